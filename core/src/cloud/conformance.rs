//! The provider conformance suite.
//!
//! Every provider, in this repository or in a third-party crate, runs these checks from its own tests
//! against its real backend or an emulator of it:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use async_trait::async_trait;
//! # use tenon_core::cloud::{DynCloudProvider, conformance::{self, Harness}};
//! struct MyHarness { provider: DynCloudProvider }
//!
//! #[async_trait]
//! impl Harness for MyHarness {
//!     fn provider(&self) -> DynCloudProvider { self.provider.clone() }
//! }
//!
//! # async fn run(h: MyHarness) {
//! conformance::assert_conformance(&h).await;
//! # }
//! ```
//!
//! The suite creates and deletes real instances through the provider: point it at an emulator or a
//! scratch account. Capabilities a backend cannot script (insufficient capacity on demand, deferred
//! launches, another cluster's instances) are skipped when the harness says so, never faked.
//!
//! The checks are not part of tenon-core's semver-stable API: new checks may be added in any release.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use super::{CapacityType, CloudError, DynCloudProvider, Instance, InstanceType, LaunchOptions, OfferingKey};
use crate::api::{
    NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassRef, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator,
    labels,
};

/// How a test waits on a backend that runs in real time (an emulator, an API server): it asks again
/// every `interval` until the answer comes, and fails at `deadline`. A harness over such a backend
/// settles with [`RealTimePoll::between`] and polls [`RealTimePoll::max_polls`] times, so the suite's
/// polls end at the same deadline as the test's own.
#[derive(Debug, Clone, Copy)]
pub struct RealTimePoll {
    /// How long a wait may take before the test fails.
    pub deadline: std::time::Duration,
    /// How long the backend gets between two polls.
    pub interval: std::time::Duration,
}

impl RealTimePoll {
    /// Gives the backend one interval: the only real wait of a test that polls with this.
    pub async fn between(&self) {
        tokio::time::sleep(self.interval).await;
    }

    /// How many polls fit in the deadline.
    pub fn max_polls(&self) -> usize {
        (self.deadline.as_millis() / self.interval.as_millis().max(1)) as usize
    }

    /// Asks `step` until it answers, from blocking code (a test driving its peer through a command-line
    /// client); `None` once the deadline has passed, for the caller to say what it waited for.
    pub fn try_until_blocking<T>(&self, mut step: impl FnMut() -> Option<T>) -> Option<T> {
        let start = std::time::Instant::now();
        loop {
            if let Some(done) = step() {
                return Some(done);
            }
            if start.elapsed() >= self.deadline {
                return None;
            }
            std::thread::sleep(self.interval);
        }
    }

    /// Asks `step` until it answers; panics naming `what` at the deadline.
    pub async fn until<T>(&self, what: &str, mut step: impl AsyncFnMut() -> Option<T>) -> T {
        let start = std::time::Instant::now();
        loop {
            if let Some(done) = step().await {
                return done;
            }
            assert!(start.elapsed() < self.deadline, "{what} after {:?}", self.deadline);
            self.between().await;
        }
    }
}

/// What the suite needs from a provider's test setup.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The provider under test.
    fn provider(&self) -> DynCloudProvider;

    /// The NodeClass the suite's claims and pool refer to.
    fn node_class_ref(&self) -> Option<NodeClassRef> {
        None
    }

    /// The pool whose instance types the suite reads.
    fn pool(&self) -> NodePool {
        let mut pool = NodePool::new("conformance", NodePoolSpec::default());
        pool.spec.template.spec.node_class_ref = self.node_class_ref();
        pool
    }

    /// Lets time pass between polls: advance a virtual clock, or wait briefly on a real backend.
    async fn settle(&self) {}

    /// How many times the suite polls (calling [`Harness::settle`] in between) for a state change.
    fn max_polls(&self) -> usize {
        120
    }

    /// Arranges for launches into `offering` to fail for lack of capacity; `false` when the backend cannot.
    async fn make_insufficient(&self, _offering: &OfferingKey) -> bool {
        false
    }

    /// Arranges for the next launch to be deferred; `false` when the backend cannot.
    async fn make_next_launch_deferred(&self) -> bool {
        false
    }

    /// Creates an instance that belongs to another cluster and returns its provider id; `None` when the
    /// backend cannot.
    async fn create_foreign_instance(&self) -> Option<String> {
        None
    }
}

/// One failed check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The check's name.
    pub check: &'static str,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.message)
    }
}

type CheckResult = Result<(), Failure>;

fn fail(check: &'static str, message: impl Into<String>) -> Failure {
    Failure { check, message: message.into() }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A claim pinned to exactly one offering.
pub fn pinned_claim(h: &dyn Harness, offering: &OfferingKey) -> NodeClaim {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let name = format!("conformance-{n}");
    let mut claim = NodeClaim::new(
        &name,
        NodeClaimSpec {
            requirements: vec![
                NodeSelectorRequirement::new(labels::INSTANCE_TYPE, Operator::In, [offering.instance_type.clone()]),
                NodeSelectorRequirement::new(labels::ZONE, Operator::In, [offering.zone.clone()]),
                NodeSelectorRequirement::new(labels::CAPACITY_TYPE, Operator::In, [offering.capacity_type.as_str()]),
            ],
            node_class_ref: h.node_class_ref(),
            ..Default::default()
        },
    );
    claim.metadata.uid = Some(format!("00000000-0000-4000-8000-{:012x}", n));
    claim.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "conformance".to_owned())].into());
    claim
}

fn with_provider_id(mut claim: NodeClaim, provider_id: &str) -> NodeClaim {
    claim.status = Some(NodeClaimStatus { provider_id: Some(provider_id.to_owned()), ..Default::default() });
    claim
}

async fn catalog(h: &dyn Harness, check: &'static str) -> Result<Vec<InstanceType>, Failure> {
    h.provider().instance_types(&h.pool()).await.map_err(|e| fail(check, format!("instance_types failed: {e}")))
}

/// The cheapest available offering of the catalog, preferring on-demand (the most portable).
async fn launchable_offering(h: &dyn Harness, check: &'static str) -> Result<OfferingKey, Failure> {
    let types = catalog(h, check).await?;
    let mut best: Option<(u8, f64, OfferingKey)> = None;
    for it in &types {
        for o in it.offerings.iter().filter(|o| o.available) {
            let rank = match o.capacity_type {
                CapacityType::OnDemand => 0,
                CapacityType::Spot => 1,
                CapacityType::Reserved => 2,
            };
            if best.as_ref().is_none_or(|(r, p, _)| (rank, o.price) < (*r, *p)) {
                best = Some((rank, o.price, o.key(&it.name)));
            }
        }
    }
    best.map(|(_, _, k)| k).ok_or_else(|| fail(check, "the catalog has no available offering to launch"))
}

/// Polls `delete` until `NotFound`.
async fn delete_until_gone(h: &dyn Harness, claim: &NodeClaim, check: &'static str) -> CheckResult {
    let p = h.provider();
    for _ in 0..h.max_polls() {
        match p.delete(claim).await {
            Ok(()) => h.settle().await,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(fail(check, format!("delete failed: {e}"))),
        }
    }
    Err(fail(check, format!("delete never answered NotFound after {} polls", h.max_polls())))
}

/// Every instance type is named once, every offering has a zone, a capacity type and a finite
/// non-negative price, and allocatable never exceeds capacity.
pub async fn catalog_sanity(h: &dyn Harness) -> CheckResult {
    const CHECK: &str = "catalog_sanity";
    let types = catalog(h, CHECK).await?;
    if types.is_empty() {
        return Err(fail(CHECK, "instance_types returned nothing"));
    }
    let mut names = std::collections::HashSet::new();
    for it in &types {
        if it.name.is_empty() || !names.insert(it.name.as_str()) {
            return Err(fail(CHECK, format!("instance type name {:?} is empty or repeated", it.name)));
        }
        if !it.allocatable().fits(&it.capacity) {
            return Err(fail(CHECK, format!("{}: allocatable exceeds capacity", it.name)));
        }
        for o in &it.offerings {
            if o.zone.is_empty() {
                return Err(fail(CHECK, format!("{}: an offering has no zone", it.name)));
            }
            if !o.price.is_finite() || o.price < 0.0 {
                return Err(fail(
                    CHECK,
                    format!(
                        "{}/{}/{}: price {} is not a finite non-negative number",
                        it.name, o.zone, o.capacity_type, o.price
                    ),
                ));
            }
            if o.capacity_type == CapacityType::Reserved && o.reservation_capacity.is_none() {
                return Err(fail(
                    CHECK,
                    format!("{}/{}: a reserved offering has no reservation capacity", it.name, o.zone),
                ));
            }
        }
    }
    Ok(())
}

fn check_instance(check: &'static str, i: &Instance, offering: &OfferingKey) -> CheckResult {
    if i.provider_id.is_empty() {
        return Err(fail(check, "the instance has no provider id"));
    }
    if i.instance_type != offering.instance_type || i.zone != offering.zone || i.capacity_type != offering.capacity_type
    {
        return Err(fail(
            check,
            format!("asked for {offering}, got {}/{}/{}", i.instance_type, i.zone, i.capacity_type),
        ));
    }
    Ok(())
}

/// create → get → list → delete → NotFound on get, absent from list.
pub async fn create_get_list_delete(h: &dyn Harness) -> CheckResult {
    const CHECK: &str = "create_get_list_delete";
    let p = h.provider();
    let offering = launchable_offering(h, CHECK).await?;
    let claim = pinned_claim(h, &offering);
    let created =
        p.create(&claim, &LaunchOptions::default()).await.map_err(|e| fail(CHECK, format!("create failed: {e}")))?;
    check_instance(CHECK, &created, &offering)?;
    let got = p.get(&created.provider_id).await.map_err(|e| fail(CHECK, format!("get after create failed: {e}")))?;
    check_instance(CHECK, &got, &offering)?;
    let listed = p.list().await.map_err(|e| fail(CHECK, format!("list failed: {e}")))?;
    if !listed.iter().any(|i| i.provider_id == created.provider_id) {
        return Err(fail(CHECK, format!("list does not contain {}", created.provider_id)));
    }
    let claim = with_provider_id(claim, &created.provider_id);
    delete_until_gone(h, &claim, CHECK).await?;
    match p.get(&created.provider_id).await {
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            return Err(fail(CHECK, format!("get after delete: expected NotFound, got {e}")));
        }
        Ok(i) => {
            return Err(fail(CHECK, format!("get after delete returned {:?}", i.state)));
        }
    }
    let listed = p.list().await.map_err(|e| fail(CHECK, format!("list failed: {e}")))?;
    if listed.iter().any(|i| i.provider_id == created.provider_id) {
        return Err(fail(CHECK, format!("list still contains {} after delete", created.provider_id)));
    }
    Ok(())
}

/// Deleting an instance that is gone, or a claim that never launched, answers `NotFound`.
pub async fn delete_is_idempotent(h: &dyn Harness) -> CheckResult {
    const CHECK: &str = "delete_is_idempotent";
    let p = h.provider();
    let offering = launchable_offering(h, CHECK).await?;
    let never_launched = pinned_claim(h, &offering);
    match p.delete(&never_launched).await {
        Err(e) if e.is_not_found() => {}
        other => {
            return Err(fail(
                CHECK,
                format!("delete of a claim that never launched: expected NotFound, got {other:?}"),
            ));
        }
    }
    let claim = pinned_claim(h, &offering);
    let created =
        p.create(&claim, &LaunchOptions::default()).await.map_err(|e| fail(CHECK, format!("create failed: {e}")))?;
    let claim = with_provider_id(claim, &created.provider_id);
    delete_until_gone(h, &claim, CHECK).await?;
    for _ in 0..2 {
        match p.delete(&claim).await {
            Err(e) if e.is_not_found() => {}
            other => {
                return Err(fail(CHECK, format!("repeated delete: expected NotFound, got {other:?}")));
            }
        }
    }
    Ok(())
}

/// A launch into an offering without capacity answers `InsufficientCapacity` naming it.
pub async fn insufficient_capacity_names_the_offering(h: &dyn Harness) -> CheckResult {
    const CHECK: &str = "insufficient_capacity_names_the_offering";
    let offering = launchable_offering(h, CHECK).await?;
    if !h.make_insufficient(&offering).await {
        return Ok(());
    }
    let claim = pinned_claim(h, &offering);
    match h.provider().create(&claim, &LaunchOptions::default()).await {
        Err(CloudError::InsufficientCapacity { offerings, .. }) if offerings.contains(&offering) => Ok(()),
        Err(CloudError::InsufficientCapacity { offerings, .. }) => {
            Err(fail(CHECK, format!("InsufficientCapacity named {offerings:?}, not {offering}")))
        }
        Err(e) => Err(fail(CHECK, format!("expected InsufficientCapacity, got {e}"))),
        Ok(i) => Err(fail(CHECK, format!("expected InsufficientCapacity, launched {}", i.provider_id))),
    }
}

/// A deferred launch answers `LaunchDeferred` with a positive `retry_after`.
pub async fn launch_deferred_has_a_positive_retry(h: &dyn Harness) -> CheckResult {
    const CHECK: &str = "launch_deferred_has_a_positive_retry";
    if !h.make_next_launch_deferred().await {
        return Ok(());
    }
    let offering = launchable_offering(h, CHECK).await?;
    let claim = pinned_claim(h, &offering);
    match h.provider().create(&claim, &LaunchOptions::default()).await {
        Err(CloudError::LaunchDeferred { retry_after, .. }) if !retry_after.is_zero() => Ok(()),
        Err(CloudError::LaunchDeferred { .. }) => Err(fail(CHECK, "LaunchDeferred with a zero retry_after")),
        Err(e) => Err(fail(CHECK, format!("expected LaunchDeferred, got {e}"))),
        Ok(i) => {
            let claim = with_provider_id(claim, &i.provider_id);
            let _ = delete_until_gone(h, &claim, CHECK).await;
            Err(fail(CHECK, format!("expected LaunchDeferred, launched {}", i.provider_id)))
        }
    }
}

/// `list` never returns another cluster's instances.
pub async fn list_excludes_other_clusters(h: &dyn Harness) -> CheckResult {
    const CHECK: &str = "list_excludes_other_clusters";
    let Some(foreign) = h.create_foreign_instance().await else {
        return Ok(());
    };
    let listed = h.provider().list().await.map_err(|e| fail(CHECK, format!("list failed: {e}")))?;
    if listed.iter().any(|i| i.provider_id == foreign) {
        return Err(fail(CHECK, format!("list returned {foreign}, which belongs to another cluster")));
    }
    Ok(())
}

/// Runs every check and returns the failures.
pub async fn run_all(h: &dyn Harness) -> Vec<Failure> {
    let mut failures = Vec::new();
    for result in [
        catalog_sanity(h).await,
        create_get_list_delete(h).await,
        delete_is_idempotent(h).await,
        insufficient_capacity_names_the_offering(h).await,
        launch_deferred_has_a_positive_retry(h).await,
        list_excludes_other_clusters(h).await,
    ] {
        if let Err(f) = result {
            failures.push(f);
        }
    }
    failures
}

/// Runs every check and panics listing the failures, for use in `#[test]`s.
pub async fn assert_conformance(h: &dyn Harness) {
    let failures = run_all(h).await;
    assert!(
        failures.is_empty(),
        "provider {} fails conformance:\n{}",
        h.provider().name(),
        failures.iter().map(|f| format!("  - {f}")).collect::<Vec<_>>().join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::CloudProvider;
    use crate::cloud::fake::FakeCloud;
    use std::sync::Arc;

    /// A broken provider: it never reports deleted instances as gone, and lists another cluster's
    /// instance. The suite must catch both, or it proves nothing.
    #[derive(Debug)]
    struct Leaky {
        inner: FakeCloud,
        foreign: std::sync::Mutex<Option<Instance>>,
    }

    #[async_trait]
    impl crate::cloud::CloudProvider for Leaky {
        fn name(&self) -> &str {
            "leaky"
        }
        fn descriptor(&self) -> crate::cloud::ProviderDescriptor {
            self.inner.descriptor()
        }
        async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
            self.inner.instance_types(pool).await
        }
        async fn create(&self, claim: &NodeClaim, o: &LaunchOptions) -> Result<Instance, CloudError> {
            self.inner.create(claim, o).await
        }
        async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
            let _ = self.inner.delete(claim).await;
            Ok(())
        }
        async fn get(&self, id: &str) -> Result<Instance, CloudError> {
            self.inner.get(id).await
        }
        async fn list(&self) -> Result<Vec<Instance>, CloudError> {
            let mut all = self.inner.list().await?;
            all.extend(self.foreign.lock().unwrap().clone());
            Ok(all)
        }
        async fn is_drifted(&self, c: &NodeClaim) -> Result<Option<crate::cloud::DriftReason>, CloudError> {
            self.inner.is_drifted(c).await
        }
        fn repair_policies(&self) -> Vec<crate::cloud::RepairPolicy> {
            Vec::new()
        }
        async fn reboot(&self, c: &NodeClaim) -> Result<(), CloudError> {
            self.inner.reboot(c).await
        }
    }

    struct LeakyHarness(Arc<Leaky>);

    #[async_trait]
    impl Harness for LeakyHarness {
        fn provider(&self) -> DynCloudProvider {
            self.0.clone()
        }
        fn max_polls(&self) -> usize {
            3
        }
        async fn create_foreign_instance(&self) -> Option<String> {
            let offering = launchable_offering(self, "setup").await.ok()?;
            let claim = pinned_claim(self, &offering);
            let mut instance = self.0.inner.create(&claim, &LaunchOptions::default()).await.ok()?;
            instance.provider_id = "fake://elsewhere/i-foreign".into();
            let id = instance.provider_id.clone();
            *self.0.foreign.lock().unwrap() = Some(instance);
            Some(id)
        }
    }

    #[tokio::test]
    async fn a_broken_provider_fails_the_suite() {
        let h = LeakyHarness(Arc::new(Leaky { inner: FakeCloud::builder().build(), foreign: Default::default() }));
        let failures = run_all(&h).await;
        let checks: Vec<_> = failures.iter().map(|f| f.check).collect();
        assert!(checks.contains(&"create_get_list_delete"), "{failures:?}");
        assert!(checks.contains(&"delete_is_idempotent"), "{failures:?}");
        assert!(checks.contains(&"list_excludes_other_clusters"), "{failures:?}");
    }
}
