//! `/metrics`: Prometheus metrics under Karpenter's names, so its dashboards and alerts work unchanged.

use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tenon_core::cluster::Snapshot;
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
    created: Counter,
    terminated: Counter,
    launch_failures: Counter,
    interrupted: Counter,
    disrupted: Counter,
    queue_failures: Counter,
    /// What the current runtime had counted at the last observation.
    seen: Mutex<(Counters, u64, u64)>,
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
            created: Counter::default(),
            terminated: Counter::default(),
            launch_failures: Counter::default(),
            interrupted: Counter::default(),
            disrupted: Counter::default(),
            queue_failures: Counter::default(),
            seen: Mutex::new((Counters::default(), 0, 0)),
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
        registry.register("karpenter_nodeclaims_created", "NodeClaims launched.", m.created.clone());
        registry.register(
            "karpenter_nodeclaims_terminated",
            "NodeClaims deleted for a timeout, expiry, interruption or a vanished instance.",
            m.terminated.clone(),
        );
        registry.register("karpenter_cloudprovider_errors", "Launches that failed.", m.launch_failures.clone());
        registry.register(
            "karpenter_interruption_actions_performed",
            "Interruption notices acted on.",
            m.interrupted.clone(),
        );
        registry.register("karpenter_nodeclaims_disrupted", "Disruption commands completed.", m.disrupted.clone());
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

    /// Takes the runtime's counters and the cluster's sizes after a step.
    pub fn observe(&self, runtime: &Runtime, snapshot: &Snapshot) {
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
        self.created.inc_by(delta(now.launched, before.launched));
        let ended = |c: &Counters| {
            c.launch_timeouts
                + c.registration_timeouts
                + c.initialization_timeouts
                + c.vanished
                + c.expirations
                + c.interruptions
        };
        self.terminated.inc_by(delta(ended(&now), ended(before)));
        self.launch_failures.inc_by(delta(now.launch_failures, before.launch_failures));
        self.interrupted.inc_by(delta(now.interruptions, before.interruptions));
        self.disrupted.inc_by(delta(queue.completed_total, seen.1));
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
            "karpenter_nodeclaims_created_total 0",
            "karpenter_voluntary_disruption_queue_failures_total 0",
            "karpenter_cluster_state_node_count 0",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
