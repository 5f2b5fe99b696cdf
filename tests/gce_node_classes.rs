//! The GCENodeClass controller ([`tenon::node_classes`]) against a real kube-apiserver
//! (`scripts/peers/kube.sh`, started by `scripts/test.sh`) and the providers' Compute Engine fake
//! (`providers/tests/gce/fake.rs`, checked against Google's discovery documents, found through
//! `TENON_GCE_DISCOVERY`): the GCP provider is fed its classes by the operator's own watch, and while the
//! replica leads each class gets the `karpenter.k8s.gcp/termination` finalizer and its status (images and
//! conditions); a deleted class stays while a NodeClaim names it. The controller runs as the chart's
//! ServiceAccount, under the RBAC the chart renders: a call it refused fails the test.
#![cfg(feature = "gcp")]
#![allow(clippy::expect_used, clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

mod common;

#[path = "../providers/tests/gce/fake.rs"]
#[allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]
mod fake;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::events::Reporter;
use serde_json::json;
use tenon::kube::KubeCluster;
use tenon_core::api::{NodeClaim, NodeClaimSpec, NodeClassRef};
use tenon_providers::gcp::nodeclass::{FINALIZER, GROUP, KIND};
use tenon_providers::gcp::status::condition_types::{IMAGES_READY, NETWORK_READY, READY, VALIDATION_SUCCEEDED};
use tenon_providers::gcp::{GCENodeClass, GcpProvider, GcpSettings};

use common::{Audit, install_chart, real_time};

const PROJECT: &str = "test-project";
const REGION: &str = "us-central1";
const IMAGE: &str = "projects/test-project/global/images/cos-test";

/// The subnetwork of the cluster's node pool.
const SUBNETWORK: &str = "projects/test-project/regions/us-central1/subnetworks/nodes";

/// The GCP provider on the fake, whose world has the image [`IMAGE`] and a node pool template.
async fn provider() -> Arc<GcpProvider> {
    let (endpoint, world) = fake::start().await;
    world.lock().unwrap().images.insert(
        format!("{PROJECT}/cos-test"),
        json!({"kind": "compute#image", "id": "7", "name": "cos-test", "architecture": "X86_64", "status": "READY",
            "selfLink": format!("https://www.googleapis.com/compute/v1/{IMAGE}")}),
    );
    // The cluster's node pool template, which the network comes from.
    world.lock().unwrap().templates.insert(
        REGION.into(),
        vec![json!({
            "kind": "compute#instanceTemplate", "id": "11", "name": "gke-tenon-e2e-default-pool-1",
            "properties": {
                "labels": {"goog-k8s-node-pool-name": "default-pool"},
                "networkInterfaces": [{"network": format!("projects/{PROJECT}/global/networks/default"),
                    "subnetwork": SUBNETWORK}],
                "metadata": {"items": [{"key": "cluster-name", "value": "tenon-e2e"}, {"key": "kube-env", "value": "ZONE: x\n"}]}
            }
        })],
    );
    let mut s = GcpSettings::new(PROJECT, REGION, "tenon-e2e");
    s.endpoint = Some(endpoint);
    let anonymous = google_cloud_auth::credentials::anonymous::Builder::new().build();
    Arc::new(GcpProvider::new(s, Some(anonymous)).await.unwrap())
}

fn class(name: &str, image: &str) -> GCENodeClass {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.gcp/v1alpha1", "kind": "GCENodeClass",
        "metadata": {"name": name},
        "spec": {"imageSelectorTerms": [{"id": image}]},
    }))
    .unwrap()
}

/// The condition `type_` of `class`, as (status, reason, message).
fn condition(class: &GCENodeClass, type_: &str) -> Option<(String, String, String)> {
    common::condition_of(class, type_)
}

fn has_finalizer(class: &GCENodeClass) -> bool {
    common::has_finalizer_of(class, FINALIZER)
}

#[test]
fn gce_node_classes_get_the_finalizer_and_their_status_and_stay_while_claims_name_them() {
    let kubeconfig = install_chart();
    let audit = Audit::start();
    let admin_kubeconfig = common::env().1;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let admin = common::client_from(&admin_kubeconfig).await;
        let operator = common::client_from(&kubeconfig).await;
        let classes = Api::<GCENodeClass>::all(admin.clone());
        let claims = Api::<NodeClaim>::all(admin.clone());
        let id = format!("gce-{}", std::process::id());
        let (good, missing) = (id.clone(), format!("{id}-missing"));
        let missing_image = "projects/test-project/global/images/no-such-image";
        for c in [class(&good, IMAGE), class(&missing, missing_image)] {
            classes.create(&PostParams::default(), &c).await.unwrap();
        }

        // A standby replica: the provider is fed its classes, nothing is written.
        let provider = provider().await;
        let (lead, leading) = tokio::sync::watch::channel(false);
        let mut cluster = KubeCluster::start(operator.clone(), Reporter { controller: "tenon".into(), instance: None });
        tenon::node_classes::feed(provider.clone(), &operator, leading)(&mut cluster);
        cluster.wait_synced().await;
        real_time(Duration::from_secs(30))
            .until("the provider to know the class", async || provider.resolve_node_class(&good).await.ok())
            .await;
        assert!(!has_finalizer(&classes.get(&good).await.unwrap()), "a standby wrote the finalizer");

        // Leading: the finalizer and the status.
        lead.send_replace(true);
        let written = real_time(Duration::from_secs(60))
            .until("the class's finalizer and Ready condition", async || {
                let c = classes.get(&good).await.ok()?;
                (has_finalizer(&c) && condition(&c, READY).is_some()).then_some(c)
            })
            .await;
        for type_ in [VALIDATION_SUCCEEDED, IMAGES_READY, NETWORK_READY, READY] {
            let (status, ..) = condition(&written, type_).unwrap_or_else(|| panic!("no {type_}: {written:?}"));
            assert_eq!(status, "True", "{type_}: {written:?}");
        }
        let images: Vec<&str> =
            written.status.as_ref().unwrap().images.iter().map(|i| i.source_image.as_str()).collect();
        assert_eq!(images, [IMAGE]);
        assert_eq!(written.status.as_ref().unwrap().subnetwork.as_deref(), Some(SUBNETWORK));

        // The class whose image does not exist: ImagesReady False, naming the class's terms.
        let unready = real_time(Duration::from_secs(60))
            .until("the missing image's condition", async || {
                let c = classes.get(&missing).await.ok()?;
                condition(&c, IMAGES_READY).is_some().then_some(c)
            })
            .await;
        assert!(has_finalizer(&unready));
        let (status, reason, message) = condition(&unready, IMAGES_READY).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("False", "ImageResolutionFailed"), "{message}");
        assert!(
            message.contains(&format!("GCENodeClass/{missing}")) && message.contains("spec.imageSelectorTerms"),
            "{message}"
        );
        let (status, reason, message) = condition(&unready, READY).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NotReady"), "{message}");
        assert!(message.contains(IMAGES_READY), "{message}");

        // Deleted while a NodeClaim names it: the finalizer stays until the claim goes.
        let claim_name = format!("{id}-claim");
        let r = NodeClassRef { group: GROUP.into(), kind: KIND.into(), name: good.clone() };
        let claim = NodeClaim::new(&claim_name, NodeClaimSpec { node_class_ref: Some(r), ..Default::default() });
        claims.create(&PostParams::default(), &claim).await.unwrap();
        classes.delete(&good, &DeleteParams::default()).await.unwrap();
        let deleting = classes.get(&good).await.unwrap();
        assert!(deleting.metadata.deletion_timestamp.is_some() && has_finalizer(&deleting), "{deleting:?}");
        // The controller lists the claims on each pass over the deleted class (the API server's audit log
        // shows it): through two passes, the finalizer stays.
        let since_deletion = Audit::start();
        real_time(Duration::from_secs(60))
            .until("two passes over the deleted class", async || {
                let passes = since_deletion
                    .requests()
                    .iter()
                    .filter(|r| r.verb == "list" && r.uri == "/apis/karpenter.sh/v1/nodeclaims?")
                    .count();
                let waiting = classes.get_opt(&good).await.unwrap();
                assert!(
                    waiting.as_ref().is_some_and(has_finalizer),
                    "the finalizer went while a claim names the class: {waiting:?}"
                );
                (passes >= 2).then_some(())
            })
            .await;
        claims.delete(&claim_name, &DeleteParams::default()).await.unwrap();
        real_time(Duration::from_secs(60))
            .until("the class to go once its claim went", async || {
                matches!(classes.get_opt(&good).await, Ok(None)).then_some(())
            })
            .await;
        real_time(Duration::from_secs(30))
            .until("the provider to forget the class", async || {
                provider.resolve_node_class(&good).await.is_err().then_some(())
            })
            .await;

        // The class without a claim goes at once.
        classes.delete(&missing, &DeleteParams::default()).await.unwrap();
        real_time(Duration::from_secs(60))
            .until("the unready class to go", async || {
                matches!(classes.get_opt(&missing).await, Ok(None)).then_some(())
            })
            .await;
        drop(cluster);
    });
    let made = audit.assert_nothing_forbidden();
    assert!(made > 0, "the controller made no call as the chart's ServiceAccount");
}
