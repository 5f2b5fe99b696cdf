//! `kwok`: a provider of simulated nodes, tenon's counterpart of Karpenter's kwok provider.
//!
//! [`KwokProvider`] launches no machine. For each NodeClaim it picks the cheapest compatible offering of a
//! static instance catalog and, after a registration delay, creates a `Node` object shaped like one a
//! kubelet would register: the claim's labels and single-value requirements, the offering's instance type,
//! zone and capacity type, the type's own labels, capacity and allocatable, the
//! `karpenter.sh/unregistered:NoExecute` taint and the `kwok.x-k8s.io/node: fake` annotation. A kwok
//! controller running in the cluster (`kwok --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake`)
//! plays the kubelet of such nodes: it marks them Ready and runs the pods the scheduler binds to them. A
//! cluster thus exercises NodePools, provisioning and disruption without a cloud bill.
//!
//! NodePools route to this provider through `nodeClassRef: {group: tenon.dev, kind: KwokNodeClass, name:
//! ...}`; [`KwokNodeClass`] is that kind, with an empty spec.
//!
//! The Node objects are the provider's only state that outlives a process: [`CloudProvider::get`] and
//! [`CloudProvider::list`] rebuild instances from them (launch time, claim and cluster come from the
//! provider's labels and annotations), so a restarted operator finds every node the previous one created.
//! A creation still waiting out its registration delay lives in memory only: if the process stops before
//! the delay is over, that Node is never created and the core sees the instance gone.
//!
//! An instance is gone once its Node is gone, or once the Node is being deleted and holds no finalizer
//! other than tenon's own `karpenter.sh/termination`: the core releases that finalizer itself after the
//! provider reports the instance gone, so a Node held only by it stands for a machine already shut down.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::schemars::JsonSchema;
use kube::CustomResource;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use serde::{Deserialize, Serialize};
use tenon_core::api::{NodeClaim, NodePool, Operator, labels};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DriftReason, Instance, InstanceState, InstanceType, LaunchOptions,
    NodeClassKind, Offering, OfferingKey, ProviderDescriptor, RepairPolicy,
};
use tenon_core::resources::Resources;
use tenon_core::snapshot::{Snapshot, SnapshotError};
use tokio::sync::Notify;

/// The provider's name, in logs, metrics and [`CloudError`]s.
pub const NAME: &str = "kwok";
/// The API group of [`KwokNodeClass`].
pub const GROUP: &str = "tenon.dev";
/// The API version of [`KwokNodeClass`].
pub const VERSION: &str = "v1alpha1";
/// The kind of [`KwokNodeClass`].
pub const KIND: &str = "KwokNodeClass";
/// The scheme of every provider id this provider hands out: `kwok://<cluster>/<zone>/<node name>`.
pub const PROVIDER_ID_PREFIX: &str = "kwok://";
/// The annotation (and label) key the kwok controller selects the nodes it manages by.
pub const KWOK_NODE_KEY: &str = "kwok.x-k8s.io/node";
/// The value of [`KWOK_NODE_KEY`] on this provider's nodes.
pub const KWOK_NODE_VALUE: &str = "fake";
/// The label naming the cluster (`KwokSettings::cluster_name`) a node belongs to.
pub const CLUSTER_LABEL: &str = "tenon.dev/kwok-cluster";
/// The annotation naming the NodeClaim a node was created for.
pub const NODE_CLAIM_ANNOTATION: &str = "tenon.dev/kwok-nodeclaim";
/// The annotation holding the UID of the NodeClaim a node was created for.
pub const NODE_CLAIM_UID_ANNOTATION: &str = "tenon.dev/kwok-nodeclaim-uid";
/// The annotation holding the instance's launch time (RFC 3339), which `get` and `list` report.
pub const LAUNCH_TIME_ANNOTATION: &str = "tenon.dev/kwok-launch-time";
/// How long after `create` the Node appears, unless [`KwokSettings::registration_delay`] says otherwise.
pub const DEFAULT_REGISTRATION_DELAY: Duration = Duration::from_secs(5);

/// How many times the background creation of a Node is attempted when the API server fails transiently.
const CREATE_ATTEMPTS: u32 = 6;
/// The wait before the second attempt; it doubles for each further one.
const FIRST_RETRY: Duration = Duration::from_millis(250);

/// The built-in catalog: rows of `examples/catalogs/aws-us-east-1.yaml`.
const DEFAULT_CATALOG: &str = include_str!("kwok-catalog.yaml");

/// The spec of a KwokNodeClass: empty, since simulated nodes need no images, networks or credentials.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[kube(
    group = "tenon.dev",
    version = "v1alpha1",
    kind = "KwokNodeClass",
    plural = "kwoknodeclasses",
    derive = "PartialEq",
    derive = "Default",
    crates(schemars = "::k8s_openapi::schemars"),
    doc = "A KwokNodeClass routes a NodePool to the kwok provider, which creates simulated nodes that a kwok controller runs."
)]
#[schemars(crate = "::k8s_openapi::schemars")]
pub struct KwokNodeClassSpec {}

/// The kwok provider's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KwokSettings {
    /// The cluster the provider's nodes belong to: it is the value of [`CLUSTER_LABEL`] and part of every
    /// provider id, so it must be a valid label value (at most 63 characters of `[A-Za-z0-9._-]`, starting
    /// and ending with an alphanumeric). `list` and `get` see only this cluster's nodes.
    pub cluster_name: String,
    /// How long after `create` the Node is created ([`DEFAULT_REGISTRATION_DELAY`] by default).
    pub registration_delay: Duration,
}

impl KwokSettings {
    /// Settings for `cluster_name` with the default registration delay.
    pub fn new(cluster_name: impl Into<String>) -> Self {
        Self { cluster_name: cluster_name.into(), registration_delay: DEFAULT_REGISTRATION_DELAY }
    }
}

/// A creation waiting out its registration delay, or whose Node create call is under way.
#[derive(Debug)]
struct Pending {
    /// The instance `create` returned.
    instance: Instance,
    /// The claim's UID, if it had one.
    claim_uid: Option<String>,
    /// Set by `delete`: the Node must not be created, or must be deleted once it is.
    cancelled: bool,
    /// Wakes the creating task early when the creation is cancelled.
    wake: Arc<Notify>,
}

type PendingMap = Arc<Mutex<HashMap<String, Pending>>>;

/// A provider of simulated nodes: Node objects in the cluster, run by a kwok controller.
pub struct KwokProvider {
    nodes: Api<Node>,
    instance_types: Vec<InstanceType>,
    settings: KwokSettings,
    /// Creations whose Node does not exist yet, by node name.
    pending: PendingMap,
    /// Offerings launches into which fail for lack of capacity ([`KwokProvider::exhaust_offering`]).
    exhausted: Mutex<HashSet<OfferingKey>>,
    /// The KwokNodeClasses that exist, once the operator feeds them ([`KwokProvider::set_node_classes`]);
    /// `None` serves any name.
    classes: Mutex<Option<BTreeSet<String>>>,
}

impl fmt::Debug for KwokProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KwokProvider")
            .field("settings", &self.settings)
            .field("instance_types", &self.instance_types.len())
            .field("pending", &lock(&self.pending).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KwokProvider {
    /// A provider creating Nodes through `client`, offering `instance_types`.
    pub fn new(client: kube::Client, instance_types: Vec<InstanceType>, settings: KwokSettings) -> Self {
        Self {
            nodes: Api::all(client),
            instance_types,
            settings,
            pending: Arc::default(),
            exhausted: Mutex::default(),
            classes: Mutex::default(),
        }
    }

    /// The names of the KwokNodeClasses that exist (the operator feeds them from the API server): a
    /// NodePool or NodeClaim naming another is answered `NodeClassNotReady`.
    pub fn set_node_classes(&self, names: impl IntoIterator<Item = String>) {
        *lock(&self.classes) = Some(names.into_iter().collect());
    }

    /// `NodeClassNotReady` unless the KwokNodeClass `r` names exists (or the classes are not fed).
    fn check_class(&self, r: Option<&tenon_core::api::NodeClassRef>, object: &str) -> Result<(), CloudError> {
        let classes = lock(&self.classes);
        let Some(known) = classes.as_ref() else { return Ok(()) };
        match r {
            Some(r) if known.contains(&r.name) => Ok(()),
            Some(r) => Err(CloudError::NodeClassNotReady(format!("{object}: {KIND}/{} does not exist", r.name))),
            None => Err(CloudError::NodeClassNotReady(format!("{object}: no nodeClassRef"))),
        }
    }

    /// The instance types of the `InstanceCatalog` documents in the YAML file at `path` (see
    /// [`tenon_core::snapshot`]); a type named twice keeps its last definition.
    ///
    /// # Errors
    ///
    /// The file cannot be read or parsed, or it defines no instance type.
    pub fn catalog_from_file(path: impl AsRef<Path>) -> Result<Vec<InstanceType>, SnapshotError> {
        let path = path.as_ref();
        let types = Snapshot::load_files(&[path])?.instance_types();
        if types.is_empty() {
            return Err(SnapshotError {
                file: path.display().to_string(),
                document: 0,
                object: String::new(),
                field: String::new(),
                message: "no InstanceCatalog document with instance types".into(),
            });
        }
        Ok(types)
    }

    /// A small built-in catalog: six CPU types (c5.large, c5.xlarge, m5.large, m5.xlarge, m5.2xlarge,
    /// r5.large) and two single-GPU types (g5.xlarge, g5.2xlarge), on-demand and spot in us-east-1a, -1b
    /// and -1c.
    ///
    /// The rows are copied unchanged from `examples/catalogs/aws-us-east-1.yaml`: shapes, overhead and
    /// on-demand prices are AWS's public us-east-1 figures (AWS Pricing API), and spot prices are that
    /// catalog's stated assumption of 42% of the on-demand price.
    pub fn default_catalog() -> Vec<InstanceType> {
        match Snapshot::parse_str("kwok-catalog.yaml", DEFAULT_CATALOG) {
            Ok(snapshot) => snapshot.instance_types(),
            Err(e) => {
                tracing::error!(error = %e, "the built-in kwok catalog does not parse");
                Vec::new()
            }
        }
    }

    /// The settings the provider was built with.
    pub fn settings(&self) -> &KwokSettings {
        &self.settings
    }

    /// Makes launches into `offering` fail with [`CloudError::InsufficientCapacity`] until
    /// [`KwokProvider::restore_offering`], while `instance_types` keeps reporting it available, as a cloud
    /// does when a market runs dry between a price list and a launch.
    pub fn exhaust_offering(&self, offering: OfferingKey) {
        lock(&self.exhausted).insert(offering);
    }

    /// Lets launches into `offering` succeed again.
    pub fn restore_offering(&self, offering: &OfferingKey) {
        lock(&self.exhausted).remove(offering);
    }

    fn cluster(&self) -> &str {
        &self.settings.cluster_name
    }

    /// The node name in `provider_id`, when it is one of this cluster's.
    fn node_name_of<'a>(&self, provider_id: &'a str) -> Option<&'a str> {
        node_name_in(self.cluster(), provider_id)
    }

    fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        self.instance_types.iter().find(|t| t.name == name)
    }

    /// How many of this cluster's instances draw on each reservation.
    async fn reservations_in_use(&self) -> Result<HashMap<String, u32>, CloudError> {
        let mut used = HashMap::new();
        for i in self.list().await? {
            if let Some(r) = i.labels.get(labels::RESERVATION_ID) {
                *used.entry(r.clone()).or_insert(0) += 1;
            }
        }
        Ok(used)
    }

    /// The cheapest launchable offering for `claim`: reserved offerings first, then by price, skipping
    /// unavailable offerings, those `options` excludes and full reservations. Offerings exhausted by
    /// [`KwokProvider::exhaust_offering`] are tried and named in the error when nothing else fits.
    fn choose(
        &self,
        claim: &NodeClaim,
        options: &LaunchOptions,
        reservations_in_use: &HashMap<String, u32>,
    ) -> Result<(&InstanceType, &Offering), CloudError> {
        let requests = Resources::from_resource_list(&claim.spec.resources.requests).map_err(|e| {
            CloudError::Create { reason: "InvalidRequests".into(), message: format!("NodeClaim/{}: {e}", claim.name()) }
        })?;
        let mut excluded = 0usize;
        let mut candidates: Vec<(&InstanceType, &Offering)> = Vec::new();
        for it in &self.instance_types {
            if !requests.fits(&it.allocatable()) {
                continue;
            }
            for o in &it.offerings {
                if !o.available || !it.offering_meets(o, &claim.spec.requirements) {
                    continue;
                }
                if options.is_unavailable(&o.key(&it.name)) {
                    excluded += 1;
                    continue;
                }
                if o.capacity_type == CapacityType::Reserved {
                    let used = o.reservation_id.as_ref().and_then(|r| reservations_in_use.get(r)).copied();
                    if used.unwrap_or(0) >= o.reservation_capacity.unwrap_or(0) {
                        continue;
                    }
                }
                candidates.push((it, o));
            }
        }
        let rank = |o: &Offering| u8::from(o.capacity_type != CapacityType::Reserved);
        candidates.sort_by(|(_, a), (_, b)| rank(a).cmp(&rank(b)).then(a.price.total_cmp(&b.price)));
        let exhausted = lock(&self.exhausted);
        let mut failed = Vec::new();
        for (it, o) in candidates {
            let key = o.key(&it.name);
            if exhausted.contains(&key) {
                failed.push(key);
            } else {
                return Ok((it, o));
            }
        }
        let message = if failed.is_empty() {
            format!(
                "NodeClaim/{}: no compatible available offering among {} instance types ({excluded} compatible \
                 offerings excluded as unavailable by the launch options)",
                claim.name(),
                self.instance_types.len()
            )
        } else {
            format!("NodeClaim/{}: every compatible offering is out of capacity", claim.name())
        };
        Err(CloudError::InsufficientCapacity { offerings: failed, message })
    }

    /// The Node a kubelet would register for `claim` on `offering` of `it`.
    fn node_for(&self, claim: &NodeClaim, it: &InstanceType, offering: &Offering, launch_time: Timestamp) -> Node {
        let name = claim.name().to_owned();
        let mut node_labels = claim.metadata.labels.clone().unwrap_or_default();
        for r in &claim.spec.requirements {
            if let (Operator::In, [value]) = (r.operator, r.values.as_slice()) {
                node_labels.insert(r.key.clone(), value.clone());
            }
        }
        node_labels.extend(it.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        node_labels.insert(labels::INSTANCE_TYPE.into(), it.name.clone());
        node_labels.insert(labels::ZONE.into(), offering.zone.clone());
        node_labels.insert(labels::CAPACITY_TYPE.into(), offering.capacity_type.as_str().into());
        if let Some(r) = &offering.reservation_id {
            node_labels.insert(labels::RESERVATION_ID.into(), r.clone());
        }
        node_labels.entry(labels::ARCH.into()).or_insert_with(|| "amd64".into());
        node_labels.entry(labels::OS.into()).or_insert_with(|| "linux".into());
        node_labels.insert(labels::HOSTNAME.into(), name.clone());
        node_labels.insert(CLUSTER_LABEL.into(), self.cluster().to_owned());
        node_labels.insert(KWOK_NODE_KEY.into(), KWOK_NODE_VALUE.into());

        let mut annotations = BTreeMap::new();
        annotations.insert(KWOK_NODE_KEY.to_owned(), KWOK_NODE_VALUE.to_owned());
        annotations.insert(NODE_CLAIM_ANNOTATION.to_owned(), name.clone());
        if let Some(uid) = &claim.metadata.uid {
            annotations.insert(NODE_CLAIM_UID_ANNOTATION.to_owned(), uid.clone());
        }
        annotations.insert(LAUNCH_TIME_ANNOTATION.to_owned(), launch_time.to_string());

        Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(node_labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(provider_id(self.cluster(), &offering.zone, &name)),
                taints: Some(vec![Taint {
                    key: labels::UNREGISTERED_TAINT.into(),
                    effect: "NoExecute".into(),
                    value: None,
                    time_added: None,
                }]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(it.capacity.to_resource_list()),
                allocatable: Some(it.allocatable().to_resource_list()),
                ..Default::default()
            }),
        }
    }

    /// Whether `node` is one of this cluster's kwok nodes.
    fn is_ours(&self, node: &Node) -> bool {
        let cluster = node.metadata.labels.as_ref().and_then(|l| l.get(CLUSTER_LABEL));
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        cluster.map(String::as_str) == Some(self.cluster()) && pid.is_some_and(|p| p.starts_with(PROVIDER_ID_PREFIX))
    }

    /// Whether `node` is this cluster's node for `claim`: the claim's provider id when it has one, its name
    /// otherwise, and its UID when both sides record one.
    fn is_claims(&self, node: &Node, claim: &NodeClaim) -> bool {
        if !self.is_ours(node) {
            return false;
        }
        let annotation = |key: &str| node.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str);
        let same_target = match claim.provider_id() {
            Some(pid) => node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid),
            None => annotation(NODE_CLAIM_ANNOTATION) == Some(claim.name()),
        };
        let same_uid = match (claim.metadata.uid.as_deref(), annotation(NODE_CLAIM_UID_ANNOTATION)) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        same_target && same_uid
    }

    /// The instance `node` stands for, when it is one of this cluster's kwok nodes with its instance type,
    /// zone and capacity type labels.
    fn instance_from_node(&self, node: &Node) -> Option<Instance> {
        if !self.is_ours(node) {
            return None;
        }
        let provider_id = node.spec.as_ref()?.provider_id.clone()?;
        let node_labels = node.metadata.labels.as_ref()?;
        let annotations = node.metadata.annotations.as_ref();
        let instance_type = node_labels.get(labels::INSTANCE_TYPE)?.clone();
        let zone = node_labels.get(labels::ZONE)?.clone();
        let capacity_type = CapacityType::parse(node_labels.get(labels::CAPACITY_TYPE)?)?;
        let it = self.instance_type(&instance_type);
        let reservation = node_labels.get(labels::RESERVATION_ID);

        let resources = |list: Option<&BTreeMap<_, _>>, fallback: Option<Resources>| {
            list.and_then(|l| Resources::from_resource_list(l).ok()).or(fallback).unwrap_or(Resources::ZERO)
        };
        let status = node.status.as_ref();
        let capacity = resources(status.and_then(|s| s.capacity.as_ref()), it.map(|t| t.capacity.clone()));
        let allocatable = resources(status.and_then(|s| s.allocatable.as_ref()), it.map(InstanceType::allocatable));

        let mut keys: BTreeSet<&str> = [
            labels::INSTANCE_TYPE,
            labels::ZONE,
            labels::CAPACITY_TYPE,
            labels::RESERVATION_ID,
            labels::ARCH,
            labels::OS,
        ]
        .into();
        keys.extend(it.iter().flat_map(|t| t.labels.keys().map(String::as_str)));
        let instance_labels = node_labels
            .iter()
            .filter(|(k, _)| keys.contains(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();

        let launch_time = annotations
            .and_then(|a| a.get(LAUNCH_TIME_ANNOTATION))
            .and_then(|t| t.parse::<Timestamp>().ok())
            .or_else(|| node.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .unwrap_or_else(Timestamp::now);
        let price = it
            .and_then(|t| {
                t.offerings.iter().find(|o| {
                    o.zone == zone && o.capacity_type == capacity_type && o.reservation_id.as_ref() == reservation
                })
            })
            .map(|o| o.price);
        let node_claim = annotations.and_then(|a| a.get(NODE_CLAIM_ANNOTATION)).cloned().or(node.metadata.name.clone());
        Some(Instance {
            provider_id,
            instance_type,
            zone,
            capacity_type,
            state: if node.metadata.deletion_timestamp.is_some() {
                InstanceState::Stopping
            } else {
                InstanceState::Running
            },
            launch_time,
            capacity,
            allocatable,
            image_id: None,
            labels: instance_labels,
            lease: None,
            node_pool: node_labels.get(labels::NODE_POOL).cloned(),
            node_claim,
            price,
        })
    }

    /// The pending creation of `node_name`, as an instance, if there is one for the same claim; an error if
    /// there is one for another claim of the same name.
    fn pending_for(&self, node_name: &str, claim_uid: Option<&str>) -> Result<Option<Instance>, CloudError> {
        let pending = lock(&self.pending);
        let Some(p) = pending.get(node_name) else {
            return Ok(None);
        };
        match (claim_uid, p.claim_uid.as_deref()) {
            (Some(a), Some(b)) if a != b => Err(CloudError::Create {
                reason: "NodeNameConflict".into(),
                message: format!("Node/{node_name} is still being created for an earlier NodeClaim of that name"),
            }),
            _ if p.cancelled => Err(CloudError::Create {
                reason: "NodeTerminating".into(),
                message: format!("Node/{node_name} is being deleted"),
            }),
            _ => Ok(Some(p.instance.clone())),
        }
    }

    /// The instance of the Node already named after `claim`: the same claim's, or an error.
    async fn existing_for(&self, claim: &NodeClaim) -> Result<Instance, CloudError> {
        let name = claim.name();
        let what = format!("Node/{name}");
        let node = self.nodes.get_opt(name).await.map_err(|e| api_error(e, &what))?;
        let conflict = |message: String| CloudError::Create { reason: "NodeNameConflict".into(), message };
        let Some(node) = node else {
            return Err(conflict(format!("{what} was deleted while NodeClaim/{name} was launched")));
        };
        let mut unlaunched = claim.clone();
        if let Some(s) = unlaunched.status.as_mut() {
            s.provider_id = None;
        }
        if !self.is_claims(&node, &unlaunched) {
            return Err(conflict(format!(
                "{what} exists and belongs to another cluster or to another NodeClaim of that name"
            )));
        }
        if node.metadata.deletion_timestamp.is_some() {
            return Err(CloudError::Create {
                reason: "NodeTerminating".into(),
                message: format!("{what} is being deleted"),
            });
        }
        self.instance_from_node(&node).ok_or_else(|| conflict(format!("{what} lacks the labels of a kwok instance")))
    }
}

/// The provider id of node `node_name` in `zone` of `cluster`.
fn provider_id(cluster: &str, zone: &str, node_name: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{cluster}/{zone}/{node_name}")
}

/// The node name in `provider_id`, when it is a provider id of `cluster`.
fn node_name_in<'a>(cluster: &str, provider_id: &'a str) -> Option<&'a str> {
    let rest = provider_id.strip_prefix(PROVIDER_ID_PREFIX)?;
    let (owner, rest) = rest.split_once('/')?;
    let (_zone, name) = rest.rsplit_once('/')?;
    (owner == cluster && !name.is_empty()).then_some(name)
}

/// Whether a Node stands for a machine that is gone: deletion has begun and only the core's termination
/// finalizer, which the core drops once the provider answers `NotFound`, holds it.
fn terminated(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some()
        && node.metadata.finalizers.iter().flatten().all(|f| f == labels::TERMINATION_FINALIZER)
}

/// The one translation of Kubernetes API errors into [`CloudError`]; `what` names the object.
fn api_error(error: kube::Error, what: &str) -> CloudError {
    match error {
        kube::Error::Api(status) => {
            let message = format!("{what}: {} ({} {})", status.message, status.code, status.reason);
            let retry_after = status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s)));
            match status.code {
                404 => CloudError::NotFound(what.to_owned()),
                401 | 403 => CloudError::Unauthorized(message),
                429 => CloudError::Throttled { retry_after },
                503 if retry_after.is_some() => CloudError::Throttled { retry_after },
                _ => CloudError::message(NAME, message),
            }
        }
        other => CloudError::other(NAME, ApiCallError { what: what.to_owned(), source: other }),
    }
}

/// Whether retrying a failed call may help: throttling, server errors and transport failures.
fn retryable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// A failed API call other than an error status, with the object it concerned.
#[derive(Debug)]
struct ApiCallError {
    what: String,
    source: kube::Error,
}

impl fmt::Display for ApiCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for ApiCallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Deletes `node` unless it was replaced by another of the same name; logs what it cannot do.
async fn delete_node(nodes: &Api<Node>, node: &Node) {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: node.metadata.uid.clone(), resource_version: None }),
        ..Default::default()
    };
    match nodes.delete(name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => tracing::warn!(node = name, error = %e, "could not delete the node of a cancelled launch"),
    }
}

/// Creates `node`, retrying transient failures while the creation is not cancelled. A Node of the same
/// name created earlier for the same claim counts as created. Returns the Node, or `None` after logging.
async fn create_node(nodes: &Api<Node>, pending: &PendingMap, node: &Node) -> Option<Node> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let uid_of = |n: &Node| n.metadata.annotations.as_ref().and_then(|a| a.get(NODE_CLAIM_UID_ANNOTATION)).cloned();
    let mut wait = FIRST_RETRY;
    for attempt in 1..=CREATE_ATTEMPTS {
        let error = match nodes.create(&PostParams::default(), node).await {
            Ok(created) => return Some(created),
            Err(kube::Error::Api(s)) if s.code == 409 => match nodes.get_opt(name).await {
                Ok(Some(existing)) if uid_of(&existing) == uid_of(node) => return Some(existing),
                Ok(_) => {
                    tracing::warn!(node = name, "a node of that name exists for another claim; not created");
                    return None;
                }
                Err(e) => e,
            },
            Err(e) => e,
        };
        let cancelled = lock(pending).get(name).is_none_or(|p| p.cancelled);
        if !retryable(&error) || attempt == CREATE_ATTEMPTS || cancelled {
            tracing::warn!(node = name, attempt, error = %error, "could not create the node");
            return None;
        }
        tracing::debug!(node = name, attempt, error = %error, "creating the node failed; retrying");
        tokio::time::sleep(wait).await;
        wait *= 2;
    }
    None
}

/// Creates `node` after `delay` unless the creation is cancelled first, then forgets the pending entry;
/// a Node whose creation was cancelled while its create call was under way is deleted.
async fn register_after(nodes: Api<Node>, pending: PendingMap, node: Node, delay: Duration, wake: Arc<Notify>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    if !delay.is_zero() {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = wake.notified() => {}
        }
    }
    if lock(&pending).get(&name).is_none_or(|p| p.cancelled) {
        lock(&pending).remove(&name);
        return;
    }
    let created = create_node(&nodes, &pending, &node).await;
    let cancelled = lock(&pending).get(&name).is_none_or(|p| p.cancelled);
    if let Some(created) = created {
        if cancelled {
            delete_node(&nodes, &created).await;
        } else {
            tracing::debug!(node = %name, "created the node");
        }
    }
    lock(&pending).remove(&name);
}

#[async_trait]
impl CloudProvider for KwokProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn descriptor(&self) -> ProviderDescriptor {
        let own: BTreeSet<&str> = self
            .instance_types
            .iter()
            .flat_map(|t| t.labels.keys().map(String::as_str))
            .filter(|k| !labels::is_well_known(k))
            .collect();
        ProviderDescriptor {
            node_classes: vec![NodeClassKind::new(GROUP, KIND)],
            well_known_labels: own.into_iter().map(str::to_owned).collect(),
        }
    }

    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        let r = pool.spec.template.spec.node_class_ref.as_ref();
        self.check_class(r, &format!("NodePool/{}", pool.name()))?;
        Ok(self.instance_types.clone())
    }

    /// After a restart: a claim launched on this cluster but not yet registered whose Node does not
    /// exist was still waiting out its registration delay when the last process stopped; its Node is
    /// created now, so the claim does not wait for its registration timeout. (A registered claim whose
    /// Node is gone is gone, and left to the core.)
    async fn adopt(&self, claims: &[NodeClaim]) -> Result<(), CloudError> {
        for claim in claims {
            let Some(pid) = claim.provider_id() else { continue };
            let Some(name) = self.node_name_of(pid) else { continue };
            let registered = claim.is_true(tenon_core::api::condition_types::REGISTERED);
            if registered || claim.metadata.deletion_timestamp.is_some() || lock(&self.pending).contains_key(name) {
                continue;
            }
            match self.nodes.get_opt(name).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(api_error(e, &format!("Node/{name}"))),
            }
            let offering = claim.label(labels::INSTANCE_TYPE).and_then(|t| {
                let it = self.instance_types.iter().find(|x| x.name == t)?;
                let zone = claim.label(labels::ZONE)?;
                let ct = claim.label(labels::CAPACITY_TYPE).and_then(CapacityType::parse)?;
                Some((it, it.offerings.iter().find(|o| o.zone == zone && o.capacity_type == ct)?))
            });
            let Some((it, offering)) = offering else { continue };
            let launched = claim
                .condition(tenon_core::api::condition_types::LAUNCHED)
                .and_then(|c| c.last_transition_time)
                .unwrap_or_else(Timestamp::now);
            let node = self.node_for(claim, it, offering, launched);
            match self.nodes.create(&PostParams::default(), &node).await {
                Ok(_) => tracing::info!(claim = claim.name(), "created the kwok node a restart interrupted"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(api_error(e, &format!("Node/{name}"))),
            }
        }
        Ok(())
    }

    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        let name = claim.name();
        if name.is_empty() {
            return Err(CloudError::Create {
                reason: "InvalidNodeClaim".into(),
                message: "the NodeClaim has no name".into(),
            });
        }
        self.check_class(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{name}"))?;
        let uid = claim.metadata.uid.as_deref();
        if let Some(instance) = self.pending_for(name, uid)? {
            return Ok(instance);
        }
        let reserved =
            self.instance_types.iter().flat_map(|t| &t.offerings).any(|o| o.capacity_type == CapacityType::Reserved);
        let in_use = if reserved { self.reservations_in_use().await? } else { HashMap::new() };
        let (it, offering) = self.choose(claim, options, &in_use)?;
        let node = self.node_for(claim, it, offering, Timestamp::now());
        let mut instance = self.instance_from_node(&node).ok_or_else(|| CloudError::Create {
            reason: "InvalidNode".into(),
            message: format!("Node/{name}: the node built for the claim is not a kwok node of this cluster"),
        })?;
        instance.state = InstanceState::Pending;

        // The API server validates the Node now (a dry run), so a Node it would refuse fails the launch
        // here rather than in the background; a Node of that name that already exists answers 409.
        let dry_run = PostParams { dry_run: true, ..Default::default() };
        match self.nodes.create(&dry_run, &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => return self.existing_for(claim).await,
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
                return Err(CloudError::Create {
                    reason: "InvalidNode".into(),
                    message: format!("Node/{name}: {}", s.message),
                });
            }
            Err(e) => return Err(api_error(e, &format!("Node/{name}"))),
        }

        let wake = Arc::new(Notify::new());
        {
            let mut pending = lock(&self.pending);
            if pending.contains_key(name) {
                // A concurrent create for the same name got here first.
                drop(pending);
                return self.pending_for(name, uid)?.ok_or_else(|| CloudError::Create {
                    reason: "NodeNameConflict".into(),
                    message: format!("Node/{name} is being created concurrently"),
                });
            }
            pending.insert(
                name.to_owned(),
                Pending {
                    instance: instance.clone(),
                    claim_uid: uid.map(str::to_owned),
                    cancelled: false,
                    wake: wake.clone(),
                },
            );
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            lock(&self.pending).remove(name);
            CloudError::Create { reason: "NoRuntime".into(), message: format!("Node/{name}: {e}") }
        })?;
        runtime.spawn(register_after(
            self.nodes.clone(),
            self.pending.clone(),
            node,
            self.settings.registration_delay,
            wake,
        ));
        tracing::debug!(claim = name, provider_id = %instance.provider_id, "launching a kwok node");
        Ok(instance)
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let name = match claim.provider_id() {
            Some(pid) => self.node_name_of(pid).ok_or_else(|| CloudError::NotFound(pid.to_owned()))?,
            None if claim.name().is_empty() => return Err(CloudError::NotFound("a NodeClaim without a name".into())),
            None => claim.name(),
        };
        let what = format!("Node/{name}");
        {
            let mut pending = lock(&self.pending);
            if let Some(p) = pending.get_mut(name) {
                let same_pid = claim.provider_id().is_none_or(|pid| pid == p.instance.provider_id);
                let same_uid = match (claim.metadata.uid.as_deref(), p.claim_uid.as_deref()) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                };
                if same_pid && same_uid {
                    p.cancelled = true;
                    p.wake.notify_one();
                    return Ok(());
                }
            }
        }
        let node = self.nodes.get_opt(name).await.map_err(|e| api_error(e, &what))?;
        let Some(node) = node.filter(|n| self.is_claims(n, claim)) else {
            return Err(CloudError::NotFound(what));
        };
        if node.metadata.deletion_timestamp.is_some() {
            return if terminated(&node) { Err(CloudError::NotFound(what)) } else { Ok(()) };
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions { uid: node.metadata.uid.clone(), resource_version: None }),
            ..Default::default()
        };
        match self.nodes.delete(name, &dp).await {
            Ok(_) => Ok(()),
            // 409: the precondition failed, so the Node of that UID is gone and another took its name.
            Err(kube::Error::Api(s)) if s.code == 409 => Err(CloudError::NotFound(what)),
            Err(e) => Err(api_error(e, &what)),
        }
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        let not_found = || CloudError::NotFound(provider_id.to_owned());
        let name = self.node_name_of(provider_id).ok_or_else(not_found)?;
        if let Some(p) = lock(&self.pending).get(name).filter(|p| p.instance.provider_id == provider_id) {
            let mut instance = p.instance.clone();
            if p.cancelled {
                instance.state = InstanceState::Stopping;
            }
            return Ok(instance);
        }
        let node = self.nodes.get_opt(name).await.map_err(|e| api_error(e, &format!("Node/{name}")))?;
        node.filter(|n| !terminated(n))
            .and_then(|n| self.instance_from_node(&n))
            .filter(|i| i.provider_id == provider_id)
            .ok_or_else(not_found)
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        // Pending creations are read before the Nodes: a creation that completes in between is then in
        // the Node list, since its entry is dropped only after its Node exists.
        let pending: Vec<Instance> = lock(&self.pending)
            .values()
            .map(|p| {
                let mut i = p.instance.clone();
                if p.cancelled {
                    i.state = InstanceState::Stopping;
                }
                i
            })
            .collect();
        let selector = format!("{CLUSTER_LABEL}={}", self.cluster());
        let nodes = self
            .nodes
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| api_error(e, &format!("Nodes with {selector}")))?;
        let mut instances: Vec<Instance> =
            nodes.items.iter().filter(|n| !terminated(n)).filter_map(|n| self.instance_from_node(n)).collect();
        let listed: HashSet<String> = instances.iter().map(|i| i.provider_id.clone()).collect();
        instances.extend(pending.into_iter().filter(|i| !listed.contains(&i.provider_id)));
        Ok(instances)
    }

    async fn is_drifted(&self, _claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        Ok(None)
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        Vec::new()
    }

    async fn reboot(&self, _claim: &NodeClaim) -> Result<(), CloudError> {
        Err(CloudError::Unsupported { provider: NAME.into(), operation: "reboot" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after_seconds: u32) -> kube::Error {
        let status = serde_json::json!({
            "status": "Failure", "code": code, "message": "refused", "reason": "Reason",
            "details": {"retryAfterSeconds": retry_after_seconds}
        });
        kube::Error::Api(Box::new(serde_json::from_value(status).unwrap()))
    }

    #[test]
    fn api_errors_are_classified_in_one_place() {
        assert!(matches!(api_error(status(404, 0), "Node/a"), CloudError::NotFound(w) if w == "Node/a"));
        assert!(matches!(api_error(status(401, 0), "Node/a"), CloudError::Unauthorized(_)));
        assert!(matches!(api_error(status(403, 0), "Node/a"), CloudError::Unauthorized(_)));
        assert!(matches!(
            api_error(status(429, 3), "Node/a"),
            CloudError::Throttled { retry_after: Some(d) } if d == Duration::from_secs(3)
        ));
        assert!(matches!(api_error(status(429, 0), "Node/a"), CloudError::Throttled { retry_after: None }));
        assert!(matches!(api_error(status(503, 1), "Node/a"), CloudError::Throttled { retry_after: Some(_) }));
        let other = api_error(status(500, 0), "Node/a");
        assert!(matches!(other, CloudError::Other { .. }), "{other}");
        assert!(other.to_string().contains("Node/a: refused (500 Reason)"), "{other}");
        assert!(retryable(&status(500, 0)) && retryable(&status(429, 0)) && !retryable(&status(422, 0)));
    }

    #[test]
    fn provider_ids_name_the_cluster_the_zone_and_the_node() {
        let pid = provider_id("blue", "us-east-1a", "n-1");
        assert_eq!(pid, "kwok://blue/us-east-1a/n-1");
        assert_eq!(node_name_in("blue", &pid), Some("n-1"));
        assert_eq!(node_name_in("green", &pid), None);
        assert_eq!(node_name_in("blue", "kwok://n-1"), None);
        assert_eq!(node_name_in("blue", "kwok://blue/us-east-1a/"), None);
        assert_eq!(node_name_in("blue", "aws:///us-east-1a/i-1"), None);
    }
}
