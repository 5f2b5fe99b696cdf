//! What a `GCENodeClass`'s `imageSelectorTerms` resolve to: GKE's node images, by family and version, or an
//! image named by id.
//!
//! - `id`: the image itself (`images.get`); it boots the instance types of its architecture.
//! - Container-Optimized OS (`family: ContainerOptimizedOS`, or `alias: ContainerOptimizedOS@…`): GKE's
//!   images in project `gke-node-images`, named `gke-<k8s>-gke<build>-cos-[arm64-]<milestone>-c-<pre|nvda>`.
//!   The images of the cluster's Kubernetes version are listed (`images.list`, filtered on the version's
//!   name prefix), those deprecated or of a special build (gVisor, kernel-module, cgroup v1, test) left out,
//!   and one chosen per variant: amd64 and arm64 for machines without GPUs, and the NVIDIA build (`-c-nvda`,
//!   drivers preloaded) for GPU machines. `version: latest` takes the cluster's own GKE build when it is
//!   published, else the newest of its patch version; a milestone (`125.19216.104.126`) takes that
//!   milestone's images. A variant that is not published is left out (without the NVIDIA build, GPU
//!   machines boot the amd64 image, as GKE's driver installer expects).
//! - Ubuntu (`family: Ubuntu2404` / `Ubuntu2204`, or `alias: Ubuntu@…`, which is 24.04): GKE's images in
//!   project `ubuntu-os-gke-cloud`, named `ubuntu-gke-<release>-<major>-<minor>-[amd64-|arm64-]v<date>`,
//!   one per architecture, of the cluster's minor version: the newest (`latest`) or that date
//!   (`vYYYYMMDD`). Both architectures must be published, else the term does not resolve.
//! - `channel` (Container-Optimized OS): the version a GKE release channel promotes for the cluster's
//!   minor version, from GKE's server config (`projects.locations.getServerConfig`): the channel's default
//!   version when it is of that minor, else the newest of its valid versions that is; `cluster` is the
//!   channel the cluster is enrolled in (`projects.locations.clusters.get`). A version newer than the
//!   cluster's own is held at the cluster's (a kubelet may not be newer than its API server). The images
//!   are that exact GKE build's, with no fallback to another build: a build GKE has not published images
//!   for yet is not ready, and says so.
//!
//! The cluster's Kubernetes version comes from [`GcpProvider::set_kubernetes_version`] (the operator reads
//! the API server's `/version`); until it is known, family and alias terms do not resolve.

use google_cloud_compute_v1::model;
use google_cloud_gax::paginator::Paginator;
use tenon_core::api::{NodeSelectorRequirement, Operator, labels};
use tenon_core::cloud::CloudError;

use super::catalog::LABEL_GPU_COUNT;
use super::errors::client_error;
use super::nodeclass::{GCENodeClass, ImageSelectorTerm, ResolvedImage};
use super::provider::GcpProvider;

/// The project of GKE's Container-Optimized OS node images.
pub const COS_PROJECT: &str = "gke-node-images";
/// The project of GKE's Ubuntu node images.
pub const UBUNTU_PROJECT: &str = "ubuntu-os-gke-cloud";

/// A cluster's Kubernetes version as its API server reports it (`v1.33.5-gke.1080000`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
    /// GKE's build number (`1080000`), when the version is a GKE one.
    pub gke_build: Option<String>,
}

impl KubernetesVersion {
    /// Parses `v1.33.5`, `1.33.5-gke.1080000` and the like.
    pub fn parse(v: &str) -> Option<Self> {
        let v = v.trim().trim_start_matches('v');
        let (base, rest) = v.split_once('-').map_or((v, None), |(b, r)| (b, Some(r)));
        let mut parts = base.split('.').map(|p| p.parse::<u32>().ok());
        let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
        if parts.next().is_some() {
            return None;
        }
        let gke_build = rest
            .and_then(|r| r.strip_prefix("gke."))
            .filter(|b| !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()))
            .map(str::to_owned);
        Some(Self { major, minor, patch, gke_build })
    }

    /// The version's order: major, minor, patch, then GKE build.
    fn order(&self) -> (u32, u32, u32, u64) {
        let build = self.gke_build.as_deref().and_then(|b| b.parse().ok()).unwrap_or(0);
        (self.major, self.minor, self.patch, build)
    }

    fn cos_key(&self) -> String {
        format!("{}{}{}", self.major, self.minor, self.patch)
    }
}

/// A Container-Optimized OS node image's name, read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CosName {
    k8s: String,
    build: String,
    arm64: bool,
    /// `121.18867.199.28`.
    milestone: String,
    nvidia: bool,
}

/// Reads `gke-<k8s>-gke<build>-cos-[arm64-]<a>-<b>-<c>-<d>-c-<pre|nvda>`; any other name (a special
/// build: `-gvisor`, `-kmod`, `-cgpv1`, test images) is `None`.
fn cos_name(name: &str) -> Option<CosName> {
    let rest = name.strip_prefix("gke-")?;
    let (k8s, rest) = rest.split_once("-gke")?;
    let (build, rest) = rest.split_once("-cos-")?;
    let (arm64, rest) = match rest.strip_prefix("arm64-") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let (version, nvidia) =
        if let Some(v) = rest.strip_suffix("-c-pre") { (v, false) } else { (rest.strip_suffix("-c-nvda")?, true) };
    let numbers: Vec<&str> = version.split('-').collect();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    if numbers.len() != 4 || !numbers.iter().all(|n| digits(n)) || !digits(k8s) || !digits(build) {
        return None;
    }
    Some(CosName { k8s: k8s.to_owned(), build: build.to_owned(), arm64, milestone: numbers.join("."), nvidia })
}

/// An Ubuntu node image's name, read: its architecture and date (`v20260416`, maybe with a letter).
fn ubuntu_name<'a>(name: &'a str, prefix: &str) -> Option<(&'static str, &'a str)> {
    let rest = name.strip_prefix(prefix)?;
    let (arch, date) = if let Some(d) = rest.strip_prefix("amd64-") {
        ("amd64", d)
    } else if let Some(d) = rest.strip_prefix("arm64-") {
        ("arm64", d)
    } else {
        ("amd64", rest)
    };
    let digits = date.strip_prefix('v')?;
    let day = digits.get(..8)?;
    let letter = &digits[8..];
    (day.bytes().all(|c| c.is_ascii_digit())
        && (letter.is_empty() || (letter.len() == 1 && letter.as_bytes()[0].is_ascii_lowercase())))
    .then_some((arch, date))
}

fn deprecated(i: &model::Image) -> bool {
    use model::deprecation_status::State;
    i.deprecated
        .as_ref()
        .and_then(|d| d.state.as_ref())
        .is_some_and(|s| matches!(s, State::Deprecated | State::Obsolete | State::Deleted))
}

fn requirement(key: &str, op: Operator, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement::new(key, op, values.iter().copied())
}

fn arch_only(arch: &str) -> Vec<NodeSelectorRequirement> {
    vec![requirement(labels::ARCH, Operator::In, &[arch])]
}

fn without_gpus(arch: &str) -> Vec<NodeSelectorRequirement> {
    vec![requirement(labels::ARCH, Operator::In, &[arch]), requirement(LABEL_GPU_COUNT, Operator::DoesNotExist, &[])]
}

/// What an image term asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted<'a> {
    Id(&'a str),
    Cos(&'a str),
    Ubuntu(&'static str, &'a str),
    Channel(&'a str),
}

fn wanted<'a>(term: &'a ImageSelectorTerm) -> Result<Wanted<'a>, String> {
    if let Some(id) = &term.id {
        return Ok(Wanted::Id(id));
    }
    let (family, version) = if let Some(alias) = &term.alias {
        let (family, version) =
            alias.split_once('@').ok_or_else(|| format!("alias {alias:?} is not family@version"))?;
        (if family == "Ubuntu" { "Ubuntu2404" } else { family }, Some(version))
    } else {
        (term.family.as_deref().unwrap_or_default(), term.version.as_deref())
    };
    match (family, version, term.channel.as_deref()) {
        ("ContainerOptimizedOS", None, Some(channel)) => Ok(Wanted::Channel(channel)),
        (f, None, Some(_)) => Err(format!("family {f:?} has no release channels (ContainerOptimizedOS has)")),
        ("ContainerOptimizedOS", Some(v), _) => Ok(Wanted::Cos(v)),
        ("Ubuntu2404", Some(v), _) => Ok(Wanted::Ubuntu("2404", v)),
        ("Ubuntu2204", Some(v), _) => Ok(Wanted::Ubuntu("2204", v)),
        (f, _, _) => Err(format!("family {f:?} with no version")),
    }
}

impl GcpProvider {
    /// What `class`'s image terms resolve to, in term order; `NodeClassNotReady` naming the term when one
    /// cannot be resolved, or when none matches an image.
    pub(crate) async fn resolve_images(&self, class: &GCENodeClass) -> Result<Vec<ResolvedImage>, CloudError> {
        let name = class.name();
        let mut images: Vec<ResolvedImage> = Vec::new();
        for (i, term) in class.spec.image_selector_terms.iter().enumerate() {
            let field = format!("GCENodeClass/{name}: spec.imageSelectorTerms[{i}]");
            let not_ready = |m: String| CloudError::NodeClassNotReady(format!("{field}: {m}"));
            let found = match wanted(term).map_err(not_ready)? {
                Wanted::Id(id) => self.image_by_id(id, &field).await?,
                Wanted::Channel(channel) => {
                    let v = self.known_kubernetes_version().ok_or_else(|| not_ready(UNKNOWN_VERSION.to_owned()))?;
                    let target = self.channel_version(channel, &v).await.map_err(|e| match e {
                        CloudError::NodeClassNotReady(m) => not_ready(m),
                        other => other,
                    })?;
                    let listed = self.list_images(COS_PROJECT, &format!("gke-{}-", target.cos_key())).await?;
                    cos_images(&listed, &target, EXACT_BUILD).map_err(not_ready)?
                }
                Wanted::Cos(version) => {
                    let v = self.known_kubernetes_version().ok_or_else(|| not_ready(UNKNOWN_VERSION.to_owned()))?;
                    let listed = self.list_images(COS_PROJECT, &format!("gke-{}-", v.cos_key())).await?;
                    cos_images(&listed, &v, version).map_err(not_ready)?
                }
                Wanted::Ubuntu(release, version) => {
                    let v = self.known_kubernetes_version().ok_or_else(|| not_ready(UNKNOWN_VERSION.to_owned()))?;
                    let prefix = format!("ubuntu-gke-{release}-{}-{}-", v.major, v.minor);
                    let listed = self.list_images(UBUNTU_PROJECT, &prefix).await?;
                    ubuntu_images(&listed, &prefix, version).map_err(not_ready)?
                }
            };
            for image in found {
                if !images.iter().any(|i| i.source_image == image.source_image) {
                    images.push(image);
                }
            }
        }
        if images.is_empty() {
            let ids: Vec<&str> = class.spec.image_selector_terms.iter().filter_map(|t| t.id.as_deref()).collect();
            let missing = if ids.is_empty() { String::new() } else { format!(" (no image {})", ids.join(", ")) };
            return Err(CloudError::NodeClassNotReady(format!(
                "GCENodeClass/{name}: spec.imageSelectorTerms match no image{missing}"
            )));
        }
        Ok(images)
    }

    async fn image_by_id(&self, id: &str, field: &str) -> Result<Vec<ResolvedImage>, CloudError> {
        let (project, image) = match id.split('/').collect::<Vec<_>>()[..] {
            ["projects", p, "global", "images", n] => (p, n),
            _ => return Err(CloudError::NodeClassNotReady(format!("{field}: {id:?} is not an image"))),
        };
        match self.images.get().set_project(project).set_image(image).send().await {
            Ok(found) => {
                let arm = matches!(found.architecture, Some(model::image::Architecture::Arm64));
                Ok(vec![ResolvedImage {
                    source_image: id.to_owned(),
                    requirements: arch_only(if arm { "arm64" } else { "amd64" }),
                }])
            }
            Err(e) if e.http_status_code() == Some(404) => Ok(Vec::new()),
            Err(e) => Err(client_error(&format!("images.get {id}"), &e)),
        }
    }

    /// The version release channel `channel` (`rapid`, …, or `cluster`: the cluster's own) promotes for
    /// a cluster at `cluster`, held at the cluster's version.
    async fn channel_version(
        &self,
        channel: &str,
        cluster: &KubernetesVersion,
    ) -> Result<KubernetesVersion, CloudError> {
        let s = self.settings();
        let location = format!("projects/{}/locations/{}", s.project, s.cluster_location);
        let name = if channel == "cluster" {
            let found = self
                .gke
                .get_cluster()
                .set_name(format!("{location}/clusters/{}", s.cluster_name))
                .send()
                .await
                .map_err(|e| client_error(&format!("GKE clusters.get {location}/clusters/{}", s.cluster_name), &e))?;
            let enrolled = found.release_channel.as_ref().and_then(|r| r.channel.name()).unwrap_or("UNSPECIFIED");
            if enrolled == "UNSPECIFIED" {
                return Err(CloudError::NodeClassNotReady(format!(
                    "channel: cluster, and GKE cluster {} is enrolled in no release channel; name a channel or use \
                     version: latest",
                    s.cluster_name
                )));
            }
            enrolled.to_owned()
        } else {
            channel.to_ascii_uppercase()
        };
        let config = self
            .gke
            .get_server_config()
            .set_name(&location)
            .send()
            .await
            .map_err(|e| client_error(&format!("GKE getServerConfig {location}"), &e))?;
        let channels: Vec<(&str, &str, &[String])> = config
            .channels
            .iter()
            .filter_map(|c| Some((c.channel.name()?, c.default_version.as_str(), c.valid_versions.as_slice())))
            .collect();
        channel_pick(&channels, &name, cluster).map_err(CloudError::NodeClassNotReady)
    }

    /// The images of `project` whose name starts with `prefix` (`images.list`, every page).
    async fn list_images(&self, project: &str, prefix: &str) -> Result<Vec<model::Image>, CloudError> {
        let mut pages = self.images.list().set_project(project).set_filter(format!("name eq {prefix}.*")).by_page();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| client_error(&format!("images.list {project}"), &e))?;
            out.extend(page.items);
        }
        Ok(out)
    }
}

/// [`cos_images`]'s version for the images of exactly the version's GKE build.
const EXACT_BUILD: &str = "exact build";

/// The version of release channel `name` (`STABLE`) among `channels` (name, default version, valid
/// versions) for a cluster at `cluster`: the default when it is of the cluster's minor, else the newest
/// valid one that is; never newer than the cluster's own.
fn channel_pick(
    channels: &[(&str, &str, &[String])],
    name: &str,
    cluster: &KubernetesVersion,
) -> Result<KubernetesVersion, String> {
    let (_, default, valid) = channels
        .iter()
        .find(|(n, _, _)| *n == name)
        .ok_or_else(|| format!("GKE's server config has no {name} release channel"))?;
    let same_minor = |v: &KubernetesVersion| v.major == cluster.major && v.minor == cluster.minor;
    let picked = KubernetesVersion::parse(default).filter(same_minor).or_else(|| {
        valid.iter().filter_map(|v| KubernetesVersion::parse(v)).filter(same_minor).max_by_key(KubernetesVersion::order)
    });
    let Some(picked) = picked else {
        return Err(format!(
            "the {name} release channel offers no version of Kubernetes {}.{}; name another channel or use \
             version: latest",
            cluster.major, cluster.minor
        ));
    };
    if cluster.gke_build.is_some() && picked.order() > cluster.order() {
        return Ok(cluster.clone());
    }
    Ok(picked)
}

const UNKNOWN_VERSION: &str = "the cluster's Kubernetes version is not known yet (it is read from the API server)";

/// The Container-Optimized OS images of `version` (`latest`, a milestone, or [`EXACT_BUILD`]: those of
/// `k8s`'s GKE build) for the cluster at `k8s`.
fn cos_images(listed: &[model::Image], k8s: &KubernetesVersion, version: &str) -> Result<Vec<ResolvedImage>, String> {
    let key = k8s.cos_key();
    let usable: Vec<(CosName, &model::Image)> = listed
        .iter()
        .filter(|i| !deprecated(i))
        .filter_map(|i| Some((cos_name(i.name.as_deref()?)?, i)))
        .filter(|(n, _)| n.k8s == key)
        .collect();
    let newest = |pick: &dyn Fn(&CosName) -> bool| {
        usable
            .iter()
            .filter(|(n, _)| pick(n))
            .max_by(|a, b| a.1.creation_timestamp.cmp(&b.1.creation_timestamp).then(a.0.build.cmp(&b.0.build)))
            .map(|(n, i)| (n.clone(), *i))
    };
    // The build all variants come from: the cluster's own, else the newest of its patch version.
    let base = if version == "latest" {
        let own = k8s.gke_build.as_ref().and_then(|b| newest(&|n| !n.arm64 && !n.nvidia && &n.build == b));
        own.or_else(|| newest(&|n| !n.arm64 && !n.nvidia))
    } else if version == EXACT_BUILD {
        let Some(build) = &k8s.gke_build else {
            return Err(format!("the version {}.{}.{} names no GKE build", k8s.major, k8s.minor, k8s.patch));
        };
        newest(&|n| !n.arm64 && !n.nvidia && &n.build == build)
    } else {
        let digits = version.split('.').filter(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit())).count();
        if digits != 4 || version.split('.').count() != 4 {
            return Err(format!(
                "ContainerOptimizedOS version {version:?} is neither latest nor a milestone (125.19216.104.126)"
            ));
        }
        newest(&|n| !n.arm64 && !n.nvidia && n.milestone == version)
    };
    let Some((base, _)) = base else {
        return Err(format!(
            "no Container-Optimized OS image of Kubernetes {}.{}.{} and version {version:?} in {COS_PROJECT}",
            k8s.major, k8s.minor, k8s.patch
        ));
    };
    let same = |arm64: bool, nvidia: bool| {
        newest(&|n| n.arm64 == arm64 && n.nvidia == nvidia && n.build == base.build && n.milestone == base.milestone)
    };
    let path =
        |i: &model::Image| format!("projects/{COS_PROJECT}/global/images/{}", i.name.as_deref().unwrap_or_default());
    let mut out = Vec::new();
    let nvidia = same(false, true);
    if let Some((_, i)) = same(false, false) {
        let requirements = if nvidia.is_some() { without_gpus("amd64") } else { arch_only("amd64") };
        out.push(ResolvedImage { source_image: path(i), requirements });
    }
    if let Some((_, i)) = same(true, false) {
        out.push(ResolvedImage { source_image: path(i), requirements: without_gpus("arm64") });
    }
    if let Some((_, i)) = nvidia {
        out.push(ResolvedImage {
            source_image: path(i),
            requirements: vec![
                requirement(labels::ARCH, Operator::In, &["amd64"]),
                requirement(LABEL_GPU_COUNT, Operator::Exists, &[]),
            ],
        });
    }
    Ok(out)
}

/// The Ubuntu images (one per architecture) named `<prefix>…` of `version` (`latest` or `vYYYYMMDD`).
fn ubuntu_images(listed: &[model::Image], prefix: &str, version: &str) -> Result<Vec<ResolvedImage>, String> {
    let pinned = version != "latest";
    if pinned && !(version.len() == 9 && version.starts_with('v') && version[1..].bytes().all(|c| c.is_ascii_digit())) {
        return Err(format!("Ubuntu version {version:?} is neither latest nor a date (v20260416)"));
    }
    let mut out = Vec::new();
    for arch in ["amd64", "arm64"] {
        let best = listed
            .iter()
            .filter(|i| !deprecated(i))
            .filter_map(|i| Some((ubuntu_name(i.name.as_deref()?, prefix)?, i)))
            .filter(|((a, date), _)| *a == arch && (!pinned || date.starts_with(version)))
            .max_by(|a, b| a.1.creation_timestamp.cmp(&b.1.creation_timestamp).then(a.0.1.cmp(b.0.1)));
        let Some((_, image)) = best else {
            return Err(format!("no {prefix}… {arch} image of version {version:?} in {UBUNTU_PROJECT}"));
        };
        let source_image =
            format!("projects/{UBUNTU_PROJECT}/global/images/{}", image.name.as_deref().unwrap_or_default());
        let requirements = if arch == "arm64" { without_gpus(arch) } else { arch_only(arch) };
        out.push(ResolvedImage { source_image, requirements });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn image(name: &str, created: &str) -> model::Image {
        model::Image::new().set_name(name).set_creation_timestamp(created)
    }

    #[test]
    fn versions_read_as_the_api_server_reports_them() {
        let v = KubernetesVersion::parse("v1.33.5-gke.1080000").unwrap();
        assert_eq!((v.major, v.minor, v.patch, v.gke_build.as_deref()), (1, 33, 5, Some("1080000")));
        assert_eq!(KubernetesVersion::parse("1.34.0").unwrap().gke_build, None);
        assert!(KubernetesVersion::parse("1.34").is_none());
        assert!(KubernetesVersion::parse("v1.x.0").is_none());
    }

    #[test]
    fn cos_names_are_read_and_special_builds_refused() {
        let n = cos_name("gke-1335-gke1080000-cos-arm64-121-18867-199-28-c-pre").unwrap();
        assert_eq!(
            (n.k8s.as_str(), n.build.as_str(), n.arm64, n.milestone.as_str(), n.nvidia),
            ("1335", "1080000", true, "121.18867.199.28", false)
        );
        assert!(cos_name("gke-1335-gke1080000-cos-121-18867-199-28-c-nvda").unwrap().nvidia);
        for special in [
            "gke-1335-gke1080000-cos-121-18867-199-28-c-cgpv1-pre",
            "gke-1335-gke1080000-cos-121-18867-199-28-gvisor-c-pre",
            "gke-1335-gke1080000-cos-kmod-121-18867-199-28-c-pre",
            "gke-1335-gke1080000-ubuntu-121-18867-199-28-c-pre",
        ] {
            assert!(cos_name(special).is_none(), "{special}");
        }
    }

    /// `latest` takes the cluster's own build, with its arm64 and NVIDIA variants; GPU machines boot the
    /// NVIDIA build and the others the plain ones. A milestone takes that milestone's images.
    #[test]
    fn cos_resolves_each_variant_of_the_clusters_build_or_a_milestone() {
        let listed = vec![
            image("gke-1335-gke1080000-cos-121-18867-199-28-c-pre", "2026-10-01T00:00:00Z"),
            image("gke-1335-gke1080000-cos-arm64-121-18867-199-28-c-pre", "2026-10-01T00:00:00Z"),
            image("gke-1335-gke1080000-cos-121-18867-199-28-c-nvda", "2026-10-01T00:00:00Z"),
            // A newer build of the same patch version, and one deprecated.
            image("gke-1335-gke1200000-cos-121-18867-210-1-c-pre", "2026-11-01T00:00:00Z"),
            image("gke-1335-gke1300000-cos-121-18867-220-1-c-pre", "2026-11-15T00:00:00Z").set_deprecated(
                model::DeprecationStatus::new().set_state(model::deprecation_status::State::Deprecated),
            ),
        ];
        let own = KubernetesVersion::parse("v1.33.5-gke.1080000").unwrap();
        let got = cos_images(&listed, &own, "latest").unwrap();
        let names: Vec<&str> = got.iter().map(|i| i.source_image.rsplit('/').next().unwrap()).collect();
        assert_eq!(
            names,
            [
                "gke-1335-gke1080000-cos-121-18867-199-28-c-pre",
                "gke-1335-gke1080000-cos-arm64-121-18867-199-28-c-pre",
                "gke-1335-gke1080000-cos-121-18867-199-28-c-nvda"
            ]
        );
        assert!(got[0].requirements.iter().any(|r| r.key == LABEL_GPU_COUNT && r.operator == Operator::DoesNotExist));
        assert!(got[2].requirements.iter().any(|r| r.key == LABEL_GPU_COUNT && r.operator == Operator::Exists));
        // Without a GKE build in the version: the newest usable build of the patch, which has no NVIDIA
        // variant, so GPU machines boot it too.
        let plain = KubernetesVersion::parse("1.33.5").unwrap();
        let got = cos_images(&listed, &plain, "latest").unwrap();
        assert_eq!(got.len(), 1);
        assert!(got[0].source_image.ends_with("gke-1335-gke1200000-cos-121-18867-210-1-c-pre"));
        assert_eq!(got[0].requirements, arch_only("amd64"));
        // A channel's build: exactly it.
        assert_eq!(cos_images(&listed, &own, EXACT_BUILD).unwrap().len(), 3);
        assert!(cos_images(&listed, &plain, EXACT_BUILD).unwrap_err().contains("GKE build"));
        let unpublished = KubernetesVersion::parse("v1.33.5-gke.1090000").unwrap();
        assert!(cos_images(&listed, &unpublished, EXACT_BUILD).is_err(), "no fallback to another build");
        let pinned = cos_images(&listed, &plain, "121.18867.199.28").unwrap();
        assert_eq!(pinned.len(), 3);
        assert!(cos_images(&listed, &plain, "121.1").unwrap_err().contains("milestone"));
        let other = KubernetesVersion::parse("1.34.1").unwrap();
        assert!(cos_images(&listed, &other, "latest").unwrap_err().contains("Kubernetes 1.34.1"));
    }

    #[test]
    fn ubuntu_resolves_one_image_per_architecture_or_fails() {
        let prefix = "ubuntu-gke-2404-1-33-";
        let listed = vec![
            image("ubuntu-gke-2404-1-33-amd64-v20260401", "2026-04-01T00:00:00Z"),
            image("ubuntu-gke-2404-1-33-amd64-v20260416a", "2026-04-17T00:00:00Z"),
            image("ubuntu-gke-2404-1-33-amd64-v20260420-tpu", "2026-04-21T00:00:00Z"),
            image("ubuntu-gke-2404-1-33-arm64-v20260401", "2026-04-01T00:00:00Z"),
        ];
        let got = ubuntu_images(&listed, prefix, "latest").unwrap();
        assert!(got[0].source_image.ends_with("ubuntu-gke-2404-1-33-amd64-v20260416a"));
        assert!(got[1].source_image.ends_with("ubuntu-gke-2404-1-33-arm64-v20260401"));
        let pinned = ubuntu_images(&listed, prefix, "v20260401").unwrap();
        assert!(pinned[0].source_image.ends_with("amd64-v20260401"));
        let e = ubuntu_images(&listed, prefix, "v20260416").unwrap_err();
        assert!(e.contains("arm64"), "a date published for one architecture only: {e}");
        assert!(ubuntu_images(&listed, prefix, "2026").unwrap_err().contains("date"));
        // 22.04's amd64 images carry no architecture.
        let jammy = [
            image("ubuntu-gke-2204-1-33-v20260301", "2026-03-01T00:00:00Z"),
            image("ubuntu-gke-2204-1-33-arm64-v20260301", "2026-03-01T00:00:00Z"),
        ];
        assert_eq!(ubuntu_images(&jammy, "ubuntu-gke-2204-1-33-", "latest").unwrap().len(), 2);
    }

    #[test]
    fn terms_read_as_what_they_ask_for() {
        let t = |v: serde_json::Value| serde_json::from_value::<ImageSelectorTerm>(v).unwrap();
        assert_eq!(wanted(&t(serde_json::json!({"alias": "ContainerOptimizedOS@latest"}))), Ok(Wanted::Cos("latest")));
        assert_eq!(
            wanted(&t(serde_json::json!({"alias": "Ubuntu@v20260416"}))),
            Ok(Wanted::Ubuntu("2404", "v20260416"))
        );
        assert_eq!(
            wanted(&t(serde_json::json!({"family": "Ubuntu2204", "version": "latest"}))),
            Ok(Wanted::Ubuntu("2204", "latest"))
        );
        assert_eq!(
            wanted(&t(serde_json::json!({"family": "ContainerOptimizedOS", "channel": "stable"}))),
            Ok(Wanted::Channel("stable"))
        );
        assert_eq!(
            wanted(&t(serde_json::json!({"family": "ContainerOptimizedOS", "channel": "cluster"}))),
            Ok(Wanted::Channel("cluster"))
        );
        assert!(wanted(&t(serde_json::json!({"family": "Ubuntu2404", "channel": "stable"}))).is_err());
    }

    /// A channel's version: its default when of the cluster's minor, else its newest valid one of that
    /// minor; held at the cluster's own; a channel without the minor is an error naming it.
    #[test]
    fn a_channel_promotes_a_version_of_the_clusters_minor_never_newer_than_the_cluster() {
        let valid = ["1.34.1-gke.100".to_owned(), "1.33.4-gke.900".to_owned(), "1.33.5-gke.1080000".to_owned()];
        let channels: Vec<(&str, &str, &[String])> =
            vec![("STABLE", "1.33.4-gke.900", &valid[..]), ("RAPID", "1.34.1-gke.100", &valid[..])];
        let cluster = KubernetesVersion::parse("v1.33.5-gke.1080000").unwrap();
        let v = channel_pick(&channels, "STABLE", &cluster).unwrap();
        assert_eq!((v.patch, v.gke_build.as_deref()), (4, Some("900")), "the default, of the same minor");
        let v = channel_pick(&channels, "RAPID", &cluster).unwrap();
        assert_eq!((v.patch, v.gke_build.as_deref()), (5, Some("1080000")), "the newest valid of the minor");
        let older = KubernetesVersion::parse("v1.33.3-gke.100").unwrap();
        assert_eq!(channel_pick(&channels, "RAPID", &older).unwrap(), older, "never newer than the cluster");
        let other = KubernetesVersion::parse("v1.32.9-gke.1").unwrap();
        assert!(channel_pick(&channels, "STABLE", &other).unwrap_err().contains("1.32"));
        assert!(channel_pick(&channels, "EXTENDED", &cluster).unwrap_err().contains("EXTENDED"));
    }
}
