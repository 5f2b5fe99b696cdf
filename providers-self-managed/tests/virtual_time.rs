//! The provider's real state machine over an in-memory BMC, in virtual time: deadlines (boot budget,
//! graceful → forced power-off) and the end-to-end autoscaling story through core's simulator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::launched;
use tenon_core::api::{NodeClaim, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator, labels};
use tenon_core::clock::VirtualClock;
use tenon_core::cloud::fake::{FakeCloud, instance_type};
use tenon_core::cloud::{CloudError, CloudProvider, InstanceState, LaunchOptions};
use tenon_core::disruption::queue::{Event, Outcome};
use tenon_core::lifecycle::LEASE_EXPIRES_AT;
use tenon_core::settings::Settings;
use tenon_core::sim::{Sim, pod};
use tenon_self_managed::{
    Bmc, BmcError, BmcTarget, InMemoryBmc, MachinePhase, PowerState, ResetType, SelfManagedProvider, parse_node_class,
};

const INVENTORY: &str = include_str!("../../examples/self-managed/inventory.yaml");
const NODE_POOL: &str = include_str!("../../examples/self-managed/nodepool.yaml");

fn inventory(machines: usize, extra: &str) -> tenon_self_managed::SelfManagedNodeClass {
    let mut yaml = format!(
        "apiVersion: tenon.dev/v1alpha1\nkind: SelfManagedNodeClass\nmetadata: {{name: owned}}\nspec:\n{extra}  machines:\n"
    );
    for n in 0..machines {
        let domain = if n % 2 == 0 { "island-a" } else { "island-b" };
        yaml.push_str(&format!(
            "  - name: h100-{n}\n    domain: {domain}\n    bmc: {{endpoint: \"https://bmc-{n}.example\", systemId: \"sys-{n}\", credentialsRef: bmc}}\n    gpu: {{model: H100-SXM5-80GB, count: 8}}\n    cpu: \"192\"\n    memory: 2Ti\n    pricePerHour: 12.5\n"
        ));
    }
    parse_node_class(&yaml).unwrap()
}

fn claim(name: &str) -> NodeClaim {
    common::claim("owned", name)
}

struct World {
    clock: Arc<VirtualClock>,
    bmc: Arc<InMemoryBmc>,
    provider: Arc<SelfManagedProvider>,
}

fn world(machines: usize, extra: &str) -> World {
    let clock = VirtualClock::at_epoch();
    let bmc = Arc::new(InMemoryBmc::new(clock.clone(), Duration::from_secs(90)));
    let provider = Arc::new(
        SelfManagedProvider::builder()
            .node_class(inventory(machines, extra))
            .credentials("bmc", "admin", "secret")
            .bmc(bmc.clone())
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    World { clock, bmc, provider }
}

#[tokio::test]
async fn a_machine_that_never_powers_on_is_quarantined_after_its_boot_budget_and_its_claim_fails_over() {
    let w = world(2, "  bootBudget: 10m\n");
    w.bmc.never_power_on("sys-0");
    let c = claim("c1");
    let i = w.provider.create(&c, &LaunchOptions::default()).await.unwrap();
    assert_eq!(i.labels.get("tenon.dev/machine").map(String::as_str), Some("h100-0"));
    w.clock.advance(Duration::from_secs(9 * 60));
    assert_eq!(w.provider.get(&i.provider_id).await.unwrap().state, InstanceState::Pending, "within budget");
    w.clock.advance(Duration::from_secs(60));
    assert!(w.provider.get(&i.provider_id).await.unwrap_err().is_not_found(), "the claim loses its machine");
    let m = &w.provider.machines()[0];
    assert!(matches!(&m.phase, MachinePhase::Quarantined { reason } if reason.contains("boot budget")), "{m:?}");
    // The claim's replacement gets the other machine.
    let j = w.provider.create(&claim("c2"), &LaunchOptions::default()).await.unwrap();
    assert_eq!(j.labels.get("tenon.dev/machine").map(String::as_str), Some("h100-1"));
    w.clock.advance(Duration::from_secs(90));
    assert_eq!(w.provider.get(&j.provider_id).await.unwrap().state, InstanceState::Running);
    // An operator releases the repaired machine.
    assert!(w.provider.release_quarantine("h100-0"));
    assert_eq!(w.provider.machines()[0].phase, MachinePhase::Free);
}

#[tokio::test]
async fn an_unreachable_bmc_past_the_boot_budget_quarantines_too() {
    let w = world(1, "  bootBudget: 10m\n");
    let i = w.provider.create(&claim("c1"), &LaunchOptions::default()).await.unwrap();
    w.bmc.set_unreachable("sys-0", true);
    w.clock.advance(Duration::from_secs(5 * 60));
    assert_eq!(w.provider.get(&i.provider_id).await.unwrap().state, InstanceState::Pending);
    w.clock.advance(Duration::from_secs(5 * 60));
    assert!(w.provider.get(&i.provider_id).await.unwrap_err().is_not_found());
    assert!(matches!(w.provider.machines()[0].phase, MachinePhase::Quarantined { .. }));
}

/// A shutdown the OS ignores: graceful first, forced after the timeout, and the machine returns to the
/// pool with a reimage boot set for its next power-on.
#[tokio::test]
async fn power_off_is_graceful_then_forced_after_the_timeout() {
    let w = world(1, "  gracefulShutdownTimeout: 5m\n  forcedShutdownTimeout: 2m\n  reimageOnRelease: true\n");
    w.bmc.ignore_graceful_shutdown("sys-0");
    let c = claim("c1");
    let i = w.provider.create(&c, &LaunchOptions::default()).await.unwrap();
    w.clock.advance(Duration::from_secs(90));
    assert_eq!(w.provider.get(&i.provider_id).await.unwrap().state, InstanceState::Running);
    let c = launched(c, &i.provider_id);
    w.provider.delete(&c).await.unwrap();
    assert_eq!(w.bmc.resets("sys-0"), [ResetType::On, ResetType::GracefulShutdown]);
    assert_eq!(w.provider.get(&i.provider_id).await.unwrap().state, InstanceState::Stopping);
    assert_eq!(w.provider.machines()[0].phase, MachinePhase::Stopping);
    w.clock.advance(Duration::from_secs(4 * 60));
    w.provider.delete(&c).await.unwrap();
    assert_eq!(w.bmc.resets("sys-0").len(), 2, "still within the graceful timeout");
    w.clock.advance(Duration::from_secs(60));
    w.provider.delete(&c).await.unwrap();
    assert_eq!(w.bmc.resets("sys-0"), [ResetType::On, ResetType::GracefulShutdown, ResetType::ForceOff]);
    w.clock.advance(Duration::from_secs(90));
    assert!(w.provider.delete(&c).await.unwrap_err().is_not_found(), "off: back in the pool");
    assert_eq!(w.bmc.power("sys-0"), PowerState::Off);
    assert_eq!(w.provider.machines()[0].phase, MachinePhase::Free);
    assert!(w.provider.delete(&c).await.unwrap_err().is_not_found(), "NotFound once free");
    // The next claim's boot reimages the machine.
    let j = w.provider.create(&claim("c2"), &LaunchOptions::default()).await.unwrap();
    w.clock.advance(Duration::from_secs(90));
    assert_eq!(w.provider.get(&j.provider_id).await.unwrap().state, InstanceState::Running);
    assert_eq!(w.bmc.pxe_boots("sys-0"), 1);
}

#[tokio::test]
async fn a_machine_that_will_not_power_off_is_quarantined() {
    let w = world(1, "  gracefulShutdownTimeout: 5m\n  forcedShutdownTimeout: 2m\n");
    w.bmc.stuck_on("sys-0");
    let c = claim("c1");
    let i = w.provider.create(&c, &LaunchOptions::default()).await.unwrap();
    w.clock.advance(Duration::from_secs(90));
    let c = launched(c, &i.provider_id);
    w.provider.delete(&c).await.unwrap();
    w.clock.advance(Duration::from_secs(5 * 60));
    w.provider.delete(&c).await.unwrap();
    w.clock.advance(Duration::from_secs(2 * 60));
    assert!(w.provider.delete(&c).await.unwrap_err().is_not_found(), "the claim lets go of it");
    let m = &w.provider.machines()[0];
    assert!(matches!(&m.phase, MachinePhase::Quarantined { reason } if reason.contains("forced")), "{m:?}");
    let err = w.provider.create(&claim("c2"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");
}

/// Repair reboots through the BMC until the machine has failed too often; then the reboot is refused (the
/// core replaces the node instead) and the machine leaves the pool when released.
#[tokio::test]
async fn repeated_repairs_quarantine_the_machine() {
    let w = world(1, "  maxFailures: 2\n");
    let c = claim("c1");
    let i = w.provider.create(&c, &LaunchOptions::default()).await.unwrap();
    w.clock.advance(Duration::from_secs(90));
    let c = launched(c, &i.provider_id);
    w.provider.reboot(&c).await.unwrap();
    assert_eq!(w.bmc.resets("sys-0"), [ResetType::On, ResetType::ForceRestart]);
    assert_eq!(w.provider.get(&i.provider_id).await.unwrap().state, InstanceState::Pending, "rebooting");
    w.clock.advance(Duration::from_secs(90));
    assert_eq!(w.provider.get(&i.provider_id).await.unwrap().state, InstanceState::Running);
    let err = w.provider.reboot(&c).await.unwrap_err();
    assert!(err.to_string().contains("quarantined when released"), "{err}");
    w.provider.delete(&c).await.unwrap();
    w.clock.advance(Duration::from_secs(90));
    assert!(w.provider.delete(&c).await.unwrap_err().is_not_found());
    assert!(matches!(w.provider.machines()[0].phase, MachinePhase::Quarantined { .. }));
}

#[test]
fn the_examples_parse() {
    let nc = parse_node_class(INVENTORY).unwrap();
    assert!(nc.spec.machines.len() >= 4);
    let pool = tenon_core::api::parse_node_pool(NODE_POOL).unwrap();
    assert_eq!(pool.annotation(labels::NODECLAIM_REGISTRATION_TIMEOUT), Some("25m"));
    let r = pool.spec.template.spec.node_class_ref.as_ref().unwrap();
    assert_eq!((r.kind.as_str(), r.name.as_str()), ("SelfManagedNodeClass", nc.metadata.name.as_deref().unwrap()));
    assert!(nc.spec.burst.is_some());
}

/// A cloud to burst to: one p5.48xlarge offering in us-east-1a.
fn burst_cloud(clock: &Arc<VirtualClock>) -> Arc<FakeCloud> {
    Arc::new(
        FakeCloud::builder()
            .name("cloud")
            .node_class("karpenter.k8s.aws", "EC2NodeClass")
            .catalog(vec![instance_type("p5.48xlarge", 192, 2048, 8, &["us-east-1a"], 98.32, 40.0)])
            .clock(clock.clone())
            .build(),
    )
}

/// A provider over `machines` owned machines that bursts to `cloud` under a 30-minute lease when full.
fn bursting_provider(
    machines: usize,
    clock: &Arc<VirtualClock>,
    bmc: &Arc<InMemoryBmc>,
    cloud: &Arc<FakeCloud>,
) -> SelfManagedProvider {
    let burst =
        "  burst:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: gpu-burst}\n    lease: 30m\n";
    SelfManagedProvider::builder()
        .node_class(inventory(machines, burst))
        .credentials("bmc", "admin", "secret")
        .bmc(bmc.clone())
        .burst(cloud.clone())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The whole story in virtual time, with the real controllers (core's simulator) over the provider and an
/// in-memory BMC, and FakeCloud as the burst cloud: pending GPU pods power machines on, their nodes
/// register (slowly: 18 minutes, inside the pool's 25-minute registration timeout) and the pods run; a
/// third pod finds the owned fleet full and bursts to the cloud under a lease; an owned machine frees up
/// and the cloud node is reclaimed onto it; the fleet shrinks and the machines power off.
#[tokio::test]
async fn owned_machines_serve_pods_burst_to_the_cloud_when_full_and_reclaim_the_burst() {
    const STEP: Duration = Duration::from_secs(10);
    let clock = VirtualClock::at_epoch();
    let bmc = Arc::new(InMemoryBmc::new(clock.clone(), Duration::from_secs(90)));
    let cloud = burst_cloud(&clock);
    let provider = Arc::new(bursting_provider(2, &clock, &bmc, &cloud));
    let mut pool = NodePool::new("gpu", NodePoolSpec::default());
    pool.spec.template.spec.node_class_ref = Some(common::class_ref("owned"));
    pool.spec.disruption.budgets[0].nodes = "100%".into();
    pool.metadata.annotations = Some([(labels::NODECLAIM_REGISTRATION_TIMEOUT.to_owned(), "25m".to_owned())].into());
    let mut sim = Sim::new(clock.clone(), provider.clone(), vec![pool], Settings::default());
    sim.kubelet.registration_delay_by_family.insert("h100-sxm5-80gb-8x".into(), Duration::from_secs(18 * 60));
    let running = |p: &SelfManagedProvider| p.machines().iter().filter(|m| m.phase == MachinePhase::Running).count();

    // Two 8-GPU pods: both machines power on, register after 18 minutes, and run them.
    sim.add_pod(pod("train-0", "16", 8));
    sim.add_pod(pod("train-1", "16", 8));
    sim.run(Duration::from_secs(25 * 60), STEP).await;
    assert!(sim.pending().is_empty(), "{:?}", sim.pending());
    assert_eq!(running(&provider), 2);
    assert_eq!((bmc.power("sys-0"), bmc.power("sys-1")), (PowerState::On, PowerState::On));
    assert_eq!(sim.runtime.lifecycle.counters.registration_timeouts, 0, "the pool's 25m timeout covers the slow boot");
    assert!(cloud.instances().is_empty(), "no burst while owned machines are free");
    assert!(sim.live_claims().iter().all(|c| c.label(labels::CAPACITY_TYPE) == Some("reserved")));

    // A third: the owned fleet is full, so it bursts to the cloud, on-demand, under a lease.
    sim.add_pod(pod("train-2", "16", 8));
    sim.run(Duration::from_secs(10 * 60), STEP).await;
    assert!(sim.pending().is_empty(), "{:?}", sim.pending());
    let burst_claims: Vec<_> =
        sim.live_claims().into_iter().filter(|c| c.label(labels::INSTANCE_TYPE) == Some("p5.48xlarge")).collect();
    assert_eq!(burst_claims.len(), 1);
    assert_eq!(burst_claims[0].label(labels::CAPACITY_TYPE), Some("on-demand"));
    assert!(burst_claims[0].annotation(LEASE_EXPIRES_AT).is_some(), "the burst node carries a lease");
    assert_eq!(cloud.instances().len(), 1);
    let burst_name = burst_claims[0].name().to_owned();

    // An owned machine frees up: the cloud node is reclaimed onto owned capacity. The replacement boots as
    // slowly as the first two (18 minutes); the disruption queue waits for it as long as the pool's
    // registration timeout allows instead of rolling the command back.
    sim.remove_pod("default/train-0");
    sim.run(Duration::from_secs(60 * 60), STEP).await;
    assert!(
        sim.events.iter().any(|(_, e)| matches!(e, Event::Finished(Outcome::Completed { claims, replacements })
            if claims.as_slice() == [burst_name.as_str()] && replacements.len() == 1)),
        "the burst claim was replaced, not just deleted: {:?}",
        sim.events
    );
    assert!(sim.pending().is_empty(), "{:?}", sim.pending());
    assert!(cloud.instances().is_empty(), "the burst node is gone");
    assert_eq!(running(&provider), 2, "{:?}", provider.machines());
    assert!(sim.live_claims().iter().all(|c| c.label(labels::CAPACITY_TYPE) == Some("reserved")));

    // The fleet shrinks to nothing: the machines power off and return to the pool.
    sim.remove_pod("default/train-1");
    sim.remove_pod("default/train-2");
    sim.run(Duration::from_secs(20 * 60), STEP).await;
    assert!(sim.live_claims().is_empty());
    assert!(provider.machines().iter().all(|m| m.phase == MachinePhase::Free), "{:?}", provider.machines());
    assert_eq!((bmc.power("sys-0"), bmc.power("sys-1")), (PowerState::Off, PowerState::Off));
}

/// A machine's own labels (a rack, a team) narrow which machine a claim gets, though the class's instance
/// type leaves them open because its machines differ.
#[tokio::test]
async fn a_claim_requiring_a_machine_label_gets_a_machine_with_that_label() {
    let mut yaml = String::from(
        "apiVersion: tenon.dev/v1alpha1\nkind: SelfManagedNodeClass\nmetadata: {name: owned}\nspec:\n  machines:\n",
    );
    for (n, rack) in [(0, "r1"), (1, "r2"), (2, "r1")] {
        yaml.push_str(&format!(
            "  - name: h100-{n}\n    domain: island-a\n    bmc: {{endpoint: \"https://bmc-{n}.example\", systemId: \"sys-{n}\", credentialsRef: bmc}}\n    gpu: {{model: H100-SXM5-80GB, count: 8}}\n    cpu: \"192\"\n    memory: 2Ti\n    pricePerHour: 12.5\n    labels: {{rack: {rack}}}\n"
        ));
    }
    let clock = VirtualClock::at_epoch();
    let provider = SelfManagedProvider::builder()
        .node_class(parse_node_class(&yaml).unwrap())
        .credentials("bmc", "admin", "secret")
        .bmc(Arc::new(InMemoryBmc::new(clock.clone(), Duration::from_secs(90))))
        .clock(clock)
        .build()
        .unwrap();
    // The class's instance type does not fix the rack: its machines differ.
    let types = provider.instance_types(&NodePool::new("gpu", NodePoolSpec::default())).await.unwrap();
    assert_eq!(types.len(), 1);
    assert_eq!(types[0].label("rack"), None);

    let on_rack = |name: &str, rack: &str| {
        let mut c = claim(name);
        c.spec.requirements = vec![NodeSelectorRequirement::new("rack", Operator::In, [rack])];
        c
    };
    let machine = |i: &tenon_core::cloud::Instance| i.labels.get("tenon.dev/machine").cloned();
    let a = provider.create(&on_rack("a", "r2"), &LaunchOptions::default()).await.unwrap();
    assert_eq!(machine(&a).as_deref(), Some("h100-1"), "the first free machine is on r1; the claim asked for r2");
    assert_eq!(a.labels.get("rack").map(String::as_str), Some("r2"));
    // r2 has no machine left; r1 has two.
    let err = provider.create(&on_rack("b", "r2"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");
    let b = provider.create(&on_rack("c", "r1"), &LaunchOptions::default()).await.unwrap();
    assert_eq!(machine(&b).as_deref(), Some("h100-0"));
    // A claim that does not ask for a rack takes any free machine.
    let c = provider.create(&claim("d"), &LaunchOptions::default()).await.unwrap();
    assert_eq!(machine(&c).as_deref(), Some("h100-2"));
}

/// A BMC whose power reads, once armed, wait until `parties` of them are in flight at once.
#[derive(Debug)]
struct SideBySide {
    inner: Arc<InMemoryBmc>,
    armed: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Barrier,
}

#[async_trait::async_trait]
impl Bmc for SideBySide {
    async fn power_state(&self, target: &BmcTarget) -> Result<PowerState, BmcError> {
        if self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            self.gate.wait().await;
        }
        self.inner.power_state(target).await
    }
    async fn reset(&self, target: &BmcTarget, reset: ResetType) -> Result<(), BmcError> {
        self.inner.reset(target, reset).await
    }
    async fn set_pxe_boot_once(&self, target: &BmcTarget) -> Result<(), BmcError> {
        self.inner.set_pxe_boot_once(target).await
    }
}

/// Listing reads the machines' BMCs side by side: with reads that only finish once all three are in
/// flight, a listing that read one BMC after another would never end.
#[tokio::test(start_paused = true)]
async fn listing_reads_the_bmcs_side_by_side() {
    let clock = VirtualClock::at_epoch();
    let inner = Arc::new(InMemoryBmc::new(clock.clone(), Duration::from_secs(90)));
    let bmc = Arc::new(SideBySide {
        inner,
        armed: std::sync::atomic::AtomicBool::new(false),
        gate: tokio::sync::Barrier::new(3),
    });
    let provider = SelfManagedProvider::builder()
        .node_class(inventory(3, ""))
        .credentials("bmc", "admin", "secret")
        .bmc(bmc.clone())
        .clock(clock)
        .build()
        .unwrap();
    for name in ["a", "b", "c"] {
        provider.create(&claim(name), &LaunchOptions::default()).await.unwrap();
    }
    bmc.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    // Paused tokio time moves on by itself once every task waits, so a stuck listing fails at once.
    let listed = tokio::time::timeout(Duration::from_secs(60), provider.list()).await;
    let instances = listed.expect("the listing waited on one BMC at a time").unwrap();
    let mut machines: Vec<_> = instances.iter().filter_map(|i| i.labels.get("tenon.dev/machine").cloned()).collect();
    machines.sort();
    assert_eq!(machines, ["h100-0", "h100-1", "h100-2"]);
}

/// After a restart the provider knows no claim; the operator hands it the NodeClaims it finds, and the
/// machines they hold are theirs again (a machine found off is released, and its claim's instance gone).
#[tokio::test]
async fn a_restarted_provider_adopts_the_machines_its_claims_hold() {
    let w = world(4, "");
    let mut claims = Vec::new();
    for name in ["a", "b"] {
        let c = claim(name);
        let i = w.provider.create(&c, &LaunchOptions::default()).await.unwrap();
        claims.push(launched(c, &i.provider_id));
    }
    w.clock.advance(Duration::from_secs(90));
    // A claim naming a machine that is off: the restart happened while it was being powered down.
    claims.push(launched(claim("c"), &tenon_self_managed::provider_id("owned", "h100-3")));

    let restarted = SelfManagedProvider::builder()
        .node_class(inventory(4, ""))
        .credentials("bmc", "admin", "secret")
        .bmc(w.bmc.clone())
        .clock(w.clock.clone())
        .build()
        .unwrap();
    let pid = |c: &NodeClaim| c.provider_id().unwrap().to_owned();
    assert!(restarted.get(&pid(&claims[0])).await.unwrap_err().is_not_found(), "nothing is known before adopting");

    // The runtime reaches it through the trait, on its first step after a restart.
    let as_provider: &dyn CloudProvider = &restarted;
    as_provider.adopt(&claims[..1]).await.unwrap();
    assert!(restarted.get(&pid(&claims[0])).await.is_ok(), "adopted through the trait");
    let adopted = restarted.adopt(&claims);
    assert_eq!(adopted, tenon_self_managed::Adopted { machines: 2, burst: 0 });
    assert_eq!(restarted.adopt(&claims), tenon_self_managed::Adopted::default(), "adopting twice takes nothing");
    let a = restarted.get(&pid(&claims[0])).await.unwrap();
    assert_eq!((a.state, a.node_claim.as_deref()), (InstanceState::Running, Some("a")));
    assert!(restarted.get(&pid(&claims[2])).await.unwrap_err().is_not_found(), "h100-3 is off: released");
    let mut listed: Vec<_> = restarted.list().await.unwrap().into_iter().map(|i| i.node_claim.unwrap()).collect();
    listed.sort();
    assert_eq!(listed, ["a", "b"]);
    // A new claim gets a machine nobody holds, not one an adopted claim runs on.
    let d = restarted.create(&claim("d"), &LaunchOptions::default()).await.unwrap();
    assert!(["h100-2", "h100-3"].contains(&d.labels["tenon.dev/machine"].as_str()), "{:?}", d.labels);
}

/// A burst instance is known again after a restart with the lease its claim's annotations record.
#[tokio::test]
async fn a_restarted_provider_adopts_its_burst_instances_with_their_leases() {
    let clock = VirtualClock::at_epoch();
    let bmc = Arc::new(InMemoryBmc::new(clock.clone(), Duration::from_secs(90)));
    let cloud = burst_cloud(&clock);
    let build = || bursting_provider(1, &clock, &bmc, &cloud);
    let provider = build();
    let owned = claim("owned");
    let i = provider.create(&owned, &LaunchOptions::default()).await.unwrap();
    let owned = launched(owned, &i.provider_id);
    let stand_in = claim("stand-in");
    let b = provider.create(&stand_in, &LaunchOptions::default()).await.unwrap();
    let lease = b.lease.clone().expect("a burst instance runs under a lease");
    let mut stand_in = launched(stand_in, &b.provider_id);
    stand_in.metadata.annotations = Some(
        [
            (LEASE_EXPIRES_AT.to_owned(), lease.expires_at.to_string()),
            (tenon_core::lifecycle::LEASE_REASON.to_owned(), lease.reason.clone()),
        ]
        .into(),
    );

    let restarted = build();
    assert_eq!(restarted.get(&b.provider_id).await.unwrap().lease, None, "the lease is not known before adopting");
    let adopted = restarted.adopt(&[owned, stand_in]);
    assert_eq!(adopted, tenon_self_managed::Adopted { machines: 1, burst: 1 });
    assert_eq!(restarted.get(&b.provider_id).await.unwrap().lease, Some(lease));
}
