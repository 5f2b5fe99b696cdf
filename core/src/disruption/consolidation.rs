//! The backwards simulation and the methods built on it.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::candidates::{self, Blocked, Candidate, allowances};
use super::{CandidateRef, Command, Decision, Inputs, Replacement};
use crate::api::{ConsolidationPolicy, DisruptionReason, labels};
use crate::cloud::{CapacityType, InstanceType};
use crate::provisioning;
use crate::resources::Resources;
use crate::scheduling::{
    ClaimPlan, ExistingNode, PodGroups, PodInfo, Requirement, Requirements, Results, Scheduler, StopAt, Stopped,
    offering_ok,
};

/// Balanced consolidation approves a move whose savings share is at least `1/K` of its disruption share.
const BALANCED_K: f64 = 2.0;
/// Multi-node consolidation considers at most this many candidates.
const MAX_MULTI_CANDIDATES: usize = 100;

/// The worst price of the first capacity type (reserved, spot, on-demand) with a compatible offering.
fn worst_launch_price(it: &InstanceType, reqs: &Requirements) -> Option<f64> {
    CapacityType::ALL.iter().find_map(|ct| {
        it.offerings
            .iter()
            .filter(|o| o.capacity_type == *ct && offering_ok(o, reqs))
            .map(|o| o.price)
            .max_by(f64::total_cmp)
    })
}

fn worst_capacity_type(it: &InstanceType, reqs: &Requirements) -> Option<CapacityType> {
    CapacityType::ALL.into_iter().find(|ct| it.offerings.iter().any(|o| o.capacity_type == *ct && offering_ok(o, reqs)))
}

/// The first `minValues` requirement of `plan` its options no longer meet, said for a person.
fn unmet_min_values(plan: &ClaimPlan) -> Option<String> {
    let reqs = &plan.requirements;
    reqs.iter().find_map(|r| {
        let min = r.min_values()?;
        let mut values: Vec<&str> = Vec::new();
        for it in &plan.types {
            match r.key() {
                labels::ZONE | labels::CAPACITY_TYPE => {
                    for o in it.offerings.iter().filter(|o| offering_ok(o, reqs)) {
                        values.push(if r.key() == labels::ZONE { o.zone.as_str() } else { o.capacity_type.as_str() });
                    }
                }
                key => values.extend(it.label(key)),
            }
        }
        values.sort_unstable();
        values.dedup();
        ((values.len() as u32) < min).then(|| {
            format!("the cheaper options span {} value(s) of {}, below its minValues {min}", values.len(), r.key())
        })
    })
}

/// The capacity type a replacement onto the `kept` options of `types` is pinned to, so that no launch
/// costs more than its worst case was priced at. Options may launch both spot and on-demand: spot, as
/// Karpenter's `computeConsolidation` pins it (an on-demand fallback of an option priced as spot could
/// cost more than the node it replaces), keeping only the options whose spot worst case passes `ok`
/// (`kept` may end up empty). Otherwise the one capacity type the options were priced on, unless that is
/// on-demand.
fn pin_capacity(
    types: &[Arc<InstanceType>],
    kept: &mut Vec<usize>,
    reqs: &Requirements,
    ok: impl Fn(f64) -> bool,
) -> Option<CapacityType> {
    let may_launch = |ct: CapacityType, kept: &[usize]| {
        kept.iter().any(|&i| types[i].offerings.iter().any(|o| o.capacity_type == ct && offering_ok(o, reqs)))
    };
    let pinned = if may_launch(CapacityType::Spot, kept) && may_launch(CapacityType::OnDemand, kept) {
        let mut spot = reqs.clone();
        spot.add(Requirement::is_in(labels::CAPACITY_TYPE, [CapacityType::Spot.as_str()]));
        kept.retain(|&i| worst_launch_price(&types[i], &spot).is_some_and(&ok));
        Some(CapacityType::Spot)
    } else {
        kept.iter().filter_map(|&i| worst_capacity_type(&types[i], reqs)).max()
    };
    pinned.filter(|c| *c != CapacityType::OnDemand)
}

/// Runs consolidation simulations against one shared base scheduler.
pub struct Simulator<'a> {
    inputs: &'a Inputs<'a>,
    /// The schedulers every simulation clones, built on the first simulation: a pass that simulates
    /// nothing (no candidate gets that far) never builds them.
    bases: std::cell::OnceCell<Bases>,
    /// The candidates not yet consolidatable (inside their own `consolidateAfter`).
    unsettled: Vec<String>,
    /// Each pool's cost and disruption, the Balanced policy's denominators.
    pool_totals: HashMap<String, PoolTotals>,
    split_attempts: u32,
    /// Nodes not yet initialized and Ready: no candidate's pods may count on them.
    booting: HashSet<String>,
    /// The pools single-node consolidation did not reach before it ran out of time, when it did; `None`
    /// when it found a command (the previous pass's record stands).
    unseen_pools: Option<BTreeSet<String>>,
    /// The nodes whose reason for staying nobody reads this pass ([`Simulator::with_unread`]).
    unread: &'a dyn Fn(&str) -> bool,
}

/// Every reason is read unless the caller says otherwise.
fn every_reason_read(_: &str) -> bool {
    false
}

/// Why a spot candidate stays when the simulation stopped at the first pod that needs a new node.
pub(super) const NEEDS_A_NEW_SPOT_NODE: &str =
    "its pods need a new node, and spot-to-spot consolidation is disabled (feature gate SpotToSpotConsolidation)";

/// Why a spot candidate stays, not simulated, when one of its pods has no other node to land on.
pub(super) const FITS_NO_OTHER_NODE: &str = "one of its pods has room on no other ready node taking pods, and \
     spot-to-spot consolidation is disabled (feature gate SpotToSpotConsolidation)";

/// Why a candidate stays when the simulation stopped at a new node that could cost no less than it, or at
/// a second new node.
pub(super) const NEEDS_A_DEARER_NODE: &str =
    "its pods need a new node that would cost no less than it, or more than one new node";

/// Why a candidate stays when the simulation stopped at a pod placed on a node still booting.
pub(super) const LANDS_ON_A_BOOTING_NODE: &str = "a pod would schedule against a node not yet initialized and Ready";

/// The indexes of `cands`' nodes among the existing nodes of `base`, a scheduler built over the state's
/// nodes in its order (a candidate's index finds its node); `None` when some candidate's is not there.
fn node_indexes(base: &Scheduler, cands: &[&Candidate]) -> Option<Vec<usize>> {
    cands.iter().map(|c| (base.node_name(c.index) == Some(c.node.as_str())).then_some(c.index)).collect()
}

/// Whether two pods ask the same of an existing node's room, taints and labels at every level of their
/// relaxation ([`Scheduler::might_land_on_a_node`]).
fn fits_alike(a: &PodInfo, b: &PodInfo) -> bool {
    a.requests == b.requests
        && a.tolerations == b.tolerations
        && a.node_selector == b.node_selector
        && a.required_terms == b.required_terms
        && a.preferred_terms == b.preferred_terms
}

/// Whether nothing `pod` requires of its node (node selector, each required and preferred term, and the
/// keys of its topology terms) narrows the capacity type away from spot.
fn allows_spot(pod: &PodInfo) -> bool {
    let spot = |r: &crate::scheduling::Requirements| {
        r.get(labels::CAPACITY_TYPE).is_none_or(|r| r.has(CapacityType::Spot.as_str()))
    };
    spot(&pod.node_selector)
        && pod.required_terms.iter().all(spot)
        && pod.preferred_terms.iter().all(|(_, r)| spot(r))
        && pod.all_terms().all(|t| t.key != labels::CAPACITY_TYPE)
}

/// The shared bases of a pass's simulations.
struct Bases {
    /// Every node.
    base: RefCell<Registered>,
    /// As `base`, with nodes inside their own `consolidateAfter` taking no pods from others.
    settled: RefCell<Registered>,
    /// Whether every claim `settled` opens stays open to spot ([`Scheduler::claims_stay_spot_capable`]),
    /// as it stands before any candidate's pod is registered. The groups registered later for some
    /// candidates' pods narrow only the claims those pods join, and a candidate read for spot
    /// ([`Simulator::only_a_delete_moves`]) has no pod with a term keyed on the capacity type.
    claims_stay_spot_capable: bool,
    /// Whether `settled`'s solves re-pack their claims ([`Scheduler::repacks_claims`]).
    repacks_claims: bool,
    /// What pods could still take of `settled`'s nodes ([`Scheduler::total_node_room`]) and of one new
    /// claim ([`Scheduler::most_claim_room`]).
    room: Resources,
}

/// A base scheduler with the topology constraints of the candidates' pods it simulated so far registered,
/// each pod's the first time a simulation places it: a pass simulates few of the pods its candidates
/// hold, and clones of the base share what it registered.
struct Registered {
    scheduler: Scheduler,
    /// The topology groups of each pod registered (by index into the pass's pods).
    groups: Vec<Option<PodGroups>>,
}

impl Registered {
    /// `scheduler` with none of the pass's `pods` pods registered yet, in a cell each simulation borrows in
    /// turn.
    fn cell(scheduler: Scheduler, pods: usize) -> RefCell<Self> {
        RefCell::new(Self { scheduler, groups: vec![None; pods] })
    }

    /// Registers the pods at `indexes` (of `all`, the state's pods) not registered yet, and again those
    /// registered before a group that could select them was.
    fn register(&mut self, all: &[crate::state::StatePod], indexes: impl Iterator<Item = usize>) {
        let scheduler = &self.scheduler;
        let new: Vec<usize> = indexes
            .filter(|i| match self.groups.get(*i) {
                Some(Some(g)) => !scheduler.knows_every_group_of(g),
                Some(None) => true,
                None => false,
            })
            .collect();
        if new.is_empty() {
            return;
        }
        let registered = self.scheduler.register(new.iter().map(|i| &*all[*i].info));
        for (i, g) in new.into_iter().zip(registered) {
            self.groups[i] = Some(g);
        }
    }
}

/// A pool's whole cost per hour and whole disruption cost, over every node it has (candidates or not).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolTotals {
    /// What its nodes cost per hour (those with a known price).
    pub cost: f64,
    /// The sum of its nodes' [`candidates::reschedule_cost`].
    pub disruption: f64,
}

/// The Balanced policy's verdict on a move, for one pool: the share of the pool's cost it saves against
/// the share of the pool's disruption it causes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// Savings ÷ the pool's cost.
    pub savings: f64,
    /// Disruption ÷ the pool's disruption.
    pub disruption: f64,
}

impl Score {
    /// Scores `savings` per hour for `disruption` against a pool's totals; with either total zero there is
    /// nothing to weigh against, and the score is zero.
    pub fn of(savings: f64, disruption: f64, totals: PoolTotals) -> Self {
        if totals.cost <= 0.0 || totals.disruption <= 0.0 {
            return Self { savings: 0.0, disruption: 0.0 };
        }
        Self { savings: savings / totals.cost, disruption: disruption / totals.disruption }
    }

    /// Savings share ÷ disruption share: zero when nothing is saved, infinite when nothing is disrupted.
    pub fn value(&self) -> f64 {
        if self.savings <= 0.0 {
            0.0
        } else if self.disruption == 0.0 {
            f64::INFINITY
        } else {
            self.savings / self.disruption
        }
    }

    /// The score a move needs: 1/k.
    pub fn threshold() -> f64 {
        1.0 / BALANCED_K
    }

    /// Whether the move is worth its disruption.
    pub fn approved(&self) -> bool {
        self.value() >= Self::threshold()
    }

    fn describe(&self) -> String {
        format!(
            "saves {:.1}% of the pool's cost for {:.1}% of its disruption (score {:.2}, threshold {:.2})",
            100.0 * self.savings,
            100.0 * self.disruption,
            self.value(),
            Self::threshold()
        )
    }
}

/// Every pool's [`PoolTotals`] over all its nodes: a candidate counts with its own price and reschedule
/// cost, any other node (blocked, booting, deleting) with its offering's price and its reschedulable pods,
/// as Karpenter's `computeNodePoolTotals` sums them.
fn pool_totals(inputs: &Inputs<'_>, cands: &[Candidate]) -> HashMap<String, PoolTotals> {
    let state = inputs.state;
    let by_index: HashMap<usize, &Candidate> = cands.iter().map(|c| (c.index, c)).collect();
    let mut types: HashMap<&str, Arc<[InstanceType]>> = HashMap::new();
    let mut totals: HashMap<String, PoolTotals> = HashMap::new();
    for (i, node) in state.nodes.iter().enumerate() {
        let Some(pool) = node.pool.as_deref() else { continue };
        let (price, disruption) = match by_index.get(&i) {
            Some(c) => (c.price, c.reschedule_cost),
            None => {
                let price = match state.pool(pool) {
                    Some(np) => node.price(types.entry(pool).or_insert_with(|| (inputs.types_for)(np))).unwrap_or(0.0),
                    None => 0.0,
                };
                let pods = node.pods.iter().map(|p| &state.pods[*p]).filter(|p| p.reschedulable());
                (price, candidates::reschedule_cost(pods))
            }
        };
        let t = totals.entry(pool.to_owned()).or_default();
        t.cost += price;
        t.disruption += disruption;
    }
    totals
}

impl<'a> Simulator<'a> {
    /// Prepares a pass over `cands`; the shared bases are built when first needed.
    pub fn new(inputs: &'a Inputs<'a>, cands: &[Candidate]) -> Self {
        let state = inputs.state;
        let unsettled = cands.iter().filter(|c| !c.consolidatable).map(|c| c.node.clone()).collect();
        let pool_totals = pool_totals(inputs, cands);
        let booting = state.nodes.iter().filter(|n| !n.initialized || !n.ready).map(|n| n.name.clone()).collect();
        Self {
            inputs,
            bases: std::cell::OnceCell::new(),
            unsettled,
            pool_totals,
            split_attempts: 0,
            booting,
            unseen_pools: None,
            unread: &every_reason_read,
        }
    }

    /// Says which nodes' reasons nobody reads this pass (the operator's `Unconsolidatable` event about them
    /// is still silenced). Single-node consolidation may turn such a candidate down as soon as its answer
    /// is known, with a shorter reason; what it decides is the same.
    #[must_use]
    pub fn with_unread(mut self, unread: &'a dyn Fn(&str) -> bool) -> Self {
        self.unread = unread;
        self
    }

    /// The scheduling view of the state's pod `i`.
    fn pod(&self, i: usize) -> &Arc<PodInfo> {
        &self.inputs.state.pods[i].info
    }

    /// The shared bases: every node, with the room pending pods will take subtracted.
    fn bases(&self) -> &Bases {
        self.bases.get_or_init(|| {
            let inputs = self.inputs;
            let state = inputs.state;
            let nodes: Vec<ExistingNode> = state.nodes.iter().map(|n| n.as_existing()).collect();
            let pools = provisioning::pool_inputs(state, inputs.types_for);
            let bound = state.bound_on_nodes();
            let options = provisioning::scheduler_options(inputs.settings);
            let mut base = Scheduler::with_bound_on_nodes(pools, nodes, &bound, &state.daemons, options);
            // Pending pods and the pods of nodes already being deleted land first: the room they will take
            // (often on capacity booting for them) is not room for the candidates' pods. They are placed on
            // a copy of the base, which then gives up that room.
            let first: Vec<Arc<PodInfo>> = state.pods_to_place().map(|p| Arc::clone(&p.info)).collect();
            if !first.is_empty() {
                let requests: HashMap<String, Resources> =
                    first.iter().map(|p| (p.key.clone(), p.requests.clone())).collect();
                let by_name: HashMap<&str, usize> =
                    state.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
                let placed = base.clone().solve_shared(first);
                for p in placed.existing {
                    let Some(&i) = by_name.get(p.node.as_str()) else { continue };
                    for r in p.pods.iter().filter_map(|k| requests.get(k)) {
                        base.take_room(i, r);
                    }
                }
            }
            let mut settled = base.clone();
            let unsettled: Vec<&str> = self.unsettled.iter().map(String::as_str).collect();
            settled.block_nodes(&unsettled);
            let booting: Vec<&str> = self.booting.iter().map(String::as_str).collect();
            settled.stop_on_landing(&booting);
            let claims_stay_spot_capable = settled.claims_stay_spot_capable();
            let repacks_claims = settled.repacks_claims();
            let room = settled.total_node_room().add(&settled.most_claim_room());
            let pods = state.pods.len();
            Bases {
                base: Registered::cell(base, pods),
                settled: Registered::cell(settled, pods),
                claims_stay_spot_capable,
                repacks_claims,
                room,
            }
        })
    }

    fn settings(&self) -> &'a crate::settings::Settings {
        self.inputs.settings
    }

    /// Reschedules the candidates' pods without the candidates.
    fn simulate(
        &self,
        cands: &[&Candidate],
        consolidating: bool,
        off_on_demand: bool,
        ceiling: Option<f64>,
    ) -> Results {
        let (sim, pods, groups) = self.prepare(cands, consolidating, off_on_demand, ceiling);
        let results = match groups {
            Some(groups) => sim.solve_registered(pods, groups.iter().collect()),
            None => sim.solve_shared(pods),
        };
        self.keep_off_booting(results)
    }

    /// As [`Simulator::simulate`] for candidates while consolidating, unless their pods open a new node
    /// or land on a booting one where `stop` says to stop: then where it stopped
    /// ([`Scheduler::solve_registered_unless`]).
    fn simulate_unless(&self, cands: &[&Candidate], stop: StopAt) -> Result<Results, Stopped> {
        let (sim, pods, groups) = self.prepare(cands, true, false, None);
        let results = match groups {
            Some(groups) => sim.solve_registered_unless(pods, groups.iter().collect(), stop)?,
            None => sim.solve_shared(pods),
        };
        Ok(self.keep_off_booting(results))
    }

    /// A simulation's scheduler (a base without the candidates) and the candidates' pods with their
    /// registered groups (`None` when some pod's are not known).
    fn prepare(
        &self,
        cands: &[&Candidate],
        consolidating: bool,
        off_on_demand: bool,
        ceiling: Option<f64>,
    ) -> (Scheduler, Vec<Arc<PodInfo>>, Option<Vec<PodGroups>>) {
        let bases = self.bases();
        let mut from = if consolidating { &bases.settled } else { &bases.base }.borrow_mut();
        let indexes = cands.iter().flat_map(|c| c.pods.iter().copied());
        from.register(&self.inputs.state.pods, indexes.clone());
        let groups = indexes.clone().map(|i| from.groups.get(i).cloned().flatten()).collect();
        let from = &from.scheduler;
        let mut sim = match node_indexes(from, cands) {
            Some(at) => from.without_nodes_at(&at),
            None => from.without_nodes(&cands.iter().map(|c| c.node.as_str()).collect::<Vec<_>>()),
        };
        if off_on_demand {
            // A lease reclaim: the replacement runs on spot or on owned (reserved) capacity, never on
            // another on-demand node.
            sim.restrict_pools(Requirement::is_in(
                labels::CAPACITY_TYPE,
                [CapacityType::Spot.as_str(), CapacityType::Reserved.as_str()],
            ));
        }
        if ceiling.is_some() {
            let mut options = provisioning::scheduler_options(self.settings());
            options.price_ceiling = ceiling;
            sim = sim.with_options(options);
        }
        let pods: Vec<Arc<PodInfo>> = indexes.map(|i| Arc::clone(self.pod(i))).collect();
        (sim, pods, groups)
    }

    /// `results` with the pods placed on nodes still booting turned unschedulable.
    fn keep_off_booting(&self, mut results: Results) -> Results {
        // A candidate's pods may not count on a node that is not initialized and Ready: deleting a node on
        // the promise of capacity still booting moves its pods onto room that other pods are waiting for.
        let (settled, booting): (Vec<_>, Vec<_>) =
            results.existing.into_iter().partition(|p| !self.booting.contains(&p.node));
        results.existing = settled;
        for placement in booting {
            for pod in placement.pods {
                results.unschedulable.push(crate::scheduling::Unschedulable {
                    pod,
                    reason: format!("would schedule against uninitialized node {}", placement.node),
                });
            }
        }
        results
    }

    fn refs(cands: &[&Candidate]) -> Vec<CandidateRef> {
        cands
            .iter()
            .map(|c| CandidateRef { node: c.node.clone(), node_claim: c.claim.clone(), price: c.price })
            .collect()
    }

    /// Emptiness: delete consolidatable nodes with no pods to move, within the `Empty` budget.
    pub fn emptiness(&mut self, cands: &[Candidate]) -> (Vec<Command>, Vec<Blocked>) {
        let mut budget: HashMap<String, (u64, Option<String>)> =
            allowances(self.inputs.state, DisruptionReason::Empty, self.inputs.now)
                .into_iter()
                .map(|(p, a, u)| (p, (a, u)))
                .collect();
        let mut chosen: Vec<&Candidate> = Vec::new();
        let mut notes = Vec::new();
        let state = self.inputs.state;
        let dynamic = |c: &Candidate| state.pool(&c.pool).is_some_and(|p| p.spec.replicas.is_none());
        for c in cands.iter().filter(|c| c.is_empty() && c.consolidatable && c.drift.is_none() && dynamic(c)) {
            match budget.get_mut(&c.pool) {
                Some((left, _)) if *left > 0 => {
                    *left -= 1;
                    chosen.push(c);
                }
                Some((_, until)) => notes.push(budget_note(c, DisruptionReason::Empty, until.as_deref())),
                None => {}
            }
        }
        if chosen.is_empty() {
            return (Vec::new(), notes);
        }
        let savings = chosen.iter().map(|c| c.price).sum();
        let command = Command {
            decision: Decision::Delete,
            reason: DisruptionReason::Empty,
            candidates: Self::refs(&chosen),
            replacements: Vec::new(),
            savings_per_hour: savings,
            explanation: String::new(),
            termination_grace: None,
        };
        (vec![command], notes)
    }

    /// Drift: replace drifted nodes, expired on-demand leases first (their replacements pinned to spot or reserved capacity),
    /// then empty ones, within the `Drifted` budget. `static_pools` selects the pools with fixed replicas.
    pub fn drift(&mut self, cands: &[Candidate], static_pools: bool) -> (Vec<Command>, Vec<Blocked>) {
        let state = self.inputs.state;
        let mut drifted: Vec<&Candidate> = cands
            .iter()
            .filter(|c| c.drift.is_some())
            .filter(|c| state.pool(&c.pool).is_some_and(|p| p.spec.replicas.is_some() == static_pools))
            .collect();
        if drifted.is_empty() {
            return (Vec::new(), Vec::new());
        }
        // Expired leases first, then the empty, then in the order they drifted (the Drifted condition's
        // transition, as Karpenter orders them; a template drift with no condition yet goes last).
        let drifted_at = |c: &Candidate| {
            state.nodes[c.index]
                .claim
                .as_ref()
                .and_then(|claim| claim.condition(crate::api::condition_types::DRIFTED))
                .and_then(|d| d.last_transition_time)
        };
        drifted.sort_by_key(|c| (!c.lease_expired(), !c.is_empty(), drifted_at(c).is_none(), drifted_at(c)));
        let mut budget: HashMap<String, (u64, Option<String>)> =
            allowances(state, DisruptionReason::Drifted, self.inputs.now)
                .into_iter()
                .map(|(p, a, u)| (p, (a, u)))
                .collect();
        let mut notes = Vec::new();
        let mut empties = Vec::new();
        let mut static_commands = Vec::new();
        for c in drifted {
            let Some((left, until)) = budget.get_mut(&c.pool) else { continue };
            if *left == 0 {
                notes.push(budget_note(c, DisruptionReason::Drifted, until.as_deref()));
                continue;
            }
            if static_pools {
                // A static pool keeps its replica count: a node of the new template is launched first, and
                // the drifted one goes once it is initialized.
                let Some(pool) = state.pool(&c.pool) else { continue };
                let types = (self.inputs.types_for)(pool);
                let max = self.settings().max_instance_types as usize;
                let Some(plan) = crate::provisioning::static_claim_plan(pool, &types, max) else {
                    notes.push(Blocked {
                        node: c.node.clone(),
                        reason: "drifted, but no instance type its template allows is offered".into(),
                    });
                    continue;
                };
                *left -= 1;
                let r = replacement(&plan, None, None);
                let likely = plan.launch.as_ref().map_or(0.0, |l| l.price);
                static_commands.push(Command {
                    decision: Decision::Replace,
                    reason: DisruptionReason::Drifted,
                    candidates: Self::refs(&[c]),
                    replacements: vec![r],
                    savings_per_hour: c.price - likely,
                    explanation: format!(
                        "drifted: {}; a node of the pool's template replaces it",
                        c.drift.as_deref().unwrap_or("")
                    ),
                    termination_grace: None,
                });
                continue;
            }
            if c.is_empty() {
                *left -= 1;
                empties.push(c);
                continue;
            }
            if !empties.is_empty() {
                break;
            }
            let reclaim = c.lease_expired();
            let r = self.simulate(&[c], false, reclaim, None);
            if let Some(u) = r.unschedulable.first() {
                let reason = if reclaim {
                    format!(
                        "no spot or reserved capacity to reclaim its on-demand lease, keeping the on-demand node ({})",
                        u.reason
                    )
                } else {
                    format!(
                        "drifted ({}), but pod {} cannot be rescheduled: {}",
                        c.drift.as_deref().unwrap_or(""),
                        u.pod,
                        u.reason
                    )
                };
                notes.push(Blocked { node: c.node.clone(), reason });
                continue;
            }
            let replacements: Vec<Replacement> = r.claims.iter().map(|p| replacement(p, None, None)).collect();
            // Drift is not a price decision: the estimate is against the likely launch, not the worst case.
            let likely: f64 = r.claims.iter().filter_map(|p| p.launch.as_ref()).map(|l| l.price).sum();
            let command = Command {
                decision: if replacements.is_empty() { Decision::Delete } else { Decision::Replace },
                reason: DisruptionReason::Drifted,
                candidates: Self::refs(&[c]),
                replacements,
                savings_per_hour: c.price - likely,
                explanation: format!("drifted: {}", c.drift.as_deref().unwrap_or("")),
                termination_grace: None,
            };
            return (vec![command], notes);
        }
        if static_pools {
            return (static_commands, notes);
        }
        if empties.is_empty() {
            return (Vec::new(), notes);
        }
        let command = Command {
            decision: Decision::Delete,
            reason: DisruptionReason::Drifted,
            savings_per_hour: empties.iter().map(|c| c.price).sum(),
            candidates: Self::refs(&empties),
            replacements: Vec::new(),
            explanation: "drifted and empty".into(),
            termination_grace: None,
        };
        (vec![command], notes)
    }

    /// The candidates consolidation may consider, sorted by savings per unit of disruption, with notes
    /// for the others.
    fn consolidation_candidates<'c>(&self, cands: &'c [Candidate]) -> (Vec<&'c Candidate>, Vec<Blocked>) {
        let state = self.inputs.state;
        let mut notes = Vec::new();
        let mut out = Vec::new();
        for c in cands {
            let Some(pool) = state.pool(&c.pool) else { continue };
            if pool.spec.replicas.is_some() {
                notes.push(Blocked {
                    node: c.node.clone(),
                    reason: "its NodePool is static (spec.replicas): its nodes are not consolidated".into(),
                });
            } else if let Some(why) = &c.consolidation_block {
                notes.push(Blocked { node: c.node.clone(), reason: why.clone() });
            } else if pool.spec.disruption.consolidation_policy == ConsolidationPolicy::WhenEmpty {
                if !c.is_empty() {
                    notes.push(Blocked {
                        node: c.node.clone(),
                        reason: "consolidationPolicy WhenEmpty only removes empty nodes".into(),
                    });
                }
            } else {
                out.push(c);
            }
        }
        out.sort_by(|a, b| b.savings_ratio().total_cmp(&a.savings_ratio()).then_with(|| a.node.cmp(&b.node)));
        (out, notes)
    }

    /// Multi-node consolidation: the largest prefix (at least two, at most 100) of the sorted candidates
    /// that can go at once, with at most one replacement, found by binary search.
    pub fn multi_node(
        &mut self,
        cands: &[Candidate],
        out_of_time: &mut dyn FnMut() -> bool,
    ) -> (Vec<Command>, Vec<Blocked>) {
        let (sorted, notes) = self.consolidation_candidates(cands);
        let mut budget: HashMap<String, u64> =
            allowances(self.inputs.state, DisruptionReason::Underutilized, self.inputs.now)
                .into_iter()
                .map(|(p, a, _)| (p, a))
                .collect();
        let mut pool: Vec<&Candidate> = Vec::new();
        for c in sorted {
            if let Some(left) = budget.get_mut(&c.pool)
                && *left > 0
            {
                *left -= 1;
                pool.push(c);
            }
            if pool.len() == MAX_MULTI_CANDIDATES {
                break;
            }
        }
        if pool.len() < 2 {
            return (Vec::new(), notes);
        }
        let (mut lo, mut hi) = (2, pool.len());
        let mut best: Option<Command> = None;
        while lo <= hi {
            if out_of_time() {
                break;
            }
            let mid = (lo + hi) / 2;
            if !self.may_fit_one_claim(&pool[..mid]) {
                hi = mid - 1;
                continue;
            }
            // Nobody reads why a prefix cannot go: only whether it can.
            match self.consolidate_unread(&pool[..mid], true) {
                Ok(cmd) if cmd.replacements.len() <= 1 => {
                    best = Some(cmd);
                    lo = mid + 1;
                }
                _ => hi = mid - 1,
            }
        }
        (best.into_iter().collect(), notes)
    }

    /// Whether the pods of `cands` might fit the rest of the fleet and at most one new node, by their
    /// total request against what every other node taking pods has left and the largest room a new node of
    /// any pool gives. When not, a simulation of them would need a second node or leave a pod out: multi-node
    /// consolidation would turn them down, and need not simulate them to know.
    fn may_fit_one_claim(&self, cands: &[&Candidate]) -> bool {
        let bases = self.bases();
        let settled = bases.settled.borrow();
        let settled = &settled.scheduler;
        let mut room = bases.room.clone();
        for c in cands {
            if settled.node_name(c.index) == Some(c.node.as_str()) {
                room.sub_assign(&settled.node_room(c.index));
            }
        }
        let mut need = Resources::ZERO;
        for i in cands.iter().flat_map(|c| c.pods.iter()) {
            need.add_assign(&self.pod(*i).requests);
        }
        need.fits(&room)
    }

    /// Single-node consolidation: each candidate in turn (`interleave`d across pools, `first` the pools
    /// a previous pass did not reach), the first that can be deleted or replaced. `out_of_time` is asked
    /// before each candidate; once it answers true the rest are left for a later pass, and the pools not
    /// reached are kept ([`Simulator::take_unseen_pools`]).
    pub fn single_node(
        &mut self,
        cands: &[Candidate],
        first: &BTreeSet<String>,
        out_of_time: &mut dyn FnMut() -> bool,
    ) -> (Vec<Command>, Vec<Blocked>) {
        let (sorted, mut notes) = self.consolidation_candidates(cands);
        let sorted = interleave(sorted, first);
        let mut unseen: BTreeSet<String> = sorted.iter().map(|c| c.pool.clone()).collect();
        let budget: HashMap<String, (u64, Option<String>)> =
            allowances(self.inputs.state, DisruptionReason::Underutilized, self.inputs.now)
                .into_iter()
                .map(|(p, a, u)| (p, (a, u)))
                .collect();
        let mut timed_out = false;
        for c in sorted {
            if timed_out || out_of_time() {
                timed_out = true;
                notes.push(Blocked {
                    node: c.node.clone(),
                    reason: "inconclusive: consolidation ran out of time this pass; a later pass retries".into(),
                });
                continue;
            }
            unseen.remove(&c.pool);
            match budget.get(&c.pool) {
                Some((0, until)) => {
                    notes.push(budget_note(c, DisruptionReason::Underutilized, until.as_deref()));
                    continue;
                }
                None => continue,
                Some(_) => {}
            }
            if let Err(reason) = self.can_pass_threshold(c) {
                notes.push(Blocked { node: c.node.clone(), reason });
                continue;
            }
            let outcome = if (self.unread)(&c.node) {
                self.consolidate_unread(&[c], false)
            } else {
                self.consolidate(&[c], false)
            };
            match outcome {
                Ok(cmd) => return (vec![cmd], notes),
                Err(reason) => notes.push(Blocked { node: c.node.clone(), reason }),
            }
        }
        self.unseen_pools = Some(if timed_out { unseen } else { BTreeSet::new() });
        (Vec::new(), notes)
    }

    /// The pools the last single-node pass did not reach because it ran out of time (empty when it reached
    /// them all), or `None` when it found a command or did not run.
    pub fn take_unseen_pools(&mut self) -> Option<BTreeSet<String>> {
        self.unseen_pools.take()
    }

    /// Whether `cands` can go: delete when their pods fit the rest of the fleet, replace when one cheaper
    /// claim (or, with the split fallback, several under the candidate's price) takes what does not.
    pub fn consolidate(&mut self, cands: &[&Candidate], multi: bool) -> Result<Command, String> {
        let r = self.simulate(cands, true, false, None);
        self.conclude(cands, multi, r)
    }

    /// As [`Simulator::consolidate`] when nobody reads why `cands` stay: the simulation stops at a new
    /// node its pods open once the answer is known to be "stays" ([`Simulator::stop_for`]), with a shorter
    /// reason. A simulation that does not stop is the one [`Simulator::consolidate`] runs, concluded as it
    /// does, so every command is the same.
    pub(super) fn consolidate_unread(&mut self, cands: &[&Candidate], multi: bool) -> Result<Command, String> {
        let Some(stop) = self.stop_for(cands, multi) else {
            return self.consolidate(cands, multi);
        };
        if stop.first_claim_below == Some(f64::NEG_INFINITY) && self.a_pod_has_no_other_node(cands) {
            return Err(FITS_NO_OTHER_NODE.into());
        }
        match self.simulate_unless(cands, stop) {
            Ok(r) => self.conclude(cands, multi, r),
            // Only the spot stop takes any first claim and no second one.
            Err(Stopped::Claim) if stop.second_claim => Err(NEEDS_A_DEARER_NODE.into()),
            Err(Stopped::Claim) => Err(NEEDS_A_NEW_SPOT_NODE.into()),
            Err(Stopped::MarkedNode) => Err(LANDS_ON_A_BOOTING_NODE.into()),
        }
    }

    /// Whether some pod of `cands` can land on no node but theirs and those still booting, whatever else a
    /// simulation of them places ([`Scheduler::might_land_on_a_node`]). When only a delete can move them
    /// ([`Simulator::stop_for`] stopping at any new node), they then stay: that pod opens a new node, lands
    /// on a booting one, or stays unscheduled, and the simulation need not run to say so.
    fn a_pod_has_no_other_node(&self, cands: &[&Candidate]) -> bool {
        let settled = self.bases().settled.borrow();
        let settled = &settled.scheduler;
        let Some(at) = node_indexes(settled, cands) else { return false };
        // Replicas of one owner ask the same: each is asked once in a row.
        let mut last: Option<&PodInfo> = None;
        cands.iter().flat_map(|c| c.pods.iter()).any(|i| {
            let pod = &**self.pod(*i);
            if last.is_some_and(|q| fits_alike(q, pod)) {
                return false;
            }
            last = Some(pod);
            !settled.might_land_on_a_node(pod, &at)
        })
    }

    /// Where a simulation of `cands` may stop once the answer is known to be "stays"; `None` when it must
    /// run in full. The answer is known at the first pod placed on a node still booting: its pods cannot
    /// count on that room ([`Simulator::keep_off_booting`], [`Simulator::conclude`]). With a split to try
    /// (single-node, several pods, the split fallback on) nothing is known at a new node. Otherwise it is
    /// also known
    /// - at any new node when only a delete can move them ([`Simulator::only_a_delete_moves`]);
    /// - at a first new node none of whose offerings costs less than they do: a replacement must be
    ///   priced below them (on spot too, for the on-demand → spot retry), and the options and offerings
    ///   left to a node only narrow as pods join it;
    /// - at a second new node: one replacement at most.
    ///
    /// The last two need the claims a solve returns to be the ones it opened: not when a pool packing by
    /// marginal cost re-packs them.
    fn stop_for(&self, cands: &[&Candidate], multi: bool) -> Option<StopAt> {
        let marked_node = !self.booting.is_empty();
        let no_claim = StopAt { first_claim_below: None, second_claim: false, marked_node };
        let stop = if self.split_applies(cands, multi) {
            no_claim
        } else if self.only_a_delete_moves(cands) {
            StopAt { first_claim_below: Some(f64::NEG_INFINITY), ..no_claim }
        } else if self.bases().repacks_claims {
            no_claim
        } else {
            let price = cands.iter().map(|c| c.price).sum();
            StopAt { first_claim_below: Some(price), second_claim: true, marked_node }
        };
        (stop.first_claim_below.is_some() || stop.second_claim || stop.marked_node).then_some(stop)
    }

    /// Whether the only command consolidation can give `cands`, no split considered, is a delete: spot
    /// nodes with spot-to-spot consolidation disabled whose replacement could only be spot (their pods,
    /// the pools and their offerings all leave spot open).
    fn only_a_delete_moves(&self, cands: &[&Candidate]) -> bool {
        !self.settings().feature_gates.spot_to_spot_consolidation()
            && cands.iter().all(|c| {
                c.capacity_type == Some(CapacityType::Spot) && c.pods.iter().all(|i| allows_spot(self.pod(*i)))
            })
            && self.bases().claims_stay_spot_capable
    }

    /// What a consolidation simulation `r` of `cands` comes to: a delete, a replace, a split, or why not.
    fn conclude(&mut self, cands: &[&Candidate], multi: bool, r: Results) -> Result<Command, String> {
        let price: f64 = cands.iter().map(|c| c.price).sum();
        if let Some(u) = r.unschedulable.first() {
            return Err(format!("pod {} cannot be rescheduled: {}", u.pod, u.reason));
        }
        let outcome = match r.claims.len() {
            0 => Ok(Command {
                decision: Decision::Delete,
                reason: DisruptionReason::Underutilized,
                candidates: Self::refs(cands),
                replacements: Vec::new(),
                savings_per_hour: price,
                explanation: "its pods fit on the rest of the fleet".into(),
                termination_grace: None,
            }),
            1 => self.replace(cands, &r.claims[0], price, multi),
            n => Err(format!("its pods would need {n} new nodes; one node is replaced by at most one")),
        };
        match outcome {
            Ok(command) => self.balanced(cands, command),
            // Neither a delete nor a 1:1 replace: the split fallback may still find several cheaper nodes.
            Err(reason) => match self.split(cands, price, multi)? {
                Some(command) => self.balanced(cands, command),
                None => Err(reason),
            },
        }
    }

    fn replace(&self, cands: &[&Candidate], plan: &ClaimPlan, price: f64, multi: bool) -> Result<Command, String> {
        let s = self.settings();
        let reqs = &plan.requirements;
        // Several nodes replaced by one of their own type must beat the cheapest of them: otherwise keeping
        // that node and deleting the rest saves as much and moves fewer pods (Karpenter's
        // filterOutSameInstanceType).
        let ceiling = if multi {
            cands
                .iter()
                .filter(|c| plan.instance_types.iter().any(|t| **t == *c.instance_type))
                .map(|c| c.price)
                .fold(price, f64::min)
        } else {
            price
        };
        let mut kept: Vec<usize> = (0..plan.types.len())
            .filter(|&i| worst_launch_price(&plan.types[i], reqs).is_some_and(|w| w < ceiling))
            .collect();
        let all_spot = cands.iter().all(|c| c.capacity_type == Some(CapacityType::Spot));
        let spot_allowed = reqs.get(labels::CAPACITY_TYPE).is_none_or(|r| r.has(CapacityType::Spot.as_str()));
        let mut explanation = String::new();
        if all_spot && spot_allowed {
            if !s.feature_gates.spot_to_spot_consolidation() {
                return Err("spot-to-spot consolidation is disabled (feature gate SpotToSpotConsolidation)".into());
            }
            if !multi {
                let floor = s.spot_to_spot_min_instance_types as usize;
                if kept.len() < floor {
                    return Err(format!(
                        "spot-to-spot needs {floor} cheaper instance types (spot-to-spot-min-instance-types), found {}",
                        kept.len()
                    ));
                }
                kept.truncate(floor);
                if kept.iter().any(|&i| *plan.instance_types[i] == *cands[0].instance_type) {
                    return Err(format!(
                        "{} is already among the {floor} cheapest spot options",
                        cands[0].instance_type
                    ));
                }
            }
        }
        if kept.is_empty() {
            let on_demand = cands.iter().all(|c| c.capacity_type == Some(CapacityType::OnDemand));
            if on_demand && spot_allowed && s.od_to_spot_consolidation {
                return self.od_to_spot(cands, plan, price, ceiling);
            }
            return Err("can't replace with a lower-priced node".into());
        }
        let pinned = pin_capacity(&plan.types, &mut kept, reqs, |w| w < price);
        if kept.is_empty() {
            return Err(
                "can't replace with a lower-priced node: only spot is cheaper, and on-demand may cost more".into()
            );
        }
        if pinned == Some(CapacityType::Spot) && cands.iter().any(|c| c.capacity_type != Some(CapacityType::Spot)) {
            explanation = "replacement pinned to spot, where its worst case was priced".into();
        }
        self.replace_with(cands, price, plan, &kept, pinned.map(|c| (c, None)), explanation)
    }

    /// A replace command onto `kept` options of `plan`, if it clears the savings floor.
    fn replace_with(
        &self,
        cands: &[&Candidate],
        price: f64,
        plan: &ClaimPlan,
        kept: &[usize],
        pin: Option<(CapacityType, Option<Vec<String>>)>,
        explanation: String,
    ) -> Result<Command, String> {
        let r = replacement(plan, Some(kept), pin);
        // The price filter may have cut the options below a minValues of the pool's (Karpenter checks
        // again after filtering, too).
        if let Some(why) = unmet_min_values(&r.plan) {
            return Err(format!("can't replace with a lower-priced node: {why}"));
        }
        let savings = price - r.worst_case_price;
        let floor = self.settings().consolidation_replace_min_savings;
        self.check_min_savings(savings, price, floor, "consolidation-replace-min-savings")?;
        Ok(Command {
            decision: Decision::Replace,
            reason: DisruptionReason::Underutilized,
            candidates: Self::refs(cands),
            replacements: vec![r],
            savings_per_hour: savings,
            explanation,
            termination_grace: None,
        })
    }

    fn check_min_savings(&self, savings: f64, price: f64, floor: f64, setting: &str) -> Result<(), String> {
        if price > 0.0 && savings / price < floor {
            return Err(format!(
                "saves {:.1}% (${savings:.4}/h), below the {:.1}% floor ({setting})",
                100.0 * savings / price,
                100.0 * floor
            ));
        }
        Ok(())
    }

    /// The on-demand → spot retry: re-price the claim as spot-only in the zones whose spot offerings beat
    /// the candidate, and pin the launch there.
    /// `ceiling` bounds each option's price (the candidates' price, or for several nodes that of the
    /// cheapest one whose type the options include); `price` is what the savings are counted against.
    fn od_to_spot(&self, cands: &[&Candidate], plan: &ClaimPlan, price: f64, ceiling: f64) -> Result<Command, String> {
        let mut spot = plan.requirements.clone();
        spot.add(Requirement::is_in(labels::CAPACITY_TYPE, [CapacityType::Spot.as_str()]));
        let mut zones: Vec<String> = plan
            .types
            .iter()
            .flat_map(|it| {
                it.offerings.iter().filter(|o| offering_ok(o, &spot) && o.price < ceiling).map(|o| o.zone.clone())
            })
            .collect();
        zones.sort();
        zones.dedup();
        if zones.is_empty() {
            return Err("can't replace with a lower-priced node, even as spot".into());
        }
        spot.add(Requirement::is_in(labels::ZONE, zones.iter().cloned()));
        let kept: Vec<usize> = (0..plan.types.len())
            .filter(|&i| worst_launch_price(&plan.types[i], &spot).is_some_and(|w| w < ceiling))
            .collect();
        if kept.is_empty() {
            return Err("can't replace with a lower-priced node, even as spot in its cheaper zones".into());
        }
        let explanation = format!("on-demand → spot retry: pinned to spot in {}", zones.join(", "));
        self.replace_with(cands, price, plan, &kept, Some((CapacityType::Spot, Some(zones))), explanation)
    }

    /// Whether the split fallback may try `cands`: one candidate of single-node consolidation with several
    /// pods, the fallback on and more than one replacement allowed.
    fn split_applies(&self, cands: &[&Candidate], multi: bool) -> bool {
        let s = self.settings();
        !multi
            && s.consolidation_split_fallback
            && s.max_consolidation_replacements >= 2
            && cands.len() == 1
            && cands[0].pods.len() >= 2
    }

    /// The 1→N split fallback: re-simulate under a price ceiling at the candidate's price.
    fn split(&mut self, cands: &[&Candidate], price: f64, multi: bool) -> Result<Option<Command>, String> {
        if !self.split_applies(cands, multi) {
            return Ok(None);
        }
        let s = self.settings();
        let max = s.max_consolidation_replacements as usize;
        if self.split_attempts >= s.consolidation_split_max_attempts {
            return Err("inconclusive: this pass used up its split attempts (consolidation-split-max-attempts)".into());
        }
        self.split_attempts += 1;
        let r = self.simulate(cands, true, false, Some(price));
        if let Some(u) = r.unschedulable.first() {
            return Err(format!("no split under ${price:.2}/h: pod {} {}", u.pod, u.reason));
        }
        // One claim is not a split but a replace under a ceiling, which the replace checks (worst-case
        // pricing, the spot-to-spot floor) have just turned down: letting it through would bypass the
        // guards that stop a node from being replaced over and over.
        if r.claims.len() < 2 {
            return Ok(None);
        }
        if r.claims.len() > max {
            return Err(format!(
                "a split needs {} nodes, more than max-consolidation-replacements {max}",
                r.claims.len()
            ));
        }
        // Each part is held to its cheapest option's worst case, so the sum priced is the most the split
        // can cost.
        let replacements: Vec<Replacement> = r
            .claims
            .iter()
            .map(|p| {
                let worst: Vec<Option<f64>> = p.types.iter().map(|t| worst_launch_price(t, &p.requirements)).collect();
                let floor = worst.iter().flatten().copied().fold(f64::INFINITY, f64::min);
                let mut kept: Vec<usize> =
                    (0..p.types.len()).filter(|&i| worst[i].is_some_and(|w| w <= floor)).collect();
                let pin = pin_capacity(&p.types, &mut kept, &p.requirements, |w| w <= floor);
                replacement(p, Some(&kept), pin.map(|c| (c, None)))
            })
            .collect();
        let worst: f64 = replacements.iter().map(|x| x.worst_case_price).sum();
        let savings = price - worst;
        if worst >= price {
            return Err("can't split into lower-priced nodes".into());
        }
        self.check_min_savings(savings, price, s.consolidation_split_min_savings, "consolidation-split-min-savings")?;
        Ok(Some(Command {
            decision: Decision::Replace,
            reason: DisruptionReason::Underutilized,
            candidates: Self::refs(cands),
            replacements,
            savings_per_hour: savings,
            explanation: format!("split 1 → {} under a ${price:.2}/h ceiling", r.claims.len()),
            termination_grace: None,
        }))
    }

    /// The Balanced policy, for each Balanced pool among the candidates' (as Karpenter's `balanced.go`):
    /// the pool's share of the savings (all of it, or split by the candidates' prices when the move spans
    /// pools) against its candidates' reschedule cost, over the pool's whole cost and disruption. Every
    /// Balanced pool must approve.
    fn balanced(&self, cands: &[&Candidate], mut command: Command) -> Result<Command, String> {
        let state = self.inputs.state;
        let mut pools: Vec<&str> = cands.iter().map(|c| c.pool.as_str()).collect();
        pools.sort_unstable();
        pools.dedup();
        let source_cost: f64 = cands.iter().map(|c| c.price).sum();
        let mut verdicts = Vec::new();
        let mut approved = true;
        for pool in &pools {
            if state.pool(pool).is_none_or(|p| p.spec.disruption.consolidation_policy != ConsolidationPolicy::Balanced)
            {
                continue;
            }
            let mine = cands.iter().filter(|c| c.pool == *pool);
            let (cost, disruption) = mine.fold((0.0, 0.0), |(p, d), c| (p + c.price, d + c.reschedule_cost));
            let savings = if pools.len() > 1 && source_cost > 0.0 {
                command.savings_per_hour * cost / source_cost
            } else {
                command.savings_per_hour
            };
            let score = Score::of(savings, disruption, self.pool_totals.get(*pool).copied().unwrap_or_default());
            approved &= score.approved();
            verdicts.push(if pools.len() > 1 {
                format!("NodePool {pool} {}", score.describe())
            } else {
                score.describe()
            });
        }
        if verdicts.is_empty() {
            return Ok(command);
        }
        let verdict = format!("Balanced: {}", verdicts.join("; "));
        if approved {
            command.explanation = verdict;
            Ok(command)
        } else {
            Err(format!("{verdict}: not worth the disruption"))
        }
    }

    /// Karpenter's `CanPassThreshold`: whether deleting the candidate outright (the best any move on it can
    /// do) would pass its pool's Balanced score; `Err` says why not. Other policies always pass.
    fn can_pass_threshold(&self, c: &Candidate) -> Result<(), String> {
        let balanced = self
            .inputs
            .state
            .pool(&c.pool)
            .is_some_and(|p| p.spec.disruption.consolidation_policy == ConsolidationPolicy::Balanced);
        let totals = self.pool_totals.get(&c.pool).copied().unwrap_or_default();
        if !balanced || totals.cost <= 0.0 {
            return Ok(());
        }
        let best = Score::of(c.price, c.reschedule_cost, totals);
        if best.approved() {
            Ok(())
        } else {
            Err(format!("Balanced: even deleting it {}: not worth the disruption", best.describe()))
        }
    }
}

/// Single-node consolidation's order: the candidates by savings ratio, taken in turn from each pool (the
/// pools `first` names, where a previous pass ran out of time before reaching them, then the others in the
/// order of their best candidate), so no pool's nodes wait behind every node of another.
fn interleave<'c>(sorted: Vec<&'c Candidate>, first: &BTreeSet<String>) -> Vec<&'c Candidate> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_pool: HashMap<&str, Vec<&'c Candidate>> = HashMap::new();
    for c in sorted {
        if !by_pool.contains_key(c.pool.as_str()) {
            order.push(c.pool.as_str());
        }
        by_pool.entry(c.pool.as_str()).or_default().push(c);
    }
    order.sort_by_key(|p| !first.contains(*p));
    let longest = by_pool.values().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..longest {
        for pool in &order {
            if let Some(c) = by_pool.get(pool).and_then(|cs| cs.get(i)) {
                out.push(*c);
            }
        }
    }
    out
}

fn budget_note(c: &Candidate, reason: DisruptionReason, until: Option<&str>) -> Blocked {
    Blocked {
        node: c.node.clone(),
        reason: match until {
            Some(t) => format!("budget for {reason} in NodePool {} is 0 until {t}", c.pool),
            None => format!("budget for {reason} in NodePool {} allows no more disruptions now", c.pool),
        },
    }
}

/// A replacement from a plan, optionally narrowed to some of its options and pinned to a capacity type
/// (and zones).
fn replacement(
    plan: &ClaimPlan,
    kept: Option<&[usize]>,
    pin: Option<(CapacityType, Option<Vec<String>>)>,
) -> Replacement {
    let all: Vec<usize> = (0..plan.types.len()).collect();
    let kept = kept.unwrap_or(&all);
    let mut reqs = plan.requirements.clone();
    if let Some((ct, zones)) = &pin {
        reqs.add(Requirement::is_in(labels::CAPACITY_TYPE, [ct.as_str()]));
        if let Some(z) = zones {
            reqs.add(Requirement::is_in(labels::ZONE, z.iter().cloned()));
        }
    }
    let mut capacity_types: Vec<CapacityType> = kept
        .iter()
        .flat_map(|&i| plan.types[i].offerings.iter().filter(|o| offering_ok(o, &reqs)).map(|o| o.capacity_type))
        .collect();
    capacity_types.sort();
    capacity_types.dedup();
    let mut zones: Vec<String> = kept
        .iter()
        .flat_map(|&i| plan.types[i].offerings.iter().filter(|o| offering_ok(o, &reqs)).map(|o| o.zone.clone()))
        .collect();
    zones.sort();
    zones.dedup();
    let worst = kept.iter().filter_map(|&i| worst_launch_price(&plan.types[i], &reqs)).fold(0.0_f64, f64::max);
    let mut narrowed = plan.clone();
    narrowed.requirements = reqs;
    narrowed.instance_types = kept.iter().map(|&i| plan.instance_types[i].clone()).collect();
    narrowed.types = kept.iter().map(|&i| plan.types[i].clone()).collect();
    narrowed.worst_case_price = worst;
    Replacement {
        instance_types: narrowed.instance_types.iter().map(|n| n.to_string()).collect(),
        capacity_types,
        zones,
        worst_case_price: worst,
        plan: narrowed,
    }
}
