//! The AWS provider's settings.

use std::time::Duration;

/// How the AWS provider reaches EC2 and SQS, and how long it keeps what it read.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsSettings {
    /// The cluster's name: instances are tagged `kubernetes.io/cluster/<name>=owned` and only those are
    /// listed, read or deleted.
    pub cluster_name: String,
    /// The region; `None` takes it from the standard AWS chain (`AWS_REGION`, profile, instance metadata).
    pub region: Option<String>,
    /// An endpoint for EC2 and SQS instead of AWS's (an emulator, a VPC endpoint).
    pub endpoint_url: Option<String>,
    /// The SQS queue (name or URL) EventBridge delivers interruption events to; `None` disables
    /// interruption handling.
    pub interruption_queue: Option<String>,
    /// Long-poll wait of one read of the interruption queue (0 to 20 s); 0 returns at once.
    pub interruption_wait: Duration,
    /// How long instance shapes (`DescribeInstanceTypes`) are kept.
    pub shapes_ttl: Duration,
    /// How long zone offerings and spot prices are kept.
    pub offerings_ttl: Duration,
    /// How long a NodeClass's resolved subnets, security groups and AMIs are kept.
    pub node_class_ttl: Duration,
    /// How long an offering that failed to launch stays unavailable.
    pub unavailable_ttl: Duration,
    /// At most this many instance types are offered to one `CreateFleet` call (each in every zone).
    pub max_instance_types: usize,
    /// Instance type name patterns (`m5.*`, `g5.xlarge`) to read; empty reads every type.
    pub instance_type_patterns: Vec<String>,
    /// The Kubernetes version `alias` terms are pinned to (`1.33`); `None` takes the API server's (which the
    /// operator passes with [`super::AwsProvider::set_kubernetes_version`]), else EKS `DescribeCluster`'s.
    pub kubernetes_version: Option<String>,
    /// A `region,instance_type,usd_per_hour` CSV replacing the bundled on-demand prices; re-read on
    /// every price refresh.
    pub on_demand_price_file: Option<String>,
    /// How often on-demand prices are read again: from the Pricing API, or from `on_demand_price_file`.
    pub price_refresh: Duration,
    /// The cluster runs without a route to the Pricing API (Karpenter's `ISOLATED_VPC`): on-demand prices
    /// are the bundled table's (or `on_demand_price_file`'s) only.
    pub isolated_vpc: bool,
    /// Capacity reservations are resolved, offered as `reserved` capacity and targeted (the core's
    /// `ReservedCapacity` gate); off, launches may land in open reservations as EC2 places them.
    pub reserved_capacity: bool,
    /// The root volume size in GiB when the NodeClass does not say (ephemeral storage capacity).
    pub default_root_volume_gib: i64,
    /// The share of an instance's memory the hypervisor keeps (0.075, as Karpenter's default): memory
    /// capacity is what EC2 reports less this, rounded up to the MiB (and 64 MiB less on arm64).
    pub vm_memory_overhead: f64,
    /// The API server URL nodes join; `None` asks EKS `DescribeCluster`.
    pub cluster_endpoint: Option<String>,
    /// The cluster CA bundle (base64 PEM); `None` asks EKS `DescribeCluster`.
    pub cluster_ca_bundle: Option<String>,
    /// The service CIDR; `None` asks EKS `DescribeCluster`.
    pub cluster_service_cidr: Option<String>,
}

impl AwsSettings {
    /// Defaults for `cluster_name`: 12 h shapes, 30 min offerings, 5 min NodeClass resolution, 3 min
    /// unavailable offerings, 60 instance types per launch.
    pub fn new(cluster_name: impl Into<String>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            region: None,
            endpoint_url: None,
            interruption_queue: None,
            interruption_wait: Duration::ZERO,
            shapes_ttl: Duration::from_secs(12 * 3600),
            offerings_ttl: Duration::from_secs(30 * 60),
            node_class_ttl: Duration::from_secs(5 * 60),
            unavailable_ttl: Duration::from_secs(180),
            max_instance_types: 60,
            instance_type_patterns: Vec::new(),
            kubernetes_version: None,
            on_demand_price_file: None,
            price_refresh: Duration::from_secs(12 * 3600),
            isolated_vpc: false,
            reserved_capacity: true,
            default_root_volume_gib: 20,
            vm_memory_overhead: 0.075,
            cluster_endpoint: None,
            cluster_ca_bundle: None,
            cluster_service_cidr: None,
        }
    }
}
