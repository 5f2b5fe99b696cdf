//! An `AKSNodeClass`'s status as the operator's NodeClass controller writes it: the node images its
//! family resolves to, the Kubernetes version they were resolved for, and the conditions
//! `ValidationSucceeded`, `ImagesReady`, `SubnetsReady` and `Ready` (karpenter-provider-azure's names).

use crate::classes::Readiness;
pub use crate::classes::{REASON_NOT_READY, REASON_VALIDATION_FAILED};

use super::nodeclass::{AKSNodeClass, AKSNodeClassStatus};
use super::provider::AzureProvider;

/// The condition types of an `AKSNodeClass`.
pub mod condition_types {
    /// The class passed the checks its schema cannot make.
    pub use tenon_core::api::condition_types::VALIDATION_SUCCEEDED;
    /// Its family resolved to at least one node image.
    pub const IMAGES_READY: &str = "ImagesReady";
    /// It has a subnet (its own or the settings').
    pub const SUBNETS_READY: &str = "SubnetsReady";
    /// Every other condition is true: claims may launch from it.
    pub const READY: &str = "Ready";
}

/// The reason of a false `ImagesReady`.
pub const REASON_IMAGES_NOT_FOUND: &str = "ImagesNotFound";
/// The reason of a false `SubnetsReady`.
pub const REASON_SUBNET_NOT_FOUND: &str = "SubnetNotFound";

impl AzureProvider {
    /// The status of `class`: its conditions, and the images it resolves to now (those of its last status
    /// while they do not resolve). A class that fails validation is not resolved. A condition keeps its
    /// transition time while its status stays.
    pub async fn node_class_status(&self, class: &AKSNodeClass) -> AKSNodeClassStatus {
        use condition_types::{IMAGES_READY, SUBNETS_READY, VALIDATION_SUCCEEDED};
        let previous = class.status.clone().unwrap_or_default();
        let mut r = Readiness::new(previous.conditions.clone(), self.now());
        if let Err(m) = class.validate() {
            return AKSNodeClassStatus { conditions: r.invalid(&m), ..previous };
        }
        r.set(VALIDATION_SUCCEEDED, Ok(()), "");
        let (images, kubernetes_version) = match self.resolve_images(class).await {
            Ok(images) => {
                r.set(IMAGES_READY, Ok(()), "");
                (images, self.known_kubernetes_version())
            }
            Err(e) => {
                r.set(IMAGES_READY, Err(e.to_string()), REASON_IMAGES_NOT_FOUND);
                (previous.images, previous.kubernetes_version)
            }
        };
        r.set(SUBNETS_READY, self.subnet_of(class).map(|_| ()).map_err(|e| e.to_string()), REASON_SUBNET_NOT_FOUND);
        AKSNodeClassStatus { images, kubernetes_version, conditions: r.finish() }
    }
}
