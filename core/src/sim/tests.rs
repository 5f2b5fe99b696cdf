//! The controllers together in virtual time, and the reliability suite: randomized faults with fixed
//! seeds, invariants checked after every step.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::api::NodePoolSpec;
use crate::cloud::fake::{FakeCloud, Method};
use crate::cloud::{CapacityType, CloudError, OfferingKey};
use crate::cluster::ApiErrorKind;
use crate::cluster::memory::{Fault, Write};
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
    assert!(sim.api.lock().claims.get(victim.name()).cloned().is_none_or(|c| c.metadata.deletion_timestamp.is_some()));
    let key = OfferingKey::new(
        victim.label(labels::INSTANCE_TYPE).unwrap(),
        victim.label(labels::ZONE).unwrap(),
        CapacityType::Spot,
    );
    assert!(sim.runtime.unavailable().is_unavailable("fake", &key, sim.clock.now()));
    sim.run(Duration::from_secs(3 * 60), STEP).await;
    assert!(sim.pending().is_empty(), "the pod runs on the replacement");
    assert!(cloud.instances().iter().all(|i| i.provider_id != pid), "the interrupted instance is gone");
    assert_eq!(sim.live_claims().len(), 1);
}

fn sicken(sim: &mut Sim, node: &str, reason: &str, minutes_ago: i64) {
    let at = sim.clock.now() - jiff::SignedDuration::from_mins(minutes_ago);
    let updated = sim.api.lock().update_node(node, |n| {
        let conditions = n.status.as_mut().unwrap().conditions.as_mut().unwrap();
        conditions.push(
            serde_json::from_value(json!({"type": "AcceleratedHardwareReady", "status": "False", "reason": reason,
                "lastTransitionTime": at.to_string()}))
            .unwrap(),
        );
    });
    assert!(updated);
}

fn repair_world() -> (Sim, Arc<FakeCloud>) {
    // Six nodes, so one sick node stays under the 20% breaker.
    let (mut sim, cloud) = world(0);
    for i in 0..6 {
        sim.add_pod(pod(&format!("big-{i}"), "5", 0));
    }
    sim.set_settings(
        crate::settings::load(None, vec![("FEATURE_GATES".into(), "NodeRepair=true".into())], &[]).unwrap().settings,
    );
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
    let family =
        sim.api.lock().claims[&sick].label(labels::INSTANCE_TYPE).unwrap().split('.').next().unwrap().to_owned();
    sim.kubelet.registration_delay_by_family.insert(family, Duration::from_secs(5 * 60));
    sicken(&mut sim, &sick, "XID48 detected", 11);
    sim.run(Duration::from_secs(30), STEP).await;
    assert!(cloud.calls().iter().any(|c| matches!(c, crate::cloud::fake::Call::Reboot { claim } if *claim == sick)));
    assert!(sim.events.iter().any(|(_, e)| matches!(e, Event::Reboot { node, .. } if *node == sick)));
    assert!(sim.api.lock().claims[&sick].metadata.deletion_timestamp.is_none(), "rebooted, not replaced");
    let rebooting = |sim: &Sim| {
        let taints = sim.api.lock().nodes[&sick].spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        taints.iter().any(|t| t.key == labels::REBOOTING_TAINT)
    };
    assert!(rebooting(&sim));
    let condition = |sim: &Sim| {
        let c = sim.api.lock().claims[&sick].condition(crate::api::condition_types::REBOOTING).cloned();
        c.map(|c| (c.status, c.reason))
    };
    assert_eq!(condition(&sim), Some((crate::api::ConditionStatus::True, "RepairReboot".to_owned())));
    sim.run(Duration::from_secs(4 * 60), STEP).await;
    assert!(rebooting(&sim), "still booting after four minutes");
    sim.run(Duration::from_secs(60), STEP).await;
    assert!(!rebooting(&sim), "back once its family has booted");
    assert_eq!(condition(&sim), Some((crate::api::ConditionStatus::False, "RebootCompleted".to_owned())));

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
    assert!(!sim.api.lock().claims.contains_key(&sick), "replaced");
    assert_eq!(sim.live_claims().len(), 6);
    assert!(sim.pending().is_empty());
}

struct Faults {
    rng: Rng,
    exhausted: Vec<(OfferingKey, u32)>,
    /// The controller died between two writes this step: it is restarted once the step is over.
    dying: bool,
}

impl Faults {
    /// After a step: a controller that died mid-step is restarted, with nothing in memory.
    fn after_step(&mut self, sim: &mut Sim) {
        if std::mem::take(&mut self.dying) {
            sim.api.lock().revive();
            sim.crash();
        }
    }
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
        if !instances.is_empty() && self.roll(2) {
            // An interruption drains the node at once, do-not-disrupt pods and all once the grace is over.
            let victim = &instances[self.rng.below(instances.len())];
            cloud.announce(&victim.provider_id, crate::cloud::InterruptionKind::SpotInterruption);
        }
        let launched: Vec<String> =
            sim.api.lock().claims.values().filter_map(|c| c.provider_id().map(str::to_owned)).collect();
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
        // The API server's trouble: conflicts and failures on every kind of write, timeouts whose write
        // landed anyway, PDB refusals of evictions, watches lagging the writes, and the controller dying
        // between two writes (it is restarted after the step).
        {
            let mut api = sim.api.lock();
            for write in Write::ALL {
                if self.roll(3) {
                    let fault = match self.rng.below(4) {
                        0 => Fault::fail(ApiErrorKind::Conflict),
                        1 => Fault::fail(ApiErrorKind::Unavailable),
                        2 => Fault::timeout_after_applying(),
                        _ => Fault::fail(ApiErrorKind::TooManyRequests),
                    };
                    api.inject(write, fault, 1 + self.rng.below(2));
                }
            }
            if self.roll(5) {
                api.inject(Write::EvictPod, Fault::fail(ApiErrorKind::TooManyRequests), 1 + self.rng.below(3));
            }
            if self.roll(4) {
                api.lag_reads(1 + self.rng.below(4));
            }
            if self.roll(3) {
                api.die_after(self.rng.below(6));
                self.dying = true;
            }
        }
        if !sim.api.lock().claims.is_empty() && self.roll(2) {
            // A claim deleted by hand, finalizer and all: its instance is left behind.
            let names: Vec<String> = sim.api.lock().claims.keys().cloned().collect();
            sim.api.lock().remove_claim(&names[self.rng.below(names.len())]);
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

fn check_invariants(
    sim: &Sim,
    cloud: &FakeCloud,
    seed: u64,
    orphans: &mut HashMap<String, Timestamp>,
    leftovers: &mut HashMap<String, Timestamp>,
) {
    let now = sim.clock.now();
    // 1. No instance without a claim beyond the orphan grace (from launch) and one garbage-collection
    //    period (plus the step it is noticed in).
    let snapshot = sim.api.lock().snapshot();
    let claimed: HashSet<&str> = snapshot.claims.values().filter_map(|c| c.provider_id()).collect();
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
    for (claim, pods) in &sim.runtime.reserved {
        let booting = snapshot
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
                let x = &snapshot.claims[*c];
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
    // 4. No node tainted `karpenter.sh/disrupted`, and no claim carrying a disruption reason, without a
    //    live command or a deletion, for longer than the clean-up takes under the faults.
    for (node, claim) in sim.runtime.disruption.queue.orphaned(&snapshot) {
        let since = *leftovers.entry(format!("{node}/{claim}")).or_insert(now);
        assert!(
            clock::since(now, since) <= Duration::from_secs(600),
            "seed {seed}: {node} (claim {claim}) has been left disrupted with no command since {since}"
        );
    }
    let current: HashSet<String> =
        sim.runtime.disruption.queue.orphaned(&snapshot).into_iter().map(|(n, c)| format!("{n}/{c}")).collect();
    leftovers.retain(|k, _| current.contains(k));
    // 3. No node deleted by disruption before its replacements initialized.
    for (at, e) in &sim.events {
        if *at == now
            && let Event::Finished(Outcome::Completed { replacements, .. }) = e
        {
            for r in replacements {
                let ok = snapshot.claims.get(r).is_some_and(|c| c.is_initialized());
                assert!(ok, "seed {seed}: a candidate was deleted before replacement {r} initialized");
            }
        }
    }
}

/// Hundreds of steps of faults on every cloud call kind, ICE storms, deferrals, instances vanishing
/// mid-boot, kubelets registering late or never, hand-deleted claims and controller crashes, and on the
/// API side conflicts, 500s and timeouts (some of which landed) on every kind of write, PDB refusals of
/// evictions, lagging watches and the controller dying between two writes; invariants after every step,
/// and once the trouble stops every pod scheduled, nothing left tainted, terminating or leaked.
#[tokio::test]
async fn reliability_under_random_faults() {
    let mut bitten: std::collections::BTreeMap<Write, u64> = Default::default();
    let mut forced = 0;
    for seed in 1..=6u64 {
        let (mut sim, cloud) = world(10);
        // Pods that may not be disrupted are deleted once a draining node's grace period is over.
        {
            let mut api = sim.api.lock();
            let mut pools = api.pools.to_vec();
            pools[0].spec.template.spec.termination_grace_period = Some(crate::api::KubeDuration::from_secs(120));
            api.set_pools(pools);
        }
        let mut faults = Faults { rng: Rng::new(seed), exhausted: Vec::new(), dying: false };
        let mut orphans = HashMap::new();
        let mut leftovers = HashMap::new();
        for step in 0..240u32 {
            faults.inject(&mut sim, &cloud);
            if step == 100 {
                // So does the pool's template: it is hashed again, and its claims drift.
                let mut api = sim.api.lock();
                let mut pools = api.pools.to_vec();
                pools[0].spec.template.metadata.labels.insert("team".into(), "search".into());
                api.set_pools(pools);
            }
            if step % 40 == 20 {
                // The workload changes under the faults too.
                sim.remove_pod("default/p03");
                sim.add_pod(pod(&format!("late-{step}"), "1500m", 0));
            }
            if step % 24 == 0 && step > 0 {
                // The node running the last do-not-disrupt job is interrupted: its drain must wait out the
                // grace period, then force the job off.
                let snapshot = sim.api.lock().snapshot();
                let node = snapshot
                    .pod(&format!("default/burst-{}", step - 6))
                    .and_then(|p| p.spec.as_ref()?.node_name.clone());
                if let Some(pid) = node.and_then(|n| snapshot.claims.get(&n)?.provider_id().map(str::to_owned)) {
                    cloud.announce(&pid, crate::cloud::InterruptionKind::SpotInterruption);
                }
            }
            if step % 12 == 6 {
                // Short jobs come and go, so nodes are bought, drained and consolidated all along.
                sim.remove_pod(&format!("default/burst-{}", step.saturating_sub(36)));
                let mut p = pod(&format!("burst-{step}"), "3", u32::from(step % 24 == 6));
                if step % 24 == 18 {
                    p.metadata.annotations =
                        Some([(crate::api::labels::DO_NOT_DISRUPT.to_owned(), "true".to_owned())].into());
                }
                sim.add_pod(p);
            }
            sim.clock.advance(STEP);
            sim.tick().await;
            faults.after_step(&mut sim);
            check_invariants(&sim, &cloud, seed, &mut orphans, &mut leftovers);
        }
        // The trouble stops; the fleet must converge.
        sim.api.lock().clear_faults();
        for (key, _) in faults.exhausted.drain(..) {
            cloud.clear_offering_failure(&key);
        }
        sim.never_register.clear();
        sim.late.clear();
        for _ in 0..180 {
            sim.clock.advance(STEP);
            sim.tick().await;
            check_invariants(&sim, &cloud, seed, &mut orphans, &mut leftovers);
        }
        // Every failed write was retried or rolled back: nothing is left half-done.
        let snapshot = sim.api.lock().snapshot();
        let left = sim.runtime.disruption.queue.orphaned(&snapshot);
        assert!(left.is_empty(), "seed {seed}: left disrupted with no command: {left:?}");
        let stuck: Vec<&String> =
            snapshot.claims.iter().filter(|(_, c)| c.metadata.deletion_timestamp.is_some()).map(|(n, _)| n).collect();
        assert!(stuck.is_empty(), "seed {seed}: claims still terminating long after the faults: {stuck:?}");
        let claimed: HashSet<&str> = snapshot.claims.values().filter_map(|c| c.provider_id()).collect();
        let leaked: Vec<String> =
            cloud.instances().into_iter().map(|i| i.provider_id).filter(|p| !claimed.contains(p.as_str())).collect();
        assert!(leaked.is_empty(), "seed {seed}: instances no claim owns: {leaked:?}");
        for (write, n) in &sim.api.lock().failed_writes {
            *bitten.entry(*write).or_default() += n;
        }
        forced += sim.api.lock().log.iter().filter(|l| l.starts_with("force-delete")).count();
    }
    // Every kind of write met its faults somewhere in the runs.
    for write in Write::ALL {
        assert!(bitten.get(&write).copied().unwrap_or(0) > 0, "no {write:?} ever failed: {bitten:?}, {forced} forced");
    }
}

fn on(sim: &Sim, prefix: &str) -> usize {
    sim.api.lock().pods.keys().filter(|k| k.starts_with(prefix)).count()
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
    assert_eq!(on(&sim, "default/agent-"), sim.api.lock().nodes.len(), "one agent per node");
    assert_eq!(on(&sim, "default/nowhere-"), 0);
    // An agent deleted from a node that stays is recreated at the next step, though no node, claim or
    // DaemonSet changed.
    let agent = sim.api.lock().pods.keys().find(|k| k.starts_with("default/agent-")).cloned().unwrap();
    assert!(sim.api.lock().remove_pod(&agent).is_some());
    sim.run(STEP, STEP).await;
    assert!(sim.api.lock().pods.contains_key(&agent), "{agent} is back");
    // A node's agent goes with it.
    for i in 0..6 {
        sim.remove_pod(&format!("default/p{i:02}"));
    }
    sim.run(Duration::from_secs(15 * 60), STEP).await;
    assert!(sim.api.lock().nodes.is_empty(), "agents alone do not keep a node");
    assert_eq!(on(&sim, "default/agent-"), 0);
}

/// NodePool status as Karpenter writes it: conditions, node count and resources; a pool that fails
/// validation is marked, reported in an event, and never provisioned from.
#[tokio::test]
async fn pools_carry_their_status_and_an_invalid_pool_is_left_out() {
    use crate::api::ConditionStatus;
    use crate::api::condition_types::{NODE_CLASS_READY, READY, VALIDATION_SUCCEEDED};
    let (mut sim, _cloud) = world(4);
    {
        let mut api = sim.api.lock();
        let mut pools = api.pools.to_vec();
        // Heavier, so it would win every pod if it were used.
        let mut bad = NodePool::new("bad", NodePoolSpec::default());
        bad.spec.weight = Some(100);
        bad.spec.disruption.budgets[0].nodes = "150%".into();
        pools.push(bad);
        api.set_pools(pools);
    }
    sim.run(Duration::from_secs(5 * 60), STEP).await;
    assert!(sim.pending().is_empty());
    let snapshot = sim.api.lock().snapshot();
    let status = |pool: &str, type_: &str| {
        let p = snapshot.pool(pool).unwrap();
        let c = p.condition(type_).unwrap();
        (c.status, c.reason.clone())
    };
    assert_eq!(status("default", VALIDATION_SUCCEEDED), (ConditionStatus::True, "ValidationSucceeded".into()));
    assert_eq!(status("default", NODE_CLASS_READY), (ConditionStatus::True, "NodeClassReady".into()));
    assert_eq!(status("default", READY), (ConditionStatus::True, "Ready".into()));
    assert_eq!(status("bad", VALIDATION_SUCCEEDED).0, ConditionStatus::False);
    assert_eq!(status("bad", READY).0, ConditionStatus::False);
    let default = snapshot.pool("default").unwrap().status.clone().unwrap();
    let live = sim.live_claims();
    assert_eq!(default.nodes, Some(live.len() as i64));
    assert!(default.resources.contains_key("cpu"), "{:?}", default.resources);
    assert!(live.iter().all(|c| c.node_pool() == Some("default")), "the invalid pool is never used");
    let events = sim.api.lock().events.clone();
    assert_eq!(events.iter().filter(|e| e.reason == "FailedValidation" && e.name == "bad").count(), 1);
}

/// Events as Karpenter publishes them: `Nominated` on each pod bought for, once; `DisruptionBlocked` on
/// the Node and NodeClaim of a node no disruption may touch (a `do-not-disrupt` pod), and on a NodePool
/// whose budget is at zero; each repeated at most once per dedupe window however often the pass runs.
#[tokio::test]
async fn nominations_and_blocked_disruptions_are_reported_in_deduplicated_events() {
    let clock = VirtualClock::at_epoch();
    let cloud = Arc::new(FakeCloud::builder().clock(clock.clone()).build());
    let mut pinned = NodePool::new("pinned", NodePoolSpec::default());
    pinned.spec.disruption.budgets[0].nodes = "0".into();
    pinned.spec.template.metadata.labels.insert("pool".into(), "pinned".into());
    let mut sim =
        Sim::new(clock, cloud, vec![NodePool::new("default", NodePoolSpec::default()), pinned], Settings::default());
    let mut kept = pod("kept", "700m", 0);
    kept.metadata.annotations = Some([(labels::DO_NOT_DISRUPT.to_owned(), "true".to_owned())].into());
    kept.spec.as_mut().unwrap().node_selector = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
    sim.add_pod(kept);
    let mut held = pod("held", "700m", 0);
    held.spec.as_mut().unwrap().node_selector = Some([("pool".to_owned(), "pinned".to_owned())].into());
    sim.add_pod(held);
    sim.run(Duration::from_secs(11 * 60), STEP).await;
    assert!(sim.pending().is_empty());
    let events = sim.api.lock().events.clone();
    let count = |kind: &str, reason: &str, name: &str| {
        events.iter().filter(|e| e.kind == kind && e.reason == reason && e.name.starts_with(name)).count()
    };
    for pod in ["kept", "held"] {
        let nominated: Vec<_> = events.iter().filter(|e| e.reason == "Nominated" && e.name == pod).collect();
        assert_eq!(nominated.len(), 1, "{nominated:?}");
        assert!(nominated[0].message.starts_with("Pod should schedule on: nodeclaim/"), "{:?}", nominated[0]);
        assert_eq!(nominated[0].namespace.as_deref(), Some("default"));
    }
    let kept_node = sim.api.lock().pods.get("default/kept").and_then(|p| p.spec.as_ref()?.node_name.clone()).unwrap();
    let on_node: Vec<_> = events.iter().filter(|e| e.kind == "Node" && e.name == kept_node).collect();
    let blocked: Vec<_> = on_node.iter().filter(|e| e.reason == "DisruptionBlocked").collect();
    assert!(blocked.iter().any(|e| e.message.contains("do-not-disrupt")), "{on_node:?}");
    // Once its pod is bound, the node is never a candidate: nothing after that says anything else.
    let last = on_node.last().unwrap();
    assert!(last.reason == "DisruptionBlocked" && last.message.contains("do-not-disrupt"), "{on_node:?}");
    // Ten minutes of passes every few seconds, one event per two minutes at most.
    assert!(on_node.len() <= 6, "{} events in 11 minutes: {on_node:?}", on_node.len());
    assert!(count("NodeClaim", "DisruptionBlocked", "default-") >= 1);
    let budget = events.iter().find(|e| e.kind == "NodePool" && e.name == "pinned" && e.reason == "DisruptionBlocked");
    let budget = budget.expect("the pinned pool's budget is reported");
    assert!(budget.message.contains("due to blocking budget"), "{budget:?}");
    assert!(count("NodePool", "DisruptionBlocked", "pinned") <= 3 * 11, "at most once a minute per reason");
}

/// A static NodePool (`spec.replicas`) keeps its count: its claims are made without any pod, are never
/// emptied or consolidated, a changed template pre-spins each replacement before the drifted node goes,
/// and a lower count deletes the surplus.
#[tokio::test]
async fn a_static_pool_keeps_its_replicas_through_drift_and_scale_down() {
    let clock = VirtualClock::at_epoch();
    let cloud = Arc::new(FakeCloud::builder().clock(clock.clone()).build());
    let mut pool = NodePool::new("static", NodePoolSpec::default());
    pool.spec.replicas = Some(3);
    pool.spec.disruption.budgets[0].nodes = "1".into();
    pool.spec.disruption.consolidate_after = crate::api::NillableDuration::from_secs(0);
    let mut sim = Sim::new(clock, cloud.clone(), vec![pool], Settings::default());
    sim.run(Duration::from_secs(10 * 60), STEP).await;
    let claims = sim.live_claims();
    assert_eq!(claims.len(), 3, "three claims with no pod at all");
    assert!(claims.iter().all(|c| c.is_initialized()), "and they stay: an empty static node is not emptied");
    let first: Vec<String> = claims.iter().map(|c| c.name().to_owned()).collect();
    // The template changes: every node is replaced, one at a time, never dropping below three live.
    {
        let mut api = sim.api.lock();
        let mut pools = api.pools.to_vec();
        pools[0].spec.template.metadata.labels.insert("team".into(), "search".into());
        api.set_pools(pools);
    }
    let mut fewest = usize::MAX;
    for _ in 0..(40 * 60 / STEP.as_secs()) {
        sim.clock.advance(STEP);
        sim.tick().await;
        let ready = sim.live_claims().iter().filter(|c| c.is_initialized()).count();
        fewest = fewest.min(ready);
    }
    let now: Vec<Arc<NodeClaim>> = sim.live_claims();
    assert_eq!(now.len(), 3, "{:?}", now.iter().map(|c| c.name()).collect::<Vec<_>>());
    assert!(now.iter().all(|c| !first.contains(&c.name().to_owned())), "every drifted node was replaced");
    assert!(now.iter().all(|c| c.label("team") == Some("search")));
    assert!(fewest >= 2, "a replacement is up before its drifted node goes (fewest initialized: {fewest})");
    // Scaled to one: the surplus goes.
    {
        let mut api = sim.api.lock();
        let mut pools = api.pools.to_vec();
        pools[0].spec.replicas = Some(1);
        api.set_pools(pools);
    }
    sim.run(Duration::from_secs(10 * 60), STEP).await;
    assert_eq!(sim.live_claims().len(), 1);
}
