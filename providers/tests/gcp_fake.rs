//! The GCP provider against a local fake of Compute Engine's REST API (`gce/fake.rs`), whose every request
//! and answer is checked against Google's discovery document (see that module for how). No GCE emulator
//! exists; the fake serves what a test puts in its world: machine types (as `machineTypes.aggregatedList`
//! describes a3-highgpu-8g, g2-standard-24, n2-standard-8 and e2-standard-4), an image, and faults.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gce/fake.rs"]
mod fake;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use tenon_core::api::{
    NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassRef, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator,
    labels,
};
use tenon_core::cloud::conformance::{self, Harness};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DynCloudProvider, LaunchOptions, OfferingKey, UnavailableOfferings,
};
use tenon_core::resources::ResourceName;
use tenon_providers::gcp::{GCENodeClass, GcpProvider, GcpSettings, LABEL_CLUSTER, LABEL_NODE_POOL};

const PROJECT: &str = "test-project";
const REGION: &str = "us-central1";
const ZONES: [&str; 3] = ["us-central1-a", "us-central1-b", "us-central1-c"];
const IMAGE: &str = "projects/test-project/global/images/cos-test";

/// A machine type as Compute Engine lists it (published shapes).
fn machine_type(name: &str, zone: &str, vcpu: i64, memory_mb: i64, gpus: Option<(&str, i64)>) -> serde_json::Value {
    let mut m = json!({
        "kind": "compute#machineType", "id": "1", "name": name, "guestCpus": vcpu, "memoryMb": memory_mb,
        "zone": zone, "isSharedCpu": false, "maximumPersistentDisks": 128, "architecture": "X86_64",
        "selfLink": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/machineTypes/{name}"),
    });
    if let Some((model, count)) = gpus {
        m["accelerators"] = json!([{"guestAcceleratorType": model, "guestAcceleratorCount": count}]);
    }
    m
}

struct Env {
    world: fake::Shared,
    provider: Arc<GcpProvider>,
    cluster: String,
    cache: Arc<UnavailableOfferings>,
}

impl Env {
    async fn new(cluster: &str) -> Self {
        let (endpoint, world) = fake::start().await;
        {
            let mut w = world.lock().unwrap();
            for zone in ZONES {
                let mut types = vec![
                    machine_type("n2-standard-8", zone, 8, 32_768, None),
                    machine_type("e2-standard-4", zone, 4, 16_384, None),
                    machine_type("g2-standard-24", zone, 24, 98_304, Some(("nvidia-l4", 2))),
                ];
                if zone != "us-central1-c" {
                    types.push(machine_type("a3-highgpu-8g", zone, 208, 1_916_928, Some(("nvidia-h100-80gb", 8))));
                }
                w.machine_types.insert(zone.to_owned(), types);
            }
            // Another region's zone is never offered.
            w.machine_types.insert(
                "europe-west4-a".into(),
                vec![machine_type("n2-standard-8", "europe-west4-a", 8, 32_768, None)],
            );
            w.templates.insert(REGION.into(), vec![gke_template(cluster, "default-pool")]);
            w.images.insert(
                format!("{PROJECT}/cos-test"),
                json!({"kind": "compute#image", "id": "7", "name": "cos-test", "architecture": "X86_64", "status": "READY",
                    "selfLink": format!("https://www.googleapis.com/compute/v1/{IMAGE}")}),
            );
        }
        let mut s = GcpSettings::new(PROJECT, REGION, cluster);
        s.endpoint = Some(endpoint);
        s.operation_poll = std::time::Duration::from_millis(5);
        s.operation_timeout = std::time::Duration::from_secs(5);
        let anonymous = google_cloud_auth::credentials::anonymous::Builder::new().build();
        let cache = Arc::new(UnavailableOfferings::new());
        let provider = GcpProvider::new(s, Some(anonymous)).await.unwrap().with_unavailable_offerings(cache.clone());
        provider.apply_node_class(class(json!({}))).unwrap();
        Self { world, provider: Arc::new(provider), cluster: cluster.to_owned(), cache }
    }

    fn pool(&self) -> NodePool {
        let mut pool = NodePool::new("default", NodePoolSpec::default());
        pool.spec.template.spec.node_class_ref = Some(class_ref());
        pool
    }

    fn claim(&self, name: &str, reqs: Vec<NodeSelectorRequirement>) -> NodeClaim {
        let mut c = NodeClaim::new(
            name,
            NodeClaimSpec { requirements: reqs, node_class_ref: Some(class_ref()), ..Default::default() },
        );
        c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
        c
    }

    /// Another provider on the same fake, its settings changed by `f`, with the class `extra` applied.
    async fn provider_with(&self, f: impl FnOnce(&mut GcpSettings), extra: serde_json::Value) -> GcpProvider {
        let mut s = self.provider.settings().clone();
        f(&mut s);
        let anonymous = google_cloud_auth::credentials::anonymous::Builder::new().build();
        let p = GcpProvider::new(s, Some(anonymous)).await.unwrap();
        p.apply_node_class(class(extra)).unwrap();
        p
    }

    fn fail(&self, machine: &str, zone: &str, fault: fake::Fault) {
        self.world.lock().unwrap().faults.push((machine.into(), zone.into(), fault));
    }
}

/// A GKE node pool's regional instance template, as GKE writes one (trimmed to what nodes boot from).
fn gke_template(cluster: &str, pool: &str) -> serde_json::Value {
    let kube_env = format!(
        "CLUSTER_NAME: {cluster}\nZONE: us-central1-a\nKUBERNETES_MASTER_NAME: 10.0.0.2\nKUBELET_ARGS: \"--v=2 --cloud-provider=external --max-pods=110 --node-labels=cloud.google.com/gke-nodepool={pool}\"\n"
    );
    json!({
        "kind": "compute#instanceTemplate", "id": "11", "name": format!("gke-{cluster}-{pool}-abc123"),
        "region": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/regions/{REGION}"),
        "properties": {
            "machineType": "e2-medium",
            "labels": {"goog-k8s-node-pool-name": pool, "goog-k8s-cluster-name": cluster},
            "tags": {"items": [format!("gke-{cluster}-1a2b3c4d-node")]},
            "networkInterfaces": [{"network": format!("projects/{PROJECT}/global/networks/default"),
                "subnetwork": format!("projects/{PROJECT}/regions/{REGION}/subnetworks/default"),
                "aliasIpRanges": [{"ipCidrRange": "/24", "subnetworkRangeName": "gke-pods-1a2b"}]}],
            "serviceAccounts": [{"email": "nodes@test-project.iam.gserviceaccount.com",
                "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}],
            "metadata": {"items": [
                {"key": "kube-env", "value": kube_env},
                {"key": "cluster-name", "value": cluster},
                {"key": "cluster-location", "value": REGION},
                {"key": "configure-sh", "value": "#!/bin/bash\necho configure"},
                {"key": "kubeconfig", "value": "apiVersion: v1\nkind: Config"},
                {"key": "user-data", "value": "#cloud-config"},
            ]}
        }
    })
}

fn class(extra: serde_json::Value) -> GCENodeClass {
    let mut spec = json!({"imageSelectorTerms": [{"id": IMAGE}], "networkTags": ["gke-test-node"],
        "disks": [{"category": "pd-balanced", "sizeGiB": 100, "boot": true}]});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({"apiVersion": "karpenter.k8s.gcp/v1alpha1", "kind": "GCENodeClass",
        "metadata": {"name": "default"}, "spec": spec}))
    .unwrap()
}

fn class_ref() -> NodeClassRef {
    NodeClassRef { group: "karpenter.k8s.gcp".into(), kind: "GCENodeClass".into(), name: "default".into() }
}

fn req(key: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement::new(key, Operator::In, values.iter().copied())
}

fn with_provider_id(mut claim: NodeClaim, pid: &str) -> NodeClaim {
    claim.status = Some(NodeClaimStatus { provider_id: Some(pid.to_owned()), ..Default::default() });
    claim
}

struct FakeHarness {
    env: Env,
}

#[async_trait]
impl Harness for FakeHarness {
    fn provider(&self) -> DynCloudProvider {
        self.env.provider.clone()
    }
    fn node_class_ref(&self) -> Option<NodeClassRef> {
        Some(class_ref())
    }
    fn max_polls(&self) -> usize {
        10
    }
    async fn make_insufficient(&self, offering: &OfferingKey) -> bool {
        self.env.fail(
            &offering.instance_type,
            &offering.zone,
            fake::Fault::Operation("ZONE_RESOURCE_POOL_EXHAUSTED".into(), "injected".into()),
        );
        true
    }
    async fn create_foreign_instance(&self) -> Option<String> {
        let mut w = self.env.world.lock().unwrap();
        let zone = ZONES[0];
        w.instances.insert(
            (zone.into(), "someone-elses".into()),
            json!({"kind": "compute#instance", "id": "99", "name": "someone-elses", "status": "RUNNING",
                "zone": format!("zones/{zone}"), "machineType": format!("zones/{zone}/machineTypes/n2-standard-8"),
                "labels": {LABEL_CLUSTER: "another-cluster", LABEL_NODE_POOL: "default"}}),
        );
        Some(format!("gce://{PROJECT}/{zone}/someone-elses"))
    }
}

/// The core's conformance suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_passes_the_conformance_suite() {
    let h = FakeHarness { env: Env::new("conformance").await };
    conformance::assert_conformance(&h).await;
}

/// GPUs are counted from the machine types' accelerators (a3-highgpu-8g has 8 H100s, g2-standard-24 two
/// L4s); zones are where each type is listed; prices come from the bundled table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_types_become_instance_types_with_their_gpus_zones_and_prices() {
    let env = Env::new("gpus").await;
    let types = env.provider.instance_types(&env.pool()).await.unwrap();
    let get = |n: &str| types.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n} missing"));
    assert_eq!(get("a3-highgpu-8g").capacity.get(ResourceName::NVIDIA_GPU), 8);
    assert_eq!(get("g2-standard-24").capacity.get(ResourceName::NVIDIA_GPU), 2);
    assert_eq!(get("g2-standard-24").labels["cloud.google.com/gke-accelerator"], "nvidia-l4");
    let a3_zones: std::collections::BTreeSet<&str> =
        get("a3-highgpu-8g").offerings.iter().map(|o| o.zone.as_str()).collect();
    assert_eq!(a3_zones, ["us-central1-a", "us-central1-b"].into());
    let g2 = get("g2-standard-24");
    assert_eq!(g2.offering("us-central1-a", CapacityType::OnDemand).unwrap().price, 2.000832574);
    assert!(g2.offering("us-central1-a", CapacityType::Spot).unwrap().available);
    assert!(types.iter().all(|t| t.offerings.iter().all(|o| o.zone.starts_with("us-central1-"))));
}

/// A spot launch asks Compute Engine for SPOT with instanceTerminationAction DELETE, carries the ownership
/// labels and is named after the claim; list, get and delete see it; drift follows the class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_launch_carries_spot_scheduling_and_ownership_labels() {
    let env = Env::new("spot").await;
    let claim = env.claim("spot-1", vec![req(labels::INSTANCE_TYPE, &["n2-standard-8"])]);
    let i = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!(i.capacity_type, CapacityType::Spot);
    let body = env.world.lock().unwrap().inserted.last().cloned().unwrap();
    assert_eq!(body["name"], "karpenter-spot-1");
    assert_eq!(body["scheduling"]["provisioningModel"], "SPOT");
    assert_eq!(body["scheduling"]["instanceTerminationAction"], "DELETE");
    assert_eq!(body["labels"][LABEL_CLUSTER], env.cluster);
    assert_eq!(body["labels"]["karpenter-sh-nodeclaim"], "spot-1");
    assert!(body["tags"]["items"].as_array().unwrap().contains(&json!("gke-test-node")));
    assert_eq!(body["disks"][0]["initializeParams"]["sourceImage"], IMAGE);
    let claim = with_provider_id(claim, &i.provider_id);
    assert_eq!(env.provider.list().await.unwrap().len(), 1);
    assert_eq!(env.provider.get(&i.provider_id).await.unwrap().instance_type, "n2-standard-8");
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap(), None);
    env.provider.apply_node_class(class(json!({"networkTags": ["other"]}))).unwrap();
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap().unwrap().0, "NodeClassDrift");
    env.provider.delete(&claim).await.unwrap();
    assert!(env.provider.get(&i.provider_id).await.unwrap_err().is_not_found());
}

/// Each error code: a zone without capacity marks the offering unavailable and the next cheapest is
/// tried; a used-up GPU quota blocks every offering of that GPU; 403 is Unauthorized, 429 Throttled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_errors_are_classified() {
    let env = Env::new("errors").await;
    let od = |t: &str| vec![req(labels::INSTANCE_TYPE, &[t]), req(labels::CAPACITY_TYPE, &["on-demand"])];
    env.fail(
        "n2-standard-8",
        "us-central1-a",
        fake::Fault::Operation("ZONE_RESOURCE_POOL_EXHAUSTED".into(), "no n2 here".into()),
    );
    let i = env.provider.create(&env.claim("ice-1", od("n2-standard-8")), &LaunchOptions::default()).await.unwrap();
    assert_ne!(i.zone, "us-central1-a", "the next zone");
    let key = OfferingKey::new("n2-standard-8", "us-central1-a", CapacityType::OnDemand);
    assert!(env.cache.is_unavailable("gcp", &key, jiff::Timestamp::now()));

    let quota = "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.";
    env.fail("g2-standard-24", "*", fake::Fault::Operation("QUOTA_EXCEEDED".into(), quota.into()));
    let err =
        env.provider.create(&env.claim("quota-1", od("g2-standard-24")), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");
    let types = env.provider.instance_types(&env.pool()).await.unwrap();
    let g2 = types.iter().find(|t| t.name == "g2-standard-24").unwrap();
    assert!(g2.offerings.iter().all(|o| !o.available), "the L4 quota blocks every g2 offering");
    assert!(types.iter().find(|t| t.name == "e2-standard-4").unwrap().offerings.iter().any(|o| o.available));

    env.fail("e2-standard-4", "*", fake::Fault::Http(403));
    let err =
        env.provider.create(&env.claim("denied", od("e2-standard-4")), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::Unauthorized(_)), "{err}");
    env.world.lock().unwrap().faults.retain(|(t, _, _)| t != "e2-standard-4");
    env.fail("e2-standard-4", "*", fake::Fault::Http(429));
    let err =
        env.provider.create(&env.claim("slow", od("e2-standard-4")), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::Throttled { .. }), "{err}");
}

/// The fake holds itself to the discovery document: a body field Compute Engine does not have is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_refuses_what_compute_engine_would() {
    assert!(fake::check("Instance", &json!({"name": "x", "scheduling": {"provisioningModel": "SPOT"}})).is_ok());
    let e = fake::check("Instance", &json!({"name": "x", "schedulingg": {}})).unwrap_err();
    assert!(e.contains("schedulingg"), "{e}");
    assert!(fake::check("Instance", &json!({"scheduling": {"provisioningModel": "CHEAP"}})).is_err());
    assert!(
        fake::check("Operation", &json!({"error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED"}]}})).is_ok()
    );
}

/// The core's controllers in virtual time against the fake: pending GPU pods get a g2 node (two L4s per
/// machine, priced from the table), spot first; when Compute Engine preempts it, the claim is replaced
/// elsewhere and the pods run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_gpu_pods_get_instances_and_a_preempted_one_is_replaced_in_virtual_time() {
    use std::time::Duration;
    use tenon_core::clock::VirtualClock;
    use tenon_core::sim::{Sim, pod};
    let env = Env::new("sim").await;
    let clock = VirtualClock::at_epoch();
    let s = env.provider.settings().clone();
    let anonymous = google_cloud_auth::credentials::anonymous::Builder::new().build();
    let provider = Arc::new(GcpProvider::new(s, Some(anonymous)).await.unwrap().with_clock(clock.clone()));
    provider.apply_node_class(class(json!({}))).unwrap();
    let mut sim = Sim::new(clock, provider.clone(), vec![env.pool()], Default::default());
    for i in 0..2 {
        sim.add_pod(pod(&format!("infer-{i}"), "4", 1));
    }
    sim.run(Duration::from_secs(180), Duration::from_secs(10)).await;
    assert!(sim.pending().is_empty(), "the pods are bound: {:?}", sim.pending());
    let first = sim.live_claims()[0].clone();
    assert_eq!(sim.live_claims().len(), 1, "both pods on one two-GPU machine");
    assert_eq!(first.label(labels::INSTANCE_TYPE), Some("g2-standard-24"));
    assert_eq!(first.label(labels::CAPACITY_TYPE), Some("spot"));
    let pid = first.provider_id().unwrap().to_owned();

    // Compute Engine preempts the spot instance.
    let (_, zone, name) = tenon_providers::gcp::parse_provider_id(&pid).unwrap();
    env.world.lock().unwrap().instances.get_mut(&(zone.to_owned(), name.to_owned())).unwrap()["status"] =
        json!("TERMINATED");
    sim.run(Duration::from_secs(300), Duration::from_secs(10)).await;
    assert_eq!(sim.runtime.lifecycle.counters.interruptions, 1);
    let live = sim.live_claims();
    assert_eq!(live.len(), 1, "one replacement");
    assert_ne!(live[0].provider_id(), Some(pid.as_str()));
    assert!(sim.pending().is_empty(), "the pods run again: {:?}", sim.pending());
    assert_eq!(provider.list().await.unwrap().iter().filter(|i| i.provider_id != pid).count(), 1);
}

/// Nodes join GKE with the bootstrap of one of its node pools: the instance takes the template's
/// bootstrap metadata, with `kube-env` rewritten for the claim (its zone, labels, taints, pods), and the
/// template's network, pods' range, firewall tags and service account; a cluster without a node pool
/// template is not ready, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_gke_with_a_node_pools_bootstrap_rewritten_for_the_claim() {
    let env = Env::new("gke").await;
    let mut claim = env.claim("join-1", vec![req(labels::INSTANCE_TYPE, &["e2-standard-4"]), req("team", &["ml"])]);
    claim.spec.taints = vec![k8s_openapi::api::core::v1::Taint {
        key: "dedicated".into(),
        value: Some("ml".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }];
    let i = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap();
    let body = env.world.lock().unwrap().inserted.last().cloned().unwrap();
    let md: std::collections::BTreeMap<String, String> = body["metadata"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["key"].as_str().unwrap().to_owned(), i["value"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(md["cluster-name"], "gke");
    assert_eq!(md["configure-sh"], "#!/bin/bash\necho configure");
    assert!(md.contains_key("kubeconfig"));
    let env_lines: std::collections::BTreeMap<String, String> =
        tenon_providers::gcp::bootstrap::parse_kube_env(&md["kube-env"]).into_iter().collect();
    assert_eq!(env_lines["ZONE"], i.zone);
    let args = &env_lines["KUBELET_ARGS"];
    assert!(args.contains("--cloud-provider=external") && args.contains("--max-pods=110"), "{args}");
    assert!(args.contains("karpenter.sh/nodepool=default") && args.contains("team=ml"), "{args}");
    assert!(args.contains("karpenter.sh/capacity-type=spot"), "{args}");
    assert!(
        args.contains("--register-with-taints=dedicated=ml:NoSchedule,karpenter.sh/unregistered=true:NoExecute"),
        "{args}"
    );
    let nic = &body["networkInterfaces"][0];
    assert_eq!(nic["subnetwork"], format!("projects/{PROJECT}/regions/{REGION}/subnetworks/default"));
    assert_eq!(nic["aliasIpRanges"][0]["subnetworkRangeName"], "gke-pods-1a2b");
    assert_eq!(nic["aliasIpRanges"][0]["ipCidrRange"], "/24", "110 pods");
    let tags: Vec<&str> = body["tags"]["items"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tags, ["gke-gke-1a2b3c4d-node", "gke-test-node"], "GKE's firewall tag, then the class's");
    assert_eq!(body["serviceAccounts"][0]["email"], "nodes@test-project.iam.gserviceaccount.com");

    env.world.lock().unwrap().templates.clear();
    let mut s = env.provider.settings().clone();
    s.cluster_name = "no-pools".into();
    let anonymous = google_cloud_auth::credentials::anonymous::Builder::new().build();
    let bare = GcpProvider::new(s, Some(anonymous)).await.unwrap();
    bare.apply_node_class(class(json!({}))).unwrap();
    let err = bare.create(&env.claim("join-2", vec![]), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("GKE cluster no-pools")), "{err}");
}

/// An image as Compute Engine describes one.
fn image(project: &str, name: &str, arm: bool, created: &str) -> (String, serde_json::Value) {
    (
        format!("{project}/{name}"),
        json!({"kind": "compute#image", "id": "8", "name": name, "status": "READY", "creationTimestamp": created,
            "architecture": if arm { "ARM64" } else { "X86_64" },
            "selfLink": format!("https://www.googleapis.com/compute/v1/projects/{project}/global/images/{name}")}),
    )
}

fn metadata_of(body: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    body["metadata"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["key"].as_str().unwrap().to_owned(), i["value"].as_str().unwrap().to_owned()))
        .collect()
}

/// Image families resolve to GKE's node images of the cluster's version: Container-Optimized OS boots
/// machines without GPUs from its plain build and GPU machines from its NVIDIA build; an upgrade of the
/// cluster moves the family to the new build, and nodes of the old one drift. Ubuntu resolves one image
/// per architecture. A release channel takes the build GKE's server config promotes for the cluster's
/// minor (`cluster`: the channel the cluster is enrolled in), and only that build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_families_follow_the_clusters_version_to_gkes_node_images() {
    let env = Env::new("images").await;
    {
        let mut w = env.world.lock().unwrap();
        for (name, arm) in [
            ("gke-1335-gke1080000-cos-121-18867-199-28-c-pre", false),
            ("gke-1335-gke1080000-cos-arm64-121-18867-199-28-c-pre", true),
            ("gke-1335-gke1080000-cos-121-18867-199-28-c-nvda", false),
            ("gke-1335-gke1080000-cos-121-18867-199-28-gvisor-c-pre", false),
            ("gke-1340-gke1000000-cos-125-19216-104-126-c-pre", false),
        ] {
            let (k, v) = image("gke-node-images", name, arm, "2026-10-01T00:00:00.000-07:00");
            w.images.insert(k, v);
        }
        for (name, arm) in
            [("ubuntu-gke-2404-1-33-amd64-v20260416", false), ("ubuntu-gke-2404-1-33-arm64-v20260416", true)]
        {
            let (k, v) = image("ubuntu-os-gke-cloud", name, arm, "2026-04-16T00:00:00.000-07:00");
            w.images.insert(k, v);
        }
    }
    let cos = json!({"imageSelectorTerms": [{"family": "ContainerOptimizedOS", "version": "latest"}]});
    let provider = env.provider_with(|_| {}, cos.clone()).await;
    let cpu = env.claim("cos-cpu", vec![req(labels::INSTANCE_TYPE, &["n2-standard-8"])]);
    let err = provider.create(&cpu, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("Kubernetes version")), "{err}");

    provider.set_kubernetes_version("v1.33.5-gke.1080000").unwrap();
    let i = provider.create(&cpu, &LaunchOptions::default()).await.unwrap();
    let source = |w: &fake::World| w.inserted.last().unwrap()["disks"][0]["initializeParams"]["sourceImage"].clone();
    let plain = "projects/gke-node-images/global/images/gke-1335-gke1080000-cos-121-18867-199-28-c-pre";
    assert_eq!(source(&env.world.lock().unwrap()), plain);
    assert_eq!(i.image_id.as_deref(), Some(plain));
    let gpu = env.claim("cos-gpu", vec![req(labels::INSTANCE_TYPE, &["g2-standard-24"])]);
    provider.create(&gpu, &LaunchOptions::default()).await.unwrap();
    assert_eq!(
        source(&env.world.lock().unwrap()),
        "projects/gke-node-images/global/images/gke-1335-gke1080000-cos-121-18867-199-28-c-nvda"
    );

    // The cluster is upgraded and GKE publishes the new build: the family follows, the old node drifts.
    {
        let (k, v) = image(
            "gke-node-images",
            "gke-1336-gke1010000-cos-121-18867-230-4-c-pre",
            false,
            "2026-11-20T00:00:00.000-07:00",
        );
        env.world.lock().unwrap().images.insert(k, v);
    }
    let mut cpu = with_provider_id(cpu, &i.provider_id);
    cpu.status.as_mut().unwrap().image_id = i.image_id.clone();
    assert_eq!(provider.is_drifted(&cpu).await.unwrap(), None);
    provider.set_kubernetes_version("v1.33.6-gke.1010000").unwrap();
    assert_eq!(provider.is_drifted(&cpu).await.unwrap().unwrap().0, "ImageDrift");
    // The new build has no NVIDIA variant: GPU machines boot its plain image.
    let types = provider.instance_types(&env.pool()).await.unwrap();
    assert!(types.iter().any(|t| t.name == "g2-standard-24"), "GPU machines stay offered on the plain build");
    provider
        .create(
            &env.claim("cos-gpu-2", vec![req(labels::INSTANCE_TYPE, &["g2-standard-24"])]),
            &LaunchOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        source(&env.world.lock().unwrap()),
        "projects/gke-node-images/global/images/gke-1336-gke1010000-cos-121-18867-230-4-c-pre"
    );

    let ubuntu = env.provider_with(|_| {}, json!({"imageSelectorTerms": [{"alias": "Ubuntu@latest"}]})).await;
    ubuntu.set_kubernetes_version("v1.33.5-gke.1080000").unwrap();
    ubuntu
        .create(&env.claim("ubuntu-1", vec![req(labels::INSTANCE_TYPE, &["e2-standard-4"])]), &LaunchOptions::default())
        .await
        .unwrap();
    assert_eq!(
        source(&env.world.lock().unwrap()),
        "projects/ubuntu-os-gke-cloud/global/images/ubuntu-gke-2404-1-33-amd64-v20260416"
    );

    // Release channels, from GKE's server config: STABLE promotes an older build of the minor, which
    // has images; REGULAR (the cluster's channel) the cluster's own; RAPID one without images yet.
    {
        let mut w = env.world.lock().unwrap();
        w.gke_server_config = Some(json!({
            "defaultClusterVersion": "1.33.5-gke.1080000",
            "channels": [
                {"channel": "STABLE", "defaultVersion": "1.33.4-gke.900", "validVersions": ["1.33.4-gke.900"]},
                {"channel": "REGULAR", "defaultVersion": "1.33.5-gke.1080000", "validVersions": ["1.33.5-gke.1080000"]},
                {"channel": "RAPID", "defaultVersion": "1.34.1-gke.100", "validVersions": ["1.34.1-gke.100", "1.33.5-gke.1090000"]}
            ]
        }));
        w.gke_clusters.insert("images".into(), json!({"name": "images", "releaseChannel": {"channel": "REGULAR"}}));
        let (k, v) = image(
            "gke-node-images",
            "gke-1334-gke900-cos-121-18867-150-1-c-pre",
            false,
            "2026-09-01T00:00:00.000-07:00",
        );
        w.images.insert(k, v);
    }
    let on = |channel: &str| json!({"imageSelectorTerms": [{"family": "ContainerOptimizedOS", "channel": channel}]});
    let stable = env.provider_with(|_| {}, on("stable")).await;
    stable.set_kubernetes_version("v1.33.5-gke.1080000").unwrap();
    stable
        .create(&env.claim("stable-1", vec![req(labels::INSTANCE_TYPE, &["e2-standard-4"])]), &LaunchOptions::default())
        .await
        .unwrap();
    assert_eq!(
        source(&env.world.lock().unwrap()),
        "projects/gke-node-images/global/images/gke-1334-gke900-cos-121-18867-150-1-c-pre"
    );
    let own = env.provider_with(|_| {}, on("cluster")).await;
    own.set_kubernetes_version("v1.33.5-gke.1080000").unwrap();
    own.create(&env.claim("own-1", vec![req(labels::INSTANCE_TYPE, &["e2-standard-4"])]), &LaunchOptions::default())
        .await
        .unwrap();
    assert_eq!(source(&env.world.lock().unwrap()), plain, "the cluster's channel, REGULAR");
    let rapid = env.provider_with(|_| {}, on("rapid")).await;
    rapid.set_kubernetes_version("v1.33.5-gke.1100000").unwrap();
    let err = rapid.create(&env.claim("rapid-1", vec![]), &LaunchOptions::default()).await.unwrap_err();
    assert!(
        matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("spec.imageSelectorTerms[0]") && m.contains("1.33.5")),
        "RAPID's 1.33.5-gke.1090000 has no images: {err}"
    );
    env.world.lock().unwrap().gke_clusters.insert("images".into(), json!({"name": "images"}));
    let unenrolled = env.provider_with(|_| {}, on("cluster")).await;
    unenrolled.set_kubernetes_version("v1.33.5-gke.1080000").unwrap();
    let err = unenrolled.create(&env.claim("own-2", vec![]), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("no release channel")), "{err}");
}

/// N1 machines take T4s attached (`guestAccelerators`) in the zones whose acceleratorTypes list them, as
/// `n1-standard-16.<n>xnvidia-tesla-t4` instance types with their GPUs counted. The bundled table prices
/// no attachable GPU, so they are not offered until a price file prices it; then a launch asks for the
/// machine with its GPUs, which cannot live-migrate, and reads back as the same instance type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_machines_with_t4s_attached_are_offered_launched_and_read_back() {
    let env = Env::new("n1").await;
    {
        let mut w = env.world.lock().unwrap();
        for zone in ["us-central1-a", "us-central1-b"] {
            w.machine_types.get_mut(zone).unwrap().push(machine_type("n1-standard-16", zone, 16, 61_440, None));
        }
        // T4s in zone a only (and a GPU N1 machines cannot take, ignored).
        w.accelerator_types.insert(
            "us-central1-a".into(),
            vec![
                json!({"kind": "compute#acceleratorType", "id": "1", "name": "nvidia-tesla-t4", "zone": "us-central1-a",
                    "description": "NVIDIA T4", "maximumCardsPerInstance": 4}),
                json!({"kind": "compute#acceleratorType", "id": "2", "name": "nvidia-l4", "zone": "us-central1-a",
                    "description": "NVIDIA L4", "maximumCardsPerInstance": 8}),
            ],
        );
    }
    let four = "n1-standard-16.4xnvidia-tesla-t4";
    let types = env.provider.instance_types(&env.pool()).await.unwrap();
    let t4 = types.iter().find(|t| t.name == four).expect("n1 + 4 T4s");
    assert_eq!(t4.capacity.get(ResourceName::NVIDIA_GPU), 4);
    assert_eq!(t4.labels["cloud.google.com/gke-accelerator"], "nvidia-tesla-t4");
    assert_eq!(t4.labels["karpenter.k8s.gcp/instance-family"], "n1");
    let zones: Vec<&str> = t4.offerings.iter().map(|o| o.zone.as_str()).collect();
    assert_eq!(zones, ["us-central1-a", "us-central1-a"], "spot and on-demand where the T4s are");
    assert!(t4.offerings.iter().all(|o| !o.available), "no GPU price, not offered: {:?}", t4.offerings);
    let names: Vec<&str> =
        types.iter().filter(|t| t.name.starts_with("n1-standard-16.")).map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 3, "one, two and four T4s: {names:?}");

    // A price file of the operator's own prices the GPU (a figure of the test's, not a published price).
    let file = std::env::temp_dir().join(format!("tenon-gcp-prices-{}.csv", std::process::id()));
    std::fs::write(
        &file,
        "region,machine_type,on_demand_usd_per_hour,spot_usd_per_hour\nus-central1,nvidia-tesla-t4,0.5,0.2\n",
    )
    .unwrap();
    let priced = env.provider_with(|s| s.price_file = Some(file.clone()), json!({})).await;
    let types = priced.instance_types(&env.pool()).await.unwrap();
    let t4 = types.iter().find(|t| t.name == four).unwrap();
    let base = types.iter().find(|t| t.name == "n1-standard-16").unwrap();
    let od = |t: &tenon_core::cloud::InstanceType| t.offering("us-central1-a", CapacityType::OnDemand).unwrap().price;
    assert!((od(t4) - (od(base) + 2.0)).abs() < 1e-9, "{} vs {}", od(t4), od(base));
    assert!(t4.offerings.iter().all(|o| o.available));

    let claim =
        env.claim("t4-1", vec![req(labels::INSTANCE_TYPE, &[four]), req(labels::CAPACITY_TYPE, &["on-demand"])]);
    let i = priced.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!((i.instance_type.as_str(), i.zone.as_str()), (four, "us-central1-a"));
    let body = env.world.lock().unwrap().inserted.last().cloned().unwrap();
    assert_eq!(body["machineType"], "zones/us-central1-a/machineTypes/n1-standard-16");
    assert_eq!(
        body["guestAccelerators"],
        json!([{"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 4}])
    );
    assert_eq!(body["scheduling"]["onHostMaintenance"], "TERMINATE");
    let read = priced.get(&i.provider_id).await.unwrap();
    assert_eq!(read.instance_type, four);
    assert_eq!(read.capacity.get(ResourceName::NVIDIA_GPU), 4);
    std::fs::remove_file(&file).unwrap();
}

/// Host maintenance announced for an instance that cannot live-migrate (a GPU machine) is a scheduled
/// change, reported once per window; one that live-migrates is not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_maintenance_of_instances_that_cannot_migrate_is_a_scheduled_change() {
    use tenon_core::cloud::InterruptionKind;
    let env = Env::new("maintenance").await;
    let od = |t: &str| vec![req(labels::INSTANCE_TYPE, &[t]), req(labels::CAPACITY_TYPE, &["on-demand"])];
    let gpu = env.provider.create(&env.claim("gpu-1", od("g2-standard-24")), &LaunchOptions::default()).await.unwrap();
    let cpu = env.provider.create(&env.claim("cpu-1", od("n2-standard-8")), &LaunchOptions::default()).await.unwrap();
    assert!(env.provider.interruptions().await.unwrap().is_empty());
    let window = |start: &str| json!({"upcomingMaintenance": {"type": "SCHEDULED", "maintenanceStatus": "PENDING", "canReschedule": true, "windowStartTime": start}});
    {
        let mut w = env.world.lock().unwrap();
        for pid in [&gpu.provider_id, &cpu.provider_id] {
            let (_, zone, name) = tenon_providers::gcp::parse_provider_id(pid).unwrap();
            let i = w.instances.get_mut(&(zone.to_owned(), name.to_owned())).unwrap();
            i["status"] = json!("RUNNING");
            i["resourceStatus"] = window("2026-12-02T10:00:00Z");
        }
    }
    let got = env.provider.interruptions().await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].provider_id.as_str(), got[0].kind),
        (gpu.provider_id.as_str(), InterruptionKind::ScheduledChange)
    );
    assert!(env.provider.interruptions().await.unwrap().is_empty(), "reported once");
    {
        let mut w = env.world.lock().unwrap();
        let (_, zone, name) = tenon_providers::gcp::parse_provider_id(&gpu.provider_id).unwrap();
        w.instances.get_mut(&(zone.to_owned(), name.to_owned())).unwrap()["resourceStatus"] =
            window("2026-12-09T10:00:00Z");
    }
    assert_eq!(env.provider.interruptions().await.unwrap().len(), 1, "a new window is new");
}

/// Without the GKE bootstrap, nodes join with the class's own startup script, which reads the node's
/// labels, taints and pods from the instance's metadata; a class without one is not ready, naming the
/// field, and with the GKE bootstrap a class's own startup script is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_of_ones_own_gets_the_nodes_settings_in_metadata() {
    let env = Env::new("own").await;
    let script = json!({"metadata": {"startup-script": "#!/bin/bash\n/opt/join.sh"}});
    let own = env.provider_with(|s| s.gke_bootstrap = false, script.clone()).await;
    let mut claim = env.claim("own-1", vec![req(labels::INSTANCE_TYPE, &["e2-standard-4"])]);
    claim.spec.startup_taints = vec![k8s_openapi::api::core::v1::Taint {
        key: "cilium.io/agent-not-ready".into(),
        value: Some("true".into()),
        effect: "NoExecute".into(),
        time_added: None,
    }];
    own.create(&claim, &LaunchOptions::default()).await.unwrap();
    let md = metadata_of(&env.world.lock().unwrap().inserted.last().cloned().unwrap());
    assert_eq!(md["startup-script"], "#!/bin/bash\n/opt/join.sh");
    assert!(!md.contains_key("kube-env"), "no GKE bootstrap");
    assert!(md["karpenter-node-labels"].contains("karpenter.sh/nodepool=default"), "{}", md["karpenter-node-labels"]);
    assert!(md["karpenter-node-labels"].contains("karpenter.sh/capacity-type=spot"));
    assert_eq!(
        md["karpenter-node-taints"],
        "cilium.io/agent-not-ready=true:NoExecute,karpenter.sh/unregistered=true:NoExecute"
    );
    assert_eq!(md["karpenter-max-pods"], "110");

    let bare = env.provider_with(|s| s.gke_bootstrap = false, json!({})).await;
    let err = bare.create(&env.claim("own-2", vec![]), &LaunchOptions::default()).await.unwrap_err();
    assert!(
        matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("spec.metadata") && m.contains("startup-script")),
        "{err}"
    );
    let gke = env.provider_with(|_| {}, script).await;
    let err = gke.create(&env.claim("own-3", vec![]), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("spec.metadata.startup-script")), "{err}");
    let mut reserved = class(json!({"metadata": {"karpenter-node-labels": "x=y"}}));
    reserved.metadata.name = Some("reserved".into());
    assert!(own.apply_node_class(reserved).is_err(), "the node's settings are the provider's to write");
}

/// A node whose subnetwork is no longer the one new nodes get (the settings or the node pool moved)
/// drifts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_another_subnetwork_drifts() {
    let env = Env::new("subnet").await;
    let claim = env.claim("net-1", vec![req(labels::INSTANCE_TYPE, &["e2-standard-4"])]);
    let i = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap();
    let claim = with_provider_id(claim, &i.provider_id);
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap(), None);
    let moved = env
        .provider_with(
            |s| s.subnetwork = Some(format!("projects/{PROJECT}/regions/{REGION}/subnetworks/nodes-2")),
            json!({}),
        )
        .await;
    assert_eq!(moved.is_drifted(&claim).await.unwrap().unwrap().0, "SubnetworkDrift");
}

/// A zone `zones.list` reports DOWN is not offered (its types still describe it, so its nodes keep their
/// price); once it is UP again, and the five minutes the zone list is kept have passed, it is offered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_that_is_down_is_not_offered_until_it_is_up_again() {
    use std::time::Duration;
    use tenon_core::clock::VirtualClock;
    let env = Env::new("zones").await;
    env.world.lock().unwrap().zones_down.insert("us-central1-b".into());
    let clock = VirtualClock::at_epoch();
    let provider = env.provider_with(|_| {}, json!({})).await.with_clock(clock.clone());
    let offered = |types: &[tenon_core::cloud::InstanceType], zone: &str| {
        let n2 = types.iter().find(|t| t.name == "n2-standard-8").expect("n2-standard-8");
        n2.offering(zone, CapacityType::OnDemand).expect("described").available
    };
    let types = provider.instance_types(&env.pool()).await.unwrap();
    assert!(!offered(&types, "us-central1-b"), "a DOWN zone is not offered");
    assert!(offered(&types, "us-central1-a") && offered(&types, "us-central1-c"));
    let claim = env.claim("in-b", vec![req(labels::ZONE, &["us-central1-b"])]);
    assert!(
        matches!(
            provider.create(&claim, &LaunchOptions::default()).await,
            Err(CloudError::InsufficientCapacity { .. })
        ),
        "nothing is launched in a DOWN zone"
    );
    assert!(env.world.lock().unwrap().inserted.is_empty());

    env.world.lock().unwrap().zones_down.clear();
    clock.advance(Duration::from_secs(299));
    assert!(!offered(&provider.instance_types(&env.pool()).await.unwrap(), "us-central1-b"), "kept five minutes");
    clock.advance(Duration::from_secs(2));
    assert!(offered(&provider.instance_types(&env.pool()).await.unwrap(), "us-central1-b"), "UP again");
}
