//! `FakeCloud`: an in-memory, deterministic, scriptable provider.
//!
//! Every core test runs against it. It launches the cheapest compatible offering of its catalog and can be
//! told to fail: the next call of a kind, N calls of a kind, launches into a chosen offering (as
//! insufficient capacity), deferred launches, instances that boot slowly, vanish, or belong to another
//! cluster, and on-demand stand-ins under a lease when spot is unavailable. It records every call.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;

use super::{
    CapacityType, CloudError, CloudProvider, DriftReason, Instance, InstanceState, InstanceType, Interruption,
    InterruptionKind, LaunchOptions, Lease, NodeClassKind, Offering, OfferingKey, ProviderDescriptor, RepairPolicy,
};
use crate::api::{NodeClaim, NodePool, labels};
use crate::clock::{self, SharedClock, SystemClock};
use crate::resources::Resources;

/// A provider method, for error injection and call records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `instance_types`
    InstanceTypes,
    /// `create`
    Create,
    /// `delete`
    Delete,
    /// `get`
    Get,
    /// `list`
    List,
    /// `is_drifted`
    IsDrifted,
    /// `reboot`
    Reboot,
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `instance_types(pool)`.
    InstanceTypes {
        /// The pool's name.
        pool: String,
    },
    /// `create(claim, options)`.
    Create {
        /// The claim's name.
        claim: String,
        /// The options it was called with.
        options: LaunchOptions,
    },
    /// `delete(claim)`.
    Delete {
        /// The claim's name.
        claim: String,
    },
    /// `get(provider_id)`.
    Get {
        /// The provider id asked for.
        provider_id: String,
    },
    /// `list()`.
    List,
    /// `is_drifted(claim)`.
    IsDrifted {
        /// The claim's name.
        claim: String,
    },
    /// `reboot(claim)`.
    Reboot {
        /// The claim's name.
        claim: String,
    },
}

#[derive(Debug)]
struct Injection {
    method: Method,
    error: CloudError,
    remaining: usize,
}

#[derive(Debug, Clone)]
struct Stored {
    instance: Instance,
    cluster: String,
    claim_uid: Option<String>,
    terminating_since: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct State {
    catalog: Vec<InstanceType>,
    instances: BTreeMap<String, Stored>,
    next_id: u64,
    injected: Vec<Injection>,
    offering_errors: HashMap<OfferingKey, CloudError>,
    deferrals: Option<(usize, Duration, String)>,
    boot_delay: Duration,
    termination_delay: Duration,
    lease: Option<Duration>,
    drifted: HashMap<String, DriftReason>,
    calls: Vec<Call>,
    repair_policies: Vec<RepairPolicy>,
    interruptions: Vec<Interruption>,
}

/// The in-memory provider.
#[derive(Debug)]
pub struct FakeCloud {
    name: String,
    cluster: String,
    node_classes: Vec<NodeClassKind>,
    clock: SharedClock,
    state: Mutex<State>,
}

/// Builds a [`FakeCloud`].
#[derive(Debug)]
pub struct FakeCloudBuilder {
    name: String,
    cluster: String,
    node_classes: Vec<NodeClassKind>,
    catalog: Vec<InstanceType>,
    clock: SharedClock,
}

impl FakeCloudBuilder {
    /// The provider's name (default `fake`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The cluster whose instances it lists (default `test`).
    pub fn cluster(mut self, cluster: &str) -> Self {
        self.cluster = cluster.to_owned();
        self
    }

    /// Adds a NodeClass kind it serves (default `tenon.dev/FakeNodeClass`).
    pub fn node_class(mut self, group: &str, kind: &str) -> Self {
        self.node_classes.push(NodeClassKind::new(group, kind));
        self
    }

    /// Its instance types (default [`FakeCloud::default_catalog`]).
    pub fn catalog(mut self, catalog: Vec<InstanceType>) -> Self {
        self.catalog = catalog;
        self
    }

    /// Its clock (default the system clock).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Builds it.
    pub fn build(self) -> FakeCloud {
        let node_classes = if self.node_classes.is_empty() {
            vec![NodeClassKind::new("tenon.dev", "FakeNodeClass")]
        } else {
            self.node_classes
        };
        FakeCloud {
            name: self.name,
            cluster: self.cluster,
            node_classes,
            clock: self.clock,
            state: Mutex::new(State {
                catalog: self.catalog,
                repair_policies: super::default_repair_policies(),
                ..State::default()
            }),
        }
    }
}

/// An instance type for tests: `cpu` cores, `memory_gib` GiB, 110 pods, the given GPUs, offered on-demand
/// and spot in each zone at the given prices.
pub fn instance_type(
    name: &str,
    cpu: i64,
    memory_gib: i64,
    gpus: i64,
    zones: &[&str],
    on_demand: f64,
    spot: f64,
) -> InstanceType {
    let capacity = Resources::cpu_memory(cpu * 1000, memory_gib << 30)
        .with(crate::resources::ResourceName::PODS, 110)
        .with(crate::resources::ResourceName::NVIDIA_GPU, gpus);
    let mut offerings = Vec::new();
    for z in zones {
        offerings.push(Offering::new(*z, CapacityType::OnDemand, on_demand));
        offerings.push(Offering::new(*z, CapacityType::Spot, spot));
    }
    let mut l = BTreeMap::new();
    l.insert(labels::ARCH.to_owned(), "amd64".to_owned());
    l.insert(labels::OS.to_owned(), "linux".to_owned());
    InstanceType { name: name.to_owned(), labels: l, capacity, overhead: Default::default(), offerings }
}

impl FakeCloud {
    /// A builder.
    pub fn builder() -> FakeCloudBuilder {
        FakeCloudBuilder {
            name: "fake".into(),
            cluster: "test".into(),
            node_classes: Vec::new(),
            catalog: Self::default_catalog(),
            clock: Arc::new(SystemClock),
        }
    }

    /// A small catalog: two CPU types and one GPU type in zones `test-zone-a` and `test-zone-b`.
    pub fn default_catalog() -> Vec<InstanceType> {
        let zones = ["test-zone-a", "test-zone-b"];
        vec![
            instance_type("fake.small", 2, 4, 0, &zones, 0.10, 0.04),
            instance_type("fake.large", 8, 32, 0, &zones, 0.40, 0.15),
            instance_type("fake.gpu", 8, 32, 1, &zones, 1.21, 0.51),
        ]
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Replaces the catalog.
    pub fn set_catalog(&self, catalog: Vec<InstanceType>) {
        self.state().catalog = catalog;
    }

    /// Changes one offering in place (price, availability, reservation capacity).
    pub fn update_offering(&self, key: &OfferingKey, update: impl FnOnce(&mut Offering)) -> bool {
        let mut st = self.state();
        let found = st
            .catalog
            .iter_mut()
            .filter(|it| it.name == key.instance_type)
            .flat_map(|it| it.offerings.iter_mut())
            .find(|o| o.zone == key.zone && o.capacity_type == key.capacity_type);
        match found {
            Some(o) => {
                update(o);
                true
            }
            None => false,
        }
    }

    /// Fails the next `times` calls of `method` with `error`.
    pub fn inject(&self, method: Method, error: CloudError, times: usize) {
        self.state().injected.push(Injection { method, error, remaining: times });
    }

    /// Fails the next call of `method` with `error`.
    pub fn inject_next(&self, method: Method, error: CloudError) {
        self.inject(method, error, 1);
    }

    /// Makes launches into `offering` fail with `error` (typically `InsufficientCapacity`) until cleared.
    pub fn fail_offering(&self, offering: OfferingKey, error: CloudError) {
        self.state().offering_errors.insert(offering, error);
    }

    /// Makes `offering` run out of capacity until cleared.
    pub fn exhaust_offering(&self, offering: OfferingKey) {
        let error = CloudError::InsufficientCapacity {
            offerings: vec![offering.clone()],
            message: format!("no capacity for {offering}"),
        };
        self.fail_offering(offering, error);
    }

    /// Clears a scripted offering failure.
    pub fn clear_offering_failure(&self, offering: &OfferingKey) {
        self.state().offering_errors.remove(offering);
    }

    /// Answers the next `count` launches with `LaunchDeferred`.
    pub fn defer_launches(&self, count: usize, retry_after: Duration, reason: &str) {
        self.state().deferrals = Some((count, retry_after, reason.to_owned()));
    }

    /// Instances stay `Pending` for `delay` after launch.
    pub fn set_boot_delay(&self, delay: Duration) {
        self.state().boot_delay = delay;
    }

    /// Instances stay `Stopping` for `delay` after the first delete.
    pub fn set_termination_delay(&self, delay: Duration) {
        self.state().termination_delay = delay;
    }

    /// When a claim allows spot but no spot offering can launch, buy on-demand under a lease of `duration`.
    pub fn fallback_to_on_demand_under_lease(&self, duration: Duration) {
        self.state().lease = Some(duration);
    }

    /// Replaces the repair policies.
    pub fn set_repair_policies(&self, policies: Vec<RepairPolicy>) {
        self.state().repair_policies = policies;
    }

    /// Makes the instance disappear without a delete (a preemption, a failed boot).
    pub fn vanish(&self, provider_id: &str) -> bool {
        self.state().instances.remove(provider_id).is_some()
    }

    /// Queues an interruption notice for the instance, delivered by the next `interruptions()` call.
    pub fn announce(&self, provider_id: &str, kind: InterruptionKind) {
        self.state().interruptions.push(Interruption { provider_id: provider_id.to_owned(), kind });
    }

    /// Reports `reason` as provider-side drift for the instance.
    pub fn set_drifted(&self, provider_id: &str, reason: &str) {
        self.state().drifted.insert(provider_id.to_owned(), DriftReason(reason.to_owned()));
    }

    /// Stores an instance that belongs to `cluster`; it must never be listed or deleted by this one.
    pub fn insert_foreign_instance(&self, cluster: &str) -> String {
        let now = self.now();
        let mut st = self.state();
        st.next_id += 1;
        let provider_id = format!("fake://{}/foreign/i-{:06}", self.name, st.next_id);
        let instance = Instance {
            provider_id: provider_id.clone(),
            instance_type: "foreign".into(),
            zone: "elsewhere".into(),
            capacity_type: CapacityType::OnDemand,
            state: InstanceState::Running,
            launch_time: now,
            capacity: Resources::ZERO,
            allocatable: Resources::ZERO,
            image_id: None,
            labels: BTreeMap::new(),
            lease: None,
            node_pool: None,
            node_claim: None,
            price: None,
        };
        st.instances.insert(
            provider_id.clone(),
            Stored { instance, cluster: cluster.to_owned(), claim_uid: None, terminating_since: None },
        );
        provider_id
    }

    /// Every recorded call.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// How many `create` calls were made.
    pub fn create_calls(&self) -> usize {
        self.state().calls.iter().filter(|c| matches!(c, Call::Create { .. })).count()
    }

    /// Forgets recorded calls.
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// Visits this cluster's live instances as stored (their `state` not brought up to date), without
    /// copying them: for bookkeeping that reads types, zones and capacity types every step. `f` runs under
    /// the provider's lock, so it must not call back into this provider.
    pub fn for_each_instance(&self, mut f: impl FnMut(&Instance)) {
        let now = self.now();
        let mut st = self.state();
        self.reap(&mut st, now);
        for s in st.instances.values().filter(|s| s.cluster == self.cluster) {
            f(&s.instance);
        }
    }

    /// This cluster's live instances.
    pub fn instances(&self) -> Vec<Instance> {
        let now = self.now();
        let mut st = self.state();
        self.reap(&mut st, now);
        st.instances.values().filter(|s| s.cluster == self.cluster).map(|s| self.observe(&st, s, now)).collect()
    }

    fn take_injected(&self, st: &mut State, method: Method) -> Option<CloudError> {
        let i = st.injected.iter().position(|inj| inj.method == method && inj.remaining > 0)?;
        let inj = &mut st.injected[i];
        inj.remaining -= 1;
        let error = inj.error.clone();
        if inj.remaining == 0 {
            st.injected.remove(i);
        }
        Some(error)
    }

    fn reap(&self, st: &mut State, now: Timestamp) {
        let delay = st.termination_delay;
        st.instances.retain(|_, s| s.terminating_since.is_none_or(|since| clock::since(now, since) < delay));
    }

    fn observe(&self, st: &State, s: &Stored, now: Timestamp) -> Instance {
        let mut i = s.instance.clone();
        i.state = if s.terminating_since.is_some() {
            InstanceState::Stopping
        } else if clock::since(now, i.launch_time) < st.boot_delay {
            InstanceState::Pending
        } else {
            InstanceState::Running
        };
        i
    }

    fn own<'a>(&self, st: &'a State, provider_id: &str) -> Option<&'a Stored> {
        st.instances.get(provider_id).filter(|s| s.cluster == self.cluster)
    }
}

#[async_trait]
impl CloudProvider for FakeCloud {
    fn name(&self) -> &str {
        &self.name
    }

    fn descriptor(&self) -> ProviderDescriptor {
        ProviderDescriptor { node_classes: self.node_classes.clone(), well_known_labels: Vec::new() }
    }

    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        let mut st = self.state();
        st.calls.push(Call::InstanceTypes { pool: pool.name().to_owned() });
        if let Some(e) = self.take_injected(&mut st, Method::InstanceTypes) {
            return Err(e);
        }
        Ok(st.catalog.clone())
    }

    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        let now = self.now();
        let mut st = self.state();
        st.calls.push(Call::Create { claim: claim.name().to_owned(), options: options.clone() });
        if let Some(e) = self.take_injected(&mut st, Method::Create) {
            return Err(e);
        }
        if let Some((count, retry_after, reason)) = st.deferrals.take() {
            if count > 1 {
                st.deferrals = Some((count - 1, retry_after, reason.clone()));
            }
            return Err(CloudError::LaunchDeferred { retry_after, reason });
        }
        self.reap(&mut st, now);
        let uid = claim.metadata.uid.clone();
        if let Some(existing) =
            uid.as_ref().and_then(|u| st.instances.values().find(|s| s.claim_uid.as_ref() == Some(u)))
        {
            return Ok(self.observe(&st, existing, now));
        }
        let requests = Resources::from_resource_list(&claim.spec.resources.requests).map_err(|e| {
            CloudError::Create { reason: "InvalidRequests".into(), message: format!("NodeClaim/{}: {e}", claim.name()) }
        })?;

        // Every launchable (type, offering), reserved first, then by price.
        let mut candidates: Vec<(usize, usize)> = Vec::new();
        for (ti, it) in st.catalog.iter().enumerate() {
            if !requests.fits(&it.allocatable()) {
                continue;
            }
            for (oi, o) in it.offerings.iter().enumerate() {
                let reserved_full =
                    o.capacity_type == CapacityType::Reserved && o.reservation_capacity.unwrap_or(0) == 0;
                if o.available
                    && !reserved_full
                    && !options.is_unavailable(&o.key(&it.name))
                    && it.offering_meets(o, &claim.spec.requirements)
                {
                    candidates.push((ti, oi));
                }
            }
        }
        let lease_mode = st.lease;
        let rank = |ct: CapacityType| match (ct, lease_mode.is_some()) {
            (CapacityType::Reserved, _) => 0,
            (CapacityType::Spot, true) => 1,
            (CapacityType::OnDemand, true) => 2,
            _ => 1,
        };
        candidates.sort_by(|a, b| {
            let (oa, ob) = (&st.catalog[a.0].offerings[a.1], &st.catalog[b.0].offerings[b.1]);
            rank(oa.capacity_type).cmp(&rank(ob.capacity_type)).then(oa.price.total_cmp(&ob.price))
        });

        let mut failed: Vec<OfferingKey> = Vec::new();
        let mut chosen = None;
        for (ti, oi) in candidates {
            let key = st.catalog[ti].offerings[oi].key(&st.catalog[ti].name);
            match st.offering_errors.get(&key) {
                Some(CloudError::InsufficientCapacity { .. }) => failed.push(key),
                Some(other) => return Err(other.clone()),
                None => {
                    chosen = Some((ti, oi));
                    break;
                }
            }
        }
        let Some((ti, oi)) = chosen else {
            let message = if failed.is_empty() {
                format!("NodeClaim/{}: no compatible available offering", claim.name())
            } else {
                format!("NodeClaim/{}: every compatible offering is out of capacity", claim.name())
            };
            return Err(CloudError::InsufficientCapacity { offerings: failed, message });
        };

        let spot_allowed = claim
            .spec
            .requirements
            .iter()
            .filter(|r| labels::normalize(&r.key) == labels::CAPACITY_TYPE)
            .all(|r| r.matches(Some(labels::CAPACITY_TYPE_SPOT)));
        let it = st.catalog[ti].clone();
        let offering = it.offerings[oi].clone();
        if offering.capacity_type == CapacityType::Reserved
            && let Some(c) = st.catalog[ti].offerings[oi].reservation_capacity.as_mut()
        {
            *c = c.saturating_sub(1);
        }
        let lease = match (lease_mode, offering.capacity_type) {
            (Some(d), CapacityType::OnDemand) if spot_allowed => {
                Some(Lease { expires_at: clock::add(now, d), reason: "spot capacity unavailable".into() })
            }
            _ => None,
        };
        st.next_id += 1;
        let provider_id = format!("fake://{}/{}/i-{:06}", self.name, offering.zone, st.next_id);
        let mut node_labels = it.labels.clone();
        node_labels.insert(labels::INSTANCE_TYPE.into(), it.name.clone());
        node_labels.insert(labels::ZONE.into(), offering.zone.clone());
        node_labels.insert(labels::CAPACITY_TYPE.into(), offering.capacity_type.as_str().into());
        if let Some(r) = &offering.reservation_id {
            node_labels.insert(labels::RESERVATION_ID.into(), r.clone());
        }
        let instance = Instance {
            provider_id: provider_id.clone(),
            instance_type: it.name.clone(),
            zone: offering.zone.clone(),
            capacity_type: offering.capacity_type,
            state: if st.boot_delay.is_zero() { InstanceState::Running } else { InstanceState::Pending },
            launch_time: now,
            capacity: it.capacity.clone(),
            allocatable: it.allocatable(),
            image_id: Some("fake-image-1".into()),
            labels: node_labels,
            lease,
            node_pool: claim.node_pool().map(str::to_owned),
            node_claim: Some(claim.name().to_owned()),
            price: Some(offering.price),
        };
        st.instances.insert(
            provider_id,
            Stored {
                instance: instance.clone(),
                cluster: self.cluster.clone(),
                claim_uid: uid,
                terminating_since: None,
            },
        );
        Ok(instance)
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let now = self.now();
        let mut st = self.state();
        st.calls.push(Call::Delete { claim: claim.name().to_owned() });
        if let Some(e) = self.take_injected(&mut st, Method::Delete) {
            return Err(e);
        }
        self.reap(&mut st, now);
        let Some(pid) = claim.provider_id().map(str::to_owned) else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        if self.own(&st, &pid).is_none() {
            return Err(CloudError::NotFound(pid));
        }
        let delay = st.termination_delay;
        if let Some(s) = st.instances.get_mut(&pid)
            && s.terminating_since.is_none()
        {
            s.terminating_since = Some(now);
        }
        if delay.is_zero() {
            st.instances.remove(&pid);
        }
        Ok(())
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        let now = self.now();
        let mut st = self.state();
        st.calls.push(Call::Get { provider_id: provider_id.to_owned() });
        if let Some(e) = self.take_injected(&mut st, Method::Get) {
            return Err(e);
        }
        self.reap(&mut st, now);
        match self.own(&st, provider_id) {
            Some(s) => Ok(self.observe(&st, s, now)),
            None => Err(CloudError::NotFound(provider_id.to_owned())),
        }
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let now = self.now();
        let mut st = self.state();
        st.calls.push(Call::List);
        if let Some(e) = self.take_injected(&mut st, Method::List) {
            return Err(e);
        }
        self.reap(&mut st, now);
        Ok(st.instances.values().filter(|s| s.cluster == self.cluster).map(|s| self.observe(&st, s, now)).collect())
    }

    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        let mut st = self.state();
        st.calls.push(Call::IsDrifted { claim: claim.name().to_owned() });
        if let Some(e) = self.take_injected(&mut st, Method::IsDrifted) {
            return Err(e);
        }
        Ok(claim.provider_id().and_then(|p| st.drifted.get(p).cloned()))
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        self.state().repair_policies.clone()
    }

    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        Ok(std::mem::take(&mut self.state().interruptions))
    }

    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let mut st = self.state();
        st.calls.push(Call::Reboot { claim: claim.name().to_owned() });
        if let Some(e) = self.take_injected(&mut st, Method::Reboot) {
            return Err(e);
        }
        match claim.provider_id() {
            Some(pid) if self.own(&st, pid).is_some() => Ok(()),
            Some(pid) => Err(CloudError::NotFound(pid.to_owned())),
            None => Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeClaimSpec, NodeClaimStatus, NodeSelectorRequirement, Operator};
    use crate::clock::{Clock, VirtualClock};
    use crate::cloud::conformance::{self, Harness};

    struct FakeHarness {
        cloud: Arc<FakeCloud>,
        clock: Arc<VirtualClock>,
    }

    #[async_trait]
    impl Harness for FakeHarness {
        fn provider(&self) -> super::super::DynCloudProvider {
            self.cloud.clone()
        }
        async fn settle(&self) {
            self.clock.advance(Duration::from_secs(5));
        }
        async fn make_insufficient(&self, offering: &OfferingKey) -> bool {
            self.cloud.exhaust_offering(offering.clone());
            true
        }
        async fn make_next_launch_deferred(&self) -> bool {
            self.cloud.defer_launches(1, Duration::from_secs(30), "owned capacity is draining");
            true
        }
        async fn create_foreign_instance(&self) -> Option<String> {
            Some(self.cloud.insert_foreign_instance("someone-else"))
        }
    }

    fn harness() -> FakeHarness {
        let clock = VirtualClock::at_epoch();
        let cloud = Arc::new(FakeCloud::builder().clock(clock.clone()).build());
        FakeHarness { cloud, clock }
    }

    #[tokio::test]
    async fn fake_cloud_passes_the_conformance_suite() {
        conformance::assert_conformance(&harness()).await;
    }

    #[tokio::test]
    async fn fake_cloud_with_slow_boots_and_terminations_passes_the_conformance_suite() {
        let h = harness();
        h.cloud.set_boot_delay(Duration::from_secs(60));
        h.cloud.set_termination_delay(Duration::from_secs(30));
        conformance::assert_conformance(&h).await;
    }

    fn claim(name: &str, reqs: Vec<NodeSelectorRequirement>) -> NodeClaim {
        let mut c = NodeClaim::new(name, NodeClaimSpec { requirements: reqs, ..Default::default() });
        c.metadata.uid = Some(format!("uid-{name}"));
        c
    }

    #[tokio::test]
    async fn launches_the_cheapest_compatible_offering_once_per_claim() {
        let h = harness();
        let c = claim("c1", vec![NodeSelectorRequirement::new(labels::INSTANCE_TYPE, Operator::In, ["fake.gpu"])]);
        let i = h.cloud.create(&c, &LaunchOptions::default()).await.unwrap();
        assert_eq!((i.instance_type.as_str(), i.capacity_type, i.price), ("fake.gpu", CapacityType::Spot, Some(0.51)));
        let again = h.cloud.create(&c, &LaunchOptions::default()).await.unwrap();
        assert_eq!(again.provider_id, i.provider_id, "a second create for the same claim UID is idempotent");
        assert_eq!(h.cloud.instances().len(), 1);
    }

    #[tokio::test]
    async fn injected_errors_fire_the_requested_number_of_times() {
        let h = harness();
        h.cloud.inject(Method::List, CloudError::Throttled { retry_after: None }, 2);
        assert!(h.cloud.list().await.is_err());
        assert!(h.cloud.list().await.is_err());
        assert!(h.cloud.list().await.is_ok());
        assert_eq!(h.cloud.calls().iter().filter(|c| **c == Call::List).count(), 3);
    }

    #[tokio::test]
    async fn unavailable_offerings_in_launch_options_are_avoided() {
        let h = harness();
        let c = claim("c1", vec![NodeSelectorRequirement::new(labels::INSTANCE_TYPE, Operator::In, ["fake.gpu"])]);
        let opts = LaunchOptions {
            unavailable: vec![
                OfferingKey::new("fake.gpu", "test-zone-a", CapacityType::Spot),
                OfferingKey::new("fake.gpu", "test-zone-b", CapacityType::Spot),
            ],
            ignore_unavailable: vec![],
        };
        let i = h.cloud.create(&c, &opts).await.unwrap();
        assert_eq!(i.capacity_type, CapacityType::OnDemand);
    }

    #[tokio::test]
    async fn falls_back_to_on_demand_under_a_lease_when_spot_is_exhausted() {
        let h = harness();
        h.cloud.fallback_to_on_demand_under_lease(Duration::from_secs(3600));
        for z in ["test-zone-a", "test-zone-b"] {
            h.cloud.exhaust_offering(OfferingKey::new("fake.gpu", z, CapacityType::Spot));
        }
        let c = claim("c1", vec![NodeSelectorRequirement::new(labels::INSTANCE_TYPE, Operator::In, ["fake.gpu"])]);
        let i = h.cloud.create(&c, &LaunchOptions::default()).await.unwrap();
        assert_eq!(i.capacity_type, CapacityType::OnDemand);
        let lease = i.lease.expect("an on-demand stand-in carries a lease");
        assert_eq!(clock::since(lease.expires_at, h.clock.now()), Duration::from_secs(3600));
        // A claim pinned to spot fails instead of falling back.
        let spot_only = claim(
            "c2",
            vec![
                NodeSelectorRequirement::new(labels::INSTANCE_TYPE, Operator::In, ["fake.gpu"]),
                NodeSelectorRequirement::new(labels::CAPACITY_TYPE, Operator::In, ["spot"]),
            ],
        );
        let err = h.cloud.create(&spot_only, &LaunchOptions::default()).await.unwrap_err();
        assert!(matches!(err, CloudError::InsufficientCapacity { ref offerings, .. } if offerings.len() == 2), "{err}");
    }

    #[tokio::test]
    async fn reservations_are_counted_down() {
        let h = harness();
        let mut it = instance_type("fake.reserved", 8, 32, 1, &[], 1.0, 1.0);
        it.offerings.push(Offering {
            zone: "test-zone-a".into(),
            capacity_type: CapacityType::Reserved,
            price: 0.0,
            available: true,
            reservation_id: Some("r-1".into()),
            reservation_capacity: Some(1),
            labels: Default::default(),
        });
        h.cloud.set_catalog(vec![it]);
        let reqs = || vec![NodeSelectorRequirement::new(labels::CAPACITY_TYPE, Operator::In, ["reserved"])];
        let i = h.cloud.create(&claim("c1", reqs()), &LaunchOptions::default()).await.unwrap();
        assert_eq!(i.labels.get(labels::RESERVATION_ID).map(String::as_str), Some("r-1"));
        assert!(h.cloud.create(&claim("c2", reqs()), &LaunchOptions::default()).await.is_err());
    }

    #[tokio::test]
    async fn vanished_instances_are_not_found() {
        let h = harness();
        let mut c = claim("c1", vec![]);
        let i = h.cloud.create(&c, &LaunchOptions::default()).await.unwrap();
        c.status = Some(NodeClaimStatus { provider_id: Some(i.provider_id.clone()), ..Default::default() });
        assert!(h.cloud.vanish(&i.provider_id));
        assert!(h.cloud.get(&i.provider_id).await.unwrap_err().is_not_found());
        assert!(h.cloud.delete(&c).await.unwrap_err().is_not_found());
    }
}
