//! The disruption ladder on small fleets, with the worked examples of the specification texts.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};

use super::*;
use crate::api::{NodePool, labels};
use crate::cloud::{CapacityType, InstanceType, Offering};
use crate::resources::{ResourceName, Resources};
use crate::settings::{self, Settings};
use crate::state::ClusterState;
use crate::testing::merge;

const NOW: &str = "2026-03-04T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn itype(name: &str, cpu: i64, gpus: i64, offerings: &[(&str, CapacityType, f64)]) -> InstanceType {
    InstanceType {
        name: name.into(),
        labels: [(labels::ARCH.to_owned(), "amd64".to_owned())].into(),
        capacity: Resources::cpu_memory(cpu * 1000, (cpu * 4) << 30)
            .with(ResourceName::PODS, 110)
            .with(ResourceName::NVIDIA_GPU, gpus),
        overhead: Default::default(),
        offerings: offerings.iter().map(|(z, ct, p)| Offering::new(*z, *ct, *p)).collect(),
    }
}

#[derive(Default)]
struct Fleet {
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    pools: Vec<NodePool>,
    pdbs: Vec<PodDisruptionBudget>,
    types: Vec<InstanceType>,
}

impl Fleet {
    fn pool(mut self, name: &str, extra: Value) -> Self {
        let mut v =
            json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": {}});
        merge(&mut v, extra);
        self.pools.push(serde_json::from_value(v).unwrap());
        self
    }

    fn node(mut self, name: &str, pool: &str, it: &str, zone: &str, ct: CapacityType) -> Self {
        let t = self.types.iter().find(|t| t.name == it).unwrap().clone();
        let alloc = t.allocatable();
        self.nodes.push(
            serde_json::from_value(json!({
                "metadata": {"name": name, "creationTimestamp": "2026-03-01T00:00:00Z", "labels": {
                    labels::NODE_POOL: pool, labels::INSTANCE_TYPE: it, labels::ZONE: zone,
                    labels::CAPACITY_TYPE: ct.as_str(), labels::INITIALIZED: "true", labels::ARCH: "amd64"}},
                "spec": {"providerID": format!("fake:///{zone}/{name}")},
                "status": {"allocatable": serde_json::to_value(alloc).unwrap(), "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap(),
        );
        self
    }

    fn pod(mut self, name: &str, node: &str, cpu: &str, gpus: i64, meta: Value) -> Self {
        let mut requests = json!({"cpu": cpu});
        if gpus > 0 {
            requests["nvidia.com/gpu"] = json!(gpus.to_string());
        }
        let mut v = json!({
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": "2026-03-01T00:00:00Z"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": requests}}]},
            "status": {"phase": "Running", "startTime": "2026-03-01T00:00:00Z"}
        });
        merge(&mut v, json!({"metadata": meta}));
        self.pods.push(serde_json::from_value(v).unwrap());
        self
    }

    fn pdb(mut self, name: &str, app: &str, max_unavailable: i32) -> Self {
        self.pdbs.push(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}}}))
            .unwrap(),
        );
        self
    }

    fn state(&self) -> ClusterState {
        ClusterState::from_objects(&self.pods, &self.nodes, &[], &[], &self.pdbs, &self.pools, now()).unwrap()
    }

    fn pass_with(&self, settings: &Settings) -> Pass {
        let state = self.state();
        let types = self.types.clone();
        let types_for = move |_: &NodePool| types.clone().into();
        compute(&Inputs { state: &state, types_for: &types_for, settings, now: now() })
    }

    fn pass(&self) -> Pass {
        self.pass_with(&Settings::default())
    }

    /// A pass as the operator runs it, `unread` naming the nodes whose reasons nobody reads.
    fn pass_unread(&self, settings: &Settings, unread: &dyn Fn(&str) -> bool) -> Pass {
        let state = self.state();
        let types = self.types.clone();
        let types_for = move |_: &NodePool| types.clone().into();
        let inputs = Inputs { state: &state, types_for: &types_for, settings, now: now() };
        let (cands, blocked) = candidates(&state, &types_for, now());
        compute_with(&inputs, cands, blocked, &Default::default(), unread)
    }

    /// Single-node consolidation alone, as the walk of the first worked example.
    fn single(&self, settings: &Settings) -> (Vec<Command>, Vec<Blocked>) {
        let state = self.state();
        let types = self.types.clone();
        let types_for = move |_: &NodePool| types.clone().into();
        let inputs = Inputs { state: &state, types_for: &types_for, settings, now: now() };
        let (cands, _) = candidates(&state, &types_for, now());
        let mut sim = Simulator::new(&inputs, &cands);
        sim.single_node(&cands, &Default::default(), &mut || false)
    }
}

fn settings_with(pairs: &[(&str, &str)]) -> Settings {
    let flags: Vec<(String, String)> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    settings::load(None, Vec::new(), &flags).unwrap().settings
}

fn gpu_catalog() -> Vec<InstanceType> {
    use CapacityType::*;
    vec![
        itype("g5.2xlarge", 8, 1, &[("us-east-1a", OnDemand, 1.21), ("us-east-1a", Spot, 0.51)]),
        itype("g5.12xlarge", 48, 4, &[("us-east-1a", OnDemand, 5.67)]),
        itype("g5.48xlarge", 192, 8, &[("us-east-1a", OnDemand, 16.29)]),
    ]
}

const TRAINING: &str = "karpenter.sh/do-not-disrupt";

/// Part 2's walk: bar ($5.67/h, one 4-GPU job) is deleted because the job fits foo's free GPUs; the
/// $1.21 on-demand g5.2xlarge whose pod fits nowhere is replaced by the same type on spot at $0.51.
#[test]
fn worked_example_delete_onto_free_gpus_then_replace_on_demand_with_spot() {
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({}))
        .node("foo", "gpu", "g5.48xlarge", "us-east-1a", CapacityType::OnDemand)
        .node("bar", "gpu", "g5.12xlarge", "us-east-1a", CapacityType::OnDemand)
        .pod("checkpointing", "foo", "8", 4, json!({"annotations": {TRAINING: "true"}}))
        .pod("job", "bar", "8", 4, json!({}));
    let (commands, notes) = fleet.single(&Settings::default());
    assert_eq!(commands.len(), 1);
    let c = &commands[0];
    assert_eq!(c.decision, Decision::Delete);
    assert_eq!(c.candidates[0].node, "bar");
    assert_eq!(c.candidates[0].price, 5.67);
    assert_eq!(c.savings_per_hour, 5.67);
    assert!(notes.is_empty() || notes.iter().all(|n| n.node != "bar"));

    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({}))
        .node("lonely", "gpu", "g5.2xlarge", "us-east-1a", CapacityType::OnDemand)
        .pod("inference", "lonely", "4", 1, json!({}));
    let (commands, _) = fleet.single(&Settings::default());
    let c = &commands[0];
    assert_eq!(c.decision, Decision::Replace);
    assert_eq!(c.candidates[0].price, 1.21);
    assert_eq!(c.replacements.len(), 1);
    let r = &c.replacements[0];
    assert_eq!(r.instance_types, ["g5.2xlarge"]);
    assert_eq!(r.capacity_types, [CapacityType::Spot]);
    assert_eq!(r.worst_case_price, 0.51);
    assert!((c.savings_per_hour - 0.70).abs() < 1e-9);
}

/// The split fallback: a $30/h 8-GPU on-demand node running 5 GPUs of pods becomes a $11 4-GPU spot
/// node and a $3 1-GPU spot node.
#[test]
fn worked_example_split_one_node_into_two() {
    use CapacityType::*;
    let types = vec![
        itype("gpu.8x", 64, 8, &[("a", OnDemand, 30.0)]),
        itype("gpu.4x", 32, 4, &[("a", OnDemand, 20.0), ("a", Spot, 11.0)]),
        itype("gpu.1x", 8, 1, &[("a", OnDemand, 5.0), ("a", Spot, 3.0)]),
    ];
    let fleet = Fleet { types, ..Default::default() }
        .pool("gpu", json!({}))
        .node("fat", "gpu", "gpu.8x", "a", OnDemand)
        .pod("four", "fat", "16", 4, json!({}))
        .pod("one", "fat", "4", 1, json!({}));
    let upstream = fleet.pass();
    assert!(upstream.commands.is_empty(), "upstream: 5 GPUs fit no single node under $30");
    let reason = &upstream.unconsolidatable.iter().find(|b| b.node == "fat").unwrap().reason;
    assert!(reason.contains("can't replace with a lower-priced node"), "{reason}");

    let split = settings_with(&[("CONSOLIDATION_SPLIT_FALLBACK", "true"), ("max-consolidation-replacements", "2")]);
    let pass = fleet.pass_with(&split);
    assert_eq!(pass.method, Some(Method::SingleNodeConsolidation), "{:?}", pass.unconsolidatable);
    let c = &pass.commands[0];
    assert_eq!(c.decision, Decision::Replace);
    let mut prices: Vec<f64> = c.replacements.iter().map(|r| r.worst_case_price).collect();
    prices.sort_by(f64::total_cmp);
    assert_eq!(prices, [3.0, 11.0]);
    assert_eq!(c.savings_per_hour, 16.0);
    // The split alone: with only one replacement allowed it stays put.
    let capped = settings_with(&[("CONSOLIDATION_SPLIT_FALLBACK", "true")]);
    assert!(fleet.pass_with(&capped).commands.is_empty());
}

/// A split that needs a single node is a replace, and the replace checks that turned it down stand: a spot
/// node is not swapped for cheaper spot while spot-to-spot consolidation is off, split fallback or not.
#[test]
fn a_one_node_split_does_not_bypass_the_replace_checks() {
    use CapacityType::*;
    let types = vec![itype("gpu.8x", 64, 8, &[("a", Spot, 6.84)]), itype("gpu.4x", 32, 4, &[("a", Spot, 2.38)])];
    let fleet = Fleet { types, ..Default::default() }
        .pool("gpu", json!({}))
        .node("big", "gpu", "gpu.8x", "a", Spot)
        .pod("x", "big", "8", 2, json!({}))
        .pod("y", "big", "8", 2, json!({}));
    let split = [("CONSOLIDATION_SPLIT_FALLBACK", "true"), ("max-consolidation-replacements", "4")];
    let pass = fleet.pass_with(&settings_with(&split));
    assert!(pass.commands.is_empty(), "{:?}", pass.commands);
    let reason = &pass.unconsolidatable.iter().find(|b| b.node == "big").unwrap().reason;
    assert!(reason.contains("spot-to-spot consolidation is disabled"), "{reason}");
    // With the gate on and a floor one type meets, the same move is a plain 1:1 replace.
    let gated = [
        split[0],
        split[1],
        ("feature-gates", "SpotToSpotConsolidation=true"),
        ("spot-to-spot-min-instance-types", "1"),
    ];
    let pass = fleet.pass_with(&settings_with(&gated));
    let c = &pass.commands[0];
    assert_eq!((c.decision, c.replacements.len()), (Decision::Replace, 1), "{:?}", pass.unconsolidatable);
    assert_eq!(c.replacements[0].worst_case_price, 2.38);
}

/// The on-demand → spot retry: one spiked zone (f, $1.40) vetoes the worst-case price; the retry pins spot
/// to zones a..e, whose worst case is $0.62.
#[test]
fn worked_example_od_to_spot_retry_pins_the_cheap_zones() {
    use CapacityType::*;
    let spots = [("a", 0.51), ("b", 0.47), ("c", 0.62), ("d", 0.58), ("e", 0.55), ("f", 1.40)];
    let mut offerings: Vec<(&str, CapacityType, f64)> = spots.iter().map(|(z, p)| (*z, Spot, *p)).collect();
    offerings.extend(spots.iter().map(|(z, _)| (*z, OnDemand, 1.21)));
    let fleet = Fleet { types: vec![itype("g5.2xlarge", 8, 1, &offerings)], ..Default::default() }
        .pool("gpu", json!({}))
        .node("od", "gpu", "g5.2xlarge", "a", OnDemand)
        .pod("p", "od", "4", 1, json!({}));
    let pass = fleet.pass();
    let c = &pass.commands[0];
    assert_eq!(c.decision, Decision::Replace);
    let r = &c.replacements[0];
    assert_eq!(r.capacity_types, [Spot]);
    assert_eq!(r.zones, ["a", "b", "c", "d", "e"]);
    assert_eq!(r.worst_case_price, 0.62);
    assert!((c.savings_per_hour - 0.59).abs() < 1e-9);
    let pinned = r.plan.requirements.get(labels::ZONE).unwrap();
    assert!(!pinned.has("f"), "the launch is pinned, so the priced worst case is the worst it can do");

    let off = settings_with(&[("OD_TO_SPOT_CONSOLIDATION", "false")]);
    let pass = fleet.pass_with(&off);
    assert!(pass.commands.is_empty(), "without the retry the spiked zone vetoes the replacement");
}

/// The disruption documentation's budget example on 19 empty nodes: 20% for Empty allows 4.
#[test]
fn nineteen_empty_nodes_under_a_twenty_percent_budget_lose_four() {
    use CapacityType::*;
    let mut fleet = Fleet { types: vec![itype("m5.large", 2, 0, &[("a", OnDemand, 0.096)])], ..Default::default() }.pool(
        "default",
        json!({"spec": {"disruption": {"budgets": [{"nodes": "20%", "reasons": ["Empty", "Drifted"]}, {"nodes": "5"}]}}}),
    );
    for i in 0..19 {
        fleet = fleet.node(&format!("n{i:02}"), "default", "m5.large", "a", OnDemand);
    }
    let pass = fleet.pass();
    assert_eq!(pass.method, Some(Method::Emptiness));
    assert_eq!(pass.commands[0].candidates.len(), 4);
    assert_eq!(pass.commands[0].reason, DisruptionReason::Empty);
    let over = pass.unconsolidatable.iter().filter(|b| b.reason.contains("budget for Empty")).count();
    assert_eq!(over, 15);
}

#[test]
fn a_scheduled_zero_budget_says_until_when() {
    use CapacityType::*;
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({"spec": {"disruption": {"budgets": [{"nodes": "0", "schedule": "0 12 * * *", "duration": "10m", "reasons": ["Underutilized"]}]}}}))
        .node("lonely", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .pod("inference", "lonely", "4", 1, json!({}));
    let pass = fleet.pass();
    assert!(pass.commands.is_empty());
    assert_eq!(pass.unconsolidatable[0].reason, "budget for Underutilized in NodePool gpu is 0 until 12:10Z");
}

#[test]
fn pdbs_and_do_not_disrupt_block_and_say_so() {
    use CapacityType::*;
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({}))
        .node("n1", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .node("n2", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .node("n3", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .pod("web", "n1", "1", 0, json!({"labels": {"app": "web"}}))
        .pdb("web", "web", 0)
        .pod("job", "n2", "1", 0, json!({"annotations": {TRAINING: "true"}}))
        .pod("warm", "n3", "1", 0, json!({"annotations": {TRAINING: "1000h"}}));
    let pass = fleet.pass();
    let reason = |n: &str| pass.unconsolidatable.iter().find(|b| b.node == n).unwrap().reason.clone();
    assert_eq!(reason("n1"), "pdb default/web prevents pod evictions");
    assert_eq!(reason("n2"), "pod default/job has karpenter.sh/do-not-disrupt");
    assert_eq!(reason("n3"), "pod default/warm has karpenter.sh/do-not-disrupt", "a duration still running");
    // A duration that has elapsed no longer protects the pod.
    let elapsed = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({}))
        .node("n4", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .pod("done", "n4", "1", 0, json!({"annotations": {TRAINING: "1h"}}));
    assert!(elapsed.pass().unconsolidatable.iter().all(|b| !b.reason.contains("do-not-disrupt")));
}

/// A reason nobody reads (the node's event is still silenced) is not worked out in full, and nothing it
/// decides changes: a spot node that only a delete could move stops simulating at the first pod that needs a
/// new node; one whose pods fit elsewhere is deleted as before; an on-demand node stops at a first new node
/// that costs as much as it does and is replaced as before by a cheaper one; with reserved capacity in the
/// pool (cheaper than the node, and no spot replacement) the simulation runs in full.
#[test]
fn unread_reasons_change_no_decision() {
    use CapacityType::*;
    let types = vec![itype("big", 16, 0, &[("a", Spot, 1.0)]), itype("small", 4, 0, &[("a", Spot, 0.2)])];
    let settings = Settings::default();
    let reasons = |pass: &Pass| -> Vec<(String, String)> {
        pass.unconsolidatable.iter().map(|b| (b.node.clone(), b.reason.clone())).collect()
    };
    let commands = |pass: &Pass| serde_json::to_value(&pass.commands).unwrap();

    // s1 (big, 10 CPU used) and a second spot node of `it` running a pod of `cpu`.
    let two_spot = |it: &str, cpu: &str| {
        Fleet { types: types.clone(), ..Default::default() }
            .pool("spot", json!({}))
            .node("s1", "spot", "big", "a", Spot)
            .pod("p1", "s1", "10", 0, json!({}))
            .node("s2", "spot", it, "a", Spot)
            .pod("p2", "s2", cpu, 0, json!({}))
    };
    // Neither pod fits the other node: each needs a new spot node, which spot-to-spot consolidation (off)
    // would have to approve. Unread, that is known without a simulation: s1's pod has room on no other node.
    let full = two_spot("big", "10");
    let read = full.pass_unread(&settings, &|_| false);
    assert!(read.commands.is_empty());
    assert!(reasons(&read).iter().all(|(_, r)| r.contains("spot-to-spot consolidation is disabled")), "{read:?}");
    let unread = full.pass_unread(&settings, &|n| n == "s1");
    assert!(unread.commands.is_empty());
    assert_eq!(
        reasons(&unread),
        [("s1".to_owned(), super::consolidation::FITS_NO_OTHER_NODE.to_owned()), reasons(&read)[1].clone()]
    );
    // Each of s1's two pods has room on s2, not both: the simulation runs, and stops at the new node the
    // second needs.
    let both = Fleet { types: types.clone(), ..Default::default() }
        .pool("spot", json!({}))
        .node("s1", "spot", "big", "a", Spot)
        .pod("p1", "s1", "5", 0, json!({}))
        .pod("p1b", "s1", "5", 0, json!({}))
        .node("s2", "spot", "big", "a", Spot)
        .pod("p2", "s2", "10", 0, json!({}));
    let unread = both.pass_unread(&settings, &|n| n == "s1");
    assert!(unread.commands.is_empty());
    assert_eq!(reasons(&unread)[0], ("s1".to_owned(), super::consolidation::NEEDS_A_NEW_SPOT_NODE.to_owned()));

    // s2's pod fits on s1: deleted, whoever reads the reasons.
    let room = two_spot("small", "1");
    let read = room.pass_unread(&settings, &|_| false);
    assert_eq!(read.commands.len(), 1);
    assert_eq!(read.commands[0].decision, Decision::Delete);
    assert_eq!(commands(&room.pass_unread(&settings, &|_| true)), commands(&read));

    // On demand, where only a cheaper node could replace it: stops at a first new node that costs as much
    // (p1 needs `big` again), simulates on when a cheaper one is possible (p2 fits `small`).
    let on_demand = vec![
        itype("big", 16, 0, &[("a", OnDemand, 1.0)]),
        itype("small", 4, 0, &[("a", OnDemand, 0.2), ("b", OnDemand, 2.0)]),
    ];
    let dear = Fleet { types: on_demand.clone(), ..Default::default() }
        .pool("od", json!({}))
        .node("o1", "od", "big", "a", OnDemand)
        .pod("p1", "o1", "10", 0, json!({}));
    let read = dear.pass_unread(&settings, &|_| false);
    assert!(read.commands.is_empty());
    assert!(reasons(&read)[0].1.contains("can't replace with a lower-priced node"), "{read:?}");
    let unread = dear.pass_unread(&settings, &|_| true);
    assert!(unread.commands.is_empty());
    assert_eq!(reasons(&unread), [("o1".to_owned(), super::consolidation::NEEDS_A_DEARER_NODE.to_owned())]);
    // `small` could launch for less in zone a, so the simulation runs on; priced at its worst (zone b) it is
    // no cheaper, and the full reason stands.
    let worst = Fleet { types: on_demand, ..Default::default() }
        .pool("od", json!({}))
        .node("o2", "od", "big", "a", OnDemand)
        .pod("p2", "o2", "2", 0, json!({}));
    let read = worst.pass_unread(&settings, &|_| false);
    assert!(read.commands.is_empty());
    assert_eq!(reasons(&worst.pass_unread(&settings, &|_| true)), reasons(&read));
    // With `small` in zone a only, o2 is replaced, whoever reads the reasons.
    let mut zone_a = worst.types.clone();
    zone_a[1].offerings.truncate(1);
    let cheaper = Fleet { types: zone_a, ..worst };
    let read = cheaper.pass_unread(&settings, &|_| false);
    assert_eq!(read.commands.len(), 1, "{read:?}");
    assert_eq!(read.commands[0].decision, Decision::Replace);
    assert_eq!(commands(&cheaper.pass_unread(&settings, &|_| true)), commands(&read));

    // A cheaper reservation of `big` in the pool: the new node launches on it as reserved capacity, not
    // spot, and replaces s1, whoever reads the reasons.
    let mut reserved = types;
    let mut offering = Offering::new("a", Reserved, 0.5);
    offering.reservation_id = Some("r-1".into());
    offering.reservation_capacity = Some(1);
    reserved[0].offerings.insert(0, offering);
    let full = Fleet { types: reserved, ..full };
    let read = full.pass_unread(&settings, &|_| false);
    assert_eq!(read.commands.len(), 1, "{read:?}");
    assert_eq!(read.commands[0].decision, Decision::Replace);
    assert_eq!(commands(&full.pass_unread(&settings, &|_| true)), commands(&read));
}

/// Whatever set of candidates is simulated, alone or together, on spot or on demand, with spot-to-spot
/// consolidation on or off and the split fallback on or off, with a node still booting or not, a simulation
/// that may stop once the answer is "stays" decides as the full one does.
#[test]
fn stopping_early_decides_as_the_full_simulation() {
    use CapacityType::*;
    let types = vec![
        itype("big", 16, 0, &[("a", Spot, 0.4), ("a", OnDemand, 1.0)]),
        itype("mid", 8, 0, &[("a", Spot, 0.3), ("a", OnDemand, 0.5)]),
        itype("small", 4, 0, &[("a", Spot, 0.1), ("a", OnDemand, 0.25)]),
    ];
    let mixed = |pool: Value| {
        Fleet { types: types.clone(), ..Default::default() }
            .pool("default", pool)
            .node("n1", "default", "big", "a", OnDemand)
            .pod("p1", "n1", "10", 0, json!({}))
            .node("n2", "default", "big", "a", OnDemand)
            .pod("p2", "n2", "3", 0, json!({}))
            .pod("p2b", "n2", "2", 0, json!({}))
            .node("n3", "default", "small", "a", OnDemand)
            .pod("p3", "n3", "1", 0, json!({}))
            .node("n4", "default", "big", "a", Spot)
            .pod("p4", "n4", "12", 0, json!({}))
            .node("n5", "default", "mid", "a", Spot)
            .pod("p5", "n5", "2", 0, json!({}))
            .pod("p5b", "n5", "3", 0, json!({}))
            .node("n6", "default", "mid", "a", OnDemand)
            .pod("p6", "n6", "7", 0, json!({}))
    };
    // The same fleet packing by marginal cost: claims re-packed after the solve.
    let marginal_pool =
        || json!({"metadata": {"annotations": {"karpenter.sh/nodeclaim-packing-policy": "marginal-cost"}}});
    let marginal = mixed(marginal_pool());
    // A node only a split can move: its two pods keep apart (hostname anti-affinity), and two cheaper
    // nodes take them.
    let mut split = Fleet {
        types: vec![itype("big", 16, 0, &[("a", OnDemand, 1.0)]), itype("mid", 8, 0, &[("a", OnDemand, 0.3)])],
        ..Default::default()
    }
    .pool("default", json!({}))
    .node("n7", "default", "big", "a", OnDemand)
    .pod("p7", "n7", "6", 0, json!({"labels": {"app": "apart"}}))
    .pod("p7b", "n7", "6", 0, json!({"labels": {"app": "apart"}}));
    for pod in &mut split.pods {
        pod.spec.as_mut().unwrap().affinity = Some(
            serde_json::from_value(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": labels::HOSTNAME, "labelSelector": {"matchLabels": {"app": "apart"}}}]}}))
            .unwrap(),
        );
    }
    let verdict = |r: Result<Command, String>| r.map(|c| serde_json::to_value(&c).unwrap()).map_err(|_| ());
    let mut stopped_differently = 0;
    let mut stopped_at_booting = 0;
    let mut not_simulated = 0;
    let mut splits = 0;
    // The same fleets with their first node still booting: pods that land there cannot count on it.
    let fleets = [
        (mixed(json!({})), false),
        (marginal, false),
        (split, false),
        (mixed(json!({})), true),
        (mixed(marginal_pool()), true),
    ];
    for (fleet, first_booting) in fleets {
        let mut state = fleet.state();
        if first_booting {
            state.nodes[0].initialized = false;
        }
        let types = fleet.types.clone();
        let types_for = move |_: &NodePool| types.clone().into();
        let (cands, _) = candidates(&state, &types_for, now());
        for flags in [
            vec![],
            vec![("FEATURE_GATES", "SpotToSpotConsolidation=true")],
            vec![("CONSOLIDATION_SPLIT_FALLBACK", "true"), ("max-consolidation-replacements", "2")],
        ] {
            let settings = settings_with(&flags);
            let inputs = Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() };
            let mut full = Simulator::new(&inputs, &cands);
            let mut quick = Simulator::new(&inputs, &cands);
            for mask in 1u32..(1 << cands.len()) {
                let set: Vec<&Candidate> =
                    (0..cands.len()).filter(|i| mask & (1 << i) != 0).map(|i| &cands[i]).collect();
                for multi in [false, true] {
                    if !multi && set.len() > 1 {
                        continue;
                    }
                    let a = full.consolidate(&set, multi);
                    let b = quick.consolidate_unread(&set, multi);
                    stopped_differently += usize::from(matches!((&a, &b), (Err(x), Err(y)) if x != y));
                    stopped_at_booting +=
                        usize::from(matches!(&b, Err(y) if y == super::consolidation::LANDS_ON_A_BOOTING_NODE));
                    not_simulated += usize::from(matches!(&b, Err(y) if y == super::consolidation::FITS_NO_OTHER_NODE));
                    splits += usize::from(a.as_ref().is_ok_and(|c| c.replacements.len() > 1));
                    assert_eq!(verdict(a), verdict(b), "{flags:?} {mask} multi {multi}");
                }
            }
        }
    }
    assert!(splits > 0, "a split was tried");
    assert!(stopped_differently > 0, "some simulation stopped early");
    assert!(stopped_at_booting > 0, "some simulation stopped at a booting node");
    assert!(not_simulated > 0, "some candidate's pod had no other node to land on");
}

/// A pass registers a candidate's pods with the bases the first time it simulates them: whichever
/// candidates it simulated before, and in whatever order, a simulation decides (with the same reason) as
/// the first simulation of a fresh pass does. The pods spread over zones and keep apart by hostname, with
/// selectors that pick other candidates' pods, so the groups registered earlier count the pods simulated
/// later.
#[test]
fn a_simulation_decides_alike_whatever_the_pass_simulated_before() {
    use CapacityType::*;
    let types = vec![
        itype("big", 16, 0, &[("a", OnDemand, 1.0), ("b", OnDemand, 1.0)]),
        itype("mid", 8, 0, &[("a", OnDemand, 0.5), ("b", OnDemand, 0.5)]),
        itype("small", 4, 0, &[("a", OnDemand, 0.2), ("b", OnDemand, 0.2)]),
    ];
    let mut fleet = Fleet { types, ..Default::default() }
        .pool("default", json!({}))
        .node("n1", "default", "big", "a", OnDemand)
        .pod("d1", "n1", "3", 0, json!({"labels": {"app": "db"}}))
        .node("n2", "default", "mid", "b", OnDemand)
        .pod("d2", "n2", "2", 0, json!({"labels": {"app": "db"}}))
        .node("n3", "default", "big", "a", OnDemand)
        .pod("w3", "n3", "2", 0, json!({"labels": {"app": "web"}}))
        .pod("w3b", "n3", "2", 0, json!({"labels": {"app": "web"}}))
        .node("n4", "default", "small", "b", OnDemand)
        .pod("c4", "n4", "1", 0, json!({"labels": {"app": "cache"}}))
        .node("n5", "default", "mid", "b", OnDemand)
        .pod("w5", "n5", "1", 0, json!({"labels": {"app": "web"}}));
    for pod in &mut fleet.pods {
        let app = pod.metadata.labels.as_ref().and_then(|l| l.get("app")).cloned().unwrap();
        let spec = pod.spec.as_mut().unwrap();
        match app.as_str() {
            // Web spreads over zones counting web and db pods alike.
            "web" => {
                spec.topology_spread_constraints = Some(
                    serde_json::from_value(json!([{"maxSkew": 1, "topologyKey": labels::ZONE,
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "db"]}]}}]))
                    .unwrap(),
                )
            }
            // A db pod keeps off nodes with another db pod, and off the cache's zone.
            "db" => {
                spec.affinity = Some(
                    serde_json::from_value(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": labels::HOSTNAME, "labelSelector": {"matchLabels": {"app": "db"}}},
                        {"topologyKey": labels::ZONE, "labelSelector": {"matchLabels": {"app": "cache"}}}]}}))
                    .unwrap(),
                )
            }
            _ => {}
        }
    }
    let state = fleet.state();
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let (cands, _) = candidates(&state, &types_for, now());
    assert_eq!(cands.len(), 5);
    let settings = Settings::default();
    let inputs = Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() };
    let verdict = |r: Result<Command, String>| r.map(|c| serde_json::to_value(&c).unwrap());
    let sets: Vec<(Vec<&Candidate>, bool)> = (1u32..(1 << cands.len()))
        .flat_map(|mask| {
            let set: Vec<&Candidate> = (0..cands.len()).filter(|i| mask & (1 << i) != 0).map(|i| &cands[i]).collect();
            let single = set.len() == 1;
            [(set.clone(), true)].into_iter().chain(single.then_some((set, false)))
        })
        .collect();
    let fresh: Vec<_> =
        sets.iter().map(|(set, multi)| verdict(Simulator::new(&inputs, &cands).consolidate(set, *multi))).collect();
    let (mut moved, mut stayed) = (0, 0);
    for order in [sets.iter().collect::<Vec<_>>(), sets.iter().rev().collect()] {
        let mut warm = Simulator::new(&inputs, &cands);
        for (set, multi) in order {
            let i = sets.iter().position(|(s, m)| std::ptr::eq(s, set) && m == multi).unwrap();
            let got = verdict(warm.consolidate(set, *multi));
            moved += usize::from(got.is_ok());
            stayed += usize::from(got.is_err());
            assert_eq!(got, fresh[i], "{:?} multi {multi}", set.iter().map(|c| &c.node).collect::<Vec<_>>());
        }
    }
    assert!(moved > 0 && stayed > 0, "{moved} moves, {stayed} stays");
}

#[test]
fn spot_to_spot_needs_the_gate_and_enough_cheaper_types() {
    use CapacityType::*;
    let mut types = vec![itype("big", 16, 0, &[("a", Spot, 1.0)])];
    for i in 0..20 {
        types.push(itype(&format!("small-{i:02}"), 4, 0, &[("a", Spot, 0.10 + 0.01 * i as f64)]));
    }
    let fleet = Fleet { types: types.clone(), ..Default::default() }
        .pool("spot", json!({}))
        .node("s", "spot", "big", "a", Spot)
        .pod("p", "s", "2", 0, json!({}));
    let pass = fleet.pass();
    assert!(pass.commands.is_empty());
    assert!(pass.unconsolidatable[0].reason.contains("SpotToSpotConsolidation"), "{:?}", pass.unconsolidatable);

    let gate = settings_with(&[("FEATURE_GATES", "SpotToSpotConsolidation=true")]);
    let pass = fleet.pass_with(&gate);
    let r = &pass.commands[0].replacements[0];
    assert_eq!(r.instance_types.len(), 15, "the launch is capped to the floor's cheapest options");
    assert_eq!(r.instance_types[0], "small-00");

    let floor =
        settings_with(&[("FEATURE_GATES", "SpotToSpotConsolidation=true"), ("spot-to-spot-min-instance-types", "25")]);
    let pass = fleet.pass_with(&floor);
    assert!(pass.commands.is_empty());
    assert!(
        pass.unconsolidatable[0]
            .reason
            .contains("needs 25 cheaper instance types (spot-to-spot-min-instance-types), found 20"),
        "{:?}",
        pass.unconsolidatable
    );
}

#[test]
fn replace_min_savings_is_a_floor() {
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({}))
        .node("lonely", "gpu", "g5.2xlarge", "us-east-1a", CapacityType::OnDemand)
        .pod("inference", "lonely", "4", 1, json!({}));
    let strict = settings_with(&[("consolidation-replace-min-savings", "60%")]);
    let pass = fleet.pass_with(&strict);
    assert!(pass.commands.is_empty());
    assert!(pass.unconsolidatable[0].reason.contains("below the 60.0% floor"), "{:?}", pass.unconsolidatable);
}

#[test]
fn when_empty_and_consolidate_after_gate_consolidation() {
    let base = |extra: Value| {
        Fleet { types: gpu_catalog(), ..Default::default() }
            .pool("gpu", extra)
            .node("lonely", "gpu", "g5.2xlarge", "us-east-1a", CapacityType::OnDemand)
            .pod("inference", "lonely", "4", 1, json!({}))
    };
    let pass = base(json!({"spec": {"disruption": {"consolidationPolicy": "WhenEmpty"}}})).pass();
    assert!(pass.commands.is_empty());
    assert_eq!(pass.unconsolidatable[0].reason, "consolidationPolicy WhenEmpty only removes empty nodes");
    let pass = base(json!({"spec": {"disruption": {"consolidateAfter": "Never"}}})).pass();
    assert!(pass.unconsolidatable[0].reason.contains("consolidateAfter: Never"));
    let pass = base(json!({"spec": {"disruption": {"consolidateAfter": "720h"}}})).pass();
    assert!(pass.unconsolidatable[0].reason.contains("within consolidateAfter 720h"), "{:?}", pass.unconsolidatable);
}

#[test]
fn balanced_weighs_savings_against_disruption() {
    use CapacityType::*;
    // Two nodes: a cheap one running many pods would save little for much disruption.
    let types = vec![itype("small", 4, 0, &[("a", OnDemand, 0.10)]), itype("large", 32, 0, &[("a", OnDemand, 2.00)])];
    let mut fleet = Fleet { types, ..Default::default() }
        .pool("b", json!({"spec": {"disruption": {"consolidationPolicy": "Balanced"}}}))
        .node("busy-small", "b", "small", "a", OnDemand)
        .node("big", "b", "large", "a", OnDemand);
    for i in 0..9 {
        fleet = fleet.pod(&format!("s{i}"), "busy-small", "100m", 0, json!({}));
    }
    fleet = fleet.pod("b0", "big", "20", 0, json!({}));
    let pass = fleet.pass();
    // Nothing is cheaper for big. Even deleting the small node, its 9 pods moving onto big, saves 0.10 of
    // 2.10 (4.8%) for 10 of the pool's 12 units of disruption (each node 1, plus 1 per pod: 83.3%):
    // rejected before any simulation, with its best-case score.
    let note = pass.unconsolidatable.iter().find(|b| b.node == "busy-small").unwrap();
    assert_eq!(
        note.reason,
        "Balanced: even deleting it saves 4.8% of the pool's cost for 83.3% of its disruption (score 0.06, \
         threshold 0.50): not worth the disruption"
    );
}

#[test]
fn balanced_denominators_span_the_whole_pool() {
    use CapacityType::*;
    // A large node's one pod fits a small node with room; a third node is held by a do-not-disrupt pod
    // (no candidate) but still counts in the pool's cost and disruption.
    let types = vec![itype("small", 4, 0, &[("a", OnDemand, 0.10)]), itype("large", 32, 0, &[("a", OnDemand, 2.00)])];
    let pinned = json!({"annotations": {labels::DO_NOT_DISRUPT: "true"}});
    let mut fleet = Fleet { types, ..Default::default() }
        .pool("b", json!({"spec": {"disruption": {"consolidationPolicy": "Balanced"}}}))
        .node("big", "b", "large", "a", OnDemand)
        .node("roomy", "b", "small", "a", OnDemand)
        .node("pinned", "b", "small", "a", OnDemand)
        .pod("mover", "big", "1", 0, json!({}))
        .pod("resident", "roomy", "100m", 0, json!({}))
        .pod("keeper", "pinned", "100m", 0, pinned);
    for i in 0..6 {
        fleet = fleet.pod(&format!("p{i}"), "pinned", "100m", 0, json!({}));
    }
    let pass = fleet.pass();
    assert_eq!(pass.commands.len(), 1, "{:?}", pass.unconsolidatable);
    let cmd = &pass.commands[0];
    assert_eq!(cmd.candidates.iter().map(|c| c.node.as_str()).collect::<Vec<_>>(), ["big"]);
    // Savings 2.00 of 2.20; disruption 2 (big: 1 + 1 pod) of 2 + 2 + 8 = 12, the pinned node's 8 included.
    assert_eq!(
        cmd.explanation,
        "Balanced: saves 90.9% of the pool's cost for 16.7% of its disruption (score 5.45, threshold 0.50)"
    );
}

#[test]
fn balanced_scores_each_pool_of_a_multi_node_move_on_its_share() {
    use CapacityType::*;
    // Two Balanced pools; a nearly empty large node in each, whose pods both fit l2, the busy node of the
    // left pool.
    let types = vec![itype("small", 4, 0, &[("a", OnDemand, 0.10)]), itype("large", 32, 0, &[("a", OnDemand, 1.00)])];
    let balanced = json!({"spec": {"disruption": {"consolidationPolicy": "Balanced"}}});
    let fleet = Fleet { types, ..Default::default() }
        .pool("left", balanced.clone())
        .pool("right", balanced)
        .node("l1", "left", "large", "a", OnDemand)
        .node("l2", "left", "large", "a", OnDemand)
        .node("r1", "right", "large", "a", OnDemand)
        .pod("la", "l1", "1", 0, json!({}))
        .pod("lb", "l2", "20", 0, json!({}))
        .pod("ra", "r1", "1", 0, json!({}));
    let pass = fleet.pass();
    assert_eq!(pass.method, Some(Method::MultiNodeConsolidation), "{:?}", pass.unconsolidatable);
    let cmd = &pass.commands[0];
    let mut nodes: Vec<&str> = cmd.candidates.iter().map(|c| c.node.as_str()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["l1", "r1"]);
    // The deletion saves 2.00, half attributed to each pool (equal source prices). left: 1.00 of 2.00 for
    // 2 of 4; right: 1.00 of 1.00 for 2 of 2.
    assert_eq!(
        cmd.explanation,
        "Balanced: NodePool left saves 50.0% of the pool's cost for 50.0% of its disruption (score 1.00, \
         threshold 0.50); NodePool right saves 100.0% of the pool's cost for 100.0% of its disruption \
         (score 1.00, threshold 0.50)"
    );
}

#[test]
fn single_node_interleaves_pools_and_takes_unreached_pools_first_after_a_timeout() {
    use CapacityType::*;
    // Pool "a" has three candidates with better savings ratios than pool "z"'s one; none can go.
    let types = vec![itype("large", 32, 0, &[("a", OnDemand, 2.00)]), itype("small", 4, 0, &[("a", OnDemand, 0.50)])];
    let fleet = Fleet { types, ..Default::default() }
        .pool("a", json!({}))
        .pool("z", json!({}))
        .node("a1", "a", "large", "a", OnDemand)
        .node("a2", "a", "large", "a", OnDemand)
        .node("a3", "a", "large", "a", OnDemand)
        .node("z1", "z", "small", "a", OnDemand)
        .pod("a1-pod", "a1", "30", 0, json!({}))
        .pod("a2-pod", "a2", "30", 0, json!({}))
        .pod("a3-pod", "a3", "30", 0, json!({}))
        .pod("z1-pod", "z1", "3500m", 0, json!({}));
    let state = fleet.state();
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let settings = Settings::default();
    let inputs = Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() };
    let (cands, _) = candidates(&state, &types_for, now());
    // The order examined: each pool in turn, best candidate first.
    let examined = |first: &std::collections::BTreeSet<String>, budget: usize| {
        let mut sim = Simulator::new(&inputs, &cands);
        let mut asked = 0;
        let (commands, notes) = sim.single_node(&cands, first, &mut || {
            asked += 1;
            asked > budget
        });
        assert!(commands.is_empty());
        let order: Vec<String> =
            notes.iter().filter(|n| !n.reason.starts_with("inconclusive")).map(|n| n.node.clone()).collect();
        (order, sim.take_unseen_pools())
    };
    let (order, unseen) = examined(&Default::default(), usize::MAX);
    assert_eq!(order, ["a1", "z1", "a2", "a3"]);
    assert_eq!(unseen, Some(Default::default()), "a sweep that finished leaves no pool unseen");
    // Out of time after one candidate: pool z was never reached, and goes first next time.
    let (order, unseen) = examined(&Default::default(), 1);
    assert_eq!(order, ["a1"]);
    let unseen = unseen.unwrap();
    assert_eq!(unseen.iter().map(String::as_str).collect::<Vec<_>>(), ["z"]);
    let (order, _) = examined(&unseen, usize::MAX);
    assert_eq!(order, ["z1", "a1", "a2", "a3"]);
}

/// Marks the first node's claim drifted because its on-demand lease ran out, and hands the claim back.
fn expire_lease(state: &mut ClusterState) -> &mut crate::api::NodeClaim {
    let claim = Arc::make_mut(state.nodes[0].claim.as_mut().unwrap());
    claim.set_condition(
        crate::api::condition_types::DRIFTED,
        crate::api::ConditionStatus::True,
        ON_DEMAND_LEASE_EXPIRED,
        "",
        now(),
    );
    claim
}

#[test]
fn drifted_nodes_are_replaced_and_expired_leases_go_to_spot_first() {
    use CapacityType::*;
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({"spec": {"template": {"spec": {"requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}]}}}}))
        .node("leased", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .pod("p", "leased", "4", 1, json!({"annotations": {TRAINING: "true"}}));
    let mut state = fleet.state();
    let claim = expire_lease(&mut state);
    claim.spec.termination_grace_period = Some(crate::api::KubeDuration::from_secs(3600));
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let s = Settings::default();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &s, now: now() });
    assert_eq!(pass.method, Some(Method::Drift));
    let r = &pass.commands[0].replacements[0];
    assert_eq!(r.capacity_types, [Spot], "the replacement is pinned to spot");
    assert!(r.plan.requirements.get(labels::CAPACITY_TYPE).unwrap().values() == ["spot"]);

    // Without spot capacity the on-demand node stays, and says why.
    let no_spot: Vec<InstanceType> = fleet
        .types
        .iter()
        .cloned()
        .map(|mut t| {
            t.offerings.retain(|o| o.capacity_type != Spot);
            t
        })
        .collect();
    let types_for = move |_: &NodePool| no_spot.clone().into();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &s, now: now() });
    assert!(pass.commands.is_empty());
    assert!(pass.unconsolidatable[0].reason.contains("no spot or reserved capacity to reclaim its on-demand lease"));
}

#[test]
fn an_expired_lease_is_reclaimed_onto_owned_reserved_capacity() {
    use CapacityType::*;
    // An owned fleet bursts to on-demand under a lease; when a reserved machine is free again the lease
    // path moves the pods back onto it rather than onto another on-demand node.
    let owned: Vec<InstanceType> = gpu_catalog()
        .into_iter()
        .map(|mut t| {
            let od: Vec<_> = t.offerings.iter().filter(|o| o.capacity_type == OnDemand).cloned().collect();
            t.offerings.retain(|o| o.capacity_type == OnDemand);
            t.offerings.extend(od.into_iter().map(|mut o| {
                o.capacity_type = Reserved;
                o.price *= 0.3;
                o.reservation_id = Some("owned".into());
                o.reservation_capacity = Some(1);
                o
            }));
            t
        })
        .collect();
    let fleet = Fleet { types: owned, ..Default::default() }
        .pool("gpu", json!({"spec": {"template": {"spec": {"requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["reserved", "on-demand"]}]}}}}))
        .node("leased", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .pod("p", "leased", "4", 1, json!({}));
    let mut state = fleet.state();
    expire_lease(&mut state);
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let s = Settings::default();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &s, now: now() });
    assert_eq!(pass.method, Some(Method::Drift));
    let r = &pass.commands[0].replacements[0];
    assert_eq!(r.capacity_types, [Reserved], "the replacement is an owned machine, not another on-demand node");
}

#[test]
fn a_changed_template_drifts_but_behavioural_fields_do_not() {
    use CapacityType::*;
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({}))
        .node("n", "gpu", "g5.2xlarge", "us-east-1a", OnDemand)
        .pod("p", "n", "4", 1, json!({"annotations": {TRAINING: "true"}}));
    let mut state = fleet.state();
    let pool = state.pools[0].clone();
    state.nodes[0].inferred_claim = false;
    let claim = Arc::make_mut(state.nodes[0].claim.as_mut().unwrap());
    claim.metadata.annotations = Some([(labels::NODEPOOL_HASH.to_owned(), pool.template_hash())].into());
    assert_eq!(drift_reason(&state.nodes[0], &pool), None);
    let mut behavioural = pool.clone();
    behavioural.spec.weight = Some(7);
    behavioural.spec.disruption.consolidation_policy = crate::api::ConsolidationPolicy::WhenEmpty;
    assert_eq!(drift_reason(&state.nodes[0], &behavioural), None);
    let mut relabelled = pool.clone();
    relabelled.spec.template.metadata.labels.insert("team".into(), "ml".into());
    assert_eq!(drift_reason(&state.nodes[0], &relabelled).as_deref(), Some("NodePoolDrifted"));
    let mut narrowed = pool;
    narrowed.spec.template.spec.requirements =
        vec![crate::api::NodeSelectorRequirement::new(labels::CAPACITY_TYPE, crate::api::Operator::In, ["spot"])];
    Arc::make_mut(state.nodes[0].claim.as_mut().unwrap()).metadata.annotations =
        Some([(labels::NODEPOOL_HASH.to_owned(), narrowed.template_hash())].into());
    assert_eq!(drift_reason(&state.nodes[0], &narrowed).as_deref(), Some("RequirementsDrifted"));
}

/// One on-demand m5.large type and a pool `default` whose one budget allows `nodes`, to add nodes to.
fn m5_fleet(nodes: &str) -> Fleet {
    Fleet { types: vec![itype("m5.large", 2, 0, &[("a", CapacityType::OnDemand, 0.096)])], ..Default::default() }
        .pool("default", json!({"spec": {"disruption": {"budgets": [{"nodes": nodes}]}}}))
}

/// Three on-demand m.8 nodes of one pool, each running a one-CPU pod, over `types`.
fn three_m8_nodes_with_a_pod_each(types: Vec<InstanceType>) -> Fleet {
    use CapacityType::*;
    let mut fleet = Fleet { types, ..Default::default() }
        .pool("default", json!({"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}}));
    for i in 1..=3 {
        fleet = fleet.node(&format!("a{i}"), "default", "m.8", "a", OnDemand).pod(
            &format!("p{i}"),
            &format!("a{i}"),
            "1",
            0,
            json!({}),
        );
    }
    fleet
}

#[test]
fn multi_node_consolidation_merges_half_empty_nodes() {
    use CapacityType::*;
    let types = vec![itype("m.4", 4, 0, &[("a", OnDemand, 0.20)]), itype("m.8", 8, 0, &[("a", OnDemand, 0.40)])];
    let fleet = three_m8_nodes_with_a_pod_each(types);
    let pass = fleet.pass();
    assert_eq!(pass.method, Some(Method::MultiNodeConsolidation));
    let c = &pass.commands[0];
    assert_eq!(c.candidates.len(), 3, "all three go");
    assert_eq!(c.decision, Decision::Replace);
    // An m.8 costs what each candidate does: only the cheaper m.4 may replace them.
    assert_eq!(c.replacements[0].instance_types, ["m.4"]);
    assert!((c.savings_per_hour - (1.20 - 0.20)).abs() < 1e-9, "{}", c.savings_per_hour);
}

/// Pending pods and the pods of a node already being deleted need the fleet's free room first: a candidate whose pod
/// would only fit in that same room is not deleted onto it.
#[test]
fn room_promised_to_pending_or_deleting_nodes_pods_is_not_room_for_candidates() {
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}}))
        .node("big", "gpu", "g5.12xlarge", "us-east-1a", CapacityType::OnDemand)
        .node("leaving", "gpu", "g5.2xlarge", "us-east-1a", CapacityType::OnDemand)
        .node("small", "gpu", "g5.2xlarge", "us-east-1a", CapacityType::OnDemand)
        .pod("training", "big", "8", 3, json!({"annotations": {TRAINING: "true"}}))
        .pod("moving", "leaving", "2", 1, json!({}))
        .pod("staying", "small", "2", 1, json!({}));
    let settings = Settings::default();
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let decide = |leaving_is_deleting: bool| {
        let mut state = fleet.state();
        for n in state.nodes.iter_mut().filter(|n| n.name == "leaving") {
            n.deleting = leaving_is_deleting;
        }
        let inputs = Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() };
        let (cands, _) = candidates(&state, &types_for, now());
        let cands: Vec<_> = cands.into_iter().filter(|c| c.node == "small").collect();
        let mut sim = Simulator::new(&inputs, &cands);
        sim.single_node(&cands, &Default::default(), &mut || false).0
    };
    // With nothing leaving, small's pod takes big's free GPU.
    let commands = decide(false);
    assert_eq!(commands[0].decision, Decision::Delete, "{commands:?}");
    // With leaving's pod headed for that GPU, small can only be replaced (by spot), not deleted.
    let commands = decide(true);
    assert!(!commands.is_empty() && commands.iter().all(|c| c.decision != Decision::Delete), "{commands:?}");

    // A pending pod has the same claim on the free GPU.
    let mut fleet = fleet;
    for p in fleet.pods.iter_mut().filter(|p| p.metadata.name.as_deref() == Some("moving")) {
        p.spec.as_mut().unwrap().node_name = None;
        p.status = None;
    }
    fleet.nodes.retain(|n| n.metadata.name.as_deref() != Some("leaving"));
    let state = fleet.state();
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let inputs = Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() };
    let (cands, _) = candidates(&state, &types_for, now());
    let cands: Vec<_> = cands.into_iter().filter(|c| c.node == "small").collect();
    let commands = Simulator::new(&inputs, &cands).single_node(&cands, &Default::default(), &mut || false).0;
    assert!(!commands.is_empty() && commands.iter().all(|c| c.decision != Decision::Delete), "{commands:?}");
}

#[test]
fn pods_do_not_move_onto_nodes_still_booting() {
    use CapacityType::*;
    let fleet = Fleet { types: gpu_catalog(), ..Default::default() }
        .pool("gpu", json!({}))
        .node("busy", "gpu", "g5.2xlarge", "us-east-1a", Spot)
        .node("booting", "gpu", "g5.2xlarge", "us-east-1a", Spot)
        .pod("p", "busy", "1", 0, json!({}))
        .pod("q", "booting", "1", 0, json!({}));
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let settings = Settings::default();
    // Both initialized: one pod joins the other and a node goes.
    let state = fleet.state();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() });
    assert_eq!(pass.method, Some(Method::SingleNodeConsolidation), "{:?}", pass.unconsolidatable);
    // `booting` not initialized yet: `busy` may not be deleted on the promise of its room.
    let mut state = fleet.state();
    state.nodes.iter_mut().find(|n| n.name == "booting").unwrap().initialized = false;
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &settings, now: now() });
    assert!(pass.commands.iter().all(|c| c.candidates.iter().all(|x| x.node != "busy")), "{:?}", pass.commands);
    let note = pass.unconsolidatable.iter().find(|b| b.node == "busy").unwrap();
    assert!(note.reason.contains("uninitialized node booting"), "{}", note.reason);
}

/// A pod tolerating every taint (`karpenter.sh/disrupted` too) still has to go somewhere when its node
/// goes, as Karpenter's `IsReschedulable` has it: its node is not empty. Only the drain leaves such pods.
/// A pod already terminating moves nowhere.
#[test]
fn a_pod_tolerating_the_disrupted_taint_still_keeps_its_node_from_being_empty() {
    use CapacityType::*;
    let mut fleet = m5_fleet("100%")
        .node("tolerant", "default", "m5.large", "a", OnDemand)
        .node("leaving", "default", "m5.large", "a", OnDemand)
        .pod("everywhere", "tolerant", "1", 0, json!({}))
        .pod("going", "leaving", "1", 0, json!({"deletionTimestamp": "2026-03-04T11:59:00Z"}));
    let spec = fleet.pods[0].spec.as_mut().unwrap();
    spec.tolerations =
        Some(vec![k8s_openapi::api::core::v1::Toleration { operator: Some("Exists".into()), ..Default::default() }]);
    let state = fleet.state();
    let tolerant = state.nodes.iter().position(|n| n.name == "tolerant").unwrap();
    let pods: Vec<&str> = state.nodes[tolerant].pods.iter().map(|i| state.pods[*i].info.key.as_str()).collect();
    assert_eq!(pods, ["default/everywhere"]);
    assert!(state.pods[state.nodes[tolerant].pods[0]].reschedulable(), "it must be rescheduled");
    let leaving = state.nodes.iter().position(|n| n.name == "leaving").unwrap();
    assert!(!state.pods[state.nodes[leaving].pods[0]].reschedulable(), "a terminating pod moves nowhere");
    let pass = fleet.pass();
    let emptied: Vec<&str> = pass
        .commands
        .iter()
        .filter(|c| c.reason == DisruptionReason::Empty)
        .flat_map(|c| c.candidates.iter().map(|x| x.node.as_str()))
        .collect();
    assert_eq!(emptied, ["leaving"], "{pass:?}");
}

/// A replacement that may launch both spot and on-demand is pinned to spot, as Karpenter's
/// `computeConsolidation` pins it: the options were priced as spot, and an on-demand fallback could cost
/// more than the node it replaces.
#[test]
fn a_replacement_that_could_fall_back_to_on_demand_is_pinned_to_spot() {
    use CapacityType::*;
    let types = vec![
        itype("big", 8, 0, &[("a", OnDemand, 0.40)]),
        // Cheaper as spot, dearer than the candidate as on-demand.
        itype("mixed", 2, 0, &[("a", Spot, 0.10), ("a", OnDemand, 0.50)]),
        // Cheaper than the candidate, but only on-demand.
        itype("od-only", 2, 0, &[("a", OnDemand, 0.30)]),
    ];
    let fleet = Fleet { types, ..Default::default() }
        .pool("default", json!({}))
        .node("n", "default", "big", "a", OnDemand)
        .pod("p", "n", "1", 0, json!({}));
    let pass = fleet.pass();
    assert_eq!(pass.method, Some(Method::SingleNodeConsolidation), "{pass:?}");
    let r = &pass.commands[0].replacements[0];
    assert_eq!(r.capacity_types, [Spot], "{r:?}");
    assert_eq!(r.instance_types, ["mixed"], "an on-demand-only option cannot launch as spot");
    assert!(r.worst_case_price < 0.40);
}

/// A node provisioning just nominated a pending pod to is left alone while the nomination holds, as
/// Karpenter leaves a nominated node: emptying it would strand the pod on its way there.
#[test]
fn a_node_nominated_for_a_pending_pod_is_not_disrupted() {
    use CapacityType::*;
    let fleet = m5_fleet("100%")
        .node("empty", "default", "m5.large", "a", OnDemand)
        .node("awaited", "default", "m5.large", "a", OnDemand);
    let mut state = fleet.state();
    let awaited = state.nodes.iter().position(|n| n.name == "awaited").unwrap();
    state.nodes[awaited].nominated = true;
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &Settings::default(), now: now() });
    let emptied: Vec<&str> = pass.commands.iter().flat_map(|c| c.candidates.iter().map(|x| x.node.as_str())).collect();
    assert_eq!(emptied, ["empty"]);
    let note = pass.unconsolidatable.iter().find(|b| b.node == "awaited").expect("a reason");
    assert_eq!(note.reason, "node is nominated for a pending pod");
    assert!(pass.blocked.contains("awaited"), "reported as DisruptionBlocked");
}

/// PDBs and `do-not-disrupt` as Karpenter reads them: a pod two PDBs select blocks (the Eviction API
/// refuses it), a not-Ready pod may go under `unhealthyPodEvictionPolicy: AlwaysAllow`, DaemonSet pods'
/// annotations count, Go durations with fractions parse, a pod with no start time fails safe, and an
/// invalid value counts as no annotation.
#[test]
fn pdbs_and_do_not_disrupt_follow_karpenters_rules() {
    use CapacityType::*;
    let blocked = |fleet: Fleet| -> Option<String> {
        let pass = fleet.pass();
        pass.unconsolidatable.iter().find(|b| b.node == "n").map(|b| b.reason.clone())
    };
    let base = || {
        m5_fleet("100%")
            .node("n", "default", "m5.large", "a", OnDemand)
            .node("other", "default", "m5.large", "a", OnDemand)
    };
    // Two PDBs, each allowing a disruption, select one pod.
    let mut two = base().pod("web", "n", "500m", 0, json!({"labels": {"app": "web", "tier": "front"}}));
    two = two.pdb("by-app", "web", 1);
    two.pdbs.push(
        serde_json::from_value(json!({"metadata": {"name": "by-tier", "namespace": "default"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"tier": "front"}}}}))
        .unwrap(),
    );
    let why = blocked(two).expect("blocked");
    assert!(why.contains("several PDBs") && why.contains("default/by-app") && why.contains("default/by-tier"), "{why}");
    // A PDB at zero lets a not-Ready pod go when its policy is AlwaysAllow.
    let at_zero = |policy: Option<&str>| {
        let mut f = base().pod("web", "n", "500m", 0, json!({"labels": {"app": "web"}})).pdb("web", "web", 0);
        if let Some(p) = policy {
            f.pdbs[0].spec.as_mut().unwrap().unhealthy_pod_eviction_policy = Some(p.into());
        }
        f.pods[0].status.as_mut().unwrap().conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        }]);
        f
    };
    assert_eq!(blocked(at_zero(None)).as_deref(), Some("pdb default/web prevents pod evictions"));
    assert_ne!(blocked(at_zero(Some("AlwaysAllow"))).as_deref(), Some("pdb default/web prevents pod evictions"));
    // A DaemonSet pod's do-not-disrupt holds its node.
    let ds = json!({"annotations": {labels::DO_NOT_DISRUPT: "true"}, "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": true}]});
    let why = blocked(base().pod("agent", "n", "100m", 0, ds)).expect("blocked");
    assert!(why.contains("default/agent") && why.contains(labels::DO_NOT_DISRUPT), "{why}");
    // Durations: the pods started 84 h before the pass.
    let with = |value: &str| base().pod("job", "n", "500m", 0, json!({"annotations": {labels::DO_NOT_DISRUPT: value}}));
    assert!(blocked(with("84.5h")).is_some_and(|w| w.contains(labels::DO_NOT_DISRUPT)), "a fraction parses");
    assert!(blocked(with("5040m30s")).is_some_and(|w| w.contains(labels::DO_NOT_DISRUPT)));
    assert!(!blocked(with("83.5h")).is_some_and(|w| w.contains(labels::DO_NOT_DISRUPT)), "run out");
    assert!(!blocked(with("True")).is_some_and(|w| w.contains(labels::DO_NOT_DISRUPT)), "not a value: none");
    let mut unstarted = with("1h");
    unstarted.pods[0].status.as_mut().unwrap().start_time = None;
    assert!(blocked(unstarted).is_some_and(|w| w.contains(labels::DO_NOT_DISRUPT)), "no start time fails safe");
}

/// A budget counts managed, initialized nodes only, as Karpenter's does: claims still launching are
/// neither in its total nor NotReady, so a pool scaling up still consolidates.
#[test]
fn claims_still_launching_do_not_use_up_the_budget() {
    use CapacityType::*;
    let fleet = m5_fleet("1")
        .node("empty-1", "default", "m5.large", "a", OnDemand)
        .node("empty-2", "default", "m5.large", "a", OnDemand);
    let launching: Vec<crate::api::NodeClaim> = (0..3)
        .map(|i| {
            let mut c = crate::api::NodeClaim::new(&format!("launching-{i}"), Default::default());
            c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
            c
        })
        .collect();
    let state =
        ClusterState::from_objects(&fleet.pods, &fleet.nodes, &launching, &[], &fleet.pdbs, &fleet.pools, now())
            .unwrap();
    let (pool, allowed, _) = allowances(&state, DisruptionReason::Empty, now()).remove(0);
    assert_eq!((pool.as_str(), allowed), ("default", 1));
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &Settings::default(), now: now() });
    assert_eq!(pass.commands.iter().map(|c| c.candidates.len()).sum::<usize>(), 1, "{pass:?}");
}

/// A node whose instance type its provider no longer lists has drifted (`InstanceTypeNotFound`), and one
/// with no known price (its provider's offerings could not be read) can still be emptied; only
/// consolidation, which weighs prices, leaves it.
#[test]
fn vanished_types_drift_and_unpriced_nodes_can_still_be_emptied() {
    use CapacityType::*;
    let fleet =
        m5_fleet("100%").node("retired", "default", "m5.large", "a", OnDemand).pod("p", "retired", "1", 0, json!({}));
    let state = fleet.state();
    let pass_with = |types: Vec<InstanceType>| {
        let types_for = move |_: &NodePool| types.clone().into();
        compute(&Inputs { state: &state, types_for: &types_for, settings: &Settings::default(), now: now() })
    };
    // The provider lists another type now.
    let pass = pass_with(vec![itype("m6i.large", 2, 0, &[("a", OnDemand, 0.096)])]);
    assert_eq!(pass.method, Some(Method::Drift), "{pass:?}");
    assert_eq!(pass.commands[0].reason, DisruptionReason::Drifted);
    let (cands, _) = candidates(&state, &|_: &NodePool| vec![itype("m6i.large", 2, 0, &[])].into(), now());
    assert_eq!(cands[0].drift.as_deref(), Some(INSTANCE_TYPE_NOT_FOUND));
    // No types at all: nothing is known to be gone, and the empty node is deleted all the same.
    let empty = Fleet { types: Vec::new(), ..Default::default() }
        .pool("default", json!({"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}}));
    let mut empty = empty;
    empty.nodes = fleet.nodes.clone();
    let state = empty.state();
    let types_for = |_: &NodePool| Vec::<InstanceType>::new().into();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &Settings::default(), now: now() });
    assert_eq!(pass.method, Some(Method::Emptiness), "{pass:?}");
    let (cands, _) = candidates(&state, &types_for, now());
    assert_eq!(cands[0].drift, None);
    assert_eq!(cands[0].consolidation_block.as_deref(), Some("its offering has no known price"));
}

/// With no pod event yet, `consolidateAfter` counts from when the claim became Initialized, as
/// Karpenter counts, not from its creation: a claim that booted slowly is not consolidated the moment it
/// is ready.
#[test]
fn consolidate_after_counts_from_initialization_without_a_pod_event() {
    use CapacityType::*;
    let fleet = Fleet { types: vec![itype("m5.large", 2, 0, &[("a", OnDemand, 0.096)])], ..Default::default() }
        .pool("default", json!({"spec": {"disruption": {"consolidateAfter": "30m", "budgets": [{"nodes": "100%"}]}}}))
        .node("slow", "default", "m5.large", "a", OnDemand);
    let mut state = fleet.state();
    let claim = std::sync::Arc::make_mut(state.nodes[0].claim.as_mut().unwrap());
    claim.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-03-04T10:00:00Z".parse().unwrap()));
    // Created two hours ago, Initialized ten minutes ago, no pod event since.
    let status = claim.status.get_or_insert_with(Default::default);
    status.last_pod_event_time = None;
    status.conditions.retain(|c| c.type_ != crate::api::condition_types::INITIALIZED);
    let initialized: Timestamp = "2026-03-04T11:50:00Z".parse().unwrap();
    claim.set_condition(
        crate::api::condition_types::INITIALIZED,
        crate::api::ConditionStatus::True,
        "Initialized",
        "",
        initialized,
    );
    let types = fleet.types.clone();
    let (cands, _) = candidates(&state, &move |_: &NodePool| types.clone().into(), now());
    assert!(!cands[0].consolidatable, "{:?}", cands[0].consolidation_block);
    assert!(
        cands[0].consolidation_block.as_deref().is_some_and(|b| b.contains("10m")),
        "{:?}",
        cands[0].consolidation_block
    );
}

/// Multi-node consolidation never replaces nodes with one of their own instance type unless it is cheaper
/// than the cheapest of them (Karpenter's `filterOutSameInstanceType`): keeping one of the nodes and
/// deleting the others moves fewer pods for the same saving.
#[test]
fn multi_node_consolidation_keeps_a_node_rather_than_buy_its_twin() {
    use CapacityType::*;
    let fleet = three_m8_nodes_with_a_pod_each(vec![itype("m.8", 8, 0, &[("a", OnDemand, 0.40)])]);
    let pass = fleet.pass();
    assert_eq!(pass.method, Some(Method::MultiNodeConsolidation), "{pass:?}");
    let c = &pass.commands[0];
    assert_eq!(c.decision, Decision::Delete, "{c:?}");
    assert_eq!(c.candidates.len(), 2);
    assert!(c.replacements.is_empty());
}

/// Drifted nodes go in the order they drifted, oldest first, as Karpenter orders them.
#[test]
fn drifted_nodes_are_replaced_in_the_order_they_drifted() {
    use CapacityType::*;
    let mut fleet = Fleet { types: vec![itype("m.8", 8, 0, &[("a", OnDemand, 0.40)])], ..Default::default() }
        .pool("default", json!({"spec": {"disruption": {"budgets": [{"nodes": "1"}]}}}));
    for n in ["late", "early", "middle"] {
        fleet = fleet.node(n, "default", "m.8", "a", OnDemand).pod(&format!("p-{n}"), n, "1", 0, json!({}));
    }
    let mut state = fleet.state();
    for (name, at) in
        [("late", "2026-03-04T11:00:00Z"), ("early", "2026-03-04T09:00:00Z"), ("middle", "2026-03-04T10:00:00Z")]
    {
        let n = state.nodes.iter().position(|x| x.name == name).unwrap();
        let claim = std::sync::Arc::make_mut(state.nodes[n].claim.as_mut().unwrap());
        claim.set_condition(
            crate::api::condition_types::DRIFTED,
            crate::api::ConditionStatus::True,
            "NodeClassDrifted",
            "",
            at.parse().unwrap(),
        );
    }
    let types = fleet.types.clone();
    let types_for = move |_: &NodePool| types.clone().into();
    let pass = compute(&Inputs { state: &state, types_for: &types_for, settings: &Settings::default(), now: now() });
    assert_eq!(pass.method, Some(Method::Drift), "{pass:?}");
    assert_eq!(pass.commands.len(), 1, "one command per candidate");
    assert_eq!(pass.commands[0].candidates[0].node, "early");
}

/// A consolidation replacement's options, cut to those cheaper than the node, must still meet the pool's
/// `minValues`, as Karpenter checks after its price filter.
#[test]
fn a_replacement_cut_below_min_values_by_price_is_not_made() {
    use CapacityType::*;
    let family = |mut it: InstanceType, f: &str| {
        it.labels.insert("example.com/family".into(), f.into());
        it
    };
    let types = vec![
        family(itype("a.4", 4, 0, &[("a", OnDemand, 0.20)]), "a"),
        family(itype("a.8", 8, 0, &[("a", OnDemand, 0.40)]), "a"),
        family(itype("b.8", 8, 0, &[("a", OnDemand, 0.50)]), "b"),
    ];
    let pool = |min: u32| {
        json!({"spec": {"template": {"spec": {"requirements": [
            {"key": "example.com/family", "operator": "In", "values": ["a", "b"], "minValues": min}]}},
            "disruption": {"budgets": [{"nodes": "100%"}]}}})
    };
    let fleet = |min: u32| {
        let mut f = Fleet { types: types.clone(), ..Default::default() }
            .pool("default", pool(min))
            .node("n", "default", "a.8", "a", OnDemand)
            .pod("p", "n", "1", 0, json!({}));
        f.nodes[0].metadata.labels.as_mut().unwrap().insert("example.com/family".into(), "a".into());
        f
    };
    let pass = fleet(1).pass();
    assert_eq!(pass.commands.len(), 1, "with minValues 1 the cheaper a.4 replaces it: {pass:?}");
    let pass = fleet(2).pass();
    assert!(pass.commands.is_empty(), "{pass:?}");
    let note = pass.unconsolidatable.iter().find(|b| b.node == "n").unwrap();
    assert!(note.reason.contains("minValues 2"), "{}", note.reason);
}

/// A node rebooting for repair is no candidate of any other method and counts against its pool's budget,
/// as a node being disrupted.
#[test]
fn a_node_rebooting_for_repair_is_left_alone_and_uses_up_the_budget() {
    use CapacityType::*;
    let mut fleet = m5_fleet("1")
        .node("rebooting", "default", "m5.large", "a", OnDemand)
        .node("empty", "default", "m5.large", "a", OnDemand);
    fleet.nodes[0].spec.as_mut().unwrap().taints =
        Some(vec![crate::scheduling::taints::taint(labels::REBOOTING_TAINT, None, "NoSchedule")]);
    let pass = fleet.pass();
    assert!(pass.commands.is_empty(), "the reboot holds the pool's one disruption: {pass:?}");
    let note = pass.unconsolidatable.iter().find(|b| b.node == "rebooting").unwrap();
    assert_eq!(note.reason, "node is rebooting for repair");
}

/// Multi-node consolidation skips the prefixes whose pods could not fit the rest of the fleet and one new
/// node, and still simulates the one that fits exactly: a2 and a3's pods need 8 CPU, which a1 (full) and one
/// new m.8 hold to the last millicore; all three nodes' pods need 16.
#[test]
fn multi_node_consolidation_still_tries_pods_that_fit_exactly() {
    use CapacityType::*;
    let types = vec![
        itype("m.4", 4, 0, &[("a", OnDemand, 0.20)]),
        itype("m.8", 8, 0, &[("a", OnDemand, 0.40)]),
        itype("c.8", 8, 0, &[("a", OnDemand, 0.38)]),
    ];
    let mut fleet = Fleet { types, ..Default::default() }
        .pool("default", json!({"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}}));
    for i in 1..=3 {
        fleet = fleet.node(&format!("a{i}"), "default", "m.8", "a", OnDemand);
    }
    let fleet = fleet
        .pod("p1", "a1", "4", 0, json!({}))
        .pod("q1", "a1", "4", 0, json!({}))
        .pod("p2", "a2", "4", 0, json!({}))
        .pod("p3", "a3", "4", 0, json!({}));
    let pass = fleet.pass();
    assert_eq!(pass.method, Some(Method::MultiNodeConsolidation), "{:#?}", pass.blocked);
    let c = &pass.commands[0];
    let nodes: Vec<&str> = c.candidates.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(nodes, ["a2", "a3"]);
    assert_eq!(c.decision, Decision::Replace);
    assert_eq!(c.replacements[0].instance_types, ["c.8"]);
}
