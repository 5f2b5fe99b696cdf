//! Scheduler behaviour, one constraint kind at a time, and the worked examples of the specification.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;
use crate::api::{NodePool, NodePoolSpec, labels};
use crate::cloud::fake::instance_type;
use crate::cloud::{CapacityType, InstanceType, Offering};
use crate::resources::{ResourceName, Resources};
use crate::testing::merge;

fn pod_with(name: &str, cpu: &str, spec_extra: Value, labels_: Value) -> PodInfo {
    let mut spec = json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels_},
        "spec": spec
    }))
    .unwrap();
    PodInfo::from_pod(&p).unwrap()
}

fn pod(name: &str, cpu: &str) -> PodInfo {
    pod_with(name, cpu, json!({}), json!({}))
}

fn pool_from(yaml: Value) -> NodePool {
    let mut v =
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {}});
    merge(&mut v, yaml);
    serde_json::from_value(v).unwrap()
}

fn input(pool: NodePool, types: Vec<InstanceType>) -> PoolInput {
    PoolInput { pool, instance_types: types.into(), in_use: Resources::ZERO, nodes_in_use: 0 }
}

fn zones3() -> [&'static str; 3] {
    ["zone-a", "zone-b", "zone-c"]
}

/// Sizes 1..=n CPU, 4 GiB per CPU, priced by size.
fn sized_catalog(n: i64) -> Vec<InstanceType> {
    (1..=n)
        .map(|i| instance_type(&format!("c.{i}"), i, 4 * i, 0, &zones3(), 0.05 * i as f64, 0.02 * i as f64))
        .collect()
}

fn solve(pools: Vec<PoolInput>, nodes: Vec<ExistingNode>, pods: Vec<PodInfo>) -> Results {
    Scheduler::new(pools, nodes, Vec::new(), &[], SchedulerOptions::default()).solve(pods)
}

#[test]
fn pending_pods_pack_into_the_cheapest_claim_that_fits() {
    let r = solve(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))],
        vec![],
        vec![pod("a", "1500m"), pod("b", "1"), pod("c", "500m")],
    );
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
    assert_eq!(r.claims.len(), 1);
    let c = &r.claims[0];
    assert_eq!(c.pods.len(), 3);
    assert_eq!(&*c.instance_types[0], "c.3", "3 CPU of pods on the smallest type with room");
    let launch = c.launch.as_ref().unwrap();
    assert_eq!((launch.instance_type.as_str(), launch.capacity_type), ("c.3", CapacityType::Spot));
    assert!((launch.price - 0.06).abs() < 1e-9);
    assert!(c.node_claim_requirements().get(labels::INSTANCE_TYPE).unwrap().values().contains(&"c.8".to_owned()));
    assert!(c.requirements.get(labels::NODE_POOL).unwrap().has("default"));
}

#[test]
fn existing_nodes_are_filled_before_anything_is_bought() {
    let node = ExistingNode {
        name: "n1".into(),
        labels: Arc::new([(labels::ZONE.to_owned(), "zone-a".to_owned())].into()),
        requirements: None,
        taints: vec![],
        available: Resources::cpu_memory(2000, 8 << 30).with(ResourceName::PODS, 10),
        host_ports: vec![],
        accepts_pods: true,
        volume_room: Vec::new(),
    };
    let r = solve(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))],
        vec![node],
        vec![pod("a", "1"), pod("b", "1"), pod("c", "1")],
    );
    assert_eq!(r.existing.len(), 1);
    assert_eq!(r.existing[0].pods.len(), 2);
    assert_eq!(r.claims.len(), 1);
    assert_eq!(r.claims[0].pods, vec!["default/c".to_owned()]);
}

#[test]
fn taints_need_tolerations_and_the_reason_names_the_taint() {
    let gpu = pool_from(
        json!({"metadata": {"name": "gpu"}, "spec": {"weight": 50, "template": {"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}}}),
    );
    let r = solve(vec![input(gpu.clone(), sized_catalog(4))], vec![], vec![pod("plain", "1")]);
    assert_eq!(r.unschedulable.len(), 1);
    assert!(r.unschedulable[0].reason.contains("nvidia.com/gpu"), "{}", r.unschedulable[0].reason);
    let tolerant =
        pod_with("tolerant", "1", json!({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}), json!({}));
    let pools = || {
        vec![
            input(gpu.clone(), sized_catalog(4)),
            input(NodePool::new("cpu", NodePoolSpec::default()), sized_catalog(4)),
        ]
    };
    let r = solve(pools(), vec![], vec![pod("plain", "1")]);
    assert_eq!(r.claims[0].pool, "cpu");
    let r = solve(pools(), vec![], vec![tolerant]);
    assert_eq!(r.claims[0].pool, "gpu", "the heavier pool is tried first");
}

#[test]
fn zonal_spread_puts_one_pod_per_zone() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let pods: Vec<PodInfo> =
        (0..6).map(|i| pod_with(&format!("web-{i}"), "1", spread.clone(), json!({"app": "web"}))).collect();
    let r = solve(vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))], vec![], pods);
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
    let mut per_zone = std::collections::BTreeMap::new();
    for c in &r.claims {
        let zone = c.requirements.get(labels::ZONE).unwrap().single().unwrap().to_owned();
        *per_zone.entry(zone).or_insert(0) += c.pods.len();
    }
    assert_eq!(per_zone.values().copied().collect::<Vec<_>>(), vec![2, 2, 2], "{per_zone:?}");
}

#[test]
fn hostname_anti_affinity_gives_each_pod_its_own_node() {
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}}]}}});
    let pods: Vec<PodInfo> =
        (0..4).map(|i| pod_with(&format!("db-{i}"), "1", anti.clone(), json!({"app": "db"}))).collect();
    let r = solve(vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))], vec![], pods);
    assert_eq!(r.claims.len(), 4);
    assert!(r.claims.iter().all(|c| c.pods.len() == 1));
}

#[test]
fn zonal_self_affinity_keeps_pods_together() {
    let aff = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "cache"}}}]}}});
    let pods: Vec<PodInfo> =
        (0..5).map(|i| pod_with(&format!("cache-{i}"), "3", aff.clone(), json!({"app": "cache"}))).collect();
    let r = solve(vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(4))], vec![], pods);
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
    let zones: std::collections::BTreeSet<String> =
        r.claims.iter().map(|c| c.requirements.get(labels::ZONE).unwrap().single().unwrap().to_owned()).collect();
    assert_eq!(zones.len(), 1, "{zones:?}");
}

#[test]
fn anti_affinity_of_running_pods_keeps_matching_pods_away() {
    let bound = pod_with(
        "guard",
        "1",
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"team": "noisy"}}}]}}}),
        json!({}),
    );
    let node = ExistingNode {
        name: "n1".into(),
        labels: Arc::new([(labels::ZONE.to_owned(), "zone-a".to_owned())].into()),
        requirements: None,
        taints: vec![],
        available: Resources::cpu_memory(8000, 32 << 30).with(ResourceName::PODS, 10),
        host_ports: vec![],
        accepts_pods: true,
        volume_room: Vec::new(),
    };
    let noisy = pod_with("noisy", "1", json!({}), json!({"team": "noisy"}));
    let r = Scheduler::new(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(4))],
        vec![node],
        vec![(bound.into(), "n1")],
        &[],
        SchedulerOptions::default(),
    )
    .solve(vec![noisy]);
    assert!(r.existing.is_empty(), "the node in zone-a is off limits");
    assert_eq!(r.claims.len(), 1);
    assert!(!r.claims[0].requirements.get(labels::ZONE).unwrap().has("zone-a"));
}

/// A running pod that its own anti-affinity selects counts for that term: another pod carrying the same
/// term stays out of its domain, whether the scheduler reads the node's pods one by one or by class.
#[test]
fn a_running_pod_counts_for_its_own_anti_affinity_term() {
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}]}}});
    let guard: Arc<PodInfo> = Arc::new(pod_with("guard", "1", anti.clone(), json!({"app": "x"})));
    // Another app that must not share a host with app x either.
    let other = pod_with("other", "1", anti, json!({"app": "z"}));
    let mut on_node = BoundOnNode::default();
    on_node.add(&guard);
    let each = Scheduler::new(
        vec![],
        vec![zone_node("n-a", "zone-a")],
        vec![(guard, "n-a")],
        &[],
        SchedulerOptions::default(),
    )
    .solve(vec![other.clone()]);
    let by_node = Scheduler::with_bound_on_nodes(
        vec![],
        vec![zone_node("n-a", "zone-a")],
        &[("n-a", &on_node)],
        &[],
        SchedulerOptions::default(),
    )
    .solve(vec![other]);
    for r in [each, by_node] {
        assert!(r.existing.is_empty(), "n-a runs an app x pod: {:?}", r.existing);
        assert_eq!(r.unschedulable.len(), 1);
    }
}

#[test]
fn node_pool_limits_are_enforced() {
    let limited = pool_from(json!({"spec": {"limits": {"cpu": "4"}}}));
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}]}}});
    let pods: Vec<PodInfo> =
        (0..3).map(|i| pod_with(&format!("x-{i}"), "1500m", anti.clone(), json!({"app": "x"}))).collect();
    let r = solve(vec![input(limited, sized_catalog(2))], vec![], pods);
    assert_eq!(r.claims.len(), 2, "two 2-CPU nodes use up the 4-CPU limit");
    assert_eq!(r.unschedulable.len(), 1);
    assert!(r.unschedulable[0].reason.contains("limits"), "{}", r.unschedulable[0].reason);
    let nodes_limited = pool_from(json!({"spec": {"limits": {"nodes": "1"}}}));
    let pods: Vec<PodInfo> =
        (0..2).map(|i| pod_with(&format!("x-{i}"), "1", anti.clone(), json!({"app": "x"}))).collect();
    let r = solve(vec![input(nodes_limited, sized_catalog(2))], vec![], pods);
    assert_eq!((r.claims.len(), r.unschedulable.len()), (1, 1));
}

#[test]
fn reserved_capacity_is_never_over_committed_in_one_pass() {
    let mut gpu = instance_type("gpu.8x", 8, 64, 1, &["zone-a"], 4.0, 1.5);
    gpu.offerings.push(Offering {
        zone: "zone-a".into(),
        capacity_type: CapacityType::Reserved,
        price: 0.0,
        available: true,
        reservation_id: Some("cr-1".into()),
        reservation_capacity: Some(2),
        labels: Default::default(),
    });
    let gpu_pod = |i: usize| {
        pod_with(
            &format!("train-{i}"),
            "4",
            json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}]}),
            json!({}),
        )
    };
    let r = solve(
        vec![input(NodePool::new("default", NodePoolSpec::default()), vec![gpu])],
        vec![],
        (0..3).map(gpu_pod).collect(),
    );
    assert_eq!(r.claims.len(), 3);
    let reserved =
        r.claims.iter().filter(|c| c.launch.as_ref().unwrap().capacity_type == CapacityType::Reserved).count();
    assert_eq!(reserved, 2);
    let pinned = r.claims.iter().filter(|c| c.requirements.get(labels::RESERVATION_ID).is_some()).count();
    assert_eq!(pinned, 2, "reserved launches are pinned to their reservation");
}

/// A label that differs by offering (a zone's id) is met per offering: a pod asking for one zone id gets
/// the zone that has it, a zone id no offering has leaves the pod unschedulable, and a pool's types
/// without the label are not taken to have it.
#[test]
fn a_label_of_the_offerings_is_met_per_offering() {
    let mut it = instance_type("m.large", 4, 16, 0, &["zone-a", "zone-b"], 1.0, 0.5);
    for o in &mut it.offerings {
        let id = if o.zone == "zone-a" { "az1" } else { "az2" };
        o.labels.insert("topology.example.com/zone-id".into(), id.into());
    }
    let plain = instance_type("p.large", 4, 16, 0, &["zone-a", "zone-b"], 0.1, 0.05);
    let wants = |name: &str, id: &str| {
        pod_with(
            name,
            "1",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.example.com/zone-id", "operator": "In", "values": [id]}]}]}}}}),
            json!({}),
        )
    };
    let r = solve(
        vec![input(NodePool::new("default", NodePoolSpec::default()), vec![it, plain])],
        vec![],
        vec![wants("in-az2", "az2"), wants("in-az9", "az9")],
    );
    assert_eq!(r.claims.len(), 1, "{:?}", r.unschedulable);
    let launch = r.claims[0].launch.as_ref().unwrap();
    assert_eq!(
        (launch.instance_type.as_str(), launch.zone.as_str()),
        ("m.large", "zone-b"),
        "not the cheaper type without the label"
    );
    assert_eq!(r.unschedulable.len(), 1);
    assert!(r.unschedulable[0].pod.ends_with("in-az9"), "{:?}", r.unschedulable);
}

#[test]
fn a_pod_too_big_for_any_type_says_which_resource() {
    let r = solve(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(4))],
        vec![],
        vec![pod("huge", "16")],
    );
    assert_eq!(r.unschedulable.len(), 1);
    let reason = &r.unschedulable[0].reason;
    assert!(
        reason.contains("NodePool default") && reason.contains("cpu 16") && reason.contains("offers 4"),
        "{reason}"
    );
}

#[test]
fn preferences_are_relaxed_when_they_cannot_be_met() {
    let p = pod_with(
        "p",
        "1",
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-z"]}]}}]}}}),
        json!({}),
    );
    let r = solve(vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(2))], vec![], vec![p]);
    assert!(r.unschedulable.is_empty());
    let q = pod_with(
        "q",
        "1",
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]}]}}]}}}),
        json!({}),
    );
    let r = solve(vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(2))], vec![], vec![q]);
    assert_eq!(
        r.claims[0].requirements.get(labels::ZONE).unwrap().values(),
        ["zone-b"],
        "a preference that can be met is kept"
    );
}

#[test]
fn required_node_affinity_or_terms_are_tried_in_turn() {
    let p = pod_with(
        "p",
        "1",
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-z"]}]},
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-c"]}]}]}}}}),
        json!({}),
    );
    let r = solve(vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(2))], vec![], vec![p]);
    assert_eq!(r.claims[0].requirements.get(labels::ZONE).unwrap().values(), ["zone-c"]);
}

#[test]
fn host_ports_never_collide_on_one_claim() {
    let ported = json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}], "resources": {"requests": {"cpu": "100m"}}}]});
    let r = solve(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(2))],
        vec![],
        vec![pod_with("a", "1", ported.clone(), json!({})), pod_with("b", "1", ported, json!({}))],
    );
    assert_eq!(r.claims.len(), 2);
}

#[test]
fn min_values_keep_enough_instance_types_open() {
    let p = pool_from(json!({"spec": {"template": {"spec": {"requirements": [
        {"key": "node.kubernetes.io/instance-type", "operator": "Exists", "minValues": 3}]}}}}));
    let r = solve(vec![input(p.clone(), sized_catalog(8))], vec![], vec![pod("a", "5")]);
    assert!(r.unschedulable.is_empty(), "c.6, c.7, c.8 keep three types open");
    let r = solve(vec![input(p, sized_catalog(8))], vec![], vec![pod("a", "7")]);
    assert_eq!(r.unschedulable.len(), 1);
    assert!(r.unschedulable[0].reason.contains("minValues"), "{}", r.unschedulable[0].reason);
}

#[test]
fn claims_carry_at_most_the_configured_number_of_types_cheapest_first() {
    let opts = SchedulerOptions { max_instance_types: 5, ..SchedulerOptions::default() };
    let r = Scheduler::new(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(40))],
        vec![],
        vec![],
        &[],
        opts,
    )
    .solve(vec![pod("a", "1")]);
    let names: Vec<&str> = r.claims[0].instance_types.iter().map(|n| &**n).collect();
    assert_eq!(names, ["c.1", "c.2", "c.3", "c.4", "c.5"]);
}

/// Cutting a claim's options to the most it carries keeps its `minValues` satisfiable: the cheapest
/// options of the families the cut would lose stay too.
#[test]
fn truncation_keeps_min_values_satisfiable() {
    let mut types = Vec::new();
    for (family, base) in [("a", 0.01), ("b", 0.10), ("c", 0.20)] {
        for size in 1..=4 {
            let mut it = instance_type(
                &format!("{family}.{size}"),
                size,
                4 * size,
                0,
                &zones3(),
                base * size as f64,
                base * size as f64 / 2.0,
            );
            it.labels.insert("example.com/family".into(), family.into());
            types.push(it);
        }
    }
    let pool = pool_from(json!({"spec": {"template": {"spec": {"requirements": [
        {"key": "example.com/family", "operator": "In", "values": ["a", "b", "c"], "minValues": 3}]}}}}));
    let opts = SchedulerOptions { max_instance_types: 4, ..SchedulerOptions::default() };
    let r = Scheduler::new(vec![input(pool, types)], vec![], vec![], &[], opts).solve(vec![pod("p", "1")]);
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
    let names: Vec<&str> = r.claims[0].instance_types.iter().map(|n| &**n).collect();
    assert_eq!(names, ["a.1", "a.2", "a.3", "a.4", "b.1", "c.1"], "the four cheapest, and the cheapest of b and c");
}

/// `min-values-policy`: Strict makes no claim whose `minValues` its options cannot meet; BestEffort makes
/// it with the floor lowered to what they meet, and the NodeClaim says so in an annotation.
#[test]
fn best_effort_lowers_min_values_that_cannot_be_met() {
    let types: Vec<InstanceType> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, family)| {
            let mut it = instance_type(&format!("{family}.2"), 2, 8, 0, &zones3(), 0.1 * (i + 1) as f64, 0.05);
            it.labels.insert("example.com/family".into(), (*family).into());
            it
        })
        .collect();
    let pool = pool_from(json!({"spec": {"template": {"spec": {"requirements": [
        {"key": "example.com/family", "operator": "Exists", "minValues": 4}]}}}}));
    let run = |best_effort: bool| {
        let opts = SchedulerOptions { min_values_best_effort: best_effort, ..SchedulerOptions::default() };
        Scheduler::new(vec![input(pool.clone(), types.clone())], vec![], vec![], &[], opts).solve(vec![pod("p", "1")])
    };
    let strict = run(false);
    assert!(strict.claims.is_empty());
    assert!(strict.unschedulable[0].reason.contains("minValues 4"), "{}", strict.unschedulable[0].reason);
    let relaxed = run(true);
    let plan = &relaxed.claims[0];
    assert!(plan.min_values_relaxed);
    assert_eq!(plan.requirements.get("example.com/family").and_then(|r| r.min_values()), Some(3));
    let claim = crate::provisioning::node_claim(plan, &pool, "default-x");
    assert_eq!(claim.annotation(labels::NODECLAIM_MIN_VALUES_RELAXED), Some("true"));
    let min = claim.spec.requirements.iter().find(|r| r.key == "example.com/family").and_then(|r| r.min_values);
    assert_eq!(min, Some(3));
}

/// The cilium / gpu-plugin / tpu-plugin example, through the scheduler: the claim reserves 700m.
#[test]
fn claims_reserve_realization_aware_daemon_overhead() {
    let pool = pool_from(json!({"spec": {"template": {"spec": {"requirements": [
        {"key": "example.com/accelerator", "operator": "In", "values": ["gpu", "tpu"]}]}}}}));
    let daemon = |name: &str, cpu: i64, sel: Option<&str>| DaemonPod {
        name: name.into(),
        requests: Resources::cpu_memory(cpu, 0),
        alternatives: vec![
            sel.map(|v| [Requirement::is_in("example.com/accelerator", [v])].into_iter().collect()).unwrap_or_default(),
        ],
        tolerations: vec![],
    };
    let daemons =
        [daemon("cilium", 200, None), daemon("gpu-plugin", 500, Some("gpu")), daemon("tpu-plugin", 300, Some("tpu"))];
    // 3.3 CPU of pods on 4-CPU types: only fits if the overhead is 700m, not 1000m.
    let r = Scheduler::new(vec![input(pool, sized_catalog(4))], vec![], vec![], &daemons, SchedulerOptions::default())
        .solve(vec![pod("a", "3300m")]);
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
    assert_eq!(r.claims[0].daemon_overhead.get(ResourceName::CPU), 700);
    assert_eq!(&*r.claims[0].instance_types[0], "c.4");
}

/// The marginal-cost example: an 8-CPU pod opens an m5.2xlarge-like spot claim (+$0.17) instead of growing
/// the g5 claim to the next size up (+$1.21).
#[test]
fn marginal_cost_packing_opens_a_cheaper_claim() {
    let g5 = |name: &str, cpu: i64, price: f64| InstanceType {
        name: name.into(),
        labels: [("example.com/family".to_owned(), "g5".to_owned())].into(),
        capacity: Resources::cpu_memory(cpu * 1000, 64 << 30)
            .with(ResourceName::PODS, 50)
            .with(ResourceName::NVIDIA_GPU, 1),
        overhead: Default::default(),
        offerings: vec![Offering::new("zone-a", CapacityType::OnDemand, price)],
    };
    let m5 = InstanceType {
        name: "m5.2xlarge".into(),
        labels: [("example.com/family".to_owned(), "m5".to_owned())].into(),
        capacity: Resources::cpu_memory(8000, 32 << 30).with(ResourceName::PODS, 50),
        overhead: Default::default(),
        offerings: vec![
            Offering::new("zone-a", CapacityType::OnDemand, 0.384),
            Offering::new("zone-a", CapacityType::Spot, 0.17),
        ],
    };
    let catalog = vec![g5("g5.2xlarge", 8, 1.21), g5("g5.4xlarge", 16, 2.42), m5];
    let gpu_pod = pod_with(
        "trainer",
        "4",
        json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}]}),
        json!({}),
    );
    let cpu_pod = pod("batch", "8");
    let run_with = |policy: &str, options: SchedulerOptions| {
        let pool = pool_from(json!({"metadata": {"annotations": {"karpenter.sh/nodeclaim-packing-policy": policy}}}));
        // The GPU pod is placed first (it is a pass of its own), then the 8-CPU pod arrives.
        let mut s = Scheduler::new(vec![input(pool, catalog.clone())], vec![], vec![], &[], options);
        s.place_in_order(vec![gpu_pod.clone(), cpu_pod.clone()])
    };
    let run = |policy: &str| run_with(policy, SchedulerOptions::default());
    let binpack = run("binpack");
    assert_eq!(binpack.claims.len(), 1, "binpack grows the g5 claim");
    assert_eq!(binpack.claims[0].launch.as_ref().unwrap().instance_type, "g5.4xlarge");
    let marginal = run("marginal-cost");
    assert_eq!(marginal.claims.len(), 2, "{:?}", marginal.claims.iter().map(|c| &c.instance_types).collect::<Vec<_>>());
    let batch = marginal.claims.iter().find(|c| c.pods == ["default/batch"]).unwrap();
    let launch = batch.launch.as_ref().unwrap();
    assert_eq!(
        (launch.instance_type.as_str(), launch.capacity_type, launch.price),
        ("m5.2xlarge", CapacityType::Spot, 0.17)
    );
    assert!(marginal.launch_price() < binpack.launch_price());
    // With marginal-cost packing turned off (`marginal-cost-packing: false`), the annotation is ignored.
    let off =
        run_with("marginal-cost", SchedulerOptions { marginal_cost_packing: false, ..SchedulerOptions::default() });
    assert_eq!(off.claims.len(), 1);
    assert_eq!(off.claims[0].launch.as_ref().unwrap().instance_type, "g5.4xlarge");
}

#[test]
fn node_taints_policy_honor_ignores_pods_on_untolerated_nodes() {
    let tainted = ExistingNode {
        name: "tainted".into(),
        labels: Arc::new([(labels::ZONE.to_owned(), "zone-a".to_owned())].into()),
        requirements: None,
        taints: vec![taints::taint("dedicated", Some("infra"), "NoSchedule")],
        available: Resources::ZERO,
        host_ports: vec![],
        accepts_pods: true,
        volume_room: Vec::new(),
    };
    let spread = |policy: &str| {
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
            "nodeTaintsPolicy": policy, "labelSelector": {"matchLabels": {"app": "web"}}}]})
    };
    let bound = |i: usize| (pod_with(&format!("old-{i}"), "1", json!({}), json!({"app": "web"})).into(), "tainted");
    let zone_for = |policy: &str| {
        let p = pod_with("new", "1", spread(policy), json!({"app": "web"}));
        let r = Scheduler::new(
            vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(2))],
            vec![tainted.clone()],
            vec![bound(0), bound(1)],
            &[],
            SchedulerOptions::default(),
        )
        .solve(vec![p]);
        r.claims[0].requirements.get(labels::ZONE).unwrap().single().unwrap().to_owned()
    };
    assert_eq!(zone_for("Ignore"), "zone-b", "the two pods in zone-a count");
    assert_eq!(zone_for("Honor"), "zone-a", "pods on a node the new pod cannot tolerate do not count");
}

/// CPU sizes without the GPU label, and one GPU type carrying `example.com/gpu-name`.
fn cpu_and_gpu_catalog() -> Vec<InstanceType> {
    let mut types = sized_catalog(4);
    let mut gpu = instance_type("g.4", 4, 16, 1, &zones3(), 1.0, 0.5);
    gpu.labels.insert("example.com/gpu-name".into(), "t4".into());
    types.push(gpu);
    types
}

#[test]
fn a_pool_requiring_a_label_to_exist_admits_only_the_types_that_have_it() {
    let pool = pool_from(json!({"spec": {"template": {"spec": {"requirements": [
        {"key": "example.com/gpu-name", "operator": "Exists"}
    ]}}}}));
    let r = solve(vec![input(pool, cpu_and_gpu_catalog())], vec![], vec![pod("a", "1")]);
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
    let types: Vec<&str> = r.claims[0].instance_types.iter().map(|t| &**t).collect();
    assert_eq!(types, ["g.4"], "a CPU type lacks the label: its DoesNotExist does not meet Exists");
}

#[test]
fn a_pod_requiring_a_label_to_exist_gets_only_the_types_that_have_it() {
    let affinity = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "example.com/gpu-name", "operator": "Exists"}]}]}}}});
    let gpu_pod = pod_with("a", "1", affinity, json!({}));
    let pool = NodePool::new("default", NodePoolSpec::default());
    let r = solve(vec![input(pool, cpu_and_gpu_catalog())], vec![], vec![gpu_pod, pod("b", "1")]);
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
    for claim in &r.claims {
        let types: Vec<&str> = claim.instance_types.iter().map(|t| &**t).collect();
        if claim.pods.contains(&"default/a".to_owned()) {
            assert_eq!(types, ["g.4"], "{claim:?}");
        }
    }
}

#[test]
fn a_label_that_must_exist_does_not_meet_one_that_must_not() {
    let exists = Requirement::exists("k");
    let absent = Requirement::does_not_exist("k");
    let not_in = Requirement::not_in("k", ["a"]);
    let mut node = Requirements::new();
    node.add(absent.clone());
    let mut pod = Requirements::new();
    pod.add(exists.clone());
    assert!(node.intersects(&pod).is_err(), "Exists against DoesNotExist");
    assert!(node.compatible(&pod, false).is_err());
    // Both sides allowing the label's absence still agree, as Karpenter's Intersects excuses.
    let mut other = Requirements::new();
    other.add(not_in);
    assert!(node.intersects(&other).is_ok(), "NotIn against DoesNotExist");
    let mut both = Requirements::new();
    both.add(exists);
    assert!(both.intersects(&pod).is_ok());
}

fn zone_node(name: &str, zone: &str) -> ExistingNode {
    ExistingNode {
        name: name.into(),
        labels: Arc::new(
            [(labels::ZONE.to_owned(), zone.to_owned()), (labels::HOSTNAME.to_owned(), name.to_owned())].into(),
        ),
        requirements: None,
        taints: vec![],
        available: Resources::cpu_memory(8000, 32 << 30).with(ResourceName::PODS, 10),
        host_ports: vec![],
        accepts_pods: true,
        volume_room: Vec::new(),
    }
}

/// `matchLabelKeys` narrows a spread to the pods sharing the pod's own values of those keys: a new
/// revision spreads on its own, whatever the old one's pods do.
#[test]
fn topology_spread_honours_match_label_keys() {
    let spread = |keys: serde_json::Value| {
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": keys}]})
    };
    let run = |keys: serde_json::Value| {
        let old: Vec<(Arc<PodInfo>, &str)> = (0..2)
            .map(|i| {
                let p = pod_with(&format!("old-{i}"), "500m", spread(keys.clone()), json!({"app": "web", "rev": "1"}));
                (Arc::new(p), "n-a")
            })
            .collect();
        let new = pod_with("new-0", "500m", spread(keys), json!({"app": "web", "rev": "2"}));
        Scheduler::new(
            vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(4))],
            vec![zone_node("n-a", "zone-a")],
            old,
            &[],
            SchedulerOptions::default(),
        )
        .solve(vec![new])
    };
    let r = run(json!(["rev"]));
    assert_eq!(r.existing.len(), 1, "revision 2 has no pod anywhere yet: zone-a is as good as any");
    let r = run(json!([]));
    assert!(r.existing.is_empty(), "counting revision 1, zone-a is two ahead");
}

/// Pod anti-affinity with `namespaceSelector: {}` counts the pods of every namespace; without it, only
/// the pod's own.
#[test]
fn pod_anti_affinity_honours_an_empty_namespace_selector() {
    let run = |namespace_selector: Option<serde_json::Value>| {
        let mut term =
            json!({"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}});
        if let Some(s) = namespace_selector {
            term["namespaceSelector"] = s;
        }
        let mut other: Pod = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "other", "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}
        }))
        .unwrap();
        other.spec.as_mut().unwrap().node_name = Some("n-a".into());
        let bound = vec![(Arc::new(PodInfo::from_pod(&other).unwrap()), "n-a")];
        let pod = pod_with(
            "app",
            "500m",
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}),
            json!({}),
        );
        Scheduler::new(
            vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(4))],
            vec![zone_node("n-a", "zone-a")],
            bound,
            &[],
            SchedulerOptions::default(),
        )
        .solve(vec![pod])
    };
    assert!(run(Some(json!({}))).existing.is_empty(), "the db pod of namespace other counts");
    assert_eq!(run(None).existing.len(), 1, "only namespace default counts");
}

/// Existing nodes are weighed against a pod's topology by their own domains: a node without the key is
/// in none, required affinity goes where its pods run, and a spread counts what each zone already holds.
#[test]
fn existing_nodes_are_judged_by_their_domains() {
    let mut unlabelled = zone_node("n-none", "zone-a");
    unlabelled.labels = Arc::new([(labels::HOSTNAME.to_owned(), "n-none".to_owned())].into());
    let nodes = || vec![unlabelled.clone(), zone_node("n-a", "zone-a"), zone_node("n-b", "zone-b")];
    let solve_on = |bound: Vec<(Arc<PodInfo>, &str)>, pod: PodInfo| {
        Scheduler::new(
            vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(4))],
            nodes(),
            bound,
            &[],
            SchedulerOptions::default(),
        )
        .solve(vec![pod])
    };
    let landed = |r: &Results| r.existing.iter().map(|p| p.node.clone()).collect::<Vec<_>>();
    let db = || Arc::new(pod_with("db", "1", json!({}), json!({"app": "db"})));
    let affine = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "db"}}}]}}});
    let r = solve_on(vec![(db(), "n-b")], pod_with("api", "1", affine, json!({"app": "api"})));
    assert_eq!(landed(&r), ["n-b"], "the first nodes hold no db pod in their zone, or have no zone");
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let web = |name: &str| Arc::new(pod_with(name, "1", spread.clone(), json!({"app": "web"})));
    let r = solve_on(vec![(web("web-0"), "n-a")], pod_with("web-1", "1", spread.clone(), json!({"app": "web"})));
    assert_eq!(landed(&r), ["n-b"], "zone-a is one ahead of zone-b");
    let bound = vec![(web("web-0"), "n-a"), (web("web-1"), "n-b")];
    let r = solve_on(bound, pod_with("web-2", "1", spread.clone(), json!({"app": "web"})));
    assert!(landed(&r).is_empty(), "the pool's zones with no web pod yet set the minimum at zero");
    let zone = r.claims[0].requirements.get(labels::ZONE).unwrap();
    assert!(!zone.has("zone-a") && !zone.has("zone-b"), "{zone:?}");
}

/// A scheduler copied after registering pods places them with the groups registration returned exactly as
/// it places them by looking their terms up, and a group registered since makes it look them up again.
#[test]
fn registered_pods_solve_as_looked_up_pods_do() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let bound: Vec<(Arc<PodInfo>, &str)> = (0..3)
        .map(|i| (Arc::new(pod_with(&format!("old-{i}"), "1", spread.clone(), json!({"app": "web"}))), "n-a"))
        .collect();
    let pods: Vec<Arc<PodInfo>> =
        (0..4).map(|i| Arc::new(pod_with(&format!("web-{i}"), "1", spread.clone(), json!({"app": "web"})))).collect();
    let mut base = Scheduler::new(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))],
        vec![zone_node("n-a", "zone-a"), zone_node("n-b", "zone-b")],
        bound,
        &[],
        SchedulerOptions::default(),
    );
    let groups = base.register(pods.iter().map(|p| &**p));
    assert_eq!(groups.len(), 4);
    assert!(groups.iter().all(|g| *g == groups[0]), "equal terms share one group: {groups:?}");
    let shape = |r: &Results| {
        let mut existing: Vec<(String, Vec<String>)> =
            r.existing.iter().map(|p| (p.node.clone(), p.pods.clone())).collect();
        existing.sort();
        let mut claims: Vec<(Option<String>, Vec<String>)> = r
            .claims
            .iter()
            .map(|c| (c.requirements.get(labels::ZONE).and_then(|z| z.single()).map(str::to_owned), c.pods.clone()))
            .collect();
        claims.sort();
        (existing, claims, r.unschedulable.len())
    };
    let looked_up = shape(&base.clone().solve_shared(pods.clone()));
    let registered = shape(&base.clone().solve_registered(pods.clone(), groups.iter().collect()));
    assert_eq!(looked_up, registered);
    assert!(looked_up.1.iter().all(|(zone, _)| zone.as_deref() == Some("zone-c")), "{looked_up:?}");
    // A pod whose selector picks the web pods registers a group the handed-in groups do not know.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "web"}}}]}}});
    let mut later = base.clone();
    later.register([&pod_with("guard", "1", anti, json!({}))]);
    let stale = shape(&later.clone().solve_registered(pods.clone(), groups.iter().collect()));
    assert_eq!(stale, shape(&later.solve_shared(pods)), "stale groups are looked up again");
}

/// A solve told to stop at the first claim answers exactly what the full solve does while no pod needs a
/// claim, and stops once one does (the full solve then buys at least one); told to stop on a marked node,
/// it stops exactly when the full solve places a pod there.
#[test]
fn a_solve_stopped_at_a_claim_is_the_full_solve_until_then() {
    let pods = |n: usize| -> Vec<Arc<PodInfo>> {
        (0..n).map(|i| Arc::new(pod_with(&format!("p-{i}"), "1", json!({}), json!({"app": "web"})))).collect()
    };
    let mut base = Scheduler::new(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))],
        vec![zone_node("n-a", "zone-a"), zone_node("n-b", "zone-b")],
        Vec::<(Arc<PodInfo>, &str)>::new(),
        &[],
        SchedulerOptions::default(),
    );
    assert!(base.claims_stay_spot_capable());
    let existing = |r: &Results| -> Vec<(String, Vec<String>)> {
        r.existing.iter().map(|p| (p.node.clone(), p.pods.clone())).collect()
    };
    // Room on the nodes for 16 one-CPU pods (ten pods a node at most).
    for (n, fits) in [(12, true), (21, false)] {
        let pods = pods(n);
        let groups = base.register(pods.iter().map(|p| &**p));
        let full = base.clone().solve_registered(pods.clone(), groups.iter().collect());
        let stopped = base.clone().solve_registered_unless(
            pods,
            groups.iter().collect(),
            StopAt { first_claim_below: Some(f64::NEG_INFINITY), second_claim: false, marked_node: false },
        );
        assert_eq!(full.claims.is_empty(), fits);
        match stopped {
            Ok(r) => {
                assert!(fits, "{n} pods need a claim");
                assert_eq!(existing(&r), existing(&full));
                assert!(r.claims.is_empty() && r.unschedulable.is_empty());
            }
            Err(at) => {
                assert!(!fits, "{n} pods fit the nodes");
                assert_eq!(at, Stopped::Claim);
            }
        }
    }
    // A marked node stops only a solve told to stop there, and only once a pod lands on it.
    let shape = |r: &Results| {
        let claims: Vec<Vec<String>> = r.claims.iter().map(|c| c.pods.clone()).collect();
        let failed: Vec<String> = r.unschedulable.iter().map(|u| u.pod.clone()).collect();
        (existing(r), claims, failed)
    };
    let mut marked = base.clone();
    marked.stop_on_landing(&["n-b"]);
    let on_marked = StopAt { first_claim_below: None, second_claim: false, marked_node: true };
    let mut stops = Vec::new();
    for n in [3, 8, 12, 21] {
        let pods = pods(n);
        let groups = marked.register(pods.iter().map(|p| &**p));
        let full = base.clone().solve_registered(pods.clone(), groups.iter().collect());
        let lands = full.existing.iter().any(|p| p.node == "n-b");
        let unmarked = marked.clone().solve_registered(pods.clone(), groups.iter().collect());
        assert_eq!(shape(&unmarked), shape(&full), "a mark alone changes nothing");
        match marked.clone().solve_registered_unless(pods, groups.iter().collect(), on_marked) {
            Ok(r) => {
                assert!(!lands, "{n} pods: a pod lands on n-b");
                assert_eq!(shape(&r), shape(&full));
            }
            Err(at) => {
                assert!(lands, "{n} pods: none lands on n-b");
                assert_eq!(at, Stopped::MarkedNode);
            }
        }
        stops.push(lands);
    }
    assert!(stops.contains(&true) && stops.contains(&false), "{stops:?}");
    // Claims that could not be spot: an on-demand pool.
    let on_demand: NodePool =
        serde_json::from_value(json!({"metadata": {"name": "od"}, "spec": {"template": {"spec": {
        "requirements": [{"key": labels::CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]}]}}}}))
        .unwrap();
    let od = Scheduler::new(
        vec![input(on_demand, sized_catalog(8))],
        vec![],
        Vec::<(Arc<PodInfo>, &str)>::new(),
        &[],
        SchedulerOptions::default(),
    );
    assert!(!od.claims_stay_spot_capable());
}

/// A term keeps its hash once computed; resolving a `namespaceSelector` changes the term, and the resolved
/// term finds the group an equal term built resolved would.
#[test]
fn a_resolved_term_is_hashed_afresh() {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let affinity = |selector: Value| {
        json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "db"}},
             "namespaceSelector": selector, "namespaces": ["team-a", "team-b"]}]}}})
    };
    let namespaces: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> =
        [("team-b".to_owned(), [("tier".to_owned(), "data".to_owned())].into())].into();
    let hasher = BuildHasherDefault::<rustc_hash::FxHasher>::default();
    let selecting = pod_with("a", "1", affinity(json!({"matchLabels": {"tier": "data"}})), json!({}));
    let before = hasher.hash_one(&selecting.topology[0]);
    let resolved = selecting.with_namespaces(&namespaces);
    let listed = pod_with("b", "1", affinity(json!({})), json!({}));
    let mut listed_term = listed.topology[0].clone();
    listed_term.namespaces = Some(vec!["team-a".into(), "team-b".into()]);
    listed_term.namespace_selector = None;
    listed_term.cache = Default::default();
    assert_eq!(resolved.topology[0], listed_term);
    assert_eq!(hasher.hash_one(&resolved.topology[0]), hasher.hash_one(&listed_term));
    assert_ne!(hasher.hash_one(&resolved.topology[0]), before);
}

/// Removing nodes by position does what removing them by name does: they take no pods and their pods stop
/// counting for topology.
#[test]
fn nodes_removed_by_position_are_gone_as_by_name() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let bound: Vec<(Arc<PodInfo>, &str)> = (0..2)
        .map(|i| (Arc::new(pod_with(&format!("old-{i}"), "1", spread.clone(), json!({"app": "web"}))), "n-a"))
        .collect();
    let base = Scheduler::new(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))],
        vec![zone_node("n-a", "zone-a"), zone_node("n-b", "zone-b")],
        bound,
        &[],
        SchedulerOptions::default(),
    );
    assert_eq!((base.node_name(0), base.node_name(1), base.node_name(2)), (Some("n-a"), Some("n-b"), None));
    let pods = || {
        (0..3).map(|i| Arc::new(pod_with(&format!("web-{i}"), "1", spread.clone(), json!({"app": "web"})))).collect()
    };
    let placed = |r: Results| {
        let mut on: Vec<(String, usize)> = r.existing.iter().map(|p| (p.node.clone(), p.pods.len())).collect();
        on.sort();
        (on, r.claims.len(), r.unschedulable.len())
    };
    let by_position = placed(base.without_nodes_at(&[0]).solve_shared(pods()));
    assert_eq!(by_position, placed(base.without_nodes(&["n-a"]).solve_shared(pods())));
    assert!(by_position.0.iter().all(|(node, _)| node == "n-b"), "n-a takes nothing: {by_position:?}");
    // Without n-a's two pods, zone-a no longer leads, so web pods may land in zone-b at once.
    assert!(!by_position.0.is_empty(), "{by_position:?}");
    assert_ne!(by_position, placed(base.clone().solve_shared(pods())));
}

#[test]
fn a_pass_reuses_its_pools_built_types_only_when_every_input_is_equal() {
    let launched = |types: &Arc<[InstanceType]>, daemons: &[DaemonPod]| {
        let pool = PoolInput {
            pool: NodePool::new("default", NodePoolSpec::default()),
            instance_types: Arc::clone(types),
            in_use: Resources::ZERO,
            nodes_in_use: 0,
        };
        let pods = vec![pod("a", "1500m"), pod("b", "1"), pod("c", "500m")];
        let r = Scheduler::new(vec![pool], vec![], Vec::new(), daemons, SchedulerOptions::default()).solve(pods);
        let launch = r.claims[0].launch.clone().unwrap();
        (launch.instance_type, (launch.price * 100.0).round() as i64)
    };
    let types: Arc<[InstanceType]> = sized_catalog(8).into();
    assert_eq!(launched(&types, &[]), ("c.3".into(), 6));
    // The same types in another allocation build the same pool.
    assert_eq!(launched(&sized_catalog(8).into(), &[]), ("c.3".into(), 6));
    // A price that moved is read, not the pool built before it moved.
    let mut moved = sized_catalog(8);
    for o in &mut moved[2].offerings {
        o.price = 0.5;
    }
    assert_eq!(launched(&moved.into(), &[]), ("c.4".into(), 8));
    // So is a DaemonSet that now takes a CPU of every node.
    let agent = DaemonPod {
        name: "default/agent".into(),
        requests: Resources::cpu_memory(1000, 0),
        alternatives: vec![Requirements::default()],
        tolerations: Vec::new(),
    };
    assert_eq!(launched(&types, std::slice::from_ref(&agent)), ("c.4".into(), 8));
    let light = DaemonPod { requests: Resources::cpu_memory(0, 1 << 30), ..agent };
    assert_eq!(launched(&types, std::slice::from_ref(&light)), ("c.3".into(), 6));
    assert_eq!(launched(&types, &[]), ("c.3".into(), 6));
}

#[test]
fn equal_terms_share_a_group_across_passes_and_unequal_ones_never_do() {
    let spread = |app: &str| {
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": labels::ZONE,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": app}}}]})
    };
    let a = pod_with("a", "1", spread("web"), json!({"app": "web"}));
    let b = pod_with("b", "1", spread("web"), json!({"app": "web"}));
    let c = pod_with("c", "1", spread("db"), json!({"app": "db"}));
    let (ta, tb, tc) = (&a.topology[0], &b.topology[0], &c.topology[0]);
    let mut first = topology::Topology::new(Default::default(), Vec::new());
    assert_eq!([first.group(ta), first.group(tb), first.group(tc)], [0, 0, 1]);
    // A later pass builds its groups in another order: each term finds the group of its equals, whatever
    // it was found equal to in the pass before.
    let mut next = topology::Topology::new(Default::default(), Vec::new());
    assert_eq!([next.group(tc), next.group(tb), next.group(ta), next.group(tc)], [0, 1, 1, 0]);
    assert!(ta == tb && tb != tc && ta != tc);
}

/// A pod told it lands on no existing node (but those set aside and those marked) lands on none in a solve:
/// every level of its relaxation is asked, the `PreferNoSchedule` tolerance the last of them included.
#[test]
fn a_pod_told_it_lands_on_no_node_lands_on_none() {
    let sized = |name: &str, zone: &str, cpu: i64| ExistingNode {
        available: Resources::cpu_memory(cpu, 32 << 30).with(ResourceName::PODS, 10),
        ..zone_node(name, zone)
    };
    let soft = crate::scheduling::taints::taint("spare", None, "PreferNoSchedule");
    let nodes = vec![
        sized("n-a", "zone-a", 8000),
        ExistingNode { taints: vec![soft], ..sized("n-b", "zone-b", 8000) },
        sized("n-c", "zone-c", 2000),
    ];
    let base = Scheduler::new(
        vec![input(NodePool::new("default", NodePoolSpec::default()), sized_catalog(8))],
        nodes,
        Vec::<(Arc<PodInfo>, &str)>::new(),
        &[],
        SchedulerOptions::default(),
    );
    let zones = |kind: &str, zones: &[&str]| {
        let terms: Vec<Value> = zones
            .iter()
            .map(|z| json!({"matchExpressions": [{"key": labels::ZONE, "operator": "In", "values": [z]}]}))
            .collect();
        match kind {
            "required" => json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": terms}}}}),
            _ => json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                terms.iter().map(|t| json!({"weight": 10, "preference": t})).collect::<Vec<_>>()}}}),
        }
    };
    // What it is told, and whether a solve lands it on an unmarked node: told it might, a pod may still go
    // to a new claim (one opens before `PreferNoSchedule` taints are tolerated).
    let cases = [
        ("big", pod("big", "4"), &[][..], false, (true, true)),
        ("big without n-a", pod("big", "4"), &[0][..], false, (true, false)),
        ("big without n-a, n-b marked", pod("big", "4"), &[0][..], true, (false, false)),
        ("too big", pod("huge", "9"), &[][..], false, (false, false)),
        ("zone-c only", pod_with("c", "4", zones("required", &["zone-c"]), json!({})), &[][..], false, (false, false)),
        (
            "small, zone-c only",
            pod_with("c", "1", zones("required", &["zone-c"]), json!({})),
            &[][..],
            false,
            (true, true),
        ),
        (
            "zone-z or zone-a",
            pod_with("or", "4", zones("required", &["zone-z", "zone-a"]), json!({})),
            &[][..],
            false,
            (true, true),
        ),
        (
            "zone-z preferred",
            pod_with("pref", "4", zones("preferred", &["zone-z"]), json!({})),
            &[1][..],
            false,
            (true, true),
        ),
    ];
    for (what, pod, except, mark_b, (might, lands)) in cases {
        let mut sched = base.clone();
        if mark_b {
            sched.stop_on_landing(&["n-b"]);
        }
        assert_eq!(sched.might_land_on_a_node(&pod, except), might, "{what}");
        let r = sched.without_nodes_at(except).solve(vec![pod]);
        let landed = r.existing.iter().any(|p| !(p.pods.is_empty() || mark_b && p.node == "n-b"));
        assert_eq!(landed, lands, "{what}: {:?}", r.existing);
    }
    let ignoring = base.with_options(SchedulerOptions { ignore_preferences: true, ..SchedulerOptions::default() });
    assert!(ignoring.might_land_on_a_node(&pod("huge", "9"), &[]), "not worked out when preferences are ignored");
}

/// Counting a group over bound pods reuses whether it selects a pod only for pods of the last one's
/// selection class (or, unclassed, with its namespace and labels): pods of one owner with different labels,
/// interleaved on one node, are told apart, classed or not.
#[test]
fn bound_pods_are_counted_by_their_own_labels_classed_or_not() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web", "tier": "front"}}}]});
    let front = json!({"app": "web", "tier": "front"});
    let back = json!({"app": "web", "tier": "back"});
    let run = |classed: bool, layout: &[(&str, &Value)], gone: &[&str]| {
        let mut classes = SelectionClasses::default();
        let bound: Vec<(Arc<PodInfo>, &str)> = layout
            .iter()
            .enumerate()
            .map(|(i, (node, labels_))| {
                let p = pod_with(&format!("old-{i}"), "100m", json!({}), (*labels_).clone());
                if classed {
                    classes.assign(&p);
                }
                (Arc::new(p), *node)
            })
            .collect();
        if classed {
            assert_eq!(bound[0].0.class_id(), bound[2].0.class_id());
            assert_ne!(bound[0].0.class_id(), bound[1].0.class_id());
        }
        let new = pod_with("new", "100m", spread.clone(), front.clone());
        let mut base = Scheduler::new(
            vec![],
            vec![zone_node("n-a", "zone-a"), zone_node("n-b", "zone-b"), zone_node("n-c", "zone-c")],
            bound,
            &[],
            SchedulerOptions::default(),
        );
        // The group is counted before the nodes go (as a pass's base registers its candidates' pods), and
        // again after, in a copy that never had them.
        let fresh = base.clone().without_nodes(gone).solve(vec![new.clone()]);
        base.register([&new]);
        let r = base.without_nodes(gone).solve(vec![new]);
        assert_eq!(fresh.existing.len(), r.existing.len());
        r.existing.iter().map(|p| p.node.clone()).collect::<Vec<_>>()
    };
    let counted = [("n-a", &front), ("n-a", &back), ("n-a", &front), ("n-a", &back), ("n-b", &back), ("n-b", &back)];
    let mut counted = counted.to_vec();
    counted.push(("n-c", &front));
    // Without n-a, zone-a counts none of its two selected pods: the zones count 0, 1 and 1, so the new pod
    // may go to zone-a alone, where no node is left.
    let removed = [("n-a", &front), ("n-a", &back), ("n-a", &front), ("n-a", &back), ("n-b", &back), ("n-b", &front)];
    let mut removed = removed.to_vec();
    removed.push(("n-c", &front));
    for classed in [true, false] {
        // zone-a runs two of the selected pods, zone-c one, zone-b none (its pods are the back tier).
        assert_eq!(run(classed, &counted, &[]), ["n-b"], "classed: {classed}");
        assert!(run(classed, &removed, &["n-a"]).is_empty(), "classed: {classed}");
        // With n-a, zone-a's two make room in the others.
        assert_eq!(run(classed, &removed, &[]).len(), 1, "classed: {classed}");
    }
}
