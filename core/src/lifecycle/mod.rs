//! A claim's life: launch, registration, initialization, liveness timeouts, lease expiry, finalization,
//! and garbage collection in both directions.
//!
//! [`Lifecycle::reconcile`] advances one claim as far as it can at `now` and says when to look again;
//! [`Lifecycle::collect_garbage`] reconciles the claims against what the providers list. Both read a
//! [`Snapshot`] and write through the [`Cluster`] port, whose writes can fail: a failed write leaves the
//! claim to be reconciled again (the launch cache keeps a lost status write from launching twice), and
//! only `NotFound` ever means an object or instance is gone. They are tested in virtual time against
//! `FakeCloud` and the in-memory API.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::api::{ConditionStatus, NodeClaim, NodeClaimStatus, NodePool, condition_types, labels};
use crate::clock;
use crate::cloud::{CapacityType, CloudError, Instance, ProviderRegistry, UnavailableOfferings};
pub use crate::cloud::{Interruption, InterruptionKind};
use crate::cluster::{
    ApiError, Cluster, ClusterEvent, EventType, Snapshot, node_has_taint, node_provider_id, node_ready, persist_claim,
    remove_node,
};
use crate::disruption::ON_DEMAND_LEASE_EXPIRED;
use crate::settings::Settings;

/// Annotation on a claim: when its on-demand lease expires (RFC 3339).
pub const LEASE_EXPIRES_AT: &str = "tenon.dev/lease-expires-at";
/// Annotation on a claim: why it runs under a lease.
pub const LEASE_REASON: &str = "tenon.dev/lease-reason";
/// Annotation on a claim: capacity types (comma-separated) for which its launch ignores the
/// unavailable-offerings cache.
pub const IGNORE_UNAVAILABLE_OFFERINGS: &str = "tenon.dev/ignore-unavailable-offerings";

/// Resources every node reports; any other requested resource must appear before a node is initialized.
const BASE_RESOURCES: [&str; 4] = ["cpu", "memory", "pods", "ephemeral-storage"];

/// How often a claim no provider serves is looked at again.
const UNROUTABLE_RECHECK: Duration = Duration::from_secs(60);
/// How often a deleting claim's instance is checked until it is gone.
const DELETE_POLL: Duration = Duration::from_secs(5);
/// The shortest back-off after a create error.
const CREATE_BACKOFF: Duration = Duration::from_secs(10);
/// The longest back-off after a create error.
const CREATE_BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);

/// When to look at a claim again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing more to do until something changes.
    Done,
    /// Look again after this long.
    After(Duration),
}

/// Counters the lifecycle keeps (exported as metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Instances launched.
    pub launched: u64,
    /// Launches that failed (insufficient capacity, NodeClass not ready, create errors).
    pub launch_failures: u64,
    /// Launches the provider deferred ("not yet"), counted apart from failures.
    pub launch_deferrals: u64,
    /// Claims deleted because they did not launch in time.
    pub launch_timeouts: u64,
    /// Claims deleted because their node did not register in time.
    pub registration_timeouts: u64,
    /// Claims deleted because their node did not initialize in time.
    pub initialization_timeouts: u64,
    /// Claims reclaimed because their instance vanished.
    pub vanished: u64,
    /// Instances terminated because no claim owns them.
    pub orphan_instances: u64,
    /// Nodes deleted because they have no claim and no instance.
    pub orphan_nodes: u64,
    /// Claims deleted because they outlived `expireAfter`.
    pub expirations: u64,
    /// Claims deleted because the provider announced an interruption.
    pub interruptions: u64,
}

/// Why a claim could not be reconciled.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// No provider serves the claim.
    #[error(transparent)]
    Registry(#[from] crate::cloud::RegistryError),
    /// A write to the cluster failed; the claim is reconciled again later.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A provider call failed in a way that is retried later.
    #[error("NodeClaim/{claim}: {source}")]
    Provider {
        /// The claim.
        claim: String,
        /// The error.
        source: CloudError,
    },
}

/// The pod-events controller: when a pod lands on a node, or leaves it (deleted, evicted, finished), the
/// node's claim records the time as `status.lastPodEventTime`. A pool's `consolidateAfter` counts from it,
/// so a node that just took pods (a replacement, a node the scheduler is filling) is not consolidated
/// under them. DaemonSet pods come and go with their node and are not events. A stamp whose write failed
/// is written again on the next pass.
#[derive(Debug, Default)]
pub struct PodEvents {
    /// The pods of the last pass, in key order: a pod object that is still listed is the same binding.
    last: Vec<(String, Arc<Pod>)>,
    /// Nodes whose claim's stamp did not land, to stamp again.
    unstamped: BTreeSet<String>,
}

/// The node a pod's binding ties it to, if it counts as one: bound, not finished, not a DaemonSet's.
fn binding(pod: &Pod) -> Option<&str> {
    crate::cluster::pod_node(pod)
        .filter(|_| !crate::cluster::pod_finished(pod) && !crate::cluster::owned_by_daemon_set(pod))
}

impl PodEvents {
    /// Compares the pods' bindings in `snapshot` with the last call and stamps the claims of the nodes
    /// that changed. The pod map is walked beside the last one in key order: a pod that is the very object
    /// it was is not read at all, so a pass over an unchanged fleet compares pointers only.
    pub async fn observe(&mut self, cluster: &dyn Cluster, snapshot: &Snapshot, now: Timestamp) {
        let mut touched: BTreeSet<String> = std::mem::take(&mut self.unstamped);
        let mut touch = |node: Option<&str>| {
            if let Some(node) = node {
                touched.insert(node.to_owned());
            }
        };
        let mut last: Vec<(String, Arc<Pod>)> = Vec::with_capacity(snapshot.pods.len());
        let mut old = std::mem::take(&mut self.last).into_iter().peekable();
        for (key, pod) in snapshot.pods.iter() {
            let kept = loop {
                let Some((old_key, old_pod)) = old.peek() else { break None };
                if Arc::ptr_eq(old_pod, pod) {
                    break old.next();
                }
                match old_key.as_str().cmp(key.as_str()) {
                    // Listed before this key and no longer: its binding is gone.
                    std::cmp::Ordering::Less => {
                        if let Some((_, gone)) = old.next() {
                            touch(binding(&gone));
                        }
                    }
                    // The object changed: its binding may have.
                    std::cmp::Ordering::Equal => {
                        if let Some((old_key, was)) = old.next() {
                            let (before, after) = (binding(&was), binding(pod));
                            if before != after {
                                touch(before);
                                touch(after);
                            }
                            break Some((old_key, Arc::clone(pod)));
                        }
                    }
                    std::cmp::Ordering::Greater => break None,
                }
            };
            match kept {
                Some(entry) => last.push(entry),
                None => {
                    // A new pod.
                    touch(binding(pod));
                    last.push((key.clone(), Arc::clone(pod)));
                }
            }
        }
        for (_, gone) in old {
            touch(binding(&gone));
        }
        self.last = last;
        if touched.is_empty() {
            return;
        }
        let node_of = |c: &NodeClaim| c.status.as_ref().and_then(|s| s.node_name.clone());
        // A claim is usually named after its node; the others are found in one scan, by the node their
        // status names.
        let mut claims: Vec<(String, Arc<NodeClaim>)> = Vec::new();
        let mut missed: BTreeSet<&str> = BTreeSet::new();
        for node in &touched {
            match snapshot.claim(node).filter(|c| node_of(c).as_deref() == Some(node.as_str())) {
                Some(c) => claims.push((node.clone(), c.clone())),
                None => {
                    missed.insert(node);
                }
            }
        }
        if !missed.is_empty() {
            for c in snapshot.claims.values() {
                if let Some(n) = node_of(c).filter(|n| missed.contains(n.as_str())) {
                    claims.push((n, c.clone()));
                }
            }
        }
        for (node, claim) in claims {
            let mut stamped = NodeClaim::clone(&claim);
            stamped.status.get_or_insert_with(Default::default).last_pod_event_time = Some(now);
            match cluster.patch_claim_status(&stamped).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::debug!(claim = claim.name(), error = %e, "pod event not recorded; retrying");
                    self.unstamped.insert(node);
                }
            }
        }
    }
}

/// How often an initialized claim's provider is asked whether the claim drifted.
pub const DRIFT_CHECK_INTERVAL: Duration = Duration::from_secs(300);

/// The claim lifecycle controller.
#[derive(Debug)]
pub struct Lifecycle {
    registry: ProviderRegistry,
    unavailable: Arc<UnavailableOfferings>,
    settings: Settings,
    /// Instances launched, by claim UID, so a lost status write never launches twice.
    launched: HashMap<String, Instance>,
    /// When each initialized claim was last asked about provider drift, by claim name.
    drift_checked: HashMap<String, Timestamp>,
    /// The nodes of the snapshots read, by provider ID.
    by_provider_id: crate::cluster::NodesByProviderId,
    /// The pods of the draining nodes of the snapshots read.
    pods_by_node: crate::cluster::PodsByNode,
    /// Counters.
    pub counters: Counters,
}

fn created(claim: &NodeClaim) -> Option<Timestamp> {
    claim.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn since_condition(claim: &NodeClaim, type_: &str) -> Option<Timestamp> {
    claim.condition(type_).filter(|c| c.status == ConditionStatus::True).and_then(|c| c.last_transition_time)
}

/// The claim as last written, and the version being changed: the same object until the first change
/// ([`Working::claim_mut`]) copies it, so that a reconcile that changes nothing copies nothing.
struct Working {
    base: Arc<NodeClaim>,
    claim: Arc<NodeClaim>,
}

impl Working {
    fn new(base: Arc<NodeClaim>) -> Self {
        Self { claim: Arc::clone(&base), base }
    }

    /// The claim, to change.
    fn claim_mut(&mut self) -> &mut NodeClaim {
        Arc::make_mut(&mut self.claim)
    }

    /// Writes what changed since the last save.
    async fn save(&mut self, cluster: &dyn Cluster) -> Result<(), ApiError> {
        let written = persist_claim(cluster, &self.base, &self.claim).await?;
        self.claim = Arc::clone(&written);
        self.base = written;
        Ok(())
    }
}

impl Lifecycle {
    /// A controller over `registry`, sharing the unavailable-offerings cache with provisioning.
    pub fn new(registry: ProviderRegistry, unavailable: Arc<UnavailableOfferings>, settings: Settings) -> Self {
        Self {
            registry,
            unavailable,
            settings,
            launched: HashMap::new(),
            drift_checked: HashMap::new(),
            by_provider_id: Default::default(),
            pods_by_node: Default::default(),
            counters: Counters::default(),
        }
    }

    /// The providers this controller routes claims to.
    pub fn registry(&self) -> &ProviderRegistry {
        &self.registry
    }

    /// The registration timeout of a pool: its `karpenter.sh/nodeclaim-registration-timeout` annotation,
    /// else the `registration-timeout` setting.
    pub fn registration_timeout(&self, pool: Option<&NodePool>) -> Duration {
        pool.and_then(|p| p.annotation(labels::NODECLAIM_REGISTRATION_TIMEOUT))
            .and_then(|t| crate::api::parse_go_duration(t).ok())
            .unwrap_or(self.settings.registration_timeout)
    }

    /// When a claim `age` old whose create failed tries again: after as long as it has existed, so the
    /// waits double (10 s, 10 s, 20 s, 40 s, …, at most 5 minutes) and a failing cloud API is not asked
    /// every few seconds; never past the launch clock.
    fn create_backoff(&self, age: Duration) -> Duration {
        age.clamp(CREATE_BACKOFF, CREATE_BACKOFF_MAX).min(self.settings.launch_timeout.saturating_sub(age))
    }

    /// Rebuilds the launch cache after a restart: a claim with no provider id whose instance the provider
    /// lists under the claim's name launched, but its status write was lost. Its next reconcile records
    /// the instance instead of launching a second one. Returns how many were taken back.
    pub fn adopt_launches(&mut self, snapshot: &Snapshot, instances: &[Instance]) -> usize {
        let mut adopted = 0;
        for i in instances {
            let Some(claim) = i.node_claim.as_deref().and_then(|n| snapshot.claim(n)) else { continue };
            if claim.provider_id().is_some() {
                continue;
            }
            let uid = claim.metadata.uid.clone().unwrap_or_else(|| claim.name().to_owned());
            if let std::collections::hash_map::Entry::Vacant(e) = self.launched.entry(uid) {
                e.insert(i.clone());
                adopted += 1;
            }
        }
        adopted
    }

    /// Whether the launch cache holds an instance for the claim with `uid`.
    pub fn has_launched(&self, uid: &str) -> bool {
        self.launched.contains_key(uid)
    }

    /// Saves the claim's changes and deletes it (its finalizer holds it for termination).
    async fn delete(&self, cluster: &dyn Cluster, w: &mut Working, why: &str) -> Result<Next, LifecycleError> {
        tracing::info!(claim = w.claim.name(), reason = why, "deleting claim");
        w.save(cluster).await?;
        match cluster.delete_claim(w.claim.name()).await {
            Ok(()) => Ok(Next::After(Duration::ZERO)),
            Err(e) if e.is_not_found() => Ok(Next::Done),
            Err(e) => Err(e.into()),
        }
    }

    /// Advances one claim, read from `cluster`'s snapshot, at `now`.
    pub async fn reconcile(
        &mut self,
        cluster: &dyn Cluster,
        name: &str,
        now: Timestamp,
    ) -> Result<Next, LifecycleError> {
        let snapshot = cluster.snapshot();
        let Some(base) = snapshot.claim(name).cloned() else {
            self.drift_checked.remove(name);
            return Ok(Next::Done);
        };
        if base.metadata.deletion_timestamp.is_some() {
            return self.finalize(cluster, snapshot, NodeClaim::clone(&base), now).await;
        }
        // A claim no registered provider serves is marked (NodeClassReady=False, an event) and looked at
        // again later, in case its provider appears.
        let provider = match self.registry.for_claim(&base) {
            Ok(p) => p.clone(),
            Err(e) => {
                self.unroutable(cluster, &base, &e, now).await;
                return Ok(Next::After(UNROUTABLE_RECHECK));
            }
        };
        let mut w = Working::new(base);
        // The termination finalizer first: without it a deleted claim would vanish before its instance.
        if !w.claim.metadata.finalizers.iter().flatten().any(|f| f == labels::TERMINATION_FINALIZER) {
            let finalizers = w.claim_mut().metadata.finalizers.get_or_insert_with(Vec::new);
            finalizers.push(labels::TERMINATION_FINALIZER.into());
            w.save(cluster).await?;
        }
        let pool = w.claim.node_pool().and_then(|p| snapshot.pool(p));
        let age = created(&w.claim).map(|c| clock::since(now, c)).unwrap_or_default();

        // Deleting a node deletes its claim (and the claim's termination drains and releases the node).
        if let Some(pid) = w.claim.provider_id()
            && self.by_provider_id.being_deleted(&snapshot, pid)
        {
            return self.delete(cluster, &mut w, "node_deleted").await;
        }

        // Expiration: forceful, whatever the budgets say.
        let expire_after = w.claim.spec.expire_after.duration();
        if let Some(expire) = expire_after
            && w.claim.is_true(condition_types::LAUNCHED)
            && age >= expire
        {
            self.counters.expirations += 1;
            return self.delete(cluster, &mut w, "expired").await;
        }

        // Launch.
        if !w.claim.is_true(condition_types::LAUNCHED) {
            let uid = w.claim.metadata.uid.clone().unwrap_or_else(|| w.claim.name().to_owned());
            // An instance already launched for the claim (its status write was lost) is no timeout.
            if age >= self.settings.launch_timeout && !self.launched.contains_key(&uid) {
                self.counters.launch_timeouts += 1;
                return self.delete(cluster, &mut w, "launch_timeout").await;
            }
            let result = match self.launched.get(&uid) {
                Some(i) => Ok(i.clone()),
                None => {
                    let ignore: Vec<CapacityType> = w
                        .claim
                        .annotation(IGNORE_UNAVAILABLE_OFFERINGS)
                        .map(|v| v.split(',').filter_map(|c| CapacityType::parse(c.trim())).collect())
                        .unwrap_or_default();
                    let options = self.unavailable.launch_options(provider.name(), &ignore, now);
                    let launched = provider.create(&w.claim, &options).await;
                    if launched.is_ok() {
                        self.counters.launched += 1;
                    }
                    launched
                }
            };
            match result {
                Ok(instance) => {
                    self.launched.insert(uid, instance.clone());
                    record_launch(w.claim_mut(), &instance, now);
                    w.save(cluster).await?;
                }
                Err(CloudError::InsufficientCapacity { offerings, message }) => {
                    for o in &offerings {
                        self.unavailable.mark(provider.name(), o, self.settings.unavailable_offerings_ttl, now);
                    }
                    self.counters.launch_failures += 1;
                    tracing::warn!(claim = name, %message, "insufficient capacity");
                    cluster
                        .publish(ClusterEvent::claim(name, EventType::Warning, "InsufficientCapacityError", message))
                        .await;
                    return self.delete(cluster, &mut w, "insufficient_capacity").await;
                }
                Err(CloudError::NodeClassNotReady(message)) => {
                    self.counters.launch_failures += 1;
                    tracing::warn!(claim = name, %message, "node class not ready");
                    cluster.publish(ClusterEvent::claim(name, EventType::Warning, "NodeClassNotReady", message)).await;
                    return self.delete(cluster, &mut w, "nodeclass_not_ready").await;
                }
                Err(CloudError::LaunchDeferred { retry_after, reason }) => {
                    self.counters.launch_deferrals += 1;
                    w.claim_mut().set_condition(
                        condition_types::LAUNCHED,
                        ConditionStatus::Unknown,
                        "LaunchDeferred",
                        &reason,
                        now,
                    );
                    w.save(cluster).await?;
                    // The launch clock keeps running from creation.
                    let left = self.settings.launch_timeout.saturating_sub(age);
                    return Ok(Next::After(retry_after.min(left)));
                }
                Err(CloudError::Create { reason, message }) => {
                    self.counters.launch_failures += 1;
                    w.claim_mut().set_condition(
                        condition_types::LAUNCHED,
                        ConditionStatus::Unknown,
                        &reason,
                        &message,
                        now,
                    );
                    cluster.publish(ClusterEvent::claim(name, EventType::Warning, "FailedLaunch", message)).await;
                    w.save(cluster).await?;
                    return Ok(Next::After(self.create_backoff(age)));
                }
                Err(e) => {
                    self.counters.launch_failures += 1;
                    let message: String = e.to_string().chars().take(300).collect();
                    w.claim_mut().set_condition(
                        condition_types::LAUNCHED,
                        ConditionStatus::Unknown,
                        "LaunchFailed",
                        &message,
                        now,
                    );
                    cluster.publish(ClusterEvent::claim(name, EventType::Warning, "FailedLaunch", message)).await;
                    w.save(cluster).await?;
                    return Ok(Next::After(self.create_backoff(age)));
                }
            }
        }

        // Lease expiry marks the claim drifted, for disruption to reclaim.
        let lease_expires = w.claim.annotation(LEASE_EXPIRES_AT).and_then(|t| t.parse::<Timestamp>().ok());
        if let Some(expires) = lease_expires
            && expires <= now
            && !w.claim.is_true(condition_types::DRIFTED)
        {
            w.claim_mut().set_condition(
                condition_types::DRIFTED,
                ConditionStatus::True,
                ON_DEMAND_LEASE_EXPIRED,
                "",
                now,
            );
            w.save(cluster).await?;
        }

        // Registration.
        if !w.claim.is_true(condition_types::REGISTERED) {
            let pid = w.claim.provider_id().unwrap_or_default().to_owned();
            let nodes = self.by_provider_id.nodes(&snapshot, &pid);
            match nodes.as_slice() {
                [node] => {
                    let node = register(w.claim_mut(), Node::clone(node));
                    cluster.patch_node(&node).await?;
                    w.claim_mut().set_condition(
                        condition_types::REGISTERED,
                        ConditionStatus::True,
                        "Registered",
                        "",
                        now,
                    );
                    w.save(cluster).await?;
                }
                [] => {
                    let timeout = self.registration_timeout(pool);
                    if age >= timeout {
                        self.counters.registration_timeouts += 1;
                        return self.delete(cluster, &mut w, "registration_timeout").await;
                    }
                    w.claim_mut().set_condition(
                        condition_types::REGISTERED,
                        ConditionStatus::Unknown,
                        "NodeNotFound",
                        "",
                        now,
                    );
                    w.save(cluster).await?;
                    return Ok(Next::After(timeout - age));
                }
                _ => {
                    w.claim_mut().set_condition(
                        condition_types::REGISTERED,
                        ConditionStatus::False,
                        "MultipleNodesFound",
                        &format!("{} nodes have provider id {pid}", nodes.len()),
                        now,
                    );
                    w.save(cluster).await?;
                    return Ok(Next::After(Duration::from_secs(10)));
                }
            }
        }

        // Initialization.
        if !w.claim.is_initialized() {
            let node_name = w.claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            // The node as this pass registered it, when the snapshot predates that write.
            let node = cluster.snapshot().node(&node_name).cloned();
            match node.as_ref().map(|n| initialization_blocker(&w.claim, n)) {
                Some(None) => {
                    if let Some(n) = node
                        && n.metadata.labels.as_ref().and_then(|l| l.get(labels::INITIALIZED)).map(String::as_str)
                            != Some("true")
                    {
                        let mut n = Node::clone(&n);
                        n.metadata
                            .labels
                            .get_or_insert_with(BTreeMap::new)
                            .insert(labels::INITIALIZED.into(), "true".into());
                        cluster.patch_node(&n).await?;
                    }
                    w.claim_mut().set_condition(
                        condition_types::INITIALIZED,
                        ConditionStatus::True,
                        "Initialized",
                        "",
                        now,
                    );
                    w.save(cluster).await?;
                }
                blocker => {
                    let why = blocker.flatten().unwrap_or_else(|| "node not found".into());
                    let mut next = Duration::from_secs(10);
                    if let (Some(limit), Some(registered)) = (
                        self.settings.nodeclaim_initialization_timeout,
                        since_condition(&w.claim, condition_types::REGISTERED),
                    ) {
                        let waited = clock::since(now, registered);
                        if waited >= limit {
                            self.counters.initialization_timeouts += 1;
                            return self.delete(cluster, &mut w, "initialization_timeout").await;
                        }
                        next = next.min(limit - waited);
                    }
                    w.claim_mut().set_condition(
                        condition_types::INITIALIZED,
                        ConditionStatus::Unknown,
                        "NotInitialized",
                        &why,
                        now,
                    );
                    w.save(cluster).await?;
                    return Ok(Next::After(next));
                }
            }
        }

        // What time alone changes: the lease running out, `expireAfter`.
        let mut wake: Option<Duration> = None;
        let mut until = |at: Timestamp| {
            if at > now {
                let d = clock::since(at, now);
                wake = Some(wake.map_or(d, |w: Duration| w.min(d)));
            }
        };
        if let Some(expires) = lease_expires.filter(|_| !w.claim.is_true(condition_types::DRIFTED)) {
            until(expires);
        }
        if let (Some(expire), Some(c)) = (expire_after, created(&w.claim)) {
            until(clock::add(c, expire));
        }
        let later = |d: Duration| Next::After(wake.map_or(d, |w| w.min(d)));

        // Provider drift (image, network, NodeClass hash), asked every DRIFT_CHECK_INTERVAL; a failed
        // check is asked again next time.
        if w.claim.is_true(condition_types::DRIFTED) {
            return Ok(wake.map_or(Next::Done, Next::After));
        }
        let last = self.drift_checked.get(w.claim.name()).copied();
        if let Some(t) = last
            && clock::since(now, t) < DRIFT_CHECK_INTERVAL
        {
            return Ok(later(DRIFT_CHECK_INTERVAL - clock::since(now, t)));
        }
        self.drift_checked.insert(w.claim.name().to_owned(), now);
        if let Ok(Some(reason)) = provider.is_drifted(&w.claim).await {
            tracing::info!(claim = w.claim.name(), reason = %reason, "provider reports drift");
            w.claim_mut().set_condition(condition_types::DRIFTED, ConditionStatus::True, &reason.0, "", now);
            w.save(cluster).await?;
            return Ok(wake.map_or(Next::Done, Next::After));
        }
        Ok(later(DRIFT_CHECK_INTERVAL))
    }

    async fn finalize(
        &mut self,
        cluster: &dyn Cluster,
        mut snapshot: Snapshot,
        mut claim: NodeClaim,
        now: Timestamp,
    ) -> Result<Next, LifecycleError> {
        self.drift_checked.remove(claim.name());
        let provider = self.registry.for_claim(&claim)?.clone();
        let uid = claim.metadata.uid.clone().unwrap_or_else(|| claim.name().to_owned());
        // An instance launched for the claim whose status write was lost is terminated all the same.
        if claim.provider_id().is_none()
            && let Some(i) = self.launched.get(&uid)
        {
            claim.status.get_or_insert_with(Default::default).provider_id = Some(i.provider_id.clone());
        }
        if let Some(pid) = claim.provider_id().map(str::to_owned) {
            // Drain the node first, unless it is NotReady and its instance is already gone.
            if let Some(node) = self.by_provider_id.nodes(&snapshot, &pid).first().map(|n| Arc::clone(n)) {
                let node = &*node;
                let gone = !node_ready(node) && provider.get(&pid).await.is_err_and(|e| e.is_not_found());
                if !gone {
                    if !node_has_taint(node, labels::DISRUPTED_TAINT) {
                        let mut tainted = Node::clone(node);
                        let taints =
                            tainted.spec.get_or_insert_with(Default::default).taints.get_or_insert_with(Vec::new);
                        taints.push(crate::scheduling::taints::taint(labels::DISRUPTED_TAINT, None, "NoSchedule"));
                        cluster.patch_node(&tainted).await?;
                    }
                    let deadline = claim.termination_deadline();
                    let name = node.metadata.name.clone().unwrap_or_default();
                    // Read once for the drain and the volumes.
                    let on_node: Vec<Arc<Pod>> =
                        self.pods_by_node.pods_on(&snapshot, &name).into_iter().cloned().collect();
                    let plan = crate::termination::DrainPlan::new(
                        &snapshot,
                        &on_node.iter().collect::<Vec<_>>(),
                        deadline,
                        now,
                    );
                    // The rest reads no pod of the snapshot: let go of its pod map before the evictions, as the
                    // in-memory API server copies a pod map a snapshot still shares.
                    snapshot.pods = Arc::default();
                    let drained = plan.run(cluster).await;
                    if !drained.done {
                        return Ok(Next::After(Duration::from_secs(1)));
                    }
                    // The drained pods' volumes detach before the instance goes, unless the grace period is
                    // over.
                    let attached = snapshot.pending_volume_attachments_with(&name, &on_node, now);
                    if !attached.is_empty() && deadline.is_none_or(|d| now < d) {
                        tracing::debug!(node = %name, ?attached, "waiting for volumes to detach");
                        return Ok(Next::After(Duration::from_secs(1)));
                    }
                }
            }
            match provider.delete(&claim).await {
                Ok(()) => return Ok(Next::After(DELETE_POLL)),
                Err(e) if e.is_not_found() => {}
                Err(source) => return Err(LifecycleError::Provider { claim: claim.name().to_owned(), source }),
            }
            for n in self.by_provider_id.nodes(&snapshot, &pid) {
                remove_node(cluster, n).await?;
            }
        }
        // The instance is gone: release the claim.
        let mut released = claim.clone();
        if let Some(f) = released.metadata.finalizers.as_mut() {
            f.retain(|f| f != labels::TERMINATION_FINALIZER);
        }
        match cluster.patch_claim(&released).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        self.launched.remove(&uid);
        Ok(Next::Done)
    }

    /// Acts on an interruption: the claim is deleted at once (its node tainted and drained, its pods
    /// provisioned elsewhere), and an interrupted spot offering is marked unavailable. An impaired
    /// instance's claim is first given a termination deadline of now
    /// (`karpenter.sh/nodeclaim-termination-timestamp`), so its drain does not wait on pods that cannot
    /// leave a broken machine. Returns the claim.
    pub async fn interrupt(
        &mut self,
        cluster: &dyn Cluster,
        snapshot: &Snapshot,
        event: &Interruption,
        now: Timestamp,
    ) -> Result<Option<String>, ApiError> {
        if event.kind == InterruptionKind::Rebalance {
            return Ok(None);
        }
        let Some(claim) = snapshot.claim_with_provider_id(&event.provider_id) else { return Ok(None) };
        if claim.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        if event.kind == InterruptionKind::SpotInterruption
            && let (Some(it), Some(zone), Ok(provider)) =
                (claim.label(labels::INSTANCE_TYPE), claim.label(labels::ZONE), self.registry.for_claim(claim))
        {
            let key = crate::cloud::OfferingKey::new(it, zone, CapacityType::Spot);
            self.unavailable.mark(provider.name(), &key, self.settings.unavailable_offerings_ttl, now);
        }
        tracing::info!(claim = claim.name(), kind = ?event.kind, "interrupted");
        if event.kind == InterruptionKind::Impaired {
            match crate::disruption::bound_termination(cluster, claim.name(), now).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        match cluster.delete_claim(claim.name()).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        }
        self.counters.interruptions += 1;
        let message = format!("{:?} for instance {}", event.kind, event.provider_id);
        cluster.publish(ClusterEvent::claim(claim.name(), EventType::Warning, "Interrupted", message)).await;
        Ok(Some(claim.name().to_owned()))
    }

    /// Reads every provider's interruption notices and acts on them. Returns the claims interrupted; a
    /// provider whose notices cannot be read, or a claim whose deletion failed, does not stop the others
    /// (the first such error is returned after the rest are handled; a notice whose deletion failed is
    /// acted on again when the provider repeats it or garbage collection finds the instance gone).
    pub async fn poll_interruptions(
        &mut self,
        cluster: &dyn Cluster,
        now: Timestamp,
    ) -> Result<Vec<String>, LifecycleError> {
        let mut hit = Vec::new();
        let mut first_error = None;
        let snapshot = cluster.snapshot();
        for provider in self.registry.providers().to_vec() {
            let events = match provider.interruptions().await {
                Ok(events) => events,
                Err(source) => {
                    first_error.get_or_insert(LifecycleError::Provider { claim: String::new(), source });
                    continue;
                }
            };
            for e in events {
                match self.interrupt(cluster, &snapshot, &e, now).await {
                    Ok(claim) => hit.extend(claim),
                    Err(err) => {
                        first_error.get_or_insert(err.into());
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(hit),
        }
    }

    /// Reconciles claims against what the providers list: claims whose instance vanished (after the
    /// vanished-instance grace, or at once when registered with a node that is not Ready), instances no
    /// claim owns (after the orphan grace), and nodes with neither claim nor instance. Returns what it did.
    /// Only `NotFound` from a provider means an instance is gone. A claim no provider serves is skipped
    /// (with a `NodeClassReady=False` condition and an event) and the rest go on; a provider whose list
    /// fails leaves its claims alone and its error is returned once the others are done.
    pub async fn collect_garbage(
        &mut self,
        cluster: &dyn Cluster,
        now: Timestamp,
    ) -> Result<Vec<String>, LifecycleError> {
        let mut done = Vec::new();
        let mut first_error: Option<LifecycleError> = None;
        let snapshot = cluster.snapshot();
        let claimed: HashSet<&str> = snapshot.claims.values().filter_map(|c| c.provider_id()).collect();
        let mut listed: HashSet<String> = HashSet::new();
        let mut unlisted: HashSet<String> = HashSet::new();
        for provider in self.registry.providers().to_vec() {
            let instances = match provider.list().await {
                Ok(i) => i,
                Err(source) => {
                    unlisted.insert(provider.name().to_owned());
                    first_error.get_or_insert(LifecycleError::Provider { claim: String::new(), source });
                    continue;
                }
            };
            self.adopt_launches(&snapshot, &instances);
            for i in instances {
                listed.insert(i.provider_id.clone());
                if claimed.contains(i.provider_id.as_str()) {
                    continue;
                }
                // Launched for a claim whose status write was lost: the launch cache holds it now, and the
                // claim's next reconcile records it.
                if let Some(owner) = i.node_claim.as_deref().and_then(|n| snapshot.claim(n))
                    && owner.provider_id().is_none()
                    && owner.metadata.deletion_timestamp.is_none()
                {
                    continue;
                }
                // Another cluster's instances are never listed; ours without a claim are leaks.
                if clock::since(now, i.launch_time) >= self.settings.orphan_instance_grace {
                    let mut stub = NodeClaim::new(i.node_claim.as_deref().unwrap_or("orphan"), Default::default());
                    stub.status =
                        Some(NodeClaimStatus { provider_id: Some(i.provider_id.clone()), ..Default::default() });
                    match provider.delete(&stub).await {
                        Ok(()) | Err(CloudError::NotFound(_)) => {
                            self.counters.orphan_instances += 1;
                            done.push(format!("terminated orphan instance {}", i.provider_id));
                        }
                        Err(source) => {
                            first_error
                                .get_or_insert(LifecycleError::Provider { claim: stub.name().to_owned(), source });
                        }
                    }
                }
            }
        }
        for claim in snapshot.claims.values() {
            let Some(pid) = claim.provider_id() else { continue };
            if claim.metadata.deletion_timestamp.is_some() || listed.contains(pid) {
                continue;
            }
            let provider = match self.registry.for_claim(claim) {
                Ok(p) => p.clone(),
                Err(e) => {
                    self.unroutable(cluster, claim, &e, now).await;
                    continue;
                }
            };
            if unlisted.contains(provider.name()) {
                continue;
            }
            match provider.get(pid).await {
                Err(e) if e.is_not_found() => {}
                _ => continue,
            }
            let registered = claim.is_true(condition_types::REGISTERED);
            let node_ready_now = self.by_provider_id.nodes(&snapshot, pid).iter().any(|n| node_ready(n));
            let launched_at = since_condition(claim, condition_types::LAUNCHED).or_else(|| created(claim));
            let reclaim = if registered {
                !node_ready_now
            } else {
                launched_at.is_some_and(|t| clock::since(now, t) >= self.settings.vanished_instance_grace)
            };
            if reclaim {
                match cluster.delete_claim(claim.name()).await {
                    Ok(()) => {
                        self.counters.vanished += 1;
                        done.push(format!("reclaimed NodeClaim/{}: its instance is gone", claim.name()));
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        first_error.get_or_insert(e.into());
                    }
                }
            }
        }
        // Nodes that registered after their claim was gone: no owner, no finalizer, no instance.
        for node in snapshot.nodes.values() {
            let Some(pid) = node_provider_id(node) else { continue };
            let managed = node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(labels::NODE_POOL));
            let owned = node.metadata.owner_references.as_ref().is_some_and(|o| !o.is_empty());
            if !managed || owned || claimed.contains(pid) {
                continue;
            }
            // Gone only when every provider says so: a throttled or refused call proves nothing.
            let mut gone = true;
            for provider in self.registry.providers() {
                match provider.get(pid).await {
                    Err(e) if e.is_not_found() => {}
                    _ => gone = false,
                }
            }
            if gone {
                let name = node.metadata.name.clone().unwrap_or_default();
                match remove_node(cluster, node).await {
                    Ok(()) => {
                        self.counters.orphan_nodes += 1;
                        done.push(format!("deleted Node/{name}: no claim owns it and its instance is gone"));
                    }
                    Err(e) => {
                        first_error.get_or_insert(e.into());
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// Marks a claim no registered provider serves (`NodeClassReady=False`) and says so in an event, once.
    async fn unroutable(
        &self,
        cluster: &dyn Cluster,
        claim: &Arc<NodeClaim>,
        error: &crate::cloud::RegistryError,
        now: Timestamp,
    ) {
        let message = error.to_string();
        let marked = claim.condition(condition_types::NODE_CLASS_READY).is_some_and(|c| {
            c.status == ConditionStatus::False && c.reason == "NodeClassNotFound" && c.message == message
        });
        if marked {
            return;
        }
        tracing::warn!(claim = claim.name(), error = %message, "no provider serves the claim; skipped");
        let mut w = Working::new(claim.clone());
        w.claim_mut().set_condition(
            condition_types::NODE_CLASS_READY,
            ConditionStatus::False,
            "NodeClassNotFound",
            &message,
            now,
        );
        if let Err(e) = w.save(cluster).await {
            tracing::debug!(claim = claim.name(), error = %e, "could not mark the claim");
        }
        cluster.publish(ClusterEvent::claim(claim.name(), EventType::Warning, "NodeClassNotFound", message)).await;
    }
}

/// Records a launched instance on its claim.
fn record_launch(claim: &mut NodeClaim, i: &Instance, now: Timestamp) {
    let labels_map = claim.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in &i.labels {
        labels_map.insert(k.clone(), v.clone());
    }
    if let Some(lease) = &i.lease {
        let a = claim.metadata.annotations.get_or_insert_with(BTreeMap::new);
        a.insert(LEASE_EXPIRES_AT.into(), lease.expires_at.to_string());
        a.insert(LEASE_REASON.into(), lease.reason.clone());
    }
    let status = claim.status.get_or_insert_with(Default::default);
    status.provider_id = Some(i.provider_id.clone());
    status.image_id = i.image_id.clone();
    status.capacity = i.capacity.to_resource_list();
    status.allocatable = i.allocatable.to_resource_list();
    claim.set_condition(condition_types::LAUNCHED, ConditionStatus::True, "Launched", "", now);
}

/// Syncs the claim onto its node: labels, annotations, taints (unless the node opts out), the termination
/// finalizer and owner reference; removes the unregistered taint and labels the node registered.
fn register(claim: &mut NodeClaim, mut node: Node) -> Node {
    let meta = &mut node.metadata;
    // Read from the node's own labels, before the claim's are merged in, as Karpenter reads it.
    let sync_taints =
        meta.labels.as_ref().and_then(|l| l.get(labels::DO_NOT_SYNC_TAINTS)).map(String::as_str) != Some("true");
    let node_labels = meta.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in claim.metadata.labels.iter().flatten() {
        node_labels.insert(k.clone(), v.clone());
    }
    node_labels.insert(labels::REGISTERED.into(), "true".into());
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    let hash_keys = [labels::NODEPOOL_HASH, labels::NODEPOOL_HASH_VERSION];
    for (k, v) in claim.metadata.annotations.iter().flatten().filter(|(k, _)| !hash_keys.contains(&k.as_str())) {
        annotations.insert(k.clone(), v.clone());
    }
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == labels::TERMINATION_FINALIZER) {
        finalizers.push(labels::TERMINATION_FINALIZER.into());
    }
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "karpenter.sh/v1".into(),
        kind: "NodeClaim".into(),
        name: claim.name().to_owned(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: None,
    }]);
    let spec = node.spec.get_or_insert_with(Default::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    taints.retain(|t| t.key != labels::UNREGISTERED_TAINT);
    if sync_taints {
        for t in claim.spec.taints.iter().chain(&claim.spec.startup_taints) {
            if !taints.iter().any(|x| x.key == t.key && x.effect == t.effect) {
                taints.push(t.clone());
            }
        }
    }
    let status = claim.status.get_or_insert_with(Default::default);
    status.node_name = node.metadata.name.clone();
    node
}

/// What keeps a registered node from being initialized, if anything.
pub fn initialization_blocker(claim: &NodeClaim, node: &Node) -> Option<String> {
    if !node_ready(node) {
        return Some("node is not Ready".into());
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    if let Some(t) =
        claim.spec.startup_taints.iter().find(|st| taints.iter().any(|t| t.key == st.key && t.effect == st.effect))
    {
        return Some(format!("startup taint {} is still present", t.key));
    }
    if let Some(t) = taints.iter().find(|t| labels::is_known_ephemeral_taint(&t.key, &t.effect)) {
        return Some(format!("taint {} is still present", t.key));
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
    for name in claim.spec.resources.requests.keys().filter(|k| !BASE_RESOURCES.contains(&k.as_str())) {
        let reported = allocatable.get(name).is_some_and(|q| q.0.trim() != "0" && !q.0.is_empty());
        if !reported {
            return Some(format!("{name} is not reported allocatable yet"));
        }
    }
    None
}

#[cfg(test)]
mod tests;
