//! Launches: the overrides a claim can take (cheapest compatible types × one subnet per zone), one
//! `CreateFleet` of type `instant` over them, and what its per-override errors say about capacity.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types as ec2;
use tenon_core::api::{NodeClaim, labels};
use tenon_core::cloud::{
    CapacityType, CloudError, Instance, InstanceState, InstanceType, LaunchOptions, Offering, OfferingKey,
};
use tenon_core::resources::Resources;

use super::catalog;
use super::errors::{FleetFault, fleet_fault, launch_template_missing, sdk_error};
use super::instances::provider_id;
use super::nodeclass::{self, EC2NodeClass, EC2NodeClassStatus, ResolvedAmi, ResolvedSubnet};
use super::provider::{AwsProvider, NAME, TAG_EKS_CLUSTER, TAG_NODE_CLAIM, TAG_NODE_CLASS, TAG_NODE_POOL, tag};

/// One fleet override: an instance type in a zonal subnet, with the AMI it boots.
#[derive(Debug, Clone)]
pub(super) struct Override {
    key: OfferingKey,
    subnet: String,
    ami: ResolvedAmi,
    price: f64,
}

impl AwsProvider {
    /// The overrides of a launch: the cheapest `max_instance_types` compatible types, each in every zone
    /// where its offering is compatible (one subnet per zone, the one with the most free addresses).
    pub(super) fn plan_overrides(
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
            // As Karpenter maps images to types: the GPU variant for GPU types, the Neuron variant for
            // accelerator types, the standard one for the rest; any image of the architecture when the
            // class has no such variant.
            let gpu = it.labels.contains_key(catalog::LABEL_GPU_COUNT);
            let neuron = !gpu && it.labels.contains_key(catalog::LABEL_ACCELERATOR_COUNT);
            let arch = it.labels.get(labels::ARCH).map(String::as_str).unwrap_or("amd64");
            let ami = status
                .amis
                .iter()
                .filter(|a| a.architecture == arch)
                .find(|a| {
                    if gpu {
                        a.nvidia
                    } else if neuron {
                        a.neuron
                    } else {
                        !a.nvidia && !a.neuron
                    }
                })
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

    pub(super) async fn launch(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
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
            Err(e) if e.code().is_some_and(launch_template_missing) => {
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
            let fault = fleet_fault(&code);
            match (fault, &key) {
                (FleetFault::Request, _) => {
                    other_errors.push((code, message));
                    continue;
                }
                (FleetFault::VcpuQuota, Some(k)) => self.block_quota(ct, catalog::quota_bucket(&k.instance_type)),
                (FleetFault::NoSpot, _) => self.block_quota(CapacityType::Spot, "*"),
                (FleetFault::SubnetFull, _) => {
                    if let Some(subnet) = ov.and_then(|o| o.subnet_id()) {
                        self.state().subnet_exhausted.insert(subnet.to_owned());
                    }
                }
                _ => {}
            }
            if let Some(k) = key {
                // A subnet out of addresses blocks its zone only when the zone has no other subnet left.
                let other_subnet = fault == FleetFault::SubnetFull && {
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

    pub(super) fn launch_tags(&self, claim: &NodeClaim, class: &EC2NodeClass) -> Vec<ec2::Tag> {
        let mut tags: BTreeMap<String, String> = class.spec.tags.clone();
        tags.insert(self.cluster_tag(), "owned".into());
        tags.insert(TAG_EKS_CLUSTER.into(), self.settings.cluster_name.clone());
        tags.insert(TAG_NODE_POOL.into(), claim.node_pool().unwrap_or_default().to_owned());
        tags.insert(TAG_NODE_CLAIM.into(), claim.name().to_owned());
        tags.insert(TAG_NODE_CLASS.into(), class.name().to_owned());
        tags.insert(nodeclass::HASH_ANNOTATION.into(), class.static_hash());
        tags.iter().map(|(k, v)| tag(k, v)).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::aws::catalog::{Gpu, Shape};
    use crate::aws::kubelet::{AmiFamily, Kubelet};
    use crate::aws::nodeclass::ResolvedSecurityGroup;
    use crate::aws::settings::AwsSettings;
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
            neuron: false,
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
}
