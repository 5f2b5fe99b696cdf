//! `karpenter.sh/v1` NodeClaim: one node tenon has asked a provider for.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::{self, Condition, ConditionStatus, condition_types};
use super::duration::{KubeDuration, NillableDuration};
use super::labels;
use super::nodepool::NodeClassRef;
use super::requirements::NodeSelectorRequirement;

fn default_expire_after() -> NillableDuration {
    NillableDuration::from_secs(720 * 3600)
}

/// The desired state of a NodeClaim.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    shortname = "nc",
    derive = "PartialEq",
    status = "NodeClaimStatus",
    doc = "A NodeClaim is a request for one node: its requirements list the acceptable instance types, zones and capacity types.",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".metadata.labels.node\\.kubernetes\\.io/instance-type"}"#,
    printcolumn = r#"{"name":"Capacity","type":"string","jsonPath":".metadata.labels.karpenter\\.sh/capacity-type"}"#,
    printcolumn = r#"{"name":"Zone","type":"string","jsonPath":".metadata.labels.topology\\.kubernetes\\.io/zone"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    /// Taints the node carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints the node carries while it boots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// What the node's labels must satisfy; the provider picks one offering that does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<NodeSelectorRequirement>,
    /// The resources the claim must be able to hold (the scheduled pods plus daemon overhead).
    #[serde(default, skip_serializing_if = "NodeClaimResources::is_empty")]
    pub resources: NodeClaimResources,
    /// The provider-specific NodeClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_ref: Option<NodeClassRef>,
    /// How long the node lives before it is drained and replaced.
    #[serde(default = "default_expire_after")]
    pub expire_after: NillableDuration,
    /// How long a draining node may wait for its pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<KubeDuration>,
}

impl Default for NodeClaimSpec {
    fn default() -> Self {
        Self {
            taints: Vec::new(),
            startup_taints: Vec::new(),
            requirements: Vec::new(),
            resources: NodeClaimResources::default(),
            node_class_ref: None,
            expire_after: default_expire_after(),
            termination_grace_period: None,
        }
    }
}

/// The resources a claim requests.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct NodeClaimResources {
    /// Requested resources.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
}

impl NodeClaimResources {
    fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

/// What tenon observed about a claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// The name of the claim's node once registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The provider's id for the instance.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The image the instance booted.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The instance's capacity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// The instance's allocatable resources.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, Quantity>,
    /// Status conditions (`Launched`, `Registered`, `Initialized`, `Drifted`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When a pod last landed on or left the node (drives `consolidateAfter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub last_pod_event_time: Option<Timestamp>,
}

impl NodeClaim {
    /// When its drain must end, once it is being deleted: the earlier of the
    /// `karpenter.sh/nodeclaim-termination-timestamp` annotation (what repair writes, and what Karpenter
    /// writes on deletion) and its deletion timestamp plus `terminationGracePeriod`. `None`: the drain may
    /// take as long as its pods need. An annotation that is no RFC 3339 time is ignored, with a warning.
    pub fn termination_deadline(&self) -> Option<Timestamp> {
        let annotated = self.metadata.annotations.as_ref().and_then(|a| a.get(labels::NODECLAIM_TERMINATION_TIMESTAMP));
        let annotated = annotated.and_then(|v| match v.parse::<Timestamp>() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(claim = %self.name(), annotation = labels::NODECLAIM_TERMINATION_TIMESTAMP, value = %v,
                    error = %e, "ignoring an unparseable termination timestamp");
                None
            }
        });
        let graced = match (&self.metadata.deletion_timestamp, self.spec.termination_grace_period) {
            (Some(t), Some(grace)) => Some(crate::clock::add(t.0, grace.0)),
            _ => None,
        };
        match (annotated, graced) {
            (Some(a), Some(g)) => Some(a.min(g)),
            (a, g) => a.or(g),
        }
    }

    /// The claim's name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// The claim's NodePool, from its `karpenter.sh/nodepool` label.
    pub fn node_pool(&self) -> Option<&str> {
        self.label(labels::NODE_POOL)
    }

    /// A label of the claim.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str)
    }

    /// An annotation of the claim.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
    }

    /// The provider id, once launched.
    pub fn provider_id(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.provider_id.as_deref())
    }

    /// A status condition.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref().and_then(|s| conditions::find(&s.conditions, type_))
    }

    /// Whether a condition is `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == ConditionStatus::True)
    }

    /// Sets a status condition, keeping its transition time when the status does not change.
    pub fn set_condition(&mut self, type_: &str, status: ConditionStatus, reason: &str, message: &str, now: Timestamp) {
        let st = self.status.get_or_insert_with(Default::default);
        conditions::set(&mut st.conditions, type_, status, reason, message, now);
    }

    /// Whether the claim's node is initialized.
    pub fn is_initialized(&self) -> bool {
        self.is_true(condition_types::INITIALIZED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_keep_transition_time_until_status_changes() {
        let mut nc = NodeClaim::new("c1", NodeClaimSpec::default());
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        nc.set_condition(condition_types::LAUNCHED, ConditionStatus::Unknown, "Pending", "", t0);
        nc.set_condition(condition_types::LAUNCHED, ConditionStatus::Unknown, "StillPending", "", t1);
        assert_eq!(nc.condition(condition_types::LAUNCHED).unwrap().last_transition_time, Some(t0));
        nc.set_condition(condition_types::LAUNCHED, ConditionStatus::True, "Launched", "", t1);
        assert!(nc.is_true(condition_types::LAUNCHED));
        assert_eq!(nc.condition(condition_types::LAUNCHED).unwrap().last_transition_time, Some(t1));
    }

    #[test]
    fn status_uses_kubernetes_field_names() {
        let mut nc = NodeClaim::new("c1", NodeClaimSpec::default());
        nc.status = Some(NodeClaimStatus {
            provider_id: Some("aws:///us-east-1a/i-1".into()),
            image_id: Some("ami-1".into()),
            ..Default::default()
        });
        let v = serde_json::to_value(&nc).unwrap();
        assert_eq!(v["status"]["providerID"], "aws:///us-east-1a/i-1");
        assert_eq!(v["status"]["imageID"], "ami-1");
        assert_eq!(v["spec"]["expireAfter"], "720h");
    }
}
