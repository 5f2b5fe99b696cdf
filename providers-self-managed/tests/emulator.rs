//! The provider against sushy-tools' Redfish emulator (started by `scripts/test.sh`, or by hand with
//! `eval "$(scripts/peers/redfish.sh start DIR)"`). Each test owns its own emulator systems, so the tests
//! run in parallel against one emulator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::launched;
use tenon_core::api::{NodeClaim, NodeClassRef, NodePool, NodePoolSpec, labels};
use tenon_core::cloud::conformance::{self, Harness, RealTimePoll};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DynCloudProvider, InstanceState, LaunchOptions, OfferingKey,
};
use tenon_self_managed::{
    Bmc, BmcTarget, MachinePhase, PowerState, RedfishClient, SelfManagedProvider, parse_node_class,
};

struct Emulator {
    endpoint: String,
    username: String,
    password: String,
    systems: Vec<String>,
}

fn emulator() -> Emulator {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: the Redfish emulator tests need sushy-tools running. Run them with \
                 `scripts/test.sh -p tenon-self-managed`, or start the peer by hand: \
                 `eval \"$(scripts/peers/redfish.sh start /tmp/redfish)\"`"
            )
        })
    };
    Emulator {
        endpoint: var("TENON_REDFISH_ENDPOINT"),
        username: var("TENON_REDFISH_USERNAME"),
        password: var("TENON_REDFISH_PASSWORD"),
        systems: var("TENON_REDFISH_SYSTEMS").split(',').map(str::to_owned).collect(),
    }
}

/// A machine of the test inventory: (name, endpoint, system id, domain).
struct M<'a>(&'a str, &'a str, &'a str, &'a str);

fn node_class(name: &str, machines: &[M<'_>], extra: &str) -> tenon_self_managed::SelfManagedNodeClass {
    let mut yaml = format!(
        "apiVersion: tenon.dev/v1alpha1\nkind: SelfManagedNodeClass\nmetadata: {{name: {name}}}\nspec:\n{extra}  machines:\n"
    );
    for M(machine, endpoint, system, domain) in machines {
        yaml.push_str(&format!(
            "  - name: {machine}\n    domain: {domain}\n    bmc: {{endpoint: \"{endpoint}\", systemId: \"{system}\", credentialsRef: bmc}}\n    gpu: {{model: H100-SXM5-80GB, count: 8}}\n    cpu: \"192\"\n    memory: 2Ti\n    pricePerHour: 12.5\n"
        ));
    }
    parse_node_class(&yaml).unwrap()
}

const FAST: &str = "  bootBudget: 30s\n  gracefulShutdownTimeout: 10s\n  forcedShutdownTimeout: 10s\n";

fn provider(class: tenon_self_managed::SelfManagedNodeClass, password: &str) -> Arc<SelfManagedProvider> {
    let e = emulator();
    let client = RedfishClient::new(Duration::from_secs(2)).unwrap();
    Arc::new(
        SelfManagedProvider::builder()
            .node_class(class)
            .credentials("bmc", &e.username, password)
            .bmc(Arc::new(client))
            .build()
            .unwrap(),
    )
}

fn claim(class: &str, name: &str) -> NodeClaim {
    let mut c = common::claim(class, name);
    c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "gpu".to_owned())].into());
    c
}

/// Every wait on the emulator, which applies a power change a second or two after the request, as a real
/// BMC does: the tests ask again every interval and fail at the deadline. The deadline only bounds a
/// failure (a state that never comes); it is the simulated-node suite's, so a loaded CI machine running
/// the tests in parallel against one emulator process does not fail them.
const POLL: RealTimePoll = RealTimePoll { deadline: Duration::from_secs(60), interval: Duration::from_millis(150) };

async fn until_running(p: &SelfManagedProvider, pid: &str) {
    POLL.until(&format!("{pid} not running"), async || {
        (p.get(pid).await.unwrap().state == InstanceState::Running).then_some(())
    })
    .await;
}

async fn delete_until_gone(p: &SelfManagedProvider, c: &NodeClaim) {
    POLL.until(&format!("{} not powered off", c.name()), async || match p.delete(c).await {
        Ok(()) => None,
        Err(e) if e.is_not_found() => Some(()),
        Err(e) => panic!("delete failed: {e}"),
    })
    .await;
}

async fn bmc_power(system: &str) -> PowerState {
    let e = emulator();
    let target = BmcTarget {
        endpoint: e.endpoint.clone(),
        system_id: system.to_owned(),
        username: e.username.clone(),
        password: e.password.clone(),
        insecure_skip_tls_verify: false,
    };
    RedfishClient::new(Duration::from_secs(2)).unwrap().power_state(&target).await.unwrap()
}

struct EmulatorHarness {
    provider: Arc<SelfManagedProvider>,
    class: String,
}

#[async_trait]
impl Harness for EmulatorHarness {
    fn provider(&self) -> DynCloudProvider {
        self.provider.clone()
    }
    fn node_class_ref(&self) -> Option<NodeClassRef> {
        Some(common::class_ref(&self.class))
    }
    /// The emulator applies power changes in real time: between the suite's polls, one poll interval.
    async fn settle(&self) {
        POLL.between().await;
    }
    /// The suite's polls end at the same deadline as this file's own (`POLL.deadline`).
    fn max_polls(&self) -> usize {
        POLL.max_polls()
    }
    /// Takes every machine of the offering out of the pool (maintenance quarantine).
    async fn make_insufficient(&self, offering: &OfferingKey) -> bool {
        for m in self.provider.machines().iter().filter(|m| m.domain == offering.zone) {
            assert!(self.provider.quarantine(&m.name, "conformance: maintenance"), "{m:?}");
        }
        true
    }
    /// Fills every domain with free machines and starts powering one machine of each off: the next launch
    /// finds nothing free but a machine on its way back.
    async fn make_next_launch_deferred(&self) -> bool {
        let free: Vec<_> = self.provider.machines().into_iter().filter(|m| m.phase == MachinePhase::Free).collect();
        let mut by_domain = std::collections::BTreeMap::new();
        for (n, m) in free.iter().enumerate() {
            let c = claim(&self.class, &format!("filler-{n}"));
            let i = self.provider.create(&c, &LaunchOptions::default()).await.unwrap();
            by_domain.insert(m.domain.clone(), launched(c, &i.provider_id));
        }
        for c in by_domain.values() {
            self.provider.delete(c).await.unwrap();
        }
        true
    }
}

#[tokio::test]
async fn the_provider_passes_the_conformance_suite_against_the_emulator() {
    let e = emulator();
    let s = &e.systems;
    let class = node_class(
        "conformance",
        &[
            M("c-a1", &e.endpoint, &s[0], "island-a"),
            M("c-a2", &e.endpoint, &s[1], "island-a"),
            M("c-b1", &e.endpoint, &s[2], "island-b"),
            M("c-b2", &e.endpoint, &s[3], "island-b"),
        ],
        FAST,
    );
    let h = EmulatorHarness { provider: provider(class, &e.password), class: "conformance".into() };
    conformance::assert_conformance(&h).await;
}

#[tokio::test]
async fn a_machine_powers_on_for_a_claim_and_off_when_it_is_deleted() {
    let e = emulator();
    let system = &e.systems[4];
    let class =
        node_class("roundtrip", &[M("rt-1", &e.endpoint, system, "island-a")], &format!("{FAST}  pxeBoot: true\n"));
    let p = provider(class, &e.password);
    let pool = {
        let mut pool = NodePool::new("gpu", NodePoolSpec::default());
        pool.spec.template.spec.node_class_ref = claim("roundtrip", "x").spec.node_class_ref;
        pool
    };
    let offering = |types: &[tenon_core::cloud::InstanceType]| {
        types[0].offering("island-a", CapacityType::Reserved).cloned().unwrap()
    };
    assert_eq!(offering(&p.instance_types(&pool).await.unwrap()).reservation_capacity, Some(1));

    let c = claim("roundtrip", "c1");
    let i = p.create(&c, &LaunchOptions::default()).await.unwrap();
    assert_eq!(
        (i.state, i.capacity_type, i.zone.as_str()),
        (InstanceState::Pending, CapacityType::Reserved, "island-a")
    );
    assert_eq!(i.labels.get("tenon.dev/machine").map(String::as_str), Some("rt-1"));
    let again = p.create(&c, &LaunchOptions::default()).await.unwrap();
    assert_eq!(again.provider_id, i.provider_id, "the same claim UID gets the same machine");
    assert_eq!(offering(&p.instance_types(&pool).await.unwrap()).reservation_capacity, Some(0));

    // The one-time PXE boot was set through the BMC.
    let body: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/redfish/v1/Systems/{system}", e.endpoint))
        .basic_auth(&e.username, Some(&e.password))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["Boot"]["BootSourceOverrideTarget"], "Pxe");

    until_running(&p, &i.provider_id).await;
    assert_eq!(bmc_power(system).await, PowerState::On);
    assert_eq!(p.list().await.unwrap().len(), 1);

    let c = launched(c, &i.provider_id);
    delete_until_gone(&p, &c).await;
    assert_eq!(bmc_power(system).await, PowerState::Off);
    assert!(p.get(&i.provider_id).await.unwrap_err().is_not_found());
    assert!(p.list().await.unwrap().is_empty());
    assert!(p.delete(&c).await.unwrap_err().is_not_found(), "NotFound once free");
    assert_eq!(p.machines()[0].phase, MachinePhase::Free);
    assert_eq!(offering(&p.instance_types(&pool).await.unwrap()).reservation_capacity, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_never_share_a_machine() {
    let e = emulator();
    let class = node_class(
        "race",
        &[M("race-1", &e.endpoint, &e.systems[5], "island-a"), M("race-2", &e.endpoint, &e.systems[6], "island-a")],
        FAST,
    );
    let p = provider(class, &e.password);
    let mut tasks = Vec::new();
    for n in 0..6 {
        let p = p.clone();
        tasks.push(tokio::spawn(
            async move { p.create(&claim("race", &format!("c{n}")), &LaunchOptions::default()).await },
        ));
    }
    let mut won = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(i) => won.push(i.provider_id),
            Err(CloudError::InsufficientCapacity { offerings, .. }) => {
                assert_eq!(offerings, [OfferingKey::new("h100-sxm5-80gb-8x", "island-a", CapacityType::Reserved)]);
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    won.sort();
    won.dedup();
    assert_eq!(won.len(), 2, "two machines, two winners, each its own machine: {won:?}");
    let held: Vec<_> = p.machines().into_iter().filter_map(|m| m.claim).collect();
    assert_eq!(held.len(), 2);
}

#[tokio::test]
async fn a_full_inventory_defers_while_a_machine_powers_off_and_fails_when_none_does() {
    let e = emulator();
    let class = node_class(
        "full",
        &[M("full-1", &e.endpoint, &e.systems[7], "island-a"), M("full-2", &e.endpoint, &e.systems[8], "island-a")],
        FAST,
    );
    let p = provider(class, &e.password);
    let mut held = Vec::new();
    for n in 0..2 {
        let c = claim("full", &format!("c{n}"));
        let i = p.create(&c, &LaunchOptions::default()).await.unwrap();
        until_running(&p, &i.provider_id).await;
        held.push(launched(c, &i.provider_id));
    }
    // One machine starts powering off: the next launch is deferred, not failed.
    p.delete(&held[0]).await.unwrap();
    match p.create(&claim("full", "c2"), &LaunchOptions::default()).await {
        Err(CloudError::LaunchDeferred { retry_after, reason }) => {
            assert!(!retry_after.is_zero());
            assert!(reason.contains("powering off"), "{reason}");
        }
        other => panic!("expected LaunchDeferred, got {other:?}"),
    }
    delete_until_gone(&p, &held[0]).await;
    let i = p.create(&claim("full", "c2"), &LaunchOptions::default()).await.unwrap();
    assert_eq!(i.provider_id, held[0].provider_id().unwrap(), "the freed machine serves the waiting claim");
    // Nothing free and nothing coming: insufficient capacity naming the offering.
    match p.create(&claim("full", "c3"), &LaunchOptions::default()).await {
        Err(CloudError::InsufficientCapacity { offerings, .. }) => {
            assert_eq!(offerings, [OfferingKey::new("h100-sxm5-80gb-8x", "island-a", CapacityType::Reserved)]);
        }
        other => panic!("expected InsufficientCapacity, got {other:?}"),
    }
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A one-connection-at-a-time HTTP server answering every request with `response` (or never, when
/// `None`), for faults the emulator cannot produce.
fn fake_bmc(response: Option<&'static str>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in l.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            match response {
                Some(r) => {
                    let _ = s.write_all(r.as_bytes());
                }
                None => held.push(s),
            }
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn bmc_refusals_become_clear_errors_naming_the_machine_and_url() {
    let e = emulator();
    let check = |err: CloudError, machine: &str, url: &str| {
        let text = err.to_string();
        assert!(text.contains(machine) && text.contains(url), "{text}");
        err
    };

    // 401: wrong password. The machine goes back to the pool, and is quarantined after repeated failures.
    let class = node_class("auth", &[M("auth-1", &e.endpoint, &e.systems[9], "island-a")], FAST);
    let p = provider(class, "not-the-password");
    for n in 0..3 {
        let err = p.create(&claim("auth", &format!("c{n}")), &LaunchOptions::default()).await.unwrap_err();
        let err = check(err, "auth-1", &e.endpoint);
        assert!(matches!(err, CloudError::Unauthorized(_)), "{err}");
    }
    assert!(matches!(p.machines()[0].phase, MachinePhase::Quarantined { .. }), "{:?}", p.machines()[0]);
    let err = p.create(&claim("auth", "c4"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");

    // 404: unknown system.
    let class = node_class("missing", &[M("missing-1", &e.endpoint, "no-such-system", "island-a")], FAST);
    let p = provider(class, &e.password);
    let err = p.create(&claim("missing", "c"), &LaunchOptions::default()).await.unwrap_err();
    let err = check(err, "missing-1", &format!("{}/redfish/v1/Systems/no-such-system", e.endpoint));
    assert!(matches!(&err, CloudError::Create { reason, .. } if reason == "BmcSystemNotFound"), "{err}");

    // Connection refused.
    let closed = format!("http://127.0.0.1:{}", closed_port());
    let class = node_class("refused", &[M("refused-1", &closed, "1", "island-a")], FAST);
    let p = provider(class, &e.password);
    let err = p.create(&claim("refused", "c"), &LaunchOptions::default()).await.unwrap_err();
    let err = check(err, "refused-1", &closed);
    assert!(matches!(&err, CloudError::Create { reason, .. } if reason == "BmcUnreachable"), "{err}");

    // A BMC that never answers, and one that answers with something other than JSON.
    let silent = fake_bmc(None);
    let garbled = fake_bmc(Some("HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot json!"));
    let class =
        node_class("odd", &[M("silent-1", &silent, "1", "island-a"), M("garbled-1", &garbled, "1", "island-b")], FAST);
    let p = provider(class, &e.password);
    let mut c = claim("odd", "silent");
    c.spec.requirements =
        vec![tenon_core::api::NodeSelectorRequirement::new(labels::ZONE, tenon_core::api::Operator::In, ["island-a"])];
    let err = p.create(&c, &LaunchOptions::default()).await.unwrap_err();
    let err = check(err, "silent-1", &silent);
    assert!(matches!(&err, CloudError::Create { reason, .. } if reason == "BmcTimeout"), "{err}");
    // The garbled BMC answers every request with a body that is not JSON.
    let mut c = claim("odd", "garbled");
    c.spec.requirements =
        vec![tenon_core::api::NodeSelectorRequirement::new(labels::ZONE, tenon_core::api::Operator::In, ["island-b"])];
    let err = p.create(&c, &LaunchOptions::default()).await.unwrap_err();
    let err = check(err, "garbled-1", &garbled);
    assert!(matches!(&err, CloudError::Create { reason, .. } if reason == "BmcBadResponse"), "{err}");
}

/// The emulator always powers on, after 1-2 s; a boot budget of zero makes that too slow, so the machine
/// is quarantined and its claim fails over (its instance is gone). The in-memory tests cover a machine
/// that never powers on with a realistic budget.
#[tokio::test]
async fn a_machine_not_on_within_its_boot_budget_is_quarantined() {
    let e = emulator();
    let class = node_class("slow", &[M("slow-1", &e.endpoint, &e.systems[10], "island-a")], "  bootBudget: \"0\"\n");
    let p = provider(class, &e.password);
    let i = p.create(&claim("slow", "c"), &LaunchOptions::default()).await.unwrap();
    let err = p.get(&i.provider_id).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let m = &p.machines()[0];
    assert!(matches!(&m.phase, MachinePhase::Quarantined { reason } if reason.contains("boot budget")), "{m:?}");
    assert_eq!(m.failures, 1);
    let err = p.create(&claim("slow", "c2"), &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");
}

#[tokio::test]
async fn repair_reboots_through_the_bmc() {
    let e = emulator();
    let class = node_class("reboot", &[M("reboot-1", &e.endpoint, &e.systems[11], "island-a")], FAST);
    let p = provider(class, &e.password);
    let c = claim("reboot", "c");
    let i = p.create(&c, &LaunchOptions::default()).await.unwrap();
    until_running(&p, &i.provider_id).await;
    let c = launched(c, &i.provider_id);
    p.reboot(&c).await.unwrap();
    assert_eq!(p.machines()[0].phase, MachinePhase::Launching, "rebooting counts against the boot budget");
    until_running(&p, &i.provider_id).await;
    assert_eq!(bmc_power(&e.systems[11]).await, PowerState::On);
    delete_until_gone(&p, &c).await;
}
