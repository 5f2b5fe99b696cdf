//! EC2 capacity reservations, as Karpenter's AWS provider models them behind its `ReservedCapacity` gate.
//!
//! - A class's `capacityReservationSelectorTerms` resolve through `DescribeCapacityReservations` (active
//!   reservations only; ended ones dropped) into `status.capacityReservations`: on-demand capacity
//!   reservations (`default`), capacity blocks for ML (`capacity-block`), and interruptible ones.
//! - Each becomes one `reserved` offering of its type in its zone, priced at a ten-millionth of the
//!   on-demand price (free, while keeping the types in price order), counted by the instances it has
//!   room for. Launches and terminations move the count until the next read overwrites it from EC2.
//! - A reserved launch targets its reservation through its launch template
//!   (`CapacityReservationSpecification`: `capacity-reservations-only` and the reservation's id; a capacity
//!   block also sets `InstanceMarketOptions`), one template per reservation; every other launch opts out
//!   of open reservations (`none`), so reserved capacity is only ever used where it was chosen.
//!
//! An open reservation is used only when a term selects it: reservations are never matched implicitly.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types as ec2;
use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tenon_core::cloud::{CapacityType, CloudError, Offering};

use super::errors::sdk_error;
use super::nodeclass::EC2NodeClass;
use super::provider::{AwsProvider, filter, tag_filters};

/// Capacity blocks stop being offered this long before they end, and their instances are reclaimed from
/// then on (EC2 starts reclaiming 30 minutes before the end).
pub const CAPACITY_BLOCK_EXPIRY_MINUTES: i64 = 40;

/// One `capacityReservationSelectorTerms` entry: an `id`, or `tags` and/or `instanceMatchCriteria`
/// (optionally with `ownerID`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservationSelectorTerm {
    /// A reservation id (`cr-…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The account owning the reservations (12 digits).
    #[serde(default, rename = "ownerID", skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    /// Tags the reservations carry (`*` as a value matches any value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// `open` or `targeted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_match_criteria: Option<String>,
}

/// A reservation a class's terms resolved to, as Karpenter's status spells it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedCapacityReservation {
    /// Its zone.
    pub availability_zone: String,
    /// When it ends (RFC 3339), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<String>,
    /// Its id.
    pub id: String,
    /// `open` or `targeted`.
    pub instance_match_criteria: String,
    /// The instance type it holds.
    pub instance_type: String,
    /// The account owning it.
    #[serde(rename = "ownerID")]
    pub owner_id: String,
    /// `default` (an on-demand capacity reservation) or `capacity-block`.
    #[serde(default = "default_type")]
    pub reservation_type: String,
    /// Whether EC2 may interrupt its instances.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interruptible: bool,
    /// `active`, or `expiring` (a capacity block about to end: no longer offered).
    #[serde(default = "default_state")]
    pub state: String,
}

fn default_type() -> String {
    RESERVATION_DEFAULT.to_owned()
}

fn default_state() -> String {
    "active".to_owned()
}

/// `reservationType` of an on-demand capacity reservation.
pub const RESERVATION_DEFAULT: &str = "default";
/// `reservationType` of a capacity block for ML.
pub const RESERVATION_CAPACITY_BLOCK: &str = "capacity-block";

impl ResolvedCapacityReservation {
    /// Whether it is a capacity block.
    pub fn is_capacity_block(&self) -> bool {
        self.reservation_type == RESERVATION_CAPACITY_BLOCK
    }

    /// Whether it is about to end and no longer offered.
    pub fn is_expiring(&self) -> bool {
        self.state == "expiring"
    }

    /// When a capacity block stops being offered: [`CAPACITY_BLOCK_EXPIRY_MINUTES`] before its end.
    pub fn expires_at(&self) -> Option<Timestamp> {
        let end: Timestamp = self.end_time.as_deref()?.parse().ok()?;
        Some(end - jiff::SignedDuration::from_mins(CAPACITY_BLOCK_EXPIRY_MINUTES))
    }

    /// The labels of an instance in it, as Karpenter sets them (with the core's reservation id).
    pub fn node_labels(&self) -> [(String, String); 4] {
        use super::catalog;
        [
            (tenon_core::api::labels::RESERVATION_ID.to_owned(), self.id.clone()),
            (catalog::LABEL_CAPACITY_RESERVATION_ID.to_owned(), self.id.clone()),
            (catalog::LABEL_CAPACITY_RESERVATION_TYPE.to_owned(), self.reservation_type.clone()),
            (catalog::LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE.to_owned(), self.interruptible.to_string()),
        ]
    }

    /// The kind of launch it needs.
    pub fn kind(&self) -> ReservationKind {
        match (self.is_capacity_block(), self.interruptible) {
            (true, _) => ReservationKind::CapacityBlock,
            (false, false) => ReservationKind::OnDemand,
            (false, true) => ReservationKind::Interruptible,
        }
    }
}

/// The kinds of reservation, each its own market: `CreateFleet` takes one per request, so a launch draws
/// on reservations of one kind, preferred in this order when prices tie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReservationKind {
    /// An on-demand capacity reservation, launched as on-demand.
    OnDemand,
    /// A capacity block for ML, launched in the `capacity-block` market.
    CapacityBlock,
    /// An interruptible capacity reservation, launched as `reserved-capacity`.
    Interruptible,
}

/// Checks one term as Karpenter's CRD does; the error names the field.
pub fn validate_term(i: usize, t: &CapacityReservationSelectorTerm) -> Result<(), String> {
    let field = format!("spec.capacityReservationSelectorTerms[{i}]");
    if t.id.is_none() && t.tags.is_empty() && t.instance_match_criteria.is_none() {
        return Err(format!("{field}: expected one of id, tags, instanceMatchCriteria"));
    }
    if t.id.is_some() && (!t.tags.is_empty() || t.owner_id.is_some() || t.instance_match_criteria.is_some()) {
        return Err(format!("{field}: id is mutually exclusive with ownerID, tags and instanceMatchCriteria"));
    }
    if let Some(id) = &t.id {
        let ok = id
            .strip_prefix("cr-")
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()));
        if !ok {
            return Err(format!("{field}.id: {id:?} is not a reservation id (cr-…)"));
        }
    }
    if let Some(owner) = &t.owner_id
        && !(owner.len() == 12 && owner.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{field}.ownerID: {owner:?} is not a 12-digit account id"));
    }
    if let Some(m) = &t.instance_match_criteria
        && m != "open"
        && m != "targeted"
    {
        return Err(format!("{field}.instanceMatchCriteria: {m:?} is not open or targeted"));
    }
    if t.tags.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(format!("{field}.tags: empty tag keys or values aren't supported"));
    }
    Ok(())
}

/// A reservation as EC2 describes it, in the status's terms; `None` (logged) for one tenon cannot launch
/// into (an unknown match criteria or type).
fn resolved(r: &ec2::CapacityReservation, now: Timestamp) -> Option<ResolvedCapacityReservation> {
    let id = r.capacity_reservation_id()?.to_owned();
    let end = r.end_date().and_then(|d| Timestamp::from_second(d.secs()).ok());
    let reservation_type = match r.reservation_type().map(|t| t.as_str()) {
        None | Some("default") => RESERVATION_DEFAULT,
        Some("capacity-block") => RESERVATION_CAPACITY_BLOCK,
        Some(other) => {
            tracing::warn!(reservation = %id, reservation_type = other, "skipping a capacity reservation of an unknown type");
            return None;
        }
    };
    let criteria = match r.instance_match_criteria().map(|c| c.as_str()) {
        Some(c @ ("open" | "targeted")) => c.to_owned(),
        other => {
            tracing::warn!(reservation = %id, instance_match_criteria = ?other, "skipping a capacity reservation without open or targeted matching");
            return None;
        }
    };
    let expiring = reservation_type == RESERVATION_CAPACITY_BLOCK
        && end.is_some_and(|e| now >= e - jiff::SignedDuration::from_mins(CAPACITY_BLOCK_EXPIRY_MINUTES));
    Some(ResolvedCapacityReservation {
        availability_zone: r.availability_zone()?.to_owned(),
        end_time: end.map(|e| e.to_string()),
        id,
        instance_match_criteria: criteria,
        instance_type: r.instance_type()?.to_owned(),
        owner_id: r.owner_id().unwrap_or_default().to_owned(),
        reservation_type: reservation_type.to_owned(),
        interruptible: r.interruptible().unwrap_or(false),
        state: if expiring { "expiring" } else { "active" }.to_owned(),
    })
}

impl AwsProvider {
    /// What a class's reservation terms select: active reservations that have not ended, by id. Their
    /// free instance counts are recorded for the offerings. `Ok(vec![])` without terms, or with reserved
    /// capacity off.
    pub(super) async fn resolve_capacity_reservations(
        &self,
        class: &EC2NodeClass,
    ) -> Result<Vec<ResolvedCapacityReservation>, CloudError> {
        if !self.settings.reserved_capacity {
            return Ok(Vec::new());
        }
        let now = self.now();
        let mut out: BTreeMap<String, ResolvedCapacityReservation> = BTreeMap::new();
        let mut counts: Vec<(String, u32)> = Vec::new();
        for term in &class.spec.capacity_reservation_selector_terms {
            let mut req = self.ec2.describe_capacity_reservations().filters(filter("state", ["active"]));
            if let Some(id) = &term.id {
                // EC2 refuses MaxResults beside ids.
                req = req.capacity_reservation_ids(id);
            } else {
                if let Some(owner) = &term.owner_id {
                    req = req.filters(filter("owner-id", [owner.as_str()]));
                }
                for f in tag_filters(&term.tags) {
                    req = req.filters(f);
                }
                if let Some(m) = &term.instance_match_criteria {
                    req = req.filters(filter("instance-match-criteria", [m.as_str()]));
                }
                req = req.max_results(1000);
            }
            let mut pages = req.into_paginator().send();
            while let Some(page) = pages.next().await {
                let page = match page {
                    Ok(p) => p,
                    // An id that names nothing selects nothing.
                    Err(e) if e.code() == Some("InvalidCapacityReservationId.NotFound") => break,
                    Err(e) => return Err(sdk_error("DescribeCapacityReservations", e)),
                };
                for r in page.capacity_reservations() {
                    let ended = r.end_date().is_some_and(|d| d.secs() <= now.as_second());
                    if ended {
                        continue;
                    }
                    if let Some(res) = resolved(r, now) {
                        let free = u32::try_from(r.available_instance_count().unwrap_or(0).max(0)).unwrap_or(0);
                        counts.push((res.id.clone(), free));
                        out.insert(res.id.clone(), res);
                    }
                }
            }
        }
        let mut st = self.state();
        for (id, free) in counts {
            st.reservation_free.insert(id, free);
        }
        Ok(out.into_values().collect())
    }

    /// How many more instances reservation `id` holds, as last read and moved since.
    pub(super) fn reservation_free(&self, id: &str) -> u32 {
        self.state().reservation_free.get(id).copied().unwrap_or(0)
    }

    /// A launch took one of reservation `id`'s instances.
    pub(super) fn mark_reservation_launched(&self, id: &str) {
        if let Some(n) = self.state().reservation_free.get_mut(id) {
            *n = n.saturating_sub(1);
        }
    }

    /// An instance of reservation `id` is gone: it holds one more.
    pub(super) fn mark_reservation_terminated(&self, id: &str) {
        if let Some(n) = self.state().reservation_free.get_mut(id) {
            *n = n.saturating_add(1);
        }
    }

    /// Reservation `id` has no room (a launch into it failed, or EC2 is interrupting its instances) until
    /// it is read again.
    pub(super) fn mark_reservation_unavailable(&self, id: &str) {
        self.state().reservation_free.insert(id.to_owned(), 0);
    }

    /// The reserved offerings of instance type `name`: one per reservation of it in a zone the class's
    /// subnets reach, at a ten-millionth of `on_demand` (free, keeping the types' order).
    pub(super) fn reserved_offerings(
        &self,
        reservations: &[ResolvedCapacityReservation],
        name: &str,
        on_demand: Option<f64>,
        zones: &BTreeSet<&str>,
    ) -> Vec<Offering> {
        reservations
            .iter()
            .filter(|r| r.instance_type == name && zones.contains(r.availability_zone.as_str()))
            .map(|r| {
                let free = self.reservation_free(&r.id);
                let mut o =
                    Offering::new(r.availability_zone.clone(), CapacityType::Reserved, on_demand.unwrap_or(0.0) / 1e7);
                o.reservation_id = Some(r.id.clone());
                o.reservation_capacity = Some(free);
                o.available = free > 0 && !r.is_expiring();
                o
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn term(v: serde_json::Value) -> CapacityReservationSelectorTerm {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn terms_are_checked_as_karpenters_crd_checks_them() {
        validate_term(0, &term(serde_json::json!({"id": "cr-0123abc"}))).unwrap();
        validate_term(0, &term(serde_json::json!({"tags": {"team": "ml"}, "ownerID": "123456789012"}))).unwrap();
        validate_term(0, &term(serde_json::json!({"instanceMatchCriteria": "open"}))).unwrap();
        for (bad, says) in [
            (serde_json::json!({"ownerID": "123456789012"}), "expected one of"),
            (serde_json::json!({"id": "cr-1", "tags": {"a": "b"}}), "mutually exclusive"),
            (serde_json::json!({"id": "r-1"}), ".id"),
            (serde_json::json!({"tags": {"a": "b"}, "ownerID": "12"}), ".ownerID"),
            (serde_json::json!({"instanceMatchCriteria": "any"}), ".instanceMatchCriteria"),
            (serde_json::json!({"tags": {"a": ""}}), ".tags"),
        ] {
            let e = validate_term(3, &term(bad.clone())).unwrap_err();
            assert!(e.contains("spec.capacityReservationSelectorTerms[3]") && e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn capacity_blocks_expire_forty_minutes_before_their_end() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let block = |mins_left: i64| {
            ec2::CapacityReservation::builder()
                .capacity_reservation_id("cr-1")
                .instance_type("p5.48xlarge")
                .availability_zone("us-east-1a")
                .owner_id("123456789012")
                .instance_match_criteria(ec2::InstanceMatchCriteria::Targeted)
                .reservation_type(ec2::CapacityReservationType::CapacityBlock)
                .end_date(aws_smithy_types::DateTime::from_secs(now.as_second() + mins_left * 60))
                .build()
        };
        let active = resolved(&block(41), now).unwrap();
        assert_eq!(active.state, "active");
        assert_eq!(active.expires_at(), Some(now + jiff::SignedDuration::from_mins(1)));
        let r = resolved(&block(40), now).unwrap();
        assert!(r.is_expiring() && r.is_capacity_block() && r.kind() == ReservationKind::CapacityBlock);
        let odcr = ec2::CapacityReservation::builder()
            .capacity_reservation_id("cr-2")
            .instance_type("m5.large")
            .availability_zone("us-east-1a")
            .instance_match_criteria(ec2::InstanceMatchCriteria::Open)
            .build();
        let r = resolved(&odcr, now).unwrap();
        assert_eq!(
            (r.reservation_type.as_str(), r.state.as_str(), r.kind()),
            ("default", "active", ReservationKind::OnDemand)
        );
    }
}
