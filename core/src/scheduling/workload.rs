//! The scheduling benchmark's workload, mirroring Karpenter's so the figures compare: 400 instance types
//! (type *i* has *i+1* CPU, *2(i+1)* GiB and *10(i+1)* pods; spot in two zones, on-demand in three) and
//! pods in five equal groups (plain, zonal spread, hostname spread, zonal self-affinity, hostname
//! self-anti-affinity) with CPU from {100, 250, 500, 1000, 1500}m and memory from
//! {100, 256, 512, 1024, 2048, 4096}Mi.
//!
//! Prices follow Karpenter's fake provider: $0.10 per CPU and per GiB per hour on demand; spot at 70%.

use std::collections::BTreeMap;

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
            });
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
            instance_types: instance_types(400),
            in_use: Resources::ZERO,
            nodes_in_use: 0,
        };
        let r =
            Scheduler::new(vec![pool], vec![], vec![], &[], SchedulerOptions::default()).solve(diverse_pods(1000, 42));
        assert!(r.unschedulable.is_empty(), "{:?}", &r.unschedulable[..r.unschedulable.len().min(3)]);
        assert_eq!(r.claims.len(), 200, "the hostname anti-affinity fifth forces 200 nodes, and no more are bought");
    }
}
