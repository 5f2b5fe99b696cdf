//! Topology spread and pod (anti-)affinity: domain counts per constraint, shared by every pod that carries
//! the same constraint.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

use super::pod::{PodInfo, TopologyKind, TopologyTerm, label_pair};
use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::requirements::{Requirement, Requirements};
use super::taints;
use crate::api::labels;

/// One constraint's domain counts.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// Shared by the group's copies: a simulation that changes a group's counts copies only the counts.
    pub(crate) term: Arc<TopologyTerm>,
    /// Pods the selector matches, per domain.
    counts: FxHashMap<String, i32>,
    /// Anti-affinity: domains where a pod carrying the constraint runs (other pods matching the selector
    /// must stay out of them).
    owners: FxHashMap<String, i32>,
    /// Hostname counts of the claims opened in this pass, indexed by claim.
    claim_counts: Vec<i32>,
    /// Hostname owners of the claims opened in this pass, indexed by claim.
    claim_owners: Vec<i32>,
    /// Every pod counted so far, wherever it is.
    total: i32,
    /// Whether any claim has an owner.
    any_claim_owner: bool,
    /// `nodeTaintsPolicy: Honor`: the tolerations deciding which nodes' pods count.
    tolerations: Option<Arc<[Toleration]>>,
    /// The domains the constraint knows, empty or not: those the pools offer (for a spread honouring
    /// taints, only pools whose taints it tolerates) and those of existing nodes it counts. Fixed once the
    /// group exists, so simulations share it; empty for hostname groups, whose domains are their nodes.
    domains: Arc<BTreeSet<String>>,
}

impl Group {
    fn selects(&self, pod: &PodInfo) -> bool {
        self.term.namespaces.as_ref().is_none_or(|n| n.contains(&pod.namespace))
            && self.term.selector.matches(&pod.labels)
    }

    /// Whether pods on a node with `taints` and requirements `reqs` (its labels, or a claim's
    /// requirements) count for this group, as Karpenter's `TopologyNodeFilter` decides for a spread: its
    /// taints tolerated under `nodeTaintsPolicy: Honor`, its labels compatible with one of the pod's node
    /// requirement alternatives under `nodeAffinityPolicy: Honor`.
    fn counts_node(&self, taints: &[Taint], reqs: &Requirements) -> bool {
        self.tolerations.as_ref().is_none_or(|t| taints::untolerated(taints, t, true).is_none())
            && self.term.node_filter.as_ref().is_none_or(|alts| alts.iter().any(|r| reqs.is_compatible(r, false)))
    }

    /// Whether a domain (an existing node's, or a claim's host) holding `count` of the group's pods may take
    /// the pod: within `maxSkew` of the least-filled domain (`min`) for a spread, where selected pods run for
    /// affinity (anywhere for the first pod of a self-affine group), away from them for anti-affinity.
    /// `selects` (whether the group selects the pod) and `min` are asked only when the kind needs them.
    fn admits(&self, count: i32, selects: impl Fn() -> bool, min: impl FnOnce() -> i32) -> bool {
        match self.term.kind {
            TopologyKind::Spread => count + i32::from(selects()) - min() <= self.term.max_skew,
            TopologyKind::Affinity => count > 0 || self.total == 0 && selects(),
            TopologyKind::AntiAffinity => count == 0,
        }
    }

    /// Counts `by` more of the group's pods in `domain`.
    fn count_in(&mut self, domain: &str, by: i32) {
        bump(&mut self.counts, domain, by);
        self.total += by;
    }

    fn count(&self, domain: &str) -> i32 {
        self.counts.get(domain).copied().unwrap_or(0)
    }

    fn claim_count(&self, claim: usize) -> i32 {
        self.claim_counts.get(claim).copied().unwrap_or(0)
    }
}

/// The domains a constraint allows or forbids, whatever the target.
#[derive(Debug, Clone)]
pub(crate) enum DomainFilter<'a> {
    /// Only these domains.
    Allow(Vec<&'a str>),
    /// Any domain but these.
    Block(Vec<&'a str>),
}

impl DomainFilter<'_> {
    /// Whether `domain` passes.
    pub(crate) fn admits(&self, domain: &str) -> bool {
        match self {
            Self::Allow(d) => d.contains(&domain),
            Self::Block(d) => !d.contains(&domain),
        }
    }
}

/// What topology needs of an existing node: its name, labels (hostname included), the requirements they
/// make, and its taints, shared by all its pods.
#[derive(Debug)]
pub(crate) struct NodeView {
    pub(crate) name: String,
    pub(crate) labels: Arc<BTreeMap<String, String>>,
    pub(crate) reqs: Arc<Requirements>,
    pub(crate) taints: Vec<Taint>,
}

/// The domains the pools offer per topology key, each with the taints of the pools offering it (one set
/// per pool; an untainted pool's empty set stands for all), as Karpenter's `TopologyDomainGroup` keeps them.
pub(crate) type PoolDomains = HashMap<String, BTreeMap<String, Vec<Arc<Vec<Taint>>>>>;

/// Records that a pool with `taints` offers `domain` of `key`.
/// Copies the strings only when they are new: most calls repeat a known pair (every instance type of a
/// zone names it).
pub(crate) fn offer_domain(domains: &mut PoolDomains, key: &str, domain: &str, taints: &Arc<Vec<Taint>>) {
    let sets = match domains.get_mut(key) {
        Some(m) => m,
        None => domains.entry(key.to_owned()).or_default(),
    };
    match sets.get_mut(domain) {
        None => {
            sets.insert(domain.to_owned(), vec![Arc::clone(taints)]);
        }
        // Every pod may use a domain an untainted pool offers: no other set matters.
        Some(v) if v.first().is_some_and(|t| t.is_empty()) => {}
        Some(v) if taints.is_empty() => *v = vec![Arc::clone(taints)],
        Some(v) => {
            if !v.iter().any(|t| Arc::ptr_eq(t, taints)) {
                v.push(Arc::clone(taints));
            }
        }
    }
}

/// An existing node's bound pods, as topology counts them.
#[derive(Debug, Clone)]
struct BoundNode {
    view: Arc<NodeView>,
    /// Its pods' classes (indexes into [`Topology`]'s `classes`), each with how many of its pods it has.
    classes: Vec<(u32, i32)>,
    /// Those of its pods with an anti-affinity term: each claims its own domain.
    anti: Vec<Arc<PodInfo>>,
}

/// One topology key's domains over a topology's nodes, looked up once per key and shared by every group of
/// the key (and by the clones of the topology): a new group reads a node's domain by index instead of
/// searching its labels.
#[derive(Debug, Clone, Default)]
struct KeyDomains {
    /// The domains, by id.
    names: Vec<String>,
    /// The id of each domain name.
    ids: FxHashMap<String, u32>,
    /// The ids of the existing nodes' domains, each once, in the order first met (none for the hostname
    /// key, whose groups know no domains up front).
    existing: Vec<u32>,
    /// Each existing node's domain id, in [`Topology`]'s `existing` order (empty for the hostname key).
    by_existing: Vec<Option<u32>>,
    /// Each bound node's domain id, in [`Topology`]'s `bound` order; extended as nodes join `bound`.
    by_bound: Vec<Option<u32>>,
}

impl KeyDomains {
    fn id(&mut self, domain: &str) -> u32 {
        if let Some(&id) = self.ids.get(domain) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(domain.to_owned());
        self.ids.insert(domain.to_owned(), id);
        id
    }
}

/// Bound pods selected alike (one namespace, the same labels): whether a group selects them is asked once,
/// of the first, and they are counted by node.
#[derive(Debug, Clone)]
struct BoundClass {
    first: Arc<PodInfo>,
    /// The nodes its pods are on (indexes into [`Topology`]'s `bound`), each with how many.
    nodes: Vec<(u32, i32)>,
}

/// The pods bound to one node as topology counts them: one entry per selection class (its first pod, and
/// how many of the node's pods it has) and the pods with an anti-affinity term. A cluster state keeps one
/// per node, built as its pods are read, so that a scheduler over the state
/// ([`Scheduler::with_bound_on_nodes`](super::Scheduler::with_bound_on_nodes)) registers each class of a
/// node once rather than each pod.
#[derive(Debug, Clone, Default)]
pub struct BoundOnNode {
    classes: Vec<(Arc<PodInfo>, i32)>,
    anti: Vec<Arc<PodInfo>>,
}

impl BoundOnNode {
    /// Adds a pod bound to the node.
    pub fn add(&mut self, pod: &Arc<PodInfo>) {
        if pod.topology.iter().any(|t| t.kind == TopologyKind::AntiAffinity) {
            self.anti.push(Arc::clone(pod));
        }
        // Pods given classes by one reader are alike exactly when their classes are the same; a pod without
        // one is compared.
        let alike = |first: &PodInfo| match (first.class_id(), pod.class_id()) {
            (Some(a), Some(b)) => a == b,
            _ => first.selected_alike(pod),
        };
        match self.classes.iter_mut().find(|(first, _)| alike(first)) {
            Some((_, n)) => *n += 1,
            None => self.classes.push((Arc::clone(pod), 1)),
        }
    }

    /// Whether it holds no pod.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }
}

/// Where a pod lands, for recording: a named domain, or the hostname of a claim opened in this pass.
#[derive(Debug, Clone)]
pub(crate) enum Landed {
    /// A concrete domain value.
    Named(String),
    /// A claim of this pass, by index.
    Claim(usize),
}

/// A claim's requirement on a topology key, for recording a pod whose domain is not known yet.
pub(crate) type OpenDomains<'f, 'r> = &'f dyn Fn(&str) -> Option<&'r Requirement>;

/// The domains of a claim of this pass for one topology key (an existing node's are fixed: see
/// [`Topology::fits_node`]).
#[derive(Debug)]
pub(crate) enum Domain<'a> {
    /// Its hostname, by the claim's index.
    Claim(usize),
    /// The values its requirement on the key still allows.
    Open(Option<&'a Requirement>),
}

/// Entries (groups, or bound pods) by the label pairs they are reached through: each pod is matched only
/// against the groups whose selectors name one of its labels, not against every group of the pass.
///
/// Keyed by a hash of the pair ([`super::pod::label_pair`]), not the strings: no key is copied or compared. Two pairs
/// may share a list, so a list is a superset of the entries reached through either, and every reader checks
/// what it reads (a group's selector against the pod) before counting it. Each list is ascending and holds
/// an entry once.
type LabelIndex = FxHashMap<u64, Vec<usize>>;

/// Adds `by` to `domain`'s count, copying the domain's name only the first time it is counted.
fn bump(counts: &mut FxHashMap<String, i32>, domain: &str, by: i32) {
    match counts.get_mut(domain) {
        Some(c) => *c += by,
        None => {
            counts.insert(domain.to_owned(), by);
        }
    }
}

/// Adds `entry` to the list of the label pair hashed `pair`. Entries are added in ascending order; one
/// reached through two pairs that share a list is kept once.
fn index_insert(index: &mut LabelIndex, pair: u64, entry: usize) {
    let list = index.entry(pair).or_default();
    if list.last() != Some(&entry) {
        list.push(entry);
    }
}

/// Groups by the label pairs their selectors require ([`super::pod::Selector::anchors`]); groups whose
/// selectors require none are checked against every pod.
#[derive(Debug, Clone, Default)]
struct GroupIndex {
    by_label: LabelIndex,
    unanchored: Vec<usize>,
}

impl GroupIndex {
    fn insert(&mut self, gid: usize, term: &TopologyTerm) {
        match term.selector.anchors() {
            Some(anchors) => {
                for (k, v) in anchors {
                    index_insert(&mut self.by_label, label_pair(k, v), gid);
                }
            }
            None => self.unanchored.push(gid),
        }
    }

    /// The groups that may select a pod with `labels`, ascending and without repeats: a superset of those
    /// that do. Most pods reach one list of the index (their app's label) and no unanchored group: that
    /// list is lent as it is (each list is ascending, its groups inserted in order), with nothing allocated.
    fn candidates(&self, pod: &PodInfo) -> Cow<'_, [usize]> {
        if self.by_label.is_empty() && self.unanchored.is_empty() {
            // No group yet: nothing to read of the pod (building a pass registers its bound pods first).
            return Cow::Borrowed(&[]);
        }
        let mut lists = pod.label_pairs().iter().filter_map(|pair| self.by_label.get(pair));
        if self.unanchored.is_empty() {
            let Some(first) = lists.next() else { return Cow::Borrowed(&[]) };
            let Some(second) = lists.next() else { return Cow::Borrowed(first) };
            let mut out: Vec<usize> = first.iter().chain(second).copied().collect();
            lists.for_each(|l| out.extend_from_slice(l));
            out.sort_unstable();
            out.dedup();
            return Cow::Owned(out);
        }
        let mut out = self.unanchored.clone();
        lists.for_each(|l| out.extend_from_slice(l));
        out.sort_unstable();
        out.dedup();
        Cow::Owned(out)
    }
}

/// All topology constraints of one scheduling pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct Topology {
    /// The groups, each shared by clones until one of them changes it: a simulation copies only the groups
    /// its pods touch.
    groups: Vec<Arc<Group>>,
    /// Each term's group (shared by clones until one registers a new term).
    index: Arc<FxHashMap<TopologyTerm, usize>>,
    /// The groups by the labels their selectors name (shared by clones until one registers a new term).
    selectors: Arc<GroupIndex>,
    /// The domains the pools offer per key, with their pools' taints (shared by clones).
    universe: Arc<PoolDomains>,
    /// Every existing node (shared by clones): its domains join the groups that count it.
    existing: Arc<Vec<Arc<NodeView>>>,
    /// The nodes with bound pods, counted into groups created later (shared by clones).
    bound: Arc<Vec<BoundNode>>,
    /// Indexes into `bound` by node name (shared by clones).
    bound_by_node: Arc<FxHashMap<String, u32>>,
    /// The bound pods by selection class (shared by clones): a new group asks once per class whether it
    /// selects its pods.
    classes: Arc<Vec<BoundClass>>,
    /// Indexes into `classes` by a pod's class token ([`PodInfo::class_id`]) or, for a pod without one, by
    /// its [`PodInfo::selection_hash`] (shared by clones). A list may hold classes of either kind: each is
    /// checked against the pod.
    class_at: Arc<FxHashMap<u64, Vec<u32>>>,
    /// Indexes into `classes` by each of their pods' labels, ascending (shared by clones): a new group
    /// looks only at the classes carrying a label its selector requires.
    classes_by_label: Arc<LabelIndex>,
    /// Nodes removed from this simulation: their pods no longer count.
    removed: FxHashSet<String>,
    /// The indexes into `bound` of the removed nodes.
    removed_bound: FxHashSet<u32>,
    /// Each topology key's domains over the nodes, on first need (shared by clones).
    key_domains: Arc<FxHashMap<String, Arc<KeyDomains>>>,
}

/// What the checks of one placement ([`Topology::fits_node`], [`Topology::check`],
/// [`Topology::domain_filter`]) work out once rather than once per target tried, per group of the placement
/// (in its order), on first need: each spread's minimum and whether a group selects the pod. It must not
/// outlive a change to the counts.
pub(crate) struct PlacementMemo {
    spread_min: Vec<OnceCell<i32>>,
    selects: Vec<OnceCell<bool>>,
}

impl PlacementMemo {
    /// An empty memo for a placement under `groups`.
    pub(crate) fn new(groups: &[usize]) -> Self {
        Self { spread_min: vec![OnceCell::new(); groups.len()], selects: vec![OnceCell::new(); groups.len()] }
    }

    fn selects(&self, i: usize, g: &Group, pod: &PodInfo) -> bool {
        *self.selects[i].get_or_init(|| g.selects(pod))
    }

    fn spread_min(&self, i: usize, min: impl FnOnce() -> i32) -> i32 {
        *self.spread_min[i].get_or_init(min)
    }
}

impl Topology {
    pub(crate) fn new(universe: PoolDomains, existing: Vec<Arc<NodeView>>) -> Self {
        Self { universe: Arc::new(universe), existing: Arc::new(existing), ..Self::default() }
    }

    /// Every domain of `key` anything offers: the pools' and the existing nodes'.
    fn all_domains(&self, key: &str) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self.universe.get(key).into_iter().flat_map(|m| m.keys().cloned()).collect();
        out.extend(self.existing.iter().filter_map(|n| n.labels.get(key).cloned()));
        out
    }

    /// Registers pods already running on `node`, in order.
    pub(crate) fn add_bound_on(&mut self, node: &Arc<NodeView>, pods: impl IntoIterator<Item = Arc<PodInfo>>) {
        let at = self.bound_node(node);
        for pod in pods {
            self.own_domain(at, node, &pod);
            self.count_bound(at, node, &pod, 1);
        }
    }

    /// Registers the pods already running on `node`, summarised by class ([`BoundOnNode`]): what
    /// [`Topology::add_bound_on`] makes of them, without reading each pod.
    pub(crate) fn add_bound_classes(&mut self, node: &Arc<NodeView>, bound: &BoundOnNode) {
        let at = self.bound_node(node);
        for pod in &bound.anti {
            self.own_domain(at, node, pod);
        }
        for (pod, n) in &bound.classes {
            self.count_bound(at, node, pod, *n);
        }
    }

    /// The index of `node` in `bound`, added if new.
    fn bound_node(&mut self, node: &Arc<NodeView>) -> u32 {
        if let Some(at) = self.bound_by_node.get(node.name.as_str()) {
            return *at;
        }
        let at = self.bound.len() as u32;
        let entry = BoundNode { view: Arc::clone(node), classes: Vec::new(), anti: Vec::new() };
        Arc::make_mut(&mut self.bound).push(entry);
        Arc::make_mut(&mut self.bound_by_node).insert(node.name.clone(), at);
        at
    }

    /// A bound pod's own anti-affinity keeps the pods its terms select out of its domain (its groups are
    /// created now if new, counted over the pods bound so far).
    fn own_domain(&mut self, at: u32, node: &NodeView, pod: &Arc<PodInfo>) {
        let mut anti = false;
        for t in pod.topology.iter().filter(|t| t.kind == TopologyKind::AntiAffinity) {
            anti = true;
            let gid = self.group(t);
            if let Some(d) = node.labels.get(&t.key) {
                bump(&mut Arc::make_mut(&mut self.groups[gid]).owners, d, 1);
            }
        }
        if anti {
            Arc::make_mut(&mut self.bound)[at as usize].anti.push(Arc::clone(pod));
        }
    }

    /// Counts `n` pods bound to the node at `at`, selected alike to `pod`, into the groups that select
    /// them, and files them under their class.
    fn count_bound(&mut self, at: u32, node: &NodeView, pod: &Arc<PodInfo>, n: i32) {
        for &gid in self.selectors.candidates(pod).iter() {
            let g = Arc::make_mut(&mut self.groups[gid]);
            if let Some(d) = node.labels.get(&g.term.key)
                && g.selects(pod)
                && g.counts_node(&node.taints, &node.reqs)
            {
                g.count_in(d, n);
            }
        }
        let class = self.class_of(pod);
        let entry = &mut Arc::make_mut(&mut self.bound)[at as usize];
        match entry.classes.iter_mut().find(|(c, _)| *c == class) {
            Some((_, count)) => *count += n,
            None => entry.classes.push((class, n)),
        }
        let nodes = &mut Arc::make_mut(&mut self.classes)[class as usize].nodes;
        match nodes.last_mut() {
            Some((node, count)) if *node == at => *count += n,
            _ => nodes.push((at, n)),
        }
    }

    /// The class of bound pods `pod` joins (by index into `classes`), new if none is selected alike.
    fn class_of(&mut self, pod: &Arc<PodInfo>) -> u32 {
        let key = pod.selection_key();
        if let Some(list) = self.class_at.get(&key)
            && let Some(c) = list.iter().find(|c| self.classes[**c as usize].first.selected_alike(pod))
        {
            return *c;
        }
        let c = self.classes.len() as u32;
        Arc::make_mut(&mut self.classes).push(BoundClass { first: Arc::clone(pod), nodes: Vec::new() });
        Arc::make_mut(&mut self.class_at).entry(key).or_default().push(c);
        let by_label = Arc::make_mut(&mut self.classes_by_label);
        for &pair in pod.label_pairs() {
            index_insert(by_label, pair, c as usize);
        }
        c
    }

    /// Forgets the pods bound to `node`, as if it were gone.
    pub(crate) fn remove_node(&mut self, node: &str) {
        if !self.removed.insert(node.to_owned()) {
            return;
        }
        let Some(&at) = self.bound_by_node.get(node) else { return };
        self.removed_bound.insert(at);
        let bound = Arc::clone(&self.bound);
        let classes = Arc::clone(&self.classes);
        let entry = &bound[at as usize];
        let view = &entry.view;
        // What a group needs of the node (its domain, when its pods count for the group) is the same for
        // every pod on it: worked out once per group. Whether a group selects the pods of a class is asked
        // of the class's first pod.
        let mut domains: Vec<(usize, Option<&String>)> = Vec::new();
        for &(class, n) in &entry.classes {
            let first = &classes[class as usize].first;
            for &gid in self.selectors.candidates(first).iter() {
                let domain = match domains.iter().find(|(g, _)| *g == gid) {
                    Some((_, d)) => *d,
                    None => {
                        let g = &self.groups[gid];
                        let d = view.labels.get(&g.term.key).filter(|_| g.counts_node(&view.taints, &view.reqs));
                        domains.push((gid, d));
                        d
                    }
                };
                let Some(d) = domain else { continue };
                if !self.groups[gid].selects(first) {
                    continue;
                }
                let g = Arc::make_mut(&mut self.groups[gid]);
                if let Some(c) = g.counts.get_mut(d) {
                    *c -= n;
                }
                g.total -= n;
            }
        }
        for pod in &entry.anti {
            // The pod's own anti-affinity no longer claims its domain (once per group, however many equal
            // terms it carries).
            let mut owned: Vec<usize> = pod
                .topology
                .iter()
                .filter(|t| t.kind == TopologyKind::AntiAffinity)
                .filter_map(|t| self.index.get(t).copied())
                .collect();
            owned.sort_unstable();
            owned.dedup();
            for gid in owned {
                let key = &self.groups[gid].term.key;
                if let Some(d) = view.labels.get(key)
                    && self.groups[gid].owners.contains_key(d)
                    && let Some(c) = Arc::make_mut(&mut self.groups[gid]).owners.get_mut(d)
                {
                    *c -= 1;
                }
            }
        }
    }

    /// The domains of `key` over the existing and bound nodes, looked up on first need and extended to
    /// nodes bound since.
    fn key_domains(&mut self, key: &str) -> Arc<KeyDomains> {
        if let Some(kd) = self.key_domains.get(key)
            && kd.by_bound.len() == self.bound.len()
        {
            return Arc::clone(kd);
        }
        let map = Arc::make_mut(&mut self.key_domains);
        let kd = map.entry(key.to_owned()).or_insert_with(|| {
            let mut kd = KeyDomains::default();
            if key != labels::HOSTNAME {
                for n in self.existing.iter() {
                    let id = n.labels.get(key).map(|d| kd.id(d));
                    if let Some(id) = id
                        && id as usize == kd.existing.len()
                    {
                        // A new id is the next one: existing nodes are read first.
                        kd.existing.push(id);
                    }
                    kd.by_existing.push(id);
                }
            }
            Arc::new(kd)
        });
        let kd_mut = Arc::make_mut(kd);
        for b in &self.bound[kd_mut.by_bound.len()..] {
            let id = b.view.labels.get(key).map(|d| kd_mut.id(d));
            kd_mut.by_bound.push(id);
        }
        Arc::clone(kd)
    }

    /// The group of a term, created (and counted over bound pods) on first use.
    pub(crate) fn group(&mut self, term: &TopologyTerm) -> usize {
        if let Some((known, &i)) = self.index.get_key_value(term) {
            term.found_equal_to(known);
            return i;
        }
        // The group's copies of the term share its equality token with it.
        term.share_equality();
        let mut g = Group {
            term: Arc::new(term.clone()),
            counts: FxHashMap::default(),
            owners: FxHashMap::default(),
            claim_counts: Vec::new(),
            claim_owners: Vec::new(),
            total: 0,
            any_claim_owner: false,
            tolerations: term
                .honor_taints
                .as_deref()
                .map(|t| serde_json::from_str::<Vec<Toleration>>(t).unwrap_or_default().into()),
            domains: Arc::default(),
        };
        // The domains the group knows: those of the pools it may use (a spread honouring taints skips
        // pools whose taints it does not tolerate) and those of the existing nodes it counts.
        let key = term.key.as_str();
        let spread = term.kind == TopologyKind::Spread;
        // Whether some node's pods might not count for the group ([`Group::counts_node`]).
        let filtered = g.tolerations.is_some() || term.node_filter.is_some();
        let kd = self.key_domains(key);
        let mut domains = BTreeSet::new();
        if key != labels::HOSTNAME {
            for (d, taint_sets) in self.universe.get(key).into_iter().flatten() {
                let usable = !spread
                    || g.tolerations
                        .as_ref()
                        .is_none_or(|tol| taint_sets.iter().any(|t| taints::untolerated(t, tol, true).is_none()));
                if usable {
                    domains.insert(d.clone());
                }
            }
            if spread && filtered {
                for (n, id) in self.existing.iter().zip(&kd.by_existing) {
                    if let Some(id) = *id
                        && !domains.contains(&kd.names[id as usize])
                        && g.counts_node(&n.taints, &n.reqs)
                    {
                        domains.insert(kd.names[id as usize].clone());
                    }
                }
            } else {
                for &id in &kd.existing {
                    if !domains.contains(&kd.names[id as usize]) {
                        domains.insert(kd.names[id as usize].clone());
                    }
                }
            }
        }
        g.domains = Arc::new(domains);
        // Only the classes of bound pods carrying a label the selector requires can count (all of them when
        // it requires none); whether the group selects a class is asked once, of its first pod. Counts are
        // summed per domain and entered in the order their domains are first met.
        let anchored: Option<Vec<usize>> = term.selector.anchors().map(|anchors| {
            let mut at: Vec<usize> = anchors
                .iter()
                .filter_map(|(k, v)| self.classes_by_label.get(&label_pair(k, v)))
                .flatten()
                .copied()
                .collect();
            if anchors.len() > 1 {
                at.sort_unstable();
                at.dedup();
            }
            at
        });
        let classes: Box<dyn Iterator<Item = &BoundClass>> = match &anchored {
            Some(at) => Box::new(at.iter().map(|c| &self.classes[*c])),
            None => Box::new(self.classes.iter()),
        };
        // Whether each bound node's pods count for a filtered group, worked out once per node.
        let mut node_counts: Vec<Option<bool>> = Vec::new();
        let mut sums: Vec<Option<i32>> = Vec::new();
        let mut met: Vec<u32> = Vec::new();
        for class in classes {
            if !g.selects(&class.first) {
                continue;
            }
            if sums.is_empty() {
                sums = vec![None; kd.names.len()];
                if filtered {
                    node_counts = vec![None; self.bound.len()];
                }
            }
            for &(at, n) in &class.nodes {
                let Some(id) = kd.by_bound[at as usize] else { continue };
                if !self.removed_bound.is_empty() && self.removed_bound.contains(&at) {
                    continue;
                }
                if filtered {
                    let counts = *node_counts[at as usize].get_or_insert_with(|| {
                        let view = &self.bound[at as usize].view;
                        g.counts_node(&view.taints, &view.reqs)
                    });
                    if !counts {
                        continue;
                    }
                }
                match &mut sums[id as usize] {
                    Some(sum) => *sum += n,
                    sum => {
                        met.push(id);
                        *sum = Some(n);
                    }
                }
            }
        }
        for id in met {
            g.count_in(&kd.names[id as usize], sums[id as usize].unwrap_or(0));
        }
        let gid = self.groups.len();
        self.groups.push(Arc::new(g));
        Arc::make_mut(&mut self.index).insert(term.clone(), gid);
        Arc::make_mut(&mut self.selectors).insert(gid, term);
        gid
    }

    /// Groups whose selector matches `pod` (their counts grow when it lands), ascending.
    pub(crate) fn selecting(&self, pod: &PodInfo) -> Vec<usize> {
        self.selectors.candidates(pod).iter().copied().filter(|&g| self.groups[g].selects(pod)).collect()
    }

    /// Of the groups `selecting` a pod ([`Topology::selecting`]), the anti-affinity ones with owners
    /// somewhere (the pod must avoid their owners' domains).
    pub(crate) fn inverse(&self, selecting: &[usize]) -> Vec<usize> {
        selecting
            .iter()
            .copied()
            .filter(|&g| {
                let grp = &self.groups[g];
                grp.term.kind == TopologyKind::AntiAffinity && (!grp.owners.is_empty() || grp.any_claim_owner)
            })
            .collect()
    }

    /// Checks `pod`'s constraints (`groups`) and the inverse anti-affinity constraints (`inverse`) against a
    /// claim of this pass, returning the requirements the target must narrow to, or why it cannot take the pod.
    pub(crate) fn check<'a>(
        &self,
        pod: &PodInfo,
        pod_reqs: &Requirements,
        groups: &[usize],
        inverse: &[usize],
        domain_of: &dyn Fn(&str) -> Domain<'a>,
        memo: &PlacementMemo,
    ) -> Result<Vec<Requirement>, String> {
        let mut narrowed: Vec<Requirement> = Vec::new();
        for (i, &gid) in groups.iter().enumerate() {
            let g = &self.groups[gid];
            let key = g.term.key.as_str();
            if let Domain::Claim(c) = domain_of(key) {
                if !self.claim_allows(gid, pod, c) {
                    return Err(describe(&g.term, "the node already holds too many matching pods"));
                }
                continue;
            }
            let own =
                |req: &Requirement| narrowed.iter().find(|r| r.key() == key).map_or(req.clone(), |n| n.intersect(req));
            let candidates: Vec<&str> = match domain_of(key) {
                Domain::Claim(_) => Vec::new(),
                Domain::Open(r) => {
                    let mut c: Vec<&str> = match r {
                        Some(r) if !r.is_complement() => r.values().iter().map(String::as_str).collect(),
                        _ => g.domains.iter().filter(|d| r.is_none_or(|r| r.has(d))).map(String::as_str).collect(),
                    };
                    if let Some(n) = narrowed.iter().find(|r| r.key() == key) {
                        c.retain(|d| n.has(d));
                    }
                    c
                }
            };
            let allowed: Vec<&str> = match g.term.kind {
                TopologyKind::Spread => {
                    let self_count = i32::from(memo.selects(i, g, pod));
                    let min = memo.spread_min(i, || self.spread_min(g, pod_reqs));
                    // Pin the emptiest domain (the first by name among equals), as kube-scheduler would fill
                    // it first.
                    candidates
                        .iter()
                        .copied()
                        .filter(|d| g.count(d) + self_count - min <= g.term.max_skew)
                        .min_by_key(|d| (g.count(d), *d))
                        .into_iter()
                        .collect()
                }
                TopologyKind::Affinity => {
                    let with_pods: Vec<&str> = candidates.iter().copied().filter(|d| g.count(d) > 0).collect();
                    if !with_pods.is_empty() {
                        with_pods
                    } else if g.total == 0 && g.selects(pod) {
                        // The first pod of a self-affine group bootstraps a domain.
                        candidates.into_iter().take(1).collect()
                    } else {
                        Vec::new()
                    }
                }
                // Every empty domain stays open: the claim lands in one of them, and until it is known which,
                // recording counts the pod in all of them (late committal, as Karpenter does).
                TopologyKind::AntiAffinity => candidates.into_iter().filter(|d| g.count(d) == 0).collect(),
            };
            if allowed.is_empty() {
                return Err(describe(&g.term, "no domain satisfies it"));
            }
            if key != labels::HOSTNAME {
                let req = own(&Requirement::is_in(key, allowed));
                narrowed.retain(|r| r.key() != key);
                narrowed.push(req);
            }
        }
        for &gid in inverse {
            let g = &self.groups[gid];
            let key = g.term.key.as_str();
            let blocked: Vec<&String> = g.owners.iter().filter(|(_, c)| **c > 0).map(|(d, _)| d).collect();
            match domain_of(key) {
                Domain::Claim(c) if g.claim_owners.get(c).copied().unwrap_or(0) > 0 => {
                    return Err(format!("a pod's anti-affinity on {key} keeps this pod off the node"));
                }
                Domain::Open(r) if !blocked.is_empty() => {
                    let avoid = Requirement::not_in(key, blocked.into_iter().cloned());
                    let req = narrowed.iter().find(|n| n.key() == key).map_or(avoid.clone(), |n| n.intersect(&avoid));
                    let req = match r {
                        Some(r) => req.intersect(r),
                        None => req,
                    };
                    if req.is_empty() {
                        return Err(format!("a running pod's anti-affinity on {key} excludes every domain"));
                    }
                    narrowed.retain(|n| n.key() != key);
                    narrowed.push(req);
                }
                _ => {}
            }
        }
        Ok(narrowed)
    }

    /// Whether the groups let `pod` onto an existing node labelled `node_labels`: what
    /// [`Topology::check`] answers for a node's fixed domains, without saying why not. `memo` is the
    /// placement's, made for `groups`.
    pub(crate) fn fits_node(
        &self,
        pod: &PodInfo,
        pod_reqs: &Requirements,
        groups: &[usize],
        inverse: &[usize],
        node_labels: &BTreeMap<String, String>,
        memo: &PlacementMemo,
    ) -> bool {
        for (i, &gid) in groups.iter().enumerate() {
            let g = &self.groups[gid];
            let Some(d) = node_labels.get(&g.term.key) else { return false };
            let min = || memo.spread_min(i, || self.spread_min(g, pod_reqs));
            if !g.admits(g.count(d), || memo.selects(i, g, pod), min) {
                return false;
            }
        }
        inverse.iter().all(|&gid| {
            let g = &self.groups[gid];
            node_labels.get(&g.term.key).is_none_or(|d| g.owners.get(d.as_str()).is_none_or(|c| *c <= 0))
        })
    }

    /// The domains group `gid` allows for `pod` right now, independent of the target: `Allow` lists the
    /// permitted domains, `Block` the forbidden ones, `None` means any. Used to reject targets whose domain
    /// is already fixed without running the full check.
    /// `i` is the group's place among the placement's groups, for `memo`.
    pub(crate) fn domain_filter(
        &self,
        i: usize,
        gid: usize,
        pod: &PodInfo,
        pod_reqs: &Requirements,
        memo: &PlacementMemo,
    ) -> Option<DomainFilter<'_>> {
        let g = &self.groups[gid];
        if g.term.key == labels::HOSTNAME {
            return None;
        }
        match g.term.kind {
            TopologyKind::Spread => {
                let self_count = i32::from(memo.selects(i, g, pod));
                let min = memo.spread_min(i, || self.spread_min(g, pod_reqs));
                let admitted = |d: &&String| g.count(d) + self_count - min <= g.term.max_skew;
                let mut allow: Vec<&str> = g.domains.iter().filter(admitted).map(String::as_str).collect();
                let counted_only = g.counts.keys().filter(|d| !g.domains.contains(*d));
                let before = allow.len();
                allow.extend(counted_only.filter(admitted).map(String::as_str));
                if allow.len() > before {
                    allow.sort_unstable();
                }
                Some(DomainFilter::Allow(allow))
            }
            TopologyKind::Affinity => {
                if g.total == 0 && memo.selects(i, g, pod) {
                    None
                } else {
                    Some(DomainFilter::Allow(
                        g.counts.iter().filter(|(_, c)| **c > 0).map(|(d, _)| d.as_str()).collect(),
                    ))
                }
            }
            TopologyKind::AntiAffinity => {
                Some(DomainFilter::Block(g.counts.iter().filter(|(_, c)| **c > 0).map(|(d, _)| d.as_str()).collect()))
            }
        }
    }

    /// Whether group `gid` lets `pod` onto claim `c` of this pass (hostname domains only); no allocation.
    pub(crate) fn claim_allows(&self, gid: usize, pod: &PodInfo, c: usize) -> bool {
        let g = &self.groups[gid];
        // A hostname spread's least-filled host is an empty one.
        g.admits(g.claim_count(c), || g.selects(pod), || 0)
    }

    /// Whether an inverse anti-affinity group keeps pods off claim `c` of this pass.
    pub(crate) fn claim_owned(&self, gid: usize, c: usize) -> bool {
        self.groups[gid].claim_owners.get(c).copied().unwrap_or(0) > 0
    }

    /// How many groups are registered.
    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }

    /// The kind of group `gid`.
    pub(crate) fn kind(&self, gid: usize) -> TopologyKind {
        self.groups[gid].term.kind
    }

    /// Whether claim `c` can still take a pod that group `gid` selects (hostname anti-affinity: none there
    /// yet; hostname spread: fewer than `maxSkew`).
    pub(crate) fn claim_open(&self, gid: usize, c: usize) -> bool {
        let g = &self.groups[gid];
        match g.term.kind {
            TopologyKind::AntiAffinity => g.claim_count(c) == 0 && g.claim_owners.get(c).copied().unwrap_or(0) == 0,
            TopologyKind::Spread => g.claim_count(c) < g.term.max_skew,
            TopologyKind::Affinity => true,
        }
    }

    /// The topology key of group `gid`.
    pub(crate) fn key(&self, gid: usize) -> &str {
        &self.groups[gid].term.key
    }

    /// Whether group `gid` is keyed on the hostname.
    pub(crate) fn is_hostname(&self, gid: usize) -> bool {
        self.groups[gid].term.key == labels::HOSTNAME
    }

    fn spread_min(&self, g: &Group, pod_reqs: &Requirements) -> i32 {
        if g.term.key == labels::HOSTNAME {
            return 0;
        }
        // The minimum is over the domains the pod's own requirement on the key allows, as Karpenter takes it.
        let filter = pod_reqs.get(&g.term.key);
        let allowed = |d: &String| filter.is_none_or(|f| f.has(d));
        if let Some(min_domains) = g.term.min_domains {
            let mut domains: BTreeSet<&String> = g.domains.iter().filter(|d| allowed(d)).collect();
            domains.extend(g.counts.keys().filter(|d| allowed(d)));
            if (domains.len() as i32) < min_domains {
                return 0;
            }
        }
        // The least count over the known domains and the counted ones (a domain in both counts the same).
        let known = g.domains.iter().filter(|d| allowed(d)).map(|d| g.count(d));
        known.chain(g.counts.iter().filter(|(d, _)| allowed(d)).map(|(_, c)| *c)).min().unwrap_or(0)
    }

    /// The domains a target still open on `key` may land in: those its requirement admits among the known
    /// ones (all known ones when it has none).
    fn possible_domains(&self, key: &str, open: Option<&Requirement>) -> Vec<String> {
        match open {
            Some(r) if !r.is_complement() => r.values().to_vec(),
            _ => self.all_domains(key).into_iter().filter(|d| open.is_none_or(|r| r.has(d))).collect(),
        }
    }

    /// Records `pod` landing on a target: counts grow in the groups that select it, and its own
    /// anti-affinity claims its domain. `domain_of` names the target's domain for a key. A claim of this pass
    /// may have none yet: `open_of` then gives its requirement on the key, and anti-affinity groups count the
    /// pod in every domain it may still land in (spread and affinity count it only once its domain is known).
    /// An existing node (no `open_of`) without the key is in no domain. `target_taints` and `target_reqs`
    /// are the target's taints and labels (a claim's: its pool's taints and its requirements).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record<'r>(
        &mut self,
        selecting: &[usize],
        owned: &[usize],
        target_taints: &[Taint],
        target_reqs: &Requirements,
        domain_of: &dyn Fn(&str) -> Option<Landed>,
        open_of: Option<OpenDomains<'_, 'r>>,
    ) {
        for &gid in selecting {
            // A spread counts the pod only on a target its node filter admits (Karpenter's `Counts`).
            if !self.groups[gid].counts_node(target_taints, target_reqs) {
                continue;
            }
            let key = self.groups[gid].term.key.clone();
            match domain_of(&key) {
                Some(Landed::Named(d)) => *Arc::make_mut(&mut self.groups[gid]).counts.entry(d).or_default() += 1,
                Some(Landed::Claim(c)) => {
                    let g = Arc::make_mut(&mut self.groups[gid]);
                    if g.claim_counts.len() <= c {
                        g.claim_counts.resize(c + 1, 0);
                    }
                    g.claim_counts[c] += 1;
                }
                None if self.groups[gid].term.kind == TopologyKind::AntiAffinity && open_of.is_some() => {
                    let domains = open_of.map(|f| self.possible_domains(&key, f(&key))).unwrap_or_default();
                    let g = Arc::make_mut(&mut self.groups[gid]);
                    for d in domains {
                        *g.counts.entry(d).or_default() += 1;
                    }
                }
                None => continue,
            }
            Arc::make_mut(&mut self.groups[gid]).total += 1;
        }
        for &gid in owned {
            if self.groups[gid].term.kind != TopologyKind::AntiAffinity {
                continue;
            }
            let key = self.groups[gid].term.key.clone();
            let landed = domain_of(&key);
            let possible = match landed {
                None => open_of.map(|f| self.possible_domains(&key, f(&key))).unwrap_or_default(),
                Some(_) => Vec::new(),
            };
            let g = Arc::make_mut(&mut self.groups[gid]);
            match landed {
                None => {
                    for d in possible {
                        *g.owners.entry(d).or_default() += 1;
                    }
                }
                Some(Landed::Named(d)) => *g.owners.entry(d).or_default() += 1,
                Some(Landed::Claim(c)) => {
                    if g.claim_owners.len() <= c {
                        g.claim_owners.resize(c + 1, 0);
                    }
                    g.claim_owners[c] += 1;
                    g.any_claim_owner = true;
                }
            }
        }
    }
}

fn describe(t: &TopologyTerm, why: &str) -> String {
    match t.kind {
        TopologyKind::Spread => format!("topology spread on {} (maxSkew {}) cannot be met: {why}", t.key, t.max_skew),
        TopologyKind::Affinity => format!("pod affinity on {} cannot be met: {why}", t.key),
        TopologyKind::AntiAffinity => format!("pod anti-affinity on {} cannot be met: {why}", t.key),
    }
}
