//! The one port between the controllers and Kubernetes.
//!
//! Controllers never talk to an API server directly. They read a [`Snapshot`] (every object they decide
//! on, at one moment) and write through a [`Cluster`], whose writes are async and can fail the way an API
//! server's do: [`ApiErrorKind`] tells `NotFound` from `Conflict` (a stale `resourceVersion`: re-read and
//! retry), `TooManyRequests` (an eviction a PodDisruptionBudget refuses: retry later), `Forbidden`,
//! `Invalid`, `AlreadyExists` and `Unavailable`.
//!
//! Two implementations exist: `tenon run` implements the port on kube-rs (reflector stores as the
//! snapshot), and [`memory::InMemoryApi`] is an API server in memory, with resourceVersions, finalizers
//! and injectable faults, which `tenon simulate` and the controller tests run against.

pub mod memory;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

use crate::api::{NodeClaim, NodePool};

pub use memory::InMemoryApi;

/// What kind of failure an API call met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ApiErrorKind {
    /// The object does not exist (404). The only answer that means "gone".
    NotFound,
    /// The object changed since it was read (409 with a stale `resourceVersion`): re-read and retry.
    Conflict,
    /// An object of that name exists already (409 on create).
    AlreadyExists,
    /// The caller may not do this (401, 403).
    Forbidden,
    /// Too many requests (429); for an eviction, a PodDisruptionBudget refuses it for now.
    TooManyRequests,
    /// The server rejected the object (400, 422).
    Invalid,
    /// The server failed or did not answer in time (5xx, timeouts, a lost connection). The write may or
    /// may not have been applied.
    Unavailable,
}

impl ApiErrorKind {
    /// The name used in messages and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "NotFound",
            Self::Conflict => "Conflict",
            Self::AlreadyExists => "AlreadyExists",
            Self::Forbidden => "Forbidden",
            Self::TooManyRequests => "TooManyRequests",
            Self::Invalid => "Invalid",
            Self::Unavailable => "Unavailable",
        }
    }
}

/// A failed API call: what failed, on which object, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {} ({message})", kind.as_str())]
pub struct ApiError {
    /// What kind of failure.
    pub kind: ApiErrorKind,
    /// The object, as `Kind/name` (`NodeClaim/gpu-00012`, `Pod/default/web-1`).
    pub object: String,
    /// The server's message.
    pub message: String,
    /// How long the server asked the caller to wait, if it said.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// An error of `kind` on `object`.
    pub fn new(kind: ApiErrorKind, object: impl Into<String>, message: impl Into<String>) -> Self {
        Self { kind, object: object.into(), message: message.into(), retry_after: None }
    }

    /// `NotFound` on `object`.
    pub fn not_found(object: impl Into<String>) -> Self {
        Self::new(ApiErrorKind::NotFound, object, "not found")
    }

    /// Whether the object is gone.
    pub fn is_not_found(&self) -> bool {
        self.kind == ApiErrorKind::NotFound
    }

    /// Whether the write lost a race with another writer.
    pub fn is_conflict(&self) -> bool {
        self.kind == ApiErrorKind::Conflict
    }
}

/// Whether an event reports something normal or something wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Progress worth knowing about.
    Normal,
    /// Something that needs attention.
    Warning,
}

/// A Kubernetes Event about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterEvent {
    /// The object's kind (`NodeClaim`, `Node`, `Pod`, `NodePool`).
    pub kind: &'static str,
    /// The object's namespace, for namespaced kinds.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
    /// Normal or Warning.
    pub type_: EventType,
    /// A CamelCase reason (`DisruptionLaunching`, `Unconsolidatable`, `FailedLaunch`, …).
    pub reason: &'static str,
    /// What happened, for a person.
    pub message: String,
}

impl ClusterEvent {
    /// An event about a NodeClaim.
    pub fn claim(name: &str, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind: "NodeClaim", namespace: None, name: name.to_owned(), type_, reason, message: message.into() }
    }

    /// An event about a Node.
    pub fn node(name: &str, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind: "Node", namespace: None, name: name.to_owned(), type_, reason, message: message.into() }
    }

    /// An event about a Pod, by `namespace/name`.
    pub fn pod(key: &str, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
        Self {
            kind: "Pod",
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            type_,
            reason,
            message: message.into(),
        }
    }
}

/// Every object the controllers decide on, as one consistent read. Cloning is cheap: each collection is
/// shared, and a writer copies a collection only when it changes one a snapshot still holds.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Pods by `namespace/name`.
    pub pods: Arc<BTreeMap<String, Arc<Pod>>>,
    /// Nodes by name.
    pub nodes: Arc<BTreeMap<String, Arc<Node>>>,
    /// NodeClaims by name.
    pub claims: Arc<BTreeMap<String, Arc<NodeClaim>>>,
    /// NodePools.
    pub pools: Arc<Vec<NodePool>>,
    /// DaemonSets.
    pub daemon_sets: Arc<Vec<DaemonSet>>,
    /// PodDisruptionBudgets.
    pub pdbs: Arc<Vec<PodDisruptionBudget>>,
    /// Namespaces: each one's labels, by name (what affinity terms' `namespaceSelector` match).
    pub namespaces: Arc<NamespaceLabels>,
    /// Attached VolumeAttachments by name.
    pub volume_attachments: Arc<BTreeMap<String, AttachedVolume>>,
    /// The storage a pod's volumes need of its node: PersistentVolumes by name (their node affinity),
    /// PersistentVolumeClaims by `namespace/name`, StorageClasses by name (binding mode, allowed
    /// topologies) and CSINodes by name (each driver's attach limit on that node).
    pub storage: Storage,
}

/// Namespaces' labels by namespace name.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// An attached VolumeAttachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedVolume {
    /// The node it is attached to.
    pub node: String,
    /// The PersistentVolume attached (`spec.source.persistentVolumeName`); `None` for an inline volume.
    pub persistent_volume: Option<String>,
}

/// The storage objects of a [`Snapshot`]; each collection is shared like the snapshot's others.
#[derive(Debug, Clone, Default)]
pub struct Storage {
    /// PersistentVolumes by name.
    pub volumes: Arc<BTreeMap<String, Arc<PersistentVolume>>>,
    /// PersistentVolumeClaims by `namespace/name`.
    pub claims: Arc<BTreeMap<String, Arc<PersistentVolumeClaim>>>,
    /// StorageClasses by name.
    pub classes: Arc<BTreeMap<String, Arc<StorageClass>>>,
    /// CSINodes by name (a CSINode is named after its node).
    pub csi_nodes: Arc<BTreeMap<String, Arc<CSINode>>>,
}

impl Snapshot {
    /// One claim.
    pub fn claim(&self, name: &str) -> Option<&Arc<NodeClaim>> {
        self.claims.get(name)
    }

    /// One node.
    pub fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.get(name)
    }

    /// One pod, by `namespace/name`.
    pub fn pod(&self, key: &str) -> Option<&Arc<Pod>> {
        self.pods.get(key)
    }

    /// One NodePool.
    pub fn pool(&self, name: &str) -> Option<&NodePool> {
        self.pools.iter().find(|p| p.name() == name)
    }

    /// The nodes whose `spec.providerID` is `provider_id` (more than one is the caller's to report).
    pub fn nodes_with_provider_id<'a>(&'a self, provider_id: &'a str) -> impl Iterator<Item = &'a Arc<Node>> + 'a {
        self.nodes.values().filter(move |n| node_provider_id(n) == Some(provider_id))
    }

    /// The claim whose instance is `provider_id`.
    pub fn claim_with_provider_id(&self, provider_id: &str) -> Option<&Arc<NodeClaim>> {
        self.claims.values().find(|c| c.provider_id() == Some(provider_id))
    }

    /// The pods bound to `node`.
    pub fn pods_on_node<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Arc<Pod>> + 'a {
        self.pods.values().filter(move |p| pod_node(p) == Some(node))
    }

    /// Names of the VolumeAttachments still bound to a node.
    pub fn volume_attachments(&self, node: &str) -> Vec<String> {
        self.volume_attachments.iter().filter(|(_, a)| a.node == node).map(|(v, _)| v.clone()).collect()
    }

    /// The attachments of `node` its termination waits for, as Karpenter's termination controller filters
    /// them: those of persistent volumes, less the volumes of pods the drain leaves on the node (static pods,
    /// pods tolerating the disruption taint, finished or stuck terminating ones; see
    /// [`crate::termination::drainable`]), which stay attached until the instance goes.
    pub fn pending_volume_attachments(&self, node: &str, now: jiff::Timestamp) -> Vec<String> {
        self.pending_volume_attachments_with(node, self.pods_on_node(node), now)
    }

    /// As [`Snapshot::pending_volume_attachments`], given the pods bound to `node`.
    pub fn pending_volume_attachments_with<'a>(
        &'a self,
        node: &str,
        on_node: impl IntoIterator<Item = &'a Arc<Pod>>,
        now: jiff::Timestamp,
    ) -> Vec<String> {
        if !self.volume_attachments.values().any(|a| a.node == node) {
            return Vec::new();
        }
        let kept: std::collections::BTreeSet<&str> = on_node
            .into_iter()
            .filter(|p| !crate::termination::drainable(p, now))
            .flat_map(|p| {
                let ns = p.metadata.namespace.as_deref().unwrap_or("default");
                let volumes = p.spec.as_ref().and_then(|s| s.volumes.as_ref());
                volumes.into_iter().flatten().filter_map(move |v| {
                    let claim = v.persistent_volume_claim.as_ref()?;
                    let pvc = self.storage.claims.get(&format!("{ns}/{}", claim.claim_name))?;
                    pvc.spec.as_ref()?.volume_name.as_deref()
                })
            })
            .collect();
        self.volume_attachments
            .iter()
            .filter(|(_, a)| a.node == node)
            .filter(|(_, a)| a.persistent_volume.as_deref().is_some_and(|pv| !kept.contains(pv)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether some pod waits for a node: unbound and not finished.
    pub fn any_unbound(&self) -> bool {
        self.pods.values().any(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()) && !pod_finished(p))
    }
}

/// Whether a pod counts as healthy for a PodDisruptionBudget, as the disruption controller counts it
/// (`currentHealthy`): bound, not finished, not terminating, and Ready (a pod that reports no Ready condition
/// counts when it is Running).
pub fn pdb_healthy(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let ready = status.and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let ready = match ready {
        Some(c) => c.status == "True",
        None => status.and_then(|s| s.phase.as_deref()) == Some("Running"),
    };
    pod_node(pod).is_some() && !pod_finished(pod) && pod.metadata.deletion_timestamp.is_none() && ready
}

/// How many of a PodDisruptionBudget's pods may be evicted now: its status's `disruptionsAllowed` once the
/// disruption controller has observed it, else computed from `expected` (the pods it selects that have not
/// finished) and `healthy` (those [`pdb_healthy`]) as that controller would; no limit without
/// `minAvailable` or `maxUnavailable`.
pub fn pdb_disruptions_allowed(pdb: &PodDisruptionBudget, expected: i32, healthy: i32) -> i32 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    if let Some(status) = pdb.status.as_ref().filter(|s| s.observed_generation.is_some()) {
        return status.disruptions_allowed;
    }
    let resolve = |value: &IntOrString| match value {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => (expected * s.trim_end_matches('%').parse::<i32>().unwrap_or(0) + 99) / 100,
    };
    let spec = pdb.spec.as_ref();
    if let Some(max) = spec.and_then(|s| s.max_unavailable.as_ref()) {
        resolve(max) - (expected - healthy)
    } else if let Some(min) = spec.and_then(|s| s.min_available.as_ref()) {
        healthy - resolve(min)
    } else {
        i32::MAX
    }
}

/// The writes controllers make, and the snapshot they read. Every write names its object; metadata and
/// status patches carry the `resourceVersion` of the object passed in as a precondition (none: no
/// precondition), and return the object as written.
#[async_trait]
pub trait Cluster: Send + Sync {
    /// The objects as last observed. Against an API server this lags the writes (watches deliver them
    /// later); callers tolerate a snapshot that does not show their own last write yet.
    fn snapshot(&self) -> Snapshot;

    /// Creates a NodeClaim. The server assigns its UID, creation time and resourceVersion.
    async fn create_claim(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError>;

    /// Writes a claim's metadata: labels, annotations, finalizers and owner references. Removing the last
    /// finalizer of a claim being deleted removes the claim.
    async fn patch_claim(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError>;

    /// Writes a claim's status through the status subresource.
    async fn patch_claim_status(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError>;

    /// Deletes a claim: with finalizers it is marked (deletion timestamp) until they are removed.
    async fn delete_claim(&self, name: &str) -> Result<(), ApiError>;

    /// Writes a node's metadata (labels, annotations, finalizers, owner references) and taints.
    async fn patch_node(&self, node: &Node) -> Result<Arc<Node>, ApiError>;

    /// Deletes a node: with finalizers it is marked until they are removed.
    async fn delete_node(&self, name: &str) -> Result<(), ApiError>;

    /// Writes a NodePool's status (conditions, resources, node count) through the status subresource.
    async fn patch_pool_status(&self, pool: &NodePool) -> Result<(), ApiError>;

    /// Writes a NodePool's annotations (its template hash and the hash's scheme), leaving the rest of its
    /// metadata alone.
    async fn patch_pool_annotations(&self, pool: &NodePool) -> Result<(), ApiError>;

    /// Evicts a pod (`namespace/name`) through the Eviction API. `TooManyRequests` means a
    /// PodDisruptionBudget refuses it for now.
    async fn evict_pod(&self, key: &str) -> Result<(), ApiError>;

    /// Deletes a pod without eviction (forced, after the termination grace period).
    async fn delete_pod(&self, key: &str) -> Result<(), ApiError>;

    /// Publishes an event. Best effort: an event that cannot be written is dropped.
    async fn publish(&self, event: ClusterEvent);
}

/// Whether a `karpenter.sh/do-not-disrupt` annotation (among a pod's `annotations`) holds at `now`, as
/// Karpenter's `IsDoNotDisruptActive` reads it: `"true"` holds for good; a Go duration (`1.5h`, `90m30s`)
/// holds until that long after the pod started, and from the start while the pod has no start time
/// (failing safe); anything else, a duration of zero or less included, is no annotation at all.
pub fn do_not_disrupt_active(
    annotations: &std::collections::BTreeMap<String, String>,
    start_time: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
) -> bool {
    let Some(v) = annotations.get(crate::api::labels::DO_NOT_DISRUPT) else { return false };
    if v == "true" {
        return true;
    }
    match crate::api::parse_go_duration(v) {
        Ok(d) if !d.is_zero() => start_time.is_none_or(|s| crate::clock::since(now, s) < d),
        _ => {
            tracing::debug!(value = %v, "an invalid do-not-disrupt annotation counts as none");
            false
        }
    }
}

/// Whether `current` is the very object `held` was taken from, unchanged since. A collection held by a
/// `Weak` is never written in place (`Arc::make_mut` moves it to a new allocation while a `Weak` is held,
/// and `Arc::get_mut` refuses), and the `Weak` keeps its address from being reused: the same address means
/// the same contents. What a reader works out from a snapshot's collection is kept with such a `Weak`.
pub(crate) fn unchanged_since<T>(held: &std::sync::Weak<T>, current: &Arc<T>) -> bool {
    std::ptr::eq(held.as_ptr(), Arc::as_ptr(current))
}

/// A snapshot's nodes by `spec.providerID`, worked out once per version of its node map (see
/// [`unchanged_since`]): a reader asking about many claims looks each one up instead of scanning every
/// node.
#[derive(Debug, Default)]
pub(crate) struct NodesByProviderId {
    source: std::sync::Weak<BTreeMap<String, Arc<Node>>>,
    /// Node names by provider ID, in the map's order.
    names: rustc_hash::FxHashMap<String, Vec<String>>,
}

impl NodesByProviderId {
    /// The nodes of `snapshot` whose `spec.providerID` is `provider_id`, by name, as
    /// [`Snapshot::nodes_with_provider_id`] lists them.
    pub(crate) fn nodes<'s>(&mut self, snapshot: &'s Snapshot, provider_id: &str) -> Vec<&'s Arc<Node>> {
        if !unchanged_since(&self.source, &snapshot.nodes) {
            self.names.clear();
            for (name, node) in snapshot.nodes.iter() {
                if let Some(pid) = node_provider_id(node) {
                    self.names.entry(pid.to_owned()).or_default().push(name.clone());
                }
            }
            self.source = Arc::downgrade(&snapshot.nodes);
        }
        let names = self.names.get(provider_id).map_or(&[][..], Vec::as_slice);
        names.iter().filter_map(|n| snapshot.nodes.get(n)).collect()
    }

    /// Whether a node of `snapshot` whose `spec.providerID` is `provider_id` is being deleted.
    pub(crate) fn being_deleted(&mut self, snapshot: &Snapshot, provider_id: &str) -> bool {
        self.nodes(snapshot, provider_id).iter().any(|n| n.metadata.deletion_timestamp.is_some())
    }
}

/// The pods bound to the nodes of a snapshot's deleting claims (and to any node asked about), by node,
/// worked out once per version of its pod map ([`unchanged_since`]): termination asks for the pods of every
/// draining node in turn, and each answer would otherwise scan every pod.
#[derive(Debug, Default)]
pub(crate) struct PodsByNode {
    source: std::sync::Weak<BTreeMap<String, Arc<Pod>>>,
    /// The pods' keys, in the map's order, of each node indexed (every one, with pods or not).
    keys: rustc_hash::FxHashMap<String, Vec<String>>,
}

impl PodsByNode {
    /// The pods of `snapshot` bound to `node`, as [`Snapshot::pods_on_node`] lists them.
    pub(crate) fn pods_on<'s>(&mut self, snapshot: &'s Snapshot, node: &str) -> Vec<&'s Arc<Pod>> {
        if !unchanged_since(&self.source, &snapshot.pods) || !self.keys.contains_key(node) {
            self.keys.clear();
            let deleting = snapshot
                .claims
                .values()
                .filter(|c| c.metadata.deletion_timestamp.is_some())
                .filter_map(|c| c.status.as_ref()?.node_name.as_deref());
            for name in deleting.chain([node]) {
                self.keys.entry(name.to_owned()).or_default();
            }
            for (key, pod) in snapshot.pods.iter() {
                if let Some(keys) = pod_node(pod).and_then(|n| self.keys.get_mut(n)) {
                    keys.push(key.clone());
                }
            }
            self.source = Arc::downgrade(&snapshot.pods);
        }
        let keys = self.keys.get(node).map_or(&[][..], Vec::as_slice);
        keys.iter().filter_map(|k| snapshot.pods.get(k)).collect()
    }
}

/// A node's `spec.providerID`.
pub fn node_provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref()?.provider_id.as_deref()
}

/// Whether a node reports `Ready=True`.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether a node carries a taint with `key`.
pub fn node_has_taint(node: &Node, key: &str) -> bool {
    node.spec.iter().flat_map(|s| s.taints.iter().flatten()).any(|t| t.key == key)
}

/// `(namespace/name, node)` for a pod bound to a node, not finished and not owned by a DaemonSet.
pub fn pod_binding(pod: &Pod) -> Option<(String, String)> {
    let node = pod_node(pod)?;
    (!pod_finished(pod) && !owned_by_daemon_set(pod)).then(|| (pod_key(pod), node.to_owned()))
}

/// Whether a pod has finished: its phase is `Succeeded` or `Failed`.
pub fn pod_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Whether a DaemonSet owns the pod.
pub fn owned_by_daemon_set(pod: &Pod) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet")
}

/// The node a pod is bound to, from `spec.nodeName`.
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// How far a claim has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimProgress {
    /// The claim is gone (deleted, or its launch failed for good).
    Missing,
    /// Launched or registering, not yet initialized.
    Pending,
    /// Initialized: Ready, startup taints gone, resources reported.
    Initialized,
}

impl Snapshot {
    /// How far a claim has come.
    pub fn claim_progress(&self, claim: &str) -> ClaimProgress {
        match self.claims.get(claim) {
            None => ClaimProgress::Missing,
            Some(c) if c.metadata.deletion_timestamp.is_some() => ClaimProgress::Missing,
            Some(c) if c.is_initialized() => ClaimProgress::Initialized,
            Some(_) => ClaimProgress::Pending,
        }
    }
}

/// Writes a claim's changes: its metadata if `after`'s differs from `before`'s, then its status if that
/// differs. Returns the claim as last written (or `before` when nothing changed).
pub async fn persist_claim(
    cluster: &dyn Cluster,
    before: &NodeClaim,
    after: &NodeClaim,
) -> Result<Arc<NodeClaim>, ApiError> {
    let mut written: Option<Arc<NodeClaim>> = None;
    let meta_changed = before.metadata.labels != after.metadata.labels
        || before.metadata.annotations != after.metadata.annotations
        || before.metadata.finalizers != after.metadata.finalizers
        || before.metadata.owner_references != after.metadata.owner_references;
    if meta_changed {
        written = Some(cluster.patch_claim(after).await?);
    }
    if before.status != after.status {
        let mut next = after.clone();
        if let Some(w) = &written {
            next.metadata.resource_version.clone_from(&w.metadata.resource_version);
        }
        written = Some(cluster.patch_claim_status(&next).await?);
    }
    Ok(written.unwrap_or_else(|| Arc::new(after.clone())))
}

/// Removes a node for good: deletes it and releases tenon's termination finalizer, so the API server lets
/// it go. `NotFound` at either step means it is gone already.
pub async fn remove_node(cluster: &dyn Cluster, node: &Node) -> Result<(), ApiError> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    match cluster.delete_node(name).await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e),
    }
    let holds = node.metadata.finalizers.iter().flatten().any(|f| f == crate::api::labels::TERMINATION_FINALIZER);
    if holds {
        let mut released = node.clone();
        // The node as read: deletion only set its timestamp, so no precondition is needed to drop ours.
        released.metadata.resource_version = None;
        if let Some(f) = released.metadata.finalizers.as_mut() {
            f.retain(|f| f != crate::api::labels::TERMINATION_FINALIZER);
        }
        match cluster.patch_node(&released).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_by_provider_id_answer_as_a_scan_does_after_every_write() {
        let node = |name: &str, pid: &str| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": {"providerID": pid}}))
                .unwrap()
        };
        let api = InMemoryApi::new(jiff::Timestamp::UNIX_EPOCH);
        for (name, pid) in [("b", "p1"), ("a", "p1"), ("c", "p2")] {
            api.lock().put_node(node(name, pid));
        }
        let mut index = NodesByProviderId::default();
        let names = |nodes: Vec<&Arc<Node>>| -> Vec<String> {
            nodes.iter().map(|n| n.metadata.name.clone().unwrap()).collect()
        };
        let scan = |s: &Snapshot, pid: &str| -> Vec<String> { names(s.nodes_with_provider_id(pid).collect()) };
        let snapshot = api.snapshot();
        assert_eq!(names(index.nodes(&snapshot, "p1")), ["a", "b"]);
        assert_eq!(names(index.nodes(&snapshot, "p3")), Vec::<String>::new());
        assert!(!index.being_deleted(&snapshot, "p2"));
        // Written where it lies (no snapshot holds the map): the index is worked out again.
        drop(snapshot);
        api.lock().update_node("c", |n| {
            n.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH))
        });
        api.lock().update_node("b", |n| n.spec.as_mut().unwrap().provider_id = Some("p2".into()));
        let snapshot = api.snapshot();
        for pid in ["p1", "p2", "p3"] {
            assert_eq!(names(index.nodes(&snapshot, pid)), scan(&snapshot, pid), "{pid}");
        }
        assert!(index.being_deleted(&snapshot, "p2"));
        assert!(!index.being_deleted(&snapshot, "p1"));
    }

    #[test]
    fn pods_by_node_answer_as_a_scan_does_after_every_write() {
        let pod = |name: &str, node: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": node, "containers": []}
            }))
            .unwrap()
        };
        let claim = |name: &str, node: &str, deleting: bool| -> NodeClaim {
            let mut c: NodeClaim = serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name},
                "spec": {"nodeClassRef": {"group": "g", "kind": "K", "name": "n"}, "requirements": []},
                "status": {"nodeName": node}
            }))
            .unwrap();
            if deleting {
                c.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
            }
            c
        };
        let api = InMemoryApi::new(jiff::Timestamp::UNIX_EPOCH);
        for (name, node) in [("p3", "a"), ("p1", "a"), ("p2", "b"), ("p4", "c")] {
            api.lock().put_pod(pod(name, node));
        }
        api.lock().put_claim(claim("ca", "a", true));
        api.lock().put_claim(claim("cb", "b", false));
        let mut index = PodsByNode::default();
        let keys = |pods: Vec<&Arc<Pod>>| -> Vec<String> { pods.iter().map(|p| pod_key(p)).collect() };
        let check = |index: &mut PodsByNode, s: &Snapshot| {
            for node in ["a", "b", "c", "d"] {
                assert_eq!(keys(index.pods_on(s, node)), keys(s.pods_on_node(node).collect()), "{node}");
            }
        };
        let snapshot = api.snapshot();
        assert_eq!(keys(index.pods_on(&snapshot, "a")), ["default/p1", "default/p3"]);
        check(&mut index, &snapshot);
        // A pod bound to an indexed node, and one gone from it, in a new version of the map.
        drop(snapshot);
        api.lock().put_pod(pod("p0", "a"));
        api.lock().remove_pod("default/p3");
        let snapshot = api.snapshot();
        assert_eq!(keys(index.pods_on(&snapshot, "a")), ["default/p0", "default/p1"]);
        check(&mut index, &snapshot);
    }
}
