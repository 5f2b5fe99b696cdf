//! The autoscaler in virtual time: the real provisioning, lifecycle, garbage-collection and disruption
//! controllers over an in-memory cluster and a provider, with a simulated kube-scheduler (binds pending pods
//! to nodes that fit, with the same constraints) and kubelet (registers launched instances after a boot
//! delay, reports GPUs after a device-plugin delay) and DaemonSet controller (one pod of each DaemonSet on
//! every node it fits).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde_json::json;

use crate::api::{NodeClaim, NodePool, condition_types, labels};
use crate::clock::{self, Clock, VirtualClock};
use crate::cloud::{CloudProvider, DynCloudProvider, InstanceType, ProviderRegistry, UnavailableOfferings};
use crate::cluster::{InMemoryCluster, pod_key};
use crate::disruption::queue::{Controller, Event};
use crate::lifecycle::{Lifecycle, Next};
use crate::provisioning::{self, Batcher, Nominations};
use crate::scheduling::{DaemonPod, Scheduler, SchedulerOptions};
use crate::settings::Settings;
use crate::state::{ClusterState, PodInfoCache, daemon_pod};

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

/// The simulated world.
pub struct Sim {
    /// The virtual clock.
    pub clock: Arc<VirtualClock>,
    /// The provider.
    pub provider: DynCloudProvider,
    /// The cluster.
    pub cluster: InMemoryCluster,
    /// NodePools.
    pub pools: Vec<NodePool>,
    /// Settings.
    pub settings: Settings,
    /// The unavailable-offerings cache, shared by provisioning and launch.
    pub unavailable: Arc<UnavailableOfferings>,
    /// The lifecycle controller.
    pub lifecycle: Lifecycle,
    /// The provisioning batcher.
    pub batcher: Batcher,
    /// Pods nominated to capacity on its way.
    pub nominations: Nominations,
    /// The disruption controller and its queue.
    pub disruption: Controller,
    /// Kubelet behaviour.
    pub kubelet: Kubelet,
    /// Instances whose kubelet never registers (by provider id).
    pub never_register: HashSet<String>,
    /// Instances whose node registers but never turns Ready (by provider id).
    pub never_ready: HashSet<String>,
    /// Extra registration delay per provider id.
    pub late: HashMap<String, Duration>,
    /// Pods a workload controller keeps alive: recreated (unbound) when evicted.
    pub desired: BTreeMap<String, Pod>,
    /// For each claim still booting, the pods provisioning last planned onto it.
    pub reserved: HashMap<String, Vec<String>>,
    /// Instance types (refreshed from the provider each provisioning pass).
    types: Vec<InstanceType>,
    next_gc: Timestamp,
    /// The cluster's digest after a scheduling attempt that bound nothing: until it changes, pending pods
    /// stay unschedulable (kube-scheduler's unschedulable queue).
    unschedulable_digest: Option<u64>,
    /// Pod events stamped on claims, for `consolidateAfter`.
    pub pod_events: crate::lifecycle::PodEvents,
    seq: u64,
    /// Disruption events, in order.
    pub events: Vec<(Timestamp, Event)>,
    /// Nodes rebooting for repair, and when each is back.
    rebooted: HashMap<String, Timestamp>,
    /// DaemonSets.
    daemon_sets: Vec<DaemonSet>,
    /// Each DaemonSet's pod as the scheduler sees it, in the order of `daemon_sets`.
    daemon_pods: Vec<DaemonPod>,
    /// Scheduling views of the pods, reused across state builds while a pod is unchanged.
    pod_infos: std::sync::Mutex<PodInfoCache>,
}

impl Sim {
    /// A world over `provider` with `pools`.
    pub fn new(clock: Arc<VirtualClock>, provider: DynCloudProvider, pools: Vec<NodePool>, settings: Settings) -> Self {
        let unavailable = Arc::new(UnavailableOfferings::new());
        let lifecycle = Self::make_lifecycle(&provider, &unavailable, &settings);
        let now = clock.now();
        let disruption = Self::make_disruption(&provider);
        Self {
            clock,
            provider,
            cluster: InMemoryCluster { now: Some(now), ..Default::default() },
            pools,
            batcher: Batcher::from_settings(&settings),
            settings,
            unavailable,
            lifecycle,
            nominations: Nominations::default(),
            disruption,
            kubelet: Kubelet::default(),
            never_register: HashSet::new(),
            never_ready: HashSet::new(),
            late: HashMap::new(),
            desired: BTreeMap::new(),
            reserved: HashMap::new(),
            types: Vec::new(),
            next_gc: now,
            unschedulable_digest: None,
            pod_events: Default::default(),
            seq: 0,
            events: Vec::new(),
            rebooted: HashMap::new(),
            daemon_sets: Vec::new(),
            daemon_pods: Vec::new(),
            pod_infos: Default::default(),
        }
    }

    /// Adds a DaemonSet: provisioning counts its pod on the nodes it would land on, and every registered
    /// node it fits runs one.
    pub fn add_daemon_set(&mut self, ds: DaemonSet) -> Result<(), crate::scheduling::PodError> {
        self.daemon_pods.push(daemon_pod(&ds)?);
        self.daemon_sets.push(ds);
        Ok(())
    }

    fn make_lifecycle(
        provider: &DynCloudProvider,
        unavailable: &Arc<UnavailableOfferings>,
        settings: &Settings,
    ) -> Lifecycle {
        let mut registry = ProviderRegistry::new();
        // One provider per world: registering it cannot collide.
        let _ = registry.register_arc(provider.clone());
        Lifecycle::new(registry, unavailable.clone(), settings.clone())
    }

    fn make_disruption(provider: &DynCloudProvider) -> Controller {
        let mut c = Controller::new();
        c.repair_policies = provider.repair_policies();
        c.reboot_supported = true;
        c
    }

    /// The controller process restarts: everything it held in memory is gone and rebuilt from the cluster.
    pub fn crash(&mut self) {
        self.lifecycle = Self::make_lifecycle(&self.provider, &self.unavailable, &self.settings);
        self.batcher = Batcher::from_settings(&self.settings);
        self.nominations = Nominations::default();
        // In-flight commands are forgotten; their candidates keep the disrupted taint until a later pass.
        self.disruption = Self::make_disruption(&self.provider);
    }

    /// Adds a pod kept alive by a workload controller.
    pub fn add_pod(&mut self, pod: Pod) {
        let key = pod_key(&pod);
        self.desired.insert(key.clone(), pod.clone());
        self.cluster.pods.insert(key, Arc::new(pod));
    }

    /// Removes a pod for good (a finished job, a scale-down).
    pub fn remove_pod(&mut self, key: &str) {
        self.desired.remove(key);
        self.cluster.pods.remove(key);
    }

    /// The cluster as the controllers see it.
    pub fn state(&self) -> ClusterState {
        let now = self.clock.now();
        let c = &self.cluster;
        // A poisoned lock only means a panic elsewhere mid-build: the cache is still sound (it is keyed on
        // the objects themselves).
        let mut cache = self.pod_infos.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut s = ClusterState::from_shared(
            c.pods.values(),
            c.nodes.values(),
            c.claims.values(),
            &self.daemon_sets,
            &c.pdbs,
            &self.pools,
            now,
            &mut cache,
        )
        .unwrap_or_default();
        self.disruption.queue.apply(&mut s);
        s
    }

    /// Advances virtual time by `total` in steps of `step`, running every controller at each step.
    pub async fn run(&mut self, total: Duration, step: Duration) {
        let end = clock::add(self.clock.now(), total);
        while self.clock.now() < end {
            self.clock.advance(step);
            self.tick().await;
        }
    }

    /// Runs every controller once at the current time.
    pub async fn tick(&mut self) {
        let now = self.clock.now();
        self.cluster.now = Some(now);
        self.workloads();
        self.kubelets(now).await;
        self.run_daemons(now);
        self.schedule_pods(now);
        self.provision(now).await;
        let _ = self.lifecycle.poll_interruptions(&mut self.cluster, now).await;
        self.reconcile_claims(now).await;
        self.pod_events.observe(&mut self.cluster, now);
        // Garbage collection every two minutes; a failed run (a throttled list) is retried next tick.
        if now >= self.next_gc && self.lifecycle.collect_garbage(&mut self.cluster, now).await.is_ok() {
            self.next_gc = clock::add(now, Duration::from_secs(120));
        }
        self.disrupt(now).await;
    }

    fn workloads(&mut self) {
        for (key, pod) in &self.desired {
            if !self.cluster.pods.contains_key(key) {
                let mut fresh = pod.clone();
                if let Some(spec) = fresh.spec.as_mut() {
                    spec.node_name = None;
                }
                fresh.status = None;
                self.cluster.pods.insert(key.clone(), Arc::new(fresh));
            }
        }
    }

    async fn kubelets(&mut self, now: Timestamp) {
        let registered: HashSet<String> =
            self.cluster.nodes.values().filter_map(|n| n.spec.as_ref()?.provider_id.clone()).collect();
        for claim in self.cluster.claims.values() {
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
                self.cluster.nodes.insert(claim.name().to_owned(), Arc::new(node));
            }
        }
        // The device plugin reports GPUs, and startup taints clear, after their delay.
        for shared in self.cluster.nodes.values_mut() {
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
            let name = shared.metadata.name.clone().unwrap_or_default();
            let Some(claim) = self.cluster.claims.get(&name) else { continue };
            let full = claim.status.as_ref().map(|s| s.allocatable.clone()).unwrap_or_default();
            let startup =
                |t: &k8s_openapi::api::core::v1::Taint| claim.spec.startup_taints.iter().any(|s| s.key == t.key);
            let reported = shared.status.as_ref().and_then(|s| s.allocatable.as_ref());
            let tainted = shared.spec.iter().flat_map(|s| s.taints.iter().flatten()).any(startup);
            // Written once: a node already reporting everything is left as it is (and stays shared).
            if (shared.status.is_none() || reported == Some(&full)) && !tainted {
                continue;
            }
            let node = Arc::make_mut(shared);
            if let Some(st) = node.status.as_mut() {
                st.allocatable = Some(full);
            }
            if let Some(t) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                t.retain(|t| !startup(t));
            }
        }
    }

    /// The DaemonSet controller: a pod of each DaemonSet on every node whose labels and taints it accepts,
    /// gone with its node.
    fn run_daemons(&mut self, now: Timestamp) {
        if self.daemon_sets.is_empty() {
            return;
        }
        let nodes = &self.cluster.nodes;
        self.cluster.pods.retain(|_, p| {
            let daemon = crate::cluster::owned_by_daemon_set(p);
            let node = p.spec.as_ref().and_then(|s| s.node_name.as_ref());
            !daemon || node.is_some_and(|n| nodes.contains_key(n))
        });
        for (name, node) in &self.cluster.nodes {
            // A node being deleted takes no new daemons.
            if node.metadata.deletion_timestamp.is_some() {
                continue;
            }
            // The claim's labels and taints: the node's own arrive with registration sync.
            let claim = self.cluster.claims.get(name);
            let mut labels = node.metadata.labels.clone().unwrap_or_default();
            if let Some(l) = claim.and_then(|c| c.metadata.labels.as_ref()) {
                labels.extend(l.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
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
            for (ds, daemon) in self.daemon_sets.iter().zip(&self.daemon_pods) {
                let ds_name = ds.metadata.name.as_deref().unwrap_or_default();
                let namespace = ds.metadata.namespace.as_deref().unwrap_or("default");
                let key = format!("{namespace}/{ds_name}-{name}");
                if self.cluster.pods.contains_key(&key) || !daemon.tolerates(&taints) || !daemon.runs_on(&labels) {
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
                self.cluster.pods.insert(key, Arc::new(pod));
            }
        }
    }

    /// Whether some pod waits for a node: unbound and not finished. Cheaper than building the state.
    fn any_unbound(&self) -> bool {
        self.cluster
            .pods
            .values()
            .any(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()) && !crate::cluster::pod_finished(p))
    }

    /// Whether some node is on its way out (deleted, tainted as disrupted, or marked by the disruption
    /// queue), so its pods need a new place.
    fn any_leaving(&self) -> bool {
        self.disruption.queue.has_marked()
            || self.cluster.claims.values().any(|c| c.metadata.deletion_timestamp.is_some())
            || self.cluster.nodes.values().any(|n| {
                n.metadata.deletion_timestamp.is_some()
                    || n.spec.iter().flat_map(|s| s.taints.iter().flatten()).any(|t| t.key == labels::DISRUPTED_TAINT)
            })
    }

    /// A digest of what kube-scheduler decides on: pods and where they run, nodes with their taints,
    /// allocatable and conditions.
    fn scheduling_digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (key, p) in &self.cluster.pods {
            (key, p.spec.as_ref().and_then(|s| s.node_name.as_ref())).hash(&mut h);
            p.status.as_ref().and_then(|s| s.phase.as_ref()).hash(&mut h);
        }
        for (name, n) in &self.cluster.nodes {
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
        // Most steps bind nothing: skip building the cluster state when no pod waits for a node, or when
        // nothing changed since an attempt that bound nothing.
        if !self.any_unbound() {
            return;
        }
        let digest = self.scheduling_digest();
        if self.unschedulable_digest == Some(digest) {
            return;
        }
        let state = self.state();
        // kube-scheduler sees the node's actual taints (unregistered, startup), not the ones planned for.
        let nodes: Vec<_> = state
            .nodes
            .iter()
            .filter(|n| n.node.is_some() && n.ready)
            .map(|n| {
                let mut e = n.as_existing();
                let node = n.node.as_ref();
                e.taints = node.and_then(|x| x.spec.as_ref()).and_then(|s| s.taints.clone()).unwrap_or_default();
                let real = node
                    .and_then(|x| x.status.as_ref())
                    .and_then(|s| s.allocatable.as_ref())
                    .and_then(|a| crate::resources::Resources::from_resource_list(a).ok())
                    .unwrap_or(n.allocatable);
                e.available = real.sub(&n.requested);
                e
            })
            .collect();
        if nodes.is_empty() {
            self.unschedulable_digest = Some(digest);
            return;
        }
        let pending: Vec<_> = state.pending_pods().map(|p| Arc::clone(&p.info)).collect();
        if pending.is_empty() {
            self.unschedulable_digest = Some(digest);
            return;
        }
        let results = Scheduler::new(Vec::new(), nodes, state.bound_pods(), &[], SchedulerOptions::default())
            .solve_shared(pending);
        let bound_any = results.existing.iter().any(|p| !p.pods.is_empty());
        self.unschedulable_digest = (!bound_any).then_some(digest);
        for placed in results.existing {
            for key in placed.pods {
                if let Some(pod) = self.cluster.pods.get_mut(&key).map(Arc::make_mut) {
                    if let Some(spec) = pod.spec.as_mut() {
                        spec.node_name = Some(placed.node.clone());
                    }
                    pod.status = serde_json::from_value(json!({"phase": "Running", "startTime": now.to_string()})).ok();
                }
            }
        }
    }

    async fn provision(&mut self, now: Timestamp) {
        // With no batch open and no pod to place, a pass would do nothing: skip building the state.
        if !self.batcher.is_open() && !self.any_unbound() && !self.any_leaving() {
            return;
        }
        let state = self.state();
        let waiting = state.pods_to_place().any(|p| self.nominations.target(&p.info.key, now).is_none());
        // Pods waiting without capacity on its way open a batch window.
        if waiting && !self.batcher.is_open() {
            self.batcher.trigger(now);
        }
        if !self.batcher.ready(now) {
            return;
        }
        self.batcher.reset();
        self.refresh_types().await;
        let mut types = self.types.clone();
        self.unavailable.apply(self.provider.name(), &mut types, &[], now);
        let types_for = move |_: &NodePool| types.clone();
        self.nominations.expire(now, |t| self.cluster.claims.contains_key(t) || self.cluster.nodes.contains_key(t));
        let seq = &mut self.seq;
        let mut name_for = |pool: &str| {
            *seq += 1;
            format!("{pool}-{:05}", *seq)
        };
        let out =
            provisioning::provision(&state, &types_for, &mut self.nominations, &self.settings, now, &mut name_for);
        // Pods planned in this pass are no longer planned anywhere else.
        let planned: HashSet<&String> = out
            .results
            .existing
            .iter()
            .flat_map(|p| &p.pods)
            .chain(out.results.claims.iter().flat_map(|c| &c.pods))
            .collect();
        for pods in self.reserved.values_mut() {
            pods.retain(|p| !planned.contains(p));
        }
        for placed in &out.results.existing {
            if self.cluster.claims.get(&placed.node).is_some_and(|c| !c.is_true(condition_types::REGISTERED)) {
                self.reserved.insert(placed.node.clone(), placed.pods.clone());
            }
        }
        for (claim, plan) in out.claims.into_iter().zip(out.results.claims.iter()) {
            self.reserved.insert(claim.name().to_owned(), plan.pods.clone());
            let _ = crate::cluster::Cluster::create_claim(&mut self.cluster, claim);
        }
    }

    /// Reads the offerings afresh (reserved capacity frees up, prices move); a failed read keeps the last.
    async fn refresh_types(&mut self) {
        if let Some(pool) = self.pools.first()
            && let Ok(types) = self.provider.instance_types(pool).await
        {
            self.types = types;
        }
    }

    async fn reconcile_claims(&mut self, now: Timestamp) {
        let names: Vec<String> = self.cluster.claims.keys().cloned().collect();
        for name in names {
            for _ in 0..3 {
                match self.lifecycle.reconcile(&mut self.cluster, &name, &self.pools, now).await {
                    Ok(Next::After(d)) if d.is_zero() => continue,
                    _ => break,
                }
            }
        }
    }

    async fn disrupt(&mut self, now: Timestamp) {
        // Disruption prices against current offerings: owned machines freed, spot prices moved.
        self.refresh_types().await;
        let state = self.state();
        let mut types = self.types.clone();
        self.unavailable.apply(self.provider.name(), &mut types, &[], now);
        let types_for = move |_: &NodePool| types.clone();
        let inputs = crate::disruption::Inputs { state: &state, types_for: &types_for, settings: &self.settings, now };
        let seq = &mut self.seq;
        let mut name_for = |pool: &str| {
            *seq += 1;
            format!("{pool}-{:05}", *seq)
        };
        let events = self.disruption.tick(&inputs, &mut self.cluster, &mut self.nominations, &mut name_for);
        for e in events {
            if let Event::Reboot { node, claim } = &e
                && let Some(c) = self.cluster.claims.get(claim).cloned()
            {
                // The executor's half of a reboot: taint the node and ask the provider.
                if let Some(n) = self.cluster.nodes.get_mut(node).map(Arc::make_mut) {
                    let taints = n.spec.get_or_insert_with(Default::default).taints.get_or_insert_with(Vec::new);
                    taints.push(crate::scheduling::taints::taint(labels::REBOOTING_TAINT, None, "NoSchedule"));
                }
                match self.provider.reboot(&c).await {
                    Ok(()) => {
                        // A reboot takes as long as the instance family takes to boot and register.
                        let boot = self.kubelet.registration_delay_for(c.label(labels::INSTANCE_TYPE));
                        self.rebooted.insert(node.clone(), clock::add(now, boot));
                    }
                    Err(_) => self.disruption.repairer.reboot_failed(node),
                }
            }
            self.events.push((now, e));
        }
        // A rebooted node comes back (its rebooting taint removed) once it has booted.
        let back: Vec<String> =
            self.rebooted.iter().filter(|(_, back_at)| now >= **back_at).map(|(n, _)| n.clone()).collect();
        for n in back {
            self.rebooted.remove(&n);
            if let Some(node) = self.cluster.nodes.get_mut(&n).map(Arc::make_mut)
                && let Some(t) = node.spec.as_mut().and_then(|s| s.taints.as_mut())
            {
                t.retain(|t| t.key != labels::REBOOTING_TAINT);
            }
        }
    }

    /// Live claims (not being deleted).
    pub fn live_claims(&self) -> Vec<&NodeClaim> {
        self.cluster.claims.values().filter(|c| c.metadata.deletion_timestamp.is_none()).map(|c| &**c).collect()
    }

    /// Pods not bound to a node.
    pub fn pending(&self) -> Vec<String> {
        self.cluster
            .pods
            .iter()
            .filter(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
            .map(|(k, _)| k.clone())
            .collect()
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
