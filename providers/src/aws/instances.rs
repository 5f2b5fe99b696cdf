//! The cluster's instances: read, listed and terminated by their ownership tag, seen as the core's
//! [`Instance`]s, and judged for drift against their class.

use std::collections::{BTreeSet, HashMap};

use aws_sdk_ec2::types as ec2;
use jiff::Timestamp;
use tenon_core::api::{NodeClaim, labels};
use tenon_core::cloud::{CapacityType, CloudError, DriftReason, Instance, InstanceState, InstanceType};
use tenon_core::resources::Resources;

use super::catalog::{self, Shape};
use super::errors::sdk_error;
use super::kubelet::{AmiFamily, Kubelet};
use super::nodeclass;
use super::provider::{AwsProvider, NAME, TAG_NODE_CLAIM, TAG_NODE_CLASS, TAG_NODE_POOL, filter, tags_of};
use super::reservations::ResolvedCapacityReservation;

/// States of an instance that still exists.
const LIVE_STATES: [&str; 5] = ["pending", "running", "stopping", "stopped", "shutting-down"];

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
    /// Describes one instance (any state); `NotFound` when EC2 does not know it or it is another
    /// cluster's.
    pub(super) async fn describe(&self, id: &str) -> Result<ec2::Instance, CloudError> {
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

    pub(super) fn owned(&self, i: &ec2::Instance) -> bool {
        let key = self.cluster_tag();
        i.tags().iter().any(|t| t.key() == Some(key.as_str()) && t.value() == Some("owned"))
    }

    pub(super) async fn describe_owned(&self, extra: Vec<ec2::Filter>) -> Result<Vec<ec2::Instance>, CloudError> {
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
    pub(super) fn to_instance(
        &self,
        i: &ec2::Instance,
        shapes: Option<&HashMap<String, Shape>>,
    ) -> Result<Instance, CloudError> {
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
        // In a reservation only when launched to draw on it (an instance that landed in an open reservation
        // by EC2's matching is on-demand), as Karpenter tells them apart.
        let reservation = i.capacity_reservation_id().filter(|_| {
            self.settings.reserved_capacity
                && i.capacity_reservation_specification().and_then(|s| s.capacity_reservation_preference())
                    == Some(&ec2::CapacityReservationPreference::CapacityReservationsOnly)
        });
        let capacity_type = match i.instance_lifecycle() {
            _ if reservation.is_some() => CapacityType::Reserved,
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
        let class = tags.get(TAG_NODE_CLASS).and_then(|n| self.state().classes.get(n));
        let (family, kubelet) = match class.as_deref() {
            Some(c) => (c.spec.family().unwrap_or(AmiFamily::Custom), c.spec.kubelet().unwrap_or_default()),
            None => (AmiFamily::Custom, Kubelet::default()),
        };
        let raid0 = class.as_deref().is_some_and(|c| c.spec.raid0().unwrap_or(false));
        let it = shapes.and_then(|s| s.get(&itype)).map(|s| {
            catalog::instance_type_with_storage(
                s,
                catalog::ephemeral_storage_bytes(s, self.root_volume_gib(class.as_deref()), raid0),
                &kubelet,
                family,
                self.settings.vm_memory_overhead,
                Vec::new(),
            )
        });
        let on_demand = || self.known_on_demand_prices().and_then(|p| p.get(&itype).copied());
        let price = match capacity_type {
            CapacityType::Spot => self
                .state()
                .spot
                .as_ref()
                .and_then(|s| s.value.get(&(itype.clone(), zone.to_owned())).copied())
                .or_else(on_demand),
            // Priced as its offering is: paid for either way.
            CapacityType::Reserved => on_demand().map(|p| p / 1e7),
            _ => on_demand(),
        };
        let mut node_labels = it.as_ref().map(|t| t.labels.clone()).unwrap_or_default();
        node_labels.insert(labels::INSTANCE_TYPE.to_owned(), itype.clone());
        node_labels.insert(labels::ZONE.to_owned(), zone.to_owned());
        node_labels.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
        node_labels.insert(labels::REGION.to_owned(), self.region.clone());
        let status = class.as_ref().and_then(|c| self.state().classes.last(c.name()));
        if let Some(zone_id) =
            status.as_ref().and_then(|s| s.subnets.iter().find(|s| s.zone == zone)).and_then(|s| s.zone_id.clone())
        {
            node_labels.insert(catalog::LABEL_ZONE_ID.to_owned(), zone_id);
        }
        if let Some(id) = reservation {
            let lifecycle = i.instance_lifecycle().map(|l| l.as_str());
            let r = ResolvedCapacityReservation {
                id: id.to_owned(),
                reservation_type: if lifecycle == Some("capacity-block") { "capacity-block" } else { "default" }.into(),
                interruptible: lifecycle == Some("interruptible-capacity-reservation"),
                ..Default::default()
            };
            node_labels.extend(r.node_labels());
        }
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

    pub(super) async fn existing_for_claim(&self, claim: &NodeClaim) -> Result<Option<Instance>, CloudError> {
        let found = self.describe_owned(vec![filter(&format!("tag:{TAG_NODE_CLAIM}"), [claim.name()])]).await?;
        match found
            .iter()
            .find(|i| !matches!(i.state().and_then(|s| s.name()), Some(ec2::InstanceStateName::ShuttingDown)))
        {
            Some(i) => Ok(Some(self.to_instance(i, self.shapes().await.ok().as_deref())?)),
            None => Ok(None),
        }
    }

    pub(super) async fn terminate(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id() else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        let id = instance_id(pid)?;
        let i = self.describe(id).await?;
        match i.state().and_then(|s| s.name()) {
            Some(ec2::InstanceStateName::Terminated) => {
                // Gone: its reservation has room for one more until read again.
                if let Some(r) = i.capacity_reservation_id() {
                    self.mark_reservation_terminated(r);
                }
                return Err(CloudError::NotFound(pid.to_owned()));
            }
            Some(ec2::InstanceStateName::ShuttingDown) => return Ok(()),
            _ => {}
        }
        match self.ec2.terminate_instances().instance_ids(id).send().await {
            Ok(_) => Ok(()),
            Err(e) => Err(sdk_error(&format!("TerminateInstances {id}"), e)),
        }
    }

    pub(super) async fn get_instance(&self, provider_id: &str) -> Result<Instance, CloudError> {
        let id = instance_id(provider_id)?;
        let i = self.describe(id).await?;
        if matches!(i.state().and_then(|s| s.name()), Some(ec2::InstanceStateName::Terminated)) {
            return Err(CloudError::NotFound(provider_id.to_owned()));
        }
        self.to_instance(&i, self.shapes().await.ok().as_deref())
    }

    pub(super) async fn list_instances(&self) -> Result<Vec<Instance>, CloudError> {
        let instances = self.describe_owned(Vec::new()).await?;
        // The shapes are read once for the whole listing (and not at all for an empty one).
        let shapes = if instances.is_empty() { None } else { self.shapes().await.ok() };
        instances.iter().map(|i| self.to_instance(i, shapes.as_deref())).collect()
    }

    pub(super) async fn drift(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        let Some(pid) = claim.provider_id() else { return Ok(None) };
        let name = self.class_name(claim.spec.node_class_ref.as_ref(), &format!("NodeClaim/{}", claim.name()))?;
        let (class, status) = self.resolve_node_class(name).await?;
        let i = self.describe(instance_id(pid)?).await?;
        let tags = tags_of(i.tags());
        // A hash made by another recipe says nothing about the class (instances from before the version tag
        // were hashed by the first recipe).
        let same_recipe =
            tags.get(nodeclass::HASH_VERSION_ANNOTATION).map_or("v1", String::as_str) == nodeclass::HASH_VERSION;
        if same_recipe && tags.get(nodeclass::HASH_ANNOTATION).is_some_and(|h| *h != class.static_hash()) {
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
        if let Some(r) = i.capacity_reservation_id()
            && self.settings.reserved_capacity
            && !status.capacity_reservations.iter().any(|c| c.id == r)
            && i.capacity_reservation_specification().and_then(|s| s.capacity_reservation_preference())
                == Some(&ec2::CapacityReservationPreference::CapacityReservationsOnly)
        {
            return Ok(Some(DriftReason("CapacityReservationDrift".into())));
        }
        Ok(None)
    }

    pub(super) async fn reboot_instance(&self, claim: &NodeClaim) -> Result<(), CloudError> {
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
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    #[test]
    fn provider_ids_round_trip() {
        assert_eq!(provider_id("us-east-1a", "i-0abc"), "aws:///us-east-1a/i-0abc");
        assert_eq!(instance_id("aws:///us-east-1a/i-0abc").unwrap(), "i-0abc");
        assert!(instance_id("aws:///us-east-1a/").unwrap_err().is_not_found());
    }
}
