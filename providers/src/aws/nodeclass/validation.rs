//! What the API server's schema cannot check of an `EC2NodeClass`, checked as Karpenter's CRD rules do,
//! each error naming the object and the field.

use super::EC2NodeClass;

impl EC2NodeClass {
    /// Checks what the API server's schema cannot: one kind of field per term, role or instance profile.
    pub fn validate(&self) -> Result<(), String> {
        let s = &self.spec;
        let name = self.name();
        // The tags tenon owns: a user tag on one of these would make instances look like another
        // cluster's, pool's or claim's.
        for key in s.tags.keys() {
            let reserved = key.is_empty()
                || key.starts_with("kubernetes.io/cluster")
                || [
                    "eks:eks-cluster-name",
                    "karpenter.sh/nodepool",
                    "karpenter.sh/nodeclaim",
                    "karpenter.k8s.aws/ec2nodeclass",
                ]
                .contains(&key.as_str());
            if reserved {
                return Err(format!("EC2NodeClass/{name}: spec.tags: {key:?} is a tag tenon sets itself"));
            }
        }
        s.family().map_err(|e| format!("EC2NodeClass/{name}: {e}"))?;
        s.kubelet().map_err(|e| format!("EC2NodeClass/{name}: {e}"))?;
        s.raid0().map_err(|e| format!("EC2NodeClass/{name}: {e}"))?;
        if s.role.is_some() && s.instance_profile.is_some() {
            return Err(format!("EC2NodeClass/{name}: spec.role and spec.instanceProfile are mutually exclusive"));
        }
        if s.subnet_selector_terms.is_empty() {
            return Err(format!("EC2NodeClass/{name}: spec.subnetSelectorTerms is empty"));
        }
        if s.security_group_selector_terms.is_empty() {
            return Err(format!("EC2NodeClass/{name}: spec.securityGroupSelectorTerms is empty"));
        }
        if s.ami_selector_terms.is_empty() {
            return Err(format!("EC2NodeClass/{name}: spec.amiSelectorTerms is empty"));
        }
        for (i, t) in s.ami_selector_terms.iter().enumerate() {
            // As Karpenter's CRD has it: an `alias` stands alone, in the only term; an `id` goes without
            // `name`, `owner` and `tags` (an `ssmParameter` beside it is ignored); `name` (with an optional
            // `owner`), `tags` and `ssmParameter` may go together.
            let others = t.name.is_some() || !t.tags.is_empty() || t.owner.is_some();
            let ok = match (t.alias.is_some(), t.id.is_some()) {
                (true, false) => !others && t.ssm_parameter.is_none() && s.ami_selector_terms.len() == 1,
                (false, true) => !others,
                (false, false) => t.name.is_some() || !t.tags.is_empty() || t.ssm_parameter.is_some(),
                (true, true) => false,
            };
            if !ok {
                return Err(format!(
                    "EC2NodeClass/{name}: spec.amiSelectorTerms[{i}] must set an alias alone (in the only term), an \
                     id alone, or name, tags and/or ssmParameter"
                ));
            }
            if let Some(alias) = &t.alias {
                parse_alias(alias).map_err(|e| format!("EC2NodeClass/{name}: spec.amiSelectorTerms[{i}]: {e}"))?;
            }
        }
        if s.capacity_reservation_selector_terms.len() > 30 {
            return Err(format!("EC2NodeClass/{name}: spec.capacityReservationSelectorTerms has more than 30 terms"));
        }
        for (i, t) in s.capacity_reservation_selector_terms.iter().enumerate() {
            crate::aws::reservations::validate_term(i, t).map_err(|e| format!("EC2NodeClass/{name}: {e}"))?;
        }
        for (i, t) in s.subnet_selector_terms.iter().enumerate() {
            if t.id.is_some() != t.tags.is_empty() {
                return Err(format!(
                    "EC2NodeClass/{name}: spec.subnetSelectorTerms[{i}] must set exactly one of id, tags"
                ));
            }
        }
        for (i, t) in s.security_group_selector_terms.iter().enumerate() {
            let kinds = [t.id.is_some(), t.name.is_some(), !t.tags.is_empty()];
            if kinds.iter().filter(|k| **k).count() != 1 {
                return Err(format!(
                    "EC2NodeClass/{name}: spec.securityGroupSelectorTerms[{i}] must set exactly one of id, name, tags"
                ));
            }
        }
        for (i, b) in s.block_device_mappings.iter().enumerate() {
            if let Some(ebs) = &b.ebs {
                ebs.size_gib().map_err(|e| format!("EC2NodeClass/{name}: spec.blockDeviceMappings[{i}].ebs: {e}"))?;
            }
        }
        Ok(())
    }
}

pub use crate::alias::Alias;

/// Parses an AMI alias, `family@version` (`al2023`, `al2` or `bottlerocket`, in any case).
pub fn parse_alias(alias: &str) -> Result<Alias, String> {
    crate::alias::parse(alias, &["al2023", "al2", "bottlerocket"], true)
}
