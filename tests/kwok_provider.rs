//! The kwok provider against a real control plane with a kwok controller (`scripts/peers/kube.sh`):
//! start one with `eval "$(scripts/peers/kube.sh start /tmp/kwokpeer)"`, then
//! `cargo test -p tenon --test kwok_provider`.
//!
//! Tests run in parallel against one cluster: each uses a cluster name and claim names of its own, so none
//! sees another's nodes. Every wait polls the API server until a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, CustomResourceExt};
use tenon::kwok::{
    CLUSTER_LABEL, KWOK_NODE_KEY, KwokNodeClass, KwokNodeClassSpec, KwokProvider, KwokSettings, LAUNCH_TIME_ANNOTATION,
    NODE_CLAIM_ANNOTATION, NODE_CLAIM_UID_ANNOTATION,
};
use tenon_core::api::{
    NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassRef, NodePool, NodePoolSpec, NodeSelectorRequirement, Operator,
    labels,
};
use tenon_core::cloud::conformance::{self, Harness, RealTimePoll};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DynCloudProvider, Instance, InstanceState, InstanceType, LaunchOptions,
    OfferingKey,
};
use tenon_core::resources::ResourceName;

/// Every wait on the cluster: the API server and the kwok controller act in real time, so the tests ask
/// again every interval, and fail at the deadline (the conformance harness's polls too).
const POLL: RealTimePoll = RealTimePoll { deadline: Duration::from_secs(60), interval: Duration::from_millis(100) };

fn kubeconfig_path() -> String {
    std::env::var("KUBECONFIG").unwrap_or_else(|_| {
        panic!(
            "KUBECONFIG is not set: the kwok provider tests need a Kubernetes control plane with a kwok controller. \
             Start one with `eval \"$(scripts/peers/kube.sh start /tmp/kwokpeer)\"` (and stop it afterwards with \
             `scripts/peers/kube.sh stop /tmp/kwokpeer`)"
        )
    })
}

async fn config() -> Config {
    // The dependency stack enables rustls with two crypto back-ends; the process picks one, as `tenon run`
    // does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap()
}

async fn client() -> Client {
    Client::try_from(config().await).unwrap()
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A name no other test of this run, nor an earlier run against the same cluster, uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

fn settings(cluster: &str, delay: Duration) -> KwokSettings {
    let mut s = KwokSettings::new(cluster);
    s.registration_delay = delay;
    s
}

async fn provider(cluster: &str, delay: Duration) -> Arc<KwokProvider> {
    Arc::new(KwokProvider::new(client().await, KwokProvider::default_catalog(), settings(cluster, delay)))
}

fn class_ref() -> NodeClassRef {
    NodeClassRef { group: "tenon.dev".into(), kind: "KwokNodeClass".into(), name: "default".into() }
}

fn req(key: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement::new(key, Operator::In, values.iter().copied())
}

/// An unlaunched claim of pool `default` with a UID of its own.
fn claim(name: &str, requirements: Vec<NodeSelectorRequirement>) -> NodeClaim {
    let mut c =
        NodeClaim::new(name, NodeClaimSpec { requirements, node_class_ref: Some(class_ref()), ..Default::default() });
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.labels = Some([(labels::NODE_POOL.to_owned(), "default".to_owned())].into());
    c
}

fn launched(mut c: NodeClaim, provider_id: &str) -> NodeClaim {
    c.status = Some(NodeClaimStatus { provider_id: Some(provider_id.to_owned()), ..Default::default() });
    c
}

fn catalog_type(name: &str) -> InstanceType {
    KwokProvider::default_catalog().into_iter().find(|t| t.name == name).unwrap()
}

/// The Node `name`, once it exists (a plain loop: the conformance harness needs a `Send` future).
async fn node_exists(name: &str) -> Node {
    let nodes: Api<Node> = Api::all(client().await);
    let start = Instant::now();
    loop {
        if let Some(n) = nodes.get_opt(name).await.unwrap() {
            return n;
        }
        assert!(start.elapsed() < POLL.deadline, "Node/{name} does not exist after {:?}", POLL.deadline);
        POLL.between().await;
    }
}

async fn node_gone(name: &str) {
    let nodes: Api<Node> = Api::all(client().await);
    POLL.until(&format!("Node/{name} still exists"), async || {
        nodes.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

async fn delete_until_gone(p: &KwokProvider, c: &NodeClaim) {
    POLL.until(&format!("NodeClaim/{} still has an instance", c.name()), async || match p.delete(c).await {
        Ok(()) => None,
        Err(e) if e.is_not_found() => Some(()),
        Err(e) => panic!("delete failed: {e}"),
    })
    .await;
}

/// `i` as `get` and `list` report it once its Node exists.
fn running(i: &Instance) -> Instance {
    Instance { state: InstanceState::Running, ..i.clone() }
}

struct KwokHarness {
    provider: Arc<KwokProvider>,
    /// Instances created in another cluster, deleted when the suite is done.
    foreign: Mutex<Vec<(Arc<KwokProvider>, NodeClaim)>>,
}

#[async_trait]
impl Harness for KwokHarness {
    fn provider(&self) -> DynCloudProvider {
        self.provider.clone()
    }
    fn node_class_ref(&self) -> Option<NodeClassRef> {
        Some(class_ref())
    }
    /// The API server and the creating task run in real time: one poll interval between the suite's polls.
    async fn settle(&self) {
        POLL.between().await;
    }
    fn max_polls(&self) -> usize {
        POLL.max_polls()
    }
    async fn make_insufficient(&self, offering: &OfferingKey) -> bool {
        self.provider.exhaust_offering(offering.clone());
        true
    }
    /// A Node created by a provider of another cluster, once it exists.
    async fn create_foreign_instance(&self) -> Option<String> {
        let other = provider(&unique("kwok-foreign"), Duration::ZERO).await;
        let key = OfferingKey::new("c5.large", "us-east-1a", CapacityType::OnDemand);
        let c = conformance::pinned_claim(self, &key);
        let i = other.create(&c, &LaunchOptions::default()).await.unwrap();
        node_exists(c.name()).await;
        self.foreign.lock().unwrap().push((other, launched(c, &i.provider_id)));
        Some(i.provider_id)
    }
}

/// The suite twice, with Nodes created at once and after a delay. Both passes run in this one test: the
/// suite names its claims (and so the Nodes) `conformance-N`, and Nodes of those names left by an earlier
/// run against the same cluster are removed first.
#[tokio::test]
async fn the_provider_passes_the_conformance_suite() {
    let nodes: Api<Node> = Api::all(client().await);
    for n in nodes.list(&ListParams::default().labels(CLUSTER_LABEL)).await.unwrap() {
        let name = n.metadata.name.clone().unwrap();
        if name.starts_with("conformance-") {
            nodes.delete(&name, &DeleteParams::default()).await.unwrap();
            node_gone(&name).await;
        }
    }
    for delay in [Duration::ZERO, Duration::from_secs(1)] {
        let h = KwokHarness {
            provider: provider(&unique("kwok-conformance"), delay).await,
            foreign: Mutex::new(Vec::new()),
        };
        conformance::assert_conformance(&h).await;
        let foreign = std::mem::take(&mut *h.foreign.lock().unwrap());
        for (other, c) in foreign {
            delete_until_gone(&other, &c).await;
            node_gone(c.name()).await;
        }
    }
}

#[tokio::test]
async fn a_created_node_looks_registered_by_a_kubelet_and_the_kwok_controller_makes_it_ready() {
    let p = provider(&unique("kwok-shape"), Duration::from_secs(2)).await;
    let name = unique("shape");
    let c = claim(
        &name,
        vec![
            req(labels::INSTANCE_TYPE, &["m5.large"]),
            req(labels::ZONE, &["us-east-1b"]),
            req(labels::CAPACITY_TYPE, &["spot", "on-demand"]),
            req("example.com/team", &["ml"]),
        ],
    );
    let i = p.create(&c, &LaunchOptions::default()).await.unwrap();
    let it = catalog_type("m5.large");

    // The instance, at once: the cheapest compatible offering (spot), the type's capacity.
    assert_eq!(i.provider_id, format!("kwok://{}/us-east-1b/{name}", p.settings().cluster_name));
    assert_eq!(
        (i.instance_type.as_str(), i.zone.as_str(), i.capacity_type, i.state),
        ("m5.large", "us-east-1b", CapacityType::Spot, InstanceState::Pending)
    );
    assert_eq!(i.price, Some(it.offering("us-east-1b", CapacityType::Spot).unwrap().price));
    assert_eq!((&i.capacity, &i.allocatable), (&it.capacity, &it.allocatable()));
    assert_eq!((i.node_claim.as_deref(), i.node_pool.as_deref()), (Some(name.as_str()), Some("default")));
    assert_eq!(i.labels.get("karpenter.k8s.aws/instance-family").map(String::as_str), Some("m5"));
    assert_eq!(i.labels.get(labels::CAPACITY_TYPE).map(String::as_str), Some("spot"));
    assert!(!i.labels.contains_key(CLUSTER_LABEL), "bookkeeping labels stay off the claim: {:?}", i.labels);

    // Within the registration delay the Node does not exist yet, and the instance is pending.
    let nodes: Api<Node> = Api::all(client().await);
    assert!(nodes.get_opt(&name).await.unwrap().is_none(), "the Node appears only after the delay");
    assert_eq!(p.get(&i.provider_id).await.unwrap(), i);
    assert!(p.list().await.unwrap().contains(&i));

    let node = node_exists(&name).await;
    let node_labels = node.metadata.labels.clone().unwrap();
    let label = |k: &str| node_labels.get(k).map(String::as_str);
    for (k, v) in [
        (labels::NODE_POOL, "default"),
        ("example.com/team", "ml"),
        (labels::INSTANCE_TYPE, "m5.large"),
        (labels::ZONE, "us-east-1b"),
        (labels::CAPACITY_TYPE, "spot"),
        (labels::ARCH, "amd64"),
        (labels::OS, "linux"),
        (labels::HOSTNAME, name.as_str()),
        ("karpenter.k8s.aws/instance-family", "m5"),
        ("karpenter.k8s.aws/instance-cpu", "2"),
        (CLUSTER_LABEL, p.settings().cluster_name.as_str()),
    ] {
        assert_eq!(label(k), Some(v), "label {k}: {node_labels:?}");
    }
    let annotations = node.metadata.annotations.clone().unwrap();
    assert_eq!(annotations.get(KWOK_NODE_KEY).map(String::as_str), Some("fake"));
    assert_eq!(annotations.get(NODE_CLAIM_ANNOTATION), Some(&name));
    assert_eq!(annotations.get(NODE_CLAIM_UID_ANNOTATION), c.metadata.uid.as_ref());
    assert_eq!(annotations.get(LAUNCH_TIME_ANNOTATION), Some(&i.launch_time.to_string()));
    let spec = node.spec.clone().unwrap();
    assert_eq!(spec.provider_id.as_deref(), Some(i.provider_id.as_str()));
    assert!(
        spec.taints.iter().flatten().any(|t| t.key == labels::UNREGISTERED_TAINT && t.effect == "NoExecute"),
        "{:?}",
        spec.taints
    );
    let status = node.status.clone().unwrap();
    assert_eq!(status.capacity, Some(it.capacity.to_resource_list()));
    assert_eq!(status.allocatable, Some(it.allocatable().to_resource_list()));
    let cpu = status.allocatable.as_ref().and_then(|a| a.get("cpu")).cloned();
    assert_eq!(cpu, Some(Quantity("1930m".into())), "2 cores less the 70m kube-reserved");

    // The kwok controller plays the kubelet.
    POLL.until(&format!("Node/{name} is not Ready"), async || {
        let n = nodes.get(&name).await.unwrap();
        let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True").then_some(())
    })
    .await;
    assert_eq!(p.get(&i.provider_id).await.unwrap(), running(&i));

    // Delete removes the Node; then the instance is NotFound everywhere.
    let c = launched(c, &i.provider_id);
    p.delete(&c).await.unwrap();
    delete_until_gone(&p, &c).await;
    node_gone(&name).await;
    assert!(p.get(&i.provider_id).await.unwrap_err().is_not_found());
    assert!(p.delete(&c).await.unwrap_err().is_not_found());
    assert!(!p.list().await.unwrap().iter().any(|x| x.provider_id == i.provider_id));
}

#[tokio::test]
async fn creating_a_claim_again_returns_the_same_instance() {
    let p = provider(&unique("kwok-idem"), Duration::from_secs(1)).await;
    let name = unique("idem");
    let c = claim(&name, vec![req(labels::INSTANCE_TYPE, &["c5.large"])]);
    let first = p.create(&c, &LaunchOptions::default()).await.unwrap();
    assert_eq!(p.create(&c, &LaunchOptions::default()).await.unwrap(), first, "while the creation is pending");

    let mut impostor = c.clone();
    impostor.metadata.uid = Some(format!("other-uid-{name}"));
    let err = p.create(&impostor, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::Create { ref reason, .. } if reason == "NodeNameConflict"), "{err}");

    node_exists(&name).await;
    assert_eq!(p.create(&c, &LaunchOptions::default()).await.unwrap(), running(&first), "once the Node exists");
    let err = p.create(&impostor, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::Create { ref reason, .. } if reason == "NodeNameConflict"), "{err}");
    let listed: Vec<_> =
        p.list().await.unwrap().into_iter().filter(|i| i.node_claim.as_deref() == Some(&name)).collect();
    assert_eq!(listed, vec![running(&first)]);

    delete_until_gone(&p, &launched(c, &first.provider_id)).await;
    node_gone(&name).await;
}

#[tokio::test]
async fn a_restarted_provider_finds_the_instances_the_first_one_created() {
    let cluster = unique("kwok-restart");
    let first = provider(&cluster, Duration::ZERO).await;
    let mut created = Vec::new();
    for (n, reqs) in [
        (
            unique("restart"),
            vec![req(labels::INSTANCE_TYPE, &["g5.xlarge"]), req(labels::CAPACITY_TYPE, &["on-demand"])],
        ),
        (unique("restart"), vec![req(labels::ZONE, &["us-east-1c"])]),
    ] {
        let c = claim(&n, reqs);
        let i = first.create(&c, &LaunchOptions::default()).await.unwrap();
        created.push((launched(c, &i.provider_id), i));
    }
    for (c, _) in &created {
        node_exists(c.name()).await;
    }
    assert_eq!(created[0].1.capacity.get(ResourceName::NVIDIA_GPU), 1);
    assert_eq!((created[1].1.instance_type.as_str(), created[1].1.capacity_type), ("c5.large", CapacityType::Spot));
    drop(first);

    let restarted = provider(&cluster, Duration::ZERO).await;
    let mut listed = restarted.list().await.unwrap();
    listed.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
    let mut want: Vec<Instance> = created.iter().map(|(_, i)| running(i)).collect();
    want.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
    assert_eq!(listed, want, "rebuilt from the Nodes: type, zone, capacity, labels, launch time, price, claim");
    for (c, i) in &created {
        assert_eq!(restarted.get(&i.provider_id).await.unwrap(), running(i));
        delete_until_gone(&restarted, c).await;
        node_gone(c.name()).await;
    }
    assert!(restarted.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn another_clusters_nodes_are_invisible() {
    let mine = provider(&unique("kwok-mine"), Duration::ZERO).await;
    let theirs = provider(&unique("kwok-theirs"), Duration::ZERO).await;
    let name = unique("theirs");
    let c = claim(&name, vec![]);
    let i = theirs.create(&c, &LaunchOptions::default()).await.unwrap();
    node_exists(&name).await;
    let c = launched(c, &i.provider_id);

    assert!(mine.list().await.unwrap().is_empty());
    assert!(mine.get(&i.provider_id).await.unwrap_err().is_not_found());
    // The same node name and zone under this cluster's provider id: still theirs.
    let forged = i.provider_id.replace(&theirs.settings().cluster_name, &mine.settings().cluster_name);
    assert!(mine.get(&forged).await.unwrap_err().is_not_found());
    assert!(mine.delete(&c).await.unwrap_err().is_not_found());
    assert!(mine.delete(&launched(c.clone(), &forged)).await.unwrap_err().is_not_found());
    let unlaunched = claim(&name, vec![]);
    assert!(mine.delete(&unlaunched).await.unwrap_err().is_not_found());
    let err = mine.create(&unlaunched, &LaunchOptions::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::Create { ref reason, .. } if reason == "NodeNameConflict"), "{err}");

    assert_eq!(theirs.list().await.unwrap(), vec![running(&i)], "untouched");
    delete_until_gone(&theirs, &c).await;
    node_gone(&name).await;
}

#[tokio::test]
async fn a_node_held_only_by_the_termination_finalizer_counts_as_gone() {
    let p = provider(&unique("kwok-final"), Duration::ZERO).await;
    let name = unique("final");
    let c = claim(&name, vec![]);
    let i = p.create(&c, &LaunchOptions::default()).await.unwrap();
    let c = launched(c, &i.provider_id);
    node_exists(&name).await;
    let nodes: Api<Node> = Api::all(client().await);
    let finalizers = async |f: &[&str]| {
        let patch = serde_json::json!({"metadata": {"finalizers": f}});
        nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    };
    finalizers(&[labels::TERMINATION_FINALIZER, "example.com/hold"]).await;

    p.delete(&c).await.unwrap();
    assert_eq!(p.get(&i.provider_id).await.unwrap().state, InstanceState::Stopping);
    p.delete(&c).await.expect("still terminating while another finalizer holds the Node");

    finalizers(&[labels::TERMINATION_FINALIZER]).await;
    assert!(p.delete(&c).await.unwrap_err().is_not_found());
    assert!(p.get(&i.provider_id).await.unwrap_err().is_not_found());
    assert!(p.list().await.unwrap().is_empty());
    let held = nodes.get(&name).await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some(), "the Node itself waits for its finalizer");

    finalizers(&[]).await;
    node_gone(&name).await;
}

#[tokio::test]
async fn launches_avoid_unavailable_offerings_and_fail_with_insufficient_capacity() {
    // A long delay: these launches are cancelled before any Node is created.
    let p = provider(&unique("kwok-ice"), Duration::from_secs(600)).await;
    let pinned =
        |n: &str| claim(n, vec![req(labels::INSTANCE_TYPE, &["m5.large"]), req(labels::ZONE, &["us-east-1a"])]);
    let spot = OfferingKey::new("m5.large", "us-east-1a", CapacityType::Spot);
    let on_demand = OfferingKey::new("m5.large", "us-east-1a", CapacityType::OnDemand);

    let unknown = claim(&unique("ice"), vec![req(labels::INSTANCE_TYPE, &["x9.huge"])]);
    let err = p.create(&unknown, &Default::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::InsufficientCapacity { ref offerings, .. } if offerings.is_empty()), "{err}");
    let mut big = claim(&unique("ice"), vec![]);
    big.spec.resources.requests.insert("cpu".into(), Quantity("1000".into()));
    assert!(matches!(p.create(&big, &Default::default()).await.unwrap_err(), CloudError::InsufficientCapacity { .. }));

    let options = LaunchOptions { unavailable: vec![spot.clone()], ignore_unavailable: vec![] };
    let c = pinned(&unique("ice"));
    let i = p.create(&c, &options).await.unwrap();
    assert_eq!(i.capacity_type, CapacityType::OnDemand, "the core's unavailable offerings are avoided");
    delete_until_gone(&p, &launched(c, &i.provider_id)).await;

    p.exhaust_offering(spot.clone());
    p.exhaust_offering(on_demand.clone());
    match p.create(&pinned(&unique("ice")), &Default::default()).await.unwrap_err() {
        CloudError::InsufficientCapacity { offerings, .. } => assert_eq!(offerings, vec![spot.clone(), on_demand]),
        other => panic!("expected InsufficientCapacity, got {other}"),
    }
    p.restore_offering(&spot);
    let c = pinned(&unique("ice"));
    let i = p.create(&c, &Default::default()).await.unwrap();
    assert_eq!(i.capacity_type, CapacityType::Spot);
    delete_until_gone(&p, &launched(c.clone(), &i.provider_id)).await;
    assert!(Api::<Node>::all(client().await).get_opt(c.name()).await.unwrap().is_none(), "cancelled before creation");
}

#[tokio::test]
async fn refused_credentials_are_unauthorized() {
    let mut anonymous = config().await;
    anonymous.auth_info = Default::default();
    let p = KwokProvider::new(
        Client::try_from(anonymous).unwrap(),
        KwokProvider::default_catalog(),
        settings(&unique("kwok-anon"), Duration::ZERO),
    );
    assert!(matches!(p.list().await.unwrap_err(), CloudError::Unauthorized(_)));
    let err = p.get(&format!("kwok://{}/us-east-1a/x", p.settings().cluster_name)).await.unwrap_err();
    assert!(matches!(err, CloudError::Unauthorized(_)), "{err}");
    let err = p.create(&claim(&unique("anon"), vec![]), &Default::default()).await.unwrap_err();
    assert!(matches!(err, CloudError::Unauthorized(_)), "{err}");
}

#[tokio::test]
async fn the_provider_serves_kwok_node_classes_and_supports_no_reboot_nor_drift() {
    let p = provider(&unique("kwok-misc"), Duration::ZERO).await;
    assert_eq!(p.name(), "kwok");
    let d = p.descriptor();
    assert_eq!(d.node_classes.len(), 1);
    assert_eq!((d.node_classes[0].group.as_str(), d.node_classes[0].kind.as_str()), ("tenon.dev", "KwokNodeClass"));
    assert!(d.well_known_labels.contains(&"karpenter.k8s.aws/instance-family".to_owned()), "{:?}", d.well_known_labels);
    assert!(p.repair_policies().is_empty());
    let c = claim("never-launched", vec![]);
    assert_eq!(p.is_drifted(&c).await.unwrap(), None);
    assert!(matches!(p.reboot(&c).await.unwrap_err(), CloudError::Unsupported { .. }));
    let mut pool = NodePool::new("default", NodePoolSpec::default());
    pool.spec.template.spec.node_class_ref = Some(class_ref());
    assert_eq!(p.instance_types(&pool).await.unwrap(), KwokProvider::default_catalog());
}

/// The built-in catalog is rows of the AWS example catalog, unchanged: a handful of CPU types and GPU types,
/// spot and on-demand in several zones.
#[test]
fn the_default_catalog_is_taken_from_the_aws_example_catalog() {
    let aws =
        KwokProvider::catalog_from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/catalogs/aws-us-east-1.yaml"))
            .unwrap();
    let catalog = KwokProvider::default_catalog();
    let names: Vec<&str> = catalog.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["c5.large", "c5.xlarge", "m5.large", "m5.xlarge", "m5.2xlarge", "r5.large", "g5.xlarge", "g5.2xlarge"]
    );
    for t in &catalog {
        assert_eq!(Some(t), aws.iter().find(|a| a.name == t.name), "{} differs from the AWS catalog", t.name);
        for ct in [CapacityType::Spot, CapacityType::OnDemand] {
            assert_eq!(t.offerings.iter().filter(|o| o.capacity_type == ct).count(), 3, "{}", t.name);
        }
    }
    let gpus = catalog.iter().filter(|t| t.capacity.get(ResourceName::NVIDIA_GPU) > 0).count();
    assert_eq!(gpus, 2);
    assert!(catalog.iter().all(|t| t.allocatable() != t.capacity && t.allocatable().fits(&t.capacity)));
}

#[test]
fn a_catalog_file_without_instance_types_is_an_error() {
    let path = std::env::temp_dir().join(format!("kwok-empty-{}.yaml", std::process::id()));
    std::fs::write(&path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n").unwrap();
    let err = KwokProvider::catalog_from_file(&path).unwrap_err();
    assert!(err.to_string().contains("no InstanceCatalog"), "{err}");
    std::fs::remove_file(&path).unwrap();
    assert!(KwokProvider::catalog_from_file(&path).is_err(), "a missing file");
}

#[test]
fn the_node_class_crd_is_cluster_scoped_in_tenon_dev() {
    let crd = KwokNodeClass::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("kwoknodeclasses.tenon.dev"));
    assert_eq!((crd.spec.group.as_str(), crd.spec.scope.as_str()), ("tenon.dev", "Cluster"));
    assert_eq!(crd.spec.names.kind, "KwokNodeClass");
    assert_eq!(crd.spec.versions.len(), 1);
    assert_eq!(crd.spec.versions[0].name, "v1alpha1");
    assert!(crd.spec.versions[0].schema.is_some());
}

#[tokio::test]
async fn the_node_class_crd_installs_and_a_node_class_applies() {
    let client = client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = KwokNodeClass::crd();
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(&name, &PatchParams::apply("tenon-kwok-tests").force(), &Patch::Apply(&crd)).await.unwrap();
    POLL.until("the KwokNodeClass CRD is not established", async || {
        let c = crds.get(&name).await.unwrap();
        let conditions = c.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
    })
    .await;
    let classes: Api<KwokNodeClass> = Api::all(client);
    let class_name = unique("class");
    let class = KwokNodeClass::new(&class_name, KwokNodeClassSpec {});
    // Creating right after Established can still meet a 404 while the new API is wired up.
    let created = POLL
        .until("KwokNodeClass cannot be created", async || match classes.create(&PostParams::default(), &class).await {
            Ok(c) => Some(c),
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => panic!("creating the KwokNodeClass: {e}"),
        })
        .await;
    assert_eq!(created.spec, KwokNodeClassSpec {});
    let manifest = serde_json::json!({
        "apiVersion": "tenon.dev/v1alpha1", "kind": "KwokNodeClass", "metadata": {"name": unique("class")}, "spec": {}
    });
    let parsed: KwokNodeClass = serde_json::from_value(manifest).unwrap();
    classes.create(&PostParams::default(), &parsed).await.unwrap();
    for n in [class_name, parsed.metadata.name.clone().unwrap()] {
        classes.delete(&n, &DeleteParams::default()).await.unwrap();
    }
}

/// A Node still waiting out its registration delay when the process stopped is created by the restarted
/// provider's adoption hook, so its claim does not wait for the registration timeout.
#[tokio::test]
async fn a_restarted_provider_creates_the_nodes_an_interrupted_launch_left_unmade() {
    let cluster = unique("kwok-adopt");
    // The first process launches with a long registration delay, then dies before the Node is made.
    let first = provider(&cluster, Duration::from_secs(3600)).await;
    let name = unique("adopt");
    let c = claim(&name, vec![req(labels::CAPACITY_TYPE, &["on-demand"])]);
    let i = first.create(&c, &LaunchOptions::default()).await.unwrap();
    let mut c = launched(c, &i.provider_id);
    c.metadata.labels.get_or_insert_with(Default::default).extend(i.labels.clone());
    let restarted = provider(&cluster, Duration::ZERO).await;
    assert!(restarted.get(&i.provider_id).await.unwrap_err().is_not_found(), "no Node yet");
    restarted.adopt(std::slice::from_ref(&c)).await.unwrap();
    let node = node_exists(&name).await;
    assert_eq!(node.spec.as_ref().and_then(|s| s.provider_id.as_deref()), Some(i.provider_id.as_str()));
    assert_eq!(restarted.get(&i.provider_id).await.unwrap().instance_type, i.instance_type);
    // Adopting again changes nothing.
    restarted.adopt(std::slice::from_ref(&c)).await.unwrap();
    delete_until_gone(&restarted, &c).await;
    node_gone(&name).await;
    drop(first);
}
