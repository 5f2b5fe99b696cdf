//! `/metrics`: Prometheus metrics under Karpenter's names, so its dashboards and alerts work unchanged.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tenon_core::cluster::Snapshot;
use tenon_core::resources::{ResourceName, Resources};

/// The `nodepool` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    nodepool: String,
}

/// The labels of a disrupted claim: its pool, capacity type and disruption reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DisruptedLabels {
    nodepool: String,
    capacity_type: String,
    reason: String,
}

/// What the metrics remember of a claim between two observations.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenClaim {
    pool: String,
    capacity_type: String,
    /// Its `DisruptionReason` condition's reason, when a disruption command holds it.
    disruption: Option<String>,
}

/// The `nodepool` and `resource_type` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolResourceLabels {
    nodepool: String,
    resource_type: String,
}

/// A resource amount as Karpenter reports it: CPU in cores, everything else in its base unit.
fn amount(name: ResourceName, value: i64) -> f64 {
    if name == ResourceName::CPU { value as f64 / 1000.0 } else { value as f64 }
}
use tenon_core::lifecycle::Counters;
use tenon_core::runtime::Runtime;

/// The operator's metrics. Counters count since the process started; a runtime rebuilt after a change of
/// leader adds on from zero.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    synced: Gauge,
    leader: Gauge,
    nodes: Gauge,
    nodeclaims: Gauge,
    pending_pods: Gauge,
    created: Family<PoolLabels, Counter>,
    terminated: Family<PoolLabels, Counter>,
    usage: Family<PoolResourceLabels, Gauge<f64, AtomicU64>>,
    limit: Family<PoolResourceLabels, Gauge<f64, AtomicU64>>,
    launch_failures: Counter,
    interrupted: Counter,
    disrupted: Family<DisruptedLabels, Counter>,
    queue_failures: Counter,
    /// What the current runtime had counted at the last observation.
    seen: Mutex<(Counters, u64, u64)>,
    /// The claims of the last observation and their pools (`None` before the first): a claim that
    /// appears was created, one that goes was terminated.
    claims: Mutex<Option<HashMap<String, SeenClaim>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The metrics, registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            synced: Gauge::default(),
            leader: Gauge::default(),
            nodes: Gauge::default(),
            nodeclaims: Gauge::default(),
            pending_pods: Gauge::default(),
            created: Family::default(),
            terminated: Family::default(),
            usage: Family::default(),
            limit: Family::default(),
            launch_failures: Counter::default(),
            interrupted: Counter::default(),
            disrupted: Family::default(),
            queue_failures: Counter::default(),
            seen: Mutex::new((Counters::default(), 0, 0)),
            claims: Mutex::new(None),
            registry: Registry::default(),
        };
        registry.register(
            "karpenter_cluster_state_synced",
            "Whether the cluster state holds every object's initial list (1) or not (0).",
            m.synced.clone(),
        );
        registry.register("karpenter_cluster_state_node_count", "Nodes in the cluster state.", m.nodes.clone());
        registry.register("karpenter_nodeclaims_count", "NodeClaims in the cluster state.", m.nodeclaims.clone());
        registry.register(
            "karpenter_scheduler_unschedulable_pods_count",
            "Pods not bound to a node.",
            m.pending_pods.clone(),
        );
        registry.register("karpenter_nodeclaims_created", "NodeClaims created, by NodePool.", m.created.clone());
        registry.register(
            "karpenter_nodeclaims_terminated",
            "NodeClaims terminated (gone from the cluster), by NodePool.",
            m.terminated.clone(),
        );
        registry.register(
            "karpenter_nodepools_usage",
            "The resources of a NodePool's NodeClaims (CPU in cores, memory in bytes).",
            m.usage.clone(),
        );
        registry.register(
            "karpenter_nodepools_limit",
            "A NodePool's limits (CPU in cores, memory in bytes).",
            m.limit.clone(),
        );
        registry.register("karpenter_cloudprovider_errors", "Launches that failed.", m.launch_failures.clone());
        registry.register(
            "karpenter_interruption_actions_performed",
            "Interruption notices acted on.",
            m.interrupted.clone(),
        );
        registry.register(
            "karpenter_nodeclaims_disrupted",
            "NodeClaims terminated by a disruption command, by NodePool, capacity type and disruption reason.",
            m.disrupted.clone(),
        );
        registry.register(
            "karpenter_voluntary_disruption_queue_failures",
            "Disruption commands rolled back.",
            m.queue_failures.clone(),
        );
        registry.register("tenon_leader", "Whether this replica leads (1) or stands by (0).", m.leader.clone());
        Self { registry, ..m }
    }

    /// Records whether the cluster state is synced.
    pub fn synced(&self, synced: bool) {
        self.synced.set(i64::from(synced));
    }

    /// Records whether this replica leads.
    pub fn leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Counts the claims created and terminated since the last call, by pool, and sets each pool's
    /// usage and limits. The first call counts nothing: the claims already there were created before.
    pub fn observe_cluster(&self, snapshot: &Snapshot) {
        use tenon_core::api::{condition_types, labels};
        let now: HashMap<String, SeenClaim> = snapshot
            .claims
            .iter()
            .map(|(name, c)| {
                let seen = SeenClaim {
                    pool: c.node_pool().unwrap_or_default().to_owned(),
                    capacity_type: c.label(labels::CAPACITY_TYPE).unwrap_or_default().to_owned(),
                    disruption: c.condition(condition_types::DISRUPTION_REASON).map(|d| d.reason.clone()),
                };
                (name.clone(), seen)
            })
            .collect();
        let mut last = self.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(before) = last.as_ref() {
            for (name, c) in &now {
                if !before.contains_key(name) {
                    self.created.get_or_create(&PoolLabels { nodepool: c.pool.clone() }).inc();
                }
            }
            for (name, c) in before {
                if now.contains_key(name) {
                    continue;
                }
                self.terminated.get_or_create(&PoolLabels { nodepool: c.pool.clone() }).inc();
                if let Some(reason) = &c.disruption {
                    let labels = DisruptedLabels {
                        nodepool: c.pool.clone(),
                        capacity_type: c.capacity_type.clone(),
                        reason: reason.clone(),
                    };
                    self.disrupted.get_or_create(&labels).inc();
                }
            }
        }
        *last = Some(now);
        self.usage.clear();
        self.limit.clear();
        for pool in snapshot.pools.iter() {
            let labels = |name: ResourceName| PoolResourceLabels {
                nodepool: pool.metadata.name.clone().unwrap_or_default(),
                resource_type: name.as_str().to_owned(),
            };
            let usage = pool.status.as_ref().and_then(|s| Resources::from_resource_list(&s.resources).ok());
            for (name, value) in usage.unwrap_or(Resources::ZERO).iter() {
                self.usage.get_or_create(&labels(name)).set(amount(name, value));
            }
            if let Ok(limits) = Resources::from_resource_list(&pool.spec.limits) {
                for (name, value) in limits.iter() {
                    self.limit.get_or_create(&labels(name)).set(amount(name, value));
                }
            }
        }
    }

    /// Takes the runtime's counters and the cluster's sizes after a step.
    pub fn observe(&self, runtime: &Runtime, snapshot: &Snapshot) {
        self.observe_cluster(snapshot);
        self.nodes.set(snapshot.nodes.len() as i64);
        self.nodeclaims.set(snapshot.claims.len() as i64);
        let pending = snapshot.pods.values().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none())).count();
        self.pending_pods.set(pending as i64);
        let now = runtime.lifecycle.counters.clone();
        let queue = &runtime.disruption.queue;
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A fresh runtime starts from zero: everything it counted is new.
        if now.launched < seen.0.launched || queue.completed_total < seen.1 {
            *seen = (Counters::default(), 0, 0);
        }
        let delta = |a: u64, b: u64| a.saturating_sub(b);
        let before = &seen.0;
        self.launch_failures.inc_by(delta(now.launch_failures, before.launch_failures));
        self.interrupted.inc_by(delta(now.interruptions, before.interruptions));
        self.queue_failures.inc_by(delta(queue.failures_total, seen.2));
        *seen = (now, queue.completed_total, queue.failures_total);
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn karpenter_names_are_served() {
        let m = Metrics::new();
        m.synced(true);
        let text = m.encode().unwrap_or_default();
        for name in [
            "karpenter_cluster_state_synced 1",
            "karpenter_voluntary_disruption_queue_failures_total 0",
            "karpenter_cluster_state_node_count 0",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    fn snapshot(claims: &[(&str, &str)]) -> Snapshot {
        use std::sync::Arc;
        use tenon_core::api::{NodeClaim, NodePool, labels};
        let claims = claims
            .iter()
            .map(|(name, pool)| {
                let mut c = NodeClaim::new(name, Default::default());
                c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), (*pool).to_owned())].into());
                ((*name).to_owned(), Arc::new(c))
            })
            .collect();
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
            "spec": {"template": {"spec": {"requirements": []}}, "limits": {"cpu": "1500m", "nvidia.com/gpu": "8"}},
            "status": {"resources": {"cpu": "500m", "memory": "1Gi"}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        Snapshot { claims: Arc::new(claims), pools: Arc::new(vec![pool]), ..Default::default() }
    }

    #[test]
    fn claims_are_counted_by_pool_as_they_come_and_go_and_pools_report_usage_and_limits() {
        let m = Metrics::new();
        // Claims there at the first look were created before: not counted.
        m.observe_cluster(&snapshot(&[("gpu-a", "gpu")]));
        m.observe_cluster(&snapshot(&[("gpu-a", "gpu"), ("gpu-b", "gpu"), ("web-c", "web")]));
        // web-c is taken by a disruption command: marked, then gone.
        let mut marked = snapshot(&[("web-c", "web")]);
        let mut claim = tenon_core::api::NodeClaim::clone(&marked.claims["web-c"]);
        claim.metadata.labels.get_or_insert_default().insert("karpenter.sh/capacity-type".into(), "spot".into());
        let at = jiff::Timestamp::UNIX_EPOCH;
        claim.set_condition("DisruptionReason", tenon_core::api::ConditionStatus::True, "Underutilized", "", at);
        marked.claims = std::sync::Arc::new([("web-c".to_owned(), std::sync::Arc::new(claim))].into());
        m.observe_cluster(&marked);
        m.observe_cluster(&snapshot(&[]));
        let text = m.encode().unwrap_or_default();
        for line in [
            "karpenter_nodeclaims_created_total{nodepool=\"gpu\"} 1",
            "karpenter_nodeclaims_created_total{nodepool=\"web\"} 1",
            "karpenter_nodeclaims_terminated_total{nodepool=\"gpu\"} 2",
            "karpenter_nodepools_usage{nodepool=\"gpu\",resource_type=\"cpu\"} 0.5",
            "karpenter_nodepools_usage{nodepool=\"gpu\",resource_type=\"memory\"} 1073741824.0",
            "karpenter_nodepools_limit{nodepool=\"gpu\",resource_type=\"cpu\"} 1.5",
            "karpenter_nodepools_limit{nodepool=\"gpu\",resource_type=\"nvidia.com/gpu\"} 8.0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        let disrupted =
            "karpenter_nodeclaims_disrupted_total{nodepool=\"web\",capacity_type=\"spot\",reason=\"Underutilized\"} 1";
        assert!(text.contains(disrupted), "{disrupted} missing from:\n{text}");
        assert!(text.contains("karpenter_nodeclaims_terminated_total{nodepool=\"web\"} 1"), "{text}");
        assert!(!text.contains("karpenter_nodeclaims_disrupted_total{nodepool=\"gpu\""), "{text}");
    }
}
