//! The GCP provider: Compute Engine through `google-cloud-compute-v1`.
//!
//! - Instance types come from `machineTypes.aggregatedList` for the region (the zones of each type are
//!   where it is listed, offered while `zones.list` says the zone is `UP`), priced from the bundled table ([`super::pricing`]).
//! - A launch is one `instances.insert` per claim, named `karpenter-<claim>` (as the community provider
//!   names them), tried on the cheapest compatible offerings in turn; its zone operation is polled and its
//!   `error.errors[].code` classified ([`super::errors`]). `bulkInsert` with an
//!   `instanceFlexibilityPolicy` would try several machine types in one call, but Compute Engine then
//!   ranks them by obtainability rather than by price, and reports its errors per request rather than per
//!   machine type and zone: one insert per offering keeps tenon's cheapest-first choice and tells exactly
//!   which offering has no capacity.
//! - Instances carry ownership labels (`goog-k8s-cluster-name`, `karpenter-sh-nodepool`,
//!   `karpenter-sh-nodeclaim`, `karpenter-k8s-gcp-gcenodeclass`); only those are listed, read or deleted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use google_cloud_compute_v1::client::{
    AcceleratorTypes, Images, Instances, MachineTypes, RegionInstanceTemplates, ZoneOperations, Zones,
};
use google_cloud_compute_v1::model;
use google_cloud_gax::paginator::Paginator;
use jiff::Timestamp;
use tenon_core::api::{NodeClaim, NodeClassRef, NodePool, labels};
use tenon_core::clock::{self, SharedClock, SystemClock};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DriftReason, Instance, InstanceState, InstanceType, Interruption,
    InterruptionKind, LaunchOptions, NodeClassKind, Offering, OfferingKey, ProviderDescriptor, RepairPolicy,
    UnavailableOfferings, default_repair_policies,
};
use tenon_core::resources::Resources;

use super::bootstrap::{self, NodeFacts, NodePoolTemplate};
use super::catalog::{self, MachineShape, NodeShape};
use super::errors::{InsertFault, client_error, insert_fault, quota_limits};
use super::images::KubernetesVersion;
use super::nodeclass::{self, GCENodeClass, GCENodeClassStatus, ResolvedImage};
use super::pricing::{self, Price};
use crate::kubelet::Kubelet;

/// The provider's name.
pub const NAME: &str = "gcp";
/// Label: the cluster an instance belongs to.
pub const LABEL_CLUSTER: &str = "goog-k8s-cluster-name";
/// Label: the cluster's location.
pub const LABEL_LOCATION: &str = "goog-k8s-cluster-location";
/// Label: the NodePool an instance was launched for.
pub const LABEL_NODE_POOL: &str = "karpenter-sh-nodepool";
/// Label: the NodeClaim an instance was launched for.
pub const LABEL_NODE_CLAIM: &str = "karpenter-sh-nodeclaim";
/// Label: the GCENodeClass an instance was launched from.
pub const LABEL_NODE_CLASS: &str = "karpenter-k8s-gcp-gcenodeclass";
/// Label: the class's static hash at launch.
pub const LABEL_HASH: &str = "karpenter-k8s-gcp-gcenodeclass-hash";

/// How the GCP provider reaches Compute Engine and what it launches into.
#[derive(Debug, Clone, PartialEq)]
pub struct GcpSettings {
    /// The project instances run in.
    pub project: String,
    /// The region (`us-central1`).
    pub region: String,
    /// The cluster's name: instances carry it in `goog-k8s-cluster-name`, and only those are managed.
    pub cluster_name: String,
    /// The cluster's location (a region or a zone), in `goog-k8s-cluster-location`.
    pub cluster_location: String,
    /// An endpoint instead of `https://compute.googleapis.com` (a fake, a private endpoint).
    pub endpoint: Option<String>,
    /// The network when the class names none (`projects/<p>/global/networks/<n>`).
    pub network: Option<String>,
    /// The subnetwork when the class names none.
    pub subnetwork: Option<String>,
    /// The service account when the class names none; unset, the project's Compute Engine default.
    pub service_account: Option<String>,
    /// How long machine types are kept.
    pub machine_types_ttl: Duration,
    /// How long an offering without capacity stays unavailable (30 min, as the community provider has it).
    pub unavailable_ttl: Duration,
    /// How long an offering whose subnetwork ran out of addresses stays unavailable.
    pub ip_space_ttl: Duration,
    /// How long a used-up quota blocks what it limits.
    pub quota_ttl: Duration,
    /// How often a zone operation is polled.
    pub operation_poll: Duration,
    /// How long an insert's operation may take before the launch gives up on it.
    pub operation_timeout: Duration,
    /// At most this many offerings one launch tries.
    pub max_attempts: usize,
    /// The share of memory the hypervisor keeps.
    pub vm_memory_overhead: f64,
    /// Nodes join GKE with the bootstrap of one of its node pools ([`super::bootstrap`]); off, instances get
    /// the class's metadata only (Kubernetes of one's own on Compute Engine).
    pub gke_bootstrap: bool,
    /// The node pool whose instance template the bootstrap comes from; unset, `default-pool` if the
    /// cluster has it, else its first pool by template name.
    pub node_pool_template: Option<String>,
    /// A `region,machine_type,on_demand_usd_per_hour,spot_usd_per_hour` CSV laid over the bundled prices
    /// (rows named after an accelerator type price attached GPUs); re-read every `price_refresh`.
    pub price_file: Option<std::path::PathBuf>,
    /// How often `price_file` is read again.
    pub price_refresh: Duration,
}

impl GcpSettings {
    /// Defaults for a cluster in `project` and `region`.
    pub fn new(project: impl Into<String>, region: impl Into<String>, cluster_name: impl Into<String>) -> Self {
        let region = region.into();
        Self {
            project: project.into(),
            cluster_location: region.clone(),
            region,
            cluster_name: cluster_name.into(),
            endpoint: None,
            network: None,
            subnetwork: None,
            service_account: None,
            machine_types_ttl: Duration::from_secs(12 * 3600),
            unavailable_ttl: Duration::from_secs(30 * 60),
            ip_space_ttl: Duration::from_secs(30),
            quota_ttl: Duration::from_secs(3600),
            operation_poll: Duration::from_secs(1),
            operation_timeout: Duration::from_secs(120),
            max_attempts: 3,
            vm_memory_overhead: 0.0,
            gke_bootstrap: true,
            node_pool_template: None,
            price_file: None,
            price_refresh: Duration::from_secs(12 * 3600),
        }
    }
}

#[derive(Debug, Clone)]
struct Cached<T> {
    at: Timestamp,
    value: Arc<T>,
}

/// A machine type and the zones of the region it is listed in.
type Listed = (MachineShape, BTreeSet<String>);

#[derive(Debug, Default)]
struct State {
    classes: crate::classes::ClassStore<GCENodeClass, GCENodeClassStatus>,
    machine_types: Option<Cached<Vec<Listed>>>,
    /// The region's zones whose status is `UP` (`zones.list`).
    zones_up: Option<Cached<BTreeSet<String>>>,
    prices: Option<Cached<HashMap<String, Price>>>,
    /// Quota metrics used up, until when.
    quota: HashMap<String, Timestamp>,
    unavailable: Option<Arc<UnavailableOfferings>>,
    /// Spot instances already reported preempted.
    preempted: BTreeSet<String>,
    /// Host maintenance already reported, as `<provider id>@<window start>`.
    maintenance: BTreeSet<String>,
    /// The node pool template the bootstrap comes from.
    template: Option<Cached<NodePoolTemplate>>,
    /// The cluster's Kubernetes version, which family and alias image terms follow.
    kubernetes_version: Option<KubernetesVersion>,
}

/// The GCP provider.
pub struct GcpProvider {
    settings: GcpSettings,
    instances: Instances,
    machine_types: MachineTypes,
    accelerator_types: AcceleratorTypes,
    zones: Zones,
    operations: ZoneOperations,
    pub(super) images: Images,
    templates: RegionInstanceTemplates,
    /// GKE's API: the release channels' versions, for image terms that follow a channel.
    pub(super) gke: google_cloud_container_v1::client::ClusterManager,
    clock: SharedClock,
    state: Mutex<State>,
}

impl fmt::Debug for GcpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcpProvider").field("settings", &self.settings).finish()
    }
}

/// `gce://<project>/<zone>/<name>`.
pub fn provider_id(project: &str, zone: &str, name: &str) -> String {
    format!("gce://{project}/{zone}/{name}")
}

/// The (project, zone, name) of `gce://<project>/<zone>/<name>`; `NotFound` for anything else.
pub fn parse_provider_id(id: &str) -> Result<(&str, &str, &str), CloudError> {
    let parts: Vec<&str> = id.strip_prefix("gce://").map(|r| r.split('/').collect()).unwrap_or_default();
    match parts[..] {
        [p, z, n] if !p.is_empty() && !z.is_empty() && !n.is_empty() => Ok((p, z, n)),
        _ => Err(CloudError::NotFound(format!("{id:?} is not a GCE provider id (gce://<project>/<zone>/<name>)"))),
    }
}

/// The region of a location: a zone's (`us-central1-a` → `us-central1`), or the region itself.
pub fn region_of(location: &str) -> String {
    match location.rsplit_once('-') {
        Some((region, zone)) if zone.len() == 1 && zone.bytes().all(|b| b.is_ascii_lowercase()) => region.to_owned(),
        _ => location.to_owned(),
    }
}

/// The last segment of a resource URL (`…/zones/us-central1-a` → `us-central1-a`).
fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// A label value Compute Engine accepts: lower case, digits, `-` and `_`, at most 63 characters.
pub fn label_value(v: &str) -> String {
    let mut out: String = v
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c.to_ascii_lowercase() } else { '-' })
        .collect();
    out.truncate(63);
    out
}

impl GcpProvider {
    /// A provider whose clients use `credentials`, or Application Default Credentials (workload
    /// identity, the metadata server, `GOOGLE_APPLICATION_CREDENTIALS`) when `None`.
    pub async fn new(
        settings: GcpSettings,
        credentials: Option<google_cloud_auth::credentials::Credentials>,
    ) -> Result<Self, CloudError> {
        macro_rules! client {
            ($t:ty) => {{
                let mut b = <$t>::builder();
                if let Some(e) = &settings.endpoint {
                    b = b.with_endpoint(e.clone());
                }
                if let Some(c) = &credentials {
                    b = b.with_credentials(c.clone());
                }
                b.build().await.map_err(|e| CloudError::message(NAME, format!("the Compute Engine client: {e}")))?
            }};
        }
        Ok(Self {
            instances: client!(Instances),
            machine_types: client!(MachineTypes),
            accelerator_types: client!(AcceleratorTypes),
            zones: client!(Zones),
            operations: client!(ZoneOperations),
            images: client!(Images),
            templates: client!(RegionInstanceTemplates),
            gke: client!(google_cloud_container_v1::client::ClusterManager),
            settings,
            clock: Arc::new(SystemClock),
            state: Mutex::new(State::default()),
        })
    }

    /// Uses `clock` for every cache timestamp (a virtual clock in tests).
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Shares the core's unavailable-offerings cache.
    pub fn with_unavailable_offerings(self, cache: Arc<UnavailableOfferings>) -> Self {
        self.state().unavailable = Some(cache);
        self
    }

    /// The settings.
    pub fn settings(&self) -> &GcpSettings {
        &self.settings
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Adds or replaces a `GCENodeClass`; a changed spec is resolved afresh on its next use.
    pub fn apply_node_class(&self, class: GCENodeClass) -> Result<(), CloudError> {
        class.validate().map_err(CloudError::NodeClassNotReady)?;
        let name = class.name().to_owned();
        self.state().classes.apply(name, class, |old, new| old.spec == new.spec);
        Ok(())
    }

    /// Sets the cluster's Kubernetes version (as the API server reports it: `v1.33.5-gke.1080000`), which
    /// image families and aliases follow; a changed version resolves every class afresh. A version that
    /// does not read is refused, naming it.
    pub fn set_kubernetes_version(&self, version: &str) -> Result<(), CloudError> {
        let v = KubernetesVersion::parse(version).ok_or_else(|| {
            CloudError::message(NAME, format!("the cluster's version {version:?} is not major.minor.patch"))
        })?;
        let mut state = self.state();
        if state.kubernetes_version.as_ref() != Some(&v) {
            state.kubernetes_version = Some(v);
            state.classes.expire_all();
        }
        Ok(())
    }

    pub(super) fn known_kubernetes_version(&self) -> Option<KubernetesVersion> {
        self.state().kubernetes_version.clone()
    }

    /// Forgets a `GCENodeClass`.
    pub fn forget_node_class(&self, name: &str) {
        self.state().classes.forget(name);
    }

    fn class_name<'a>(&self, r: Option<&'a NodeClassRef>, object: &str) -> Result<&'a str, CloudError> {
        crate::classes::referenced(r, nodeclass::GROUP, nodeclass::KIND, object)
    }

    /// The class `name` and what its image terms resolve to (kept for five minutes).
    pub async fn resolve_node_class(
        &self,
        name: &str,
    ) -> Result<(Arc<GCENodeClass>, Arc<GCENodeClassStatus>), CloudError> {
        let class = self
            .state()
            .classes
            .get(name)
            .ok_or_else(|| CloudError::NodeClassNotReady(format!("GCENodeClass/{name} is not known")))?;
        let now = self.now();
        if let Some(status) = self.state().classes.fresh(name, now, Duration::from_secs(300)) {
            return Ok((class, status));
        }
        let images = self.resolve_images(&class).await?;
        let status = Arc::new(GCENodeClassStatus { images, ..Default::default() });
        self.state().classes.remember(name, now, status.clone());
        Ok((class, status))
    }

    /// The region's machine types and their zones (kept for `machine_types_ttl`; a refresh that fails
    /// keeps the last read).
    async fn listed_machine_types(&self) -> Result<Arc<Vec<Listed>>, CloudError> {
        let now = self.now();
        if let Some(c) = &self.state().machine_types
            && clock::since(now, c.at) < self.settings.machine_types_ttl
        {
            return Ok(c.value.clone());
        }
        let prefix = format!("zones/{}-", self.settings.region);
        let mut by_name: BTreeMap<String, Listed> = BTreeMap::new();
        let mut pages = self
            .machine_types
            .aggregated_list()
            .set_project(&self.settings.project)
            .set_filter(format!("zone eq .*{}-.*", self.settings.region))
            .by_page();
        while let Some(page) = pages.next().await {
            let page = match page {
                Ok(p) => p,
                Err(e) => {
                    let e = client_error("machineTypes.aggregatedList", &e);
                    return match self.state().machine_types.as_ref() {
                        Some(last) => {
                            tracing::warn!(error = %e, "keeping the machine types last read");
                            Ok(last.value.clone())
                        }
                        None => Err(e),
                    };
                }
            };
            for (scope, list) in &page.items {
                let Some(zone) = scope.strip_prefix("zones/").filter(|_| scope.starts_with(&prefix)) else { continue };
                for mt in &list.machine_types {
                    match shape_of(mt) {
                        Ok(shape) => {
                            by_name
                                .entry(shape.name.clone())
                                .or_insert_with(|| (shape, BTreeSet::new()))
                                .1
                                .insert(zone.to_owned());
                        }
                        Err(e) => tracing::warn!(error = %e, "dropping a machine type described incompletely"),
                    }
                }
            }
        }
        // N1 machines with GPUs attached, in the zones that have both the machine and the GPU.
        let gpus = match self.attachable_gpus().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "no GPUs attached to N1 machines until acceleratorTypes can be read");
                BTreeMap::new()
            }
        };
        let mut attached = Vec::new();
        for (base, zones) in by_name.values() {
            for gpu in &catalog::ATTACHABLE {
                let Some(in_zones) = gpus.get(gpu.model) else { continue };
                for (zone, max_cards) in in_zones.iter().filter(|(z, _)| zones.contains(*z)) {
                    for shape in catalog::attached_shapes(base, gpu, *max_cards) {
                        attached.push((shape, zone.clone()));
                    }
                }
            }
        }
        for (shape, zone) in attached {
            by_name.entry(shape.name.clone()).or_insert_with(|| (shape, BTreeSet::new())).1.insert(zone);
        }
        let value = Arc::new(by_name.into_values().collect::<Vec<_>>());
        self.state().machine_types = Some(Cached { at: now, value: value.clone() });
        Ok(value)
    }

    /// The network and subnetwork `class`'s instances get: the class's, else the settings', else (with
    /// the GKE bootstrap) the node pool template's; unset, Compute Engine's default.
    pub(super) fn network_of(
        &self,
        class: &GCENodeClass,
        template: Option<&NodePoolTemplate>,
    ) -> (Option<String>, Option<String>) {
        let n = class.spec.network_config.as_ref();
        let network = n.and_then(|n| n.network.clone()).or_else(|| self.settings.network.clone());
        let subnetwork = n.and_then(|n| n.subnetwork.clone()).or_else(|| self.settings.subnetwork.clone());
        (
            network.or_else(|| template.and_then(|t| t.network.clone())),
            subnetwork.or_else(|| template.and_then(|t| t.subnetwork.clone())),
        )
    }

    /// [`Self::network_of`], the node pool template read when the GKE bootstrap is on (a cluster
    /// without one is `NodeClassNotReady`, naming it).
    pub(super) async fn resolve_network(
        &self,
        class: &GCENodeClass,
    ) -> Result<(Option<String>, Option<String>), CloudError> {
        let template = if self.settings.gke_bootstrap { Some(self.node_pool_template().await?) } else { None };
        Ok(self.network_of(class, template.as_deref()))
    }

    /// The region's zones that are `UP` (`zones.list`, kept for five minutes so a zone that goes down
    /// stops being offered soon). A read that fails keeps the last one; with none yet, `None`: every
    /// listed zone is offered, and launches there answer for themselves.
    async fn zones_up(&self) -> Option<Arc<BTreeSet<String>>> {
        let now = self.now();
        if let Some(c) = &self.state().zones_up
            && clock::since(now, c.at) < Duration::from_secs(300)
        {
            return Some(c.value.clone());
        }
        let mut up = BTreeSet::new();
        let mut pages = self
            .zones
            .list()
            .set_project(&self.settings.project)
            .set_filter(format!("name eq {}-.*", self.settings.region))
            .by_page();
        while let Some(page) = pages.next().await {
            match page {
                Ok(page) => up.extend(
                    page.items
                        .into_iter()
                        .filter(|z| z.status == Some(model::zone::Status::Up))
                        .filter_map(|z| z.name)
                        .filter(|n| region_of(n) == self.settings.region),
                ),
                Err(e) => {
                    let e = client_error("zones.list", &e);
                    let last = self.state().zones_up.as_ref().map(|c| c.value.clone());
                    tracing::warn!(error = %e, "zones.list failed; {}", if last.is_some() { "keeping the zones last read" } else { "offering every listed zone" });
                    return last;
                }
            }
        }
        let value = Arc::new(up);
        self.state().zones_up = Some(Cached { at: now, value: value.clone() });
        Some(value)
    }

    /// The region's attachable GPUs (`acceleratorTypes.aggregatedList`): by accelerator type, each zone
    /// that has it and its `maximumCardsPerInstance`.
    async fn attachable_gpus(&self) -> Result<BTreeMap<String, BTreeMap<String, i64>>, CloudError> {
        let prefix = format!("zones/{}-", self.settings.region);
        let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        let mut pages = self
            .accelerator_types
            .aggregated_list()
            .set_project(&self.settings.project)
            .set_filter(format!("zone eq .*{}-.*", self.settings.region))
            .by_page();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| client_error("acceleratorTypes.aggregatedList", &e))?;
            for (scope, list) in &page.items {
                let Some(zone) = scope.strip_prefix("zones/").filter(|_| scope.starts_with(&prefix)) else { continue };
                for a in &list.accelerator_types {
                    let (Some(name), Some(max)) = (&a.name, a.maximum_cards_per_instance) else { continue };
                    if catalog::ATTACHABLE.iter().any(|g| g.model == name) {
                        out.entry(name.clone()).or_default().insert(zone.to_owned(), i64::from(max));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The node pool template nodes join the cluster with (kept for twelve minutes, as GKE rolls them on
    /// upgrades); `NodeClassNotReady` naming the cluster when it has none.
    async fn node_pool_template(&self) -> Result<Arc<NodePoolTemplate>, CloudError> {
        let now = self.now();
        if let Some(c) = &self.state().template
            && clock::since(now, c.at) < Duration::from_secs(12 * 60)
        {
            return Ok(c.value.clone());
        }
        let mut found: Vec<(Option<String>, NodePoolTemplate)> = Vec::new();
        let mut pages =
            self.templates.list().set_project(&self.settings.project).set_region(&self.settings.region).by_page();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| client_error("regionInstanceTemplates.list", &e))?;
            for t in &page.items {
                if let Some(tpl) = NodePoolTemplate::of(t, &self.settings.cluster_name) {
                    let pool = t.properties.as_ref().and_then(|p| p.labels.get("goog-k8s-node-pool-name").cloned());
                    found.push((pool, tpl));
                }
            }
        }
        found.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        let wanted = self.settings.node_pool_template.as_deref();
        let pick = match wanted {
            Some(pool) => found.into_iter().find(|(p, _)| p.as_deref() == Some(pool)),
            None => {
                let default = found.iter().position(|(p, _)| p.as_deref() == Some("default-pool")).unwrap_or(0);
                found.into_iter().nth(default)
            }
        };
        let Some((_, tpl)) = pick else {
            return Err(CloudError::NodeClassNotReady(format!(
                "no instance template of a node pool{} of GKE cluster {} in {} to take the node bootstrap from",
                wanted.map(|p| format!(" named {p}")).unwrap_or_default(),
                self.settings.cluster_name,
                self.settings.region
            )));
        };
        let value = Arc::new(tpl);
        self.state().template = Some(Cached { at: now, value: value.clone() });
        Ok(value)
    }

    /// The region's prices: the bundled table with `price_file` laid over it (read again every
    /// `price_refresh`; a file that cannot be read keeps the prices last read, and is an error naming
    /// it only before any were).
    fn prices(&self) -> Result<Arc<HashMap<String, Price>>, CloudError> {
        let now = self.now();
        let last = self.state().prices.clone();
        if let Some(c) = &last
            && (self.settings.price_file.is_none() || clock::since(now, c.at) < self.settings.price_refresh)
        {
            return Ok(c.value.clone());
        }
        let read = || -> Result<HashMap<String, Price>, String> {
            let mut p = pricing::parse_prices(pricing::BUNDLED_PRICES_CSV, &self.settings.region)?;
            if let Some(path) = &self.settings.price_file {
                let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
                p.extend(
                    pricing::parse_prices(&text, &self.settings.region)
                        .map_err(|e| format!("{}: {e}", path.display()))?,
                );
            }
            Ok(p)
        };
        match read() {
            Ok(p) => {
                let value = Arc::new(p);
                self.state().prices = Some(Cached { at: now, value: value.clone() });
                Ok(value)
            }
            Err(e) => match last {
                Some(c) => {
                    tracing::warn!(error = %e, "keeping the prices last read");
                    self.state().prices = Some(Cached { at: now, value: c.value.clone() });
                    Ok(c.value)
                }
                None => Err(CloudError::message(NAME, format!("reading prices: {e}"))),
            },
        }
    }

    /// Drops expired quota blocks and returns the metrics blocked now.
    fn live_quota(&self) -> Vec<String> {
        let now = self.now();
        let mut st = self.state();
        st.quota.retain(|_, until| *until > now);
        st.quota.keys().cloned().collect()
    }

    /// Every instance type for a resolved class: machine types its images boot, offered on-demand and
    /// spot in every zone they are listed in, priced from the table.
    async fn types_for(
        &self,
        class: &GCENodeClass,
        status: &GCENodeClassStatus,
    ) -> Result<Vec<InstanceType>, CloudError> {
        self.types_named(class, status, None).await
    }

    /// [`Self::types_for`], of machine type `only` alone when given (reading one instance needs no more).
    async fn types_named(
        &self,
        class: &GCENodeClass,
        status: &GCENodeClassStatus,
        only: Option<&str>,
    ) -> Result<Vec<InstanceType>, CloudError> {
        let listed = self.listed_machine_types().await?;
        let prices = self.prices()?;
        let kubelet = Kubelet::parse_at(class.spec.kubelet_configuration.as_ref(), "spec.kubeletConfiguration")
            .map_err(|e| CloudError::NodeClassNotReady(format!("GCENodeClass/{}: {e}", class.name())))?;
        let node = NodeShape {
            boot_disk_gib: class.boot_disk_gib(),
            local_ssd_gib: class.local_ssd_gib(),
            kubelet,
            vm_memory_overhead: self.settings.vm_memory_overhead,
        };
        let quota = self.live_quota();
        let up = self.zones_up().await;
        let mut out = Vec::with_capacity(listed.len());
        for (shape, zones) in listed.iter().filter(|(s, _)| only.is_none_or(|o| s.name == o)) {
            let price = pricing::price_of(&prices, &shape.name);
            let gpu = shape.accelerators.first().map(|(m, _)| m.as_str());
            let mut offerings = Vec::new();
            for zone in zones {
                for ct in [CapacityType::Spot, CapacityType::OnDemand] {
                    let p = match ct {
                        CapacityType::Spot => price.and_then(|p| p.spot),
                        _ => price.map(|p| p.on_demand),
                    };
                    let blocked = quota.iter().any(|m| quota_limits(m, &shape.name, gpu, ct == CapacityType::Spot));
                    let mut o = Offering::new(zone.clone(), ct, p.unwrap_or(0.0));
                    // A zone that is not UP is still described (its nodes keep their price) but not offered.
                    o.available = p.is_some() && !blocked && up.as_ref().is_none_or(|u| u.contains(zone));
                    offerings.push(o);
                }
            }
            let mut it = catalog::instance_type(shape, &node, offerings);
            // Only what one of the class's images boots (its architecture; GPUs or not).
            if boot_image(status, &it).is_none() {
                continue;
            }
            it.labels.insert(labels::REGION.to_owned(), self.settings.region.clone());
            out.push(it);
        }
        Ok(out)
    }

    fn mark_unavailable(&self, key: &OfferingKey, ttl: Duration) {
        let cache = self.state().unavailable.clone();
        if let Some(c) = cache {
            c.mark(NAME, key, ttl, self.now());
        }
    }

    /// The instance `name` in `zone`, if it is this cluster's.
    async fn owned_instance(&self, zone: &str, name: &str) -> Result<model::Instance, CloudError> {
        let found = self
            .instances
            .get()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_instance(name)
            .send()
            .await
            .map_err(|e| client_error(&format!("instances.get {zone}/{name}"), &e))?;
        if !self.owned(&found) {
            return Err(CloudError::NotFound(format!(
                "instance {zone}/{name} (not owned by cluster {})",
                self.settings.cluster_name
            )));
        }
        Ok(found)
    }

    fn owned(&self, i: &model::Instance) -> bool {
        i.labels.get(LABEL_CLUSTER).is_some_and(|c| *c == label_value(&self.settings.cluster_name))
            && i.labels.contains_key(LABEL_NODE_POOL)
    }

    /// This cluster's instances in the region.
    async fn owned_instances(&self) -> Result<Vec<model::Instance>, CloudError> {
        let mut out = Vec::new();
        let filter = format!("labels.{LABEL_CLUSTER} = {}", label_value(&self.settings.cluster_name));
        let mut pages =
            self.instances.aggregated_list().set_project(&self.settings.project).set_filter(filter).by_page();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| client_error("instances.aggregatedList", &e))?;
            let prefix = format!("zones/{}-", self.settings.region);
            for (scope, list) in &page.items {
                if scope.starts_with(&prefix) {
                    out.extend(list.instances.iter().filter(|i| self.owned(i)).cloned());
                }
            }
        }
        Ok(out)
    }

    /// The core's view of an instance.
    fn to_instance(&self, i: &model::Instance, types: Option<&[InstanceType]>) -> Result<Instance, CloudError> {
        let name = i.name.clone().ok_or_else(|| CloudError::message(NAME, "an instance has no name"))?;
        let zone = i
            .zone
            .as_deref()
            .map(last_segment)
            .ok_or_else(|| CloudError::message(NAME, format!("instance {name}: no zone")))?
            .to_owned();
        let machine =
            instance_type_of(i).ok_or_else(|| CloudError::message(NAME, format!("instance {name}: no machineType")))?;
        let capacity_type = if is_spot(i) { CapacityType::Spot } else { CapacityType::OnDemand };
        let state = instance_state(i);
        let it = types.and_then(|t| t.iter().find(|t| t.name == machine));
        let mut node_labels = it.map(|t| t.labels.clone()).unwrap_or_default();
        node_labels.insert(labels::INSTANCE_TYPE.to_owned(), machine.clone());
        node_labels.insert(labels::ZONE.to_owned(), zone.clone());
        node_labels.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
        node_labels.insert(labels::REGION.to_owned(), self.settings.region.clone());
        let price =
            it.and_then(|t| t.offering(&zone, capacity_type)).filter(|o| o.available || o.price > 0.0).map(|o| o.price);
        let launch_time =
            i.creation_timestamp.as_deref().and_then(|t| t.parse::<Timestamp>().ok()).unwrap_or_else(|| self.now());
        Ok(Instance {
            provider_id: provider_id(&self.settings.project, &zone, &name),
            instance_type: machine,
            zone,
            capacity_type,
            state,
            launch_time,
            capacity: it.map_or(Resources::ZERO, |t| t.capacity.clone()),
            allocatable: it.map(InstanceType::allocatable).unwrap_or(Resources::ZERO),
            image_id: None,
            labels: node_labels,
            lease: None,
            node_pool: i.labels.get(LABEL_NODE_POOL).cloned(),
            node_claim: i.labels.get(LABEL_NODE_CLAIM).cloned(),
            price,
        })
    }
}

/// The instance type of instance `i`: its machine type, with the GPUs attached to it if any
/// (`n1-standard-16.4xnvidia-tesla-t4`).
fn instance_type_of(i: &model::Instance) -> Option<String> {
    let machine = last_segment(i.machine_type.as_deref()?);
    let gpus: Vec<(i64, &str)> = i
        .guest_accelerators
        .iter()
        .filter_map(|a| Some((i64::from(a.accelerator_count?), last_segment(a.accelerator_type.as_deref()?))))
        .filter(|(n, _)| *n > 0)
        .collect();
    Some(match gpus[..] {
        [(count, model)] => catalog::attached_name(machine, count, model),
        _ => machine.to_owned(),
    })
}

/// The first of the class's images that boots `it` (its requirements met by the type's labels).
fn boot_image<'a>(status: &'a GCENodeClassStatus, it: &InstanceType) -> Option<&'a ResolvedImage> {
    status.images.iter().find(|i| i.requirements.iter().all(|r| r.matches(it.labels.get(&r.key).map(String::as_str))))
}

/// The labels a claim's node registers with: the claim's, its single-valued requirements on labels the
/// kubelet may set, and the capacity type.
fn node_labels(claim: &NodeClaim, capacity_type: CapacityType) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = claim.metadata.labels.clone().unwrap_or_default();
    for r in &claim.spec.requirements {
        let single = r.operator == tenon_core::api::Operator::In && r.values.len() == 1;
        if single && !labels::is_well_known(&r.key) && !labels::RESTRICTED_LABELS.contains(&r.key.as_str()) {
            out.entry(r.key.clone()).or_insert_with(|| r.values[0].clone());
        }
    }
    out.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
    out
}

/// Whether `i` is a spot instance.
fn is_spot(i: &model::Instance) -> bool {
    matches!(
        i.scheduling.as_ref().and_then(|s| s.provisioning_model.as_ref()),
        Some(model::scheduling::ProvisioningModel::Spot)
    )
}

/// The start of the host maintenance coming to `i` (pending or ongoing), when `i` is terminated rather
/// than live-migrated through it.
fn maintenance_without_migration(i: &model::Instance) -> Option<String> {
    use model::upcoming_maintenance::MaintenanceStatus;
    let terminates = matches!(
        i.scheduling.as_ref().and_then(|s| s.on_host_maintenance.as_ref()),
        Some(model::scheduling::OnHostMaintenance::Terminate)
    );
    let m = i.resource_status.as_ref()?.upcoming_maintenance.as_ref()?;
    let coming = matches!(m.maintenance_status, Some(MaintenanceStatus::Pending | MaintenanceStatus::Ongoing) | None);
    (terminates && coming).then(|| m.window_start_time.clone().unwrap_or_default())
}

/// The core's state of an instance's status.
fn instance_state(i: &model::Instance) -> InstanceState {
    use model::instance::Status;
    match i.status {
        Some(Status::Running) => InstanceState::Running,
        Some(Status::Terminated) => InstanceState::Terminated,
        Some(Status::Stopping | Status::Stopped | Status::Suspending | Status::Suspended) => InstanceState::Stopping,
        _ => InstanceState::Pending,
    }
}

/// A machine type of `machineTypes.aggregatedList`; an error for an entry missing what every entry has.
pub fn shape_of(mt: &model::MachineType) -> Result<MachineShape, String> {
    let name = mt.name.clone().ok_or("a machine type has no name")?;
    let vcpu = mt.guest_cpus.ok_or_else(|| format!("{name}: no guestCpus"))?;
    let memory = mt.memory_mb.ok_or_else(|| format!("{name}: no memoryMb"))?;
    Ok(MachineShape {
        vcpu: i64::from(vcpu),
        memory_mib: i64::from(memory),
        arm64: matches!(mt.architecture, Some(model::machine_type::Architecture::Arm64)),
        shared_cpu: mt.is_shared_cpu.unwrap_or(false),
        accelerators: mt
            .accelerators
            .iter()
            .filter_map(|a| Some((a.guest_accelerator_type.clone()?, i64::from(a.guest_accelerator_count?))))
            .filter(|(_, n)| *n > 0)
            .collect(),
        local_ssd_partitions: mt
            .bundled_local_ssds
            .as_ref()
            .and_then(|b| b.partition_count)
            .map(i64::from)
            .unwrap_or(0),
        name,
    })
}

#[async_trait]
impl CloudProvider for GcpProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn descriptor(&self) -> ProviderDescriptor {
        ProviderDescriptor {
            node_classes: vec![NodeClassKind::new(nodeclass::GROUP, nodeclass::KIND)],
            well_known_labels: catalog::WELL_KNOWN_LABELS.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        let name =
            self.class_name(pool.spec.template.spec.node_class_ref.as_ref(), &format!("NodePool/{}", pool.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        self.types_for(&class, &status).await
    }

    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        self.launch(claim, options).await
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id() else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        let (_, zone, name) = parse_provider_id(pid)?;
        let i = self.owned_instance(zone, name).await?;
        match i.status {
            Some(model::instance::Status::Terminated) => return Err(CloudError::NotFound(pid.to_owned())),
            // A delete is already under way.
            Some(model::instance::Status::Stopping) => return Ok(()),
            _ => {}
        }
        self.instances
            .delete()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_instance(name)
            .send()
            .await
            .map_err(|e| client_error(&format!("instances.delete {zone}/{name}"), &e))?;
        Ok(())
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        let (_, zone, name) = parse_provider_id(provider_id)?;
        let i = self.owned_instance(zone, name).await?;
        let class = i.labels.get(LABEL_NODE_CLASS).cloned();
        let machine = instance_type_of(&i);
        let types = self.types_of_class(class.as_deref(), machine.as_deref()).await;
        self.to_instance(&i, types.as_deref())
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let found = self.owned_instances().await?;
        let mut by_class: HashMap<Option<String>, Option<Vec<InstanceType>>> = HashMap::new();
        let mut out = Vec::with_capacity(found.len());
        for i in &found {
            let class = i.labels.get(LABEL_NODE_CLASS).cloned();
            if !by_class.contains_key(&class) {
                let types = self.types_of_class(class.as_deref(), None).await;
                by_class.insert(class.clone(), types);
            }
            out.push(self.to_instance(i, by_class[&class].as_deref())?);
        }
        Ok(out)
    }

    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        let Some(pid) = claim.provider_id() else { return Ok(None) };
        let name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        let (_, zone, instance) = parse_provider_id(pid)?;
        let i = self.owned_instance(zone, instance).await?;
        if i.labels.get(LABEL_HASH).is_some_and(|h| *h != label_value(&class.static_hash())) {
            return Ok(Some(DriftReason("NodeClassDrift".into())));
        }
        if let Some(image) = claim.status.as_ref().and_then(|s| s.image_id.as_deref())
            && !status.images.iter().any(|i| i.source_image == image)
        {
            return Ok(Some(DriftReason("ImageDrift".into())));
        }
        // The subnetwork new instances would get (the class's, the settings', the node pool's) is not this
        // one's: the settings or the cluster's node pool moved.
        let (_, want) = self.resolve_network(&class).await?;
        let have = i.network_interfaces.first().and_then(|n| n.subnetwork.as_deref());
        if let (Some(want), Some(have)) = (want, have)
            && last_segment(have) != last_segment(&want)
        {
            return Ok(Some(DriftReason("SubnetworkDrift".into())));
        }
        Ok(None)
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        default_repair_policies()
    }

    /// A hard reset (`instances.reset`), the repair by reboot.
    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id() else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        let (_, zone, name) = parse_provider_id(pid)?;
        self.owned_instance(zone, name).await?;
        self.instances
            .reset()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_instance(name)
            .send()
            .await
            .map_err(|e| client_error(&format!("instances.reset {zone}/{name}"), &e))?;
        Ok(())
    }

    /// Read from the instances' own state (`instances.aggregatedList`), each reported once:
    /// - a spot instance Compute Engine has preempted (stopping or terminated without tenon deleting it)
    ///   is a spot interruption;
    /// - host maintenance coming to an instance that cannot live-migrate (`onHostMaintenance: TERMINATE`:
    ///   GPU machines and spot ones), announced in `resourceStatus.upcomingMaintenance` as pending or
    ///   ongoing, is a scheduled change, so the node is drained and replaced before the host goes down.
    ///   Maintenance of an instance that live-migrates does not disrupt it and is not reported.
    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        let found = self.owned_instances().await?;
        let mut out = Vec::new();
        let mut st = self.state();
        for i in &found {
            let (Some(name), Some(zone)) = (i.name.as_deref(), i.zone.as_deref().map(last_segment)) else { continue };
            let gone =
                matches!(i.status, Some(model::instance::Status::Stopping | model::instance::Status::Terminated));
            if is_spot(i) && gone {
                let pid = provider_id(&self.settings.project, zone, name);
                if st.preempted.insert(pid.clone()) {
                    out.push(Interruption { provider_id: pid, kind: InterruptionKind::SpotInterruption });
                }
                continue;
            }
            if let Some(window) = maintenance_without_migration(i) {
                let pid = provider_id(&self.settings.project, zone, name);
                if st.maintenance.insert(format!("{pid}@{window}")) {
                    out.push(Interruption { provider_id: pid, kind: InterruptionKind::ScheduledChange });
                }
            }
        }
        Ok(out)
    }
}

impl GcpProvider {
    /// The instance types of class `name` (of machine type `only`, when given), when it is known and
    /// resolves.
    async fn types_of_class(&self, name: Option<&str>, only: Option<&str>) -> Option<Vec<InstanceType>> {
        let (class, status) = self.resolve_node_class(name?).await.ok()?;
        self.types_named(&class, &status, only).await.ok()
    }

    /// One launch: the cheapest compatible offerings tried in turn (at most `max_attempts`).
    async fn launch(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        let class_name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(class_name).await?;
        let name = format!("karpenter-{}", claim.name());
        // Idempotent per claim: an instance of that name is the claim's.
        if let Some(existing) = self.owned_instances().await?.into_iter().find(|i| i.name.as_deref() == Some(&name)) {
            let machine = instance_type_of(&existing);
            let types = self.types_named(&class, &status, machine.as_deref()).await?;
            return self.to_instance(&existing, Some(&types));
        }
        let types = self.types_for(&class, &status).await?;
        let requests = Resources::from_resource_list(&claim.spec.resources.requests).map_err(|e| {
            CloudError::Create { reason: "InvalidRequests".into(), message: format!("NodeClaim/{}: {e}", claim.name()) }
        })?;
        let mut candidates: Vec<(&InstanceType, &Offering)> = types
            .iter()
            .filter(|it| requests.fits(&it.allocatable()))
            .flat_map(|it| it.offerings.iter().map(move |o| (it, o)))
            .filter(|(it, o)| {
                o.available
                    && !options.is_unavailable(&o.key(&it.name))
                    && it.offering_meets(o, &claim.spec.requirements)
            })
            .collect();
        let capacity_type = if candidates.iter().any(|(_, o)| o.capacity_type == CapacityType::Spot) {
            CapacityType::Spot
        } else {
            CapacityType::OnDemand
        };
        candidates.retain(|(_, o)| o.capacity_type == capacity_type);
        candidates.sort_by(|a, b| {
            a.1.price.total_cmp(&b.1.price).then(a.0.name.cmp(&b.0.name)).then(a.1.zone.cmp(&b.1.zone))
        });
        if candidates.is_empty() {
            return Err(CloudError::InsufficientCapacity {
                offerings: Vec::new(),
                message: format!("NodeClaim/{}: no compatible available offering", claim.name()),
            });
        }
        let template = if self.settings.gke_bootstrap { Some(self.node_pool_template().await?) } else { None };
        let mut failed = Vec::new();
        for (it, o) in candidates.into_iter().take(self.settings.max_attempts.max(1)) {
            let image = boot_image(&status, it).ok_or_else(|| {
                CloudError::NodeClassNotReady(format!("GCENodeClass/{}: no image boots {}", class.name(), it.name))
            })?;
            let body = self.instance_body(&name, claim, &class, it, o, &image.source_image, template.as_deref())?;
            match self.insert(&o.zone, body).await? {
                None => {
                    let mut instance = Instance {
                        provider_id: provider_id(&self.settings.project, &o.zone, &name),
                        instance_type: it.name.clone(),
                        zone: o.zone.clone(),
                        capacity_type,
                        state: InstanceState::Pending,
                        launch_time: self.now(),
                        capacity: it.capacity.clone(),
                        allocatable: it.allocatable(),
                        image_id: Some(image.source_image.clone()),
                        labels: it.labels.clone(),
                        lease: None,
                        node_pool: claim.node_pool().map(str::to_owned),
                        node_claim: Some(claim.name().to_owned()),
                        price: Some(o.price),
                    };
                    instance.labels.insert(labels::INSTANCE_TYPE.to_owned(), it.name.clone());
                    instance.labels.insert(labels::ZONE.to_owned(), o.zone.clone());
                    instance.labels.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
                    tracing::info!(claim = claim.name(), instance = %name, machine_type = %it.name, zone = %o.zone, capacity_type = %capacity_type, "launched");
                    return Ok(instance);
                }
                Some(faults) => {
                    let key = o.key(&it.name);
                    let mut other = None;
                    for (fault, code, message) in faults {
                        match fault {
                            InsertFault::Capacity => self.mark_unavailable(&key, self.settings.unavailable_ttl),
                            InsertFault::IpSpace => self.mark_unavailable(&key, self.settings.ip_space_ttl),
                            InsertFault::Quota(metric) => {
                                let until = clock::add(self.now(), self.settings.quota_ttl);
                                self.state().quota.insert(metric, until);
                            }
                            InsertFault::Request => other = Some((code, message)),
                        }
                    }
                    if let Some((reason, message)) = other {
                        return Err(CloudError::Create {
                            reason,
                            message: format!("NodeClaim/{}: instances.insert: {message}", claim.name()),
                        });
                    }
                    failed.push(key);
                }
            }
        }
        Err(CloudError::InsufficientCapacity {
            message: format!(
                "NodeClaim/{}: no capacity in {}",
                claim.name(),
                failed.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
            offerings: failed,
        })
    }

    /// The `instances.insert` body of a claim's instance, joining the cluster with `template`'s bootstrap.
    #[allow(clippy::too_many_arguments)]
    fn instance_body(
        &self,
        name: &str,
        claim: &NodeClaim,
        class: &GCENodeClass,
        it: &InstanceType,
        o: &Offering,
        image: &str,
        template: Option<&NodePoolTemplate>,
    ) -> Result<model::Instance, CloudError> {
        let s = &class.spec;
        let spot = o.capacity_type == CapacityType::Spot;
        let mut labels: BTreeMap<String, String> = s.labels.iter().map(|(k, v)| (k.clone(), label_value(v))).collect();
        labels.insert(LABEL_CLUSTER.into(), label_value(&self.settings.cluster_name));
        labels.insert(LABEL_LOCATION.into(), label_value(&self.settings.cluster_location));
        labels.insert(LABEL_NODE_POOL.into(), label_value(claim.node_pool().unwrap_or_default()));
        labels.insert(LABEL_NODE_CLAIM.into(), label_value(claim.name()));
        labels.insert(LABEL_NODE_CLASS.into(), label_value(class.name()));
        labels.insert(LABEL_HASH.into(), label_value(&class.static_hash()));
        let boot_disk = s.disks.iter().find(|d| d.boot == Some(true));
        let mut disks = vec![
            model::AttachedDisk::new().set_boot(true).set_auto_delete(true).set_initialize_params(
                model::AttachedDiskInitializeParams::new()
                    .set_source_image(image)
                    .set_disk_size_gb(class.boot_disk_gib())
                    .set_disk_type(format!(
                        "zones/{}/diskTypes/{}",
                        o.zone,
                        boot_disk.and_then(|d| d.category.as_deref()).unwrap_or("pd-balanced")
                    )),
            ),
        ];
        for d in s.disks.iter().filter(|d| d.boot != Some(true)) {
            let category = d.category.as_deref().unwrap_or("pd-balanced");
            let mut disk = model::AttachedDisk::new().set_auto_delete(true).set_initialize_params(
                model::AttachedDiskInitializeParams::new()
                    .set_disk_size_gb(d.size_gib.unwrap_or(if category == "local-ssd" { 375 } else { 100 }))
                    .set_disk_type(format!("zones/{}/diskTypes/{category}", o.zone)),
            );
            if category == "local-ssd" {
                disk = disk
                    .set_type(model::attached_disk::Type::Scratch)
                    .set_interface(model::attached_disk::Interface::Nvme);
            }
            disks.push(disk);
        }
        let network = s.network_config.as_ref();
        let mut nic = model::NetworkInterface::new();
        let (net, subnet) = self.network_of(class, template);
        if let Some(n) = net {
            nic = nic.set_network(n);
        }
        if let Some(sn) = subnet {
            nic = nic.set_subnetwork(sn);
        }
        // Pod addresses: an alias range sized for the node's pods, from the pods' secondary range.
        let pods = it.capacity.get(tenon_core::resources::ResourceName::PODS);
        if let Some(range) = s.subnet_range_name.clone().or_else(|| template.and_then(|t| t.pod_range.clone())) {
            let prefix = match pods {
                ..=8 => 28,
                9..=16 => 27,
                17..=32 => 26,
                33..=64 => 25,
                65..=128 => 24,
                _ => 23,
            };
            nic = nic.set_alias_ip_ranges([model::AliasIpRange::new()
                .set_ip_cidr_range(format!("/{prefix}"))
                .set_subnetwork_range_name(range)]);
        }
        if !network.and_then(|n| n.enable_private_nodes).unwrap_or(true) {
            nic = nic.set_access_configs([model::AccessConfig::new().set_name("External NAT")]);
        }
        let mut nics = vec![nic];
        for extra in network.map(|n| n.additional_network_interfaces.as_slice()).unwrap_or_default() {
            let mut nic = model::NetworkInterface::new().set_subnetwork(extra.subnetwork.clone());
            if let Some(n) = &extra.network {
                nic = nic.set_network(n.clone());
            }
            nics.push(nic);
        }
        let mut scheduling = model::Scheduling::new();
        if spot {
            scheduling = scheduling
                .set_provisioning_model(model::scheduling::ProvisioningModel::Spot)
                .set_instance_termination_action(model::scheduling::InstanceTerminationAction::Delete)
                .set_preemptible(true)
                .set_automatic_restart(false)
                .set_on_host_maintenance(model::scheduling::OnHostMaintenance::Terminate);
        } else if it.labels.contains_key(catalog::LABEL_GPU_COUNT) {
            // GPUs cannot live-migrate.
            scheduling = scheduling.set_on_host_maintenance(model::scheduling::OnHostMaintenance::Terminate);
        }
        let scopes: Vec<String> = match (s.scopes.is_empty(), template) {
            (false, _) => s.scopes.clone(),
            (true, Some(t)) if !t.scopes.is_empty() => t.scopes.clone(),
            _ => vec![nodeclass::DEFAULT_SCOPE.to_owned()],
        };
        let mut account = model::ServiceAccount::new().set_scopes(scopes);
        let email = s.service_account.clone().or_else(|| self.settings.service_account.clone());
        if let Some(email) = email.or_else(|| template.and_then(|t| t.service_account.clone())) {
            account = account.set_email(email);
        }
        let node_labels = node_labels(claim, o.capacity_type);
        let taints: Vec<k8s_openapi::api::core::v1::Taint> =
            claim.spec.taints.iter().chain(&claim.spec.startup_taints).cloned().collect();
        let facts = NodeFacts { zone: &o.zone, labels: &node_labels, taints: &taints, max_pods: pods };
        let not_ready = |e: String| CloudError::NodeClassNotReady(format!("GCENodeClass/{}: {e}", class.name()));
        let items: BTreeMap<String, String> = match template {
            Some(t) => {
                bootstrap::gke_class_metadata(&s.metadata).map_err(not_ready)?;
                bootstrap::node_metadata(t, &facts, &s.metadata)
            }
            None => bootstrap::own_metadata(&facts, &s.metadata).map_err(not_ready)?,
        };
        let metadata = model::Metadata::new()
            .set_items(items.into_iter().map(|(k, v)| model::metadata::Items::new().set_key(k).set_value(v)));
        let mut tags: Vec<String> = template.map(|t| t.tags.clone()).unwrap_or_default();
        for t in &s.network_tags {
            if !tags.contains(t) {
                tags.push(t.clone());
            }
        }
        let (machine, attached) = catalog::split_attached(&it.name);
        let mut body = model::Instance::new()
            .set_name(name)
            .set_machine_type(format!("zones/{}/machineTypes/{machine}", o.zone))
            .set_disks(disks)
            .set_network_interfaces(nics)
            .set_scheduling(scheduling)
            .set_service_accounts([account])
            .set_labels(labels)
            .set_metadata(metadata);
        if !tags.is_empty() {
            body = body.set_tags(model::Tags::new().set_items(tags));
        }
        if let Some((count, gpu)) = attached {
            body = body.set_guest_accelerators([model::AcceleratorConfig::new()
                .set_accelerator_type(format!("zones/{}/acceleratorTypes/{gpu}", o.zone))
                .set_accelerator_count(count as i32)]);
        }
        if let Some(sh) = &s.shielded_instance_config {
            let mut c = model::ShieldedInstanceConfig::new();
            if let Some(v) = sh.enable_secure_boot {
                c = c.set_enable_secure_boot(v);
            }
            if let Some(v) = sh.enable_vtpm {
                c = c.set_enable_vtpm(v);
            }
            if let Some(v) = sh.enable_integrity_monitoring {
                c = c.set_enable_integrity_monitoring(v);
            }
            body = body.set_shielded_instance_config(c);
        }
        if !s.resource_manager_tags.is_empty() {
            body = body
                .set_params(model::InstanceParams::new().set_resource_manager_tags(s.resource_manager_tags.clone()));
        }
        Ok(body)
    }

    /// Inserts `body` in `zone` and waits for its operation: `Ok(None)` once done, `Ok(Some(errors))` when
    /// Compute Engine refused it (each error classified), `Err` when the call itself failed or the
    /// operation did not end within `operation_timeout`.
    async fn insert(
        &self,
        zone: &str,
        body: model::Instance,
    ) -> Result<Option<Vec<(InsertFault, String, String)>>, CloudError> {
        let name = body.name.clone().unwrap_or_default();
        let op = match self
            .instances
            .insert()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_body(body)
            .send()
            .await
        {
            Ok(op) => op,
            Err(e) => {
                // A synchronous refusal can carry the same codes as an operation's.
                if let Some(payload) =
                    e.http_payload().and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                {
                    let errors = payload["error"]["errors"].as_array().cloned().unwrap_or_default();
                    let faults: Vec<_> = errors
                        .iter()
                        .filter_map(|x| {
                            let code = x["reason"].as_str().or(x["code"].as_str())?.to_owned();
                            let message = x["message"].as_str().unwrap_or_default().to_owned();
                            Some((insert_fault(&code, &message), code, message))
                        })
                        .collect();
                    if faults.iter().any(|(f, _, _)| *f != InsertFault::Request) {
                        return Ok(Some(faults));
                    }
                }
                return Err(client_error(&format!("instances.insert {zone}/{name}"), &e));
            }
        };
        let op_name =
            op.name.clone().ok_or_else(|| CloudError::message(NAME, "instances.insert: the operation has no name"))?;
        // Bounded by polls rather than by the clock, which may be virtual.
        let polls =
            (self.settings.operation_timeout.as_millis() / self.settings.operation_poll.as_millis().max(1)).max(1);
        let mut polled = 0;
        let mut current = op;
        loop {
            let done = matches!(current.status, Some(model::operation::Status::Done));
            if done {
                let errors = current.error.as_ref().map(|e| e.errors.clone()).unwrap_or_default();
                if errors.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(
                    errors
                        .iter()
                        .map(|x| {
                            let code = x.code.clone().unwrap_or_default();
                            let message = x.message.clone().unwrap_or_default();
                            (insert_fault(&code, &message), code, message)
                        })
                        .collect(),
                ));
            }
            polled += 1;
            if polled > polls {
                return Err(CloudError::message(
                    NAME,
                    format!("instances.insert {zone}/{name}: operation {op_name} did not finish in time"),
                ));
            }
            tokio::time::sleep(self.settings.operation_poll).await;
            current = self
                .operations
                .get()
                .set_project(&self.settings.project)
                .set_zone(zone)
                .set_operation(&op_name)
                .send()
                .await
                .map_err(|e| client_error(&format!("zoneOperations.get {op_name}"), &e))?;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn locations_ids_and_label_values() {
        assert_eq!(region_of("us-central1-a"), "us-central1");
        assert_eq!(region_of("us-central1"), "us-central1");
        assert_eq!(region_of("europe-west4"), "europe-west4");
        let pid = provider_id("p", "us-central1-a", "karpenter-x");
        assert_eq!(parse_provider_id(&pid).unwrap(), ("p", "us-central1-a", "karpenter-x"));
        assert!(parse_provider_id("aws:///us-east-1a/i-1").unwrap_err().is_not_found());
        assert_eq!(label_value("Team.ML/gpu"), "team-ml-gpu");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }
}
