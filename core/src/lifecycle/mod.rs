//! A claim's life: launch, registration, initialization, liveness timeouts, lease expiry, finalization,
//! and garbage collection in both directions.
//!
//! [`Lifecycle::reconcile`] advances one claim as far as it can at `now` and says when to look again;
//! [`Lifecycle::collect_garbage`] reconciles the claims against what the providers list. Both run over the
//! [`Objects`] port and the [`ProviderRegistry`], so they are tested in virtual time against `FakeCloud`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

use crate::api::{ConditionStatus, NodeClaim, NodeClaimStatus, NodePool, condition_types, labels, parse_duration};
use crate::clock;
use crate::cloud::{CapacityType, CloudError, Instance, ProviderRegistry, UnavailableOfferings};
pub use crate::cloud::{Interruption, InterruptionKind};
use crate::cluster::{Objects, node_provider_id};
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
/// under them. DaemonSet pods come and go with their node and are not events.
#[derive(Debug, Default)]
pub struct PodEvents {
    /// Each bound pod's node, and the pass that last saw the binding.
    bound: HashMap<String, (String, u64)>,
    pass: u64,
}

impl PodEvents {
    /// Compares the pods' bindings with the last call and stamps the claims of the nodes that changed.
    /// Nothing is allocated for a binding that did not change.
    pub fn observe(&mut self, cluster: &mut dyn Objects, now: Timestamp) {
        self.pass += 1;
        let pass = self.pass;
        let mut touched: BTreeSet<String> = BTreeSet::new();
        let bound = &mut self.bound;
        cluster.for_each_binding(&mut |pod, node| match bound.get_mut(pod) {
            Some((old, seen)) if old == node => *seen = pass,
            Some((old, seen)) => {
                touched.insert(std::mem::replace(old, node.to_owned()));
                touched.insert(node.to_owned());
                *seen = pass;
            }
            None => {
                touched.insert(node.to_owned());
                bound.insert(pod.to_owned(), (node.to_owned(), pass));
            }
        });
        // Bindings not seen this pass are gone (the pod was deleted, evicted or finished).
        self.bound.retain(|_, (node, seen)| {
            let kept = *seen == pass;
            if !kept {
                touched.insert(std::mem::take(node));
            }
            kept
        });
        if !touched.is_empty() {
            let node_of = |c: &NodeClaim| c.status.as_ref().and_then(|s| s.node_name.clone());
            // A claim is usually named after its node; the others are found in one listing, by the node
            // their status names.
            let mut claims: Vec<NodeClaim> = Vec::new();
            let mut missed: BTreeSet<&str> = BTreeSet::new();
            for node in &touched {
                match cluster.claim(node).filter(|c| node_of(c).as_deref() == Some(node.as_str())) {
                    Some(c) => claims.push(c),
                    None => {
                        missed.insert(node);
                    }
                }
            }
            if !missed.is_empty() {
                claims.extend(
                    cluster.claims().into_iter().filter(|c| node_of(c).is_some_and(|n| missed.contains(n.as_str()))),
                );
            }
            for mut claim in claims {
                claim.status.get_or_insert_with(Default::default).last_pod_event_time = Some(now);
                cluster.put_claim(claim);
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
    /// Counters.
    pub counters: Counters,
}

fn created(claim: &NodeClaim) -> Option<Timestamp> {
    claim.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn since_condition(claim: &NodeClaim, type_: &str) -> Option<Timestamp> {
    claim.condition(type_).filter(|c| c.status == ConditionStatus::True).and_then(|c| c.last_transition_time)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
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
            counters: Counters::default(),
        }
    }

    /// The registration timeout of a pool: its `karpenter.sh/nodeclaim-registration-timeout` annotation,
    /// else the `registration-timeout` setting.
    pub fn registration_timeout(&self, pool: Option<&NodePool>) -> Duration {
        pool.and_then(|p| p.annotation(labels::NODECLAIM_REGISTRATION_TIMEOUT))
            .and_then(|t| parse_duration(t).ok())
            .unwrap_or(self.settings.registration_timeout)
    }

    /// When a claim `age` old whose create failed tries again: after as long as it has existed, so the
    /// waits double (10 s, 10 s, 20 s, 40 s, …, at most 5 minutes) and a failing cloud API is not asked
    /// every few seconds; never past the launch clock.
    fn create_backoff(&self, age: Duration) -> Duration {
        age.clamp(CREATE_BACKOFF, CREATE_BACKOFF_MAX).min(self.settings.launch_timeout.saturating_sub(age))
    }

    fn delete(&self, cluster: &mut dyn Objects, mut claim: NodeClaim, now: Timestamp, why: &str) -> Next {
        tracing::info!(claim = claim.name(), reason = why, "deleting claim");
        if claim.metadata.deletion_timestamp.is_none() {
            claim.metadata.deletion_timestamp = Some(Time(now));
        }
        cluster.put_claim(claim);
        Next::After(Duration::ZERO)
    }

    /// Advances one claim at `now`.
    pub async fn reconcile(
        &mut self,
        cluster: &mut dyn Objects,
        name: &str,
        pools: &[NodePool],
        now: Timestamp,
    ) -> Result<Next, LifecycleError> {
        let Some(mut claim) = cluster.claim(name) else { return Ok(Next::Done) };
        let provider = self.registry.for_claim(&claim)?.clone();
        if claim.metadata.deletion_timestamp.is_some() {
            return self.finalize(cluster, claim, now).await;
        }
        let pool = claim.node_pool().and_then(|p| pools.iter().find(|x| x.name() == p));
        let age = created(&claim).map(|c| clock::since(now, c)).unwrap_or_default();

        // Deleting a node deletes its claim (and the claim's termination drains and releases the node).
        if let Some(pid) = claim.provider_id()
            && cluster.node_being_deleted(pid)
        {
            return Ok(self.delete(cluster, claim, now, "node_deleted"));
        }

        // Expiration: forceful, whatever the budgets say.
        if let Some(expire) = claim.spec.expire_after.duration()
            && claim.is_true(condition_types::LAUNCHED)
            && age >= expire
        {
            self.counters.expirations += 1;
            return Ok(self.delete(cluster, claim, now, "expired"));
        }

        // Launch.
        if !claim.is_true(condition_types::LAUNCHED) {
            if age >= self.settings.launch_timeout {
                self.counters.launch_timeouts += 1;
                return Ok(self.delete(cluster, claim, now, "launch_timeout"));
            }
            let uid = claim.metadata.uid.clone().unwrap_or_else(|| claim.name().to_owned());
            let result = match self.launched.get(&uid) {
                Some(i) => Ok(i.clone()),
                None => {
                    let ignore: Vec<CapacityType> = claim
                        .annotation(IGNORE_UNAVAILABLE_OFFERINGS)
                        .map(|v| v.split(',').filter_map(|c| CapacityType::parse(c.trim())).collect())
                        .unwrap_or_default();
                    let options = self.unavailable.launch_options(provider.name(), &ignore, now);
                    provider.create(&claim, &options).await
                }
            };
            match result {
                Ok(instance) => {
                    self.launched.insert(uid, instance.clone());
                    self.counters.launched += 1;
                    record_launch(&mut claim, &instance, now);
                    cluster.put_claim(claim.clone());
                }
                Err(CloudError::InsufficientCapacity { offerings, message }) => {
                    for o in &offerings {
                        self.unavailable.mark(provider.name(), o, self.settings.unavailable_offerings_ttl, now);
                    }
                    self.counters.launch_failures += 1;
                    tracing::warn!(claim = name, %message, "insufficient capacity");
                    return Ok(self.delete(cluster, claim, now, "insufficient_capacity"));
                }
                Err(CloudError::NodeClassNotReady(message)) => {
                    self.counters.launch_failures += 1;
                    tracing::warn!(claim = name, %message, "node class not ready");
                    return Ok(self.delete(cluster, claim, now, "nodeclass_not_ready"));
                }
                Err(CloudError::LaunchDeferred { retry_after, reason }) => {
                    self.counters.launch_deferrals += 1;
                    claim.set_condition(
                        condition_types::LAUNCHED,
                        ConditionStatus::Unknown,
                        "LaunchDeferred",
                        &reason,
                        now,
                    );
                    cluster.put_claim(claim);
                    // The launch clock keeps running from creation.
                    let left = self.settings.launch_timeout.saturating_sub(age);
                    return Ok(Next::After(retry_after.min(left)));
                }
                Err(CloudError::Create { reason, message }) => {
                    self.counters.launch_failures += 1;
                    claim.set_condition(condition_types::LAUNCHED, ConditionStatus::Unknown, &reason, &message, now);
                    cluster.put_claim(claim);
                    return Ok(Next::After(self.create_backoff(age)));
                }
                Err(e) => {
                    self.counters.launch_failures += 1;
                    let message: String = e.to_string().chars().take(300).collect();
                    claim.set_condition(
                        condition_types::LAUNCHED,
                        ConditionStatus::Unknown,
                        "LaunchFailed",
                        &message,
                        now,
                    );
                    cluster.put_claim(claim);
                    return Ok(Next::After(self.create_backoff(age)));
                }
            }
        }

        // Lease expiry marks the claim drifted, for disruption to reclaim.
        if let Some(expires) = claim.annotation(LEASE_EXPIRES_AT).and_then(|t| t.parse::<Timestamp>().ok())
            && expires <= now
            && !claim.is_true(condition_types::DRIFTED)
        {
            claim.set_condition(condition_types::DRIFTED, ConditionStatus::True, ON_DEMAND_LEASE_EXPIRED, "", now);
            cluster.put_claim(claim.clone());
        }

        // Registration.
        if !claim.is_true(condition_types::REGISTERED) {
            let pid = claim.provider_id().unwrap_or_default().to_owned();
            let nodes: Vec<Node> = cluster.nodes_with_provider_id(&pid);
            match nodes.as_slice() {
                [node] => {
                    let node = register(&mut claim, node.clone(), now);
                    cluster.put_node(node);
                    cluster.put_claim(claim.clone());
                }
                [] => {
                    let timeout = self.registration_timeout(pool);
                    if age >= timeout {
                        self.counters.registration_timeouts += 1;
                        return Ok(self.delete(cluster, claim, now, "registration_timeout"));
                    }
                    claim.set_condition(condition_types::REGISTERED, ConditionStatus::Unknown, "NodeNotFound", "", now);
                    cluster.put_claim(claim);
                    return Ok(Next::After(timeout - age));
                }
                _ => {
                    claim.set_condition(
                        condition_types::REGISTERED,
                        ConditionStatus::False,
                        "MultipleNodesFound",
                        &format!("{} nodes have provider id {pid}", nodes.len()),
                        now,
                    );
                    cluster.put_claim(claim);
                    return Ok(Next::After(Duration::from_secs(10)));
                }
            }
        }

        // Initialization.
        if !claim.is_initialized() {
            let node_name = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            let node = cluster.node(&node_name);
            match node.as_ref().map(|n| initialization_blocker(&claim, n)) {
                Some(None) => {
                    if let Some(mut n) = node {
                        n.metadata
                            .labels
                            .get_or_insert_with(BTreeMap::new)
                            .insert(labels::INITIALIZED.into(), "true".into());
                        cluster.put_node(n);
                    }
                    claim.set_condition(condition_types::INITIALIZED, ConditionStatus::True, "Initialized", "", now);
                    cluster.put_claim(claim.clone());
                }
                blocker => {
                    let why = blocker.flatten().unwrap_or_else(|| "node not found".into());
                    let mut next = Duration::from_secs(10);
                    if let (Some(limit), Some(registered)) = (
                        self.settings.nodeclaim_initialization_timeout,
                        since_condition(&claim, condition_types::REGISTERED),
                    ) {
                        let waited = clock::since(now, registered);
                        if waited >= limit {
                            self.counters.initialization_timeouts += 1;
                            return Ok(self.delete(cluster, claim, now, "initialization_timeout"));
                        }
                        next = next.min(limit - waited);
                    }
                    claim.set_condition(
                        condition_types::INITIALIZED,
                        ConditionStatus::Unknown,
                        "NotInitialized",
                        &why,
                        now,
                    );
                    cluster.put_claim(claim);
                    return Ok(Next::After(next));
                }
            }
        }

        // Provider drift (image, network, NodeClass hash), asked every DRIFT_CHECK_INTERVAL; a failed
        // check is asked again next time.
        if claim.is_true(condition_types::DRIFTED) {
            return Ok(Next::Done);
        }
        let last = self.drift_checked.get(claim.name()).copied();
        if let Some(t) = last
            && clock::since(now, t) < DRIFT_CHECK_INTERVAL
        {
            return Ok(Next::After(DRIFT_CHECK_INTERVAL - clock::since(now, t)));
        }
        self.drift_checked.insert(claim.name().to_owned(), now);
        if let Ok(Some(reason)) = provider.is_drifted(&claim).await {
            tracing::info!(claim = claim.name(), reason = %reason, "provider reports drift");
            claim.set_condition(condition_types::DRIFTED, ConditionStatus::True, &reason.0, "", now);
            cluster.put_claim(claim);
            return Ok(Next::Done);
        }
        Ok(Next::After(DRIFT_CHECK_INTERVAL))
    }

    async fn finalize(
        &mut self,
        cluster: &mut dyn Objects,
        claim: NodeClaim,
        now: Timestamp,
    ) -> Result<Next, LifecycleError> {
        self.drift_checked.remove(claim.name());
        let provider = self.registry.for_claim(&claim)?.clone();
        if let Some(pid) = claim.provider_id() {
            // Drain the node first, unless it is NotReady and its instance is already gone.
            if let Some(mut node) = cluster.nodes_with_provider_id(pid).into_iter().next() {
                let gone = !node_ready(&node) && provider.get(pid).await.is_err_and(|e| e.is_not_found());
                if !gone {
                    let taints = node.spec.get_or_insert_with(Default::default).taints.get_or_insert_with(Vec::new);
                    if !taints.iter().any(|t| t.key == labels::DISRUPTED_TAINT) {
                        taints.push(crate::scheduling::taints::taint(labels::DISRUPTED_TAINT, None, "NoSchedule"));
                        cluster.put_node(node.clone());
                    }
                    let deadline = match (&claim.metadata.deletion_timestamp, claim.spec.termination_grace_period) {
                        (Some(t), Some(grace)) => Some(clock::add(t.0, grace.0)),
                        _ => None,
                    };
                    let name = node.metadata.name.clone().unwrap_or_default();
                    let drained = crate::termination::drain(cluster, &name, deadline, now);
                    if !drained.done {
                        return Ok(Next::After(Duration::from_secs(1)));
                    }
                    // Volumes detach before the instance goes, unless the grace period is over.
                    let attached = cluster.volume_attachments(&name);
                    if !attached.is_empty() && deadline.is_none_or(|d| now < d) {
                        tracing::debug!(node = %name, ?attached, "waiting for volumes to detach");
                        return Ok(Next::After(Duration::from_secs(1)));
                    }
                }
            }
        }
        if claim.provider_id().is_some() {
            match provider.delete(&claim).await {
                Ok(()) => return Ok(Next::After(DELETE_POLL)),
                Err(e) if e.is_not_found() => {}
                Err(source) => return Err(LifecycleError::Provider { claim: claim.name().to_owned(), source }),
            }
            let pid = claim.provider_id().unwrap_or_default();
            for n in cluster.nodes_with_provider_id(pid) {
                cluster.remove_node(n.metadata.name.as_deref().unwrap_or_default());
            }
        }
        if let Some(uid) = &claim.metadata.uid {
            self.launched.remove(uid);
        }
        cluster.remove_claim(claim.name());
        Ok(Next::Done)
    }

    /// Acts on an interruption: the claim is deleted at once (its node tainted and drained, its pods
    /// provisioned elsewhere), and an interrupted spot offering is marked unavailable. Returns the claim.
    pub fn interrupt(&mut self, cluster: &mut dyn Objects, event: &Interruption, now: Timestamp) -> Option<String> {
        if event.kind == InterruptionKind::Rebalance {
            return None;
        }
        let claim = cluster.claims().into_iter().find(|c| c.provider_id() == Some(event.provider_id.as_str()))?;
        if event.kind == InterruptionKind::SpotInterruption
            && let (Some(it), Some(zone), Ok(provider)) =
                (claim.label(labels::INSTANCE_TYPE), claim.label(labels::ZONE), self.registry.for_claim(&claim))
        {
            let key = crate::cloud::OfferingKey::new(it, zone, CapacityType::Spot);
            self.unavailable.mark(provider.name(), &key, self.settings.unavailable_offerings_ttl, now);
        }
        self.counters.interruptions += 1;
        let name = claim.name().to_owned();
        self.delete(cluster, claim, now, "interrupted");
        Some(name)
    }

    /// Reads every provider's interruption notices and acts on them. Returns the claims interrupted.
    pub async fn poll_interruptions(
        &mut self,
        cluster: &mut dyn Objects,
        now: Timestamp,
    ) -> Result<Vec<String>, LifecycleError> {
        let mut hit = Vec::new();
        for provider in self.registry.providers().to_vec() {
            let events = provider
                .interruptions()
                .await
                .map_err(|source| LifecycleError::Provider { claim: String::new(), source })?;
            for e in events {
                hit.extend(self.interrupt(cluster, &e, now));
            }
        }
        Ok(hit)
    }

    /// Reconciles claims against what the providers list: claims whose instance vanished (after the
    /// vanished-instance grace, or at once when registered with a node that is not Ready), instances no
    /// claim owns (after the orphan grace), and nodes with neither claim nor instance. Returns what it did.
    pub async fn collect_garbage(
        &mut self,
        cluster: &mut dyn Objects,
        now: Timestamp,
    ) -> Result<Vec<String>, LifecycleError> {
        let mut done = Vec::new();
        let claims = cluster.claims();
        let claimed: HashSet<String> = claims.iter().filter_map(|c| c.provider_id().map(str::to_owned)).collect();
        let mut listed: HashSet<String> = HashSet::new();
        for provider in self.registry.providers().to_vec() {
            let instances =
                provider.list().await.map_err(|source| LifecycleError::Provider { claim: String::new(), source })?;
            for i in instances {
                listed.insert(i.provider_id.clone());
                if claimed.contains(&i.provider_id) {
                    continue;
                }
                // Another cluster's instances are never listed; ours without a claim are leaks.
                if clock::since(now, i.launch_time) >= self.settings.orphan_instance_grace {
                    let mut stub = NodeClaim::new(i.node_claim.as_deref().unwrap_or("orphan"), Default::default());
                    stub.status =
                        Some(NodeClaimStatus { provider_id: Some(i.provider_id.clone()), ..Default::default() });
                    match provider.delete(&stub).await {
                        Ok(()) | Err(CloudError::NotFound(_)) => {}
                        Err(source) => return Err(LifecycleError::Provider { claim: stub.name().to_owned(), source }),
                    }
                    self.counters.orphan_instances += 1;
                    done.push(format!("terminated orphan instance {}", i.provider_id));
                }
            }
        }
        let nodes = cluster.nodes();
        for claim in claims {
            let Some(pid) = claim.provider_id() else { continue };
            if claim.metadata.deletion_timestamp.is_some() || listed.contains(pid) {
                continue;
            }
            let provider = self.registry.for_claim(&claim)?.clone();
            match provider.get(pid).await {
                Err(e) if e.is_not_found() => {}
                _ => continue,
            }
            let registered = claim.is_true(condition_types::REGISTERED);
            let node_ready_now = nodes.iter().any(|n| node_provider_id(n) == Some(pid) && node_ready(n));
            let launched_at = since_condition(&claim, condition_types::LAUNCHED).or_else(|| created(&claim));
            let reclaim = if registered {
                !node_ready_now
            } else {
                launched_at.is_some_and(|t| clock::since(now, t) >= self.settings.vanished_instance_grace)
            };
            if reclaim {
                self.counters.vanished += 1;
                done.push(format!("reclaimed NodeClaim/{}: its instance is gone", claim.name()));
                self.delete(cluster, claim, now, "instance_vanished");
            }
        }
        // Nodes that registered after their claim was gone: no owner, no finalizer, no instance.
        let claimed_now: HashSet<String> =
            cluster.claims().iter().filter_map(|c| c.provider_id().map(str::to_owned)).collect();
        for node in cluster.nodes() {
            let Some(pid) = node_provider_id(&node).map(str::to_owned) else { continue };
            let managed = node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(labels::NODE_POOL));
            let owned = node.metadata.owner_references.as_ref().is_some_and(|o| !o.is_empty());
            if !managed || owned || claimed_now.contains(&pid) {
                continue;
            }
            let mut gone = true;
            for provider in self.registry.providers() {
                if provider.get(&pid).await.is_ok() {
                    gone = false;
                }
            }
            if gone {
                let name = node.metadata.name.clone().unwrap_or_default();
                cluster.remove_node(&name);
                self.counters.orphan_nodes += 1;
                done.push(format!("deleted Node/{name}: no claim owns it and its instance is gone"));
            }
        }
        Ok(done)
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
fn register(claim: &mut NodeClaim, mut node: Node, now: Timestamp) -> Node {
    let meta = &mut node.metadata;
    let node_labels = meta.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in claim.metadata.labels.iter().flatten() {
        node_labels.insert(k.clone(), v.clone());
    }
    node_labels.insert(labels::REGISTERED.into(), "true".into());
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in claim.metadata.annotations.iter().flatten().filter(|(k, _)| k.as_str() != labels::NODEPOOL_HASH) {
        annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let sync_taints = annotations.get(labels::DO_NOT_SYNC_TAINTS).map(String::as_str) != Some("true");
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
    claim.set_condition(condition_types::REGISTERED, ConditionStatus::True, "Registered", "", now);
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
    if let Some(t) = taints.iter().find(|t| labels::KNOWN_EPHEMERAL_TAINTS.contains(&t.key.as_str())) {
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
