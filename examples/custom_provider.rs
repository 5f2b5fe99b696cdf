//! A complete tenon provider in one file: a fixed pool of hosts.
//!
//! This is the on-ramp for a cloud tenon does not cover. It implements [`CloudProvider`] for a handful of
//! hosts in two racks, runs the public conformance suite from its tests, and builds an operator binary
//! with it through the library entry point:
//!
//! ```text
//! cargo run --example custom_provider -- providers
//! cargo test --example custom_provider
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Mutex;

use async_trait::async_trait;
use tenon_core::api::{NodeClaim, NodePool, labels};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DriftReason, Instance, InstanceState, InstanceType, LaunchOptions,
    NodeClassKind, Offering, OfferingKey, ProviderDescriptor, RepairPolicy,
};
use tenon_core::resources::{ResourceName, Resources};

const NAME: &str = "hostpool";

/// One host: its id, its rack (used as the zone) and the claim holding it, if any.
#[derive(Debug, Clone)]
struct Host {
    id: String,
    rack: String,
    cluster: String,
    held_by: Option<String>,
}

/// A fixed pool of identical 16-core hosts, priced at their amortized cost.
#[derive(Debug)]
pub struct HostPool {
    cluster: String,
    hosts: Mutex<Vec<Host>>,
}

impl HostPool {
    /// `per_rack` hosts in each of `racks`, owned by `cluster`.
    pub fn new(cluster: &str, racks: &[&str], per_rack: usize) -> Self {
        let hosts = racks
            .iter()
            .flat_map(|rack| {
                (0..per_rack).map(move |i| Host {
                    id: format!("{rack}-h{i}"),
                    rack: (*rack).to_owned(),
                    cluster: cluster.to_owned(),
                    held_by: None,
                })
            })
            .collect();
        Self { cluster: cluster.to_owned(), hosts: Mutex::new(hosts) }
    }

    fn hosts(&self) -> std::sync::MutexGuard<'_, Vec<Host>> {
        self.hosts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn capacity() -> Resources {
        Resources::cpu_memory(16_000, 64 << 30).with(ResourceName::PODS, 110)
    }

    fn instance(&self, host: &Host) -> Instance {
        let mut node_labels = BTreeMap::new();
        node_labels.insert(labels::INSTANCE_TYPE.to_owned(), "host-16c".to_owned());
        node_labels.insert(labels::ZONE.to_owned(), host.rack.clone());
        node_labels.insert(labels::CAPACITY_TYPE.to_owned(), "reserved".to_owned());
        Instance {
            provider_id: format!("{NAME}://{}", host.id),
            instance_type: "host-16c".into(),
            zone: host.rack.clone(),
            capacity_type: CapacityType::Reserved,
            state: InstanceState::Running,
            launch_time: jiff::Timestamp::now(),
            capacity: Self::capacity(),
            allocatable: Self::capacity(),
            image_id: None,
            labels: node_labels,
            lease: None,
            node_pool: None,
            node_claim: host.held_by.clone(),
            price: Some(0.35),
        }
    }

    /// Adds a host that belongs to another cluster (for the conformance suite).
    pub fn add_foreign_host(&self, cluster: &str) -> String {
        let host =
            Host { id: "foreign-h0".into(), rack: "rack-x".into(), cluster: cluster.into(), held_by: Some("x".into()) };
        let id = format!("{NAME}://{}", host.id);
        self.hosts().push(host);
        id
    }
}

#[async_trait]
impl CloudProvider for HostPool {
    fn name(&self) -> &str {
        NAME
    }

    fn descriptor(&self) -> ProviderDescriptor {
        ProviderDescriptor {
            node_classes: vec![NodeClassKind::new("example.com", "HostPoolNodeClass")],
            well_known_labels: Vec::new(),
        }
    }

    async fn instance_types(&self, _pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        let hosts = self.hosts();
        let mut racks: BTreeMap<&str, u32> = BTreeMap::new();
        for h in hosts.iter().filter(|h| h.cluster == self.cluster) {
            *racks.entry(h.rack.as_str()).or_default() += u32::from(h.held_by.is_none());
        }
        let offerings = racks
            .into_iter()
            .map(|(rack, free)| Offering {
                available: free > 0,
                reservation_id: Some(format!("{rack}-pool")),
                reservation_capacity: Some(free),
                // The rest as a plain offering has it, so fields the core adds later need no edit here.
                ..Offering::new(rack, CapacityType::Reserved, 0.35)
            })
            .collect();
        Ok(vec![InstanceType {
            name: "host-16c".into(),
            labels: [(labels::ARCH.to_owned(), "amd64".to_owned())].into(),
            capacity: Self::capacity(),
            overhead: Default::default(),
            offerings,
        }])
    }

    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        let allowed_rack = |rack: &str| {
            claim
                .spec
                .requirements
                .iter()
                .filter(|r| labels::normalize(&r.key) == labels::ZONE)
                .all(|r| r.matches(Some(rack)))
                && !options.is_unavailable(&OfferingKey::new("host-16c", rack, CapacityType::Reserved))
        };
        let mut hosts = self.hosts();
        let cluster = self.cluster.clone();
        let host = hosts
            .iter_mut()
            .find(|h| h.cluster == cluster && h.held_by.is_none() && allowed_rack(&h.rack))
            .ok_or_else(|| CloudError::InsufficientCapacity {
                offerings: claim
                    .spec
                    .requirements
                    .iter()
                    .filter(|r| labels::normalize(&r.key) == labels::ZONE)
                    .flat_map(|r| r.values.iter())
                    .map(|rack| OfferingKey::new("host-16c", rack.clone(), CapacityType::Reserved))
                    .collect(),
                message: "no free host".into(),
            })?;
        host.held_by = Some(claim.name().to_owned());
        let host = host.clone();
        Ok(self.instance(&host))
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let id = claim.provider_id().unwrap_or_default().trim_start_matches("hostpool://").to_owned();
        let mut hosts = self.hosts();
        match hosts.iter_mut().find(|h| h.id == id && h.cluster == self.cluster && h.held_by.is_some()) {
            Some(h) => {
                h.held_by = None;
                Ok(())
            }
            None => Err(CloudError::NotFound(id)),
        }
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        let hosts = self.hosts();
        hosts
            .iter()
            .find(|h| format!("{NAME}://{}", h.id) == provider_id && h.cluster == self.cluster && h.held_by.is_some())
            .map(|h| self.instance(h))
            .ok_or_else(|| CloudError::NotFound(provider_id.to_owned()))
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let hosts = self.hosts();
        Ok(hosts
            .iter()
            .filter(|h| h.cluster == self.cluster && h.held_by.is_some())
            .map(|h| self.instance(h))
            .collect())
    }

    async fn is_drifted(&self, _claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        Ok(None)
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        tenon_core::cloud::default_repair_policies()
    }

    async fn reboot(&self, _claim: &NodeClaim) -> Result<(), CloudError> {
        Err(CloudError::Unsupported { provider: NAME.into(), operation: "reboot" })
    }
}

fn main() -> ExitCode {
    tenon::Operator::builder().provider(HostPool::new("example", &["rack-1", "rack-2"], 4)).run_cli()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tenon_core::api::NodeClassRef;
    use tenon_core::cloud::DynCloudProvider;
    use tenon_core::cloud::conformance::{self, Harness};

    use super::*;

    struct HostPoolHarness(Arc<HostPool>);

    #[async_trait]
    impl Harness for HostPoolHarness {
        fn provider(&self) -> DynCloudProvider {
            self.0.clone()
        }
        fn node_class_ref(&self) -> Option<NodeClassRef> {
            Some(NodeClassRef { group: "example.com".into(), kind: "HostPoolNodeClass".into(), name: "default".into() })
        }
        async fn make_insufficient(&self, offering: &OfferingKey) -> bool {
            // Fill every free host of the offering's rack.
            for h in self.0.hosts().iter_mut().filter(|h| h.rack == offering.zone && h.held_by.is_none()) {
                h.held_by = Some("filler".into());
            }
            true
        }
        async fn create_foreign_instance(&self) -> Option<String> {
            Some(self.0.add_foreign_host("someone-else"))
        }
    }

    #[tokio::test]
    async fn host_pool_passes_the_conformance_suite() {
        conformance::assert_conformance(&HostPoolHarness(Arc::new(HostPool::new("example", &["rack-1", "rack-2"], 2))))
            .await;
    }

    #[test]
    fn the_operator_routes_its_node_class_to_the_host_pool() {
        let op = tenon::Operator::builder().provider(HostPool::new("example", &["rack-1"], 1));
        let registry = op.registry().unwrap();
        let mut pool = NodePool::new("hosts", Default::default());
        pool.spec.template.spec.node_class_ref = Some(NodeClassRef {
            group: "example.com".into(),
            kind: "HostPoolNodeClass".into(),
            name: "default".into(),
        });
        assert_eq!(registry.for_pool(&pool).unwrap().name(), "hostpool");
    }
}
