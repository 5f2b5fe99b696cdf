//! A `GCENodeClass`'s status as the operator's NodeClass controller writes it: the images its terms
//! resolve to, its network and subnetwork, and the conditions [`condition_types::VALIDATION_SUCCEEDED`],
//! [`condition_types::IMAGES_READY`], [`condition_types::NETWORK_READY`] and [`condition_types::READY`].

use crate::classes::Readiness;
pub use crate::classes::{REASON_NOT_READY, REASON_VALIDATION_FAILED};

use super::nodeclass::{GCENodeClass, GCENodeClassStatus};
use super::provider::GcpProvider;

/// The condition types of a `GCENodeClass`.
pub mod condition_types {
    /// The class passed the checks its schema cannot make.
    pub use tenon_core::api::condition_types::VALIDATION_SUCCEEDED;
    /// Its image terms resolved to at least one image.
    pub const IMAGES_READY: &str = "ImagesReady";
    /// Its network resolved (with the GKE bootstrap, the cluster has a node pool template to take it
    /// from when neither the class nor the settings name one).
    pub const NETWORK_READY: &str = "NetworkReady";
    /// Every other condition is true: claims may launch from it.
    pub const READY: &str = "Ready";
}

/// The reason of a false [`condition_types::IMAGES_READY`].
pub const REASON_IMAGE_RESOLUTION_FAILED: &str = "ImageResolutionFailed";
/// The reason of a false [`condition_types::NETWORK_READY`].
pub const REASON_NETWORK_RESOLUTION_FAILED: &str = "NetworkResolutionFailed";

impl GcpProvider {
    /// The status of `class`: its conditions, and the images its terms resolve to now (those of its last
    /// status while they do not resolve). A class that fails validation is not resolved: its
    /// `ValidationSucceeded` is false with the error (naming the field), `Ready` false, the rest as it was.
    /// A condition keeps its transition time while its status stays.
    pub async fn node_class_status(&self, class: &GCENodeClass) -> GCENodeClassStatus {
        use condition_types::{IMAGES_READY, NETWORK_READY, VALIDATION_SUCCEEDED};
        let previous = class.status.clone().unwrap_or_default();
        let mut r = Readiness::new(previous.conditions.clone(), self.now());
        if let Err(m) = class.validate() {
            return GCENodeClassStatus { conditions: r.invalid(&m), ..previous };
        }
        r.set(VALIDATION_SUCCEEDED, Ok(()), "");
        let images = match self.resolve_images(class).await {
            Ok(images) => {
                r.set(IMAGES_READY, Ok(()), "");
                images
            }
            Err(e) => {
                r.set(IMAGES_READY, Err(e.to_string()), REASON_IMAGE_RESOLUTION_FAILED);
                previous.images
            }
        };
        let (network, subnetwork) = match self.resolve_network(class).await {
            Ok(n) => {
                r.set(NETWORK_READY, Ok(()), "");
                n
            }
            Err(e) => {
                r.set(NETWORK_READY, Err(e.to_string()), REASON_NETWORK_RESOLUTION_FAILED);
                (previous.network.clone(), previous.subnetwork.clone())
            }
        };
        GCENodeClassStatus { images, network, subnetwork, conditions: r.finish() }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use jiff::Timestamp;
    use tenon_core::clock::VirtualClock;

    use super::condition_types::{IMAGES_READY, READY, VALIDATION_SUCCEEDED};
    use super::*;
    use crate::gcp::nodeclass::ResolvedImage;
    use crate::gcp::provider::GcpSettings;
    use tenon_core::api::ConditionStatus;

    /// A provider on a virtual clock whose Compute Engine answers every call 404 (no image exists).
    async fn provider(clock: std::sync::Arc<VirtualClock>) -> GcpProvider {
        let body = r#"{"error": {"code": 404, "message": "not found", "errors": [{"reason": "notFound", "message": "not found", "domain": "global"}]}}"#;
        let app = axum::Router::new().fallback(move || async move {
            (axum::http::StatusCode::NOT_FOUND, [("content-type", "application/json")], body)
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut s = GcpSettings::new("test-project", "us-central1", "c");
        s.endpoint = Some(format!("http://{addr}"));
        // No node pool template to read: the network is the settings' (none).
        s.gke_bootstrap = false;
        let anonymous = google_cloud_auth::credentials::anonymous::Builder::new().build();
        GcpProvider::new(s, Some(anonymous)).await.unwrap().with_clock(clock)
    }

    fn class(terms: serde_json::Value, status: Option<GCENodeClassStatus>) -> GCENodeClass {
        let mut c: GCENodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.gcp/v1alpha1", "kind": "GCENodeClass",
            "metadata": {"name": "default"}, "spec": {"imageSelectorTerms": terms},
        }))
        .unwrap();
        c.status = status;
        c
    }

    fn condition<'a>(s: &'a GCENodeClassStatus, type_: &str) -> &'a tenon_core::api::Condition {
        s.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_}: {s:?}"))
    }

    #[tokio::test]
    async fn a_class_that_fails_validation_is_not_resolved_and_keeps_its_images() {
        let clock = VirtualClock::new(Timestamp::UNIX_EPOCH);
        let p = provider(clock.clone()).await;
        let previous = GCENodeClassStatus {
            images: vec![ResolvedImage { source_image: "projects/p/global/images/old".into(), requirements: vec![] }],
            ..Default::default()
        };
        let status = p.node_class_status(&class(serde_json::json!([]), Some(previous.clone()))).await;
        let v = condition(&status, VALIDATION_SUCCEEDED);
        assert_eq!((v.status, v.reason.as_str()), (ConditionStatus::False, REASON_VALIDATION_FAILED));
        assert!(v.message.contains("GCENodeClass/default") && v.message.contains("spec.imageSelectorTerms"), "{v:?}");
        let r = condition(&status, READY);
        assert_eq!((r.status, r.reason.as_str()), (ConditionStatus::False, REASON_NOT_READY));
        assert!(r.message.contains(VALIDATION_SUCCEEDED), "{r:?}");
        assert!(!status.conditions.iter().any(|c| c.type_ == IMAGES_READY), "not resolved: {status:?}");
        assert_eq!(status.images, previous.images);
    }

    #[tokio::test]
    async fn images_that_do_not_resolve_keep_the_last_ones_and_the_transition_time() {
        let clock = VirtualClock::new(Timestamp::UNIX_EPOCH);
        let p = provider(clock.clone()).await;
        let previous = GCENodeClassStatus {
            images: vec![ResolvedImage { source_image: "projects/p/global/images/old".into(), requirements: vec![] }],
            ..Default::default()
        };
        let terms = serde_json::json!([{"id": "projects/p/global/images/new"}]);
        let failing = class(terms.clone(), Some(previous.clone()));
        let resolve = p.node_class_status(&failing);
        let first =
            tokio::time::timeout(Duration::from_secs(10), resolve).await.expect("the image is not found at once");
        let i = condition(&first, IMAGES_READY);
        assert_eq!((i.status, i.reason.as_str()), (ConditionStatus::False, REASON_IMAGE_RESOLUTION_FAILED), "{i:?}");
        assert!(i.message.contains("GCENodeClass/default: spec.imageSelectorTerms"), "{i:?}");
        assert_eq!(condition(&first, VALIDATION_SUCCEEDED).status, ConditionStatus::True);
        let r = condition(&first, READY);
        assert_eq!((r.status, r.message.as_str()), (ConditionStatus::False, "ImagesReady not ready"));
        assert_eq!(first.images, previous.images);
        // A minute later, still failing: the conditions keep the time they turned false.
        clock.advance(Duration::from_secs(60));
        let still = class(terms, Some(first.clone()));
        let resolve = p.node_class_status(&still);
        let again =
            tokio::time::timeout(Duration::from_secs(10), resolve).await.expect("the image is not found at once");
        assert_eq!(condition(&again, IMAGES_READY).last_transition_time, Some(Timestamp::UNIX_EPOCH), "{again:?}");
        assert_eq!(again.images, previous.images);
    }
}
