//! The scheduler: existing nodes first, then claims opened earlier in the pass, then new claims from
//! NodePools by weight.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Taint;
use rustc_hash::FxHashMap;
use serde::Serialize;

use super::daemon::{DaemonPod, daemon_overhead};
use super::nodes::{Node, Nodes};
use super::pod::{Constraints, HostPort, PodInfo, Relaxation, TopologyKind};
use super::requirements::{Requirement, Requirements};
use super::taints;
use super::topology::{
    BoundOnNode, Domain, DomainFilter, Landed, NodeView, PlacementMemo, PoolDomains, Topology, offer_domain,
};
use crate::api::{NodePool, labels};
use crate::cloud::{CapacityType, InstanceType, Offering};
use crate::resources::{ResourceName, Resources, format_quantity};

#[path = "improve.rs"]
mod improve;

/// How a NodePool packs pods into the claims it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum Packing {
    /// First fit into the least-loaded claim already open; a new claim only when none fits.
    #[default]
    Binpack,
    /// Wherever the price rises least: growing a claim costs the rise of its cheapest launch price,
    /// opening one costs its cheapest price; ties go to the open claim.
    MarginalCost,
}

impl Packing {
    /// The policy a pool's `karpenter.sh/nodeclaim-packing-policy` annotation asks for.
    pub fn of(pool: &NodePool) -> Self {
        match pool.packing_policy() {
            Some("marginal-cost") => Self::MarginalCost,
            _ => Self::Binpack,
        }
    }
}

/// A NodePool and what it can buy.
#[derive(Debug, Clone)]
pub struct PoolInput {
    /// The pool.
    pub pool: NodePool,
    /// Its provider's instance types (with the unavailable-offerings cache already applied).
    pub instance_types: Arc<[InstanceType]>,
    /// Capacity of the pool's existing nodes and claims, counted against its limits.
    pub in_use: Resources,
    /// How many nodes the pool already has, counted against `limits.nodes`.
    pub nodes_in_use: u64,
}

/// A node that already exists (or a claim already launched), as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct ExistingNode {
    /// The node's name.
    pub name: String,
    /// Its labels (the hostname label is derived from the name when absent), shared with its source.
    pub labels: Arc<BTreeMap<String, String>>,
    /// The requirements `labels` make ([`Requirements::from_labels`]), when its source has them already;
    /// read from `labels` otherwise (and whenever the hostname label had to be added).
    pub requirements: Option<Arc<Requirements>>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Allocatable resources minus the requests of the pods bound to it (and of daemons still to come).
    pub available: Resources,
    /// Host ports its pods already bind.
    pub host_ports: Vec<HostPort>,
    /// Whether it may take pods (false for nodes being deleted, or, when consolidating, nodes inside their
    /// own `consolidateAfter`).
    pub accepts_pods: bool,
    /// The attach limit of each CSI driver that publishes one on it (its CSINode's `allocatable.count`),
    /// with the volumes its pods hold; a driver not listed has no limit.
    pub volume_room: Vec<VolumeRoom>,
}

/// One CSI driver's attach limit on a node, and the volumes (claims, `namespace/name`) attached under it.
/// A pod's volume already attached (a claim another pod of the node uses) takes no more room, as
/// Karpenter's volume usage counts distinct claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeRoom {
    /// The CSI driver.
    pub driver: String,
    /// How many volumes it may attach.
    pub limit: i64,
    /// The claims attached.
    pub attached: BTreeSet<String>,
}

impl VolumeRoom {
    /// Whether the node has room under its drivers' limits for `volumes` (driver, claim) on top of what
    /// it holds.
    pub fn admit(rooms: &[VolumeRoom], volumes: &[(String, String)]) -> bool {
        rooms.iter().all(|r| {
            let new = volumes.iter().filter(|(d, c)| *d == r.driver && !r.attached.contains(c)).count();
            new == 0 || r.attached.len() as i64 + new as i64 <= r.limit
        })
    }

    /// Records `volumes` as attached.
    pub fn attach(rooms: &mut [VolumeRoom], volumes: &[(String, String)]) {
        for (driver, claim) in volumes {
            if let Some(r) = rooms.iter_mut().find(|r| r.driver == *driver) {
                r.attached.insert(claim.clone());
            }
        }
    }
}

/// Knobs of one scheduling pass.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// The most instance-type options a claim carries.
    pub max_instance_types: usize,
    /// Ignore preferred terms entirely.
    pub ignore_preferences: bool,
    /// New claims may only use offerings priced strictly below this (the split fallback's ceiling).
    pub price_ceiling: Option<f64>,
    /// Whether a pool's packing-policy annotation is honoured (off: every pool packs fit-only).
    pub marginal_cost_packing: bool,
    /// Whether a claim whose `minValues` its options cannot meet is made anyway, with them lowered to what
    /// the options meet (`min-values-policy: BestEffort`).
    pub min_values_best_effort: bool,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            max_instance_types: 600,
            ignore_preferences: false,
            price_ceiling: None,
            marginal_cost_packing: true,
            min_values_best_effort: false,
        }
    }
}

/// The offering a claim would most likely get.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Launch {
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Capacity type.
    pub capacity_type: CapacityType,
    /// Price per hour.
    pub price: f64,
}

/// A claim the pass would create.
#[derive(Debug, Clone)]
pub struct ClaimPlan {
    /// The NodePool it comes from.
    pub pool: String,
    /// The pods it is for (`namespace/name`).
    pub pods: Vec<String>,
    /// Instance types it may launch, cheapest first.
    pub instance_types: Vec<Arc<str>>,
    /// The same instance types, with their offerings (sorted by price).
    pub types: Vec<Arc<InstanceType>>,
    /// Its requirements: the pool's, the pods', and the topology's (see
    /// [`ClaimPlan::node_claim_requirements`] for the full set a NodeClaim carries).
    pub requirements: Requirements,
    /// The pods' requests.
    pub requests: Resources,
    /// The DaemonSet overhead charged on the launch type.
    pub daemon_overhead: Resources,
    /// The cheapest available compatible offering.
    pub launch: Option<Launch>,
    /// The most the claim could cost: the worst compatible offering of the first capacity type (reserved,
    /// spot, on-demand) it can use.
    pub worst_case_price: f64,
    /// Whether some `minValues` of its requirements were lowered to what its options meet
    /// (`min-values-policy: BestEffort`).
    pub min_values_relaxed: bool,
}

impl ClaimPlan {
    /// The requirements of the NodeClaim to create: [`ClaimPlan::requirements`] plus
    /// `node.kubernetes.io/instance-type In [instance_types]`.
    pub fn node_claim_requirements(&self) -> Requirements {
        let mut r = self.requirements.clone();
        r.add(Requirement::is_in(labels::INSTANCE_TYPE, self.instance_types.iter().map(|n| n.to_string())));
        r
    }
}

/// Pods placed on an existing node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlacement {
    /// The node.
    pub node: String,
    /// The pods (`namespace/name`).
    pub pods: Vec<String>,
}

/// A pod that lands nowhere, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unschedulable {
    /// `namespace/name`.
    pub pod: String,
    /// The constraint that failed, for a person.
    pub reason: String,
}

/// A pod's topology groups in one scheduler: those of its own terms (in [`PodInfo::all_terms`] order) and
/// those that count it. [`Scheduler::register`] returns them so that copies of the scheduler can place
/// the pod without hashing its terms again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodGroups {
    /// Shared by the pods whose terms are equal.
    terms: Arc<[usize]>,
    /// Shared by the pods selected alike.
    selecting: Arc<[usize]>,
    /// How many groups the scheduler had when these were read: a group added since could select the pod.
    known: usize,
}

/// Where a solve asked only whether its pods can go with at most one claim, priced below some bound, and
/// none on a marked node, may stop ([`Scheduler::solve_registered_unless`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopAt {
    /// Stop at the first claim unless some offering its options allow costs less than this
    /// (`f64::NEG_INFINITY`: at any first claim; `None`: not at a first claim).
    pub first_claim_below: Option<f64>,
    /// Stop at a second claim.
    pub second_claim: bool,
    /// Stop once a pod lands on an existing node marked with [`Scheduler::stop_on_landing`].
    pub marked_node: bool,
}

/// Where a solve told where to stop ([`StopAt`]) stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// At a claim about to open.
    Claim,
    /// With a pod placed on a marked node.
    MarkedNode,
}

/// The outcome of a pass.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Claims to create.
    pub claims: Vec<ClaimPlan>,
    /// Pods placed on existing nodes.
    pub existing: Vec<NodePlacement>,
    /// Pods that land nowhere.
    pub unschedulable: Vec<Unschedulable>,
}

impl Results {
    /// The total of the claims' launch prices per hour.
    pub fn launch_price(&self) -> f64 {
        self.claims.iter().filter_map(|c| c.launch.as_ref()).map(|l| l.price).sum()
    }
}

#[derive(Debug, Clone)]
struct TypeEntry {
    name: Arc<str>,
    it: Arc<InstanceType>,
    reqs: Requirements,
    avail: Resources,
    overhead: Resources,
}

#[derive(Debug, Clone)]
struct Pool {
    name: String,
    reqs: Requirements,
    taints: Vec<Taint>,
    types: Arc<Vec<TypeEntry>>,
    /// The label keys its instance types define (`karpenter.k8s.aws/instance-family`, …): a pod may
    /// select on them without the pool naming them, as on the well-known keys.
    type_keys: Arc<BTreeSet<String>>,
    base: Arc<Vec<u32>>,
    packing: Packing,
    remaining: Option<Resources>,
    remaining_nodes: Option<u64>,
}

#[derive(Debug, Clone)]
struct Claim {
    pool: usize,
    reqs: Requirements,
    options: Vec<u32>,
    max_avail: Resources,
    requests: Resources,
    pods: Vec<usize>,
    host_ports: Vec<HostPort>,
    price: Option<f64>,
}

/// A placement that fits a claim: the narrowed requirements (when they change) and either the re-filtered
/// options (when requirements change) or how many cheap options at the front no longer fit.
struct Fit {
    reqs: Option<Requirements>,
    options: Option<Vec<u32>>,
    first: usize,
}

/// Claims by the single value they are pinned to on one key (`None`: still open), least loaded first.
type DomainIndex = FxHashMap<Option<String>, BTreeSet<(usize, usize)>>;

/// Merges sets of `(load, claim)` in ascending order, lazily: searches usually stop at the first entry.
struct MergeByLoad<'a> {
    heads: Vec<std::iter::Peekable<std::collections::btree_set::Iter<'a, (usize, usize)>>>,
}

impl<'a> MergeByLoad<'a> {
    fn new(sets: Vec<&'a BTreeSet<(usize, usize)>>) -> Self {
        Self { heads: sets.into_iter().map(|s| s.iter().peekable()).collect() }
    }
}

impl Iterator for MergeByLoad<'_> {
    type Item = (usize, usize);
    fn next(&mut self) -> Option<Self::Item> {
        let mut best: Option<(usize, (usize, usize))> = None;
        for (i, h) in self.heads.iter_mut().enumerate() {
            if let Some(&&v) = h.peek()
                && best.is_none_or(|(_, b)| v < b)
            {
                best = Some((i, v));
            }
        }
        let (i, v) = best?;
        self.heads[i].next();
        Some(v)
    }
}

/// The offering-level requirements (zone, capacity type, reservation) of a claim, looked up once.
#[derive(Clone, Copy)]
struct OfferFilter<'a> {
    zone: Option<&'a Requirement>,
    capacity_type: Option<&'a Requirement>,
    reservation: Option<&'a Requirement>,
    reqs: &'a Requirements,
    ceiling: Option<f64>,
}

impl<'a> OfferFilter<'a> {
    fn new(reqs: &'a Requirements, ceiling: Option<f64>) -> Self {
        Self {
            zone: reqs.get(labels::ZONE),
            capacity_type: reqs.get(labels::CAPACITY_TYPE),
            reservation: reqs.get(labels::RESERVATION_ID),
            reqs,
            ceiling,
        }
    }

    #[inline]
    fn ok(&self, o: &Offering) -> bool {
        o.available
            && self.ceiling.is_none_or(|c| o.price < c)
            && self.zone.is_none_or(|r| r.has(&o.zone))
            && self.capacity_type.is_none_or(|r| r.has(o.capacity_type.as_str()))
            && self.reservation.is_none_or(|r| o.reservation_id.as_deref().is_some_and(|id| r.has(id)))
            && (o.capacity_type != CapacityType::Reserved || o.reservation_capacity.unwrap_or(0) > 0)
            && (o.labels.is_empty() || o.labels_meet(self.reqs))
    }

    /// The cheapest passing offering of a type whose offerings are sorted by price.
    #[inline]
    fn cheapest<'t>(&self, it: &'t InstanceType) -> Option<&'t Offering> {
        it.offerings.iter().find(|o| self.ok(o))
    }
}

/// The values `key` takes on `it`: its zones or capacity types (of the offerings `filter` allows) for
/// those keys, its label otherwise.
fn values_of<'a>(it: &'a InstanceType, key: &str, filter: &'a OfferFilter<'_>) -> Vec<&'a str> {
    match key {
        labels::ZONE => it.offerings.iter().filter(|of| filter.ok(of)).map(|of| of.zone.as_str()).collect(),
        labels::CAPACITY_TYPE => {
            it.offerings.iter().filter(|of| filter.ok(of)).map(|of| of.capacity_type.as_str()).collect()
        }
        k => it.label(k).into_iter().collect(),
    }
}

/// Cuts `priced` (options by price, cheapest first) to `max` options, keeping each `minValues`
/// requirement of `reqs` satisfiable: when the cheapest `max` span too few values of its key, the
/// cheapest options bringing a missing value are kept too, past `max`. (Karpenter would fail the claim
/// instead; a claim whose minValues its own options meet is always better than none.)
fn truncate_keeping_min_values<'a>(
    priced: &mut Vec<(f64, u32)>,
    max: usize,
    reqs: &Requirements,
    type_of: &dyn Fn(u32) -> &'a InstanceType,
    filter: &OfferFilter<'_>,
) {
    if priced.len() <= max {
        return;
    }
    let dropped = priced.split_off(max);
    let kept = priced.len();
    for r in reqs.iter() {
        let Some(min) = r.min_values() else { continue };
        let mut seen: BTreeSet<&str> =
            priced.iter().flat_map(|(_, o)| values_of(type_of(*o), r.key(), filter)).collect();
        for d in &dropped {
            if seen.len() as u32 >= min {
                break;
            }
            let values = values_of(type_of(d.1), r.key(), filter);
            if values.iter().any(|v| !seen.contains(v)) && !priced.contains(d) {
                seen.extend(values);
                priced.push(*d);
            }
        }
    }
    if priced.len() > kept {
        priced.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| type_of(a.1).name.cmp(&type_of(b.1).name)));
    }
}

/// Whether an offering is available and allowed by the zone, capacity-type and reservation requirements,
/// and by those on its own labels.
pub fn offering_ok(o: &Offering, reqs: &Requirements) -> bool {
    o.available
        && reqs.get(labels::ZONE).is_none_or(|r| r.has(&o.zone))
        && reqs.get(labels::CAPACITY_TYPE).is_none_or(|r| r.has(o.capacity_type.as_str()))
        && reqs.get(labels::RESERVATION_ID).is_none_or(|r| o.reservation_id.as_deref().is_some_and(|id| r.has(id)))
        && (o.capacity_type != CapacityType::Reserved || o.reservation_capacity.unwrap_or(0) > 0)
        && o.labels_meet(reqs)
}

fn cheapest(it: &InstanceType, reqs: &Requirements, ceiling: Option<f64>) -> Option<f64> {
    OfferFilter::new(reqs, ceiling).cheapest(it).map(|o| o.price)
}

/// The worst price of the first capacity type (reserved, spot, on-demand) with a compatible offering.
fn worst_launch_price(it: &InstanceType, filter: &OfferFilter<'_>) -> Option<f64> {
    CapacityType::ALL.iter().find_map(|ct| {
        it.offerings.iter().filter(|o| o.capacity_type == *ct && filter.ok(o)).map(|o| o.price).max_by(f64::total_cmp)
    })
}

fn type_requirements(it: &InstanceType, all_keys: &BTreeSet<String>) -> Requirements {
    let mut r = Requirements::new();
    for key in all_keys {
        match it.labels.get(key) {
            Some(v) => r.add(Requirement::is_in(key, [v.clone()])),
            // A label its offerings carry: any of their values.
            None if it.offerings.iter().any(|o| o.labels.contains_key(key)) => {
                r.add(Requirement::is_in(key, it.offerings.iter().filter_map(|o| o.labels.get(key).cloned())))
            }
            None => r.add(Requirement::does_not_exist(key)),
        }
    }
    r.add(Requirement::is_in(labels::INSTANCE_TYPE, [it.name.clone()]));
    r.add(Requirement::is_in(labels::ZONE, it.offerings.iter().map(|o| o.zone.clone())));
    r.add(Requirement::is_in(labels::CAPACITY_TYPE, it.offerings.iter().map(|o| o.capacity_type.as_str())));
    r
}

/// One scheduling pass over a snapshot.
///
/// A scheduler prepared once can be cloned cheaply (instance types, node labels and bound-pod data are
/// shared), so consolidation simulates "what if these nodes were gone" from one base without rebuilding
/// the world per candidate.
#[derive(Debug, Clone)]
pub struct Scheduler {
    /// Shared with the clones until a pass changes one (a claim opened against its limits).
    pools: Vec<Arc<Pool>>,
    /// Shared with the clones until a pass changes one (a pod placed, room taken): a consolidation
    /// simulation copies only the few nodes its pods land on, and the chunks holding them.
    nodes: Nodes,
    claims: Vec<Claim>,
    by_load: BTreeSet<(usize, usize)>,
    /// For hostname anti-affinity and hostname spread groups: the claims that can still take a pod the
    /// group selects, least loaded first. Pods with such a constraint search these instead of every claim.
    free: FxHashMap<usize, BTreeSet<(usize, usize)>>,
    /// For topology keys other than the hostname: claims by the single domain they are pinned to (`None`:
    /// still open), least loaded first. Pods allowed only some domains search these.
    by_domain: FxHashMap<String, DomainIndex>,
    topology: Topology,
    options: SchedulerOptions,
    prefer_no_schedule: bool,
    /// Set for a solve asked only whether its pods can go with at most one claim cheap enough and none on a
    /// marked node ([`Scheduler::solve_registered_unless`]).
    stop_at: Option<StopAt>,
    /// Where such a solve stopped.
    stopped: Option<Stopped>,
}

/// The checks of an existing node that depend on the node and the pod's constraints alone: it takes pods,
/// has room for the pod, tolerates it (`PreferNoSchedule` as `cons` says) and meets `cons`' node
/// requirements. The cheap ones come first, and nothing is allocated to say why not.
fn node_admits(node: &Node, pod: &PodInfo, cons: &Constraints) -> bool {
    node.accepts_pods
        && pod.requests.fits(&node.available)
        && taints::untolerated(&node.info.taints, &pod.tolerations, cons.tolerate_prefer_no_schedule).is_none()
        && node.info.reqs.is_compatible(&cons.requirements, false)
}

/// A pod [`Scheduler::register`] worked groups out for, and those groups, shared with the pods alike.
type Shared<'p> = (&'p PodInfo, Arc<[usize]>);

/// Whether two pods carry equal topology terms, in order. A term found equal to the other's takes its
/// equality token, so that the next comparison of the two is a pointer comparison.
fn same_terms(a: &PodInfo, b: &PodInfo) -> bool {
    let (mut x, mut y) = (a.all_terms(), b.all_terms());
    loop {
        match (x.next(), y.next()) {
            (None, None) => return true,
            (Some(s), Some(t)) if s == t => t.found_equal_to(s),
            _ => return false,
        }
    }
}

/// The views topology shares of the nodes bound pods run on: the existing nodes', and for a node the pass
/// was not given, one of its name alone.
struct BoundViews<'a> {
    known: FxHashMap<&'a str, Arc<NodeView>>,
    unknown: FxHashMap<String, Arc<NodeView>>,
}

impl BoundViews<'_> {
    fn of(&mut self, node: &str) -> Arc<NodeView> {
        if let Some(view) = self.known.get(node) {
            return Arc::clone(view);
        }
        let view = self.unknown.entry(node.to_owned()).or_insert_with(|| {
            let labels = Arc::new(BTreeMap::from([(labels::HOSTNAME.to_owned(), node.to_owned())]));
            let reqs = Arc::new(Requirements::from_labels(&*labels));
            Arc::new(NodeView { name: node.to_owned(), labels, reqs, taints: Vec::new() })
        });
        Arc::clone(view)
    }
}

impl Scheduler {
    /// Prepares a pass: pools (tried by weight, heaviest first), existing nodes (tried in order), pods
    /// already bound (for topology counts, with their node's name) and DaemonSet pods (for overhead).
    pub fn new<'n>(
        pools: Vec<PoolInput>,
        nodes: Vec<ExistingNode>,
        bound: impl IntoIterator<Item = (Arc<PodInfo>, &'n str)>,
        daemons: &[DaemonPod],
        options: SchedulerOptions,
    ) -> Self {
        Self::build(pools, nodes, daemons, options, |topology, views| {
            // A node's pods come one after another: registered together, under one look-up of the node.
            let mut bound = bound.into_iter().peekable();
            while let Some((pod, node)) = bound.next() {
                let mut pods = vec![pod];
                while let Some((pod, _)) = bound.next_if(|(_, next)| *next == node) {
                    pods.push(pod);
                }
                topology.add_bound_on(&views.of(node), pods);
            }
        })
    }

    /// As [`Scheduler::new`], the bound pods given by node and summarised by class ([`BoundOnNode`], as a
    /// cluster state keeps them): each class of a node is registered once, not each pod.
    pub fn with_bound_on_nodes(
        pools: Vec<PoolInput>,
        nodes: Vec<ExistingNode>,
        bound: &[(&str, &BoundOnNode)],
        daemons: &[DaemonPod],
        options: SchedulerOptions,
    ) -> Self {
        Self::build(pools, nodes, daemons, options, |topology, views| {
            for (node, on_node) in bound {
                topology.add_bound_classes(&views.of(node), on_node);
            }
        })
    }

    /// The pass over `pools` and `nodes`, with the bound pods `add_bound` registers in its topology.
    fn build(
        pools: Vec<PoolInput>,
        nodes: Vec<ExistingNode>,
        daemons: &[DaemonPod],
        options: SchedulerOptions,
        add_bound: impl FnOnce(&mut Topology, &mut BoundViews<'_>),
    ) -> Self {
        let mut universe = PoolDomains::new();
        let mut built = Vec::new();
        let mut ordered = pools;
        ordered.sort_by(|a, b| b.pool.weight().cmp(&a.pool.weight()).then_with(|| a.pool.name().cmp(b.pool.name())));
        for input in ordered {
            let (mut pool, offered) = build_pool(input, daemons);
            if !options.marginal_cost_packing {
                pool.packing = Packing::Binpack;
            }
            // The domains a pool offers, with its taints: its types' labels and their offerings' zones and
            // capacity types (as the requirements Karpenter derives from them), and every value its own
            // requirements (template labels included) allow.
            let taints = Arc::new(pool.taints.clone());
            for (k, v) in offered.iter() {
                offer_domain(&mut universe, k, v, &taints);
            }
            for r in pool.reqs.iter().filter(|r| !r.is_complement()) {
                for v in r.values() {
                    offer_domain(&mut universe, r.key(), v, &taints);
                }
            }
            built.push(Arc::new(pool));
        }
        let nodes: Vec<Node> = nodes
            .into_iter()
            .map(|mut n| {
                if !n.labels.contains_key(labels::HOSTNAME) {
                    Arc::make_mut(&mut n.labels).insert(labels::HOSTNAME.to_owned(), n.name.clone());
                    n.requirements = None;
                }
                Node {
                    info: Arc::new(NodeView {
                        reqs: n.requirements.unwrap_or_else(|| Arc::new(Requirements::from_labels(&*n.labels))),
                        name: n.name,
                        labels: n.labels,
                        taints: n.taints,
                    }),
                    available: n.available,
                    host_ports: n.host_ports,
                    accepts_pods: n.accepts_pods,
                    volume_room: n.volume_room,
                    pods: Vec::new(),
                    ends_solve: false,
                }
            })
            .collect();
        let prefer_no_schedule = built.iter().any(|p| p.taints.iter().any(|t| t.effect == "PreferNoSchedule"))
            || nodes.iter().any(|n| n.info.taints.iter().any(|t| t.effect == "PreferNoSchedule"));
        // Topology shares each node's view with the scheduler: for all of its pods and every group.
        let existing: Vec<Arc<NodeView>> = nodes.iter().map(|n| Arc::clone(&n.info)).collect();
        let mut topology = Topology::new(universe, existing.clone());
        let mut views = BoundViews {
            known: existing.iter().map(|n| (n.name.as_str(), Arc::clone(n))).collect(),
            unknown: FxHashMap::default(),
        };
        add_bound(&mut topology, &mut views);
        drop(views);
        Self {
            pools: built,
            nodes: Nodes::new(nodes),
            claims: Vec::new(),
            by_load: BTreeSet::new(),
            free: FxHashMap::default(),
            by_domain: FxHashMap::default(),
            topology,
            options,
            prefer_no_schedule,
            stop_at: None,
            stopped: None,
        }
    }

    /// Registers the topology constraints of `pods` now, so that clones of this scheduler share their
    /// counts instead of each recounting every bound pod. Returns each pod's groups, which
    /// [`Scheduler::solve_registered`] takes instead of looking every term up again.
    pub fn register<'p>(&mut self, pods: impl IntoIterator<Item = &'p PodInfo>) -> Vec<PodGroups> {
        let pods: Vec<&PodInfo> = pods.into_iter().collect();
        // An owner's replicas carry equal terms and are selected alike: each is worked out once for the pods
        // sharing it, found by their selection key ([`PodInfo::selection_key`]).
        let mut by_terms: FxHashMap<u64, Vec<Shared<'_>>> = FxHashMap::default();
        let terms: Vec<Arc<[usize]>> = pods
            .iter()
            .map(|p| {
                let same = by_terms.entry(p.selection_key()).or_default();
                if let Some((_, groups)) = same.iter().find(|(q, _)| same_terms(q, p)) {
                    return Arc::clone(groups);
                }
                let groups: Arc<[usize]> = p.all_terms().map(|t| self.topology.group(t)).collect();
                same.push((p, Arc::clone(&groups)));
                groups
            })
            .collect();
        // Selection is read once every group is known: a group registered for a later pod may select an
        // earlier one.
        let known = self.topology.len();
        let mut selecting: FxHashMap<u64, Vec<Shared<'_>>> = FxHashMap::default();
        terms
            .into_iter()
            .zip(&pods)
            .map(|(terms, p)| {
                let same = selecting.entry(p.selection_key()).or_default();
                let groups = match same.iter().find(|(q, _)| q.selected_alike(p)) {
                    Some((_, groups)) => Arc::clone(groups),
                    None => {
                        let groups: Arc<[usize]> = self.topology.selecting(p).into();
                        same.push((p, Arc::clone(&groups)));
                        groups
                    }
                };
                PodGroups { terms, selecting: groups, known }
            })
            .collect()
    }

    /// A copy of this scheduler in which the named nodes are gone: they take no pods, and the pods bound
    /// to them no longer count for topology.
    #[must_use]
    pub fn without_nodes(&self, names: &[&str]) -> Self {
        let mut s = self.clone();
        s.block_nodes(names);
        for name in names {
            s.topology.remove_node(name);
        }
        s
    }

    /// As [`Scheduler::without_nodes`], for the existing nodes at `indexes` (in the order they were given to
    /// [`Scheduler::new`]): no name is looked for among the nodes.
    #[must_use]
    pub fn without_nodes_at(&self, indexes: &[usize]) -> Self {
        let mut s = self.clone();
        for &i in indexes {
            let Some(info) = s.nodes.update(i, |n| {
                n.accepts_pods = false;
                Arc::clone(&n.info)
            }) else {
                continue;
            };
            s.topology.remove_node(&info.name);
        }
        s
    }

    /// Whether `groups`, returned by [`Scheduler::register`] on this scheduler or the one it was cloned
    /// from, still name every group that could select their pod: no group was registered since.
    pub fn knows_every_group_of(&self, groups: &PodGroups) -> bool {
        groups.known == self.topology.len()
    }

    /// Whether every claim this scheduler could open keeps `karpenter.sh/capacity-type` open to spot,
    /// whatever its pods ask of other keys: every pool allows spot, no offering is a reservation (a launch
    /// on one pins the claim to `reserved`) and no topology group is keyed on the capacity type (a
    /// constraint there narrows the claims it places).
    pub fn claims_stay_spot_capable(&self) -> bool {
        let spot = CapacityType::Spot.as_str();
        self.pools.iter().all(|p| {
            p.reqs.get(labels::CAPACITY_TYPE).is_none_or(|r| r.has(spot))
                && p.types.iter().all(|t| t.it.offerings.iter().all(|o| o.reservation_id.is_none()))
        }) && (0..self.topology.len()).all(|g| self.topology.key(g) != labels::CAPACITY_TYPE)
    }

    /// What pods could still take of the `index`th existing node (in the order they were given to
    /// [`Scheduler::new`]): its available resources, none below zero; nothing when it takes no pods.
    pub fn node_room(&self, index: usize) -> Resources {
        self.nodes.get(index).map_or(Resources::ZERO, Node::room)
    }

    /// Whether `pod` might land on an existing node other than those at `except` (in the order the nodes
    /// were given to [`Scheduler::new`]) and those marked with [`Scheduler::stop_on_landing`], in a solve
    /// of this scheduler: `false` when, at every level of its relaxation, no such node taking pods has room
    /// for it and tolerates it and meets its node requirements as that level states them. What else a
    /// placement checks (topology, host ports, volumes) only turns nodes down, and the pods a solve places
    /// only take room, so a pod told `false` lands on no such node in any solve of this scheduler.
    pub fn might_land_on_a_node(&self, pod: &PodInfo, except: &[usize]) -> bool {
        if self.options.ignore_preferences {
            // A solve drops the pod's preferences before its first level; not worked out here.
            return true;
        }
        let mut relax = Relaxation::default();
        loop {
            let cons = relax.constraints(pod);
            let found = self.nodes.find(&pod.requests, |i, node| {
                !node.ends_solve && !except.contains(&i) && node_admits(node, pod, &cons)
            });
            if found.is_some() {
                return true;
            }
            if relax.relax(pod, self.prefer_no_schedule).is_none() {
                return false;
            }
        }
    }

    /// [`Scheduler::node_room`] summed over every existing node.
    pub fn total_node_room(&self) -> Resources {
        let mut total = Resources::ZERO;
        for n in self.nodes.iter() {
            total.add_assign(&n.room());
        }
        total
    }

    /// The most of each resource a new claim of any pool could give pods: its instance types' room (their
    /// DaemonSets' overhead taken out), the largest per resource.
    pub fn most_claim_room(&self) -> Resources {
        let rooms = self.pools.iter().flat_map(|p| p.base.iter().map(|t| &p.types[*t as usize].avail));
        Resources::max_of(rooms)
    }

    /// The name of the `index`th existing node (in the order they were given to [`Scheduler::new`]).
    pub fn node_name(&self, index: usize) -> Option<&str> {
        self.nodes.get(index).map(|n| n.info.name.as_str())
    }

    /// Takes `room` from the `index`th existing node's available resources (in the order the nodes were
    /// given to [`Scheduler::new`]), as if a pod placed elsewhere already held it.
    pub fn take_room(&mut self, index: usize, room: &Resources) {
        self.nodes.update(index, |n| n.available.sub_assign(room));
    }

    /// Stops the named nodes from taking pods (they stay, with their pods counted).
    pub fn block_nodes(&mut self, names: &[&str]) {
        for i in self.indexes_of(names) {
            self.nodes.update(i, |n| n.accepts_pods = false);
        }
    }

    /// Narrows every pool to `req` (e.g. `karpenter.sh/capacity-type In [spot]` to pin replacements).
    pub fn restrict_pools(&mut self, req: Requirement) {
        for pool in &mut self.pools {
            let pool = Arc::make_mut(pool);
            pool.reqs.add(req.clone());
            let reqs = pool.reqs.clone();
            let types = Arc::clone(&pool.types);
            let base: Vec<u32> = pool
                .base
                .iter()
                .copied()
                .filter(|o| {
                    let te = &types[*o as usize];
                    te.reqs.is_intersecting(&reqs) && te.it.offerings.iter().any(|of| offering_ok(of, &reqs))
                })
                .collect();
            pool.base = Arc::new(base);
        }
    }

    /// Replaces the pass's options (e.g. a price ceiling for one simulation).
    #[must_use]
    pub fn with_options(mut self, options: SchedulerOptions) -> Self {
        self.options = options;
        self
    }

    /// Schedules `pods` in the given order (no largest-first sorting), as if they arrived one by one.
    pub fn place_in_order(&mut self, pods: Vec<PodInfo>) -> Results {
        let this = std::mem::replace(self, Self::empty());
        this.solve_ordered(pods.into_iter().map(Arc::new).collect(), None, false)
    }

    fn empty() -> Self {
        Self {
            pools: Vec::new(),
            nodes: Nodes::default(),
            claims: Vec::new(),
            by_load: BTreeSet::new(),
            free: FxHashMap::default(),
            by_domain: FxHashMap::default(),
            topology: Topology::default(),
            options: SchedulerOptions::default(),
            prefer_no_schedule: false,
            stop_at: None,
            stopped: None,
        }
    }

    /// Schedules `pods`, largest first, returning where each lands and what must be bought.
    pub fn solve(self, pods: Vec<PodInfo>) -> Results {
        self.solve_ordered(pods.into_iter().map(Arc::new).collect(), None, true)
    }

    /// As [`Scheduler::solve`], for pods whose views are shared (a cluster state's), without copying them.
    pub fn solve_shared(self, pods: Vec<Arc<PodInfo>>) -> Results {
        self.solve_ordered(pods, None, true)
    }

    /// As [`Scheduler::solve_shared`], for pods registered with this scheduler or the one it was copied
    /// from ([`Scheduler::register`]), `groups[i]` being what registering `pods[i]` returned. The groups
    /// are taken as they are while no other group has been registered since and preferences count;
    /// otherwise every pod's terms are looked up again, so the result is the same either way.
    pub fn solve_registered(self, pods: Vec<Arc<PodInfo>>, groups: Vec<&PodGroups>) -> Results {
        self.solve_ordered(pods, Some(groups), true)
    }

    /// As [`Scheduler::solve_registered`], unless a pod opens a claim where `stop` says to stop (the
    /// first claim, when no offering its options allow costs less than `stop.first_claim_below`, or a
    /// second one), or lands on a node marked with [`Scheduler::stop_on_landing`] when `stop.marked_node`.
    /// Then it stops there and says where. Until it stops the solve is the one
    /// [`Scheduler::solve_registered`] runs, so `Ok` holds exactly what that returns.
    ///
    /// [`Stopped::Claim`] says that its results would hold at least one claim (claims are never given up
    /// once opened), two when it stopped at a second, and, if they hold only one, that no offering its
    /// options allow costs less than the bound (options and offerings only narrow as pods join a claim).
    /// Claims re-packed after the solve ([`Scheduler::repacks_claims`]) void the last two: only a stop at
    /// any first claim holds then. A stop is taken where a claim is about to open, after every existing
    /// node and claim turned the pod down. [`Stopped::MarkedNode`] says that its results would place a pod
    /// on a marked node: a pod placed on an existing node stays there.
    pub fn solve_registered_unless(
        mut self,
        pods: Vec<Arc<PodInfo>>,
        groups: Vec<&PodGroups>,
        stop: StopAt,
    ) -> Result<Results, Stopped> {
        self.stop_at = Some(stop);
        self.solve_until_stop(pods, Some(groups), true)
    }

    /// Marks the named existing nodes: a solve told to stop on them ([`StopAt::marked_node`]) stops once a
    /// pod lands on one. Other solves place pods on them as on any node.
    pub fn stop_on_landing(&mut self, names: &[&str]) {
        for i in self.indexes_of(names) {
            self.nodes.update(i, |n| n.ends_solve = true);
        }
    }

    /// The indexes of the existing nodes named in `names`.
    fn indexes_of(&self, names: &[&str]) -> Vec<usize> {
        let names: rustc_hash::FxHashSet<&str> = names.iter().copied().collect();
        if names.is_empty() {
            return Vec::new();
        }
        self.nodes.iter().enumerate().filter(|(_, n)| names.contains(n.info.name.as_str())).map(|(i, _)| i).collect()
    }

    /// Whether a solve re-packs the claims it opened once every pod is placed (a pool packing by marginal
    /// cost): the claims it returns are then not always the ones it opened.
    pub fn repacks_claims(&self) -> bool {
        self.pools.iter().any(|p| p.packing == Packing::MarginalCost)
    }

    fn solve_ordered(self, pods: Vec<Arc<PodInfo>>, known: Option<Vec<&PodGroups>>, largest_first: bool) -> Results {
        // Only a scheduler told where to stop stops short.
        self.solve_until_stop(pods, known, largest_first).unwrap_or_default()
    }

    /// The solve; `Err` when it stopped where `stop_at` says.
    fn solve_until_stop(
        mut self,
        pods: Vec<Arc<PodInfo>>,
        known: Option<Vec<&PodGroups>>,
        largest_first: bool,
    ) -> Result<Results, Stopped> {
        let mut pods = pods;
        let known = known.filter(|k| {
            !self.options.ignore_preferences && k.len() == pods.len() && k.iter().all(|g| self.knows_every_group_of(g))
        });
        if self.options.ignore_preferences {
            for p in &mut pods {
                let p = Arc::make_mut(p);
                p.preferred_terms.clear();
                p.preferred_affinity.clear();
                p.preferred_anti_affinity.clear();
                p.soft_spreads.clear();
            }
        }
        // Register every constraint up front so every pod is counted by every group that selects it. Each
        // pod keeps the groups of its terms (in `PodInfo::all_terms` order): a term is hashed once per pass.
        let looked_up: Vec<PodGroups>;
        let groups: Vec<&PodGroups> = match known {
            Some(known) => known,
            None => {
                looked_up = self.register(pods.iter().map(|p| &**p));
                looked_up.iter().collect()
            }
        };
        let term_groups: Vec<&[usize]> = groups.iter().map(|g| &*g.terms).collect();
        let selecting: Vec<&[usize]> = groups.iter().map(|g| &*g.selecting).collect();
        // How many of the pass's pods each group concerns (carried or selecting).
        let mut weight = vec![0usize; self.topology.len()];
        for (carried, sel) in term_groups.iter().zip(&selecting) {
            let mut concerned = carried.to_vec();
            concerned.extend_from_slice(sel);
            concerned.sort_unstable();
            concerned.dedup();
            for g in concerned {
                weight[g] += 1;
            }
        }
        for (g, weight) in weight.into_iter().enumerate() {
            if self.topology.is_hostname(g) {
                // A hostname group closes at most one claim per pod it concerns, so searching every claim
                // and skipping the closed ones costs at most its pods squared; an index of the claims still
                // open costs an update per placement. The index pays only for groups of many pods.
                if self.topology.kind(g) != TopologyKind::Affinity && weight * weight > pods.len() {
                    self.free.insert(g, BTreeSet::new());
                }
            } else {
                self.by_domain.entry(self.topology.key(g).to_owned()).or_default();
            }
        }
        let mut order: Vec<usize> = (0..pods.len()).collect();
        if largest_first {
            order.sort_by(|&a, &b| {
                let (ra, rb) = (&pods[a].requests, &pods[b].requests);
                rb.get(ResourceName::CPU)
                    .cmp(&ra.get(ResourceName::CPU))
                    .then(rb.get(ResourceName::MEMORY).cmp(&ra.get(ResourceName::MEMORY)))
                    .then_with(|| pods[a].key.cmp(&pods[b].key))
            });
        }
        let mut relax = vec![Relaxation::default(); pods.len()];
        let mut errors: FxHashMap<usize, String> = FxHashMap::default();
        let mut pending = order;
        loop {
            let mut failed = Vec::new();
            let before = pending.len();
            for i in pending {
                let placed = self.place(&pods, i, term_groups[i], selecting[i], &mut relax[i]);
                if let Some(stopped) = self.stopped {
                    return Err(stopped);
                }
                match placed {
                    Ok(()) => {
                        errors.remove(&i);
                    }
                    Err(e) => {
                        errors.insert(i, e);
                        failed.push(i);
                    }
                }
            }
            // Another round only helps when something landed (an affinity target may now exist).
            if failed.is_empty() || failed.len() == before {
                pending = failed;
                break;
            }
            pending = failed;
        }
        // Marginal-cost pools: a bounded search for a cheaper packing of the claims they opened.
        self.improve_marginal_cost(&pods, &selecting);
        Ok(self.finish(&pods, pending, errors))
    }

    fn place(
        &mut self,
        pods: &[Arc<PodInfo>],
        i: usize,
        term_groups: &[usize],
        selecting: &[usize],
        relax: &mut Relaxation,
    ) -> Result<(), String> {
        let pod = &pods[i];
        loop {
            let cons = relax.constraints(pod);
            let groups: Vec<usize> = relax.terms_in_force(pod).map(|t| term_groups[t]).collect();
            match self.place_with(pods, i, selecting, &cons, &groups) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if relax.relax(pod, self.prefer_no_schedule).is_none() {
                        return Err(e);
                    }
                }
            }
        }
    }

    fn place_with(
        &mut self,
        pods: &[Arc<PodInfo>],
        i: usize,
        selecting: &[usize],
        cons: &Constraints,
        groups: &[usize],
    ) -> Result<(), String> {
        let pod = &pods[i];
        let inverse = self.topology.inverse(selecting);
        // 1. Existing nodes.
        let memo = PlacementMemo::new(groups);
        let found = self.nodes.find(&pod.requests, |_, node| self.node_fits(node, pod, cons, groups, &inverse, &memo));
        if let Some(n) = found {
            self.nodes.update(n, |node| {
                node.available.sub_assign(&pod.requests);
                node.host_ports.extend(pod.host_ports.iter().cloned());
                VolumeRoom::attach(&mut node.volume_room, &pod.volumes);
                node.pods.push(i);
            });
            let info = &self.nodes[n].info;
            self.topology.record(
                selecting,
                groups,
                &info.taints,
                &info.reqs,
                &|k| info.labels.get(k).cloned().map(Landed::Named),
                None,
            );
            if self.nodes[n].ends_solve && self.stop_at.is_some_and(|s| s.marked_node) {
                self.stopped = Some(Stopped::MarkedNode);
            }
            return Ok(());
        }
        // 2. Claims opened earlier in the pass, least loaded first.
        let mut best_marginal: Option<(f64, usize, Fit)> = None;
        let mut first_fit: Option<(usize, Fit)> = None;
        let hostname_groups: Vec<usize> = groups.iter().copied().filter(|g| self.topology.is_hostname(*g)).collect();
        let hostname_inverse: Vec<usize> = inverse.iter().copied().filter(|g| self.topology.is_hostname(*g)).collect();
        let domain_filters: Vec<(&str, DomainFilter<'_>)> = groups
            .iter()
            .enumerate()
            .filter_map(|(i, g)| {
                self.topology.domain_filter(i, *g, pod, &cons.strict, &memo).map(|f| (self.topology.key(*g), f))
            })
            .collect();
        // A hostname constraint that closes claims narrows the search to the claims it leaves open: through
        // its index of them when it has one (a group of many pods), else by skipping the others.
        let narrowest = hostname_groups.iter().copied().find(|g| {
            self.topology.kind(*g) != TopologyKind::Affinity
                && (self.topology.kind(*g) == TopologyKind::AntiAffinity || selecting.contains(g))
        });
        let open_in = narrowest.filter(|g| !self.free.contains_key(g));
        let search: Vec<&BTreeSet<(usize, usize)>> = match narrowest.and_then(|g| self.free.get(&g)) {
            Some(set) => vec![set],
            None => domain_filters
                .iter()
                .find_map(|(key, f)| match f {
                    DomainFilter::Allow(domains) => self.by_domain.get(*key).map(|index| {
                        domains
                            .iter()
                            .map(|d| Some((*d).to_owned()))
                            .chain(std::iter::once(None))
                            .filter_map(|d| index.get(&d))
                            .collect()
                    }),
                    DomainFilter::Block(_) => None,
                })
                .unwrap_or_else(|| vec![&self.by_load]),
        };
        for (_, c) in MergeByLoad::new(search) {
            // Cheap rejections first: no allocation, no requirement algebra.
            let claim = &self.claims[c];
            if !claim.requests.add(&pod.requests).fits(&claim.max_avail)
                || open_in.is_some_and(|g| !self.topology.claim_open(g, c))
                || hostname_groups.iter().any(|g| !self.topology.claim_allows(*g, pod, c))
                || hostname_inverse.iter().any(|g| self.topology.claim_owned(*g, c))
                || domain_filters
                    .iter()
                    .any(|(key, f)| claim.reqs.get(key).and_then(|r| r.single()).is_some_and(|d| !f.admits(d)))
            {
                continue;
            }
            let Ok(fit) = self.try_claim(claim, c, pod, cons, groups, &inverse, &memo, false) else { continue };
            let pool = &self.pools[self.claims[c].pool];
            if pool.packing == Packing::MarginalCost {
                let after = self.price_of(
                    pool,
                    fit.reqs.as_ref().unwrap_or(&self.claims[c].reqs),
                    fit.options.as_deref().unwrap_or(&self.claims[c].options[fit.first..]),
                    &self.claims[c].requests.add(&pod.requests),
                );
                if let (Some(before), Some(after)) = (self.claims[c].price, after) {
                    let delta = after - before;
                    if best_marginal.as_ref().is_none_or(|(d, _, _)| delta < *d) {
                        best_marginal = Some((delta, c, fit));
                    }
                    continue;
                }
            }
            first_fit = Some((c, fit));
            break;
        }
        if let Some((c, fit)) = first_fit {
            self.commit(c, pods, i, selecting, groups, fit);
            return Ok(());
        }
        // 3. A new claim, from the heaviest pool that can take the pod.
        let mut reasons = Vec::new();
        for p in 0..self.pools.len() {
            match self.new_claim(p, pod, cons, groups, &inverse, &memo) {
                Ok((claim, fit)) => {
                    if let Some((delta, c, _)) = &best_marginal {
                        let open_price = self.price_of(
                            &self.pools[p],
                            fit.reqs.as_ref().unwrap_or(&claim.reqs),
                            fit.options.as_deref().unwrap_or(&claim.options[fit.first..]),
                            &pod.requests,
                        );
                        if open_price.is_none_or(|open| *delta <= open) {
                            let c = *c;
                            let Some((_, _, fit)) = best_marginal.take() else { unreachable!("checked above") };
                            self.commit(c, pods, i, selecting, groups, fit);
                            return Ok(());
                        }
                    }
                    // The claim opens here, unless the solve was told to stop at it.
                    if let Some(stop) = self.stop_at {
                        let stop_here = if self.claims.is_empty() {
                            let pool = &self.pools[p];
                            let reqs = fit.reqs.as_ref().unwrap_or(&claim.reqs);
                            let options = fit.options.as_deref().unwrap_or(&claim.options[fit.first..]);
                            stop.first_claim_below.is_some_and(|below| {
                                !self.could_launch_below(pool, reqs, options, &pod.requests, below)
                            })
                        } else {
                            stop.second_claim
                        };
                        if stop_here {
                            self.stopped = Some(Stopped::Claim);
                            return Ok(());
                        }
                    }
                    self.claims.push(claim);
                    let c = self.claims.len() - 1;
                    self.by_load.insert((0, c));
                    for (key, index) in self.by_domain.iter_mut() {
                        let value = self.claims[c].reqs.get(key).and_then(|r| r.single()).map(str::to_owned);
                        index.entry(value).or_default().insert((0, c));
                    }
                    for set in self.free.values_mut() {
                        set.insert((0, c));
                    }
                    self.commit(c, pods, i, selecting, groups, fit);
                    let pool = Arc::make_mut(&mut self.pools[p]);
                    let max_cap =
                        Resources::max_of(self.claims[c].options.iter().map(|o| &pool.types[*o as usize].it.capacity));
                    if let Some(rem) = pool.remaining.as_mut() {
                        rem.sub_assign(&max_cap);
                    }
                    if let Some(n) = pool.remaining_nodes.as_mut() {
                        *n = n.saturating_sub(1);
                    }
                    return Ok(());
                }
                Err(e) => reasons.push(format!("NodePool {}: {e}", self.pools[p].name)),
            }
        }
        if let Some((_, c, fit)) = best_marginal {
            self.commit(c, pods, i, selecting, groups, fit);
            return Ok(());
        }
        if reasons.is_empty() {
            reasons.push("no NodePool can launch nodes".into());
        }
        Err(reasons.join("; "))
    }

    /// Whether any offering of the `options` that fit `total` and that `reqs` allow costs less than `below`.
    fn could_launch_below(
        &self,
        pool: &Pool,
        reqs: &Requirements,
        options: &[u32],
        total: &Resources,
        below: f64,
    ) -> bool {
        let filter = OfferFilter::new(reqs, self.options.price_ceiling);
        options
            .iter()
            .map(|o| &pool.types[*o as usize])
            .filter(|t| total.fits(&t.avail))
            .any(|t| t.it.offerings.iter().any(|of| of.price < below && filter.ok(of)))
    }

    fn price_of(&self, pool: &Pool, reqs: &Requirements, options: &[u32], total: &Resources) -> Option<f64> {
        let filter = OfferFilter::new(reqs, self.options.price_ceiling);
        options
            .iter()
            .filter(|o| total.fits(&pool.types[**o as usize].avail))
            .filter_map(|o| filter.cheapest(&pool.types[*o as usize].it).map(|of| of.price))
            .min_by(f64::total_cmp)
    }

    /// Whether `pod` fits existing node `node` under `cons`. Most nodes are turned down for resources, so
    /// the cheap checks come first and nothing is allocated to say why (no caller reads it).
    fn node_fits(
        &self,
        node: &Node,
        pod: &PodInfo,
        cons: &Constraints,
        groups: &[usize],
        inverse: &[usize],
        memo: &PlacementMemo,
    ) -> bool {
        if !node_admits(node, pod, cons) {
            return false;
        }
        if pod.host_ports.iter().any(|p| node.host_ports.iter().any(|q| p.conflicts(q))) {
            return false;
        }
        // CSI attach limits, as Karpenter's volume usage checks them on existing nodes.
        if !pod.volumes.is_empty() && !VolumeRoom::admit(&node.volume_room, &pod.volumes) {
            return false;
        }
        self.topology.fits_node(pod, &cons.strict, groups, inverse, &node.info.labels, memo)
    }

    #[allow(clippy::too_many_arguments)]
    fn try_claim(
        &self,
        claim: &Claim,
        index: usize,
        pod: &PodInfo,
        cons: &Constraints,
        groups: &[usize],
        inverse: &[usize],
        memo: &PlacementMemo,
        want_reason: bool,
    ) -> Result<Fit, String> {
        let pool = &self.pools[claim.pool];
        let total = claim.requests.add(&pod.requests);
        if !total.fits(&claim.max_avail) {
            return Err(if want_reason {
                self.fit_reason(pool, &claim.reqs, &claim.options, &total)
            } else {
                String::new()
            });
        }
        if let Some(t) = taints::untolerated(&pool.taints, &pod.tolerations, cons.tolerate_prefer_no_schedule) {
            return Err(format!(
                "the pod does not tolerate taint {}{}:{}",
                t.key,
                t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default(),
                t.effect
            ));
        }
        claim
            .reqs
            .compatible_with(&cons.requirements, |k| labels::is_well_known(k) || pool.type_keys.contains(k))
            .map_err(|e| format!("incompatible requirements: {e}"))?;
        let mut reqs = if cons.requirements.is_empty() {
            None
        } else {
            let mut r = claim.reqs.clone();
            r.add_all(&cons.requirements);
            Some(r)
        };
        if !groups.is_empty() || !inverse.is_empty() {
            let current = reqs.as_ref().unwrap_or(&claim.reqs);
            let domain_of =
                |k: &str| if k == labels::HOSTNAME { Domain::Claim(index) } else { Domain::Open(current.get(k)) };
            let narrowed = self.topology.check(pod, &cons.strict, groups, inverse, &domain_of, memo)?;
            // Narrowing a claim to the domain it is already pinned to (every pod after its first) changes
            // nothing: no copy of its requirements to find that out.
            if !narrowed.iter().all(|n| current.get(n.key()).is_some_and(|c| c.absorbs_same(n))) {
                let mut r = reqs.take().unwrap_or_else(|| claim.reqs.clone());
                for n in narrowed {
                    r.add(n);
                }
                reqs = Some(r);
            }
        }
        if pod.host_ports.iter().any(|p| claim.host_ports.iter().any(|q| p.conflicts(q))) {
            return Err("a host port is already taken on the claim".into());
        }
        if reqs.as_ref().is_some_and(|r| *r == claim.reqs) {
            reqs = None;
        }
        let ceiling = self.options.price_ceiling;
        let final_reqs = reqs.as_ref().unwrap_or(&claim.reqs);
        let has_min_values = final_reqs.iter().any(|r| r.min_values().is_some());
        if reqs.is_none() && ceiling.is_none() && !has_min_values {
            // Requirements unchanged: every option still satisfies them; only the fit may have changed,
            // and options are cheapest first, so the first that fits is all that matters.
            return match claim.options.iter().position(|o| total.fits(&pool.types[*o as usize].avail)) {
                Some(first) => Ok(Fit { reqs: None, options: None, first }),
                None if want_reason => Err(self.fit_reason(pool, &claim.reqs, &claim.options, &total)),
                None => Err(String::new()),
            };
        }
        let filter = OfferFilter::new(final_reqs, ceiling);
        let options: Vec<u32> = claim
            .options
            .iter()
            .copied()
            .filter(|o| {
                let te = &pool.types[*o as usize];
                total.fits(&te.avail)
                    && reqs.as_ref().is_none_or(|r| te.reqs.is_intersecting(r))
                    && filter.cheapest(&te.it).is_some()
            })
            .collect();
        if options.is_empty() {
            return Err(if want_reason {
                self.fit_reason(pool, final_reqs, &claim.options, &total)
            } else {
                String::new()
            });
        }
        for r in final_reqs.iter() {
            if let Some(min) = r.min_values() {
                let mut distinct = BTreeSet::new();
                for o in &options {
                    distinct.extend(values_of(&pool.types[*o as usize].it, r.key(), &filter));
                }
                if (distinct.len() as u32) < min && !self.options.min_values_best_effort {
                    return Err(format!(
                        "minValues {min} of {} cannot be met: only {} value(s) remain",
                        r.key(),
                        distinct.len()
                    ));
                }
            }
        }
        Ok(Fit { reqs, options: Some(options), first: 0 })
    }

    fn fit_reason(&self, pool: &Pool, reqs: &Requirements, options: &[u32], total: &Resources) -> String {
        let compatible: Vec<&TypeEntry> = options
            .iter()
            .map(|o| &pool.types[*o as usize])
            .filter(|te| te.reqs.is_intersecting(reqs) && te.it.offerings.iter().any(|of| offering_ok(of, reqs)))
            .collect();
        if compatible.is_empty() {
            return format!("no instance type with an available offering satisfies {reqs}");
        }
        let largest = Resources::max_of(compatible.iter().map(|te| &te.avail));
        let short: Vec<String> = total
            .exceeding(&largest)
            .into_iter()
            .map(|n| {
                format!(
                    "{n} {} (largest compatible offers {})",
                    format_quantity(n, total.get(n)),
                    format_quantity(n, largest.get(n))
                )
            })
            .collect();
        if short.is_empty() {
            if self.options.price_ceiling.is_some() {
                return "no instance type fits under the price ceiling".into();
            }
            return "no single instance type has room for every request".into();
        }
        format!("no instance type has room for {}", short.join(", "))
    }

    fn new_claim(
        &self,
        p: usize,
        pod: &PodInfo,
        cons: &Constraints,
        groups: &[usize],
        inverse: &[usize],
        memo: &PlacementMemo,
    ) -> Result<(Claim, Fit), String> {
        let pool = &self.pools[p];
        if pool.remaining_nodes == Some(0) {
            return Err("its node limit is reached".into());
        }
        let options: Vec<u32> = match &pool.remaining {
            Some(rem) => pool.base.iter().copied().filter(|o| pool.types[*o as usize].it.capacity.fits(rem)).collect(),
            None => pool.base.to_vec(),
        };
        if options.is_empty() {
            return Err(if pool.base.is_empty() {
                "no instance type with an available offering matches its requirements".into()
            } else {
                "its limits leave no room for another node".into()
            });
        }
        let max_avail = Resources::max_of(options.iter().map(|o| &pool.types[*o as usize].avail));
        let claim = Claim {
            pool: p,
            reqs: pool.reqs.clone(),
            options,
            max_avail,
            requests: Resources::ZERO,
            pods: Vec::new(),
            host_ports: Vec::new(),
            price: None,
        };
        let fit = self.try_claim(&claim, self.claims.len(), pod, cons, groups, inverse, memo, true)?;
        Ok((claim, fit))
    }

    fn commit(&mut self, c: usize, pods: &[Arc<PodInfo>], i: usize, selecting: &[usize], groups: &[usize], fit: Fit) {
        let pod = &pods[i];
        let load = self.claims[c].pods.len();
        self.by_load.remove(&(load, c));
        for (key, index) in self.by_domain.iter_mut() {
            let value = self.claims[c].reqs.get(key).and_then(|r| r.single()).map(str::to_owned);
            if let Some(set) = index.get_mut(&value) {
                set.remove(&(load, c));
            }
        }
        let pool = &self.pools[self.claims[c].pool];
        let claim = &mut self.claims[c];
        if let Some(r) = fit.reqs {
            claim.reqs = r;
        }
        match fit.options {
            Some(options) => {
                claim.options = options;
                claim.max_avail = Resources::max_of(claim.options.iter().map(|o| &pool.types[*o as usize].avail));
            }
            None if fit.first > 0 => {
                claim.options.drain(..fit.first);
                claim.max_avail = Resources::max_of(claim.options.iter().map(|o| &pool.types[*o as usize].avail));
            }
            None => {}
        }
        claim.requests.add_assign(&pod.requests);
        claim.host_ports.extend(pod.host_ports.iter().cloned());
        claim.pods.push(i);
        let price = if pool.packing == Packing::MarginalCost {
            claim
                .options
                .iter()
                .filter(|o| claim.requests.fits(&pool.types[**o as usize].avail))
                .filter_map(|o| {
                    OfferFilter::new(&claim.reqs, self.options.price_ceiling)
                        .cheapest(&pool.types[*o as usize].it)
                        .map(|of| of.price)
                })
                .min_by(f64::total_cmp)
        } else {
            None
        };
        claim.price = price;
        self.by_load.insert((claim.pods.len(), c));
        let new_load = claim.pods.len();
        for (key, index) in self.by_domain.iter_mut() {
            let value = self.claims[c].reqs.get(key).and_then(|r| r.single()).map(str::to_owned);
            index.entry(value).or_default().insert((new_load, c));
        }
        for set in self.free.values_mut() {
            if set.remove(&(load, c)) {
                // Kept only while a pod the group selects could still join.
                set.insert((new_load, c));
            }
        }
        let reqs = &self.claims[c].reqs;
        let taints = &self.pools[self.claims[c].pool].taints;
        self.topology.record(
            selecting,
            groups,
            taints,
            reqs,
            &|k| {
                if k == labels::HOSTNAME {
                    Some(Landed::Claim(c))
                } else {
                    reqs.get(k).and_then(|r| r.single()).map(|v| Landed::Named(v.to_owned()))
                }
            },
            Some(&|k| reqs.get(k)),
        );
        for g in selecting.iter().chain(groups) {
            if let Some(set) = self.free.get_mut(g)
                && !self.topology.claim_open(*g, c)
            {
                set.remove(&(new_load, c));
            }
        }
    }

    fn finish(self, pods: &[Arc<PodInfo>], failed: Vec<usize>, errors: FxHashMap<usize, String>) -> Results {
        let mut reserved: FxHashMap<String, u32> = FxHashMap::default();
        for pool in &self.pools {
            for te in pool.types.iter() {
                for o in &te.it.offerings {
                    if let (Some(id), Some(cap)) = (&o.reservation_id, o.reservation_capacity) {
                        reserved.entry(id.clone()).or_insert(cap);
                    }
                }
            }
        }
        let mut claims = Vec::with_capacity(self.claims.len());
        let ceiling = self.options.price_ceiling;
        for claim in &self.claims {
            let pool = &self.pools[claim.pool];
            let mut reqs = claim.reqs.clone();
            let (launch, names, types, worst_case_price, daemon_overhead) = {
                let filter = OfferFilter::new(&reqs, ceiling);
                let usable = |o: &Offering, reserved: &FxHashMap<String, u32>| {
                    filter.ok(o)
                        && o.reservation_id.as_ref().is_none_or(|id| reserved.get(id).copied().unwrap_or(0) > 0)
                };
                let mut priced: Vec<(f64, u32)> = claim
                    .options
                    .iter()
                    .filter(|o| claim.requests.fits(&pool.types[**o as usize].avail))
                    .filter_map(|o| {
                        // Offerings are sorted by price: the first usable one is the cheapest.
                        pool.types[*o as usize]
                            .it
                            .offerings
                            .iter()
                            .find(|of| usable(of, &reserved))
                            .map(|of| (of.price, *o))
                    })
                    .collect();
                priced.sort_by(|a, b| {
                    a.0.total_cmp(&b.0).then_with(|| pool.types[a.1 as usize].name.cmp(&pool.types[b.1 as usize].name))
                });
                truncate_keeping_min_values(
                    &mut priced,
                    self.options.max_instance_types.max(1),
                    &reqs,
                    &|o| &pool.types[o as usize].it,
                    &filter,
                );
                let launch = priced.first().and_then(|(_, o)| {
                    let it = &pool.types[*o as usize].it;
                    it.offerings.iter().find(|of| usable(of, &reserved)).map(|of| (it, of.clone()))
                });
                let names: Vec<Arc<str>> = priced.iter().map(|(_, o)| pool.types[*o as usize].name.clone()).collect();
                let types: Vec<Arc<InstanceType>> =
                    priced.iter().map(|(_, o)| pool.types[*o as usize].it.clone()).collect();
                let worst = priced
                    .iter()
                    .filter_map(|(_, o)| worst_launch_price(&pool.types[*o as usize].it, &filter))
                    .fold(0.0_f64, f64::max);
                let overhead =
                    priced.first().map(|(_, o)| pool.types[*o as usize].overhead.clone()).unwrap_or_default();
                (launch.map(|(it, of)| (it.name.clone(), of)), names, types, worst, overhead)
            };
            let launch = launch.map(|(name, of)| {
                if let Some(id) = &of.reservation_id {
                    if let Some(left) = reserved.get_mut(id) {
                        *left = left.saturating_sub(1);
                    }
                    reqs.add(Requirement::is_in(labels::CAPACITY_TYPE, [CapacityType::Reserved.as_str()]));
                    reqs.add(Requirement::is_in(labels::RESERVATION_ID, [id.clone()]));
                }
                Launch { instance_type: name, zone: of.zone, capacity_type: of.capacity_type, price: of.price }
            });
            // BestEffort: a minValues the options cannot meet is lowered to what they do.
            let mut min_values_relaxed = false;
            if self.options.min_values_best_effort {
                let filter = OfferFilter::new(&reqs, ceiling);
                let lowered: Vec<Requirement> = reqs
                    .iter()
                    .filter_map(|r| {
                        let min = r.min_values()?;
                        let met: BTreeSet<&str> = types.iter().flat_map(|t| values_of(t, r.key(), &filter)).collect();
                        ((met.len() as u32) < min).then(|| {
                            let mut lower = r.clone();
                            lower.set_min_values(Some(met.len() as u32));
                            lower
                        })
                    })
                    .collect();
                for r in lowered {
                    min_values_relaxed = true;
                    reqs.replace(r);
                }
            }
            claims.push(ClaimPlan {
                min_values_relaxed,
                pool: pool.name.clone(),
                pods: claim.pods.iter().map(|i| pods[*i].key.clone()).collect(),
                instance_types: names,
                types,
                requirements: reqs,
                requests: claim.requests.clone(),
                daemon_overhead,
                launch,
                worst_case_price,
            });
        }
        let existing = self
            .nodes
            .iter()
            .filter(|n| !n.pods.is_empty())
            .map(|n| NodePlacement {
                node: n.info.name.clone(),
                pods: n.pods.iter().map(|i| pods[*i].key.clone()).collect(),
            })
            .collect();
        let mut unschedulable: Vec<Unschedulable> = failed
            .into_iter()
            .map(|i| Unschedulable {
                pod: pods[i].key.clone(),
                reason: errors.get(&i).cloned().unwrap_or_else(|| "no node or NodePool can take it".into()),
            })
            .collect();
        unschedulable.sort_by(|a, b| a.pod.cmp(&b.pod));
        Results { claims, existing, unschedulable }
    }
}

/// What a NodePool's template requires of its nodes: its requirements, its labels, and the pool itself.
pub fn template_requirements(np: &NodePool) -> Requirements {
    let template = &np.spec.template;
    let mut reqs = Requirements::from_api(&template.spec.requirements);
    for (k, v) in &template.metadata.labels {
        reqs.add(Requirement::is_in(k, [v.clone()]));
    }
    reqs.add(Requirement::is_in(labels::NODE_POOL, [np.name().to_owned()]));
    reqs
}

/// Whether a type described by `treqs` ([`type_requirements`]) can be a node meeting `reqs`, with an
/// offering they allow.
fn type_usable(it: &InstanceType, treqs: &Requirements, reqs: &Requirements) -> bool {
    reqs.is_intersecting(treqs) && it.offerings.iter().any(|o| offering_ok(o, reqs))
}

/// The instance types of `types` a node meeting `reqs` can be, in their order: as a pool's types are
/// chosen, a label some other type defines and this one lacks counting as absent.
pub fn allowed_types<'a>(reqs: &Requirements, types: &'a [InstanceType]) -> Vec<&'a InstanceType> {
    let all_keys = label_keys(types.iter());
    types.iter().filter(|it| type_usable(it, &type_requirements(it, &all_keys), reqs)).collect()
}

/// Every label key instance types define, on the types or on their offerings.
fn label_keys<'a>(types: impl Iterator<Item = &'a InstanceType>) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for it in types {
        keys.extend(it.labels.keys().cloned());
        for o in &it.offerings {
            keys.extend(o.labels.keys().cloned());
        }
    }
    keys
}

/// What a pool's instance types come to under its template and the DaemonSets that run on its nodes:
/// each type's requirements and room, the usable ones cheapest first, and the domains they offer.
#[derive(Debug, Clone)]
struct BuiltTypes {
    types: Arc<Vec<TypeEntry>>,
    type_keys: Arc<BTreeSet<String>>,
    base: Arc<Vec<u32>>,
    /// Each `(key, value)` the usable types offer (labels, offerings' zones and capacity types), once.
    offered: Arc<Vec<(String, String)>>,
}

/// The inputs [`BuiltTypes`] were worked out from, compared whole on a lookup.
#[derive(Debug)]
struct BuiltTypesKey {
    reqs: Requirements,
    daemons: Vec<DaemonPod>,
    instance_types: Arc<[InstanceType]>,
}

/// How many pools' [`BuiltTypes`] a thread keeps.
const BUILT_TYPES_KEPT: usize = 16;

thread_local! {
    /// The last pools' [`BuiltTypes`], most recent first. Every pass (provisioning, each disruption pass and
    /// its validation) builds its pools afresh from instance types that rarely change between passes; working
    /// out each type's requirements and DaemonSet overhead was most of building a pass. An entry is reused
    /// only when its inputs are equal to the new ones, field by field, so a pass builds what it would build
    /// without it.
    static BUILT_TYPES: std::cell::RefCell<std::collections::VecDeque<(BuiltTypesKey, BuiltTypes)>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// A pool's [`BuiltTypes`], reused from an earlier pass of this thread when its inputs are the same.
fn built_types(reqs: &Requirements, daemons: Vec<&DaemonPod>, instance_types: Arc<[InstanceType]>) -> BuiltTypes {
    let same = |k: &BuiltTypesKey| {
        k.reqs == *reqs
            && k.daemons.len() == daemons.len()
            && k.daemons.iter().zip(&daemons).all(|(a, b)| a == *b)
            && (Arc::ptr_eq(&k.instance_types, &instance_types) || k.instance_types == instance_types)
    };
    let found = BUILT_TYPES.with_borrow_mut(|memo| {
        let at = memo.iter().position(|(k, _)| same(k))?;
        let entry = memo.remove(at)?;
        let built = entry.1.clone();
        memo.push_front(entry);
        Some(built)
    });
    if let Some(built) = found {
        return built;
    }
    let built = build_types(reqs, &daemons, &instance_types);
    let key = BuiltTypesKey { reqs: reqs.clone(), daemons: daemons.into_iter().cloned().collect(), instance_types };
    BUILT_TYPES.with_borrow_mut(|memo| {
        memo.push_front((key, built.clone()));
        memo.truncate(BUILT_TYPES_KEPT);
    });
    built
}

fn build_types(reqs: &Requirements, compatible_daemons: &[&DaemonPod], instance_types: &[InstanceType]) -> BuiltTypes {
    let all_keys = label_keys(instance_types.iter());
    let mut overhead_cache: FxHashMap<Vec<Option<String>>, Resources> = FxHashMap::default();
    let daemon_keys: BTreeSet<String> = compatible_daemons
        .iter()
        .flat_map(|d| d.alternatives.iter().flat_map(|a| a.iter().map(|r| r.key().to_owned())))
        .collect();
    let mut types = Vec::with_capacity(instance_types.len());
    let mut base = Vec::new();
    for it in instance_types {
        let mut it = it.clone();
        it.offerings.sort_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.zone.cmp(&b.zone)));
        let treqs = type_requirements(&it, &all_keys);
        let overhead = if compatible_daemons.is_empty() {
            Resources::ZERO
        } else {
            let mut node = reqs.clone();
            node.add_all(&treqs);
            let key: Vec<Option<String>> = daemon_keys
                .iter()
                .map(|k| node.get(k).map(|r| r.to_string()))
                .chain(std::iter::once(Some(format!("{:?}", node.get(labels::ZONE).map(|r| r.values().to_vec())))))
                .collect();
            overhead_cache.entry(key).or_insert_with(|| daemon_overhead(&node, compatible_daemons)).clone()
        };
        let avail = it.allocatable().sub(&overhead);
        let usable = type_usable(&it, &treqs, reqs);
        if usable {
            base.push(types.len() as u32);
        }
        types.push(TypeEntry { name: Arc::from(it.name.as_str()), it: Arc::new(it), reqs: treqs, avail, overhead });
    }
    // Cheapest first, so claims carry their options in price order.
    base.sort_by(|a, b| {
        let pa = cheapest(&types[*a as usize].it, reqs, None).unwrap_or(f64::INFINITY);
        let pb = cheapest(&types[*b as usize].it, reqs, None).unwrap_or(f64::INFINITY);
        pa.total_cmp(&pb)
    });
    // The domains offered, in the order they are first offered (a repeat offers nothing new).
    let mut offered: Vec<(String, String)> = Vec::new();
    let mut seen: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
    for t in &base {
        let te = &types[*t as usize];
        let offerings = te.it.offerings.iter().filter(|o| offering_ok(o, reqs));
        let pairs = offerings
            .flat_map(|o| [(labels::ZONE, o.zone.as_str()), (labels::CAPACITY_TYPE, o.capacity_type.as_str())])
            .chain(te.it.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        for (k, v) in pairs {
            if seen.insert((k, v)) {
                offered.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    BuiltTypes {
        types: Arc::new(types),
        type_keys: Arc::new(all_keys),
        base: Arc::new(base),
        offered: Arc::new(offered),
    }
}

fn build_pool(input: PoolInput, daemons: &[DaemonPod]) -> (Pool, Arc<Vec<(String, String)>>) {
    let np = &input.pool;
    let template = &np.spec.template;
    let reqs = template_requirements(np);
    let taints = template.spec.taints.clone();
    let compatible_daemons: Vec<&DaemonPod> = daemons
        .iter()
        .filter(|d| {
            d.tolerates(&taints)
                && d.alternatives.iter().any(|a| reqs.is_compatible(a, true) || reqs.is_intersecting(a))
        })
        .collect();
    let BuiltTypes { types, type_keys, base, offered } = built_types(&reqs, compatible_daemons, input.instance_types);
    let mut remaining = None;
    let mut remaining_nodes = None;
    if !np.spec.limits.is_empty() {
        let mut limits = np.spec.limits.clone();
        if let Some(n) = limits.remove("nodes") {
            remaining_nodes = n.0.parse::<u64>().ok().map(|n| n.saturating_sub(input.nodes_in_use));
        }
        if !limits.is_empty() {
            let mut lim = Resources::from_resource_list(&limits).unwrap_or_default();
            lim.sub_assign(&input.in_use);
            remaining = Some(limit_mask(&limits, lim));
        }
    }
    let pool = Pool {
        name: np.name().to_owned(),
        reqs,
        taints,
        types,
        type_keys,
        base,
        packing: Packing::of(np),
        remaining,
        remaining_nodes,
    };
    (pool, offered)
}

/// Marks the resources a pool's limits leave unmentioned as unlimited.
fn limit_mask(
    limits: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    remaining: Resources,
) -> Resources {
    // Resources the limits do not mention are unlimited.
    let mut out = Resources::splat(i64::MAX);
    for name in limits.keys() {
        if let Some(r) = ResourceName::lookup(name) {
            out.set(r, remaining.get(r));
        }
    }
    out
}
