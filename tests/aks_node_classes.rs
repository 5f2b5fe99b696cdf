//! The AKSNodeClass controller ([`tenon::node_classes`]) against a real kube-apiserver
//! (`scripts/peers/kube.sh`, started by `scripts/test.sh`) and the providers' Resource Manager fake
//! (`providers/tests/azure/fake.rs`, checked against Microsoft's published models, found through
//! `TENON_AZURE_MODELS`): the Azure provider is fed its classes by the operator's own watch, and while
//! the replica leads each class gets the `karpenter.azure.com/termination` finalizer and its status
//! (node images, Kubernetes version and conditions); a class whose family has no published image is not
//! ready, naming it. The controller runs as the chart's ServiceAccount, under the RBAC the chart renders:
//! a call it refused fails the test.
#![cfg(feature = "azure")]
#![allow(clippy::expect_used, clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

mod common;

#[path = "../providers/tests/azure/fake.rs"]
#[allow(unreachable_pub, clippy::unwrap_used, clippy::expect_used)]
mod fake;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::events::Reporter;
use serde_json::json;
use tenon::kube::KubeCluster;
use tenon_providers::azure::images::UBUNTU_GALLERY;
use tenon_providers::azure::nodeclass::FINALIZER;
use tenon_providers::azure::status::condition_types::{IMAGES_READY, READY, SUBNETS_READY, VALIDATION_SUCCEEDED};
use tenon_providers::azure::{AKSNodeClass, AzureProvider, AzureSettings};

use common::{Audit, install_chart, real_time};

const SUBNET: &str = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes";

/// The Azure provider on the fake, whose galleries publish the Ubuntu 22.04 node images only.
async fn provider() -> Arc<AzureProvider> {
    let (endpoint, world) = fake::start().await;
    for image in ["2204gen2containerd", "2204containerd", "2204gen2arm64containerd"] {
        world.lock().unwrap().gallery_versions.insert(
            (UBUNTU_GALLERY.into(), image.into()),
            vec![fake::gallery_version(UBUNTU_GALLERY, image, "202511.10.0", "eastus")],
        );
    }
    let mut s = AzureSettings::new("s", "MC_rg_tenon-e2e_eastus", "eastus", "tenon-e2e");
    s.endpoint = Some(endpoint);
    s.vnet_subnet_id = Some(SUBNET.into());
    let p = AzureProvider::new(s, Some(Arc::new(fake::StaticToken))).unwrap();
    p.set_kubernetes_version("v1.33.2").unwrap();
    Arc::new(p)
}

fn class(name: &str, family: &str) -> AKSNodeClass {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.azure.com/v1beta1", "kind": "AKSNodeClass",
        "metadata": {"name": name}, "spec": {"imageFamily": family},
    }))
    .unwrap()
}

/// The condition `type_` of `class`, as (status, reason, message).
fn condition(class: &AKSNodeClass, type_: &str) -> Option<(String, String, String)> {
    common::condition_of(class, type_)
}

fn has_finalizer(class: &AKSNodeClass) -> bool {
    common::has_finalizer_of(class, FINALIZER)
}

#[test]
fn aks_node_classes_get_the_finalizer_and_their_status() {
    let kubeconfig = install_chart();
    let audit = Audit::start();
    let admin_kubeconfig = common::env().1;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let admin = common::client_from(&admin_kubeconfig).await;
        let operator = common::client_from(&kubeconfig).await;
        let classes = Api::<AKSNodeClass>::all(admin.clone());
        let id = format!("aks-{}", std::process::id());
        let (good, azure_linux) = (id.clone(), format!("{id}-azl"));
        for c in [class(&good, "Ubuntu2204"), class(&azure_linux, "AzureLinux")] {
            classes.create(&PostParams::default(), &c).await.unwrap();
        }
        // The API server's schema holds the enum: a family not known is refused.
        let err = classes.create(&PostParams::default(), &class(&format!("{id}-bad"), "Windows")).await;
        assert!(err.is_err(), "imageFamily Windows was accepted");

        let provider = provider().await;
        let (lead, leading) = tokio::sync::watch::channel(false);
        let mut cluster = KubeCluster::start(operator.clone(), Reporter { controller: "tenon".into(), instance: None });
        tenon::node_classes::feed(provider.clone(), &operator, leading)(&mut cluster);
        cluster.wait_synced().await;
        real_time(Duration::from_secs(30))
            .until("the provider to know the class", async || provider.resolve_node_class(&good).await.ok())
            .await;
        assert!(!has_finalizer(&classes.get(&good).await.unwrap()), "a standby wrote the finalizer");

        lead.send_replace(true);
        let written = real_time(Duration::from_secs(60))
            .until("the class's finalizer and Ready condition", async || {
                let c = classes.get(&good).await.ok()?;
                (has_finalizer(&c) && condition(&c, READY).is_some()).then_some(c)
            })
            .await;
        for type_ in [VALIDATION_SUCCEEDED, IMAGES_READY, SUBNETS_READY, READY] {
            let (status, ..) = condition(&written, type_).unwrap_or_else(|| panic!("no {type_}: {written:?}"));
            assert_eq!(status, "True", "{type_}: {written:?}");
        }
        let status = written.status.as_ref().unwrap();
        assert_eq!(status.kubernetes_version.as_deref(), Some("1.33.2"));
        let ids: Vec<&str> = status.images.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids.len(), 3, "{ids:?}");
        assert!(ids[0].ends_with("/images/2204gen2containerd/versions/202511.10.0"), "{ids:?}");

        // Azure Linux 3 (Kubernetes 1.33) has no published image here: not ready, naming the class.
        let unready = real_time(Duration::from_secs(60))
            .until("the Azure Linux class's condition", async || {
                let c = classes.get(&azure_linux).await.ok()?;
                condition(&c, IMAGES_READY).is_some().then_some(c)
            })
            .await;
        let (status, reason, message) = condition(&unready, IMAGES_READY).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("False", "ImagesNotFound"), "{message}");
        assert!(message.contains(&format!("AKSNodeClass/{azure_linux}")) && message.contains("V3gen2"), "{message}");

        for name in [&good, &azure_linux] {
            classes.delete(name, &DeleteParams::default()).await.unwrap();
        }
        for name in [&good, &azure_linux] {
            real_time(Duration::from_secs(60))
                .until("the class to go", async || matches!(classes.get_opt(name).await, Ok(None)).then_some(()))
                .await;
        }
        real_time(Duration::from_secs(30))
            .until("the provider to forget the class", async || {
                provider.resolve_node_class(&good).await.is_err().then_some(())
            })
            .await;
        drop(cluster);
    });
    let made = audit.assert_nothing_forbidden();
    assert!(made > 0, "the controller made no call as the chart's ServiceAccount");
}
