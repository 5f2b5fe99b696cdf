//! Node auto repair, behind the `NodeRepair` gate: nodes reporting a monitored condition for longer than
//! its toleration are rebooted in place or replaced, through the disruption queue under the `Unhealthy`
//! budget.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use regex::Regex;

use crate::api::{ConditionStatus, DisruptionReason, labels};
use crate::clock;
use crate::cloud::{RepairAction, RepairPolicy};
use crate::disruption::{CandidateRef, Command, Decision, Inputs};
use crate::state::{ClusterState, StateNode};

/// More than this share of a pool reporting a monitored condition stops repair in that pool.
pub const BREAKER: f64 = 0.20;
/// A node rebooted this many times within [`REBOOT_WINDOW`] is replaced instead.
pub const MAX_REBOOTS: usize = 2;
/// The window over which reboots are counted.
pub const REBOOT_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// How long a reboot may take to bring the node back healthy before repair acts again.
pub const REBOOT_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// What repair decided for one node.
#[derive(Debug, Clone)]
pub enum RepairDecision {
    /// Reboot the node in place.
    Reboot {
        /// The node.
        node: String,
        /// Its claim.
        claim: String,
    },
    /// Replace the node through the disruption queue.
    Replace(Command),
    /// Repair is blocked, with the event to emit (`DisruptionBlocked`, `NodeRepairBlocked`).
    Blocked {
        /// The node.
        node: String,
        /// The event reason.
        event: &'static str,
        /// Why.
        message: String,
    },
}

/// A monitored condition a node reports, with the policy it matches.
#[derive(Debug, Clone)]
struct Unhealthy<'p> {
    policy: &'p RepairPolicy,
    since: Timestamp,
}

fn matches_reason(policy: &RepairPolicy, reason: &str, siblings: &[&RepairPolicy]) -> bool {
    match &policy.reason {
        Some(pattern) => Regex::new(&format!("^(?:{pattern})$")).is_ok_and(|re| re.is_match(reason)),
        // A policy without a reason takes every reason no sibling matches.
        None => !siblings.iter().any(|s| s.reason.is_some() && matches_reason(s, reason, &[])),
    }
}

/// The most disruptive policy a node's conditions match, and since when.
fn unhealthy<'p>(node: &StateNode, policies: &'p [RepairPolicy]) -> Option<Unhealthy<'p>> {
    let conditions = node.node.as_ref()?.status.as_ref()?.conditions.as_ref()?;
    let mut worst: Option<Unhealthy<'p>> = None;
    for c in conditions {
        let status = match c.status.as_str() {
            "True" => ConditionStatus::True,
            "False" => ConditionStatus::False,
            _ => ConditionStatus::Unknown,
        };
        let siblings: Vec<&RepairPolicy> =
            policies.iter().filter(|p| p.condition_type == c.type_ && p.status == status).collect();
        let reason = c.reason.as_deref().unwrap_or("");
        for p in &siblings {
            if !matches_reason(p, reason, &siblings) {
                continue;
            }
            let since = c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
            if worst.as_ref().is_none_or(|w| p.action > w.policy.action) {
                worst = Some(Unhealthy { policy: p, since });
            }
        }
    }
    worst
}

/// Node repair with its reboot history (kept in memory: a restart resets it, as the documentation says).
#[derive(Debug, Default)]
pub struct Repairer {
    reboots: HashMap<String, Vec<Timestamp>>,
    failed: std::collections::HashSet<String>,
}

impl Repairer {
    /// A repairer with no history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `node` was rebooted at `now`.
    pub fn rebooted(&mut self, node: &str, now: Timestamp) {
        self.reboots.entry(node.to_owned()).or_default().push(now);
    }

    /// Records that a reboot of `node` failed (the provider refused it); repair replaces the node next.
    pub fn reboot_failed(&mut self, node: &str) {
        self.failed.insert(node.to_owned());
    }

    fn recent_reboots(&self, node: &str, now: Timestamp) -> usize {
        self.reboots.get(node).map_or(0, |v| v.iter().filter(|t| clock::since(now, **t) < REBOOT_WINDOW).count())
    }

    /// Decides repairs at `now`, longest-unhealthy first, within each pool's `Unhealthy` budget, with
    /// `reboot_supported` saying whether the provider can reboot in place.
    pub fn decide(
        &self,
        inputs: &Inputs<'_>,
        policies: &[RepairPolicy],
        reboot_supported: bool,
    ) -> Vec<RepairDecision> {
        if !inputs.settings.feature_gates.node_repair() || policies.is_empty() {
            return Vec::new();
        }
        let state = inputs.state;
        let now = inputs.now;
        let mut out = Vec::new();
        let mut by_pool: HashMap<&str, (usize, usize)> = HashMap::new();
        for n in &state.nodes {
            if let Some(p) = n.pool.as_deref() {
                let e = by_pool.entry(p).or_default();
                e.0 += 1;
                e.1 += usize::from(unhealthy(n, policies).is_some());
            }
        }
        let mut due: Vec<(&StateNode, Unhealthy<'_>)> = state
            .nodes
            .iter()
            .filter(|n| n.pool.is_some() && n.claim.is_some() && !n.deleting)
            .filter_map(|n| unhealthy(n, policies).map(|u| (n, u)))
            .filter(|(_, u)| clock::since(now, u.since) >= u.policy.toleration)
            .collect();
        // Longest unhealthy past its toleration first.
        due.sort_by_key(|(n, u)| (clock::add(u.since, u.policy.toleration), n.name.clone()));
        let mut budget: HashMap<String, u64> = crate::disruption::allowances(state, DisruptionReason::Unhealthy, now)
            .into_iter()
            .map(|(p, a, _)| (p, a))
            .collect();
        for (node, u) in due {
            // A reboot in progress gets its 20 minutes to bring the node back.
            let rebooting = self
                .reboots
                .get(&node.name)
                .and_then(|v| v.last())
                .is_some_and(|t| clock::since(now, *t) < REBOOT_TIMEOUT);
            if rebooting {
                continue;
            }
            let pool = node.pool.as_deref().unwrap_or_default();
            let (total, sick) = by_pool.get(pool).copied().unwrap_or((1, 0));
            if sick as f64 > BREAKER * total as f64 {
                out.push(RepairDecision::Blocked {
                    node: node.name.clone(),
                    event: "NodeRepairBlocked",
                    message: format!("{sick} of {total} nodes in NodePool {pool} are unhealthy (more than 20%): likely a correlated failure"),
                });
                continue;
            }
            let annotated = node
                .node
                .as_ref()
                .and_then(|n| n.metadata.annotations.as_ref())
                .and_then(|a| a.get(labels::DO_NOT_REPAIR));
            if annotated.map(String::as_str) == Some("true") {
                out.push(RepairDecision::Blocked {
                    node: node.name.clone(),
                    event: "DisruptionBlocked",
                    message: format!("node is annotated {}", labels::DO_NOT_REPAIR),
                });
                continue;
            }
            match budget.get_mut(pool) {
                Some(left) if *left > 0 => *left -= 1,
                _ => {
                    out.push(RepairDecision::Blocked {
                        node: node.name.clone(),
                        event: "DisruptionBlocked",
                        message: format!("budget for Unhealthy in NodePool {pool} allows no more disruptions now"),
                    });
                    continue;
                }
            }
            let claim = node.claim.as_ref().map(|c| c.name().to_owned()).unwrap_or_default();
            // A reboot that failed, or after which the same fault persisted past its window, means replace.
            let last = self.reboots.get(&node.name).and_then(|v| v.last().copied());
            let reboot_failed = self.failed.contains(&node.name) || last.is_some_and(|t| u.since <= t);
            if u.policy.action == RepairAction::Reboot
                && reboot_supported
                && !reboot_failed
                && self.recent_reboots(&node.name, now) < MAX_REBOOTS
            {
                out.push(RepairDecision::Reboot { node: node.name.clone(), claim });
                continue;
            }
            match replacement(inputs, node) {
                Ok(mut cmd) => {
                    cmd.termination_grace = Some(u.policy.termination_grace);
                    out.push(RepairDecision::Replace(cmd))
                }
                Err(message) => {
                    out.push(RepairDecision::Blocked { node: node.name.clone(), event: "DisruptionBlocked", message })
                }
            }
        }
        out
    }
}

/// A replace command for an unhealthy node: its pods rescheduled, new capacity for what does not fit.
fn replacement(inputs: &Inputs<'_>, node: &StateNode) -> Result<Command, String> {
    let state: &ClusterState = inputs.state;
    let pods: Vec<_> = node
        .pods
        .iter()
        .map(|i| &state.pods[*i])
        .filter(|p| p.reschedulable())
        .map(|p| std::sync::Arc::clone(&p.info))
        .collect();
    let nodes = state.nodes.iter().map(|n| n.as_existing()).collect();
    let sim = crate::scheduling::Scheduler::with_bound_on_nodes(
        crate::provisioning::pool_inputs(state, inputs.types_for),
        nodes,
        &state.bound_on_nodes(),
        &state.daemons,
        crate::provisioning::scheduler_options(inputs.settings),
    )
    .without_nodes(&[node.name.as_str()]);
    let r = sim.solve_shared(pods);
    if let Some(u) = r.unschedulable.first() {
        return Err(format!("pod {} cannot be rescheduled: {}", u.pod, u.reason));
    }
    let claim = node.claim.as_ref().map(|c| c.name().to_owned()).unwrap_or_default();
    let price = node
        .pool
        .as_deref()
        .and_then(|p| state.pool(p))
        .and_then(|p| node.price(&(inputs.types_for)(p)))
        .unwrap_or(0.0);
    Ok(Command {
        decision: if r.claims.is_empty() { Decision::Delete } else { Decision::Replace },
        reason: DisruptionReason::Unhealthy,
        candidates: vec![CandidateRef { node: node.name.clone(), node_claim: claim, price }],
        replacements: r
            .claims
            .iter()
            .map(|p| crate::disruption::Replacement {
                instance_types: p.instance_types.iter().map(|n| n.to_string()).collect(),
                capacity_types: Vec::new(),
                zones: Vec::new(),
                worst_case_price: p.worst_case_price,
                plan: p.clone(),
            })
            .collect(),
        savings_per_hour: 0.0,
        explanation: "repair".into(),
        termination_grace: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodePool;
    use crate::cloud::{CapacityType, InstanceType, Offering, default_repair_policies};
    use crate::resources::{ResourceName, Resources};
    use crate::settings::Settings;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-03-04T12:00:00Z".parse().unwrap()
    }

    fn node(name: &str, conditions: serde_json::Value, annotations: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations, "labels": {labels::NODE_POOL: "gpu", labels::INSTANCE_TYPE: "gpu.1x",
                labels::ZONE: "a", labels::CAPACITY_TYPE: "on-demand", labels::INITIALIZED: "true"}},
            "status": {"allocatable": {"cpu": "8", "pods": "110", "nvidia.com/gpu": "1"}, "conditions": conditions}
        }))
        .unwrap()
    }

    fn sick(kind: &str, reason: &str, minutes_ago: i64) -> serde_json::Value {
        let at = now() - jiff::SignedDuration::from_mins(minutes_ago);
        json!([{"type": "Ready", "status": "True"}, {"type": kind, "status": "False", "reason": reason, "lastTransitionTime": at.to_string()}])
    }

    fn healthy() -> serde_json::Value {
        json!([{"type": "Ready", "status": "True"}])
    }

    fn decide(nodes: Vec<Node>, repairer: &Repairer, gate: bool) -> Vec<RepairDecision> {
        let pool: NodePool = serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "gpu"}, "spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}}))
        .unwrap();
        let state = ClusterState::from_objects(&[], &nodes, &[], &[], &[], &[pool], now()).unwrap();
        let types = vec![InstanceType {
            name: "gpu.1x".into(),
            labels: Default::default(),
            capacity: Resources::cpu_memory(8000, 32 << 30)
                .with(ResourceName::PODS, 110)
                .with(ResourceName::NVIDIA_GPU, 1),
            overhead: Default::default(),
            offerings: vec![Offering::new("a", CapacityType::OnDemand, 3.0)],
        }];
        let types_for = move |_: &NodePool| types.clone().into();
        let flags = if gate { vec![("FEATURE_GATES".to_owned(), "NodeRepair=true".to_owned())] } else { vec![] };
        let settings: Settings = crate::settings::load(None, Vec::new(), &flags).unwrap().settings;
        repairer.decide(
            &Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() },
            &default_repair_policies(),
            true,
        )
    }

    fn fleet(first: Node) -> Vec<Node> {
        let mut v = vec![first];
        for i in 0..9 {
            v.push(node(&format!("ok-{i}"), healthy(), json!({})));
        }
        v
    }

    #[test]
    fn a_transient_gpu_fault_reboots_and_a_fatal_one_replaces_after_ten_minutes() {
        let r = Repairer::new();
        let d =
            decide(fleet(node("n", sick("AcceleratedHardwareReady", "GPU XID48 detected", 11), json!({}))), &r, true);
        assert!(matches!(&d[..], [RepairDecision::Reboot { node, .. }] if node == "n"), "{d:?}");
        let d = decide(
            fleet(node("n", sick("AcceleratedHardwareReady", "XID79 fell off the bus", 11), json!({}))),
            &r,
            true,
        );
        assert!(matches!(&d[..], [RepairDecision::Replace(c)] if c.reason == DisruptionReason::Unhealthy), "{d:?}");
        // The fatal-XID policy's 5-minute termination grace bounds the drain of the node it replaces.
        assert!(
            matches!(&d[..], [RepairDecision::Replace(c)] if c.termination_grace == Some(Duration::from_secs(300))),
            "{d:?}"
        );
        let d = decide(fleet(node("n", sick("AcceleratedHardwareReady", "XID79", 9), json!({}))), &r, true);
        assert!(d.is_empty(), "inside the 10-minute toleration");
        let d = decide(fleet(node("n", sick("AcceleratedHardwareReady", "something else", 29), json!({}))), &r, true);
        assert!(d.is_empty(), "an unmatched reason tolerates 30 minutes");
        assert!(
            decide(fleet(node("n", sick("AcceleratedHardwareReady", "XID79", 11), json!({}))), &r, false).is_empty(),
            "gate off"
        );
    }

    #[test]
    fn a_reboot_that_fails_or_does_not_clear_the_fault_means_a_replacement() {
        let mut r = Repairer::new();
        r.reboot_failed("n");
        let d = decide(fleet(node("n", sick("AcceleratedHardwareReady", "XID48", 11), json!({}))), &r, true);
        assert!(matches!(&d[..], [RepairDecision::Replace(_)]), "{d:?}");
        // Rebooted 25 minutes ago, and the condition from before the reboot is still there.
        let mut r = Repairer::new();
        r.rebooted("n", now() - jiff::SignedDuration::from_mins(25));
        let d = decide(fleet(node("n", sick("AcceleratedHardwareReady", "XID48", 40), json!({}))), &r, true);
        assert!(matches!(&d[..], [RepairDecision::Replace(_)]), "{d:?}");
        // Rebooted 5 minutes ago: still inside its 20 minutes.
        let mut r = Repairer::new();
        r.rebooted("n", now() - jiff::SignedDuration::from_mins(5));
        assert!(
            decide(fleet(node("n", sick("AcceleratedHardwareReady", "XID48", 40), json!({}))), &r, true).is_empty()
        );
    }

    #[test]
    fn two_reboots_in_a_day_mean_a_replacement() {
        let mut r = Repairer::new();
        r.rebooted("n", now() - jiff::SignedDuration::from_hours(5));
        r.rebooted("n", now() - jiff::SignedDuration::from_hours(1));
        let d = decide(fleet(node("n", sick("AcceleratedHardwareReady", "XID48", 11), json!({}))), &r, true);
        assert!(matches!(&d[..], [RepairDecision::Replace(_)]), "{d:?}");
    }

    #[test]
    fn do_not_repair_and_the_twenty_percent_breaker_block_repair() {
        let r = Repairer::new();
        let d =
            decide(fleet(node("n", sick("KernelReady", "oops", 31), json!({labels::DO_NOT_REPAIR: "true"}))), &r, true);
        assert!(matches!(&d[..], [RepairDecision::Blocked { event: "DisruptionBlocked", .. }]), "{d:?}");
        let mut nodes = vec![
            node("a", sick("KernelReady", "oops", 31), json!({})),
            node("b", sick("StorageReady", "disk", 40), json!({})),
            node("c", sick("NetworkingReady", "eni", 35), json!({})),
        ];
        for i in 0..7 {
            nodes.push(node(&format!("ok-{i}"), healthy(), json!({})));
        }
        let d = decide(nodes, &r, true);
        assert_eq!(d.len(), 3);
        assert!(
            d.iter().all(|x| matches!(x, RepairDecision::Blocked { event: "NodeRepairBlocked", .. })),
            "3 of 10 is more than 20%"
        );
    }

    #[test]
    fn the_longest_unhealthy_node_is_repaired_first() {
        let r = Repairer::new();
        let mut nodes = vec![
            node("recent", sick("KernelReady", "x", 31), json!({})),
            node("old", sick("KernelReady", "x", 50), json!({})),
        ];
        for i in 0..8 {
            nodes.push(node(&format!("ok-{i}"), healthy(), json!({})));
        }
        let d = decide(nodes, &r, true);
        let order: Vec<String> = d
            .iter()
            .map(|x| match x {
                RepairDecision::Replace(c) => c.candidates[0].node.clone(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(order, ["old", "recent"]);
    }
}
