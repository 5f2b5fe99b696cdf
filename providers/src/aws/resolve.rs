//! NodeClass resolution: the classes the operator feeds, what their subnet and security-group terms
//! resolve to, the status written on them, and the cache of it all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tenon_core::api::NodeClassRef;
use tenon_core::cloud::CloudError;

use super::errors::sdk_error;
use super::nodeclass::{self, EC2NodeClass, EC2NodeClassStatus, ResolvedSecurityGroup, ResolvedSubnet};
use super::provider::{AwsProvider, NAME, ResolvedParts, filter, tag_filters};

impl AwsProvider {
    /// Adds or replaces an `EC2NodeClass` (the operator feeds them from the API server). A changed spec
    /// is resolved afresh (subnets, security groups, AMIs) on its next use; an unchanged one keeps its
    /// resolution until `node_class_ttl`.
    pub fn apply_node_class(&self, class: EC2NodeClass) -> Result<(), CloudError> {
        class.validate().map_err(CloudError::NodeClassNotReady)?;
        let name = class.name().to_owned();
        self.state().classes.apply(name, class, |old, new| old.spec == new.spec);
        Ok(())
    }

    /// Forgets an `EC2NodeClass` at once, leaving its launch templates: a class that no longer validates
    /// is not launched from with its last good spec; its claims answer `NodeClassNotReady` until it is
    /// fixed.
    pub fn forget_node_class(&self, name: &str) {
        self.state().classes.forget(name);
    }

    /// Forgets an `EC2NodeClass` and deletes the launch templates this cluster made for it (what a
    /// finalizer on the class does before it lets the class go). Instances launched from them run on.
    pub async fn delete_node_class(&self, name: &str) -> Result<(), CloudError> {
        self.state().classes.forget(name);
        self.delete_launch_templates(name, &BTreeSet::new()).await?;
        self.delete_instance_profile(name).await
    }

    pub(super) fn class_name<'a>(&self, r: Option<&'a NodeClassRef>, object: &str) -> Result<&'a str, CloudError> {
        crate::classes::referenced(r, nodeclass::GROUP, nodeclass::KIND, object)
    }

    /// The NodeClass `name` and what its selector terms resolve to (cached for `node_class_ttl`).
    /// `NodeClassNotReady` when it is unknown or a term resolves to nothing.
    pub async fn resolve_node_class(
        &self,
        name: &str,
    ) -> Result<(Arc<EC2NodeClass>, Arc<EC2NodeClassStatus>), CloudError> {
        let class = self.known_class(name)?;
        if let Some(status) = self.fresh_resolution(name) {
            return Ok((class, status));
        }
        let (subnets, security_groups, amis, reservations) = self.resolve_parts(&class).await;
        let status = EC2NodeClassStatus {
            subnets: subnets?,
            security_groups: security_groups?,
            amis: amis?,
            instance_profile: self.ensure_instance_profile(&class).await?,
            capacity_reservations: reservations?,
            conditions: Vec::new(),
        };
        Ok((class.clone(), self.remember_resolution(name, &class, status).await))
    }

    /// The status to write on `class`, as Karpenter's AWS provider writes it: what its terms resolve to,
    /// a condition for each part (`ValidationSucceeded`, `SubnetsReady`, `SecurityGroupsReady`,
    /// `AMIsReady`, `InstanceProfileReady`, and with reserved capacity on `CapacityReservationsReady`) and
    /// `Ready` over them all, keeping the transition times of its
    /// current status. Reads EC2 only when the cached resolution is stale, as a launch would; a class that
    /// fails validation is not resolved and keeps what its status last said it resolved to.
    pub async fn node_class_status(&self, class: &EC2NodeClass) -> EC2NodeClassStatus {
        use super::nodeclass::condition_types::{
            AMIS_READY, CAPACITY_RESERVATIONS_READY, INSTANCE_PROFILE_READY, READY, SECURITY_GROUPS_READY,
            SUBNETS_READY,
        };
        use tenon_core::api::condition_types::VALIDATION_SUCCEEDED;
        use tenon_core::api::{ConditionStatus, set_condition};
        let previous = class.status.clone().unwrap_or_default();
        let now = self.now();
        let mut conditions = previous.conditions.clone();
        let mut unready: Vec<&str> = Vec::new();
        let mut set = |type_: &'static str, failure: Option<String>, reason: &str| match failure {
            None => set_condition(&mut conditions, type_, ConditionStatus::True, type_, "", now),
            Some(m) => {
                unready.push(type_);
                set_condition(&mut conditions, type_, ConditionStatus::False, reason, &m, now);
            }
        };
        if let Err(m) = class.validate() {
            set(VALIDATION_SUCCEEDED, Some(m), "ValidationFailed");
            let message = format!("{VALIDATION_SUCCEEDED} is False");
            set_condition(&mut conditions, READY, ConditionStatus::False, "NotReady", &message, now);
            return EC2NodeClassStatus { conditions, ..previous };
        }
        set(VALIDATION_SUCCEEDED, None, "");
        let name = class.name();
        let known = self.state().classes.get(name).is_some_and(|k| k.spec == class.spec);
        let cached = known.then(|| self.fresh_resolution(name)).flatten();
        let (subnets, security_groups, amis, reservations) = match &cached {
            Some(s) => (
                Ok(s.subnets.clone()),
                Ok(s.security_groups.clone()),
                Ok(s.amis.clone()),
                Ok(s.capacity_reservations.clone()),
            ),
            None => self.resolve_parts(class).await,
        };
        let (instance_profile, profile_error) = match self.ensure_instance_profile(class).await {
            Ok(Some(p)) => (Some(p), None),
            Ok(None) => (None, Some("neither spec.role nor spec.instanceProfile is set".to_owned())),
            Err(e) => (previous.instance_profile.clone(), Some(e.to_string())),
        };
        set(SUBNETS_READY, subnets.as_ref().err().map(ToString::to_string), "SubnetsNotFound");
        set(SECURITY_GROUPS_READY, security_groups.as_ref().err().map(ToString::to_string), "SecurityGroupsNotFound");
        set(AMIS_READY, amis.as_ref().err().map(ToString::to_string), "AMIsNotFound");
        set(INSTANCE_PROFILE_READY, profile_error, "InstanceProfileNotFound");
        if self.settings.reserved_capacity {
            let failure = reservations.as_ref().err().map(ToString::to_string);
            set(CAPACITY_RESERVATIONS_READY, failure, "CapacityReservationsNotFound");
        }
        let ready = unready.is_empty();
        if ready {
            set_condition(&mut conditions, READY, ConditionStatus::True, READY, "", now);
        } else {
            let message = format!("{} not ready", unready.join(", "));
            set_condition(&mut conditions, READY, ConditionStatus::False, "NotReady", &message, now);
        }
        let status = EC2NodeClassStatus {
            subnets: subnets.unwrap_or_default(),
            security_groups: security_groups.unwrap_or_default(),
            amis: amis.unwrap_or_default(),
            instance_profile,
            capacity_reservations: reservations.unwrap_or_else(|_| previous.capacity_reservations.clone()),
            conditions: Vec::new(),
        };
        if ready && known && cached.is_none() {
            self.remember_resolution(name, class, status.clone()).await;
        }
        EC2NodeClassStatus { conditions, ..status }
    }

    pub(super) fn known_class(&self, name: &str) -> Result<Arc<EC2NodeClass>, CloudError> {
        self.state()
            .classes
            .get(name)
            .ok_or_else(|| CloudError::NodeClassNotReady(format!("EC2NodeClass/{name} is not known")))
    }

    /// The cached resolution of class `name`, unless older than `node_class_ttl`.
    /// A capacity block that has come within its expiry of its end makes the resolution stale at once, so
    /// it stops being offered on time.
    pub(super) fn fresh_resolution(&self, name: &str) -> Option<Arc<EC2NodeClassStatus>> {
        let now = self.now();
        let status = self.state().classes.fresh(name, now, self.settings.node_class_ttl)?;
        let block_expired = status
            .capacity_reservations
            .iter()
            .any(|r| r.is_capacity_block() && !r.is_expiring() && r.expires_at().is_some_and(|at| at <= now));
        (!block_expired).then_some(status)
    }

    /// What each kind of selector term of `class` resolves to, read from EC2.
    pub(super) async fn resolve_parts(&self, class: &EC2NodeClass) -> ResolvedParts {
        (
            self.resolve_subnets(class).await,
            self.resolve_security_groups(class).await,
            self.resolve_amis(class).await,
            self.resolve_capacity_reservations(class).await,
        )
    }

    /// Caches a fresh resolution, and deletes the launch templates it makes stale: a changed spec, AMI,
    /// group or profile names a new one, and those the class would no longer use go. Failing to delete
    /// them is not the caller's problem.
    pub(super) async fn remember_resolution(
        &self,
        name: &str,
        class: &EC2NodeClass,
        status: EC2NodeClassStatus,
    ) -> Arc<EC2NodeClassStatus> {
        let status = Arc::new(status);
        {
            // Fresh free-address counts: what launches took and found is in them now.
            let mut st = self.state();
            for s in &status.subnets {
                st.subnet_used.remove(&s.id);
                st.subnet_exhausted.remove(&s.id);
            }
        }
        self.state().classes.remember(name, self.now(), status.clone());
        let keep: BTreeSet<String> =
            status.amis.iter().map(|a| self.launch_template_prefix(class, &status, a)).collect();
        if let Err(e) = self.delete_launch_templates(name, &keep).await {
            tracing::warn!(node_class = name, error = %e, "could not delete unused launch templates");
        }
        status
    }

    pub(super) async fn resolve_subnets(&self, class: &EC2NodeClass) -> Result<Vec<ResolvedSubnet>, CloudError> {
        let mut out: BTreeMap<String, ResolvedSubnet> = BTreeMap::new();
        for term in &class.spec.subnet_selector_terms {
            let mut req = self.ec2.describe_subnets();
            if let Some(id) = &term.id {
                req = req.subnet_ids(id);
            }
            for f in tag_filters(&term.tags) {
                req = req.filters(f);
            }
            let resp = req.send().await.map_err(|e| sdk_error("DescribeSubnets", e))?;
            for s in resp.subnets() {
                let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone()) else {
                    return Err(CloudError::message(
                        NAME,
                        "DescribeSubnets: a subnet has no SubnetId or AvailabilityZone",
                    ));
                };
                out.insert(
                    id.to_owned(),
                    ResolvedSubnet {
                        id: id.to_owned(),
                        zone: zone.to_owned(),
                        zone_id: s.availability_zone_id().map(str::to_owned),
                        available_ips: s.available_ip_address_count(),
                    },
                );
            }
        }
        if out.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: spec.subnetSelectorTerms match no subnet",
                class.name()
            )));
        }
        Ok(out.into_values().collect())
    }

    pub(super) async fn resolve_security_groups(
        &self,
        class: &EC2NodeClass,
    ) -> Result<Vec<ResolvedSecurityGroup>, CloudError> {
        let mut out: BTreeMap<String, ResolvedSecurityGroup> = BTreeMap::new();
        for term in &class.spec.security_group_selector_terms {
            let mut req = self.ec2.describe_security_groups();
            if let Some(id) = &term.id {
                req = req.group_ids(id);
            }
            if let Some(name) = &term.name {
                req = req.filters(filter("group-name", [name.as_str()]));
            }
            for f in tag_filters(&term.tags) {
                req = req.filters(f);
            }
            let resp = req.send().await.map_err(|e| sdk_error("DescribeSecurityGroups", e))?;
            for g in resp.security_groups() {
                let Some(id) = g.group_id() else {
                    return Err(CloudError::message(NAME, "DescribeSecurityGroups: a group has no GroupId"));
                };
                out.insert(
                    id.to_owned(),
                    ResolvedSecurityGroup { id: id.to_owned(), name: g.group_name().map(str::to_owned) },
                );
            }
        }
        if out.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: spec.securityGroupSelectorTerms match no security group",
                class.name()
            )));
        }
        Ok(out.into_values().collect())
    }
}
