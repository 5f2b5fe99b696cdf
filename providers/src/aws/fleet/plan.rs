//! The overrides a launch offers `CreateFleet`: the cheapest compatible types, each in one subnet per
//! zone, under one capacity type (reserved, then spot, then on-demand), with the image each boots.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tenon_core::api::{NodeClaim, labels};
use tenon_core::cloud::{CapacityType, CloudError, InstanceType, LaunchOptions, Offering, OfferingKey};
use tenon_core::resources::Resources;

use crate::aws::catalog;
use crate::aws::nodeclass::{EC2NodeClassStatus, ResolvedAmi, ResolvedSubnet};
use crate::aws::provider::AwsProvider;
use crate::aws::reservations::{ReservationKind, ResolvedCapacityReservation};

/// One fleet override: an instance type in a zonal subnet, with the AMI it boots, and for reserved
/// capacity the reservation it draws on.
#[derive(Debug, Clone)]
pub(crate) struct Override {
    pub(crate) key: OfferingKey,
    pub(crate) subnet: String,
    pub(crate) ami: ResolvedAmi,
    pub(crate) price: f64,
    pub(crate) reservation: Option<ResolvedCapacityReservation>,
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
        // Reserved capacity first, as Karpenter prefers it: it is paid for either way.
        let capacity_type = if candidates.iter().any(|(_, o)| o.capacity_type == CapacityType::Reserved) {
            CapacityType::Reserved
        } else if candidates.iter().any(|(_, o)| o.capacity_type == CapacityType::Spot) {
            CapacityType::Spot
        } else {
            CapacityType::OnDemand
        };
        candidates.retain(|(_, o)| o.capacity_type == capacity_type);
        if capacity_type == CapacityType::Reserved {
            let reservation = |o: &Offering| {
                o.reservation_id.as_deref().and_then(|id| status.capacity_reservations.iter().find(|r| r.id == id))
            };
            candidates.retain(|(_, o)| reservation(o).is_some());
            reserved_filters(&mut candidates, |o| {
                reservation(o).map_or(ReservationKind::OnDemand, ResolvedCapacityReservation::kind)
            });
        }
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
            let reservation = o
                .reservation_id
                .as_deref()
                .and_then(|id| status.capacity_reservations.iter().find(|r| r.id == id))
                .cloned();
            out.push(Override {
                key: o.key(&it.name),
                subnet: subnet.id.clone(),
                ami: ami.clone(),
                price: o.price,
                reservation,
            });
        }
        if out.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "NodeClaim/{}: no resolved AMI boots the compatible instance types",
                claim.name()
            )));
        }
        Ok((capacity_type, out))
    }
}

/// Narrows reserved candidates as Karpenter's reserved filters do, since one `CreateFleet` takes one market
/// and one capacity block:
/// - one kind of reservation (`kind_of`): the kind of the cheapest candidate, the first
///   [`ReservationKind`] on a tie;
/// - a capacity block launches alone: the cheapest candidate only;
/// - of several reservations of one type in one zone, the one with the most room.
pub(crate) fn reserved_filters<'a>(
    candidates: &mut Vec<(&'a InstanceType, &'a Offering)>,
    kind_of: impl Fn(&Offering) -> ReservationKind,
) {
    let Some(kind) = candidates
        .iter()
        .map(|(_, o)| (o.price, kind_of(o)))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, k)| k)
    else {
        return;
    };
    candidates.retain(|(_, o)| kind_of(o) == kind);
    if kind == ReservationKind::CapacityBlock {
        if let Some(best) = candidates
            .iter()
            .copied()
            .min_by(|a, b| a.1.price.total_cmp(&b.1.price).then(a.0.name.cmp(&b.0.name)).then(a.1.zone.cmp(&b.1.zone)))
        {
            *candidates = vec![best];
        }
        return;
    }
    let mut roomiest: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for (it, o) in candidates.iter() {
        let room = roomiest.entry((it.name.as_str(), o.zone.as_str())).or_insert(0);
        *room = (*room).max(o.reservation_capacity.unwrap_or(0));
    }
    let mut kept: BTreeSet<(&str, &str)> = BTreeSet::new();
    candidates.retain(|(it, o)| {
        let key = (it.name.as_str(), o.zone.as_str());
        o.reservation_capacity.unwrap_or(0) == roomiest[&key] && kept.insert(key)
    });
}
