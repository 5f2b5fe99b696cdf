//! An API server in memory: the objects of a [`Snapshot`], a resourceVersion on every object, finalizers
//! that hold deleted objects until released, and faults to inject on any write.
//!
//! The controllers write through the [`Cluster`] port as they would against kube-apiserver. The simulated
//! world (kube-scheduler, kubelet, workloads) and tests change objects directly through
//! [`InMemoryApi::lock`], which never fails and bumps resourceVersions the same way.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::{ApiError, ApiErrorKind, AttachedVolume, Cluster, ClusterEvent, Snapshot, pod_key};
use crate::api::{NodeClaim, NodePool};

/// The kinds of write the port makes, for injecting faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Write {
    /// [`Cluster::create_claim`].
    CreateClaim,
    /// [`Cluster::patch_claim`].
    PatchClaim,
    /// [`Cluster::patch_claim_status`].
    PatchClaimStatus,
    /// [`Cluster::delete_claim`].
    DeleteClaim,
    /// [`Cluster::patch_node`].
    PatchNode,
    /// [`Cluster::delete_node`].
    DeleteNode,
    /// [`Cluster::evict_pod`].
    EvictPod,
    /// [`Cluster::delete_pod`].
    DeletePod,
    /// [`Cluster::patch_pool_status`].
    PatchPoolStatus,
    /// [`Cluster::patch_pool_annotations`].
    PatchPool,
}

impl Write {
    /// Every kind of write.
    pub const ALL: [Write; 10] = [
        Write::CreateClaim,
        Write::PatchClaim,
        Write::PatchClaimStatus,
        Write::DeleteClaim,
        Write::PatchNode,
        Write::DeleteNode,
        Write::EvictPod,
        Write::DeletePod,
        Write::PatchPoolStatus,
        Write::PatchPool,
    ];
}

/// A fault a write meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The error the caller gets.
    pub kind: ApiErrorKind,
    /// Whether the write is applied anyway (a timeout whose request reached the server).
    pub applied: bool,
}

impl Fault {
    /// The write fails with `kind` and is not applied.
    pub fn fail(kind: ApiErrorKind) -> Self {
        Self { kind, applied: false }
    }

    /// The write is applied, but the answer is lost: the caller sees `Unavailable`.
    pub fn timeout_after_applying() -> Self {
        Self { kind: ApiErrorKind::Unavailable, applied: true }
    }
}

/// The objects and what has been done to them. Reached through [`InMemoryApi::lock`]; it reads as the
/// [`Snapshot`] of the objects as they are now.
#[derive(Debug, Default)]
pub struct Objects {
    /// The objects.
    current: Snapshot,
    /// The server's clock, stamped on created and deleted objects.
    pub now: Timestamp,
    /// Every write through the port that succeeded, in order, for assertions on ordering.
    pub log: Vec<String>,
    /// Claims deleted through the port, in order.
    pub deleted: Vec<String>,
    /// Pods evicted through the port, in order.
    pub evicted: Vec<String>,
    /// Events published.
    pub events: Vec<ClusterEvent>,
    /// Writes through the port that failed, by kind.
    pub failed_writes: BTreeMap<Write, u64>,
    version: u64,
    /// Writes that removed pods ([`Objects::pod_removals`]).
    pod_removals: u64,
    /// Writes that removed nodes ([`Objects::node_removals`]).
    node_removals: u64,
    faults: HashMap<Write, VecDeque<Fault>>,
    object_faults: HashMap<String, ApiErrorKind>,
    /// Writes left before every write fails (the process writing is dead).
    writes_left: Option<usize>,
    /// Reads served from an older snapshot, and how many more.
    stale: Option<(Snapshot, usize)>,
}

impl std::ops::Deref for Objects {
    type Target = Snapshot;

    fn deref(&self) -> &Snapshot {
        &self.current
    }
}

/// Changes the object `key` of `map` in place and stamps `version` on it; `false` when there is none.
fn update_entry<T: Clone>(
    map: &mut Arc<BTreeMap<String, Arc<T>>>,
    key: &str,
    version: String,
    meta: fn(&mut T) -> &mut ObjectMeta,
    f: impl FnOnce(&mut T),
) -> bool {
    match Arc::make_mut(map).get_mut(key) {
        Some(o) => {
            let o = Arc::make_mut(o);
            f(o);
            meta(o).resource_version = Some(version);
            true
        }
        None => false,
    }
}

/// Removes `key` from `map`, copying the map only when it holds the key.
fn remove_entry<T: Clone>(map: &mut Arc<BTreeMap<String, Arc<T>>>, key: &str) -> Option<Arc<T>> {
    if !map.contains_key(key) {
        return None;
    }
    Arc::make_mut(map).remove(key)
}

impl Objects {
    fn bump(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    fn stamp(&mut self, meta: &mut ObjectMeta) {
        meta.resource_version = Some(self.bump());
    }

    /// A snapshot of the objects as they are now.
    pub fn snapshot(&self) -> Snapshot {
        self.current.clone()
    }

    /// Creates or replaces a pod, as its controller or kube-scheduler would.
    pub fn put_pod(&mut self, mut pod: Pod) {
        self.stamp(&mut pod.metadata);
        Arc::make_mut(&mut self.current.pods).insert(pod_key(&pod), Arc::new(pod));
    }

    /// Changes a pod in place; `false` when there is none.
    pub fn update_pod(&mut self, key: &str, f: impl FnOnce(&mut Pod)) -> bool {
        let version = self.bump();
        update_entry(&mut self.current.pods, key, version, |p| &mut p.metadata, f)
    }

    /// Removes a pod.
    pub fn remove_pod(&mut self, key: &str) -> Option<Arc<Pod>> {
        let removed = remove_entry(&mut self.current.pods, key);
        if removed.is_some() {
            self.pod_removals += 1;
        }
        removed
    }

    /// Keeps the pods for which `keep` says so.
    pub fn retain_pods(&mut self, mut keep: impl FnMut(&Pod) -> bool) {
        if self.pods.values().all(|p| keep(p)) {
            return;
        }
        self.pod_removals += 1;
        Arc::make_mut(&mut self.current.pods).retain(|_, p| keep(p));
    }

    /// How many times pods were removed so far: while it stays the same, every pod key present stays
    /// present.
    pub fn pod_removals(&self) -> u64 {
        self.pod_removals
    }

    /// Creates or replaces a node, as a kubelet would.
    pub fn put_node(&mut self, mut node: Node) {
        self.stamp(&mut node.metadata);
        let name = node.metadata.name.clone().unwrap_or_default();
        Arc::make_mut(&mut self.current.nodes).insert(name, Arc::new(node));
    }

    /// Changes a node in place; `false` when there is none.
    pub fn update_node(&mut self, name: &str, f: impl FnOnce(&mut Node)) -> bool {
        let version = self.bump();
        update_entry(&mut self.current.nodes, name, version, |n| &mut n.metadata, f)
    }

    /// Removes a node at once, finalizers and all.
    pub fn remove_node(&mut self, name: &str) -> Option<Arc<Node>> {
        let removed = remove_entry(&mut self.current.nodes, name);
        if removed.is_some() {
            self.node_removals += 1;
        }
        removed
    }

    /// How many times nodes were removed so far: while it stays the same, every node name present stays
    /// present.
    pub fn node_removals(&self) -> u64 {
        self.node_removals
    }

    /// Creates or replaces a claim directly, as a test or another controller would.
    pub fn put_claim(&mut self, mut claim: NodeClaim) {
        self.stamp(&mut claim.metadata);
        claim.metadata.uid.get_or_insert_with(|| format!("uid-{}", claim.metadata.name.as_deref().unwrap_or_default()));
        let now = self.now;
        claim.metadata.creation_timestamp.get_or_insert(Time(now));
        Arc::make_mut(&mut self.current.claims).insert(claim.name().to_owned(), Arc::new(claim));
    }

    /// Changes a claim in place; `false` when there is none.
    pub fn update_claim(&mut self, name: &str, f: impl FnOnce(&mut NodeClaim)) -> bool {
        let version = self.bump();
        update_entry(&mut self.current.claims, name, version, |c| &mut c.metadata, f)
    }

    /// Removes a claim at once, finalizers and all (as `kubectl patch` removing them would).
    pub fn remove_claim(&mut self, name: &str) -> Option<Arc<NodeClaim>> {
        remove_entry(&mut self.current.claims, name)
    }

    /// Removes every claim at once.
    pub fn clear_claims(&mut self) {
        self.current.claims = Arc::default();
    }

    /// Replaces the NodePools.
    pub fn set_pools(&mut self, pools: Vec<NodePool>) {
        self.current.pools = Arc::new(pools);
    }

    /// Adds a DaemonSet.
    pub fn add_daemon_set(&mut self, ds: DaemonSet) {
        Arc::make_mut(&mut self.current.daemon_sets).push(ds);
    }

    /// Adds a PodDisruptionBudget.
    pub fn add_pdb(&mut self, pdb: PodDisruptionBudget) {
        Arc::make_mut(&mut self.current.pdbs).push(pdb);
    }

    /// Records a VolumeAttachment of `node`, of PersistentVolume `volume` (`None`: an inline volume).
    pub fn attach_volume(&mut self, attachment: &str, node: &str, volume: Option<&str>) {
        let attached = AttachedVolume { node: node.to_owned(), persistent_volume: volume.map(str::to_owned) };
        Arc::make_mut(&mut self.current.volume_attachments).insert(attachment.to_owned(), attached);
    }

    /// Adds (or replaces) a Namespace with its labels.
    pub fn put_namespace(&mut self, name: &str, labels: BTreeMap<String, String>) {
        Arc::make_mut(&mut self.current.namespaces).insert(name.to_owned(), labels);
    }

    /// Adds (or replaces) a PersistentVolumeClaim.
    pub fn put_volume_claim(&mut self, pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim) {
        let key = format!(
            "{}/{}",
            pvc.metadata.namespace.as_deref().unwrap_or("default"),
            pvc.metadata.name.as_deref().unwrap_or_default()
        );
        Arc::make_mut(&mut self.current.storage.claims).insert(key, Arc::new(pvc));
    }

    /// Removes a VolumeAttachment.
    pub fn detach_volume(&mut self, attachment: &str) {
        Arc::make_mut(&mut self.current.volume_attachments).remove(attachment);
    }

    /// The next `count` writes of `write` meet `fault`.
    pub fn inject(&mut self, write: Write, fault: Fault, count: usize) {
        let queue = self.faults.entry(write).or_default();
        queue.extend(std::iter::repeat_n(fault, count));
    }

    /// Every write to the object named `name` (a claim, node, or `namespace/name` pod) fails with `kind`
    /// until [`Objects::clear_object_fault`].
    pub fn fail_object(&mut self, name: &str, kind: ApiErrorKind) {
        self.object_faults.insert(name.to_owned(), kind);
    }

    /// Lets writes to `name` through again.
    pub fn clear_object_fault(&mut self, name: &str) {
        self.object_faults.remove(name);
    }

    /// After `writes` more writes succeed, every write fails with `Unavailable` (the writer died between
    /// two writes) until [`Objects::revive`].
    pub fn die_after(&mut self, writes: usize) {
        self.writes_left = Some(writes);
    }

    /// Lets writes through again after [`Objects::die_after`].
    pub fn revive(&mut self) {
        self.writes_left = None;
    }

    /// The next `reads` snapshots show the objects as they are now, whatever is written meanwhile (a
    /// watch lagging the writes).
    pub fn lag_reads(&mut self, reads: usize) {
        let now = self.snapshot();
        self.stale = Some((now, reads));
    }

    /// Drops every pending fault, object fault and stale read.
    pub fn clear_faults(&mut self) {
        self.faults.clear();
        self.object_faults.clear();
        self.writes_left = None;
        self.stale = None;
    }

    /// The fault this write meets, if any; `Ok(true)` when it must be applied and then reported failed.
    fn admit(&mut self, write: Write, object: &str, name: &str) -> Result<Option<ApiErrorKind>, ApiError> {
        if let Some(left) = self.writes_left.as_mut() {
            if *left == 0 {
                *self.failed_writes.entry(write).or_default() += 1;
                return Err(ApiError::new(ApiErrorKind::Unavailable, object, "connection refused"));
            }
            *left -= 1;
        }
        if let Some(kind) = self.object_faults.get(name).copied() {
            *self.failed_writes.entry(write).or_default() += 1;
            return Err(ApiError::new(kind, object, "injected fault"));
        }
        match self.faults.get_mut(&write).and_then(VecDeque::pop_front) {
            Some(f) if f.applied => Ok(Some(f.kind)),
            Some(f) => {
                *self.failed_writes.entry(write).or_default() += 1;
                Err(ApiError::new(f.kind, object, "injected fault"))
            }
            None => Ok(None),
        }
    }

    /// Reports the lost answer of a write that was applied.
    fn answer<T>(&mut self, write: Write, object: &str, lost: Option<ApiErrorKind>, value: T) -> Result<T, ApiError> {
        match lost {
            Some(kind) => {
                *self.failed_writes.entry(write).or_default() += 1;
                Err(ApiError::new(kind, object, "the request timed out"))
            }
            None => Ok(value),
        }
    }

    fn check_version(current: &ObjectMeta, given: &ObjectMeta, object: &str) -> Result<(), ApiError> {
        match &given.resource_version {
            Some(v) if current.resource_version.as_ref() != Some(v) => Err(ApiError::new(
                ApiErrorKind::Conflict,
                object,
                "the object has been modified; please apply your changes to the latest version and try again",
            )),
            _ => Ok(()),
        }
    }

    fn create_claim(&mut self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError> {
        let object = format!("NodeClaim/{}", claim.name());
        let lost = self.admit(Write::CreateClaim, &object, claim.name())?;
        if self.claims.contains_key(claim.name()) {
            return Err(ApiError::new(ApiErrorKind::AlreadyExists, object, "already exists"));
        }
        let mut c = claim.clone();
        c.metadata.uid = Some(format!("uid-{}-{}", claim.name(), self.version + 1));
        c.metadata.creation_timestamp = Some(Time(self.now));
        c.metadata.deletion_timestamp = None;
        self.stamp(&mut c.metadata);
        let c = Arc::new(c);
        Arc::make_mut(&mut self.current.claims).insert(claim.name().to_owned(), c.clone());
        self.log.push(format!("create {}", claim.name()));
        self.answer(Write::CreateClaim, &object, lost, c)
    }

    fn patch_claim(&mut self, claim: &NodeClaim, status: bool) -> Result<Arc<NodeClaim>, ApiError> {
        let (write, what) = if status { (Write::PatchClaimStatus, "status") } else { (Write::PatchClaim, "metadata") };
        let object = format!("NodeClaim/{}", claim.name());
        let lost = self.admit(write, &object, claim.name())?;
        let Some(current) = self.claims.get(claim.name()) else { return Err(ApiError::not_found(object)) };
        Self::check_version(&current.metadata, &claim.metadata, &object)?;
        let mut c = NodeClaim::clone(current);
        if status {
            c.status.clone_from(&claim.status);
        } else {
            c.metadata.labels.clone_from(&claim.metadata.labels);
            c.metadata.annotations.clone_from(&claim.metadata.annotations);
            c.metadata.finalizers.clone_from(&claim.metadata.finalizers);
            c.metadata.owner_references.clone_from(&claim.metadata.owner_references);
        }
        self.stamp(&mut c.metadata);
        self.log.push(format!("patch {what} {}", claim.name()));
        let released =
            c.metadata.deletion_timestamp.is_some() && c.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
        let c = Arc::new(c);
        if released {
            Arc::make_mut(&mut self.current.claims).remove(claim.name());
            self.log.push(format!("removed {}", claim.name()));
        } else {
            Arc::make_mut(&mut self.current.claims).insert(claim.name().to_owned(), c.clone());
        }
        self.answer(write, &object, lost, c)
    }

    fn delete_claim(&mut self, name: &str) -> Result<(), ApiError> {
        let object = format!("NodeClaim/{name}");
        let lost = self.admit(Write::DeleteClaim, &object, name)?;
        let Some(current) = self.claims.get(name) else { return Err(ApiError::not_found(object)) };
        if current.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            Arc::make_mut(&mut self.current.claims).remove(name);
            self.log.push(format!("removed {name}"));
        } else if current.metadata.deletion_timestamp.is_none() {
            let now = self.now;
            let version = self.bump();
            if let Some(c) = Arc::make_mut(&mut self.current.claims).get_mut(name).map(Arc::make_mut) {
                c.metadata.deletion_timestamp = Some(Time(now));
                c.metadata.resource_version = Some(version);
            }
        }
        self.log.push(format!("delete {name}"));
        self.deleted.push(name.to_owned());
        self.answer(Write::DeleteClaim, &object, lost, ())
    }

    fn patch_node(&mut self, node: &Node) -> Result<Arc<Node>, ApiError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let object = format!("Node/{name}");
        let lost = self.admit(Write::PatchNode, &object, &name)?;
        let Some(current) = self.nodes.get(&name) else { return Err(ApiError::not_found(object)) };
        Self::check_version(&current.metadata, &node.metadata, &object)?;
        let mut n = Node::clone(current);
        n.metadata.labels.clone_from(&node.metadata.labels);
        n.metadata.annotations.clone_from(&node.metadata.annotations);
        n.metadata.finalizers.clone_from(&node.metadata.finalizers);
        n.metadata.owner_references.clone_from(&node.metadata.owner_references);
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone());
        n.spec.get_or_insert_with(Default::default).taints = taints;
        self.stamp(&mut n.metadata);
        self.log.push(format!("patch node {name}"));
        let released =
            n.metadata.deletion_timestamp.is_some() && n.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
        let n = Arc::new(n);
        if released {
            self.node_removals += 1;
            Arc::make_mut(&mut self.current.nodes).remove(&name);
            self.log.push(format!("removed node {name}"));
        } else {
            Arc::make_mut(&mut self.current.nodes).insert(name, n.clone());
        }
        self.answer(Write::PatchNode, &object, lost, n)
    }

    fn delete_node(&mut self, name: &str) -> Result<(), ApiError> {
        let object = format!("Node/{name}");
        let lost = self.admit(Write::DeleteNode, &object, name)?;
        let Some(current) = self.nodes.get(name) else { return Err(ApiError::not_found(object)) };
        if current.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            self.node_removals += 1;
            Arc::make_mut(&mut self.current.nodes).remove(name);
            self.log.push(format!("removed node {name}"));
        } else if current.metadata.deletion_timestamp.is_none() {
            let now = self.now;
            self.update_node(name, |n| n.metadata.deletion_timestamp = Some(Time(now)));
            self.log.push(format!("delete node {name}"));
        }
        self.answer(Write::DeleteNode, &object, lost, ())
    }

    fn patch_pool_status(&mut self, pool: &NodePool) -> Result<(), ApiError> {
        let name = pool.name().to_owned();
        let object = format!("NodePool/{name}");
        let lost = self.admit(Write::PatchPoolStatus, &object, &name)?;
        let Some(i) = self.current.pools.iter().position(|p| p.name() == name) else {
            return Err(ApiError::not_found(object));
        };
        Self::check_version(&self.current.pools[i].metadata, &pool.metadata, &object)?;
        let version = self.bump();
        let stored = &mut Arc::make_mut(&mut self.current.pools)[i];
        stored.status.clone_from(&pool.status);
        stored.metadata.resource_version = Some(version);
        self.log.push(format!("patch status NodePool/{name}"));
        self.answer(Write::PatchPoolStatus, &object, lost, ())
    }

    fn patch_pool_annotations(&mut self, pool: &NodePool) -> Result<(), ApiError> {
        let name = pool.name().to_owned();
        let object = format!("NodePool/{name}");
        let lost = self.admit(Write::PatchPool, &object, &name)?;
        let Some(i) = self.current.pools.iter().position(|p| p.name() == name) else {
            return Err(ApiError::not_found(object));
        };
        Self::check_version(&self.current.pools[i].metadata, &pool.metadata, &object)?;
        let version = self.bump();
        let stored = &mut Arc::make_mut(&mut self.current.pools)[i];
        stored.metadata.annotations.clone_from(&pool.metadata.annotations);
        stored.metadata.resource_version = Some(version);
        self.log.push(format!("patch NodePool/{name}"));
        self.answer(Write::PatchPool, &object, lost, ())
    }

    fn evict_pod(&mut self, key: &str) -> Result<(), ApiError> {
        self.take_pod(Write::EvictPod, key)
    }

    fn delete_pod(&mut self, key: &str) -> Result<(), ApiError> {
        self.take_pod(Write::DeletePod, key)
    }

    /// Removes pod `key` through `write`, an eviction (recorded in `evicted`) or a forced delete.
    fn take_pod(&mut self, write: Write, key: &str) -> Result<(), ApiError> {
        let object = format!("Pod/{key}");
        let lost = self.admit(write, &object, key)?;
        if self.remove_pod(key).is_none() {
            return Err(ApiError::not_found(object));
        }
        if write == Write::EvictPod {
            self.log.push(format!("evict {key}"));
            self.evicted.push(key.to_owned());
        } else {
            self.log.push(format!("force-delete {key}"));
        }
        self.answer(write, &object, lost, ())
    }
}

/// An API server in memory. See the [module docs](self).
#[derive(Debug, Default)]
pub struct InMemoryApi {
    objects: Mutex<Objects>,
}

impl InMemoryApi {
    /// An empty API whose clock reads `now`.
    pub fn new(now: Timestamp) -> Self {
        Self { objects: Mutex::new(Objects { now, ..Default::default() }) }
    }

    /// The objects, to read or change directly (never fails, injects nothing).
    pub fn lock(&self) -> MutexGuard<'_, Objects> {
        // A poisoned lock only means a panic elsewhere mid-change; the maps are still whole.
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the server's clock.
    pub fn set_now(&self, now: Timestamp) {
        self.lock().now = now;
    }
}

#[async_trait]
impl Cluster for InMemoryApi {
    fn snapshot(&self) -> Snapshot {
        let mut o = self.lock();
        if let Some((snapshot, left)) = o.stale.as_mut() {
            let s = snapshot.clone();
            *left = left.saturating_sub(1);
            if *left == 0 {
                o.stale = None;
            }
            return s;
        }
        o.snapshot()
    }

    async fn create_claim(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError> {
        self.lock().create_claim(claim)
    }

    async fn patch_claim(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError> {
        self.lock().patch_claim(claim, false)
    }

    async fn patch_claim_status(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError> {
        self.lock().patch_claim(claim, true)
    }

    async fn delete_claim(&self, name: &str) -> Result<(), ApiError> {
        self.lock().delete_claim(name)
    }

    async fn patch_node(&self, node: &Node) -> Result<Arc<Node>, ApiError> {
        self.lock().patch_node(node)
    }

    async fn delete_node(&self, name: &str) -> Result<(), ApiError> {
        self.lock().delete_node(name)
    }

    async fn patch_pool_status(&self, pool: &NodePool) -> Result<(), ApiError> {
        self.lock().patch_pool_status(pool)
    }

    async fn patch_pool_annotations(&self, pool: &NodePool) -> Result<(), ApiError> {
        self.lock().patch_pool_annotations(pool)
    }

    async fn evict_pod(&self, key: &str) -> Result<(), ApiError> {
        self.lock().evict_pod(key)
    }

    async fn delete_pod(&self, key: &str) -> Result<(), ApiError> {
        self.lock().delete_pod(key)
    }

    async fn publish(&self, event: ClusterEvent) {
        self.lock().events.push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::labels;

    fn claim(name: &str, finalizer: bool) -> NodeClaim {
        let mut c = NodeClaim::new(name, Default::default());
        if finalizer {
            c.metadata.finalizers = Some(vec![labels::TERMINATION_FINALIZER.into()]);
        }
        c
    }

    #[tokio::test]
    async fn writes_with_a_stale_resource_version_conflict() {
        let api = InMemoryApi::new(Timestamp::UNIX_EPOCH);
        let created = api.create_claim(&claim("a", true)).await.unwrap();
        let mut first = NodeClaim::clone(&created);
        first.metadata.labels = Some([("x".to_owned(), "1".to_owned())].into());
        api.patch_claim(&first).await.unwrap();
        // A second writer still holding the created object loses.
        let mut second = NodeClaim::clone(&created);
        second.metadata.labels = Some([("x".to_owned(), "2".to_owned())].into());
        let err = api.patch_claim(&second).await.unwrap_err();
        assert_eq!(err.kind, ApiErrorKind::Conflict);
        assert_eq!(err.object, "NodeClaim/a");
        assert_eq!(api.snapshot().claims["a"].label("x"), Some("1"));
        assert_eq!(api.create_claim(&claim("a", true)).await.unwrap_err().kind, ApiErrorKind::AlreadyExists);
    }

    #[tokio::test]
    async fn a_finalizer_holds_a_deleted_claim_until_it_is_released() {
        let api = InMemoryApi::new(Timestamp::UNIX_EPOCH);
        api.create_claim(&claim("a", true)).await.unwrap();
        api.delete_claim("a").await.unwrap();
        let held = api.snapshot().claims["a"].clone();
        assert!(held.metadata.deletion_timestamp.is_some());
        let mut released = NodeClaim::clone(&held);
        released.metadata.finalizers = Some(Vec::new());
        api.patch_claim(&released).await.unwrap();
        assert!(api.snapshot().claims.is_empty());
        assert!(api.delete_claim("a").await.unwrap_err().is_not_found());
        // Without a finalizer, deletion is immediate.
        api.create_claim(&claim("b", false)).await.unwrap();
        api.delete_claim("b").await.unwrap();
        assert!(api.snapshot().claims.is_empty());
    }

    #[tokio::test]
    async fn injected_faults_fail_or_apply_and_lose_the_answer() {
        let api = InMemoryApi::new(Timestamp::UNIX_EPOCH);
        api.lock().inject(Write::CreateClaim, Fault::fail(ApiErrorKind::Unavailable), 1);
        assert_eq!(api.create_claim(&claim("a", true)).await.unwrap_err().kind, ApiErrorKind::Unavailable);
        assert!(api.snapshot().claims.is_empty(), "a failed write is not applied");
        api.lock().inject(Write::CreateClaim, Fault::timeout_after_applying(), 1);
        assert_eq!(api.create_claim(&claim("a", true)).await.unwrap_err().kind, ApiErrorKind::Unavailable);
        assert!(api.snapshot().claims.contains_key("a"), "a timed-out write may have landed");
        api.lock().die_after(1);
        api.create_claim(&claim("b", true)).await.unwrap();
        assert!(api.create_claim(&claim("c", true)).await.is_err(), "dead after one more write");
        api.lock().revive();
        api.create_claim(&claim("c", true)).await.unwrap();
        assert_eq!(api.lock().failed_writes[&Write::CreateClaim], 3);
    }

    #[tokio::test]
    async fn lagging_reads_show_the_past() {
        let api = InMemoryApi::new(Timestamp::UNIX_EPOCH);
        api.lock().lag_reads(2);
        api.create_claim(&claim("a", true)).await.unwrap();
        assert!(api.snapshot().claims.is_empty());
        assert!(api.snapshot().claims.is_empty());
        assert!(api.snapshot().claims.contains_key("a"), "the watch caught up");
    }
}
