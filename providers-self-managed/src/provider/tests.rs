//! [`SelfManagedProvider::reload`] over the in-memory BMC, in virtual time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Once};
use std::time::Duration;

use tenon_core::api::{
    NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassRef, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator,
    labels,
};
use tenon_core::clock::VirtualClock;
use tenon_core::cloud::fake::{FakeCloud, instance_type};
use tenon_core::cloud::{CapacityType, CloudError, CloudProvider, InstanceState, LaunchOptions};

use super::{Credentials, MachinePhase, MachineStatus, Reloaded, SelfManagedProvider};
use crate::bmc::{InMemoryBmc, ResetType};
use crate::inventory::{GROUP, InventoryError, KIND, SelfManagedNodeClass, parse_node_class};

/// A NodeClass `name` with `machines` as (name, domain), each an 8-GPU H100 whose BMC system id is
/// `sys-<name>` and whose credentials are `bmc`; `extra` is more of the spec, indented by two spaces.
fn class(name: &str, extra: &str, machines: &[(&str, &str)]) -> SelfManagedNodeClass {
    let mut yaml = format!(
        "apiVersion: tenon.dev/v1alpha1\nkind: SelfManagedNodeClass\nmetadata: {{name: {name}}}\nspec:\n{extra}  machines:\n"
    );
    for (m, domain) in machines {
        yaml.push_str(&format!(
            "  - name: {m}\n    domain: {domain}\n    bmc: {{endpoint: \"https://bmc-{m}.example\", systemId: \"sys-{m}\", credentialsRef: bmc}}\n    gpu: {{model: H100-SXM5-80GB, count: 8}}\n    cpu: \"192\"\n    memory: 2Ti\n    pricePerHour: 12.5\n"
        ));
    }
    parse_node_class(&yaml).unwrap()
}

fn owned(extra: &str, machines: &[(&str, &str)]) -> SelfManagedNodeClass {
    class("owned", extra, machines)
}

fn credentials(names: &[&str]) -> HashMap<String, Credentials> {
    names.iter().map(|n| ((*n).to_owned(), Credentials::new("admin", "secret"))).collect()
}

fn class_ref(class: &str) -> NodeClassRef {
    NodeClassRef { group: GROUP.into(), kind: KIND.into(), name: class.into() }
}

/// An unlaunched claim `name` on `class`, with a UID of its own.
fn claim_on(class: &str, name: &str) -> NodeClaim {
    let mut c = NodeClaim::new(name, NodeClaimSpec { node_class_ref: Some(class_ref(class)), ..Default::default() });
    c.metadata.uid = Some(format!("uid-{class}-{name}"));
    c
}

fn claim(name: &str) -> NodeClaim {
    claim_on("owned", name)
}

/// `c` as launched onto the instance `pid`.
fn launched(mut c: NodeClaim, pid: &str) -> NodeClaim {
    c.status = Some(NodeClaimStatus { provider_id: Some(pid.to_owned()), ..Default::default() });
    c
}

fn pool(class: &str) -> NodePool {
    let mut p = NodePool::new("gpu", NodePoolSpec::default());
    p.spec.template.spec.node_class_ref = Some(class_ref(class));
    p
}

struct World {
    clock: Arc<VirtualClock>,
    bmc: Arc<InMemoryBmc>,
    provider: SelfManagedProvider,
}

/// A provider over `classes` with the credentials `bmc` and `spare-bmc`, on an in-memory BMC whose power
/// changes take 90 s of virtual time.
fn world(classes: Vec<SelfManagedNodeClass>) -> World {
    let clock = VirtualClock::at_epoch();
    let bmc = Arc::new(InMemoryBmc::new(clock.clone(), Duration::from_secs(90)));
    let mut builder = SelfManagedProvider::builder()
        .credentials("bmc", "admin", "secret")
        .credentials("spare-bmc", "admin", "secret")
        .bmc(bmc.clone())
        .clock(clock.clone());
    for c in classes {
        builder = builder.node_class(c);
    }
    World { clock, bmc, provider: builder.build().unwrap() }
}

impl World {
    fn machine(&self, name: &str) -> Option<MachineStatus> {
        self.provider.machines().into_iter().find(|m| m.name == name)
    }

    fn names(&self) -> Vec<String> {
        self.provider.machines().into_iter().map(|m| m.name).collect()
    }

    /// Launches `c` and returns it as launched, with the machine it got.
    async fn launch(&self, c: NodeClaim) -> (NodeClaim, String) {
        let i = self.provider.create(&c, &LaunchOptions::default()).await.unwrap();
        let machine = i.labels["tenon.dev/machine"].clone();
        (launched(c, &i.provider_id), machine)
    }

    /// Launches `c` and lets its machine come on.
    async fn run(&self, c: NodeClaim) -> (NodeClaim, String) {
        let (c, machine) = self.launch(c).await;
        self.clock.advance(Duration::from_secs(90));
        let pid = c.provider_id().unwrap().to_owned();
        assert_eq!(self.provider.get(&pid).await.unwrap().state, InstanceState::Running);
        (c, machine)
    }

    /// Deletes `c` until its machine is released, letting each power-off take effect.
    async fn release(&self, c: &NodeClaim) {
        for _ in 0..10 {
            match self.provider.delete(c).await {
                Ok(()) => self.clock.advance(Duration::from_secs(90)),
                Err(e) if e.is_not_found() => return,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{} was not released", c.name());
    }

    fn reload(&self, classes: Vec<SelfManagedNodeClass>) -> Result<Reloaded, InventoryError> {
        self.provider.reload(classes, credentials(&["bmc", "spare-bmc"]))
    }
}

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// The error [`SelfManagedProvider::builder`] gives for `classes`.
fn build_error(classes: Vec<SelfManagedNodeClass>) -> InventoryError {
    let clock = VirtualClock::at_epoch();
    let mut builder = SelfManagedProvider::builder().bmc(Arc::new(InMemoryBmc::new(clock, Duration::ZERO)));
    for c in classes {
        builder = builder.node_class(c);
    }
    builder.build().unwrap_err()
}

#[tokio::test]
async fn an_invalid_reload_fails_as_build_fails_and_changes_nothing() {
    let w = world(vec![owned("  bootBudget: 10m\n", &[("m0", "a"), ("m1", "b")])]);
    let (_, held) = w.launch(claim("c0")).await;
    assert_eq!(held, "m0");
    let before = w.provider.machines();
    let types_before = w.provider.instance_types(&pool("owned")).await.unwrap();

    // A valid change (a new machine, a new budget) next to an invalid NodeClass: none of it applies.
    let grown = owned("  bootBudget: 30m\n", &[("m0", "b"), ("m1", "b"), ("m2", "a")]);
    let mut bad_cpu = class("spare", "", &[("s0", "a")]);
    bad_cpu.spec.machines[0].cpu = "lots".into();
    let twice = vec![grown.clone(), grown.clone()];
    let shared = vec![grown.clone(), class("spare", "", &[("m2", "a")])];
    let cases = [
        (vec![grown.clone(), bad_cpu], "SelfManagedNodeClass/spare", "spec.machines[0].cpu"),
        (twice, "SelfManagedNodeClass/owned", "metadata.name"),
        (shared, "SelfManagedNodeClass/spare", "spec.machines"),
    ];
    for (classes, object, field) in cases {
        let e = w.provider.reload(classes.clone(), HashMap::new()).unwrap_err();
        assert_eq!((e.object.as_str(), e.field.as_str()), (object, field), "{e}");
        assert_eq!(e, build_error(classes), "reload and build validate alike");
        assert_eq!(w.provider.machines(), before, "{e}: the machines are unchanged");
        assert_eq!(w.provider.instance_types(&pool("owned")).await.unwrap(), types_before, "{e}");
    }
    // The policies and credentials are unchanged too: the old boot budget holds, and m1 still launches.
    w.bmc.never_power_on("sys-m0");
    w.clock.advance(Duration::from_secs(10 * 60));
    let pid = crate::provider_id("owned", "m0");
    assert!(w.provider.get(&pid).await.unwrap_err().is_not_found(), "the 10m boot budget still applies");
    let (_, next) = w.launch(claim("c1")).await;
    assert_eq!(next, "m1", "the credentials are still given");
}

#[tokio::test]
async fn free_and_quarantined_machines_take_their_new_spec_at_once() {
    let w = world(vec![owned("", &[("m0", "a"), ("m1", "a"), ("m2", "a")])]);
    assert!(w.provider.quarantine("m1", "maintenance"));
    let r = w.reload(vec![owned("", &[("m0", "b"), ("m1", "b"), ("m2", "a")])]).unwrap();
    assert_eq!(r, Reloaded { updated: names(&["m0", "m1"]), ..Reloaded::default() });

    let m0 = w.machine("m0").unwrap();
    assert_eq!((m0.domain.as_str(), m0.phase), ("b", MachinePhase::Free));
    let m1 = w.machine("m1").unwrap();
    assert_eq!(m1.domain, "b");
    assert_eq!(m1.phase, MachinePhase::Quarantined { reason: "maintenance".into() }, "it stays quarantined");
    // A launch gets the new spec.
    let i = w.provider.create(&claim("c0"), &LaunchOptions::default()).await.unwrap();
    assert_eq!((i.labels["tenon.dev/machine"].as_str(), i.zone.as_str()), ("m0", "b"));
}

/// A machine held by a claim, whether launching, running or powering off, keeps its spec until the
/// claim releases it; then the new spec applies.
#[tokio::test]
async fn held_machines_keep_their_spec_until_released() {
    let w = world(vec![owned("", &[("m0", "a"), ("m1", "a"), ("m2", "a"), ("m3", "a")])]);
    let (running, m0) = w.launch(claim("running")).await;
    let (stopping, m1) = w.launch(claim("stopping")).await;
    w.clock.advance(Duration::from_secs(90));
    assert_eq!(w.provider.get(running.provider_id().unwrap()).await.unwrap().state, InstanceState::Running);
    w.provider.delete(&stopping).await.unwrap();
    let (launching, m2) = w.launch(claim("launching")).await;
    assert_eq!((m0.as_str(), m1.as_str(), m2.as_str()), ("m0", "m1", "m2"));
    let phase = |m: &str| w.machine(m).unwrap().phase;
    assert_eq!((phase("m1"), phase("m2")), (MachinePhase::Stopping, MachinePhase::Launching));

    let moved = owned("", &[("m0", "b"), ("m1", "b"), ("m2", "b"), ("m3", "a")]);
    let r = w.reload(vec![moved.clone()]).unwrap();
    assert_eq!(r, Reloaded { deferred: names(&["m0", "m1", "m2"]), ..Reloaded::default() });
    assert_eq!(w.reload(vec![moved]).unwrap(), Reloaded::default(), "the same change again changes nothing");
    for m in ["m0", "m1", "m2"] {
        assert_eq!(w.machine(m).unwrap().domain, "a", "{m} keeps its spec while held");
    }
    assert_eq!(
        (phase("m0"), phase("m1"), phase("m2")),
        (MachinePhase::Running, MachinePhase::Stopping, MachinePhase::Launching)
    );
    let pid = |c: &NodeClaim| c.provider_id().unwrap().to_owned();
    assert_eq!(w.provider.get(&pid(&running)).await.unwrap().zone, "a");
    // A machine powering off back to the pool in another domain is not coming back to this one: with
    // m3 taken, a claim for domain a finds nothing, not "wait for m1".
    let (_, m3) = w.launch(claim("c3")).await;
    assert_eq!(m3, "m3");
    let mut in_a = claim("in-a");
    in_a.spec.requirements = vec![NodeSelectorRequirement::new(labels::ZONE, Operator::In, ["a"])];
    let err = w.provider.create(&in_a, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");

    for (c, m) in [(&stopping, "m1"), (&running, "m0"), (&launching, "m2")] {
        w.release(c).await;
        let status = w.machine(m).unwrap();
        assert_eq!(
            (status.domain.as_str(), status.phase),
            ("b", MachinePhase::Free),
            "{m} takes its new spec on release"
        );
    }
    let types = w.provider.instance_types(&pool("owned")).await.unwrap();
    let b = types[0].offering("b", CapacityType::Reserved).unwrap();
    assert_eq!(b.reservation_capacity, Some(3));
}

#[tokio::test]
async fn removed_machines_are_dropped_at_once_when_free_and_on_release_when_held() {
    let w = world(vec![owned("", &[("m0", "a"), ("m1", "a"), ("m2", "a"), ("m3", "a")])]);
    let (held, _) = w.run(claim("c0")).await;
    assert!(w.provider.quarantine("m3", "maintenance"));

    let r = w.reload(vec![owned("", &[("m2", "a"), ("m4", "a")])]).unwrap();
    assert_eq!(
        r,
        Reloaded {
            added: names(&["m4"]),
            removed: names(&["m1", "m3"]),
            deferred: names(&["m0"]),
            ..Reloaded::default()
        }
    );
    assert_eq!(w.names(), ["m2", "m4", "m0"], "the held machine stays until released");
    assert_eq!(w.machine("m4").unwrap().phase, MachinePhase::Free, "a new machine joins free");
    let pid = held.provider_id().unwrap().to_owned();
    assert_eq!(w.provider.get(&pid).await.unwrap().state, InstanceState::Running, "and keeps working");
    assert_eq!(w.provider.list().await.unwrap().len(), 1);

    // The free ones are taken; m0 powers off, but out of the inventory, so it is not coming back.
    let (_, a) = w.launch(claim("c2")).await;
    let (_, b) = w.launch(claim("c4")).await;
    assert_eq!((a.as_str(), b.as_str()), ("m2", "m4"));
    w.provider.delete(&held).await.unwrap();
    assert_eq!(w.machine("m0").unwrap().phase, MachinePhase::Stopping);
    let err = w.provider.create(&claim("c5"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "not LaunchDeferred: {err}");
    let types = w.provider.instance_types(&pool("owned")).await.unwrap();
    assert!(!types[0].offering("a", CapacityType::Reserved).unwrap().available);

    w.release(&held).await;
    assert_eq!(w.names(), ["m2", "m4"], "dropped instead of returning to the pool");
}

#[tokio::test]
async fn policies_and_credentials_are_live() {
    let w = world(vec![owned(
        "  bootBudget: 10m\n  gracefulShutdownTimeout: 5m\n",
        &[("m0", "a"), ("m1", "a"), ("m2", "a")],
    )]);
    w.bmc.ignore_graceful_shutdown("sys-m0");
    let (held, _) = w.run(claim("c0")).await;

    let r = w
        .reload(vec![owned(
            "  bootBudget: 30m\n  gracefulShutdownTimeout: 1m\n  pxeBoot: true\n",
            &[("m0", "a"), ("m1", "a"), ("m2", "a")],
        )])
        .unwrap();
    assert_eq!(r, Reloaded { node_classes: names(&["owned"]), ..Reloaded::default() });

    // The held machine's power-off follows the new graceful timeout: forced after 1m, not 5m.
    w.provider.delete(&held).await.unwrap();
    w.clock.advance(Duration::from_secs(60));
    w.provider.delete(&held).await.unwrap();
    assert_eq!(w.bmc.resets("sys-m0"), [ResetType::On, ResetType::GracefulShutdown, ResetType::ForceOff]);

    // A launch gets the new boot budget and the PXE boot.
    w.bmc.never_power_on("sys-m1");
    let (slow, m) = w.launch(claim("slow")).await;
    assert_eq!(m, "m1");
    w.clock.advance(Duration::from_secs(15 * 60));
    let pid = slow.provider_id().unwrap().to_owned();
    assert_eq!(w.provider.get(&pid).await.unwrap().state, InstanceState::Pending, "within the 30m budget");
    let (_, m) = w.run(claim("pxe")).await;
    assert_eq!(m, "m2");
    assert_eq!(w.bmc.pxe_boots("sys-m2"), 1);

    // Credentials: without `bmc`, a launch cannot reach its BMC; with them back, it can.
    w.release(&held).await;
    let classes = || {
        vec![owned(
            "  bootBudget: 30m\n  gracefulShutdownTimeout: 1m\n  pxeBoot: true\n",
            &[("m0", "a"), ("m1", "a"), ("m2", "a")],
        )]
    };
    let r = w.provider.reload(classes(), HashMap::new()).unwrap();
    assert_eq!(r, Reloaded { credentials: names(&["bmc", "spare-bmc"]), ..Reloaded::default() });
    let err = w.provider.create(&claim("c3"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(&err, CloudError::NodeClassNotReady(m) if m.contains("credentials")), "{err}");
    let mut given = credentials(&["bmc"]);
    given.insert("bmc".into(), Credentials::new("root", "rotated"));
    let r = w.provider.reload(classes(), given).unwrap();
    assert_eq!(r, Reloaded { credentials: names(&["bmc"]), ..Reloaded::default() });
    let (_, m) = w.launch(claim("c3")).await;
    assert_eq!(m, "m0");
}

/// A NodeClass left out of the inventory is no longer served, but the machine a claim holds keeps its
/// last policy and credentials until it is released, and is then dropped.
#[tokio::test]
async fn a_removed_node_class_is_not_served_but_its_held_machines_keep_working() {
    let mut spare = class("spare", "  gracefulShutdownTimeout: 1m\n", &[("s0", "a"), ("s1", "a")]);
    for m in &mut spare.spec.machines {
        m.bmc.credentials_ref = "spare-bmc".into();
    }
    let w = world(vec![owned("", &[("m0", "a")]), spare]);
    w.bmc.ignore_graceful_shutdown("sys-s0");
    let (held, s0) = w.run(claim_on("spare", "c0")).await;
    assert_eq!(s0, "s0");

    let r = w.provider.reload(vec![owned("", &[("m0", "a")])], credentials(&["bmc"])).unwrap();
    assert_eq!(
        r,
        Reloaded {
            removed: names(&["s1"]),
            deferred: names(&["s0"]),
            node_classes: names(&["spare"]),
            credentials: names(&["spare-bmc"]),
            ..Reloaded::default()
        }
    );
    let err = w.provider.create(&claim_on("spare", "c1"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(&err, CloudError::NodeClassNotReady(m) if m.contains("not in the inventory")), "{err}");
    let err = w.provider.instance_types(&pool("spare")).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(_)), "{err}");
    // The only NodeClass left serves pools that name none.
    assert!(w.provider.instance_types(&NodePool::new("any", NodePoolSpec::default())).await.is_ok());

    // s0 still answers, with the credentials no longer given, and powers off under spare's 1m timeout.
    let pid = held.provider_id().unwrap().to_owned();
    assert_eq!(w.provider.get(&pid).await.unwrap().state, InstanceState::Running);
    w.provider.delete(&held).await.unwrap();
    w.clock.advance(Duration::from_secs(60));
    w.provider.delete(&held).await.unwrap();
    assert_eq!(w.bmc.resets("sys-s0"), [ResetType::On, ResetType::GracefulShutdown, ResetType::ForceOff]);
    w.release(&held).await;
    assert_eq!(w.names(), ["m0"]);
}

#[tokio::test]
async fn a_reloaded_burst_must_be_served_by_the_burst_provider_of_the_build() {
    let burst = "  burst:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: gpu-burst}\n";
    // No burst provider: a class that bursts is refused, as build refuses it.
    let w = world(vec![owned("", &[("m0", "a")])]);
    let e = w.reload(vec![owned(burst, &[("m0", "a")])]).unwrap_err();
    assert_eq!(e.field, "spec.burst.nodeClassRef");
    assert_eq!(e, build_error(vec![owned(burst, &[("m0", "a")])]));

    // With one, the reloaded class bursts through it when the owned fleet is full.
    let clock = VirtualClock::at_epoch();
    let cloud = Arc::new(
        FakeCloud::builder()
            .name("cloud")
            .node_class("karpenter.k8s.aws", "EC2NodeClass")
            .catalog(vec![instance_type("p5.48xlarge", 192, 2048, 8, &["us-east-1a"], 98.32, 40.0)])
            .clock(clock.clone())
            .build(),
    );
    let provider = SelfManagedProvider::builder()
        .node_class(owned("", &[("m0", "a")]))
        .credentials("bmc", "admin", "secret")
        .bmc(Arc::new(InMemoryBmc::new(clock.clone(), Duration::from_secs(90))))
        .burst(cloud.clone())
        .clock(clock)
        .build()
        .unwrap();
    provider.create(&claim("c0"), &LaunchOptions::default()).await.unwrap();
    let err = provider.create(&claim("c1"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "no burst configured yet: {err}");
    let r = provider.reload(vec![owned(burst, &[("m0", "a")])], credentials(&["bmc"])).unwrap();
    assert_eq!(r.node_classes, ["owned"]);
    let i = provider.create(&claim("c1"), &LaunchOptions::default()).await.unwrap();
    assert!(i.lease.is_some(), "a burst instance under a lease");
    assert_eq!(cloud.instances().len(), 1);
}

thread_local! {
    /// The messages of the events logged on this thread while [`summaries`] captures them.
    static CAPTURED: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// The test binary's global subscriber: it records the messages of events on threads that capture them.
/// Global, because a callsite's interest is shared by all threads: a subscriber set for one thread only
/// misses events whose callsite another thread (another test) registered first.
struct Capture;

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.0 = format!("{value:?}");
                }
            }
        }
        CAPTURED.with(|captured| {
            if let Some(messages) = captured.borrow_mut().as_mut() {
                let mut message = String::new();
                event.record(&mut Message(&mut message));
                messages.push(message);
            }
        });
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The reload summaries logged on this thread while `f` runs.
fn summaries<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| tracing::subscriber::set_global_default(Capture).unwrap());
    // Callsites registered before the subscriber was installed are enabled now.
    tracing::callsite::rebuild_interest_cache();
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let out = f();
    let messages = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, messages.into_iter().filter(|m| m.starts_with("inventory reloaded")).collect())
}

#[tokio::test]
async fn a_reload_says_what_changed_and_logs_one_line_only_when_something_did() {
    let w = world(vec![owned("", &[("m0", "a"), ("m1", "a"), ("m2", "a")])]);
    let (held, _) = w.run(claim("c0")).await;
    assert_eq!(w.machine("m0").unwrap().phase, MachinePhase::Running);

    let (r, logged) = summaries(|| w.reload(vec![owned("", &[("m0", "a"), ("m1", "a"), ("m2", "a")])]).unwrap());
    assert!(r.is_empty(), "{r:?}");
    assert_eq!(r.to_string(), "no change");
    assert!(logged.is_empty(), "nothing is logged when nothing changed: {logged:?}");

    let (r, logged) = summaries(|| w.reload(vec![owned("", &[("m1", "b"), ("m2", "a"), ("m3", "a")])]).unwrap());
    let expected =
        Reloaded { added: names(&["m3"]), updated: names(&["m1"]), deferred: names(&["m0"]), ..Reloaded::default() };
    assert_eq!(r, expected);
    assert_eq!(r.to_string(), "added: m3; updated: m1; deferred until release: m0");
    assert_eq!(logged, ["inventory reloaded: added: m3; updated: m1; deferred until release: m0"]);

    // Putting the held machine back withdraws its removal: it returns to the pool when released.
    let (r, logged) =
        summaries(|| w.reload(vec![owned("", &[("m0", "a"), ("m1", "b"), ("m2", "a"), ("m3", "a")])]).unwrap());
    assert_eq!(r, Reloaded { deferred: names(&["m0"]), ..Reloaded::default() });
    assert_eq!(logged.len(), 1);
    w.release(&held).await;
    assert_eq!(w.machine("m0").unwrap().phase, MachinePhase::Free);
}

#[tokio::test]
async fn offerings_follow_a_reload_at_once() {
    let w = world(vec![owned("", &[("m0", "a"), ("m1", "a")])]);
    let capacity = |types: &[tenon_core::cloud::InstanceType], it: &str, zone: &str| {
        types
            .iter()
            .find(|t| t.name == it)
            .and_then(|t| t.offering(zone, CapacityType::Reserved))
            .map(|o| (o.reservation_capacity, o.available))
    };
    let h100 = "h100-sxm5-80gb-8x";
    let types = w.provider.instance_types(&pool("owned")).await.unwrap();
    assert_eq!(capacity(&types, h100, "a"), Some((Some(2), true)));

    let mut four = owned("", &[("m3", "b")]);
    four.spec.machines[0].gpu.count = 4;
    let mut classes = owned("", &[("m0", "a"), ("m2", "b")]);
    classes.spec.machines.extend(four.spec.machines);
    w.reload(vec![classes]).unwrap();
    let types = w.provider.instance_types(&pool("owned")).await.unwrap();
    assert_eq!(capacity(&types, h100, "a"), Some((Some(1), true)), "the removed free m1 is not offered");
    assert_eq!(capacity(&types, h100, "b"), Some((Some(1), true)), "the new free m2 is");
    assert_eq!(capacity(&types, "h100-sxm5-80gb-4x", "b"), Some((Some(1), true)), "a new class is a new type");

    w.reload(vec![owned("", &[("m0", "a")])]).unwrap();
    let types = w.provider.instance_types(&pool("owned")).await.unwrap();
    assert_eq!(types.len(), 1);
    assert_eq!(capacity(&types, h100, "b"), None);
}
