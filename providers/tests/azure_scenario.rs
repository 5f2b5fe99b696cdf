//! The aks-batch scenario (`examples/scenarios/aks-batch.yaml`) on the Azure provider's own catalog.
//!
//! The local Resource Manager fake (`azure/fake.rs`) lists, as Resource SKUs does, every VM size of the
//! bundled `examples/catalogs/azure-eastus.yaml` (published vCPUs, memory and GPUs, three zones), and its
//! Retail Prices API serves the catalog's prices as meters (on-demand: the public table's; spot: the
//! catalog's stated 35% of on-demand, not a quote). The provider turns them into instance types (GPU
//! models from the size names, AKS's reservations, the `karpenter.azure.com/sku-*` labels), and the
//! scenario runs on those in place of the bundled catalog; the same scenario on the bundled catalog is
//! the reference.
#![cfg(feature = "azure")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "azure/fake.rs"]
mod fake;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use tenon_core::api::{NodeClassRef, NodePool, NodePoolSpec, labels};
use tenon_core::cloud::{CapacityType, CloudProvider, InstanceType};
use tenon_core::resources::ResourceName;
use tenon_core::sim::scenario::{self, Report, Scenario};
use tenon_providers::azure::images::UBUNTU_GALLERY;
use tenon_providers::azure::{AKSNodeClass, AzureProvider, AzureSettings};

const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/scenarios/aks-batch.yaml");
const GIB: i64 = 1 << 30;

/// Catalog type `t` as Resource SKUs lists it in eastus: vCPUs, memory, GPUs and its zones.
fn sku(t: &InstanceType) -> Value {
    let cpu = (t.capacity.get(ResourceName::CPU) / 1000).to_string();
    let memory = t.capacity.get(ResourceName::MEMORY);
    assert!(memory % GIB == 0, "{}: whole GiB", t.name);
    let gib = (memory / GIB).to_string();
    let gpus = t.capacity.get(ResourceName::NVIDIA_GPU).to_string();
    let zones: BTreeSet<&str> = t.offerings.iter().map(|o| o.zone.rsplit('-').next().unwrap()).collect();
    let zones: Vec<&str> = zones.into_iter().collect();
    let caps = [
        ("vCPUs", cpu.as_str()),
        ("MemoryGB", gib.as_str()),
        ("GPUs", gpus.as_str()),
        ("HyperVGenerations", "V1,V2"),
        ("CpuArchitectureType", "x64"),
        ("LowPriorityCapable", "True"),
    ];
    fake::sku(&t.name, "standardFamily", "eastus", &zones, &caps)
}

/// Catalog type `t`'s prices as Retail Prices meters (its zones share one price per capacity type).
fn meters(t: &InstanceType) -> Vec<Value> {
    let meter = t.name.trim_start_matches("Standard_").replace('_', " ");
    let price = |ct| t.offerings.iter().find(|o| o.capacity_type == ct).unwrap().price;
    let spot = format!("{meter} Spot");
    vec![
        fake::price_item(&t.name, "eastus", &meter, "Virtual Machines Series", &meter, price(CapacityType::OnDemand)),
        fake::price_item(&t.name, "eastus", &spot, "Virtual Machines Series", &spot, price(CapacityType::Spot)),
    ]
}

async fn provider_types(bundled: &[InstanceType]) -> Vec<InstanceType> {
    let (endpoint, world) = fake::start().await;
    {
        let mut w = world.lock().unwrap();
        w.skus = bundled.iter().map(sku).collect();
        w.prices = bundled.iter().flat_map(meters).collect();
        for image in ["2204gen2containerd", "2204containerd", "2204gen2arm64containerd"] {
            w.gallery_versions.insert(
                (UBUNTU_GALLERY.into(), image.into()),
                vec![fake::gallery_version(UBUNTU_GALLERY, image, "202511.10.0", "eastus")],
            );
        }
    }
    let mut s = AzureSettings::new("s", "MC_aks_batch_eastus", "eastus", "batch");
    s.endpoint = Some(endpoint.clone());
    s.prices_endpoint = Some(endpoint);
    // The bundled catalog states capacity as the published size; the hypervisor's share is left to the
    // provider's default elsewhere.
    s.vm_memory_overhead = 0.0;
    let p = AzureProvider::new(s, Some(Arc::new(fake::StaticToken))).unwrap();
    p.set_kubernetes_version("v1.33.2").unwrap();
    let class: AKSNodeClass = serde_json::from_value(json!({"apiVersion": "karpenter.azure.com/v1beta1",
        "kind": "AKSNodeClass", "metadata": {"name": "default"}, "spec": {}}))
    .unwrap();
    p.apply_node_class(class).unwrap();
    let mut pool = NodePool::new("default", NodePoolSpec::default());
    pool.spec.template.spec.node_class_ref =
        Some(NodeClassRef { group: "karpenter.azure.com".into(), kind: "AKSNodeClass".into(), name: "default".into() });
    p.instance_types(&pool).await.unwrap()
}

fn seen(r: &Report) -> BTreeSet<String> {
    r.timeline.iter().flat_map(|s| s.nodes_by_instance_type.keys().cloned()).collect()
}

fn run(scenario: &Scenario) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(scenario::run(scenario, scenario.settings(&[]).unwrap(), &mut |_, _, _| {}))
}

#[test]
fn the_aks_batch_scenario_runs_on_the_providers_catalog() {
    let bundled = Scenario::load(Path::new(SCENARIO)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let types = rt.block_on(provider_types(&bundled.types));
    drop(rt);

    // The provider offers every size, with the bundled catalog's labels, capacity, reservations, zones
    // and prices.
    let names = |ts: &[InstanceType]| ts.iter().map(|t| t.name.clone()).collect::<BTreeSet<_>>();
    assert_eq!(names(&types), names(&bundled.types));
    for t in &types {
        let b = bundled.types.iter().find(|b| b.name == t.name).unwrap();
        for (key, value) in &b.labels {
            assert_eq!(t.labels.get(key), Some(value), "{} {key}", t.name);
        }
        for r in [ResourceName::CPU, ResourceName::MEMORY, ResourceName::PODS, ResourceName::NVIDIA_GPU] {
            assert_eq!(t.capacity.get(r), b.capacity.get(r), "{} capacity {r:?}", t.name);
        }
        // The provider adds the OS disk as ephemeral storage, which the bundled catalog leaves out.
        for r in [ResourceName::CPU, ResourceName::MEMORY, ResourceName::PODS, ResourceName::NVIDIA_GPU] {
            assert_eq!(t.allocatable().get(r), b.allocatable().get(r), "{} allocatable {r:?}", t.name);
        }
        assert_eq!(t.offerings.len(), b.offerings.len(), "{}", t.name);
        for bo in &b.offerings {
            let o = t.offering(&bo.zone, bo.capacity_type).unwrap_or_else(|| panic!("{} {bo:?}", t.name));
            assert!(o.available && (o.price - bo.price).abs() < 1e-9, "{} {o:?} vs {bo:?}", t.name);
        }
        assert_eq!(t.labels.get(labels::REGION).map(String::as_str), Some("eastus"));
    }

    let mut on_azure = bundled.clone();
    on_azure.types = types;
    let (reference, r) = std::thread::scope(|s| {
        let reference = s.spawn(|| run(&bundled));
        let r = run(&on_azure);
        (reference.join().unwrap(), r)
    });
    assert_eq!(r.pending_at_end, 0, "{:?}", r.timeline.last());
    let bought = seen(&r);
    assert!(bought.contains("Standard_NC24ads_A100_v4"), "{bought:?}");
    assert!(!bought.contains("Standard_NC96ads_A100_v4"), "{bought:?}");
    assert!(bought.iter().any(|t| t.contains("_T4_")), "{bought:?}");
    assert_eq!(bought, seen(&reference), "the same sizes");
    eprintln!(
        "aks-batch: provider catalog ${:.2} ({} launches), bundled catalog ${:.2} ({} launches)",
        r.total_cost, r.launches, reference.total_cost, reference.launches
    );
    // The same types, prices and shapes: the same fleet, to the cent (the types' order differs, so ties
    // might break apart; 1% leaves room for that without hiding a wrong price or GPU count).
    let ratio = r.total_cost / reference.total_cost;
    assert!((0.99..=1.01).contains(&ratio), "{} vs {}", r.total_cost, reference.total_cost);
}
