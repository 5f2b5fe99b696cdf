//! The controller loop shared by `tenon run` and `tenon simulate`: which controller runs when.
//!
//! A [`Runtime`] owns the controllers and their cadence, and nothing else decides when they run:
//!
//! - **provisioning**: a batch window opens on the first pod that needs a node and closes after
//!   `batch-idle-duration` without a new one, or `batch-max-duration` at most; one scheduling pass then
//!   turns the batch into NodeClaims;
//! - **lifecycle**: each claim has its own schedule. A claim is reconciled when it or its node changes
//!   (every step compares the snapshot with the last one), and again when its reconcile asked
//!   ([`Next::After`]); a failed reconcile backs off per claim;
//! - **interruptions**: the providers' notices are read every step;
//! - **pod events**: every step, so `consolidateAfter` counts from the last pod that came or went;
//! - **garbage collection**: every two minutes, sooner again after a failed run;
//! - **disruption**: a pass every `disruption-poll-period`, commands held for the validation window, the
//!   queue moved on every step; repair reboots are executed here.
//!
//! It reads through the [`Cluster`] port and writes through it, on a [`Clock`](crate::clock::Clock). [`Runtime::step`] runs
//! whatever is due at the clock's time and says when it next wants to run ([`Runtime::next_wake`]).
//! `tenon simulate` calls it once per simulated step, after the simulated world moved; `tenon run` calls
//! it whenever its watches report a change or the wake time comes, over the kube-rs port.
//!
//! **Restart safety.** A runtime starts with nothing in memory, so its first step rebuilds what it needs
//! from the cluster and the providers: each provider's own state through
//! [`CloudProvider::adopt`](crate::cloud::CloudProvider::adopt); the launch cache from the instances the
//! providers list under a claim's name (a claim whose status write was lost records its instance instead
//! of launching a second); and disruption commands found in flight (nodes tainted
//! `karpenter.sh/disrupted`, claims with a `DisruptionReason`, with no live command) are rolled back,
//! as Karpenter does, before the first pass.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use crate::api::{NodeClaim, NodePool, condition_types, labels};
use crate::clock::{self, SharedClock};
use crate::cloud::{InstanceType, ProviderRegistry, UnavailableOfferings};
use crate::cluster::{ApiErrorKind, Cluster, ClusterEvent, EventType, Snapshot, node_has_taint, node_provider_id};
use crate::disruption::queue::{Controller, Event};
use crate::lifecycle::{Lifecycle, Next, PodEvents};
use crate::provisioning::{self, Batcher, Nominations};
use crate::resources::Resources;
use crate::settings::Settings;
use crate::state::{ClusterState, ObjectMemo, StateCache};

/// What the runtime measured since the operator last took it ([`Runtime::take_telemetry`]), for
/// Karpenter's scheduler and disruption metrics. The decisions never read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Telemetry {
    /// How long each scheduling pass took (`scheduler_scheduling_duration_seconds`).
    pub scheduling: Vec<Duration>,
    /// Pods that wanted a place at the last provisioning step (`scheduler_queue_depth`).
    pub queue_depth: Option<usize>,
    /// What the last disruption pass measured.
    pub pass: Option<crate::disruption::PassStats>,
    /// Each pool's allowed disruptions by reason at the last pass (`nodepools_allowed_disruptions`).
    pub allowed: Vec<(String, crate::api::DisruptionReason, u64)>,
}

/// How often garbage collection runs.
pub const GC_PERIOD: Duration = Duration::from_secs(120);
/// The longest a claim's failed reconcile waits before it is tried again.
const RETRY_MAX: Duration = Duration::from_secs(300);
/// How many times a claim is reconciled in one step when it asks to go on at once.
const RECONCILES_PER_STEP: usize = 3;

/// A NodePool's validation: `Ok`, or what is wrong with it.
type Validation = Result<(), String>;

/// Names new NodeClaims: given a pool, a name no claim has.
pub type NameSource = Box<dyn FnMut(&str) -> String + Send>;

/// Names from a counter: `pool-00001`, `pool-00002`, … The counter is shared, so a runtime built afresh
/// after a restart goes on where the last left off (the simulator's names stay deterministic).
pub fn counter_names(counter: Arc<std::sync::atomic::AtomicU64>) -> NameSource {
    Box::new(move |pool: &str| {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        format!("{pool}-{n:05}")
    })
}

/// The controllers, and when each runs. See the [module docs](self).
pub struct Runtime {
    clock: SharedClock,
    settings: Settings,
    unavailable: Arc<UnavailableOfferings>,
    /// The claim lifecycle controller (its counters feed the simulator's report and the metrics).
    pub lifecycle: Lifecycle,
    batcher: Batcher,
    /// Pods nominated to capacity on its way.
    pub nominations: Nominations,
    /// The disruption controller and its queue.
    pub disruption: Controller,
    pod_events: PodEvents,
    names: NameSource,
    /// Claims scheduled for a reconcile, and when.
    due: HashMap<String, Timestamp>,
    /// Consecutive failed reconciles per claim, for back-off.
    failures: HashMap<String, u32>,
    /// The claims and nodes of the last step, to see what changed.
    last: Option<Snapshot>,
    next_gc: Timestamp,
    /// Instance types per NodePool, refreshed from its provider each pass; a failed read keeps the last.
    types: HashMap<String, Vec<InstanceType>>,
    /// Whether `types` was read afresh since [`Runtime::take_offerings_changed`] last looked.
    types_read: bool,
    /// What the last pass read for each NodePool: the types with the unavailable offerings applied. A pass
    /// that reads the same gets the same allocation, so the decisions can tell in a pointer comparison that
    /// nothing changed (see `scheduling`'s built-types memo).
    offered: HashMap<String, Arc<[InstanceType]>>,
    recovered: bool,
    /// The NodePools last validated, and each one's validation.
    valid_pools: Option<(Arc<Vec<NodePool>>, Vec<Validation>)>,
    /// Disruption decisions and their outcomes, in order, until the caller takes them.
    decisions: Vec<(Timestamp, Event)>,
    /// For each claim still booting, the pods provisioning last planned onto it.
    pub reserved: HashMap<String, Vec<String>>,
    state_cache: StateCache,
    /// Each claim's capacity, read once per claim object (NodePool status sums them every step).
    claim_capacity: ObjectMemo<NodeClaim, Option<Resources>>,
    /// Events recently published, so a condition that holds pass after pass is reported once a while.
    recent: RecentEvents,
    telemetry: Telemetry,
    /// Claims created for static NodePools and not yet seen in a snapshot (watches lag the writes), by
    /// name, with their pool and when: counted as live so that the count is not made up twice.
    static_created: HashMap<String, (String, Timestamp)>,
    /// The pools and claims (of a snapshot holding only those) whose template hashes needed no write when
    /// last checked: unchanged, they are not walked again.
    hashes_settled: Option<Snapshot>,
}

/// How long an `Unconsolidatable` event about one object silences the next, as Karpenter's.
const UNCONSOLIDATABLE_DEDUPE: Duration = Duration::from_secs(15 * 60);
/// How long a NodePool's `DisruptionBlocked` (a budget at zero) silences the next: budgets move by the
/// minute.
const POOL_BLOCKED_DEDUPE: Duration = Duration::from_secs(60);
/// How long any other event about one object, with one reason, silences the next (Karpenter's default).
const EVENT_DEDUPE: Duration = Duration::from_secs(120);

/// The events published lately, by object and reason (and, for a NodePool's budget, the disruption
/// reason): the same condition reported pass after pass makes one event per dedupe window, as Karpenter's
/// recorder dedupes, whatever its message says.
#[derive(Debug, Default)]
struct RecentEvents {
    at: HashMap<(&'static str, String, &'static str), Timestamp>,
    /// The size past which the next admission first drops what no window still covers: twice what the
    /// last sweep kept (at least [`RECENT_EVENTS_SWEEP`]), so sweeps stay rare however many events are
    /// live at once, and the whole costs a constant per event.
    sweep_above: usize,
    /// Sweeps so far.
    #[cfg(test)]
    sweeps: u64,
}

/// The fewest events [`RecentEvents`] holds before it sweeps.
const RECENT_EVENTS_SWEEP: usize = 4096;

impl RecentEvents {
    /// Whether an event about `object` of `kind` with `reason` would not go out now ([`RecentEvents::admit`]
    /// would turn it down), without recording anything.
    fn silenced(
        &self,
        kind: &'static str,
        object: &str,
        reason: &'static str,
        dedupe: Duration,
        now: Timestamp,
    ) -> bool {
        self.silences(&(kind, object.to_owned(), reason), dedupe, now)
    }

    /// Whether the event under `key` went out less than `dedupe` before `now`.
    fn silences(&self, key: &(&'static str, String, &'static str), dedupe: Duration, now: Timestamp) -> bool {
        self.at.get(key).is_some_and(|at| clock::since(now, *at) < dedupe)
    }

    /// Whether an event about `object` of `kind` with `reason` goes out now; records it if so.
    fn admit(
        &mut self,
        kind: &'static str,
        object: &str,
        reason: &'static str,
        dedupe: Duration,
        now: Timestamp,
    ) -> bool {
        if self.at.len() > self.sweep_above.max(RECENT_EVENTS_SWEEP) {
            // Every window is at most UNCONSOLIDATABLE_DEDUPE long: an older entry silences nothing.
            self.at.retain(|_, at| clock::since(now, *at) < UNCONSOLIDATABLE_DEDUPE);
            self.sweep_above = 2 * self.at.len();
            #[cfg(test)]
            {
                self.sweeps += 1;
            }
        }
        let key = (kind, object.to_owned(), reason);
        if self.silences(&key, dedupe, now) {
            return false;
        }
        self.at.insert(key, now);
        true
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("due", &self.due.len()).field("recovered", &self.recovered).finish()
    }
}

impl Runtime {
    /// A runtime over the providers in `registry`, on `clock`, naming claims with `names`.
    pub fn new(clock: SharedClock, registry: ProviderRegistry, settings: Settings, names: NameSource) -> Self {
        let unavailable = Arc::new(UnavailableOfferings::new());
        let mut disruption = Controller::new();
        disruption.repair_policies = registry.providers().iter().flat_map(|p| p.repair_policies()).collect();
        disruption.reboot_supported = true;
        let now = clock.now();
        Self {
            lifecycle: Lifecycle::new(registry, unavailable.clone(), settings.clone()),
            batcher: Batcher::from_settings(&settings),
            clock,
            settings,
            unavailable,
            nominations: Nominations::default(),
            disruption,
            pod_events: PodEvents::default(),
            names,
            due: HashMap::new(),
            failures: HashMap::new(),
            last: None,
            next_gc: now,
            types: HashMap::new(),
            types_read: false,
            offered: HashMap::new(),
            recovered: false,
            valid_pools: None,
            decisions: Vec::new(),
            reserved: HashMap::new(),
            state_cache: StateCache::default(),
            claim_capacity: ObjectMemo::default(),
            recent: RecentEvents::default(),
            telemetry: Telemetry::default(),
            static_created: HashMap::new(),
            hashes_settled: None,
        }
    }

    /// Shares `cache` as the unavailable-offerings cache, with a provider that marks offerings itself
    /// (AWS marks per-override `CreateFleet` errors).
    #[must_use]
    pub fn with_unavailable(mut self, cache: Arc<UnavailableOfferings>) -> Self {
        let registry = self.lifecycle.registry().clone();
        self.lifecycle = Lifecycle::new(registry, cache.clone(), self.settings.clone());
        self.unavailable = cache;
        self
    }

    /// The unavailable-offerings cache provisioning and launch share.
    pub fn unavailable(&self) -> &Arc<UnavailableOfferings> {
        &self.unavailable
    }

    /// What the runtime's state builds keep of the objects they read ([`StateCache`]). Something else
    /// building states of the same cluster (the simulator's kube-scheduler) may build with it too: what
    /// one build read is then not read again by the other, and a build over the pods the last one read
    /// takes them over whole.
    pub fn state_cache(&mut self) -> &mut StateCache {
        &mut self.state_cache
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Takes the disruption decisions made since the last call.
    pub fn take_decisions(&mut self) -> Vec<(Timestamp, Event)> {
        std::mem::take(&mut self.decisions)
    }

    /// Takes what the runtime measured since the last call.
    pub fn take_telemetry(&mut self) -> Telemetry {
        std::mem::take(&mut self.telemetry)
    }

    /// Each NodePool's instance types as its provider last reported them, when they were read again
    /// since the last call (for the offering price metrics).
    pub fn take_offerings_changed(&mut self) -> Option<&HashMap<String, Vec<InstanceType>>> {
        std::mem::take(&mut self.types_read).then_some(&self.types)
    }

    /// When the runtime next has something to do on its own; changes in the cluster may bring it sooner.
    pub fn next_wake(&self) -> Timestamp {
        let now = self.clock.now();
        let mut at = self.next_gc;
        let mut earliest = |t: Option<Timestamp>| {
            if let Some(t) = t {
                at = at.min(t);
            }
        };
        earliest(self.batcher.deadline());
        earliest(self.due.values().min().copied());
        earliest(self.disruption.next_wake());
        if !self.disruption.queue.is_empty() || self.disruption.queue.has_marked() {
            earliest(Some(clock::add(now, Duration::from_secs(1))));
        }
        at.max(now)
    }

    /// Builds the state mirror from a snapshot, with the disruption queue's marks. `None` (after a
    /// warning) when the snapshot cannot be read: a pass is skipped rather than run on a partial view.
    fn state(&mut self, snapshot: &Snapshot, now: Timestamp) -> Option<ClusterState> {
        let built = ClusterState::from_snapshot(snapshot, now, &mut self.state_cache);
        match built {
            Ok(mut s) => {
                self.disruption.queue.apply(&mut s);
                let nominated: HashSet<&str> = self.nominations.targets(now).collect();
                if !nominated.is_empty() {
                    for n in &mut s.nodes {
                        let claim = n.claim.as_ref().map(|c| c.name());
                        n.nominated =
                            nominated.contains(n.name.as_str()) || claim.is_some_and(|c| nominated.contains(c));
                    }
                }
                Some(s)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cluster state cannot be built; skipping this pass");
                None
            }
        }
    }

    /// Runs everything due at the clock's time.
    pub async fn step(&mut self, cluster: &dyn Cluster) {
        let now = self.clock.now();
        if !self.recovered {
            self.recover(cluster).await;
        }
        self.pool_status(cluster, now).await;
        self.keep_replicas(cluster, now).await;
        self.provision(cluster, now).await;
        if let Err(e) = self.lifecycle.poll_interruptions(cluster, now).await {
            tracing::warn!(error = %e, "interruption notices");
        }
        self.reconcile_claims(cluster, now).await;
        let snapshot = cluster.snapshot();
        self.pod_events.observe(cluster, &snapshot, now).await;
        self.finish_reboots(cluster, &snapshot, now).await;
        if now >= self.next_gc {
            // A failed run (a throttled list) is retried next step.
            match self.lifecycle.collect_garbage(cluster, now).await {
                Ok(_) => self.next_gc = clock::add(now, GC_PERIOD),
                Err(e) => tracing::warn!(error = %e, "garbage collection"),
            }
        }
        self.disrupt(cluster, now).await;
    }

    /// What a fresh process rebuilds before its first decision. See the [module docs](self).
    async fn recover(&mut self, cluster: &dyn Cluster) {
        let snapshot = cluster.snapshot();
        let claims: Vec<NodeClaim> = snapshot.claims.values().map(|c| NodeClaim::clone(c)).collect();
        let mut ok = true;
        for provider in self.lifecycle.registry().providers().to_vec() {
            if let Err(e) = provider.adopt(&claims).await {
                tracing::warn!(provider = provider.name(), error = %e, "adopting provider state; retried next step");
                ok = false;
                continue;
            }
            match provider.list().await {
                Ok(instances) => {
                    let n = self.lifecycle.adopt_launches(&snapshot, &instances);
                    if n > 0 {
                        tracing::info!(provider = provider.name(), claims = n, "launches taken back from the provider");
                    }
                }
                Err(e) => {
                    tracing::warn!(provider = provider.name(), error = %e, "listing instances; retried next step");
                    ok = false;
                }
            }
        }
        self.recovered = ok;
    }

    /// Each NodePool's validation, in the order of `pools`: computed once per version of the pools, and
    /// shared by the decisions and the pool status.
    fn validations(&mut self, pools: &Arc<Vec<NodePool>>) -> &[Validation] {
        if !self.valid_pools.as_ref().is_some_and(|(seen, _)| Arc::ptr_eq(seen, pools)) {
            let checked = pools.iter().map(|p| p.validate().map_err(|e| e.to_string())).collect();
            self.valid_pools = Some((pools.clone(), checked));
        }
        self.valid_pools.as_ref().map_or(&[], |(_, checked)| checked.as_slice())
    }

    /// The snapshot the decisions read: NodePools that fail validation are left out (with a
    /// `ValidationSucceeded=False` condition on them), as Karpenter leaves them out.
    fn decidable(&mut self, snapshot: Snapshot) -> Snapshot {
        let valid: Vec<bool> = self.validations(&snapshot.pools).iter().map(Result::is_ok).collect();
        if valid.iter().all(|v| *v) {
            return snapshot;
        }
        let pools = snapshot.pools.iter().zip(&valid).filter(|(_, v)| **v).map(|(p, _)| p.clone()).collect();
        Snapshot { pools: Arc::new(pools), ..snapshot }
    }

    /// NodePool status as Karpenter writes it: `ValidationSucceeded`, `NodeClassReady` (a registered
    /// provider serves its NodeClass) and `Ready` conditions, the node count and the nodes' total
    /// resources. Written only when it changed; a failed write is tried again next step.
    async fn pool_status(&mut self, cluster: &dyn Cluster, now: Timestamp) {
        use crate::api::ConditionStatus;
        use crate::api::condition_types::{NODE_CLASS_READY, READY, VALIDATION_SUCCEEDED};
        let snapshot = cluster.snapshot();
        let validations = self.validations(&snapshot.pools).to_vec();
        self.keep_template_hashes(cluster, &snapshot).await;
        for (pool, validation) in snapshot.pools.iter().zip(validations) {
            let mut desired = pool.clone();
            match &validation {
                Ok(()) => {
                    desired.set_condition(VALIDATION_SUCCEEDED, ConditionStatus::True, "ValidationSucceeded", "", now)
                }
                Err(m) => {
                    desired.set_condition(VALIDATION_SUCCEEDED, ConditionStatus::False, "ValidationFailed", m, now)
                }
            }
            let routed = self.lifecycle.registry().for_pool(pool).map(|_| ()).map_err(|e| e.to_string());
            match &routed {
                Ok(()) => desired.set_condition(NODE_CLASS_READY, ConditionStatus::True, "NodeClassReady", "", now),
                Err(m) => desired.set_condition(NODE_CLASS_READY, ConditionStatus::False, "NodeClassNotFound", m, now),
            }
            match validation.as_ref().and(routed.as_ref()) {
                Ok(()) => desired.set_condition(READY, ConditionStatus::True, "Ready", "", now),
                Err(m) => desired.set_condition(READY, ConditionStatus::False, "NotReady", m, now),
            }
            let mut total = crate::resources::Resources::ZERO;
            let mut nodes = 0i64;
            for c in snapshot.claims.values() {
                if c.node_pool() != Some(pool.name()) || c.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                nodes += 1;
                let read = || c.status.as_ref().and_then(|s| Resources::from_resource_list(&s.capacity).ok());
                if let Some(capacity) = self.claim_capacity.get(c, read) {
                    total.add_assign(&capacity);
                }
            }
            let status = desired.status.get_or_insert_with(Default::default);
            status.resources = total.to_resource_list();
            status.nodes = Some(nodes);
            if desired.status == pool.status {
                continue;
            }
            let was_valid = pool.condition(VALIDATION_SUCCEEDED).is_none_or(|c| c.status == ConditionStatus::True);
            if let (Err(m), true) = (&validation, was_valid) {
                let event = pool_event(pool.name(), EventType::Warning, "FailedValidation", m.clone());
                cluster.publish(event).await;
            }
            if let Err(e) = cluster.patch_pool_status(&desired).await {
                tracing::debug!(pool = pool.name(), error = %e, "NodePool status not written; retried next step");
            }
        }
        self.claim_capacity.end_round();
    }

    /// Keeps the template hashes as Karpenter's NodePool hash controller does: each pool carries tenon's hash
    /// of its template and the scheme (`karpenter.sh/nodepool-hash`, `…-hash-version`), and each of its
    /// claims hashed under another scheme (a claim Karpenter made) is re-hashed with the pool's, unless it
    /// is already marked drifted. A claim is compared for drift only against a hash of its own scheme, so
    /// taking over a Karpenter cluster drifts nothing. Failed writes are tried again next step.
    async fn keep_template_hashes(&mut self, cluster: &dyn Cluster, snapshot: &Snapshot) {
        use crate::api::TEMPLATE_HASH_VERSION;
        if self
            .hashes_settled
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(&s.pools, &snapshot.pools) && Arc::ptr_eq(&s.claims, &snapshot.claims))
        {
            return;
        }
        let mut wrote = false;
        let mut hashes: HashMap<&str, String> = HashMap::with_capacity(snapshot.pools.len());
        for pool in snapshot.pools.iter() {
            let hash = pool.template_hash();
            let current = (pool.annotation(labels::NODEPOOL_HASH), pool.annotation(labels::NODEPOOL_HASH_VERSION));
            if current != (Some(hash.as_str()), Some(TEMPLATE_HASH_VERSION)) {
                let mut desired = pool.clone();
                let annotations = desired.metadata.annotations.get_or_insert_with(Default::default);
                annotations.insert(labels::NODEPOOL_HASH.to_owned(), hash.clone());
                annotations.insert(labels::NODEPOOL_HASH_VERSION.to_owned(), TEMPLATE_HASH_VERSION.to_owned());
                wrote = true;
                if let Err(e) = cluster.patch_pool_annotations(&desired).await {
                    tracing::debug!(pool = pool.name(), error = %e, "NodePool hash not written; retried next step");
                }
            }
            hashes.insert(pool.name(), hash);
        }
        for claim in snapshot.claims.values() {
            let version = claim.annotation(labels::NODEPOOL_HASH_VERSION);
            if version == Some(TEMPLATE_HASH_VERSION)
                || claim.metadata.deletion_timestamp.is_some()
                || claim.is_true(condition_types::DRIFTED)
            {
                continue;
            }
            let Some(hash) = claim.node_pool().and_then(|p| hashes.get(p)) else { continue };
            let mut c = NodeClaim::clone(claim);
            let annotations = c.metadata.annotations.get_or_insert_with(Default::default);
            // A hash with no scheme is an earlier tenon's own: kept, so drift since then still shows.
            if version.is_some() || !annotations.contains_key(labels::NODEPOOL_HASH) {
                annotations.insert(labels::NODEPOOL_HASH.to_owned(), hash.clone());
            }
            annotations.insert(labels::NODEPOOL_HASH_VERSION.to_owned(), TEMPLATE_HASH_VERSION.to_owned());
            wrote = true;
            if let Err(e) = cluster.patch_claim(&c).await {
                tracing::debug!(claim = claim.name(), error = %e, "NodeClaim hash not written; retried next step");
            }
        }
        self.hashes_settled = (!wrote).then(|| Snapshot {
            pools: snapshot.pools.clone(),
            claims: snapshot.claims.clone(),
            ..Default::default()
        });
    }

    /// Keeps each static NodePool (`spec.replicas`) at its count, as Karpenter's static provisioning and
    /// deprovisioning do: claims of its template are added while fewer are live (within `limits.nodes`),
    /// and the surplus is deleted while none of its nodes is held by a disruption command, in
    /// [`surplus_order`]. A claim being deleted, or whose node a command holds, is not
    /// live: a drifted node's replacement is counted in its stead.
    async fn keep_replicas(&mut self, cluster: &dyn Cluster, now: Timestamp) {
        let snapshot = self.decidable(cluster.snapshot());
        let statics: Vec<NodePool> = snapshot
            .pools
            .iter()
            .filter(|p| p.spec.replicas.is_some() && p.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect();
        // A created claim is awaited in the snapshot for a minute at most.
        self.static_created.retain(|name, (_, at)| {
            !snapshot.claims.contains_key(name) && clock::since(now, *at) < Duration::from_secs(60)
        });
        if statics.is_empty() {
            return;
        }
        for pool in &statics {
            let want = u64::try_from(pool.spec.replicas.unwrap_or(0)).unwrap_or(0);
            let held = |c: &NodeClaim| {
                let node = c.status.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or(c.name());
                self.disruption.queue.is_marked(node) || self.disruption.queue.is_marked(c.name())
            };
            let of_pool: Vec<&Arc<NodeClaim>> =
                snapshot.claims.values().filter(|c| c.node_pool() == Some(pool.name())).collect();
            let live: Vec<&Arc<NodeClaim>> =
                of_pool.iter().copied().filter(|c| c.metadata.deletion_timestamp.is_none() && !held(c)).collect();
            let in_flight = self.static_created.values().filter(|(p, _)| p == pool.name()).count() as u64;
            let have = live.len() as u64 + in_flight;
            if have < want {
                let limit = pool.spec.limits.get("nodes").and_then(|q| q.0.parse::<u64>().ok());
                let counted = of_pool.iter().filter(|c| c.metadata.deletion_timestamp.is_none()).count() as u64;
                let room = limit.map_or(u64::MAX, |l| l.saturating_sub(counted));
                let types = self.refresh_types(std::slice::from_ref(pool), now).await;
                let types = types.get(pool.name()).cloned().unwrap_or_else(|| Arc::new([]));
                let Some(plan) =
                    provisioning::static_claim_plan(pool, &types, self.settings.max_instance_types as usize)
                else {
                    tracing::warn!(
                        pool = pool.name(),
                        "static NodePool: no instance type its template allows is offered"
                    );
                    continue;
                };
                for _ in 0..(want - have).min(room) {
                    let name = (self.names)(pool.name());
                    let claim = provisioning::node_claim(&plan, pool, &name);
                    if let Err(e) = cluster.create_claim(&claim).await {
                        tracing::warn!(pool = pool.name(), claim = %name, error = %e, "static NodePool: creating a claim");
                        break;
                    }
                    self.static_created.insert(name, (pool.name().to_owned(), now));
                }
            } else if have > want && in_flight == 0 && !of_pool.iter().any(|c| held(c)) {
                for c in surplus_order(&snapshot, &live, now).into_iter().take((have - want) as usize) {
                    if let Err(e) = cluster.delete_claim(c.name()).await {
                        tracing::warn!(claim = c.name(), error = %e, "static NodePool: deleting a surplus claim");
                    }
                }
            }
        }
    }

    /// Whether some node is on its way out (deleted, tainted as disrupted, or marked by the disruption
    /// queue), so its pods need a new place.
    fn any_leaving(&self, snapshot: &Snapshot) -> bool {
        self.disruption.queue.has_marked()
            || snapshot.claims.values().any(|c| c.metadata.deletion_timestamp.is_some())
            || snapshot
                .nodes
                .values()
                .any(|n| n.metadata.deletion_timestamp.is_some() || node_has_taint(n, labels::DISRUPTED_TAINT))
    }

    /// Reads each pool's offerings afresh (reserved capacity frees up, prices move); a pool whose
    /// provider cannot be read keeps its last types.
    async fn refresh_types(&mut self, pools: &[NodePool], now: Timestamp) -> HashMap<String, Arc<[InstanceType]>> {
        let mut out = HashMap::with_capacity(pools.len());
        for pool in pools {
            let Ok(provider) = self.lifecycle.registry().for_pool(pool).cloned() else { continue };
            match provider.instance_types(pool).await {
                Ok(types) => {
                    self.types.insert(pool.name().to_owned(), types);
                    self.types_read = true;
                }
                Err(e) => tracing::debug!(pool = pool.name(), error = %e, "instance types; keeping the last"),
            }
            if let Some(types) = self.types.get(pool.name()) {
                let mut types = types.clone();
                self.unavailable.apply(provider.name(), &mut types, &[], now);
                let types = match self.offered.get(pool.name()) {
                    Some(last) if **last == *types => Arc::clone(last),
                    _ => {
                        let types: Arc<[InstanceType]> = types.into();
                        self.offered.insert(pool.name().to_owned(), Arc::clone(&types));
                        types
                    }
                };
                out.insert(pool.name().to_owned(), types);
            }
        }
        self.offered.retain(|name, _| self.types.contains_key(name));
        out
    }

    async fn provision(&mut self, cluster: &dyn Cluster, now: Timestamp) {
        let snapshot = self.decidable(cluster.snapshot());
        // With no batch open and no pod to place, a pass would do nothing: skip building the state.
        if !self.batcher.is_open() && !snapshot.any_unbound() && !self.any_leaving(&snapshot) {
            return;
        }
        let Some(state) = self.state(&snapshot, now) else { return };
        let waiting = state.pods_to_place().any(|p| self.nominations.target(&p.info.key, now).is_none());
        self.telemetry.queue_depth = Some(state.pods_to_place().count());
        // Pods waiting without capacity on its way open a batch window.
        if waiting && !self.batcher.is_open() {
            self.batcher.trigger(now);
        }
        if !self.batcher.ready(now) {
            return;
        }
        self.batcher.reset();
        let types = self.refresh_types(&snapshot.pools, now).await;
        let types_for = types_of(types);
        self.nominations.expire(now, |t| snapshot.claims.contains_key(t) || snapshot.nodes.contains_key(t));
        let names = &mut self.names;
        let mut name_for = |pool: &str| names(pool);
        let began = std::time::Instant::now();
        let out =
            provisioning::provision(&state, &types_for, &mut self.nominations, &self.settings, now, &mut name_for);
        // Bounded for a caller that never takes the telemetry (the simulator).
        if self.telemetry.scheduling.len() < 1024 {
            self.telemetry.scheduling.push(began.elapsed());
        }
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
            if snapshot.claims.get(&placed.node).is_some_and(|c| !c.is_true(condition_types::REGISTERED)) {
                self.reserved.insert(placed.node.clone(), placed.pods.clone());
            }
        }
        self.reserved.retain(|claim, _| snapshot.claims.contains_key(claim));
        for placed in &out.results.existing {
            let target = if snapshot.claims.contains_key(&placed.node) { "nodeclaim" } else { "node" };
            self.nominated(cluster, &placed.pods, &format!("{target}/{}", placed.node), now).await;
        }
        for (claim, plan) in out.claims.into_iter().zip(out.results.claims.iter()) {
            match cluster.create_claim(&claim).await {
                Ok(_) => {
                    self.reserved.insert(claim.name().to_owned(), plan.pods.clone());
                    self.nominated(cluster, &plan.pods, &format!("nodeclaim/{}", claim.name()), now).await;
                }
                // A create whose answer was lost may have landed; the claim is reconciled if it did.
                Err(e) if e.kind == ApiErrorKind::Unavailable => {
                    tracing::warn!(claim = claim.name(), error = %e, "creating a claim: no answer");
                    self.reserved.insert(claim.name().to_owned(), plan.pods.clone());
                }
                Err(e) => {
                    // Its pods are free for the next batch.
                    tracing::warn!(claim = claim.name(), error = %e, "creating a claim failed");
                    self.nominations.release(claim.name());
                    let pool = claim.node_pool().unwrap_or_default().to_owned();
                    let message = format!("creating NodeClaim {}: {e}", claim.name());
                    cluster.publish(pool_event(&pool, EventType::Warning, "FailedCreate", message)).await;
                }
            }
        }
    }

    /// `Nominated` events on `pods` (by key), placed on `target` (`nodeclaim/NAME` or `node/NAME`).
    async fn nominated(&mut self, cluster: &dyn Cluster, pods: &[String], target: &str, now: Timestamp) {
        for pod in pods {
            if self.recent.admit("Pod", pod, "Nominated", EVENT_DEDUPE, now) {
                let message = format!("Pod should schedule on: {target}");
                cluster.publish(ClusterEvent::pod(pod, EventType::Normal, "Nominated", message)).await;
            }
        }
    }

    /// After a disruption pass: `DisruptionBlocked` on the Node and NodeClaim of each node that is no
    /// candidate (and on each NodePool whose budget is at zero for a reason with nodes to disrupt), and
    /// `Unconsolidatable` on those a method examined and left alone, each with its reason.
    async fn report_pass(&mut self, cluster: &dyn Cluster, snapshot: &Snapshot, state: &ClusterState, now: Timestamp) {
        use crate::api::DisruptionReason;
        let Some((notes, stats)) = self.disruption.take_pass_report() else { return };
        self.telemetry.pass = Some(stats);
        let claims: HashMap<&str, &str> = snapshot
            .claims
            .values()
            .filter_map(|c| Some((c.status.as_ref()?.node_name.as_deref()?, c.name())))
            .collect();
        for crate::disruption::queue::Note { node, reason, blocked } in notes {
            let (event, dedupe) = if blocked {
                ("DisruptionBlocked", EVENT_DEDUPE)
            } else {
                ("Unconsolidatable", UNCONSOLIDATABLE_DEDUPE)
            };
            if self.recent.admit("Node", &node, event, dedupe, now) {
                cluster.publish(ClusterEvent::node(&node, EventType::Normal, event, reason.clone())).await;
            }
            if let Some(claim) = claims.get(node.as_str())
                && self.recent.admit("NodeClaim", claim, event, dedupe, now)
            {
                cluster.publish(ClusterEvent::claim(claim, EventType::Normal, event, reason)).await;
            }
        }
        self.telemetry.allowed.clear();
        for reason in [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized] {
            for (pool, allowed, _) in crate::disruption::allowances(state, reason, now) {
                self.telemetry.allowed.push((pool.clone(), reason, allowed));
                if allowed > 0 || state.pool_nodes(&pool).next().is_none() {
                    continue;
                }
                let object = format!("{pool}/{reason}");
                if self.recent.admit("NodePool", &object, "DisruptionBlocked", POOL_BLOCKED_DEDUPE, now) {
                    let message =
                        format!("No allowed disruptions for disruption reason {reason} due to blocking budget");
                    cluster.publish(pool_event(&pool, EventType::Normal, "DisruptionBlocked", message)).await;
                }
            }
        }
    }

    /// Schedules every claim that changed, or whose node changed, since the last step.
    fn notice_changes(&mut self, snapshot: &Snapshot, now: Timestamp) {
        let last = self.last.take();
        match &last {
            Some(l) if Arc::ptr_eq(&l.claims, &snapshot.claims) => {}
            Some(l) => {
                let (due, failures) = (&mut self.due, &mut self.failures);
                walk_changes(&l.claims, &snapshot.claims, |name, _, gone| {
                    if gone {
                        due.remove(name);
                        failures.remove(name);
                    } else {
                        due.insert(name.to_owned(), now);
                    }
                });
            }
            None => {
                for name in snapshot.claims.keys() {
                    self.due.insert(name.clone(), now);
                }
                self.due.retain(|name, _| snapshot.claims.contains_key(name));
                self.failures.retain(|name, _| snapshot.claims.contains_key(name));
            }
        }
        if let Some(old) = last.as_ref().map(|l| &l.nodes)
            && !Arc::ptr_eq(old, &snapshot.nodes)
        {
            let mut touched: HashSet<String> = HashSet::new();
            walk_changes(old, &snapshot.nodes, |name, node, _| {
                touched.extend(node_provider_id(node).map(str::to_owned));
                touched.insert(name.to_owned());
            });
            if !touched.is_empty() {
                for (name, claim) in snapshot.claims.iter() {
                    let by_pid = claim.provider_id().is_some_and(|p| touched.contains(p));
                    let by_node =
                        claim.status.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| touched.contains(n));
                    if by_pid || by_node || touched.contains(name) {
                        self.due.insert(name.clone(), now);
                    }
                }
            }
        }
        self.last =
            Some(Snapshot { claims: snapshot.claims.clone(), nodes: snapshot.nodes.clone(), ..Default::default() });
    }

    async fn reconcile_claims(&mut self, cluster: &dyn Cluster, now: Timestamp) {
        // Not held past this: a claim's termination evicts pods, and the in-memory API server copies a pod map
        // a snapshot still shares.
        self.notice_changes(&cluster.snapshot(), now);
        let mut ready: Vec<String> = self.due.iter().filter(|(_, at)| **at <= now).map(|(n, _)| n.clone()).collect();
        ready.sort_unstable();
        for name in ready {
            let mut next = Next::Done;
            let mut failed = None;
            for _ in 0..RECONCILES_PER_STEP {
                match self.lifecycle.reconcile(cluster, &name, now).await {
                    Ok(Next::After(d)) if d.is_zero() => next = Next::After(d),
                    Ok(n) => {
                        next = n;
                        break;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            match failed {
                Some(e) => {
                    let n = self.failures.entry(name.clone()).or_default();
                    *n += 1;
                    // A conflict only needs a fresh read; anything else backs off, 1 s doubling.
                    let wait = match &e {
                        crate::lifecycle::LifecycleError::Api(a) if a.is_conflict() => Duration::from_secs(1),
                        _ => (Duration::from_secs(1) * 2u32.saturating_pow((*n - 1).min(16))).min(RETRY_MAX),
                    };
                    tracing::debug!(claim = %name, error = %e, ?wait, "reconcile failed");
                    self.due.insert(name, clock::add(now, wait));
                }
                None => {
                    self.failures.remove(&name);
                    match next {
                        // Still going on at once after the step's share: the next step picks it up.
                        Next::After(d) => {
                            self.due.insert(name, clock::add(now, d));
                        }
                        Next::Done => {
                            self.due.remove(&name);
                        }
                    }
                }
            }
        }
    }

    async fn disrupt(&mut self, cluster: &dyn Cluster, now: Timestamp) {
        let snapshot = self.decidable(cluster.snapshot());
        // Disruption prices against current offerings: owned machines freed, spot prices moved.
        let types = self.refresh_types(&snapshot.pools, now).await;
        let Some(state) = self.state(&snapshot, now) else { return };
        let types_for = types_of(types);
        let inputs = crate::disruption::Inputs { state: &state, types_for: &types_for, settings: &self.settings, now };
        let names = &mut self.names;
        let mut name_for = |pool: &str| names(pool);
        // A node whose `Unconsolidatable` events (on it and on its claim) are still silenced gets none from
        // this pass whatever its reason says: single-node consolidation need not work out the reason.
        let claims: HashMap<&str, &str> = snapshot
            .claims
            .values()
            .filter_map(|c| Some((c.status.as_ref()?.node_name.as_deref()?, c.name())))
            .collect();
        let recent = &self.recent;
        let silenced = |kind: &'static str, object: &str| {
            recent.silenced(kind, object, "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, now)
        };
        let unread =
            |node: &str| silenced("Node", node) && claims.get(node).is_none_or(|claim| silenced("NodeClaim", claim));
        let events = self.disruption.tick(&inputs, cluster, &mut self.nominations, &mut name_for, &unread).await;
        for e in events {
            match &e {
                Event::Reboot { node, claim } => self.reboot(cluster, &snapshot, node, claim).await,
                Event::Proposed { method, nodes } => tracing::info!(?method, ?nodes, "disruption proposed"),
                Event::Started { nodes, why, .. } => tracing::info!(?nodes, %why, "disruption started"),
                Event::Rejected { nodes, reason } => tracing::info!(?nodes, %reason, "disruption rejected"),
                Event::Finished(outcome) => tracing::info!(?outcome, "disruption finished"),
                Event::CleanedUp { node } => tracing::info!(%node, "removed a disrupted taint no command holds"),
                Event::RepairBlocked { node, message, .. } => tracing::info!(%node, %message, "repair blocked"),
            }
            self.decisions.push((now, e));
        }
        self.report_pass(cluster, &snapshot, &state, now).await;
    }

    /// Lifts the `karpenter.sh/rebooting` taint of each node back from a repair reboot: its `Ready`
    /// condition turned `True` after the taint was added (the kubelet came back), or the reboot outlasted
    /// [`REBOOT_TIMEOUT`](crate::repair::REBOOT_TIMEOUT), when repair judges the node afresh. A taint
    /// with no time is lifted once the node is Ready.
    async fn finish_reboots(&mut self, cluster: &dyn Cluster, snapshot: &Snapshot, now: Timestamp) {
        for (name, node) in snapshot.nodes.iter() {
            let Some(taint) = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .and_then(|t| t.iter().find(|t| t.key == labels::REBOOTING_TAINT))
            else {
                continue;
            };
            let since = taint.time_added.as_ref().map(|t| t.0);
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .filter(|c| c.status == "True");
            let back = ready.is_some_and(|c| match (since, c.last_transition_time.as_ref()) {
                (Some(since), Some(at)) => at.0 > since,
                (None, _) => true,
                (Some(_), None) => false,
            });
            let timed_out = since.is_some_and(|t| clock::since(now, t) >= crate::repair::REBOOT_TIMEOUT);
            if !back && !timed_out {
                continue;
            }
            let mut n = k8s_openapi::api::core::v1::Node::clone(node);
            if let Some(taints) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                taints.retain(|t| t.key != labels::REBOOTING_TAINT);
            }
            match cluster.patch_node(&n).await {
                Ok(_) if back => tracing::info!(node = %name, "back from its repair reboot"),
                Ok(_) => tracing::warn!(node = %name, "its repair reboot timed out; repair judges it afresh"),
                Err(e) => {
                    tracing::debug!(node = %name, error = %e, "lifting the rebooting taint; retried next step");
                    continue;
                }
            }
            let claim =
                snapshot.claims.values().find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name));
            if let Some(c) = claim.filter(|c| c.is_true(condition_types::REBOOTING)) {
                let mut c = NodeClaim::clone(c);
                let reason = if back { "RebootCompleted" } else { "RebootTimedOut" };
                c.set_condition(condition_types::REBOOTING, crate::api::ConditionStatus::False, reason, "", now);
                if let Err(e) = cluster.patch_claim_status(&c).await {
                    tracing::debug!(claim = c.name(), error = %e, "recording the end of the reboot on the claim");
                }
            }
        }
    }

    /// The executor's half of a repair reboot: taint the node and ask its provider.
    async fn reboot(&mut self, cluster: &dyn Cluster, snapshot: &Snapshot, node: &str, claim: &str) {
        let Some(c) = snapshot.claim(claim) else { return };
        if let Some(n) = snapshot.node(node)
            && !node_has_taint(n, labels::REBOOTING_TAINT)
        {
            let mut n = k8s_openapi::api::core::v1::Node::clone(n);
            let taints = n.spec.get_or_insert_with(Default::default).taints.get_or_insert_with(Vec::new);
            let mut taint = crate::scheduling::taints::taint(labels::REBOOTING_TAINT, None, "NoSchedule");
            // When the reboot began, kept on the node itself: a restarted tenon still knows.
            taint.time_added = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(self.clock.now()));
            taints.push(taint);
            if let Err(e) = cluster.patch_node(&n).await {
                tracing::warn!(node, error = %e, "tainting a node to reboot");
                self.disruption.repairer.reboot_failed(node);
                return;
            }
        }
        let provider = match self.lifecycle.registry().for_claim(c) {
            Ok(p) => p.clone(),
            Err(_) => {
                self.disruption.repairer.reboot_failed(node);
                return;
            }
        };
        if let Err(e) = provider.reboot(c).await {
            tracing::warn!(node, error = %e, "reboot failed");
            self.disruption.repairer.reboot_failed(node);
        } else {
            cluster.publish(ClusterEvent::node(node, EventType::Normal, "Rebooting", "rebooting for repair")).await;
            let mut claim = NodeClaim::clone(c);
            let now = self.clock.now();
            claim.set_condition(condition_types::REBOOTING, crate::api::ConditionStatus::True, "RepairReboot", "", now);
            if let Err(e) = cluster.patch_claim_status(&claim).await {
                tracing::debug!(claim = claim.name(), error = %e, "recording the reboot on the claim");
            }
        }
    }
}

/// The decisions' view of `types`, read per pool: a pool with none read has none.
/// Walks `new` beside `old` in key order and calls `f(key, value, gone)` for each key of `new` whose value
/// is not the very object `old` holds there (`gone` false; new keys included) and each key of `old` that
/// `new` no longer has (`gone` true, with its old value). Unchanged entries cost a pointer comparison.
fn walk_changes<'a, V>(
    old: &'a BTreeMap<String, Arc<V>>,
    new: &'a BTreeMap<String, Arc<V>>,
    mut f: impl FnMut(&'a str, &'a Arc<V>, bool),
) {
    let mut old = old.iter().peekable();
    for (key, value) in new {
        loop {
            let Some((old_key, old_value)) = old.peek() else {
                f(key, value, false);
                break;
            };
            if Arc::ptr_eq(old_value, value) {
                old.next();
                break;
            }
            match old_key.as_str().cmp(key.as_str()) {
                std::cmp::Ordering::Less => {
                    f(old_key, old_value, true);
                    old.next();
                }
                std::cmp::Ordering::Equal => {
                    f(key, value, false);
                    old.next();
                    break;
                }
                std::cmp::Ordering::Greater => {
                    f(key, value, false);
                    break;
                }
            }
        }
    }
    for (old_key, old_value) in old {
        f(old_key, old_value, true);
    }
}

fn types_of(types: HashMap<String, Arc<[InstanceType]>>) -> impl Fn(&NodePool) -> Arc<[InstanceType]> {
    move |p| types.get(p.name()).cloned().unwrap_or_else(|| Arc::new([]))
}

fn pool_event(pool: &str, type_: EventType, reason: &'static str, message: String) -> ClusterEvent {
    ClusterEvent { kind: "NodePool", namespace: None, name: pool.to_owned(), type_, reason, message }
}

/// The order a static NodePool's surplus claims go in, as Karpenter's static deprovisioning picks them:
/// claims not yet launched (no provider ID) first; then empty nodes (no pods, or only DaemonSet pods none
/// of which has an active `karpenter.sh/do-not-disrupt`); then the others, those without an active
/// `do-not-disrupt` pod first, each group cheapest to disrupt first (its pods' eviction costs times its
/// remaining lifetime). Ties go to the newest claim.
fn surplus_order<'c>(snapshot: &Snapshot, live: &[&'c Arc<NodeClaim>], now: Timestamp) -> Vec<&'c Arc<NodeClaim>> {
    use std::cmp::Ordering;
    #[derive(PartialEq, PartialOrd)]
    struct Key {
        launched: bool,
        occupied: bool,
        held: bool,
        cost: f64,
    }
    let key = |c: &NodeClaim| {
        let launched = c.provider_id().is_some_and(|p| !p.is_empty());
        let node = c.status.as_ref().and_then(|s| s.node_name.as_deref());
        let pods: Vec<&k8s_openapi::api::core::v1::Pod> =
            node.map(|n| snapshot.pods_on_node(n).map(|p| &**p).collect()).unwrap_or_default();
        let pods: Vec<&k8s_openapi::api::core::v1::Pod> =
            pods.into_iter().filter(|p| !crate::cluster::pod_finished(p)).collect();
        let held = pods.iter().any(|p| {
            let annotations = p.metadata.annotations.clone().unwrap_or_default();
            let started = p.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            crate::cluster::do_not_disrupt_active(&annotations, started, now)
        });
        let occupied = held || !pods.iter().all(|p| crate::cluster::owned_by_daemon_set(p));
        let cost = pods.iter().map(|p| crate::disruption::kube_pod_cost(p)).sum::<f64>()
            * crate::disruption::claim_lifetime_remaining(c, now);
        Key { launched, occupied, held, cost }
    };
    let mut keyed: Vec<(Key, &'c Arc<NodeClaim>)> = live.iter().map(|c| (key(c), *c)).collect();
    keyed.sort_by(|(a, ca), (b, cb)| {
        let created = |c: &NodeClaim| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
        a.partial_cmp(b).unwrap_or(Ordering::Equal).then_with(|| created(cb).cmp(&created(ca)))
    });
    keyed.into_iter().map(|(_, c)| c).collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeClaimSpec, NodePoolSpec, TEMPLATE_HASH_VERSION};
    use crate::clock::Clock;
    use crate::cloud::fake::FakeCloud;
    use crate::cluster::InMemoryApi;

    proptest::proptest! {
        /// Walking two maps beside each other finds what looking every key up finds: the keys whose object
        /// changed or is new, and the keys gone (with their old object).
        #[test]
        fn walking_two_maps_finds_what_looking_every_key_up_finds(
            old in proptest::collection::btree_map(0u8..40, 0u32..4, 0..30),
            edits in proptest::collection::vec((0u8..40, 0u8..3), 0..30),
        ) {
            let old: BTreeMap<String, Arc<u32>> = old.into_iter().map(|(k, v)| (format!("k{k:02}"), Arc::new(v))).collect();
            let mut new = old.clone();
            for (k, what) in edits {
                let key = format!("k{k:02}");
                match what {
                    0 => { new.remove(&key); }
                    // The same value in a new object counts as changed.
                    1 => { let v = new.get(&key).map_or(9, |v| **v); new.insert(key, Arc::new(v)); }
                    _ => {}
                }
            }
            let mut expected: Vec<(String, u32, bool)> = new
                .iter()
                .filter(|(k, v)| old.get(*k).is_none_or(|o| !Arc::ptr_eq(o, v)))
                .map(|(k, v)| (k.clone(), **v, false))
                .chain(old.iter().filter(|(k, _)| !new.contains_key(*k)).map(|(k, v)| (k.clone(), **v, true)))
                .collect();
            expected.sort();
            let mut walked = Vec::new();
            walk_changes(&old, &new, |k, v, gone| walked.push((k.to_owned(), **v, gone)));
            walked.sort();
            proptest::prop_assert_eq!(walked, expected);
        }
    }

    /// `silenced` answers what `admit` would, and records nothing: disruption passes ask it which nodes'
    /// reasons will go unread.
    #[test]
    fn silenced_events_are_those_admit_turns_down() {
        let start: Timestamp = "2026-03-04T12:00:00Z".parse().unwrap();
        let mut recent = RecentEvents::default();
        let silenced = |recent: &RecentEvents, kind, at| {
            recent.silenced(kind, "n-1", "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, at)
        };
        assert!(!silenced(&recent, "Node", start));
        assert!(!silenced(&recent, "Node", start), "asking records nothing");
        assert!(recent.admit("Node", "n-1", "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, start));
        let inside = clock::add(start, UNCONSOLIDATABLE_DEDUPE - Duration::from_secs(1));
        assert!(silenced(&recent, "Node", inside));
        assert!(!recent.admit("Node", "n-1", "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, inside));
        assert!(!silenced(&recent, "NodeClaim", inside), "each kind has its own window");
        let after = clock::add(start, UNCONSOLIDATABLE_DEDUPE);
        assert!(!silenced(&recent, "Node", after));
        assert!(recent.admit("Node", "n-1", "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, after));
    }

    /// Many events live at once (a fleet of thousands of nodes, each reported unconsolidatable) are swept
    /// a few times in all, not on every admission; an event past every window is forgotten by a sweep and
    /// goes out again, one inside its window stays silenced.
    #[test]
    fn recent_events_sweep_rarely_and_forget_only_what_no_window_covers() {
        let start: Timestamp = "2026-03-04T12:00:00Z".parse().unwrap();
        let mut recent = RecentEvents::default();
        for i in 0..20_000 {
            assert!(recent.admit("Node", &format!("node-{i}"), "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, start));
        }
        assert!(recent.sweeps <= 3, "{} sweeps for 20,000 live events", recent.sweeps);
        assert!(!recent.admit("Node", "node-7", "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, start));
        // Past every window: the next sweep drops the lot, and the first event admitted afterwards is new.
        let later = clock::add(start, UNCONSOLIDATABLE_DEDUPE);
        let swept = recent.sweeps;
        for i in 0..40_001 {
            assert!(recent.admit("Pod", &format!("pod-{i}"), "Nominated", EVENT_DEDUPE, later));
        }
        assert!(recent.sweeps > swept);
        assert!(recent.at.len() <= 40_001 && !recent.at.keys().any(|(kind, _, _)| *kind == "Node"));
        assert!(recent.admit("Node", "node-7", "Unconsolidatable", UNCONSOLIDATABLE_DEDUPE, later));
        assert!(!recent.admit("Pod", "pod-3", "Nominated", EVENT_DEDUPE, later));
    }

    /// Karpenter's static deprovisioning order: unlaunched claims, empty nodes, then the cheapest to
    /// disrupt, nodes with an active do-not-disrupt pod (a DaemonSet's too) last.
    #[test]
    fn a_static_pools_surplus_goes_unlaunched_first_then_empty_then_cheapest() {
        let now: Timestamp = "2026-03-04T12:00:00Z".parse().unwrap();
        let mut snapshot = Snapshot::default();
        let mut claims = Vec::new();
        for (i, name) in ["pinned", "ds-pinned", "heavy", "cheap", "empty", "unlaunched"].into_iter().enumerate() {
            let mut c = NodeClaim::new(name, NodeClaimSpec::default());
            // Later names are newer: a tie would put them first.
            c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(clock::add(
                now,
                Duration::from_secs(i as u64),
            )));
            if name != "unlaunched" {
                let status = c.status.get_or_insert_with(Default::default);
                status.provider_id = Some(format!("fake:///{name}"));
                status.node_name = Some(name.to_owned());
            }
            claims.push(Arc::new(c));
        }
        let pod = |name: &str, node: &str, daemon: bool, pinned: bool| {
            let mut meta = serde_json::json!({"name": name, "namespace": "default"});
            if daemon {
                meta["ownerReferences"] = serde_json::json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "agent", "uid": "u", "controller": true}]);
            }
            if pinned {
                meta["annotations"] = serde_json::json!({labels::DO_NOT_DISRUPT: "true"});
            }
            let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
                "metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "startTime": "2026-03-01T00:00:00Z"}
            }))
            .unwrap();
            (format!("default/{name}"), Arc::new(p))
        };
        let pods = Arc::make_mut(&mut snapshot.pods);
        for (key, p) in [
            pod("agent-empty", "empty", true, false),
            pod("a", "cheap", false, false),
            pod("b1", "heavy", false, false),
            pod("b2", "heavy", false, false),
            pod("b3", "heavy", false, false),
            pod("agent-pinned", "ds-pinned", true, true),
            pod("job", "pinned", false, true),
        ] {
            pods.insert(key, p);
        }
        let live: Vec<&Arc<NodeClaim>> = claims.iter().collect();
        let order: Vec<&str> = surplus_order(&snapshot, &live, now).into_iter().map(|c| c.name()).collect();
        assert_eq!(order, ["unlaunched", "empty", "cheap", "heavy", "ds-pinned", "pinned"]);
    }

    fn claim(name: &str, hash: Option<(&str, Option<&str>)>) -> NodeClaim {
        let mut c = NodeClaim::new(name, NodeClaimSpec::default());
        c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
        if let Some((hash, version)) = hash {
            let mut a = std::collections::BTreeMap::from([(labels::NODEPOOL_HASH.to_owned(), hash.to_owned())]);
            if let Some(v) = version {
                a.insert(labels::NODEPOOL_HASH_VERSION.to_owned(), v.to_owned());
            }
            c.metadata.annotations = Some(a);
        }
        c
    }

    /// Taking over a pool Karpenter hashed: the pool gets tenon's hash and scheme, Karpenter's claims are
    /// re-hashed (not drifted), a claim already marked drifted keeps its hash, and an earlier tenon's
    /// unversioned hash is kept so that drift since then still shows.
    #[tokio::test]
    async fn karpenter_hashed_claims_are_rehashed_not_drifted() {
        let clock = crate::clock::VirtualClock::at_epoch();
        let api = InMemoryApi::new(clock.now());
        let mut pool = NodePool::new("default", NodePoolSpec::default());
        pool.metadata.annotations = Some(
            [
                (labels::NODEPOOL_HASH.to_owned(), "6103363645544484573".to_owned()),
                (labels::NODEPOOL_HASH_VERSION.to_owned(), "v3".to_owned()),
            ]
            .into(),
        );
        let ours = pool.template_hash();
        {
            let mut objects = api.lock();
            objects.set_pools(vec![pool]);
            objects.put_claim(claim("karpenter", Some(("6103363645544484573", Some("v3")))));
            let mut drifted = claim("drifted", Some(("123", Some("v3"))));
            drifted.set_condition(
                condition_types::DRIFTED,
                crate::api::ConditionStatus::True,
                "NodePoolDrifted",
                "",
                clock.now(),
            );
            objects.put_claim(drifted);
            objects.put_claim(claim("older", Some(("0123456789abcdef", None))));
        }
        let mut registry = ProviderRegistry::new();
        registry.register(FakeCloud::builder().build()).unwrap();
        let mut rt = Runtime::new(clock.clone(), registry, Settings::default(), counter_names(Default::default()));
        rt.step(&api).await;
        let snapshot = api.snapshot();
        let pool = &snapshot.pools[0];
        assert_eq!(pool.annotation(labels::NODEPOOL_HASH), Some(ours.as_str()));
        assert_eq!(pool.annotation(labels::NODEPOOL_HASH_VERSION), Some(TEMPLATE_HASH_VERSION));
        let hash = |name: &str| {
            let c = &snapshot.claims[name];
            (c.annotation(labels::NODEPOOL_HASH).map(str::to_owned), c.annotation(labels::NODEPOOL_HASH_VERSION))
        };
        assert_eq!(hash("karpenter"), (Some(ours.clone()), Some(TEMPLATE_HASH_VERSION)));
        assert!(!pool.template_drifted(&snapshot.claims["karpenter"]));
        assert_eq!(hash("drifted"), (Some("123".to_owned()), Some("v3")), "a drifted claim stays drifted");
        assert_eq!(hash("older"), (Some("0123456789abcdef".to_owned()), Some(TEMPLATE_HASH_VERSION)));
        assert!(pool.template_drifted(&snapshot.claims["older"]), "its template changed since");
    }

    /// Read-only (`tenon plan` on a Karpenter cluster's snapshot): a claim is compared with the pool's
    /// hash under the claim's own scheme.
    #[test]
    fn drift_compares_hashes_of_one_scheme_only() {
        let mut pool = NodePool::new("default", NodePoolSpec::default());
        pool.metadata.annotations = Some(
            [
                (labels::NODEPOOL_HASH.to_owned(), "111".to_owned()),
                (labels::NODEPOOL_HASH_VERSION.to_owned(), "v3".to_owned()),
            ]
            .into(),
        );
        assert!(!pool.template_drifted(&claim("same", Some(("111", Some("v3"))))));
        assert!(pool.template_drifted(&claim("changed", Some(("222", Some("v3"))))));
        assert!(!pool.template_drifted(&claim("ours", Some(("333", Some(TEMPLATE_HASH_VERSION))))), "another scheme");
        // A pool tenon hashes: claims of tenon's scheme are compared with the template as it is now.
        pool.metadata.annotations = None;
        let ours = pool.template_hash();
        assert!(!pool.template_drifted(&claim("ours", Some((&ours, Some(TEMPLATE_HASH_VERSION))))));
        assert!(pool.template_drifted(&claim("stale", Some(("333", Some(TEMPLATE_HASH_VERSION))))));
        assert!(!pool.template_drifted(&claim("karpenter", Some(("333", Some("v3"))))), "re-hashed, not drifted");
        assert!(!pool.template_drifted(&claim("unhashed", None)));
    }

    /// The nodes and claims pods are nominated to are marked in the state the decisions read, until the
    /// nomination runs out.
    #[test]
    fn nominations_mark_their_nodes_until_they_run_out() {
        let clock = crate::clock::VirtualClock::at_epoch();
        let api = InMemoryApi::new(clock.now());
        for name in ["n1", "n2"] {
            let node: k8s_openapi::api::core::v1::Node =
                serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
            api.lock().put_node(node);
        }
        let mut rt = Runtime::new(
            clock.clone(),
            ProviderRegistry::new(),
            Settings::default(),
            counter_names(Default::default()),
        );
        let now = clock.now();
        rt.nominations.nominate("default/p", "n2", clock::add(now, Duration::from_secs(20)));
        let state = rt.state(&api.snapshot(), now).unwrap();
        let nominated: Vec<&str> = state.nodes.iter().filter(|n| n.nominated).map(|n| n.name.as_str()).collect();
        assert_eq!(nominated, ["n2"]);
        let later = clock::add(now, Duration::from_secs(21));
        assert!(rt.state(&api.snapshot(), later).unwrap().nodes.iter().all(|n| !n.nominated));
    }
}
