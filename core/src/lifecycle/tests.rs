//! A claim's life in virtual time against FakeCloud and the in-memory cluster.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::*;
use crate::api::{NodeClaim, NodeClaimSpec, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator};
use crate::clock::{Clock, VirtualClock};
use crate::cloud::fake::{FakeCloud, Method};
use crate::cloud::{CloudProvider, OfferingKey, ProviderRegistry, UnavailableOfferings};
use crate::cluster::{Cluster, InMemoryApi};
use crate::settings::{self, Settings};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const MIN: u64 = 60;

struct World {
    clock: Arc<VirtualClock>,
    cloud: Arc<FakeCloud>,
    api: InMemoryApi,
    lifecycle: Lifecycle,
    unavailable: Arc<UnavailableOfferings>,
    pools: Vec<NodePool>,
    start: Timestamp,
}

impl World {
    fn with_settings(settings: Settings) -> Self {
        let clock = VirtualClock::at_epoch();
        let cloud = Arc::new(FakeCloud::builder().clock(clock.clone()).build());
        let mut registry = ProviderRegistry::new();
        registry.register_arc(cloud.clone()).unwrap();
        let unavailable = Arc::new(UnavailableOfferings::new());
        let lifecycle = Lifecycle::new(registry, unavailable.clone(), settings);
        let start = clock.now();
        let api = InMemoryApi::new(start);
        api.lock().set_pools(vec![NodePool::new("default", NodePoolSpec::default())]);
        Self {
            clock,
            cloud,
            api,
            lifecycle,
            unavailable,
            pools: vec![NodePool::new("default", NodePoolSpec::default())],
            start,
        }
    }

    fn new() -> Self {
        Self::with_settings(Settings::default())
    }

    fn at(&self, minutes: u64) {
        self.clock.set(clock::add(self.start, Duration::from_secs(minutes * MIN)));
        self.api.set_now(self.clock.now());
    }

    /// A claim as the API holds it now.
    fn claim_(&self, name: &str) -> Arc<NodeClaim> {
        self.api.snapshot().claims[name].clone()
    }

    /// A node as the API holds it now.
    fn node_(&self, name: &str) -> Arc<Node> {
        self.api.snapshot().nodes[name].clone()
    }

    fn set_pools(&mut self, pools: Vec<NodePool>) {
        self.api.lock().set_pools(pools.clone());
        self.pools = pools;
    }

    fn claim(&mut self, name: &str, reqs: Vec<NodeSelectorRequirement>, requests: serde_json::Value) {
        let mut c = NodeClaim::new(name, NodeClaimSpec { requirements: reqs, ..Default::default() });
        c.metadata.uid = Some(format!("uid-{name}"));
        c.metadata.creation_timestamp = Some(Time(self.clock.now()));
        c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
        c.spec.resources.requests = serde_json::from_value(requests).unwrap();
        self.api.lock().put_claim(c);
    }

    async fn step(&mut self, name: &str) -> Next {
        let now = self.clock.now();
        self.api.set_now(now);
        self.lifecycle.reconcile(&self.api, name, now).await.unwrap()
    }

    /// Reconciles until the claim settles (or is gone), as the controller's requeues would at this time.
    async fn settle(&mut self, name: &str) {
        for _ in 0..5 {
            match self.step(name).await {
                Next::After(d) if d.is_zero() => continue,
                _ => break,
            }
        }
    }

    fn kubelet_registers(&mut self, name: &str, ready: bool, allocatable: serde_json::Value) {
        let pid = self.claim_(name).provider_id().unwrap().to_owned();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": format!("node-{name}")},
            "spec": {"providerID": pid, "taints": [{"key": labels::UNREGISTERED_TAINT, "effect": "NoExecute"}]},
            "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap();
        self.api.lock().put_node(node);
    }

    fn gone(&self, name: &str) -> bool {
        !self.api.lock().claims.contains_key(name)
    }

    fn deleting(&self, name: &str) -> bool {
        self.api.lock().claims.get(name).is_none_or(|c| c.metadata.deletion_timestamp.is_some())
    }
}

fn gpu_reqs() -> Vec<NodeSelectorRequirement> {
    vec![NodeSelectorRequirement::new(labels::INSTANCE_TYPE, Operator::In, ["fake.gpu"])]
}

#[tokio::test]
async fn launch_records_the_instance_and_never_launches_twice() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({"cpu": "1", "nvidia.com/gpu": "1"}));
    w.step("c1").await;
    let c = &w.claim_("c1");
    assert!(c.is_true(condition_types::LAUNCHED));
    let st = c.status.as_ref().unwrap();
    assert!(st.provider_id.as_deref().unwrap().starts_with("fake://"));
    assert_eq!(st.image_id.as_deref(), Some("fake-image-1"));
    assert_eq!(st.allocatable["nvidia.com/gpu"].0, "1");
    assert_eq!(c.label(labels::INSTANCE_TYPE), Some("fake.gpu"));
    // The status write is lost: the claim comes back unlaunched, and the cache answers.
    let mut lost = NodeClaim::clone(c);
    lost.status = None;
    w.api.lock().put_claim(lost);
    w.step("c1").await;
    assert_eq!(w.cloud.create_calls(), 1, "no second launch");
    assert!(w.claim_("c1").is_true(condition_types::LAUNCHED));
}

#[tokio::test]
async fn insufficient_capacity_marks_offerings_and_deletes_the_claim() {
    let mut w = World::new();
    for z in ["test-zone-a", "test-zone-b"] {
        for ct in [crate::cloud::CapacityType::Spot, crate::cloud::CapacityType::OnDemand] {
            w.cloud.exhaust_offering(OfferingKey::new("fake.gpu", z, ct));
        }
    }
    w.claim("c1", gpu_reqs(), json!({}));
    w.settle("c1").await;
    assert!(w.gone("c1"), "deleted, so provisioning retries elsewhere");
    let key = OfferingKey::new("fake.gpu", "test-zone-a", crate::cloud::CapacityType::Spot);
    assert!(w.unavailable.is_unavailable("fake", &key, w.clock.now()));
    assert_eq!(w.lifecycle.counters.launch_failures, 1);
}

#[tokio::test]
async fn node_class_not_ready_deletes_and_create_errors_keep_the_claim() {
    let mut w = World::new();
    w.cloud.inject_next(Method::Create, CloudError::NodeClassNotReady("AMI not resolved".into()));
    w.claim("c1", gpu_reqs(), json!({}));
    w.settle("c1").await;
    assert!(w.gone("c1"));
    w.cloud.inject_next(
        Method::Create,
        CloudError::Create { reason: "QuotaExceeded".into(), message: "vCPU quota".into() },
    );
    w.claim("c2", gpu_reqs(), json!({}));
    assert_eq!(w.step("c2").await, Next::After(Duration::from_secs(10)), "backs off");
    let cond = w.claim_("c2").condition(condition_types::LAUNCHED).unwrap().clone();
    assert_eq!((cond.status, cond.reason.as_str()), (ConditionStatus::Unknown, "QuotaExceeded"));
    w.step("c2").await;
    assert!(w.claim_("c2").is_true(condition_types::LAUNCHED), "a later try succeeds");
}

#[tokio::test]
async fn create_errors_back_off_longer_each_time_but_not_past_the_launch_clock() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    let mut waits = Vec::new();
    for _ in 0..6 {
        w.cloud.inject_next(
            Method::Create,
            CloudError::Create { reason: "Throttled".into(), message: "slow down".into() },
        );
        let Next::After(wait) = w.step("c1").await else { panic!("a failed create is retried") };
        waits.push(wait.as_secs());
        w.clock.advance(wait);
    }
    assert_eq!(waits, [10, 10, 20, 40, 80, 140], "doubling, and the last wait ends with the 5-minute launch clock");
    assert_eq!(w.lifecycle.counters.launch_failures, 6);
    w.settle("c1").await;
    assert!(w.gone("c1"), "the launch clock ran out");
    assert_eq!(w.lifecycle.counters.launch_timeouts, 1);
}

#[tokio::test]
async fn deferred_launches_requeue_at_the_provider_cadence_but_the_launch_clock_keeps_running() {
    let mut w = World::new();
    w.cloud.defer_launches(100, Duration::from_secs(90), "owned machines are draining");
    w.claim("c1", gpu_reqs(), json!({}));
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(90)));
    assert_eq!(w.lifecycle.counters.launch_deferrals, 1);
    assert_eq!(w.lifecycle.counters.launch_failures, 0, "a deferral is not a failure");
    w.at(4);
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(60)), "never past the 5-minute launch clock");
    assert!(!w.deleting("c1"));
    w.at(5);
    w.settle("c1").await;
    assert!(w.gone("c1"), "deleted when the launch clock, counted from creation, runs out");
    assert_eq!(w.lifecycle.counters.launch_timeouts, 1);
}

#[tokio::test]
async fn a_claim_can_ignore_the_unavailable_offerings_cache_for_chosen_capacity_types() {
    let mut w = World::new();
    let spot = OfferingKey::new("fake.gpu", "test-zone-a", crate::cloud::CapacityType::Spot);
    w.unavailable.mark("fake", &spot, Duration::from_secs(180), w.clock.now());
    w.claim("c1", gpu_reqs(), json!({}));
    let mut c = (*w.claim_("c1")).clone();
    c.metadata.annotations = Some([(IGNORE_UNAVAILABLE_OFFERINGS.to_owned(), "spot".to_owned())].into());
    w.api.lock().put_claim(c);
    w.step("c1").await;
    let calls = w.cloud.calls();
    let Some(crate::cloud::fake::Call::Create { options, .. }) = calls.last() else { panic!("{calls:?}") };
    assert!(options.unavailable.is_empty(), "the spot entry is not passed on");
    assert_eq!(options.ignore_unavailable, [crate::cloud::CapacityType::Spot]);
}

#[tokio::test]
async fn registration_syncs_the_node_and_initialization_waits_for_gpus() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({"cpu": "1", "nvidia.com/gpu": "1"}));
    let mut c = (*w.claim_("c1")).clone();
    c.spec.taints = vec![crate::scheduling::taints::taint("nvidia.com/gpu", None, "NoSchedule")];
    c.spec.startup_taints = vec![crate::scheduling::taints::taint("example.com/driver", None, "NoExecute")];
    w.api.lock().put_claim(c);
    w.step("c1").await;
    w.kubelet_registers("c1", true, json!({"cpu": "8", "nvidia.com/gpu": "0"}));
    w.step("c1").await;
    let node = &w.node_("node-c1");
    let l = node.metadata.labels.as_ref().unwrap();
    assert_eq!(l[labels::REGISTERED], "true");
    assert_eq!(l[labels::NODE_POOL], "default");
    assert!(node.metadata.finalizers.as_ref().unwrap().contains(&labels::TERMINATION_FINALIZER.to_owned()));
    assert_eq!(node.metadata.owner_references.as_ref().unwrap()[0].name, "c1");
    let taints: Vec<&str> =
        node.spec.as_ref().unwrap().taints.as_ref().unwrap().iter().map(|t| t.key.as_str()).collect();
    assert_eq!(taints, ["nvidia.com/gpu", "example.com/driver"], "unregistered taint gone, claim taints synced");
    let claim = &w.claim_("c1");
    assert!(claim.is_true(condition_types::REGISTERED));
    assert!(!claim.is_initialized());
    assert!(claim.condition(condition_types::INITIALIZED).unwrap().message.contains("startup taint"));
    // The startup taint clears, but the device plugin has not reported the GPU yet.
    let mut n = (*w.node_("node-c1")).clone();
    n.spec.as_mut().unwrap().taints.as_mut().unwrap().retain(|t| t.key != "example.com/driver");
    w.api.lock().put_node(n.clone());
    w.step("c1").await;
    assert!(w.claim_("c1").condition(condition_types::INITIALIZED).unwrap().message.contains("nvidia.com/gpu"));
    n.status.as_mut().unwrap().allocatable.as_mut().unwrap().insert("nvidia.com/gpu".into(), Quantity("1".into()));
    w.api.lock().put_node(n);
    w.step("c1").await;
    assert!(w.claim_("c1").is_initialized());
    assert_eq!(w.node_("node-c1").metadata.labels.as_ref().unwrap()[labels::INITIALIZED], "true");
}

/// `karpenter.sh/do-not-sync-taints` is a label of the node (an annotation of that name does nothing),
/// and a `readiness.k8s.io/` taint keeps the node from initializing, whatever its effect, until it goes.
#[tokio::test]
async fn the_do_not_sync_label_and_readiness_taints_are_read_as_karpenter_reads_them() {
    let taints = |w: &World, node: &str| -> Vec<String> {
        let n = w.node_(node);
        n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default().into_iter().map(|t| t.key).collect()
    };
    for (meta, synced) in [("labels", false), ("annotations", true)] {
        let mut w = World::new();
        w.claim("c1", vec![], json!({"cpu": "1"}));
        let mut c = (*w.claim_("c1")).clone();
        c.spec.taints = vec![crate::scheduling::taints::taint("dedicated", Some("ml"), "NoSchedule")];
        w.api.lock().put_claim(c);
        w.step("c1").await;
        w.kubelet_registers("c1", true, json!({"cpu": "8"}));
        let mut n = (*w.node_("node-c1")).clone();
        let map = [(labels::DO_NOT_SYNC_TAINTS.to_owned(), "true".to_owned())].into();
        if meta == "labels" {
            n.metadata.labels = Some(map)
        } else {
            n.metadata.annotations = Some(map)
        }
        n.spec.as_mut().unwrap().taints.as_mut().unwrap().push(crate::scheduling::taints::taint(
            "readiness.k8s.io/network",
            None,
            "NoExecute",
        ));
        w.api.lock().put_node(n);
        w.step("c1").await;
        assert_eq!(taints(&w, "node-c1").contains(&"dedicated".to_owned()), synced, "do-not-sync-taints as {meta}");
        let claim = w.claim_("c1");
        assert!(claim.is_true(condition_types::REGISTERED));
        assert!(!claim.is_initialized(), "a readiness taint is ephemeral: not initialized while it stays");
        let mut n = (*w.node_("node-c1")).clone();
        n.spec.as_mut().unwrap().taints.as_mut().unwrap().retain(|t| !t.key.starts_with("readiness.k8s.io/"));
        w.api.lock().put_node(n);
        w.step("c1").await;
        assert!(w.claim_("c1").is_initialized());
    }
}

#[tokio::test]
async fn two_nodes_with_one_provider_id_is_an_error_condition() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    w.step("c1").await;
    w.kubelet_registers("c1", true, json!({}));
    let mut twin = (*w.node_("node-c1")).clone();
    twin.metadata.name = Some("twin".into());
    w.api.lock().put_node(twin);
    w.step("c1").await;
    let cond = w.claim_("c1").condition(condition_types::REGISTERED).unwrap().clone();
    assert_eq!((cond.status, cond.reason.as_str()), (ConditionStatus::False, "MultipleNodesFound"));
}

/// The per-pool registration timeout: a slow GPU that registers at minute 22 survives a 25-minute
/// override; under the 15-minute default it is deleted at minute 15.
#[tokio::test]
async fn a_slow_gpu_registering_at_minute_22_survives_a_25_minute_override() {
    for (override_, survives) in [(Some("25m"), true), (None, false)] {
        let mut w = World::new();
        if let Some(t) = override_ {
            let mut pools = w.pools.clone();
            pools[0].metadata.annotations =
                Some([(labels::NODECLAIM_REGISTRATION_TIMEOUT.to_owned(), t.to_owned())].into());
            w.set_pools(pools);
        }
        w.claim("slow", gpu_reqs(), json!({}));
        w.step("slow").await;
        for minute in [5, 10, 14] {
            w.at(minute);
            w.settle("slow").await;
            assert!(!w.deleting("slow"), "minute {minute}");
        }
        w.at(15);
        w.settle("slow").await;
        assert_eq!(!w.deleting("slow"), survives, "minute 15, override {override_:?}");
        if survives {
            w.at(22);
            w.kubelet_registers("slow", true, json!({}));
            w.settle("slow").await;
            assert!(w.claim_("slow").is_true(condition_types::REGISTERED));
            assert!(w.claim_("slow").is_initialized());
        } else {
            assert_eq!(w.lifecycle.counters.registration_timeouts, 1);
        }
    }
}

/// The opt-in initialization timeout counts from registration: registered at minute 10 under a 30-minute
/// timeout, a node that never initializes is deleted at minute 40 and not before.
#[tokio::test]
async fn the_initialization_timeout_counts_from_registration() {
    let s = settings::load(None, [("NODECLAIM_INITIALIZATION_TIMEOUT".to_owned(), "30m".to_owned())], &[])
        .unwrap()
        .settings;
    let mut w = World::with_settings(s);
    w.claim("c1", gpu_reqs(), json!({"nvidia.com/gpu": "1"}));
    w.step("c1").await;
    w.at(10);
    w.kubelet_registers("c1", true, json!({"nvidia.com/gpu": "0"}));
    w.step("c1").await;
    w.at(39);
    w.settle("c1").await;
    assert!(!w.deleting("c1"), "29 minutes after registration");
    w.at(40);
    w.settle("c1").await;
    assert!(w.deleting("c1"));
    assert_eq!(w.lifecycle.counters.initialization_timeouts, 1);
    // Without the setting the node is kept, as upstream does.
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({"nvidia.com/gpu": "1"}));
    w.step("c1").await;
    w.kubelet_registers("c1", true, json!({"nvidia.com/gpu": "0"}));
    w.step("c1").await;
    w.at(14);
    w.settle("c1").await;
    assert!(!w.deleting("c1"));
}

/// A claim that launched but never registered, whose instance vanished, is reclaimed after the 5-minute
/// grace for list-after-create consistency, not held until the 15-minute registration timeout.
#[tokio::test]
async fn a_vanished_instance_is_reclaimed_after_the_grace_not_the_registration_timeout() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    w.step("c1").await;
    let pid = w.claim_("c1").provider_id().unwrap().to_owned();
    w.at(1);
    w.cloud.vanish(&pid);
    w.at(4);
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert!(done.is_empty(), "within the grace");
    w.at(5);
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert_eq!(done, ["reclaimed NodeClaim/c1: its instance is gone"]);
    w.settle("c1").await;
    assert!(w.gone("c1"));
}

#[tokio::test]
async fn registered_claims_whose_instance_is_gone_are_deleted_once_the_node_is_not_ready() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    w.step("c1").await;
    w.kubelet_registers("c1", true, json!({}));
    w.settle("c1").await;
    let pid = w.claim_("c1").provider_id().unwrap().to_owned();
    w.cloud.vanish(&pid);
    assert!(w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap().is_empty(), "the node is still Ready");
    let mut n = (*w.node_("node-c1")).clone();
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "Unknown".into();
    w.api.lock().put_node(n);
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert_eq!(done.len(), 1);
    w.settle("c1").await;
    assert!(w.gone("c1"));
    assert!(!w.api.lock().nodes.contains_key("node-c1"), "its node goes with it");
}

#[tokio::test]
async fn instances_without_a_claim_are_terminated_after_the_grace_and_other_clusters_are_left_alone() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    w.step("c1").await;
    // A crash between create and the status write: the instance exists, the claim was deleted by hand.
    w.api.lock().clear_claims();
    let foreign = w.cloud.insert_foreign_instance("other-cluster");
    w.at(1);
    assert!(w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap().is_empty());
    w.at(2);
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(w.cloud.instances().is_empty());
    assert!(w.cloud.get(&foreign).await.is_err(), "invisible to this cluster");
    assert_eq!(w.lifecycle.counters.orphan_instances, 1);
}

#[tokio::test]
async fn a_node_that_registered_after_its_claim_was_deleted_goes_once_the_instance_is_gone() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    w.step("c1").await;
    let pid = w.claim_("c1").provider_id().unwrap().to_owned();
    let mut c = (*w.claim_("c1")).clone();
    c.metadata.deletion_timestamp = Some(Time(w.clock.now()));
    w.api.lock().put_claim(c);
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(5)), "terminating");
    assert_eq!(w.step("c1").await, Next::Done, "NotFound: the finalizer is released");
    assert!(w.gone("c1"));
    // The kubelet registers late: a node with no owner and no finalizer.
    let late: Node =
        serde_json::from_value(json!({"metadata": {"name": "late", "labels": {labels::NODE_POOL: "default"}},
        "spec": {"providerID": pid}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}))
        .unwrap();
    w.api.lock().put_node(late);
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert_eq!(done, ["deleted Node/late: no claim owns it and its instance is gone"]);
    assert!(!w.api.lock().nodes.contains_key("late"));
}

/// The lease path: spot unavailable → on-demand under a lease → the lease expires → the claim drifts with
/// OnDemandLeaseExpired → disruption replaces it on spot; and, while spot stays unavailable, the
/// on-demand node stays.
#[tokio::test]
async fn an_on_demand_lease_expires_into_drift_and_is_reclaimed_to_spot() {
    let mut w = World::new();
    w.cloud.fallback_to_on_demand_under_lease(Duration::from_secs(30 * MIN));
    for z in ["test-zone-a", "test-zone-b"] {
        w.cloud.exhaust_offering(OfferingKey::new("fake.gpu", z, crate::cloud::CapacityType::Spot));
    }
    w.claim("c1", gpu_reqs(), json!({}));
    w.step("c1").await;
    let claim = (*w.claim_("c1")).clone();
    assert_eq!(claim.label(labels::CAPACITY_TYPE), Some("on-demand"));
    assert!(claim.annotation(LEASE_EXPIRES_AT).is_some());
    w.kubelet_registers("c1", true, json!({}));
    w.settle("c1").await;
    w.at(29);
    w.settle("c1").await;
    assert!(!w.claim_("c1").is_true(condition_types::DRIFTED));
    w.at(30);
    w.settle("c1").await;
    let drifted = w.claim_("c1").condition(condition_types::DRIFTED).unwrap().clone();
    assert_eq!((drifted.status, drifted.reason.as_str()), (ConditionStatus::True, ON_DEMAND_LEASE_EXPIRED));

    // Disruption sorts it first and pins its replacement to spot.
    let node = (*w.node_("node-c1")).clone();
    let claims: Vec<NodeClaim> = w.api.snapshot().claims.values().map(|c| NodeClaim::clone(c)).collect();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": "node-c1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}}))
    .unwrap();
    let now = w.clock.now();
    let state = crate::state::ClusterState::from_objects(&[pod], &[node], &claims, &[], &[], &w.pools, now).unwrap();
    let settings = Settings::default();
    let run = |available: bool| {
        let mut types = FakeCloud::default_catalog();
        if !available {
            for t in &mut types {
                t.offerings.retain(|o| o.capacity_type != crate::cloud::CapacityType::Spot);
            }
        }
        let types_for = move |_: &NodePool| types.clone().into();
        crate::disruption::compute(&crate::disruption::Inputs {
            state: &state,
            types_for: &types_for,
            settings: &settings,
            now,
        })
    };
    let pass = run(true);
    assert_eq!(pass.method, Some(crate::disruption::Method::Drift));
    assert_eq!(pass.commands[0].replacements[0].capacity_types, [crate::cloud::CapacityType::Spot]);
    let pass = run(false);
    assert!(pass.commands.is_empty(), "spot still unavailable: the on-demand node stays");
    assert!(pass.unconsolidatable[0].reason.contains("keeping the on-demand node"));
}

fn bound_pod(w: &mut World, name: &str, node: &str, extra: serde_json::Value) {
    let mut v = json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}});
    crate::testing::merge(&mut v, extra);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(v).unwrap();
    w.api.lock().put_pod(pod);
}

async fn running(w: &mut World, name: &str) {
    w.claim(name, gpu_reqs(), json!({}));
    w.step(name).await;
    w.kubelet_registers(name, true, json!({}));
    w.settle(name).await;
    assert!(w.claim_(name).is_initialized());
}

/// Termination: the node is tainted and drained through the eviction API before the instance is deleted;
/// a do-not-disrupt pod holds the drain until the claim's termination grace period runs out.
#[tokio::test]
async fn deleting_a_claim_drains_its_node_then_terminates_the_instance() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    bound_pod(&mut w, "web", "node-c1", json!({}));
    bound_pod(&mut w, "train", "node-c1", json!({"metadata": {"annotations": {labels::DO_NOT_DISRUPT: "true"}}}));
    let mut c = (*w.claim_("c1")).clone();
    c.metadata.deletion_timestamp = Some(Time(w.clock.now()));
    c.spec.termination_grace_period = Some(crate::api::KubeDuration::from_secs(10 * MIN));
    w.api.lock().put_claim(c);
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(1)), "draining");
    let taints = w.node_("node-c1").spec.as_ref().unwrap().taints.clone().unwrap();
    assert!(taints.iter().any(|t| t.key == labels::DISRUPTED_TAINT));
    assert_eq!(w.api.lock().evicted, ["default/web"]);
    assert_eq!(w.cloud.instances().len(), 1, "the instance lives while pods drain");
    w.at(9);
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(1)), "the do-not-disrupt pod waits");
    w.at(10);
    w.step("c1").await;
    assert!(w.api.lock().pods.is_empty(), "forced once the grace period is over");
    w.step("c1").await;
    assert!(w.gone("c1"));
    assert!(w.cloud.instances().is_empty());
    assert!(!w.api.lock().nodes.contains_key("node-c1"));
}

/// A claim annotated with a termination timestamp (repair writes one from its policy's grace) is drained
/// by then, though it has no terminationGracePeriod of its own.
#[tokio::test]
async fn the_termination_timestamp_annotation_bounds_the_drain() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    bound_pod(&mut w, "train", "node-c1", json!({"metadata": {"annotations": {labels::DO_NOT_DISRUPT: "true"}}}));
    let mut c = (*w.claim_("c1")).clone();
    let deadline = clock::add(w.clock.now(), Duration::from_secs(5 * MIN));
    c.metadata.annotations.get_or_insert_with(Default::default).insert(
        labels::NODECLAIM_TERMINATION_TIMESTAMP.to_owned(),
        deadline.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    );
    c.metadata.deletion_timestamp = Some(Time(w.clock.now()));
    assert!(c.spec.termination_grace_period.is_none());
    w.api.lock().put_claim(c);
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(1)), "the do-not-disrupt pod holds the drain");
    w.clock.advance(Duration::from_secs(4 * MIN));
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(1)), "still inside the deadline");
    w.clock.advance(Duration::from_secs(MIN));
    w.step("c1").await;
    assert!(w.api.lock().pods.is_empty(), "forced at the annotated deadline");
    w.step("c1").await;
    assert!(w.gone("c1"));
}

#[tokio::test]
async fn claims_expire_after_expire_after() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    let mut c = (*w.claim_("c1")).clone();
    c.spec.expire_after = crate::api::NillableDuration::from_secs(60 * MIN);
    w.api.lock().put_claim(c);
    w.at(59);
    w.step("c1").await;
    assert!(!w.deleting("c1"));
    w.at(60);
    w.step("c1").await;
    assert!(w.deleting("c1"));
    assert_eq!(w.lifecycle.counters.expirations, 1);
}

/// Interruption: a spot interruption notice deletes the claim at once, marks the offering unavailable,
/// and the node's pods get new capacity elsewhere; a rebalance recommendation does nothing.
#[tokio::test]
async fn a_spot_interruption_drains_replaces_and_marks_the_offering() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    bound_pod(
        &mut w,
        "job",
        "node-c1",
        json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}}),
    );
    let pid = w.claim_("c1").provider_id().unwrap().to_owned();
    let zone = w.claim_("c1").label(labels::ZONE).unwrap().to_owned();
    assert_eq!(w.claim_("c1").label(labels::CAPACITY_TYPE), Some("spot"));
    let now = w.clock.now();
    assert_eq!(
        w.lifecycle
            .interrupt(
                &w.api,
                &w.api.snapshot(),
                &Interruption { provider_id: pid.clone(), kind: InterruptionKind::Rebalance },
                now
            )
            .await
            .unwrap(),
        None
    );
    let hit = w
        .lifecycle
        .interrupt(
            &w.api,
            &w.api.snapshot(),
            &Interruption { provider_id: pid, kind: InterruptionKind::SpotInterruption },
            now,
        )
        .await
        .unwrap();
    assert_eq!(hit.as_deref(), Some("c1"));
    assert!(w.deleting("c1"));
    let key = OfferingKey::new("fake.gpu", &zone, crate::cloud::CapacityType::Spot);
    assert!(w.unavailable.is_unavailable("fake", &key, now));
    // Provisioning sees the deleting node's pod and buys for it, avoiding the interrupted offering.
    let c = w.api.snapshot();
    let state = crate::state::ClusterState::from_shared(
        c.pods.values(),
        c.nodes.values(),
        c.claims.values(),
        &[],
        &[],
        &w.pools,
        now,
        &mut Default::default(),
    )
    .unwrap();
    let unavailable = w.unavailable.clone();
    let types_for = move |_: &NodePool| {
        let mut t = FakeCloud::default_catalog();
        unavailable.apply("fake", &mut t, &[], now);
        t.into()
    };
    let r = crate::provisioning::schedule(&state, &types_for, &Default::default(), &Settings::default(), now);
    assert_eq!(r.claims.len(), 1);
    assert_eq!(r.claims[0].pods, ["default/job"]);
    let launch = r.claims[0].launch.as_ref().unwrap();
    assert!(!(launch.zone == zone && launch.capacity_type == crate::cloud::CapacityType::Spot), "{launch:?}");
    w.step("c1").await;
    assert_eq!(w.api.lock().evicted, ["default/job"]);
}

/// An impaired instance (a failed status check) is terminated without a graceful drain: its claim gets a
/// termination deadline of now before it is deleted; no offering is marked (the hardware failed, not the
/// market). A reservation's interruption drains as a scheduled change does.
#[tokio::test]
async fn an_impaired_instance_is_terminated_without_waiting_for_its_drain() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    running(&mut w, "c2").await;
    let now = w.clock.now();
    let pid = w.claim_("c1").provider_id().unwrap().to_owned();
    assert!(w.claim_("c1").termination_deadline().is_none());
    let hit = w
        .lifecycle
        .interrupt(&w.api, &w.api.snapshot(), &Interruption { provider_id: pid, kind: InterruptionKind::Impaired }, now)
        .await
        .unwrap();
    assert_eq!(hit.as_deref(), Some("c1"));
    assert!(w.deleting("c1"));
    assert_eq!(w.claim_("c1").termination_deadline(), Some(now));
    let zone = w.claim_("c1").label(labels::ZONE).unwrap().to_owned();
    let key = OfferingKey::new("fake.gpu", &zone, crate::cloud::CapacityType::Spot);
    assert!(!w.unavailable.is_unavailable("fake", &key, now));
    let pid = w.claim_("c2").provider_id().unwrap().to_owned();
    let event = Interruption { provider_id: pid, kind: InterruptionKind::ReservationInterruption };
    w.lifecycle.interrupt(&w.api, &w.api.snapshot(), &event, now).await.unwrap();
    assert!(w.deleting("c2"));
    assert!(w.claim_("c2").termination_deadline().is_none(), "drained as usual");
}

#[tokio::test]
async fn volumes_detach_before_the_instance_goes_and_deleting_the_node_deletes_the_claim() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    w.api.lock().attach_volume("csi-123", "node-c1", Some("pv-data"));
    // kubectl delete node: the claim follows.
    let mut n = (*w.node_("node-c1")).clone();
    n.metadata.deletion_timestamp = Some(Time(w.clock.now()));
    w.api.lock().put_node(n);
    w.step("c1").await;
    assert!(w.deleting("c1"));
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(1)), "waiting for the volume");
    assert_eq!(w.cloud.instances().len(), 1);
    w.api.lock().detach_volume("csi-123");
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(5)), "terminating");
    w.step("c1").await;
    assert!(w.gone("c1"));
    assert!(!w.api.lock().nodes.contains_key("node-c1"));
}

/// Only the volumes of pods the drain moves hold the instance: a pod tolerating the disruption taint keeps
/// its volume attached until the instance goes, and an inline volume has no PersistentVolume to hand over.
#[tokio::test]
async fn termination_awaits_only_the_volumes_of_drained_pods() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    let with_claim = |claim: &str, extra: serde_json::Value| {
        let mut pod = json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}});
        crate::testing::merge(&mut pod, extra);
        pod
    };
    let tolerates = json!({"spec": {"tolerations": [{"key": labels::DISRUPTED_TAINT, "operator": "Exists"}]}});
    bound_pod(&mut w, "agent", "node-c1", with_claim("agent-data", tolerates));
    bound_pod(&mut w, "db", "node-c1", with_claim("db-data", json!({})));
    {
        let mut api = w.api.lock();
        for (pvc, pv) in [("agent-data", "pv-agent"), ("db-data", "pv-db")] {
            api.put_volume_claim(
                serde_json::from_value(json!({
                    "metadata": {"name": pvc, "namespace": "default"},
                    "spec": {"volumeName": pv}
                }))
                .unwrap(),
            );
        }
        api.attach_volume("csi-agent", "node-c1", Some("pv-agent"));
        api.attach_volume("csi-db", "node-c1", Some("pv-db"));
        api.attach_volume("csi-inline", "node-c1", None);
    }
    let mut c = (*w.claim_("c1")).clone();
    c.metadata.deletion_timestamp = Some(Time(w.clock.now()));
    w.api.lock().put_claim(c);
    // The drain evicts db; the agent stays.
    w.step("c1").await;
    assert_eq!(w.api.lock().evicted, ["default/db"]);
    assert_eq!(w.step("c1").await, Next::After(Duration::from_secs(1)), "waiting for db's volume");
    assert_eq!(w.cloud.instances().len(), 1, "db's volume is still attached");
    assert_eq!(w.api.lock().snapshot().pending_volume_attachments("node-c1", w.clock.now()), ["csi-db"]);
    w.api.lock().detach_volume("csi-db");
    w.step("c1").await;
    w.step("c1").await;
    assert!(w.gone("c1"), "the agent's and the inline volume do not hold the instance");
}

/// Provider drift (an image or NodeClass change only the provider can see) reaches the claim's Drifted
/// condition, for disruption to act on; the provider is asked at most every DRIFT_CHECK_INTERVAL.
#[tokio::test]
async fn provider_drift_marks_the_claim_drifted() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    assert!(!w.claim_("c1").is_true(condition_types::DRIFTED));
    let pid = w.claim_("c1").provider_id().unwrap().to_owned();
    w.cloud.set_drifted(&pid, "AMIDrift");
    let next = w.step("c1").await;
    assert!(!w.claim_("c1").is_true(condition_types::DRIFTED), "asked again only after the interval");
    assert!(matches!(next, Next::After(d) if d <= super::DRIFT_CHECK_INTERVAL), "{next:?}");
    w.clock.advance(super::DRIFT_CHECK_INTERVAL);
    w.step("c1").await;
    let drifted = w.claim_("c1").condition(condition_types::DRIFTED).unwrap().clone();
    assert_eq!((drifted.status, drifted.reason.as_str()), (crate::api::ConditionStatus::True, "AMIDrift"));
}

/// Pod events: a pod landing on a node or leaving it stamps the node's claim with the time, which
/// `consolidateAfter` counts from; a quiet node keeps its stamp, and DaemonSet pods are not events.
#[tokio::test]
async fn pod_events_stamp_the_claim_of_the_node_they_touch() {
    let mut w = World::new();
    running(&mut w, "c1").await;
    let stamp = |w: &World| w.claim_("c1").status.as_ref().and_then(|s| s.last_pod_event_time);
    let mut events = super::PodEvents::default();
    events.observe(&w.api, &w.api.snapshot(), w.clock.now()).await;
    assert_eq!(stamp(&w), None, "no pods yet");

    bound_pod(&mut w, "web", "node-c1", json!({}));
    w.clock.advance(Duration::from_secs(60));
    let landed = w.clock.now();
    events.observe(&w.api, &w.api.snapshot(), landed).await;
    assert_eq!(stamp(&w), Some(landed), "a pod landed");

    w.clock.advance(Duration::from_secs(60));
    events.observe(&w.api, &w.api.snapshot(), w.clock.now()).await;
    assert_eq!(stamp(&w), Some(landed), "nothing moved");

    bound_pod(
        &mut w,
        "agent",
        "node-c1",
        json!({"metadata": {"ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u"}]}}),
    );
    w.clock.advance(Duration::from_secs(60));
    events.observe(&w.api, &w.api.snapshot(), w.clock.now()).await;
    assert_eq!(stamp(&w), Some(landed), "a DaemonSet pod is not an event");

    w.api.lock().remove_pod("default/web");
    w.clock.advance(Duration::from_secs(60));
    let left = w.clock.now();
    events.observe(&w.api, &w.api.snapshot(), left).await;
    assert_eq!(stamp(&w), Some(left), "a pod left");

    // A pod bound elsewhere (deleted and recreated under the same name) touches both nodes.
    running(&mut w, "c2").await;
    let stamp2 = |w: &World| w.claim_("c2").status.as_ref().and_then(|s| s.last_pod_event_time);
    bound_pod(&mut w, "api", "node-c2", json!({}));
    w.clock.advance(Duration::from_secs(60));
    events.observe(&w.api, &w.api.snapshot(), w.clock.now()).await;
    assert_eq!(stamp(&w), Some(left), "c1 untouched");
    bound_pod(&mut w, "api", "node-c1", json!({}));
    w.clock.advance(Duration::from_secs(60));
    let moved = w.clock.now();
    events.observe(&w.api, &w.api.snapshot(), moved).await;
    assert_eq!((stamp(&w), stamp2(&w)), (Some(moved), Some(moved)), "the node it left and the node it landed on");
}

/// Pod events across many pods: pods leaving, landing and moving between others that stay, listed
/// before, between and after them, touch exactly their nodes.
#[tokio::test]
async fn pod_events_among_pods_that_stay_touch_only_the_nodes_that_changed() {
    let mut w = World::new();
    for c in ["c1", "c2", "c3", "c4"] {
        running(&mut w, c).await;
    }
    let stamps = |w: &World| -> Vec<Option<Timestamp>> {
        ["c1", "c2", "c3", "c4"]
            .iter()
            .map(|c| w.claim_(c).status.as_ref().and_then(|s| s.last_pod_event_time))
            .collect()
    };
    for (pod, node) in [("b", "node-c1"), ("d", "node-c2"), ("f", "node-c3"), ("h", "node-c1")] {
        bound_pod(&mut w, pod, node, json!({}));
    }
    let mut events = super::PodEvents::default();
    let first = w.clock.now();
    events.observe(&w.api, &w.api.snapshot(), first).await;
    assert_eq!(stamps(&w), [Some(first), Some(first), Some(first), None]);
    // "a" lands before every other pod, "d" leaves from between two that stay, "e" lands between, "f" moves
    // to c4, and "z" lands after them all: c1 keeps its stamp, as "b" and "h" stay.
    w.api.lock().remove_pod("default/d");
    w.api.lock().remove_pod("default/f");
    for (pod, node) in [("a", "node-c2"), ("e", "node-c2"), ("f", "node-c4"), ("z", "node-c4")] {
        bound_pod(&mut w, pod, node, json!({}));
    }
    w.clock.advance(Duration::from_secs(60));
    let then = w.clock.now();
    events.observe(&w.api, &w.api.snapshot(), then).await;
    assert_eq!(stamps(&w), [Some(first), Some(then), Some(then), Some(then)]);
    // The last pod in key order leaving is seen too.
    w.api.lock().remove_pod("default/z");
    w.clock.advance(Duration::from_secs(60));
    let last = w.clock.now();
    events.observe(&w.api, &w.api.snapshot(), last).await;
    assert_eq!(stamps(&w), [Some(first), Some(then), Some(then), Some(last)]);
    // A pod written over on the node it was on is no event; one that finishes leaves its node.
    w.api.lock().update_pod("default/b", |pod| {
        pod.metadata.labels.get_or_insert_with(Default::default).insert("touched".into(), "yes".into());
    });
    w.clock.advance(Duration::from_secs(60));
    events.observe(&w.api, &w.api.snapshot(), w.clock.now()).await;
    assert_eq!(stamps(&w), [Some(first), Some(then), Some(then), Some(last)]);
    w.api.lock().update_pod("default/h", |pod| {
        pod.status = serde_json::from_value(json!({"phase": "Succeeded"})).ok();
    });
    w.clock.advance(Duration::from_secs(60));
    let finished = w.clock.now();
    events.observe(&w.api, &w.api.snapshot(), finished).await;
    assert_eq!(stamps(&w), [Some(finished), Some(then), Some(then), Some(last)]);
}

/// An owner-less node is deleted only when the providers say its instance is gone: a throttled or refused
/// `get` proves nothing.
#[tokio::test]
async fn a_throttled_or_refused_get_never_deletes_an_owner_less_node() {
    let mut w = World::new();
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": "stray", "labels": {labels::NODE_POOL: "default"}},
        "spec": {"providerID": "fake://gone"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}))
        .unwrap();
    w.api.lock().put_node(node);
    for error in [CloudError::Throttled { retry_after: None }, CloudError::Unauthorized("expired token".into())] {
        w.cloud.inject(Method::Get, error, 1);
        let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
        assert!(done.is_empty(), "{done:?}");
        assert!(w.api.lock().nodes.contains_key("stray"), "the node stays while the provider cannot answer");
    }
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert_eq!(done, ["deleted Node/stray: no claim owns it and its instance is gone"]);
}

/// A claim whose NodeClass no provider serves is skipped by garbage collection and interruption
/// handling, with a condition and an event; the other claims are handled as usual.
#[tokio::test]
async fn a_claim_with_an_unknown_node_class_does_not_stop_garbage_collection() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    w.step("c1").await;
    let pid = w.claim_("c1").provider_id().unwrap().to_owned();
    let mut stranger = NodeClaim::clone(&w.claim_("c1"));
    stranger.metadata.name = Some("stranger".into());
    stranger.metadata.uid = Some("uid-stranger".into());
    stranger.spec.node_class_ref = Some(crate::api::NodeClassRef {
        group: "example.com".into(),
        kind: "MissingNodeClass".into(),
        name: "x".into(),
    });
    stranger.status.get_or_insert_with(Default::default).provider_id = Some("other://1".into());
    w.api.lock().put_claim(stranger);
    // c1's instance vanishes; the stranger's is not listed either.
    w.cloud.vanish(&pid);
    w.at(10);
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert_eq!(done, ["reclaimed NodeClaim/c1: its instance is gone"]);
    let cond = w.claim_("stranger").condition(condition_types::NODE_CLASS_READY).unwrap().clone();
    assert_eq!((cond.status, cond.reason.as_str()), (ConditionStatus::False, "NodeClassNotFound"));
    assert!(cond.message.contains("MissingNodeClass"), "{}", cond.message);
    assert!(w.api.lock().events.iter().any(|e| e.name == "stranger" && e.reason == "NodeClassNotFound"));
    // Interruptions go on too: a notice for the stranger's instance is acted on like any other.
    w.cloud.announce("other://1", InterruptionKind::SpotInterruption);
    let hit = w.lifecycle.poll_interruptions(&w.api, w.clock.now()).await.unwrap();
    assert_eq!(hit, ["stranger"]);
}

/// An instance whose claim exists but whose status write was lost is not an orphan: garbage collection
/// matches it to the claim by name and leaves it, and the claim records it without a second launch, even
/// after a restart emptied the launch cache.
#[tokio::test]
async fn an_instance_whose_status_write_was_lost_is_matched_to_its_claim_not_terminated() {
    use crate::cluster::memory::{Fault, Write};
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    // The finalizer lands; the status write after the launch is lost.
    w.api.lock().inject(Write::PatchClaimStatus, Fault::fail(crate::cluster::ApiErrorKind::Unavailable), 1);
    assert!(w.lifecycle.reconcile(&w.api, "c1", w.clock.now()).await.is_err());
    assert!(w.claim_("c1").provider_id().is_none());
    assert_eq!(w.cloud.instances().len(), 1);
    // The controller restarts: the launch cache is gone.
    w.lifecycle = Lifecycle::new(
        {
            let mut r = ProviderRegistry::new();
            r.register_arc(w.cloud.clone()).unwrap();
            r
        },
        w.unavailable.clone(),
        Settings::default(),
    );
    w.at(10);
    let done = w.lifecycle.collect_garbage(&w.api, w.clock.now()).await.unwrap();
    assert!(done.is_empty(), "past the orphan grace, but not an orphan: {done:?}");
    assert_eq!(w.cloud.instances().len(), 1);
    w.step("c1").await;
    assert_eq!(w.cloud.create_calls(), 1, "no second launch");
    assert_eq!(w.claim_("c1").provider_id(), Some(w.cloud.instances()[0].provider_id.as_str()));
}

/// A claim whose NodeClass no provider serves is not launched: it is marked NodeClassReady=False with an
/// event, and looked at again later.
#[tokio::test]
async fn a_claim_with_an_unknown_node_class_is_marked_and_not_launched() {
    let mut w = World::new();
    w.claim("c1", gpu_reqs(), json!({}));
    let mut c = NodeClaim::clone(&w.claim_("c1"));
    c.spec.node_class_ref =
        Some(crate::api::NodeClassRef { group: "example.com".into(), kind: "Missing".into(), name: "x".into() });
    w.api.lock().put_claim(c);
    assert_eq!(w.step("c1").await, Next::After(UNROUTABLE_RECHECK));
    assert_eq!(w.cloud.create_calls(), 0);
    let cond = w.claim_("c1").condition(condition_types::NODE_CLASS_READY).unwrap().clone();
    assert_eq!((cond.status, cond.reason.as_str()), (ConditionStatus::False, "NodeClassNotFound"));
    assert_eq!(w.api.lock().events.iter().filter(|e| e.reason == "NodeClassNotFound").count(), 1);
    w.step("c1").await;
    assert_eq!(w.api.lock().events.len(), 1, "marked once");
}
