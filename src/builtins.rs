//! The providers built into the `tenon` binary, built and registered by `tenon run` from settings.
//!
//! - `kwok`: simulated nodes ([`crate::kwok`]), for trying NodePools and disruption on any cluster. Its
//!   `KwokNodeClass` objects are watched: a pool or claim naming one that does not exist is answered
//!   `NodeClassNotReady`.
//! - `self-managed`: owned bare-metal machines through their Redfish BMCs. Its `SelfManagedNodeClass`
//!   objects are read when `tenon run` starts, with the BMC credentials from the Secrets they name (in
//!   the operator's namespace, keys `username` and `password`), and read again, Secrets included,
//!   whenever one changes: the provider reloads its inventory in place (a machine a claim holds keeps its
//!   spec until released; an inventory that fails validation leaves the last one in force). A class that
//!   bursts names a provider registered before it (built in or added by the binary), or it is skipped
//!   with a warning.
//! - `aws` (with the `aws` feature): EC2 through the standard AWS credential and region chain
//!   (`AWS_REGION`, IRSA or Pod Identity, `AWS_ENDPOINT_URL` for an emulator). Its `EC2NodeClass` objects
//!   are watched and fed to the provider as they change; a class that fails validation is forgotten
//!   until it is fixed. While this replica leads, each class gets the `karpenter.k8s.aws/termination`
//!   finalizer and a status as Karpenter writes it (resolved subnets, security groups, AMIs and instance
//!   profile; `SubnetsReady`, `SecurityGroupsReady`, `AMIsReady`, `InstanceProfileReady`,
//!   `ValidationSucceeded` and `Ready`), refreshed every minute; a deleted class stays until no NodeClaim
//!   names it, then its launch templates are deleted. The interruption queue is the
//!   `interruption-queue` setting.
//! - `gcp` (with the `gcp` feature): Compute Engine, for GKE, through Application Default Credentials.
//!   Its `GCENodeClass` objects are watched and fed to the provider the same way; while this replica
//!   leads, each class gets the `karpenter.k8s.gcp/termination` finalizer and a status (resolved images;
//!   `ValidationSucceeded`, `ImagesReady` and `Ready`), refreshed every minute; a deleted class stays
//!   until no NodeClaim names it, then it is forgotten. Image families and aliases follow the API
//!   server's version (its `/version` gitVersion, read every five minutes).
//!
//! - `azure` (with the `azure` feature): VMs in the AKS cluster's node resource group, through Resource
//!   Manager with the standard Azure credential chain (workload identity, a service principal in the
//!   environment, managed identity, the Azure CLI). Its `AKSNodeClass` objects are watched and fed to the
//!   provider the same way; while this replica leads, each class gets the `karpenter.azure.com/termination`
//!   finalizer and a status (node images, Kubernetes version; `ValidationSucceeded`, `ImagesReady`,
//!   `SubnetsReady` and `Ready`). Image families follow the API server's version. Nodes join with AKS's
//!   bootstrap: `cluster-endpoint`, the cluster CA (`cluster-ca-bundle`, else the operator's own service
//!   account CA) and a TLS bootstrap token from the `KUBELET_BOOTSTRAP_TOKEN` environment variable (never
//!   a setting, so never printed); or with custom data of one's own (`azure-custom-data-file`).
//!
//! The cloud providers' NodeClass controller is one for every kind: [`crate::node_classes`].
//!
//! The `providers` setting chooses among them; empty registers those that need no cloud account (kwok
//! and self-managed): a cloud provider left unconfigured would only fail every call.

use std::sync::Arc;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::{Client, CustomResourceExt, ResourceExt};
use tenon_core::cloud::{NodeClassKind, ProviderRegistry, UnavailableOfferings};
use tenon_core::settings::Settings;
use tenon_self_managed::{
    Credentials, DEFAULT_REQUEST_TIMEOUT, RedfishClient, SelfManagedNodeClass, SelfManagedProvider,
};

use crate::kube::KubeCluster;
use crate::kwok::{KwokNodeClass, KwokProvider, KwokSettings};

/// Starts the watch of a registered provider's NodeClass kind on the operator's cluster.
pub type Feed = Box<dyn FnOnce(&mut KubeCluster) + Send>;

/// A built-in provider: its name and the NodeClass kind it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Builtin {
    /// The provider's name (what the `providers` setting lists).
    pub name: &'static str,
    /// The NodeClass group.
    pub group: &'static str,
    /// The NodeClass kind.
    pub kind: &'static str,
}

/// Every built-in provider of this binary.
pub const BUILTINS: &[Builtin] = &[
    Builtin { name: "kwok", group: "tenon.dev", kind: "KwokNodeClass" },
    Builtin { name: "self-managed", group: "tenon.dev", kind: "SelfManagedNodeClass" },
    #[cfg(feature = "aws")]
    Builtin { name: "aws", group: "karpenter.k8s.aws", kind: "EC2NodeClass" },
    #[cfg(feature = "gcp")]
    Builtin { name: "gcp", group: "karpenter.k8s.gcp", kind: "GCENodeClass" },
    #[cfg(feature = "azure")]
    Builtin { name: "azure", group: "karpenter.azure.com", kind: "AKSNodeClass" },
];

/// The built-in providers that need a cloud account: registered only when the `providers` setting
/// names them.
const CLOUD: &[&str] = &["aws", "gcp", "azure"];

/// The CRDs of the built-in providers' NodeClass kinds.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    #[allow(unused_mut)]
    let mut crds = vec![KwokNodeClass::crd(), SelfManagedNodeClass::crd()];
    #[cfg(feature = "aws")]
    crds.push(tenon_providers::aws::EC2NodeClass::crd());
    #[cfg(feature = "gcp")]
    crds.push(tenon_providers::gcp::GCENodeClass::crd());
    #[cfg(feature = "azure")]
    crds.push(tenon_providers::azure::AKSNodeClass::crd());
    crds
}

/// Whether the settings ask for the provider `name`.
fn wanted(settings: &Settings, name: &str) -> bool {
    if settings.providers.is_empty() {
        return !CLOUD.contains(&name);
    }
    settings.providers.iter().any(|p| p == name)
}

/// Checks the `providers` setting names only built-in providers.
pub fn check(settings: &Settings) -> Result<()> {
    for p in &settings.providers {
        if !BUILTINS.iter().any(|b| b.name == p) {
            let known: Vec<&str> = BUILTINS.iter().map(|b| b.name).collect();
            anyhow::bail!("providers: {p:?} is not a built-in provider of this binary (it has {})", known.join(", "));
        }
    }
    Ok(())
}

/// Builds the built-in providers the settings ask for and registers them; returns the watches of their
/// NodeClass kinds, for the cluster the operator runs on. `unavailable` is the process's
/// unavailable-offerings cache, shared with the providers that mark offerings themselves; `leading`
/// says whether this replica leads, for the providers' own controllers (only the leader writes).
pub async fn register(
    registry: &mut ProviderRegistry,
    client: &Client,
    namespace: &str,
    settings: &Settings,
    unavailable: &Arc<UnavailableOfferings>,
    leading: &tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<Feed>> {
    check(settings)?;
    let mut feeds: Vec<Feed> = Vec::new();
    if wanted(settings, "kwok") {
        let types = match &settings.kwok_catalog {
            Some(path) => {
                KwokProvider::catalog_from_file(path).with_context(|| format!("kwok-catalog: reading {path}"))?
            }
            None => KwokProvider::default_catalog(),
        };
        let mut kwok_settings = KwokSettings::new(settings.cluster_name.clone());
        kwok_settings.registration_delay = settings.kwok_registration_delay;
        let provider = Arc::new(KwokProvider::new(client.clone(), types, kwok_settings));
        registry.register_arc(provider.clone()).context("registering the simulated-node provider")?;
        feeds.push(Box::new(move |cluster: &mut KubeCluster| {
            cluster.feed_node_classes::<KwokNodeClass>(move |classes| {
                provider.set_node_classes(classes.iter().map(|c| c.name_any()));
            });
        }));
    }
    if wanted(settings, "self-managed") {
        let inventory = SelfManagedInventory::read(registry, client, namespace).await?;
        let bmc = RedfishClient::new(DEFAULT_REQUEST_TIMEOUT).context("building the Redfish client")?;
        let mut builder = SelfManagedProvider::builder().bmc(Arc::new(bmc));
        if let Some(burst) = &inventory.burst {
            builder = builder.burst(burst.clone());
        }
        for class in inventory.classes.clone() {
            builder = builder.node_class(class);
        }
        for (name, c) in &inventory.credentials {
            builder = builder.credentials(name, &c.username, &c.password);
        }
        let provider = Arc::new(builder.build().context("the SelfManagedNodeClass inventory")?);
        registry.register_arc(provider.clone()).context("registering the self-managed provider")?;
        let (changed, changes) = tokio::sync::watch::channel(());
        tokio::spawn(reload_self_managed(provider, registry.clone(), client.clone(), namespace.to_owned(), changes));
        // Each class's spec and version as last seen: the inventory is read again when one changes.
        let seen = std::sync::Mutex::new(inventory.versions);
        feeds.push(Box::new(move |cluster: &mut KubeCluster| {
            cluster.feed_node_classes::<SelfManagedNodeClass>(move |classes| {
                let now: std::collections::BTreeMap<String, serde_json::Value> =
                    classes.iter().map(|c| (c.name_any(), serde_json::to_value(&c.spec).unwrap_or_default())).collect();
                let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if *seen != now {
                    *seen = now;
                    changed.send_replace(());
                }
            });
        }));
    }
    #[cfg(feature = "aws")]
    if wanted(settings, "aws") {
        feeds.push(aws(registry, client, settings, unavailable, leading.clone()).await?);
    }
    #[cfg(feature = "gcp")]
    if wanted(settings, "gcp") {
        feeds.push(gcp(registry, client, settings, unavailable, leading.clone()).await?);
    }
    #[cfg(feature = "azure")]
    if wanted(settings, "azure") {
        feeds.push(azure(registry, client, settings, unavailable, leading.clone())?);
    }
    let _ = (unavailable, leading);
    Ok(feeds)
}

/// The AWS provider, registered, and the watch feeding it its `EC2NodeClass` objects.
#[cfg(feature = "aws")]
async fn aws(
    registry: &mut ProviderRegistry,
    client: &Client,
    settings: &Settings,
    unavailable: &Arc<UnavailableOfferings>,
    leading: tokio::sync::watch::Receiver<bool>,
) -> Result<Feed> {
    use tenon_providers::aws::{AwsProvider, AwsSettings};

    let mut aws = AwsSettings::new(settings.cluster_name.clone());
    aws.interruption_queue = settings.interruption_queue.clone();
    aws.vm_memory_overhead = settings.vm_memory_overhead;
    aws.cluster_endpoint = settings.cluster_endpoint.clone();
    aws.cluster_ca_bundle = settings.cluster_ca_bundle.clone();
    aws.cluster_service_cidr = settings.cluster_service_cidr.clone();
    aws.isolated_vpc = settings.isolated_vpc;
    aws.reserved_capacity = settings.feature_gates.reserved_capacity();
    let provider = Arc::new(AwsProvider::new(aws).await.with_unavailable_offerings(unavailable.clone()));
    tracing::info!(region = provider.region(), "the aws provider");
    // Until the API server's version is read, the provider asks EKS.
    let versioned = provider.clone();
    tokio::spawn(kubernetes_version(client.clone(), move |info| {
        match tenon_providers::aws::ami::kubernetes_version(&info.major, &info.minor) {
            Some(v) => versioned.set_kubernetes_version(&v),
            None => {
                tracing::warn!(major = %info.major, minor = %info.minor, "the API server's /version is not major.minor")
            }
        }
    }));
    registry.register_arc(provider.clone()).context("registering the aws provider")?;
    Ok(crate::node_classes::feed(provider, client, leading))
}

/// The GCP provider, registered, and the watch feeding it its `GCENodeClass` objects. Its project and
/// location come from `PROJECT_ID` and `CLUSTER_LOCATION` (a zone names its region), credentials from
/// Application Default Credentials (workload identity on GKE).
#[cfg(feature = "gcp")]
async fn gcp(
    registry: &mut ProviderRegistry,
    client: &Client,
    settings: &Settings,
    unavailable: &Arc<UnavailableOfferings>,
    leading: tokio::sync::watch::Receiver<bool>,
) -> Result<Feed> {
    use tenon_providers::gcp::{GcpProvider, GcpSettings};
    let project = settings.project_id.clone().context("the gcp provider needs project-id (PROJECT_ID)")?;
    let location =
        settings.cluster_location.clone().context("the gcp provider needs cluster-location (CLUSTER_LOCATION)")?;
    let mut gcp = GcpSettings::new(project, tenon_providers::gcp::region_of(&location), settings.cluster_name.clone());
    gcp.cluster_location = location;
    gcp.service_account = settings.default_nodepool_service_account.clone();
    gcp.node_pool_template = settings.default_nodepool_template_name.clone();
    let provider = Arc::new(
        GcpProvider::new(gcp, None)
            .await
            .context("the gcp provider's Compute Engine client")?
            .with_unavailable_offerings(unavailable.clone()),
    );
    tracing::info!(project = %provider.settings().project, region = %provider.settings().region, "the gcp provider");
    // Until the API server's version is read, family and alias image terms do not resolve.
    let versioned = provider.clone();
    follow_git_version(client, move |v| versioned.set_kubernetes_version(v));
    registry.register_arc(provider.clone()).context("registering the gcp provider")?;
    Ok(crate::node_classes::feed(provider, client, leading))
}

/// The Azure settings `tenon run`'s settings (and, for the bootstrap token, the environment) say; an
/// error names the missing setting.
#[cfg(feature = "azure")]
pub fn azure_settings(
    settings: &Settings,
    bootstrap_token: Option<String>,
    service_account_ca: Option<&[u8]>,
) -> Result<tenon_providers::azure::AzureSettings> {
    use base64::Engine;
    use tenon_providers::azure::AzureSettings;
    use tenon_providers::azure::bootstrap::{AksBootstrap, Bootstrap, Secret};
    let need = |value: &str, key: &str, env: &str| -> Result<String> {
        if value.is_empty() {
            anyhow::bail!("the azure provider needs {key} ({env})");
        }
        Ok(value.to_owned())
    };
    let mut s = AzureSettings::new(
        &need(&settings.azure_subscription_id, "azure-subscription-id", "AZURE_SUBSCRIPTION_ID")?,
        &need(&settings.azure_node_resource_group, "azure-node-resource-group", "AZURE_NODE_RESOURCE_GROUP")?,
        &need(&settings.azure_location, "azure-location", "AZURE_LOCATION")?,
        &settings.cluster_name,
    );
    s.vnet_subnet_id = Some(settings.vnet_subnet_id.clone()).filter(|v| !v.is_empty());
    s.network_plugin = settings.network_plugin.clone();
    s.network_plugin_mode = settings.network_plugin_mode.clone();
    s.network_policy = settings.network_policy.clone();
    s.ssh_public_key = settings.ssh_public_key.clone();
    s.node_identities =
        settings.node_identities.split(',').map(str::trim).filter(|i| !i.is_empty()).map(str::to_owned).collect();
    s.vm_memory_overhead = settings.vm_memory_overhead;
    s.interruption_queue = settings.interruption_queue.clone();
    s.bootstrap = if settings.azure_custom_data_file.is_empty() {
        let endpoint = settings
            .cluster_endpoint
            .clone()
            .context("the azure provider's AKS bootstrap needs cluster-endpoint (CLUSTER_ENDPOINT)")?;
        let ca_bundle = match (&settings.cluster_ca_bundle, service_account_ca) {
            (Some(b), _) => b.clone(),
            (None, Some(pem)) => base64::engine::general_purpose::STANDARD.encode(pem),
            (None, None) => anyhow::bail!(
                "the azure provider's AKS bootstrap needs cluster-ca-bundle (CLUSTER_CA_BUNDLE), or the service account's CA"
            ),
        };
        let token = bootstrap_token
            .filter(|t| !t.is_empty())
            .context("the azure provider's AKS bootstrap needs a TLS bootstrap token in KUBELET_BOOTSTRAP_TOKEN")?;
        Bootstrap::Aks(AksBootstrap {
            cluster_endpoint: endpoint,
            ca_bundle,
            bootstrap_token: Secret(token),
            tenant_id: settings.azure_tenant_id.clone(),
            dns_service_ip: settings.dns_service_ip.clone(),
            kubelet_identity_client_id: Some(settings.kubelet_identity_client_id.clone()).filter(|v| !v.is_empty()),
            network_security_group: settings.network_security_group.clone(),
            route_table: String::new(),
        })
    } else {
        let path = &settings.azure_custom_data_file;
        let data = std::fs::read_to_string(path).with_context(|| format!("azure-custom-data-file: reading {path}"))?;
        Bootstrap::Own(data)
    };
    Ok(s)
}

/// The Azure provider, registered, and the watch feeding it its `AKSNodeClass` objects.
#[cfg(feature = "azure")]
fn azure(
    registry: &mut ProviderRegistry,
    client: &Client,
    settings: &Settings,
    unavailable: &Arc<UnavailableOfferings>,
    leading: tokio::sync::watch::Receiver<bool>,
) -> Result<Feed> {
    use tenon_providers::azure::AzureProvider;
    let ca = std::fs::read("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt").ok();
    let azure = azure_settings(settings, std::env::var("KUBELET_BOOTSTRAP_TOKEN").ok(), ca.as_deref())?;
    let provider = Arc::new(
        AzureProvider::new(azure, None).context("the azure provider")?.with_unavailable_offerings(unavailable.clone()),
    );
    tracing::info!(
        subscription = %provider.settings().subscription_id,
        resource_group = %provider.settings().resource_group,
        location = %provider.settings().location,
        "the azure provider"
    );
    // Until the API server's version is read, image families do not resolve.
    let versioned = provider.clone();
    follow_git_version(client, move |v| versioned.set_kubernetes_version(v));
    registry.register_arc(provider.clone()).context("registering the azure provider")?;
    Ok(crate::node_classes::feed(provider, client, leading))
}

/// How often the API server's version is read again (a control-plane upgrade moves image aliases and
/// families to the new version's images).
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
const VERSION_REFRESH: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Keeps a provider's Kubernetes version (which pins image aliases and families) at the API server's:
/// `set` is given its `/version`, read at once and every [`VERSION_REFRESH`]. A read that fails keeps the
/// version known.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
async fn kubernetes_version(client: Client, set: impl Fn(&k8s_openapi::apimachinery::pkg::version::Info) + Send) {
    loop {
        match client.apiserver_version().await {
            Ok(info) => set(&info),
            Err(e) => tracing::warn!(error = %e, "reading the API server's version"),
        }
        tokio::time::sleep(VERSION_REFRESH).await;
    }
}

/// Keeps a provider at the API server's `/version` gitVersion (`v1.33.5-gke.1080000`), given to `set`; a
/// version `set` refuses is logged.
#[cfg(any(feature = "gcp", feature = "azure"))]
fn follow_git_version(
    client: &Client,
    set: impl Fn(&str) -> Result<(), tenon_core::cloud::CloudError> + Send + 'static,
) {
    tokio::spawn(kubernetes_version(client.clone(), move |info| {
        if let Err(e) = set(&info.git_version) {
            tracing::warn!(error = %e, "the API server's /version gitVersion");
        }
    }));
}

/// The self-managed inventory as the cluster has it now: the `SelfManagedNodeClass` objects, the BMC
/// credentials of their machines (from the Secrets they name, in the operator's namespace) and the burst
/// provider they name.
struct SelfManagedInventory {
    classes: Vec<SelfManagedNodeClass>,
    credentials: std::collections::HashMap<String, Credentials>,
    burst: Option<tenon_core::cloud::DynCloudProvider>,
    /// Each class's spec, by name, as read.
    versions: std::collections::BTreeMap<String, serde_json::Value>,
}

impl SelfManagedInventory {
    /// Reads the classes and their Secrets. A class whose burst names no provider of `registry` is left
    /// out, with a warning; a Secret that cannot be read fails the whole read.
    async fn read(registry: &ProviderRegistry, client: &Client, namespace: &str) -> Result<Self> {
        let classes = match Api::<SelfManagedNodeClass>::all(client.clone()).list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::info!("the SelfManagedNodeClass CRD is not installed: the self-managed provider serves none");
                Vec::new()
            }
            Err(e) => return Err(e).context("listing SelfManagedNodeClasses"),
        };
        let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
        let versions =
            classes.iter().map(|c| (c.name_any(), serde_json::to_value(&c.spec).unwrap_or_default())).collect();
        let mut inventory = Self { classes: Vec::new(), credentials: Default::default(), burst: None, versions };
        for class in classes {
            let object = format!("SelfManagedNodeClass/{}", class.name_any());
            if let Some(burst) = &class.spec.burst {
                let r = &burst.node_class_ref;
                let kind = NodeClassKind::new(r.group.clone(), r.kind.clone());
                match registry.providers().iter().find(|p| p.descriptor().node_classes.contains(&kind)) {
                    Some(p) => inventory.burst = Some(p.clone()),
                    None => {
                        tracing::warn!(%object, burst = %kind, "no registered provider serves its burst NodeClass; skipped");
                        continue;
                    }
                }
            }
            for m in &class.spec.machines {
                let name = &m.bmc.credentials_ref;
                if inventory.credentials.contains_key(name) {
                    continue;
                }
                let secret = secrets
                    .get(name)
                    .await
                    .with_context(|| format!("{object}: spec.machines: reading Secret {namespace}/{name}"))?;
                let field = |key: &str| -> Result<String> {
                    let bytes = secret
                        .data
                        .as_ref()
                        .and_then(|d| d.get(key))
                        .with_context(|| format!("Secret {namespace}/{name}: data.{key} is missing"))?;
                    String::from_utf8(bytes.0.clone())
                        .with_context(|| format!("Secret {namespace}/{name}: data.{key} is not UTF-8"))
                };
                inventory.credentials.insert(name.clone(), Credentials::new(field("username")?, field("password")?));
            }
            inventory.classes.push(class);
        }
        Ok(inventory)
    }
}

/// How soon a self-managed inventory that could not be read or applied is tried again.
const INVENTORY_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads the self-managed inventory again each time a `SelfManagedNodeClass` changes, and reloads the
/// provider with it: machines added, removed or edited take effect without a restart (a machine a claim
/// holds keeps its spec until it is released). An inventory that cannot be read (a missing Secret) or
/// that fails validation leaves the provider as it was, with a warning, and is tried again. Standbys
/// reload too, so a new leader starts from the current inventory.
async fn reload_self_managed(
    provider: Arc<SelfManagedProvider>,
    registry: ProviderRegistry,
    client: Client,
    namespace: String,
    mut changes: tokio::sync::watch::Receiver<()>,
) {
    // The value sent at start is the inventory the provider was built from.
    changes.borrow_and_update();
    let mut retry = false;
    loop {
        if retry {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(INVENTORY_RETRY) => {}
            }
        } else if changes.changed().await.is_err() {
            return;
        }
        changes.borrow_and_update();
        retry = true;
        let inventory = match SelfManagedInventory::read(&registry, &client, &namespace).await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "reading the self-managed inventory; the last one stays");
                continue;
            }
        };
        match provider.reload(inventory.classes, inventory.credentials) {
            Ok(_) => retry = false,
            Err(e) => tracing::warn!(error = %e, "the self-managed inventory is invalid; the last one stays"),
        }
    }
}
