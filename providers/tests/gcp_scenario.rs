//! The gke-inference scenario (`examples/scenarios/gke-inference.yaml`) on the GCP provider's own catalog.
//!
//! The local Compute Engine fake (`gce/fake.rs`) lists, as `machineTypes.aggregatedList` does, every
//! us-central1 machine type one of the scenario's node pools can use, shaped as the bundled
//! `examples/catalogs/gcp-us-central1.yaml` has them from the published specifications (vCPUs, memory,
//! `accelerators[]`, the zones). The provider turns them into instance types (GPUs counted from the
//! accelerators, GKE's reservations, its labels) priced from its bundled table, and the scenario runs on
//! those in place of the bundled catalog; the same scenario on the bundled catalog is the reference.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The fake serves more than instance types need (launches, faults, the discovery checker).
#[allow(dead_code)]
#[path = "gce/fake.rs"]
mod fake;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};
use tenon_core::api::{NodeClassRef, NodePool, NodePoolSpec, labels};
use tenon_core::cloud::{CloudProvider, InstanceType};
use tenon_core::resources::ResourceName;
use tenon_core::sim::scenario::{self, Report, Scenario};
use tenon_providers::gcp::{GCENodeClass, GcpProvider, GcpSettings};

const PROJECT: &str = "test-project";
const REGION: &str = "us-central1";
const IMAGE: &str = "projects/test-project/global/images/cos-test";
const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/scenarios/gke-inference.yaml");
const MIB: i64 = 1 << 20;

/// Compute Engine's shared-core machine types (`isSharedCpu`), by their published names.
fn shared_core(name: &str) -> bool {
    matches!(name, "e2-micro" | "e2-small" | "e2-medium" | "f1-micro" | "g1-small")
}

/// Catalog type `t` as `machineTypes.aggregatedList` lists it in `zone`: its vCPUs and memory, and its GPUs
/// as one `accelerators[]` entry of the accelerator type GKE's label names (Compute Engine and GKE both
/// call them `nvidia-l4`, `nvidia-tesla-a100`). No price: prices are the provider's own.
fn machine_type(t: &InstanceType, zone: &str) -> Value {
    let cpu = t.capacity.get(ResourceName::CPU);
    let memory = t.capacity.get(ResourceName::MEMORY);
    assert!(cpu % 1000 == 0 && memory % MIB == 0, "{}: whole vCPUs and MiB", t.name);
    let mut m = json!({
        "kind": "compute#machineType", "id": "1", "name": t.name, "description": t.name,
        "guestCpus": cpu / 1000, "memoryMb": memory / MIB, "zone": zone, "isSharedCpu": shared_core(&t.name),
        "maximumPersistentDisks": 128, "architecture": if t.labels[labels::ARCH] == "arm64" { "ARM64" } else { "X86_64" },
        "selfLink": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/machineTypes/{}", t.name),
    });
    let gpus = t.capacity.get(ResourceName::NVIDIA_GPU);
    if gpus > 0 {
        let model = &t.labels["cloud.google.com/gke-accelerator"];
        m["accelerators"] = json!([{"guestAcceleratorType": model, "guestAcceleratorCount": gpus}]);
    }
    m
}

/// Whether every requirement of `pool` holds for `t`, strictly: a label the type does not carry fails an
/// `In` (a node without it could not serve the pool's pods' selectors either); capacity type and zone
/// are the offerings'.
fn admits(pool: &NodePool, t: &InstanceType) -> bool {
    pool.spec.template.spec.requirements.iter().all(|r| match labels::normalize(&r.key) {
        labels::CAPACITY_TYPE => t.offerings.iter().any(|o| r.matches(Some(o.capacity_type.as_str()))),
        labels::ZONE => t.offerings.iter().any(|o| r.matches(Some(o.zone.as_str()))),
        key => r.matches(t.label(key)),
    })
}

/// The names of `types` each of `pools` admits.
fn admitted(pools: &[NodePool], types: &[InstanceType]) -> BTreeMap<String, BTreeSet<String>> {
    pools
        .iter()
        .map(|p| (p.name().to_owned(), types.iter().filter(|t| admits(p, t)).map(|t| t.name.clone()).collect()))
        .collect()
}

fn class_ref() -> NodeClassRef {
    NodeClassRef { group: "karpenter.k8s.gcp".into(), kind: "GCENodeClass".into(), name: "default".into() }
}

/// The GCP provider's instance types with the fake listing `machine_types` (one zone each key).
async fn provider_types(machine_types: BTreeMap<String, Vec<Value>>) -> Vec<InstanceType> {
    let (endpoint, world) = fake::start().await;
    {
        let mut w = world.lock().unwrap();
        w.machine_types = machine_types;
        w.images.insert(
            format!("{PROJECT}/cos-test"),
            json!({"kind": "compute#image", "id": "7", "name": "cos-test", "architecture": "X86_64", "status": "READY",
                "selfLink": format!("https://www.googleapis.com/compute/v1/{IMAGE}")}),
        );
    }
    let mut s = GcpSettings::new(PROJECT, REGION, "inference");
    s.endpoint = Some(endpoint);
    let anonymous = google_cloud_auth::credentials::anonymous::Builder::new().build();
    let provider = GcpProvider::new(s, Some(anonymous)).await.unwrap();
    let class: GCENodeClass = serde_json::from_value(json!({"apiVersion": "karpenter.k8s.gcp/v1alpha1",
        "kind": "GCENodeClass", "metadata": {"name": "default"},
        "spec": {"imageSelectorTerms": [{"id": IMAGE}], "disks": [{"category": "pd-balanced", "sizeGiB": 100, "boot": true}]}}))
    .unwrap();
    provider.apply_node_class(class).unwrap();
    let mut pool = NodePool::new("default", NodePoolSpec::default());
    pool.spec.template.spec.node_class_ref = Some(class_ref());
    provider.instance_types(&pool).await.unwrap()
}

/// Every instance type the run's nodes had, over its timeline.
fn seen(r: &Report) -> BTreeSet<String> {
    r.timeline.iter().flat_map(|s| s.nodes_by_instance_type.keys().cloned()).collect()
}

/// The most live nodes of a type whose name starts with `prefix` at one sample from `from` hours on.
fn most_nodes(r: &Report, prefix: &str, from: f64) -> u32 {
    r.timeline
        .iter()
        .filter(|s| s.hour >= from)
        .map(|s| s.nodes_by_instance_type.iter().filter(|(t, _)| t.starts_with(prefix)).map(|(_, n)| n).sum())
        .max()
        .unwrap_or(0)
}

/// Runs `scenario` on a runtime of its own (the virtual-time simulator needs no more than one thread).
fn run(scenario: &Scenario) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(scenario::run(scenario, scenario.settings(&[]).unwrap(), &mut |_, _, _| {}))
}

#[test]
fn the_gke_inference_scenario_runs_on_the_providers_catalog() {
    let started = Instant::now();
    let bundled = Scenario::load(Path::new(SCENARIO)).unwrap();

    // What Compute Engine lists: every machine type of the bundled catalog that one of the node pools can
    // use (e2 and n2 for the CPU pool, g2 for L4s, a2 for A100s; c3 is in no pool), in its zones.
    let usable: Vec<&InstanceType> =
        bundled.types.iter().filter(|t| bundled.pools.iter().any(|p| admits(p, t))).collect();
    let mut listed: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for t in &usable {
        let zones: BTreeSet<&str> = t.offerings.iter().map(|o| o.zone.as_str()).collect();
        for zone in zones {
            listed.entry(zone.to_owned()).or_default().push(machine_type(t, zone));
        }
    }
    assert_eq!(listed.keys().collect::<Vec<_>>(), ["us-central1-a", "us-central1-b", "us-central1-c"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let types = rt.block_on(provider_types(listed));
    drop(rt);

    // The provider offers exactly those types, and each pool admits the same of its types as of the
    // bundled catalog's: it sets every label the pools select on (`cloud.google.com/machine-family`,
    // `cloud.google.com/gke-accelerator`) with the bundled catalog's values.
    let names = |ts: &[InstanceType]| ts.iter().map(|t| t.name.clone()).collect::<BTreeSet<_>>();
    assert_eq!(names(&types), usable.iter().map(|t| t.name.clone()).collect());
    assert_eq!(names(&types).len(), 14, "{:?}", names(&types));
    assert_eq!(admitted(&bundled.pools, &types), admitted(&bundled.pools, &bundled.types));
    for t in &types {
        let b = bundled.types.iter().find(|b| b.name == t.name).unwrap();
        for key in [labels::ARCH, labels::OS, "cloud.google.com/machine-family", "cloud.google.com/gke-accelerator"] {
            assert_eq!(t.labels.get(key), b.labels.get(key), "{} {key}", t.name);
        }
        // The count label: the provider's `cloud.google.com/gke-accelerator-count` is the bundled one.
        assert_eq!(
            t.labels.get("cloud.google.com/gke-accelerator-count"),
            b.labels.get("cloud.google.com/gke-accelerator-count"),
            "{}",
            t.name
        );
        for r in [ResourceName::CPU, ResourceName::MEMORY, ResourceName::PODS, ResourceName::NVIDIA_GPU] {
            assert_eq!(t.capacity.get(r), b.capacity.get(r), "{} capacity {r:?}", t.name);
        }
        // GKE's kube-reserved CPU and memory and the memory eviction threshold are the bundled
        // catalog's figures (the same published node-sizing formula); the provider also holds back
        // 100m of system reserve (kube-proxy and GKE's system daemons), which the bundled catalog does
        // not: its allocatable CPU is 100m less on every type.
        let (o, bo) = (&t.overhead, &b.overhead);
        assert_eq!(o.kube_reserved.get(ResourceName::CPU), bo.kube_reserved.get(ResourceName::CPU), "{}", t.name);
        assert_eq!(o.kube_reserved.get(ResourceName::MEMORY), bo.kube_reserved.get(ResourceName::MEMORY), "{}", t.name);
        assert_eq!(
            o.eviction_threshold.get(ResourceName::MEMORY),
            bo.eviction_threshold.get(ResourceName::MEMORY),
            "{}",
            t.name
        );
        assert_eq!(
            t.allocatable().get(ResourceName::CPU),
            b.allocatable().get(ResourceName::CPU) - 100,
            "{}: the system reserve",
            t.name
        );
        assert_eq!(t.allocatable().get(ResourceName::MEMORY), b.allocatable().get(ResourceName::MEMORY), "{}", t.name);
        // Same offerings, all available, priced from the same public table: the bundled catalog rounds
        // to four decimals, the provider's table has the full figures.
        assert_eq!(t.offerings.len(), b.offerings.len(), "{}", t.name);
        for bo in &b.offerings {
            let off = t.offering(&bo.zone, bo.capacity_type).unwrap_or_else(|| panic!("{} {bo:?}", t.name));
            assert!(off.available, "{} {bo:?}", t.name);
            assert!((off.price - bo.price).abs() <= 0.00005 + 1e-9, "{} {} vs {}", t.name, off.price, bo.price);
        }
    }

    // The scenario on the bundled catalog, and on the provider's types, side by side (each run is
    // single-threaded and deterministic).
    let mut on_gcp = bundled.clone();
    on_gcp.types = types;
    let (reference, r) = std::thread::scope(|s| {
        let reference = s.spawn(|| run(&bundled));
        let r = run(&on_gcp);
        (reference.join().unwrap(), r)
    });

    // Every pod ran: the inference and API replicas are bound at the end, and all twelve fine-tuning jobs
    // started (a job is removed only two hours after it started; one never started would be pending).
    assert_eq!(r.hours, 12.0);
    assert_eq!(r.pending_at_end, 0, "{:?}", r.timeline.last());
    assert!(r.launches > 0 && r.total_cost > 0.0);
    // The L4 inference pods ran on g2 machines and the 4-GPU A100 jobs on a2 machines of at least four
    // GPUs; the CPU API on e2 or n2; nothing else was bought.
    let bought = seen(&r);
    assert!(bought.iter().any(|t| t.starts_with("g2-")), "{bought:?}");
    assert!(bought.iter().any(|t| t == "a2-highgpu-4g" || t == "a2-highgpu-8g"), "{bought:?}");
    assert!(!bought.contains("a2-highgpu-1g") && !bought.contains("a2-highgpu-2g"), "{bought:?}");
    assert!(bought.iter().any(|t| t.starts_with("e2-") || t.starts_with("n2-")), "{bought:?}");
    assert!(bought.iter().all(|t| ["e2-", "n2-", "g2-", "a2-"].iter().any(|f| t.starts_with(f))), "{bought:?}");
    // A100s ran while the jobs did and were given back once the last one (arriving at 8h15m, running two
    // hours) was done.
    assert!(most_nodes(&r, "a2-", 0.0) >= 1);
    assert_eq!(most_nodes(&r, "a2-", 11.5), 0, "{:?}", r.timeline.last());
    assert!(most_nodes(&r, "g2-", 11.5) >= 1, "the inference floor of 4 replicas keeps L4s");

    // The same fleet costs about the same. The prices are the same public table's, the bundled catalog's
    // rounded to four decimals: at most $0.00005 per node-hour, about a cent over this run. The provider's
    // 100m of system reserve could change how pods pack (its allocatable CPU is 100m less); on this
    // scenario's shapes it does not (3 CPU inference pods still fit a g2-standard-4's 3820m, 40 CPU jobs an
    // a2-highgpu-4g's), so the same types are bought and the bills differ by the rounding alone; 1% leaves
    // room for a packing change without hiding a wrong price or GPU count (either moves the bill by far
    // more).
    assert_eq!(reference.pending_at_end, 0);
    assert_eq!(bought, seen(&reference), "the same instance types");
    let rounding = 0.00005 * reference.node_hours + 1e-6;
    let ratio = r.total_cost / reference.total_cost;
    eprintln!(
        "gke-inference: provider catalog ${:.4} ({} launches, {:.1} node-hours), bundled catalog ${:.4} ({} launches, {:.1} node-hours), ratio {ratio:.6}, {:?}",
        r.total_cost,
        r.launches,
        r.node_hours,
        reference.total_cost,
        reference.launches,
        reference.node_hours,
        started.elapsed()
    );
    assert!((0.99..=1.01).contains(&ratio), "{} vs {}", r.total_cost, reference.total_cost);
    if r.launches == reference.launches && (r.node_hours - reference.node_hours).abs() < 1e-9 {
        assert!(
            (r.total_cost - reference.total_cost).abs() <= rounding,
            "{} vs {}",
            r.total_cost,
            reference.total_cost
        );
    }
}
