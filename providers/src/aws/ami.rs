//! AMI selection, as Karpenter's AWS provider does it.
//!
//! - An `alias` (`al2023@latest`, `bottlerocket@v1.30.0`) names EKS's public SSM parameters, one per
//!   architecture and variant, pinned to the cluster's Kubernetes version; each parameter holds the image
//!   id of that variant: standard, NVIDIA (GPU types) or Neuron (Inferentia and Trainium types).
//! - An `ssmParameter` term names a parameter holding an image id.
//! - `id`, `name` (owned by this account or Amazon unless `owner` says) and `tags` terms search
//!   `DescribeImages`; of what they match, the newest image of each architecture and variant is kept.
//!
//! SSM answers are kept for a day (an alias's) or five minutes (a user's parameter).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_ec2::types as ec2;
use aws_sdk_ssm::error::ProvideErrorMetadata;
use tenon_core::clock;
use tenon_core::cloud::CloudError;

use super::errors::sdk_error;
use super::nodeclass::{self, Alias, AmiSelectorTerm, EC2NodeClass, ResolvedAmi};
use super::provider::{AwsProvider, NAME, filter, tag_filters};
use super::shapes::kube_arch;

/// How long an alias's SSM parameter is kept (EKS publishes new images every few weeks).
const ALIAS_PARAMETER_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a user's `ssmParameter` is kept.
const CUSTOM_PARAMETER_TTL: Duration = Duration::from_secs(5 * 60);

/// What an image is built for: ordinary types, NVIDIA GPU types, Neuron accelerator types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Variant {
    /// Ordinary instance types.
    Standard,
    /// Instance types with GPUs.
    Nvidia,
    /// Instance types with AWS Inferentia or Trainium devices.
    Neuron,
}

/// One SSM parameter an alias reads: its name, and what the image it names is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasParameter {
    /// The parameter's name.
    pub name: String,
    /// The variants its image serves (AL2's GPU image serves both accelerated kinds).
    pub variants: Vec<Variant>,
}

/// The SSM parameters of `alias` for Kubernetes `k8s` (`1.33`), as EKS publishes them.
pub fn alias_parameters(alias: &Alias, k8s: &str) -> Vec<AliasParameter> {
    use Variant::{Neuron, Nvidia, Standard};
    let latest = alias.version == "latest";
    let p = |name: String, variants: &[Variant]| AliasParameter { name, variants: variants.to_vec() };
    match alias.family.as_str() {
        "al2023" => {
            let combos: [(&str, &str, Variant); 5] = [
                ("x86_64", "standard", Standard),
                ("x86_64", "nvidia", Nvidia),
                ("x86_64", "neuron", Neuron),
                ("arm64", "standard", Standard),
                ("arm64", "nvidia", Nvidia),
            ];
            combos
                .iter()
                .map(|(arch, variant, v)| {
                    let image = if latest {
                        "recommended".to_owned()
                    } else {
                        format!("amazon-eks-node-al2023-{arch}-{variant}-{k8s}-{}", alias.version)
                    };
                    p(
                        format!(
                            "/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2023/{arch}/{variant}/{image}/image_id"
                        ),
                        &[*v],
                    )
                })
                .collect()
        }
        "al2" => {
            let path = |dir: &str, image: &str, variants: &[Variant]| {
                let image = if latest { "recommended".to_owned() } else { format!("{image}-{k8s}-{}", alias.version) };
                p(format!("/aws/service/eks/optimized-ami/{k8s}/{dir}/{image}/image_id"), variants)
            };
            vec![
                path("amazon-linux-2", "amazon-eks-node", &[Standard]),
                path("amazon-linux-2-arm64", "amazon-eks-arm64-node", &[Standard]),
                path("amazon-linux-2-gpu", "amazon-eks-gpu-node", &[Nvidia, Neuron]),
            ]
        }
        _ => {
            let v = alias.version.trim_start_matches('v');
            vec![
                p(format!("/aws/service/bottlerocket/aws-k8s-{k8s}/x86_64/{v}/image_id"), &[Standard, Neuron]),
                p(format!("/aws/service/bottlerocket/aws-k8s-{k8s}/arm64/{v}/image_id"), &[Standard]),
                p(format!("/aws/service/bottlerocket/aws-k8s-{k8s}-nvidia/x86_64/{v}/image_id"), &[Nvidia]),
                p(format!("/aws/service/bottlerocket/aws-k8s-{k8s}-nvidia/arm64/{v}/image_id"), &[Nvidia]),
            ]
        }
    }
}

/// The `major.minor` Kubernetes version of an API server's `/version` (`1` and `31+` are `1.31`).
pub fn kubernetes_version(major: &str, minor: &str) -> Option<String> {
    let digits = |s: &str| s.trim().trim_end_matches('+').to_owned();
    let (major, minor) = (digits(major), digits(minor));
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (numeric(&major) && numeric(&minor)).then(|| format!("{major}.{minor}"))
}

impl AwsProvider {
    /// Pins `alias` terms to Kubernetes `version` (`1.33`), as the operator reads it from the API server.
    /// A version in the settings wins over it.
    pub fn set_kubernetes_version(&self, version: &str) {
        let mut st = self.state();
        if st.kubernetes_version.as_deref() != Some(version) {
            tracing::info!(version, "the cluster's Kubernetes version");
            st.kubernetes_version = Some(version.to_owned());
        }
    }

    /// The Kubernetes version aliases are pinned to: the settings', else the API server's, else the one
    /// EKS `DescribeCluster` reports.
    async fn alias_kubernetes_version(&self) -> Result<String, CloudError> {
        if let Some(v) = self.settings.kubernetes_version.clone().or_else(|| self.state().kubernetes_version.clone()) {
            return Ok(v);
        }
        let described = self.eks.describe_cluster().name(&self.settings.cluster_name).send().await.map_err(|e| {
            CloudError::NodeClassNotReady(format!(
                "an AMI alias needs the cluster's Kubernetes version: the API server's is not known yet and EKS \
                 DescribeCluster {} failed: {}",
                self.settings.cluster_name,
                aws_sdk_eks::error::DisplayErrorContext(e)
            ))
        })?;
        let v = described.cluster().and_then(|c| c.version()).map(str::to_owned).ok_or_else(|| {
            CloudError::NodeClassNotReady(format!(
                "an AMI alias needs the cluster's Kubernetes version: EKS DescribeCluster {} reports none",
                self.settings.cluster_name
            ))
        })?;
        self.state().kubernetes_version = Some(v.clone());
        Ok(v)
    }

    /// The value of SSM parameter `name` (kept for `ttl`); `None` when it does not exist.
    async fn ssm_parameter(&self, name: &str, ttl: Duration) -> Result<Option<String>, CloudError> {
        let now = self.now();
        if let Some((at, value)) = self.state().ssm.get(name)
            && clock::since(now, *at) < ttl
        {
            return Ok(Some(value.clone()));
        }
        match self.ssm.get_parameter().name(name).send().await {
            Ok(resp) => {
                let value = resp.parameter().and_then(|p| p.value()).map(str::to_owned).ok_or_else(|| {
                    CloudError::message(NAME, format!("SSM GetParameter {name}: the answer has no Parameter.Value"))
                })?;
                tracing::debug!(parameter = name, value = %value, "SSM parameter read");
                self.state().ssm.insert(name.to_owned(), (now, value.clone()));
                Ok(Some(value))
            }
            Err(e) if e.code() == Some("ParameterNotFound") => Ok(None),
            Err(e) => Err(sdk_error(&format!("SSM GetParameter {name}"), e)),
        }
    }

    /// `DescribeImages` for a term (`ids` replace the term's own `id`).
    async fn describe_images(
        &self,
        term: &AmiSelectorTerm,
        ids: &[String],
        owners: &[String],
    ) -> Result<Vec<ec2::Image>, CloudError> {
        let mut req = self.ec2.describe_images().include_deprecated(true);
        if ids.is_empty() {
            if let Some(id) = &term.id {
                req = req.image_ids(id);
            }
            if let Some(name) = &term.name {
                req = req.filters(filter("name", [name.as_str()]));
            }
            for o in owners {
                req = req.owners(o);
            }
            for f in tag_filters(&term.tags) {
                req = req.filters(f);
            }
        } else {
            req = req.set_image_ids(Some(ids.to_vec()));
        }
        let mut images = Vec::new();
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            images.extend(page.map_err(|e| sdk_error("DescribeImages", e))?.images().iter().cloned());
        }
        Ok(images)
    }

    /// The images of an alias term, each with the variants its parameter says it serves. A variant EKS
    /// does not publish for this version (no parameter) is left out; none at all is `NodeClassNotReady`.
    async fn alias_images(
        &self,
        class: &EC2NodeClass,
        term: &AmiSelectorTerm,
        alias: &str,
    ) -> Result<Vec<(ec2::Image, Vec<Variant>)>, CloudError> {
        let alias = nodeclass::parse_alias(alias).map_err(CloudError::NodeClassNotReady)?;
        let k8s = self.alias_kubernetes_version().await?;
        let mut variants_of: BTreeMap<String, Vec<Variant>> = BTreeMap::new();
        let mut tried = Vec::new();
        for param in alias_parameters(&alias, &k8s) {
            tried.push(param.name.clone());
            if let Some(id) = self.ssm_parameter(&param.name, ALIAS_PARAMETER_TTL).await? {
                variants_of.entry(id).or_default().extend(param.variants);
            }
        }
        if variants_of.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: alias {}@{} has no image for Kubernetes {k8s} (no SSM parameter {})",
                class.name(),
                alias.family,
                alias.version,
                tried.join(", ")
            )));
        }
        let ids: Vec<String> = variants_of.keys().cloned().collect();
        let images = self.describe_images(term, &ids, &[]).await?;
        Ok(images
            .into_iter()
            .filter_map(|i| {
                let variants = variants_of.get(i.image_id()?)?.clone();
                Some((i, variants))
            })
            .collect())
    }

    /// What a class's AMI terms resolve to, newest first.
    pub(super) async fn resolve_amis(&self, class: &EC2NodeClass) -> Result<Vec<ResolvedAmi>, CloudError> {
        let mut found: Vec<(ResolvedAmi, bool)> = Vec::new();
        for term in &class.spec.ami_selector_terms {
            let images: Vec<(ec2::Image, Option<Vec<Variant>>)> = if let Some(alias) = &term.alias {
                self.alias_images(class, term, alias).await?.into_iter().map(|(i, v)| (i, Some(v))).collect()
            } else if term.id.is_none()
                && let Some(param) = &term.ssm_parameter
            {
                match self.ssm_parameter(param, CUSTOM_PARAMETER_TTL).await? {
                    Some(id) if id.starts_with("ami-") => {
                        self.describe_images(term, &[id], &[]).await?.into_iter().map(|i| (i, None)).collect()
                    }
                    Some(value) => {
                        tracing::warn!(node_class = class.name(), parameter = %param, value = %value, "the SSM parameter does not hold an AMI id");
                        Vec::new()
                    }
                    None => {
                        tracing::warn!(node_class = class.name(), parameter = %param, "no such SSM parameter");
                        Vec::new()
                    }
                }
            } else {
                let owners = nodeclass::image_owners(term);
                self.describe_images(term, &[], &owners).await?.into_iter().map(|i| (i, None)).collect()
            };
            for (i, variants) in images {
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
                // An image found by name or tags is taken as NVIDIA's when its name says so.
                let variants = variants.unwrap_or_else(|| {
                    let n = name.as_deref().unwrap_or_default().to_ascii_lowercase();
                    vec![if n.contains("nvidia") || n.contains("gpu") { Variant::Nvidia } else { Variant::Standard }]
                });
                let now = self.now();
                let deprecated =
                    i.deprecation_time().and_then(|t| t.parse::<jiff::Timestamp>().ok()).is_some_and(|t| t <= now);
                if !found.iter().any(|(a, _)| a.id == id) {
                    found.push((
                        ResolvedAmi {
                            id: id.to_owned(),
                            name,
                            architecture: arch.to_owned(),
                            nvidia: variants.contains(&Variant::Nvidia),
                            neuron: variants.contains(&Variant::Neuron),
                            creation_date: i.creation_date().map(str::to_owned),
                        },
                        deprecated,
                    ));
                }
            }
        }
        if found.is_empty() {
            return Err(CloudError::NodeClassNotReady(format!(
                "EC2NodeClass/{}: spec.amiSelectorTerms match no image",
                class.name()
            )));
        }
        // Of the images serving one architecture and variant, the class boots one: the newest that is not
        // deprecated (then by name), as Karpenter keeps them.
        found.sort_by(|(a, a_old), (b, b_old)| {
            a_old.cmp(b_old).then(b.creation_date.cmp(&a.creation_date)).then(b.name.cmp(&a.name)).then(a.id.cmp(&b.id))
        });
        let mut seen = BTreeSet::new();
        Ok(found
            .into_iter()
            .map(|(a, _)| a)
            .filter(|a| seen.insert((a.architecture.clone(), a.nvidia, a.neuron)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn names(alias: &str, k8s: &str) -> Vec<(String, Vec<Variant>)> {
        let alias = nodeclass::parse_alias(alias).unwrap();
        alias_parameters(&alias, k8s).into_iter().map(|p| (p.name, p.variants)).collect()
    }

    #[test]
    fn aliases_name_the_ssm_parameters_eks_publishes() {
        use Variant::{Neuron, Nvidia, Standard};
        let al2023 = names("al2023@latest", "1.33");
        assert_eq!(al2023.len(), 5, "x86_64 standard, nvidia, neuron; arm64 standard, nvidia");
        assert_eq!(
            al2023[0],
            (
                "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id".into(),
                vec![Standard]
            )
        );
        assert_eq!(
            names("al2023@v20260601", "1.33")[2].0,
            "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/neuron/amazon-eks-node-al2023-x86_64-neuron-1.33-v20260601/image_id"
        );
        assert_eq!(
            names("al2@latest", "1.32")[2],
            (
                "/aws/service/eks/optimized-ami/1.32/amazon-linux-2-gpu/recommended/image_id".into(),
                vec![Nvidia, Neuron]
            )
        );
        assert_eq!(
            names("al2@v20260601", "1.32")[1].0,
            "/aws/service/eks/optimized-ami/1.32/amazon-linux-2-arm64/amazon-eks-arm64-node-1.32-v20260601/image_id"
        );
        let br = names("bottlerocket@v1.40.0", "1.33");
        assert_eq!(
            br[0],
            ("/aws/service/bottlerocket/aws-k8s-1.33/x86_64/1.40.0/image_id".into(), vec![Standard, Neuron])
        );
        assert_eq!(br[3], ("/aws/service/bottlerocket/aws-k8s-1.33-nvidia/arm64/1.40.0/image_id".into(), vec![Nvidia]));
        assert_eq!(
            names("bottlerocket@latest", "1.33")[1].0,
            "/aws/service/bottlerocket/aws-k8s-1.33/arm64/latest/image_id"
        );
    }

    #[test]
    fn the_api_server_version_is_major_dot_minor() {
        assert_eq!(kubernetes_version("1", "33").as_deref(), Some("1.33"));
        assert_eq!(kubernetes_version("1", "31+").as_deref(), Some("1.31"), "EKS reports 31+");
        assert_eq!(kubernetes_version("", "31"), None);
        assert_eq!(kubernetes_version("1", "x"), None);
    }
}
