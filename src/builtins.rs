//! The providers built into the `tenon` binary, built and registered by `tenon run` from settings.
//!
//! - `kwok`: simulated nodes ([`crate::kwok`]), for trying NodePools and disruption on any cluster;
//! - `self-managed`: owned bare-metal machines through their Redfish BMCs. Its `SelfManagedNodeClass`
//!   objects are read when `tenon run` starts, with the BMC credentials from the Secrets they name (in
//!   the operator's namespace, keys `username` and `password`); a class changed later is picked up at the
//!   next start. A class that bursts names a provider registered before it (built in or added by the
//!   binary), or it is skipped with a warning.
//!
//! The `providers` setting chooses among them; empty registers every one.

use std::sync::Arc;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::{Client, CustomResourceExt, ResourceExt};
use tenon_core::cloud::{NodeClassKind, ProviderRegistry};
use tenon_core::settings::Settings;
use tenon_self_managed::{DEFAULT_REQUEST_TIMEOUT, RedfishClient, SelfManagedNodeClass, SelfManagedProvider};

use crate::kwok::{KwokNodeClass, KwokProvider, KwokSettings};

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
];

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
    settings.providers.is_empty() || settings.providers.iter().any(|p| p == name)
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

/// Builds the built-in providers the settings ask for and registers them.
pub async fn register(
    registry: &mut ProviderRegistry,
    client: &Client,
    namespace: &str,
    settings: &Settings,
) -> Result<()> {
    check(settings)?;
    if wanted(settings, "kwok") {
        let types = match &settings.kwok_catalog {
            Some(path) => {
                KwokProvider::catalog_from_file(path).with_context(|| format!("kwok-catalog: reading {path}"))?
            }
            None => KwokProvider::default_catalog(),
        };
        let mut kwok_settings = KwokSettings::new(settings.cluster_name.clone());
        kwok_settings.registration_delay = settings.kwok_registration_delay;
        registry
            .register(KwokProvider::new(client.clone(), types, kwok_settings))
            .context("registering the simulated-node provider")?;
    }
    if wanted(settings, "self-managed") {
        let provider = self_managed(registry, client, namespace).await?;
        registry.register(provider).context("registering the self-managed provider")?;
    }
    Ok(())
}

/// The self-managed provider over the `SelfManagedNodeClass` objects in the cluster now.
async fn self_managed(registry: &ProviderRegistry, client: &Client, namespace: &str) -> Result<SelfManagedProvider> {
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
    builder.build().context("the SelfManagedNodeClass inventory")
}
