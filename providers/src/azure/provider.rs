//! The Azure provider: VMs in the cluster's node resource group, through Azure Resource Manager.
//!
//! - Instance types come from Resource SKUs for the location ([`super::catalog`]), read every
//!   `skus_ttl`, priced from the Retail Prices API ([`super::pricing`]).
//! - A launch is a NIC, then the VM (`PUT`, long-running, polled through `Azure-AsyncOperation`), both
//!   named `aks-<claim>` as karpenter-provider-azure names them, tried on the cheapest compatible
//!   offerings in turn; a failed VM create deletes what it made (the VM if Azure kept it, then the NIC)
//!   before the next offering, and its error is classified ([`super::errors`]).
//! - VMs carry ownership tags (`karpenter.azure.com_cluster`, `karpenter.sh_nodepool`,
//!   `karpenter.sh_nodeclaim`, `karpenter.azure.com_aksnodeclass`); only those are listed, read or deleted.
//! - `delete` removes the VM, then its NIC, then its OS disk, one step per call, until all are gone
//!   (`NotFound`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::{Value, json};
use tenon_core::api::{NodeClaim, NodeClassRef, NodePool, labels};
use tenon_core::clock::{self, SharedClock, SystemClock};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DriftReason, Instance, InstanceState, InstanceType, Interruption,
    LaunchOptions, NodeClassKind, Offering, OfferingKey, ProviderDescriptor, RepairPolicy, UnavailableOfferings,
    default_repair_policies,
};
use tenon_core::resources::Resources;

use super::arm::{Arm, PUBLIC_ENDPOINT, Started};
use super::bootstrap::{Bootstrap, NodeFacts, own_custom_data};
use super::catalog::{self, NodeShape, ResourceSku, SkuShape};
use super::errors::{ArmError, LaunchFault, Scope};
use super::images;
use super::interruption;
use super::nodeclass::{self, AKSNodeClass, AKSNodeClassStatus, NodeImage};
use super::pricing::{self, Price};

/// The provider's name.
pub const NAME: &str = "azure";
/// Tag: the cluster a VM belongs to.
pub const TAG_CLUSTER: &str = "karpenter.azure.com_cluster";
/// Tag: its NodePool.
pub const TAG_NODE_POOL: &str = "karpenter.sh_nodepool";
/// Tag: its NodeClaim.
pub const TAG_NODE_CLAIM: &str = "karpenter.sh_nodeclaim";
/// Tag: its AKSNodeClass.
pub const TAG_NODE_CLASS: &str = "karpenter.azure.com_aksnodeclass";
/// Tag: the class's static hash when it launched.
pub const TAG_HASH: &str = "karpenter.azure.com_aksnodeclass-hash";
/// Tag AKS bills Linux nodes by.
pub const TAG_BILLING: &str = "compute.aks.billing";

/// Resource SKUs' API version.
pub const SKUS_API: &str = "2021-07-01";
/// Virtual machines' API version.
pub const VM_API: &str = "2026-04-01";
/// Managed disks' API version.
pub const DISKS_API: &str = "2026-03-02";
/// Community galleries' API version.
pub const GALLERY_API: &str = "2026-03-03";
/// Network interfaces' API version.
pub const NIC_API: &str = "2026-03-01";

/// The provider's settings.
#[derive(Debug, Clone)]
pub struct AzureSettings {
    /// The subscription.
    pub subscription_id: String,
    /// The node resource group VMs are made in (`MC_<rg>_<cluster>_<location>`).
    pub resource_group: String,
    /// The location (`eastus`).
    pub location: String,
    /// The cluster's name, in the ownership tag.
    pub cluster_name: String,
    /// The subnet interfaces join when the class names none.
    pub vnet_subnet_id: Option<String>,
    /// The network plugin (`azure`, `kubenet`, `none`).
    pub network_plugin: String,
    /// Its mode (`overlay`, or empty for Azure CNI on the node subnet).
    pub network_plugin_mode: String,
    /// The network policy (`calico`, `azure`, `cilium`, or empty).
    pub network_policy: String,
    /// The admin user of the VMs.
    pub admin_username: String,
    /// The SSH public key of that user (Azure requires one for Linux VMs without a password).
    pub ssh_public_key: String,
    /// User-assigned identities attached to every VM (the kubelet's identity, …), by resource id.
    pub node_identities: Vec<String>,
    /// How nodes join.
    pub bootstrap: Bootstrap,
    /// Extra tags on every VM.
    pub additional_tags: BTreeMap<String, String>,
    /// Resource Manager's endpoint (default: the public cloud's).
    pub endpoint: Option<String>,
    /// The Retail Prices API's endpoint (default `https://prices.azure.com`).
    pub prices_endpoint: Option<String>,
    /// The Service Bus queue Health Resources events arrive on
    /// (`https://<namespace>.servicebus.windows.net/<queue>`); unset, no interruptions are read.
    pub interruption_queue: Option<String>,
    /// How often a long-running operation is polled when ARM does not say.
    pub operation_poll: Duration,
    /// How long one may take.
    pub operation_timeout: Duration,
    /// How long the SKU list is kept.
    pub skus_ttl: Duration,
    /// How often prices are read again.
    pub price_refresh: Duration,
    /// The share of memory the hypervisor and kernel keep (0.075).
    pub vm_memory_overhead: f64,
    /// How many offerings one launch tries.
    pub max_attempts: usize,
}

impl AzureSettings {
    /// Settings for a cluster, with the defaults.
    pub fn new(subscription_id: &str, resource_group: &str, location: &str, cluster_name: &str) -> Self {
        Self {
            subscription_id: subscription_id.to_owned(),
            resource_group: resource_group.to_owned(),
            location: location.to_ascii_lowercase(),
            cluster_name: cluster_name.to_owned(),
            vnet_subnet_id: None,
            network_plugin: "azure".into(),
            network_plugin_mode: "overlay".into(),
            network_policy: String::new(),
            admin_username: "azureuser".into(),
            ssh_public_key: String::new(),
            node_identities: Vec::new(),
            bootstrap: Bootstrap::Aks(Default::default()),
            additional_tags: BTreeMap::new(),
            endpoint: None,
            prices_endpoint: None,
            interruption_queue: None,
            operation_poll: Duration::from_secs(3),
            operation_timeout: Duration::from_secs(15 * 60),
            skus_ttl: Duration::from_secs(12 * 3600),
            price_refresh: Duration::from_secs(12 * 3600),
            vm_memory_overhead: 0.075,
            max_attempts: 5,
        }
    }

    /// Pods per node unless a class says: 250 for Azure CNI overlay and for no plugin, 30 for Azure CNI
    /// on the node subnet, 110 otherwise (kubenet).
    pub fn default_max_pods(&self) -> i64 {
        match (self.network_plugin.as_str(), self.network_plugin_mode.as_str()) {
            ("none", _) | ("azure", "overlay") => 250,
            ("azure", _) => 30,
            _ => 110,
        }
    }
}

/// `azure:///subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<name>`
/// (the resource group in lower case, as the cloud controller manager writes it).
pub fn provider_id(subscription: &str, resource_group: &str, name: &str) -> String {
    format!(
        "azure:///subscriptions/{subscription}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}",
        resource_group.to_ascii_lowercase()
    )
}

/// The VM name of a provider id; `NotFound` for anything else.
pub fn vm_name(provider_id: &str) -> Result<&str, CloudError> {
    let rest = provider_id.strip_prefix("azure://").unwrap_or_default();
    let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match parts[..] {
        ["subscriptions", _, rg, _, "providers", p, vms, name]
            if rg.eq_ignore_ascii_case("resourceGroups")
                && p.eq_ignore_ascii_case("Microsoft.Compute")
                && vms.eq_ignore_ascii_case("virtualMachines")
                && !name.is_empty() =>
        {
            Ok(name)
        }
        _ => Err(CloudError::NotFound(format!("{provider_id:?} is not an Azure VM provider id"))),
    }
}

/// The (resource group, virtual network, subnet) of a subnet id; an error says what is wrong.
pub fn parse_subnet_id(id: &str) -> Result<(&str, &str, &str), String> {
    let parts: Vec<&str> = id.trim_start_matches('/').split('/').collect();
    match parts[..] {
        ["subscriptions", s, rg, g, "providers", p, vn, v, sn, subnet]
            if !s.is_empty()
                && rg.eq_ignore_ascii_case("resourceGroups")
                && !g.is_empty()
                && p.eq_ignore_ascii_case("Microsoft.Network")
                && vn.eq_ignore_ascii_case("virtualNetworks")
                && !v.is_empty()
                && sn.eq_ignore_ascii_case("subnets")
                && !subnet.is_empty() =>
        {
            Ok((g, v, subnet))
        }
        _ => Err(format!(
            "{id:?} is not /subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.Network/virtualNetworks/<vnet>/subnets/<subnet>"
        )),
    }
}

/// A VM as ARM answers it, the fields read here.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Vm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    zones: Vec<String>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    properties: VmProperties,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct VmProperties {
    #[serde(default)]
    hardware_profile: Option<HardwareProfile>,
    #[serde(default)]
    priority: Option<String>,
    #[serde(default)]
    provisioning_state: Option<String>,
    #[serde(default)]
    time_created: Option<String>,
    #[serde(default)]
    storage_profile: Option<StorageProfile>,
    #[serde(default)]
    network_profile: Option<NetworkProfile>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HardwareProfile {
    #[serde(default)]
    vm_size: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct StorageProfile {
    #[serde(default)]
    image_reference: Option<ImageReference>,
    #[serde(default)]
    os_disk: Option<OsDisk>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ImageReference {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    community_gallery_image_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct OsDisk {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkProfile {
    #[serde(default)]
    network_interfaces: Vec<SubResource>,
}

#[derive(Debug, Clone, Deserialize, Default)]
struct SubResource {
    #[serde(default)]
    id: Option<String>,
}

/// A NIC, the fields read here.
#[derive(Debug, Clone, Deserialize, Default)]
struct Nic {
    #[serde(default)]
    properties: NicProperties,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NicProperties {
    #[serde(default)]
    ip_configurations: Vec<IpConfiguration>,
}

#[derive(Debug, Clone, Deserialize, Default)]
struct IpConfiguration {
    #[serde(default)]
    properties: IpConfigurationProperties,
}

#[derive(Debug, Clone, Deserialize, Default)]
struct IpConfigurationProperties {
    #[serde(default)]
    subnet: Option<SubResource>,
}

impl Vm {
    fn size(&self) -> Option<&str> {
        self.properties.hardware_profile.as_ref()?.vm_size.as_deref()
    }

    fn spot(&self) -> bool {
        self.properties.priority.as_deref().is_some_and(|p| p.eq_ignore_ascii_case("Spot"))
    }

    fn provisioning(&self) -> &str {
        self.properties.provisioning_state.as_deref().unwrap_or_default()
    }

    fn image(&self) -> Option<&str> {
        let r = self.properties.storage_profile.as_ref()?.image_reference.as_ref()?;
        r.community_gallery_image_id.as_deref().or(r.id.as_deref())
    }

    fn os_disk(&self) -> Option<&str> {
        self.properties.storage_profile.as_ref()?.os_disk.as_ref()?.name.as_deref()
    }

    fn zone_label(&self, location: &str) -> String {
        match self.zones.first() {
            Some(z) => catalog::zone_label(location, z),
            None => catalog::REGIONAL_ZONE.to_owned(),
        }
    }
}

#[derive(Debug)]
struct Cached<T> {
    at: Timestamp,
    value: Arc<T>,
}

/// Offerings kept out wider than one offering, until when.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    scope: Scope,
    size: String,
    quota_family: String,
    vcpu: i64,
    zone: String,
    capacity: CapacityType,
    until: Timestamp,
}

impl Block {
    fn covers(&self, shape: &SkuShape, zone: &str, capacity: CapacityType) -> bool {
        match self.scope {
            Scope::AllSpot => capacity == CapacityType::Spot,
            Scope::Family => capacity == self.capacity && shape.quota_family == self.quota_family,
            Scope::FamilyFromSize => {
                capacity == self.capacity && shape.quota_family == self.quota_family && shape.vcpu >= self.vcpu
            }
            Scope::Offering => capacity == self.capacity && shape.name == self.size && zone == self.zone,
            Scope::SizeInZone => shape.name == self.size && zone == self.zone,
            Scope::SizeAnyZone => capacity == self.capacity && shape.name == self.size,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    classes: crate::classes::ClassStore<AKSNodeClass, AKSNodeClassStatus>,
    skus: Option<Cached<Vec<SkuShape>>>,
    prices: Option<Cached<HashMap<String, Price>>>,
    blocks: Vec<Block>,
    unavailable: Option<Arc<UnavailableOfferings>>,
    kubernetes_version: Option<(u64, u64, u64)>,
    /// OS disks of VMs this provider deleted, by VM name: deleted in turn once the VM is gone, unless
    /// they went with it (`deleteOption: Delete`).
    disks: HashMap<String, String>,
}

/// The Azure provider.
pub struct AzureProvider {
    settings: AzureSettings,
    arm: Arm,
    http: reqwest::Client,
    /// Service Bus, for the interruption queue (tokens for `https://servicebus.azure.net`).
    bus: Option<Arm>,
    clock: SharedClock,
    state: Mutex<State>,
}

impl std::fmt::Debug for AzureProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureProvider").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl AzureProvider {
    /// A provider with `settings`, its tokens from `credential` (default: the standard chain,
    /// [`super::identity::Chain`]).
    pub fn new(settings: AzureSettings, credential: Option<Arc<dyn TokenCredential>>) -> Result<Self, CloudError> {
        for (field, value) in [
            ("subscription_id", &settings.subscription_id),
            ("resource_group", &settings.resource_group),
            ("location", &settings.location),
            ("cluster_name", &settings.cluster_name),
        ] {
            if value.is_empty() {
                return Err(CloudError::message(NAME, format!("the Azure settings' {field} is empty")));
            }
        }
        if let Some(id) = &settings.vnet_subnet_id {
            parse_subnet_id(id)
                .map_err(|e| CloudError::message(NAME, format!("the Azure settings' vnet_subnet_id: {e}")))?;
        }
        let credential: Arc<dyn TokenCredential> = match credential {
            Some(c) => c,
            None => Arc::new(super::identity::Chain::from_env().map_err(CloudError::Unauthorized)?),
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| CloudError::message(NAME, format!("an HTTP client: {e}")))?;
        let base = settings.endpoint.clone().unwrap_or_else(|| PUBLIC_ENDPOINT.to_owned());
        let scope = if base == PUBLIC_ENDPOINT {
            format!("{PUBLIC_ENDPOINT}/.default")
        } else {
            format!("{}/.default", base.trim_end_matches('/'))
        };
        let mut arm = Arm::new(http.clone(), &base, &scope, credential.clone());
        arm.poll = settings.operation_poll;
        arm.timeout = settings.operation_timeout;
        let bus = settings.interruption_queue.as_ref().map(|q| {
            let mut a = Arm::new(http.clone(), q, "https://servicebus.azure.net/.default", credential.clone());
            a.poll = settings.operation_poll;
            a
        });
        Ok(Self { settings, arm, http, bus, clock: Arc::new(SystemClock), state: Mutex::new(State::default()) })
    }

    /// The same provider on `clock` (virtual time in tests and the simulator).
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Marks failed offerings in `cache` (the core's), with this provider's TTLs.
    pub fn with_unavailable_offerings(self, cache: Arc<UnavailableOfferings>) -> Self {
        self.state().unavailable = Some(cache);
        self
    }

    /// The settings.
    pub fn settings(&self) -> &AzureSettings {
        &self.settings
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Adds or replaces an `AKSNodeClass`; one that fails validation is refused, naming the field.
    pub fn apply_node_class(&self, class: AKSNodeClass) -> Result<(), CloudError> {
        class.validate().map_err(CloudError::NodeClassNotReady)?;
        let name = class.name().to_owned();
        self.state().classes.apply(name, class, |old, new| old.spec == new.spec);
        Ok(())
    }

    /// Forgets an `AKSNodeClass`.
    pub fn forget_node_class(&self, name: &str) {
        self.state().classes.forget(name);
    }

    /// Sets the cluster's Kubernetes version (`v1.33.2`, as the API server reports it), which image
    /// families follow; a change resolves every class afresh.
    pub fn set_kubernetes_version(&self, version: &str) -> Result<(), CloudError> {
        let v = parse_version(version).ok_or_else(|| {
            CloudError::message(NAME, format!("the cluster's version {version:?} is not major.minor.patch"))
        })?;
        let mut state = self.state();
        if state.kubernetes_version != Some(v) {
            state.kubernetes_version = Some(v);
            state.classes.expire_all();
        }
        Ok(())
    }

    pub(super) fn known_kubernetes_version(&self) -> Option<String> {
        self.state().kubernetes_version.map(|(a, b, c)| format!("{a}.{b}.{c}"))
    }

    fn kubernetes_version(&self) -> Result<(u64, u64, u64), CloudError> {
        self.state()
            .kubernetes_version
            .ok_or_else(|| CloudError::NodeClassNotReady("the cluster's Kubernetes version is not known yet".into()))
    }

    fn class_name<'a>(&self, r: Option<&'a NodeClassRef>, object: &str) -> Result<&'a str, CloudError> {
        crate::classes::referenced(r, nodeclass::GROUP, nodeclass::KIND, object)
    }

    fn subscription_path(&self) -> String {
        format!("/subscriptions/{}", self.settings.subscription_id)
    }

    fn group_path(&self) -> String {
        format!("/subscriptions/{}/resourceGroups/{}", self.settings.subscription_id, self.settings.resource_group)
    }

    fn vm_url(&self, name: &str) -> String {
        self.arm.url(&format!("{}/providers/Microsoft.Compute/virtualMachines/{name}", self.group_path()), VM_API)
    }

    fn nic_url(&self, name: &str) -> String {
        self.arm.url(&format!("{}/providers/Microsoft.Network/networkInterfaces/{name}", self.group_path()), NIC_API)
    }

    fn disk_url(&self, name: &str) -> String {
        self.arm.url(&format!("{}/providers/Microsoft.Compute/disks/{name}", self.group_path()), DISKS_API)
    }

    /// The class `name` and what it resolves to (kept for five minutes).
    pub async fn resolve_node_class(
        &self,
        name: &str,
    ) -> Result<(Arc<AKSNodeClass>, Arc<AKSNodeClassStatus>), CloudError> {
        let class = self
            .state()
            .classes
            .get(name)
            .ok_or_else(|| CloudError::NodeClassNotReady(format!("AKSNodeClass/{name} is not known")))?;
        let now = self.now();
        if let Some(status) = self.state().classes.fresh(name, now, Duration::from_secs(300)) {
            return Ok((class, status));
        }
        let (major, minor, patch) = self.kubernetes_version()?;
        let images = self.resolve_images(&class).await?;
        let status = Arc::new(AKSNodeClassStatus {
            images,
            kubernetes_version: Some(format!("{major}.{minor}.{patch}")),
            ..Default::default()
        });
        self.state().classes.remember(name, now, status.clone());
        Ok((class, status))
    }

    /// The node images of `class`'s family for the cluster's version, each at its newest (or pinned)
    /// version; `NodeClassNotReady` naming the class when none resolves.
    pub(super) async fn resolve_images(&self, class: &AKSNodeClass) -> Result<Vec<NodeImage>, CloudError> {
        let not_ready = |m: String| CloudError::NodeClassNotReady(format!("AKSNodeClass/{}: {m}", class.name()));
        if class.spec.fips_mode.as_deref() == Some("FIPS") {
            return Err(not_ready(
                "FIPS node images are only in AKS's shared image gallery, which tenon does not read".into(),
            ));
        }
        let (_, minor, _) = self.kubernetes_version()?;
        let family = class.image_family();
        let defs = images::definitions(family, minor)
            .ok_or_else(|| not_ready(format!("image family {family:?} is not known")))?;
        let now = self.now().to_string();
        let mut out = Vec::new();
        let mut missing = Vec::new();
        for d in defs {
            let url = self.arm.url(
                &format!(
                    "{}/providers/Microsoft.Compute/locations/{}/communityGalleries/{}/images/{}/versions",
                    self.subscription_path(),
                    self.settings.location,
                    d.gallery,
                    d.name
                ),
                GALLERY_API,
            );
            let versions: Vec<images::ImageVersion> =
                match self.arm.list(&url, &format!("list versions of {}", d.name)).await {
                    Ok(v) => v,
                    Err(e) if e.is_not_found() => Vec::new(),
                    Err(e) => return Err(e.into()),
                };
            match images::pick_version(&versions, class.spec.image_version.as_deref(), &now) {
                Some(v) => out.push(NodeImage { id: images::image_id(&d, &v), requirements: images::requirements(&d) }),
                None => missing.push(d.name),
            }
        }
        if out.is_empty() {
            let what = match &class.spec.image_version {
                Some(v) => format!("version {v} of"),
                None => "a version of".into(),
            };
            return Err(not_ready(format!(
                "no {what} {} is published in {}",
                missing.join(", "),
                self.settings.location
            )));
        }
        Ok(out)
    }

    /// The location's VM sizes (kept for `skus_ttl`; a refresh that fails keeps the last read).
    async fn skus(&self) -> Result<Arc<Vec<SkuShape>>, CloudError> {
        let now = self.now();
        if let Some(c) = &self.state().skus
            && clock::since(now, c.at) < self.settings.skus_ttl
        {
            return Ok(c.value.clone());
        }
        let url = self.arm.url(
            &format!(
                "{}/providers/Microsoft.Compute/skus?$filter=location eq '{}'",
                self.subscription_path(),
                self.settings.location
            ),
            SKUS_API,
        );
        let skus: Vec<ResourceSku> = match self.arm.list(&url, "list resource SKUs").await {
            Ok(s) => s,
            Err(e) => {
                let e = CloudError::from(e);
                return match self.state().skus.as_ref() {
                    Some(last) => {
                        tracing::warn!(error = %e, "keeping the resource SKUs last read");
                        Ok(last.value.clone())
                    }
                    None => Err(e),
                };
            }
        };
        let mut shapes = Vec::new();
        for sku in &skus {
            if sku.resource_type.as_deref() != Some("virtualMachines") {
                continue;
            }
            match catalog::shape_of(sku, &self.settings.location) {
                Ok(s) => shapes.push(s),
                Err(why) => tracing::debug!(%why, "VM size left out"),
            }
        }
        shapes.sort_by(|a, b| a.name.cmp(&b.name));
        shapes.dedup_by(|a, b| a.name == b.name);
        let value = Arc::new(shapes);
        self.state().skus = Some(Cached { at: now, value: value.clone() });
        Ok(value)
    }

    /// The prices: the Retail Prices API's, read every `price_refresh` (a read that fails keeps the last
    /// one; with none yet, the bundled on-demand table).
    async fn prices(&self) -> Arc<HashMap<String, Price>> {
        let now = self.now();
        let last = self.state().prices.as_ref().map(|c| (c.at, c.value.clone()));
        if let Some((at, value)) = &last
            && clock::since(now, *at) < self.settings.price_refresh
        {
            return value.clone();
        }
        let value = match self.retail_prices().await {
            Ok(p) if !p.is_empty() => Arc::new(p),
            result => {
                match result {
                    Err(e) => tracing::warn!(error = %e, "the Retail Prices API could not be read"),
                    Ok(_) => tracing::warn!(location = %self.settings.location, "the Retail Prices API priced nothing"),
                }
                match last {
                    Some((_, value)) => value,
                    None => Arc::new(pricing::bundled(&self.settings.location).unwrap_or_default()),
                }
            }
        };
        self.state().prices = Some(Cached { at: now, value: value.clone() });
        value
    }

    async fn retail_prices(&self) -> Result<HashMap<String, Price>, String> {
        let base = self.settings.prices_endpoint.as_deref().unwrap_or(pricing::RETAIL_PRICES_ENDPOINT);
        let mut url = reqwest::Url::parse_with_params(
            &format!("{}/api/retail/prices", base.trim_end_matches('/')),
            [
                ("api-version", pricing::RETAIL_PRICES_API_VERSION),
                ("$filter", &pricing::retail_filter(&self.settings.location)),
            ],
        )
        .map_err(|e| e.to_string())?
        .to_string();
        let mut items = Vec::new();
        for _ in 0..10_000 {
            let resp = self.http.get(&url).send().await.map_err(|e| e.to_string())?;
            let status = resp.status();
            if !status.is_success() {
                return Err(format!("GET {url}: {status}"));
            }
            let page: pricing::RetailPage = resp.json().await.map_err(|e| format!("GET {url}: {e}"))?;
            items.extend(page.items);
            match page.next_page_link.filter(|l| !l.is_empty()) {
                Some(next) => url = next,
                None => return Ok(pricing::from_items(&items)),
            }
        }
        Err("more than 10,000 pages of prices".into())
    }

    /// Every instance type for a resolved class: the VM sizes its images boot, offered in their zones,
    /// priced, and kept out where a launch failed.
    async fn types_for(
        &self,
        class: &AKSNodeClass,
        status: &AKSNodeClassStatus,
    ) -> Result<Vec<InstanceType>, CloudError> {
        let skus = self.skus().await?;
        let prices = self.prices().await;
        let node = NodeShape {
            max_pods: class.spec.max_pods.map_or_else(|| self.settings.default_max_pods(), i64::from),
            os_disk_gb: class.os_disk_gb(),
            vm_memory_overhead: self.settings.vm_memory_overhead,
        };
        let now = self.now();
        let blocks: Vec<Block> = {
            let mut st = self.state();
            st.blocks.retain(|b| b.until > now);
            st.blocks.clone()
        };
        let encryption = class.spec.security.as_ref().and_then(|s| s.encryption_at_host) == Some(true);
        let mut out = Vec::with_capacity(skus.len());
        for shape in skus.iter() {
            if encryption && !shape.encryption_at_host {
                continue;
            }
            let price = prices.get(&shape.name).copied().unwrap_or_default();
            let mut offerings = Vec::with_capacity(shape.zones.len() * 2);
            for zone in &shape.zones {
                for ct in [CapacityType::Spot, CapacityType::OnDemand] {
                    let p = if ct == CapacityType::Spot {
                        price.spot.filter(|_| shape.spot_capable)
                    } else {
                        price.on_demand
                    };
                    let blocked = blocks.iter().any(|b| b.covers(shape, zone, ct));
                    let mut o = Offering::new(zone.clone(), ct, p.unwrap_or(0.0));
                    o.available = p.is_some() && !blocked;
                    offerings.push(o);
                }
            }
            let mut it = catalog::instance_type(shape, &node, offerings);
            if boot_image(status, &it).is_none() {
                continue;
            }
            it.labels.insert(labels::REGION.to_owned(), self.settings.location.clone());
            it.labels.insert("kubernetes.azure.com/os-sku".to_owned(), images::os_sku(class.image_family()).to_owned());
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

    /// Reads VM `name`, if it is this cluster's.
    async fn owned_vm(&self, name: &str) -> Result<Vm, CloudError> {
        let vm: Vm = self.arm.get(&self.vm_url(name), &format!("GET virtualMachines/{name}")).await?;
        if vm.tags.get(TAG_CLUSTER) != Some(&self.settings.cluster_name) {
            return Err(CloudError::NotFound(format!(
                "VM {name} (not owned by cluster {})",
                self.settings.cluster_name
            )));
        }
        Ok(vm)
    }

    /// This cluster's VMs in the node resource group.
    async fn owned_vms(&self) -> Result<Vec<Vm>, CloudError> {
        let url = self.arm.url(&format!("{}/providers/Microsoft.Compute/virtualMachines", self.group_path()), VM_API);
        let vms: Vec<Vm> = self.arm.list(&url, "list virtualMachines").await?;
        Ok(vms.into_iter().filter(|v| v.tags.get(TAG_CLUSTER) == Some(&self.settings.cluster_name)).collect())
    }

    fn to_instance(&self, vm: &Vm, types: Option<&[InstanceType]>) -> Result<Instance, CloudError> {
        let size =
            vm.size().ok_or_else(|| CloudError::message(NAME, format!("VM {}: no hardwareProfile.vmSize", vm.name)))?;
        let zone = vm.zone_label(&self.settings.location);
        let capacity_type = if vm.spot() { CapacityType::Spot } else { CapacityType::OnDemand };
        let state = match vm.provisioning() {
            "Succeeded" => InstanceState::Running,
            "Deleting" => InstanceState::Stopping,
            _ => InstanceState::Pending,
        };
        let it = types.and_then(|t| t.iter().find(|t| t.name == size));
        let mut node_labels = it.map(|t| t.labels.clone()).unwrap_or_default();
        node_labels.insert(labels::INSTANCE_TYPE.to_owned(), size.to_owned());
        node_labels.insert(labels::ZONE.to_owned(), zone.clone());
        node_labels.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
        node_labels.insert(labels::REGION.to_owned(), self.settings.location.clone());
        let price =
            it.and_then(|t| t.offering(&zone, capacity_type)).filter(|o| o.available || o.price > 0.0).map(|o| o.price);
        let launch_time = vm
            .properties
            .time_created
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .unwrap_or_else(|| self.now());
        Ok(Instance {
            provider_id: provider_id(&self.settings.subscription_id, &self.settings.resource_group, &vm.name),
            instance_type: size.to_owned(),
            zone,
            capacity_type,
            state,
            launch_time,
            capacity: it.map_or(Resources::ZERO, |t| t.capacity.clone()),
            allocatable: it.map(InstanceType::allocatable).unwrap_or(Resources::ZERO),
            image_id: vm.image().map(str::to_owned),
            labels: node_labels,
            lease: None,
            node_pool: vm.tags.get(TAG_NODE_POOL).cloned(),
            node_claim: vm.tags.get(TAG_NODE_CLAIM).cloned(),
            price,
        })
    }

    /// The instance types of class `name`, when it is known and resolves.
    async fn types_of_class(&self, name: Option<&str>) -> Option<Vec<InstanceType>> {
        let (class, status) = self.resolve_node_class(name?).await.ok()?;
        self.types_for(&class, &status).await.ok()
    }

    /// The subnet `class`'s VMs join.
    pub(super) fn subnet_of(&self, class: &AKSNodeClass) -> Result<String, CloudError> {
        class.spec.vnet_subnet_id.clone().or_else(|| self.settings.vnet_subnet_id.clone()).ok_or_else(|| {
            CloudError::NodeClassNotReady(format!(
                "AKSNodeClass/{}: no spec.vnetSubnetID, and the settings name no vnet_subnet_id",
                class.name()
            ))
        })
    }

    /// One launch: the cheapest compatible offerings tried in turn.
    async fn launch(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        let class_name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(class_name).await?;
        let subnet = self.subnet_of(&class)?;
        let name = format!("aks-{}", claim.name());
        // Idempotent per claim: a VM of that name is the claim's.
        match self.owned_vm(&name).await {
            Ok(vm) if vm.provisioning() != "Failed" && vm.provisioning() != "Deleting" => {
                let types = self.types_for(&class, &status).await?;
                return self.to_instance(&vm, Some(&types));
            }
            Ok(_) | Err(CloudError::NotFound(_)) => {}
            Err(e) => return Err(e),
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
        let skus = self.skus().await?;
        let mut failed = Vec::new();
        let mut tried: BTreeSet<OfferingKey> = BTreeSet::new();
        for (it, o) in candidates.into_iter().take(self.settings.max_attempts.max(1)) {
            let key = o.key(&it.name);
            // An earlier failure of this launch may have kept this one out already.
            if !tried.insert(key.clone()) || self.blocked(&skus, &key) {
                continue;
            }
            let image = boot_image(&status, it).ok_or_else(|| {
                CloudError::NodeClassNotReady(format!("AKSNodeClass/{}: no image boots {}", class.name(), it.name))
            })?;
            let nic_id = self.create_nic(&name, claim, &class, &subnet, it).await?;
            let body = self.vm_body(&name, claim, &class, it, o, &image.id, &nic_id, &subnet)?;
            let context = format!("PUT virtualMachines/{name}");
            let result = match self.arm.put(&self.vm_url(&name), &body, &context).await {
                Ok((_, started)) => self.arm.wait(&started, &context).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    let mut instance = Instance {
                        provider_id: provider_id(&self.settings.subscription_id, &self.settings.resource_group, &name),
                        instance_type: it.name.clone(),
                        zone: o.zone.clone(),
                        capacity_type,
                        state: InstanceState::Pending,
                        launch_time: self.now(),
                        capacity: it.capacity.clone(),
                        allocatable: it.allocatable(),
                        image_id: Some(image.id.clone()),
                        labels: it.labels.clone(),
                        lease: None,
                        node_pool: claim.node_pool().map(str::to_owned),
                        node_claim: Some(claim.name().to_owned()),
                        price: Some(o.price),
                    };
                    instance.labels.insert(labels::INSTANCE_TYPE.to_owned(), it.name.clone());
                    instance.labels.insert(labels::ZONE.to_owned(), o.zone.clone());
                    instance.labels.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
                    tracing::info!(claim = claim.name(), vm = %name, size = %it.name, zone = %o.zone, capacity_type = %capacity_type, "launched");
                    return Ok(instance);
                }
                Err(e) => {
                    // What the create made goes before anything else is tried: a VM Azure kept in
                    // `Failed`, then the NIC (a VM holding it would refuse its deletion).
                    self.clean_up_failed(&name).await?;
                    match e.status {
                        401 | 403 | 429 => return Err(e.into()),
                        _ => {}
                    }
                    match super::errors::launch_fault(&e.code, &e.message, capacity_type) {
                        LaunchFault::Unavailable { scope, ttl } => {
                            let shape = skus.iter().find(|s| s.name == it.name);
                            self.block(scope.clone(), shape, &key, ttl);
                            tracing::info!(size = %it.name, zone = %o.zone, code = %e.code, ?scope, "offering kept out");
                            failed.push(key);
                        }
                        LaunchFault::RegionalQuota => {
                            return Err(CloudError::InsufficientCapacity {
                                offerings: vec![key],
                                message: format!(
                                    "NodeClaim/{}: the regional cores quota is used up: {}",
                                    claim.name(),
                                    e.message
                                ),
                            });
                        }
                        LaunchFault::Request => {
                            return Err(CloudError::Create {
                                reason: if e.code.is_empty() { "CreateFailed".into() } else { e.code.clone() },
                                message: format!("NodeClaim/{}: {e}", claim.name()),
                            });
                        }
                    }
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

    fn blocked(&self, skus: &[SkuShape], key: &OfferingKey) -> bool {
        let now = self.now();
        let Some(shape) = skus.iter().find(|s| s.name == key.instance_type) else { return false };
        self.state().blocks.iter().any(|b| b.until > now && b.covers(shape, &key.zone, key.capacity_type))
    }

    /// Keeps out `scope` around `key` for `ttl`: one offering in the core's cache as well, so the
    /// scheduler stops choosing it at once.
    fn block(&self, scope: Scope, shape: Option<&SkuShape>, key: &OfferingKey, ttl: Duration) {
        let until = clock::add(self.now(), ttl);
        self.state().blocks.push(Block {
            scope,
            size: key.instance_type.clone(),
            quota_family: shape.map(|s| s.quota_family.clone()).unwrap_or_default(),
            vcpu: shape.map_or(0, |s| s.vcpu),
            zone: key.zone.clone(),
            capacity: key.capacity_type,
            until,
        });
        self.mark_unavailable(key, ttl);
    }

    /// Deletes what a failed create left: the VM (when Azure kept it) and the NIC, waiting for both.
    async fn clean_up_failed(&self, name: &str) -> Result<(), CloudError> {
        let context = format!("DELETE virtualMachines/{name}");
        let started = self.arm.delete(&self.vm_url(name), &context).await?;
        self.arm.wait(&started, &context).await?;
        let context = format!("DELETE networkInterfaces/{name}");
        let started = self.arm.delete(&self.nic_url(name), &context).await?;
        self.arm.wait(&started, &context).await?;
        Ok(())
    }

    fn tags(&self, claim: &NodeClaim, class: &AKSNodeClass) -> BTreeMap<String, String> {
        let mut tags: BTreeMap<String, String> = self.settings.additional_tags.clone();
        tags.extend(class.spec.tags.iter().map(|(k, v)| (k.clone(), v.clone())));
        tags.insert(TAG_CLUSTER.into(), self.settings.cluster_name.clone());
        tags.insert(TAG_NODE_POOL.into(), claim.node_pool().unwrap_or_default().to_owned());
        tags.insert(TAG_NODE_CLAIM.into(), claim.name().to_owned());
        tags.insert(TAG_NODE_CLASS.into(), class.name().to_owned());
        tags.insert(TAG_HASH.into(), class.static_hash());
        tags.insert(TAG_BILLING.into(), "linux".into());
        // Azure tag names may not hold `/`.
        tags.into_iter().map(|(k, v)| (k.replace('/', "_"), v)).collect()
    }

    /// Creates (or finds) the claim's NIC; its id.
    async fn create_nic(
        &self,
        name: &str,
        claim: &NodeClaim,
        class: &AKSNodeClass,
        subnet: &str,
        it: &InstanceType,
    ) -> Result<String, CloudError> {
        let accelerated = it.labels.get(catalog::LABEL_SKU_ACCELERATED_NETWORKING).is_some_and(|v| v == "true");
        let body = json!({
            "location": self.settings.location,
            "tags": self.tags(claim, class),
            "properties": {
                "ipConfigurations": [{
                    "name": name,
                    "properties": {"primary": true, "privateIPAllocationMethod": "Dynamic", "subnet": {"id": subnet}},
                }],
                "enableAcceleratedNetworking": accelerated,
                "enableIPForwarding": false,
            },
        });
        let context = format!("PUT networkInterfaces/{name}");
        let (nic, started) = self.arm.put(&self.nic_url(name), &body, &context).await?;
        self.arm.wait(&started, &context).await?;
        nic.get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| CloudError::message(NAME, format!("{context}: the answer has no id")))
    }

    /// The VM's body.
    #[allow(clippy::too_many_arguments)]
    fn vm_body(
        &self,
        name: &str,
        claim: &NodeClaim,
        class: &AKSNodeClass,
        it: &InstanceType,
        o: &Offering,
        image: &str,
        nic_id: &str,
        subnet: &str,
    ) -> Result<Value, CloudError> {
        let spot = o.capacity_type == CapacityType::Spot;
        let disk_gb = class.os_disk_gb();
        let ephemeral = it
            .labels
            .get(catalog::LABEL_SKU_EPHEMERAL_OS_MAX)
            .and_then(|v| v.parse::<i64>().ok())
            .is_some_and(|max| disk_gb <= max);
        let mut os_disk = json!({
            "name": name, "createOption": "FromImage", "deleteOption": "Delete", "diskSizeGB": disk_gb,
        });
        if ephemeral {
            os_disk["caching"] = json!("ReadOnly");
            os_disk["diffDiskSettings"] = json!({"option": "Local", "placement": "CacheDisk"});
        }
        let labels = self.node_labels(claim, class, it, o);
        let taints: Vec<k8s_openapi::api::core::v1::Taint> =
            claim.spec.taints.iter().chain(&claim.spec.startup_taints).cloned().collect();
        let max_pods = it.capacity.get(tenon_core::resources::ResourceName::PODS);
        let custom_data = match &self.settings.bootstrap {
            Bootstrap::Aks(aks) => {
                let (major, minor, patch) = self.kubernetes_version()?;
                let version = format!("{major}.{minor}.{patch}");
                let parsed = parse_subnet_id(subnet)
                    .map_err(|e| CloudError::NodeClassNotReady(format!("AKSNodeClass/{}: {e}", class.name())))?;
                let plugin = if self.settings.network_plugin_mode.is_empty() {
                    self.settings.network_plugin.clone()
                } else {
                    format!("{}/{}", self.settings.network_plugin, self.settings.network_plugin_mode)
                };
                let mib = 1 << 20;
                let facts = NodeFacts {
                    kubernetes_version: &version,
                    subscription_id: &self.settings.subscription_id,
                    resource_group: &self.settings.resource_group,
                    location: &self.settings.location,
                    subnet: parsed,
                    network_plugin: &plugin,
                    network_policy: &self.settings.network_policy,
                    arch: it.labels.get(labels::ARCH).map_or("amd64", String::as_str),
                    nvidia_gpu: it.labels.get(catalog::LABEL_SKU_GPU_MANUFACTURER).is_some_and(|m| m == "nvidia"),
                    labels: &labels,
                    taints: &taints,
                    max_pods,
                    kube_reserved: (
                        it.overhead.kube_reserved.get(tenon_core::resources::ResourceName::CPU),
                        it.overhead.kube_reserved.get(tenon_core::resources::ResourceName::MEMORY) / mib,
                    ),
                    eviction_memory_mib: it
                        .overhead
                        .eviction_threshold
                        .get(tenon_core::resources::ResourceName::MEMORY)
                        / mib,
                    kubelet_flags: kubelet_flags(class),
                    admin_username: &self.settings.admin_username,
                };
                aks.custom_data(&facts)
            }
            Bootstrap::Own(data) => {
                own_custom_data(data, &labels, &taints, max_pods).map_err(|e| CloudError::Create {
                    reason: "InvalidCustomData".into(),
                    message: format!("the settings' custom data: {e}"),
                })?
            }
        };
        let mut linux = json!({"disablePasswordAuthentication": true});
        if !self.settings.ssh_public_key.is_empty() {
            linux["ssh"] = json!({"publicKeys": [{
                "path": format!("/home/{}/.ssh/authorized_keys", self.settings.admin_username),
                "keyData": self.settings.ssh_public_key,
            }]});
        }
        let mut properties = json!({
            "hardwareProfile": {"vmSize": it.name},
            "storageProfile": {"imageReference": {"communityGalleryImageId": image}, "osDisk": os_disk},
            "osProfile": {
                "computerName": name, "adminUsername": self.settings.admin_username,
                "linuxConfiguration": linux, "customData": custom_data,
            },
            "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"primary": true, "deleteOption": "Delete"}}]},
            "priority": if spot { "Spot" } else { "Regular" },
        });
        if spot {
            properties["evictionPolicy"] = json!("Delete");
            properties["billingProfile"] = json!({"maxPrice": -1});
        }
        if class.spec.security.as_ref().and_then(|s| s.encryption_at_host) == Some(true) {
            properties["securityProfile"] = json!({"encryptionAtHost": true});
        }
        let mut body = json!({
            "location": self.settings.location,
            "tags": self.tags(claim, class),
            "properties": properties,
        });
        if let Some(z) = catalog::arm_zone(&o.zone) {
            body["zones"] = json!([z]);
        }
        if !self.settings.node_identities.is_empty() {
            let ids: serde_json::Map<String, Value> =
                self.settings.node_identities.iter().map(|i| (i.clone(), json!({}))).collect();
            body["identity"] = json!({"type": "UserAssigned", "userAssignedIdentities": ids});
        }
        Ok(body)
    }

    /// The labels the node registers with: the claim's, the type's, its zone and capacity type.
    fn node_labels(
        &self,
        claim: &NodeClaim,
        class: &AKSNodeClass,
        it: &InstanceType,
        o: &Offering,
    ) -> BTreeMap<String, String> {
        let mut l = it.labels.clone();
        for r in &claim.spec.requirements {
            if r.operator == tenon_core::api::Operator::In
                && let [v] = r.values.as_slice()
            {
                l.entry(r.key.clone()).or_insert_with(|| v.clone());
            }
        }
        if let Some(extra) = &claim.metadata.labels {
            l.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        l.insert(labels::INSTANCE_TYPE.to_owned(), it.name.clone());
        l.insert(labels::ZONE.to_owned(), o.zone.clone());
        l.insert(labels::CAPACITY_TYPE.to_owned(), o.capacity_type.as_str().to_owned());
        l.insert("kubernetes.azure.com/mode".into(), "user".into());
        l.insert("kubernetes.azure.com/role".into(), "agent".into());
        l.insert(
            "kubernetes.azure.com/scalesetpriority".into(),
            if o.capacity_type == CapacityType::Spot { "spot" } else { "regular" }.into(),
        );
        l.insert(format!("{}/aksnodeclass", nodeclass::GROUP), class.name().to_owned());
        l
    }

    /// Drains the interruption queue: each message read, its interruptions collected, and deleted
    /// (messages that do not read are logged and deleted too: they would never read).
    async fn drain_queue(&self, bus: &Arm) -> Result<Vec<interruption::Reported>, CloudError> {
        let mut out = Vec::new();
        for _ in 0..100 {
            let Some((body, lock)) = self.receive(bus).await? else { break };
            match interruption::parse_message(&body) {
                Ok(r) => out.extend(r),
                Err(e) => tracing::warn!(error = %e, "an interruption message that does not read"),
            }
            if let Some(lock) = lock {
                let context = "DELETE the queue message";
                bus.delete(&lock, context).await?;
            }
        }
        Ok(out)
    }

    /// One message of the queue, peek-locked: its body and the URL that deletes it.
    async fn receive(&self, bus: &Arm) -> Result<Option<(String, Option<String>)>, CloudError> {
        let url = format!("{}/messages/head?timeout=0", bus.base());
        let (status, headers, body) = bus.post_raw(&url, "receive from the interruption queue").await?;
        if status == 204 {
            return Ok(None);
        }
        let lock = headers.get("location").cloned();
        Ok(Some((body, lock)))
    }
}

/// The kubelet flags an `AKSNodeClass`'s `kubelet` sets.
fn kubelet_flags(class: &AKSNodeClass) -> Vec<(String, String)> {
    let Some(k) = &class.spec.kubelet else { return Vec::new() };
    let mut out = Vec::new();
    let mut put = |flag: &str, v: Option<String>| {
        if let Some(v) = v {
            out.push((flag.to_owned(), v));
        }
    };
    put("--cpu-manager-policy", k.cpu_manager_policy.clone());
    put("--cpu-cfs-quota", k.cpu_cfs_quota.map(|b| b.to_string()));
    put("--cpu-cfs-quota-period", k.cpu_cfs_quota_period.clone());
    put("--image-gc-high-threshold", k.image_gc_high_threshold_percent.map(|v| v.to_string()));
    put("--image-gc-low-threshold", k.image_gc_low_threshold_percent.map(|v| v.to_string()));
    put("--topology-manager-policy", k.topology_manager_policy.clone());
    put("--container-log-max-size", k.container_log_max_size.clone());
    put("--container-log-max-files", k.container_log_max_files.map(|v| v.to_string()));
    put("--pod-max-pids", k.pod_pids_limit.map(|v| v.to_string()));
    put("--fail-swap-on", k.fail_swap_on.map(|b| b.to_string()));
    if !k.allowed_unsafe_sysctls.is_empty() {
        put("--allowed-unsafe-sysctls", Some(k.allowed_unsafe_sysctls.join(",")));
    }
    out
}

/// `v1.33.2` or `1.33.2-…` as (1, 33, 2).
pub fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().trim_start_matches('v');
    let core = v.split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// The first of the class's images that boots `it` (its requirements met by the type's labels).
fn boot_image<'a>(status: &'a AKSNodeClassStatus, it: &InstanceType) -> Option<&'a NodeImage> {
    status
        .images
        .iter()
        .find(|img| img.requirements.iter().all(|r| r.matches(it.labels.get(&r.key).map(String::as_str))))
}

#[async_trait]
impl CloudProvider for AzureProvider {
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

    /// One step per call: the VM (waited for), then its NIC, then its OS disk; `NotFound` once all are
    /// gone.
    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id() else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        let name = vm_name(pid)?.to_owned();
        let vm: Result<Vm, ArmError> = self.arm.get(&self.vm_url(&name), &format!("GET virtualMachines/{name}")).await;
        match vm {
            Ok(vm) if vm.tags.get(TAG_CLUSTER) == Some(&self.settings.cluster_name) => {
                if let Some(disk) = vm.os_disk() {
                    self.state().disks.insert(name.clone(), disk.to_owned());
                }
                let context = format!("DELETE virtualMachines/{name}");
                let started = self.arm.delete(&self.vm_url(&name), &context).await?;
                self.arm.wait(&started, &context).await?;
                tracing::info!(vm = %name, "deleted");
                return Ok(());
            }
            // Another cluster's VM of that name: none of its resources are touched.
            Ok(_) => {
                return Err(CloudError::NotFound(format!(
                    "{pid} (not owned by cluster {})",
                    self.settings.cluster_name
                )));
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        // The VM is gone; what it named with `deleteOption: Delete` normally went with it.
        let nic: Result<Value, ArmError> =
            self.arm.get(&self.nic_url(&name), &format!("GET networkInterfaces/{name}")).await;
        match nic {
            Ok(n) if owned_tags(&n, &self.settings.cluster_name) => {
                let context = format!("DELETE networkInterfaces/{name}");
                let started = self.arm.delete(&self.nic_url(&name), &context).await?;
                self.arm.wait(&started, &context).await?;
                return Ok(());
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        // The OS disk of a VM this provider deleted (OS disks carry no tags of their own to tell an
        // owner by, so only those).
        let disk = self.state().disks.get(&name).cloned();
        if let Some(disk) = disk {
            let context = format!("DELETE disks/{disk}");
            let started = self.arm.delete(&self.disk_url(&disk), &context).await?;
            self.state().disks.remove(&name);
            if started != Started::Absent {
                self.arm.wait(&started, &context).await?;
                return Ok(());
            }
        }
        Err(CloudError::NotFound(pid.to_owned()))
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        let name = vm_name(provider_id)?;
        let vm = self.owned_vm(name).await?;
        let types = self.types_of_class(vm.tags.get(TAG_NODE_CLASS).map(String::as_str)).await;
        self.to_instance(&vm, types.as_deref())
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let vms = self.owned_vms().await?;
        let mut by_class: HashMap<String, Option<Vec<InstanceType>>> = HashMap::new();
        let mut out = Vec::with_capacity(vms.len());
        for vm in &vms {
            let class = vm.tags.get(TAG_NODE_CLASS).cloned().unwrap_or_default();
            if !by_class.contains_key(&class) {
                let types = self.types_of_class(Some(&class)).await;
                by_class.insert(class.clone(), types);
            }
            match self.to_instance(vm, by_class.get(&class).and_then(|t| t.as_deref())) {
                Ok(i) => out.push(i),
                Err(e) => tracing::warn!(error = %e, "a VM that does not read"),
            }
        }
        Ok(out)
    }

    /// `NodeClassDrift` when the class's static fields changed since launch, `ImageDrift` when the node
    /// image is not one the class resolves to now, `SubnetDrift` when the NIC is not on the class's
    /// subnet.
    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        let Some(pid) = claim.provider_id() else { return Ok(None) };
        let name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        let vm = self.owned_vm(vm_name(pid)?).await?;
        if vm.tags.get(TAG_HASH).is_some_and(|h| *h != class.static_hash()) {
            return Ok(Some(DriftReason("NodeClassDrift".into())));
        }
        let image = vm.image().map(str::to_owned).or_else(|| claim.status.as_ref().and_then(|s| s.image_id.clone()));
        if let Some(image) = image
            && !status.images.iter().any(|i| i.id.eq_ignore_ascii_case(&image))
        {
            return Ok(Some(DriftReason("ImageDrift".into())));
        }
        let want = self.subnet_of(&class)?;
        let nic = vm
            .properties
            .network_profile
            .as_ref()
            .and_then(|n| n.network_interfaces.first())
            .and_then(|n| n.id.clone());
        if let Some(nic_id) = nic {
            let nic_name = nic_id.rsplit('/').next().unwrap_or_default().to_owned();
            let nic: Nic = self.arm.get(&self.nic_url(&nic_name), &format!("GET networkInterfaces/{nic_name}")).await?;
            let have = nic
                .properties
                .ip_configurations
                .first()
                .and_then(|c| c.properties.subnet.as_ref())
                .and_then(|s| s.id.clone());
            if have.is_some_and(|h| !h.eq_ignore_ascii_case(&want)) {
                return Ok(Some(DriftReason("SubnetDrift".into())));
            }
        }
        Ok(None)
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        default_repair_policies()
    }

    /// A restart of the VM (`virtualMachines/restart`), the repair by reboot.
    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id() else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        let name = vm_name(pid)?;
        self.owned_vm(name).await?;
        let url = self
            .arm
            .url(&format!("{}/providers/Microsoft.Compute/virtualMachines/{name}/restart", self.group_path()), VM_API);
        self.arm.post(&url, &format!("POST virtualMachines/{name}/restart")).await?;
        Ok(())
    }

    /// From the interruption queue ([`super::interruption`]), when the settings name one: the events
    /// about this resource group's VMs, as provider ids.
    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        let Some(bus) = &self.bus else { return Ok(Vec::new()) };
        let reported = self.drain_queue(bus).await?;
        let prefix = format!(
            "/subscriptions/{}/resourcegroups/{}/providers/microsoft.compute/virtualmachines/",
            self.settings.subscription_id, self.settings.resource_group
        )
        .to_ascii_lowercase();
        let mut out = Vec::new();
        for r in reported {
            let Some(rest) = r.resource_id.strip_prefix(&prefix) else { continue };
            // Ids compare without case; the VM's own name comes from the VM itself when it is still there.
            let name = match self.owned_vm(rest).await {
                Ok(vm) => vm.name,
                Err(CloudError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            tracing::info!(vm = %name, annotation = %r.annotation, "interruption");
            out.push(Interruption {
                provider_id: provider_id(&self.settings.subscription_id, &self.settings.resource_group, &name),
                kind: r.kind,
            });
        }
        Ok(out)
    }
}

/// Whether a resource's tags say it is `cluster`'s.
fn owned_tags(resource: &Value, cluster: &str) -> bool {
    resource.get("tags").and_then(|t| t.get(TAG_CLUSTER)).and_then(Value::as_str) == Some(cluster)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        let pid = provider_id("s", "MC_rg_c_eastus", "aks-default-abc");
        assert_eq!(
            pid,
            "azure:///subscriptions/s/resourceGroups/mc_rg_c_eastus/providers/Microsoft.Compute/virtualMachines/aks-default-abc"
        );
        assert_eq!(vm_name(&pid).unwrap(), "aks-default-abc");
        assert!(vm_name("aws:///us-east-1a/i-1").unwrap_err().is_not_found());
    }

    #[test]
    fn subnet_ids_are_read() {
        let id = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes";
        assert_eq!(parse_subnet_id(id).unwrap(), ("net", "v", "nodes"));
        assert!(parse_subnet_id("/subscriptions/s/resourceGroups/net").is_err());
    }

    #[test]
    fn versions_read() {
        assert_eq!(parse_version("v1.33.2"), Some((1, 33, 2)));
        assert_eq!(parse_version("1.34.0-rc.1"), Some((1, 34, 0)));
        assert_eq!(parse_version("v1.31"), Some((1, 31, 0)));
        assert_eq!(parse_version("latest"), None);
    }

    #[test]
    fn max_pods_follow_the_network_plugin() {
        let mut s = AzureSettings::new("s", "rg", "eastus", "c");
        assert_eq!(s.default_max_pods(), 250);
        s.network_plugin_mode = String::new();
        assert_eq!(s.default_max_pods(), 30);
        s.network_plugin = "kubenet".into();
        assert_eq!(s.default_max_pods(), 110);
    }
}
