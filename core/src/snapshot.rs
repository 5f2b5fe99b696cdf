//! Cluster snapshots read from YAML files.
//!
//! `tenon plan` reads multi-document YAML files holding Kubernetes objects as `kubectl get -o yaml` prints
//! them (bare objects or `kind: List` wrappers) plus tenon's own `InstanceCatalog` documents. Kinds tenon
//! does not model (Service, ConfigMap, Deployment, …) are skipped; everything else is checked up front so that
//! an error names the file, the document, the object and the field.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::Path;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{NodeClaim, NodePool, ValidationError};
use crate::cloud::{CapacityType, InstanceType};
use crate::resources::Resources;

/// An `InstanceCatalog` document (apiVersion `tenon.dev/v1alpha1`): the instance types a provider offers.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceCatalog {
    /// The catalog's `metadata.name`.
    pub name: String,
    /// Its `spec.instanceTypes`, in document order.
    pub instance_types: Vec<InstanceType>,
}

/// Everything read from snapshot files.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Pods, with `metadata.namespace` defaulted to `default`.
    pub pods: Vec<Pod>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// DaemonSets, with `metadata.namespace` defaulted to `default`.
    pub daemon_sets: Vec<DaemonSet>,
    /// PodDisruptionBudgets, with `metadata.namespace` defaulted to `default`.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// NodePools, validated.
    pub node_pools: Vec<NodePool>,
    /// NodeClaims, validated.
    pub node_claims: Vec<NodeClaim>,
    /// Instance catalogs, in the order they were read.
    pub catalogs: Vec<InstanceCatalog>,
    /// PersistentVolumes.
    pub persistent_volumes: Vec<PersistentVolume>,
    /// PersistentVolumeClaims, with `metadata.namespace` defaulted to `default`.
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// StorageClasses.
    pub storage_classes: Vec<StorageClass>,
    /// CSINodes.
    pub csi_nodes: Vec<CSINode>,
    /// Namespaces (their labels are what affinity terms' `namespaceSelector` match).
    pub namespaces: Vec<Namespace>,
}

/// An input error naming the file, the document (1-based index within the file), the object
/// (`Kind/name` or `Kind/namespace/name`) and the field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SnapshotError {
    /// The file as it was given.
    pub file: String,
    /// The 1-based document index within the file; 0 when the error concerns the whole file.
    pub document: usize,
    /// `Kind/name` or `Kind/namespace/name`; the bare kind when the name is unknown, empty when the kind is.
    pub object: String,
    /// The path of the offending field, e.g. `spec.containers[0].resources.requests.cpu`; fields of a
    /// `kind: List` item start with `items[i]`. Empty when the error concerns the whole document.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The object reads as kubectl prints it: `Pod default/web-1`.
        let object = self.object.split_once('/').map_or(self.object.clone(), |(kind, rest)| format!("{kind} {rest}"));
        let mut parts: Vec<String> = Vec::new();
        if !self.file.is_empty() {
            parts.push(self.file.clone());
        }
        match (self.document, object.is_empty()) {
            (0, true) => {}
            (0, false) => parts.push(object),
            (n, true) => parts.push(format!("document {n}")),
            (n, false) => parts.push(format!("document {n} ({object})")),
        }
        if !self.field.is_empty() {
            parts.push(self.field.clone());
        }
        parts.push(self.message.clone());
        f.write_str(&parts.join(": "))
    }
}

/// Where in the input an object sits: the file, the document and, inside `kind: List`, the item path.
struct At<'a> {
    file: &'a str,
    document: usize,
    prefix: String,
}

impl At<'_> {
    fn err(&self, object: &str, field: &str, message: impl fmt::Display) -> SnapshotError {
        let field = match (self.prefix.as_str(), field) {
            (p, "") => p.to_owned(),
            ("", f) => f.to_owned(),
            (p, f) => format!("{p}.{f}"),
        };
        SnapshotError {
            file: self.file.to_owned(),
            document: self.document,
            object: object.to_owned(),
            field,
            message: message.to_string(),
        }
    }

    /// Deserializes `value` into `T`, naming the failing field.
    fn typed<T: DeserializeOwned>(&self, object: &str, value: &Value) -> Result<T, SnapshotError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let field = e.path().to_string();
            self.err(object, if field == "." { "" } else { &field }, e.into_inner())
        })
    }

    fn validation(&self, e: ValidationError) -> SnapshotError {
        self.err(&e.object, &e.field, e.message)
    }
}

const NAMESPACED: [&str; 4] = ["Pod", "DaemonSet", "PodDisruptionBudget", "PersistentVolumeClaim"];

fn object_name(kind: &str, value: &Value) -> String {
    let text = |pointer| value.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty());
    match (text("/metadata/name"), text("/metadata/namespace")) {
        (None, _) => kind.to_owned(),
        (Some(name), ns) if NAMESPACED.contains(&kind) => format!("{kind}/{}/{name}", ns.unwrap_or("default")),
        (Some(name), _) => format!("{kind}/{name}"),
    }
}

fn default_namespace(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".to_owned());
    }
}

/// `path.key`, or `path["key"]` when the key is not a plain identifier (`nvidia.com/gpu`).
fn key_path(path: &str, key: &str) -> String {
    if key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        format!("{path}.{key}")
    } else {
        format!("{path}[{key:?}]")
    }
}

fn check_quantities(
    at: &At<'_>,
    object: &str,
    path: &str,
    list: Option<&BTreeMap<String, Quantity>>,
) -> Result<(), SnapshotError> {
    for (name, q) in list.into_iter().flatten() {
        Resources::parse_quantity(name, &q.0).map_err(|e| at.err(object, &key_path(path, name), e))?;
    }
    Ok(())
}

fn check_pod_spec(at: &At<'_>, object: &str, path: &str, spec: Option<&PodSpec>) -> Result<(), SnapshotError> {
    let Some(spec) = spec else { return Ok(()) };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (list, containers) in [("containers", spec.containers.as_slice()), ("initContainers", init)] {
        for (i, c) in containers.iter().enumerate() {
            let r = c.resources.as_ref();
            let field = format!("{path}.{list}[{i}].resources");
            check_quantities(at, object, &format!("{field}.requests"), r.and_then(|r| r.requests.as_ref()))?;
            check_quantities(at, object, &format!("{field}.limits"), r.and_then(|r| r.limits.as_ref()))?;
        }
    }
    check_quantities(at, object, &format!("{path}.overhead"), spec.overhead.as_ref())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CatalogDocument {
    spec: CatalogSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CatalogSpec {
    instance_types: Vec<InstanceType>,
}

fn check_catalog(at: &At<'_>, object: &str, types: &[InstanceType]) -> Result<(), SnapshotError> {
    let mut seen = HashSet::new();
    for (i, t) in types.iter().enumerate() {
        let path = format!("spec.instanceTypes[{i}]");
        if t.name.is_empty() {
            return Err(at.err(object, &format!("{path}.name"), "must not be empty"));
        }
        if !seen.insert(t.name.as_str()) {
            return Err(at.err(object, &format!("{path}.name"), format!("duplicate instance type {:?}", t.name)));
        }
        for (j, o) in t.offerings.iter().enumerate() {
            let path = format!("{path}.offerings[{j}]");
            if o.zone.is_empty() {
                return Err(at.err(object, &format!("{path}.zone"), "must not be empty"));
            }
            if !o.price.is_finite() || o.price < 0.0 {
                let message = format!("must be a finite, non-negative price, got {}", o.price);
                return Err(at.err(object, &format!("{path}.price"), message));
            }
            if o.capacity_type == CapacityType::Reserved && o.reservation_capacity.is_none() {
                let message = "a reserved offering needs a reservationCapacity";
                return Err(at.err(object, &format!("{path}.reservationCapacity"), message));
            }
        }
    }
    Ok(())
}

impl Snapshot {
    /// Reads and parses each file in turn and merges them in order. An unreadable file is an error naming it.
    pub fn load_files(paths: &[impl AsRef<Path>]) -> Result<Snapshot, SnapshotError> {
        let mut snapshot = Snapshot::default();
        for path in paths {
            let file = path.as_ref().display().to_string();
            let text = std::fs::read_to_string(path.as_ref()).map_err(|e| {
                let at = At { file: &file, document: 0, prefix: String::new() };
                at.err("", "", format!("cannot read the file: {e}"))
            })?;
            snapshot.merge(Self::parse_str(&file, &text)?);
        }
        Ok(snapshot)
    }

    /// Parses the multi-document YAML `text`; `file` names it in errors.
    pub fn parse_str(file: &str, text: &str) -> Result<Snapshot, SnapshotError> {
        let mut snapshot = Snapshot::default();
        for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let at = At { file, document: i + 1, prefix: String::new() };
            let value = Value::deserialize(document).map_err(|e| at.err("", "", format!("invalid YAML: {e}")))?;
            snapshot.add(&at, &value)?;
        }
        Ok(snapshot)
    }

    /// Appends everything in `other` after what this snapshot holds.
    pub fn merge(&mut self, other: Snapshot) {
        self.pods.extend(other.pods);
        self.nodes.extend(other.nodes);
        self.daemon_sets.extend(other.daemon_sets);
        self.pdbs.extend(other.pdbs);
        self.node_pools.extend(other.node_pools);
        self.node_claims.extend(other.node_claims);
        self.catalogs.extend(other.catalogs);
        self.persistent_volumes.extend(other.persistent_volumes);
        self.persistent_volume_claims.extend(other.persistent_volume_claims);
        self.storage_classes.extend(other.storage_classes);
        self.csi_nodes.extend(other.csi_nodes);
        self.namespaces.extend(other.namespaces);
    }

    /// Each Namespace's labels, by name.
    pub fn namespace_labels(&self) -> crate::cluster::NamespaceLabels {
        self.namespaces
            .iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), n.metadata.labels.clone().unwrap_or_default()))
            .collect()
    }

    /// The storage objects, keyed as the decisions read them (a later object of one name replaces an
    /// earlier one).
    pub fn storage(&self) -> crate::cluster::Storage {
        use std::sync::Arc;
        let by_name = |meta: &ObjectMeta| meta.name.clone().unwrap_or_default();
        crate::cluster::Storage {
            volumes: Arc::new(
                self.persistent_volumes.iter().map(|v| (by_name(&v.metadata), Arc::new(v.clone()))).collect(),
            ),
            claims: Arc::new(
                self.persistent_volume_claims
                    .iter()
                    .map(|c| {
                        let ns = c.metadata.namespace.as_deref().unwrap_or("default");
                        (format!("{ns}/{}", by_name(&c.metadata)), Arc::new(c.clone()))
                    })
                    .collect(),
            ),
            classes: Arc::new(
                self.storage_classes.iter().map(|c| (by_name(&c.metadata), Arc::new(c.clone()))).collect(),
            ),
            csi_nodes: Arc::new(self.csi_nodes.iter().map(|c| (by_name(&c.metadata), Arc::new(c.clone()))).collect()),
        }
    }

    /// Every catalog's instance types; a type named again in a later catalog replaces the earlier one (in the
    /// earlier one's position).
    pub fn instance_types(&self) -> Vec<InstanceType> {
        let mut types: Vec<InstanceType> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for t in self.catalogs.iter().flat_map(|c| &c.instance_types) {
            match index.get(t.name.as_str()) {
                Some(&i) => types[i] = t.clone(),
                None => {
                    index.insert(&t.name, types.len());
                    types.push(t.clone());
                }
            }
        }
        types
    }

    /// Adds one document (or `kind: List` item); null documents are skipped, unknown kinds ignored.
    fn add(&mut self, at: &At<'_>, value: &Value) -> Result<(), SnapshotError> {
        let map = match value {
            Value::Null => return Ok(()),
            Value::Object(map) => map,
            other => {
                let found = match other {
                    Value::Array(_) => "a sequence",
                    _ => "a scalar",
                };
                return Err(at.err("", "", format!("expected a Kubernetes object (a mapping), found {found}")));
            }
        };
        let text = |key: &str| map.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
        let kind = text("kind").ok_or_else(|| at.err("", "kind", "is required"))?;
        let object = object_name(kind, value);
        let api_version = text("apiVersion").ok_or_else(|| at.err(&object, "apiVersion", "is required"))?;
        if kind == "List" {
            let items = match map.get("items") {
                None | Some(Value::Null) => return Ok(()),
                Some(Value::Array(items)) => items,
                Some(_) => return Err(at.err(&object, "items", "expected a list of objects")),
            };
            for (i, item) in items.iter().enumerate() {
                let prefix =
                    if at.prefix.is_empty() { format!("items[{i}]") } else { format!("{}.items[{i}]", at.prefix) };
                self.add(&At { file: at.file, document: at.document, prefix }, item)?;
            }
            return Ok(());
        }
        let expected = match kind {
            "Pod" | "Node" | "PersistentVolume" | "PersistentVolumeClaim" | "Namespace" => "v1",
            "StorageClass" | "CSINode" => "storage.k8s.io/v1",
            "DaemonSet" => "apps/v1",
            "PodDisruptionBudget" => "policy/v1",
            "NodePool" | "NodeClaim" => "karpenter.sh/v1",
            "InstanceCatalog" => "tenon.dev/v1alpha1",
            _ => return Ok(()),
        };
        if api_version != expected {
            return Err(at.err(
                &object,
                "apiVersion",
                format!("expected {expected:?} for {kind}, got {api_version:?}"),
            ));
        }
        let name = value.pointer("/metadata/name").and_then(Value::as_str).filter(|s| !s.is_empty());
        let Some(name) = name else { return Err(at.err(&object, "metadata.name", "is required")) };
        match kind {
            "Pod" => {
                let mut pod: Pod = at.typed(&object, value)?;
                default_namespace(&mut pod.metadata);
                check_pod_spec(at, &object, "spec", pod.spec.as_ref())?;
                self.pods.push(pod);
            }
            "Node" => {
                let node: Node = at.typed(&object, value)?;
                let status = node.status.as_ref();
                check_quantities(at, &object, "status.allocatable", status.and_then(|s| s.allocatable.as_ref()))?;
                check_quantities(at, &object, "status.capacity", status.and_then(|s| s.capacity.as_ref()))?;
                self.nodes.push(node);
            }
            "DaemonSet" => {
                let mut ds: DaemonSet = at.typed(&object, value)?;
                default_namespace(&mut ds.metadata);
                let spec = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref());
                check_pod_spec(at, &object, "spec.template.spec", spec)?;
                self.daemon_sets.push(ds);
            }
            "PodDisruptionBudget" => {
                let mut pdb: PodDisruptionBudget = at.typed(&object, value)?;
                default_namespace(&mut pdb.metadata);
                self.pdbs.push(pdb);
            }
            "PersistentVolume" => self.persistent_volumes.push(at.typed(&object, value)?),
            "PersistentVolumeClaim" => {
                let mut pvc: PersistentVolumeClaim = at.typed(&object, value)?;
                default_namespace(&mut pvc.metadata);
                self.persistent_volume_claims.push(pvc);
            }
            "StorageClass" => self.storage_classes.push(at.typed(&object, value)?),
            "CSINode" => self.csi_nodes.push(at.typed(&object, value)?),
            "Namespace" => self.namespaces.push(at.typed(&object, value)?),
            "NodePool" => {
                let pool: NodePool = at.typed(&object, value)?;
                pool.validate().map_err(|e| at.validation(e))?;
                self.node_pools.push(pool);
            }
            "NodeClaim" => {
                let claim: NodeClaim = at.typed(&object, value)?;
                claim.validate().map_err(|e| at.validation(e))?;
                self.node_claims.push(claim);
            }
            _ => {
                let doc: CatalogDocument = at.typed(&object, value)?;
                check_catalog(at, &object, &doc.spec.instance_types)?;
                self.catalogs.push(InstanceCatalog { name: name.to_owned(), instance_types: doc.spec.instance_types });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceName;

    fn parse_err(text: &str) -> SnapshotError {
        Snapshot::parse_str("t.yaml", text).unwrap_err()
    }

    #[test]
    fn empty_documents_count_and_unknown_kinds_are_ignored() {
        let text = "---\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n---\n\
                    apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n---\nfoo\n";
        let e = parse_err(text);
        assert_eq!(e.document, 4, "{e}");
        assert_eq!(e.to_string(), "t.yaml: document 4: expected a Kubernetes object (a mapping), found a scalar");
        let snapshot = Snapshot::parse_str("t.yaml", text.trim_end_matches("---\nfoo\n")).unwrap();
        assert_eq!(snapshot.pods.len(), 1);
        assert_eq!(snapshot.pods[0].metadata.namespace.as_deref(), Some("default"));
        assert!(Snapshot::parse_str("t.yaml", "").unwrap().pods.is_empty());
    }

    #[test]
    fn pod_quantities_are_checked_with_their_path() {
        let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: web-1, namespace: shop}\nspec:\n  containers:\n  \
                   - {name: a, resources: {limits: {cpu: '1'}}}\n  initContainers:\n  - name: b\n    \
                   resources: {requests: {nvidia.com/gpu: lots}}\n";
        let e = parse_err(pod);
        assert_eq!(e.object, "Pod/shop/web-1");
        assert_eq!(e.field, "spec.initContainers[0].resources.requests[\"nvidia.com/gpu\"]");
        let e = parse_err("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [], overhead: {cpu: x}}");
        assert_eq!(e.field, "spec.overhead.cpu");
        let e = parse_err("apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}\nspec: {containers: []}");
        assert_eq!((e.object.as_str(), e.field.as_str()), ("Pod", "metadata.name"));
        let e = parse_err("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: 3}");
        assert_eq!((e.object.as_str(), e.field.as_str()), ("Pod/default/p", "spec.containers"));
    }

    #[test]
    fn nodes_and_daemon_sets_are_checked() {
        let node = "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus: {capacity: {cpu: '4', memory: 1Zi}}";
        let e = parse_err(node);
        assert_eq!((e.object.as_str(), e.field.as_str()), ("Node/n1", "status.capacity.memory"));
        let ds = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent}\nspec:\n  selector: {}\n  \
                  template: {spec: {containers: [{name: a, resources: {requests: {memory: -1Gi}}}]}}";
        let e = parse_err(ds);
        assert_eq!(e.object, "DaemonSet/default/agent");
        assert_eq!(e.field, "spec.template.spec.containers[0].resources.requests.memory");
    }

    #[test]
    fn list_items_are_unwrapped_and_named() {
        let list = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n\
                    - {apiVersion: policy/v1, kind: PodDisruptionBudget, metadata: {name: pdb}, spec: {}}\n\
                    - {apiVersion: v1, kind: Node, metadata: {name: n}, spec: {taints: 1}}\n";
        let e = parse_err(list);
        assert_eq!((e.document, e.object.as_str(), e.field.as_str()), (1, "Node/n", "items[2].spec.taints"));
        let snapshot = Snapshot::parse_str("t.yaml", list.rsplit_once("- {apiVersion: v1, kind: Node").unwrap().0);
        let snapshot = snapshot.unwrap();
        assert_eq!(snapshot.pdbs.len(), 1);
        assert_eq!(snapshot.pdbs[0].metadata.namespace.as_deref(), Some("default"));
        let e = parse_err("apiVersion: v1\nkind: List\nitems: [{kind: Pod}]");
        assert_eq!((e.object.as_str(), e.field.as_str()), ("Pod", "items[0].apiVersion"));
    }

    #[test]
    fn catalogs_are_validated_and_later_types_win() {
        let catalog = |name: &str, types: &str| {
            format!(
                "apiVersion: tenon.dev/v1alpha1\nkind: InstanceCatalog\nmetadata: {{name: {name}}}\nspec:\n  instanceTypes: {types}\n"
            )
        };
        let a = catalog("a", "[{name: m5.large, capacity: {cpu: '2'}}, {name: c5.large, capacity: {cpu: '2'}}]");
        let b = catalog(
            "b",
            "[{name: m5.large, capacity: {cpu: '4'}, offerings: [{zone: z, capacityType: spot, price: 1}]}]",
        );
        let mut snapshot = Snapshot::parse_str("a.yaml", &a).unwrap();
        snapshot.merge(Snapshot::parse_str("b.yaml", &b).unwrap());
        let types = snapshot.instance_types();
        assert_eq!(types.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["m5.large", "c5.large"]);
        assert_eq!(types[0].capacity.get(ResourceName::CPU), 4000);
        assert!(types[0].offerings[0].available, "available defaults to true");

        let cases = [
            ("[{name: '', capacity: {}}]", "spec.instanceTypes[0].name", "must not be empty"),
            ("[{name: x, capacity: {}}, {name: x, capacity: {}}]", "spec.instanceTypes[1].name", "duplicate"),
            (
                "[{name: x, capacity: {}, offerings: [{zone: '', capacityType: spot, price: 1}]}]",
                "offerings[0].zone",
                "",
            ),
            ("[{name: x, capacity: {cpu: many}}]", "spec.instanceTypes[0].capacity", "many"),
            ("[{name: x, capacity: {}, offerings: [{zone: z, capacityType: cheap, price: 1}]}]", "capacityType", ""),
        ];
        for (types, field, message) in cases {
            let e = parse_err(&catalog("c", types));
            assert_eq!(e.object, "InstanceCatalog/c");
            assert!(e.field.ends_with(field) && e.message.contains(message), "{types}: {e}");
        }
        let e = parse_err("apiVersion: tenon.dev/v1alpha1\nkind: InstanceCatalog\nmetadata: {name: c}\n");
        assert_eq!((e.field.as_str(), e.message.as_str()), ("", "missing field `spec`"));
    }

    #[test]
    fn errors_display_every_known_part() {
        let e = SnapshotError {
            file: "cluster.yaml".into(),
            document: 3,
            object: "Pod/default/web-1".into(),
            field: "spec.containers[0].resources.requests.cpu".into(),
            message: "invalid quantity \"lots\"".into(),
        };
        let expected = "cluster.yaml: document 3 (Pod default/web-1): spec.containers[0].resources.requests.cpu: \
                        invalid quantity \"lots\"";
        assert_eq!(e.to_string(), expected);
        let e = SnapshotError { document: 0, object: String::new(), field: String::new(), ..e };
        assert_eq!(e.to_string(), "cluster.yaml: invalid quantity \"lots\"");
    }
}
