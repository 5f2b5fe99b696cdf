//! The AWS provider: EC2 `CreateFleet` launches, tag-scoped list/get/delete, NodeClass resolution, drift
//! and SQS interruption events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::types as ec2;
use jiff::Timestamp;
use tenon_core::api::{NodeClaim, NodePool};
use tenon_core::clock::{self, SharedClock, SystemClock};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DriftReason, Instance, InstanceType, Interruption, LaunchOptions,
    NodeClassKind, ProviderDescriptor, RepairPolicy, UnavailableOfferings, default_repair_policies,
};

use super::bootstrap::ClusterInfo;
use super::catalog::{self, Shape};
use super::nodeclass::{self, EC2NodeClass, EC2NodeClassStatus, ResolvedAmi, ResolvedSecurityGroup, ResolvedSubnet};
use super::reservations::ResolvedCapacityReservation;
use super::settings::AwsSettings;

/// The provider's name.
pub const NAME: &str = "aws";
/// Tag: the NodePool an instance was launched for.
pub const TAG_NODE_POOL: &str = "karpenter.sh/nodepool";
/// Tag: the NodeClaim an instance was launched for (set at launch).
pub const TAG_NODE_CLAIM: &str = "karpenter.sh/nodeclaim";
/// Tag: the EC2NodeClass an instance was launched from.
pub const TAG_NODE_CLASS: &str = "karpenter.k8s.aws/ec2nodeclass";
/// Tag: the cluster, as EKS spells it.
pub const TAG_EKS_CLUSTER: &str = "eks:eks-cluster-name";

#[derive(Debug, Clone)]
pub(super) struct Cached<T> {
    pub(super) at: Timestamp,
    pub(super) value: Arc<T>,
}

/// What a class's subnet, security group and AMI terms resolve to, each on its own.
pub(super) type ResolvedParts = (
    Result<Vec<ResolvedSubnet>, CloudError>,
    Result<Vec<ResolvedSecurityGroup>, CloudError>,
    Result<Vec<ResolvedAmi>, CloudError>,
    Result<Vec<ResolvedCapacityReservation>, CloudError>,
);

/// A quota scope that failed: a capacity type, and a vCPU quota bucket (`*` for all).
pub(super) type QuotaKey = (CapacityType, String);

#[derive(Debug, Default)]
pub(super) struct State {
    /// The classes fed, and what each resolved to.
    pub(super) classes: crate::classes::ClassStore<EC2NodeClass, EC2NodeClassStatus>,
    pub(super) shapes: Option<Cached<HashMap<String, Shape>>>,
    pub(super) zones: Option<Cached<HashMap<String, BTreeSet<String>>>>,
    pub(super) spot: Option<Cached<HashMap<(String, String), f64>>>,
    pub(super) on_demand: Option<Cached<HashMap<String, f64>>>,
    /// The cluster's Kubernetes version, from the API server or EKS.
    pub(super) kubernetes_version: Option<String>,
    /// SSM parameters read: name → (when, value).
    pub(super) ssm: HashMap<String, (Timestamp, String)>,
    /// How many more instances each capacity reservation holds: read with the class, moved by launches,
    /// terminations and failures until read again.
    pub(super) reservation_free: HashMap<String, u32>,
    /// When EC2's status checks were last read.
    pub(super) status_checked: Option<Timestamp>,
    /// EC2 refused `DescribeInstanceStatus`: status checks are not read again.
    pub(super) status_checks_refused: bool,
    /// When the Pricing API is next asked for on-demand prices (`None`: at the first use).
    pub(super) pricing_due: Option<Timestamp>,
    pub(super) templates: BTreeSet<String>,
    pub(super) cluster: Option<Arc<ClusterInfo>>,
    /// The instance profiles made for classes' roles: profile → the role it holds.
    pub(super) profiles: HashMap<String, String>,
    /// Addresses taken in each subnet by launches since its free count was last read.
    pub(super) subnet_used: HashMap<String, i32>,
    /// Subnets a launch found out of addresses, until their free count is read again.
    pub(super) subnet_exhausted: BTreeSet<String>,
    pub(super) quota: HashMap<QuotaKey, Timestamp>,
    pub(super) unavailable: Option<Arc<UnavailableOfferings>>,
    pub(super) queue_url: Option<String>,
}

/// The AWS provider.
pub struct AwsProvider {
    pub(super) settings: AwsSettings,
    pub(super) region: String,
    pub(super) ec2: aws_sdk_ec2::Client,
    pub(super) sqs: aws_sdk_sqs::Client,
    pub(super) eks: aws_sdk_eks::Client,
    pub(super) iam: aws_sdk_iam::Client,
    pub(super) ssm: aws_sdk_ssm::Client,
    pub(super) pricing: aws_sdk_pricing::Client,
    pub(super) clock: SharedClock,
    pub(super) state: Mutex<State>,
}

impl fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsProvider").field("settings", &self.settings).field("region", &self.region).finish()
    }
}

pub(super) fn filter(name: &str, values: impl IntoIterator<Item = impl Into<String>>) -> ec2::Filter {
    let mut f = ec2::Filter::builder().name(name);
    for v in values {
        f = f.values(v);
    }
    f.build()
}

/// Tag filters of a selector term: `tag:K=V`, or `tag-key=K` for the value `*`.
pub(super) fn tag_filters(tags: &BTreeMap<String, String>) -> Vec<ec2::Filter> {
    tags.iter()
        .map(
            |(k, v)| if v == "*" { filter("tag-key", [k.as_str()]) } else { filter(&format!("tag:{k}"), [v.as_str()]) },
        )
        .collect()
}

pub(super) fn tag(key: &str, value: &str) -> ec2::Tag {
    ec2::Tag::builder().key(key).value(value).build()
}

pub(super) fn tags_of(tags: &[ec2::Tag]) -> BTreeMap<String, String> {
    tags.iter().filter_map(|t| Some((t.key()?.to_owned(), t.value().unwrap_or_default().to_owned()))).collect()
}

impl AwsProvider {
    /// A provider with credentials and region from the standard AWS chain, overridden by `settings`.
    pub async fn new(settings: AwsSettings) -> Self {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(r) = &settings.region {
            loader = loader.region(aws_config::Region::new(r.clone()));
        }
        if let Some(e) = &settings.endpoint_url {
            loader = loader.endpoint_url(e.clone());
        }
        let config = loader.load().await;
        Self::from_sdk_config(settings, &config)
    }

    /// A provider over an already loaded SDK configuration (its region, credentials and endpoint);
    /// `settings.region` and `settings.endpoint_url` still override it.
    pub fn from_sdk_config(settings: AwsSettings, config: &aws_config::SdkConfig) -> Self {
        let mut ec2_conf = aws_sdk_ec2::config::Builder::from(config);
        let mut sqs_conf = aws_sdk_sqs::config::Builder::from(config);
        let mut eks_conf = aws_sdk_eks::config::Builder::from(config);
        let mut iam_conf = aws_sdk_iam::config::Builder::from(config);
        let mut ssm_conf = aws_sdk_ssm::config::Builder::from(config);
        let mut pricing_conf = aws_sdk_pricing::config::Builder::from(config);
        if let Some(r) = &settings.region {
            ssm_conf = ssm_conf.region(aws_sdk_ssm::config::Region::new(r.clone()));
            ec2_conf = ec2_conf.region(aws_sdk_ec2::config::Region::new(r.clone()));
            sqs_conf = sqs_conf.region(aws_sdk_sqs::config::Region::new(r.clone()));
            eks_conf = eks_conf.region(aws_sdk_eks::config::Region::new(r.clone()));
            iam_conf = iam_conf.region(aws_sdk_iam::config::Region::new(r.clone()));
        }
        if let Some(e) = &settings.endpoint_url {
            ec2_conf = ec2_conf.endpoint_url(e.clone());
            sqs_conf = sqs_conf.endpoint_url(e.clone());
            eks_conf = eks_conf.endpoint_url(e.clone());
            iam_conf = iam_conf.endpoint_url(e.clone());
            ssm_conf = ssm_conf.endpoint_url(e.clone());
            pricing_conf = pricing_conf.endpoint_url(e.clone());
        }
        let region = settings
            .region
            .clone()
            .or_else(|| config.region().map(ToString::to_string))
            .unwrap_or_else(|| "us-east-1".to_owned());
        // The Pricing API answers from a few regions only; each region asks the nearest.
        pricing_conf =
            pricing_conf.region(aws_sdk_pricing::config::Region::new(super::pricing::pricing_region(&region)));
        Self {
            settings,
            region,
            ec2: aws_sdk_ec2::Client::from_conf(ec2_conf.build()),
            sqs: aws_sdk_sqs::Client::from_conf(sqs_conf.build()),
            eks: aws_sdk_eks::Client::from_conf(eks_conf.build()),
            iam: aws_sdk_iam::Client::from_conf(iam_conf.build()),
            ssm: aws_sdk_ssm::Client::from_conf(ssm_conf.build()),
            pricing: aws_sdk_pricing::Client::from_conf(pricing_conf.build()),
            clock: Arc::new(SystemClock),
            state: Mutex::new(State::default()),
        }
    }

    /// Uses `clock` for every cache timestamp (a virtual clock in tests).
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Shares the core's unavailable-offerings cache: offerings that fail inside a launch that still
    /// succeeded elsewhere are marked there too.
    pub fn with_unavailable_offerings(self, cache: Arc<UnavailableOfferings>) -> Self {
        self.set_unavailable_offerings(cache);
        self
    }

    /// Sets the shared unavailable-offerings cache after construction.
    pub fn set_unavailable_offerings(&self, cache: Arc<UnavailableOfferings>) {
        self.state().unavailable = Some(cache);
    }

    /// The settings.
    pub fn settings(&self) -> &AwsSettings {
        &self.settings
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The EC2 client (for tools and tests).
    pub fn ec2(&self) -> &aws_sdk_ec2::Client {
        &self.ec2
    }

    /// The SQS client (for tools and tests).
    pub fn sqs(&self) -> &aws_sdk_sqs::Client {
        &self.sqs
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub(super) fn fresh<T>(&self, c: &Option<Cached<T>>, ttl: Duration) -> Option<Arc<T>> {
        c.as_ref().filter(|c| clock::since(self.now(), c.at) < ttl).map(|c| c.value.clone())
    }
}

#[async_trait]
impl CloudProvider for AwsProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn descriptor(&self) -> ProviderDescriptor {
        ProviderDescriptor {
            node_classes: vec![NodeClassKind::new(nodeclass::GROUP, nodeclass::KIND)],
            well_known_labels: catalog::WELL_KNOWN_LABELS.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        let name =
            self.class_name(pool.spec.template.spec.node_class_ref.as_ref(), &format!("NodePool/{}", pool.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        self.types_for(&class, &status).await
    }

    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        self.launch(claim, options).await
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        self.terminate(claim).await
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        self.get_instance(provider_id).await
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        self.list_instances().await
    }

    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        self.drift(claim).await
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        default_repair_policies()
    }

    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        self.reboot_instance(claim).await
    }

    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        self.read_interruptions().await
    }
}
