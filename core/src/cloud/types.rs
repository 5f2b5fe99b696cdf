//! The provider data model: instance types, offerings, instances, leases, repair policies.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::api::{ConditionStatus, labels};
use crate::resources::Resources;

/// How an instance is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CapacityType {
    /// Capacity held for this cluster (a cloud reservation, or an owned machine); counted, not bought.
    #[serde(rename = "reserved")]
    Reserved,
    /// Interruptible capacity at a market price.
    #[serde(rename = "spot")]
    Spot,
    /// List-price capacity.
    #[serde(rename = "on-demand")]
    OnDemand,
}

impl CapacityType {
    /// Every capacity type, in the order a worst-case launch price considers them.
    pub const ALL: [Self; 3] = [Self::Reserved, Self::Spot, Self::OnDemand];

    /// The label value (`reserved`, `spot`, `on-demand`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => labels::CAPACITY_TYPE_RESERVED,
            Self::Spot => labels::CAPACITY_TYPE_SPOT,
            Self::OnDemand => labels::CAPACITY_TYPE_ON_DEMAND,
        }
    }

    /// Parses a label value.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == value)
    }
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Names one offering: an instance type in a zone under a capacity type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OfferingKey {
    /// The instance type.
    pub instance_type: String,
    /// The zone.
    pub zone: String,
    /// The capacity type.
    pub capacity_type: CapacityType,
}

impl OfferingKey {
    /// A key from its parts.
    pub fn new(instance_type: impl Into<String>, zone: impl Into<String>, capacity_type: CapacityType) -> Self {
        Self { instance_type: instance_type.into(), zone: zone.into(), capacity_type }
    }
}

impl fmt::Display for OfferingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.instance_type, self.zone, self.capacity_type)
    }
}

/// Where and how an instance type can be bought, and for how much.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offering {
    /// The zone.
    pub zone: String,
    /// The capacity type.
    pub capacity_type: CapacityType,
    /// Price in USD per hour.
    pub price: f64,
    /// Whether it can be launched now.
    #[serde(default = "default_true")]
    pub available: bool,
    /// The reservation this offering draws on (reserved offerings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// How many more instances the reservation can hold (reserved offerings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_capacity: Option<u32>,
    /// Labels a node bought through this offering carries beyond its zone and capacity type, which differ
    /// from offering to offering of one type (a zone's id): a requirement on one is met per offering.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

fn default_true() -> bool {
    true
}

impl Offering {
    /// An available offering without a reservation.
    pub fn new(zone: impl Into<String>, capacity_type: CapacityType, price: f64) -> Self {
        Self {
            zone: zone.into(),
            capacity_type,
            price,
            available: true,
            reservation_id: None,
            reservation_capacity: None,
            labels: BTreeMap::new(),
        }
    }

    /// Whether this offering's own labels meet `reqs` (a label it lacks is left to its type).
    #[inline]
    pub fn labels_meet(&self, reqs: &crate::scheduling::Requirements) -> bool {
        self.labels.iter().all(|(k, v)| reqs.get(k).is_none_or(|r| r.has(v)))
    }

    /// The offering's key for `instance_type`.
    pub fn key(&self, instance_type: &str) -> OfferingKey {
        OfferingKey::new(instance_type, self.zone.clone(), self.capacity_type)
    }
}

/// What the kubelet and system hold back from an instance's capacity.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Overhead {
    /// Reserved for Kubernetes daemons.
    #[serde(default)]
    pub kube_reserved: Resources,
    /// Reserved for the operating system.
    #[serde(default)]
    pub system_reserved: Resources,
    /// The kubelet's hard eviction threshold.
    #[serde(default)]
    pub eviction_threshold: Resources,
}

impl Overhead {
    /// The sum of the three reservations.
    pub fn total(&self) -> Resources {
        self.kube_reserved.add(&self.system_reserved).add(&self.eviction_threshold)
    }
}

/// A shape of machine a provider can launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceType {
    /// The name, also the `node.kubernetes.io/instance-type` label.
    pub name: String,
    /// Labels every instance of this type carries (architecture, family, GPU model, …); zone and capacity
    /// type come from the offering.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Full capacity.
    pub capacity: Resources,
    /// What is held back from it.
    #[serde(default)]
    pub overhead: Overhead,
    /// Where and how it can be bought.
    #[serde(default)]
    pub offerings: Vec<Offering>,
}

impl InstanceType {
    /// Whether launching this type as `offering` meets every one of `requirements` (a claim's). Zone,
    /// capacity type, instance type and reservation come from the offering and the type; other keys the
    /// type defines must match its labels, and keys it does not define (template labels, the pool's) are the
    /// node's own and hold.
    pub fn offering_meets(&self, offering: &Offering, requirements: &[crate::api::NodeSelectorRequirement]) -> bool {
        requirements.iter().all(|req| {
            let value = match labels::normalize(&req.key) {
                labels::ZONE => Some(offering.zone.as_str()),
                labels::CAPACITY_TYPE => Some(offering.capacity_type.as_str()),
                labels::INSTANCE_TYPE => Some(self.name.as_str()),
                labels::RESERVATION_ID => offering.reservation_id.as_deref(),
                other => match offering.labels.get(other).or_else(|| self.labels.get(other)) {
                    Some(v) => Some(v.as_str()),
                    None => return true,
                },
            };
            req.matches(value)
        })
    }

    /// Capacity minus overhead, never negative.
    pub fn allocatable(&self) -> Resources {
        self.capacity.sub_clamped(&self.overhead.total())
    }

    /// The value of label `key` on every instance of this type, if it is fixed by the type.
    pub fn label(&self, key: &str) -> Option<&str> {
        if key == labels::INSTANCE_TYPE {
            return Some(&self.name);
        }
        self.labels.get(key).map(String::as_str)
    }

    /// The offering in `zone` under `capacity_type`.
    pub fn offering(&self, zone: &str, capacity_type: CapacityType) -> Option<&Offering> {
        self.offerings.iter().find(|o| o.zone == zone && o.capacity_type == capacity_type)
    }

    /// The cheapest available offering.
    pub fn cheapest_available(&self) -> Option<&Offering> {
        self.offerings.iter().filter(|o| o.available).min_by(|a, b| a.price.total_cmp(&b.price))
    }
}

/// An instance's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InstanceState {
    /// Booting.
    Pending,
    /// Running.
    Running,
    /// Shutting down.
    Stopping,
    /// Gone (providers usually answer `NotFound` instead).
    Terminated,
}

/// On-demand capacity bought as a stand-in for cheaper capacity, to be reclaimed when it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// When the stand-in should be replaced.
    pub expires_at: Timestamp,
    /// Why it was bought.
    pub reason: String,
}

/// A launched instance, as the provider reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The provider id, also `Node.spec.providerID`.
    pub provider_id: String,
    /// The instance type.
    pub instance_type: String,
    /// The zone.
    pub zone: String,
    /// The capacity type.
    pub capacity_type: CapacityType,
    /// The state.
    pub state: InstanceState,
    /// When it was launched.
    pub launch_time: Timestamp,
    /// Full capacity.
    pub capacity: Resources,
    /// Allocatable resources.
    pub allocatable: Resources,
    /// The image it booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Labels the node will carry (instance type, zone, capacity type and the type's own labels).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Present when the instance was bought as an on-demand stand-in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// The NodePool it was launched for, from the provider's ownership tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_pool: Option<String>,
    /// The NodeClaim it was launched for, from the provider's ownership tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<String>,
    /// The price per hour of its offering, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<f64>,
}

/// Extra instructions for one launch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Offerings the core believes are unavailable (from its unavailable-offerings cache); the provider
    /// must not launch into them.
    pub unavailable: Vec<OfferingKey>,
    /// Capacity types for which the cache was ignored (their entries are already left out of
    /// `unavailable`), so that a sold-out market is probed again.
    pub ignore_unavailable: Vec<CapacityType>,
}

impl LaunchOptions {
    /// Whether the offering must be avoided.
    pub fn is_unavailable(&self, key: &OfferingKey) -> bool {
        self.unavailable.contains(key)
    }
}

/// A NodeClass kind a provider serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeClassKind {
    /// API group, e.g. `karpenter.k8s.aws`.
    pub group: String,
    /// Kind, e.g. `EC2NodeClass`.
    pub kind: String,
}

impl NodeClassKind {
    /// A kind from its parts.
    pub fn new(group: impl Into<String>, kind: impl Into<String>) -> Self {
        Self { group: group.into(), kind: kind.into() }
    }
}

impl fmt::Display for NodeClassKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.group, self.kind)
    }
}

/// What a provider serves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProviderDescriptor {
    /// The NodeClass kinds routed to this provider.
    pub node_classes: Vec<NodeClassKind>,
    /// Label keys of its own this provider puts on nodes (`karpenter.k8s.aws/instance-family`, …), for
    /// tools and documentation. The scheduler does not need them: it learns which keys each instance type
    /// defines from the type's labels, and treats a key a type leaves out as absent on that type.
    pub well_known_labels: Vec<String>,
}

/// Why a provider considers a claim drifted (`AMIDrift`, `NodeClassDrift`, …).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DriftReason(pub String);

impl fmt::Display for DriftReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What repair does to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RepairAction {
    /// Reboot in place (least disruptive).
    Reboot,
    /// Replace the node.
    Replace,
}

/// A node condition that, held long enough, triggers repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairPolicy {
    /// The node condition type, e.g. `Ready`.
    pub condition_type: String,
    /// The status that counts as unhealthy.
    pub status: ConditionStatus,
    /// A regular expression the condition's reason must match; `None` matches any reason not matched by
    /// another policy for the same condition.
    pub reason: Option<String>,
    /// How long the condition must hold before repair.
    pub toleration: Duration,
    /// How long the drain may take.
    pub termination_grace: Duration,
    /// Reboot or replace.
    pub action: RepairAction,
}

/// The default repair policies: the monitored-condition table of the disruption documentation.
pub fn default_repair_policies() -> Vec<RepairPolicy> {
    let min = |m: u64| Duration::from_secs(m * 60);
    let policy = |t: &str, s, reason: Option<&str>, tol, grace, action| RepairPolicy {
        condition_type: t.into(),
        status: s,
        reason: reason.map(Into::into),
        toleration: tol,
        termination_grace: grace,
        action,
    };
    use ConditionStatus::{False, Unknown};
    use RepairAction::{Reboot, Replace};
    vec![
        policy("Ready", False, None, min(30), min(10), Replace),
        policy("Ready", Unknown, None, min(30), min(10), Replace),
        policy(
            "AcceleratedHardwareReady",
            False,
            Some(".*XID(46|48|54|62|63|95|109|110|136|140|143|155|156|158).*"),
            min(10),
            min(5),
            Reboot,
        ),
        policy("AcceleratedHardwareReady", False, Some(".*XID(64|74|79|119|120).*"), min(10), min(5), Replace),
        policy("AcceleratedHardwareReady", False, None, min(30), min(10), Replace),
        policy("StorageReady", False, None, min(30), min(10), Replace),
        policy("NetworkingReady", False, None, min(30), min(10), Replace),
        policy("KernelReady", False, None, min(30), min(10), Replace),
        policy("ContainerRuntimeReady", False, None, min(30), min(10), Replace),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocatable_subtracts_every_reservation() {
        let it = InstanceType {
            name: "g5.2xlarge".into(),
            labels: BTreeMap::new(),
            capacity: Resources::from_quantities([("cpu", "8"), ("memory", "32Gi"), ("pods", "58")]).unwrap(),
            overhead: Overhead {
                kube_reserved: Resources::from_quantities([("cpu", "100m"), ("memory", "1Gi")]).unwrap(),
                system_reserved: Resources::ZERO,
                eviction_threshold: Resources::from_quantities([("memory", "100Mi")]).unwrap(),
            },
            offerings: vec![Offering::new("us-east-1a", CapacityType::OnDemand, 1.212), {
                let mut o = Offering::new("us-east-1a", CapacityType::Spot, 0.51);
                o.available = false;
                o
            }],
        };
        let a = it.allocatable();
        assert_eq!(a.get(crate::resources::ResourceName::CPU), 7900);
        assert_eq!(a.get(crate::resources::ResourceName::MEMORY), (31 << 30) - (100 << 20));
        assert_eq!(it.label(labels::INSTANCE_TYPE), Some("g5.2xlarge"));
        assert_eq!(it.cheapest_available().unwrap().price, 1.212, "the spot offering is unavailable");
    }

    #[test]
    fn default_policies_follow_the_documented_table() {
        let p = default_repair_policies();
        assert_eq!(p.len(), 9);
        let reboot: Vec<_> = p.iter().filter(|p| p.action == RepairAction::Reboot).collect();
        assert_eq!(reboot.len(), 1);
        assert_eq!(reboot[0].toleration, Duration::from_secs(600));
    }
}

/// What a provider announces about an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InterruptionKind {
    /// A spot instance will be reclaimed (two minutes' notice on AWS).
    SpotInterruption,
    /// Scheduled maintenance will stop or retire the instance.
    ScheduledChange,
    /// The instance is stopping.
    Stopping,
    /// The instance is terminating.
    Terminating,
    /// A rebalance recommendation: informational, no action.
    Rebalance,
    /// The capacity reservation the instance runs in is taking it back (an interruptible reservation's
    /// notice); the provider marks the reservation full.
    ReservationInterruption,
    /// The instance or the host under it is impaired (a failed status check): it is terminated without
    /// waiting for a graceful drain.
    Impaired,
}

/// An interruption event from a provider's stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interruption {
    /// The instance.
    pub provider_id: String,
    /// What happens to it.
    pub kind: InterruptionKind,
}
