//! The providers built into the `tenon` binary, built and registered by `tenon run` from settings.
//!
//! - `kwok`: simulated nodes ([`crate::kwok`]), for trying NodePools and disruption on any cluster. Its
//!   `KwokNodeClass` objects are watched: a pool or claim naming one that does not exist is answered
//!   `NodeClassNotReady`.
//! - `self-managed`: owned bare-metal machines through their Redfish BMCs. Its `SelfManagedNodeClass`
//!   objects are read when `tenon run` starts, with the BMC credentials from the Secrets they name (in
//!   the operator's namespace, keys `username` and `password`). They are watched too, but the machine
//!   inventory is fixed for the life of the process: a class changed later is reported (a warning) and
//!   picked up at the next start. A class that bursts names a provider registered before it (built in or
//!   added by the binary), or it is skipped with a warning.
//! - `aws` (with the `aws` feature): EC2 through the standard AWS credential and region chain
//!   (`AWS_REGION`, IRSA or Pod Identity, `AWS_ENDPOINT_URL` for an emulator). Its `EC2NodeClass` objects
//!   are watched and fed to the provider as they change; a class that fails validation is forgotten
//!   until it is fixed, and a deleted class's launch templates are deleted. The interruption queue is
//!   the `interruption-queue` setting.
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
use tenon_self_managed::{DEFAULT_REQUEST_TIMEOUT, RedfishClient, SelfManagedNodeClass, SelfManagedProvider};

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
];

/// The built-in providers that need a cloud account: registered only when the `providers` setting
/// names them.
const CLOUD: &[&str] = &["aws"];

/// The CRDs of the built-in providers' NodeClass kinds.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    #[allow(unused_mut)]
    let mut crds = vec![KwokNodeClass::crd(), SelfManagedNodeClass::crd()];
    #[cfg(feature = "aws")]
    crds.push(tenon_providers::aws::EC2NodeClass::crd());
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
/// unavailable-offerings cache, shared with the providers that mark offerings themselves.
pub async fn register(
    registry: &mut ProviderRegistry,
    client: &Client,
    namespace: &str,
    settings: &Settings,
    unavailable: &Arc<UnavailableOfferings>,
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
        let (provider, started) = self_managed(registry, client, namespace).await?;
        registry.register(provider).context("registering the self-managed provider")?;
        // Each class's spec as last seen: a change is reported once, when it is seen.
        let seen = std::sync::Mutex::new(started);
        feeds.push(Box::new(move |cluster: &mut KubeCluster| {
            cluster.feed_node_classes::<SelfManagedNodeClass>(move |classes| {
                let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                for class in &classes {
                    let spec = serde_json::to_value(&class.spec).unwrap_or_default();
                    let name = class.name_any();
                    if seen.get(&name) != Some(&spec) {
                        let object = format!("SelfManagedNodeClass/{name}");
                        tracing::warn!(%object, "changed since tenon started: the machine inventory picks it up at the next start");
                        seen.insert(name, spec);
                    }
                }
            });
        }));
    }
    #[cfg(feature = "aws")]
    if wanted(settings, "aws") {
        feeds.push(aws(registry, settings, unavailable).await?);
    }
    let _ = unavailable;
    Ok(feeds)
}

/// The AWS provider, registered, and the watch feeding it its `EC2NodeClass` objects.
#[cfg(feature = "aws")]
async fn aws(
    registry: &mut ProviderRegistry,
    settings: &Settings,
    unavailable: &Arc<UnavailableOfferings>,
) -> Result<Feed> {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    use tenon_providers::aws::{AwsProvider, AwsSettings, EC2NodeClass};

    let mut aws = AwsSettings::new(settings.cluster_name.clone());
    aws.interruption_queue = settings.interruption_queue.clone();
    let provider = Arc::new(AwsProvider::new(aws).await.with_unavailable_offerings(unavailable.clone()));
    tracing::info!(region = provider.region(), "the aws provider");
    registry.register_arc(provider.clone()).context("registering the aws provider")?;
    let known: Mutex<BTreeSet<String>> = Mutex::default();
    Ok(Box::new(move |cluster: &mut KubeCluster| {
        cluster.feed_node_classes::<EC2NodeClass>(move |classes| {
            let mut now = BTreeSet::new();
            for class in classes {
                let name = class.name_any();
                match provider.apply_node_class(EC2NodeClass::clone(&class)) {
                    Ok(()) => {
                        now.insert(name);
                    }
                    Err(e) => {
                        tracing::warn!(object = %format!("EC2NodeClass/{name}"), error = %e, "not launched from until it is fixed");
                        provider.forget_node_class(&name);
                    }
                }
            }
            let mut known = known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for gone in known.difference(&now) {
                let (provider, gone) = (provider.clone(), gone.clone());
                tokio::spawn(async move {
                    if let Err(e) = provider.delete_node_class(&gone).await {
                        tracing::warn!(object = %format!("EC2NodeClass/{gone}"), error = %e, "deleting its launch templates");
                    }
                });
            }
            *known = now;
        });
    }))
}

/// The self-managed provider over the `SelfManagedNodeClass` objects in the cluster now, and each
/// class's spec as it was read (by name).
async fn self_managed(
    registry: &ProviderRegistry,
    client: &Client,
    namespace: &str,
) -> Result<(SelfManagedProvider, std::collections::BTreeMap<String, serde_json::Value>)> {
    let bmc = RedfishClient::new(DEFAULT_REQUEST_TIMEOUT).context("building the Redfish client")?;
    let mut builder = SelfManagedProvider::builder().bmc(Arc::new(bmc));
    let classes = match Api::<SelfManagedNodeClass>::all(client.clone()).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::info!("the SelfManagedNodeClass CRD is not installed: the self-managed provider serves none");
            Vec::new()
        }
        Err(e) => return Err(e).context("listing SelfManagedNodeClasses"),
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let mut seen = std::collections::BTreeSet::new();
    let started = classes.iter().map(|c| (c.name_any(), serde_json::to_value(&c.spec).unwrap_or_default())).collect();
    for class in classes {
        let object = format!("SelfManagedNodeClass/{}", class.name_any());
        if let Some(burst) = &class.spec.burst {
            let r = &burst.node_class_ref;
            let kind = NodeClassKind::new(r.group.clone(), r.kind.clone());
            match registry.providers().iter().find(|p| p.descriptor().node_classes.contains(&kind)) {
                Some(p) => builder = builder.burst(p.clone()),
                None => {
                    tracing::warn!(%object, burst = %kind, "no registered provider serves its burst NodeClass; skipped");
                    continue;
                }
            }
        }
        for m in &class.spec.machines {
            let name = &m.bmc.credentials_ref;
            if !seen.insert(name.clone()) {
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
            builder = builder.credentials(name, &field("username")?, &field("password")?);
        }
        builder = builder.node_class(class);
    }
    let provider = builder.build().context("the SelfManagedNodeClass inventory")?;
    Ok((provider, started))
}
