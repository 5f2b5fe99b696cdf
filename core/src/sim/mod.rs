//! The autoscaler in virtual time. The simulator holds only the world: an in-memory API server
//! ([`InMemoryApi`]: resourceVersions, finalizers, injectable write faults), a provider, a simulated
//! kube-scheduler (binds pending pods to nodes that fit, with the same constraints, honouring the nodes'
//! real taints), kubelet (registers launched instances after a boot delay, reports GPUs after a
//! device-plugin delay), DaemonSet controller (one pod of each DaemonSet on every node it fits) and
//! workloads. tenon's controllers run in the [`Runtime`], exactly as `tenon run` runs them, over the same
//! [`Cluster`](crate::cluster::Cluster) port.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde_json::json;

use crate::api::{NodeClaim, NodePool, condition_types, labels};
use crate::clock::{self, Clock, VirtualClock};
use crate::cloud::{CloudProvider, DynCloudProvider, ProviderRegistry, UnavailableOfferings};
use crate::cluster::{InMemoryApi, Snapshot, node_provider_id, pod_key};
use crate::disruption::queue::Event;
use crate::runtime::{Runtime, counter_names};
use crate::scheduling::{DaemonPod, Scheduler, SchedulerOptions};
use crate::settings::Settings;
use crate::state::{ClusterState, ObjectMemo, daemon_pod};

/// How the simulated nodes behave.
#[derive(Debug, Clone)]
pub struct Kubelet {
    /// From launch to the node registering.
    pub registration_delay: Duration,
    /// From registration to extended resources (GPUs) being reported and startup taints removed.
    pub device_plugin_delay: Duration,
    /// Registration delays by instance family (the instance type's name up to its first `.`).
    pub registration_delay_by_family: BTreeMap<String, Duration>,
}

impl Default for Kubelet {
    fn default() -> Self {
        Self {
            registration_delay: Duration::from_secs(60),
            device_plugin_delay: Duration::from_secs(30),
            registration_delay_by_family: BTreeMap::new(),
        }
    }
}

impl Kubelet {
    /// How long an instance of `instance_type` takes to register.
    pub fn registration_delay_for(&self, instance_type: Option<&str>) -> Duration {
        let family = instance_type.map(|t| t.split('.').next().unwrap_or(t));
        family.and_then(|f| self.registration_delay_by_family.get(f)).copied().unwrap_or(self.registration_delay)
    }
}

/// The simulated world: an in-memory API server, a provider, a kube-scheduler, kubelets, a DaemonSet
/// controller and workload controllers, with the [`Runtime`] driving tenon's controllers over them in
/// virtual time. The world only moves objects the way those components would; every decision is the
/// runtime's.
pub struct Sim {
    /// The virtual clock.
    pub clock: Arc<VirtualClock>,
    /// The provider.
    pub provider: DynCloudProvider,
    /// The API server.
    pub api: Arc<InMemoryApi>,
    /// Settings.
    pub settings: Settings,
    /// tenon's controllers (rebuilt from scratch by [`Sim::crash`]).
    pub runtime: Runtime,
    /// Kubelet behaviour.
    pub kubelet: Kubelet,
    /// Instances whose kubelet never registers (by provider id).
    pub never_register: HashSet<String>,
    /// Instances whose node registers but never turns Ready (by provider id).
    pub never_ready: HashSet<String>,
    /// Extra registration delay per provider id.
    pub late: HashMap<String, Duration>,
    /// Pods a workload controller keeps alive: recreated (unbound) when evicted. Each is in the API from
    /// the moment it is added ([`Sim::add_pod`]) until it is removed for good ([`Sim::remove_pod`]).
    desired: BTreeMap<String, Pod>,
    /// The API's count of pod removals when the workload controller last made every desired pod present:
    /// while it stays the same, none is missing.
    desired_present_at: Option<u64>,
    /// The cluster's digest after a scheduling attempt that bound nothing: until it changes, pending pods
    /// stay unschedulable (kube-scheduler's unschedulable queue).
    unschedulable_digest: Option<u64>,
    /// What those digests are made with.
    digests: crate::disruption::DigestState,
    /// Disruption events, in order.
    pub events: Vec<(Timestamp, Event)>,
    /// Nodes rebooting for repair, and when each is back.
    rebooted: HashMap<String, Timestamp>,
    /// Each DaemonSet's pod as the scheduler sees it, in the order of the API's DaemonSets.
    daemon_pods: Vec<DaemonPod>,
    /// What the DaemonSet controller last ran over ([`Sim::run_daemons`]).
    daemons_ran_over: Option<DaemonInputs>,
    /// The API's count of node removals when the DaemonSet controller last removed the daemon pods of
    /// nodes gone: while it stays the same, every daemon pod's node is there (the controller creates them on
    /// nodes, and a daemon pod added otherwise clears this).
    orphaned_daemons_checked_at: Option<u64>,
    /// Each node's allocatable as its kubelet reports it, read once per node object.
    reported: ObjectMemo<Node, Option<crate::resources::Resources>>,
    /// Claim names handed out so far (shared by every runtime, so a restart never reuses one).
    names: Arc<AtomicU64>,
    /// The unavailable-offerings cache, shared with the provider and kept across restarts.
    pub unavailable: Arc<UnavailableOfferings>,
}

impl Sim {
    /// A world over `provider` with `pools`.
    pub fn new(clock: Arc<VirtualClock>, provider: DynCloudProvider, pools: Vec<NodePool>, settings: Settings) -> Self {
        let now = clock.now();
        let api = Arc::new(InMemoryApi::new(now));
        api.lock().set_pools(pools);
        let names = Arc::new(AtomicU64::new(0));
        let unavailable = Arc::new(UnavailableOfferings::new());
        let runtime = Self::make_runtime(&clock, &provider, &settings, &names, &unavailable);
        Self {
            clock,
            provider,
            api,
            settings,
            runtime,
            kubelet: Kubelet::default(),
            never_register: HashSet::new(),
            never_ready: HashSet::new(),
            late: HashMap::new(),
            desired: BTreeMap::new(),
            desired_present_at: None,
            unschedulable_digest: None,
            digests: Default::default(),
            events: Vec::new(),
            rebooted: HashMap::new(),
            daemon_pods: Vec::new(),
            daemons_ran_over: None,
            orphaned_daemons_checked_at: None,
            reported: ObjectMemo::default(),
            names,
            unavailable,
        }
    }

    fn make_runtime(
        clock: &Arc<VirtualClock>,
        provider: &DynCloudProvider,
        settings: &Settings,
        names: &Arc<AtomicU64>,
        unavailable: &Arc<UnavailableOfferings>,
    ) -> Runtime {
        let mut registry = ProviderRegistry::new();
        // One provider per world: registering it cannot collide.
        let _ = registry.register_arc(provider.clone());
        let clock: crate::clock::SharedClock = clock.clone();
        Runtime::new(clock, registry, settings.clone(), counter_names(names.clone()))
            .with_unavailable(unavailable.clone())
    }

    /// Adds a DaemonSet: provisioning counts its pod on the nodes it would land on, and every registered
    /// node it fits runs one.
    pub fn add_daemon_set(&mut self, ds: DaemonSet) -> Result<(), crate::scheduling::PodError> {
        self.daemon_pods.push(daemon_pod(&ds)?);
        self.api.lock().add_daemon_set(ds);
        Ok(())
    }

    /// Changes the settings, restarting the controllers under them.
    pub fn set_settings(&mut self, settings: Settings) {
        self.settings = settings;
        self.crash();
    }

    /// The controller process restarts: everything it held in memory is gone and rebuilt from the cluster.
    pub fn crash(&mut self) {
        self.runtime = Self::make_runtime(&self.clock, &self.provider, &self.settings, &self.names, &self.unavailable);
    }

    /// Adds a pod kept alive by a workload controller.
    pub fn add_pod(&mut self, pod: Pod) {
        let key = pod_key(&pod);
        if crate::cluster::owned_by_daemon_set(&pod) {
            // Its node may be gone: the DaemonSet controller looks again.
            self.orphaned_daemons_checked_at = None;
        }
        self.desired.insert(key, pod.clone());
        self.api.lock().put_pod(pod);
    }

    /// Removes a pod for good (a finished job, a scale-down).
    pub fn remove_pod(&mut self, key: &str) {
        self.desired.remove(key);
        self.api.lock().remove_pod(key);
    }

    /// The cluster as it is now (the world reads the API's objects directly, never a lagging snapshot).
    pub fn state(&mut self) -> ClusterState {
        let now = self.clock.now();
        let s = self.api.lock().snapshot();
        ClusterState::from_snapshot(&s, now, self.runtime.state_cache()).unwrap_or_default()
    }

    /// Advances virtual time by `total` in steps of `step`, running the world and the runtime at each step.
    pub async fn run(&mut self, total: Duration, step: Duration) {
        let end = clock::add(self.clock.now(), total);
        while self.clock.now() < end {
            self.clock.advance(step);
            self.tick().await;
        }
    }

    /// Moves the world, then runs the runtime once, at the current time.
    pub async fn tick(&mut self) {
        let now = self.clock.now();
        self.api.set_now(now);
        self.workloads();
        self.kubelets(now).await;
        self.run_daemons(now);
        self.schedule_pods(now);
        self.runtime.step(&*self.api).await;
        for (at, e) in self.runtime.take_decisions() {
            if let Event::Reboot { node, claim } = &e {
                let snapshot = self.api.lock().snapshot();
                if let Some(c) = snapshot.claim(claim) {
                    // A reboot takes as long as the instance family takes to boot and register, its
                    // kubelet down meanwhile.
                    let boot = self.kubelet.registration_delay_for(c.label(labels::INSTANCE_TYPE));
                    self.rebooted.insert(node.clone(), clock::add(now, boot));
                    self.api.lock().update_node(node, |n| set_ready(n, "False", now));
                }
            }
            self.events.push((at, e));
        }
        // A rebooted node's kubelet comes back (Ready again) once it has booted; tenon lifts the taint.
        let back: Vec<String> =
            self.rebooted.iter().filter(|(_, back_at)| now >= **back_at).map(|(n, _)| n.clone()).collect();
        for n in back {
            self.rebooted.remove(&n);
            self.api.lock().update_node(&n, |node| set_ready(node, "True", now));
        }
    }

    fn workloads(&mut self) {
        let mut api = self.api.lock();
        if self.desired_present_at == Some(api.pod_removals()) {
            return;
        }
        // Both maps are sorted by key: one walk over the two finds the desired pods the cluster lacks, where a
        // lookup per desired pod would compare each key with a dozen others.
        let mut missing = Vec::new();
        let mut present = api.pods.keys().peekable();
        for (key, pod) in &self.desired {
            while present.next_if(|k| *k < key).is_some() {}
            if present.next_if(|k| *k == key).is_none() {
                missing.push(pod);
            }
        }
        for pod in missing {
            let mut fresh = pod.clone();
            if let Some(spec) = fresh.spec.as_mut() {
                spec.node_name = None;
            }
            fresh.status = None;
            api.put_pod(fresh);
        }
        self.desired_present_at = Some(api.pod_removals());
    }

    async fn kubelets(&mut self, now: Timestamp) {
        let snapshot = self.api.lock().snapshot();
        let registered: HashSet<&str> = snapshot.nodes.values().filter_map(|n| node_provider_id(n)).collect();
        for claim in snapshot.claims.values() {
            let Some(pid) = claim.provider_id() else { continue };
            if registered.contains(pid)
                || self.never_register.contains(pid)
                || claim.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let launched =
                claim.condition(condition_types::LAUNCHED).and_then(|c| c.last_transition_time).unwrap_or(now);
            let instance_type = claim.metadata.labels.as_ref().and_then(|l| l.get(labels::INSTANCE_TYPE));
            let delay = self.kubelet.registration_delay_for(instance_type.map(String::as_str))
                + self.late.get(pid).copied().unwrap_or_default();
            if clock::since(now, launched) < delay || self.provider.get(pid).await.is_err() {
                continue;
            }
            let status = claim.status.clone().unwrap_or_default();
            let mut allocatable = status.allocatable.clone();
            for (k, v) in allocatable.iter_mut() {
                if !["cpu", "memory", "pods", "ephemeral-storage"].contains(&k.as_str()) {
                    v.0 = "0".into();
                }
            }
            let mut taints = vec![json!({"key": labels::UNREGISTERED_TAINT, "effect": "NoExecute"})];
            taints.extend(
                claim.spec.startup_taints.iter().map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect})),
            );
            let ready = if self.never_ready.contains(pid) { "False" } else { "True" };
            let node: Option<Node> = serde_json::from_value(json!({
                "metadata": {"name": claim.name(), "labels": {labels::HOSTNAME: claim.name()},
                    "annotations": {"tenon.dev/registered-at": now.to_string()}},
                "spec": {"providerID": pid, "taints": taints},
                "status": {"capacity": status.capacity, "allocatable": allocatable,
                    "conditions": [{"type": "Ready", "status": ready}]}
            }))
            .ok();
            if let Some(node) = node {
                self.api.lock().put_node(node);
            }
        }
        // The device plugin reports GPUs, and startup taints clear, after their delay.
        let snapshot = self.api.lock().snapshot();
        for (name, shared) in snapshot.nodes.iter() {
            let Some(claim) = snapshot.claims.get(name) else { continue };
            let startup =
                |t: &k8s_openapi::api::core::v1::Taint| claim.spec.startup_taints.iter().any(|s| s.key == t.key);
            let reported = shared.status.as_ref().and_then(|s| s.allocatable.as_ref());
            let empty = BTreeMap::new();
            let full_ref = claim.status.as_ref().map_or(&empty, |s| &s.allocatable);
            let tainted = shared.spec.iter().flat_map(|s| s.taints.iter().flatten()).any(startup);
            // Written once: a node already reporting everything is left as it is (and stays shared).
            if (shared.status.is_none() || reported == Some(full_ref)) && !tainted {
                continue;
            }
            let Some(at) = shared
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("tenon.dev/registered-at"))
                .and_then(|t| t.parse::<Timestamp>().ok())
            else {
                continue;
            };
            if clock::since(now, at) < self.kubelet.device_plugin_delay {
                continue;
            }
            let full = full_ref.clone();
            self.api.lock().update_node(name, |node| {
                if let Some(st) = node.status.as_mut() {
                    st.allocatable = Some(full);
                }
                if let Some(t) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                    t.retain(|t| !startup(t));
                }
            });
        }
    }

    /// The DaemonSet controller: a pod of each DaemonSet on every node whose labels and taints it accepts,
    /// gone with its node.
    fn run_daemons(&mut self, now: Timestamp) {
        let mut api = self.api.lock();
        if api.daemon_sets.is_empty() {
            return;
        }
        // The same nodes, claims and DaemonSets, and no pod removed: every daemon pod still has its node,
        // and each node runs all it did, which was all it could.
        if self.daemons_ran_over.as_ref().is_some_and(|last| last.unchanged_in(&api)) {
            return;
        }
        let nodes = api.nodes.clone();
        if self.orphaned_daemons_checked_at != Some(api.node_removals()) {
            api.retain_pods(|p| {
                let daemon = crate::cluster::owned_by_daemon_set(p);
                let node = p.spec.as_ref().and_then(|s| s.node_name.as_ref());
                !daemon || node.is_some_and(|n| nodes.contains_key(n))
            });
            self.orphaned_daemons_checked_at = Some(api.node_removals());
        }
        let claims = api.claims.clone();
        let daemon_sets = api.daemon_sets.clone();
        for (name, node) in nodes.iter() {
            // A node being deleted takes no new daemons.
            if node.metadata.deletion_timestamp.is_some() {
                continue;
            }
            // Most nodes already run every daemon: nothing to read of them.
            let key = |ds: &DaemonSet| {
                let ds_name = ds.metadata.name.as_deref().unwrap_or_default();
                let namespace = ds.metadata.namespace.as_deref().unwrap_or("default");
                format!("{namespace}/{ds_name}-{name}")
            };
            if daemon_sets.iter().all(|ds| api.pods.contains_key(&key(ds))) {
                continue;
            }
            // The claim's labels and taints: the node's own arrive with registration sync.
            let claim = claims.get(name);
            let (claim_labels, node_labels) =
                (claim.and_then(|c| c.metadata.labels.as_ref()), node.metadata.labels.as_ref());
            let label = |k: &str| {
                claim_labels.and_then(|l| l.get(k)).or_else(|| node_labels.and_then(|l| l.get(k))).map(String::as_str)
            };
            // Nor does a node being disrupted: its disrupted taint is one no DaemonSet tolerates by default,
            // and a drain that evicted a daemon must not see it come back.
            let mut taints = claim.map(|c| c.spec.taints.clone()).unwrap_or_default();
            taints.extend(
                node.spec
                    .iter()
                    .flat_map(|s| s.taints.iter().flatten())
                    .filter(|t| t.key == labels::DISRUPTED_TAINT)
                    .cloned(),
            );
            for (ds, daemon) in daemon_sets.iter().zip(&self.daemon_pods) {
                let ds_name = ds.metadata.name.as_deref().unwrap_or_default();
                let namespace = ds.metadata.namespace.as_deref().unwrap_or("default");
                if api.pods.contains_key(&key(ds)) || !daemon.tolerates(&taints) || !daemon.runs_on_with(label) {
                    continue;
                }
                let template = ds.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
                let mut spec = template.spec.unwrap_or_default();
                spec.node_name = Some(name.clone());
                let pod = Pod {
                    metadata: ObjectMeta {
                        name: Some(format!("{ds_name}-{name}")),
                        namespace: Some(namespace.to_owned()),
                        labels: template.metadata.and_then(|m| m.labels),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "apps/v1".into(),
                            kind: "DaemonSet".into(),
                            name: ds_name.to_owned(),
                            uid: ds.metadata.uid.clone().unwrap_or_default(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    spec: Some(spec),
                    status: serde_json::from_value(json!({"phase": "Running", "startTime": now.to_string()})).ok(),
                };
                api.put_pod(pod);
            }
        }
        self.daemons_ran_over = Some(DaemonInputs::of(&api));
    }

    /// A digest of what kube-scheduler decides on: pods and where they run, nodes with their taints,
    /// allocatable and conditions.
    fn scheduling_digest(snapshot: &Snapshot, state: &crate::disruption::DigestState) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = state.build_hasher();
        for (key, p) in snapshot.pods.iter() {
            (key, p.spec.as_ref().and_then(|s| s.node_name.as_ref())).hash(&mut h);
            p.status.as_ref().and_then(|s| s.phase.as_ref()).hash(&mut h);
        }
        for (name, n) in snapshot.nodes.iter() {
            (name, n.metadata.deletion_timestamp.is_some()).hash(&mut h);
            for t in n.spec.iter().flat_map(|s| s.taints.iter().flatten()) {
                (&t.key, &t.effect).hash(&mut h);
            }
            if let Some(st) = n.status.as_ref() {
                for (k, v) in st.allocatable.iter().flatten() {
                    (k, &v.0).hash(&mut h);
                }
                for c in st.conditions.iter().flatten() {
                    (&c.type_, &c.status).hash(&mut h);
                }
            }
        }
        h.finish()
    }

    /// The kube-scheduler: binds pending pods to nodes that fit.
    fn schedule_pods(&mut self, now: Timestamp) {
        let snapshot = self.api.lock().snapshot();
        // Most steps bind nothing: skip building the cluster state when no pod waits for a node, or when
        // nothing changed since an attempt that bound nothing.
        if !snapshot.any_unbound() {
            return;
        }
        // The digest is worked out up front only to compare with an attempt that bound nothing; otherwise
        // only once this attempt binds nothing.
        if let Some(last) = self.unschedulable_digest
            && Self::scheduling_digest(&snapshot, &self.digests) == last
        {
            return;
        }
        let state = self.state();
        // kube-scheduler sees the node's actual taints (unregistered, startup, disrupted), not the ones
        // planned for.
        let reported = &mut self.reported;
        let nodes: Vec<_> = state
            .nodes
            .iter()
            .filter_map(|n| Some((n, n.node.as_ref()?)))
            .filter(|(n, _)| n.ready)
            .map(|(n, node)| {
                let mut e = n.as_existing();
                e.taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
                let read = || {
                    let list = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
                    list.and_then(|a| crate::resources::Resources::from_resource_list(a).ok())
                };
                let real = reported.get(node, read).unwrap_or_else(|| n.allocatable.clone());
                e.available = real.sub(&n.requested);
                e
            })
            .collect();
        reported.end_round();
        let pending: Vec<_> = state.pending_pods().map(|p| Arc::clone(&p.info)).collect();
        if nodes.is_empty() || pending.is_empty() {
            self.unschedulable_digest = Some(Self::scheduling_digest(&snapshot, &self.digests));
            return;
        }
        let bound = state.bound_on_nodes();
        let results = Scheduler::with_bound_on_nodes(Vec::new(), nodes, &bound, &[], SchedulerOptions::default())
            .solve_shared(pending);
        let bound_any = results.existing.iter().any(|p| !p.pods.is_empty());
        self.unschedulable_digest = (!bound_any).then(|| Self::scheduling_digest(&snapshot, &self.digests));
        // Let go of the objects before writing to them: a write to a map a snapshot still shares copies it
        // whole.
        drop(snapshot);
        drop(state);
        let mut api = self.api.lock();
        for placed in results.existing {
            for key in placed.pods {
                api.update_pod(&key, |pod| {
                    if let Some(spec) = pod.spec.as_mut() {
                        spec.node_name = Some(placed.node.clone());
                    }
                    pod.status = serde_json::from_value(json!({"phase": "Running", "startTime": now.to_string()})).ok();
                });
            }
        }
    }

    /// Live claims (not being deleted).
    pub fn live_claims(&self) -> Vec<Arc<NodeClaim>> {
        self.api
            .lock()
            .snapshot()
            .claims
            .values()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect()
    }

    /// Pods not bound to a node.
    pub fn pending(&self) -> Vec<String> {
        self.api
            .lock()
            .pods
            .iter()
            .filter(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// What the simulated DaemonSet controller read: the API's nodes, claims and DaemonSets (held weakly, see
/// [`unchanged_since`](crate::cluster::unchanged_since)) and its count of pod removals. Only the
/// controller adds daemon pods, so while these are the same it has nothing to do.
struct DaemonInputs {
    nodes: std::sync::Weak<BTreeMap<String, Arc<k8s_openapi::api::core::v1::Node>>>,
    claims: std::sync::Weak<BTreeMap<String, Arc<NodeClaim>>>,
    daemon_sets: std::sync::Weak<Vec<DaemonSet>>,
    pod_removals: u64,
}

impl DaemonInputs {
    fn of(api: &crate::cluster::memory::Objects) -> Self {
        Self {
            nodes: Arc::downgrade(&api.nodes),
            claims: Arc::downgrade(&api.claims),
            daemon_sets: Arc::downgrade(&api.daemon_sets),
            pod_removals: api.pod_removals(),
        }
    }

    /// Whether `api` still holds these nodes, claims and DaemonSets, and removed no pod since.
    fn unchanged_in(&self, api: &crate::cluster::memory::Objects) -> bool {
        use crate::cluster::unchanged_since;
        unchanged_since(&self.nodes, &api.nodes)
            && unchanged_since(&self.claims, &api.claims)
            && unchanged_since(&self.daemon_sets, &api.daemon_sets)
            && self.pod_removals == api.pod_removals()
    }
}

/// A pod requesting `cpu` and optionally GPUs, for simulations and tests.
pub fn pod(name: &str, cpu: &str, gpus: u32) -> Pod {
    let mut requests = json!({"cpu": cpu, "memory": "1Gi"});
    if gpus > 0 {
        requests["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": Time(Timestamp::UNIX_EPOCH)},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    }))
    .unwrap_or_default()
}

pub mod scenario;

#[cfg(test)]
mod tests;

/// Sets a node's `Ready` condition to `status`, as its kubelet would, with a transition at `now` when it
/// changes.
fn set_ready(node: &mut k8s_openapi::api::core::v1::Node, status: &str, now: Timestamp) {
    use k8s_openapi::api::core::v1::NodeCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let conditions = node.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(c) if c.status == status => {}
        Some(c) => {
            c.status = status.to_owned();
            c.last_transition_time = Some(Time(now));
        }
        None => conditions.push(NodeCondition {
            type_: "Ready".into(),
            status: status.to_owned(),
            last_transition_time: Some(Time(now)),
            ..Default::default()
        }),
    }
}
