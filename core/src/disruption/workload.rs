//! A generated fleet for the disruption benchmark: `n` nodes of mixed instance types and capacity types,
//! each running about ten pods, some behind PDBs, some spread across zones, some marked do-not-disrupt.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::json;

use crate::api::{NodePool, NodePoolSpec, labels};
use crate::cloud::{CapacityType, InstanceType, Offering};
use crate::resources::{ResourceName, Resources};
use crate::scheduling::workload::Rng;

/// The fleet's objects.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// One NodePool.
    pub pool: NodePool,
    /// Its instance types.
    pub instance_types: Vec<InstanceType>,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The pods, bound to the nodes.
    pub pods: Vec<Pod>,
    /// PDBs over some of the apps.
    pub pdbs: Vec<PodDisruptionBudget>,
}

const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// General-purpose types of 2 to 64 CPU (4 GiB per CPU), on demand at $0.048 per CPU-hour, spot at 35%.
pub fn instance_types() -> Vec<InstanceType> {
    [2i64, 4, 8, 16, 32, 48, 64]
        .iter()
        .flat_map(|cpu| ["m", "c", "r"].map(move |family| (family, *cpu)))
        .map(|(family, cpu)| {
            let mem = match family {
                "c" => 2,
                "r" => 8,
                _ => 4,
            };
            let od = 0.048 * cpu as f64 * (mem as f64 / 4.0).sqrt();
            let mut offerings = Vec::new();
            for (i, z) in ZONES.iter().enumerate() {
                offerings.push(Offering::new(*z, CapacityType::OnDemand, od));
                offerings.push(Offering::new(*z, CapacityType::Spot, od * (0.33 + 0.02 * i as f64)));
            }
            InstanceType {
                name: format!("{family}.{cpu}x"),
                labels: [
                    (labels::ARCH.to_owned(), "amd64".to_owned()),
                    ("example.com/family".to_owned(), family.to_owned()),
                ]
                .into(),
                capacity: Resources::cpu_memory(cpu * 1000, (cpu * mem) << 30).with(ResourceName::PODS, 110),
                overhead: Default::default(),
                offerings,
            }
        })
        .collect()
}

/// `nodes` nodes with about `pods_per_node` pods each, from `seed`.
pub fn fleet(nodes: usize, pods_per_node: usize, seed: u64) -> Fleet {
    let mut rng = Rng::new(seed);
    let types = instance_types();
    let mut pool = NodePool::new("default", NodePoolSpec::default());
    pool.spec.disruption.budgets[0].nodes = "100%".into();
    let mut out_nodes = Vec::with_capacity(nodes);
    let mut pods = Vec::with_capacity(nodes * pods_per_node);
    let sizes = [8i64, 16, 32];
    for n in 0..nodes {
        let cpu = sizes[rng.below(sizes.len())];
        let family = ["m", "c", "r"][rng.below(3)];
        let it =
            types.iter().find(|t| t.name == format!("{family}.{cpu}x")).map(|t| t.name.clone()).unwrap_or_default();
        let zone = ZONES[n % ZONES.len()];
        let ct = if rng.below(2) == 0 { "spot" } else { "on-demand" };
        let name = format!("node-{n:05}");
        let mem_gib = cpu
            * match family {
                "c" => 2,
                "r" => 8,
                _ => 4,
            };
        out_nodes.push(node(&name, &it, zone, ct, cpu, mem_gib));
        // Fill 40–90% of the node's CPU with about `pods_per_node` pods.
        let fill = cpu * 1000 * (40 + rng.below(51) as i64) / 100;
        let per_pod = (fill / pods_per_node as i64).max(50);
        for p in 0..pods_per_node {
            let app = format!("app-{}", rng.below(200));
            let mut meta = json!({"name": format!("{name}-p{p}"), "namespace": "default", "labels": {"app": app},
                "creationTimestamp": "2026-01-01T00:00:00Z"});
            let mut spec = json!({"nodeName": name, "containers": [{"name": "c", "resources": {"requests": {
                "cpu": format!("{per_pod}m"), "memory": format!("{}Mi", per_pod)}}}]});
            match rng.below(200) {
                0 => meta["annotations"] = json!({labels::DO_NOT_DISRUPT: "true"}),
                1..=30 => {
                    spec["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": labels::ZONE,
                        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": app}}}]);
                }
                _ => {}
            }
            if let Ok(pod) = serde_json::from_value(json!({"metadata": meta, "spec": spec,
                "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}}))
            {
                pods.push(pod);
            }
        }
    }
    let pdbs = (0..20)
        .filter_map(|i| {
            serde_json::from_value(json!({"metadata": {"name": format!("pdb-{i}"), "namespace": "default"},
                "spec": {"maxUnavailable": if i % 10 == 0 { 0 } else { 1 }, "selector": {"matchLabels": {"app": format!("app-{}", i * 10)}}}}))
            .ok()
        })
        .collect();
    Fleet { pool, instance_types: types, nodes: out_nodes, pods, pdbs }
}

fn node(name: &str, it: &str, zone: &str, ct: &str, cpu: i64, mem_gib: i64) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {
            labels::NODE_POOL: "default", labels::INSTANCE_TYPE: it, labels::ZONE: zone,
            labels::CAPACITY_TYPE: ct, labels::INITIALIZED: "true", labels::ARCH: "amd64"}},
        "status": {"allocatable": {"cpu": cpu.to_string(), "memory": format!("{mem_gib}Gi"), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap_or_default()
}
