//! Instance types and their offerings for a resolved NodeClass: shapes and zones read from EC2 (cached,
//! a failed refresh keeping the last good read), priced, with quota and unavailable-offering blocks.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use aws_sdk_ec2::types as ec2;
use jiff::Timestamp;
use tenon_core::api::labels;
use tenon_core::clock;
use tenon_core::cloud::{CapacityType, CloudError, InstanceType, Offering, OfferingKey};

use super::catalog::{self, Shape};
use super::errors::sdk_error;
use super::nodeclass::{EC2NodeClass, EC2NodeClassStatus};
use super::provider::{AwsProvider, Cached, NAME, QuotaKey, filter};
use super::shapes::shapes_of;

impl AwsProvider {
    /// The instance shapes, read at most every `shapes_ttl`. A refresh that fails keeps the catalog last
    /// read (with a warning), as a spot price refresh does; only a first read that fails is an error.
    pub(super) async fn shapes(&self) -> Result<Arc<HashMap<String, Shape>>, CloudError> {
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
    pub(super) async fn selected_names(&self) -> Result<Option<Vec<String>>, CloudError> {
        if self.settings.instance_type_patterns.is_empty() {
            return Ok(None);
        }
        let mut names: Vec<String> = self.shapes().await?.keys().cloned().collect();
        names.sort();
        Ok(Some(names))
    }

    /// The zones each type is offered in, from `DescribeInstanceTypeOfferings` (kept for `offerings_ttl`).
    pub(super) async fn zones(&self) -> Result<Arc<HashMap<String, BTreeSet<String>>>, CloudError> {
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

    /// Drops expired quota blocks and returns the (capacity type, bucket) scopes blocked now.
    pub(super) fn live_quota_blocks(&self) -> HashMap<QuotaKey, Timestamp> {
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
    pub(super) async fn types_for(
        &self,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
    ) -> Result<Vec<InstanceType>, CloudError> {
        let shapes = self.shapes().await?;
        let zones = self.zones().await?;
        let spot = self.spot_prices().await?;
        let od = self.on_demand_prices().await?;
        let subnet_zones: BTreeSet<&str> = status.subnets.iter().map(|s| s.zone.as_str()).collect();
        // Zone ids differ by offering of a type: requirements on them are met per offering.
        let zone_ids: HashMap<&str, &str> =
            status.subnets.iter().filter_map(|s| Some((s.zone.as_str(), s.zone_id.as_deref()?))).collect();
        let archs: BTreeSet<&str> = status.amis.iter().map(|a| a.architecture.as_str()).collect();
        let root = self.root_volume_gib(Some(class));
        let not_ready = |m: String| CloudError::NodeClassNotReady(format!("EC2NodeClass/{}: {m}", class.name()));
        let family = class.spec.family().map_err(not_ready)?;
        let kubelet = class.spec.kubelet().map_err(not_ready)?;
        let raid0 = class.spec.raid0().map_err(not_ready)?;
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
            offerings.extend(self.reserved_offerings(&status.capacity_reservations, name, od_price, &subnet_zones));
            for o in &mut offerings {
                if let Some(id) = zone_ids.get(o.zone.as_str()) {
                    o.labels.insert(catalog::LABEL_ZONE_ID.to_owned(), (*id).to_owned());
                }
            }
            let mut it = catalog::instance_type_with_storage(
                shape,
                catalog::ephemeral_storage_bytes(shape, root, raid0),
                &kubelet,
                family,
                self.settings.vm_memory_overhead,
                offerings,
            );
            if let Some(arch) = shape.architectures.iter().find(|a| archs.contains(a.as_str())) {
                it.labels.insert(labels::ARCH.to_owned(), arch.clone());
            }
            out.push(it);
        }
        Ok(out)
    }

    pub(super) fn mark_unavailable(&self, key: &OfferingKey) {
        let cache = self.state().unavailable.clone();
        if let Some(c) = cache {
            c.mark(NAME, key, self.settings.unavailable_ttl, self.now());
        }
    }

    pub(super) fn block_quota(&self, capacity_type: CapacityType, bucket: &str) {
        let until = clock::add(self.now(), self.settings.unavailable_ttl);
        self.state().quota.insert((capacity_type, bucket.to_owned()), until);
    }
}
