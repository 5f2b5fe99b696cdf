//! The AWS provider: EC2 `CreateFleet` launches, tag-scoped list/get/delete, NodeClass resolution, drift
//! and SQS interruption events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types as ec2;
use jiff::Timestamp;
use tenon_core::api::{NodeClaim, NodeClassRef, NodePool, labels};
use tenon_core::clock::{self, SharedClock, SystemClock};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DriftReason, Instance, InstanceState, InstanceType, Interruption,
    LaunchOptions, NodeClassKind, Offering, OfferingKey, ProviderDescriptor, RepairPolicy, UnavailableOfferings,
    default_repair_policies,
};
use tenon_core::resources::Resources;

use super::bootstrap::ClusterInfo;
use super::catalog::{self, Gpu, Shape};
use super::events;
use super::kubelet::{AmiFamily, Kubelet};
use super::nodeclass::{
    self, AmiSelectorTerm, EC2NodeClass, EC2NodeClassStatus, ResolvedAmi, ResolvedSecurityGroup, ResolvedSubnet,
};
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

/// Fleet error codes that mean "no capacity here now" rather than a broken request.
const UNFULFILLABLE: [&str; 9] = [
    "InsufficientInstanceCapacity",
    "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded",
    "UnfulfillableCapacity",
    "Unsupported",
    "InsufficientFreeAddressesInSubnet",
    "MaxFleetCountExceeded",
    "ReservationCapacityExceeded",
    // The account cannot create the spot service-linked role: no spot launch can succeed until it exists.
    "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
];

/// States of an instance that still exists.
const LIVE_STATES: [&str; 5] = ["pending", "running", "stopping", "stopped", "shutting-down"];

#[derive(Debug, Clone)]
struct Cached<T> {
    at: Timestamp,
    value: Arc<T>,
}

/// What a class's subnet, security group and AMI terms resolve to, each on its own.
type ResolvedParts = (
    Result<Vec<ResolvedSubnet>, CloudError>,
    Result<Vec<ResolvedSecurityGroup>, CloudError>,
    Result<Vec<ResolvedAmi>, CloudError>,
);

#[derive(Debug, Clone)]

struct ResolvedClass {
    at: Timestamp,
    status: Arc<EC2NodeClassStatus>,
}

/// A quota scope that failed: a capacity type, and a vCPU quota bucket (`*` for all).
type QuotaKey = (CapacityType, String);

#[derive(Debug, Default)]
pub(super) struct State {
    classes: HashMap<String, Arc<EC2NodeClass>>,
    resolved: HashMap<String, ResolvedClass>,
    shapes: Option<Cached<HashMap<String, Shape>>>,
    zones: Option<Cached<HashMap<String, BTreeSet<String>>>>,
    spot: Option<Cached<HashMap<(String, String), f64>>>,
    on_demand: Option<Cached<HashMap<String, f64>>>,
    pub(super) templates: BTreeSet<String>,
    pub(super) cluster: Option<Arc<ClusterInfo>>,
    /// The instance profiles made for classes' roles: profile → the role it holds.
    pub(super) profiles: HashMap<String, String>,
    /// Addresses taken in each subnet by launches since its free count was last read.
    subnet_used: HashMap<String, i32>,
    /// Subnets a launch found out of addresses, until their free count is read again.
    subnet_exhausted: BTreeSet<String>,
    quota: HashMap<QuotaKey, Timestamp>,
    unavailable: Option<Arc<UnavailableOfferings>>,
    queue_url: Option<String>,
}

/// The AWS provider.
pub struct AwsProvider {
    pub(super) settings: AwsSettings,
    region: String,
    pub(super) ec2: aws_sdk_ec2::Client,
    sqs: aws_sdk_sqs::Client,
    pub(super) eks: aws_sdk_eks::Client,
    pub(super) iam: aws_sdk_iam::Client,
    clock: SharedClock,
    state: Mutex<State>,
}

impl fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsProvider").field("settings", &self.settings).field("region", &self.region).finish()
    }
}

/// An AWS SDK error (any service's: they share one response type) as a [`CloudError`] by its code.
pub(super) fn sdk_error<E>(op: &str, e: SdkError<E, aws_sdk_ec2::config::http::HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let code = e.code().unwrap_or_default().to_owned();
    let message = format!("{op}: {}", DisplayErrorContext(&e));
    match code.as_str() {
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" => CloudError::NotFound(message),
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
            CloudError::Throttled { retry_after: None }
        }
        "UnauthorizedOperation" | "AuthFailure" | "AccessDenied" | "AccessDeniedException" | "InvalidClientTokenId" => {
            CloudError::Unauthorized(message)
        }
        _ => CloudError::message(NAME, message),
    }
}

fn sqs_error<E>(op: &str, e: SdkError<E, aws_sdk_sqs::config::http::HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    CloudError::message(NAME, format!("{op}: {}", DisplayErrorContext(&e)))
}

pub(super) fn filter(name: &str, values: impl IntoIterator<Item = impl Into<String>>) -> ec2::Filter {
    let mut f = ec2::Filter::builder().name(name);
    for v in values {
        f = f.values(v);
    }
    f.build()
}

/// Tag filters of a selector term: `tag:K=V`, or `tag-key=K` for the value `*`.
fn tag_filters(tags: &BTreeMap<String, String>) -> Vec<ec2::Filter> {
    tags.iter()
        .map(
            |(k, v)| if v == "*" { filter("tag-key", [k.as_str()]) } else { filter(&format!("tag:{k}"), [v.as_str()]) },
        )
        .collect()
}

pub(super) fn tag(key: &str, value: &str) -> ec2::Tag {
    ec2::Tag::builder().key(key).value(value).build()
}

fn tags_of(tags: &[ec2::Tag]) -> BTreeMap<String, String> {
    tags.iter().filter_map(|t| Some((t.key()?.to_owned(), t.value().unwrap_or_default().to_owned()))).collect()
}

fn kube_arch(ec2_arch: &str) -> Option<&'static str> {
    match ec2_arch {
        "x86_64" | "x86_64_mac" => Some("amd64"),
        "arm64" | "arm64_mac" => Some("arm64"),
        _ => None,
    }
}

/// The instance id of `aws:///<zone>/<id>` (or of a bare id).
pub fn instance_id(provider_id: &str) -> Result<&str, CloudError> {
    let id = provider_id.rsplit('/').next().unwrap_or_default();
    if id.starts_with("i-") {
        Ok(id)
    } else {
        Err(CloudError::NotFound(format!("{provider_id:?} is not an AWS provider id (aws:///<zone>/<instance-id>)")))
    }
}

/// `aws:///<zone>/<id>`.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
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
        if let Some(r) = &settings.region {
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
        }
        let region = settings
            .region
            .clone()
            .or_else(|| config.region().map(ToString::to_string))
            .unwrap_or_else(|| "us-east-1".to_owned());
        Self {
            settings,
            region,
            ec2: aws_sdk_ec2::Client::from_conf(ec2_conf.build()),
            sqs: aws_sdk_sqs::Client::from_conf(sqs_conf.build()),
            eks: aws_sdk_eks::Client::from_conf(eks_conf.build()),
            iam: aws_sdk_iam::Client::from_conf(iam_conf.build()),
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

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn fresh<T>(&self, c: &Option<Cached<T>>, ttl: Duration) -> Option<Arc<T>> {
        c.as_ref().filter(|c| clock::since(self.now(), c.at) < ttl).map(|c| c.value.clone())
    }

    /// Adds or replaces an `EC2NodeClass` (the operator feeds them from the API server). A changed spec
    /// is resolved afresh (subnets, security groups, AMIs) on its next use; an unchanged one keeps its
    /// resolution until `node_class_ttl`.
    pub fn apply_node_class(&self, class: EC2NodeClass) -> Result<(), CloudError> {
        class.validate().map_err(CloudError::NodeClassNotReady)?;
        let name = class.name().to_owned();
        let mut st = self.state();
        if st.classes.get(&name).is_none_or(|old| old.spec != class.spec) {
            st.resolved.remove(&name);
        }
        st.classes.insert(name, Arc::new(class));
        Ok(())
    }

    /// Forgets an `EC2NodeClass` at once, leaving its launch templates: a class that no longer validates
    /// is not launched from with its last good spec; its claims answer `NodeClassNotReady` until it is
    /// fixed.
    pub fn forget_node_class(&self, name: &str) {
        let mut st = self.state();
        st.classes.remove(name);
        st.resolved.remove(name);
    }

    /// Forgets an `EC2NodeClass` and deletes the launch templates this cluster made for it (what a
    /// finalizer on the class does before it lets the class go). Instances launched from them run on.
    pub async fn delete_node_class(&self, name: &str) -> Result<(), CloudError> {
        {
            let mut st = self.state();
            st.classes.remove(name);
            st.resolved.remove(name);
        }
        self.delete_launch_templates(name, &BTreeSet::new()).await?;
        self.delete_instance_profile(name).await
    }

    fn class_name<'a>(&self, r: Option<&'a NodeClassRef>, object: &str) -> Result<&'a str, CloudError> {
        match r {
            Some(r) if r.group == nodeclass::GROUP && r.kind == nodeclass::KIND => Ok(&r.name),
            Some(r) => Err(CloudError::NodeClassNotReady(format!("{object}: nodeClassRef {r} is not an EC2NodeClass"))),
            None => Err(CloudError::NodeClassNotReady(format!("{object}: no nodeClassRef to an EC2NodeClass"))),
        }
    }

    /// The NodeClass `name` and what its selector terms resolve to (cached for `node_class_ttl`).
    /// `NodeClassNotReady` when it is unknown or a term resolves to nothing.
    pub async fn resolve_node_class(
        &self,
        name: &str,
    ) -> Result<(Arc<EC2NodeClass>, Arc<EC2NodeClassStatus>), CloudError> {
        let class = self.known_class(name)?;
        if let Some(status) = self.fresh_resolution(name) {
            return Ok((class, status));
        }
        let (subnets, security_groups, amis) = self.resolve_parts(&class).await;
        let status = EC2NodeClassStatus {
            subnets: subnets?,
            security_groups: security_groups?,
            amis: amis?,
            instance_profile: self.ensure_instance_profile(&class).await?,
            conditions: Vec::new(),
        };
        Ok((class.clone(), self.remember_resolution(name, &class, status).await))
    }

    /// The status to write on `class`, as Karpenter's AWS provider writes it: what its terms resolve to,
    /// a condition for each part (`ValidationSucceeded`, `SubnetsReady`, `SecurityGroupsReady`,
    /// `AMIsReady`, `InstanceProfileReady`) and `Ready` over them all, keeping the transition times of its
    /// current status. Reads EC2 only when the cached resolution is stale, as a launch would; a class that
    /// fails validation is not resolved and keeps what its status last said it resolved to.
    pub async fn node_class_status(&self, class: &EC2NodeClass) -> EC2NodeClassStatus {
        use super::nodeclass::condition_types::{
            AMIS_READY, INSTANCE_PROFILE_READY, READY, SECURITY_GROUPS_READY, SUBNETS_READY,
        };
        use tenon_core::api::condition_types::VALIDATION_SUCCEEDED;
        use tenon_core::api::{ConditionStatus, set_condition};
        let previous = class.status.clone().unwrap_or_default();
        let now = self.now();
        let mut conditions = previous.conditions.clone();
        let mut unready: Vec<&str> = Vec::new();
        let mut set = |type_: &'static str, failure: Option<String>, reason: &str| match failure {
            None => set_condition(&mut conditions, type_, ConditionStatus::True, type_, "", now),
            Some(m) => {
                unready.push(type_);
                set_condition(&mut conditions, type_, ConditionStatus::False, reason, &m, now);
            }
        };
        if let Err(m) = class.validate() {
            set(VALIDATION_SUCCEEDED, Some(m), "ValidationFailed");
            let message = format!("{VALIDATION_SUCCEEDED} is False");
            set_condition(&mut conditions, READY, ConditionStatus::False, "NotReady", &message, now);
            return EC2NodeClassStatus { conditions, ..previous };
        }
        set(VALIDATION_SUCCEEDED, None, "");
        let name = class.name();
        let known = self.state().classes.get(name).is_some_and(|k| k.spec == class.spec);
        let cached = known.then(|| self.fresh_resolution(name)).flatten();
        let (subnets, security_groups, amis) = match &cached {
            Some(s) => (Ok(s.subnets.clone()), Ok(s.security_groups.clone()), Ok(s.amis.clone())),
            None => self.resolve_parts(class).await,
        };
        let (instance_profile, profile_error) = match self.ensure_instance_profile(class).await {
            Ok(Some(p)) => (Some(p), None),
            Ok(None) => (None, Some("neither spec.role nor spec.instanceProfile is set".to_owned())),
            Err(e) => (previous.instance_profile.clone(), Some(e.to_string())),
        };
        set(SUBNETS_READY, subnets.as_ref().err().map(ToString::to_string), "SubnetsNotFound");
        set(SECURITY_GROUPS_READY, security_groups.as_ref().err().map(ToString::to_string), "SecurityGroupsNotFound");
        set(AMIS_READY, amis.as_ref().err().map(ToString::to_string), "AMIsNotFound");
        set(INSTANCE_PROFILE_READY, profile_error, "InstanceProfileNotFound");
        let ready = unready.is_empty();
        if ready {
            set_condition(&mut conditions, READY, ConditionStatus::True, READY, "", now);
        } else {
            let message = format!("{} not ready", unready.join(", "));
            set_condition(&mut conditions, READY, ConditionStatus::False, "NotReady", &message, now);
        }
        let status = EC2NodeClassStatus {
            subnets: subnets.unwrap_or_default(),
            security_groups: security_groups.unwrap_or_default(),
            amis: amis.unwrap_or_default(),
            instance_profile,
            conditions: Vec::new(),
        };
        if ready && known && cached.is_none() {
            self.remember_resolution(name, class, status.clone()).await;
        }
        EC2NodeClassStatus { conditions, ..status }
    }

    fn known_class(&self, name: &str) -> Result<Arc<EC2NodeClass>, CloudError> {
        self.state()
            .classes
            .get(name)
            .cloned()
            .ok_or_else(|| CloudError::NodeClassNotReady(format!("EC2NodeClass/{name} is not known")))
    }

    /// The cached resolution of class `name`, unless older than `node_class_ttl`.
    fn fresh_resolution(&self, name: &str) -> Option<Arc<EC2NodeClassStatus>> {
        let cached = self.state().resolved.get(name).cloned()?;
        (clock::since(self.now(), cached.at) < self.settings.node_class_ttl).then_some(cached.status)
    }

    /// What each kind of selector term of `class` resolves to, read from EC2.
    async fn resolve_parts(&self, class: &EC2NodeClass) -> ResolvedParts {
        (self.resolve_subnets(class).await, self.resolve_security_groups(class).await, self.resolve_amis(class).await)
    }

    /// Caches a fresh resolution, and deletes the launch templates it makes stale: a changed spec, AMI,
    /// group or profile names a new one, and those the class would no longer use go. Failing to delete
    /// them is not the caller's problem.
    async fn remember_resolution(
        &self,
        name: &str,
        class: &EC2NodeClass,
        status: EC2NodeClassStatus,
    ) -> Arc<EC2NodeClassStatus> {
        let status = Arc::new(status);
        {
            // Fresh free-address counts: what launches took and found is in them now.
            let mut st = self.state();
            for s in &status.subnets {
                st.subnet_used.remove(&s.id);
                st.subnet_exhausted.remove(&s.id);
            }
        }
        self.state().resolved.insert(name.to_owned(), ResolvedClass { at: self.now(), status: status.clone() });
        let keep: BTreeSet<String> =
            status.amis.iter().map(|a| self.launch_template_prefix(class, &status, a)).collect();
        if let Err(e) = self.delete_launch_templates(name, &keep).await {
            tracing::warn!(node_class = name, error = %e, "could not delete unused launch templates");
        }
        status
    }

    async fn resolve_subnets(&self, class: &EC2NodeClass) -> Result<Vec<ResolvedSubnet>, CloudError> {
        let mut out: BTreeMap<String, ResolvedSubnet> = BTreeMap::new();
        for term in &class.spec.subnet_selector_terms {
            let mut req = self.ec2.describe_subnets();
            if let Some(id) = &term.id {
                req = req.subnet_ids(id);
            }
            for f in tag_filters(&term.tags) {
                req = req.filters(f);
            }
            let resp = req.send().await.map_err(|e| sdk_error("DescribeSubnets", e))?;
            for s in resp.subnets() {
                let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone()) else {
                    return Err(CloudError::message(
                        NAME,
                        "DescribeSubnets: a subnet has no SubnetId or AvailabilityZone",
                    ));
                };
                out.insert(
                    id.to_owned(),
                    ResolvedSubnet {
                        id: id.to_owned(),
                        zone: zone.to_owned(),
                        zone_id: s.availability_zone_id().map(str::to_owned),
                        available_ips: s.available_ip_address_count(),
                    },
                );
            }
        }
        if out.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: spec.subnetSelectorTerms match no subnet",
                class.name()
            )));
        }
        Ok(out.into_values().collect())
    }

    async fn resolve_security_groups(&self, class: &EC2NodeClass) -> Result<Vec<ResolvedSecurityGroup>, CloudError> {
        let mut out: BTreeMap<String, ResolvedSecurityGroup> = BTreeMap::new();
        for term in &class.spec.security_group_selector_terms {
            let mut req = self.ec2.describe_security_groups();
            if let Some(id) = &term.id {
                req = req.group_ids(id);
            }
            if let Some(name) = &term.name {
                req = req.filters(filter("group-name", [name.as_str()]));
            }
            for f in tag_filters(&term.tags) {
                req = req.filters(f);
            }
            let resp = req.send().await.map_err(|e| sdk_error("DescribeSecurityGroups", e))?;
            for g in resp.security_groups() {
                let Some(id) = g.group_id() else {
                    return Err(CloudError::message(NAME, "DescribeSecurityGroups: a group has no GroupId"));
                };
                out.insert(
                    id.to_owned(),
                    ResolvedSecurityGroup { id: id.to_owned(), name: g.group_name().map(str::to_owned) },
                );
            }
        }
        if out.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: spec.securityGroupSelectorTerms match no security group",
                class.name()
            )));
        }
        Ok(out.into_values().collect())
    }

    /// Name patterns of an alias's images: `(pattern, nvidia)`.
    fn alias_patterns(&self, alias: &nodeclass::Alias) -> Vec<(String, bool)> {
        let k8s = self.settings.kubernetes_version.as_deref().unwrap_or("*");
        let v = if alias.version == "latest" { "v*".to_owned() } else { alias.version.clone() };
        match alias.family.as_str() {
            "al2023" => vec![
                (format!("amazon-eks-node-al2023-*-standard-{k8s}-{v}"), false),
                (format!("amazon-eks-node-al2023-*-nvidia-{k8s}-{v}"), true),
            ],
            "al2" => vec![
                (format!("amazon-eks-node-{k8s}-{v}"), false),
                (format!("amazon-eks-arm64-node-{k8s}-{v}"), false),
                (format!("amazon-eks-gpu-node-{k8s}-{v}"), true),
            ],
            _ => vec![
                (format!("bottlerocket-aws-k8s-{k8s}-*-{v}*"), false),
                (format!("bottlerocket-aws-k8s-{k8s}-nvidia-*-{v}*"), true),
            ],
        }
    }

    async fn describe_images(
        &self,
        term: &AmiSelectorTerm,
        pattern: Option<&str>,
        owners: &[String],
    ) -> Result<Vec<ec2::Image>, CloudError> {
        let mut req = self.ec2.describe_images();
        if let Some(id) = &term.id {
            req = req.image_ids(id);
        }
        if let Some(p) = pattern {
            req = req.filters(filter("name", [p]));
        }
        for o in owners {
            req = req.owners(o);
        }
        for f in tag_filters(&term.tags) {
            req = req.filters(f);
        }
        let resp = req.send().await.map_err(|e| sdk_error("DescribeImages", e))?;
        Ok(resp.images().to_vec())
    }

    async fn resolve_amis(&self, class: &EC2NodeClass) -> Result<Vec<ResolvedAmi>, CloudError> {
        let mut found: Vec<ResolvedAmi> = Vec::new();
        for term in &class.spec.ami_selector_terms {
            let mut batches: Vec<(Vec<ec2::Image>, bool)> = Vec::new();
            if let Some(alias) = &term.alias {
                let alias = nodeclass::parse_alias(alias).map_err(CloudError::NodeClassNotReady)?;
                let owners = [self.settings.ami_alias_owner.clone()];
                for (pattern, nvidia) in self.alias_patterns(&alias) {
                    let mut images = self.describe_images(term, Some(&pattern), &owners).await?;
                    // An alias names one image per architecture and variant: the newest.
                    images.sort_by(|a, b| b.creation_date().cmp(&a.creation_date()));
                    let mut seen = BTreeSet::new();
                    images.retain(|i| seen.insert(i.architecture().map(|a| a.as_str().to_owned())));
                    batches.push((images, nvidia));
                }
            } else {
                let images = self.describe_images(term, term.name.as_deref(), &nodeclass::image_owners(term)).await?;
                batches.push((images, false));
            }
            for (images, nvidia) in batches {
                for i in images {
                    let Some(id) = i.image_id() else {
                        return Err(CloudError::message(NAME, "DescribeImages: an image has no ImageId"));
                    };
                    // One odd image in a wildcard match must not make the whole NodeClass unusable.
                    let Some(arch) = i.architecture().map(|a| a.as_str()).and_then(kube_arch) else {
                        tracing::warn!(
                            node_class = class.name(),
                            image = id,
                            architecture = ?i.architecture(),
                            "skipping an image without a supported Architecture"
                        );
                        continue;
                    };
                    let name = i.name().map(str::to_owned);
                    let nvidia = nvidia
                        || name.as_deref().is_some_and(|n| {
                            let n = n.to_ascii_lowercase();
                            n.contains("nvidia") || n.contains("gpu")
                        });
                    if !found.iter().any(|a| a.id == id) {
                        found.push(ResolvedAmi {
                            id: id.to_owned(),
                            name,
                            architecture: arch.to_owned(),
                            nvidia,
                            creation_date: i.creation_date().map(str::to_owned),
                        });
                    }
                }
            }
        }
        if found.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: spec.amiSelectorTerms match no image",
                class.name()
            )));
        }
        found.sort_by(|a, b| b.creation_date.cmp(&a.creation_date));
        Ok(found)
    }

    /// Instance shapes, from `DescribeInstanceTypes` (kept for `shapes_ttl`).
    /// The instance shapes, read at most every `shapes_ttl`. A refresh that fails keeps the catalog last
    /// read (with a warning), as a spot price refresh does; only a first read that fails is an error.
    async fn shapes(&self) -> Result<Arc<HashMap<String, Shape>>, CloudError> {
        if let Some(s) = self.fresh(&self.state().shapes, self.settings.shapes_ttl) {
            return Ok(s);
        }
        let mut infos = Vec::new();
        let mut req = self.ec2.describe_instance_types().max_results(100);
        if !self.settings.instance_type_patterns.is_empty() {
            req = req.filters(filter("instance-type", self.settings.instance_type_patterns.iter().cloned()));
        }
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            match page {
                Ok(resp) => infos.extend(resp.instance_types().iter().cloned()),
                Err(e) => {
                    let e = sdk_error("DescribeInstanceTypes", e);
                    let last = self.state().shapes.as_ref().map(|c| c.value.clone());
                    return match last {
                        Some(last) => {
                            tracing::warn!(error = %e, "keeping the instance types last read");
                            Ok(last)
                        }
                        None => Err(e),
                    };
                }
            }
        }
        let value = Arc::new(shapes_of(&infos));
        self.state().shapes = Some(Cached { at: self.now(), value: value.clone() });
        Ok(value)
    }

    /// With `instance_type_patterns`, the exact names of the selected types (offerings and spot prices are
    /// then read for those only); `None` reads every type.
    async fn selected_names(&self) -> Result<Option<Vec<String>>, CloudError> {
        if self.settings.instance_type_patterns.is_empty() {
            return Ok(None);
        }
        let mut names: Vec<String> = self.shapes().await?.keys().cloned().collect();
        names.sort();
        Ok(Some(names))
    }

    /// The zones each type is offered in, from `DescribeInstanceTypeOfferings` (kept for `offerings_ttl`).
    async fn zones(&self) -> Result<Arc<HashMap<String, BTreeSet<String>>>, CloudError> {
        if let Some(z) = self.fresh(&self.state().zones, self.settings.offerings_ttl) {
            return Ok(z);
        }
        let names = self.selected_names().await?;
        let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
        let mut req = self
            .ec2
            .describe_instance_type_offerings()
            .location_type(ec2::LocationType::AvailabilityZone)
            .max_results(1000);
        if let Some(names) = &names {
            req = req.filters(filter("instance-type", names.iter().cloned()));
        }
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            let resp = page.map_err(|e| sdk_error("DescribeInstanceTypeOfferings", e))?;
            for o in resp.instance_type_offerings() {
                let (Some(t), Some(zone)) = (o.instance_type(), o.location()) else {
                    return Err(CloudError::message(
                        NAME,
                        "DescribeInstanceTypeOfferings: an offering has no InstanceType or Location",
                    ));
                };
                out.entry(t.as_str().to_owned()).or_default().insert(zone.to_owned());
            }
        }
        let value = Arc::new(out);
        self.state().zones = Some(Cached { at: self.now(), value: value.clone() });
        Ok(value)
    }

    /// The latest spot price of each (type, zone), from `DescribeSpotPriceHistory` (kept for
    /// `offerings_ttl`; the previous prices are kept when a refresh fails).
    async fn spot_prices(&self) -> Result<Arc<HashMap<(String, String), f64>>, CloudError> {
        if let Some(p) = self.fresh(&self.state().spot, self.settings.offerings_ttl) {
            return Ok(p);
        }
        match self.fetch_spot_prices().await {
            Ok(value) => {
                let value = Arc::new(value);
                self.state().spot = Some(Cached { at: self.now(), value: value.clone() });
                Ok(value)
            }
            Err(e) => match self.state().spot.as_ref() {
                Some(old) => {
                    tracing::warn!(error = %e, "spot price refresh failed; keeping the previous prices");
                    Ok(old.value.clone())
                }
                None => Err(e),
            },
        }
    }

    async fn fetch_spot_prices(&self) -> Result<HashMap<(String, String), f64>, CloudError> {
        let names = self.selected_names().await?;
        let mut latest: HashMap<(String, String), (i64, f64)> = HashMap::new();
        let start = aws_smithy_types::DateTime::from_secs(self.now().as_second());
        let mut req = self
            .ec2
            .describe_spot_price_history()
            .product_descriptions("Linux/UNIX")
            .product_descriptions("Linux/UNIX (Amazon VPC)")
            .start_time(start)
            .max_results(1000);
        if let Some(names) = &names {
            req = req.set_instance_types(Some(names.iter().map(|n| ec2::InstanceType::from(n.as_str())).collect()));
        }
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            let resp = page.map_err(|e| sdk_error("DescribeSpotPriceHistory", e))?;
            for p in resp.spot_price_history() {
                let (Some(t), Some(zone), Some(price)) = (p.instance_type(), p.availability_zone(), p.spot_price())
                else {
                    continue;
                };
                // A price that is not a finite, non-negative number (NaN, inf) would poison every comparison:
                // that offering goes unpriced (and so unoffered) rather than failing the whole refresh.
                let Some(price) = spot_price(price) else {
                    tracing::warn!(
                        instance_type = t.as_str(),
                        zone,
                        price,
                        "ignoring a spot price that is not a finite non-negative number"
                    );
                    continue;
                };
                let at = p.timestamp().map(|t| t.secs()).unwrap_or_default();
                let slot = latest.entry((t.as_str().to_owned(), zone.to_owned())).or_insert((at, price));
                if at >= slot.0 {
                    *slot = (at, price);
                }
            }
        }
        Ok(latest.into_iter().map(|(k, (_, p))| (k, p)).collect())
    }

    /// On-demand prices of the region: the bundled table, or `on_demand_price_file` re-read every
    /// `price_refresh` (the previous table is kept when a re-read fails).
    fn on_demand_prices(&self) -> Result<Arc<HashMap<String, f64>>, CloudError> {
        if let Some(p) = self.fresh(&self.state().on_demand, self.settings.price_refresh) {
            return Ok(p);
        }
        let loaded = match &self.settings.on_demand_price_file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("on-demand price file {path}: {e}"))
                .and_then(|text| catalog::parse_prices(&text, &self.region).map_err(|e| format!("{path}: {e}"))),
            None => catalog::parse_prices(catalog::BUNDLED_PRICES_CSV, &self.region),
        };
        let value = match loaded {
            Ok(v) => Arc::new(v),
            Err(e) => match self.state().on_demand.as_ref() {
                Some(old) => {
                    tracing::warn!(error = %e, "on-demand price refresh failed; keeping the previous prices");
                    old.value.clone()
                }
                None => return Err(CloudError::message(NAME, e)),
            },
        };
        self.state().on_demand = Some(Cached { at: self.now(), value: value.clone() });
        Ok(value)
    }

    /// Drops expired quota blocks and returns the (capacity type, bucket) scopes blocked now.
    fn live_quota_blocks(&self) -> HashMap<QuotaKey, Timestamp> {
        let now = self.now();
        let mut st = self.state();
        st.quota.retain(|_, until| *until > now);
        st.quota.clone()
    }

    /// The size of the volume the kubelet's ephemeral storage lives on: the mapping marked `rootVolume`,
    /// else the first (the default volumes mark theirs; Bottlerocket's is its data volume).
    pub(super) fn root_volume_gib(&self, class: Option<&EC2NodeClass>) -> i64 {
        class
            .and_then(|c| {
                let bdms = &c.spec.block_device_mappings;
                bdms.iter().find(|b| b.root_volume == Some(true)).or_else(|| bdms.first())
            })
            .and_then(|b| b.ebs.as_ref())
            .and_then(|e| e.size_gib().ok().flatten())
            .map(i64::from)
            .unwrap_or(self.settings.default_root_volume_gib)
    }

    /// Every instance type for a resolved NodeClass: shapes whose architecture one of its AMIs boots,
    /// offered in the zones of its subnets.
    async fn types_for(
        &self,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
    ) -> Result<Vec<InstanceType>, CloudError> {
        let shapes = self.shapes().await?;
        let zones = self.zones().await?;
        let spot = self.spot_prices().await?;
        let od = self.on_demand_prices()?;
        let subnet_zones: BTreeSet<&str> = status.subnets.iter().map(|s| s.zone.as_str()).collect();
        let archs: BTreeSet<&str> = status.amis.iter().map(|a| a.architecture.as_str()).collect();
        let root = self.root_volume_gib(Some(class));
        let not_ready = |m: String| CloudError::NodeClassNotReady(format!("EC2NodeClass/{}: {m}", class.name()));
        let family = class.spec.family().map_err(not_ready)?;
        let kubelet = class.spec.kubelet().map_err(not_ready)?;
        let mut names: Vec<&String> = shapes.keys().collect();
        names.sort();
        let quota = self.live_quota_blocks();
        let blocked = |ct: CapacityType, name: &str| {
            quota.contains_key(&(ct, "*".to_owned()))
                || quota.contains_key(&(ct, catalog::quota_bucket(name).to_owned()))
        };
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let shape = &shapes[name];
            if !shape.architectures.iter().any(|a| archs.contains(a.as_str())) {
                continue;
            }
            // Neither the on-demand price nor the quota blocks depend on the zone.
            let od_price = od.get(name).copied();
            let blocked = [CapacityType::Spot, CapacityType::OnDemand].map(|ct| (ct, blocked(ct, name)));
            let mut offerings = Vec::new();
            for zone in zones.get(name).into_iter().flatten().filter(|z| subnet_zones.contains(z.as_str())) {
                for (ct, blocked) in blocked {
                    let price = match ct {
                        CapacityType::Spot => spot.get(&(name.clone(), zone.clone())).copied().or(od_price),
                        _ => od_price,
                    };
                    let mut o = Offering::new(zone.clone(), ct, price.unwrap_or(0.0));
                    o.available = price.is_some() && !blocked;
                    offerings.push(o);
                }
            }
            let mut it =
                catalog::instance_type(shape, root, &kubelet, family, self.settings.vm_memory_overhead, offerings);
            if let Some(arch) = shape.architectures.iter().find(|a| archs.contains(a.as_str())) {
                it.labels.insert(labels::ARCH.to_owned(), arch.clone());
            }
            out.push(it);
        }
        Ok(out)
    }

    fn mark_unavailable(&self, key: &OfferingKey) {
        let cache = self.state().unavailable.clone();
        if let Some(c) = cache {
            c.mark(NAME, key, self.settings.unavailable_ttl, self.now());
        }
    }

    fn block_quota(&self, capacity_type: CapacityType, bucket: &str) {
        let until = clock::add(self.now(), self.settings.unavailable_ttl);
        self.state().quota.insert((capacity_type, bucket.to_owned()), until);
    }

    /// Describes one instance (any state); `NotFound` when EC2 does not know it or it is another
    /// cluster's.
    async fn describe(&self, id: &str) -> Result<ec2::Instance, CloudError> {
        let resp = self
            .ec2
            .describe_instances()
            .instance_ids(id)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("DescribeInstances {id}"), e))?;
        let instance = resp
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(id))
            .cloned()
            .ok_or_else(|| CloudError::NotFound(format!("instance {id}")))?;
        if !self.owned(&instance) {
            return Err(CloudError::NotFound(format!(
                "instance {id} (not owned by cluster {})",
                self.settings.cluster_name
            )));
        }
        Ok(instance)
    }

    pub(super) fn cluster_tag(&self) -> String {
        format!("kubernetes.io/cluster/{}", self.settings.cluster_name)
    }

    fn owned(&self, i: &ec2::Instance) -> bool {
        let key = self.cluster_tag();
        i.tags().iter().any(|t| t.key() == Some(key.as_str()) && t.value() == Some("owned"))
    }

    async fn describe_owned(&self, extra: Vec<ec2::Filter>) -> Result<Vec<ec2::Instance>, CloudError> {
        let mut out = Vec::new();
        let mut req = self
            .ec2
            .describe_instances()
            .filters(filter(&format!("tag:{}", self.cluster_tag()), ["owned"]))
            .filters(filter("tag-key", [TAG_NODE_POOL]))
            .filters(filter("instance-state-name", LIVE_STATES));
        for f in extra {
            req = req.filters(f);
        }
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            let resp = page.map_err(|e| sdk_error("DescribeInstances", e))?;
            out.extend(resp.reservations().iter().flat_map(|r| r.instances()).filter(|i| self.owned(i)).cloned());
        }
        Ok(out)
    }

    /// The core's view of an EC2 instance. Its capacity and labels come from `shapes` (the instance types
    /// EC2 described); without them, or for a type they lack, the instance has no capacity or type labels.
    fn to_instance(&self, i: &ec2::Instance, shapes: Option<&HashMap<String, Shape>>) -> Result<Instance, CloudError> {
        let id = i
            .instance_id()
            .ok_or_else(|| CloudError::message(NAME, "DescribeInstances: an instance has no InstanceId"))?;
        let zone = i
            .placement()
            .and_then(|p| p.availability_zone())
            .ok_or_else(|| CloudError::message(NAME, format!("instance {id}: no Placement.AvailabilityZone")))?;
        let itype = i
            .instance_type()
            .map(|t| t.as_str().to_owned())
            .ok_or_else(|| CloudError::message(NAME, format!("instance {id}: no InstanceType")))?;
        let capacity_type = match i.instance_lifecycle() {
            Some(ec2::InstanceLifecycleType::Spot) => CapacityType::Spot,
            _ => CapacityType::OnDemand,
        };
        let state = match i.state().and_then(|s| s.name()) {
            Some(ec2::InstanceStateName::Pending) => InstanceState::Pending,
            Some(ec2::InstanceStateName::Running) => InstanceState::Running,
            Some(ec2::InstanceStateName::Terminated) => InstanceState::Terminated,
            _ => InstanceState::Stopping,
        };
        let tags = tags_of(i.tags());
        let launch_time =
            i.launch_time().and_then(|t| Timestamp::from_second(t.secs()).ok()).unwrap_or_else(|| self.now());
        let class = tags.get(TAG_NODE_CLASS).and_then(|n| self.state().classes.get(n).cloned());
        let (family, kubelet) = match class.as_deref() {
            Some(c) => (c.spec.family().unwrap_or(AmiFamily::Custom), c.spec.kubelet().unwrap_or_default()),
            None => (AmiFamily::Custom, Kubelet::default()),
        };
        let it = shapes.and_then(|s| s.get(&itype)).map(|s| {
            catalog::instance_type(
                s,
                self.root_volume_gib(class.as_deref()),
                &kubelet,
                family,
                self.settings.vm_memory_overhead,
                Vec::new(),
            )
        });
        let price = match capacity_type {
            CapacityType::Spot => {
                self.state().spot.as_ref().and_then(|s| s.value.get(&(itype.clone(), zone.to_owned())).copied())
            }
            _ => None,
        }
        .or_else(|| self.on_demand_prices().ok().and_then(|p| p.get(&itype).copied()));
        let mut node_labels = it.as_ref().map(|t| t.labels.clone()).unwrap_or_default();
        node_labels.insert(labels::INSTANCE_TYPE.to_owned(), itype.clone());
        node_labels.insert(labels::ZONE.to_owned(), zone.to_owned());
        node_labels.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
        node_labels.insert(labels::REGION.to_owned(), self.region.clone());
        Ok(Instance {
            provider_id: provider_id(zone, id),
            instance_type: itype,
            zone: zone.to_owned(),
            capacity_type,
            state,
            launch_time,
            capacity: it.as_ref().map_or(Resources::ZERO, |t| t.capacity.clone()),
            allocatable: it.as_ref().map(InstanceType::allocatable).unwrap_or(Resources::ZERO),
            image_id: i.image_id().map(str::to_owned),
            labels: node_labels,
            lease: None,
            node_pool: tags.get(TAG_NODE_POOL).cloned(),
            node_claim: tags.get(TAG_NODE_CLAIM).cloned(),
            price,
        })
    }

    fn launch_tags(&self, claim: &NodeClaim, class: &EC2NodeClass) -> Vec<ec2::Tag> {
        let mut tags: BTreeMap<String, String> = class.spec.tags.clone();
        tags.insert(self.cluster_tag(), "owned".into());
        tags.insert(TAG_EKS_CLUSTER.into(), self.settings.cluster_name.clone());
        tags.insert(TAG_NODE_POOL.into(), claim.node_pool().unwrap_or_default().to_owned());
        tags.insert(TAG_NODE_CLAIM.into(), claim.name().to_owned());
        tags.insert(TAG_NODE_CLASS.into(), class.name().to_owned());
        tags.insert(nodeclass::HASH_ANNOTATION.into(), class.static_hash());
        tags.iter().map(|(k, v)| tag(k, v)).collect()
    }

    /// Reads the interruption queue's URL (a URL setting is used as is).
    async fn queue_url(&self, queue: &str) -> Result<String, CloudError> {
        if queue.starts_with("http://") || queue.starts_with("https://") {
            return Ok(queue.to_owned());
        }
        if let Some(u) = self.state().queue_url.clone() {
            return Ok(u);
        }
        let resp = self
            .sqs
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(|e| sqs_error(&format!("GetQueueUrl {queue}"), e))?;
        let url = resp
            .queue_url()
            .ok_or_else(|| CloudError::message(NAME, format!("GetQueueUrl {queue}: no QueueUrl in the answer")))?
            .to_owned();
        self.state().queue_url = Some(url.clone());
        Ok(url)
    }
}

/// A `SpotPrice` as a price: a finite, non-negative number, or nothing.
fn spot_price(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0)
}

/// The shapes of `infos`, by name. An entry that cannot be read (a field EC2 always sends is missing) is
/// dropped with its reason logged: one odd type never takes the whole catalog down.
pub fn shapes_of(infos: &[ec2::InstanceTypeInfo]) -> HashMap<String, Shape> {
    let mut out = HashMap::new();
    for info in infos {
        match shape_of(info) {
            Ok(Some(s)) => {
                out.insert(s.name.clone(), s);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "dropping an instance type DescribeInstanceTypes describes incompletely")
            }
        }
    }
    out
}

/// A shape from one `DescribeInstanceTypes` entry; `None` for types tenon cannot run (no supported
/// architecture, no HVM).
pub fn shape_of(info: &ec2::InstanceTypeInfo) -> Result<Option<Shape>, CloudError> {
    let name = info
        .instance_type()
        .map(|t| t.as_str().to_owned())
        .ok_or_else(|| CloudError::message(NAME, "DescribeInstanceTypes: an entry has no InstanceType"))?;
    let missing = |field: &str| CloudError::message(NAME, format!("DescribeInstanceTypes: {name}: no {field}"));
    let architectures: Vec<String> = info
        .processor_info()
        .map(|p| p.supported_architectures())
        .unwrap_or_default()
        .iter()
        .filter_map(|a| kube_arch(a.as_str()))
        .map(str::to_owned)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let hvm = info.supported_virtualization_types().is_empty()
        || info.supported_virtualization_types().contains(&ec2::VirtualizationType::Hvm);
    if architectures.is_empty() || !hvm {
        return Ok(None);
    }
    let vcpu = info.v_cpu_info().and_then(|v| v.default_v_cpus()).ok_or_else(|| missing("VCpuInfo.DefaultVCpus"))?;
    let memory_mib = info.memory_info().and_then(|m| m.size_in_mib()).ok_or_else(|| missing("MemoryInfo.SizeInMiB"))?;
    let net = info.network_info().ok_or_else(|| missing("NetworkInfo"))?;
    // The VPC CNI uses the interfaces of the default network card (p4d.24xlarge: 15 of its 60).
    let default_card = net.default_network_card_index().unwrap_or(0);
    let max_enis = net
        .network_cards()
        .iter()
        .find(|c| c.network_card_index() == Some(default_card))
        .and_then(|c| c.maximum_network_interfaces())
        .or(net.maximum_network_interfaces())
        .ok_or_else(|| missing("NetworkInfo.MaximumNetworkInterfaces"))?;
    let ipv4 = net.ipv4_addresses_per_interface().ok_or_else(|| missing("NetworkInfo.Ipv4AddressesPerInterface"))?;
    let mut gpus = Vec::new();
    for g in info.gpu_info().map(|g| g.gpus()).unwrap_or_default() {
        gpus.push(Gpu {
            name: g.name().ok_or_else(|| missing("GpuInfo.Gpus[].Name"))?.to_owned(),
            manufacturer: g.manufacturer().ok_or_else(|| missing("GpuInfo.Gpus[].Manufacturer"))?.to_owned(),
            count: i64::from(g.count().ok_or_else(|| missing("GpuInfo.Gpus[].Count"))?),
            memory_mib: i64::from(g.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0)),
        });
    }
    Ok(Some(Shape {
        name,
        vcpu: i64::from(vcpu),
        memory_mib,
        architectures,
        gpus,
        max_enis: i64::from(max_enis),
        ipv4_per_eni: i64::from(ipv4),
        hypervisor: info.hypervisor().map(|h| h.as_str().to_owned()).unwrap_or_default(),
        bare_metal: info.bare_metal().unwrap_or(false),
        cpu_manufacturer: info.processor_info().and_then(|p| p.manufacturer()).map(str::to_owned),
        cpu_clock_mhz: info
            .processor_info()
            .and_then(|p| p.sustained_clock_speed_in_ghz())
            .filter(|g| g.is_finite() && *g > 0.0)
            .map(|g| (g * 1000.0).round() as i64),
        local_nvme_gb: info
            .instance_storage_info()
            .filter(|s| s.nvme_support().is_some_and(|n| n.as_str() != "unsupported"))
            .and_then(|s| s.total_size_in_gb()),
        ebs_bandwidth_mbps: info
            .ebs_info()
            .and_then(|e| e.ebs_optimized_info())
            .and_then(|o| o.maximum_bandwidth_in_mbps())
            .map(i64::from),
        encryption_in_transit: info.network_info().and_then(|n| n.encryption_in_transit_supported()),
    }))
}

/// One fleet override: an instance type in a zonal subnet, with the AMI it boots.
#[derive(Debug, Clone)]
struct Override {
    key: OfferingKey,
    subnet: String,
    ami: ResolvedAmi,
    price: f64,
}

impl AwsProvider {
    /// The overrides of a launch: the cheapest `max_instance_types` compatible types, each in every zone
    /// where its offering is compatible (one subnet per zone, the one with the most free addresses).
    fn plan_overrides(
        &self,
        claim: &NodeClaim,
        options: &LaunchOptions,
        types: &[InstanceType],
        status: &EC2NodeClassStatus,
    ) -> Result<(CapacityType, Vec<Override>), CloudError> {
        let requests = Resources::from_resource_list(&claim.spec.resources.requests).map_err(|e| {
            CloudError::Create { reason: "InvalidRequests".into(), message: format!("NodeClaim/{}: {e}", claim.name()) }
        })?;
        // One subnet per zone: the one with the most free addresses, counting those launches took since they
        // were read; one a launch found out of addresses goes last, so the zone keeps its other subnets.
        let free = {
            let st = self.state();
            let free_of = |s: &ResolvedSubnet| {
                let exhausted = st.subnet_exhausted.contains(&s.id);
                let used = st.subnet_used.get(&s.id).copied().unwrap_or(0);
                (!exhausted, s.available_ips.unwrap_or(0) - used)
            };
            status.subnets.iter().map(|s| (s.id.clone(), free_of(s))).collect::<HashMap<String, (bool, i32)>>()
        };
        let mut subnet_of: BTreeMap<&str, &ResolvedSubnet> = BTreeMap::new();
        for s in &status.subnets {
            let better = subnet_of.get(s.zone.as_str()).is_none_or(|cur| free[&s.id] > free[&cur.id]);
            if better {
                subnet_of.insert(&s.zone, s);
            }
        }
        let mut candidates: Vec<(&InstanceType, &Offering)> = Vec::new();
        for it in types {
            if !requests.fits(&it.allocatable()) {
                continue;
            }
            for o in &it.offerings {
                if o.available
                    && !options.is_unavailable(&o.key(&it.name))
                    && subnet_of.contains_key(o.zone.as_str())
                    && it.offering_meets(o, &claim.spec.requirements)
                {
                    candidates.push((it, o));
                }
            }
        }
        // GPU and bare-metal types serve the claims that need them: while an ordinary type fits, they are
        // left out (Karpenter's `filterExoticInstanceTypes`), so a CPU pod never lands on a GPU by price.
        // Neither filter applies to a claim with minValues, whose flexibility they could break.
        let min_values = claim.spec.requirements.iter().any(|r| r.min_values.is_some());
        let exotic = |it: &InstanceType| {
            it.labels.contains_key(catalog::LABEL_GPU_COUNT)
                || it.labels.get(catalog::LABEL_INSTANCE_SIZE).is_some_and(|s| s.contains("metal"))
        };
        if !min_values && candidates.iter().any(|(it, _)| !exotic(it)) {
            candidates.retain(|(it, _)| !exotic(it));
        }
        // Spot dearer than the cheapest on-demand offering the claim could have is never worth its
        // interruptions (Karpenter's `filterUnwantedSpot`); then spot when the claim allows it and any spot
        // offering is left.
        let cheapest_on_demand = candidates
            .iter()
            .filter(|(_, o)| o.capacity_type == CapacityType::OnDemand)
            .map(|(_, o)| o.price)
            .min_by(f64::total_cmp);
        candidates.retain(|(_, o)| {
            min_values || o.capacity_type != CapacityType::Spot || cheapest_on_demand.is_none_or(|od| o.price <= od)
        });
        let capacity_type = if candidates.iter().any(|(_, o)| o.capacity_type == CapacityType::Spot) {
            CapacityType::Spot
        } else {
            CapacityType::OnDemand
        };
        candidates.retain(|(_, o)| o.capacity_type == capacity_type);
        if candidates.is_empty() {
            return Err(CloudError::InsufficientCapacity {
                offerings: Vec::new(),
                message: format!("NodeClaim/{}: no compatible available offering", claim.name()),
            });
        }
        // The cheapest offering of each type ranks the type.
        let mut best: BTreeMap<&str, f64> = BTreeMap::new();
        for (it, o) in &candidates {
            let e = best.entry(it.name.as_str()).or_insert(o.price);
            *e = e.min(o.price);
        }
        let mut ranked: Vec<(&str, f64)> = best.into_iter().collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)));
        ranked.truncate(self.settings.max_instance_types.max(1));
        let chosen: BTreeSet<&str> = ranked.iter().map(|(n, _)| *n).collect();
        let rank: HashMap<&str, usize> = ranked.iter().enumerate().map(|(i, (n, _))| (*n, i)).collect();
        candidates.retain(|(it, _)| chosen.contains(it.name.as_str()));
        candidates.sort_by(|a, b| {
            a.1.price
                .total_cmp(&b.1.price)
                .then(rank[a.0.name.as_str()].cmp(&rank[b.0.name.as_str()]))
                .then(a.1.zone.cmp(&b.1.zone))
        });
        let mut out = Vec::new();
        for (it, o) in candidates {
            let gpu = it.labels.contains_key(catalog::LABEL_GPU_COUNT);
            let arch = it.labels.get(labels::ARCH).map(String::as_str).unwrap_or("amd64");
            let ami = status
                .amis
                .iter()
                .filter(|a| a.architecture == arch)
                .find(|a| a.nvidia == gpu)
                .or_else(|| status.amis.iter().find(|a| a.architecture == arch));
            let (Some(ami), Some(subnet)) = (ami, subnet_of.get(o.zone.as_str())) else { continue };
            out.push(Override { key: o.key(&it.name), subnet: subnet.id.clone(), ami: ami.clone(), price: o.price });
        }
        if out.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "NodeClaim/{}: no resolved AMI boots the compatible instance types",
                claim.name()
            )));
        }
        Ok((capacity_type, out))
    }

    async fn existing_for_claim(&self, claim: &NodeClaim) -> Result<Option<Instance>, CloudError> {
        let found = self.describe_owned(vec![filter(&format!("tag:{TAG_NODE_CLAIM}"), [claim.name()])]).await?;
        match found
            .iter()
            .find(|i| !matches!(i.state().and_then(|s| s.name()), Some(ec2::InstanceStateName::ShuttingDown)))
        {
            Some(i) => Ok(Some(self.to_instance(i, self.shapes().await.ok().as_deref())?)),
            None => Ok(None),
        }
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
        let name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        if let Some(existing) = self.existing_for_claim(claim).await? {
            return Ok(existing);
        }
        let types = self.types_for(&class, &status).await?;
        let (capacity_type, overrides) = self.plan_overrides(claim, options, &types, &status)?;

        // One launch template per AMI; each carries the overrides that boot it.
        let mut by_ami: BTreeMap<&str, Vec<&Override>> = BTreeMap::new();
        for o in &overrides {
            by_ami.entry(o.ami.id.as_str()).or_default().push(o);
        }
        let user_data = self.user_data(&class, claim, capacity_type).await?;
        let mut configs: Vec<(String, Vec<&Override>)> = Vec::with_capacity(by_ami.len());
        for ovs in by_ami.into_values() {
            let pool = claim.node_pool().unwrap_or_default();
            let lt = self.ensure_launch_template(&class, &status, &ovs[0].ami, &user_data, pool).await?;
            configs.push((lt, ovs));
        }
        let tags = self.launch_tags(claim, &class);
        let mut req = self
            .ec2
            .create_fleet()
            .set_context(class.spec.context.clone())
            .r#type(ec2::FleetType::Instant)
            .target_capacity_specification(
                ec2::TargetCapacitySpecificationRequest::builder()
                    .total_target_capacity(1)
                    .default_target_capacity_type(match capacity_type {
                        CapacityType::Spot => ec2::DefaultTargetCapacityType::Spot,
                        _ => ec2::DefaultTargetCapacityType::OnDemand,
                    })
                    .build(),
            );
        req = match capacity_type {
            CapacityType::Spot => req.spot_options(
                ec2::SpotOptionsRequest::builder()
                    .allocation_strategy(ec2::SpotAllocationStrategy::PriceCapacityOptimized)
                    .build(),
            ),
            _ => req.on_demand_options(
                ec2::OnDemandOptionsRequest::builder()
                    .allocation_strategy(ec2::FleetOnDemandAllocationStrategy::LowestPrice)
                    .build(),
            ),
        };
        for (lt, ovs) in &configs {
            let mut c = ec2::FleetLaunchTemplateConfigRequest::builder().launch_template_specification(
                ec2::FleetLaunchTemplateSpecificationRequest::builder()
                    .launch_template_name(lt)
                    .version("$Latest")
                    .build(),
            );
            for o in ovs {
                c = c.overrides(
                    ec2::FleetLaunchTemplateOverridesRequest::builder()
                        .instance_type(ec2::InstanceType::from(o.key.instance_type.as_str()))
                        .subnet_id(&o.subnet)
                        .availability_zone(&o.key.zone)
                        .image_id(&o.ami.id)
                        .build(),
                );
            }
            req = req.launch_template_configs(c.build());
        }
        for rt in [ec2::ResourceType::Instance, ec2::ResourceType::Volume] {
            req = req.tag_specifications(
                ec2::TagSpecification::builder().resource_type(rt).set_tags(Some(tags.clone())).build(),
            );
        }
        let resp = match req.send().await {
            Ok(r) => r,
            // A template deleted from outside: forgotten, so the retry makes it again.
            Err(e) if e.code().is_some_and(|c| c.contains("LaunchTemplate") && c.contains("NotFound")) => {
                let mut st = self.state();
                for (lt, _) in &configs {
                    st.templates.remove(lt);
                }
                return Err(CloudError::Create {
                    reason: "LaunchTemplateNotFound".into(),
                    message: format!(
                        "NodeClaim/{}: CreateFleet: a launch template is gone; made again on retry",
                        claim.name()
                    ),
                });
            }
            Err(e) => return Err(sdk_error(&format!("CreateFleet for NodeClaim/{}", claim.name()), e)),
        };

        // Per-override errors arrive even on success: the failed offerings are unavailable for a while.
        let mut failed: Vec<OfferingKey> = Vec::new();
        let mut other_errors: Vec<(String, String)> = Vec::new();
        for e in resp.errors() {
            let code = e.error_code().unwrap_or("Unknown").to_owned();
            let message = e.error_message().unwrap_or_default().to_owned();
            let ov = e.launch_template_and_overrides().and_then(|l| l.overrides());
            let ct = match e.lifecycle() {
                Some(ec2::InstanceLifecycle::Spot) => CapacityType::Spot,
                Some(ec2::InstanceLifecycle::OnDemand) => CapacityType::OnDemand,
                _ => capacity_type,
            };
            let key = ov.and_then(|o| Some(OfferingKey::new(o.instance_type()?.as_str(), o.availability_zone()?, ct)));
            if !UNFULFILLABLE.contains(&code.as_str()) {
                other_errors.push((code, message));
                continue;
            }
            match (code.as_str(), &key) {
                ("VcpuLimitExceeded", Some(k)) => self.block_quota(ct, catalog::quota_bucket(&k.instance_type)),
                ("MaxSpotInstanceCountExceeded" | "AuthFailure.ServiceLinkedRoleCreationNotPermitted", _) => {
                    self.block_quota(CapacityType::Spot, "*")
                }
                ("InsufficientFreeAddressesInSubnet", _) => {
                    if let Some(subnet) = ov.and_then(|o| o.subnet_id()) {
                        self.state().subnet_exhausted.insert(subnet.to_owned());
                    }
                }
                _ => {}
            }
            if let Some(k) = key {
                // A subnet out of addresses blocks its zone only when the zone has no other subnet left.
                let other_subnet = code == "InsufficientFreeAddressesInSubnet" && {
                    let st = self.state();
                    status.subnets.iter().any(|s| s.zone == k.zone && !st.subnet_exhausted.contains(&s.id))
                };
                if !other_subnet {
                    self.mark_unavailable(&k);
                }
                if !failed.contains(&k) {
                    failed.push(k);
                }
            }
        }
        let launched = resp.instances().iter().find_map(|i| {
            let id = i.instance_ids().first()?;
            Some((i, id.clone()))
        });
        let Some((fi, id)) = launched else {
            if other_errors.is_empty() {
                let message = format!(
                    "NodeClaim/{}: CreateFleet launched nothing: {}",
                    claim.name(),
                    resp.errors().iter().filter_map(|e| e.error_message()).collect::<Vec<_>>().join("; ")
                );
                let offerings =
                    if failed.is_empty() { overrides.iter().map(|o| o.key.clone()).collect() } else { failed };
                return Err(CloudError::InsufficientCapacity { offerings, message });
            }
            let (reason, message) = other_errors.swap_remove(0);
            return Err(CloudError::Create {
                reason,
                message: format!("NodeClaim/{}: CreateFleet: {message}", claim.name()),
            });
        };
        let ov = fi.launch_template_and_overrides().and_then(|l| l.overrides());
        let itype = fi
            .instance_type()
            .or_else(|| ov.and_then(|o| o.instance_type()))
            .map(|t| t.as_str().to_owned())
            .ok_or_else(|| CloudError::message(NAME, format!("CreateFleet: instance {id} has no InstanceType")))?;
        let zone = ov
            .and_then(|o| o.availability_zone().map(str::to_owned))
            .or_else(|| {
                let subnet = ov.and_then(|o| o.subnet_id())?;
                status.subnets.iter().find(|s| s.id == subnet).map(|s| s.zone.clone())
            })
            .ok_or_else(|| CloudError::message(NAME, format!("CreateFleet: instance {id}: no zone in the answer")))?;
        let ct = match fi.lifecycle() {
            Some(ec2::InstanceLifecycle::Spot) => CapacityType::Spot,
            Some(ec2::InstanceLifecycle::OnDemand) => CapacityType::OnDemand,
            _ => capacity_type,
        };
        let chosen =
            overrides.iter().find(|o| o.key.instance_type == itype && o.key.zone == zone && o.key.capacity_type == ct);
        if let Some(subnet) =
            ov.and_then(|o| o.subnet_id()).map(str::to_owned).or_else(|| chosen.map(|c| c.subnet.clone()))
        {
            *self.state().subnet_used.entry(subnet).or_default() += 1;
        }
        let it = types.iter().find(|t| t.name == itype);
        let mut node_labels = it.map(|t| t.labels.clone()).unwrap_or_default();
        node_labels.insert(labels::INSTANCE_TYPE.to_owned(), itype.clone());
        node_labels.insert(labels::ZONE.to_owned(), zone.clone());
        node_labels.insert(labels::CAPACITY_TYPE.to_owned(), ct.as_str().to_owned());
        node_labels.insert(labels::REGION.to_owned(), self.region.clone());
        tracing::info!(claim = claim.name(), instance = %id, instance_type = %itype, zone = %zone, capacity_type = %ct, "launched");
        Ok(Instance {
            provider_id: provider_id(&zone, &id),
            instance_type: itype.clone(),
            zone,
            capacity_type: ct,
            state: InstanceState::Pending,
            launch_time: self.now(),
            capacity: it.map_or(Resources::ZERO, |t| t.capacity.clone()),
            allocatable: it.map(InstanceType::allocatable).unwrap_or(Resources::ZERO),
            image_id: chosen.map(|o| o.ami.id.clone()).or_else(|| ov.and_then(|o| o.image_id().map(str::to_owned))),
            labels: node_labels,
            lease: None,
            node_pool: claim.node_pool().map(str::to_owned),
            node_claim: Some(claim.name().to_owned()),
            price: chosen.map(|o| o.price),
        })
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id() else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        let id = instance_id(pid)?;
        let i = self.describe(id).await?;
        match i.state().and_then(|s| s.name()) {
            Some(ec2::InstanceStateName::Terminated) => return Err(CloudError::NotFound(pid.to_owned())),
            Some(ec2::InstanceStateName::ShuttingDown) => return Ok(()),
            _ => {}
        }
        match self.ec2.terminate_instances().instance_ids(id).send().await {
            Ok(_) => Ok(()),
            Err(e) => Err(sdk_error(&format!("TerminateInstances {id}"), e)),
        }
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        let id = instance_id(provider_id)?;
        let i = self.describe(id).await?;
        if matches!(i.state().and_then(|s| s.name()), Some(ec2::InstanceStateName::Terminated)) {
            return Err(CloudError::NotFound(provider_id.to_owned()));
        }
        self.to_instance(&i, self.shapes().await.ok().as_deref())
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let instances = self.describe_owned(Vec::new()).await?;
        // The shapes are read once for the whole listing (and not at all for an empty one).
        let shapes = if instances.is_empty() { None } else { self.shapes().await.ok() };
        instances.iter().map(|i| self.to_instance(i, shapes.as_deref())).collect()
    }

    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        let Some(pid) = claim.provider_id() else { return Ok(None) };
        let name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        let i = self.describe(instance_id(pid)?).await?;
        let tags = tags_of(i.tags());
        if tags.get(nodeclass::HASH_ANNOTATION).is_some_and(|h| *h != class.static_hash()) {
            return Ok(Some(DriftReason("NodeClassDrift".into())));
        }
        let image = claim.status.as_ref().and_then(|s| s.image_id.clone()).or_else(|| i.image_id().map(str::to_owned));
        if let Some(image) = image
            && !status.amis.iter().any(|a| a.id == image)
        {
            return Ok(Some(DriftReason("AMIDrift".into())));
        }
        // An instance whose groups EC2 does not report is not judged on them.
        let groups: BTreeSet<&str> = i.security_groups().iter().filter_map(|g| g.group_id()).collect();
        let wanted: BTreeSet<&str> = status.security_groups.iter().map(|g| g.id.as_str()).collect();
        if !groups.is_empty() && groups != wanted {
            return Ok(Some(DriftReason("SecurityGroupDrift".into())));
        }
        if let Some(subnet) = i.subnet_id()
            && !status.subnets.iter().any(|s| s.id == subnet)
        {
            return Ok(Some(DriftReason("SubnetDrift".into())));
        }
        Ok(None)
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        default_repair_policies()
    }

    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id() else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        let id = instance_id(pid)?;
        self.describe(id).await?;
        self.ec2
            .reboot_instances()
            .instance_ids(id)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("RebootInstances {id}"), e))?;
        Ok(())
    }

    async fn interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        let Some(queue) = self.settings.interruption_queue.clone() else { return Ok(Vec::new()) };
        let url = self.queue_url(&queue).await?;
        let mut notices: Vec<events::Notice> = Vec::new();
        let mut handles: Vec<String> = Vec::new();
        let wait = i32::try_from(self.settings.interruption_wait.as_secs().min(20)).unwrap_or(0);
        // A bounded number of batches per call, so one call never runs unbounded.
        for _ in 0..10 {
            let resp = self
                .sqs
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .wait_time_seconds(if handles.is_empty() { wait } else { 0 })
                .visibility_timeout(20)
                .send()
                .await
                .map_err(|e| sqs_error(&format!("ReceiveMessage {queue}"), e))?;
            let messages = resp.messages();
            if messages.is_empty() {
                break;
            }
            for m in messages {
                match events::parse(m.body().unwrap_or_default()) {
                    Ok(n) => notices.extend(n),
                    Err(e) => tracing::warn!(
                        queue = %queue,
                        message_id = m.message_id().unwrap_or_default(),
                        error = %e,
                        "dropping an unreadable interruption message"
                    ),
                }
                handles.extend(m.receipt_handle().map(str::to_owned));
            }
        }
        // Resolved before the messages are deleted: if the lookup fails, they come back after their
        // visibility timeout.
        let found = self.interruptions_of(notices).await?;
        // A delete that fails leaves its message to come back after its visibility timeout (acted on
        // twice, harmlessly); the interruptions already read are still returned.
        for handle in handles {
            if let Err(e) = self.sqs.delete_message().queue_url(&url).receipt_handle(handle).send().await {
                tracing::warn!(queue = %queue, error = %sqs_error("DeleteMessage", e), "an interruption message stays queued");
            }
        }
        Ok(found)
    }
}

impl AwsProvider {
    /// Interruption notices with provider ids, for this cluster's instances only.
    async fn interruptions_of(&self, notices: Vec<events::Notice>) -> Result<Vec<Interruption>, CloudError> {
        if notices.is_empty() {
            return Ok(Vec::new());
        }
        // Provider ids carry the zone: look the instances up (ours only).
        let ids: BTreeSet<String> = notices.iter().map(|n| n.instance_id.clone()).collect();
        let mut zone_of: HashMap<String, String> = HashMap::new();
        let resp = self.ec2.describe_instances().set_instance_ids(Some(ids.iter().cloned().collect())).send().await;
        let instances: Vec<ec2::Instance> = match resp {
            Ok(r) => r.reservations().iter().flat_map(|r| r.instances()).cloned().collect(),
            // One unknown id fails the whole call: look the others up one by one.
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {
                let mut found = Vec::new();
                for id in &ids {
                    match self.describe(id).await {
                        Ok(i) => found.push(i),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
                found
            }
            Err(e) => return Err(sdk_error("DescribeInstances for interruption events", e)),
        };
        for i in &instances {
            if let (true, Some(id), Some(zone)) =
                (self.owned(i), i.instance_id(), i.placement().and_then(|p| p.availability_zone()))
            {
                zone_of.insert(id.to_owned(), zone.to_owned());
            }
        }
        Ok(notices
            .into_iter()
            .filter_map(|n| {
                let zone = zone_of.get(&n.instance_id)?;
                Some(Interruption { provider_id: provider_id(zone, &n.instance_id), kind: n.kind })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tenon_core::api::NodeSelectorRequirement;
    use tenon_core::api::{NodeClaimSpec, Operator};

    fn provider() -> AwsProvider {
        let config = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        AwsProvider::from_sdk_config(AwsSettings::new("unit"), &config)
    }

    fn shape(name: &str, vcpu: i64, gpus: i64) -> Shape {
        Shape {
            name: name.into(),
            vcpu,
            memory_mib: vcpu * 4096,
            architectures: vec!["amd64".into()],
            gpus: (gpus > 0)
                .then(|| Gpu { name: "L4".into(), manufacturer: "NVIDIA".into(), count: gpus, memory_mib: 22_888 })
                .into_iter()
                .collect(),
            max_enis: 4,
            ipv4_per_eni: 15,
            hypervisor: "nitro".into(),
            bare_metal: false,
            ..Default::default()
        }
    }

    fn status() -> EC2NodeClassStatus {
        let subnet = |id: &str, zone: &str, ips| ResolvedSubnet {
            id: id.into(),
            zone: zone.into(),
            zone_id: None,
            available_ips: Some(ips),
        };
        let ami = |id: &str, nvidia| ResolvedAmi {
            id: id.into(),
            name: None,
            architecture: "amd64".into(),
            nvidia,
            creation_date: None,
        };
        EC2NodeClassStatus {
            subnets: vec![subnet("subnet-a1", "a", 10), subnet("subnet-a2", "a", 200), subnet("subnet-b", "b", 5)],
            security_groups: vec![ResolvedSecurityGroup { id: "sg-1".into(), name: None }],
            amis: vec![ami("ami-std", false), ami("ami-gpu", true)],
            instance_profile: None,
            conditions: Vec::new(),
        }
    }

    #[test]
    fn gpu_and_metal_types_are_left_to_the_claims_that_need_them() {
        let p = provider();
        let at = |price: f64| vec![Offering::new("a", CapacityType::OnDemand, price)];
        let cheap_gpu = catalog::instance_type(
            &shape("g4dn.xlarge", 4, 1),
            20,
            &Kubelet::default(),
            AmiFamily::Al2023,
            0.0,
            at(0.5),
        );
        let metal =
            catalog::instance_type(&shape("m5.metal", 96, 0), 20, &Kubelet::default(), AmiFamily::Al2023, 0.0, at(0.6));
        let cpu =
            catalog::instance_type(&shape("m5.xlarge", 4, 0), 20, &Kubelet::default(), AmiFamily::Al2023, 0.0, at(1.0));
        let types = vec![cheap_gpu.clone(), metal, cpu];
        let claim = NodeClaim::new("c", NodeClaimSpec::default());
        let (_, overrides) = p.plan_overrides(&claim, &LaunchOptions::default(), &types, &status()).unwrap();
        let names: BTreeSet<&str> = overrides.iter().map(|o| o.key.instance_type.as_str()).collect();
        assert_eq!(names, BTreeSet::from(["m5.xlarge"]), "the GPU and metal types are cheaper, but not wanted");
        // A claim asking for a GPU gets the GPU type.
        let mut gpu_claim = NodeClaim::new("g", NodeClaimSpec::default());
        gpu_claim.spec.resources.requests =
            Resources::ZERO.with(tenon_core::resources::ResourceName::NVIDIA_GPU, 1).to_resource_list();
        let (_, overrides) = p.plan_overrides(&gpu_claim, &LaunchOptions::default(), &[cheap_gpu], &status()).unwrap();
        assert_eq!(overrides[0].key.instance_type, "g4dn.xlarge");
    }

    #[test]
    fn subnets_are_chosen_by_free_addresses_less_those_launches_took_and_exhausted_ones_go_last() {
        let p = provider();
        let it = catalog::instance_type(
            &shape("m5.large", 2, 0),
            20,
            &Kubelet::default(),
            AmiFamily::Al2023,
            0.0,
            vec![Offering::new("a", CapacityType::OnDemand, 0.1)],
        );
        let claim = NodeClaim::new("c", NodeClaimSpec::default());
        let subnet_in_a = || {
            let (_, o) =
                p.plan_overrides(&claim, &LaunchOptions::default(), std::slice::from_ref(&it), &status()).unwrap();
            o[0].subnet.clone()
        };
        assert_eq!(subnet_in_a(), "subnet-a2", "the most free addresses");
        // Launches since the count was read took most of a2's addresses.
        let free = |id: &str| status().subnets.iter().find(|s| s.id == id).unwrap().available_ips.unwrap();
        p.state().subnet_used.insert("subnet-a2".into(), free("subnet-a2") - free("subnet-a1") + 1);
        assert_eq!(subnet_in_a(), "subnet-a1");
        p.state().subnet_used.clear();
        // A launch found a2 out of addresses: a1 serves the zone until the counts are read again.
        p.state().subnet_exhausted.insert("subnet-a2".into());
        assert_eq!(subnet_in_a(), "subnet-a1");
        p.state().subnet_exhausted.insert("subnet-a1".into());
        assert!(!subnet_in_a().is_empty(), "a zone whose subnets are all exhausted is still tried");
    }

    #[test]
    fn spot_dearer_than_the_cheapest_on_demand_is_never_launched() {
        let p = provider();
        let it = |name: &str, od: f64, spot: f64| {
            let offerings =
                vec![Offering::new("a", CapacityType::OnDemand, od), Offering::new("a", CapacityType::Spot, spot)];
            catalog::instance_type(&shape(name, 2, 0), 20, &Kubelet::default(), AmiFamily::Al2023, 0.0, offerings)
        };
        let claim = NodeClaim::new("c", NodeClaimSpec::default());
        let types = vec![it("dear.large", 0.40, 0.50), it("cheap.large", 1.00, 0.30)];
        let (ct, overrides) = p.plan_overrides(&claim, &LaunchOptions::default(), &types, &status()).unwrap();
        assert_eq!(ct, CapacityType::Spot);
        let names: Vec<&str> = overrides.iter().map(|o| o.key.instance_type.as_str()).collect();
        assert_eq!(names, ["cheap.large"], "dear.large's spot (0.50) costs more than its on-demand (0.40)");
        // When every spot offering is dearer, the claim launches on-demand.
        let types = vec![it("dear.large", 0.40, 0.50)];
        let (ct, _) = p.plan_overrides(&claim, &LaunchOptions::default(), &types, &status()).unwrap();
        assert_eq!(ct, CapacityType::OnDemand);
    }

    #[test]
    fn overrides_are_the_cheapest_sixty_types_in_every_zonal_subnet() {
        let p = provider();
        // 100 types, each on-demand and spot in zones a and b; type i costs i + 1 (spot: half).
        let types: Vec<InstanceType> = (0..100)
            .map(|i| {
                let offerings = ["a", "b"]
                    .iter()
                    .flat_map(|z| {
                        let (od, spot) = (100.0 + f64::from(i), f64::from(i + 1) / 2.0);
                        [Offering::new(*z, CapacityType::OnDemand, od), Offering::new(*z, CapacityType::Spot, spot)]
                    })
                    .collect();
                catalog::instance_type(
                    &shape(&format!("t{i:03}.large"), 2, 0),
                    20,
                    &Kubelet::default(),
                    AmiFamily::Al2023,
                    0.0,
                    offerings,
                )
            })
            .collect();
        let claim = NodeClaim::new("c", NodeClaimSpec::default());
        let (ct, overrides) = p.plan_overrides(&claim, &LaunchOptions::default(), &types, &status()).unwrap();
        assert_eq!(ct, CapacityType::Spot, "spot when allowed");
        let names: BTreeSet<&str> = overrides.iter().map(|o| o.key.instance_type.as_str()).collect();
        assert_eq!(names.len(), 60);
        assert!(names.contains("t000.large") && names.contains("t059.large") && !names.contains("t060.large"));
        assert_eq!(overrides.len(), 120, "each type in both zones");
        assert_eq!(overrides[0].key.instance_type, "t000.large");
        assert!(overrides.iter().filter(|o| o.key.zone == "a").all(|o| o.subnet == "subnet-a2"), "most free IPs");
        assert!(overrides.windows(2).all(|w| w[0].price <= w[1].price), "cheapest first");

        // On-demand only, with one offering unavailable.
        let mut claim = claim;
        claim.spec.requirements = vec![
            NodeSelectorRequirement::new(labels::CAPACITY_TYPE, Operator::In, ["on-demand"]),
            NodeSelectorRequirement::new(labels::INSTANCE_TYPE, Operator::In, ["t000.large"]),
        ];
        let opts = LaunchOptions {
            unavailable: vec![OfferingKey::new("t000.large", "a", CapacityType::OnDemand)],
            ignore_unavailable: vec![],
        };
        let (ct, overrides) = p.plan_overrides(&claim, &opts, &types, &status()).unwrap();
        assert_eq!(ct, CapacityType::OnDemand);
        assert_eq!(overrides.len(), 1);
        assert_eq!((overrides[0].key.zone.as_str(), overrides[0].subnet.as_str()), ("b", "subnet-b"));
        // Nothing left: insufficient capacity, not a crash.
        let opts = LaunchOptions {
            unavailable: vec![
                OfferingKey::new("t000.large", "a", CapacityType::OnDemand),
                OfferingKey::new("t000.large", "b", CapacityType::OnDemand),
            ],
            ignore_unavailable: vec![],
        };
        assert!(matches!(
            p.plan_overrides(&claim, &opts, &types, &status()),
            Err(CloudError::InsufficientCapacity { .. })
        ));
    }

    #[test]
    fn gpu_types_boot_the_nvidia_image() {
        let p = provider();
        let offerings = vec![Offering::new("a", CapacityType::OnDemand, 1.0)];
        let types = vec![
            catalog::instance_type(
                &shape("g6.xlarge", 4, 1),
                20,
                &Kubelet::default(),
                AmiFamily::Al2023,
                0.0,
                offerings.clone(),
            ),
            catalog::instance_type(
                &shape("m6i.xlarge", 4, 0),
                20,
                &Kubelet::default(),
                AmiFamily::Al2023,
                0.0,
                offerings,
            ),
        ];
        let ami_of = |claim: &NodeClaim, t: &str| {
            let (_, overrides) = p.plan_overrides(claim, &LaunchOptions::default(), &types, &status()).unwrap();
            overrides.iter().find(|o| o.key.instance_type == t).unwrap().ami.id.clone()
        };
        let mut gpu = NodeClaim::new("g", NodeClaimSpec::default());
        gpu.spec.resources.requests =
            Resources::ZERO.with(tenon_core::resources::ResourceName::NVIDIA_GPU, 1).to_resource_list();
        assert_eq!(ami_of(&gpu, "g6.xlarge"), "ami-gpu");
        assert_eq!(ami_of(&NodeClaim::new("c", NodeClaimSpec::default()), "m6i.xlarge"), "ami-std");
    }

    #[test]
    fn spot_prices_must_be_finite_and_non_negative() {
        assert_eq!(spot_price("0.4589"), Some(0.4589));
        assert_eq!(spot_price(" 0 "), Some(0.0));
        for bad in ["nan", "NaN", "inf", "-inf", "-0.1", "1e999", "cheap", ""] {
            assert_eq!(spot_price(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_incomplete_instance_type_is_dropped_and_the_rest_remain() {
        let info = |name: &str, memory: Option<i64>| {
            let mut b = ec2::InstanceTypeInfo::builder()
                .instance_type(ec2::InstanceType::from(name))
                .processor_info(
                    ec2::ProcessorInfo::builder().supported_architectures(ec2::ArchitectureType::X8664).build(),
                )
                .v_cpu_info(ec2::VCpuInfo::builder().default_v_cpus(2).build())
                .network_info(
                    ec2::NetworkInfo::builder().maximum_network_interfaces(3).ipv4_addresses_per_interface(10).build(),
                );
            if let Some(m) = memory {
                b = b.memory_info(ec2::MemoryInfo::builder().size_in_mib(m).build());
            }
            b.build()
        };
        let shapes = shapes_of(&[info("m5.large", Some(8192)), info("x9.odd", None), info("c5.large", Some(4096))]);
        let mut names: Vec<&str> = shapes.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["c5.large", "m5.large"]);
        assert!(shape_of(&info("x9.odd", None)).unwrap_err().to_string().contains("MemoryInfo.SizeInMiB"));
    }

    #[test]
    fn provider_ids_round_trip() {
        assert_eq!(provider_id("us-east-1a", "i-0abc"), "aws:///us-east-1a/i-0abc");
        assert_eq!(instance_id("aws:///us-east-1a/i-0abc").unwrap(), "i-0abc");
        assert!(instance_id("aws:///us-east-1a/").unwrap_err().is_not_found());
    }
}
