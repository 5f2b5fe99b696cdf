//! The cluster port on kube-rs: reflector stores as the snapshot, the API server for writes.
//!
//! [`KubeCluster::start`] runs one watcher per kind the decisions read (Pods, Nodes, NodeClaims,
//! NodePools, DaemonSets, PodDisruptionBudgets, VolumeAttachments, PersistentVolumes,
//! PersistentVolumeClaims, StorageClasses, CSINodes), each feeding a reflector store with the default
//! back-off, managed fields stripped (and of pods, what no decision reads: see [`trim_pod`]). [`Cluster::snapshot`] reads the stores; it is rebuilt
//! only after a watch event, and shares each object's `Arc` with the store, so unchanged objects are the
//! same objects from one snapshot to the next (the runtime notices changes and reuses pods' scheduling
//! views by identity). No decision is made before every store holds its initial list
//! ([`KubeCluster::wait_synced`]).
//!
//! Writes go to the API server: metadata as a JSON merge patch carrying the object's `resourceVersion`
//! (a precondition: a stale write fails as `Conflict`) and deleting the labels and annotations the new
//! object drops; status through the status subresource; evictions through `policy/v1` Eviction (429: a
//! PodDisruptionBudget refuses for now); events through `events.k8s.io/v1`, from a bounded queue a task
//! of their own drains, so a decision never waits for an event (when the queue is full, events are
//! dropped with a debug line). Every API error is classified into [`ApiErrorKind`] in one place,
//! [`api_error`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tenon_core::api::{NodeClaim, NodePool};
use tenon_core::cluster::{
    ApiError, ApiErrorKind, AttachedVolume, Cluster, ClusterEvent, EventType, Snapshot, Storage, pod_key,
};
use tokio::sync::{Notify, mpsc};

/// The field manager tenon's writes are recorded under.
pub const FIELD_MANAGER: &str = "tenon";
/// How many events wait to be written at most; more are dropped until the queue drains.
const EVENT_QUEUE: usize = 1024;

/// The reflector stores the snapshot is read from.
#[derive(Clone)]
struct Stores {
    pods: Store<Pod>,
    nodes: Store<Node>,
    claims: Store<NodeClaim>,
    pools: Store<NodePool>,
    daemon_sets: Store<DaemonSet>,
    pdbs: Store<PodDisruptionBudget>,
    volume_attachments: Store<VolumeAttachment>,
    persistent_volumes: Store<PersistentVolume>,
    persistent_volume_claims: Store<PersistentVolumeClaim>,
    storage_classes: Store<StorageClass>,
    csi_nodes: Store<CSINode>,
    namespaces: Store<Namespace>,
}

/// The cluster port over a kube-rs client. See the [module docs](self).
pub struct KubeCluster {
    client: Client,
    stores: Stores,
    /// Bumped by every watch event: a snapshot of an older generation is rebuilt.
    generation: Arc<AtomicU64>,
    changed: Arc<Notify>,
    cached: Mutex<Option<(u64, Snapshot)>>,
    events: mpsc::Sender<(KubeEvent, ObjectReference)>,
    synced: Arc<AtomicBool>,
    /// The initial lists of the NodeClass kinds fed to providers, awaited by [`KubeCluster::wait_synced`].
    feeds: Mutex<Vec<futures_util::future::BoxFuture<'static, ()>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").field("synced", &self.is_synced()).finish()
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts a watcher feeding a store for `api`, each object trimmed by `trim` (after its managed fields)
/// before the store keeps it; `on_event` sees every event once the store has applied it. Errors are
/// logged and the watch goes on with the default back-off.
fn spawn_watch<K>(
    api: Api<K>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
    trim: fn(&mut K),
    mut on_event: impl FnMut(&watcher::Event<K>, &Store<K>) + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let reader = store.clone();
    tasks.push(tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(move |o: &mut K| {
                o.managed_fields_mut().clear();
                trim(o);
            })
            .reflect(writer);
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(e) => on_event(&e, &reader),
                Err(e) => tracing::warn!(kind = %kind, error = %e, "watch failed; retrying with back-off"),
            }
        }
    }));
    store
}

/// A watch whose every event bumps `generation` and wakes `changed`, so the snapshot is rebuilt.
fn watch<K>(
    api: Api<K>,
    generation: &Arc<AtomicU64>,
    changed: &Arc<Notify>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
    trim: fn(&mut K),
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (generation, changed) = (generation.clone(), changed.clone());
    spawn_watch(api, tasks, trim, move |_, _| {
        generation.fetch_add(1, Ordering::Release);
        changed.notify_one();
    })
}

/// What of a pod no decision reads, dropped before the store keeps it: its containers' commands,
/// arguments, environment, probes, mounts and lifecycle hooks, and its containers' statuses. Kept:
/// everything scheduling, disruption and termination read (requests and limits, ports, volumes,
/// affinity, tolerations, topology spread, node selector, priority, owner references, annotations,
/// conditions, phase, nominated node).
pub fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.as_mut() {
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            c.command = None;
            c.args = None;
            c.env = None;
            c.env_from = None;
            c.liveness_probe = None;
            c.readiness_probe = None;
            c.startup_probe = None;
            c.volume_mounts = None;
            c.volume_devices = None;
            c.lifecycle = None;
        }
        spec.ephemeral_containers = None;
    }
    if let Some(status) = pod.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
    }
}

impl KubeCluster {
    /// Starts watching the cluster through `client`; `reporter` names tenon in the events it publishes.
    pub fn start(client: Client, reporter: Reporter) -> Self {
        let generation = Arc::new(AtomicU64::new(0));
        let changed = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let (g, n, t) = (&generation, &changed, &mut tasks);
        // Each store's kind comes from its field; only pods are trimmed beyond their managed fields.
        let stores = Stores {
            pods: watch(Api::all(client.clone()), g, n, t, trim_pod),
            nodes: watch(Api::all(client.clone()), g, n, t, |_| {}),
            claims: watch(Api::all(client.clone()), g, n, t, |_| {}),
            pools: watch(Api::all(client.clone()), g, n, t, |_| {}),
            daemon_sets: watch(Api::all(client.clone()), g, n, t, |_| {}),
            pdbs: watch(Api::all(client.clone()), g, n, t, |_| {}),
            volume_attachments: watch(Api::all(client.clone()), g, n, t, |_| {}),
            persistent_volumes: watch(Api::all(client.clone()), g, n, t, |_| {}),
            persistent_volume_claims: watch(Api::all(client.clone()), g, n, t, |_| {}),
            storage_classes: watch(Api::all(client.clone()), g, n, t, |_| {}),
            csi_nodes: watch(Api::all(client.clone()), g, n, t, |_| {}),
            namespaces: watch(Api::all(client.clone()), g, n, t, |_| {}),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        let (events, mut queued) = mpsc::channel::<(KubeEvent, ObjectReference)>(EVENT_QUEUE);
        tasks.push(tokio::spawn(async move {
            while let Some((event, reference)) = queued.recv().await {
                if let Err(e) = recorder.publish(&event, &reference).await {
                    let object = reference.name.unwrap_or_default();
                    tracing::debug!(%object, reason = %event.reason, error = %e, "event not published");
                }
            }
        }));
        Self {
            client,
            stores,
            generation,
            changed,
            cached: Mutex::new(None),
            events,
            synced: Arc::new(AtomicBool::new(false)),
            feeds: Mutex::default(),
            tasks,
        }
    }

    /// Watches the NodeClass kind `K` of a provider: after its initial list and after every change,
    /// `sink` gets every object of the kind (the provider diffs them against what it holds). The cluster
    /// counts as synced only once the kind's initial list is in.
    pub fn feed_node_classes<K>(&mut self, sink: impl Fn(Vec<Arc<K>>) + Send + Sync + 'static)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let mut listed = false;
        let store = spawn_watch(
            Api::<K>::all(self.client.clone()),
            &mut self.tasks,
            |_| {},
            move |event, store| match event {
                watcher::Event::InitDone => {
                    listed = true;
                    sink(store.state());
                }
                watcher::Event::Apply(_) | watcher::Event::Delete(_) if listed => sink(store.state()),
                _ => {}
            },
        );
        let ready = async move {
            let _ = store.wait_until_ready().await;
        };
        self.feeds.lock().unwrap_or_else(PoisonError::into_inner).push(Box::pin(ready));
    }

    /// Waits until every store holds its initial list. Nothing is decided before.
    pub async fn wait_synced(&self) {
        let s = &self.stores;
        // A store's writer lives as long as its watcher task, which runs until the cluster is dropped.
        let _ = s.pods.wait_until_ready().await;
        let _ = s.nodes.wait_until_ready().await;
        let _ = s.claims.wait_until_ready().await;
        let _ = s.pools.wait_until_ready().await;
        let _ = s.daemon_sets.wait_until_ready().await;
        let _ = s.pdbs.wait_until_ready().await;
        let _ = s.volume_attachments.wait_until_ready().await;
        let _ = s.persistent_volumes.wait_until_ready().await;
        let _ = s.persistent_volume_claims.wait_until_ready().await;
        let _ = s.namespaces.wait_until_ready().await;
        let _ = s.storage_classes.wait_until_ready().await;
        let _ = s.csi_nodes.wait_until_ready().await;
        let feeds = std::mem::take(&mut *self.feeds.lock().unwrap_or_else(PoisonError::into_inner));
        futures_util::future::join_all(feeds).await;
        self.synced.store(true, Ordering::Release);
    }

    /// Whether every store holds its initial list.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Woken on every watch event.
    pub fn changes(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn build_snapshot(&self) -> Snapshot {
        let s = &self.stores;
        let by_name = |items: Vec<Arc<Node>>| -> BTreeMap<String, Arc<Node>> {
            items.into_iter().map(|n| (n.name_any(), n)).collect()
        };
        Snapshot {
            pods: Arc::new(s.pods.state().into_iter().map(|p| (pod_key(&p), p)).collect()),
            nodes: Arc::new(by_name(s.nodes.state())),
            claims: Arc::new(s.claims.state().into_iter().map(|c| (c.name_any(), c)).collect()),
            pools: Arc::new(s.pools.state().iter().map(|p| NodePool::clone(p)).collect()),
            daemon_sets: Arc::new(s.daemon_sets.state().iter().map(|d| DaemonSet::clone(d)).collect()),
            pdbs: Arc::new(s.pdbs.state().iter().map(|p| PodDisruptionBudget::clone(p)).collect()),
            namespaces: Arc::new(
                s.namespaces
                    .state()
                    .iter()
                    .map(|ns| (ns.name_any(), ns.metadata.labels.clone().unwrap_or_default()))
                    .collect(),
            ),
            volume_attachments: Arc::new(
                s.volume_attachments
                    .state()
                    .iter()
                    .filter(|v| v.status.as_ref().is_some_and(|st| st.attached))
                    .map(|v| {
                        let attached = AttachedVolume {
                            node: v.spec.node_name.clone(),
                            persistent_volume: v.spec.source.persistent_volume_name.clone(),
                        };
                        (v.name_any(), attached)
                    })
                    .collect(),
            ),
            storage: Storage {
                volumes: Arc::new(s.persistent_volumes.state().into_iter().map(|v| (v.name_any(), v)).collect()),
                claims: Arc::new(
                    s.persistent_volume_claims
                        .state()
                        .into_iter()
                        .map(|c| (format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()), c))
                        .collect(),
                ),
                classes: Arc::new(s.storage_classes.state().into_iter().map(|c| (c.name_any(), c)).collect()),
                csi_nodes: Arc::new(s.csi_nodes.state().into_iter().map(|c| (c.name_any(), c)).collect()),
            },
        }
    }

    /// The reference an event about `event`'s object points at (with its UID when the stores know it).
    fn reference(&self, event: &ClusterEvent) -> ObjectReference {
        let snapshot = self.snapshot();
        let (api_version, uid) = match event.kind {
            "NodeClaim" => ("karpenter.sh/v1", snapshot.claim(&event.name).and_then(|c| c.metadata.uid.clone())),
            "NodePool" => ("karpenter.sh/v1", snapshot.pool(&event.name).and_then(|p| p.metadata.uid.clone())),
            "Node" => ("v1", snapshot.node(&event.name).and_then(|n| n.metadata.uid.clone())),
            "Pod" => {
                let key = format!("{}/{}", event.namespace.as_deref().unwrap_or("default"), event.name);
                ("v1", snapshot.pod(&key).and_then(|p| p.metadata.uid.clone()))
            }
            _ => ("v1", None),
        };
        ObjectReference {
            api_version: Some(api_version.to_owned()),
            kind: Some(event.kind.to_owned()),
            name: Some(event.name.clone()),
            namespace: event.namespace.clone(),
            uid,
            ..Default::default()
        }
    }
}

/// Classifies a kube-rs error on `object` into the port's error kinds. Only a 404 is `NotFound`.
pub fn api_error(object: &str, e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(status) => {
            let kind = match status.code {
                404 => ApiErrorKind::NotFound,
                409 if status.reason == "AlreadyExists" => ApiErrorKind::AlreadyExists,
                409 => ApiErrorKind::Conflict,
                401 | 403 => ApiErrorKind::Forbidden,
                429 => ApiErrorKind::TooManyRequests,
                400 | 422 => ApiErrorKind::Invalid,
                _ => ApiErrorKind::Unavailable,
            };
            let retry_after = status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| std::time::Duration::from_secs(u64::from(s)));
            ApiError { kind, object: object.to_owned(), message: status.message.clone(), retry_after }
        }
        other => ApiError::new(ApiErrorKind::Unavailable, object, other.to_string()),
    }
}

/// A merge patch for a string map: `desired` in full, and `null` for every key of `current` it drops.
fn map_patch(current: Option<&BTreeMap<String, String>>, desired: Option<&BTreeMap<String, String>>) -> Value {
    let mut out = serde_json::Map::new();
    for k in current.into_iter().flatten().map(|(k, _)| k) {
        out.insert(k.clone(), Value::Null);
    }
    for (k, v) in desired.into_iter().flatten() {
        out.insert(k.clone(), Value::String(v.clone()));
    }
    Value::Object(out)
}

/// The metadata part of a merge patch that makes `current` into `desired`: labels, annotations,
/// finalizers and owner references, with `desired`'s resourceVersion as the precondition.
fn meta_patch(current: Option<&ObjectMeta>, desired: &ObjectMeta) -> Value {
    let mut meta = json!({
        "labels": map_patch(current.and_then(|c| c.labels.as_ref()), desired.labels.as_ref()),
        "annotations": map_patch(current.and_then(|c| c.annotations.as_ref()), desired.annotations.as_ref()),
        "finalizers": desired.finalizers.clone().unwrap_or_default(),
        "ownerReferences": desired.owner_references.clone().unwrap_or_default(),
    });
    if let Some(rv) = &desired.resource_version {
        meta["resourceVersion"] = Value::String(rv.clone());
    }
    meta
}

fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() }
}

/// `Ok` for a delete the server accepted; the object is gone or going.
fn deleted<T>(object: &str, result: Result<T, kube::Error>) -> Result<(), ApiError> {
    result.map(|_| ()).map_err(|e| api_error(object, e))
}

#[async_trait]
impl Cluster for KubeCluster {
    fn snapshot(&self) -> Snapshot {
        let generation = self.generation.load(Ordering::Acquire);
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((g, s)) = cached.as_ref()
            && *g == generation
        {
            return s.clone();
        }
        let s = self.build_snapshot();
        *cached = Some((generation, s.clone()));
        s
    }

    async fn create_claim(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError> {
        let object = format!("NodeClaim/{}", claim.name_any());
        let mut claim = claim.clone();
        claim.metadata.resource_version = None;
        claim.status = None;
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PostParams::default() };
        let api = Api::<NodeClaim>::all(self.client.clone());
        let created = api.create(&pp, &claim).await.map_err(|e| api_error(&object, e))?;
        Ok(Arc::new(created))
    }

    async fn patch_claim(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError> {
        let name = claim.name_any();
        let object = format!("NodeClaim/{name}");
        let current = self.stores.claims.state().into_iter().find(|c| c.name_any() == name);
        let patch = json!({"metadata": meta_patch(current.as_ref().map(|c| &c.metadata), &claim.metadata)});
        let api = Api::<NodeClaim>::all(self.client.clone());
        match api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await {
            Ok(c) => Ok(Arc::new(c)),
            // Releasing the last finalizer of a claim being deleted removes it: the write did what it meant.
            Err(kube::Error::Api(s)) if s.code == 404 && claim.metadata.deletion_timestamp.is_some() => {
                Ok(Arc::new(claim.clone()))
            }
            Err(e) => Err(api_error(&object, e)),
        }
    }

    async fn patch_claim_status(&self, claim: &NodeClaim) -> Result<Arc<NodeClaim>, ApiError> {
        let name = claim.name_any();
        let object = format!("NodeClaim/{name}");
        let mut patch = json!({"status": claim.status});
        if let Some(rv) = &claim.metadata.resource_version {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
        let api = Api::<NodeClaim>::all(self.client.clone());
        let written = api.patch_status(&name, &patch_params(), &Patch::Merge(&patch)).await;
        written.map(Arc::new).map_err(|e| api_error(&object, e))
    }

    async fn delete_claim(&self, name: &str) -> Result<(), ApiError> {
        let api = Api::<NodeClaim>::all(self.client.clone());
        deleted(&format!("NodeClaim/{name}"), api.delete(name, &DeleteParams::default()).await)
    }

    async fn patch_node(&self, node: &Node) -> Result<Arc<Node>, ApiError> {
        let name = node.name_any();
        let object = format!("Node/{name}");
        let current = self.stores.nodes.state().into_iter().find(|n| n.name_any() == name);
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let patch = json!({
            "metadata": meta_patch(current.as_ref().map(|n| &n.metadata), &node.metadata),
            "spec": {"taints": taints},
        });
        let api = Api::<Node>::all(self.client.clone());
        match api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await {
            Ok(n) => Ok(Arc::new(n)),
            Err(kube::Error::Api(s)) if s.code == 404 && node.metadata.deletion_timestamp.is_some() => {
                Ok(Arc::new(node.clone()))
            }
            Err(e) => Err(api_error(&object, e)),
        }
    }

    async fn delete_node(&self, name: &str) -> Result<(), ApiError> {
        let api = Api::<Node>::all(self.client.clone());
        deleted(&format!("Node/{name}"), api.delete(name, &DeleteParams::default()).await)
    }

    async fn patch_pool_status(&self, pool: &NodePool) -> Result<(), ApiError> {
        let name = pool.name_any();
        let mut patch = json!({"status": pool.status});
        if let Some(rv) = &pool.metadata.resource_version {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
        let api = Api::<NodePool>::all(self.client.clone());
        let written = api.patch_status(&name, &patch_params(), &Patch::Merge(&patch)).await;
        written.map(|_| ()).map_err(|e| api_error(&format!("NodePool/{name}"), e))
    }

    async fn patch_pool_annotations(&self, pool: &NodePool) -> Result<(), ApiError> {
        let name = pool.name_any();
        let current = self.stores.pools.state().into_iter().find(|p| p.name_any() == name);
        let annotations = map_patch(
            current.as_ref().and_then(|p| p.metadata.annotations.as_ref()),
            pool.metadata.annotations.as_ref(),
        );
        let mut patch = json!({"metadata": {"annotations": annotations}});
        if let Some(rv) = &pool.metadata.resource_version {
            patch["metadata"]["resourceVersion"] = json!(rv);
        }
        let api = Api::<NodePool>::all(self.client.clone());
        let written = api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await;
        written.map(|_| ()).map_err(|e| api_error(&format!("NodePool/{name}"), e))
    }

    async fn evict_pod(&self, key: &str) -> Result<(), ApiError> {
        let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        api.evict(name, &EvictParams::default()).await.map(|_| ()).map_err(|e| api_error(&format!("Pod/{key}"), e))
    }

    async fn delete_pod(&self, key: &str) -> Result<(), ApiError> {
        let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        deleted(&format!("Pod/{key}"), api.delete(name, &DeleteParams::default()).await)
    }

    async fn publish(&self, event: ClusterEvent) {
        let reference = self.reference(&event);
        let e = KubeEvent {
            type_: match event.type_ {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: event.reason.to_owned(),
            note: Some(event.message.chars().take(1024).collect()),
            action: event.reason.to_owned(),
            secondary: None,
        };
        if let Err(err) = self.events.try_send((e, reference)) {
            tracing::debug!(object = %event.name, reason = event.reason, error = %err, "event dropped: the queue is full");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_patch_deletes_what_the_new_object_drops_and_carries_the_precondition() {
        let current = ObjectMeta {
            labels: Some([("a".to_owned(), "1".to_owned()), ("b".to_owned(), "2".to_owned())].into()),
            ..Default::default()
        };
        let desired = ObjectMeta {
            labels: Some([("a".to_owned(), "3".to_owned())].into()),
            finalizers: Some(vec!["karpenter.sh/termination".to_owned()]),
            resource_version: Some("42".to_owned()),
            ..Default::default()
        };
        let patch = meta_patch(Some(&current), &desired);
        assert_eq!(patch["labels"], json!({"a": "3", "b": null}));
        assert_eq!(patch["finalizers"], json!(["karpenter.sh/termination"]));
        assert_eq!(patch["resourceVersion"], "42");
        assert!(meta_patch(None, &ObjectMeta::default()).get("resourceVersion").is_none());
    }
}
