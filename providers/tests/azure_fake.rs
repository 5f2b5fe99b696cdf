//! The Azure provider against a local fake of Resource Manager and the Retail Prices API
//! (`azure/fake.rs`), whose every request and answer is checked against Microsoft's published models
//! (PyPI's `azure-mgmt-compute` and `azure-mgmt-network`; see that module for how, and for the shapes
//! with no model). No ARM emulator exists; the fake serves what a test puts in its world: VM sizes as
//! Resource SKUs describe them (published vCPUs, memory and GPUs), AKS's node image versions, prices, and
//! faults.
//!
//! On-demand prices here are the bundled table's eastus figures; spot prices are figures of the tests'
//! own (a third of on-demand), not quotes.
#![cfg(feature = "azure")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "azure/fake.rs"]
mod fake;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use serde_json::{Value, json};
use tenon_core::api::{
    NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassRef, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator,
    labels,
};
use tenon_core::clock::{Clock, VirtualClock};
use tenon_core::cloud::conformance::{self, Harness};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DynCloudProvider, InstanceType, InterruptionKind, LaunchOptions,
    OfferingKey, UnavailableOfferings,
};
use tenon_core::resources::ResourceName;
use tenon_providers::azure::bootstrap::{AksBootstrap, Bootstrap, Secret as TokenSecret};
use tenon_providers::azure::images::UBUNTU_GALLERY;
use tenon_providers::azure::{AKSNodeClass, AzureProvider, AzureSettings, TAG_CLUSTER, TAG_NODE_POOL};

const SUB: &str = "00000000-0000-0000-0000-000000000001";
const RG: &str = "MC_aks_test_eastus";
const LOCATION: &str = "eastus";
const SUBNET: &str = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/aks-vnet/subnets/nodes";

/// VM sizes as Resource SKUs describe them in eastus (published shapes).
fn skus() -> Vec<Value> {
    let zones = ["1", "2", "3"];
    let common = [
        ("HyperVGenerations", "V1,V2"),
        ("CpuArchitectureType", "x64"),
        ("LowPriorityCapable", "True"),
        ("AcceleratedNetworkingEnabled", "True"),
        ("PremiumIO", "True"),
        ("EncryptionAtHostSupported", "True"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        common.iter().copied().chain(extra.iter().copied()).collect()
    };
    let mut a100 = fake::sku(
        "Standard_NC24ads_A100_v4",
        "standardNCADSA100v4Family",
        LOCATION,
        &zones,
        &with(&[
            ("vCPUs", "24"),
            ("MemoryGB", "220"),
            ("GPUs", "1"),
            ("EphemeralOSDiskSupported", "True"),
            ("MaxResourceVolumeMB", "65536"),
        ]),
    );
    // Not offered in zone 2 to this subscription.
    a100["restrictions"] = json!([{"type": "Zone", "values": [LOCATION], "reasonCode": "NotAvailableForSubscription",
        "restrictionInfo": {"locations": [LOCATION], "zones": ["2"]}}]);
    let mut f2 = fake::sku(
        "Standard_F2s_v2",
        "standardFSv2Family",
        LOCATION,
        &zones,
        &with(&[("vCPUs", "2"), ("MemoryGB", "4")]),
    );
    f2["restrictions"] = json!([{"type": "Location", "values": [LOCATION], "reasonCode": "NotAvailableForSubscription",
        "restrictionInfo": {"locations": [LOCATION]}}]);
    let arm = [
        ("HyperVGenerations", "V2"),
        ("CpuArchitectureType", "Arm64"),
        ("LowPriorityCapable", "True"),
        ("vCPUs", "8"),
        ("MemoryGB", "32"),
    ];
    vec![
        fake::sku(
            "Standard_D2s_v5",
            "standardDSv5Family",
            LOCATION,
            &zones,
            &with(&[("vCPUs", "2"), ("MemoryGB", "8")]),
        ),
        fake::sku(
            "Standard_D4s_v5",
            "standardDSv5Family",
            LOCATION,
            &zones,
            &with(&[("vCPUs", "4"), ("MemoryGB", "16")]),
        ),
        fake::sku("Standard_D8ps_v5", "standardDPSv5Family", LOCATION, &zones, &arm),
        fake::sku(
            "Standard_NC4as_T4_v3",
            "standardNCASv3_T4Family",
            LOCATION,
            &zones,
            &with(&[
                ("vCPUs", "4"),
                ("MemoryGB", "28"),
                ("GPUs", "1"),
                ("EphemeralOSDiskSupported", "True"),
                ("MaxResourceVolumeMB", "180224"),
            ]),
        ),
        fake::sku(
            "Standard_NC64as_T4_v3",
            "standardNCASv3_T4Family",
            LOCATION,
            &zones,
            &with(&[("vCPUs", "64"), ("MemoryGB", "440"), ("GPUs", "4")]),
        ),
        a100,
        fake::sku(
            "Standard_NV36ads_A10_v5",
            "standardNVADSA10v5Family",
            LOCATION,
            &zones,
            &with(&[("vCPUs", "36"), ("MemoryGB", "440"), ("GPUs", "1")]),
        ),
        fake::sku(
            "Standard_NV6ads_A10_v5",
            "standardNVADSA10v5Family",
            LOCATION,
            &zones,
            &with(&[("vCPUs", "6"), ("MemoryGB", "55"), ("GPUs", "1")]),
        ),
        f2,
        // Another location's size is never offered.
        fake::sku(
            "Standard_D2s_v5",
            "standardDSv5Family",
            "westeurope",
            &zones,
            &with(&[("vCPUs", "2"), ("MemoryGB", "8")]),
        ),
    ]
}

/// The bundled eastus on-demand price of `size`, and a spot price of the tests' own.
const PRICES: [(&str, &str, f64); 8] = [
    ("Standard_D2s_v5", "D2s v5", 0.096),
    ("Standard_D4s_v5", "D4s v5", 0.192),
    ("Standard_D8ps_v5", "D8ps v5", 0.308),
    ("Standard_NC4as_T4_v3", "NC4as T4 v3", 0.526),
    ("Standard_NC64as_T4_v3", "NC64as T4 v3", 4.352),
    ("Standard_NC24ads_A100_v4", "NC24ads A100 v4", 3.673),
    ("Standard_NV36ads_A10_v5", "NV36ads A10 v5", 3.2),
    ("Standard_NV6ads_A10_v5", "NV6ads A10 v5", 0.454),
];

fn spot_of(on_demand: f64) -> f64 {
    (on_demand / 3.0 * 10_000.0).round() / 10_000.0
}

/// The Retail Prices API's items: each size's Linux on-demand and spot meters, and the Windows and
/// low-priority ones that must be skipped (priced to be noticed if they were not).
fn price_items() -> Vec<Value> {
    let mut items = Vec::new();
    for (size, meter, p) in PRICES {
        let product = "Virtual Machines Series";
        items.push(fake::price_item(size, LOCATION, meter, product, meter, p));
        let spot = format!("{meter} Spot");
        items.push(fake::price_item(size, LOCATION, &spot, product, &spot, spot_of(p)));
        items.push(fake::price_item(size, LOCATION, meter, &format!("{product} Windows"), meter, p * 2.0));
        let low = format!("{meter} Low Priority");
        items.push(fake::price_item(size, LOCATION, &low, product, &low, 0.001));
    }
    items
}

struct Env {
    world: fake::Shared,
    endpoint: String,
    clock: Arc<VirtualClock>,
    provider: Arc<AzureProvider>,
    cache: Arc<UnavailableOfferings>,
}

fn settings(endpoint: &str, cluster: &str) -> AzureSettings {
    let mut s = AzureSettings::new(SUB, RG, LOCATION, cluster);
    s.endpoint = Some(endpoint.to_owned());
    s.prices_endpoint = Some(endpoint.to_owned());
    s.interruption_queue = Some(format!("{endpoint}/servicebus/interruptions"));
    s.vnet_subnet_id = Some(SUBNET.to_owned());
    s.ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAbCdEf test".into();
    s.operation_poll = Duration::from_millis(2);
    s.operation_timeout = Duration::from_secs(5);
    s.bootstrap = Bootstrap::Aks(AksBootstrap {
        cluster_endpoint: "https://test-dns-1a2b3c.hcp.eastus.azmk8s.io:443".into(),
        ca_bundle: "LS0tLS1CRUdJTi0tLS0t".into(),
        bootstrap_token: TokenSecret("abcdef.0123456789abcdef".into()),
        tenant_id: "00000000-0000-0000-0000-0000000000aa".into(),
        dns_service_ip: "10.0.0.10".into(),
        kubelet_identity_client_id: Some("00000000-0000-0000-0000-0000000000bb".into()),
        network_security_group: "aks-agentpool-1234-nsg".into(),
        route_table: String::new(),
    });
    s
}

impl Env {
    async fn new(cluster: &str) -> Self {
        let (endpoint, world) = fake::start().await;
        {
            let mut w = world.lock().unwrap();
            w.skus = skus();
            w.prices = price_items();
            for image in ["2204gen2containerd", "2204containerd", "2204gen2arm64containerd"] {
                w.gallery_versions.insert(
                    (UBUNTU_GALLERY.into(), image.into()),
                    vec![fake::gallery_version(UBUNTU_GALLERY, image, "202511.10.0", LOCATION)],
                );
            }
        }
        let clock = VirtualClock::at_epoch();
        let cache = Arc::new(UnavailableOfferings::new());
        let provider = Self::provider_on(&endpoint, cluster, &clock, |_| {}).with_unavailable_offerings(cache.clone());
        Self { world, endpoint, clock, provider: Arc::new(provider), cache }
    }

    fn provider_on(
        endpoint: &str,
        cluster: &str,
        clock: &Arc<VirtualClock>,
        f: impl FnOnce(&mut AzureSettings),
    ) -> AzureProvider {
        let mut s = settings(endpoint, cluster);
        f(&mut s);
        let p = AzureProvider::new(s, Some(Arc::new(fake::StaticToken))).unwrap().with_clock(clock.clone());
        p.set_kubernetes_version("v1.33.2").unwrap();
        p.apply_node_class(class(json!({}))).unwrap();
        p
    }

    fn pool(&self) -> NodePool {
        let mut pool = NodePool::new("default", NodePoolSpec::default());
        pool.spec.template.spec.node_class_ref = Some(class_ref());
        pool
    }

    fn claim(&self, name: &str, reqs: Vec<NodeSelectorRequirement>) -> NodeClaim {
        let mut c = NodeClaim::new(
            name,
            NodeClaimSpec { requirements: reqs, node_class_ref: Some(class_ref()), ..Default::default() },
        );
        c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
        c
    }

    fn fail(&self, size: &str, zone: &str, fault: fake::Fault, sticky: bool) {
        self.world.lock().unwrap().faults.push((fake::FaultMatch::new(size, zone, "*"), fault, sticky));
    }

    async fn types(&self) -> Vec<InstanceType> {
        self.provider.instance_types(&self.pool()).await.unwrap()
    }
}

fn class(extra: Value) -> AKSNodeClass {
    let mut spec = json!({"imageFamily": "Ubuntu", "osDiskSizeGB": 128});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({"apiVersion": "karpenter.azure.com/v1beta1", "kind": "AKSNodeClass",
        "metadata": {"name": "default"}, "spec": spec}))
    .unwrap()
}

fn class_ref() -> NodeClassRef {
    NodeClassRef { group: "karpenter.azure.com".into(), kind: "AKSNodeClass".into(), name: "default".into() }
}

fn req(key: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement::new(key, Operator::In, values.iter().copied())
}

fn pinned(size: &str, zone: &str, capacity: &str) -> Vec<NodeSelectorRequirement> {
    vec![req(labels::INSTANCE_TYPE, &[size]), req(labels::ZONE, &[zone]), req(labels::CAPACITY_TYPE, &[capacity])]
}

fn with_provider_id(mut claim: NodeClaim, pid: &str) -> NodeClaim {
    claim.status = Some(NodeClaimStatus { provider_id: Some(pid.to_owned()), ..Default::default() });
    claim
}

fn get<'a>(types: &'a [InstanceType], name: &str) -> &'a InstanceType {
    types.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} missing"))
}

fn offered(types: &[InstanceType], size: &str, zone: &str, ct: CapacityType) -> bool {
    types.iter().find(|t| t.name == size).and_then(|t| t.offering(zone, ct)).is_some_and(|o| o.available)
}

struct AzureHarness {
    env: Env,
}

#[async_trait]
impl Harness for AzureHarness {
    fn provider(&self) -> DynCloudProvider {
        self.env.provider.clone()
    }
    fn node_class_ref(&self) -> Option<NodeClassRef> {
        Some(class_ref())
    }
    fn max_polls(&self) -> usize {
        10
    }
    async fn make_insufficient(&self, offering: &OfferingKey) -> bool {
        let zone = offering.zone.rsplit('-').next().unwrap_or_default().to_owned();
        let fault = fake::Fault::Async { code: "ZonalAllocationFailed".into(), message: "injected".into() };
        self.env.fail(&offering.instance_type, &zone, fault, false);
        true
    }
    async fn create_foreign_instance(&self) -> Option<String> {
        let other = Env::provider_on(&self.env.endpoint, "another-cluster", &self.env.clock, |_| {});
        let claim = self.env.claim("someone-elses", pinned("Standard_D2s_v5", "eastus-1", "on-demand"));
        let i = other.create(&claim, &LaunchOptions::default()).await.ok()?;
        Some(i.provider_id)
    }
}

/// The core's conformance suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_passes_the_conformance_suite() {
    let h = AzureHarness { env: Env::new("conformance").await };
    conformance::assert_conformance(&h).await;
}

/// GPU sizes get their model from the size name (NC A100 v4, NV A10 v5, NC T4 v3), their count from the
/// SKU's `GPUs`, the `karpenter.azure.com/sku-*` labels and AKS's reservations; a size with a fraction
/// of an A10 is left out, as are sizes restricted in the location and another location's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_sizes_are_counted_labelled_and_reserved_as_aks_does() {
    let env = Env::new("gpus").await;
    let types = env.types().await;
    let names: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
    assert!(!names.contains(&"Standard_NV6ads_A10_v5"), "a fraction of a GPU: {names:?}");
    assert!(!names.contains(&"Standard_F2s_v2"), "restricted in eastus: {names:?}");
    for (size, model, count) in [
        ("Standard_NC24ads_A100_v4", "A100", 1),
        ("Standard_NV36ads_A10_v5", "A10", 1),
        ("Standard_NC4as_T4_v3", "T4", 1),
        ("Standard_NC64as_T4_v3", "T4", 4),
    ] {
        let t = get(&types, size);
        assert_eq!(t.capacity.get(ResourceName::NVIDIA_GPU), count, "{size}");
        assert_eq!(t.labels["karpenter.azure.com/sku-gpu-name"], model, "{size}");
        assert_eq!(t.labels["karpenter.azure.com/sku-gpu-manufacturer"], "nvidia");
        assert_eq!(t.labels["karpenter.azure.com/sku-gpu-count"], count.to_string());
        assert_eq!(t.labels["karpenter.azure.com/sku-family"], "N");
    }
    let a100 = get(&types, "Standard_NC24ads_A100_v4");
    assert_eq!(a100.labels["karpenter.azure.com/sku-series"], "NCads_v4");
    assert_eq!(a100.labels["karpenter.azure.com/sku-version"], "4");
    assert_eq!(a100.labels["karpenter.azure.com/sku-memory"], (220 * 1024).to_string());
    assert_eq!(a100.labels["karpenter.azure.com/sku-storage-ephemeralos-maxsize"], "68");
    let d4 = get(&types, "Standard_D4s_v5");
    assert_eq!(d4.labels["karpenter.azure.com/sku-gpu-count"], "0");
    assert_eq!(d4.capacity.get(ResourceName::CPU), 4000);
    // 16 GiB less 7.5% for the hypervisor; 250 pods (Azure CNI overlay).
    assert_eq!(d4.capacity.get(ResourceName::MEMORY), (16_384 - 1229) << 20);
    assert_eq!(d4.capacity.get(ResourceName::PODS), 250);
    assert_eq!(d4.overhead.kube_reserved.get(ResourceName::CPU), 140);
    assert_eq!(d4.overhead.kube_reserved.get(ResourceName::MEMORY), 4096 << 20, "a quarter of 16 GiB");
    assert_eq!(d4.overhead.eviction_threshold.get(ResourceName::MEMORY), 100 << 20);
    let arm = get(&types, "Standard_D8ps_v5");
    assert_eq!(arm.labels[labels::ARCH], "arm64");
    assert_eq!(arm.labels["karpenter.azure.com/sku-hyperv-generation"], "2");
    // Prices: the Linux meters, not the Windows or low-priority ones.
    assert_eq!(d4.offering("eastus-1", CapacityType::OnDemand).unwrap().price, 0.192);
    assert_eq!(d4.offering("eastus-1", CapacityType::Spot).unwrap().price, spot_of(0.192));
}

/// A size restricted in one zone is not offered there; everywhere else it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_restricted_size_is_not_offered_in_that_zone() {
    let env = Env::new("zones").await;
    let a100 = get(&env.types().await, "Standard_NC24ads_A100_v4").clone();
    let zones: std::collections::BTreeSet<&str> = a100.offerings.iter().map(|o| o.zone.as_str()).collect();
    assert_eq!(zones, ["eastus-1", "eastus-3"].into());
    let claim = env.claim(
        "in-zone-2",
        vec![req(labels::INSTANCE_TYPE, &["Standard_NC24ads_A100_v4"]), req(labels::ZONE, &["eastus-2"])],
    );
    let err = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");
    assert!(env.world.lock().unwrap().vm_puts().is_empty());
}

/// A spot launch: the NIC first, then the VM with `priority: Spot`, `evictionPolicy: Delete` and
/// `billingProfile.maxPrice: -1`, in its zone, with the ownership tags, the AKS node image and custom
/// data that joins the cluster; list, get and delete see it, and the NIC and OS disk go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_launch_carries_spot_fields_tags_image_and_bootstrap() {
    let env = Env::new("spot").await;
    let claim = env.claim("gpu-1", pinned("Standard_NC4as_T4_v3", "eastus-2", "spot"));
    let i = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!(
        (i.instance_type.as_str(), i.zone.as_str(), i.capacity_type),
        ("Standard_NC4as_T4_v3", "eastus-2", CapacityType::Spot)
    );
    assert!(i.provider_id.ends_with("/virtualMachines/aks-gpu-1"), "{}", i.provider_id);
    let vm = {
        let w = env.world.lock().unwrap();
        let order: Vec<String> = w
            .requests
            .iter()
            .filter(|r| r.method == "PUT")
            .map(|r| r.path.rsplit('/').nth(1).unwrap().to_owned())
            .collect();
        assert_eq!(order, ["networkInterfaces", "virtualMachines"], "the NIC before the VM");
        w.vm_puts()[0].clone()
    };
    let p = &vm["properties"];
    assert_eq!(p["priority"], "Spot");
    assert_eq!(p["evictionPolicy"], "Delete");
    assert_eq!(p["billingProfile"]["maxPrice"], -1.0);
    assert_eq!(vm["zones"], json!(["2"]));
    assert_eq!(p["hardwareProfile"]["vmSize"], "Standard_NC4as_T4_v3");
    assert_eq!(
        p["storageProfile"]["imageReference"]["communityGalleryImageId"],
        format!("/CommunityGalleries/{UBUNTU_GALLERY}/images/2204gen2containerd/versions/202511.10.0")
    );
    // 128 GB fits the T4 size's 188 GB resource disk: an ephemeral OS disk.
    assert_eq!(p["storageProfile"]["osDisk"]["diffDiskSettings"]["option"], "Local");
    assert_eq!(p["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"], "Delete");
    assert_eq!(vm["tags"][TAG_CLUSTER], "spot");
    assert_eq!(vm["tags"][TAG_NODE_POOL], "default");
    assert_eq!(vm["tags"]["compute.aks.billing"], "linux");
    let data = p["osProfile"]["customData"].as_str().unwrap();
    let script = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data).unwrap()).unwrap();
    for want in [
        "API_SERVER_NAME='test-dns-1a2b3c.hcp.eastus.azmk8s.io'",
        "TLS_BOOTSTRAP_TOKEN='abcdef.0123456789abcdef'",
        "GPU_NODE='true'",
        "--max-pods=250",
        "--kube-reserved=cpu=140m,memory=",
        "karpenter.sh/unregistered=true:NoExecute",
        "karpenter.sh/capacity-type=spot",
        "/opt/azure/containers/provision_start.sh",
    ] {
        assert!(script.contains(want), "custom data lacks {want}: {script}");
    }
    assert!(!format!("{:?}", env.provider.settings()).contains("0123456789abcdef"), "the token is not in Debug");

    let got = env.provider.get(&i.provider_id).await.unwrap();
    assert_eq!(
        (got.instance_type.as_str(), got.zone.as_str(), got.capacity_type),
        ("Standard_NC4as_T4_v3", "eastus-2", CapacityType::Spot)
    );
    assert_eq!(got.node_claim.as_deref(), Some("gpu-1"));
    assert!(env.provider.list().await.unwrap().iter().any(|x| x.provider_id == i.provider_id));
    let claim = with_provider_id(claim, &i.provider_id);
    let mut calls = 0;
    while env.provider.delete(&claim).await.is_ok() {
        calls += 1;
        assert!(calls < 5);
    }
    let w = env.world.lock().unwrap();
    assert!(w.vms.is_empty() && w.nics.is_empty() && w.disks.is_empty(), "VM, NIC and OS disk gone");
}

/// Each ARM error becomes its verdict: the offerings it keeps out, for its time; 429 is `Throttled` with
/// `Retry-After`, 401 and 403 `Unauthorized`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_errors_are_classified_with_their_ttls() {
    let env = Env::new("errors").await;
    let d2 = "Standard_D2s_v5";
    let sync =
        |code: &str, message: &str| fake::Fault::Sync { status: 409, code: code.into(), message: message.into() };

    // SkuNotAvailable: that size, that capacity type, that zone; 23 h on demand.
    env.fail(d2, "1", sync("SkuNotAvailable", "The requested size is not available"), false);
    let err = env
        .provider
        .create(&env.claim("e1", pinned(d2, "eastus-1", "on-demand")), &LaunchOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CloudError::InsufficientCapacity { offerings, .. } if offerings[0].zone == "eastus-1"),
        "{err}"
    );
    let types = env.types().await;
    assert!(!offered(&types, d2, "eastus-1", CapacityType::OnDemand));
    assert!(
        offered(&types, d2, "eastus-1", CapacityType::Spot) && offered(&types, d2, "eastus-2", CapacityType::OnDemand)
    );
    env.clock.advance(Duration::from_secs(22 * 3600));
    assert!(!offered(&env.types().await, d2, "eastus-1", CapacityType::OnDemand), "still out after 22 h");
    env.clock.advance(Duration::from_secs(3601));
    assert!(offered(&env.types().await, d2, "eastus-1", CapacityType::OnDemand), "back after 23 h");

    // ZonalAllocationFailed (after the VM was made, so it is deleted): the size in the zone, both ways, 1 h.
    let fault = fake::Fault::Async { code: "ZonalAllocationFailed".into(), message: "no capacity".into() };
    env.fail(d2, "2", fault, false);
    env.provider
        .create(&env.claim("e2", pinned(d2, "eastus-2", "on-demand")), &LaunchOptions::default())
        .await
        .unwrap_err();
    let types = env.types().await;
    assert!(
        !offered(&types, d2, "eastus-2", CapacityType::OnDemand)
            && !offered(&types, d2, "eastus-2", CapacityType::Spot)
    );
    assert!(offered(&types, d2, "eastus-3", CapacityType::OnDemand));
    env.clock.advance(Duration::from_secs(3601));
    assert!(offered(&env.types().await, d2, "eastus-2", CapacityType::Spot));

    // LowPriorityCores quota: every spot offering, 1 h.
    let quota = "Operation could not be completed as it results in exceeding approved LowPriorityCores quota. Current Limit: 10";
    env.fail("*", "*", sync("OperationNotAllowed", quota), false);
    env.provider.create(&env.claim("e3", pinned(d2, "eastus-3", "spot")), &LaunchOptions::default()).await.unwrap_err();
    let types = env.types().await;
    assert!(types.iter().all(|t| t.offerings.iter().all(|o| o.capacity_type != CapacityType::Spot || !o.available)));
    assert!(offered(&types, d2, "eastus-3", CapacityType::OnDemand));
    env.clock.advance(Duration::from_secs(3601));

    // A family's cores quota at zero: the whole family, that capacity type.
    let family = "Operation could not be completed as it results in exceeding approved standardDSv5Family Cores quota. \
                  Current Limit: 0, Current Usage: 0, Additional Required: 2";
    env.fail(d2, "*", sync("OperationNotAllowed", family), false);
    env.provider
        .create(&env.claim("e4", pinned(d2, "eastus-3", "on-demand")), &LaunchOptions::default())
        .await
        .unwrap_err();
    let types = env.types().await;
    assert!(!offered(&types, "Standard_D4s_v5", "eastus-1", CapacityType::OnDemand), "the family is out");
    assert!(offered(&types, "Standard_D8ps_v5", "eastus-1", CapacityType::OnDemand), "another family is not");
    env.clock.advance(Duration::from_secs(3601));

    // A family's quota with room: the size and larger ones of the family, 10 min.
    let some = family
        .replace("Current Limit: 0", "Current Limit: 4")
        .replace("Current Usage: 0", "Current Usage: 2")
        .replace("Required: 2", "Required: 4");
    env.fail("Standard_D4s_v5", "*", sync("OperationNotAllowed", &some), false);
    env.provider
        .create(&env.claim("e5", pinned("Standard_D4s_v5", "eastus-1", "on-demand")), &LaunchOptions::default())
        .await
        .unwrap_err();
    let types = env.types().await;
    assert!(!offered(&types, "Standard_D4s_v5", "eastus-2", CapacityType::OnDemand));
    assert!(offered(&types, d2, "eastus-2", CapacityType::OnDemand), "a smaller size of the family fits");
    env.clock.advance(Duration::from_secs(601));
    assert!(offered(&env.types().await, "Standard_D4s_v5", "eastus-2", CapacityType::OnDemand));

    // Overconstrained requests: zonal, that offering; regional, the size and capacity type everywhere.
    env.fail(d2, "1", sync("OverconstrainedZonalAllocationRequest", "constraints"), false);
    env.provider.create(&env.claim("e6", pinned(d2, "eastus-1", "spot")), &LaunchOptions::default()).await.unwrap_err();
    let types = env.types().await;
    assert!(
        !offered(&types, d2, "eastus-1", CapacityType::Spot) && offered(&types, d2, "eastus-1", CapacityType::OnDemand)
    );
    env.fail(d2, "*", sync("OverconstrainedAllocationRequest", "constraints"), false);
    env.provider.create(&env.claim("e7", pinned(d2, "eastus-2", "spot")), &LaunchOptions::default()).await.unwrap_err();
    let types = env.types().await;
    assert!(
        !offered(&types, d2, "eastus-3", CapacityType::Spot) && offered(&types, d2, "eastus-3", CapacityType::OnDemand)
    );
    env.clock.advance(Duration::from_secs(3601));

    // The regional cores quota: insufficient capacity, nothing kept out.
    let total = "Operation could not be completed as it results in exceeding approved Total Regional Cores quota. Current Limit: 100";
    env.fail(d2, "*", sync("OperationNotAllowed", total), false);
    let err = env
        .provider
        .create(&env.claim("e8", pinned(d2, "eastus-3", "on-demand")), &LaunchOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { .. }), "{err}");
    assert!(offered(&env.types().await, d2, "eastus-3", CapacityType::OnDemand));

    // Throttling and authorization.
    env.fail(d2, "*", fake::Fault::Throttled { retry_after_secs: 17 }, false);
    let err = env
        .provider
        .create(&env.claim("e9", pinned(d2, "eastus-3", "on-demand")), &LaunchOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::Throttled { retry_after: Some(d) } if d == Duration::from_secs(17)), "{err}");
    for status in [401, 403] {
        env.fail(d2, "*", fake::Fault::Unauthorized { status }, false);
        let err = env
            .provider
            .create(&env.claim("e10", pinned(d2, "eastus-3", "on-demand")), &LaunchOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err, CloudError::Unauthorized(_)), "{status}: {err}");
    }
    // Nothing any failure made is left behind.
    let w = env.world.lock().unwrap();
    assert!(w.vms.is_empty() && w.nics.is_empty(), "vms {:?} nics {:?}", w.vms.keys(), w.nics.keys());
}

/// A VM create that fails after Azure made the VM (left `Failed`) deletes the VM, then its NIC, before
/// the next offering is tried; the launch lands on that next offering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_vm_create_cleans_up_its_nic_and_the_next_offering_is_tried() {
    let env = Env::new("cleanup").await;
    let fault = fake::Fault::Async { code: "AllocationFailed".into(), message: "no capacity".into() };
    env.fail("Standard_D2s_v5", "1", fault, false);
    let claim = env.claim(
        "web-1",
        vec![req(labels::INSTANCE_TYPE, &["Standard_D2s_v5"]), req(labels::CAPACITY_TYPE, &["on-demand"])],
    );
    let i = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert_eq!(i.zone, "eastus-2", "the next zone");
    let w = env.world.lock().unwrap();
    let deletes: Vec<String> = w
        .requests
        .iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.path.rsplit('/').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(deletes, ["virtualMachines", "networkInterfaces"], "the failed VM, then its NIC");
    assert_eq!(w.vms.len(), 1);
    assert_eq!(w.nics.len(), 1, "only the live VM's NIC");
    assert!(env.cache.is_unavailable(
        "azure",
        &OfferingKey::new("Standard_D2s_v5", "eastus-1", CapacityType::OnDemand),
        env.clock.now()
    ));
}

/// Retail prices come in pages (followed to the end), Windows and low-priority meters are skipped and
/// spot meters price spot; without the API, the bundled table prices on-demand and spot is not offered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retail_prices_are_paged_and_filtered_and_the_bundled_table_is_the_fallback() {
    let env = Env::new("prices").await;
    env.world.lock().unwrap().price_page_size = 3;
    let types = env.types().await;
    let pages = env.world.lock().unwrap().requests.iter().filter(|r| r.path == "/api/retail/prices").count();
    assert_eq!(pages, PRICES.len() * 4 / 3 + 1, "every page read");
    let t4 = get(&types, "Standard_NC4as_T4_v3");
    assert_eq!(t4.offering("eastus-1", CapacityType::OnDemand).unwrap().price, 0.526, "Linux, not Windows");
    assert_eq!(t4.offering("eastus-1", CapacityType::Spot).unwrap().price, spot_of(0.526), "spot, not low priority");
    let query =
        env.world.lock().unwrap().requests.iter().find(|r| r.path == "/api/retail/prices").unwrap().query.clone();
    assert!(query.contains("armRegionName") && query.contains("eastus"), "{query}");

    // No Retail Prices API: the bundled on-demand table, and no spot.
    let p = Env::provider_on(&env.endpoint, "prices", &env.clock, |s| {
        s.prices_endpoint = Some("http://127.0.0.1:9".into())
    });
    let types = p.instance_types(&env.pool()).await.unwrap();
    let d4 = get(&types, "Standard_D4s_v5");
    assert_eq!(d4.offering("eastus-1", CapacityType::OnDemand).unwrap().price, 0.192);
    assert!(!d4.offering("eastus-1", CapacityType::Spot).unwrap().available, "no spot price, no spot");
}

/// Only this cluster's VMs are listed, read or deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_vms_are_never_touched() {
    let env = Env::new("mine").await;
    let other = Env::provider_on(&env.endpoint, "theirs", &env.clock, |_| {});
    let claim = env.claim("shared-name", pinned("Standard_D2s_v5", "eastus-1", "on-demand"));
    let theirs = other.create(&claim, &LaunchOptions::default()).await.unwrap();
    assert!(env.provider.list().await.unwrap().is_empty());
    assert!(env.provider.get(&theirs.provider_id).await.unwrap_err().is_not_found());
    let err = env.provider.delete(&with_provider_id(claim.clone(), &theirs.provider_id)).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let mine = env.claim("mine-1", pinned("Standard_D2s_v5", "eastus-1", "on-demand"));
    env.provider.create(&mine, &LaunchOptions::default()).await.unwrap();
    let w = env.world.lock().unwrap();
    assert_eq!(w.vms.len(), 2, "theirs is still there");
    assert!(w.requests.iter().all(|r| r.method != "DELETE"), "nothing of theirs was deleted");
}

/// Drift: the class's static fields changed (NodeClassDrift), a newer node image published
/// (ImageDrift), the class moved to another subnet (SubnetDrift).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_follows_the_class_the_images_and_the_subnet() {
    let env = Env::new("drift").await;
    let claim = env.claim("d-1", pinned("Standard_D2s_v5", "eastus-1", "on-demand"));
    let i = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap();
    let claim = with_provider_id(claim, &i.provider_id);
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap(), None);

    // Tags are not static: no drift.
    env.provider.apply_node_class(class(json!({"tags": {"team": "web"}}))).unwrap();
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap(), None);
    env.provider.apply_node_class(class(json!({"osDiskSizeGB": 64}))).unwrap();
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap().unwrap().0, "NodeClassDrift");
    env.provider.apply_node_class(class(json!({}))).unwrap();
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap(), None);

    // A newer image: once the class resolves again (five minutes), the node is on an old one.
    {
        let mut w = env.world.lock().unwrap();
        let mut newer = fake::gallery_version(UBUNTU_GALLERY, "2204gen2containerd", "202512.01.0", LOCATION);
        newer["properties"]["publishedDate"] = json!("2025-12-01T00:00:00Z");
        w.gallery_versions.get_mut(&(UBUNTU_GALLERY.to_owned(), "2204gen2containerd".to_owned())).unwrap().push(newer);
    }
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap(), None, "kept five minutes");
    env.clock.advance(Duration::from_secs(301));
    assert_eq!(env.provider.is_drifted(&claim).await.unwrap().unwrap().0, "ImageDrift");
    // Pinned to the node's version, it is not drifted.
    env.provider.apply_node_class(class(json!({"imageVersion": "202511.10.0"}))).unwrap();
    assert_eq!(
        env.provider.is_drifted(&claim).await.unwrap().unwrap().0,
        "NodeClassDrift",
        "the pin is a static field"
    );

    let other = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/aks-vnet/subnets/other";
    // The newer image withdrawn, the settings' subnet changed.
    env.world
        .lock()
        .unwrap()
        .gallery_versions
        .get_mut(&(UBUNTU_GALLERY.to_owned(), "2204gen2containerd".to_owned()))
        .unwrap()
        .pop();
    let p = Env::provider_on(&env.endpoint, "drift", &env.clock, |s| s.vnet_subnet_id = Some(other.into()));
    assert_eq!(p.is_drifted(&claim).await.unwrap().unwrap().0, "SubnetDrift");
}

/// A class whose family has no published image, or a FIPS class, is not ready, naming the class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_without_images_is_not_ready() {
    let env = Env::new("images").await;
    env.provider.apply_node_class(class(json!({"imageFamily": "AzureLinux"}))).unwrap();
    let err = env.provider.instance_types(&env.pool()).await.unwrap_err();
    assert!(
        matches!(&err, CloudError::NodeClassNotReady(m) if m.contains("AKSNodeClass/default") && m.contains("V3gen2")),
        "{err}"
    );
    env.provider.apply_node_class(class(json!({"fipsMode": "FIPS"}))).unwrap();
    let err = env.provider.instance_types(&env.pool()).await.unwrap_err();
    assert!(matches!(&err, CloudError::NodeClassNotReady(m) if m.contains("FIPS")), "{err}");
    let status = env.provider.node_class_status(&class(json!({"imageFamily": "AzureLinux"}))).await;
    let images = status.conditions.iter().find(|c| c.type_ == "ImagesReady").unwrap();
    assert_eq!(images.reason, "ImagesNotFound");
    let ready = env.provider.node_class_status(&class(json!({}))).await;
    assert!(
        ready.conditions.iter().any(|c| c.type_ == "Ready" && c.status == tenon_core::api::ConditionStatus::True),
        "{ready:?}"
    );
    assert_eq!(ready.images.len(), 3);
    assert_eq!(ready.kubernetes_version.as_deref(), Some("1.33.2"));
}

/// A Health Resources event for a spot VM, read from the Service Bus queue, is a spot interruption of
/// that VM; events about other VMs and other annotations are not; each message is completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_events_from_the_queue_are_interruptions() {
    let env = Env::new("events").await;
    let claim = env.claim("s-1", pinned("Standard_D2s_v5", "eastus-1", "spot"));
    let i = env.provider.create(&claim, &LaunchOptions::default()).await.unwrap();
    {
        let mut w = env.world.lock().unwrap();
        w.queue.push_back(annotated(
            &format!(
                "/subscriptions/{SUB}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/aks-s-1",
                RG.to_ascii_lowercase()
            ),
            "VirtualMachinePreempted",
        ));
        w.queue.push_back(annotated(
            &format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/aks-s-1"),
            "VirtualMachineRestarted",
        ));
        w.queue.push_back(annotated(
            &format!("/subscriptions/{SUB}/resourceGroups/elsewhere/providers/Microsoft.Compute/virtualMachines/x"),
            "VirtualMachinePreempted",
        ));
        w.queue.push_back("not an event".into());
    }
    let found = env.provider.interruptions().await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].provider_id, i.provider_id);
    assert_eq!(found[0].kind, InterruptionKind::SpotInterruption);
    let w = env.world.lock().unwrap();
    assert!(w.queue.is_empty() && w.locked.is_empty(), "every message completed");
}

/// A `ResourceAnnotated` event as Event Grid delivers it (CloudEvents), for `target`.
fn annotated(target: &str, annotation: &str) -> String {
    json!({
        "id": "e1", "source": format!("/subscriptions/{SUB}"), "specversion": "1.0",
        "type": "Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated", "subject": target,
        "time": "2026-12-01T01:39:48.3385828Z",
        "data": {"resourceInfo": {"id": format!("{target}/providers/Microsoft.ResourceHealth/resourceAnnotations/current"),
            "name": "current", "type": "Microsoft.ResourceHealth/resourceAnnotations",
            "properties": {"targetResourceId": target, "targetResourceType": "Microsoft.Compute/virtualMachines",
                "occurredTime": "2026-12-01T01:39:48.3385828Z", "annotationName": annotation, "reason": "r",
                "summary": "s", "context": "Platform Initiated", "category": "Unplanned", "impactType": "Informational"}},
            "operationalInfo": {"resourceEventTime": "2026-12-01T01:39:48.3385828+00:00"}, "apiVersion": "2022-08-01"}
    })
    .to_string()
}

/// The real controllers in virtual time: pending GPU pods become a VM and a node; Azure evicts the spot
/// VM (a Health Resources event on the queue, the VM deleted), and the pods run again on a replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_gpu_pods_get_a_vm_and_an_evicted_one_is_replaced_in_virtual_time() {
    use tenon_core::sim::{Sim, pod};
    let env = Env::new("sim").await;
    let mut pool = env.pool();
    pool.spec.template.spec.requirements = vec![req("karpenter.azure.com/sku-gpu-name", &["T4"])];
    let mut sim = Sim::new(env.clock.clone(), env.provider.clone(), vec![pool], Default::default());
    for i in 0..2 {
        sim.add_pod(pod(&format!("infer-{i}"), "1", 1));
    }
    sim.run(Duration::from_secs(180), Duration::from_secs(10)).await;
    assert!(sim.pending().is_empty(), "the pods are bound: {:?}", sim.pending());
    let live = sim.live_claims();
    // Fit-only packing (Karpenter's) puts both on one claim, so the size with two or more T4s.
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].label(labels::INSTANCE_TYPE), Some("Standard_NC64as_T4_v3"));
    assert_eq!(live[0].label(labels::CAPACITY_TYPE), Some("spot"));
    let evicted = live[0].provider_id().unwrap().to_owned();
    let name = tenon_providers::azure::vm_name(&evicted).unwrap().to_owned();

    // Azure evicts the VM: the event arrives, and (evictionPolicy Delete) the VM goes.
    {
        let mut w = env.world.lock().unwrap();
        w.queue.push_back(annotated(
            &format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}"),
            "VirtualMachinePreempted",
        ));
    }
    sim.run(Duration::from_secs(300), Duration::from_secs(10)).await;
    assert_eq!(sim.runtime.lifecycle.counters.interruptions, 1);
    let live = sim.live_claims();
    assert_eq!(live.len(), 1, "one replacement");
    assert!(live.iter().all(|c| c.provider_id() != Some(evicted.as_str())));
    assert!(sim.pending().is_empty(), "the pods run again: {:?}", sim.pending());
    assert!(env.provider.list().await.unwrap().iter().all(|i| i.provider_id != evicted));
}
