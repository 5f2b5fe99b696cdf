//! The AWS provider against moto's EC2 and SQS server (`scripts/peers/moto.sh`, started by
//! `scripts/test.sh`).
//!
//! Two kinds of tests live here, and each says which it is:
//! - **moto**: everything the provider sees is moto's own behaviour.
//! - **fault-injected**: moto plus tenon's switchboard (`scripts/peers/moto_faults.py`, same server) for
//!   what moto never produces: per-override `Errors[]` of `CreateFleet` (capacity and quota errors) and
//!   real-looking spot prices. Those tests check tenon's reading of AWS's documented shapes, not moto.
//!
//! Tests run in parallel against one server: each builds its own VPC, subnets, security group and AMIs,
//! and its own cluster name, so none sees another's instances or faults.
#![cfg(feature = "aws")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::types as ec2;
use tenon_core::api::{
    NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassRef, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator,
    labels,
};
use tenon_core::clock::VirtualClock;
use tenon_core::cloud::conformance::{self, Harness};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DynCloudProvider, InterruptionKind, LaunchOptions, OfferingKey,
    UnavailableOfferings,
};
use tenon_core::resources::ResourceName;
use tenon_providers::aws::catalog::{self, kube_reserved_cpu_millis, kube_reserved_memory_mib, max_pods};
use tenon_providers::aws::{AwsProvider, AwsSettings, EC2NodeClass, TAG_NODE_CLAIM, TAG_NODE_CLASS, TAG_NODE_POOL};

const REGION: &str = "us-east-1";
const TYPES: [&str; 5] = ["c5.large", "m5.large", "m5.xlarge", "g5.xlarge", "p4d.24xlarge"];
const MIB: i64 = 1 << 20;

fn endpoint() -> String {
    std::env::var("TENON_MOTO_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "TENON_MOTO_ENDPOINT is not set: the AWS provider tests need moto's server. Run scripts/test.sh, or \
             eval \"$(scripts/peers/moto.sh start /tmp/moto)\" first"
        )
    })
}

async fn sdk_config() -> aws_config::SdkConfig {
    sdk_config_in(REGION).await
}

async fn sdk_config_in(region: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_owned()))
        .endpoint_url(endpoint())
        .credentials_provider(aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "tenon-tests"))
        .load()
        .await
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One test's private corner of moto: a VPC with a subnet in us-east-1a and one in us-east-1b, a security
/// group, a standard and an NVIDIA AMI, and a cluster name.
struct Env {
    region: &'static str,
    cluster: String,
    ec2: aws_sdk_ec2::Client,
    sqs: aws_sdk_sqs::Client,
    subnets: Vec<(String, String)>,
    security_group: String,
    ami: String,
    gpu_ami: String,
}

impl Env {
    async fn new(test: &str) -> Self {
        Self::in_region(test, REGION).await
    }

    /// The same corner of moto in `region` (zones `<region>a` and `<region>b`).
    async fn in_region(test: &str, region: &'static str) -> Self {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let cluster = format!("{test}-{}-{n}", std::process::id());
        let conf = sdk_config_in(region).await;
        let ec2 = aws_sdk_ec2::Client::new(&conf);
        let sqs = aws_sdk_sqs::Client::new(&conf);
        let tags = |rt: ec2::ResourceType| {
            ec2::TagSpecification::builder()
                .resource_type(rt)
                .tags(ec2::Tag::builder().key("tenon-test").value(&cluster).build())
                .build()
        };
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .tag_specifications(tags(ec2::ResourceType::Vpc))
            .send()
            .await
            .unwrap();
        let vpc_id = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
        let mut subnets = Vec::new();
        for (i, zone) in [format!("{region}a"), format!("{region}b")].into_iter().enumerate() {
            let s = ec2
                .create_subnet()
                .vpc_id(&vpc_id)
                .cidr_block(format!("10.0.{i}.0/24"))
                .availability_zone(&zone)
                .tag_specifications(tags(ec2::ResourceType::Subnet))
                .send()
                .await
                .unwrap();
            subnets.push((s.subnet().unwrap().subnet_id().unwrap().to_owned(), zone));
        }
        let sg = ec2
            .create_security_group()
            .group_name(format!("nodes-{cluster}"))
            .description("tenon test nodes")
            .vpc_id(&vpc_id)
            .tag_specifications(tags(ec2::ResourceType::SecurityGroup))
            .send()
            .await
            .unwrap();
        let security_group = sg.group_id().unwrap().to_owned();
        let ami = register_image_in(&ec2, region, &format!("tenon-standard-{cluster}"), &cluster).await;
        let gpu_ami = register_image_in(&ec2, region, &format!("tenon-nvidia-{cluster}"), &cluster).await;
        Self { region, cluster, ec2, sqs, subnets, security_group, ami, gpu_ami }
    }

    fn class_name(&self) -> String {
        format!("class-{}", self.cluster)
    }

    /// A NodeClass selecting this test's subnets and group by tag, and its AMIs by tag.
    fn node_class(&self) -> EC2NodeClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": self.class_name()},
            "spec": {
                "amiSelectorTerms": [{"tags": {"tenon-test": self.cluster}}],
                "subnetSelectorTerms": [{"tags": {"tenon-test": self.cluster}}],
                "securityGroupSelectorTerms": [{"tags": {"tenon-test": self.cluster}}],
                "userData": "#!/bin/bash\necho hello",
                "blockDeviceMappings": [{"deviceName": "/dev/xvda", "rootVolume": true,
                    "ebs": {"volumeSize": "80Gi", "volumeType": "gp3", "encrypted": true}}],
                "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
                "tags": {"team": "ml"}
            }
        }))
        .unwrap()
    }

    fn settings(&self) -> AwsSettings {
        let mut s = AwsSettings::new(&self.cluster);
        s.region = Some(self.region.into());
        s.endpoint_url = Some(endpoint());
        s.instance_type_patterns = TYPES.iter().map(|t| (*t).to_owned()).collect();
        s
    }

    async fn provider_with(&self, settings: AwsSettings) -> AwsProvider {
        let p = AwsProvider::from_sdk_config(settings, &sdk_config_in(self.region).await);
        p.apply_node_class(self.node_class()).unwrap();
        p
    }

    async fn provider(&self) -> AwsProvider {
        self.provider_with(self.settings()).await
    }

    fn class_ref(&self) -> NodeClassRef {
        NodeClassRef { group: "karpenter.k8s.aws".into(), kind: "EC2NodeClass".into(), name: self.class_name() }
    }

    fn pool(&self) -> NodePool {
        let mut pool = NodePool::new("default", NodePoolSpec::default());
        pool.spec.template.spec.node_class_ref = Some(self.class_ref());
        pool
    }

    fn claim(&self, name: &str, reqs: Vec<NodeSelectorRequirement>) -> NodeClaim {
        let mut c = NodeClaim::new(
            name,
            NodeClaimSpec { requirements: reqs, node_class_ref: Some(self.class_ref()), ..Default::default() },
        );
        c.metadata.uid = Some(format!("uid-{name}-{}", self.cluster));
        c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
        c
    }

    async fn describe(&self, id: &str) -> ec2::Instance {
        let r = self.ec2.describe_instances().instance_ids(id).send().await.unwrap();
        r.reservations()[0].instances()[0].clone()
    }

    async fn fault(&self, path: &str, body: serde_json::Value) {
        let status = post(&format!("{}{path}", endpoint()), &body.to_string()).await;
        assert!(status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200"), "{path}: {status}");
    }

    /// Fault-injected: every override of `instance_type` in this test's subnets fails with `code`.
    async fn fail_fleet_overrides(&self, instance_type: Option<&str>, zone: Option<&str>, code: &str) {
        let rules: Vec<serde_json::Value> = self
            .subnets
            .iter()
            .filter(|(_, z)| zone.is_none_or(|want| want == z))
            .map(|(s, _)| serde_json::json!({"subnet_id": s, "instance_type": instance_type, "code": code}))
            .collect();
        self.fault("/_fault/capacity", serde_json::json!({ "rules": rules })).await;
    }

    /// An EKS cluster of this test's name in moto (Kubernetes `version`, or moto's default), in its first
    /// subnet; what `DescribeCluster` then says of it.
    async fn create_eks_cluster(&self, version: Option<&str>) -> aws_sdk_eks::types::Cluster {
        let eks = aws_sdk_eks::Client::new(&sdk_config_in(self.region).await);
        eks.create_cluster()
            .name(&self.cluster)
            .set_version(version.map(str::to_owned))
            .role_arn("arn:aws:iam::123456789012:role/eks-cluster")
            .resources_vpc_config(
                aws_sdk_eks::types::VpcConfigRequest::builder().subnet_ids(self.subnets[0].0.clone()).build(),
            )
            .send()
            .await
            .unwrap();
        let described = eks.describe_cluster().name(&self.cluster).send().await.unwrap();
        described.cluster().unwrap().clone()
    }

    async fn clear_faults(&self) {
        let ids: Vec<&String> = self.subnets.iter().map(|(s, _)| s).collect();
        self.fault("/_fault/clear", serde_json::json!({ "subnet_ids": ids })).await;
    }
}

/// A bundled x86_64 image of moto's (Amazon Linux, HVM) to copy: RegisterImage in moto leaves the
/// architecture empty, CopyImage keeps the source's.
const SOURCE_AMI: &str = "ami-760aaa0f";

async fn register_image(ec2: &aws_sdk_ec2::Client, name: &str, cluster: &str) -> String {
    register_image_in(ec2, REGION, name, cluster).await
}

async fn register_image_in(ec2: &aws_sdk_ec2::Client, region: &str, name: &str, cluster: &str) -> String {
    let copied = ec2.copy_image().source_image_id(SOURCE_AMI).source_region(region).name(name).send().await.unwrap();
    let id = copied.image_id().unwrap().to_owned();
    ec2.create_tags()
        .resources(&id)
        .tags(ec2::Tag::builder().key("tenon-test").value(cluster).build())
        .send()
        .await
        .unwrap();
    id
}

/// A minimal HTTP/1.1 POST to the fault switchboard; returns the status line.
async fn post(url: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let url = url.to_owned();
    let body = body.to_owned();
    tokio::task::spawn_blocking(move || {
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_at(rest.find('/').unwrap());
        let mut s = std::net::TcpStream::connect(host).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.lines().next().unwrap_or_default().to_owned()
    })
    .await
    .unwrap()
}

fn req(key: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement::new(key, Operator::In, values.iter().copied())
}

fn with_provider_id(mut claim: NodeClaim, pid: &str) -> NodeClaim {
    claim.status = Some(NodeClaimStatus { provider_id: Some(pid.to_owned()), ..Default::default() });
    claim
}

fn tags(i: &ec2::Instance) -> BTreeMap<String, String> {
    i.tags().iter().map(|t| (t.key().unwrap().to_owned(), t.value().unwrap_or_default().to_owned())).collect()
}

// ---------------------------------------------------------------------------------------------------------

struct MotoHarness {
    env: Env,
    provider: Arc<AwsProvider>,
}

#[async_trait]
impl Harness for MotoHarness {
    fn provider(&self) -> DynCloudProvider {
        self.provider.clone()
    }
    fn node_class_ref(&self) -> Option<NodeClassRef> {
        Some(self.env.class_ref())
    }
    fn max_polls(&self) -> usize {
        40
    }
    /// Fault-injected: the switchboard fails the offering's overrides with InsufficientInstanceCapacity.
    async fn make_insufficient(&self, offering: &OfferingKey) -> bool {
        self.env
            .fail_fleet_overrides(Some(&offering.instance_type), Some(&offering.zone), "InsufficientInstanceCapacity")
            .await;
        true
    }
    /// moto: an instance tagged for another cluster, launched with plain RunInstances.
    async fn create_foreign_instance(&self) -> Option<String> {
        let (subnet, zone) = self.env.subnets[0].clone();
        let r = self
            .env
            .ec2
            .run_instances()
            .image_id(&self.env.ami)
            .instance_type(ec2::InstanceType::M5Large)
            .min_count(1)
            .max_count(1)
            .subnet_id(subnet)
            .tag_specifications(
                ec2::TagSpecification::builder()
                    .resource_type(ec2::ResourceType::Instance)
                    .tags(ec2::Tag::builder().key("kubernetes.io/cluster/someone-else").value("owned").build())
                    .tags(ec2::Tag::builder().key(TAG_NODE_POOL).value("default").build())
                    .build(),
            )
            .send()
            .await
            .ok()?;
        let id = r.instances().first()?.instance_id()?.to_owned();
        Some(format!("aws:///{zone}/{id}"))
    }
}

/// moto (+ fault-injected for the insufficient-capacity check): the core's conformance suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_passes_the_conformance_suite() {
    let env = Env::new("conformance").await;
    let provider = Arc::new(env.provider().await);
    let h = MotoHarness { env, provider };
    conformance::assert_conformance(&h).await;
    h.env.clear_faults().await;
}

/// moto: GpuInfo becomes GPU capacity and accelerator labels; allocatable follows the EKS formulas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_instance_types_are_parsed_with_eks_allocatable() {
    let env = Env::new("gpus").await;
    let p = env.provider().await;
    let types = p.instance_types(&env.pool()).await.unwrap();
    let by_name: BTreeMap<&str, _> = types.iter().map(|t| (t.name.as_str(), t)).collect();
    for t in TYPES {
        assert!(by_name.contains_key(t), "{t} missing from {:?}", by_name.keys());
    }

    let p4d = by_name["p4d.24xlarge"];
    assert_eq!(p4d.capacity.get(ResourceName::NVIDIA_GPU), 8);
    assert_eq!(p4d.labels[catalog::LABEL_GPU_NAME], "a100");
    assert_eq!(p4d.labels[catalog::LABEL_GPU_COUNT], "8");
    assert_eq!(p4d.labels[catalog::LABEL_GPU_MANUFACTURER], "nvidia");
    assert_eq!(p4d.labels[catalog::LABEL_GPU_MEMORY], "40960");
    assert_eq!(p4d.labels[catalog::LABEL_INSTANCE_FAMILY], "p4d");
    assert_eq!(p4d.labels[catalog::LABEL_INSTANCE_SIZE], "24xlarge");
    assert_eq!(p4d.labels[catalog::LABEL_INSTANCE_CPU], "96");
    assert_eq!(p4d.labels[catalog::LABEL_INSTANCE_MEMORY], "1179648");
    assert_eq!(p4d.labels[labels::ARCH], "amd64");
    // 15 interfaces on the default network card × (50 − 1) + 2: EKS's 737.
    assert_eq!(p4d.capacity.get(ResourceName::PODS), 737);
    let a = p4d.allocatable();
    assert_eq!(a.get(ResourceName::CPU), 96_000 - kube_reserved_cpu_millis(96));
    assert_eq!(kube_reserved_cpu_millis(96), 310);
    // EC2's memory less the hypervisor's 7.5% (88,474 MiB, rounded up), kube-reserved and eviction.
    assert_eq!(p4d.capacity.get(ResourceName::MEMORY), (1_179_648 - 88_474) * MIB);
    assert_eq!(a.get(ResourceName::MEMORY), (1_179_648 - 88_474 - kube_reserved_memory_mib(737) - 100) * MIB);
    // p4d is offered in us-east-1a..d; this test's subnets are in 1a and 1b.
    let zones: std::collections::BTreeSet<&str> = p4d.offerings.iter().map(|o| o.zone.as_str()).collect();
    assert_eq!(zones, ["us-east-1a", "us-east-1b"].into());
    let od = p4d.offering("us-east-1a", CapacityType::OnDemand).unwrap();
    assert_eq!(od.price, 21.957642, "the bundled on-demand table");

    let g5 = by_name["g5.xlarge"];
    assert_eq!(g5.capacity.get(ResourceName::NVIDIA_GPU), 1);
    assert_eq!(g5.labels[catalog::LABEL_GPU_NAME], "a10g");
    assert_eq!(g5.labels[catalog::LABEL_GPU_MEMORY], "22888");
    let pods = max_pods(4, 15);
    assert_eq!(pods, 58);
    let a = g5.allocatable();
    assert_eq!(a.get(ResourceName::PODS), 58);
    assert_eq!(a.get(ResourceName::CPU), 4000 - 80);
    assert_eq!(a.get(ResourceName::MEMORY), (16_384 - 1_229 - 893 - 100) * MIB);
    // 80Gi root volume from the NodeClass, 1Gi kube-reserved, 10% eviction threshold.
    assert_eq!(a.get(ResourceName::EPHEMERAL_STORAGE), (80 << 30) - (1 << 30) - (8 << 30));
    assert!(by_name["m5.large"].capacity.get(ResourceName::NVIDIA_GPU) == 0);
    assert_eq!(by_name["m5.large"].labels.get(catalog::LABEL_GPU_NAME), None);
    // The labels Karpenter derives from the rest of the description, so a requirement on one means something.
    let m5 = &by_name["m5.large"].labels;
    assert_eq!(m5[catalog::LABEL_CPU_MANUFACTURER], "intel");
    assert_eq!(m5[catalog::LABEL_CPU_CLOCK], "3100");
    assert_eq!(m5[catalog::LABEL_EBS_BANDWIDTH], "4750");
    assert_eq!(m5[catalog::LABEL_ENCRYPTION_IN_TRANSIT], "false");
    assert!(!m5.contains_key(catalog::LABEL_LOCAL_NVME), "no instance store");
}

/// moto: a CreateFleet launch lands as an instance with the ownership tags, from a launch template that
/// carries the NodeClass's AMI, groups and user data; a GPU type boots the NVIDIA AMI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_fleet_launches_tagged_instances_from_a_launch_template() {
    let env = Env::new("launch").await;
    let p = env.provider().await;
    let claim = env.claim(
        "web-1",
        vec![
            req(labels::INSTANCE_TYPE, &["m5.large"]),
            req(labels::CAPACITY_TYPE, &["on-demand"]),
            req(labels::ZONE, &["us-east-1b"]),
        ],
    );
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert!(i.provider_id.starts_with("aws:///us-east-1b/i-"), "{}", i.provider_id);
    assert_eq!((i.instance_type.as_str(), i.capacity_type), ("m5.large", CapacityType::OnDemand));
    assert_eq!(i.image_id.as_deref(), Some(env.ami.as_str()), "the standard AMI for a CPU type");
    assert_eq!(i.price, Some(0.096));
    assert_eq!(i.labels[labels::ZONE], "us-east-1b");
    let id = i.provider_id.rsplit('/').next().unwrap();
    let described = env.describe(id).await;
    let t = tags(&described);
    assert_eq!(t[&format!("kubernetes.io/cluster/{}", env.cluster)], "owned");
    assert_eq!(t[TAG_NODE_POOL], "default");
    assert_eq!(t[TAG_NODE_CLAIM], "web-1");
    assert_eq!(t[TAG_NODE_CLASS], env.class_name());
    assert_eq!(t["eks:eks-cluster-name"], env.cluster);
    assert_eq!(t["team"], "ml");
    assert_eq!(described.subnet_id(), Some(env.subnets[1].0.as_str()));
    assert_eq!(described.image_id(), Some(env.ami.as_str()));

    // The launch template: named for the cluster, with the NodeClass's settings.
    let lts = launch_templates(&env).await;
    let lt = &lts[0];
    assert!(lt.launch_template_name().unwrap().starts_with(&format!("tenon/{}/", env.cluster)));
    let lt_tags: BTreeMap<String, String> =
        lt.tags().iter().map(|t| (t.key().unwrap().to_owned(), t.value().unwrap().to_owned())).collect();
    assert_eq!(lt_tags["eks:eks-cluster-name"], env.cluster, "{lt_tags:?}");
    assert_eq!(lt_tags[TAG_NODE_POOL], "default");
    assert_eq!(lt_tags[TAG_NODE_CLASS], env.class_name());
    let data = template_data(&env, lt).await;
    assert_eq!(data.image_id(), Some(env.ami.as_str()));
    assert_eq!(data.security_group_ids(), std::slice::from_ref(&env.security_group));
    let user_data = aws_smithy_types::base64::decode(data.user_data().unwrap()).unwrap();
    assert_eq!(String::from_utf8(user_data).unwrap(), "#!/bin/bash\necho hello");

    // A second create for the same claim finds the instance instead of launching another.
    let again = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!(again.provider_id, i.provider_id);

    // A GPU type boots the NVIDIA AMI; spot when the claim allows it.
    let gpu = env.claim("gpu-1", vec![req(labels::INSTANCE_TYPE, &["g5.xlarge"])]);
    let g = p.create(&gpu, &LaunchOptions::default()).await.unwrap();
    assert_eq!((g.instance_type.as_str(), g.capacity_type), ("g5.xlarge", CapacityType::Spot));
    assert_eq!(g.image_id.as_deref(), Some(env.gpu_ami.as_str()));
    assert_eq!(g.capacity.get(ResourceName::NVIDIA_GPU), 1);
    let got = p.get(&g.provider_id).await.unwrap();
    assert_eq!(got.capacity_type, CapacityType::Spot, "the instance lifecycle is read back");
    assert_eq!(got.node_claim.as_deref(), Some("gpu-1"));
    // Unavailable offerings in the launch options are avoided.
    let opts = LaunchOptions {
        unavailable: vec![
            OfferingKey::new("g5.xlarge", "us-east-1a", CapacityType::Spot),
            OfferingKey::new("g5.xlarge", "us-east-1b", CapacityType::Spot),
        ],
        ignore_unavailable: vec![],
    };
    let od = p.create(&env.claim("gpu-2", vec![req(labels::INSTANCE_TYPE, &["g5.xlarge"])]), &opts).await.unwrap();
    assert_eq!(od.capacity_type, CapacityType::OnDemand);
    for (c, pid) in [(claim, i.provider_id), (gpu, g.provider_id)] {
        p.delete(&with_provider_id(c, &pid)).await.unwrap();
    }
}

/// moto: an AL2023 class launches with user data that joins the cluster: a `nodeadm` NodeConfig after
/// the user's own script, with the endpoint, CA and service CIDR EKS `DescribeCluster` reports, the
/// class's kubelet settings (which the offered allocatable follows), and the claim's labels and taints.
/// Settings that name the cluster's facts are used instead of asking EKS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_al2023_class_launches_with_user_data_that_joins_the_cluster() {
    use tenon_providers::aws::bootstrap::mime;
    let env = Env::new("al2023").await;
    let cluster = env.create_eks_cluster(None).await;
    let mut class = env.node_class();
    class.spec.ami_family = Some("AL2023".into());
    class.spec.kubelet = serde_json::json!({"maxPods": 30, "kubeReserved": {"cpu": "250m"}}).as_object().cloned();
    let p = env.provider().await;
    p.apply_node_class(class.clone()).unwrap();
    let types = p.instance_types(&env.pool()).await.unwrap();
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    assert_eq!(m5.capacity.get(ResourceName::PODS), 30, "maxPods sets the pods offered");
    assert_eq!(m5.overhead.kube_reserved.get(ResourceName::CPU), 250);

    let mut claim = env.claim("joins-1", vec![req(labels::INSTANCE_TYPE, &["m5.large"]), req("team", &["ml"])]);
    claim.spec.taints = vec![k8s_openapi::api::core::v1::Taint {
        key: "dedicated".into(),
        value: Some("ml".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }];
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    let node_config = |data: &ec2::ResponseLaunchTemplateData| -> (Vec<mime::Part>, serde_json::Value) {
        let text = String::from_utf8(aws_smithy_types::base64::decode(data.user_data().unwrap()).unwrap()).unwrap();
        let parts = mime::parse(&text).unwrap();
        let doc = serde_yaml_ng::from_str(&parts.last().unwrap().content).unwrap();
        (parts, doc)
    };
    let lts = launch_templates(&env).await;
    assert_eq!(lts.len(), 1, "one template for the class, its AMI and this user data");
    let (parts, doc) = node_config(&template_data(&env, &lts[0]).await);
    assert_eq!(parts[0].content, "#!/bin/bash\necho hello", "the class's own script runs first");
    let spec = &doc["spec"];
    assert_eq!(spec["cluster"]["name"], env.cluster.as_str());
    assert_eq!(spec["cluster"]["apiServerEndpoint"], cluster.endpoint().unwrap());
    assert_eq!(spec["cluster"]["certificateAuthority"], cluster.certificate_authority().unwrap().data().unwrap());
    let cidr = cluster.kubernetes_network_config().and_then(|n| n.service_ipv4_cidr()).unwrap();
    assert_eq!(spec["cluster"]["cidr"], cidr);
    assert_eq!(spec["kubelet"]["config"]["maxPods"], 30);
    assert_eq!(spec["kubelet"]["config"]["kubeReserved"]["cpu"], "250m");
    let taints: Vec<String> = spec["kubelet"]["config"]["registerWithTaints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{}:{}", t["key"].as_str().unwrap(), t["effect"].as_str().unwrap()))
        .collect();
    assert_eq!(taints, ["dedicated:NoSchedule", "karpenter.sh/unregistered:NoExecute"]);
    let flags = spec["kubelet"]["flags"][0].as_str().unwrap();
    assert_eq!(flags, "--node-labels=karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default,team=ml");
    p.delete(&with_provider_id(claim, &i.provider_id)).await.unwrap();

    // The cluster's facts from the settings: EKS is not asked (this cluster name is unknown to it).
    let mut settings = env.settings();
    settings.cluster_name = format!("{}-elsewhere", env.cluster);
    settings.cluster_endpoint = Some("https://api.elsewhere.example".into());
    settings.cluster_ca_bundle = Some("Y2E=".into());
    settings.cluster_service_cidr = Some("10.96.0.0/12".into());
    let elsewhere = env.provider_with(settings).await;
    elsewhere.apply_node_class(class).unwrap();
    let claim = env.claim("joins-2", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let i = elsewhere.create(&claim, &LaunchOptions::default()).await.unwrap();
    let owned = format!("tag:kubernetes.io/cluster/{}-elsewhere", env.cluster);
    let lts = env
        .ec2
        .describe_launch_templates()
        .filters(ec2::Filter::builder().name(owned).values("owned").build())
        .send()
        .await
        .unwrap();
    let lt = lts
        .launch_templates()
        .iter()
        .find(|t| t.launch_template_name().is_some_and(|n| n.starts_with(&format!("tenon/{}-elsewhere/", env.cluster))))
        .unwrap();
    let (_, doc) = node_config(&template_data(&env, lt).await);
    assert_eq!(doc["spec"]["cluster"]["apiServerEndpoint"], "https://api.elsewhere.example");
    assert_eq!(doc["spec"]["cluster"]["certificateAuthority"], "Y2E=");
    assert_eq!(doc["spec"]["cluster"]["cidr"], "10.96.0.0/12");
    elsewhere.delete(&with_provider_id(claim, &i.provider_id)).await.unwrap();
}

/// moto: the launch template carries a customer KMS key as Karpenter's manifests spell it (`kmsKeyID`),
/// a class without block devices gets an encrypted 20 GiB gp3 root, and instance tags stay out of the
/// metadata service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_templates_carry_kms_keys_default_volumes_and_metadata_options() {
    let env = Env::new("volumes").await;
    let p = env.provider().await;
    let all_data = || async {
        let mut out = Vec::new();
        for lt in launch_templates(&env).await {
            out.push(template_data(&env, &lt).await);
        }
        out
    };
    let mut class: serde_json::Value = serde_json::to_value(env.node_class()).unwrap();
    class["spec"]["blockDeviceMappings"] = serde_json::json!([{"deviceName": "/dev/xvda", "rootVolume": true,
        "ebs": {"volumeSize": "50Gi", "volumeType": "gp3", "encrypted": true, "kmsKeyID": "arn:aws:kms:us-east-1:123456789012:key/k1"}}]);
    p.apply_node_class(serde_json::from_value(class.clone()).unwrap()).unwrap();
    let c1 = env.claim("vol-1", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let i1 = p.create(&c1, &LaunchOptions::default()).await.unwrap();
    let data = all_data().await;
    let bdm = &data[0].block_device_mappings()[0];
    assert_eq!(bdm.ebs().and_then(|e| e.kms_key_id()), Some("arn:aws:kms:us-east-1:123456789012:key/k1"));
    let md = data[0].metadata_options().unwrap();
    assert_eq!(md.instance_metadata_tags().map(|t| t.as_str()), Some("disabled"));
    p.delete(&with_provider_id(c1, &i1.provider_id)).await.unwrap();

    class["spec"].as_object_mut().unwrap().remove("blockDeviceMappings");
    p.apply_node_class(serde_json::from_value(class).unwrap()).unwrap();
    let c2 = env.claim("vol-2", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let i2 = p.create(&c2, &LaunchOptions::default()).await.unwrap();
    let data = all_data().await;
    let defaults: Vec<_> = data
        .iter()
        .flat_map(|d| d.block_device_mappings())
        .filter(|b| b.ebs().and_then(|e| e.kms_key_id()).is_none())
        .collect();
    assert_eq!(defaults.len(), 1, "{data:?}");
    let ebs = defaults[0].ebs().unwrap();
    assert_eq!(defaults[0].device_name(), Some("/dev/xvda"));
    assert_eq!((ebs.volume_size(), ebs.encrypted()), (Some(20), Some(true)));
    assert_eq!(ebs.volume_type().map(|t| t.as_str()), Some("gp3"));
    p.delete(&with_provider_id(c2, &i2.provider_id)).await.unwrap();
}

/// moto: a launch template deleted from outside is made again: the launch that meets it gone fails
/// retryably, and the next launch recreates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_template_deleted_from_outside_is_made_again() {
    let env = Env::new("ltgone").await;
    let p = env.provider().await;
    let c1 = env.claim("ltgone-1", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let i1 = p.create(&c1, &LaunchOptions::default()).await.unwrap();
    for lt in launch_templates(&env).await {
        env.ec2.delete_launch_template().launch_template_id(lt.launch_template_id().unwrap()).send().await.unwrap();
    }
    let c2 = env.claim("ltgone-2", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    match p.create(&c2, &LaunchOptions::default()).await {
        Err(CloudError::Create { reason, .. }) => assert_eq!(reason, "LaunchTemplateNotFound"),
        other => panic!("expected a retryable failure, got {other:?}"),
    }
    let i2 = p.create(&c2, &LaunchOptions::default()).await.unwrap();
    assert_eq!(launch_templates(&env).await.len(), 1, "the template is back");
    for (c, i) in [(c1, i1), (c2, i2)] {
        p.delete(&with_provider_id(c, &i.provider_id)).await.unwrap();
    }
}

/// moto: a class whose cluster facts cannot be found (no settings, no EKS cluster of that name) is not
/// ready, and says what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_family_class_without_cluster_facts_is_not_ready() {
    let env = Env::new("nofacts").await;
    let mut class = env.node_class();
    class.spec.ami_family = Some("Bottlerocket".into());
    let p = env.provider().await;
    p.apply_node_class(class).unwrap();
    let err = p
        .create(&env.claim("nofacts-1", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]), &LaunchOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(_)), "{err:?}");
    assert!(err.to_string().contains("CLUSTER_ENDPOINT"), "{err}");
}

/// moto: list and get see only this cluster's instances; delete terminates, then answers NotFound;
/// another cluster's instance is never listed, read or deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_get_delete_stay_inside_the_cluster() {
    let env = Env::new("ownership").await;
    let p = Arc::new(env.provider().await);
    let h = MotoHarness { env, provider: p.clone() };
    let env = &h.env;
    let foreign = h.create_foreign_instance().await.unwrap();
    // A second provider for another cluster in the same VPC.
    let mut other_settings = env.settings();
    other_settings.cluster_name = format!("{}-other", env.cluster);
    let other = env.provider_with(other_settings).await;
    let theirs = other
        .create(&env.claim("theirs", vec![req(labels::INSTANCE_TYPE, &["c5.large"])]), &LaunchOptions::default())
        .await
        .unwrap();
    let claim = env.claim("ours", vec![req(labels::INSTANCE_TYPE, &["c5.large"])]);
    let ours = p.create(&claim, &LaunchOptions::default()).await.unwrap();

    let listed: Vec<String> = p.list().await.unwrap().into_iter().map(|i| i.provider_id).collect();
    assert_eq!(listed, std::slice::from_ref(&ours.provider_id));
    let theirs_listed: Vec<String> = other.list().await.unwrap().into_iter().map(|i| i.provider_id).collect();
    assert_eq!(theirs_listed, std::slice::from_ref(&theirs.provider_id));
    for pid in [&foreign, &theirs.provider_id] {
        assert!(p.get(pid).await.unwrap_err().is_not_found(), "{pid}");
        let stolen = with_provider_id(env.claim("stolen", vec![]), pid);
        assert!(p.delete(&stolen).await.unwrap_err().is_not_found(), "{pid}");
    }
    let theirs_id = theirs.provider_id.rsplit('/').next().unwrap();
    assert_eq!(env.describe(theirs_id).await.state().unwrap().name(), Some(&ec2::InstanceStateName::Running));

    let got = p.get(&ours.provider_id).await.unwrap();
    assert_eq!(got.node_pool.as_deref(), Some("default"));
    assert_eq!(got.node_claim.as_deref(), Some("ours"));
    assert_eq!(got.allocatable, ours.allocatable);
    let claim = with_provider_id(claim, &ours.provider_id);
    p.delete(&claim).await.unwrap();
    assert!(p.delete(&claim).await.unwrap_err().is_not_found());
    assert!(p.get(&ours.provider_id).await.unwrap_err().is_not_found());
    assert!(p.list().await.unwrap().is_empty());
    assert!(p.get("aws:///us-east-1a/i-0123456789abcdef0").await.unwrap_err().is_not_found());
    assert!(p.get("gce://x/y").await.unwrap_err().is_not_found());
    other.delete(&with_provider_id(env.claim("theirs", vec![]), &theirs.provider_id)).await.unwrap();
}

/// moto: a NodeClass whose terms resolve to nothing, or that is unknown, answers NodeClassNotReady.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_node_class_is_not_ready() {
    let env = Env::new("notready").await;
    let p = env.provider().await;
    let mut nc = env.node_class();
    nc.spec.subnet_selector_terms[0].tags = [("tenon-test".to_owned(), "nobody".to_owned())].into();
    p.apply_node_class(nc).unwrap();
    let claim = env.claim("c", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let err = p.create(&claim, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("subnetSelectorTerms")), "{err}");
    let mut claim = claim;
    claim.spec.node_class_ref.as_mut().unwrap().name = "missing".into();
    let err = p.create(&claim, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("missing")), "{err}");
    // Restored, it resolves: subnets, the group and both AMIs land in the status.
    p.apply_node_class(env.node_class()).unwrap();
    let (_, status) = p.resolve_node_class(&env.class_name()).await.unwrap();
    assert_eq!(status.subnets.len(), 2);
    assert_eq!(status.security_groups[0].id, env.security_group);
    let gpu_ami = status.amis.iter().find(|a| a.id == env.gpu_ami).unwrap();
    assert!(gpu_ami.nvidia, "named nvidia");
    // The same spec applied again (a watch resync) keeps its resolution; a changed one is resolved afresh.
    p.apply_node_class(env.node_class()).unwrap();
    let (_, again) = p.resolve_node_class(&env.class_name()).await.unwrap();
    assert!(std::sync::Arc::ptr_eq(&status, &again), "not resolved again");
    let mut nc = env.node_class();
    nc.spec.subnet_selector_terms[0].tags = [("tenon-test".to_owned(), "nobody".to_owned())].into();
    p.apply_node_class(nc).unwrap();
    let err = p.resolve_node_class(&env.class_name()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(ref m) if m.contains("subnetSelectorTerms")), "{err}");
}

/// moto: the status written on an EC2NodeClass says, condition by condition, what resolved and what did
/// not, as Karpenter's does; a condition that holds keeps its transition time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_class_status_has_a_condition_for_each_part_and_ready_over_them() {
    use tenon_core::api::ConditionStatus;
    let env = Env::new("status").await;
    let p = env.provider().await;
    let condition = |s: &tenon_providers::aws::EC2NodeClassStatus, t: &str| {
        s.conditions.iter().find(|c| c.type_ == t).map(|c| (c.status, c.reason.clone(), c.last_transition_time))
    };
    // No role: everything resolves but the instance profile.
    let class = env.node_class();
    let status = p.node_class_status(&class).await;
    assert_eq!(status.subnets.len(), 2);
    assert_eq!(status.security_groups[0].id, env.security_group);
    assert_eq!(condition(&status, "SubnetsReady").map(|c| c.0), Some(ConditionStatus::True));
    assert_eq!(condition(&status, "AMIsReady").map(|c| c.0), Some(ConditionStatus::True));
    let profile = condition(&status, "InstanceProfileReady").unwrap();
    assert_eq!((profile.0, profile.1.as_str()), (ConditionStatus::False, "InstanceProfileNotFound"));
    let ready = condition(&status, "Ready").unwrap();
    assert_eq!(ready.0, ConditionStatus::False);
    // With a role, Ready: its instance profile is made; the conditions that held keep their transition times.
    let role = create_role(&env).await;
    let mut class = env.node_class();
    class.spec.role = Some(role);
    class.status = Some(status.clone());
    p.apply_node_class(class.clone()).unwrap();
    let ready_status = p.node_class_status(&class).await;
    assert_eq!(condition(&ready_status, "Ready").map(|c| c.0), Some(ConditionStatus::True), "{ready_status:?}");
    assert_eq!(ready_status.instance_profile, Some(p.instance_profile_name(&env.class_name())));
    assert_eq!(condition(&ready_status, "SubnetsReady").unwrap().2, condition(&status, "SubnetsReady").unwrap().2);
    // Subnets that match nothing: SubnetsReady and Ready are False, with the reason.
    class.spec.subnet_selector_terms[0].tags = [("tenon-test".to_owned(), "nobody".to_owned())].into();
    class.status = Some(ready_status);
    let status = p.node_class_status(&class).await;
    let subnets = condition(&status, "SubnetsReady").unwrap();
    assert_eq!((subnets.0, subnets.1.as_str()), (ConditionStatus::False, "SubnetsNotFound"));
    assert_eq!(condition(&status, "Ready").map(|c| c.0), Some(ConditionStatus::False));
    assert!(status.subnets.is_empty());
    // A class that fails validation is not resolved at all.
    class.spec.subnet_selector_terms.clear();
    let status = p.node_class_status(&class).await;
    let validation = condition(&status, "ValidationSucceeded").unwrap();
    assert_eq!((validation.0, validation.1.as_str()), (ConditionStatus::False, "ValidationFailed"));
    assert_eq!(condition(&status, "Ready").map(|c| c.0), Some(ConditionStatus::False));
}

/// An IAM role for this test's nodes.
async fn create_role(env: &Env) -> String {
    let iam = aws_sdk_iam::Client::new(&sdk_config().await);
    let name = format!("KarpenterNodeRole-{}", env.cluster);
    iam.create_role()
        .role_name(&name)
        .path("/eks/")
        .assume_role_policy_document(r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#)
        .send()
        .await
        .unwrap();
    name
}

/// moto: a class naming a `role` (here as an ARN with a path, as Karpenter accepts it) launches with an
/// instance profile tenon made for it, holding that role; a new role replaces the old in the profile; the
/// profile goes with the class. A class naming `instanceProfile` uses it as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_gets_an_instance_profile_that_goes_with_its_class() {
    let env = Env::new("profile").await;
    let iam = aws_sdk_iam::Client::new(&sdk_config().await);
    let role = create_role(&env).await;
    let p = env.provider().await;
    let mut class = env.node_class();
    class.spec.role = Some(format!("arn:aws:iam::123456789012:role/eks/{role}"));
    p.apply_node_class(class.clone()).unwrap();
    let (_, status) = p.resolve_node_class(&env.class_name()).await.unwrap();
    let profile = p.instance_profile_name(&env.class_name());
    assert_eq!(status.instance_profile.as_deref(), Some(profile.as_str()));
    let got = iam.get_instance_profile().instance_profile_name(&profile).send().await.unwrap();
    let roles: Vec<&str> = got.instance_profile().unwrap().roles().iter().map(|r| r.role_name()).collect();
    assert_eq!(roles, [role.as_str()]);
    let claim = env.claim("profile-1", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    let data = template_data(&env, &launch_templates(&env).await[0]).await;
    assert_eq!(data.iam_instance_profile().and_then(|p| p.name()), Some(profile.as_str()));
    p.delete(&with_provider_id(claim, &i.provider_id)).await.unwrap();

    // The class's role changes: the profile now holds the new one only.
    let other = format!("{role}-2");
    iam.create_role()
        .role_name(&other)
        .assume_role_policy_document(r#"{"Version":"2012-10-17","Statement":[]}"#)
        .send()
        .await
        .unwrap();
    class.spec.role = Some(other.clone());
    p.apply_node_class(class.clone()).unwrap();
    p.resolve_node_class(&env.class_name()).await.unwrap();
    let got = iam.get_instance_profile().instance_profile_name(&profile).send().await.unwrap();
    let roles: Vec<&str> = got.instance_profile().unwrap().roles().iter().map(|r| r.role_name()).collect();
    assert_eq!(roles, [other.as_str()]);

    // A role IAM does not know: the class is not ready, naming the field.
    class.spec.role = Some("NoSuchRole".into());
    p.apply_node_class(class.clone()).unwrap();
    let err = p.resolve_node_class(&env.class_name()).await.unwrap_err();
    assert!(err.to_string().contains("spec.role"), "{err}");

    // The class goes, and its profile with it.
    p.delete_node_class(&env.class_name()).await.unwrap();
    let gone = iam.get_instance_profile().instance_profile_name(&profile).send().await;
    assert!(gone.is_err_and(|e| e.into_service_error().is_no_such_entity_exception()));

    // An instance profile of the user's own is used untouched.
    let mut own = env.node_class();
    own.spec.instance_profile = Some("my-profile".into());
    p.apply_node_class(own).unwrap();
    let (_, status) = p.resolve_node_class(&env.class_name()).await.unwrap();
    assert_eq!(status.instance_profile.as_deref(), Some("my-profile"));
}

/// A Kubernetes version no other test uses: the public SSM parameter names the switchboard serves are
/// global, and tests run in parallel.
fn unique_kubernetes_version() -> String {
    format!("1.{}", 900 + SEQ.fetch_add(1, Ordering::Relaxed))
}

/// The switchboard serves EKS's public SSM parameters (`name → image id`).
async fn publish_ssm_parameters(env: &Env, parameters: &[(String, &str)]) {
    let map: serde_json::Map<String, serde_json::Value> =
        parameters.iter().map(|(k, v)| (k.clone(), serde_json::Value::String((*v).to_owned()))).collect();
    env.fault("/_fault/ssm-parameters", serde_json::json!({ "parameters": map })).await;
}

/// Fault-injected (moto has no public `/aws/service/...` parameters, and refuses to store them): an
/// `alias` term reads EKS's SSM parameters for the cluster's Kubernetes version (the API server's, else
/// EKS `DescribeCluster`'s), one per architecture and variant; a variant EKS does not publish is left
/// out; GPU and Neuron images are marked for their types; an unpublished version is not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_resolves_through_the_eks_ssm_parameters_of_the_cluster_version() {
    let env = Env::new("alias").await;
    let k8s = unique_kubernetes_version();
    let standard = register_image(&env.ec2, &format!("al2023-standard-{}", env.cluster), &env.cluster).await;
    let nvidia = register_image(&env.ec2, &format!("al2023-nvidia-{}", env.cluster), &env.cluster).await;
    let neuron = register_image(&env.ec2, &format!("al2023-neuron-{}", env.cluster), &env.cluster).await;
    let path = |variant: &str| {
        format!("/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2023/x86_64/{variant}/recommended/image_id")
    };
    // No arm64 parameters: those variants are simply absent.
    publish_ssm_parameters(
        &env,
        &[(path("standard"), &standard), (path("nvidia"), &nvidia), (path("neuron"), &neuron)],
    )
    .await;
    let p = env.provider().await;
    let mut nc = env.node_class();
    nc.spec.ami_selector_terms = vec![serde_json::from_value(serde_json::json!({"alias": "al2023@latest"})).unwrap()];
    p.apply_node_class(nc.clone()).unwrap();
    p.set_kubernetes_version(&k8s);
    let (_, status) = p.resolve_node_class(&env.class_name()).await.unwrap();
    let by_id: BTreeMap<&str, (bool, bool)> =
        status.amis.iter().map(|a| (a.id.as_str(), (a.nvidia, a.neuron))).collect();
    assert_eq!(
        by_id,
        [(standard.as_str(), (false, false)), (nvidia.as_str(), (true, false)), (neuron.as_str(), (false, true))]
            .into()
    );
    assert!(status.amis.iter().all(|a| a.architecture == "amd64"));

    // Without the API server's version, EKS DescribeCluster's pins the alias: a version EKS publishes no
    // image for leaves the class not ready, naming the parameters it looked for.
    env.create_eks_cluster(Some("1.899")).await;
    let fresh = env.provider().await;
    fresh.apply_node_class(nc).unwrap();
    let err = fresh.resolve_node_class(&env.class_name()).await.unwrap_err();
    assert!(matches!(err, CloudError::NodeClassNotReady(_)), "{err}");
    assert!(
        err.to_string()
            .contains("/aws/service/eks/optimized-ami/1.899/amazon-linux-2023/x86_64/standard/recommended/image_id"),
        "{err}"
    );
}

/// Fault-injected (moto has no Pricing API, nor EKS's public SSM parameters): a Karpenter EC2NodeClass
/// manifest (a role, an alias, block devices with a customer KMS key) reads and writes back unchanged,
/// and launches on-demand in eu-west-1, which the bundled price table does not cover: its on-demand
/// offerings are priced by the Pricing API's `GetProducts` (asked with Karpenter's filters) once it
/// answers, and unpriced (so never launched) before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_karpenter_node_class_launches_on_demand_in_another_region_priced_by_the_pricing_api() {
    let env = Env::in_region("region", "eu-west-1").await;
    // The only test pricing eu-west-1: whatever an earlier run on this server listed goes first.
    env.fault("/_fault/clear", serde_json::json!({"pricing_region": "eu-west-1"})).await;
    let k8s = unique_kubernetes_version();
    let image = format!("/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2023/x86_64/standard/recommended/image_id");
    publish_ssm_parameters(&env, &[(image, &env.ami)]).await;
    // IAM is global: the role is made as for any other test.
    let role = create_role(&env).await;
    let manifest = serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": env.class_name()},
        "spec": {
            "role": role,
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {"tenon-test": env.cluster}}],
            "securityGroupSelectorTerms": [{"tags": {"tenon-test": env.cluster}}],
            "blockDeviceMappings": [{"deviceName": "/dev/xvda", "rootVolume": true,
                "ebs": {"volumeSize": "100Gi", "volumeType": "gp3", "encrypted": true, "deleteOnTermination": true,
                    "kmsKeyID": "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"}}],
            "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                "httpPutResponseHopLimit": 1, "httpTokens": "required"},
            "tags": {"team": "ml"}
        }
    });
    let class: EC2NodeClass = serde_json::from_value(manifest.clone()).unwrap();
    assert_eq!(serde_json::to_value(&class).unwrap(), manifest, "the manifest round-trips unchanged");

    let mut settings = env.settings();
    settings.kubernetes_version = Some(k8s);
    settings.cluster_endpoint = Some("https://api.region.example".into());
    settings.cluster_ca_bundle = Some("Y2E=".into());
    settings.cluster_service_cidr = Some("10.100.0.0/16".into());
    let clock = VirtualClock::at_epoch();
    let p = AwsProvider::from_sdk_config(settings, &sdk_config_in(env.region).await).with_clock(clock.clone());
    p.apply_node_class(class).unwrap();
    let on_demand = |types: &[tenon_core::cloud::InstanceType], name: &str| {
        let t = types.iter().find(|t| t.name == name).unwrap();
        let o = t.offerings.iter().find(|o| o.capacity_type == CapacityType::OnDemand).unwrap();
        (o.available, o.price)
    };
    // The Pricing API has nothing for eu-west-1 yet: on-demand is unpriced and unoffered.
    let types = p.instance_types(&env.pool()).await.unwrap();
    assert!(!on_demand(&types, "m5.large").0);

    // The products the Pricing API lists. The hourly figures are us-east-1's published prices (the bundled
    // table's), reused: what is checked is that they arrive through GetProducts. The decoys (1000.0, not a
    // price) are products of the same types that Karpenter's filters exclude.
    let product = |itype: &str, tenancy: &str, family: &str, os: &str, status: &str, usd: &str| {
        serde_json::json!({"productFamily": family, "usd": usd, "attributes": {
            "regionCode": "eu-west-1", "instanceType": itype, "tenancy": tenancy, "operatingSystem": os,
            "preInstalledSw": "NA", "capacitystatus": status, "marketoption": "OnDemand", "location": "EU (Ireland)"}})
    };
    let compute = "Compute Instance";
    env.fault(
        "/_fault/pricing",
        serde_json::json!({"products": [
            product("m5.large", "Shared", compute, "Linux", "Used", "0.0960000000"),
            product("c5.large", "Shared", compute, "Linux", "Used", "0.0850000000"),
            product("m5.metal", "Dedicated", "Compute Instance (bare metal)", "Linux", "Used", "4.6080000000"),
            product("m5.large", "Shared", compute, "Windows", "Used", "1000.0"),
            product("m5.large", "Dedicated", compute, "Linux", "Used", "1000.0"),
            product("m5.large", "Shared", compute, "Linux", "UnusedCapacityReservation", "1000.0"),
        ]}),
    )
    .await;
    // A failed refresh is tried again after five minutes, not at once.
    let types = p.instance_types(&env.pool()).await.unwrap();
    assert!(!on_demand(&types, "m5.large").0, "no second ask before the retry is due");
    clock.advance(Duration::from_secs(5 * 60));
    let types = p.instance_types(&env.pool()).await.unwrap();
    assert_eq!(on_demand(&types, "m5.large"), (true, 0.096));
    assert_eq!(on_demand(&types, "c5.large"), (true, 0.085));
    assert!(!on_demand(&types, "m5.xlarge").0, "a type the Pricing API does not price is not offered");

    let claim = env
        .claim("region-1", vec![req(labels::INSTANCE_TYPE, &["m5.large"]), req(labels::CAPACITY_TYPE, &["on-demand"])]);
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!((i.capacity_type, i.price), (CapacityType::OnDemand, Some(0.096)));
    assert!(i.zone.starts_with("eu-west-1"), "{}", i.zone);
    assert_eq!(i.labels.get(labels::REGION).map(String::as_str), Some("eu-west-1"));
    let data = template_data(&env, &launch_templates(&env).await[0]).await;
    let ebs = data.block_device_mappings()[0].ebs().unwrap();
    assert_eq!(ebs.kms_key_id(), Some("arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"));
    assert_eq!(data.image_id(), Some(env.ami.as_str()), "the alias's image");
    assert_eq!(
        data.iam_instance_profile().and_then(|p| p.name()),
        Some(p.instance_profile_name(&env.class_name()).as_str())
    );
    p.delete(&with_provider_id(claim, &i.provider_id)).await.unwrap();
}

/// This test's cluster's launch templates.
async fn launch_templates(env: &Env) -> Vec<ec2::LaunchTemplate> {
    let r = env
        .ec2
        .describe_launch_templates()
        .filters(
            ec2::Filter::builder().name(format!("tag:kubernetes.io/cluster/{}", env.cluster)).values("owned").build(),
        )
        .send()
        .await
        .unwrap();
    r.launch_templates().to_vec()
}

/// The data of a launch template's first version.
async fn template_data(env: &Env, lt: &ec2::LaunchTemplate) -> ec2::ResponseLaunchTemplateData {
    let v = env
        .ec2
        .describe_launch_template_versions()
        .launch_template_id(lt.launch_template_id().unwrap())
        .send()
        .await
        .unwrap();
    v.launch_template_versions()[0].launch_template_data().unwrap().clone()
}

/// The names of this test's cluster's launch templates.
async fn launch_template_names(env: &Env) -> std::collections::BTreeSet<String> {
    launch_templates(env).await.iter().filter_map(|t| t.launch_template_name()).map(str::to_owned).collect()
}

/// moto: a launch template the class no longer uses (its spec changed) is deleted when the class is
/// resolved again, and deleting the class deletes the rest; instances launched from them run on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_templates_the_class_no_longer_uses_are_deleted() {
    let env = Env::new("ltgc").await;
    let p = env.provider().await;
    let m5 = |name: &str| env.claim(name, vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let first = p.create(&m5("a"), &LaunchOptions::default()).await.unwrap();
    let before = launch_template_names(&env).await;
    assert_eq!(before.len(), 1, "{before:?}");

    // New user data: a new template; the old one goes when the changed class is resolved.
    let mut nc = env.node_class();
    nc.spec.user_data = Some("#!/bin/bash\necho changed".into());
    p.apply_node_class(nc).unwrap();
    p.create(&m5("b"), &LaunchOptions::default()).await.unwrap();
    let after = launch_template_names(&env).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(after.is_disjoint(&before), "the template of the old spec is gone: {before:?} → {after:?}");

    // Re-resolving an unchanged class keeps its template.
    p.apply_node_class({
        let mut nc = env.node_class();
        nc.spec.user_data = Some("#!/bin/bash\necho changed".into());
        nc
    })
    .unwrap();
    p.resolve_node_class(&env.class_name()).await.unwrap();
    assert_eq!(launch_template_names(&env).await, after);

    // Deleting the class deletes its templates; its instances are not touched.
    p.delete_node_class(&env.class_name()).await.unwrap();
    assert!(launch_template_names(&env).await.is_empty());
    let id = first.provider_id.rsplit('/').next().unwrap();
    let state = env.describe(id).await.state().and_then(|s| s.name()).cloned();
    assert_eq!(state, Some(ec2::InstanceStateName::Running));
}

/// moto: drift by NodeClass hash, AMI and subnet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_follows_the_node_class() {
    let env = Env::new("drift").await;
    let p = env.provider().await;
    let claim = env.claim(
        "d",
        vec![
            req(labels::INSTANCE_TYPE, &["m5.large"]),
            req(labels::ZONE, &["us-east-1a"]),
            req(labels::CAPACITY_TYPE, &["on-demand"]),
        ],
    );
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    let mut claim = with_provider_id(claim, &i.provider_id);
    claim.status.as_mut().unwrap().image_id = i.image_id.clone();
    assert_eq!(p.is_drifted(&claim).await.unwrap(), None);

    let mut nc = env.node_class();
    nc.spec.user_data = Some("#!/bin/bash\necho changed".into());
    p.apply_node_class(nc).unwrap();
    assert_eq!(p.is_drifted(&claim).await.unwrap().unwrap().0, "NodeClassDrift");
    // A hash made by another recipe version says nothing about the class: no static drift.
    let id = tenon_providers::aws::instance_id(&i.provider_id).unwrap().to_owned();
    let retag = |version: &'static str| {
        let ec2 = env.ec2.clone();
        let id = id.clone();
        async move {
            let t = ec2::Tag::builder().key("karpenter.k8s.aws/ec2nodeclass-hash-version").value(version).build();
            ec2.create_tags().resources(id).tags(t).send().await.unwrap();
        }
    };
    assert_eq!(
        tags(&env.describe(&id).await).get("karpenter.k8s.aws/ec2nodeclass-hash-version").map(String::as_str),
        Some("v1")
    );
    retag("v0").await;
    assert_eq!(p.is_drifted(&claim).await.unwrap(), None);
    retag("v1").await;
    assert_eq!(p.is_drifted(&claim).await.unwrap().unwrap().0, "NodeClassDrift");

    let mut nc = env.node_class();
    nc.spec.ami_selector_terms = vec![serde_json::from_value(serde_json::json!({"id": env.gpu_ami})).unwrap()];
    p.apply_node_class(nc).unwrap();
    assert_eq!(p.is_drifted(&claim).await.unwrap().unwrap().0, "AMIDrift");

    let mut nc = env.node_class();
    nc.spec.subnet_selector_terms = vec![serde_json::from_value(serde_json::json!({"id": env.subnets[1].0})).unwrap()];
    p.apply_node_class(nc).unwrap();
    assert_eq!(p.is_drifted(&claim).await.unwrap().unwrap().0, "SubnetDrift");
    p.delete(&claim).await.unwrap();
}

/// Fault-injected: a fleet that launches in one override while another fails reports the failed
/// offering to the shared unavailable-offerings cache; a fleet where every override fails answers
/// InsufficientCapacity naming them; a vCPU quota error blocks its quota bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_errors_mark_offerings_unavailable() {
    let env = Env::new("ice").await;
    let cache = Arc::new(UnavailableOfferings::new());
    let clock = VirtualClock::at_epoch();
    let p = env.provider().await.with_clock(clock.clone()).with_unavailable_offerings(cache.clone());
    env.fail_fleet_overrides(Some("c5.large"), Some("us-east-1a"), "InsufficientInstanceCapacity").await;
    let claim = env
        .claim("partial", vec![req(labels::INSTANCE_TYPE, &["c5.large"]), req(labels::CAPACITY_TYPE, &["on-demand"])]);
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!(i.zone, "us-east-1b", "the other zone's override launched");
    let failed = OfferingKey::new("c5.large", "us-east-1a", CapacityType::OnDemand);
    let now = tenon_core::clock::Clock::now(&*clock);
    assert!(cache.is_unavailable("aws", &failed, now));
    assert!(!cache.is_unavailable("aws", &failed, tenon_core::clock::add(now, Duration::from_secs(180))), "3 minutes");
    p.delete(&with_provider_id(claim, &i.provider_id)).await.unwrap();

    // Every override fails: InsufficientCapacity naming each failed offering.
    env.fail_fleet_overrides(Some("c5.large"), Some("us-east-1b"), "InsufficientInstanceCapacity").await;
    let claim =
        env.claim("none", vec![req(labels::INSTANCE_TYPE, &["c5.large"]), req(labels::CAPACITY_TYPE, &["on-demand"])]);
    match p.create(&claim, &LaunchOptions::default()).await {
        Err(CloudError::InsufficientCapacity { offerings, .. }) => {
            assert_eq!(offerings.len(), 2, "{offerings:?}");
            assert!(offerings.contains(&failed));
        }
        other => panic!("expected InsufficientCapacity, got {other:?}"),
    }

    // A vCPU quota error on a G type blocks the G quota bucket for on-demand, not the standard one.
    env.fail_fleet_overrides(Some("g5.xlarge"), None, "VcpuLimitExceeded").await;
    let claim = env
        .claim("quota", vec![req(labels::INSTANCE_TYPE, &["g5.xlarge"]), req(labels::CAPACITY_TYPE, &["on-demand"])]);
    assert!(matches!(p.create(&claim, &LaunchOptions::default()).await, Err(CloudError::InsufficientCapacity { .. })));
    let types = p.instance_types(&env.pool()).await.unwrap();
    let g5 = types.iter().find(|t| t.name == "g5.xlarge").unwrap();
    assert!(g5.offerings.iter().filter(|o| o.capacity_type == CapacityType::OnDemand).all(|o| !o.available));
    assert!(g5.offerings.iter().filter(|o| o.capacity_type == CapacityType::Spot).all(|o| o.available));
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    assert!(m5.offerings.iter().all(|o| o.available));
    clock.advance(Duration::from_secs(181));
    let types = p.instance_types(&env.pool()).await.unwrap();
    let g5 = types.iter().find(|t| t.name == "g5.xlarge").unwrap();
    assert!(g5.offerings.iter().all(|o| o.available), "the quota block expires with the TTL");

    // The account cannot create the spot service-linked role: all spot is unavailable for a while, so the
    // claim's retry falls back to on-demand.
    env.clear_faults().await;
    env.fail_fleet_overrides(Some("c5.large"), None, "AuthFailure.ServiceLinkedRoleCreationNotPermitted").await;
    let claim = env.claim("slr", vec![req(labels::INSTANCE_TYPE, &["c5.large"])]);
    assert!(matches!(p.create(&claim, &LaunchOptions::default()).await, Err(CloudError::InsufficientCapacity { .. })));
    let types = p.instance_types(&env.pool()).await.unwrap();
    assert!(
        types.iter().flat_map(|t| &t.offerings).filter(|o| o.capacity_type == CapacityType::Spot).all(|o| !o.available)
    );
    env.clear_faults().await;
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!(i.capacity_type, CapacityType::OnDemand, "spot stays blocked: on-demand");
    p.delete(&with_provider_id(claim, &i.provider_id)).await.unwrap();

    // Some other error is a create error, not a capacity one.
    env.clear_faults().await;
    env.fail_fleet_overrides(Some("m5.xlarge"), None, "InvalidParameterValue").await;
    let claim = env
        .claim("broken", vec![req(labels::INSTANCE_TYPE, &["m5.xlarge"]), req(labels::CAPACITY_TYPE, &["on-demand"])]);
    assert!(
        matches!(p.create(&claim, &LaunchOptions::default()).await, Err(CloudError::Create { ref reason, .. }) if reason == "InvalidParameterValue")
    );
    env.clear_faults().await;
}

/// Fault-injected: real-looking spot prices (moto answers 0.00001 for all) price the spot offerings per
/// zone, and the cheapest zone's override is offered first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_prices_come_from_the_spot_price_history() {
    let env = Env::new("spot").await;
    // p4d.24xlarge is used by no other launching test: its prices cannot disturb them.
    env.fault(
        "/_fault/spot-prices",
        serde_json::json!({"prices": {"p4d.24xlarge": {"us-east-1a": 9.8311, "us-east-1b": 8.1204}}}),
    )
    .await;
    let p = env.provider().await;
    let types = p.instance_types(&env.pool()).await.unwrap();
    let p4d = types.iter().find(|t| t.name == "p4d.24xlarge").unwrap();
    assert_eq!(p4d.offering("us-east-1a", CapacityType::Spot).unwrap().price, 9.8311);
    assert_eq!(p4d.offering("us-east-1b", CapacityType::Spot).unwrap().price, 8.1204);
    let i = p
        .create(&env.claim("train", vec![req(labels::INSTANCE_TYPE, &["p4d.24xlarge"])]), &LaunchOptions::default())
        .await
        .unwrap();
    assert_eq!((i.zone.as_str(), i.capacity_type, i.price), ("us-east-1b", CapacityType::Spot, Some(8.1204)));
    // moto's own price for types the switchboard leaves alone.
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    assert_eq!(m5.offering("us-east-1a", CapacityType::Spot).unwrap().price, 0.00001);
    p.delete(&with_provider_id(env.claim("train", vec![]), &i.provider_id)).await.unwrap();
}

async fn create_queue(env: &Env) -> String {
    env.sqs
        .create_queue()
        .queue_name(format!("interruptions-{}", env.cluster))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_owned()
}

async fn send(env: &Env, queue: &str, body: serde_json::Value) {
    env.sqs.send_message().queue_url(queue).message_body(body.to_string()).send().await.unwrap();
}

fn event(detail_type: &str, source: &str, detail: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602", "detail-type": detail_type,
        "source": source, "account": "123456789012", "time": "2026-01-01T00:00:00Z", "region": REGION,
        "resources": [], "detail": detail})
}

/// moto (SQS): EventBridge-shaped messages become interruption notices for this cluster's instances;
/// unreadable messages and other clusters' instances are dropped; every message is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_messages_are_parsed_and_deleted() {
    let env = Env::new("sqs").await;
    let queue = create_queue(&env).await;
    let mut settings = env.settings();
    settings.interruption_queue = Some(format!("interruptions-{}", env.cluster));
    let p = Arc::new(env.provider_with(settings).await);
    let i = p
        .create(&env.claim("n", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]), &LaunchOptions::default())
        .await
        .unwrap();
    let id = i.provider_id.rsplit('/').next().unwrap().to_owned();
    let h = MotoHarness { env, provider: p.clone() };
    let foreign = h.create_foreign_instance().await.unwrap();
    let foreign_id = foreign.rsplit('/').next().unwrap();
    let env = &h.env;
    send(
        env,
        &queue,
        event("EC2 Instance Rebalance Recommendation", "aws.ec2", serde_json::json!({"instance-id": id})),
    )
    .await;
    env.sqs.send_message().queue_url(&queue).message_body("not an event").send().await.unwrap();
    send(
        env,
        &queue,
        event(
            "EC2 Instance State-change Notification",
            "aws.ec2",
            serde_json::json!({"instance-id": id, "state": "stopping"}),
        ),
    )
    .await;
    send(
        env,
        &queue,
        event(
            "AWS Health Event",
            "aws.health",
            serde_json::json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
            "affectedEntities": [{"entityValue": id}]}),
        ),
    )
    .await;
    send(
        env,
        &queue,
        event(
            "EC2 Spot Instance Interruption Warning",
            "aws.ec2",
            serde_json::json!({"instance-id": foreign_id, "instance-action": "terminate"}),
        ),
    )
    .await;
    // An instance EC2 no longer knows: dropped, without losing the others.
    send(
        env,
        &queue,
        event(
            "EC2 Spot Instance Interruption Warning",
            "aws.ec2",
            serde_json::json!({"instance-id": "i-0123456789abcdef0", "instance-action": "terminate"}),
        ),
    )
    .await;
    let mut got = p.interruptions().await.unwrap();
    got.sort_by_key(|i| format!("{:?}", i.kind));
    let kinds: Vec<InterruptionKind> = got.iter().map(|i| i.kind).collect();
    assert_eq!(kinds, [InterruptionKind::Rebalance, InterruptionKind::ScheduledChange, InterruptionKind::Stopping]);
    assert!(got.iter().all(|n| n.provider_id == i.provider_id));
    assert!(p.interruptions().await.unwrap().is_empty(), "every message was deleted, the unreadable one too");
    let left = env
        .sqs
        .get_queue_attributes()
        .queue_url(&queue)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap();
    let n = left.attributes().unwrap()[&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages].clone();
    assert_eq!(n, "0");
}

/// The default security group of the account's default VPC, which moto gives spot fleet instances.
async fn default_security_group(env: &Env) -> String {
    let vpcs = env
        .ec2
        .describe_vpcs()
        .filters(ec2::Filter::builder().name("is-default").values("true").build())
        .send()
        .await
        .unwrap();
    let vpc = vpcs.vpcs()[0].vpc_id().unwrap().to_owned();
    let groups = env
        .ec2
        .describe_security_groups()
        .filters(ec2::Filter::builder().name("vpc-id").values(vpc).build())
        .filters(ec2::Filter::builder().name("group-name").values("default").build())
        .send()
        .await
        .unwrap();
    groups.security_groups()[0].group_id().unwrap().to_owned()
}

/// moto (EC2 + SQS) driving the core's controllers in virtual time: a pod gets a spot node; a spot
/// interruption warning on the queue deletes its claim, terminates the instance, marks the offering
/// unavailable, and the pod gets a replacement node elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_from_sqs_replaces_the_node_in_virtual_time() {
    use tenon_core::sim::{Sim, pod};
    let env = Env::new("replace").await;
    let queue = create_queue(&env).await;
    let mut settings = env.settings();
    settings.interruption_queue = Some(queue.clone());
    let clock = VirtualClock::at_epoch();
    let provider = Arc::new(env.provider_with(settings).await.with_clock(clock.clone()));
    // moto gives spot instances launched through CreateFleet the default VPC's default security group, not
    // the launch template's (EC2 applies the template's). The controllers ask the provider about drift, so
    // the NodeClass selects that group here: otherwise the node would drift at once, which is moto's quirk,
    // not this test's subject.
    let mut node_class = serde_json::to_value(env.node_class()).unwrap();
    node_class["spec"]["securityGroupSelectorTerms"] = serde_json::json!([{"id": default_security_group(&env).await}]);
    provider.apply_node_class(serde_json::from_value(node_class).unwrap()).unwrap();
    let mut pool = env.pool();
    pool.spec.template.spec.requirements = vec![req(labels::INSTANCE_TYPE, &["m5.large", "m5.xlarge"])];
    let mut sim = Sim::new(clock, provider.clone(), vec![pool], Default::default());
    provider.set_unavailable_offerings(sim.unavailable.clone());
    sim.add_pod(pod("job", "1", 0));
    sim.run(Duration::from_secs(180), Duration::from_secs(10)).await;
    assert!(sim.pending().is_empty(), "the pod is bound: {:?}", sim.pending());
    let first = sim.live_claims()[0].clone();
    let pid = first.provider_id().unwrap().to_owned();
    assert_eq!(first.label(labels::CAPACITY_TYPE), Some("spot"));
    let zone = first.label(labels::ZONE).unwrap().to_owned();
    let itype = first.label(labels::INSTANCE_TYPE).unwrap().to_owned();
    let id = pid.rsplit('/').next().unwrap().to_owned();

    send(
        &env,
        &queue,
        event(
            "EC2 Spot Instance Interruption Warning",
            "aws.ec2",
            serde_json::json!({"instance-id": id, "instance-action": "terminate"}),
        ),
    )
    .await;
    sim.run(Duration::from_secs(300), Duration::from_secs(10)).await;

    assert_eq!(sim.runtime.lifecycle.counters.interruptions, 1);
    assert!(!sim.api.lock().claims.contains_key(first.name()), "the interrupted claim is gone");
    let state = env.describe(&id).await.state().unwrap().name().cloned();
    assert_eq!(state, Some(ec2::InstanceStateName::Terminated));
    let live = sim.live_claims();
    assert_eq!(live.len(), 1, "one replacement");
    let replacement = &live[0];
    assert_ne!(replacement.provider_id(), Some(pid.as_str()));
    let same_offering = replacement.label(labels::INSTANCE_TYPE) == Some(itype.as_str())
        && replacement.label(labels::ZONE) == Some(zone.as_str())
        && replacement.label(labels::CAPACITY_TYPE) == Some("spot");
    assert!(!same_offering, "the interrupted offering is avoided");
    assert!(sim.pending().is_empty(), "the pod runs again: {:?}", sim.pending());
    let listed = provider.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    for c in sim.live_claims() {
        provider.delete(&c).await.unwrap();
    }
}

/// A capacity reservation as `DescribeCapacityReservations` reports it, tagged to this test.
fn reservation(
    env: &Env,
    id: &str,
    itype: &str,
    zone: &str,
    free: i32,
    kind: &str,
    end: Option<String>,
) -> serde_json::Value {
    let mut r = serde_json::json!({
        "Region": env.region, "CapacityReservationId": id, "OwnerId": "123456789012", "InstanceType": itype,
        "InstancePlatform": "Linux/UNIX", "AvailabilityZone": zone, "Tenancy": "default", "State": "active",
        "TotalInstanceCount": free.max(1), "AvailableInstanceCount": free, "InstanceMatchCriteria": "targeted",
        "ReservationType": kind, "EndDateType": "unlimited",
        "Tags": [{"Key": "tenon-test", "Value": env.cluster}]
    });
    if let Some(end) = end {
        r["EndDate"] = end.into();
        r["EndDateType"] = "limited".into();
    }
    r
}

/// Fault-injected (moto has no capacity reservations; the switchboard serves `DescribeCapacityReservations`,
/// checked against EC2's model): a class's reservation terms resolve to its active reservations (an ended
/// one is dropped, a capacity block about to end is kept as `expiring`), each a `reserved` offering of its
/// type and zone, counted and nearly free; a claim that may take reserved capacity launches into it through
/// a launch template targeting the reservation, and the count goes down; a reservation that turns out full
/// is marked so without marking the on-demand offering of its type and zone. Other launches opt out of
/// open reservations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_reservations_are_offered_and_targeted() {
    use tenon_core::api::ConditionStatus;
    let env = Env::new("reserved").await;
    let (zone_a, zone_b) = (env.subnets[0].1.clone(), env.subnets[1].1.clone());
    let clock = VirtualClock::new(jiff::Timestamp::from_second(1_800_000_000).unwrap());
    let at = |secs: i64| jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap().to_string();
    let odcr = format!("cr-{:x}a", std::process::id());
    let block = format!("cr-{:x}b", std::process::id());
    let ended = format!("cr-{:x}c", std::process::id());
    let soon = format!("cr-{:x}d", std::process::id());
    env.fault(
        "/_fault/capacity-reservations",
        serde_json::json!({"reservations": [
            reservation(&env, &odcr, "m5.large", &zone_a, 2, "default", None),
            reservation(&env, &block, "c5.large", &zone_b, 4, "capacity-block", Some(at(10 * 60))),
            reservation(&env, &ended, "m5.xlarge", &zone_a, 4, "default", Some(at(-60))),
            reservation(&env, &soon, "g5.xlarge", &zone_a, 1, "capacity-block", Some(at(42 * 60))),
        ]}),
    )
    .await;
    let p = AwsProvider::from_sdk_config(env.settings(), &sdk_config().await).with_clock(clock.clone());
    let mut class = env.node_class();
    class.spec.capacity_reservation_selector_terms =
        vec![serde_json::from_value(serde_json::json!({"tags": {"tenon-test": env.cluster}})).unwrap()];
    p.apply_node_class(class.clone()).unwrap();
    let status = p.node_class_status(&class).await;
    let ready = status.conditions.iter().find(|c| c.type_ == "CapacityReservationsReady").unwrap();
    assert_eq!(ready.status, ConditionStatus::True);
    let ids: Vec<(&str, &str, &str)> = status
        .capacity_reservations
        .iter()
        .map(|r| (r.id.as_str(), r.reservation_type.as_str(), r.state.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            (odcr.as_str(), "default", "active"),
            (block.as_str(), "capacity-block", "expiring"),
            (soon.as_str(), "capacity-block", "active")
        ]
    );

    let reserved = |types: &[tenon_core::cloud::InstanceType], name: &str| {
        let t = types.iter().find(|t| t.name == name).unwrap();
        t.offerings.iter().find(|o| o.capacity_type == CapacityType::Reserved).cloned()
    };
    let types = p.instance_types(&env.pool()).await.unwrap();
    let m5 = reserved(&types, "m5.large").unwrap();
    assert_eq!((m5.zone.as_str(), m5.available, m5.reservation_capacity), (zone_a.as_str(), true, Some(2)));
    assert_eq!(m5.reservation_id.as_deref(), Some(odcr.as_str()));
    assert!(m5.price < 1e-6, "reserved capacity is paid for already: {}", m5.price);
    let described = env.ec2.describe_subnets().subnet_ids(&env.subnets[0].0).send().await.unwrap();
    let zone_id = described.subnets()[0].availability_zone_id().unwrap().to_owned();
    assert_eq!(m5.labels.get("topology.k8s.aws/zone-id"), Some(&zone_id), "offerings carry their zone's id");
    assert!(!reserved(&types, "c5.large").unwrap().available, "a capacity block about to end is not offered");
    assert!(reserved(&types, "m5.xlarge").is_none(), "an ended reservation is gone");
    assert!(reserved(&types, "g5.xlarge").unwrap().available);
    // Two minutes on, that block is within 40 minutes of its end: no longer offered, whatever the cache.
    clock.advance(Duration::from_secs(2 * 60));
    let types = p.instance_types(&env.pool()).await.unwrap();
    assert!(!reserved(&types, "g5.xlarge").unwrap().available, "a capacity block about to end is withdrawn on time");

    // A claim that may take reserved capacity takes it first.
    let claim = env.claim(
        "reserved-1",
        vec![req(labels::INSTANCE_TYPE, &["m5.large"]), req(labels::CAPACITY_TYPE, &["reserved", "on-demand"])],
    );
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!((i.capacity_type, i.zone.as_str()), (CapacityType::Reserved, zone_a.as_str()));
    assert_eq!(i.labels.get("karpenter.k8s.aws/capacity-reservation-id"), Some(&odcr));
    assert_eq!(i.labels.get("karpenter.k8s.aws/capacity-reservation-type").map(String::as_str), Some("default"));
    assert_eq!(i.labels.get(labels::RESERVATION_ID), Some(&odcr));
    assert_eq!(i.labels.get("topology.k8s.aws/zone-id"), Some(&zone_id));
    let target = |data: &ec2::ResponseLaunchTemplateData| {
        data.capacity_reservation_specification().map(|s| {
            (
                s.capacity_reservation_preference().map(|p| p.as_str().to_owned()),
                s.capacity_reservation_target().and_then(|t| t.capacity_reservation_id()).map(str::to_owned),
            )
        })
    };
    let mut targets = Vec::new();
    for lt in launch_templates(&env).await {
        targets.push(target(&template_data(&env, &lt).await));
    }
    assert_eq!(targets, [Some((Some("capacity-reservations-only".into()), Some(odcr.clone())))]);
    let types = p.instance_types(&env.pool()).await.unwrap();
    assert_eq!(reserved(&types, "m5.large").unwrap().reservation_capacity, Some(1), "one taken");

    // The reservation is full after all: the launch fails over its reservation, not its market.
    env.fail_fleet_overrides(Some("m5.large"), None, "ReservationCapacityExceeded").await;
    let claim2 = env.claim(
        "reserved-2",
        vec![req(labels::INSTANCE_TYPE, &["m5.large"]), req(labels::CAPACITY_TYPE, &["reserved"])],
    );
    let err = p.create(&claim2, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");
    let types = p.instance_types(&env.pool()).await.unwrap();
    let m5 = reserved(&types, "m5.large").unwrap();
    assert!(!m5.available && m5.reservation_capacity == Some(0));
    let t = types.iter().find(|t| t.name == "m5.large").unwrap();
    assert!(
        t.offering(&zone_a, CapacityType::OnDemand).unwrap().available,
        "on-demand m5.large in {zone_a} is untouched"
    );
    env.clear_faults().await;

    // An on-demand launch never lands in an open reservation by chance.
    let claim3 = env.claim(
        "reserved-3",
        vec![req(labels::INSTANCE_TYPE, &["c5.large"]), req(labels::CAPACITY_TYPE, &["on-demand"])],
    );
    let i3 = p.create(&claim3, &LaunchOptions::default()).await.unwrap();
    assert_eq!(i3.capacity_type, CapacityType::OnDemand);
    let mut targets = Vec::new();
    for lt in launch_templates(&env).await {
        targets.push(target(&template_data(&env, &lt).await));
    }
    assert!(targets.contains(&Some((Some("none".into()), None))), "{targets:?}");
    for (c, id) in [(claim, &i.provider_id), (claim3, &i3.provider_id)] {
        p.delete(&with_provider_id(c, id)).await.unwrap();
    }
}

/// Fault-injected (moto reports every status check passing and knows no scheduled events; the
/// switchboard's `DescribeInstanceStatus` follows EC2's model): an instance whose check failed more than
/// two minutes ago is `Impaired`, one failing for less is left alone, a scheduled maintenance is a
/// `ScheduledChange`, another cluster's instance is not reported; checks are read once a minute, with or
/// without an interruption queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_checks_report_impaired_instances_and_scheduled_events() {
    use tenon_core::cloud::InterruptionKind;
    let env = Env::new("status-checks").await;
    let clock = VirtualClock::new(jiff::Timestamp::from_second(1_800_000_000).unwrap());
    let ago = |secs: i64| jiff::Timestamp::from_second(1_800_000_000 - secs).unwrap().to_string();
    let p = AwsProvider::from_sdk_config(env.settings(), &sdk_config().await).with_clock(clock.clone());
    p.apply_node_class(env.node_class()).unwrap();
    let mut launched = Vec::new();
    for n in 0..3 {
        let claim = env.claim(&format!("checks-{n}"), vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
        let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
        launched.push((claim, i.provider_id));
    }
    let id = |n: usize| tenon_providers::aws::instance_id(&launched[n].1).unwrap().to_owned();
    let foreign = MotoHarness { env: Env::new("status-foreign").await, provider: Arc::new(env.provider().await) };
    let foreign_id = foreign.create_foreign_instance().await.unwrap();
    let foreign_id = tenon_providers::aws::instance_id(&foreign_id).unwrap().to_owned();
    env.fault(
        "/_fault/instance-status",
        serde_json::json!({"statuses": {
            id(0): {"InstanceStatus": "impaired", "ImpairedSince": ago(600)},
            id(1): {"SystemStatus": "impaired", "ImpairedSince": ago(30)},
            id(2): {"Events": [{"Code": "system-maintenance", "Description": "scheduled maintenance", "NotBefore": ago(-3600)}]},
            foreign_id: {"InstanceStatus": "impaired", "ImpairedSince": ago(600)},
        }}),
    )
    .await;
    let seen = |found: Vec<tenon_core::cloud::Interruption>| {
        let v: BTreeMap<String, InterruptionKind> = found.into_iter().map(|i| (i.provider_id, i.kind)).collect();
        v
    };
    let want = BTreeMap::from([
        (launched[0].1.clone(), InterruptionKind::Impaired),
        (launched[2].1.clone(), InterruptionKind::ScheduledChange),
    ]);
    assert_eq!(seen(p.interruptions().await.unwrap()), want);
    assert!(p.interruptions().await.unwrap().is_empty(), "read once a minute");
    clock.advance(Duration::from_secs(60));
    assert_eq!(seen(p.interruptions().await.unwrap()), want);
    for (c, pid) in launched {
        p.delete(&with_provider_id(c, &pid)).await.unwrap();
    }
}

/// A minimal HTTP/1.1 GET of the fault switchboard; returns the body.
async fn get(url: &str) -> String {
    use std::io::{Read, Write};
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_at(rest.find('/').unwrap());
        let mut s = std::net::TcpStream::connect(host).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
    })
    .await
    .unwrap()
}

/// Every action docs/aws.md's IAM policy allows (`ec2:CreateFleet`, …).
fn documented_policy_actions() -> std::collections::BTreeSet<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/aws.md")).unwrap();
    let section = &doc[doc.find("## IAM permissions").unwrap()..];
    let start = section.find("```json").unwrap() + "```json".len();
    let end = start + section[start..].find("```").unwrap();
    let policy: serde_json::Value = serde_json::from_str(&section[start..end]).unwrap();
    let mut out = std::collections::BTreeSet::new();
    for statement in policy["Statement"].as_array().unwrap() {
        match &statement["Action"] {
            serde_json::Value::String(a) => {
                out.insert(a.clone());
            }
            serde_json::Value::Array(list) => out.extend(list.iter().map(|a| a.as_str().unwrap().to_owned())),
            other => panic!("a statement's Action is {other}"),
        }
    }
    out
}

/// Fault-injected (the switchboard records the actions of requests signed with this test's key; its SSM
/// parameters and capacity reservations stand in for AWS's): the provider runs a class through its whole
/// life (status, instance profile, alias, reservations, prices, launch, list, get, drift, reboot,
/// interruptions, delete, class deletion), and every request it made is an action docs/aws.md's IAM policy
/// allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_iam_policy_allows_every_request_the_provider_makes() {
    let env = Env::new("iam").await;
    let key = format!("record-{}", env.cluster);
    let role = create_role(&env).await;
    let k8s = unique_kubernetes_version();
    env.create_eks_cluster(Some(&k8s)).await;
    let path = format!("/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2023/x86_64/standard/recommended/image_id");
    publish_ssm_parameters(&env, &[(path, &env.ami)]).await;
    let zone = env.subnets[0].1.clone();
    let cr = format!("cr-{:x}f", std::process::id());
    env.fault(
        "/_fault/capacity-reservations",
        serde_json::json!({"reservations": [reservation(&env, &cr, "m5.xlarge", &zone, 1, "default", None)]}),
    )
    .await;
    let queue = create_queue(&env).await;
    let mut settings = env.settings();
    settings.interruption_queue = Some(queue.clone());
    let recording = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .endpoint_url(endpoint())
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(&key, "secret", None, None, "tenon-tests"))
        .load()
        .await;
    let p = AwsProvider::from_sdk_config(settings, &recording);
    let mut class = env.node_class();
    class.spec.role = Some(role);
    class.spec.ami_selector_terms =
        vec![serde_json::from_value(serde_json::json!({"alias": "al2023@latest"})).unwrap()];
    class.spec.capacity_reservation_selector_terms =
        vec![serde_json::from_value(serde_json::json!({"tags": {"tenon-test": env.cluster}})).unwrap()];
    p.apply_node_class(class.clone()).unwrap();
    let status = p.node_class_status(&class).await;
    assert!(status.conditions.iter().all(|c| c.status == tenon_core::api::ConditionStatus::True), "{status:?}");
    p.instance_types(&env.pool()).await.unwrap();
    let claim = env.claim("iam-1", vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
    let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
    let claim = with_provider_id(claim, &i.provider_id);
    p.list().await.unwrap();
    p.get(&i.provider_id).await.unwrap();
    p.is_drifted(&claim).await.unwrap();
    p.reboot(&claim).await.unwrap();
    let id = tenon_providers::aws::instance_id(&i.provider_id).unwrap().to_owned();
    send(
        &env,
        &queue,
        event("EC2 Spot Instance Interruption Warning", "aws.ec2", serde_json::json!({"instance-id": id})),
    )
    .await;
    assert_eq!(p.interruptions().await.unwrap().len(), 1);
    p.delete(&claim).await.unwrap();
    p.delete_node_class(&env.class_name()).await.unwrap();

    let made: Vec<String> =
        serde_json::from_str(&get(&format!("{}/_fault/actions?key={key}", endpoint())).await).unwrap();
    let made: std::collections::BTreeSet<String> = made.into_iter().collect();
    for expected in [
        "ec2:CreateFleet",
        "ec2:CreateLaunchTemplate",
        "ec2:DescribeCapacityReservations",
        "ec2:DescribeInstanceStatus",
        "ec2:TerminateInstances",
        "ec2:RebootInstances",
        "ec2:DeleteLaunchTemplate",
        "ssm:GetParameter",
        "pricing:GetProducts",
        "eks:DescribeCluster",
        "iam:CreateInstanceProfile",
        "iam:DeleteInstanceProfile",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
    ] {
        assert!(made.contains(expected), "the run made no {expected}: {made:?}");
    }
    let allowed = documented_policy_actions();
    let missing: Vec<&String> = made.iter().filter(|a| !allowed.contains(*a)).collect();
    assert!(missing.is_empty(), "docs/aws.md's IAM policy does not allow {missing:?}");
}

/// Fault-injected (EKS's public SSM parameters): a Karpenter class with an AL2 or a Bottlerocket alias
/// boots the image its parameter names, with user data that joins the cluster: AL2's `bootstrap.sh` with
/// the endpoint and CA, Bottlerocket's TOML `settings.kubernetes` with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn al2_and_bottlerocket_aliases_launch_with_user_data_that_joins_the_cluster() {
    let env = Env::new("families").await;
    let k8s = unique_kubernetes_version();
    publish_ssm_parameters(
        &env,
        &[
            (format!("/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2/recommended/image_id"), &env.ami),
            (format!("/aws/service/bottlerocket/aws-k8s-{k8s}/x86_64/latest/image_id"), &env.gpu_ami),
        ],
    )
    .await;
    let mut settings = env.settings();
    settings.kubernetes_version = Some(k8s);
    settings.cluster_endpoint = Some("https://api.families.example".into());
    settings.cluster_ca_bundle = Some("Y2E=".into());
    settings.cluster_service_cidr = Some("10.100.0.0/16".into());
    let p = env.provider_with(settings).await;
    for (alias, image) in [("al2@latest", &env.ami), ("bottlerocket@latest", &env.gpu_ami)] {
        let mut class = env.node_class();
        class.spec.user_data = None;
        class.spec.ami_selector_terms = vec![serde_json::from_value(serde_json::json!({"alias": alias})).unwrap()];
        class.spec.kubelet = serde_json::json!({"maxPods": 42}).as_object().cloned();
        p.apply_node_class(class).unwrap();
        let claim = env.claim(&format!("family-{}", &alias[..3]), vec![req(labels::INSTANCE_TYPE, &["m5.large"])]);
        let i = p.create(&claim, &LaunchOptions::default()).await.unwrap();
        assert_eq!(i.image_id.as_ref(), Some(image), "{alias}");
        let mut found = false;
        for lt in launch_templates(&env).await {
            let data = template_data(&env, &lt).await;
            if data.image_id() != Some(image.as_str()) {
                continue;
            }
            found = true;
            let text = String::from_utf8(aws_smithy_types::base64::decode(data.user_data().unwrap()).unwrap()).unwrap();
            if alias.starts_with("al2@") {
                assert!(text.contains("/etc/eks/bootstrap.sh"), "{text}");
                assert!(
                    text.contains("--apiserver-endpoint 'https://api.families.example'")
                        || text.contains("--apiserver-endpoint https://api.families.example"),
                    "{text}"
                );
                assert!(text.contains("--b64-cluster-ca 'Y2E='") || text.contains("--b64-cluster-ca Y2E="), "{text}");
                assert!(text.contains("--max-pods=42"), "{text}");
            } else {
                let doc: toml::Value = toml::from_str(&text).unwrap();
                let k = &doc["settings"]["kubernetes"];
                assert_eq!(k["api-server"].as_str(), Some("https://api.families.example"));
                assert_eq!(k["cluster-certificate"].as_str(), Some("Y2E="));
                assert_eq!(k["max-pods"].as_integer(), Some(42));
                assert_eq!(
                    k["node-taints"]["karpenter.sh/unregistered"][0].as_str(),
                    Some(":NoExecute"),
                    "no value, as Karpenter writes it"
                );
            }
        }
        assert!(found, "{alias}: no launch template boots {image}");
        p.delete(&with_provider_id(claim, &i.provider_id)).await.unwrap();
    }
}
