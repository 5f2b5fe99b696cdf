//! Volume topology: the node requirements a pod's persistent volumes add, as Karpenter's
//! `VolumeTopology` injects them.
//!
//! - A volume whose claim is bound pins the pod to its PersistentVolume's node affinity (the first of its
//!   ORed terms, as Karpenter reads it), without the hostname of a local or `hostPath` volume, which a
//!   new node could not match anyway.
//! - A claim not bound yet follows its StorageClass's `allowedTopologies` (the first term), where the
//!   volume will be provisioned once the pod is placed (`WaitForFirstConsumer`).
//! - A generic ephemeral volume's claim is `<pod>-<volume>`; before it exists, its template's
//!   StorageClass is read instead.
//!
//! The zone keys CSI drivers write into volume affinity (`topology.ebs.csi.aws.com/zone`,
//! `topology.gke.io/zone`, `topology.disk.csi.azure.com/zone`) are read as `topology.kubernetes.io/zone`,
//! the key every provider's instance types define: a pod pinned to a volume's zone is then placed, and
//! consolidated, in that zone.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::{Requirement, Requirements};
use crate::api::labels;
use crate::cluster::Storage;

/// The zone keys of CSI drivers' volume topology, read as [`labels::ZONE`].
const CSI_ZONE_KEYS: [&str; 3] =
    ["topology.ebs.csi.aws.com/zone", "topology.gke.io/zone", "topology.disk.csi.azure.com/zone"];

/// Why a pod's volumes cannot be placed yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {message}")]
pub struct VolumeError {
    /// The pod, `namespace/name`.
    pub pod: String,
    /// What is missing.
    pub message: String,
}

fn key(key: &str) -> &str {
    if CSI_ZONE_KEYS.contains(&key) { labels::ZONE } else { key }
}

/// Where a pod's volumes let it run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolumePlacement {
    /// The node requirements its volumes add.
    pub requirements: Requirements,
    /// The attachments its volumes take on its node: each volume's CSI driver (the bound volume's driver,
    /// else the class's provisioner) and its claim (`namespace/name`), sorted. Pods sharing a claim share
    /// its attachment.
    pub attachments: Vec<(String, String)>,
}

/// Where `pod`'s volumes let it run, read from `storage`. Nothing when the storage holds no claims at
/// all (a snapshot without storage objects: nothing is known). A claim that does not exist, or names a
/// volume or class that does not, is an error: the pod waits for it, as Karpenter leaves it.
pub fn volume_placement(pod: &Pod, storage: &Storage) -> Result<VolumePlacement, VolumeError> {
    let mut placement = VolumePlacement::default();
    let Some(volumes) = pod.spec.as_ref().and_then(|s| s.volumes.as_ref()) else { return Ok(placement) };
    if storage.claims.is_empty() {
        return Ok(placement);
    }
    let out = &mut placement.requirements;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut attach = |driver: Option<&str>, claim: &str| {
        let Some(driver) = driver.filter(|d| !d.is_empty()) else { return };
        placement.attachments.push((driver.to_owned(), format!("{namespace}/{claim}")));
    };
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let error = |message: String| VolumeError { pod: format!("{namespace}/{pod_name}"), message };
    for v in volumes {
        let (claim_name, ephemeral_class) = match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => (c.claim_name.clone(), None),
            (None, Some(e)) => {
                let class = e.volume_claim_template.as_ref().and_then(|t| t.spec.storage_class_name.clone());
                (format!("{pod_name}-{}", v.name), Some(class))
            }
            _ => continue,
        };
        let claim: Option<&PersistentVolumeClaim> =
            storage.claims.get(&format!("{namespace}/{claim_name}")).map(|c| &**c);
        let (volume_name, class_name) = match (claim, ephemeral_class) {
            (Some(c), _) => {
                let spec = c.spec.as_ref();
                (
                    spec.and_then(|s| s.volume_name.clone()).filter(|n| !n.is_empty()),
                    spec.and_then(|s| s.storage_class_name.clone()),
                )
            }
            // An ephemeral volume's claim is created with the pod's placement pending.
            (None, Some(class)) => (None, class),
            (None, None) => {
                return Err(error(format!("PersistentVolumeClaim {namespace}/{claim_name} does not exist")));
            }
        };
        if let Some(volume_name) = volume_name {
            let Some(pv) = storage.volumes.get(&volume_name) else {
                return Err(error(format!("PersistentVolume {volume_name} does not exist")));
            };
            let spec = pv.spec.as_ref();
            attach(spec.and_then(|s| s.csi.as_ref()).map(|c| c.driver.as_str()), &claim_name);
            let local = spec.is_some_and(|s| s.local.is_some() || s.host_path.is_some());
            let term = spec
                .and_then(|s| s.node_affinity.as_ref())
                .and_then(|a| a.required.as_ref())
                .and_then(|r| r.node_selector_terms.first());
            for e in term.and_then(|t| t.match_expressions.as_ref()).into_iter().flatten() {
                if local && e.key == labels::HOSTNAME {
                    continue;
                }
                let op = super::pod::parse_operator(&e.operator);
                out.add(Requirement::new(key(&e.key), op, e.values.as_deref().unwrap_or_default()));
            }
        } else if let Some(class_name) = class_name.filter(|c| !c.is_empty()) {
            let Some(class) = storage.classes.get(&class_name) else {
                return Err(error(format!("StorageClass {class_name} does not exist")));
            };
            attach(Some(class.provisioner.as_str()), &claim_name);
            let term = class.allowed_topologies.as_ref().and_then(|t| t.first());
            for e in term.and_then(|t| t.match_label_expressions.as_ref()).into_iter().flatten() {
                out.add(Requirement::is_in(key(&e.key), e.values.iter().cloned()));
            }
        }
    }
    placement.attachments.sort();
    placement.attachments.dedup();
    Ok(placement)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use serde_json::json;

    fn storage(objects: serde_json::Value) -> Storage {
        let mut s = Storage::default();
        for o in objects.as_array().unwrap() {
            let name = o["metadata"]["name"].as_str().unwrap().to_owned();
            match o["kind"].as_str().unwrap() {
                "PersistentVolume" => {
                    Arc::make_mut(&mut s.volumes).insert(name, Arc::new(serde_json::from_value(o.clone()).unwrap()));
                }
                "PersistentVolumeClaim" => {
                    let key = format!("default/{name}");
                    Arc::make_mut(&mut s.claims).insert(key, Arc::new(serde_json::from_value(o.clone()).unwrap()));
                }
                _ => {
                    Arc::make_mut(&mut s.classes).insert(name, Arc::new(serde_json::from_value(o.clone()).unwrap()));
                }
            }
        }
        s
    }

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "db", "namespace": "default"},
            "spec": {"containers": [], "volumes": volumes}}))
        .unwrap()
    }

    fn objects() -> Storage {
        storage(json!([
            {"kind": "PersistentVolume", "metadata": {"name": "pv-a"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1a"]}]},
                {"matchExpressions": [{"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1b"]}]}]}}}},
            {"kind": "PersistentVolume", "metadata": {"name": "pv-local"}, "spec": {"local": {"path": "/mnt"}, "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]},
                                      {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1c"]}]}]}}}},
            {"kind": "PersistentVolumeClaim", "metadata": {"name": "bound"}, "spec": {"volumeName": "pv-a"}},
            {"kind": "PersistentVolumeClaim", "metadata": {"name": "local"}, "spec": {"volumeName": "pv-local"}},
            {"kind": "PersistentVolumeClaim", "metadata": {"name": "waiting"}, "spec": {"storageClassName": "zonal"}},
            {"kind": "StorageClass", "metadata": {"name": "zonal"}, "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer",
             "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["us-east-1b", "us-east-1c"]}]}]}
        ]))
    }

    fn requirements(pod: &Pod, storage: &Storage) -> Result<Requirements, VolumeError> {
        volume_placement(pod, storage).map(|p| p.requirements)
    }

    fn zones(r: &Requirements) -> Vec<String> {
        r.get(labels::ZONE).map(|z| z.values().to_vec()).unwrap_or_default()
    }

    #[test]
    fn a_bound_claim_pins_its_volumes_zone_and_an_unbound_one_its_classes_topology() {
        let s = objects();
        let bound = requirements(&pod(json!([{"name": "data", "persistentVolumeClaim": {"claimName": "bound"}}])), &s);
        assert_eq!(zones(&bound.unwrap()), ["us-east-1a"], "the first term, the CSI key read as the zone");
        let waiting =
            requirements(&pod(json!([{"name": "data", "persistentVolumeClaim": {"claimName": "waiting"}}])), &s);
        assert_eq!(zones(&waiting.unwrap()), ["us-east-1b", "us-east-1c"]);
        let both = pod(json!([{"name": "a", "persistentVolumeClaim": {"claimName": "waiting"}},
                              {"name": "b", "persistentVolumeClaim": {"claimName": "local"}}]));
        let r = requirements(&both, &s).unwrap();
        assert_eq!(zones(&r), ["us-east-1c"], "two volumes: both zones must hold");
        assert!(r.get(labels::HOSTNAME).is_none(), "a local volume's hostname is dropped");
        let ephemeral = pod(
            json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "zonal"}}}}]),
        );
        assert_eq!(zones(&requirements(&ephemeral, &s).unwrap()), ["us-east-1b", "us-east-1c"]);
    }

    #[test]
    fn missing_claims_volumes_and_classes_hold_the_pod_and_no_storage_means_nothing_known() {
        let s = objects();
        let e = requirements(&pod(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}])), &s);
        assert_eq!(e.unwrap_err().to_string(), "pod default/db: PersistentVolumeClaim default/nope does not exist");
        let mut gone = s.clone();
        Arc::make_mut(&mut gone.volumes).remove("pv-a");
        let e = requirements(&pod(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "bound"}}])), &gone);
        assert!(e.unwrap_err().message.contains("PersistentVolume pv-a"));
        let none = Storage { claims: Arc::new(BTreeMap::new()), ..Default::default() };
        let r = requirements(&pod(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}])), &none);
        assert!(r.unwrap().is_empty());
    }
}
