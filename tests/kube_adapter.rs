//! The kube-rs port's error paths that a real API server does not produce on demand, on kube-rs's
//! `tower-test` mock service: a storm of 409s on a claim's write, 429 on eviction (a PDB refusing) with
//! the server's retry-after, and a watch the server resets with 410 Gone, after which the store holds
//! the fresh list.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions unwrap too

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::events::Reporter;
use serde_json::{Value, json};
use tenon::kube::KubeCluster;
use tenon_core::api::{NodeClaim, NodeClaimSpec};
use tenon_core::cluster::{ApiErrorKind, Cluster};
use tower_test::mock::{self, Handle, SendResponse};

type Mock = Handle<Request<Body>, Response<Body>>;

/// What the mock API server answers to one request: a status and a JSON body, or nothing yet (a watch
/// left open).
enum Answer {
    Json(StatusCode, Value),
    Hold,
}

fn status(code: u16, reason: &str, message: &str, retry_after: Option<u32>) -> Value {
    let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    if let Some(r) = retry_after {
        s["details"] = json!({"retryAfterSeconds": r});
    }
    s
}

/// An empty list of any kind, at resourceVersion 1.
fn empty_list() -> Value {
    json!({"metadata": {"resourceVersion": "1"}, "items": []})
}

/// Serves `mock` with `answer` until the client goes away; requests `answer` holds stay open. Every
/// request's method and path-and-query is recorded in `log`.
fn serve(
    mut mock: Mock,
    log: Arc<Mutex<Vec<String>>>,
    mut answer: impl FnMut(&Request<Body>) -> Answer + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut held: Vec<SendResponse<Response<Body>>> = Vec::new();
        while let Some((request, send)) = mock.next_request().await {
            let uri = request.uri().path_and_query().map(ToString::to_string).unwrap_or_default();
            log.lock().unwrap().push(format!("{} {uri}", request.method()));
            match answer(&request) {
                Answer::Json(code, body) => {
                    let response = Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap();
                    send.send_response(response);
                }
                Answer::Hold => held.push(send),
            }
        }
    })
}

fn is_watch(request: &Request<Body>) -> bool {
    request.uri().query().is_some_and(|q| q.contains("watch=true"))
}

/// A cluster port over a mock service answering every list empty and holding every watch, except what
/// `special` answers first.
fn cluster_with(
    mut special: impl FnMut(&Request<Body>) -> Option<Answer> + Send + 'static,
) -> (KubeCluster, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let (service, mock) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let log = Arc::new(Mutex::new(Vec::new()));
    let server = serve(mock, log.clone(), move |r| {
        if let Some(a) = special(r) {
            return a;
        }
        if is_watch(r) { Answer::Hold } else { Answer::Json(StatusCode::OK, empty_list()) }
    });
    let cluster = KubeCluster::start(client, Reporter { controller: "tenon".into(), instance: None });
    (cluster, log, server)
}

fn claim(name: &str, resource_version: &str) -> NodeClaim {
    let mut c = NodeClaim::new(name, NodeClaimSpec::default());
    c.metadata.resource_version = Some(resource_version.to_owned());
    c
}

/// Every write of a claim meets a conflict: each is reported as `Conflict` (the runtime retries the
/// claim after a second, with a fresh read), never as gone, and nothing is retried inside the port.
#[tokio::test]
async fn a_storm_of_conflicts_is_reported_as_conflicts_and_never_as_gone() {
    let (cluster, log, _server) = cluster_with(|r| {
        (r.method() == http::Method::PATCH).then(|| {
            let body = status(409, "Conflict", "the object has been modified; please apply your changes", None);
            Answer::Json(StatusCode::CONFLICT, body)
        })
    });
    tokio::time::timeout(Duration::from_secs(10), cluster.wait_synced()).await.expect("the stores sync");
    for i in 0..20 {
        let e = cluster.patch_claim(&claim("c1", &i.to_string())).await.unwrap_err();
        assert_eq!(e.kind, ApiErrorKind::Conflict, "{e}");
        assert!(e.object.contains("NodeClaim/c1"), "{e}");
        let e = cluster.patch_claim_status(&claim("c1", &i.to_string())).await.unwrap_err();
        assert_eq!(e.kind, ApiErrorKind::Conflict, "{e}");
    }
    let patches = log.lock().unwrap().iter().filter(|l| l.starts_with("PATCH")).count();
    assert_eq!(patches, 40, "one request per write");
    // A create that finds the name taken is AlreadyExists, not a conflict to retry.
    let (cluster, _, _server) = cluster_with(|r| {
        (r.method() == http::Method::POST && !is_watch(r)).then(|| {
            Answer::Json(StatusCode::CONFLICT, status(409, "AlreadyExists", "nodeclaims \"c1\" already exists", None))
        })
    });
    tokio::time::timeout(Duration::from_secs(10), cluster.wait_synced()).await.expect("the stores sync");
    let e = cluster.create_claim(&claim("c1", "1")).await.unwrap_err();
    assert_eq!(e.kind, ApiErrorKind::AlreadyExists, "{e}");
}

/// An eviction a PDB refuses answers 429: the port says `TooManyRequests` with the server's
/// retry-after; a pod already gone answers 404, `NotFound`, the only error that means gone.
#[tokio::test]
async fn an_eviction_refused_with_429_is_retried_later_and_404_means_gone() {
    let (cluster, log, _server) = cluster_with(|r| {
        let path = r.uri().path();
        if r.method() != http::Method::POST || !path.ends_with("/eviction") {
            return None;
        }
        Some(if path.contains("/pods/web-0/") {
            let body = status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                Some(10),
            );
            Answer::Json(StatusCode::TOO_MANY_REQUESTS, body)
        } else {
            Answer::Json(StatusCode::NOT_FOUND, status(404, "NotFound", "pods \"web-1\" not found", None))
        })
    });
    tokio::time::timeout(Duration::from_secs(10), cluster.wait_synced()).await.expect("the stores sync");
    let e = cluster.evict_pod("shop/web-0").await.unwrap_err();
    assert_eq!(e.kind, ApiErrorKind::TooManyRequests, "{e}");
    assert_eq!(e.retry_after, Some(Duration::from_secs(10)));
    let e = cluster.evict_pod("shop/web-1").await.unwrap_err();
    assert_eq!(e.kind, ApiErrorKind::NotFound, "{e}");
    let evictions: Vec<String> = log.lock().unwrap().iter().filter(|l| l.contains("/eviction")).cloned().collect();
    assert_eq!(evictions.len(), 2, "{evictions:?}");
    assert!(evictions[0].starts_with("POST /api/v1/namespaces/shop/pods/web-0/eviction"), "{evictions:?}");
}

/// The server resets the pods watch with 410 Gone (the resourceVersion expired): the watcher lists
/// again, and the snapshot holds the fresh list, not the stale one.
#[tokio::test]
async fn a_watch_reset_with_410_gone_relists_and_the_snapshot_follows() {
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "shop", "resourceVersion": "5"},
            "spec": {"containers": [{"name": "c", "image": "x", "env": [{"name": "SECRET", "value": "s"}]}]}})
    };
    let mut pod_lists = 0;
    let mut pod_watches = 0;
    let (cluster, log, _server) = cluster_with(move |r| {
        if r.uri().path() != "/api/v1/pods" {
            return None;
        }
        if !is_watch(r) {
            pod_lists += 1;
            let items = if pod_lists == 1 { vec![pod("old")] } else { vec![pod("new")] };
            return Some(Answer::Json(StatusCode::OK, json!({"metadata": {"resourceVersion": "5"}, "items": items})));
        }
        pod_watches += 1;
        if pod_watches > 1 {
            return Some(Answer::Hold);
        }
        // A watch that opens, then reports its resourceVersion too old.
        let gone = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version: 5 (9)", None)});
        Some(Answer::Json(StatusCode::OK, gone))
    });
    tokio::time::timeout(Duration::from_secs(10), cluster.wait_synced()).await.expect("the stores sync");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let changes = cluster.changes();
    loop {
        let pods = cluster.snapshot().pods.clone();
        if pods.contains_key("shop/new") {
            assert!(!pods.contains_key("shop/old"), "the stale pod stays: {:?}", pods.keys());
            // The store keeps no more of a pod than the decisions read.
            assert!(pods["shop/new"].spec.as_ref().unwrap().containers[0].env.is_none());
            break;
        }
        // Woken by the next watch event, or failed at the deadline.
        let woken = tokio::time::timeout_at(deadline, changes.notified()).await;
        assert!(woken.is_ok(), "no re-list after the reset: {:?}", log.lock().unwrap());
    }
    let lists =
        log.lock().unwrap().iter().filter(|l| l.starts_with("GET /api/v1/pods?") && !l.contains("watch=true")).count();
    assert_eq!(lists, 2, "one list, then one after the reset: {:?}", log.lock().unwrap());
}

/// The snapshot carries what termination and affinity read of the objects it watches: each Namespace's
/// labels, and each attached VolumeAttachment's node and PersistentVolume (an unattached one is left out).
#[tokio::test]
async fn namespaces_and_volume_attachments_reach_the_snapshot() {
    let (cluster, _log, _server) = cluster_with(|r| {
        let list = |items: Value| {
            Some(Answer::Json(StatusCode::OK, json!({"metadata": {"resourceVersion": "1"}, "items": items})))
        };
        if is_watch(r) {
            return None;
        }
        match r.uri().path() {
            "/api/v1/namespaces" => list(json!([
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "data", "labels": {"team": "data"}}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "plain"}}
            ])),
            "/apis/storage.k8s.io/v1/volumeattachments" => list(json!([
                {"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "csi-a"},
                 "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv-a"}},
                 "status": {"attached": true}},
                {"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "csi-b"},
                 "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv-b"}},
                 "status": {"attached": false}}
            ])),
            _ => None,
        }
    });
    tokio::time::timeout(Duration::from_secs(10), cluster.wait_synced()).await.expect("the stores sync");
    let snapshot = cluster.snapshot();
    assert_eq!(snapshot.namespaces["data"].get("team").map(String::as_str), Some("data"));
    assert!(snapshot.namespaces["plain"].is_empty());
    let attached: Vec<(&str, &str, Option<&str>)> = snapshot
        .volume_attachments
        .iter()
        .map(|(name, a)| (name.as_str(), a.node.as_str(), a.persistent_volume.as_deref()))
        .collect();
    assert_eq!(attached, [("csi-a", "n1", Some("pv-a"))]);
}
