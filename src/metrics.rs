//! `/metrics`: Prometheus metrics under Karpenter's names, so its dashboards and alerts work unchanged.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tenon_core::api::{NodeClaim, NodePool, labels as wk};
use tenon_core::cloud::{
    CloudError, CloudProvider, DriftReason, DynCloudProvider, Instance, InstanceType, Interruption, LaunchOptions,
    ProviderDescriptor, RepairPolicy,
};
use tenon_core::cluster::Snapshot;
use tenon_core::disruption::queue::Event;
use tenon_core::disruption::{Decision, Method};
use tenon_core::resources::{ResourceName, Resources};

type FloatGauge = Gauge<f64, AtomicU64>;
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets for decision times, 1 ms to about 16 s.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The labels Karpenter puts on a node's resource gauges: the node, its pool and resource, and its
/// well-known labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node_name: String,
    nodepool: String,
    resource_type: String,
    instance_type: String,
    capacity_type: String,
    zone: String,
    arch: String,
    os: String,
}

/// The labels of `karpenter_pods_state`: one series per pod, valued 1.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    name: String,
    namespace: String,
    owner: String,
    node: String,
    nodepool: String,
    zone: String,
    arch: String,
    capacity_type: String,
    instance_type: String,
    phase: String,
}

/// A disruption decision: delete or replace, its reason (lower case) and consolidation type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: String,
    reason: String,
    consolidation_type: String,
}

/// A disruption reason (lower case) and consolidation type, as Karpenter labels method metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
    consolidation_type: String,
}

/// A disruption reason alone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// A pool and a disruption reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolReasonLabels {
    nodepool: String,
    reason: String,
}

/// An offering.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OfferingLabels {
    instance_type: String,
    capacity_type: String,
    zone: String,
}

/// A provider call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    provider: String,
}

/// A provider call that failed, and its error's kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallErrorLabels {
    method: String,
    provider: String,
    error: String,
}

/// The reason and consolidation type Karpenter labels a method with.
fn method_labels(method: Method) -> (&'static str, &'static str) {
    match method {
        Method::NodeRepair => ("unhealthy", ""),
        Method::Emptiness => ("empty", "empty"),
        Method::StaticDrift | Method::Drift => ("drifted", ""),
        Method::MultiNodeConsolidation => ("underutilized", "multi"),
        Method::SingleNodeConsolidation => ("underutilized", "single"),
    }
}

/// The `nodepool` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    nodepool: String,
}

/// The labels of a disrupted claim: its pool, capacity type and disruption reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DisruptedLabels {
    nodepool: String,
    capacity_type: String,
    reason: String,
}

/// What the metrics remember of a claim between two observations.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenClaim {
    pool: String,
    capacity_type: String,
    /// Its `DisruptionReason` condition's reason, when a disruption command holds it.
    disruption: Option<String>,
}

/// The `nodepool` and `resource_type` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolResourceLabels {
    nodepool: String,
    resource_type: String,
}

/// A resource amount as Karpenter reports it: CPU in cores, everything else in its base unit.
fn amount(name: ResourceName, value: i64) -> f64 {
    if name == ResourceName::CPU { value as f64 / 1000.0 } else { value as f64 }
}
use tenon_core::lifecycle::Counters;
use tenon_core::runtime::Runtime;

/// The series computed from the whole cluster when scraped rather than at every step: one per pod and
/// per node resource, too many to rebuild each time the cluster changes.
#[derive(Debug, Default)]
struct Inventory {
    allocatable: Family<NodeLabels, FloatGauge>,
    pod_requests: Family<NodeLabels, FloatGauge>,
    daemon_requests: Family<NodeLabels, FloatGauge>,
    pods: Family<PodLabels, Gauge>,
}

/// The operator's metrics. Counters count since the process started; a runtime rebuilt after a change of
/// leader adds on from zero.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    synced: Gauge,
    leader: Gauge,
    nodes: Gauge,
    nodeclaims: Gauge,
    pending_pods: Gauge,
    created: Family<PoolLabels, Counter>,
    terminated: Family<PoolLabels, Counter>,
    usage: Family<PoolResourceLabels, Gauge<f64, AtomicU64>>,
    limit: Family<PoolResourceLabels, Gauge<f64, AtomicU64>>,
    launch_failures: Counter,
    interrupted: Counter,
    disrupted: Family<DisruptedLabels, Counter>,
    queue_failures: Counter,
    decisions: Family<DecisionLabels, Counter>,
    eligible: Family<ReasonLabels, Gauge>,
    evaluation: Histograms<MethodLabels>,
    allowed: Family<PoolReasonLabels, Gauge>,
    scheduling: Histogram,
    queue_depth: Gauge,
    price: Family<OfferingLabels, FloatGauge>,
    calls: Arc<Histograms<CallLabels>>,
    call_errors: Arc<Family<CallErrorLabels, Counter>>,
    inventory: Inventory,
    /// Held while the inventory is rebuilt and encoded, so two scrapes never interleave.
    scrape: Mutex<()>,
    /// What the current runtime had counted at the last observation.
    seen: Mutex<(Counters, u64, u64)>,
    /// The claims of the last observation and their pools (`None` before the first): a claim that
    /// appears was created, one that goes was terminated.
    claims: Mutex<Option<HashMap<String, SeenClaim>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The metrics, registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            synced: Gauge::default(),
            leader: Gauge::default(),
            nodes: Gauge::default(),
            nodeclaims: Gauge::default(),
            pending_pods: Gauge::default(),
            created: Family::default(),
            terminated: Family::default(),
            usage: Family::default(),
            limit: Family::default(),
            launch_failures: Counter::default(),
            interrupted: Counter::default(),
            disrupted: Family::default(),
            queue_failures: Counter::default(),
            decisions: Family::default(),
            eligible: Family::default(),
            evaluation: Family::new_with_constructor(seconds),
            allowed: Family::default(),
            scheduling: seconds(),
            queue_depth: Gauge::default(),
            price: Family::default(),
            calls: Arc::new(Family::new_with_constructor(seconds)),
            call_errors: Arc::default(),
            inventory: Inventory::default(),
            scrape: Mutex::new(()),
            seen: Mutex::new((Counters::default(), 0, 0)),
            claims: Mutex::new(None),
            registry: Registry::default(),
        };
        registry.register(
            "karpenter_cluster_state_synced",
            "Whether the cluster state holds every object's initial list (1) or not (0).",
            m.synced.clone(),
        );
        registry.register("karpenter_cluster_state_node_count", "Nodes in the cluster state.", m.nodes.clone());
        registry.register("karpenter_nodeclaims_count", "NodeClaims in the cluster state.", m.nodeclaims.clone());
        registry.register(
            "karpenter_scheduler_unschedulable_pods_count",
            "Pods not bound to a node.",
            m.pending_pods.clone(),
        );
        registry.register("karpenter_nodeclaims_created", "NodeClaims created, by NodePool.", m.created.clone());
        registry.register(
            "karpenter_nodeclaims_terminated",
            "NodeClaims terminated (gone from the cluster), by NodePool.",
            m.terminated.clone(),
        );
        registry.register(
            "karpenter_nodepools_usage",
            "The resources of a NodePool's NodeClaims (CPU in cores, memory in bytes).",
            m.usage.clone(),
        );
        registry.register(
            "karpenter_nodepools_limit",
            "A NodePool's limits (CPU in cores, memory in bytes).",
            m.limit.clone(),
        );
        registry.register("karpenter_cloudprovider_errors", "Launches that failed.", m.launch_failures.clone());
        registry.register(
            "karpenter_interruption_actions_performed",
            "Interruption notices acted on.",
            m.interrupted.clone(),
        );
        registry.register(
            "karpenter_nodeclaims_disrupted",
            "NodeClaims terminated by a disruption command, by NodePool, capacity type and disruption reason.",
            m.disrupted.clone(),
        );
        registry.register(
            "karpenter_voluntary_disruption_queue_failures",
            "Disruption commands rolled back.",
            m.queue_failures.clone(),
        );
        registry.register(
            "karpenter_voluntary_disruption_decisions",
            "Disruption commands that entered the queue, by decision, reason and consolidation type.",
            m.decisions.clone(),
        );
        registry.register(
            "karpenter_voluntary_disruption_eligible_nodes",
            "Nodes the last disruption pass could act on, by reason.",
            m.eligible.clone(),
        );
        registry.register(
            "karpenter_voluntary_disruption_decision_evaluation_duration_seconds",
            "How long a disruption method took to evaluate its candidates.",
            m.evaluation.clone(),
        );
        registry.register(
            "karpenter_nodepools_allowed_disruptions",
            "Nodes a NodePool's budgets allow to disrupt now, by reason.",
            m.allowed.clone(),
        );
        registry.register(
            "karpenter_scheduler_scheduling_duration_seconds",
            "How long a provisioning scheduling pass took.",
            m.scheduling.clone(),
        );
        registry.register(
            "karpenter_scheduler_queue_depth",
            "Pods that wanted a place at the last provisioning step.",
            m.queue_depth.clone(),
        );
        registry.register(
            "karpenter_cloudprovider_instance_type_offering_price_estimate",
            "The price per hour of each offering the NodePools can buy, as their providers last reported it.",
            m.price.clone(),
        );
        registry.register(
            "karpenter_cloudprovider_duration_seconds",
            "How long a cloud provider call took, by method and provider.",
            Histograms::clone(&m.calls),
        );
        registry.register(
            "karpenter_cloudprovider_errors",
            "Cloud provider calls that failed, by method, provider and error kind.",
            Family::clone(&m.call_errors),
        );
        registry.register(
            "karpenter_nodes_allocatable",
            "A node's allocatable resources (CPU in cores, memory in bytes).",
            m.inventory.allocatable.clone(),
        );
        registry.register(
            "karpenter_nodes_total_pod_requests",
            "The requests of the pods bound to a node, DaemonSet pods excluded.",
            m.inventory.pod_requests.clone(),
        );
        registry.register(
            "karpenter_nodes_total_daemon_requests",
            "The requests of the DaemonSet pods bound to a node.",
            m.inventory.daemon_requests.clone(),
        );
        registry.register(
            "karpenter_pods_state",
            "Every pod, with where it runs and its phase.",
            m.inventory.pods.clone(),
        );
        registry.register("tenon_leader", "Whether this replica leads (1) or stands by (0).", m.leader.clone());
        Self { registry, ..m }
    }

    /// Records whether the cluster state is synced.
    pub fn synced(&self, synced: bool) {
        self.synced.set(i64::from(synced));
    }

    /// Records whether this replica leads.
    pub fn leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Counts the claims created and terminated since the last call, by pool, and sets each pool's
    /// usage and limits. The first call counts nothing: the claims already there were created before.
    pub fn observe_cluster(&self, snapshot: &Snapshot) {
        use tenon_core::api::{condition_types, labels};
        let now: HashMap<String, SeenClaim> = snapshot
            .claims
            .iter()
            .map(|(name, c)| {
                let seen = SeenClaim {
                    pool: c.node_pool().unwrap_or_default().to_owned(),
                    capacity_type: c.label(labels::CAPACITY_TYPE).unwrap_or_default().to_owned(),
                    disruption: c.condition(condition_types::DISRUPTION_REASON).map(|d| d.reason.clone()),
                };
                (name.clone(), seen)
            })
            .collect();
        let mut last = self.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(before) = last.as_ref() {
            for (name, c) in &now {
                if !before.contains_key(name) {
                    self.created.get_or_create(&PoolLabels { nodepool: c.pool.clone() }).inc();
                }
            }
            for (name, c) in before {
                if now.contains_key(name) {
                    continue;
                }
                self.terminated.get_or_create(&PoolLabels { nodepool: c.pool.clone() }).inc();
                if let Some(reason) = &c.disruption {
                    let labels = DisruptedLabels {
                        nodepool: c.pool.clone(),
                        capacity_type: c.capacity_type.clone(),
                        reason: reason.clone(),
                    };
                    self.disrupted.get_or_create(&labels).inc();
                }
            }
        }
        *last = Some(now);
        self.usage.clear();
        self.limit.clear();
        for pool in snapshot.pools.iter() {
            let labels = |name: ResourceName| PoolResourceLabels {
                nodepool: pool.metadata.name.clone().unwrap_or_default(),
                resource_type: name.as_str().to_owned(),
            };
            let usage = pool.status.as_ref().and_then(|s| Resources::from_resource_list(&s.resources).ok());
            for (name, value) in usage.unwrap_or(Resources::ZERO).iter() {
                self.usage.get_or_create(&labels(name)).set(amount(name, value));
            }
            if let Ok(limits) = Resources::from_resource_list(&pool.spec.limits) {
                for (name, value) in limits.iter() {
                    self.limit.get_or_create(&labels(name)).set(amount(name, value));
                }
            }
        }
    }

    /// Counts the disruption commands that entered the queue.
    fn observe_decisions(&self, events: &[(jiff::Timestamp, Event)]) {
        for (_, e) in events {
            if let Event::Started { method, decision, reason, .. } = e {
                let consolidation_type = method_labels(*method).1;
                let labels = DecisionLabels {
                    decision: match decision {
                        Decision::Delete => "delete".into(),
                        Decision::Replace => "replace".into(),
                    },
                    reason: reason.as_str().to_lowercase(),
                    consolidation_type: consolidation_type.into(),
                };
                self.decisions.get_or_create(&labels).inc();
            }
        }
    }

    /// Takes what a runtime measured: scheduling and evaluation times, eligible nodes, budgets.
    fn observe_telemetry(&self, t: tenon_core::runtime::Telemetry) {
        for d in t.scheduling {
            self.scheduling.observe(d.as_secs_f64());
        }
        if let Some(depth) = t.queue_depth {
            self.queue_depth.set(depth as i64);
        }
        if let Some(pass) = t.pass {
            for (method, took) in pass.evaluations {
                let (reason, consolidation_type) = method_labels(method);
                let labels = MethodLabels { method: reason.into(), consolidation_type: consolidation_type.into() };
                self.evaluation.get_or_create(&labels).observe(took.as_secs_f64());
            }
            for (reason, n) in pass.eligible {
                self.eligible.get_or_create(&ReasonLabels { reason: reason.as_str().to_lowercase() }).set(n as i64);
            }
        }
        if !t.allowed.is_empty() {
            self.allowed.clear();
            for (pool, reason, n) in t.allowed {
                let labels = PoolReasonLabels { nodepool: pool, reason: reason.as_str().to_owned() };
                self.allowed.get_or_create(&labels).set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    /// Sets the price estimate of every offering the pools' providers last reported.
    fn observe_offerings<'a>(&self, types: impl Iterator<Item = &'a InstanceType>) {
        self.price.clear();
        for t in types {
            for o in &t.offerings {
                let labels = OfferingLabels {
                    instance_type: t.name.clone(),
                    capacity_type: o.capacity_type.as_str().to_owned(),
                    zone: o.zone.clone(),
                };
                self.price.get_or_create(&labels).set(o.price);
            }
        }
    }

    /// Takes the runtime's counters, measurements and decisions, and the cluster's sizes, after a step.
    /// The runtime's decisions are drained: the operator keeps no log of them but these counts.
    pub fn observe(&self, runtime: &mut Runtime, snapshot: &Snapshot) {
        self.observe_decisions(&runtime.take_decisions());
        self.observe_telemetry(runtime.take_telemetry());
        if let Some(types) = runtime.take_offerings_changed() {
            self.observe_offerings(types.values().flatten());
        }
        self.observe_cluster(snapshot);
        self.nodes.set(snapshot.nodes.len() as i64);
        self.nodeclaims.set(snapshot.claims.len() as i64);
        let pending = snapshot.pods.values().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none())).count();
        self.pending_pods.set(pending as i64);
        let now = runtime.lifecycle.counters.clone();
        let queue = &runtime.disruption.queue;
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A fresh runtime starts from zero: everything it counted is new.
        if now.launched < seen.0.launched || queue.completed_total < seen.1 {
            *seen = (Counters::default(), 0, 0);
        }
        let delta = |a: u64, b: u64| a.saturating_sub(b);
        let before = &seen.0;
        self.launch_failures.inc_by(delta(now.launch_failures, before.launch_failures));
        self.interrupted.inc_by(delta(now.interruptions, before.interruptions));
        self.queue_failures.inc_by(delta(queue.failures_total, seen.2));
        *seen = (now, queue.completed_total, queue.failures_total);
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// The metrics with the per-node and per-pod series rebuilt from `snapshot`, for a scrape.
    pub fn scrape(&self, snapshot: &Snapshot) -> Result<String, std::fmt::Error> {
        let _one = self.scrape.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.inventory.rebuild(snapshot);
        self.encode()
    }

    /// `provider`, with each call timed and each failure counted under `karpenter_cloudprovider_*`.
    pub fn instrument(&self, provider: DynCloudProvider) -> DynCloudProvider {
        Arc::new(Instrumented { inner: provider, calls: self.calls.clone(), errors: self.call_errors.clone() })
    }
}

impl Inventory {
    fn rebuild(&self, snapshot: &Snapshot) {
        use k8s_openapi::api::core::v1::Pod;
        use tenon_core::cluster::owned_by_daemon_set;
        self.allocatable.clear();
        self.pod_requests.clear();
        self.daemon_requests.clear();
        self.pods.clear();
        let label = |l: Option<&std::collections::BTreeMap<String, String>>, key: &str| {
            l.and_then(|l| l.get(key)).cloned().unwrap_or_default()
        };
        let mut requests: HashMap<&str, (Resources, Resources)> = HashMap::new();
        for pod in snapshot.pods.values() {
            let Some(spec) = pod.spec.as_ref() else { continue };
            let Some(node) = spec.node_name.as_deref() else { continue };
            if tenon_core::cluster::pod_finished(pod) {
                continue;
            }
            let Ok(r) = tenon_core::scheduling::pod_requests(spec) else { continue };
            let entry = requests.entry(node).or_insert((Resources::ZERO, Resources::ZERO));
            if owned_by_daemon_set(pod) { entry.1.add_assign(&r) } else { entry.0.add_assign(&r) }
        }
        for (name, node) in snapshot.nodes.iter() {
            let l = node.metadata.labels.as_ref();
            let labels = |resource: ResourceName| NodeLabels {
                node_name: name.clone(),
                nodepool: label(l, wk::NODE_POOL),
                resource_type: resource.as_str().to_owned(),
                instance_type: label(l, wk::INSTANCE_TYPE),
                capacity_type: label(l, wk::CAPACITY_TYPE),
                zone: label(l, wk::ZONE),
                arch: label(l, wk::ARCH),
                os: label(l, wk::OS),
            };
            let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
            if let Some(Ok(a)) = allocatable.map(Resources::from_resource_list) {
                for (resource, value) in a.iter() {
                    self.allocatable.get_or_create(&labels(resource)).set(amount(resource, value));
                }
            }
            let (pods, daemons) = requests.get(name.as_str()).cloned().unwrap_or_default();
            for (resource, value) in pods.iter() {
                self.pod_requests.get_or_create(&labels(resource)).set(amount(resource, value));
            }
            for (resource, value) in daemons.iter() {
                self.daemon_requests.get_or_create(&labels(resource)).set(amount(resource, value));
            }
        }
        let owner = |pod: &Pod| {
            pod.metadata.owner_references.as_ref().and_then(|o| o.first()).map(|o| format!("{}/{}", o.kind, o.name))
        };
        for pod in snapshot.pods.values() {
            let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            let nl = snapshot.node(&node_name).and_then(|n| n.metadata.labels.as_ref());
            let labels = PodLabels {
                name: pod.metadata.name.clone().unwrap_or_default(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                owner: owner(pod).unwrap_or_default(),
                nodepool: label(nl, wk::NODE_POOL),
                zone: label(nl, wk::ZONE),
                arch: label(nl, wk::ARCH),
                capacity_type: label(nl, wk::CAPACITY_TYPE),
                instance_type: label(nl, wk::INSTANCE_TYPE),
                phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into()),
                node: node_name,
            };
            self.pods.get_or_create(&labels).set(1);
        }
    }
}

/// A provider whose calls are timed and whose failures are counted, as Karpenter's metrics decorator does.
/// `LaunchDeferred` is an answer, not a failure, and is not counted.
#[derive(Debug)]
struct Instrumented {
    inner: DynCloudProvider,
    calls: Arc<Histograms<CallLabels>>,
    errors: Arc<Family<CallErrorLabels, Counter>>,
}

impl Instrumented {
    async fn timed<T>(&self, method: &str, call: impl Future<Output = Result<T, CloudError>>) -> Result<T, CloudError> {
        let began = Instant::now();
        let out = call.await;
        let labels = CallLabels { method: method.to_owned(), provider: self.inner.name().to_owned() };
        self.calls.get_or_create(&labels).observe(began.elapsed().as_secs_f64());
        if let Err(e) = &out
            && !matches!(e, CloudError::LaunchDeferred { .. })
        {
            let labels = CallErrorLabels { method: labels.method, provider: labels.provider, error: e.kind().into() };
            self.errors.get_or_create(&labels).inc();
        }
        out
    }
}

#[async_trait]
impl CloudProvider for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn descriptor(&self) -> ProviderDescriptor {
        self.inner.descriptor()
    }
    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        self.timed("GetInstanceTypes", self.inner.instance_types(pool)).await
    }
    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        self.timed("Create", self.inner.create(claim, options)).await
    }
    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        self.timed("Delete", self.inner.delete(claim)).await
    }
    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        self.timed("Get", self.inner.get(provider_id)).await
    }
    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        self.timed("List", self.inner.list()).await
    }
    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        self.timed("IsDrifted", self.inner.is_drifted(claim)).await
    }
    fn repair_policies(&self) -> Vec<RepairPolicy> {
        self.inner.repair_policies()
    }
    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        self.timed("Reboot", self.inner.reboot(claim)).await
    }
    async fn adopt(&self, claims: &[NodeClaim]) -> Result<(), CloudError> {
        self.timed("Adopt", self.inner.adopt(claims)).await
    }
    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        self.timed("Interruptions", self.inner.interruptions()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn karpenter_names_are_served() {
        let m = Metrics::new();
        m.synced(true);
        let text = m.encode().unwrap_or_default();
        for name in [
            "karpenter_cluster_state_synced 1",
            "karpenter_voluntary_disruption_queue_failures_total 0",
            "karpenter_cluster_state_node_count 0",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    fn snapshot(claims: &[(&str, &str)]) -> Snapshot {
        use std::sync::Arc;
        use tenon_core::api::{NodeClaim, NodePool, labels};
        let claims = claims
            .iter()
            .map(|(name, pool)| {
                let mut c = NodeClaim::new(name, Default::default());
                c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), (*pool).to_owned())].into());
                ((*name).to_owned(), Arc::new(c))
            })
            .collect();
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
            "spec": {"template": {"spec": {"requirements": []}}, "limits": {"cpu": "1500m", "nvidia.com/gpu": "8"}},
            "status": {"resources": {"cpu": "500m", "memory": "1Gi"}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        Snapshot { claims: Arc::new(claims), pools: Arc::new(vec![pool]), ..Default::default() }
    }

    #[test]
    fn claims_are_counted_by_pool_as_they_come_and_go_and_pools_report_usage_and_limits() {
        let m = Metrics::new();
        // Claims there at the first look were created before: not counted.
        m.observe_cluster(&snapshot(&[("gpu-a", "gpu")]));
        m.observe_cluster(&snapshot(&[("gpu-a", "gpu"), ("gpu-b", "gpu"), ("web-c", "web")]));
        // web-c is taken by a disruption command: marked, then gone.
        let mut marked = snapshot(&[("web-c", "web")]);
        let mut claim = tenon_core::api::NodeClaim::clone(&marked.claims["web-c"]);
        claim.metadata.labels.get_or_insert_default().insert("karpenter.sh/capacity-type".into(), "spot".into());
        let at = jiff::Timestamp::UNIX_EPOCH;
        claim.set_condition("DisruptionReason", tenon_core::api::ConditionStatus::True, "Underutilized", "", at);
        marked.claims = std::sync::Arc::new([("web-c".to_owned(), std::sync::Arc::new(claim))].into());
        m.observe_cluster(&marked);
        m.observe_cluster(&snapshot(&[]));
        let text = m.encode().unwrap_or_default();
        for line in [
            "karpenter_nodeclaims_created_total{nodepool=\"gpu\"} 1",
            "karpenter_nodeclaims_created_total{nodepool=\"web\"} 1",
            "karpenter_nodeclaims_terminated_total{nodepool=\"gpu\"} 2",
            "karpenter_nodepools_usage{nodepool=\"gpu\",resource_type=\"cpu\"} 0.5",
            "karpenter_nodepools_usage{nodepool=\"gpu\",resource_type=\"memory\"} 1073741824.0",
            "karpenter_nodepools_limit{nodepool=\"gpu\",resource_type=\"cpu\"} 1.5",
            "karpenter_nodepools_limit{nodepool=\"gpu\",resource_type=\"nvidia.com/gpu\"} 8.0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        let disrupted =
            "karpenter_nodeclaims_disrupted_total{nodepool=\"web\",capacity_type=\"spot\",reason=\"Underutilized\"} 1";
        assert!(text.contains(disrupted), "{disrupted} missing from:\n{text}");
        assert!(text.contains("karpenter_nodeclaims_terminated_total{nodepool=\"web\"} 1"), "{text}");
        assert!(!text.contains("karpenter_nodeclaims_disrupted_total{nodepool=\"gpu\""), "{text}");
    }

    #[tokio::test]
    async fn provider_calls_are_timed_and_failures_counted_by_kind_but_a_deferral_is_no_failure() {
        use tenon_core::cloud::fake::{FakeCloud, Method as Call};
        let m = Metrics::new();
        let fake = Arc::new(FakeCloud::builder().name("fake").build());
        let provider = m.instrument(fake.clone());
        assert_eq!(provider.name(), "fake");
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {"spec": {"requirements": []}}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(provider.instance_types(&pool).await.is_ok());
        fake.inject(Call::InstanceTypes, CloudError::Throttled { retry_after: None }, 1);
        assert!(provider.instance_types(&pool).await.is_err());
        let deferred =
            CloudError::LaunchDeferred { retry_after: std::time::Duration::from_secs(5), reason: "x".into() };
        fake.inject(Call::InstanceTypes, deferred, 1);
        assert!(provider.instance_types(&pool).await.is_err());
        let text = m.encode().unwrap_or_default();
        let count = "karpenter_cloudprovider_duration_seconds_count{method=\"GetInstanceTypes\",provider=\"fake\"} 3";
        assert!(text.contains(count), "{count} missing from:\n{text}");
        let errors =
            "karpenter_cloudprovider_errors_total{method=\"GetInstanceTypes\",provider=\"fake\",error=\"Throttled\"} 1";
        assert!(text.contains(errors), "{errors} missing from:\n{text}");
        assert!(!text.contains("error=\"LaunchDeferred\""), "{text}");
    }

    #[test]
    fn a_scrape_reports_each_node_and_pod_and_forgets_those_gone() {
        use std::sync::Arc;
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {
                "karpenter.sh/nodepool": "web", "node.kubernetes.io/instance-type": "m5.large",
                "karpenter.sh/capacity-type": "spot", "topology.kubernetes.io/zone": "z1"}},
            "status": {"allocatable": {"cpu": "1930m", "memory": "7Gi", "pods": "29"}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let pod = |name: &str, cpu: &str, daemon: bool| {
            let owner = if daemon {
                serde_json::json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": true}])
            } else {
                serde_json::json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}])
            };
            let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "ownerReferences": owner},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
                "status": {"phase": "Running"}
            }))
            .unwrap_or_else(|e| panic!("{e}"));
            (format!("default/{name}"), Arc::new(p))
        };
        let pods = [pod("a", "500m", false), pod("b", "250m", false), pod("log", "100m", true)];
        let snapshot = Snapshot {
            nodes: Arc::new([("n1".to_owned(), Arc::new(node))].into()),
            pods: Arc::new(pods.into_iter().collect()),
            ..Default::default()
        };
        let m = Metrics::new();
        let text = m.scrape(&snapshot).unwrap_or_default();
        let labels = "node_name=\"n1\",nodepool=\"web\",resource_type=\"cpu\",instance_type=\"m5.large\",capacity_type=\"spot\",zone=\"z1\",arch=\"\",os=\"\"";
        for line in [
            format!("karpenter_nodes_allocatable{{{labels}}} 1.93"),
            format!("karpenter_nodes_total_pod_requests{{{labels}}} 0.75"),
            format!("karpenter_nodes_total_daemon_requests{{{labels}}} 0.1"),
        ] {
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
        let a = "karpenter_pods_state{name=\"a\",namespace=\"default\",owner=\"ReplicaSet/rs\",node=\"n1\",nodepool=\"web\",zone=\"z1\",arch=\"\",capacity_type=\"spot\",instance_type=\"m5.large\",phase=\"Running\"} 1";
        assert!(text.contains(a), "{a} missing from:\n{text}");
        // Gone from the cluster, gone from the next scrape.
        let text = m.scrape(&Snapshot::default()).unwrap_or_default();
        assert!(!text.contains("node_name=\"n1\"") && !text.contains("name=\"a\""), "{text}");
    }

    #[test]
    fn started_commands_are_counted_with_karpenters_labels_and_passes_report_budgets_and_eligible_nodes() {
        use tenon_core::api::DisruptionReason;
        use tenon_core::disruption::PassStats;
        let m = Metrics::new();
        let at = jiff::Timestamp::UNIX_EPOCH;
        let started =
            |method, decision, reason| Event::Started { nodes: vec![], method, decision, reason, why: String::new() };
        m.observe_decisions(&[
            (at, started(Method::Emptiness, Decision::Delete, DisruptionReason::Empty)),
            (at, started(Method::SingleNodeConsolidation, Decision::Replace, DisruptionReason::Underutilized)),
            (at, started(Method::SingleNodeConsolidation, Decision::Replace, DisruptionReason::Underutilized)),
            (at, Event::Proposed { method: Method::Drift, nodes: vec![] }),
        ]);
        m.observe_telemetry(tenon_core::runtime::Telemetry {
            scheduling: vec![std::time::Duration::from_millis(3)],
            queue_depth: Some(4),
            pass: Some(PassStats {
                evaluations: vec![(Method::MultiNodeConsolidation, std::time::Duration::from_millis(20))],
                eligible: vec![(DisruptionReason::Drifted, 2)],
            }),
            allowed: vec![("web".into(), DisruptionReason::Underutilized, 3)],
        });
        let text = m.encode().unwrap_or_default();
        for line in [
            "karpenter_voluntary_disruption_decisions_total{decision=\"delete\",reason=\"empty\",consolidation_type=\"empty\"} 1",
            "karpenter_voluntary_disruption_decisions_total{decision=\"replace\",reason=\"underutilized\",consolidation_type=\"single\"} 2",
            "karpenter_voluntary_disruption_eligible_nodes{reason=\"drifted\"} 2",
            "karpenter_nodepools_allowed_disruptions{nodepool=\"web\",reason=\"Underutilized\"} 3",
            "karpenter_scheduler_queue_depth 4",
            "karpenter_scheduler_scheduling_duration_seconds_count 1",
            "karpenter_voluntary_disruption_decision_evaluation_duration_seconds_count{method=\"underutilized\",consolidation_type=\"multi\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("reason=\"drifted\",consolidation_type=\"\"} "), "a proposal is no decision: {text}");
    }
}
