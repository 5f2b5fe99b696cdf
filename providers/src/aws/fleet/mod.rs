//! Launches: the overrides a claim can take (cheapest compatible types × one subnet per zone), one
//! `CreateFleet` of type `instant` over them, and what its per-override errors say about capacity.

mod plan;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types as ec2;
use tenon_core::api::{NodeClaim, labels};
use tenon_core::cloud::{CapacityType, CloudError, Instance, InstanceState, InstanceType, LaunchOptions, OfferingKey};
use tenon_core::resources::Resources;

use super::catalog;
use super::errors::{FleetFault, fleet_fault, launch_template_missing, sdk_error};
use super::instances::provider_id;
use super::launch_template::Template;
use super::nodeclass::{self, EC2NodeClass};
use super::provider::{AwsProvider, NAME, TAG_EKS_CLUSTER, TAG_NODE_CLAIM, TAG_NODE_CLASS, TAG_NODE_POOL, tag};
use super::reservations::ReservationKind;
use plan::Override;

/// `CreateFleet`'s target capacity type: a reserved launch's follows its reservations' kind (a capacity
/// block, an interruptible reservation, or an on-demand capacity reservation launched as on-demand).
fn target_capacity_type(
    capacity_type: CapacityType,
    reservation_kind: Option<ReservationKind>,
) -> ec2::DefaultTargetCapacityType {
    match (capacity_type, reservation_kind) {
        (CapacityType::Spot, _) => ec2::DefaultTargetCapacityType::Spot,
        (CapacityType::Reserved, Some(ReservationKind::CapacityBlock)) => ec2::DefaultTargetCapacityType::CapacityBlock,
        (CapacityType::Reserved, Some(ReservationKind::Interruptible)) => {
            ec2::DefaultTargetCapacityType::ReservedCapacity
        }
        _ => ec2::DefaultTargetCapacityType::OnDemand,
    }
}

impl AwsProvider {
    pub(super) async fn launch(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        let name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        if let Some(existing) = self.existing_for_claim(claim).await? {
            return Ok(existing);
        }
        let types = self.types_for(&class, &status).await?;
        let (capacity_type, overrides) = self.plan_overrides(claim, options, &types, &status)?;

        // One launch template per AMI (and per reservation, which it targets); each carries the overrides
        // that boot it.
        let mut by_template: BTreeMap<(&str, Option<&str>), Vec<&Override>> = BTreeMap::new();
        for o in &overrides {
            let reservation = o.reservation.as_ref().map(|r| r.id.as_str());
            by_template.entry((o.ami.id.as_str(), reservation)).or_default().push(o);
        }
        let user_data = self.user_data(&class, claim, capacity_type).await?;
        let mut configs: Vec<(String, Vec<&Override>)> = Vec::with_capacity(by_template.len());
        for ovs in by_template.into_values() {
            let template = Template {
                ami: &ovs[0].ami,
                user_data: &user_data,
                pool: claim.node_pool().unwrap_or_default(),
                capacity_type,
                reservation: ovs[0].reservation.as_ref(),
            };
            let lt = self.ensure_launch_template(&class, &status, &template).await?;
            configs.push((lt, ovs));
        }
        let reservation_kind = overrides.iter().find_map(|o| o.reservation.as_ref()).map(|r| r.kind());
        let tags = self.launch_tags(claim, &class);
        let mut req = self
            .ec2
            .create_fleet()
            .set_context(class.spec.context.clone())
            .r#type(ec2::FleetType::Instant)
            .target_capacity_specification(
                ec2::TargetCapacitySpecificationRequest::builder()
                    .total_target_capacity(1)
                    .default_target_capacity_type(target_capacity_type(capacity_type, reservation_kind))
                    .build(),
            );
        req = match (capacity_type, reservation_kind) {
            (CapacityType::Spot, _) => req.spot_options(
                ec2::SpotOptionsRequest::builder()
                    .allocation_strategy(ec2::SpotAllocationStrategy::PriceCapacityOptimized)
                    .build(),
            ),
            // A capacity block takes neither options block.
            (CapacityType::Reserved, Some(ReservationKind::CapacityBlock)) => req,
            (_, kind) => {
                let req = req.on_demand_options(
                    ec2::OnDemandOptionsRequest::builder()
                        .allocation_strategy(ec2::FleetOnDemandAllocationStrategy::LowestPrice)
                        .build(),
                );
                if kind == Some(ReservationKind::Interruptible) {
                    req.reserved_capacity_options(
                        ec2::ReservedCapacityOptionsRequest::builder()
                            .reservation_types(ec2::FleetReservationType::InterruptibleCapacityReservation)
                            .build(),
                    )
                } else {
                    req
                }
            }
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
        for rt in [ec2::ResourceType::Instance, ec2::ResourceType::Volume, ec2::ResourceType::Fleet] {
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
                _ if capacity_type == CapacityType::Reserved => CapacityType::Reserved,
                Some(ec2::InstanceLifecycle::Spot) => CapacityType::Spot,
                Some(ec2::InstanceLifecycle::OnDemand) => CapacityType::OnDemand,
                _ => capacity_type,
            };
            let key = ov.and_then(|o| Some(OfferingKey::new(o.instance_type()?.as_str(), o.availability_zone()?, ct)));
            let fault = fleet_fault(&code);
            if fault == FleetFault::Request {
                other_errors.push((code, message));
                continue;
            }
            // A reserved launch that failed marks its reservation full, not the offering: the type and
            // zone may well launch on-demand or spot.
            if let Some(k) = &key
                && ct == CapacityType::Reserved
            {
                let failed_reservation = overrides
                    .iter()
                    .filter(|o| o.key.instance_type == k.instance_type && o.key.zone == k.zone)
                    .find_map(|o| o.reservation.as_ref());
                if let Some(r) = failed_reservation {
                    self.mark_reservation_unavailable(&r.id);
                }
                if !failed.contains(k) {
                    failed.push(k.clone());
                }
                continue;
            }
            match (fault, &key) {
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
            _ if capacity_type == CapacityType::Reserved => CapacityType::Reserved,
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
        if let Some(zone_id) = status.subnets.iter().find(|s| s.zone == zone).and_then(|s| s.zone_id.clone()) {
            node_labels.insert(catalog::LABEL_ZONE_ID.to_owned(), zone_id);
        }
        if let Some(r) = chosen.and_then(|o| o.reservation.as_ref()) {
            self.mark_reservation_launched(&r.id);
            node_labels.extend(r.node_labels());
        }
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
        tags.insert(nodeclass::HASH_VERSION_ANNOTATION.into(), nodeclass::HASH_VERSION.into());
        // The console's name column: the claim's, unless the class names its instances itself.
        tags.entry("Name".into()).or_insert_with(|| claim.name().to_owned());
        tags.iter().map(|(k, v)| tag(k, v)).collect()
    }
}
