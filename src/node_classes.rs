//! The NodeClass controller of the built-in cloud providers, one loop for every kind, as Karpenter's
//! providers run one for theirs: each class is fed to its provider as it changes; while this replica
//! leads, each class gets its provider's finalizer and the status the provider resolves for it (written
//! when it changes, refreshed every [`RESYNC`]); a deleted class keeps its finalizer until no NodeClaim
//! names it, then the provider cleans up after it and the finalizer is removed.
//!
//! A provider takes part by implementing [`NodeClassController`]: the kind, its finalizer, how a class
//! resolves into a status and what deleting one cleans up. [`feed`] starts the controller and returns the
//! watch feeding the provider; [`run`] and [`reconcile`] are the loop and one pass over one class.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenon_core::cloud::CloudError;
use tokio::sync::watch;

use crate::builtins::Feed;
use crate::kube::KubeCluster;

/// How often each class's status is refreshed when nothing changed (images are published, subnets fill
/// up).
pub const RESYNC: Duration = Duration::from_secs(60);
/// How soon a failed write, or a deleted class waiting for its claims to go, is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// A provider whose NodeClass kind the controller serves.
pub trait NodeClassController: Send + Sync + 'static {
    /// The NodeClass resource (cluster-scoped), with its status.
    type Class: Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + HasStatus<Status: Serialize + PartialEq + Send + Sync>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static;

    /// The API group of the kind, as a NodeClaim's `spec.nodeClassRef.group` names it.
    const GROUP: &'static str;
    /// The kind.
    const KIND: &'static str;
    /// The finalizer the controller keeps on each class until its clean-up is done.
    const FINALIZER: &'static str;

    /// Adds or replaces `class` in the provider; an error (the class fails validation) leaves it
    /// forgotten until it is fixed.
    fn apply(&self, class: Self::Class) -> Result<(), CloudError>;

    /// Forgets the class `name`: nothing launches from it.
    fn forget(&self, name: &str);

    /// The status of `class`: what it resolves to, and its conditions (a failure is a condition, not an
    /// error).
    fn status(&self, class: &Self::Class) -> impl Future<Output = <Self::Class as HasStatus>::Status> + Send;

    /// Cleans up after the deleted class `name` (what the provider made for it in the cloud), and forgets
    /// it.
    fn clean_up(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
}

/// Starts the controller of `provider`'s kind (it writes only while `leading` is true) and returns the
/// watch that feeds the provider its classes on the operator's cluster. A class that disappears without
/// the finalizer's clean-up (the finalizer removed by hand, or never added by a leader) is cleaned up
/// when it is gone.
pub fn feed<P: NodeClassController>(provider: Arc<P>, client: &Client, leading: watch::Receiver<bool>) -> Feed {
    let (to_reconcile, classes) = watch::channel(Vec::new());
    tokio::spawn(run(provider.clone(), client.clone(), classes, leading));
    let known: Mutex<BTreeSet<String>> = Mutex::default();
    Box::new(move |cluster: &mut KubeCluster| {
        cluster.feed_node_classes::<P::Class>(move |classes| {
            to_reconcile.send_replace(classes.clone());
            let mut now = BTreeSet::new();
            for class in classes {
                let name = class.name_any();
                match provider.apply(P::Class::clone(&class)) {
                    Ok(()) => {
                        now.insert(name);
                    }
                    Err(e) => {
                        tracing::warn!(object = %object::<P>(&name), error = %e, "not launched from until it is fixed");
                        provider.forget(&name);
                    }
                }
            }
            let mut known = known.lock().unwrap_or_else(PoisonError::into_inner);
            for gone in known.difference(&now) {
                let (provider, gone) = (provider.clone(), gone.clone());
                tokio::spawn(async move {
                    if let Err(e) = provider.clean_up(&gone).await {
                        tracing::warn!(object = %object::<P>(&gone), error = format!("{e:#}"), "cleaning up after it");
                    }
                });
            }
            *known = now;
        });
    })
}

/// `Kind/name`, for logs and errors.
fn object<P: NodeClassController>(name: &str) -> String {
    format!("{}/{name}", P::KIND)
}

/// The controller's loop: a pass over every class in `classes` whenever they change, leadership is
/// gained, or [`RESYNC`] passes ([`RETRY`] when a pass failed or waits); nothing while this replica does
/// not lead. It ends when either sender is dropped.
pub async fn run<P: NodeClassController>(
    provider: Arc<P>,
    client: Client,
    mut classes: watch::Receiver<Vec<Arc<P::Class>>>,
    mut leading: watch::Receiver<bool>,
) {
    loop {
        if !*leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { return },
                changed = classes.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let current = classes.borrow_and_update().clone();
        let mut again = RESYNC;
        for class in current {
            match reconcile(provider.as_ref(), &client, &class).await {
                Ok(true) => {}
                Ok(false) => again = RETRY,
                Err(e) => {
                    let object = object::<P>(&class.name_any());
                    tracing::warn!(%object, error = format!("{e:#}"), "reconciling; tried again shortly");
                    again = RETRY;
                }
            }
        }
        tokio::select! {
            changed = classes.changed() => if changed.is_err() { return },
            changed = leading.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(again) => {}
        }
    }
}

/// One pass over one class: adds the finalizer and writes the status when it changed; for a deleted
/// class, waits for the NodeClaims naming it to go, then cleans up and removes the finalizer. `Ok(false)`
/// when it waits for something (its claims to go). Every write names the class's resource version: one
/// made on a stale read fails, and is tried again on the next pass.
pub async fn reconcile<P: NodeClassController>(provider: &P, client: &Client, class: &P::Class) -> Result<bool> {
    let name = class.name_any();
    let object = object::<P>(&name);
    let api = Api::<P::Class>::all(client.clone());
    let finalizers = class.meta().finalizers.clone().unwrap_or_default();
    let has_finalizer = finalizers.iter().any(|f| f == P::FINALIZER);
    let params = PatchParams::default();
    let version = class.meta().resource_version.clone();
    if class.meta().deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(true);
        }
        let users = claims_naming::<P>(client, &name).await?;
        if users > 0 {
            tracing::info!(%object, claims = users, "deleted; waiting for its NodeClaims to go");
            return Ok(false);
        }
        provider.clean_up(&name).await.with_context(|| format!("{object}: cleaning up after it"))?;
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != P::FINALIZER).collect();
        let patch = serde_json::json!({"metadata": {"resourceVersion": version, "finalizers": rest}});
        api.patch(&name, &params, &Patch::Merge(&patch))
            .await
            .with_context(|| format!("{object}: removing the finalizer {}", P::FINALIZER))?;
        return Ok(true);
    }
    if !has_finalizer {
        let mut all = finalizers.clone();
        all.push(P::FINALIZER.to_owned());
        let patch = serde_json::json!({"metadata": {"resourceVersion": version, "finalizers": all}});
        api.patch(&name, &params, &Patch::Merge(&patch))
            .await
            .with_context(|| format!("{object}: adding the finalizer {}", P::FINALIZER))?;
    }
    let status = provider.status(class).await;
    if class.status() != Some(&status) {
        let patch = serde_json::json!({"status": status});
        api.patch_status(&name, &params, &Patch::Merge(&patch))
            .await
            .with_context(|| format!("{object}: writing the status"))?;
    }
    Ok(true)
}

/// How many NodeClaims name the class `name` of `P`'s kind in `spec.nodeClassRef`.
async fn claims_naming<P: NodeClassController>(client: &Client, name: &str) -> Result<usize> {
    let claims = Api::<tenon_core::api::NodeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .with_context(|| format!("{}: listing the NodeClaims that may name it", object::<P>(name)))?;
    let naming = |c: &&tenon_core::api::NodeClaim| {
        c.spec.node_class_ref.as_ref().is_some_and(|r| r.group == P::GROUP && r.kind == P::KIND && r.name == name)
    };
    Ok(claims.items.iter().filter(naming).count())
}

#[cfg(feature = "aws")]
impl NodeClassController for tenon_providers::aws::AwsProvider {
    type Class = tenon_providers::aws::EC2NodeClass;
    const GROUP: &'static str = tenon_providers::aws::nodeclass::GROUP;
    const KIND: &'static str = tenon_providers::aws::nodeclass::KIND;
    const FINALIZER: &'static str = tenon_providers::aws::nodeclass::FINALIZER;

    fn apply(&self, class: Self::Class) -> Result<(), CloudError> {
        self.apply_node_class(class)
    }

    fn forget(&self, name: &str) {
        self.forget_node_class(name);
    }

    async fn status(&self, class: &Self::Class) -> tenon_providers::aws::EC2NodeClassStatus {
        self.node_class_status(class).await
    }

    /// Deletes the class's launch templates (and the instance profile made for it).
    async fn clean_up(&self, name: &str) -> Result<()> {
        self.delete_node_class(name).await.context("deleting its launch templates")
    }
}

#[cfg(feature = "gcp")]
impl NodeClassController for tenon_providers::gcp::GcpProvider {
    type Class = tenon_providers::gcp::GCENodeClass;
    const GROUP: &'static str = tenon_providers::gcp::nodeclass::GROUP;
    const KIND: &'static str = tenon_providers::gcp::nodeclass::KIND;
    const FINALIZER: &'static str = tenon_providers::gcp::nodeclass::FINALIZER;

    fn apply(&self, class: Self::Class) -> Result<(), CloudError> {
        self.apply_node_class(class)
    }

    fn forget(&self, name: &str) {
        self.forget_node_class(name);
    }

    async fn status(&self, class: &Self::Class) -> tenon_providers::gcp::GCENodeClassStatus {
        self.node_class_status(class).await
    }

    /// Nothing is made in the cloud per class (instances name their image and settings themselves): the
    /// class is forgotten.
    async fn clean_up(&self, name: &str) -> Result<()> {
        self.forget_node_class(name);
        Ok(())
    }
}

#[cfg(feature = "azure")]
impl NodeClassController for tenon_providers::azure::AzureProvider {
    type Class = tenon_providers::azure::AKSNodeClass;
    const GROUP: &'static str = tenon_providers::azure::nodeclass::GROUP;
    const KIND: &'static str = tenon_providers::azure::nodeclass::KIND;
    const FINALIZER: &'static str = tenon_providers::azure::nodeclass::FINALIZER;

    fn apply(&self, class: Self::Class) -> Result<(), CloudError> {
        self.apply_node_class(class)
    }

    fn forget(&self, name: &str) {
        self.forget_node_class(name);
    }

    async fn status(&self, class: &Self::Class) -> tenon_providers::azure::AKSNodeClassStatus {
        self.node_class_status(class).await
    }

    /// Nothing is made in the cloud per class (VMs name their image and settings themselves): the class
    /// is forgotten.
    async fn clean_up(&self, name: &str) -> Result<()> {
        self.forget_node_class(name);
        Ok(())
    }
}
