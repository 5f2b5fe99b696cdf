//! Snapshot files load into typed objects, and every kind of bad input is rejected with an error naming the
//! file, the document, the object and the field.

use std::path::PathBuf;

use tenon_core::cloud::CapacityType;
use tenon_core::resources::ResourceName;
use tenon_core::snapshot::{Snapshot, SnapshotError};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(name)
}

#[test]
fn a_cluster_dump_loads_every_modelled_kind() {
    let s = Snapshot::load_files(&[fixture("cluster.yaml")]).unwrap();
    assert_eq!(
        (s.pods.len(), s.nodes.len(), s.daemon_sets.len(), s.pdbs.len(), s.node_pools.len(), s.catalogs.len()),
        (3, 1, 1, 1, 1, 1)
    );
    assert!(s.node_claims.is_empty());
    let pods: Vec<_> = s
        .pods
        .iter()
        .map(|p| (p.metadata.namespace.as_deref().unwrap(), p.metadata.name.as_deref().unwrap()))
        .collect();
    assert_eq!(pods, [("default", "web-1"), ("ml", "trainer"), ("batch", "worker-0")], "the List's Pod comes last");
    assert_eq!(s.pdbs[0].metadata.namespace.as_deref(), Some("default"), "namespace defaulted");
    assert_eq!(s.daemon_sets[0].metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(s.nodes[0].metadata.namespace, None, "nodes are cluster-scoped");
    assert_eq!(s.node_pools[0].name(), "default");

    let catalog = &s.catalogs[0];
    assert_eq!(catalog.name, "base");
    let g5 = &catalog.instance_types[1];
    assert_eq!(g5.capacity.get(ResourceName::NVIDIA_GPU), 1);
    assert_eq!(g5.allocatable().get(ResourceName::CPU), 7900);
    assert_eq!(g5.offerings[1].capacity_type, CapacityType::Reserved);
    assert_eq!(g5.offerings[1].reservation_capacity, Some(2));
    assert!(!catalog.instance_types[0].offerings[1].available);
}

#[test]
fn later_catalogs_replace_earlier_instance_types() {
    let s = Snapshot::load_files(&[fixture("cluster.yaml"), fixture("catalog-override.yaml")]).unwrap();
    assert_eq!(s.catalogs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["base", "override"]);
    let types = s.instance_types();
    assert_eq!(types.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["m5.large", "g5.2xlarge", "c5.xlarge"]);
    assert_eq!(types[0].offerings.len(), 1);
    assert_eq!(types[0].offerings[0].price, 0.1, "the override's m5.large wins");

    let reversed = Snapshot::load_files(&[fixture("catalog-override.yaml"), fixture("cluster.yaml")]).unwrap();
    assert_eq!(reversed.instance_types()[0].offerings[0].price, 0.096, "now the base catalog's wins");
}

/// Asserts every part of the error and that its message shows them.
fn assert_error(e: &SnapshotError, file: &str, document: usize, object: &str, field: &str, message: &str) {
    assert_eq!((e.file.as_str(), e.document, e.object.as_str(), e.field.as_str()), (file, document, object, field));
    assert!(e.message.contains(message), "{e}");
    let shown = e.to_string();
    assert!(shown.starts_with(&format!("{file}: document {document}")), "{shown}");
    let (kind, rest) = object.split_once('/').unwrap_or((object, ""));
    assert!(shown.contains(kind) && shown.contains(rest) && shown.contains(field), "{shown}");
}

const PREAMBLE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n";

fn parse_err(text: &str) -> SnapshotError {
    match Snapshot::parse_str("input.yaml", &format!("{PREAMBLE}{text}")) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

fn catalog(offering: &str) -> String {
    format!(
        "apiVersion: tenon.dev/v1alpha1\nkind: InstanceCatalog\nmetadata: {{name: prices}}\nspec:\n  instanceTypes:\n  \
         - {{name: m5.large, capacity: {{cpu: '2'}}, offerings: [{{zone: a, capacityType: spot, price: 1}}, {offering}]}}\n"
    )
}

#[test]
fn a_bad_pod_quantity_names_file_document_object_and_field() {
    let path = fixture("bad-pod.yaml");
    let e = Snapshot::load_files(&[fixture("cluster.yaml"), path.clone()]).unwrap_err();
    let file = path.display().to_string();
    assert_error(&e, &file, 2, "Pod/default/web-2", "spec.containers[0].resources.requests.cpu", "\"lots\"");
    assert!(e.to_string().contains("document 2 (Pod default/web-2): spec.containers[0].resources.requests.cpu: "));
}

#[test]
fn a_bad_node_pool_budget_is_rejected_by_validation() {
    let pool = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: burst}\n\
                spec: {template: {spec: {}}, disruption: {budgets: [{nodes: '10%'}, {nodes: '110%'}]}}\n";
    let e = parse_err(pool);
    assert_error(&e, "input.yaml", 2, "NodePool/burst", "spec.disruption.budgets[1].nodes", "\"110%\"");
}

#[test]
fn a_node_pool_with_the_wrong_api_version_names_the_field() {
    let e = parse_err("apiVersion: karpenter.sh/v1beta1\nkind: NodePool\nmetadata: {name: old}\nspec: {}\n");
    assert_error(&e, "input.yaml", 2, "NodePool/old", "apiVersion", "\"karpenter.sh/v1\"");
}

#[test]
fn a_document_without_kind_is_rejected() {
    let e = parse_err("---\napiVersion: v1\nmetadata: {name: mystery}\n");
    assert_error(&e, "input.yaml", 3, "", "kind", "is required");
}

#[test]
fn a_scalar_document_is_rejected() {
    let e = parse_err("just some text\n");
    assert_error(&e, "input.yaml", 2, "", "", "mapping");
    assert_eq!(e.to_string(), "input.yaml: document 2: expected a Kubernetes object (a mapping), found a scalar");
}

#[test]
fn a_negative_catalog_price_is_rejected() {
    let e = parse_err(&catalog("{zone: b, capacityType: on-demand, price: -0.5}"));
    assert_error(&e, "input.yaml", 2, "InstanceCatalog/prices", "spec.instanceTypes[0].offerings[1].price", "-0.5");
}

#[test]
fn a_reserved_offering_needs_a_reservation_capacity() {
    let e = parse_err(&catalog("{zone: b, capacityType: reserved, price: 0, reservationId: cr-1}"));
    let field = "spec.instanceTypes[0].offerings[1].reservationCapacity";
    assert_error(&e, "input.yaml", 2, "InstanceCatalog/prices", field, "reservationCapacity");
}

#[test]
fn a_bad_list_item_names_the_item() {
    let list = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: web}}\n\
                - {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: shop}, spec: {containers: [\
                {name: c, resources: {limits: {memory: 1Qi}}}]}}\n";
    let e = parse_err(list);
    assert_error(&e, "input.yaml", 2, "Pod/shop/p", "items[1].spec.containers[0].resources.limits.memory", "1Qi");
}

#[test]
fn a_missing_file_is_named() {
    let path = fixture("does-not-exist.yaml");
    let e = Snapshot::load_files(&[fixture("cluster.yaml"), path.clone()]).unwrap_err();
    assert_eq!((e.file, e.document, e.object.as_str()), (path.display().to_string(), 0, ""));
    assert!(e.message.contains("cannot read"), "{}", e.message);
}
