//! The provider boundary: what tenon asks of a cloud (or of a rack of owned machines).
//!
//! A provider implements [`CloudProvider`]: it lists instance types with their priced offerings, launches
//! one instance for a [`NodeClaim`], reports instance liveness, and deletes. The core does everything else
//! (scheduling, consolidation, lifecycle, garbage collection), so a provider crate stays small.
//!
//! Several providers serve one cluster through a [`ProviderRegistry`], which routes each NodePool to a
//! provider by its `nodeClassRef` group and kind.

mod error;
pub mod fake;
mod registry;
mod types;
mod unavailable;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

pub use error::CloudError;
pub use registry::{ProviderRegistry, RegistryError};
pub use types::{
    CapacityType, DriftReason, Instance, InstanceState, InstanceType, Interruption, InterruptionKind, LaunchOptions,
    Lease, NodeClassKind, Offering, OfferingKey, Overhead, ProviderDescriptor, RepairAction, RepairPolicy,
    default_repair_policies,
};
pub use unavailable::{DEFAULT_TTL as UNAVAILABLE_OFFERINGS_TTL, UnavailableOfferings};

use crate::api::{NodeClaim, NodePool};

/// A source of nodes: a cloud, or a fleet of owned machines.
///
/// # Contract
///
/// - [`CloudProvider::instance_types`] returns every instance type the pool could use, including those with
///   no available offering right now.
/// - [`CloudProvider::create`] launches exactly one instance for the claim, choosing among the instance
///   types, zones and capacity types its requirements allow and avoiding the offerings listed in
///   [`LaunchOptions::unavailable`]. It must be idempotent per claim UID where the backend allows it.
/// - [`CloudProvider::delete`] returns `Ok(())` while the instance is terminating and
///   [`CloudError::NotFound`] once it is gone; the core calls it until it gets `NotFound`.
/// - [`CloudProvider::list`] returns every instance this cluster owns, and never another cluster's.
///
/// # Errors
///
/// Every method returns a [`CloudError`]; providers classify their SDK errors into it in one place.
#[async_trait]
pub trait CloudProvider: Send + Sync + Debug + 'static {
    /// The provider's name, used in logs and metrics (`aws`, `gcp`, `self-managed`, …).
    fn name(&self) -> &str;

    /// What the provider serves: its NodeClass kinds and the extra well-known labels it defines.
    fn descriptor(&self) -> ProviderDescriptor;

    /// Every instance type `pool` could use, with offerings, capacity and overhead.
    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError>;

    /// Launches one instance for `claim`.
    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError>;

    /// Terminates the claim's instance: `Ok` while terminating, `NotFound` once gone.
    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError>;

    /// The instance with `provider_id`, or `NotFound`.
    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError>;

    /// Every instance this cluster owns.
    async fn list(&self) -> Result<Vec<Instance>, CloudError>;

    /// Provider-side drift (image, network, NodeClass hash), or `None`.
    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError>;

    /// The unhealthy node conditions this provider wants repaired, and how.
    fn repair_policies(&self) -> Vec<RepairPolicy>;

    /// Reboots the claim's instance in place, for repair; [`CloudError::Unsupported`] when the provider
    /// cannot.
    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError>;

    /// Takes back, after a restart, whatever the provider keeps in memory about the claims it serves
    /// (which machine a claim holds, a burst instance's lease): called with every NodeClaim before the
    /// first decision, and again until it succeeds. Idempotent. Providers that keep nothing need not
    /// implement it.
    async fn adopt(&self, claims: &[NodeClaim]) -> Result<(), CloudError> {
        let _ = claims;
        Ok(())
    }

    /// Interruption notices received since the last call (spot interruption warnings, scheduled
    /// maintenance, instances stopping or terminating). Providers without an event source return none.
    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        Ok(Vec::new())
    }
}

/// A provider as the core holds it.
pub type DynCloudProvider = Arc<dyn CloudProvider>;

#[async_trait]
impl<T: CloudProvider + ?Sized> CloudProvider for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn descriptor(&self) -> ProviderDescriptor {
        (**self).descriptor()
    }
    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        (**self).instance_types(pool).await
    }
    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        (**self).create(claim, options).await
    }
    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        (**self).delete(claim).await
    }
    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        (**self).get(provider_id).await
    }
    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        (**self).list().await
    }
    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        (**self).is_drifted(claim).await
    }
    fn repair_policies(&self) -> Vec<RepairPolicy> {
        (**self).repair_policies()
    }
    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        (**self).reboot(claim).await
    }
    async fn adopt(&self, claims: &[NodeClaim]) -> Result<(), CloudError> {
        (**self).adopt(claims).await
    }
    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        (**self).interruptions().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn the_trait_is_object_safe_and_thread_safe() {
        assert_send_sync::<DynCloudProvider>();
        let _: Option<Box<dyn CloudProvider>> = None;
    }

    /// A provider shared as the registry holds it (`Arc<dyn CloudProvider>`) is reached through every
    /// method, the restart hook included.
    #[tokio::test]
    async fn a_shared_provider_forwards_every_call() {
        #[derive(Debug, Default)]
        struct Adopting(std::sync::atomic::AtomicUsize);
        #[async_trait]
        impl CloudProvider for Adopting {
            fn name(&self) -> &str {
                "adopting"
            }
            fn descriptor(&self) -> ProviderDescriptor {
                ProviderDescriptor::default()
            }
            async fn instance_types(&self, _: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
                Ok(Vec::new())
            }
            async fn create(&self, c: &NodeClaim, _: &LaunchOptions) -> Result<Instance, CloudError> {
                Err(CloudError::NotFound(c.name().to_owned()))
            }
            async fn delete(&self, c: &NodeClaim) -> Result<(), CloudError> {
                Err(CloudError::NotFound(c.name().to_owned()))
            }
            async fn get(&self, id: &str) -> Result<Instance, CloudError> {
                Err(CloudError::NotFound(id.to_owned()))
            }
            async fn list(&self) -> Result<Vec<Instance>, CloudError> {
                Ok(Vec::new())
            }
            async fn is_drifted(&self, _: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
                Ok(None)
            }
            fn repair_policies(&self) -> Vec<RepairPolicy> {
                Vec::new()
            }
            async fn reboot(&self, _: &NodeClaim) -> Result<(), CloudError> {
                Ok(())
            }
            async fn adopt(&self, claims: &[NodeClaim]) -> Result<(), CloudError> {
                self.0.fetch_add(claims.len(), std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
        }
        let inner = Arc::new(Adopting::default());
        let shared: DynCloudProvider = inner.clone();
        shared.adopt(&[NodeClaim::new("a", Default::default())]).await.unwrap();
        assert_eq!(inner.0.load(std::sync::atomic::Ordering::Relaxed), 1, "the restart hook reached the provider");
    }
}
