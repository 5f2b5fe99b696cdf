//! A local fake of the Compute Engine REST subset the GCP provider uses (and of GKE's, for release
//! channels), checked against Google's discovery documents `compute.v1.json` and `container.v1.json`
//! (shipped in PyPI's `google-api-python-client`, installed in the test venv by `scripts/test.sh`, found
//! through `TENON_GCE_DISCOVERY`, GKE's beside it).
//!
//! How the shapes are checked: every request is routed by the discovery documents' own methods (HTTP
//! method and path template); a query parameter the method does not declare is refused; a request body is
//! validated against the method's request schema and every answer against its response schema, with the
//! discovery schemas turned into JSON Schema (`$ref`s resolved in one definitions map per document, and
//! no property beyond those a schema lists). A request the real API would refuse is a 400 naming the
//! field, and an answer that does not fit fails the test: the fake cannot drift from the API unnoticed.
//!
//! What it serves: `machineTypes.aggregatedList`, `acceleratorTypes.aggregatedList`, `zones.list` (every
//! zone a machine type is listed in, `UP` unless a test takes it down), `images.{get,list}`,
//! `regionInstanceTemplates.list`, `instances.{insert,get,aggregatedList,delete,reset}` and
//! `zoneOperations.get`, whose operations progress over polls (running, then done) and can end in any
//! error code a test asks for; and GKE's `projects.locations.getServerConfig` and
//! `projects.locations.clusters.get`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// The discovery documents, loaded once: Compute Engine's (`TENON_GCE_DISCOVERY`) and, beside it in the
/// same package, GKE's `container.v1.json` (its release channels and clusters).
fn documents() -> &'static [Value; 2] {
    static DOCS: OnceLock<[Value; 2]> = OnceLock::new();
    DOCS.get_or_init(|| {
        let path = std::env::var("TENON_GCE_DISCOVERY").unwrap_or_else(|_| {
            panic!(
                "TENON_GCE_DISCOVERY is not set: the GCP tests check the fake against Google's compute.v1.json. Run \
                 scripts/test.sh (it installs google-api-python-client into the venv and sets it)"
            )
        });
        let read = |path: &std::path::Path| -> Value {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let compute = std::path::PathBuf::from(&path);
        let container = compute.with_file_name("container.v1.json");
        [read(&compute), read(&container)]
    })
}

/// A discovery schema as JSON Schema.
fn convert(v: &Value) -> Value {
    let Value::Object(m) = v else { return v.clone() };
    let mut out = Map::new();
    for (k, x) in m {
        match k.as_str() {
            "$ref" => {
                out.insert("$ref".into(), json!(format!("#/definitions/{}", x.as_str().unwrap_or_default())));
            }
            "type" if x == "any" => {}
            "type" | "enum" => {
                out.insert(k.clone(), x.clone());
            }
            "properties" => {
                let props: Map<String, Value> = x
                    .as_object()
                    .map(|p| p.iter().map(|(name, s)| (name.clone(), convert(s))).collect())
                    .unwrap_or_default();
                out.insert(k.clone(), Value::Object(props));
            }
            "items" | "additionalProperties" => {
                out.insert(k.clone(), convert(x));
            }
            _ => {}
        }
    }
    if out.contains_key("properties") && !out.contains_key("additionalProperties") {
        out.insert("additionalProperties".into(), json!(false));
    }
    Value::Object(out)
}

/// The validator of schema `name` of discovery document `doc`, compiled once.
fn validator(doc: usize, name: &str) -> Arc<jsonschema::Validator> {
    static DEFS: OnceLock<[Value; 2]> = OnceLock::new();
    type Validators = HashMap<(usize, String), Arc<jsonschema::Validator>>;
    static CACHE: OnceLock<Mutex<Validators>> = OnceLock::new();
    let defs = DEFS.get_or_init(|| {
        documents().each_ref().map(|d| {
            let schemas = d["schemas"].as_object().expect("discovery schemas");
            Value::Object(schemas.iter().map(|(n, s)| (n.clone(), convert(s))).collect())
        })
    });
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    cache
        .entry((doc, name.to_owned()))
        .or_insert_with(|| {
            let root = json!({"definitions": &defs[doc], "$ref": format!("#/definitions/{name}")});
            Arc::new(jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("schema {name}: {e}")))
        })
        .clone()
}

/// Whether `value` fits Compute Engine's schema `name`; the errors otherwise.
pub(crate) fn check(name: &str, value: &Value) -> Result<(), String> {
    check_in(0, name, value)
}

fn check_in(doc: usize, name: &str, value: &Value) -> Result<(), String> {
    let v = validator(doc, name);
    let errors: Vec<String> = v.iter_errors(value).map(|e| format!("{} at {}", e, e.instance_path)).collect();
    if errors.is_empty() { Ok(()) } else { Err(format!("{name}: {}", errors.join("; "))) }
}

/// One discovery method, matched to a request.
struct DiscoveryMethod {
    /// The document it is of (0: Compute Engine, 1: GKE).
    doc: usize,
    id: String,
    params: Vec<String>,
    request: Option<String>,
    response: Option<String>,
}

/// Every method of a discovery resource tree, nested resources included.
fn methods(resources: &'static Value, out: &mut Vec<&'static Value>) {
    for resource in resources.as_object().into_iter().flat_map(|r| r.values()) {
        out.extend(resource["methods"].as_object().into_iter().flat_map(|m| m.values()));
        methods(&resource["resources"], out);
    }
}

/// The discovery method of (`http`, `path`), with the path's parameters.
fn route(http: &Method, path: &str) -> Option<(DiscoveryMethod, HashMap<String, String>)> {
    for (doc_index, doc) in documents().iter().enumerate() {
        let service = doc["servicePath"].as_str().unwrap_or_default();
        let Some(path) = path.trim_start_matches('/').strip_prefix(service) else { continue };
        let segments: Vec<&str> = path.split('/').collect();
        let mut all = Vec::new();
        methods(&doc["resources"], &mut all);
        for m in all {
            if m["httpMethod"].as_str() != Some(http.as_str()) {
                continue;
            }
            let template = m["flatPath"].as_str().or(m["path"].as_str()).unwrap_or_default();
            let parts: Vec<&str> = template.split('/').collect();
            if parts.len() != segments.len() {
                continue;
            }
            let mut vars = HashMap::new();
            let ok =
                parts.iter().zip(&segments).all(|(t, s)| match t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                    Some(var) => {
                        vars.insert(var.to_owned(), (*s).to_owned());
                        true
                    }
                    None => t == s,
                });
            if ok {
                let schema = |k: &str| m[k]["$ref"].as_str().map(str::to_owned);
                return Some((
                    DiscoveryMethod {
                        doc: doc_index,
                        id: m["id"].as_str().unwrap_or_default().to_owned(),
                        params: m["parameters"].as_object().map(|p| p.keys().cloned().collect()).unwrap_or_default(),
                        request: schema("request"),
                        response: schema("response"),
                    },
                    vars,
                ));
            }
        }
    }
    None
}

/// What a launch of (machine type, zone) should fail with.
#[derive(Debug, Clone)]
pub(crate) enum Fault {
    /// The operation ends with this `error.errors[].code` and message.
    Operation(String, String),
    /// The insert call itself answers this HTTP status.
    Http(u16),
}

/// An operation: its zone, the polls before it is done, the error it ends with, and what it says now.
pub(crate) type Op = (String, u32, Option<(String, String)>, Value);

/// The fake's world.
#[derive(Default)]
pub(crate) struct World {
    /// zone → machine types listed there.
    pub machine_types: BTreeMap<String, Vec<Value>>,
    /// zone → accelerator types listed there.
    pub accelerator_types: BTreeMap<String, Vec<Value>>,
    /// `project/name` → image.
    pub images: HashMap<String, Value>,
    /// (zone, name) → instance.
    pub instances: BTreeMap<(String, String), Value>,
    /// operation name → (zone, polls left before done, error).
    pub operations: HashMap<String, Op>,
    /// (machine type or `*`, zone or `*`) → fault.
    pub faults: Vec<(String, String, Fault)>,
    /// Every insert body, in order.
    pub inserted: Vec<Value>,
    /// GKE's server config of the cluster's location (`projects.locations.getServerConfig`).
    pub gke_server_config: Option<Value>,
    /// GKE clusters by name (`projects.locations.clusters.get`).
    pub gke_clusters: HashMap<String, Value>,
    /// region → instance templates.
    pub templates: BTreeMap<String, Vec<Value>>,
    /// Zones `zones.list` answers `DOWN` (every other zone of a machine type is `UP`).
    pub zones_down: BTreeSet<String>,
    seq: u64,
}

/// The fake server's shared state.
pub(crate) type Shared = Arc<Mutex<World>>;

fn answer(status: StatusCode, body: Value) -> Response {
    (status, [("content-type", "application/json")], body.to_string()).into_response()
}

fn error(status: StatusCode, reason: &str, message: &str) -> Response {
    answer(
        status,
        json!({"error": {"code": status.as_u16(), "message": message, "errors": [{"reason": reason, "message": message, "domain": "global"}]}}),
    )
}

/// The one handler: routes by the discovery document, checks, answers from the world.
pub(crate) async fn handle(
    State(world): State<Shared>,
    method: Method,
    uri: Uri,
    Query(params): Query<Vec<(String, String)>>,
    body: Bytes,
) -> Response {
    let Some((m, vars)) = route(&method, uri.path()) else {
        return error(StatusCode::NOT_FOUND, "notFound", &format!("no discovery method for {method} {}", uri.path()));
    };
    // The document's own system parameters (`alt`, `fields`, `prettyPrint`, …) go with every method, also
    // written with Google's `$` prefix (`$alt`), as does `$apiVersion`, which Google's clients pin the API
    // version with.
    let system = documents()[m.doc]["parameters"].as_object();
    for (k, _) in &params {
        let bare = k.strip_prefix('$').unwrap_or(k);
        let known = m.params.contains(k) || system.is_some_and(|s| s.contains_key(bare)) || k == "$apiVersion";
        if !known {
            return error(StatusCode::BAD_REQUEST, "invalidParameter", &format!("{}: unknown parameter {k}", m.id));
        }
    }
    let request: Value =
        if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    if let Some(schema) = &m.request
        && let Err(e) = check_in(m.doc, schema, &request)
    {
        return error(StatusCode::BAD_REQUEST, "invalid", &format!("{}: {e}", m.id));
    }
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (status, out) = serve(&world, &m.id, &vars, param("filter"), request);
    if status == StatusCode::OK
        && let Some(schema) = &m.response
        && let Err(e) = check_in(m.doc, schema, &out)
    {
        panic!("the fake's answer to {} does not fit {schema}: {e}", m.id);
    }
    answer(status, out)
}

/// A 404 as Compute Engine answers one.
fn not_found(what: &str) -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"error": {"code": 404, "message": format!("{what} not found"), "errors": [{"reason": "notFound", "message": "not found"}]}}),
    )
}

fn operation(w: &mut World, zone: &str, target: &str, kind: &str, err: Option<(String, String)>, polls: u32) -> Value {
    w.seq += 1;
    let name = format!("operation-{}", w.seq);
    let op = json!({
        "kind": "compute#operation", "id": w.seq.to_string(), "name": name, "zone": format!("zones/{zone}"),
        "operationType": kind, "targetLink": target, "status": "RUNNING", "progress": 0,
        "insertTime": "2026-12-01T00:00:00.000-07:00",
    });
    w.operations.insert(name, (zone.to_owned(), polls, err, op.clone()));
    op
}

/// An aggregated list of zonal `items` (zone → entries) as Compute Engine answers one: the zones of the
/// region the filter (`zone eq .*<region>-.*`, as the provider filters) names, each with its `field`.
fn zonal_list(items: &BTreeMap<String, Vec<Value>>, filter: Option<&str>, field: &str, kind: &str) -> Value {
    let region = filter.and_then(|f| f.strip_prefix("zone eq .*")).and_then(|r| r.strip_suffix("-.*"));
    let items: Map<String, Value> = items
        .iter()
        .filter(|(z, _)| region.is_none_or(|r| z.starts_with(&format!("{r}-"))))
        .map(|(z, entries)| (format!("zones/{z}"), json!({ field: entries })))
        .collect();
    json!({"kind": format!("compute#{kind}AggregatedList"), "id": format!("projects/test/aggregated/{field}"), "items": items})
}

fn serve(
    world: &Shared,
    id: &str,
    vars: &HashMap<String, String>,
    filter: Option<String>,
    body: Value,
) -> (StatusCode, Value) {
    let mut w = world.lock().unwrap();
    let var = |k: &str| vars.get(k).cloned().unwrap_or_default();
    match id {
        "compute.machineTypes.aggregatedList" => {
            (StatusCode::OK, zonal_list(&w.machine_types, filter.as_deref(), "machineTypes", "machineType"))
        }
        "container.projects.locations.getServerConfig" => match &w.gke_server_config {
            Some(c) => (StatusCode::OK, c.clone()),
            None => not_found("server config"),
        },
        "container.projects.locations.clusters.get" => match w.gke_clusters.get(&var("clustersId")) {
            Some(c) => (StatusCode::OK, c.clone()),
            None => not_found("cluster"),
        },
        "compute.zones.list" => {
            // `name eq <region>-.*`, as the provider filters.
            let prefix = filter.as_deref().and_then(|f| f.strip_prefix("name eq ")).and_then(|f| f.strip_suffix(".*"));
            let items: Vec<Value> = w
                .machine_types
                .keys()
                .filter(|z| prefix.is_none_or(|p| z.starts_with(p)))
                .map(|z| {
                    let region = z.rsplit_once('-').map_or(z.as_str(), |(r, _)| r);
                    let status = if w.zones_down.contains(z) { "DOWN" } else { "UP" };
                    json!({
                        "kind": "compute#zone", "name": z, "status": status,
                        "region": format!("https://www.googleapis.com/compute/v1/projects/{}/regions/{region}", var("project")),
                    })
                })
                .collect();
            (StatusCode::OK, json!({"kind": "compute#zoneList", "id": "zones", "items": items}))
        }
        "compute.acceleratorTypes.aggregatedList" => {
            (StatusCode::OK, zonal_list(&w.accelerator_types, filter.as_deref(), "acceleratorTypes", "acceleratorType"))
        }
        "compute.images.list" => {
            // `name eq <prefix>.*`, as the provider filters.
            let prefix = filter.as_deref().and_then(|f| f.strip_prefix("name eq ")).and_then(|f| f.strip_suffix(".*"));
            let project = format!("{}/", var("project"));
            let items: Vec<Value> = w
                .images
                .iter()
                .filter(|(k, i)| {
                    k.starts_with(&project)
                        && prefix.is_none_or(|p| i["name"].as_str().is_some_and(|n| n.starts_with(p)))
                })
                .map(|(_, i)| i.clone())
                .collect();
            (StatusCode::OK, json!({"kind": "compute#imageList", "id": "images", "items": items}))
        }
        "compute.images.get" => match w.images.get(&format!("{}/{}", var("project"), var("image"))) {
            Some(i) => (StatusCode::OK, i.clone()),
            None => not_found("image"),
        },
        "compute.instances.insert" => {
            let zone = var("zone");
            let name = body["name"].as_str().unwrap_or_default().to_owned();
            let machine =
                body["machineType"].as_str().unwrap_or_default().rsplit('/').next().unwrap_or_default().to_owned();
            w.inserted.push(body.clone());
            let fault = w
                .faults
                .iter()
                .find(|(t, z, _)| (t == "*" || *t == machine) && (z == "*" || *z == zone))
                .map(|(_, _, f)| f.clone());
            if let Some(Fault::Http(code)) = fault {
                let status = StatusCode::from_u16(code).unwrap();
                return (
                    status,
                    json!({"error": {"code": code, "message": "injected", "errors": [{"reason": "injected", "message": "injected"}]}}),
                );
            }
            if w.instances.contains_key(&(zone.clone(), name.clone())) {
                return (
                    StatusCode::CONFLICT,
                    json!({"error": {"code": 409, "message": "already exists", "errors": [{"reason": "alreadyExists", "message": "already exists"}]}}),
                );
            }
            let err = match fault {
                Some(Fault::Operation(code, message)) => Some((code, message)),
                _ => None,
            };
            if err.is_none() {
                let mut inst = body.clone();
                inst["kind"] = json!("compute#instance");
                inst["id"] = json!(format!("{}", 1000 + w.seq));
                inst["zone"] =
                    json!(format!("https://www.googleapis.com/compute/v1/projects/{}/zones/{zone}", var("project")));
                inst["machineType"] = json!(format!(
                    "https://www.googleapis.com/compute/v1/projects/{}/zones/{zone}/machineTypes/{machine}",
                    var("project")
                ));
                inst["status"] = json!("PROVISIONING");
                inst["creationTimestamp"] = json!("2026-12-01T00:00:00.000-07:00");
                w.instances.insert((zone.clone(), name.clone()), inst);
            }
            let target = format!("projects/{}/zones/{zone}/instances/{name}", var("project"));
            (StatusCode::OK, operation(&mut w, &zone, &target, "insert", err, 1))
        }
        "compute.zoneOperations.get" => {
            let Some((zone, polls, err, op)) = w.operations.get(&var("operation")).cloned() else {
                return not_found("operation");
            };
            let mut op = op;
            if polls == 0 {
                op["status"] = json!("DONE");
                op["progress"] = json!(100);
                if let Some((code, message)) = &err {
                    op["error"] = json!({"errors": [{"code": code, "message": message}]});
                    op["httpErrorStatusCode"] = json!(400);
                }
            }
            w.operations.insert(var("operation"), (zone, polls.saturating_sub(1), err, op.clone()));
            (StatusCode::OK, op)
        }
        "compute.instances.get" => match w.instances.get(&(var("zone"), var("instance"))) {
            Some(i) => {
                let mut i = i.clone();
                if i["status"] == "PROVISIONING" {
                    i["status"] = json!("RUNNING");
                }
                (StatusCode::OK, i)
            }
            None => not_found("instance"),
        },
        "compute.instances.aggregatedList" => {
            // `labels.<key> = <value>`, as the provider filters.
            let want = filter.as_deref().and_then(|f| f.strip_prefix("labels.")).and_then(|f| f.split_once(" = "));
            let mut items: Map<String, Value> = Map::new();
            for ((zone, _), i) in &w.instances {
                if want.is_some_and(|(k, v)| i["labels"][k].as_str() != Some(v)) {
                    continue;
                }
                let entry = items.entry(format!("zones/{zone}")).or_insert_with(|| json!({"instances": []}));
                entry["instances"].as_array_mut().unwrap().push(i.clone());
            }
            (
                StatusCode::OK,
                json!({"kind": "compute#instanceAggregatedList", "id": "projects/test/aggregated/instances", "items": items}),
            )
        }
        "compute.regionInstanceTemplates.list" => {
            let items = w.templates.get(&var("region")).cloned().unwrap_or_default();
            (StatusCode::OK, json!({"kind": "compute#instanceTemplateList", "id": "templates", "items": items}))
        }
        "compute.instances.delete" | "compute.instances.reset" => {
            let key = (var("zone"), var("instance"));
            if !w.instances.contains_key(&key) {
                return not_found("instance");
            }
            if id == "compute.instances.delete" {
                w.instances.remove(&key);
            }
            let target = format!("projects/{}/zones/{}/instances/{}", var("project"), key.0, key.1);
            let kind = id.rsplit('.').next().unwrap_or_default().to_owned();
            (StatusCode::OK, operation(&mut w, &key.0, &target, &kind, None, 0))
        }
        other => (
            StatusCode::NOT_IMPLEMENTED,
            json!({"error": {"code": 501, "message": format!("{other} is not faked"), "errors": []}}),
        ),
    }
}

/// Starts the fake on a free port; its address and world.
pub(crate) async fn start() -> (String, Shared) {
    let world: Shared = Arc::default();
    let app = axum::Router::new().fallback(handle).with_state(world.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), world)
}
