//! Status conditions, shaped like Kubernetes' `metav1.Condition`.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The condition types tenon sets on NodeClaims and NodePools.
pub mod condition_types {
    /// The provider launched an instance for the claim.
    pub const LAUNCHED: &str = "Launched";
    /// The claim's node registered with the cluster.
    pub const REGISTERED: &str = "Registered";
    /// The claim's node is Ready, its startup taints are gone and its extended resources are reported.
    pub const INITIALIZED: &str = "Initialized";
    /// The claim no longer matches its NodePool or NodeClass.
    pub const DRIFTED: &str = "Drifted";
    /// The claim is past its `consolidateAfter` and may be consolidated.
    pub const CONSOLIDATABLE: &str = "Consolidatable";
    /// Why the claim is being disrupted (`Empty`, `Underutilized`, `Drifted`, `Unhealthy`, …).
    pub const DISRUPTION_REASON: &str = "DisruptionReason";
    /// The claim's node has been drained.
    pub const DRAINED: &str = "Drained";
    /// The claim's volumes are detached.
    pub const VOLUMES_DETACHED: &str = "VolumesDetached";
    /// The claim's instance is terminating.
    pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
    /// The claim's node matches the shape the claim promised.
    pub const CONSISTENT_STATE_FOUND: &str = "ConsistentStateFound";
    /// The claim's node is being rebooted for repair.
    pub const REBOOTING: &str = "Rebooting";
    /// The NodePool passed tenon's validation (what the CRD schema alone cannot check).
    pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
    /// The claim's or pool's NodeClass is served by a registered provider and ready.
    pub const NODE_CLASS_READY: &str = "NodeClassReady";
    /// The object is ready (NodePools: its NodeClass resolved and is ready).
    pub const READY: &str = "Ready";
}

/// `True`, `False` or `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not known yet.
    Unknown,
}

/// One status condition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition type, e.g. `Launched`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// A CamelCase machine-readable reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// A human-readable message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub last_transition_time: Option<Timestamp>,
    /// The generation the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Condition helpers shared by NodeClaim and NodePool statuses.
pub(crate) fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Sets a condition in `conditions`, keeping its transition time when the status does not change: for
/// the status of any object shaped like Kubernetes' (a provider's NodeClass, say).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = Some(now);
        }
        c.status = status;
        c.reason = reason.to_owned();
        c.message = message.to_owned();
    } else {
        conditions.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: Some(now),
            observed_generation: None,
        });
    }
}
