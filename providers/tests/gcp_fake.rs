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
