//! The cluster mirror: nodes joined with their claims, the pods bound to them, DaemonSets and PDBs, with
//! per-node available resources. Built from Kubernetes objects (a watch, a simulator, or a snapshot file)
//! and read by every decision.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use rustc_hash::{FxHashMap, FxHashSet};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::api::{ConditionStatus, condition_types};
use crate::api::{NodeClaim, NodeClaimSpec, NodeClaimStatus, NodePool, NodeSelectorRequirement, Operator, labels};
use crate::cloud::{CapacityType, InstanceType};
use crate::resources::Resources;
use crate::scheduling::{BoundOnNode, DaemonPod, ExistingNode, HostPort, PodError, PodInfo, Requirement, Requirements};

/// A node (or a launched claim whose node has not registered yet), as the controllers see it.
#[derive(Debug, Clone)]
pub struct StateNode {
    /// The node's name (the claim's name while no node exists).
    pub name: String,
    /// The Node object, once registered (shared with the caller when it holds it behind an `Arc`).
    pub node: Option<Arc<Node>>,
    /// The NodeClaim, inferred from the Node when none exists.
    pub claim: Option<Arc<NodeClaim>>,
    /// Whether the claim was inferred from the Node (an inferred claim has no template hash).
    pub inferred_claim: bool,
    /// The node's labels (shared with the schedulers built from this state).
    pub labels: Arc<BTreeMap<String, String>>,
    /// The requirements its labels make, read on first use ([`StateNode::label_requirements`]) and kept
    /// with what the state cache read of the object.
    label_requirements: Arc<OnceLock<Arc<Requirements>>>,
    /// The node's taints.
    pub taints: Vec<Taint>,
    /// Allocatable resources.
    pub allocatable: Resources,
    /// The Node's reported capacity (`status.capacity`), when it has one that parses: what counts against
    /// its pool's limits (the allocatable otherwise).
    pub capacity: Option<Resources>,
    /// Requests of the pods bound to it.
    pub requested: Resources,
    /// Host ports its pods bind.
    pub host_ports: Vec<HostPort>,
    /// The NodePool it belongs to, if tenon manages it.
    pub pool: Option<String>,
    /// Whether the node or its claim is being deleted.
    pub deleting: bool,
    /// Whether the node is Ready.
    pub ready: bool,
    /// Whether the claim is initialized.
    pub initialized: bool,
    /// Whether the node is cordoned.
    pub unschedulable: bool,
    /// Whether provisioning nominated a pending pod to it lately: it is no disruption candidate while
    /// the nomination holds, as Karpenter leaves a nominated node alone.
    pub nominated: bool,
    /// The volume attachments each CSI driver allows on it (its CSINode's `allocatable.count`), with the
    /// claims its pods hold attached.
    pub volume_limits: Vec<crate::scheduling::VolumeRoom>,
    /// Indexes into [`ClusterState::pods`] of the pods bound to it.
    pub pods: Vec<usize>,
    /// Those of its pods that have not finished, summarised for topology (shared with the state cache,
    /// which keeps it while none of them changes).
    pub bound: Arc<BoundOnNode>,
}

impl StateNode {
    /// The requirements its labels make ([`Requirements::from_labels`]), read once per object (not at all
    /// when nothing schedules against the node) and shared with the schedulers built from this state.
    pub fn label_requirements(&self) -> Arc<Requirements> {
        Arc::clone(self.label_requirements.get_or_init(|| Arc::new(Requirements::from_labels(&*self.labels))))
    }

    /// Allocatable minus requested.
    pub fn available(&self) -> Resources {
        self.allocatable.sub(&self.requested)
    }

    /// A label of the node.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The capacity type, from the `karpenter.sh/capacity-type` label.
    pub fn capacity_type(&self) -> Option<CapacityType> {
        self.label(labels::CAPACITY_TYPE).and_then(CapacityType::parse)
    }

    /// The price per hour of the node's own offering (its instance type, zone and capacity type) in
    /// `types`.
    pub fn price(&self, types: &[InstanceType]) -> Option<f64> {
        let it = types.iter().find(|t| Some(t.name.as_str()) == self.label(labels::INSTANCE_TYPE))?;
        self.price_of_type(it)
    }

    /// The price per hour of the node's offering of `it` (its zone and capacity type), `it` being the
    /// node's instance type found by the caller.
    pub fn price_of_type(&self, it: &InstanceType) -> Option<f64> {
        let zone = self.label(labels::ZONE)?;
        let ct = self.capacity_type()?;
        it.offering(zone, ct).map(|o| o.price)
    }

    /// As a scheduling target.
    pub fn as_existing(&self) -> ExistingNode {
        ExistingNode {
            name: self.name.clone(),
            labels: self.labels.clone(),
            requirements: Some(self.label_requirements()),
            taints: self.taints.clone(),
            available: self.available(),
            host_ports: self.host_ports.clone(),
            accepts_pods: !self.deleting && !self.unschedulable,
            volume_room: self.volume_limits.clone(),
        }
    }
}

/// A pod and where it stands.
#[derive(Debug, Clone)]
pub struct StatePod {
    /// The scheduling view, shared with the schedulers built from this state.
    pub info: Arc<PodInfo>,
    /// Whether it has finished (Succeeded or Failed).
    pub terminal: bool,
    /// Whether it is a static (mirror) pod, owned by its node.
    pub static_pod: bool,
    /// Whether it is being deleted (it has a deletion timestamp).
    pub terminating: bool,
    /// Whether a StatefulSet owns it.
    pub stateful: bool,
    /// When it started running (`status.startTime`), if it did.
    pub start_time: Option<Timestamp>,
    /// Whether its `Ready` condition is `False` (a PDB with `unhealthyPodEvictionPolicy: AlwaysAllow`
    /// lets such a pod go).
    pub not_ready: bool,
    /// Whether a PodDisruptionBudget counts it healthy ([`crate::cluster::pdb_healthy`]).
    pub pdb_healthy: bool,
    /// Whether provisioning may buy capacity for it, as Karpenter's `IsProvisionable` judges: see
    /// [`provisionable`].
    pub provisionable: bool,
}

impl StatePod {
    /// Whether the pod needs a new place when its node goes, as Karpenter's `IsReschedulable` judges:
    /// active (not finished, not terminating), or a StatefulSet's pod terminating (its replacement must
    /// wait for it to go, and will need the room); never a DaemonSet's or a static pod. A pod tolerating
    /// the `karpenter.sh/disrupted` taint still needs one: only the drain leaves it be.
    pub fn reschedulable(&self) -> bool {
        !self.terminal && (!self.terminating || self.stateful) && !self.info.daemon && !self.static_pod
    }
}

/// Whether provisioning may buy capacity for `pod`, as Karpenter's `IsProvisionable` judges: not bound,
/// not preempting (no `status.nominatedNodeName`), held by no `schedulingGates`, and marked by the
/// scheduler as failed to schedule (`PodScheduled=False`, reason `Unschedulable`); a pod with no status at
/// all (a hand-written snapshot's) counts as failed to schedule. DaemonSet and mirror pods are left out by
/// the callers, which know them.
pub fn provisionable(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    if spec.node_name.is_some() || spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()) {
        return false;
    }
    let Some(status) = pod.status.as_ref() else { return true };
    if status.nominated_node_name.as_ref().is_some_and(|n| !n.is_empty()) {
        return false;
    }
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled")
        .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
}

/// What a state reads of a pod besides its scheduling view.
#[derive(Debug, Clone)]
struct PodFacts {
    terminal: bool,
    static_pod: bool,
    terminating: bool,
    stateful: bool,
    start_time: Option<Timestamp>,
    not_ready: bool,
    pdb_healthy: bool,
    /// [`provisionable`] of the pod alone.
    provisionable: bool,
    has_volumes: bool,
}

impl PodFacts {
    fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let owned_by = |kind: &str| pod.metadata.owner_references.iter().flatten().any(|o| o.kind == kind);
        PodFacts {
            terminal: crate::cluster::pod_finished(pod),
            static_pod: owned_by("Node"),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            stateful: owned_by("StatefulSet"),
            start_time: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            not_ready: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "False"),
            pdb_healthy: crate::cluster::pdb_healthy(pod),
            provisionable: provisionable(pod),
            has_volumes: pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).is_some_and(|v| !v.is_empty()),
        }
    }
}

/// One pod of [`ReadPods`].
#[derive(Debug, Clone)]
struct ReadPod {
    /// The scheduling view, or why the pod cannot be understood (reported when the state is built, as
    /// [`ClusterState::from_objects`] reports it).
    info: Result<Arc<PodInfo>, Box<PodError>>,
    facts: PodFacts,
    pod: Option<Box<Pod>>,
}

impl ReadPod {
    /// Reduces `pod`.
    fn new(pod: Pod) -> Self {
        let facts = PodFacts::of(&pod);
        let info = PodInfo::from_pod(&pod).map(Arc::new).map_err(Box::new);
        let keep = info.is_ok() && facts.has_volumes && !facts.terminal;
        ReadPod { info, facts, pod: keep.then(|| Box::new(pod)) }
    }
}

/// Pods reduced as they are read, in order, to what a [`ClusterState`] keeps of them: their scheduling
/// views and a few facts (the `Pod` object itself only for a pod with volumes, whose placement depends on
/// storage objects that may come later in the input). What a [`Snapshot`](crate::snapshot::Snapshot) read
/// for [`ClusterState::from_read_snapshot`] keeps of its pods.
#[derive(Debug, Clone, Default)]
pub struct ReadPods(Vec<ReadPod>);

impl crate::snapshot::PodSink for ReadPods {
    fn push(&mut self, pod: Pod) {
        self.0.push(ReadPod::new(pod));
    }

    fn append(&mut self, mut other: Self) {
        if self.0.is_empty() {
            *self = other;
        } else {
            self.0.append(&mut other.0);
        }
    }
}

/// An object a state is built from: borrowed (copied into the state) or shared behind an `Arc` (shared
/// by the state too).
trait ObjectRef<T> {
    /// The object.
    fn object(&self) -> &T;
    /// The object behind an `Arc`, copying it only if it is not shared already.
    fn to_shared(&self) -> Arc<T>;
    /// The shared object, if it is one (its identity keys [`StateCache`]).
    fn as_shared(&self) -> Option<&Arc<T>>;
}

impl<T: Clone> ObjectRef<T> for &T {
    fn object(&self) -> &T {
        self
    }
    fn to_shared(&self) -> Arc<T> {
        Arc::new((*self).clone())
    }
    fn as_shared(&self) -> Option<&Arc<T>> {
        None
    }
}

impl<T> ObjectRef<T> for &Arc<T> {
    fn object(&self) -> &T {
        self
    }
    fn to_shared(&self) -> Arc<T> {
        Arc::clone(self)
    }
    fn as_shared(&self) -> Option<&Arc<T>> {
        Some(self)
    }
}

/// What a state build read from shared objects, reused by the next build while the object is the same
/// allocation: an object that changes is a new `Arc` (copy-on-write), so it is read afresh. Pods keep
/// their scheduling views and facts; Nodes and NodeClaims the labels (and the requirements they make) and
/// resources read from them.
///
/// A snapshot build whose namespaces and storage are the last one's takes over the last build's pods that
/// did not change, and the counts of the nodes none of whose pods changed, without reading the others
/// again; a build that reads every pod (the first, or one after namespaces or storage changed) reads them
/// through the memo of pods. A build that takes pods over empties that memo, so that it holds no pod (nor
/// the object it was read from) once gone: a build reading every pod after one that took them over reads
/// each afresh.
#[derive(Debug, Default)]
pub struct StateCache {
    /// The pods the last build that read every pod read, until a build takes over `built` instead (over
    /// the same namespaces and storage).
    pods: ObjectMemo<Pod, (Arc<PodInfo>, PodFacts)>,
    nodes: ObjectMemo<Node, ReadFacts>,
    claims: ObjectMemo<NodeClaim, ReadFacts>,
    /// The last snapshot build's pods, with what it read them from.
    built: Option<(PodsSource, Arc<BuiltPods>)>,
    /// The selection classes of the pods read.
    classes: crate::scheduling::SelectionClasses,
}

/// What a snapshot's pods were read from: its pod map, storage and namespaces, held weakly
/// ([`unchanged_since`](crate::cluster::unchanged_since) says whether a snapshot holds them unchanged).
#[derive(Debug)]
struct PodsSource {
    pods: std::sync::Weak<BTreeMap<String, Arc<Pod>>>,
    namespaces: std::sync::Weak<crate::cluster::NamespaceLabels>,
    volumes: std::sync::Weak<BTreeMap<String, Arc<k8s_openapi::api::core::v1::PersistentVolume>>>,
    claims: std::sync::Weak<BTreeMap<String, Arc<k8s_openapi::api::core::v1::PersistentVolumeClaim>>>,
    classes: std::sync::Weak<BTreeMap<String, Arc<k8s_openapi::api::storage::v1::StorageClass>>>,
    csi_nodes: std::sync::Weak<BTreeMap<String, Arc<k8s_openapi::api::storage::v1::CSINode>>>,
}

impl PodsSource {
    fn of(snapshot: &crate::cluster::Snapshot) -> Self {
        let storage = &snapshot.storage;
        Self {
            pods: Arc::downgrade(&snapshot.pods),
            namespaces: Arc::downgrade(&snapshot.namespaces),
            volumes: Arc::downgrade(&storage.volumes),
            claims: Arc::downgrade(&storage.claims),
            classes: Arc::downgrade(&storage.classes),
            csi_nodes: Arc::downgrade(&storage.csi_nodes),
        }
    }

    /// Whether `snapshot` holds the very maps this source was taken from, unchanged.
    fn is_of(&self, snapshot: &crate::cluster::Snapshot) -> bool {
        crate::cluster::unchanged_since(&self.pods, &snapshot.pods) && self.same_but_pods(snapshot)
    }

    /// Whether `snapshot` holds the namespaces and storage maps this source was taken from, unchanged
    /// (its pods may have changed): what a pod's state depends on besides the pod itself.
    fn same_but_pods(&self, snapshot: &crate::cluster::Snapshot) -> bool {
        use crate::cluster::unchanged_since;
        let storage = &snapshot.storage;
        unchanged_since(&self.namespaces, &snapshot.namespaces)
            && unchanged_since(&self.volumes, &storage.volumes)
            && unchanged_since(&self.claims, &storage.claims)
            && unchanged_since(&self.classes, &storage.classes)
            && unchanged_since(&self.csi_nodes, &storage.csi_nodes)
    }
}

/// A build's pods, and what the pods bound to each node name add to it: all a later build over the same
/// pods, storage and namespaces takes over whole, whatever its nodes and claims; one over the same storage
/// and namespaces and a pod map written since takes over the pods that did not change
/// ([`BuiltPods::update`]).
#[derive(Debug, Default, Clone)]
struct BuiltPods {
    pods: Arc<Vec<StatePod>>,
    /// What each pod was read from, in the pods' order: its key in the snapshot's pod map and the object.
    /// Empty when the build read no snapshot.
    sources: Vec<(String, Arc<Pod>)>,
    on_nodes: Vec<OnNode>,
    /// For each pod, the index into `on_nodes` of the node name it counts on ([`NO_INDEX`] when none).
    on_node: Vec<u32>,
}

/// No index: in [`BuiltPods::on_node`], a pod that counts on no node (not bound, or finished); in
/// [`BuiltPods::update`], a pod read afresh or an old pod no longer listed.
const NO_INDEX: u32 = u32::MAX;

/// The pods that count on one node name (bound to it, not finished), in the pods' order, and what they add.
#[derive(Debug, Clone)]
struct OnNode {
    node: String,
    pods: Vec<usize>,
    requested: Resources,
    host_ports: Vec<HostPort>,
    /// Those of `pods` with volumes to attach.
    with_volumes: Vec<usize>,
    /// `pods` summarised for topology.
    bound: Arc<BoundOnNode>,
}

/// The pods of the last build that a build over the pod map written since takes over, taken in ascending
/// order: moved out when the last build's state is gone (nothing else holds them), so that taking a pod
/// over does not touch its scheduling view (tens of thousands of them, each on its own cache line); copied
/// otherwise.
enum Kept {
    Owned(std::iter::Enumerate<std::vec::IntoIter<StatePod>>),
    Shared(Arc<Vec<StatePod>>),
}

impl Kept {
    fn new(pods: Arc<Vec<StatePod>>) -> Self {
        match Arc::try_unwrap(pods) {
            Ok(pods) => Self::Owned(pods.into_iter().enumerate()),
            Err(shared) => Self::Shared(shared),
        }
    }

    /// The old pod at `at`, above any taken before; `None` past the end.
    fn take(&mut self, at: usize) -> Option<StatePod> {
        match self {
            Self::Owned(pods) => pods.find(|(i, _)| *i == at).map(|(_, p)| p),
            Self::Shared(pods) => pods.get(at).cloned(),
        }
    }
}

impl BuiltPods {
    /// The pods of `snapshot`, whose namespaces and storage are those these pods were read with: a pod that
    /// is the very object it was (at its key) keeps its state, and the nodes none of whose pods changed keep
    /// what their pods add; the other pods are read (`read`) and their nodes counted again. Gives what a
    /// build reading every pod gives.
    fn update(
        self,
        snapshot: &crate::cluster::Snapshot,
        mut read: impl FnMut(&Arc<Pod>) -> Result<StatePod, StateError>,
    ) -> Result<BuiltPods, StateError> {
        let BuiltPods { pods: old_pods, sources: old_sources, on_nodes: old_on_nodes, on_node: old_on_node } = self;
        let map = &*snapshot.pods;
        // For each pod listed now, the old pod it is, or NO_INDEX when it is read afresh; the old pods'
        // nodes that lose a pod are counted again. Both lists are in key order: one walk pairs them, comparing
        // keys only where the objects differ (an object is listed under one key).
        let mut origin: Vec<u32> = Vec::with_capacity(map.len());
        let mut recount = vec![false; old_on_nodes.len()];
        let gone = |at: usize, recount: &mut Vec<bool>| {
            if let Some(slot) = old_on_node.get(at).filter(|s| **s != NO_INDEX) {
                recount[*slot as usize] = true;
            }
        };
        let mut at = 0;
        for (key, pod) in map {
            let found = loop {
                let Some((old_key, old_pod)) = old_sources.get(at) else { break None };
                if Arc::ptr_eq(old_pod, pod) {
                    break Some(at);
                }
                match old_key.as_str().cmp(key.as_str()) {
                    // Listed before this key and no longer: gone.
                    std::cmp::Ordering::Less => {
                        gone(at, &mut recount);
                        at += 1;
                    }
                    // The pod changed: the old one is gone, the new one is read.
                    std::cmp::Ordering::Equal => {
                        gone(at, &mut recount);
                        at += 1;
                        break None;
                    }
                    // A new key.
                    std::cmp::Ordering::Greater => break None,
                }
            };
            match found {
                Some(i) => {
                    origin.push(i as u32);
                    at += 1;
                }
                None => origin.push(NO_INDEX),
            }
        }
        for i in at..old_sources.len() {
            gone(i, &mut recount);
        }
        // The pods, in the map's order: the unchanged ones taken over, the others read.
        let mut pods: Vec<StatePod> = Vec::with_capacity(map.len());
        let mut sources: Vec<(String, Arc<Pod>)> = Vec::with_capacity(map.len());
        let mut moved = vec![NO_INDEX; old_pods.len()];
        let mut kept = Kept::new(old_pods);
        let mut read_afresh: Vec<usize> = Vec::new();
        let mut old_sources = old_sources.into_iter().enumerate();
        for ((key, pod), &o) in map.iter().zip(&origin) {
            let j = pods.len();
            let taken = (o != NO_INDEX).then(|| kept.take(o as usize)).flatten();
            match taken {
                Some(taken) => {
                    let o = o as usize;
                    pods.push(taken);
                    moved[o] = j as u32;
                    match old_sources.find(|(i, _)| *i == o) {
                        Some((_, source)) => sources.push(source),
                        None => sources.push((key.clone(), Arc::clone(pod))),
                    }
                }
                None => {
                    pods.push(read(pod)?);
                    sources.push((key.clone(), Arc::clone(pod)));
                    read_afresh.push(j);
                }
            }
        }
        drop(kept);
        drop(old_sources);
        // The node names the pods read afresh count on are counted again too.
        let old_at: FxHashMap<&str, usize> =
            old_on_nodes.iter().enumerate().map(|(k, on)| (on.node.as_str(), k)).collect();
        let mut names: Vec<&str> = Vec::new();
        for &j in &read_afresh {
            let p = &pods[j];
            if let Some(name) = p.info.node_name.as_deref().filter(|_| !p.terminal) {
                match old_at.get(name) {
                    Some(k) => recount[*k] = true,
                    None => names.push(name),
                }
            }
        }
        // Nodes none of whose pods changed keep their counts, their pods renumbered.
        let mut on_nodes: Vec<OnNode> = Vec::with_capacity(old_on_nodes.len());
        let mut on_node = vec![NO_INDEX; pods.len()];
        let mut again: Vec<(String, Vec<usize>)> = Vec::new();
        drop(old_at);
        for (k, mut on) in old_on_nodes.into_iter().enumerate() {
            if recount[k] {
                let kept = on.pods.iter().map(|i| moved[*i]).filter(|j| *j != NO_INDEX);
                again.push((on.node, kept.map(|j| j as usize).collect()));
                continue;
            }
            let slot = on_nodes.len() as u32;
            for i in on.pods.iter_mut().chain(on.with_volumes.iter_mut()) {
                *i = moved[*i] as usize;
            }
            for &j in &on.pods {
                on_node[j] = slot;
            }
            on_nodes.push(on);
        }
        names.sort_unstable();
        names.dedup();
        again.extend(names.into_iter().map(|n| (n.to_owned(), Vec::new())));
        let again_at: FxHashMap<String, usize> =
            again.iter().enumerate().map(|(k, (name, _))| (name.clone(), k)).collect();
        for &j in &read_afresh {
            let p = &pods[j];
            if let Some(name) = p.info.node_name.as_deref().filter(|_| !p.terminal)
                && let Some(k) = again_at.get(name)
            {
                again[*k].1.push(j);
            }
        }
        // The others are counted again, their pods in order.
        for (name, mut list) in again {
            if list.is_empty() {
                // No pod counts on it any more: as in a build that reads every pod, it has no entry.
                continue;
            }
            list.sort_unstable();
            let slot = on_nodes.len() as u32;
            let mut on = OnNode::new(name);
            for j in list {
                on.count(j, &pods[j].info);
                on_node[j] = slot;
            }
            on_nodes.push(on);
        }
        Ok(BuiltPods { pods: Arc::new(pods), sources, on_nodes, on_node })
    }

    /// Counts the pods on the nodes of `state` (a state of nodes and no pod yet) they are bound to, and
    /// gives it the pods.
    fn count_on(&self, state: &mut ClusterState, by_name: &FxHashMap<String, usize>) {
        for on in &self.on_nodes {
            let Some(n) = by_name.get(on.node.as_str()) else { continue };
            let node = &mut state.nodes[*n];
            node.requested.add_assign(&on.requested);
            node.host_ports.extend(on.host_ports.iter().cloned());
            for i in &on.with_volumes {
                crate::scheduling::VolumeRoom::attach(&mut node.volume_limits, &self.pods[*i].info.volumes);
            }
            node.pods.extend_from_slice(&on.pods);
            node.bound = Arc::clone(&on.bound);
        }
        state.pods = Arc::clone(&self.pods);
    }
}

/// Reads a build's pods in order into a [`BuiltPods`].
#[derive(Debug, Default)]
struct PodsBuilder {
    pods: Vec<StatePod>,
    sources: Vec<(String, Arc<Pod>)>,
    on_nodes: Vec<OnNode>,
    on_node: Vec<u32>,
    /// Index into `on_nodes` by node name.
    node_at: FxHashMap<String, usize>,
}

impl PodsBuilder {
    /// Adds a pod: its scheduling view `info` (pinned where its volumes are, its namespace selectors
    /// resolved), counted on the node it is bound to. `pod` is needed only when the pod has volumes and has
    /// not finished.
    fn add(
        &mut self,
        info: Arc<PodInfo>,
        facts: &PodFacts,
        pod: Option<&Pod>,
        storage: &crate::cluster::Storage,
        namespaces: &crate::cluster::NamespaceLabels,
    ) {
        let pod = state_pod(info, facts, pod, storage, namespaces);
        let i = self.pods.len();
        let slot = match pod.info.node_name.as_deref().filter(|_| !pod.terminal) {
            Some(name) => {
                let at = match self.node_at.get(name) {
                    Some(at) => *at,
                    None => {
                        self.node_at.insert(name.to_owned(), self.on_nodes.len());
                        self.on_nodes.push(OnNode::new(name.to_owned()));
                        self.on_nodes.len() - 1
                    }
                };
                self.on_nodes[at].count(i, &pod.info);
                at as u32
            }
            None => NO_INDEX,
        };
        self.on_node.push(slot);
        self.pods.push(pod);
    }

    fn finish(self) -> BuiltPods {
        let Self { pods, sources, on_nodes, on_node, .. } = self;
        BuiltPods { pods: Arc::new(pods), sources, on_nodes, on_node }
    }
}

impl OnNode {
    fn new(node: String) -> Self {
        Self {
            node,
            pods: Vec::new(),
            requested: Resources::ZERO,
            host_ports: Vec::new(),
            with_volumes: Vec::new(),
            bound: Arc::default(),
        }
    }

    /// Counts the pod at index `i` of the build, with scheduling view `info`, on this node.
    fn count(&mut self, i: usize, info: &Arc<PodInfo>) {
        Arc::make_mut(&mut self.bound).add(info);
        self.requested.add_assign(&info.requests);
        self.host_ports.extend(info.host_ports.iter().cloned());
        if !info.volumes.is_empty() {
            self.with_volumes.push(i);
        }
        self.pods.push(i);
    }
}

/// A pod's state from its scheduling view `info` and `facts`: the view pinned where its volumes are and
/// its namespace selectors resolved. `pod` is needed only when the pod has volumes and has not finished.
fn state_pod(
    info: Arc<PodInfo>,
    facts: &PodFacts,
    pod: Option<&Pod>,
    storage: &crate::cluster::Storage,
    namespaces: &crate::cluster::NamespaceLabels,
) -> StatePod {
    let terminal = facts.terminal;
    // Affinity terms selecting namespaces by label count the namespaces that match now; resolved
    // each build, as namespaces change without the pod changing.
    let info = if info.needs_namespaces() { Arc::new(info.with_namespaces(namespaces)) } else { info };
    // Where its volumes are, or may be provisioned: for a pod still to be placed and for one
    // consolidation may move. Injected afresh each build, as claims bind without the pod changing.
    let mut volumes_ready = true;
    let info = match pod.filter(|_| facts.has_volumes && !terminal) {
        Some(pod) => match crate::scheduling::volume_placement(pod, storage) {
            Ok(p) if p.requirements.is_empty() && p.attachments.is_empty() => info,
            Ok(p) => {
                let mut pinned = PodInfo::clone(&info);
                pinned.node_selector.add_all(&p.requirements);
                pinned.volumes = p.attachments;
                Arc::new(pinned)
            }
            Err(e) => {
                tracing::debug!(error = %e, "not provisioned for until its volumes exist");
                volumes_ready = false;
                info
            }
        },
        None => info,
    };
    let provisionable =
        volumes_ready && !terminal && !facts.static_pod && !info.daemon && facts.provisionable && !facts.terminating;
    StatePod {
        info,
        terminal,
        static_pod: facts.static_pod,
        terminating: facts.terminating,
        stateful: facts.stateful,
        start_time: facts.start_time,
        not_ready: facts.not_ready,
        pdb_healthy: facts.pdb_healthy,
        provisionable,
    }
}

/// What was read from one Node (or from a NodeClaim whose node has not registered: its labels with its
/// requirements' single values, and what it launched or was sized for).
#[derive(Debug, Clone)]
struct ReadFacts {
    labels: Arc<BTreeMap<String, String>>,
    label_requirements: Arc<OnceLock<Arc<Requirements>>>,
    allocatable: Resources,
    /// The Node's `status.capacity`, when it reports one that parses.
    capacity: Option<Resources>,
    /// The NodePool it belongs to (its `karpenter.sh/nodepool` label).
    pool: Option<String>,
    /// Whether the Node carries `karpenter.sh/initialized: "true"`.
    initialized_label: bool,
    /// Whether the Node is Ready.
    ready: bool,
    /// Whether the Node is cordoned.
    unschedulable: bool,
}

impl ReadFacts {
    /// The facts of a Node.
    fn of_node(node: &Node, allocatable: Resources, capacity: Option<Resources>) -> Self {
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        Self {
            label_requirements: Arc::default(),
            pool: node_labels.get(labels::NODE_POOL).cloned(),
            initialized_label: node_labels.get(labels::INITIALIZED).map(String::as_str) == Some("true"),
            ready: node_ready(node),
            unschedulable: node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
            labels: Arc::new(node_labels),
            allocatable,
            capacity,
        }
    }

    /// The facts of a NodeClaim whose node has not registered, with the labels it gives that node.
    fn of_claim(claim: &NodeClaim, node_labels: BTreeMap<String, String>, allocatable: Resources) -> Self {
        Self {
            label_requirements: Arc::default(),
            pool: node_labels.get(labels::NODE_POOL).cloned().or_else(|| claim.node_pool().map(str::to_owned)),
            initialized_label: false,
            ready: false,
            unschedulable: false,
            labels: Arc::new(node_labels),
            allocatable,
            capacity: None,
        }
    }
}

/// How many entries past where it was expected an [`ObjectMemo`] read looks for its object.
const LOOKAHEAD: usize = 8;

/// How many reads in a row an [`ObjectMemo`] takes for new objects, when looking ahead does not find them,
/// before it indexes the last round by address.
const UNINDEXED_MISSES: usize = 4;

/// Values read from shared objects, kept while the object is the same allocation (a changed object is a
/// new `Arc`). Each round of reads ([`ObjectMemo::get`]) ends with [`ObjectMemo::end_round`], which forgets
/// the objects the round did not read; a round that can be cut short (a failed read) begins with
/// [`ObjectMemo::begin_round`]. The memo holds each object it keys on, so an address cannot be reused while
/// its entry lives.
///
/// Rounds list mostly the same objects in the same order (a snapshot's map, walked by key), so each read is
/// first looked for where the last round had it, one step past the previous read: a pointer comparison. A
/// read that is not there looks a few entries further ([`LOOKAHEAD`]: the objects removed since are
/// skipped), and an object found nowhere near is taken for one added or changed and read afresh. Only after
/// [`UNINDEXED_MISSES`] such reads in a row (many objects added or removed together, or listed out of
/// order) does a read look the address up, in an index of the last round built then: building it costs a
/// hash insert per object, more than the few changes of most rounds. Until then an object listed out of
/// place is read again, and gets the same value.
///
/// An entry found is moved from the last round into this one, not copied: a round over objects that did
/// not change touches neither their reference counts nor their memory, only the memo's own.
#[derive(Debug)]
pub(crate) struct ObjectMemo<T, V> {
    /// The reads just made that were found neither where expected nor a few entries further.
    misses: usize,
    /// The last finished round's objects and values, in the order it read them.
    last: Vec<Slot<T, V>>,
    /// Where in `last` the next read is expected.
    cursor: usize,
    /// `last` by address, once a read of this round was not where expected.
    by_address: Option<FxHashMap<usize, usize>>,
    /// This round's reads so far (all [`Slot::Kept`]).
    next: Vec<Slot<T, V>>,
}

/// An entry of an [`ObjectMemo`] round.
#[derive(Debug)]
enum Slot<T, V> {
    /// An object and its value.
    Kept(Arc<T>, V),
    /// Taken over by the round under way, at this index of its reads.
    Moved(usize),
}

impl<T, V> Slot<T, V> {
    /// The object and value, unless the entry was taken over.
    fn kept(&self) -> Option<(&Arc<T>, &V)> {
        match self {
            Slot::Kept(o, v) => Some((o, v)),
            Slot::Moved(_) => None,
        }
    }
}

impl<T, V> Default for ObjectMemo<T, V> {
    fn default() -> Self {
        Self { misses: 0, last: Vec::new(), cursor: 0, by_address: None, next: Vec::new() }
    }
}

impl<T, V: Clone> ObjectMemo<T, V> {
    /// The value of `object`: the one read last round if it is the same allocation, else `read()`.
    pub(crate) fn get(&mut self, object: &Arc<T>, read: impl FnOnce() -> V) -> V {
        match self.try_get(Some(object), || Ok::<V, std::convert::Infallible>(read())) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    /// As [`ObjectMemo::get`], for a read that may fail (a failed read is not kept) and an object that may not
    /// be shared at all (`None`: read, never kept).
    pub(crate) fn try_get<E>(&mut self, object: Option<&Arc<T>>, read: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        let Some(object) = object else { return read() };
        let at = match self.last.get(self.cursor) {
            Some(Slot::Kept(o, _)) if Arc::ptr_eq(o, object) => {
                self.misses = 0;
                Some(self.cursor)
            }
            _ if self.by_address.is_none() && self.misses < UNINDEXED_MISSES => {
                // From the entry just read (an object listed twice in a row) to a few past the expected one.
                let (last, next) = (&self.last, &self.next);
                let holds = |slot: &Slot<T, V>| match slot {
                    Slot::Kept(o, _) => Arc::ptr_eq(o, object),
                    Slot::Moved(j) => next[*j].kept().is_some_and(|(o, _)| Arc::ptr_eq(o, object)),
                };
                let end = last.len().min(self.cursor + LOOKAHEAD);
                let ahead = (self.cursor.saturating_sub(1)..end).find(|&i| holds(&last[i]));
                self.misses = if ahead.is_some() { 0 } else { self.misses + 1 };
                ahead
            }
            _ => {
                let (last, next) = (&self.last, &self.next);
                let index = self.by_address.get_or_insert_with(|| {
                    // An entry taken over is found where it went.
                    let address = |slot: &Slot<T, V>| match slot {
                        Slot::Kept(o, _) => Some(Arc::as_ptr(o) as usize),
                        Slot::Moved(j) => next[*j].kept().map(|(o, _)| Arc::as_ptr(o) as usize),
                    };
                    last.iter().enumerate().filter_map(|(i, slot)| Some((address(slot)?, i))).collect()
                });
                index.get(&(Arc::as_ptr(object) as usize)).copied()
            }
        };
        let (o, value) = match at {
            Some(i) => {
                self.cursor = i + 1;
                match std::mem::replace(&mut self.last[i], Slot::Moved(self.next.len())) {
                    Slot::Kept(o, value) => (o, value),
                    // Listed again in this round: the value it was given a moment ago.
                    Slot::Moved(j) => {
                        self.last[i] = Slot::Moved(j);
                        match self.next[j].kept() {
                            Some((o, value)) => (Arc::clone(o), value.clone()),
                            None => (Arc::clone(object), read()?),
                        }
                    }
                }
            }
            None => (Arc::clone(object), read()?),
        };
        self.next.push(Slot::Kept(o, value.clone()));
        Ok(value)
    }

    /// Begins a round, dropping what a round cut short (by a failed read) had read: the last finished
    /// round's values stay.
    pub(crate) fn begin_round(&mut self) {
        if !self.next.is_empty() {
            // A round cut short gives back the entries it took over, where they were; what it read afresh
            // follows.
            let mut taken: Vec<Option<Slot<T, V>>> = std::mem::take(&mut self.next).into_iter().map(Some).collect();
            for slot in &mut self.last {
                if let Slot::Moved(j) = *slot
                    && let Some(entry) = taken.get_mut(j).and_then(Option::take)
                {
                    *slot = entry;
                }
            }
            self.last.retain(|slot| matches!(slot, Slot::Kept(..)));
            self.last.extend(taken.into_iter().flatten());
            self.by_address = None;
        }
        self.next.reserve(self.last.len());
        self.cursor = 0;
        self.misses = 0;
    }

    /// Ends a round: what it did not read is forgotten.
    pub(crate) fn end_round(&mut self) {
        self.last = std::mem::take(&mut self.next);
        self.cursor = 0;
        self.by_address = None;
        self.misses = 0;
    }

    /// How many objects the memo holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.last.len()
    }
}

/// The objects a state is built from.
struct Objects<'a, P, N, C> {
    pods: P,
    nodes: N,
    claims: C,
    daemon_sets: &'a [DaemonSet],
    pdbs: &'a [PodDisruptionBudget],
    pools: &'a [NodePool],
    storage: &'a crate::cluster::Storage,
    namespaces: &'a crate::cluster::NamespaceLabels,
}

/// Everything the decisions read.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// Nodes and launched claims.
    pub nodes: Vec<StateNode>,
    /// Every pod (shared with the next state built over the same pods).
    pub pods: Arc<Vec<StatePod>>,
    /// What each DaemonSet would run on a new node.
    pub daemons: Vec<DaemonPod>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// NodePools.
    pub pools: Vec<NodePool>,
}

/// An object the mirror cannot understand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A pod whose spec cannot be read.
    #[error(transparent)]
    Pod(#[from] PodError),
    /// Another object, with the field.
    #[error("{object}: {field}: {message}")]
    Object {
        /// `Kind/name`.
        object: String,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The claim a managed Node implies when its NodeClaim is missing (initialized when the Node says so).
pub fn infer_claim(node: &Node, now: Timestamp) -> NodeClaim {
    let name = node.metadata.name.clone().unwrap_or_default();
    let node_labels = node.metadata.labels.clone().unwrap_or_default();
    let requirements: Vec<NodeSelectorRequirement> = [labels::INSTANCE_TYPE, labels::ZONE, labels::CAPACITY_TYPE]
        .iter()
        .filter_map(|k| node_labels.get(*k).map(|v| NodeSelectorRequirement::new(*k, Operator::In, [v.clone()])))
        .collect();
    let mut claim = NodeClaim::new(&name, NodeClaimSpec { requirements, ..Default::default() });
    claim.metadata.labels = Some(node_labels.clone());
    claim.status = Some(NodeClaimStatus {
        node_name: Some(name),
        provider_id: node.spec.as_ref().and_then(|s| s.provider_id.clone()),
        allocatable: node.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default(),
        capacity: node.status.as_ref().and_then(|s| s.capacity.clone()).unwrap_or_default(),
        ..Default::default()
    });
    // The node's creation is the best guess of when it launched, registered and initialized.
    let since = node.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    claim.set_condition(condition_types::LAUNCHED, ConditionStatus::True, "Inferred", "", since);
    claim.set_condition(condition_types::REGISTERED, ConditionStatus::True, "Inferred", "", since);
    if node_labels.get(labels::INITIALIZED).map(String::as_str) == Some("true") {
        claim.set_condition(condition_types::INITIALIZED, ConditionStatus::True, "Inferred", "", since);
    }
    claim
}

/// A DaemonSet's pod as the scheduler sees it.
pub fn daemon_pod(ds: &DaemonSet) -> Result<DaemonPod, PodError> {
    let name = format!(
        "{}/{}",
        ds.metadata.namespace.as_deref().unwrap_or("default"),
        ds.metadata.name.as_deref().unwrap_or_default()
    );
    let template = ds.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let pod = Pod { metadata: template.metadata.unwrap_or_default(), spec: template.spec, status: None };
    let info = PodInfo::from_pod(&pod).map_err(|e| PodError { pod: format!("DaemonSet {name}"), ..e })?;
    Ok(DaemonPod {
        name,
        requests: info.requests.clone(),
        alternatives: info.requirement_alternatives(),
        tolerations: info.tolerations.clone(),
    })
}

impl ClusterState {
    /// Builds the mirror from Kubernetes objects. Nodes without a claim but with a `karpenter.sh/nodepool`
    /// label get an inferred claim; claims without a node (launched, not registered) are nodes of their
    /// own, with the claim's allocatable.
    pub fn from_objects<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        nodes: impl IntoIterator<Item = &'a Node>,
        claims: impl IntoIterator<Item = &'a NodeClaim>,
        daemon_sets: &[DaemonSet],
        pdbs: &[PodDisruptionBudget],
        pools: &[NodePool],
        now: Timestamp,
    ) -> Result<Self, StateError> {
        let (storage, namespaces) = (Default::default(), Default::default());
        Self::from_objects_with_storage(pods, nodes, claims, daemon_sets, pdbs, pools, &storage, &namespaces, now)
    }

    /// As [`ClusterState::from_objects`], with the storage objects the pods' volumes name: each pod
    /// is pinned to where its volumes are or may be provisioned
    /// ([`volume_placement`](crate::scheduling::volume_placement)), and a pod
    /// whose claim, volume or class does not exist yet is not provisioned for; and with the Namespaces'
    /// labels, which affinity terms' `namespaceSelector` match.
    #[allow(clippy::too_many_arguments)]
    pub fn from_objects_with_storage<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        nodes: impl IntoIterator<Item = &'a Node>,
        claims: impl IntoIterator<Item = &'a NodeClaim>,
        daemon_sets: &[DaemonSet],
        pdbs: &[PodDisruptionBudget],
        pools: &[NodePool],
        storage: &crate::cluster::Storage,
        namespaces: &crate::cluster::NamespaceLabels,
        now: Timestamp,
    ) -> Result<Self, StateError> {
        let objects = Objects { pods, nodes, claims, daemon_sets, pdbs, pools, storage, namespaces };
        Self::build(objects, None, now, &mut StateCache::default())
    }

    /// The state of snapshot files read with [`ReadPods`], consuming them: the nodes and claims move into
    /// the state rather than being copied, and of the pods nothing but what [`ReadPods`] keeps was ever
    /// held. Gives what [`ClusterState::from_objects_with_storage`] gives for the same files read as `Pod`s
    /// (errors included, in the same order).
    pub fn from_read_snapshot(
        snapshot: crate::snapshot::Snapshot<ReadPods>,
        now: Timestamp,
    ) -> Result<Self, StateError> {
        let storage = snapshot.storage();
        let namespaces = snapshot.namespace_labels();
        let crate::snapshot::Snapshot { pods, nodes, node_claims, daemon_sets, pdbs, node_pools, .. } = snapshot;
        let nodes: Vec<Arc<Node>> = nodes.into_iter().map(Arc::new).collect();
        let claims: Vec<Arc<NodeClaim>> = node_claims.into_iter().map(Arc::new).collect();
        let (mut state, by_name) =
            Self::with_nodes(&nodes, &claims, &pdbs, &node_pools, &storage, now, &mut StateCache::default())?;
        drop((nodes, claims));
        let mut built = PodsBuilder::default();
        built.pods.reserve(pods.0.len());
        for read in pods.0 {
            let info = read.info.map_err(|e| *e)?;
            built.add(info, &read.facts, read.pod.as_deref(), &storage, &namespaces);
        }
        built.finish().count_on(&mut state, &by_name);
        state.add_daemons(&daemon_sets)?;
        Ok(state)
    }

    /// The state of a cluster [`Snapshot`](crate::cluster::Snapshot), sharing its objects (see
    /// [`ClusterState::from_shared`]).
    pub fn from_snapshot(
        snapshot: &crate::cluster::Snapshot,
        now: Timestamp,
        cache: &mut StateCache,
    ) -> Result<Self, StateError> {
        let objects = Objects {
            pods: snapshot.pods.values(),
            nodes: snapshot.nodes.values(),
            claims: snapshot.claims.values(),
            daemon_sets: &snapshot.daemon_sets,
            pdbs: &snapshot.pdbs,
            pools: &snapshot.pools,
            storage: &snapshot.storage,
            namespaces: &snapshot.namespaces,
        };
        Self::build(objects, Some(snapshot), now, cache)
    }

    /// As [`ClusterState::from_objects`], from objects shared behind `Arc`s (a watch cache, the
    /// simulator's cluster): the state shares them instead of copying, and reuses from `cache` the
    /// scheduling view of every pod that is the same object as at the last build.
    #[allow(clippy::too_many_arguments)]
    pub fn from_shared<'a>(
        pods: impl IntoIterator<Item = &'a Arc<Pod>>,
        nodes: impl IntoIterator<Item = &'a Arc<Node>>,
        claims: impl IntoIterator<Item = &'a Arc<NodeClaim>>,
        daemon_sets: &[DaemonSet],
        pdbs: &[PodDisruptionBudget],
        pools: &[NodePool],
        now: Timestamp,
        cache: &mut StateCache,
    ) -> Result<Self, StateError> {
        let (storage, namespaces) = (Default::default(), Default::default());
        let objects =
            Objects { pods, nodes, claims, daemon_sets, pdbs, pools, storage: &storage, namespaces: &namespaces };
        Self::build(objects, None, now, cache)
    }

    /// The state of `objects`. With the `source` snapshot they are read from, a build over the same pods
    /// as the last build with `cache` takes over that build's pods instead of reading them again.
    fn build<P, N, C, PI, NI, CI>(
        objects: Objects<'_, PI, NI, CI>,
        source: Option<&crate::cluster::Snapshot>,
        now: Timestamp,
        cache: &mut StateCache,
    ) -> Result<Self, StateError>
    where
        P: ObjectRef<Pod>,
        N: ObjectRef<Node>,
        C: ObjectRef<NodeClaim>,
        PI: IntoIterator<Item = P>,
        NI: IntoIterator<Item = N>,
        CI: IntoIterator<Item = C>,
    {
        let Objects { pods, nodes, claims, daemon_sets, pdbs, pools, storage, namespaces } = objects;
        let (mut state, by_name) = Self::with_nodes(nodes, claims, pdbs, pools, storage, now, cache)?;
        let built = match (source, cache.built.take()) {
            (Some(source), Some((last, built))) if last.is_of(source) => {
                cache.built = Some((last, Arc::clone(&built)));
                built
            }
            (Some(source), Some((last, built))) if last.same_but_pods(source) => {
                // From here on builds take over pods rather than read them through the memo: let go of the
                // pods it holds, which would otherwise stay alive, objects and all, long after they are gone.
                cache.pods = ObjectMemo::default();
                let built = Arc::unwrap_or_clone(built);
                let classes = &mut cache.classes;
                let read = |pod: &Arc<Pod>| {
                    let info = Arc::new(classes.read(pod)?);
                    Ok(state_pod(info, &PodFacts::of(pod), Some(pod), storage, namespaces))
                };
                let built = Arc::new(built.update(source, read)?);
                cache.built = Some((PodsSource::of(source), Arc::clone(&built)));
                built
            }
            (source, _) => {
                let classes = &mut cache.classes;
                let mut read = |pod: &Pod| Ok::<_, StateError>((Arc::new(classes.read(pod)?), PodFacts::of(pod)));
                cache.pods.begin_round();
                let pods = pods.into_iter();
                let mut builder = PodsBuilder::default();
                builder.pods.reserve(pods.size_hint().0);
                // A snapshot's pods are its map's values, in order: their keys and objects are kept for a
                // later build over the map written since.
                let mut keys = source.map(|s| s.pods.keys());
                for pod_ref in pods {
                    let pod = pod_ref.object();
                    let (info, facts) = cache.pods.try_get(pod_ref.as_shared(), || read(pod))?;
                    if let (Some(keys), Some(shared)) = (keys.as_mut(), pod_ref.as_shared())
                        && let Some(key) = keys.next()
                    {
                        builder.sources.push((key.clone(), Arc::clone(shared)));
                    }
                    builder.add(info, &facts, Some(pod), storage, namespaces);
                }
                cache.pods.end_round();
                let built = Arc::new(builder.finish());
                cache.built = source.map(|s| (PodsSource::of(s), Arc::clone(&built)));
                built
            }
        };
        // The classes of pods no build holds any more go.
        cache.classes.sweep();
        built.count_on(&mut state, &by_name);
        state.add_daemons(daemon_sets)?;
        Ok(state)
    }

    /// A state of the nodes and claims (with the PDBs and NodePools) and no pod yet; with the index of
    /// each node by name. What it reads of shared nodes and claims comes from `cache` when they are
    /// unchanged since the last build.
    fn with_nodes<N, C, NI, CI>(
        nodes: NI,
        claims: CI,
        pdbs: &[PodDisruptionBudget],
        pools: &[NodePool],
        storage: &crate::cluster::Storage,
        now: Timestamp,
        cache: &mut StateCache,
    ) -> Result<(Self, FxHashMap<String, usize>), StateError>
    where
        N: ObjectRef<Node>,
        C: ObjectRef<NodeClaim>,
        NI: IntoIterator<Item = N>,
        CI: IntoIterator<Item = C>,
    {
        let mut state = ClusterState { pdbs: pdbs.to_vec(), pools: pools.to_vec(), ..Default::default() };
        let nodes: Vec<N> = nodes.into_iter().collect();
        let claims: Vec<C> = claims.into_iter().collect();
        // One per NodeClaim or per Node, whichever are more, but for unmanaged nodes and claims booting.
        state.nodes.reserve(nodes.len().max(claims.len()));
        let mut by_name: FxHashMap<String, usize> = FxHashMap::default();
        by_name.reserve(nodes.len().max(claims.len()));
        let node_by_pid: FxHashMap<&str, &str> = nodes
            .iter()
            .map(ObjectRef::object)
            .filter_map(|n| Some((crate::cluster::node_provider_id(n)?, n.metadata.name.as_deref()?)))
            .collect();
        // Node name → index into `claims`.
        let claim_for_node: FxHashMap<&str, usize> = claims
            .iter()
            .map(ObjectRef::object)
            .enumerate()
            .filter_map(|(i, c)| {
                let by_node = c.status.as_ref().and_then(|s| s.node_name.as_deref());
                let by_pid = c.provider_id().and_then(|pid| node_by_pid.get(pid).copied());
                by_node.or(by_pid).map(|n| (n, i))
            })
            .collect();
        cache.nodes.begin_round();
        cache.claims.begin_round();
        for node_ref in &nodes {
            let node = node_ref.object();
            let name = node.metadata.name.clone().unwrap_or_default();
            let read = || {
                let allocatable = match node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
                    Some(list) => Resources::from_resource_list(list).map_err(|e| StateError::Object {
                        object: format!("Node/{name}"),
                        field: "status.allocatable".into(),
                        message: e.to_string(),
                    })?,
                    None => Resources::ZERO,
                };
                // What counts against the pool's limits; a capacity that does not parse counts as the
                // allocatable.
                let capacity = node
                    .status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| Resources::from_resource_list(c).ok());
                Ok::<_, StateError>(ReadFacts::of_node(node, allocatable, capacity))
            };
            let ReadFacts {
                labels: node_labels,
                label_requirements,
                allocatable,
                capacity,
                pool,
                initialized_label,
                ready,
                unschedulable,
            } = cache.nodes.try_get(node_ref.as_shared(), read)?;
            let claim_of_node = claim_for_node.get(name.as_str()).map(|i| claims[*i].object());
            // Until a node is initialized its extended resources (GPUs) may still read zero: plan with
            // what its claim launched.
            let allocatable = match claim_of_node {
                Some(c) if !c.is_initialized() => c
                    .status
                    .as_ref()
                    .map(|s| Resources::from_resource_list(&s.allocatable))
                    .transpose()
                    .ok()
                    .flatten()
                    .filter(|r| !r.is_zero())
                    .map_or_else(|| allocatable.clone(), |r| r.max(&allocatable)),
                _ => allocatable,
            };
            let (claim, inferred) = match (claim_for_node.get(name.as_str()), &pool) {
                (Some(i), _) => (Some(claims[*i].to_shared()), false),
                (None, Some(_)) => (Some(Arc::new(infer_claim(node, now))), true),
                (None, None) => (None, false),
            };
            let node_taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            // Until a node is initialized, plan with the taints its claim will leave on it, not the ones it
            // boots with (unregistered, not-ready, startup taints).
            let taints = match &claim {
                Some(c) if !initialized_label && !c.is_initialized() => {
                    let mut t = c.spec.taints.clone();
                    t.extend(node_taints.iter().filter(|x| x.key == labels::DISRUPTED_TAINT).cloned());
                    t
                }
                _ => node_taints,
            };
            let deleting = node.metadata.deletion_timestamp.is_some()
                || claim.as_ref().is_some_and(|c| c.metadata.deletion_timestamp.is_some())
                || taints.iter().any(|t| t.key == labels::DISRUPTED_TAINT);
            let initialized = claim.as_ref().is_some_and(|c| c.is_initialized()) || initialized_label;
            by_name.insert(name.clone(), state.nodes.len());
            let volume_limits = csi_limits(storage, &name);
            state.nodes.push(StateNode {
                name,
                ready,
                unschedulable,
                node: Some(node_ref.to_shared()),
                claim,
                inferred_claim: inferred,
                labels: node_labels,
                label_requirements,
                capacity,
                taints,
                allocatable,
                requested: Resources::ZERO,
                host_ports: Vec::new(),
                pool,
                deleting,
                initialized,
                nominated: false,
                volume_limits,
                pods: Vec::new(),
                bound: Arc::default(),
            });
        }
        // Claims whose node has not registered yet are capacity in flight: launched ones with their
        // instance's allocatable, not-yet-launched ones with what they were sized for.
        let registered: FxHashSet<&str> = claim_for_node.values().map(|i| claims[*i].object().name()).collect();
        for c_ref in &claims {
            let c = c_ref.object();
            if registered.contains(c.name()) {
                continue;
            }
            let read = || {
                let no_status = NodeClaimStatus::default();
                let (field, list) = if c.provider_id().is_some() {
                    ("status.allocatable", &c.status.as_ref().unwrap_or(&no_status).allocatable)
                } else {
                    ("spec.resources.requests", &c.spec.resources.requests)
                };
                let allocatable = Resources::from_resource_list(list).map_err(|e| StateError::Object {
                    object: format!("NodeClaim/{}", c.name()),
                    field: field.into(),
                    message: e.to_string(),
                })?;
                let mut node_labels: BTreeMap<String, String> = c.metadata.labels.clone().unwrap_or_default();
                let reqs = Requirements::from_api(&c.spec.requirements);
                for (k, v) in reqs.single_values() {
                    node_labels.entry(k.to_owned()).or_insert_with(|| v.to_owned());
                }
                Ok::<_, StateError>(ReadFacts::of_claim(c, node_labels, allocatable))
            };
            let ReadFacts { labels: node_labels, label_requirements, allocatable, capacity, pool, .. } =
                cache.claims.try_get(c_ref.as_shared(), read)?;
            let taints = c.spec.taints.clone();
            by_name.insert(c.name().to_owned(), state.nodes.len());
            state.nodes.push(StateNode {
                name: c.name().to_owned(),
                node: None,
                claim: Some(c_ref.to_shared()),
                inferred_claim: false,
                pool,
                labels: node_labels,
                label_requirements,
                capacity,
                taints,
                allocatable,
                requested: Resources::ZERO,
                host_ports: Vec::new(),
                deleting: c.metadata.deletion_timestamp.is_some(),
                ready: false,
                initialized: false,
                unschedulable: false,
                nominated: false,
                volume_limits: Vec::new(),
                pods: Vec::new(),
                bound: Arc::default(),
            });
        }
        cache.nodes.end_round();
        cache.claims.end_round();
        Ok((state, by_name))
    }

    fn add_daemons(&mut self, daemon_sets: &[DaemonSet]) -> Result<(), StateError> {
        for ds in daemon_sets {
            self.daemons.push(daemon_pod(ds)?);
        }
        Ok(())
    }

    /// A NodePool by name.
    pub fn pool(&self, name: &str) -> Option<&NodePool> {
        self.pools.iter().find(|p| p.name() == name)
    }

    /// Pods waiting for a node: unbound, not finished, not owned by a DaemonSet.
    pub fn pending_pods(&self) -> impl Iterator<Item = &StatePod> {
        self.pods.iter().filter(|p| p.info.node_name.is_none() && !p.terminal && !p.info.daemon)
    }

    /// Pods that must move because their node is being deleted: those [`StatePod::reschedulable`] says
    /// need a new place.
    pub fn evicted_pods(&self) -> impl Iterator<Item = &StatePod> {
        self.nodes
            .iter()
            .filter(|n| n.deleting)
            .flat_map(|n| n.pods.iter().map(|i| &self.pods[*i]))
            .filter(|p| p.reschedulable())
    }

    /// Pods that need a place: the pending pods provisioning may buy for ([`provisionable`]), then the
    /// pods of nodes being deleted.
    pub fn pods_to_place(&self) -> impl Iterator<Item = &StatePod> {
        self.pods.iter().filter(|p| p.provisionable).chain(self.evicted_pods())
    }

    /// The pods bound to nodes not being deleted, that have not finished, by node and summarised for
    /// topology: what a scheduler over this state counts ([`Scheduler::with_bound_on_nodes`]).
    ///
    /// [`Scheduler::with_bound_on_nodes`]: crate::scheduling::Scheduler::with_bound_on_nodes
    pub fn bound_on_nodes(&self) -> Vec<(&str, &BoundOnNode)> {
        self.nodes.iter().filter(|n| !n.deleting && !n.bound.is_empty()).map(|n| (n.name.as_str(), &*n.bound)).collect()
    }

    /// The nodes of `pool`.
    pub fn pool_nodes<'a>(&'a self, pool: &'a str) -> impl Iterator<Item = &'a StateNode> + 'a {
        self.nodes.iter().filter(move |n| n.pool.as_deref() == Some(pool))
    }
}

/// The attach limit each CSI driver publishes on node `name` (its CSINode's `allocatable.count`), with
/// nothing used yet.
fn csi_limits(storage: &crate::cluster::Storage, name: &str) -> Vec<crate::scheduling::VolumeRoom> {
    let Some(csi) = storage.csi_nodes.get(name) else { return Vec::new() };
    csi.spec
        .drivers
        .iter()
        .filter_map(|d| {
            let limit = i64::from(d.allocatable.as_ref()?.count?);
            Some(crate::scheduling::VolumeRoom { driver: d.name.clone(), limit, attached: Default::default() })
        })
        .collect()
}

/// Requirements of a node's labels, for compatibility checks.
pub fn node_requirements(node: &StateNode) -> Requirements {
    node.labels.iter().map(|(k, v)| Requirement::is_in(k, [v.clone()])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, cpu: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
            }))
            .unwrap(),
        )
    }

    fn build(pods: &[Arc<Pod>], cache: &mut StateCache) -> ClusterState {
        let now = Timestamp::UNIX_EPOCH;
        ClusterState::from_shared(pods, &[], &[], &[], &[], &[], now, cache).unwrap()
    }

    #[test]
    fn shared_pods_keep_their_view_until_they_change() {
        let mut cache = StateCache::default();
        let mut pods = vec![pod("a", "1"), pod("b", "2")];
        let first = build(&pods, &mut cache);
        let again = build(&pods, &mut cache);
        for (x, y) in first.pods.iter().zip(again.pods.iter()) {
            assert!(Arc::ptr_eq(&x.info, &y.info), "an unchanged pod is not read again");
        }
        // A write copies the pod (another owner holds it): its view is read afresh, the other's is kept.
        let spec = Arc::make_mut(&mut pods[1]).spec.as_mut().unwrap();
        spec.containers[0]
            .resources
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert("cpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("3".into()));
        let changed = build(&pods, &mut cache);
        assert!(Arc::ptr_eq(&first.pods[0].info, &changed.pods[0].info));
        assert!(!Arc::ptr_eq(&first.pods[1].info, &changed.pods[1].info));
        assert_eq!(changed.pods[1].info.requests.get(crate::resources::ResourceName::CPU), 3000);
        // A pod no longer listed leaves the cache.
        pods.truncate(1);
        build(&pods, &mut cache);
        assert_eq!(cache.pods.len(), 1);
    }

    #[test]
    fn shared_nodes_and_claims_are_read_again_only_when_they_change() {
        let node = |name: &str, cpu: &str, zone: &str| -> Arc<Node> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "labels": {labels::ZONE: zone}},
                    "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}
                }))
                .unwrap(),
            )
        };
        let claim: Arc<NodeClaim> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "c-1", "labels": {labels::NODE_POOL: "default"}},
                "spec": {"nodeClassRef": {"group": "", "kind": "", "name": ""},
                    "requirements": [{"key": labels::ZONE, "operator": "In", "values": ["z1"]}],
                    "resources": {"requests": {"cpu": "2"}}}
            }))
            .unwrap(),
        );
        let mut nodes = vec![node("a", "4", "z1"), node("b", "8", "z2")];
        let claims = vec![Arc::clone(&claim)];
        let mut cache = StateCache::default();
        let build = |nodes: &[Arc<Node>], cache: &mut StateCache| {
            ClusterState::from_shared(&[], nodes, &claims, &[], &[], &[], Timestamp::UNIX_EPOCH, cache).unwrap()
        };
        let first = build(&nodes, &mut cache);
        assert!(first.nodes.iter().all(|n| n.label_requirements.get().is_none()), "read on first use only");
        let again = build(&nodes, &mut cache);
        for (x, y) in first.nodes.iter().zip(&again.nodes) {
            assert!(Arc::ptr_eq(&x.labels, &y.labels), "{}: an unchanged object is not read again", x.name);
            assert!(Arc::ptr_eq(&x.label_requirements(), &y.label_requirements()));
            assert_eq!(*y.label_requirements(), Requirements::from_labels(&*y.labels));
            assert_eq!(x.allocatable, y.allocatable);
        }
        assert_eq!(again.nodes[2].label(labels::ZONE), Some("z1"), "the claim's requirement names its zone");
        assert_eq!(again.nodes[2].allocatable.get(crate::resources::ResourceName::CPU), 2000);
        // A changed node is a new allocation: read afresh, the others kept.
        nodes[1] = node("b", "16", "z3");
        let changed = build(&nodes, &mut cache);
        assert!(Arc::ptr_eq(&first.nodes[0].labels, &changed.nodes[0].labels));
        assert_eq!(changed.nodes[1].label(labels::ZONE), Some("z3"));
        assert_eq!(changed.nodes[1].allocatable.get(crate::resources::ResourceName::CPU), 16_000);
        // A node no longer listed leaves the cache; one that cannot be read is an error, never a stale read.
        nodes.truncate(1);
        build(&nodes, &mut cache);
        assert_eq!((cache.nodes.len(), cache.claims.len()), (1, 1));
        nodes.push(node("bad", "lots", "z1"));
        let err = ClusterState::from_shared(&[], &nodes, &claims, &[], &[], &[], Timestamp::UNIX_EPOCH, &mut cache);
        assert!(err.is_err_and(|e| e.to_string().contains("Node/bad")));
        // The round the failure cut short is dropped: the next keeps what the last finished round read.
        nodes.pop();
        let after = build(&nodes, &mut cache);
        assert!(Arc::ptr_eq(&first.nodes[0].labels, &after.nodes[0].labels));
        assert_eq!((cache.nodes.len(), cache.claims.len()), (1, 1));
    }

    #[test]
    fn a_build_over_the_same_pods_takes_them_over_and_counts_them_on_its_own_nodes() {
        use crate::resources::ResourceName;
        let node = |name: &str| -> Arc<Node> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name},
                    "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110"}}
                }))
                .unwrap(),
            )
        };
        let bound = |name: &str, node: Option<&str>, cpu: &str, port: i32| -> (String, Arc<Pod>) {
            let pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"containerPort": port, "hostPort": port}],
                    "resources": {"requests": {"cpu": cpu}}}]}
            }))
            .unwrap();
            (format!("default/{name}"), Arc::new(pod))
        };
        let now = Timestamp::UNIX_EPOCH;
        let mut snapshot = crate::cluster::Snapshot {
            pods: Arc::new(BTreeMap::from([
                bound("a", Some("n1"), "1", 80),
                bound("b", Some("n2"), "2", 81),
                bound("c", Some("n1"), "3", 82),
                bound("d", None, "4", 83),
            ])),
            nodes: Arc::new(BTreeMap::from([("n1".to_owned(), node("n1"))])),
            ..Default::default()
        };
        let counted = |state: &ClusterState| -> Vec<(String, i64, Vec<usize>, Vec<i32>)> {
            let ports = |n: &StateNode| n.host_ports.iter().map(|p| p.port).collect();
            state
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.requested.get(ResourceName::CPU), n.pods.clone(), ports(n)))
                .collect()
        };
        let mut cache = StateCache::default();
        let first = ClusterState::from_snapshot(&snapshot, now, &mut cache).unwrap();
        assert_eq!(counted(&first), [("n1".into(), 4000, vec![0, 2], vec![80, 82])]);
        // A node registers; the pods are the same map: taken over, and counted on the nodes of this build.
        snapshot.nodes = Arc::new(BTreeMap::from([("n1".to_owned(), node("n1")), ("n2".to_owned(), node("n2"))]));
        let second = ClusterState::from_snapshot(&snapshot, now, &mut cache).unwrap();
        assert!(Arc::ptr_eq(&first.pods, &second.pods));
        let fresh = ClusterState::from_snapshot(&snapshot, now, &mut StateCache::default()).unwrap();
        assert_eq!(counted(&second), counted(&fresh));
        assert_eq!(counted(&second)[1], ("n2".into(), 2000, vec![1], vec![81]));
        // The map written where it is (nothing else holds it): read again, never taken for the same pods.
        drop((first, second, fresh));
        Arc::make_mut(&mut snapshot.pods).extend([bound("c", Some("n2"), "5", 84)]);
        let third = ClusterState::from_snapshot(&snapshot, now, &mut cache).unwrap();
        assert_eq!(
            counted(&third),
            [("n1".into(), 1000, vec![0], vec![80]), ("n2".into(), 7000, vec![1, 2], vec![81, 84])]
        );
        let waiting: Vec<&str> = third.pods_to_place().map(|p| p.info.key.as_str()).collect();
        assert_eq!(waiting, ["default/d"]);
    }

    /// A change to a snapshot's pods, for [`a_build_over_changed_pods_gives_what_reading_every_pod_gives`].
    #[derive(Debug, Clone)]
    enum PodChange {
        /// A pod (named by a number) bound to node `n{node}` (`None`: pending), with a CPU request and host port.
        Put { name: u8, node: Option<u8>, cpu: u8, port: u8 },
        /// The `i`th pod listed (modulo their number) goes.
        Remove(usize),
        /// The `i`th pod finishes.
        Finish(usize),
        /// The `i`th pod is written without change: a new object of the same content.
        Touch(usize),
    }

    fn pod_change() -> impl proptest::strategy::Strategy<Value = PodChange> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..40, proptest::option::of(0u8..4), 1u8..4, 0u8..3)
                .prop_map(|(name, node, cpu, port)| PodChange::Put { name, node, cpu, port }),
            (0usize..64).prop_map(PodChange::Remove),
            (0usize..64).prop_map(PodChange::Finish),
            (0usize..64).prop_map(PodChange::Touch),
        ]
    }

    proptest::proptest! {
        /// Builds over a pod map written between them (pods added, removed, rebound, finished, rewritten),
        /// with the same namespaces and storage, take over the unchanged pods and count only the changed
        /// nodes again: each gives what a build reading every pod gives.
        #[test]
        fn a_build_over_changed_pods_gives_what_reading_every_pod_gives(
            batches in proptest::collection::vec(proptest::collection::vec(pod_change(), 1..6), 1..12),
        ) {
            use crate::resources::ResourceName;
            let node = |name: String| -> (String, Arc<Node>) {
                let node = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name},
                    "status": {"allocatable": {"cpu": "64", "memory": "64Gi", "pods": "110"}}
                }))
                .unwrap();
                (name, Arc::new(node))
            };
            let make = |name: u8, node: Option<u8>, cpu: u8, port: u8| -> (String, Arc<Pod>) {
                let name = format!("p{name}");
                let pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"nodeName": node.map(|n| format!("n{n}")), "containers": [{"name": "c",
                        "ports": [{"containerPort": 8000 + i32::from(port), "hostPort": 8000 + i32::from(port)}],
                        "resources": {"requests": {"cpu": cpu.to_string()}}}]}
                }))
                .unwrap();
                (format!("default/{name}"), Arc::new(pod))
            };
            // Node n3 is named by pods but never registers.
            let mut snapshot = crate::cluster::Snapshot {
                pods: Arc::new(BTreeMap::from([make(0, Some(0), 1, 0), make(1, None, 2, 1)])),
                nodes: Arc::new((0..3).map(|n| node(format!("n{n}"))).collect()),
                ..Default::default()
            };
            let now = Timestamp::UNIX_EPOCH;
            // Each node: its name, CPU requested, pods, host ports and topology summary.
            type Counted = (String, i64, Vec<usize>, Vec<i32>, String);
            let counted = |state: &ClusterState| -> Vec<Counted> {
                let ports = |n: &StateNode| n.host_ports.iter().map(|p| p.port).collect();
                let bound = |n: &StateNode| format!("{:?}", n.bound);
                state
                    .nodes
                    .iter()
                    .map(|n| (n.name.clone(), n.requested.get(ResourceName::CPU), n.pods.clone(), ports(n), bound(n)))
                    .collect()
            };
            let pods = |state: &ClusterState| -> Vec<(String, Option<String>, bool, bool)> {
                state
                    .pods
                    .iter()
                    .map(|p| (p.info.key.clone(), p.info.node_name.clone(), p.terminal, p.provisionable))
                    .collect()
            };
            let mut cache = StateCache::default();
            let views = |state: &ClusterState| -> Vec<Arc<PodInfo>> { state.pods.iter().map(|p| Arc::clone(&p.info)).collect() };
            let mut last = Some(ClusterState::from_snapshot(&snapshot, now, &mut cache).unwrap());
            let mut last_views = last.as_ref().map(views).unwrap_or_default();
            let read_in_full = cache.pods.len();
            for (round, batch) in batches.into_iter().enumerate() {
                // Every other build runs with the last state gone, so that its pods are moved rather than
                // copied into the new one.
                if round % 2 == 1 {
                    drop(last.take());
                }
                let before: BTreeMap<String, Arc<Pod>> = (*snapshot.pods).clone();
                let map = Arc::make_mut(&mut snapshot.pods);
                for change in batch {
                    let nth = |map: &BTreeMap<String, Arc<Pod>>, i: usize| {
                        (!map.is_empty()).then(|| map.keys().nth(i % map.len()).cloned()).flatten()
                    };
                    match change {
                        PodChange::Put { name, node, cpu, port } => {
                            let (key, pod) = make(name, node, cpu, port);
                            map.insert(key, pod);
                        }
                        PodChange::Remove(i) => {
                            if let Some(key) = nth(map, i) {
                                map.remove(&key);
                            }
                        }
                        PodChange::Finish(i) => {
                            if let Some(pod) = nth(map, i).and_then(|key| map.get_mut(&key)) {
                                Arc::make_mut(pod).status = serde_json::from_value(serde_json::json!({"phase": "Succeeded"})).unwrap();
                            }
                        }
                        PodChange::Touch(i) => {
                            if let Some(pod) = nth(map, i).and_then(|key| map.get_mut(&key)) {
                                *pod = Arc::new(Pod::clone(pod));
                            }
                        }
                    }
                }
                let built = ClusterState::from_snapshot(&snapshot, now, &mut cache).unwrap();
                let fresh = ClusterState::from_snapshot(&snapshot, now, &mut StateCache::default()).unwrap();
                proptest::prop_assert_eq!(pods(&built), pods(&fresh));
                proptest::prop_assert_eq!(counted(&built), counted(&fresh));
                // Taken over, not read again (each batch writes a new map): the memo of full reads is let go
                // of, and an unchanged pod keeps its view. No pod object written over or removed is kept.
                proptest::prop_assert!(read_in_full > 0);
                proptest::prop_assert_eq!(cache.pods.len(), 0);
                for (key, pod) in &before {
                    if !snapshot.pods.get(key).is_some_and(|now| Arc::ptr_eq(now, pod)) {
                        proptest::prop_assert_eq!(Arc::strong_count(pod), 1, "{} is kept", key);
                    }
                }
                for p in built.pods.iter() {
                    let unchanged = before.get(&p.info.key).is_some_and(|b| Arc::ptr_eq(b, &snapshot.pods[&p.info.key]));
                    if unchanged && let Some(q) = last_views.iter().find(|q| q.key == p.info.key) {
                        proptest::prop_assert!(Arc::ptr_eq(&p.info, q), "{} read again", p.info.key);
                    }
                }
                last_views = views(&built);
                last = Some(built);
            }
            drop(last);
        }
    }

    /// One round of reads through `memo`, counting the reads it could not answer.
    fn memo_round(memo: &mut ObjectMemo<u32, u32>, list: &[&Arc<u32>], reads: &mut usize) -> Vec<u32> {
        memo.begin_round();
        let out = list
            .iter()
            .map(|o| {
                memo.get(o, || {
                    *reads += 1;
                    ***o * 10
                })
            })
            .collect();
        memo.end_round();
        out
    }

    #[test]
    fn the_memo_keeps_values_in_any_order_and_in_order_reads_only_new_objects() {
        let objects: Vec<Arc<u32>> = (0..6).map(Arc::new).collect();
        let [a, b, c, d, e, f] = [0, 1, 2, 3, 4, 5].map(|i| &objects[i]);
        let mut memo = ObjectMemo::default();
        let mut reads = 0;
        assert_eq!(memo_round(&mut memo, &[a, b, c, d], &mut reads), [0, 10, 20, 30]);
        assert_eq!(reads, 4);
        // Same order, one gone, one new, and one listed twice.
        assert_eq!(memo_round(&mut memo, &[a, c, e, d, d], &mut reads), [0, 20, 40, 30, 30]);
        assert_eq!(reads, 5, "only the new object is read");
        // Reversed: the first is found ahead; the others, out of place, are read again until the memo
        // indexes the last round, and keep their values.
        assert_eq!(memo_round(&mut memo, &[d, e, c, a], &mut reads), [30, 40, 20, 0]);
        assert_eq!(reads, 8);
        assert_eq!(memo_round(&mut memo, &[d, e, c, a], &mut reads), [30, 40, 20, 0]);
        assert_eq!(reads, 8, "the same order again reads nothing");
        // A value equal in content but another allocation is another object.
        let a2 = Arc::new(0);
        assert_eq!(memo_round(&mut memo, &[&a2, f], &mut reads), [0, 50]);
        assert_eq!((reads, memo.len()), (10, 2));
        assert_eq!(memo_round(&mut memo, &[a], &mut reads), [0]);
        assert_eq!(reads, 11, "a forgotten object is read again");
        // A round cut short by a failed read gives back what it had taken over: the next round reads
        // nothing it already knew.
        assert_eq!(memo_round(&mut memo, &[a, b, c], &mut reads), [0, 10, 20]);
        assert_eq!(reads, 13);
        memo.begin_round();
        assert_eq!(memo.try_get(Some(b), || Err::<u32, ()>(())), Ok(10));
        assert_eq!(memo.try_get(Some(d), || Err::<u32, ()>(())), Err(()));
        assert_eq!(memo_round(&mut memo, &[a, b, c], &mut reads), [0, 10, 20]);
        assert_eq!((reads, memo.len()), (13, 3));
    }

    /// In a long list walked in the same order, new objects scattered through it are the only reads, and a
    /// long run of removed ones costs at most a few reads before the memo indexes the last round.
    #[test]
    fn the_memo_reads_only_what_changed_in_a_long_list() {
        let objects: Vec<Arc<u32>> = (0..200).map(Arc::new).collect();
        let mut memo = ObjectMemo::default();
        let mut reads = 0;
        let all: Vec<&Arc<u32>> = objects.iter().collect();
        memo_round(&mut memo, &all, &mut reads);
        assert_eq!(reads, 200);
        // Every tenth object replaced by a new one, and a few removed.
        let fresh: Vec<Arc<u32>> = (0..20).map(|i| Arc::new(1000 + i)).collect();
        let mut list: Vec<&Arc<u32>> = Vec::new();
        for (i, o) in objects.iter().enumerate() {
            match i % 10 {
                0 => list.push(&fresh[i / 10]),
                5 if i % 20 == 5 => {}
                _ => list.push(o),
            }
        }
        let values = memo_round(&mut memo, &list, &mut reads);
        assert_eq!(values, list.iter().map(|o| ***o * 10).collect::<Vec<_>>());
        assert_eq!(reads, 220, "only the 20 new objects are read");
        // Objects 20 to 119 removed at once: a few of those after them are read again, then found.
        let mut list2: Vec<&Arc<u32>> = list.iter().copied().filter(|o| !(20..120).contains(&***o)).collect();
        let before = reads;
        let values = memo_round(&mut memo, &list2, &mut reads);
        assert_eq!(values, list2.iter().map(|o| ***o * 10).collect::<Vec<_>>());
        assert!(reads - before <= UNINDEXED_MISSES, "{} reads", reads - before);
        list2.reverse();
        memo_round(&mut memo, &list2, &mut reads);
        let before = reads;
        list2.reverse();
        memo_round(&mut memo, &list2, &mut reads);
        assert!(reads - before <= UNINDEXED_MISSES, "{} reads", reads - before);
    }

    #[test]
    fn only_pods_the_scheduler_failed_to_place_are_provisioned_for() {
        let with = |name: &str, extra: serde_json::Value| {
            let mut v = serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
            });
            crate::testing::merge(&mut v, extra);
            Arc::new(serde_json::from_value::<Pod>(v).unwrap())
        };
        let unschedulable = serde_json::json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}});
        let mut nominated = unschedulable.clone();
        crate::testing::merge(&mut nominated, serde_json::json!({"status": {"nominatedNodeName": "n1"}}));
        let pods = vec![
            pod("no-status", "1"),
            with("unschedulable", unschedulable.clone()),
            with("gated", serde_json::json!({"spec": {"schedulingGates": [{"name": "example.com/quota"}]}})),
            with(
                "gated-by-status",
                serde_json::json!({"status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}),
            ),
            with("preempting", nominated),
            with("not-yet-tried", serde_json::json!({"status": {"phase": "Pending"}})),
            with(
                "mirror",
                serde_json::json!({"metadata": {"ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}]}}),
            ),
            with("daemon", {
                let mut d = unschedulable.clone();
                crate::testing::merge(
                    &mut d,
                    serde_json::json!({"metadata": {"ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": true}]}}),
                );
                d
            }),
        ];
        let state = build(&pods, &mut StateCache::default());
        let placed: Vec<&str> = state.pods_to_place().map(|p| p.info.key.as_str()).collect();
        assert_eq!(placed, ["default/no-status", "default/unschedulable"]);
    }
}
