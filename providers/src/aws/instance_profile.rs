//! Instance profiles for a class's `role`, as Karpenter's AWS provider manages them: one profile per class
//! (named after the cluster and a hash of region and class), made when first needed, holding the class's
//! role (a role path or ARN is reduced to the role's name), tagged to the cluster and class, recorded in the
//! class's status, and deleted with the class. A class naming `instanceProfile` uses that one untouched.

use aws_sdk_iam::error::ProvideErrorMetadata;
use tenon_core::cloud::CloudError;

use super::errors::sdk_error;
use super::nodeclass::EC2NodeClass;
use super::provider::{AwsProvider, TAG_NODE_CLASS};

/// The name IAM knows a role by: the last segment of a role ARN or path (`arn:aws:iam::1:role/eks/Nodes`
/// and `eks/Nodes` are both `Nodes`).
pub(crate) fn role_name(role: &str) -> &str {
    role.rsplit('/').next().unwrap_or(role)
}

fn not_found<E: ProvideErrorMetadata>(
    e: &aws_sdk_iam::error::SdkError<E, aws_sdk_iam::config::http::HttpResponse>,
) -> bool {
    e.code() == Some("NoSuchEntity")
}

impl AwsProvider {
    /// The name of the instance profile tenon makes for the class named `class`.
    pub fn instance_profile_name(&self, class: &str) -> String {
        let key = serde_json::Value::String(format!("{}{class}", self.region()));
        format!("{}_{}", self.settings.cluster_name, tenon_core::api::stable_hash(&key))
    }

    /// The instance profile `class`'s instances launch with: its `instanceProfile`, or the profile tenon
    /// keeps for its `role` (made, and given the role, when missing or holding another). `None` when the
    /// class names neither.
    pub(super) async fn ensure_instance_profile(&self, class: &EC2NodeClass) -> Result<Option<String>, CloudError> {
        if let Some(p) = &class.spec.instance_profile {
            return Ok(Some(p.clone()));
        }
        let Some(role) = class.spec.role.as_deref() else { return Ok(None) };
        let role = role_name(role);
        let name = self.instance_profile_name(class.name());
        if self.state().profiles.get(&name).is_some_and(|r| r == role) {
            return Ok(Some(name));
        }
        let found = match self.iam.get_instance_profile().instance_profile_name(&name).send().await {
            Ok(r) => r.instance_profile().cloned(),
            Err(e) if not_found(&e) => None,
            Err(e) => return Err(sdk_error(&format!("GetInstanceProfile {name}"), e)),
        };
        let roles: Vec<String> = match &found {
            Some(p) => p.roles().iter().map(|r| r.role_name().to_owned()).collect(),
            None => {
                let path = format!("/karpenter/{}/{}/{}/", self.region(), self.settings.cluster_name, class.name());
                let tag = |k: &str, v: &str| aws_sdk_iam::types::Tag::builder().key(k).value(v).build();
                let cluster_tag = tag(&format!("kubernetes.io/cluster/{}", self.settings.cluster_name), "owned");
                let mut req = self.iam.create_instance_profile().instance_profile_name(&name).path(path);
                for t in [cluster_tag, tag(TAG_NODE_CLASS, class.name())] {
                    req = req.tags(t.map_err(|e| CloudError::message(super::provider::NAME, e.to_string()))?);
                }
                match req.send().await {
                    Ok(_) => {}
                    Err(e) if e.code() == Some("EntityAlreadyExists") => {}
                    Err(e) => return Err(sdk_error(&format!("CreateInstanceProfile {name}"), e)),
                }
                tracing::info!(instance_profile = %name, node_class = class.name(), "created an instance profile");
                Vec::new()
            }
        };
        // A profile holds one role: another one (the class's role changed) goes first.
        for other in roles.iter().filter(|r| r.as_str() != role) {
            let r = self.iam.remove_role_from_instance_profile().instance_profile_name(&name).role_name(other);
            match r.send().await {
                Ok(_) => {}
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(sdk_error(&format!("RemoveRoleFromInstanceProfile {name}"), e)),
            }
        }
        if !roles.iter().any(|r| r == role) {
            let r = self.iam.add_role_to_instance_profile().instance_profile_name(&name).role_name(role);
            match r.send().await {
                Ok(_) => {}
                Err(e) if e.code() == Some("LimitExceeded") => {}
                Err(e) if not_found(&e) => {
                    return Err(CloudError::NodeClassNotReady(format!(
                        "EC2NodeClass/{}: spec.role: IAM has no role {role:?}",
                        class.name()
                    )));
                }
                Err(e) => return Err(sdk_error(&format!("AddRoleToInstanceProfile {name}"), e)),
            }
        }
        self.state().profiles.insert(name.clone(), role.to_owned());
        Ok(Some(name))
    }

    /// Deletes the instance profile tenon made for the class named `class` (its role removed first);
    /// nothing when it made none (the class named its own `instanceProfile`).
    pub(super) async fn delete_instance_profile(&self, class: &str) -> Result<(), CloudError> {
        let name = self.instance_profile_name(class);
        self.state().profiles.remove(&name);
        let profile = match self.iam.get_instance_profile().instance_profile_name(&name).send().await {
            Ok(r) => r.instance_profile().cloned(),
            Err(e) if not_found(&e) => return Ok(()),
            Err(e) => return Err(sdk_error(&format!("GetInstanceProfile {name}"), e)),
        };
        for role in profile.iter().flat_map(|p| p.roles()) {
            let r =
                self.iam.remove_role_from_instance_profile().instance_profile_name(&name).role_name(role.role_name());
            match r.send().await {
                Ok(_) => {}
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(sdk_error(&format!("RemoveRoleFromInstanceProfile {name}"), e)),
            }
        }
        match self.iam.delete_instance_profile().instance_profile_name(&name).send().await {
            Ok(_) => {
                tracing::info!(instance_profile = %name, node_class = class, "deleted an instance profile");
                Ok(())
            }
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(sdk_error(&format!("DeleteInstanceProfile {name}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_path_or_arn_is_reduced_to_its_name() {
        assert_eq!(role_name("KarpenterNodeRole-prod"), "KarpenterNodeRole-prod");
        assert_eq!(role_name("eks/nodes/KarpenterNodeRole-prod"), "KarpenterNodeRole-prod");
        assert_eq!(role_name("arn:aws:iam::123456789012:role/eks/KarpenterNodeRole-prod"), "KarpenterNodeRole-prod");
    }
}
