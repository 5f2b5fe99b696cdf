//! A local fake of the Azure Resource Manager (ARM) subset the Azure provider uses, and of the Azure Retail
//! Prices API, checked against Microsoft's published models: the Python packages `azure-mgmt-compute` and
//! `azure-mgmt-network` (pinned in `scripts/peers/requirements.txt`), whose models and operations
//! `scripts/azure-arm-models.py` writes into one JSON document, found through `TENON_AZURE_MODELS`
//! (`scripts/test.sh` installs the packages into the test venv, runs the script and sets it).
//!
//! What it serves (every ARM call needs `Authorization: Bearer <token>`, else 401 `AuthenticationFailed`):
//! - `ResourceSkus_List` (`$filter=location eq '<location>'`), `World::page_size` SKUs a page, the next
//!   page's `nextLink` an absolute URL back to the fake with a `$skiptoken`;
//! - `CommunityGalleryImageVersions_List`, paged the same way, from `World::gallery_versions`;
//! - `NetworkInterfaces_{CreateOrUpdate,Get,Delete}`, all synchronous: a PUT answers 201 (200 when it
//!   replaces one) with the stored interface, `provisioningState` `Succeeded`, and every IP configuration's
//!   `privateIPAddress` assigned from 10.224.0.4 up; a DELETE answers 200, or 400 `NicInUse` while a VM
//!   holds the interface;
//! - `VirtualMachines_{CreateOrUpdate,Get,Delete,List,Restart}`: a PUT answers 201 (200 on update) with the
//!   VM `Creating` and an `Azure-AsyncOperation` header; the operation reports `InProgress` for
//!   `World::polls` polls and then `Succeeded` (the VM `Succeeded`, power state running) or, for an
//!   [`Fault::Async`], `Failed` (the VM left `Failed`, as Azure leaves it). A DELETE answers 202 with an
//!   operation, the VM `Deleting` until it ends; then the VM is gone with the OS disk and the interfaces
//!   whose `deleteOption` is `Delete` (the rest are detached). `$expand=instanceView` adds the instance
//!   view to a GET. Interfaces a VM names must exist (else 400 `InvalidResourceReference`);
//! - `Disks_Delete`, synchronous (200; 409 `OperationNotAllowed` while a VM holds the disk);
//! - the operations' status (`…/providers/Microsoft.Compute/locations/{location}/operations/{id}`);
//! - the Retail Prices API (`/api/retail/prices`, no ARM token), its `$filter` a conjunction of
//!   `<field> eq '<value>'` clauses, `World::price_page_size` items a page, `$skip` paging;
//! - a Service Bus queue under `/servicebus/<queue>` (receive with peek-lock, complete), the interruption
//!   queue's transport; see [`service_bus`].
//!
//! A GET of a missing resource is 404 `ResourceNotFound`, a DELETE of one 204, as ARM answers.
//!
//! How the shapes are checked: ARM requests are routed by the packages' own operations (HTTP method and
//! URL template, literal segments compared case-insensitively as ARM does); `api-version` must be the
//! package's for that operation (else 400 `MissingApiVersionParameter` / `InvalidApiVersionParameter`);
//! a query parameter the operation does not declare is refused (400 `InvalidParameter`; a paged operation
//! also takes the `$skiptoken` of its own `nextLink`s). A request body is validated against the
//! operation's request model and every answer against its response model (a page: the `value` of items
//! and `nextLink` the package's paging code reads), error answers against its error model. The models
//! are turned into JSON Schema: each model an object with no property beyond those it declares, required
//! what its annotation does not make Optional (read-only fields excepted), a closed enum enforced, an
//! extensible one (any string the service accepts) a string, `null` the value of no field, a polymorphic
//! model's subtype chosen by its discriminator. Read-only fields in a request body are allowed and
//! ignored, as ARM ignores them. A request ARM would refuse is a 400 naming the field, and an answer that
//! does not fit fails the test, so the fake cannot drift from the published models unnoticed.
//!
//! Shapes without a package model, checked against JSON Schemas written here from Microsoft's REST
//! documentation ([`check`] knows them by these names): `AzureAsyncOperationStatus`, what an
//! `Azure-AsyncOperation` URL answers (`name`, `status` `InProgress`/`Succeeded`/`Failed`/`Canceled`,
//! `startTime`, `endTime`, `error {code, message}`); `RetailPriceItem` and `RetailPricesPage`, the Retail
//! Prices API's items and pages (`BillingCurrency`, `CustomerEntityId`, `CustomerEntityType`, `Items`,
//! `NextPageLink`, `Count`). The Retail Prices API's `api-version` must be [`PRICES_API_VERSION`].
//!
//! State: [`World`]; VMs, interfaces and disks are keyed by (resource group, name) as the path writes them.
//! Faults ([`World::faults`]) are matched on a VM PUT; see [`FaultMatch`].

// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// The Retail Prices API version the fake serves.
pub(crate) const PRICES_API_VERSION: &str = "2023-01-01-preview";

/// The operation whose api-version the operations' status URLs carry.
const STATUS_API_OF: &str = "VirtualMachines_CreateOrUpdate";

/// The document `scripts/azure-arm-models.py` writes, loaded once from `TENON_AZURE_MODELS`.
fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = std::env::var("TENON_AZURE_MODELS").unwrap_or_else(|_| {
            panic!(
                "TENON_AZURE_MODELS is not set: the Azure tests check the fake against the models of azure-mgmt-compute \
                 and azure-mgmt-network. Run scripts/test.sh (it installs them into the venv, writes the models with \
                 scripts/azure-arm-models.py and sets it)"
            )
        });
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    })
}

/// The package's api-version of operation `op` (e.g. `VirtualMachines_Get`).
pub(crate) fn api_version(op: &str) -> String {
    document()["operations"][op]["apiVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("no operation {op} in TENON_AZURE_MODELS"))
        .to_owned()
}

/// A field's type, as the models document writes it, in JSON Schema.
fn schema_of(t: &Value) -> Value {
    if let Some(name) = t.get("$ref").and_then(Value::as_str) {
        return json!({"$ref": format!("#/definitions/{name}")});
    }
    let mut out = Map::new();
    match t.get("type").and_then(Value::as_str) {
        Some("array") => {
            out.insert("type".into(), json!("array"));
            out.insert("items".into(), schema_of(&t["items"]));
        }
        Some("object") => {
            out.insert("type".into(), json!("object"));
            out.insert("additionalProperties".into(), schema_of(&t["additionalProperties"]));
        }
        Some(kind) => {
            out.insert("type".into(), json!(kind));
            for k in ["enum", "format"] {
                if let Some(v) = t.get(k) {
                    out.insert(k.into(), v.clone());
                }
            }
        }
        None => {}
    }
    Value::Object(out)
}

/// A model as a closed JSON Schema object.
fn object_schema(model: &Value) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, t) in model["properties"].as_object().into_iter().flatten() {
        properties.insert(name.clone(), schema_of(t));
        if t["required"] == true && t["readOnly"] != true {
            required.push(json!(name));
        }
    }
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

/// The shapes without a package model, from Microsoft's REST documentation.
fn documented_schemas() -> [(&'static str, Value); 3] {
    let string = json!({"type": "string"});
    let time = json!({"type": "string", "format": "date-time"});
    let item_fields = [
        ("currencyCode", string.clone()),
        ("tierMinimumUnits", json!({"type": "number"})),
        ("retailPrice", json!({"type": "number"})),
        ("unitPrice", json!({"type": "number"})),
        ("armRegionName", string.clone()),
        ("location", string.clone()),
        ("effectiveStartDate", time.clone()),
        ("meterId", string.clone()),
        ("meterName", string.clone()),
        ("productId", string.clone()),
        ("skuId", string.clone()),
        ("productName", string.clone()),
        ("skuName", string.clone()),
        ("serviceName", string.clone()),
        ("serviceId", string.clone()),
        ("serviceFamily", string.clone()),
        ("unitOfMeasure", string.clone()),
        ("type", json!({"enum": ["Consumption", "Reservation", "DevTestConsumption"]})),
        ("isPrimaryMeterRegion", json!({"type": "boolean"})),
        ("armSkuName", string.clone()),
        ("reservationTerm", string.clone()),
        ("savingsPlan", json!({"type": "array"})),
    ];
    let optional = ["tierMinimumUnits", "reservationTerm", "savingsPlan"];
    let item = json!({
        "type": "object",
        "properties": item_fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect::<Map<String, Value>>(),
        "required": item_fields.iter().map(|(k, _)| *k).filter(|k| !optional.contains(k)).collect::<Vec<_>>(),
        "additionalProperties": false,
    });
    let page = json!({
        "type": "object",
        "properties": {
            "BillingCurrency": string, "CustomerEntityId": string, "CustomerEntityType": string,
            "Items": {"type": "array", "items": {"$ref": "#/definitions/RetailPriceItem"}},
            "NextPageLink": {"type": ["string", "null"]}, "Count": {"type": "integer"},
        },
        "required": ["BillingCurrency", "CustomerEntityId", "CustomerEntityType", "Items", "NextPageLink", "Count"],
        "additionalProperties": false,
    });
    let status = json!({
        "type": "object",
        "properties": {
            "id": string, "name": string, "startTime": time, "endTime": time,
            "status": {"enum": ["InProgress", "Succeeded", "Failed", "Canceled"]},
            "percentComplete": {"type": "number"},
            "error": {
                "type": "object",
                "properties": {"code": string, "message": string},
                "required": ["code", "message"],
                "additionalProperties": false,
            },
        },
        "required": ["name", "status", "startTime"],
        "additionalProperties": false,
    });
    [("RetailPriceItem", item), ("RetailPricesPage", page), ("AzureAsyncOperationStatus", status)]
}

/// Every model as a JSON Schema definition, and the shapes without one.
fn definitions() -> &'static Map<String, Value> {
    static DEFS: OnceLock<Map<String, Value>> = OnceLock::new();
    DEFS.get_or_init(|| {
        let models = document()["models"].as_object().expect("TENON_AZURE_MODELS: no models");
        let mut defs = Map::new();
        for (name, model) in models {
            let Some(d) = model.get("discriminator") else {
                defs.insert(name.clone(), object_schema(model));
                continue;
            };
            // A polymorphic model: the subtype its discriminator names, else the model itself.
            let own = format!("{name}.base");
            defs.insert(own.clone(), object_schema(model));
            let property = d["property"].as_str().unwrap_or_default();
            let mut chain = json!({"$ref": format!("#/definitions/{own}")});
            for (value, sub) in d["mapping"].as_object().into_iter().flatten().rev() {
                let sub = sub.as_str().unwrap_or_default();
                let target = if sub == name { own.clone() } else { sub.to_owned() };
                chain = json!({
                    "if": {"properties": {property: {"const": value}}, "required": [property]},
                    "then": {"$ref": format!("#/definitions/{target}")},
                    "else": chain,
                });
            }
            defs.insert(name.clone(), chain);
        }
        for (name, schema) in documented_schemas() {
            assert!(!defs.contains_key(name), "TENON_AZURE_MODELS has a model {name}, which the fake defines itself");
            defs.insert(name.into(), schema);
        }
        defs
    })
}

/// The validator of model `name`, compiled once.
fn validator(name: &str) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    cache
        .entry(name.to_owned())
        .or_insert_with(|| {
            assert!(definitions().contains_key(name), "no model {name} in TENON_AZURE_MODELS");
            let root = json!({"definitions": definitions(), "$ref": format!("#/definitions/{name}")});
            let v = jsonschema::options().should_validate_formats(true).build(&root);
            Arc::new(v.unwrap_or_else(|e| panic!("schema {name}: {e}")))
        })
        .clone()
}

/// Whether `value` fits model `name` (a package model, or one of the shapes the module docs list); the
/// errors otherwise.
pub(crate) fn check(name: &str, value: &Value) -> Result<(), String> {
    let v = validator(name);
    let errors: Vec<String> = v.iter_errors(value).map(|e| format!("{e} at {}", e.instance_path)).collect();
    if errors.is_empty() { Ok(()) } else { Err(format!("{name}: {}", errors.join("; "))) }
}

/// What a VM PUT should meet.
#[derive(Debug, Clone)]
pub(crate) enum Fault {
    /// The PUT answers this status and ARM error; nothing is created.
    Sync { status: u16, code: String, message: String },
    /// The VM is created, and its operation ends `Failed` with this error; the VM stays, `Failed`.
    Async { code: String, message: String },
    /// The PUT answers 429 `TooManyRequests` with this `Retry-After`.
    Throttled { retry_after_secs: u64 },
    /// The PUT answers 401 `AuthenticationFailed`, or (any other status) that status and
    /// `AuthorizationFailed`.
    Unauthorized { status: u16 },
}

/// Which VM PUTs a fault applies to: each field is matched exactly (case-insensitively), or `*` matches
/// anything. `size` is `properties.hardwareProfile.vmSize`; `zone` the first of `zones` (`""` for a VM
/// without zones); `priority` `properties.priority` (`Regular` when absent, else e.g. `Spot`).
#[derive(Debug, Clone)]
pub(crate) struct FaultMatch {
    pub size: String,
    pub zone: String,
    pub priority: String,
}

impl FaultMatch {
    pub(crate) fn new(size: &str, zone: &str, priority: &str) -> Self {
        Self { size: size.into(), zone: zone.into(), priority: priority.into() }
    }

    /// Every VM PUT.
    pub(crate) fn any() -> Self {
        Self::new("*", "*", "*")
    }

    fn matches(&self, size: &str, zone: &str, priority: &str) -> bool {
        let one = |want: &str, got: &str| want == "*" || want.eq_ignore_ascii_case(got);
        one(&self.size, size) && one(&self.zone, zone) && one(&self.priority, priority)
    }
}

/// A request as the fake received it.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub method: String,
    pub path: String,
    /// The raw query string (still percent-encoded).
    pub query: String,
    /// The body, when it is JSON.
    pub body: Option<Value>,
}

/// What an operation does when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// A VM PUT: the VM becomes `Succeeded` (or `Failed`).
    Put,
    /// A VM DELETE: the VM, and what it deletes with it, go.
    Delete,
    /// A VM restart.
    Restart,
}

/// A long-running operation.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub kind: OpKind,
    /// The VM's (resource group, name).
    pub vm: (String, String),
    /// Polls still answered `InProgress`.
    pub polls_left: u32,
    /// The error it ends with.
    pub error: Option<(String, String)>,
    pub start_time: String,
    /// Its end time, once it has ended.
    pub end_time: Option<String>,
}

/// The fake's world.
pub(crate) struct World {
    /// The fake's own base URL (what [`start`] returns), for `nextLink`s and operation URLs.
    pub endpoint: String,
    /// `ResourceSkus_List`'s SKUs; a location filter keeps those whose `locations` name it.
    pub skus: Vec<Value>,
    /// (gallery, image) → `CommunityGalleryImageVersion`s.
    pub gallery_versions: BTreeMap<(String, String), Vec<Value>>,
    /// Retail price items (see [`price_item`]).
    pub prices: Vec<Value>,
    /// (resource group, name) → VM, as stored (its `properties.instanceView` included).
    pub vms: BTreeMap<(String, String), Value>,
    /// (resource group, name) → network interface.
    pub nics: BTreeMap<(String, String), Value>,
    /// (resource group, name) → managed disk (`id`, `name`, `type`, `location`, `managedBy`), the OS disks
    /// the VMs were created with.
    pub disks: BTreeMap<(String, String), Value>,
    /// Faults, matched on VM PUTs in order; the first that matches applies, and is then removed unless its
    /// flag (sticky) is set.
    pub faults: Vec<(FaultMatch, Fault, bool)>,
    /// Every request, in order.
    pub requests: Vec<Recorded>,
    /// Operation id → operation.
    pub operations: BTreeMap<String, Op>,
    /// Items per page of the paged ARM lists (default 2).
    pub page_size: usize,
    /// Items per page of the Retail Prices API (default 100).
    pub price_page_size: usize,
    /// Polls an operation answers `InProgress` before it ends (default 2).
    pub polls: u32,
    /// Messages waiting in the Service Bus queue (`/servicebus/<queue>`), oldest first.
    pub queue: std::collections::VecDeque<String>,
    /// Messages received under a peek-lock and not deleted yet: lock URL path → body.
    pub locked: BTreeMap<String, String>,
    seq: u64,
    next_ip: u32,
}

impl Default for World {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            skus: Vec::new(),
            gallery_versions: BTreeMap::new(),
            prices: Vec::new(),
            vms: BTreeMap::new(),
            nics: BTreeMap::new(),
            disks: BTreeMap::new(),
            faults: Vec::new(),
            requests: Vec::new(),
            operations: BTreeMap::new(),
            page_size: 2,
            price_page_size: 100,
            polls: 2,
            queue: Default::default(),
            locked: BTreeMap::new(),
            seq: 0,
            next_ip: 4,
        }
    }
}

impl World {
    /// A fresh pseudo-random 64-bit number (deterministic per world).
    fn random(&mut self) -> u64 {
        self.seq += 1;
        let mut z = self.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uuid(&mut self) -> String {
        let (a, b) = (self.random(), self.random());
        uuid_of(a, b)
    }

    /// The VM PUTs' recorded bodies, in order.
    pub(crate) fn vm_puts(&self) -> Vec<&Value> {
        self.requests
            .iter()
            .filter(|r| {
                r.method == "PUT" && r.path.to_ascii_lowercase().contains("/microsoft.compute/virtualmachines/")
            })
            .filter_map(|r| r.body.as_ref())
            .collect()
    }
}

/// A UUID-shaped string of two numbers.
fn uuid_of(a: u64, b: u64) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// The fake server's shared state.
pub(crate) type Shared = Arc<Mutex<World>>;

/// An answer: status, headers, body.
struct Reply {
    status: StatusCode,
    headers: Vec<(String, String)>,
    body: Option<Value>,
}

impl Reply {
    fn json(status: StatusCode, body: Value) -> Self {
        Self { status, headers: Vec::new(), body: Some(body) }
    }

    fn empty(status: StatusCode) -> Self {
        Self { status, headers: Vec::new(), body: None }
    }

    fn header(mut self, name: &str, value: String) -> Self {
        self.headers.push((name.to_owned(), value));
        self
    }
}

/// An ARM error answer.
fn arm_error(status: StatusCode, code: &str, message: &str) -> Reply {
    Reply::json(status, json!({"error": {"code": code, "message": message}}))
}

fn not_found(kind: &str, rg: &str, name: &str) -> Reply {
    arm_error(
        StatusCode::NOT_FOUND,
        "ResourceNotFound",
        &format!("The Resource '{kind}/{name}' under resource group '{rg}' was not found."),
    )
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A query string of `params`.
fn query_string(params: &[(String, String)]) -> String {
    params.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect::<Vec<_>>().join("&")
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// The package operation of (`method`, `path`), with the path's parameters.
fn route(method: &Method, path: &str) -> Option<(&'static str, &'static Value, HashMap<String, String>)> {
    let segments: Vec<&str> = path.split('/').collect();
    for (id, op) in document()["operations"].as_object()? {
        if op["method"].as_str() != Some(method.as_str()) {
            continue;
        }
        let parts: Vec<&str> = op["path"].as_str().unwrap_or_default().split('/').collect();
        if parts.len() != segments.len() {
            continue;
        }
        let mut vars = HashMap::new();
        let ok =
            parts.iter().zip(&segments).all(|(t, s)| match t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                Some(var) => {
                    vars.insert(var.to_owned(), (*s).to_owned());
                    !s.is_empty()
                }
                None => t.eq_ignore_ascii_case(s),
            });
        if ok {
            return Some((id.as_str(), op, vars));
        }
    }
    None
}

/// The operations' status path: `/subscriptions/{s}/providers/Microsoft.Compute/locations/{l}/operations/{id}`.
fn status_route(method: &Method, path: &str) -> Option<String> {
    let s: Vec<&str> = path.split('/').collect();
    let lit = |i: usize, want: &str| s.get(i).is_some_and(|x| x.eq_ignore_ascii_case(want));
    let ok = *method == Method::GET
        && s.len() == 9
        && lit(1, "subscriptions")
        && lit(3, "providers")
        && lit(4, "Microsoft.Compute")
        && lit(5, "locations")
        && lit(7, "operations");
    ok.then(|| s[8].to_owned())
}

/// The one handler: records, authenticates, routes by the packages' operations, checks, answers.
pub(crate) async fn handle(
    State(world): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(params): Query<Vec<(String, String)>>,
    body: Bytes,
) -> Response {
    let parsed: Option<Value> = if body.is_empty() { None } else { serde_json::from_slice(&body).ok() };
    let mut w = world.lock().unwrap();
    w.requests.push(Recorded {
        method: method.to_string(),
        path: uri.path().to_owned(),
        query: uri.query().unwrap_or_default().to_owned(),
        body: parsed.clone(),
    });
    let path = uri.path();
    if path == "/api/retail/prices" && method == Method::GET {
        return respond(prices(&w, &params));
    }
    let token = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let authenticated = token.is_some_and(|t| !t.trim().is_empty());
    if let Some(rest) = path.strip_prefix("/servicebus/") {
        if !authenticated {
            return respond(unauthenticated());
        }
        return service_bus(&mut w, &method, rest);
    }

    if let Some(id) = status_route(&method, path) {
        if !authenticated {
            return respond(unauthenticated());
        }
        if let Err(reply) = check_query("operation status", &params, &api_version(STATUS_API_OF), &["api-version"]) {
            return respond(reply);
        }
        let reply = operation_status(&mut w, &id);
        if let Some(body) = &reply.body
            && reply.status == StatusCode::OK
            && let Err(e) = check("AzureAsyncOperationStatus", body)
        {
            panic!("the fake's operation status does not fit: {e}");
        }
        return respond(reply);
    }

    let Some((id, op, vars)) = route(&method, path) else {
        return respond(arm_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("the fake serves no operation for {method} {path}"),
        ));
    };
    let reply = 'reply: {
        if !authenticated {
            break 'reply unauthenticated();
        }
        let mut allowed: Vec<&str> = op["query"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        if op["paged"] == true {
            allowed.push("$skiptoken");
        }
        if let Err(reply) = check_query(id, &params, op["apiVersion"].as_str().unwrap_or_default(), &allowed) {
            break 'reply reply;
        }
        let request = match (op["request"].as_str(), &parsed) {
            (Some(model), Some(body)) => match check(model, body) {
                Ok(()) => body.clone(),
                Err(e) => {
                    break 'reply arm_error(StatusCode::BAD_REQUEST, "InvalidRequestContent", &format!("{id}: {e}"));
                }
            },
            (Some(model), None) => {
                break 'reply arm_error(
                    StatusCode::BAD_REQUEST,
                    "InvalidRequestContent",
                    &format!("{id}: the request body must be a JSON {model}"),
                );
            }
            (None, _) => Value::Null,
        };
        serve(&mut w, id, &vars, &params, path, request)
    };
    if let Some(body) = &reply.body {
        let model = if reply.status.is_success() { op["response"].as_str() } else { op["error"].as_str() };
        if let Some(model) = model
            && let Err(e) = check(model, body)
        {
            panic!("the fake's answer to {id} ({}) does not fit {model}: {e}", reply.status);
        }
    }
    respond(reply)
}

fn respond(reply: Reply) -> Response {
    let mut response = match reply.body {
        Some(body) => (reply.status, [("content-type", "application/json")], body.to_string()).into_response(),
        None => reply.status.into_response(),
    };
    for (name, value) in reply.headers {
        let name = axum::http::HeaderName::try_from(name).unwrap();
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

fn unauthenticated() -> Reply {
    arm_error(
        StatusCode::UNAUTHORIZED,
        "AuthenticationFailed",
        "Authentication failed. The 'Authorization' header is missing or is not a bearer token.",
    )
}

/// Checks `api-version` (it must be `want`) and that every parameter is one of `allowed`.
fn check_query(id: &str, params: &[(String, String)], want: &str, allowed: &[&str]) -> Result<(), Reply> {
    for (k, _) in params {
        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(k)) {
            return Err(arm_error(
                StatusCode::BAD_REQUEST,
                "InvalidParameter",
                &format!("{id}: unknown query parameter {k} (it takes {})", allowed.join(", ")),
            ));
        }
    }
    match param(params, "api-version") {
        None => Err(arm_error(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            &format!("{id}: the api-version query parameter (?api-version=) is required; it is {want}"),
        )),
        Some(v) if v != want => Err(arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidApiVersionParameter",
            &format!("{id}: the api-version '{v}' is not the package's; it is '{want}'"),
        )),
        Some(_) => Ok(()),
    }
}

/// One page of `items`, from the `$skiptoken` of the request, with a `nextLink` to the next.
fn page(endpoint: &str, path: &str, params: &[(String, String)], items: &[Value], size: usize) -> Result<Value, Reply> {
    let skip = match param(params, "$skiptoken") {
        None => 0,
        Some(t) => t.parse::<usize>().map_err(|_| {
            arm_error(StatusCode::BAD_REQUEST, "InvalidParameter", &format!("$skiptoken {t} is not one of the fake's"))
        })?,
    };
    let size = size.max(1);
    let start = skip.min(items.len());
    let end = (start + size).min(items.len());
    let mut out = json!({"value": items[start..end]});
    if end < items.len() {
        let mut next: Vec<(String, String)> =
            params.iter().filter(|(k, _)| !k.eq_ignore_ascii_case("$skiptoken")).cloned().collect();
        next.push(("$skiptoken".into(), end.to_string()));
        out["nextLink"] = json!(format!("{endpoint}{path}?{}", query_string(&next)));
    }
    Ok(out)
}

fn var(vars: &HashMap<String, String>, k: &str) -> String {
    vars.get(k).cloned().unwrap_or_default()
}

fn serve(
    w: &mut World,
    id: &str,
    vars: &HashMap<String, String>,
    params: &[(String, String)],
    path: &str,
    body: Value,
) -> Reply {
    let sub = var(vars, "subscriptionId");
    let rg = var(vars, "resourceGroupName");
    let page_of = |w: &World, items: &[Value]| match page(&w.endpoint, path, params, items, w.page_size) {
        Ok(v) => Reply::json(StatusCode::OK, v),
        Err(r) => r,
    };
    match id {
        "ResourceSkus_List" => {
            let location = match param(params, "$filter") {
                None => None,
                Some(f) => match eq_clause(f, "location") {
                    Some(l) => Some(l),
                    None => {
                        return arm_error(
                            StatusCode::BAD_REQUEST,
                            "InvalidParameter",
                            &format!("ResourceSkus_List: the fake filters only by location eq '<location>', not {f}"),
                        );
                    }
                },
            };
            let items: Vec<Value> = w
                .skus
                .iter()
                .filter(|s| {
                    location.as_ref().is_none_or(|l| {
                        s["locations"]
                            .as_array()
                            .is_some_and(|ls| ls.iter().any(|x| x.as_str().is_some_and(|x| x.eq_ignore_ascii_case(l))))
                    })
                })
                .cloned()
                .collect();
            page_of(w, &items)
        }
        "CommunityGalleryImageVersions_List" => {
            let key = (var(vars, "publicGalleryName"), var(vars, "galleryImageName"));
            match w.gallery_versions.get(&key) {
                Some(items) => {
                    let items = items.clone();
                    page_of(w, &items)
                }
                None => arm_error(
                    StatusCode::NOT_FOUND,
                    "ResourceNotFound",
                    &format!("Community gallery image '{}/{}' was not found.", key.0, key.1),
                ),
            }
        }
        "NetworkInterfaces_CreateOrUpdate" => nic_put(w, &sub, &rg, &var(vars, "networkInterfaceName"), body),
        "NetworkInterfaces_Get" => {
            let name = var(vars, "networkInterfaceName");
            match w.nics.get(&(rg.clone(), name.clone())) {
                Some(nic) => Reply::json(StatusCode::OK, nic.clone()),
                None => not_found("Microsoft.Network/networkInterfaces", &rg, &name),
            }
        }
        "NetworkInterfaces_Delete" => {
            let key = (rg, var(vars, "networkInterfaceName"));
            let Some(nic) = w.nics.get(&key) else { return Reply::empty(StatusCode::NO_CONTENT) };
            if let Some(vm) = nic["properties"]["virtualMachine"]["id"].as_str() {
                return arm_error(
                    StatusCode::BAD_REQUEST,
                    "NicInUse",
                    &format!(
                        "Network Interface {} is used by existing resource {vm}. In order to delete the network \
                         interface, it must be dissociated from the resource.",
                        nic["id"].as_str().unwrap_or_default()
                    ),
                );
            }
            w.nics.remove(&key);
            Reply::empty(StatusCode::OK)
        }
        "VirtualMachines_CreateOrUpdate" => vm_put(w, &sub, &rg, &var(vars, "vmName"), body),
        "VirtualMachines_Get" => {
            let name = var(vars, "vmName");
            match w.vms.get(&(rg.clone(), name.clone())) {
                Some(vm) => {
                    let expand = param(params, "$expand").is_some_and(|e| e.eq_ignore_ascii_case("instanceView"));
                    Reply::json(StatusCode::OK, if expand { vm.clone() } else { model_view(vm) })
                }
                None => not_found("Microsoft.Compute/virtualMachines", &rg, &name),
            }
        }
        "VirtualMachines_List" => {
            let items: Vec<Value> = w.vms.iter().filter(|((g, _), _)| *g == rg).map(|(_, vm)| model_view(vm)).collect();
            page_of(w, &items)
        }
        "VirtualMachines_Delete" => {
            let key = (rg, var(vars, "vmName"));
            let Some(vm) = w.vms.get_mut(&key) else { return Reply::empty(StatusCode::NO_CONTENT) };
            vm["properties"]["provisioningState"] = json!("Deleting");
            set_statuses(vm, &[status("ProvisioningState/deleting", "Info", "Deleting")]);
            let location = vm["location"].as_str().unwrap_or_default().to_owned();
            let url = start_op(w, &sub, &location, OpKind::Delete, key, None);
            Reply::empty(StatusCode::ACCEPTED).header("Azure-AsyncOperation", url.clone()).header("Location", url)
        }
        "VirtualMachines_Restart" => {
            let key = (rg, var(vars, "vmName"));
            let Some(vm) = w.vms.get(&key) else {
                return not_found("Microsoft.Compute/virtualMachines", &key.0, &key.1);
            };
            let location = vm["location"].as_str().unwrap_or_default().to_owned();
            let url = start_op(w, &sub, &location, OpKind::Restart, key, None);
            Reply::empty(StatusCode::ACCEPTED).header("Azure-AsyncOperation", url.clone()).header("Location", url)
        }
        "Disks_Delete" => {
            let key = (rg, var(vars, "diskName"));
            let Some(disk) = w.disks.get(&key) else { return Reply::empty(StatusCode::NO_CONTENT) };
            if let Some(vm) = disk["managedBy"].as_str() {
                return arm_error(
                    StatusCode::CONFLICT,
                    "OperationNotAllowed",
                    &format!("Disk {} is attached to VM {vm}.", key.1),
                );
            }
            w.disks.remove(&key);
            Reply::empty(StatusCode::OK)
        }
        other => arm_error(StatusCode::NOT_IMPLEMENTED, "NotImplemented", &format!("{other} is not faked")),
    }
}

/// The value of an OData `<field> eq '<value>'` clause of `filter` (a conjunction with `and`).
fn eq_clause(filter: &str, field: &str) -> Option<String> {
    clauses(filter).ok()?.into_iter().find(|(f, _)| f.eq_ignore_ascii_case(field)).map(|(_, v)| v)
}

/// The `<field> eq <value>` clauses of an OData conjunction; the value unquoted.
fn clauses(filter: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = filter.trim();
    while !rest.is_empty() {
        let (field, after) = rest.split_once(' ').ok_or_else(|| format!("cannot read {rest:?}"))?;
        let after = after.trim_start();
        let after = after
            .strip_prefix("eq ")
            .or_else(|| after.strip_prefix("Eq "))
            .ok_or_else(|| format!("only `eq` clauses are understood, not {rest:?}"))?
            .trim_start();
        let (value, tail) = if let Some(quoted) = after.strip_prefix('\'') {
            let end = quoted.find('\'').ok_or_else(|| format!("unterminated string in {rest:?}"))?;
            (quoted[..end].to_owned(), &quoted[end + 1..])
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_owned(), &after[end..])
        };
        out.push((field.to_owned(), value));
        let tail = tail.trim_start();
        rest = match tail.split_once(' ') {
            Some((and, more)) if and.eq_ignore_ascii_case("and") => more.trim_start(),
            _ if tail.is_empty() => "",
            _ => return Err(format!("only `and` joins clauses, not {tail:?}")),
        };
    }
    Ok(out)
}

/// A VM as a GET without `$expand` answers it: without the instance view.
fn model_view(vm: &Value) -> Value {
    let mut vm = vm.clone();
    if let Some(p) = vm["properties"].as_object_mut() {
        p.remove("instanceView");
    }
    vm
}

fn status(code: &str, level: &str, display: &str) -> Value {
    json!({"code": code, "level": level, "displayStatus": display, "time": now()})
}

fn set_statuses(vm: &mut Value, statuses: &[Value]) {
    vm["properties"]["instanceView"]["statuses"] = json!(statuses);
}

/// Starts an operation on VM `vm`; its status URL.
fn start_op(
    w: &mut World,
    sub: &str,
    location: &str,
    kind: OpKind,
    vm: (String, String),
    error: Option<(String, String)>,
) -> String {
    let id = w.uuid();
    let op = Op { kind, vm, polls_left: w.polls, error, start_time: now(), end_time: None };
    w.operations.insert(id.clone(), op);
    format!(
        "{}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}/operations/{id}?api-version={}",
        w.endpoint,
        api_version(STATUS_API_OF)
    )
}

fn operation_status(w: &mut World, id: &str) -> Reply {
    let Some(op) = w.operations.get_mut(id) else {
        return arm_error(StatusCode::NOT_FOUND, "ResourceNotFound", &format!("operation {id} was not found"));
    };
    if op.end_time.is_none() {
        if op.polls_left > 0 {
            op.polls_left -= 1;
            return Reply::json(
                StatusCode::OK,
                json!({"name": id, "status": "InProgress", "startTime": op.start_time}),
            );
        }
        op.end_time = Some(now());
        let op = op.clone();
        finish(w, &op);
    }
    let op = &w.operations[id];
    let mut out = json!({"name": id, "startTime": op.start_time, "endTime": op.end_time});
    match &op.error {
        Some((code, message)) => {
            out["status"] = json!("Failed");
            out["error"] = json!({"code": code, "message": message});
        }
        None => out["status"] = json!("Succeeded"),
    }
    Reply::json(StatusCode::OK, out)
}

/// What an operation does as it ends.
fn finish(w: &mut World, op: &Op) {
    match op.kind {
        OpKind::Put | OpKind::Restart => {
            let Some(vm) = w.vms.get_mut(&op.vm) else { return };
            if vm["properties"]["provisioningState"] == "Deleting" {
                return;
            }
            match &op.error {
                None => {
                    vm["properties"]["provisioningState"] = json!("Succeeded");
                    set_statuses(
                        vm,
                        &[
                            status("ProvisioningState/succeeded", "Info", "Provisioning succeeded"),
                            status("PowerState/running", "Info", "VM running"),
                        ],
                    );
                }
                Some((code, message)) => {
                    vm["properties"]["provisioningState"] = json!("Failed");
                    let mut failed =
                        status(&format!("ProvisioningState/failed/{code}"), "Error", "Provisioning failed");
                    failed["message"] = json!(message);
                    set_statuses(vm, &[failed]);
                }
            }
        }
        OpKind::Delete => {
            let Some(vm) = w.vms.remove(&op.vm) else { return };
            let props = &vm["properties"];
            let os = &props["storageProfile"]["osDisk"];
            if let Some(disk) = os["name"].as_str() {
                let key = (op.vm.0.clone(), disk.to_owned());
                if os["deleteOption"] == "Delete" {
                    w.disks.remove(&key);
                } else if let Some(d) = w.disks.get_mut(&key) {
                    d.as_object_mut().map(|d| d.remove("managedBy"));
                }
            }
            for nic in props["networkProfile"]["networkInterfaces"].as_array().into_iter().flatten() {
                let Some(key) = nic["id"].as_str().and_then(|i| find(&w.nics, i)) else { continue };
                if nic["properties"]["deleteOption"] == "Delete" {
                    w.nics.remove(&key);
                } else if let Some(n) = w.nics.get_mut(&key) {
                    n["properties"].as_object_mut().map(|p| p.remove("virtualMachine"));
                }
            }
        }
    }
}

/// The key of the resource with ARM id `id` in `map` (keys compared case-insensitively, as ARM does).
fn find(map: &BTreeMap<(String, String), Value>, id: &str) -> Option<(String, String)> {
    map.iter().find(|(_, v)| v["id"].as_str().is_some_and(|v| v.eq_ignore_ascii_case(id))).map(|(k, _)| k.clone())
}

fn nic_put(w: &mut World, sub: &str, rg: &str, name: &str, body: Value) -> Reply {
    let key = (rg.to_owned(), name.to_owned());
    let existing = w.nics.get(&key).cloned();
    if body["location"].as_str().is_none_or(str::is_empty) {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "LocationRequired",
            "The location property is required for this definition.",
        );
    }
    let id = format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/{name}");
    let etag = format!("W/\"{}\"", w.uuid());
    let mut nic = body;
    nic["id"] = json!(id);
    nic["name"] = json!(name);
    nic["type"] = json!("Microsoft.Network/networkInterfaces");
    nic["etag"] = json!(etag);
    if !nic["properties"].is_object() {
        nic["properties"] = json!({});
    }
    let old = existing.as_ref().map(|e| e["properties"].clone()).unwrap_or(Value::Null);
    let guid = match old["resourceGuid"].as_str() {
        Some(g) => g.to_owned(),
        None => w.uuid(),
    };
    let props = &mut nic["properties"];
    props["provisioningState"] = json!("Succeeded");
    props["resourceGuid"] = json!(guid);
    if let Some(vm) = old.get("virtualMachine") {
        props["virtualMachine"] = vm.clone();
    }
    let configs = props["ipConfigurations"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for (i, mut c) in configs.into_iter().enumerate() {
        let cname = c["name"].as_str().map_or_else(|| format!("ipconfig{}", i + 1), str::to_owned);
        c["name"] = json!(cname);
        c["id"] = json!(format!("{id}/ipConfigurations/{cname}"));
        c["etag"] = json!(etag);
        c["type"] = json!("Microsoft.Network/networkInterfaces/ipConfigurations");
        if !c["properties"].is_object() {
            c["properties"] = json!({});
        }
        let previous = old["ipConfigurations"]
            .as_array()
            .and_then(|cs| cs.iter().find(|p| p["name"] == json!(cname)))
            .and_then(|p| p["properties"]["privateIPAddress"].as_str())
            .map(str::to_owned);
        let p = &mut c["properties"];
        if p["privateIPAddress"].as_str().is_none() {
            let ip = previous.unwrap_or_else(|| {
                let n = w.next_ip;
                w.next_ip += 1;
                format!("10.224.{}.{}", n / 256, n % 256)
            });
            p["privateIPAddress"] = json!(ip);
        }
        for (k, v) in [("privateIPAllocationMethod", json!("Dynamic")), ("privateIPAddressVersion", json!("IPv4"))] {
            if p.get(k).is_none() {
                p[k] = v;
            }
        }
        if p.get("primary").is_none() {
            p["primary"] = json!(i == 0);
        }
        p["provisioningState"] = json!("Succeeded");
        out.push(c);
    }
    nic["properties"]["ipConfigurations"] = json!(out);
    w.nics.insert(key, nic.clone());
    Reply::json(if existing.is_some() { StatusCode::OK } else { StatusCode::CREATED }, nic)
}

fn vm_put(w: &mut World, sub: &str, rg: &str, name: &str, body: Value) -> Reply {
    let key = (rg.to_owned(), name.to_owned());
    let id = format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}");
    let props = &body["properties"];
    let size = props["hardwareProfile"]["vmSize"].as_str().unwrap_or_default().to_owned();
    let zone = body["zones"][0].as_str().unwrap_or_default().to_owned();
    let priority = props["priority"].as_str().unwrap_or("Regular").to_owned();

    let mut async_error = None;
    if let Some(i) = w.faults.iter().position(|(m, _, _)| m.matches(&size, &zone, &priority)) {
        let (_, fault, sticky) = w.faults[i].clone();
        if !sticky {
            w.faults.remove(i);
        }
        match fault {
            Fault::Sync { status, code, message } => {
                return arm_error(StatusCode::from_u16(status).expect("a fault's status"), &code, &message);
            }
            Fault::Throttled { retry_after_secs } => {
                return arm_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequests",
                    "The request is being throttled as the limit has been reached for operation type.",
                )
                .header("Retry-After", retry_after_secs.to_string());
            }
            Fault::Unauthorized { status: 401 } => {
                return arm_error(StatusCode::UNAUTHORIZED, "AuthenticationFailed", "Authentication failed.");
            }
            Fault::Unauthorized { status } => {
                return arm_error(
                    StatusCode::from_u16(status).expect("a fault's status"),
                    "AuthorizationFailed",
                    &format!(
                        "The client does not have authorization to perform action \
                         'Microsoft.Compute/virtualMachines/write' over scope '{id}'."
                    ),
                );
            }
            Fault::Async { code, message } => async_error = Some((code, message)),
        }
    }

    let existing = w.vms.get(&key).cloned();
    if existing.as_ref().is_some_and(|e| e["properties"]["provisioningState"] == "Deleting") {
        return arm_error(
            StatusCode::CONFLICT,
            "OperationNotAllowed",
            &format!("Operation 'PUT' is not allowed on VM '{name}' since the VM is marked for deletion."),
        );
    }
    let mut nics = Vec::new();
    for nic in props["networkProfile"]["networkInterfaces"].as_array().into_iter().flatten() {
        let nic_id = nic["id"].as_str().unwrap_or_default();
        let Some(nic_key) = find(&w.nics, nic_id) else {
            return arm_error(
                StatusCode::BAD_REQUEST,
                "InvalidResourceReference",
                &format!("Resource {nic_id} referenced by resource {id} was not found."),
            );
        };
        if let Some(holder) = w.nics[&nic_key]["properties"]["virtualMachine"]["id"].as_str()
            && !holder.eq_ignore_ascii_case(&id)
        {
            return arm_error(
                StatusCode::BAD_REQUEST,
                "NicInUse",
                &format!("Network Interface {nic_id} is used by existing resource {holder}."),
            );
        }
        nics.push(nic_key);
    }

    let location = body["location"].as_str().unwrap_or_default().to_owned();
    let mut vm = body;
    let old = existing.as_ref().map(|e| e["properties"].clone()).unwrap_or(Value::Null);
    vm["id"] = json!(id);
    vm["name"] = json!(name);
    vm["type"] = json!("Microsoft.Compute/virtualMachines");
    if !vm["properties"].is_object() {
        vm["properties"] = json!({});
    }
    let vm_id = match old["vmId"].as_str() {
        Some(v) => v.to_owned(),
        None => w.uuid(),
    };
    let created = old["timeCreated"].as_str().map_or_else(now, str::to_owned);
    let props = &mut vm["properties"];
    props["vmId"] = json!(vm_id);
    props["timeCreated"] = json!(created);
    props["provisioningState"] = json!(if existing.is_some() { "Updating" } else { "Creating" });
    props["instanceView"] = json!({});
    if !props["storageProfile"]["osDisk"].is_object() {
        props["storageProfile"]["osDisk"] = json!({"createOption": "FromImage"});
    }
    let old_disk = old["storageProfile"]["osDisk"]["name"].as_str().map(str::to_owned);
    let disk_name = match (props["storageProfile"]["osDisk"]["name"].as_str(), old_disk) {
        (Some(n), _) => n.to_owned(),
        (None, Some(n)) => n,
        (None, None) => format!("{name}_OsDisk_1_{:016x}{:016x}", w.random(), w.random()),
    };
    let disk_id = format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/disks/{disk_name}");
    let os = &mut vm["properties"]["storageProfile"]["osDisk"];
    os["name"] = json!(disk_name);
    os["managedDisk"]["id"] = json!(disk_id);
    set_statuses(
        &mut vm,
        &[status(
            if existing.is_some() { "ProvisioningState/updating" } else { "ProvisioningState/creating" },
            "Info",
            "Provisioning",
        )],
    );
    w.disks.insert(
        (rg.to_owned(), disk_name.clone()),
        json!({
            "id": disk_id, "name": disk_name, "type": "Microsoft.Compute/disks", "location": location,
            "managedBy": id,
        }),
    );
    for nic_key in nics {
        if let Some(n) = w.nics.get_mut(&nic_key) {
            n["properties"]["virtualMachine"] = json!({"id": id});
        }
    }
    let url = start_op(w, sub, &location, OpKind::Put, key.clone(), async_error);
    w.vms.insert(key, vm.clone());
    let status = if existing.is_some() { StatusCode::OK } else { StatusCode::CREATED };
    Reply::json(status, model_view(&vm)).header("Azure-AsyncOperation", url)
}

/// The Retail Prices API: the items every clause of `$filter` matches, a page from `$skip`.
fn prices(w: &World, params: &[(String, String)]) -> Reply {
    let allowed = ["api-version", "$filter", "$skip", "currencyCode", "meterRegion"];
    if let Err(reply) = check_query("Retail Prices", params, PRICES_API_VERSION, &allowed) {
        return reply;
    }
    let filter = match clauses(param(params, "$filter").unwrap_or_default()) {
        Ok(c) => c,
        Err(e) => return arm_error(StatusCode::BAD_REQUEST, "InvalidFilter", &format!("$filter: {e}")),
    };
    let fields: Vec<&str> = match &definitions()["RetailPriceItem"]["properties"] {
        Value::Object(p) => p.keys().map(String::as_str).collect(),
        _ => Vec::new(),
    };
    let mut want = Vec::new();
    for (field, value) in filter {
        // `priceType` is what the API calls an item's `type` in a filter.
        let field = if field.eq_ignore_ascii_case("priceType") { "type".to_owned() } else { field };
        let Some(field) = fields.iter().find(|f| f.eq_ignore_ascii_case(&field)) else {
            return arm_error(StatusCode::BAD_REQUEST, "InvalidFilter", &format!("$filter: no field {field}"));
        };
        want.push((*field, value));
    }
    let items: Vec<&Value> = w
        .prices
        .iter()
        .filter(|item| {
            want.iter().all(|(f, v)| match &item[*f] {
                Value::String(s) => s == v,
                other => serde_json::from_str::<Value>(v).is_ok_and(|x| x == *other),
            })
        })
        .collect();
    let skip = match param(params, "$skip").map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return arm_error(StatusCode::BAD_REQUEST, "InvalidSkip", "$skip must be a number"),
    };
    let size = w.price_page_size.max(1);
    let start = skip.min(items.len());
    let end = (start + size).min(items.len());
    let next = (end < items.len()).then(|| {
        let mut next: Vec<(String, String)> =
            params.iter().filter(|(k, _)| !k.eq_ignore_ascii_case("$skip")).cloned().collect();
        next.push(("$skip".into(), end.to_string()));
        format!("{}/api/retail/prices?{}", w.endpoint, query_string(&next))
    });
    let out = json!({
        "BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
        "Items": items[start..end], "NextPageLink": next, "Count": end - start,
    });
    if let Err(e) = check("RetailPricesPage", &out) {
        panic!("the fake's Retail Prices page does not fit: {e}");
    }
    Reply::json(StatusCode::OK, out)
}

/// A `ResourceSku` of a VM size: resource type `virtualMachines`, available in `location` (and `zones`
/// there), with `capabilities` (name, value), unrestricted.
pub(crate) fn sku(name: &str, family: &str, location: &str, zones: &[&str], caps: &[(&str, &str)]) -> Value {
    let capabilities: Vec<Value> = caps.iter().map(|(n, v)| json!({"name": n, "value": v})).collect();
    let sku = json!({
        "resourceType": "virtualMachines", "name": name, "tier": "Standard",
        "size": name.strip_prefix("Standard_").unwrap_or(name), "family": family, "locations": [location],
        "locationInfo": [{"location": location, "zones": zones, "zoneDetails": []}],
        "capabilities": capabilities, "restrictions": [],
    });
    check("ResourceSku", &sku).unwrap_or_else(|e| panic!("{e}"));
    sku
}

/// A Retail Prices API item: a Virtual Machines consumption price per hour in USD.
pub(crate) fn price_item(
    arm_sku: &str,
    region: &str,
    sku_name: &str,
    product_name: &str,
    meter_name: &str,
    price: f64,
) -> Value {
    let digest = arm_sku
        .bytes()
        .chain(region.bytes())
        .chain(meter_name.bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let item = json!({
        "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": region, "effectiveStartDate": "2024-01-01T00:00:00Z",
        "meterId": uuid_of(digest, digest.rotate_left(17)),
        "meterName": meter_name, "productId": "DZH318Z0BQ4L", "skuId": format!("DZH318Z0BQ4L/{:04X}", digest & 0xffff),
        "productName": product_name, "skuName": sku_name, "serviceName": "Virtual Machines",
        "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": "Consumption",
        "isPrimaryMeterRegion": true, "armSkuName": arm_sku,
    });
    check("RetailPriceItem", &item).unwrap_or_else(|e| panic!("{e}"));
    item
}

/// A `CommunityGalleryImageVersion` named `version`, in `location`.
pub(crate) fn gallery_version(gallery: &str, image: &str, version: &str, location: &str) -> Value {
    let v = json!({
        "name": version, "location": location,
        "type": "Microsoft.Compute/locations/communityGalleries/images/versions",
        "identifier": {"uniqueId": format!("/CommunityGalleries/{gallery}/Images/{image}/Versions/{version}")},
        "properties": {"publishedDate": "2024-01-01T00:00:00Z", "excludeFromLatest": false},
    });
    check("CommunityGalleryImageVersion", &v).unwrap_or_else(|e| panic!("{e}"));
    v
}

/// Service Bus's REST receive with peek-lock, as its runtime API documents it: `POST
/// <queue>/messages/head` answers 201 with the oldest message as its body, a `Location` header (the
/// message's lock URL) and `BrokerProperties` (`MessageId`, `LockToken`, `DeliveryCount`), or 204 when the
/// queue is empty; `DELETE <lock URL>` completes the message (200), 404 for a lock not held. (Service Bus
/// has no model in the packages; its shapes are these headers and a raw body.)
fn service_bus(w: &mut World, method: &Method, rest: &str) -> Response {
    let parts: Vec<&str> = rest.split('/').collect();
    match (method, parts.as_slice()) {
        (&Method::POST, [queue, "messages", "head"]) => {
            let Some(body) = w.queue.pop_front() else {
                return StatusCode::NO_CONTENT.into_response();
            };
            let (id, lock) = (w.uuid(), w.uuid());
            let lock_path = format!("/servicebus/{queue}/messages/{id}/{lock}");
            w.locked.insert(lock_path.clone(), body.clone());
            let broker = json!({"MessageId": id, "LockToken": lock, "DeliveryCount": 1, "SequenceNumber": w.seq});
            (
                StatusCode::CREATED,
                [
                    ("content-type", "application/json".to_owned()),
                    ("location", format!("{}{lock_path}", w.endpoint)),
                    ("brokerproperties", broker.to_string()),
                ],
                body,
            )
                .into_response()
        }
        (&Method::DELETE, [queue, "messages", id, lock]) => {
            let lock_path = format!("/servicebus/{queue}/messages/{id}/{lock}");
            match w.locked.remove(&lock_path) {
                Some(_) => StatusCode::OK.into_response(),
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A token credential that hands out one fixed token, for clients of the fake (which takes any bearer
/// token).
#[derive(Debug)]
pub(crate) struct StaticToken;

#[async_trait::async_trait]
impl azure_core::credentials::TokenCredential for StaticToken {
    async fn get_token(
        &self,
        _: &[&str],
        _: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<azure_core::credentials::AccessToken> {
        let expires = azure_core::time::OffsetDateTime::now_utc() + azure_core::time::Duration::hours(1);
        Ok(azure_core::credentials::AccessToken::new(azure_core::credentials::Secret::new("test-token"), expires))
    }
}

/// Starts the fake on a free port; its address and world.
pub(crate) async fn start() -> (String, Shared) {
    let world: Shared = Arc::default();
    let app = axum::Router::new().fallback(handle).with_state(world.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    world.lock().unwrap().endpoint = endpoint.clone();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (endpoint, world)
}
