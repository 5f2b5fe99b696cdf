//! AMI selection: aliases, names, ids and tags resolved to images, each with its architecture and
//! whether it is the accelerated variant.

use std::collections::BTreeSet;

use aws_sdk_ec2::types as ec2;
use tenon_core::cloud::CloudError;

use super::errors::sdk_error;
use super::nodeclass::{self, AmiSelectorTerm, EC2NodeClass, ResolvedAmi};
use super::provider::{AwsProvider, NAME, filter, tag_filters};
use super::shapes::kube_arch;

impl AwsProvider {
    /// Name patterns of an alias's images: `(pattern, nvidia)`.
    pub(super) fn alias_patterns(&self, alias: &nodeclass::Alias) -> Vec<(String, bool)> {
        let k8s = self.settings.kubernetes_version.as_deref().unwrap_or("*");
        let v = if alias.version == "latest" { "v*".to_owned() } else { alias.version.clone() };
        match alias.family.as_str() {
            "al2023" => vec![
                (format!("amazon-eks-node-al2023-*-standard-{k8s}-{v}"), false),
                (format!("amazon-eks-node-al2023-*-nvidia-{k8s}-{v}"), true),
            ],
            "al2" => vec![
                (format!("amazon-eks-node-{k8s}-{v}"), false),
                (format!("amazon-eks-arm64-node-{k8s}-{v}"), false),
                (format!("amazon-eks-gpu-node-{k8s}-{v}"), true),
            ],
            _ => vec![
                (format!("bottlerocket-aws-k8s-{k8s}-*-{v}*"), false),
                (format!("bottlerocket-aws-k8s-{k8s}-nvidia-*-{v}*"), true),
            ],
        }
    }

    pub(super) async fn describe_images(
        &self,
        term: &AmiSelectorTerm,
        pattern: Option<&str>,
        owners: &[String],
    ) -> Result<Vec<ec2::Image>, CloudError> {
        let mut req = self.ec2.describe_images();
        if let Some(id) = &term.id {
            req = req.image_ids(id);
        }
        if let Some(p) = pattern {
            req = req.filters(filter("name", [p]));
        }
        for o in owners {
            req = req.owners(o);
        }
        for f in tag_filters(&term.tags) {
            req = req.filters(f);
        }
        let resp = req.send().await.map_err(|e| sdk_error("DescribeImages", e))?;
        Ok(resp.images().to_vec())
    }

    pub(super) async fn resolve_amis(&self, class: &EC2NodeClass) -> Result<Vec<ResolvedAmi>, CloudError> {
        let mut found: Vec<ResolvedAmi> = Vec::new();
        for term in &class.spec.ami_selector_terms {
            let mut batches: Vec<(Vec<ec2::Image>, bool)> = Vec::new();
            if let Some(alias) = &term.alias {
                let alias = nodeclass::parse_alias(alias).map_err(CloudError::NodeClassNotReady)?;
                let owners = [self.settings.ami_alias_owner.clone()];
                for (pattern, nvidia) in self.alias_patterns(&alias) {
                    let mut images = self.describe_images(term, Some(&pattern), &owners).await?;
                    // An alias names one image per architecture and variant: the newest.
                    images.sort_by(|a, b| b.creation_date().cmp(&a.creation_date()));
                    let mut seen = BTreeSet::new();
                    images.retain(|i| seen.insert(i.architecture().map(|a| a.as_str().to_owned())));
                    batches.push((images, nvidia));
                }
            } else {
                let images = self.describe_images(term, term.name.as_deref(), &nodeclass::image_owners(term)).await?;
                batches.push((images, false));
            }
            for (images, nvidia) in batches {
                for i in images {
                    let Some(id) = i.image_id() else {
                        return Err(CloudError::message(NAME, "DescribeImages: an image has no ImageId"));
                    };
                    // One odd image in a wildcard match must not make the whole NodeClass unusable.
                    let Some(arch) = i.architecture().map(|a| a.as_str()).and_then(kube_arch) else {
                        tracing::warn!(
                            node_class = class.name(),
                            image = id,
                            architecture = ?i.architecture(),
                            "skipping an image without a supported Architecture"
                        );
                        continue;
                    };
                    let name = i.name().map(str::to_owned);
                    let nvidia = nvidia
                        || name.as_deref().is_some_and(|n| {
                            let n = n.to_ascii_lowercase();
                            n.contains("nvidia") || n.contains("gpu")
                        });
                    if !found.iter().any(|a| a.id == id) {
                        found.push(ResolvedAmi {
                            id: id.to_owned(),
                            name,
                            architecture: arch.to_owned(),
                            nvidia,
                            creation_date: i.creation_date().map(str::to_owned),
                        });
                    }
                }
            }
        }
        if found.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: spec.amiSelectorTerms match no image",
                class.name()
            )));
        }
        found.sort_by(|a, b| b.creation_date.cmp(&a.creation_date));
        Ok(found)
    }
}
