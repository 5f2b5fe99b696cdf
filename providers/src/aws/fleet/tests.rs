//! The launch planning: which overrides a claim gets.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use crate::aws::catalog;
use crate::aws::catalog::{Gpu, Shape};
use crate::aws::kubelet::{AmiFamily, Kubelet};
use crate::aws::nodeclass::ResolvedSecurityGroup;
use crate::aws::nodeclass::{EC2NodeClassStatus, ResolvedAmi, ResolvedSubnet};
use crate::aws::provider::AwsProvider;
use crate::aws::settings::AwsSettings;
use std::collections::BTreeSet;
use tenon_core::api::NodeSelectorRequirement;
use tenon_core::api::{NodeClaim, labels};
use tenon_core::api::{NodeClaimSpec, Operator};
use tenon_core::cloud::{CapacityType, CloudError, InstanceType, LaunchOptions, Offering, OfferingKey};
use tenon_core::resources::Resources;

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
        neuron: false,
        creation_date: None,
    };
    EC2NodeClassStatus {
        subnets: vec![subnet("subnet-a1", "a", 10), subnet("subnet-a2", "a", 200), subnet("subnet-b", "b", 5)],
        security_groups: vec![ResolvedSecurityGroup { id: "sg-1".into(), name: None }],
        amis: vec![ami("ami-std", false), ami("ami-gpu", true)],
        instance_profile: None,
        capacity_reservations: Vec::new(),
        conditions: Vec::new(),
    }
}

#[test]
fn gpu_and_metal_types_are_left_to_the_claims_that_need_them() {
    let p = provider();
    let at = |price: f64| vec![Offering::new("a", CapacityType::OnDemand, price)];
    let cheap_gpu =
        catalog::instance_type(&shape("g4dn.xlarge", 4, 1), 20, &Kubelet::default(), AmiFamily::Al2023, 0.0, at(0.5));
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
        let (_, o) = p.plan_overrides(&claim, &LaunchOptions::default(), std::slice::from_ref(&it), &status()).unwrap();
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
    assert!(matches!(p.plan_overrides(&claim, &opts, &types, &status()), Err(CloudError::InsufficientCapacity { .. })));
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
        catalog::instance_type(&shape("m6i.xlarge", 4, 0), 20, &Kubelet::default(), AmiFamily::Al2023, 0.0, offerings),
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

/// Reserved capacity goes first; one kind of reservation per launch (the cheapest candidate's); a capacity
/// block launches alone; of two reservations of one type in one zone the roomier is used.
#[test]
fn reserved_capacity_goes_first_one_kind_and_the_roomiest_reservation() {
    use crate::aws::reservations::ResolvedCapacityReservation;
    let p = provider();
    let reservation = |id: &str, itype: &str, zone: &str, kind: &str| ResolvedCapacityReservation {
        availability_zone: zone.into(),
        id: id.into(),
        instance_match_criteria: "targeted".into(),
        instance_type: itype.into(),
        owner_id: "123456789012".into(),
        reservation_type: kind.into(),
        state: "active".into(),
        ..Default::default()
    };
    let reserved = |id: &str, zone: &str, price: f64, room: u32| {
        let mut o = Offering::new(zone, CapacityType::Reserved, price);
        o.reservation_id = Some(id.into());
        o.reservation_capacity = Some(room);
        o
    };
    let it = |name: &str, offerings: Vec<Offering>| {
        catalog::instance_type(&shape(name, 2, 0), 20, &Kubelet::default(), AmiFamily::Al2023, 0.0, offerings)
    };
    let mut status = status();
    status.capacity_reservations = vec![
        reservation("cr-small", "m5.large", "a", "default"),
        reservation("cr-big", "m5.large", "a", "default"),
        reservation("cr-block", "p5.large", "b", "capacity-block"),
        reservation("cr-block2", "p5.large", "a", "capacity-block"),
    ];
    let types = vec![
        it(
            "m5.large",
            vec![
                Offering::new("a", CapacityType::Spot, 0.01),
                reserved("cr-small", "a", 1e-8, 1),
                reserved("cr-big", "a", 1e-8, 5),
            ],
        ),
        it("p5.large", vec![reserved("cr-block", "b", 2e-8, 3), reserved("cr-block2", "a", 3e-8, 3)]),
    ];
    let claim = NodeClaim::new("c", NodeClaimSpec::default());
    let (ct, overrides) = p.plan_overrides(&claim, &LaunchOptions::default(), &types, &status).unwrap();
    assert_eq!(ct, CapacityType::Reserved, "before the cheaper-looking spot");
    let picked: Vec<(&str, Option<&str>)> = overrides
        .iter()
        .map(|o| (o.key.instance_type.as_str(), o.reservation.as_ref().map(|r| r.id.as_str())))
        .collect();
    assert_eq!(picked, [("m5.large", Some("cr-big"))], "default reservations only; the roomier of the two");
    // Only capacity blocks left: one, the cheapest.
    let (ct, overrides) = p.plan_overrides(&claim, &LaunchOptions::default(), &types[1..], &status).unwrap();
    assert_eq!(ct, CapacityType::Reserved);
    let picked: Vec<&str> = overrides.iter().filter_map(|o| o.reservation.as_ref().map(|r| r.id.as_str())).collect();
    assert_eq!(picked, ["cr-block"]);
    // A claim that may not take reserved capacity never does.
    let mut spot_only = claim.clone();
    spot_only.spec.requirements = vec![NodeSelectorRequirement::new(labels::CAPACITY_TYPE, Operator::In, ["spot"])];
    let (ct, _) = p.plan_overrides(&spot_only, &LaunchOptions::default(), &types, &status).unwrap();
    assert_eq!(ct, CapacityType::Spot);
}
