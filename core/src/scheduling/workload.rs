//! The scheduling benchmark's workload, mirroring Karpenter's so the figures compare: 400 instance types
//! (type *i* has *i+1* CPU, *2(i+1)* GiB and *10(i+1)* pods; spot in two zones, on-demand in three) and
//! pods in five equal groups (plain, zonal spread, hostname spread, zonal self-affinity, hostname
//! self-anti-affinity) with CPU from {100, 250, 500, 1000, 1500}m and memory from
//! {100, 256, 512, 1024, 2048, 4096}Mi.
//!
//! Prices follow Karpenter's fake provider: $0.10 per CPU and per GiB per hour on demand; spot at 70%.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::pod::{PodInfo, Selector, TopologyKind, TopologyTerm};
use super::requirements::Requirements;
use crate::api::labels;
use crate::cloud::{CapacityType, InstanceType, Offering};
use crate::resources::{ResourceName, Resources};

/// `n` instance types shaped like Karpenter's benchmark catalog.
pub fn instance_types(n: usize) -> Vec<InstanceType> {
    (0..n)
        .map(|i| {
            let size = i as i64 + 1;
            let on_demand = 0.1 * size as f64 + 0.1 * 2.0 * size as f64;
            let mut offerings: Vec<Offering> = ["test-zone-1", "test-zone-2"]
                .iter()
                .map(|z| Offering::new(*z, CapacityType::Spot, on_demand * 0.7))
                .collect();
            offerings.extend(
                ["test-zone-1", "test-zone-2", "test-zone-3"]
                    .iter()
                    .map(|z| Offering::new(*z, CapacityType::OnDemand, on_demand)),
            );
            InstanceType {
                name: format!("fake-it-{i}"),
                labels: [(labels::ARCH.to_owned(), "amd64".to_owned()), (labels::OS.to_owned(), "linux".to_owned())]
                    .into(),
                capacity: Resources::cpu_memory(size * 1000, size * 2 * (1 << 30)).with(ResourceName::PODS, size * 10),
                overhead: Default::default(),
                offerings,
            }
        })
        .collect()
}

/// A small deterministic generator (SplitMix64), so the workload is the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

fn term(kind: TopologyKind, key: &str, group: &str) -> TopologyTerm {
    TopologyTerm {
        kind,
        key: key.to_owned(),
        selector: Selector::labels(&[("group", group)]),
        namespaces: Some(vec!["default".to_owned()]),
        namespace_selector: None,
        max_skew: 1,
        min_domains: None,
        node_filter: None,
        honor_taints: None,
        cache: Default::default(),
    }
}

/// `n` pods in the benchmark's five groups, from `seed`.
pub fn diverse_pods(n: usize, seed: u64) -> Vec<PodInfo> {
    const CPU: [i64; 5] = [100, 250, 500, 1000, 1500];
    const MEM_MI: [i64; 6] = [100, 256, 512, 1024, 2048, 4096];
    let mut rng = Rng::new(seed);
    let per_group = n / 5;
    let groups: [(&str, Option<(TopologyKind, &str)>); 5] = [
        ("generic", None),
        ("zonal-spread", Some((TopologyKind::Spread, labels::ZONE))),
        ("hostname-spread", Some((TopologyKind::Spread, labels::HOSTNAME))),
        ("zonal-affinity", Some((TopologyKind::Affinity, labels::ZONE))),
        ("hostname-anti-affinity", Some((TopologyKind::AntiAffinity, labels::HOSTNAME))),
    ];
    let mut pods = Vec::with_capacity(n);
    for (g, (name, constraint)) in groups.iter().enumerate() {
        let count = if g == 4 { n - per_group * 4 } else { per_group };
        for i in 0..count {
            let requests = Resources::cpu_memory(CPU[rng.below(CPU.len())], MEM_MI[rng.below(MEM_MI.len())] << 20)
                .with(ResourceName::PODS, 1);
            let topology = constraint.iter().map(|(kind, key)| term(*kind, key, name)).collect();
            pods.push(PodInfo {
                key: format!("default/{name}-{i}"),
                namespace: "default".to_owned(),
                labels: BTreeMap::from([("group".to_owned(), (*name).to_owned())]),
                annotations: BTreeMap::new(),
                requests,
                node_selector: Requirements::new(),
                required_terms: Vec::new(),
                preferred_terms: Vec::new(),
                tolerations: Vec::new(),
                host_ports: Vec::new(),
                topology,
                soft_spreads: Vec::new(),
                preferred_affinity: Vec::new(),
                preferred_anti_affinity: Vec::new(),
                priority: 0,
                node_name: None,
                daemon: false,
                volumes: Vec::new(),
                label_cache: Default::default(),
            });
        }
    }
    pods
}

/// `n` pending pods of `apps` applications, as a cluster with many deployments holds them: each app's pods
/// are identical (requests drawn once per app, from the same sizes as [`diverse_pods`]), and app *i* carries
/// the constraint of the benchmark's group *i* mod 5 (none, zonal spread, hostname spread, zonal
/// self-affinity, hostname self-anti-affinity) over its own pods. The last app takes the remainder.
pub fn app_pods(n: usize, apps: usize, seed: u64) -> Vec<Pod> {
    const CPU: [i64; 5] = [100, 250, 500, 1000, 1500];
    const MEM_MI: [i64; 6] = [100, 256, 512, 1024, 2048, 4096];
    let apps = apps.clamp(1, n.max(1));
    let per_app = n / apps;
    let mut rng = Rng::new(seed);
    let mut pods = Vec::with_capacity(n);
    for a in 0..apps {
        let app = format!("app-{a:04}");
        let (cpu, mem) = (CPU[rng.below(CPU.len())], MEM_MI[rng.below(MEM_MI.len())]);
        let selector = json!({"matchLabels": {"app": app}});
        let spread = |key: &str| {
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector}]})
        };
        let affinity = |kind: &str, key: &str| {
            json!({"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": key, "labelSelector": selector}]}}})
        };
        let constraint = match a % 5 {
            1 => spread(labels::ZONE),
            2 => spread(labels::HOSTNAME),
            3 => affinity("podAffinity", labels::ZONE),
            4 => affinity("podAntiAffinity", labels::HOSTNAME),
            _ => json!({}),
        };
        let count = if a + 1 == apps { n - per_app * a } else { per_app };
        for i in 0..count {
            let mut spec = json!({"containers": [{"name": "app", "resources": {"requests": {
                "cpu": format!("{cpu}m"), "memory": format!("{mem}Mi")}}}]});
            if let (Some(spec), Some(extra)) = (spec.as_object_mut(), constraint.as_object()) {
                spec.extend(extra.clone());
            }
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{app}-{i}"), "namespace": "default", "labels": {"app": app},
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": spec,
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
            });
            if let Ok(pod) = serde_json::from_value(pod) {
                pods.push(pod);
            }
        }
    }
    pods
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodePool, NodePoolSpec};
    use crate::scheduling::{PoolInput, Scheduler, SchedulerOptions};

    #[test]
    fn a_thousand_diverse_pods_need_two_hundred_nodes() {
        let pool = PoolInput {
            pool: NodePool::new("default", NodePoolSpec::default()),
            instance_types: instance_types(400).into(),
            in_use: Resources::ZERO,
            nodes_in_use: 0,
        };
        let r =
            Scheduler::new(vec![pool], vec![], vec![], &[], SchedulerOptions::default()).solve(diverse_pods(1000, 42));
        assert!(r.unschedulable.is_empty(), "{:?}", &r.unschedulable[..r.unschedulable.len().min(3)]);
        assert_eq!(r.claims.len(), 200, "the hostname anti-affinity fifth forces 200 nodes, and no more are bought");
    }

    #[test]
    fn app_pods_carry_their_apps_constraint_and_all_schedule() {
        let pods: Vec<PodInfo> = app_pods(1000, 100, 42).iter().filter_map(|p| PodInfo::from_pod(p).ok()).collect();
        assert_eq!(pods.len(), 1000);
        // Apps 0..100 in five kinds: 20 apps each; the constrained four carry one term each.
        let with_terms = pods.iter().filter(|p| !p.topology.is_empty()).count();
        assert_eq!(with_terms, 800);
        let distinct: std::collections::HashSet<_> = pods.iter().flat_map(|p| p.topology.iter()).collect();
        assert_eq!(distinct.len(), 80, "one group per constrained app");
        let pool = PoolInput {
            pool: NodePool::new("default", NodePoolSpec::default()),
            instance_types: instance_types(400).into(),
            in_use: Resources::ZERO,
            nodes_in_use: 0,
        };
        let r = Scheduler::new(vec![pool], vec![], vec![], &[], SchedulerOptions::default()).solve(pods);
        assert!(r.unschedulable.is_empty(), "{:?}", &r.unschedulable[..r.unschedulable.len().min(3)]);
        // Each anti-affine app of ten pods needs ten nodes.
        assert!(r.claims.len() >= 10, "{} claims", r.claims.len());
    }
}
