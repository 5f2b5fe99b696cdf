//! What an `AKSNodeClass`'s image family resolves to: AKS's node images in its community galleries
//! (`AKSUbuntu-…`, `AKSAzureLinux-…`), one image definition per architecture and Hyper-V generation,
//! each at its newest published version (`communityGalleryImageVersions` of the location, by
//! `publishedDate`, skipping versions excluded from latest or past their end of life), or at the class's
//! `imageVersion`.
//!
//! The family follows the cluster's Kubernetes version as AKS's does: `Ubuntu` is Ubuntu 24.04 from
//! Kubernetes 1.34 and 22.04 before; `AzureLinux` is Azure Linux 3 from 1.32 and 2 before.

use serde::Deserialize;
use tenon_core::api::{NodeSelectorRequirement, Operator, labels};

use super::catalog::LABEL_SKU_HYPERV_GENERATION;

/// The community gallery of AKS's Ubuntu node images.
pub const UBUNTU_GALLERY: &str = "AKSUbuntu-38d80f77-467a-481f-a8d4-09b6d4220bd2";
/// The community gallery of AKS's Azure Linux node images.
pub const AZURE_LINUX_GALLERY: &str = "AKSAzureLinux-f7c7cda5-1c9a-4bdc-a222-9614c968580b";

/// One image definition of a family: its gallery, name, architecture and Hyper-V generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Definition {
    /// The community gallery.
    pub gallery: &'static str,
    /// The image definition (`2204gen2containerd`).
    pub name: &'static str,
    /// `amd64` or `arm64`.
    pub arch: &'static str,
    /// `1` or `2`.
    pub generation: &'static str,
}

const fn def(gallery: &'static str, name: &'static str, arch: &'static str, generation: &'static str) -> Definition {
    Definition { gallery, name, arch, generation }
}

/// The image definitions of `family` for Kubernetes `minor` (of 1.x), in the order they are preferred;
/// `None` for a family not known.
pub fn definitions(family: &str, minor: u64) -> Option<[Definition; 3]> {
    let ubuntu = |v: &str| match v {
        "2404" => [
            def(UBUNTU_GALLERY, "2404gen2containerd", "amd64", "2"),
            def(UBUNTU_GALLERY, "2404containerd", "amd64", "1"),
            def(UBUNTU_GALLERY, "2404gen2arm64containerd", "arm64", "2"),
        ],
        _ => [
            def(UBUNTU_GALLERY, "2204gen2containerd", "amd64", "2"),
            def(UBUNTU_GALLERY, "2204containerd", "amd64", "1"),
            def(UBUNTU_GALLERY, "2204gen2arm64containerd", "arm64", "2"),
        ],
    };
    Some(match family {
        "Ubuntu" if minor >= 34 => ubuntu("2404"),
        "Ubuntu" | "Ubuntu2204" => ubuntu("2204"),
        "Ubuntu2404" => ubuntu("2404"),
        "AzureLinux" if minor >= 32 => [
            def(AZURE_LINUX_GALLERY, "V3gen2", "amd64", "2"),
            def(AZURE_LINUX_GALLERY, "V3", "amd64", "1"),
            def(AZURE_LINUX_GALLERY, "V3gen2arm64", "arm64", "2"),
        ],
        "AzureLinux" => [
            def(AZURE_LINUX_GALLERY, "V2gen2", "amd64", "2"),
            def(AZURE_LINUX_GALLERY, "V2", "amd64", "1"),
            def(AZURE_LINUX_GALLERY, "V2gen2arm64", "arm64", "2"),
        ],
        _ => return None,
    })
}

/// The OS SKU AKS labels a family's nodes with (`kubernetes.azure.com/os-sku`).
pub fn os_sku(family: &str) -> &'static str {
    if family == "AzureLinux" { "AzureLinux" } else { "Ubuntu" }
}

/// A community gallery image version, the fields read here.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ImageVersion {
    /// The version (`202505.27.0`).
    #[serde(default)]
    pub name: Option<String>,
    /// Its properties.
    #[serde(default)]
    pub properties: Option<ImageVersionProperties>,
}

/// `CommunityGalleryImageVersionProperties`, the fields read here.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ImageVersionProperties {
    /// When it was published (RFC 3339).
    #[serde(default)]
    pub published_date: Option<String>,
    /// When it stops being supported.
    #[serde(default)]
    pub end_of_life_date: Option<String>,
    /// Whether "latest" skips it.
    #[serde(default)]
    pub exclude_from_latest: Option<bool>,
}

/// The version to boot of those listed: `pinned` if listed, else the newest published one that is not
/// excluded from latest nor past its end of life at `now` (RFC 3339).
pub fn pick_version(versions: &[ImageVersion], pinned: Option<&str>, now: &str) -> Option<String> {
    if let Some(p) = pinned {
        return versions.iter().filter_map(|v| v.name.as_deref()).find(|n| *n == p).map(str::to_owned);
    }
    let at = |s: &str| s.parse::<jiff::Timestamp>().ok();
    let now = at(now);
    versions
        .iter()
        .filter_map(|v| {
            let p = v.properties.as_ref()?;
            if p.exclude_from_latest == Some(true) {
                return None;
            }
            if let (Some(eol), Some(now)) = (p.end_of_life_date.as_deref().and_then(at), now)
                && eol <= now
            {
                return None;
            }
            Some((p.published_date.as_deref().and_then(at)?, v.name.as_deref()?))
        })
        .max()
        .map(|(_, n)| n.to_owned())
}

/// The image id of a community gallery image version.
pub fn image_id(d: &Definition, version: &str) -> String {
    format!("/CommunityGalleries/{}/images/{}/versions/{version}", d.gallery, d.name)
}

/// The requirements a definition's VM sizes meet.
pub fn requirements(d: &Definition) -> Vec<NodeSelectorRequirement> {
    vec![
        NodeSelectorRequirement::new(labels::ARCH, Operator::In, [d.arch]),
        NodeSelectorRequirement::new(LABEL_SKU_HYPERV_GENERATION, Operator::In, [d.generation]),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn v(name: &str, published: &str, eol: Option<&str>, excluded: bool) -> ImageVersion {
        ImageVersion {
            name: Some(name.into()),
            properties: Some(ImageVersionProperties {
                published_date: Some(published.into()),
                end_of_life_date: eol.map(Into::into),
                exclude_from_latest: Some(excluded),
            }),
        }
    }

    #[test]
    fn families_follow_the_kubernetes_version() {
        assert_eq!(definitions("Ubuntu", 33).unwrap()[0].name, "2204gen2containerd");
        assert_eq!(definitions("Ubuntu", 34).unwrap()[0].name, "2404gen2containerd");
        assert_eq!(definitions("AzureLinux", 31).unwrap()[2].name, "V2gen2arm64");
        assert_eq!(definitions("AzureLinux", 32).unwrap()[0].name, "V3gen2");
        assert!(definitions("Windows", 33).is_none());
    }

    #[test]
    fn the_newest_usable_version_wins_unless_one_is_pinned() {
        let versions = [
            v("202501.01.0", "2025-01-01T00:00:00Z", None, false),
            v("202503.01.0", "2025-03-01T00:00:00Z", None, false),
            v("202504.01.0", "2025-04-01T00:00:00Z", None, true),
            v("202505.01.0", "2025-05-01T00:00:00Z", Some("2025-06-01T00:00:00Z"), false),
        ];
        assert_eq!(pick_version(&versions, None, "2025-07-01T00:00:00Z").as_deref(), Some("202503.01.0"));
        assert_eq!(pick_version(&versions, None, "2025-05-15T00:00:00Z").as_deref(), Some("202505.01.0"));
        assert_eq!(
            pick_version(&versions, Some("202501.01.0"), "2025-07-01T00:00:00Z").as_deref(),
            Some("202501.01.0")
        );
        assert_eq!(pick_version(&versions, Some("209901.01.0"), "2025-07-01T00:00:00Z"), None);
    }
}
