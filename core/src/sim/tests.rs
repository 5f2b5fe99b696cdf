//! The controllers together in virtual time, and the reliability suite: randomized faults with fixed
//! seeds, invariants checked after every step.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::api::NodePoolSpec;
use crate::cloud::fake::{FakeCloud, Method};
use crate::cloud::{CapacityType, CloudError, OfferingKey};
use crate::disruption::queue::Outcome;
use crate::scheduling::workload::Rng;

const STEP: Duration = Duration::from_secs(10);

fn world(seed_pods: usize) -> (Sim, Arc<FakeCloud>) {
    let clock = VirtualClock::at_epoch();
    let cloud = Arc::new(FakeCloud::builder().clock(clock.clone()).build());
    let mut pool = NodePool::new("default", NodePoolSpec::default());
    pool.spec.disruption.budgets[0].nodes = "50%".into();
    let mut sim = Sim::new(clock, cloud.clone(), vec![pool], Settings::default());
    for i in 0..seed_pods {
        let gpus = u32::from(i % 4 == 0);
        sim.add_pod(pod(&format!("p{i:02}"), "700m", gpus));
    }
    (sim, cloud)
}

#[tokio::test]
async fn pending_pods_get_nodes_that_boot_register_initialize_and_run_them() {
    let (mut sim, cloud) = world(6);
    sim.run(Duration::from_secs(5 * 60), STEP).await;
    assert!(sim.pending().is_empty(), "{:?}", sim.pending());
    assert!(!sim.live_claims().is_empty());
    assert!(sim.live_claims().iter().all(|c| c.is_initialized()));
    assert_eq!(cloud.instances().len(), sim.live_claims().len());
    // Scale to zero: the nodes empty out and are consolidated away, instances and all.
    for i in 0..6 {
        sim.remove_pod(&format!("default/p{i:02}"));
    }
    sim.run(Duration::from_secs(10 * 60), STEP).await;
    assert!(sim.live_claims().is_empty(), "{:?}", sim.live_claims().iter().map(|c| c.name()).collect::<Vec<_>>());
    assert!(cloud.instances().is_empty());
}

/// A spot interruption notice: the node is tainted, drained and its pods land on new capacity outside the
/// interrupted offering, at once.
#[tokio::test]
async fn a_spot_interruption_notice_replaces_the_node_at_once() {
    let (mut sim, cloud) = world(1);
    sim.run(Duration::from_secs(3 * 60), STEP).await;
    assert!(sim.pending().is_empty());
    let victim = sim.live_claims()[0].clone();
    let pid = victim.provider_id().unwrap().to_owned();
    assert_eq!(victim.label(labels::CAPACITY_TYPE), Some("spot"));
    cloud.announce(&pid, crate::cloud::InterruptionKind::SpotInterruption);
    sim.clock.advance(STEP);
    sim.tick().await;
    assert!(sim.cluster.claims.get(victim.name()).is_none_or(|c| c.metadata.deletion_timestamp.is_some()));
    let key = OfferingKey::new(
        victim.label(labels::INSTANCE_TYPE).unwrap(),
        victim.label(labels::ZONE).unwrap(),
        CapacityType::Spot,
    );
    assert!(sim.unavailable.is_unavailable("fake", &key, sim.clock.now()));
    sim.run(Duration::from_secs(3 * 60), STEP).await;
    assert!(sim.pending().is_empty(), "the pod runs on the replacement");
    assert!(cloud.instances().iter().all(|i| i.provider_id != pid), "the interrupted instance is gone");
    assert_eq!(sim.live_claims().len(), 1);
}

fn sicken(sim: &mut Sim, node: &str, reason: &str, minutes_ago: i64) {
    let at = sim.clock.now() - jiff::SignedDuration::from_mins(minutes_ago);
    let n = std::sync::Arc::make_mut(sim.cluster.nodes.get_mut(node).unwrap());
    let conditions = n.status.as_mut().unwrap().conditions.as_mut().unwrap();
    conditions.push(
        serde_json::from_value(json!({"type": "AcceleratedHardwareReady", "status": "False", "reason": reason,
            "lastTransitionTime": at.to_string()}))
        .unwrap(),
    );
}

fn repair_world() -> (Sim, Arc<FakeCloud>) {
    // Six nodes, so one sick node stays under the 20% breaker.
    let (mut sim, cloud) = world(0);
    for i in 0..6 {
        sim.add_pod(pod(&format!("big-{i}"), "5", 0));
    }
    sim.settings =
        crate::settings::load(None, vec![("FEATURE_GATES".into(), "NodeRepair=true".into())], &[]).unwrap().settings;
    (sim, cloud)
}

/// Node repair: a transient GPU fault (XID 48) reboots the node in place; a fatal one (XID 79) replaces it
/// through the queue, the replacement initialized before the sick node goes.
#[tokio::test]
async fn repair_reboots_transient_faults_and_replaces_fatal_ones() {
    let (mut sim, cloud) = repair_world();
    sim.run(Duration::from_secs(3 * 60), STEP).await;
    let sick = sim.live_claims()[0].name().to_owned();
    // The node's family boots in five minutes, so its reboot takes that long.
    let family = sim.cluster.claims[&sick].label(labels::INSTANCE_TYPE).unwrap().split('.').next().unwrap().to_owned();
    sim.kubelet.registration_delay_by_family.insert(family, Duration::from_secs(5 * 60));
    sicken(&mut sim, &sick, "XID48 detected", 11);
    sim.run(Duration::from_secs(30), STEP).await;
    assert!(cloud.calls().iter().any(|c| matches!(c, crate::cloud::fake::Call::Reboot { claim } if *claim == sick)));
    assert!(sim.events.iter().any(|(_, e)| matches!(e, Event::Reboot { node, .. } if *node == sick)));
    assert!(sim.cluster.claims[&sick].metadata.deletion_timestamp.is_none(), "rebooted, not replaced");
    let rebooting = |sim: &Sim| {
        let taints = sim.cluster.nodes[&sick].spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        taints.iter().any(|t| t.key == labels::REBOOTING_TAINT)
    };
    assert!(rebooting(&sim));
    sim.run(Duration::from_secs(4 * 60), STEP).await;
    assert!(rebooting(&sim), "still booting after four minutes");
    sim.run(Duration::from_secs(60), STEP).await;
    assert!(!rebooting(&sim), "back once its family has booted");

    let (mut sim, _cloud) = repair_world();
    sim.run(Duration::from_secs(3 * 60), STEP).await;
    let sick = sim.live_claims()[0].name().to_owned();
    sicken(&mut sim, &sick, "XID79 fell off the bus", 11);
    sim.run(Duration::from_secs(5 * 60), STEP).await;
    assert!(
        sim.events
            .iter()
            .any(|(_, e)| matches!(e, Event::Proposed { method: crate::disruption::Method::NodeRepair, .. }))
    );
    assert!(!sim.cluster.claims.contains_key(&sick), "replaced");
    assert_eq!(sim.live_claims().len(), 6);
    assert!(sim.pending().is_empty());
}

struct Faults {
    rng: Rng,
    exhausted: Vec<(OfferingKey, u32)>,
}

impl Faults {
    fn roll(&mut self, percent: usize) -> bool {
        self.rng.below(100) < percent
    }

    /// One step's worth of trouble.
    fn inject(&mut self, sim: &mut Sim, cloud: &FakeCloud) {
        let types = ["fake.small", "fake.large", "fake.gpu"];
        let zones = ["test-zone-a", "test-zone-b"];
        if self.roll(5) {
            cloud.inject(
                Method::Create,
                CloudError::Create { reason: "RequestLimitExceeded".into(), message: "slow down".into() },
                1 + self.rng.below(3),
            );
        }
        if self.roll(4) {
            let key = OfferingKey::new(
                types[self.rng.below(3)],
                zones[self.rng.below(2)],
                if self.roll(50) { CapacityType::Spot } else { CapacityType::OnDemand },
            );
            cloud.exhaust_offering(key.clone());
            self.exhausted.push((key, 10));
        }
        if self.roll(3) {
            cloud.defer_launches(2, Duration::from_secs(30), "capacity is being freed");
        }
        for method in [Method::Delete, Method::Get, Method::List] {
            if self.roll(3) {
                cloud.inject(method, CloudError::Throttled { retry_after: None }, 1);
            }
        }
        let instances = cloud.instances();
        if !instances.is_empty() && self.roll(3) {
            let victim = &instances[self.rng.below(instances.len())];
            cloud.vanish(&victim.provider_id);
        }
        let launched: Vec<String> =
            sim.cluster.claims.values().filter_map(|c| c.provider_id().map(str::to_owned)).collect();
        if !launched.is_empty() && self.roll(3) {
            let pid = launched[self.rng.below(launched.len())].clone();
            if self.roll(50) {
                sim.late.insert(pid, Duration::from_secs(300));
            } else {
                sim.never_register.insert(pid);
            }
        }
        if self.roll(2) {
            sim.crash();
        }
        if !sim.cluster.claims.is_empty() && self.roll(2) {
            // A claim deleted by hand, finalizer and all: its instance is left behind.
            let names: Vec<String> = sim.cluster.claims.keys().cloned().collect();
            sim.cluster.claims.remove(&names[self.rng.below(names.len())]);
        }
        for (key, left) in self.exhausted.iter_mut() {
            *left -= 1;
            if *left == 0 {
                cloud.clear_offering_failure(key);
            }
        }
        self.exhausted.retain(|(_, left)| *left > 0);
    }
}

fn check_invariants(sim: &Sim, cloud: &FakeCloud, seed: u64, orphans: &mut HashMap<String, Timestamp>) {
    let now = sim.clock.now();
    // 1. No instance without a claim beyond the orphan grace (from launch) and one garbage-collection
    //    period (plus the step it is noticed in).
    let claimed: HashSet<&str> = sim.cluster.claims.values().filter_map(|c| c.provider_id()).collect();
    let instances = cloud.instances();
    orphans.retain(|pid, _| instances.iter().any(|i| i.provider_id == *pid) && !claimed.contains(pid.as_str()));
    for i in &instances {
        if claimed.contains(i.provider_id.as_str()) {
            continue;
        }
        let since = *orphans.entry(i.provider_id.clone()).or_insert(now);
        let due = since.max(clock::add(i.launch_time, sim.settings.orphan_instance_grace));
        assert!(
            now <= due || clock::since(now, due) <= Duration::from_secs(120) + 2 * STEP,
            "seed {seed}: instance {} has had no claim since {since}",
            i.provider_id
        );
    }
    // 2. No pod bought for twice: a pending pod is planned onto at most one claim still booting.
    let mut booking: HashMap<&str, Vec<&str>> = HashMap::new();
    for (claim, pods) in &sim.reserved {
        let booting = sim
            .cluster
            .claims
            .get(claim)
            .is_some_and(|c| c.metadata.deletion_timestamp.is_none() && !c.is_true(condition_types::REGISTERED));
        if booting {
            for p in pods {
                booking.entry(p.as_str()).or_default().push(claim.as_str());
            }
        }
    }
    for pod in sim.pending() {
        let claims = booking.get(pod.as_str()).cloned().unwrap_or_default();
        let detail: Vec<String> = claims
            .iter()
            .map(|c| {
                let x = &sim.cluster.claims[*c];
                format!(
                    "{c}: created {:?} launched {:?} pid {:?} requests {:?}",
                    x.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
                    x.condition(condition_types::LAUNCHED).map(|c| (c.status, c.reason.clone())),
                    x.provider_id(),
                    x.spec.resources.requests
                )
            })
            .collect();
        assert!(claims.len() <= 1, "seed {seed} at {now}: pod {pod} is planned onto {detail:#?}");
    }
    // 3. No node deleted by disruption before its replacements initialized.
    for (at, e) in &sim.events {
        if *at == now
            && let Event::Finished(Outcome::Completed { replacements, .. }) = e
        {
            for r in replacements {
                let ok = sim.cluster.claims.get(r).is_some_and(|c| c.is_initialized());
                assert!(ok, "seed {seed}: a candidate was deleted before replacement {r} initialized");
            }
        }
    }
}

/// Hundreds of steps of faults on every call kind, ICE storms, deferrals, instances vanishing mid-boot,
/// kubelets registering late or never, hand-deleted claims and controller crashes; invariants after every
/// step, and every pod scheduled once the trouble stops.
#[tokio::test]
async fn reliability_under_random_faults() {
    for seed in 1..=6u64 {
        let (mut sim, cloud) = world(10);
        let mut faults = Faults { rng: Rng::new(seed), exhausted: Vec::new() };
        let mut orphans = HashMap::new();
        for step in 0..240 {
            faults.inject(&mut sim, &cloud);
            if step % 40 == 20 {
                // The workload changes under the faults too.
                sim.remove_pod("default/p03");
                sim.add_pod(pod(&format!("late-{step}"), "1500m", 0));
            }
            sim.clock.advance(STEP);
            sim.tick().await;
            check_invariants(&sim, &cloud, seed, &mut orphans);
        }
        // The trouble stops; the fleet must converge.
        for (key, _) in faults.exhausted.drain(..) {
            cloud.clear_offering_failure(&key);
        }
        sim.never_register.clear();
        sim.late.clear();
        for _ in 0..180 {
            sim.clock.advance(STEP);
            sim.tick().await;
            check_invariants(&sim, &cloud, seed, &mut orphans);
        }
        assert!(sim.pending().is_empty(), "seed {seed}: still pending after the faults stopped: {:?}", sim.pending());
        let live = sim.live_claims().len();
        assert!(live <= sim.cluster.pods.len(), "seed {seed}: {live} claims for {} pods", sim.cluster.pods.len());
    }
}

fn on(sim: &Sim, prefix: &str) -> usize {
    sim.cluster.pods.keys().filter(|k| k.starts_with(prefix)).count()
}

fn daemon_set(name: &str, cpu: &str, node_selector: serde_json::Value) -> k8s_openapi::api::apps::v1::DaemonSet {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("ds-{name}")},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}},
            "spec": {"tolerations": [{"operator": "Exists"}], "nodeSelector": node_selector,
                "containers": [{"name": "a", "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}}}]}}}
    }))
    .unwrap()
}

#[tokio::test]
async fn daemon_sets_run_where_they_fit_and_provisioning_leaves_room_for_them() {
    let (mut sim, _cloud) = world(6);
    sim.add_daemon_set(daemon_set("agent", "300m", serde_json::json!({}))).unwrap();
    // Selects a label no node carries: provisioning may not charge it, and it never runs.
    sim.add_daemon_set(daemon_set("nowhere", "4", serde_json::json!({"example.com/rack": "r9"}))).unwrap();
    sim.run(Duration::from_secs(10 * 60), STEP).await;
    assert!(sim.pending().is_empty(), "the workload pods fit beside the agents: {:?}", sim.pending());
    assert_eq!(on(&sim, "default/agent-"), sim.cluster.nodes.len(), "one agent per node");
    assert_eq!(on(&sim, "default/nowhere-"), 0);
    // A node's agent goes with it.
    for i in 0..6 {
        sim.remove_pod(&format!("default/p{i:02}"));
    }
    sim.run(Duration::from_secs(15 * 60), STEP).await;
    assert!(sim.cluster.nodes.is_empty(), "agents alone do not keep a node");
    assert_eq!(on(&sim, "default/agent-"), 0);
}
