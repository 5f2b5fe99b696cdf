//! Disruption: every pass, ask of every node whether its pods could run elsewhere for less, and act when a
//! simulation proves it.
//!
//! A pass walks the methods in order — [`Method::Emptiness`], [`Method::StaticDrift`], [`Method::Drift`],
//! [`Method::MultiNodeConsolidation`], [`Method::SingleNodeConsolidation`] — and stops at the first that
//! returns commands. Consolidation runs the scheduler backwards: remove the candidates, reschedule their
//! pods onto the rest of the fleet, and accept zero new claims (delete), one cheaper claim (replace), or,
//! with the split fallback, several claims under the candidate's price. Every node considered and left
//! alone gets a reason a person can read.

mod candidates;
mod consolidation;
pub mod queue;
pub(crate) use queue::bound_termination;
pub mod workload;

use std::collections::BTreeSet;
use std::time::Instant;

use jiff::Timestamp;
use serde::Serialize;

pub use candidates::{
    Blocked, Candidate, INSTANCE_TYPE_NOT_FOUND, ON_DEMAND_LEASE_EXPIRED, PdbAllowance, allowances, blocking_pdb,
    candidates, claim_lifetime_remaining, do_not_disrupt, drift_reason, kube_pod_cost, last_pod_event, pdb_allowances,
    pdb_allowed, pod_cost, reschedule_cost,
};
pub use consolidation::{PoolTotals, Score, Simulator};

use crate::api::DisruptionReason;
use crate::cloud::CapacityType;
use crate::scheduling::ClaimPlan;
use crate::settings::Settings;
use crate::state::ClusterState;

/// A disruption method, in the order a pass tries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Method {
    /// Replace (or reboot) nodes reporting a monitored unhealthy condition (behind `NodeRepair`).
    NodeRepair,
    /// Delete nodes whose pods cost nothing to move.
    Emptiness,
    /// Replace drifted nodes of static (replica-pinned) pools.
    StaticDrift,
    /// Replace nodes that no longer match their pool or NodeClass.
    Drift,
    /// Remove several nodes at once, with at most one replacement.
    MultiNodeConsolidation,
    /// Remove or replace one node at a time.
    SingleNodeConsolidation,
}

/// Delete or replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// The pods fit on the rest of the fleet.
    Delete,
    /// The pods need new, cheaper capacity.
    Replace,
}

/// A node a command disrupts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateRef {
    /// The node.
    pub node: String,
    /// Its claim.
    pub node_claim: String,
    /// Its price per hour.
    pub price: f64,
}

/// New capacity a command launches.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replacement {
    /// The instance types it may launch, cheapest first.
    pub instance_types: Vec<String>,
    /// The capacity types it may launch.
    pub capacity_types: Vec<CapacityType>,
    /// The zones it may launch in.
    pub zones: Vec<String>,
    /// The most it can cost.
    #[serde(serialize_with = "rounded")]
    pub worst_case_price: f64,
    /// The plan behind it (requirements, pods).
    #[serde(skip)]
    pub plan: ClaimPlan,
}

/// Prices are printed to a millionth of a dollar, without float noise.
fn rounded<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((v * 1e6).round() / 1e6)
}

/// One disruption action.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Command {
    /// Delete or replace.
    pub decision: Decision,
    /// Why.
    pub reason: DisruptionReason,
    /// The nodes it removes.
    pub candidates: Vec<CandidateRef>,
    /// The capacity it launches first.
    pub replacements: Vec<Replacement>,
    /// The estimated saving per hour (candidates' price minus the replacements' worst case).
    #[serde(serialize_with = "rounded")]
    pub savings_per_hour: f64,
    /// For a person: how the decision was reached (policy scores, retries).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub explanation: String,
    /// How long the candidates' drain may take once their claims are deleted, when the method bounds it
    /// (repair, by its policy): written to each claim as `karpenter.sh/nodeclaim-termination-timestamp`.
    /// `None` leaves the claims' own `terminationGracePeriod`.
    #[serde(skip)]
    pub termination_grace: Option<std::time::Duration>,
}

/// The outcome of one pass.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    /// The first method that returned commands.
    pub method: Option<Method>,
    /// Its commands.
    pub commands: Vec<Command>,
    /// Nodes considered and left alone, with the reason.
    pub unconsolidatable: Vec<Blocked>,
    /// The nodes of `unconsolidatable` that are not candidates at all (a PDB, `do-not-disrupt`, a budget
    /// at zero, a node not yet initialized, …): Karpenter reports them as `DisruptionBlocked`, and the
    /// others, which a method examined and could not act on, as `Unconsolidatable`.
    #[serde(skip)]
    pub blocked: std::collections::BTreeSet<String>,
    /// What the pass measured: for the operator's metrics, not for a plan.
    #[serde(skip)]
    pub stats: PassStats,
    /// The pools single-node consolidation did not reach before its timeout (empty when it reached them
    /// all); `None` when it did not finish a sweep (it found a command, or an earlier method acted). The
    /// next pass takes them first ([`compute_with`]).
    #[serde(skip)]
    pub unseen_pools: Option<BTreeSet<String>>,
}

/// What a pass measured, for Karpenter's `voluntary_disruption` metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassStats {
    /// How long each method it ran took, in order (`decision_evaluation_duration_seconds`).
    pub evaluations: Vec<(Method, std::time::Duration)>,
    /// How many candidates each reason's methods could act on (`eligible_nodes`): empty ones, drifted
    /// ones, and those consolidation may consider.
    pub eligible: Vec<(DisruptionReason, usize)>,
}

impl PassStats {
    fn eligible(cands: &[Candidate]) -> Vec<(DisruptionReason, usize)> {
        let count = |f: &dyn Fn(&Candidate) -> bool| cands.iter().filter(|c| f(c)).count();
        vec![
            (DisruptionReason::Empty, count(&|c| c.is_empty() && c.consolidatable && c.drift.is_none())),
            (DisruptionReason::Drifted, count(&|c| c.drift.is_some())),
            (DisruptionReason::Underutilized, count(&|c| c.consolidatable && c.consolidation_block.is_none())),
        ]
    }
}

/// What a pass reads.
pub struct Inputs<'a> {
    /// The cluster.
    pub state: &'a ClusterState,
    /// Instance types per pool (prices, and capacity for replacements).
    pub types_for: &'a crate::provisioning::TypesFor<'a>,
    /// Settings (feature gates, fleet-pricing knobs).
    pub settings: &'a Settings,
    /// The time of the pass.
    pub now: Timestamp,
}

/// Runs one disruption pass: the first method that returns commands wins.
pub fn compute(inputs: &Inputs<'_>) -> Pass {
    let (cands, blocked) = candidates(inputs.state, inputs.types_for, inputs.now);
    compute_from(inputs, cands, blocked)
}

/// A pass over candidates already found by [`candidates`], with the nodes they left out and why.
pub fn compute_from(inputs: &Inputs<'_>, cands: Vec<Candidate>, blocked: Vec<Blocked>) -> Pass {
    compute_with(inputs, cands, blocked, &BTreeSet::new(), &|_| false)
}

/// As [`compute_from`], single-node consolidation taking the pools of `unseen` first: those a previous
/// pass's single-node sweep ran out of time before reaching ([`Pass::unseen_pools`]). Each consolidation
/// method has its own timeout (`multi-node-consolidation-timeout`, `single-node-consolidation-timeout`),
/// counted from its own start. `unread` names the nodes whose reason for staying nobody will read (see
/// [`Simulator::with_unread`]): their reasons in [`Pass::unconsolidatable`] may be shorter;
/// the commands are the same.
pub fn compute_with(
    inputs: &Inputs<'_>,
    cands: Vec<Candidate>,
    mut blocked: Vec<Blocked>,
    unseen: &BTreeSet<String>,
    unread: &dyn Fn(&str) -> bool,
) -> Pass {
    let filtered = blocked.iter().map(|b| b.node.clone()).collect();
    let mut sim = Simulator::new(inputs, &cands).with_unread(unread);
    let mut stats = PassStats { evaluations: Vec::new(), eligible: PassStats::eligible(&cands) };
    for method in [
        Method::Emptiness,
        Method::StaticDrift,
        Method::Drift,
        Method::MultiNodeConsolidation,
        Method::SingleNodeConsolidation,
    ] {
        let began = Instant::now();
        let (commands, notes) = match method {
            Method::Emptiness => sim.emptiness(&cands),
            Method::StaticDrift => sim.drift(&cands, true),
            Method::Drift => sim.drift(&cands, false),
            Method::MultiNodeConsolidation => {
                let timeout = inputs.settings.multi_node_consolidation_timeout;
                sim.multi_node(&cands, &mut || began.elapsed() > timeout)
            }
            Method::SingleNodeConsolidation => {
                let timeout = inputs.settings.single_node_consolidation_timeout;
                sim.single_node(&cands, unseen, &mut || began.elapsed() > timeout)
            }
            // Repair runs from the controller, which holds the provider's policies and reboot history.
            Method::NodeRepair => (Vec::new(), Vec::new()),
        };
        stats.evaluations.push((method, began.elapsed()));
        if !commands.is_empty() {
            let acted: Vec<&str> = commands.iter().flat_map(|c| c.candidates.iter().map(|x| x.node.as_str())).collect();
            blocked.extend(notes.into_iter().filter(|b| !acted.contains(&b.node.as_str())));
            dedupe(&mut blocked);
            let unseen_pools = None;
            return Pass {
                method: Some(method),
                commands,
                unconsolidatable: blocked,
                blocked: filtered,
                stats,
                unseen_pools,
            };
        }
        blocked.extend(notes);
    }
    dedupe(&mut blocked);
    let unseen_pools = sim.take_unseen_pools();
    Pass { method: None, commands: Vec::new(), unconsolidatable: blocked, blocked: filtered, stats, unseen_pools }
}

/// What digests of a cluster are made with ([`digest`], and the simulated kube-scheduler's): foldhash's
/// quality variant, seeded at random once per process. It hashes the many short strings of a digest (every
/// pod's key, every node's name) at a fraction of SipHash's cost, with 64-bit output of the same statistical
/// quality; its random seed keeps anyone who names pods from picking names that collide (a collision only
/// skips one pass, for at most [`QUIET_RECHECK`]). The crate is already part of the build, through hashbrown.
pub type DigestState = foldhash::quality::RandomState;

/// How long a pass that found nothing is trusted while its digest stays the same. Prices, budgets and
/// remaining lifetimes move without any object changing, so the fleet is examined afresh at least this often.
pub const QUIET_RECHECK: std::time::Duration = std::time::Duration::from_secs(300);

/// A digest of what a pass decides on: every node and pod and where it stands, the candidates (drifted,
/// consolidatable now or not, their pods and prices), each pool's budget allowances, and the offerings
/// each pool can buy. A pass whose digest matches the last one that found nothing would find nothing again,
/// up to the slow drift of remaining lifetimes that [`QUIET_RECHECK`] bounds; the controller skips it, as an
/// unchanged cluster needs no new simulation.
///
/// Digests compare only when made with the same `state`: one kept for the life of the controller, seeded
/// at random ([`DigestState`]).
pub fn digest(inputs: &Inputs<'_>, cands: &[Candidate], state: &DigestState) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = state.build_hasher();
    let state = inputs.state;
    for n in &state.nodes {
        (&n.name, &n.pool, n.deleting, n.ready, n.initialized, n.unschedulable, n.nominated).hash(&mut h);
        (&n.allocatable, &n.requested, n.taints.len(), n.pods.len()).hash(&mut h);
    }
    for p in state.pods.iter() {
        (&p.info.key, &p.info.node_name, p.terminal).hash(&mut h);
    }
    for c in cands {
        (&c.node, &c.drift, c.consolidatable, c.price.to_bits(), &c.pods).hash(&mut h);
    }
    for reason in [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized] {
        for (pool, allowed, _) in allowances(state, reason, inputs.now) {
            (pool, allowed).hash(&mut h);
        }
    }
    for pool in &state.pools {
        for it in (inputs.types_for)(pool).iter() {
            it.name.hash(&mut h);
            for o in &it.offerings {
                (&o.zone, o.capacity_type, o.price.to_bits(), o.available, o.reservation_capacity).hash(&mut h);
            }
        }
    }
    h.finish()
}

/// Keeps the first reason given for each node.
fn dedupe(blocked: &mut Vec<Blocked>) {
    let mut seen = std::collections::HashSet::new();
    blocked.retain(|b| seen.insert(b.node.clone()));
    blocked.sort_by(|a, b| a.node.cmp(&b.node));
}

#[cfg(test)]
mod tests;
