//! Cluster snapshots read from YAML files.
//!
//! `tenon plan` reads multi-document YAML files holding Kubernetes objects as `kubectl get -o yaml` prints
//! them (bare objects or `kind: List` wrappers) plus tenon's own `InstanceCatalog` documents. Kinds tenon
//! does not model (Service, ConfigMap, Deployment, …) are skipped; everything else is checked up front so that
//! an error names the file, the document, the object and the field.
//!
//! A file is read in one of two ways. First by a reader of the block-style YAML that kubectl and
//! serde_yaml_ng write, which deserializes typed objects straight from the text (the `block` module); when
//! the file strays from that style or anything in it is wrong, the file is read again with serde_yaml_ng
//! into a `serde_json::Value` per document and then into typed objects through `serde_path_to_error`, which
//! handles all of YAML and names the file, document, object and field of an error. Both give the same
//! objects; the first takes a fraction of the time and memory on large dumps.
//!
//! What a snapshot keeps of each pod is up to its [`PodSink`]: the `Pod` objects themselves
//! ([`Snapshot`]), or only what the cluster state needs of them
//! ([`ReadPods`](crate::state::ReadPods)), so that a dump of tens of thousands of pods is never held in
//! memory as Kubernetes objects.

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

mod block;

/// An `InstanceCatalog` document (apiVersion `tenon.dev/v1alpha1`): the instance types a provider offers.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceCatalog {
    /// The catalog's `metadata.name`.
    pub name: String,
    /// Its `spec.instanceTypes`, in document order.
    pub instance_types: Vec<InstanceType>,
}

/// What a [`Snapshot`] keeps of the pods it reads, in the order it reads them.
pub trait PodSink: Default {
    /// Keeps `pod` (its namespace defaulted, its quantities checked).
    fn push(&mut self, pod: Pod);
    /// Appends everything `other` kept after what this one holds.
    fn append(&mut self, other: Self);
}

impl PodSink for Vec<Pod> {
    fn push(&mut self, pod: Pod) {
        Vec::push(self, pod);
    }

    fn append(&mut self, mut other: Self) {
        if self.is_empty() {
            *self = other;
        } else {
            Vec::append(self, &mut other);
        }
    }
}

/// Everything read from snapshot files; `P` is what is kept of the pods, the `Pod` objects by default.
#[derive(Debug, Clone, Default)]
pub struct Snapshot<P = Vec<Pod>> {
    /// Pods, with `metadata.namespace` defaulted to `default`.
    pub pods: P,
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

/// A document (or `kind: List` item) to read typed objects from.
trait Source {
    /// Deserializes the object into `T`, naming the failing field.
    fn typed<T: DeserializeOwned>(&self, at: &At<'_>, object: &str) -> Result<T, SnapshotError>;
}

impl Source for &Value {
    fn typed<T: DeserializeOwned>(&self, at: &At<'_>, object: &str) -> Result<T, SnapshotError> {
        at.typed(object, self)
    }
}

impl Source for block::Node<'_, '_> {
    /// The error is never shown: any error sends the file to the general reader, which words it.
    fn typed<T: DeserializeOwned>(&self, at: &At<'_>, object: &str) -> Result<T, SnapshotError> {
        self.deserialize().map_err(|e| at.err(object, "", e))
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

/// Checks every quantity of `list`; `path` names the list, and is only spelled out for an error.
fn check_quantities(
    at: &At<'_>,
    object: &str,
    path: &dyn Fn() -> String,
    list: Option<&BTreeMap<String, Quantity>>,
) -> Result<(), SnapshotError> {
    for (name, q) in list.into_iter().flatten() {
        Resources::parse_quantity(name, &q.0).map_err(|e| at.err(object, &key_path(&path(), name), e))?;
    }
    Ok(())
}

fn check_pod_spec(at: &At<'_>, object: &str, path: &str, spec: Option<&PodSpec>) -> Result<(), SnapshotError> {
    let Some(spec) = spec else { return Ok(()) };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (list, containers) in [("containers", spec.containers.as_slice()), ("initContainers", init)] {
        for (i, c) in containers.iter().enumerate() {
            let r = c.resources.as_ref();
            let field = || format!("{path}.{list}[{i}].resources");
            check_quantities(at, object, &|| format!("{}.requests", field()), r.and_then(|r| r.requests.as_ref()))?;
            check_quantities(at, object, &|| format!("{}.limits", field()), r.and_then(|r| r.limits.as_ref()))?;
        }
    }
    check_quantities(at, object, &|| format!("{path}.overhead"), spec.overhead.as_ref())
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
        Self::read_files(paths)
    }

    /// Parses the multi-document YAML `text`; `file` names it in errors.
    pub fn parse_str(file: &str, text: &str) -> Result<Snapshot, SnapshotError> {
        Self::read_str(file, text)
    }
}

impl<P: PodSink> Snapshot<P> {
    /// As [`Snapshot::load_files`], keeping of the pods what `P` keeps.
    pub fn read_files(paths: &[impl AsRef<Path>]) -> Result<Self, SnapshotError> {
        let mut snapshot = Self::default();
        for path in paths {
            let file = path.as_ref().display().to_string();
            let text = std::fs::read_to_string(path.as_ref()).map_err(|e| {
                let at = At { file: &file, document: 0, prefix: String::new() };
                at.err("", "", format!("cannot read the file: {e}"))
            })?;
            snapshot.merge(Self::read_str(&file, &text)?);
        }
        Ok(snapshot)
    }

    /// As [`Snapshot::parse_str`], keeping of the pods what `P` keeps.
    pub fn read_str(file: &str, text: &str) -> Result<Self, SnapshotError> {
        match Self::read_block_style(file, text) {
            Some(snapshot) => Ok(snapshot),
            None => Self::read_any_style(file, text),
        }
    }

    /// Reads `text` with the block-style reader; `None` when the text strays from that style or anything in
    /// it is wrong (the general reader then reads it again, and words the error).
    fn read_block_style(file: &str, text: &str) -> Option<Self> {
        let mut snapshot = Self::default();
        let mut reader = block::Reader::new(text).ok()?;
        let at = At { file, document: 0, prefix: String::new() };
        while let Some(tape) = reader.next_document().ok()? {
            snapshot.add_block(&at, tape.root()).ok()?;
        }
        Some(snapshot)
    }

    /// Reads `text` with serde_yaml_ng, a `serde_json::Value` per document.
    fn read_any_style(file: &str, text: &str) -> Result<Self, SnapshotError> {
        let mut snapshot = Self::default();
        for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let at = At { file, document: i + 1, prefix: String::new() };
            let value = Value::deserialize(document).map_err(|e| at.err("", "", format!("invalid YAML: {e}")))?;
            snapshot.add(&at, &value)?;
        }
        Ok(snapshot)
    }

    /// Appends everything in `other` after what this snapshot holds.
    pub fn merge(&mut self, other: Self) {
        self.pods.append(other.pods);
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

    /// Adds one block-style document (or `kind: List` item), as [`Snapshot::add`] adds one read the general
    /// way; `Err` for whatever [`Snapshot::add`] would reject, and for what the general reader may read
    /// differently (a key given twice where the object's kind, version or name is looked up).
    fn add_block(&mut self, at: &At<'_>, node: block::Node<'_, '_>) -> Result<(), block::Unsupported> {
        use block::Unsupported;
        if node.is_null() {
            return Ok(());
        }
        if !node.is_map() {
            return Err(Unsupported);
        }
        let text = |key: &str| -> Result<&str, Unsupported> {
            node.get(key)?.and_then(|v| v.as_str()).filter(|s| !s.is_empty()).ok_or(Unsupported)
        };
        let (kind, api_version) = (text("kind")?, text("apiVersion")?);
        if kind == "List" {
            let Some(items) = node.get("items")? else { return Ok(()) };
            if items.is_null() {
                return Ok(());
            }
            for item in items.items().ok_or(Unsupported)? {
                self.add_block(at, item)?;
            }
            return Ok(());
        }
        let Some(expected) = api_version_of(kind) else { return Ok(()) };
        if api_version != expected {
            return Err(Unsupported);
        }
        let metadata = node.get("metadata")?.ok_or(Unsupported)?;
        let name = metadata.get("name")?.and_then(|v| v.as_str()).filter(|s| !s.is_empty()).ok_or(Unsupported)?;
        // The object is only named in errors, and errors are the general reader's to word.
        self.add_object(at, "", kind, name, node).map_err(|_| Unsupported)
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
        let Some(expected) = api_version_of(kind) else { return Ok(()) };
        if api_version != expected {
            return Err(at.err(
                &object,
                "apiVersion",
                format!("expected {expected:?} for {kind}, got {api_version:?}"),
            ));
        }
        let name = value.pointer("/metadata/name").and_then(Value::as_str).filter(|s| !s.is_empty());
        let Some(name) = name else { return Err(at.err(&object, "metadata.name", "is required")) };
        self.add_object(at, &object, kind, name, value)
    }

    /// Reads a document (or `kind: List` item) of a known `kind`, with its version checked, from `source`
    /// and keeps it. `object` names it in errors.
    fn add_object(
        &mut self,
        at: &At<'_>,
        object: &str,
        kind: &str,
        name: &str,
        source: impl Source,
    ) -> Result<(), SnapshotError> {
        match kind {
            "Pod" => {
                let mut pod: Pod = source.typed(at, object)?;
                default_namespace(&mut pod.metadata);
                check_pod_spec(at, object, "spec", pod.spec.as_ref())?;
                self.pods.push(pod);
            }
            "Node" => {
                let node: Node = source.typed(at, object)?;
                let status = node.status.as_ref();
                let allocatable = status.and_then(|s| s.allocatable.as_ref());
                check_quantities(at, object, &|| "status.allocatable".into(), allocatable)?;
                check_quantities(at, object, &|| "status.capacity".into(), status.and_then(|s| s.capacity.as_ref()))?;
                self.nodes.push(node);
            }
            "DaemonSet" => {
                let mut ds: DaemonSet = source.typed(at, object)?;
                default_namespace(&mut ds.metadata);
                let spec = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref());
                check_pod_spec(at, object, "spec.template.spec", spec)?;
                self.daemon_sets.push(ds);
            }
            "PodDisruptionBudget" => {
                let mut pdb: PodDisruptionBudget = source.typed(at, object)?;
                default_namespace(&mut pdb.metadata);
                self.pdbs.push(pdb);
            }
            "PersistentVolume" => self.persistent_volumes.push(source.typed(at, object)?),
            "PersistentVolumeClaim" => {
                let mut pvc: PersistentVolumeClaim = source.typed(at, object)?;
                default_namespace(&mut pvc.metadata);
                self.persistent_volume_claims.push(pvc);
            }
            "StorageClass" => self.storage_classes.push(source.typed(at, object)?),
            "CSINode" => self.csi_nodes.push(source.typed(at, object)?),
            "Namespace" => self.namespaces.push(source.typed(at, object)?),
            "NodePool" => {
                let pool: NodePool = source.typed(at, object)?;
                pool.validate().map_err(|e| at.validation(e))?;
                self.node_pools.push(pool);
            }
            "NodeClaim" => {
                let claim: NodeClaim = source.typed(at, object)?;
                claim.validate().map_err(|e| at.validation(e))?;
                self.node_claims.push(claim);
            }
            _ => {
                let doc: CatalogDocument = source.typed(at, object)?;
                check_catalog(at, object, &doc.spec.instance_types)?;
                self.catalogs.push(InstanceCatalog { name: name.to_owned(), instance_types: doc.spec.instance_types });
            }
        }
        Ok(())
    }
}

/// The apiVersion a modelled kind must have; `None` for kinds tenon skips.
fn api_version_of(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Pod" | "Node" | "PersistentVolume" | "PersistentVolumeClaim" | "Namespace" => "v1",
        "StorageClass" | "CSINode" => "storage.k8s.io/v1",
        "DaemonSet" => "apps/v1",
        "PodDisruptionBudget" => "policy/v1",
        "NodePool" | "NodeClaim" => "karpenter.sh/v1",
        "InstanceCatalog" => "tenon.dev/v1alpha1",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceName;
    use crate::state::{ClusterState, ReadPods};
    use std::path::PathBuf;

    fn repo(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
    }

    /// The plan cases, the loader's fixtures and a catalog, by name.
    fn inputs() -> Vec<(String, String)> {
        let mut out = Vec::new();
        for dir in ["tests/plan", "core/tests/snapshots"] {
            let mut files: Vec<PathBuf> = std::fs::read_dir(repo(dir))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect();
            files.sort();
            out.extend(files.into_iter().map(|p| (p.display().to_string(), std::fs::read_to_string(&p).unwrap())));
        }
        let catalog = repo("examples/catalogs/aws-us-east-1.yaml");
        out.push((catalog.display().to_string(), std::fs::read_to_string(&catalog).unwrap()));
        out
    }

    /// `text` rewritten document by document as serde_yaml_ng writes YAML: block style, strings quoted only
    /// where they must be. Documents that do not read as YAML are left out.
    fn block_style(text: &str) -> String {
        let mut out = String::new();
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            let Ok(value) = Value::deserialize(document) else { break };
            if !value.is_null() {
                out.push_str("---\n");
                out.push_str(&serde_yaml_ng::to_string(&value).unwrap());
            }
        }
        out
    }

    /// A dump as `kubectl get -o yaml` writes one: a `List` with compact sequences, quoted strings, a literal
    /// annotation, empty collections, comments.
    const KUBECTL: &str = r#"apiVersion: v1
items:
- apiVersion: v1
  kind: Pod
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"shop"}}
      note: "tab\tand \"quotes\""
    creationTimestamp: "2026-01-01T00:00:00Z"
    labels:
      app: web
      pod-template-hash: "5d4f8b7c9"
    name: web-1
    namespace: shop
    ownerReferences:
    - apiVersion: apps/v1
      blockOwnerDeletion: true
      controller: true
      kind: ReplicaSet
      name: web-5d4f8b7c9
      uid: 0b6f2a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b
    resourceVersion: "12345"
  spec:
    affinity:
      podAntiAffinity:
        preferredDuringSchedulingIgnoredDuringExecution:
        - podAffinityTerm:
            labelSelector:
              matchLabels:
                app: web
            topologyKey: kubernetes.io/hostname
          weight: 100
    containers:
    - args:
      - --port=8080
      - --verbose
      image: registry.example.com/web:1.2.3
      name: web
      ports:
      - containerPort: 8080
        protocol: TCP
      resources:
        limits:
          memory: 512Mi
        requests:
          cpu: 250m
          memory: 256Mi
      securityContext: {}
      volumeMounts:
      - mountPath: /var/run/secrets/kubernetes.io/serviceaccount
        name: kube-api-access
        readOnly: true
    dnsPolicy: ClusterFirst
    priority: 0
    terminationGracePeriodSeconds: 30
    tolerations:
    - effect: NoExecute
      key: node.kubernetes.io/not-ready
      operator: Exists
      tolerationSeconds: 300
    topologySpreadConstraints:
    - labelSelector:
        matchLabels:
          app: web
      maxSkew: 1
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: ScheduleAnyway
    volumes:
    - name: kube-api-access
      projected:
        defaultMode: 420
        sources:
        - serviceAccountToken:
            expirationSeconds: 3607
            path: token
  status:
    conditions:
    - lastProbeTime: null
      lastTransitionTime: "2026-01-01T00:00:00Z"
      message: '0/3 nodes are available: 3 Insufficient cpu.'
      reason: Unschedulable
      status: "False"
      type: PodScheduled
    phase: Pending
    qosClass: Burstable
# a node
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      karpenter.sh/capacity-type: spot
      karpenter.sh/nodepool: default
      node.kubernetes.io/instance-type: m5.large
      topology.kubernetes.io/zone: us-east-1a
    name: ip-10-0-0-1
  spec:
    providerID: aws:///us-east-1a/i-0123456789abcdef0
    taints: []
  status:
    allocatable:
      cpu: 1930m
      ephemeral-storage: "18242267924"
      memory: 7291332Ki
      pods: "29"
    conditions:
    - status: "True"
      type: Ready
- apiVersion: v1
  kind: ConfigMap
  data:
    key: value
  metadata:
    name: ignored
kind: List
metadata:
  resourceVersion: ""
"#;

    /// Reads `text` both ways. When the block-style reader takes it, it must give what the general reader
    /// gives; returns whether it took it.
    fn same_either_way(text: &str) -> bool {
        let general = Snapshot::<Vec<Pod>>::read_any_style("t.yaml", text);
        let Some(block) = Snapshot::<Vec<Pod>>::read_block_style("t.yaml", text) else { return false };
        match general {
            Ok(general) => assert_eq!(format!("{block:?}"), format!("{general:?}"), "read differently:\n{text}"),
            Err(e) => panic!("the block-style reader takes what the general one rejects ({e}):\n{text}"),
        }
        true
    }

    #[test]
    fn block_style_files_are_read_directly_as_the_general_reader_reads_them() {
        assert!(same_either_way(KUBECTL));
        let snapshot = Snapshot::parse_str("t.yaml", KUBECTL).unwrap();
        assert_eq!((snapshot.pods.len(), snapshot.nodes.len()), (1, 1));
        let annotations = snapshot.pods[0].metadata.annotations.as_ref().unwrap();
        assert!(annotations["kubectl.kubernetes.io/last-applied-configuration"].ends_with("}}\n"));
        assert_eq!(annotations["note"], "tab\tand \"quotes\"");
        for (file, text) in inputs() {
            let block = block_style(&text);
            let readable = Snapshot::parse_str("t.yaml", &text).is_ok();
            assert_eq!(same_either_way(&block), readable, "{file} in block style:\n{block}");
            // The rewrite reads as the file does.
            let (a, b) = (Snapshot::parse_str("t.yaml", &block), Snapshot::parse_str("t.yaml", &text));
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{file}");
        }
    }

    #[test]
    fn generated_snapshots_are_read_directly() {
        use crate::scheduling::workload;
        let with_kind = |v: &dyn erased::Ser, api: &str, kind: &str| {
            let mut v = v.value();
            let map = v.as_object_mut().unwrap();
            map.insert("apiVersion".into(), api.into());
            map.insert("kind".into(), kind.into());
            format!("---\n{}", serde_yaml_ng::to_string(&v).unwrap())
        };
        let mut text = String::new();
        let catalog = serde_json::json!({"apiVersion": "tenon.dev/v1alpha1", "kind": "InstanceCatalog",
            "metadata": {"name": "generated"}, "spec": {"instanceTypes": workload::instance_types(20)}});
        text.push_str(&format!("---\n{}", serde_yaml_ng::to_string(&catalog).unwrap()));
        text.push_str(&with_kind(&NodePool::new("default", Default::default()), "karpenter.sh/v1", "NodePool"));
        for pod in workload::app_pods(200, 20, 7) {
            text.push_str(&with_kind(&pod, "v1", "Pod"));
        }
        let fleet = crate::disruption::workload::fleet(20, 5, 3);
        for node in &fleet.nodes {
            text.push_str(&with_kind(node, "v1", "Node"));
        }
        for pod in &fleet.pods {
            text.push_str(&with_kind(pod, "v1", "Pod"));
        }
        for pdb in &fleet.pdbs {
            text.push_str(&with_kind(pdb, "policy/v1", "PodDisruptionBudget"));
        }
        assert!(same_either_way(&text));
        assert_eq!(Snapshot::parse_str("t.yaml", &text).unwrap().pods.len(), 200 + fleet.pods.len());
    }

    /// Serializes the generated objects of several types behind one reference.
    mod erased {
        pub(super) trait Ser {
            fn value(&self) -> serde_json::Value;
        }
        impl<T: serde::Serialize> Ser for T {
            fn value(&self) -> serde_json::Value {
                serde_json::to_value(self).unwrap()
            }
        }
    }

    /// Text that makes YAML and Kubernetes objects go wrong in interesting ways.
    const NOISE: &[&str] = &[
        ":",
        "- ",
        "-",
        "[",
        "]",
        "{}",
        "[]",
        "\"",
        "'",
        "''",
        "\n",
        "  ",
        " ",
        "#",
        " #",
        "&a",
        "*a",
        "!!int",
        "~",
        "null",
        "-1",
        "1e400",
        "0x",
        "0",
        "007",
        "1.5",
        "99999999999999999999",
        "500m",
        "1Gi",
        "NaN",
        ".inf",
        "true",
        "|",
        "|-",
        "|+",
        ">",
        "\n  - ",
        "\n---\n",
        "---",
        "...",
        "kind: List",
        "items:",
        "apiVersion: v1",
        "kind: Pod",
        "kind: Node",
        "metadata:",
        "name: x",
        "requests:",
        "cpu: ",
        "\t",
        "\r",
        "ü",
        "\\",
        "\\u00e9",
    ];

    /// A small deterministic generator (xorshift), so that a failure repeats.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n.max(1) as u64) as usize
        }
    }

    fn mutate(text: &str, rng: &mut Rng) -> String {
        let mut t = text.to_owned();
        for _ in 0..=rng.below(3) {
            let boundary = |t: &str, mut i: usize| {
                i = i.min(t.len());
                while !t.is_char_boundary(i) {
                    i -= 1;
                }
                i
            };
            match rng.below(5) {
                0 => {
                    let i = boundary(&t, rng.below(t.len() + 1));
                    t.truncate(i);
                }
                1 | 2 => {
                    let mut lines: Vec<&str> = t.split_inclusive('\n').collect();
                    if lines.is_empty() {
                        continue;
                    }
                    let i = rng.below(lines.len());
                    if rng.below(2) == 0 {
                        lines.remove(i);
                    } else {
                        lines.insert(i, lines[i]);
                    }
                    t = lines.concat();
                }
                _ => {
                    let i = boundary(&t, rng.below(t.len() + 1));
                    let j = boundary(&t, i + rng.below(12)).max(i);
                    t.replace_range(i..j, NOISE[rng.below(NOISE.len())]);
                }
            }
        }
        t
    }

    #[test]
    fn mutated_block_style_files_read_as_the_general_reader_reads_them_or_are_left_to_it() {
        let mut sources: Vec<String> = inputs().iter().map(|(_, text)| block_style(text)).collect();
        sources.push(KUBECTL.to_owned());
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut taken, cases) = (0, 3000);
        for _ in 0..cases {
            let source = &sources[rng.below(sources.len())];
            let text = mutate(source, &mut rng);
            // As YAML, whatever the objects.
            block::tests::agrees(&text);
            if same_either_way(&text) {
                taken += 1;
            }
        }
        // The property is only worth something if many of the mutated files are read directly (most edits
        // break the objects, or repeat a line and so a key, which the block-style reader leaves alone).
        assert!(taken > cases / 10, "only {taken} of {cases} mutated files were read directly");
    }

    #[test]
    fn states_built_from_read_pods_are_those_built_from_pod_objects() {
        let now: jiff::Timestamp = "2026-03-04T12:00:00Z".parse().unwrap();
        let catalog = std::fs::read_to_string(repo("examples/catalogs/aws-us-east-1.yaml")).unwrap();
        let mut cases: Vec<String> = inputs().into_iter().map(|(_, text)| text).collect();
        cases.push(KUBECTL.to_owned());
        cases.extend(cases.clone().iter().map(|t| block_style(t)));
        for text in cases {
            let objects = Snapshot::parse_str("t.yaml", &text);
            let read = Snapshot::<ReadPods>::read_str("t.yaml", &text);
            let (mut objects, mut read) = match (objects, read) {
                (Ok(o), Ok(r)) => (o, r),
                (Err(a), Err(b)) => {
                    assert_eq!(a, b);
                    continue;
                }
                (a, b) => panic!("{:?} but {:?}:\n{text}", a.err(), b.err()),
            };
            objects.merge(Snapshot::parse_str("c.yaml", &catalog).unwrap());
            read.merge(Snapshot::<ReadPods>::read_str("c.yaml", &catalog).unwrap());
            assert_eq!(format!("{:?}", objects.instance_types()), format!("{:?}", read.instance_types()));
            let expected = ClusterState::from_objects_with_storage(
                &objects.pods,
                &objects.nodes,
                &objects.node_claims,
                &objects.daemon_sets,
                &objects.pdbs,
                &objects.node_pools,
                &objects.storage(),
                &objects.namespace_labels(),
                now,
            );
            let state = ClusterState::from_read_snapshot(read, now);
            assert_eq!(format!("{state:?}"), format!("{expected:?}"), "{text}");
        }
    }

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
