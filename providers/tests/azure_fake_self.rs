//! The Azure Resource Manager fake (`azure/fake.rs`) against itself: its shape checks refuse what the
//! published models refuse, and its resources and operations behave as the provider's tests rely on.
#![cfg(feature = "azure")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "azure/fake.rs"]
mod fake;

use serde_json::{Value, json};

const SUB: &str = "00000000-0000-0000-0000-000000000001";
const RG: &str = "tenon-rg";
const LOCATION: &str = "eastus2";

struct Client {
    endpoint: String,
    http: reqwest::Client,
}

impl Client {
    fn new(endpoint: &str) -> Self {
        Self { endpoint: endpoint.to_owned(), http: reqwest::Client::new() }
    }

    /// An ARM call to `path` (relative to the endpoint, or an absolute URL) with a bearer token.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let url = if path.starts_with("http") { path.to_owned() } else { format!("{}{path}", self.endpoint) };
        let mut req = self.http.request(method, url).bearer_auth("test-token");
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let value = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap() };
        (status, headers, value)
    }
}

fn vm_path(name: &str) -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}?api-version={}",
        fake::api_version("VirtualMachines_CreateOrUpdate")
    )
}

fn nic_path(name: &str) -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/networkInterfaces/{name}?api-version={}",
        fake::api_version("NetworkInterfaces_CreateOrUpdate")
    )
}

fn nic_body() -> Value {
    json!({
        "location": LOCATION,
        "properties": {"ipConfigurations": [{"name": "ipconfig1", "properties": {
            "subnet": {"id": format!(
                "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes"
            )},
        }}]},
    })
}

fn vm_body(nic_id: &str) -> Value {
    json!({
        "location": LOCATION,
        "zones": ["1"],
        "tags": {"tenon.sh/nodepool": "default"},
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_D2s_v5"},
            "priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1.0},
            "storageProfile": {
                "imageReference": {"communityGalleryImageId": "/CommunityGalleries/g/Images/i/Versions/1.0.0"},
                "osDisk": {
                    "createOption": "FromImage", "deleteOption": "Delete",
                    "managedDisk": {"storageAccountType": "Premium_LRS"},
                },
            },
            "osProfile": {
                "computerName": "node-1", "adminUsername": "azureuser",
                "linuxConfiguration": {"disablePasswordAuthentication": true},
            },
            "networkProfile": {"networkInterfaces": [
                {"id": nic_id, "properties": {"primary": true, "deleteOption": "Delete"}},
            ]},
        },
    })
}

#[tokio::test]
async fn fixtures_are_checked_against_the_models() {
    let sku = fake::sku("Standard_D2s_v5", "standardDSv5Family", LOCATION, &["1", "2", "3"], &[("vCPUs", "2")]);
    fake::check("ResourceSku", &sku).unwrap();
    let mut bad = sku.clone();
    bad["vcpus"] = json!(2);
    let err = fake::check("ResourceSku", &bad).unwrap_err();
    assert!(err.contains("vcpus"), "{err}");
    let mut mistyped = sku;
    mistyped["locationInfo"][0]["zones"] = json!("1");
    assert!(fake::check("ResourceSku", &mistyped).is_err());
    fake::price_item("Standard_D2s_v5", LOCATION, "D2s v5", "Virtual Machines Dsv5 Series", "D2s v5", 0.096);
}

#[tokio::test]
async fn requests_are_refused_as_arm_refuses_them() {
    let (endpoint, world) = fake::start().await;
    let c = Client::new(&endpoint);
    let nic = c.call(reqwest::Method::PUT, &nic_path("n1"), Some(&nic_body())).await;
    assert_eq!(nic.0, 201, "{}", nic.2);
    let nic_id = nic.2["id"].as_str().unwrap().to_owned();

    // A field the model does not have.
    let mut body = vm_body(&nic_id);
    body["properties"]["hardwareProfile"]["vmSku"] = json!("Standard_D2s_v5");
    let (status, _, err) = c.call(reqwest::Method::PUT, &vm_path("vm1"), Some(&body)).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["code"], "InvalidRequestContent");
    assert!(err["error"]["message"].as_str().unwrap().contains("vmSku"), "{err}");
    // A mistyped one.
    let mut body = vm_body(&nic_id);
    body["properties"]["billingProfile"]["maxPrice"] = json!("-1");
    let (status, _, err) = c.call(reqwest::Method::PUT, &vm_path("vm1"), Some(&body)).await;
    assert_eq!(status, 400);
    assert!(err["error"]["message"].as_str().unwrap().contains("/properties/billingProfile/maxPrice"), "{err}");

    // The wrong api-version, and a missing one.
    let wrong = vm_path("vm1").replace(&fake::api_version("VirtualMachines_Get"), "2020-01-01");
    let (status, _, err) = c.call(reqwest::Method::GET, &wrong, None).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["code"], "InvalidApiVersionParameter");
    assert!(err["error"]["message"].as_str().unwrap().contains("2020-01-01"), "{err}");
    let bare = vm_path("vm1").split('?').next().unwrap().to_owned();
    assert_eq!(c.call(reqwest::Method::GET, &bare, None).await.2["error"]["code"], "MissingApiVersionParameter");
    // An unknown query parameter.
    let (status, _, err) = c.call(reqwest::Method::GET, &format!("{}&$top=3", vm_path("vm1")), None).await;
    assert_eq!(status, 400, "{err}");

    // No token.
    let resp = reqwest::Client::new().get(format!("{endpoint}{}", vm_path("vm1"))).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "AuthenticationFailed");

    // A NIC that does not exist.
    let missing = nic_id.replace("/n1", "/n9");
    let (status, _, err) = c.call(reqwest::Method::PUT, &vm_path("vm1"), Some(&vm_body(&missing))).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["code"], "InvalidResourceReference");
    assert!(world.lock().unwrap().vms.is_empty());
}

#[tokio::test]
async fn a_vm_is_created_polled_and_deleted() {
    let (endpoint, world) = fake::start().await;
    let c = Client::new(&endpoint);
    let (_, _, nic) = c.call(reqwest::Method::PUT, &nic_path("n1"), Some(&nic_body())).await;
    assert_eq!(nic["properties"]["provisioningState"], "Succeeded");
    assert_eq!(nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"], "10.224.0.4");
    let nic_id = nic["id"].as_str().unwrap().to_owned();

    let (status, headers, vm) = c.call(reqwest::Method::PUT, &vm_path("vm1"), Some(&vm_body(&nic_id))).await;
    assert_eq!(status, 201, "{vm}");
    assert_eq!(vm["properties"]["provisioningState"], "Creating");
    assert!(vm["properties"]["vmId"].is_string());
    let disk = vm["properties"]["storageProfile"]["osDisk"]["name"].as_str().unwrap().to_owned();
    assert!(disk.starts_with("vm1_OsDisk_1_"), "{disk}");
    assert!(world.lock().unwrap().disks.contains_key(&(RG.to_owned(), disk.clone())));
    let op = headers["azure-asyncoperation"].to_str().unwrap().to_owned();
    assert!(op.starts_with(&format!(
        "{endpoint}/subscriptions/{SUB}/providers/Microsoft.Compute/locations/{LOCATION}/operations/"
    )));
    for _ in 0..2 {
        assert_eq!(c.call(reqwest::Method::GET, &op, None).await.2["status"], "InProgress");
    }
    let (_, _, done) = c.call(reqwest::Method::GET, &op, None).await;
    assert_eq!(done["status"], "Succeeded", "{done}");
    let (_, _, vm) = c.call(reqwest::Method::GET, &format!("{}&$expand=instanceView", vm_path("vm1")), None).await;
    assert_eq!(vm["properties"]["provisioningState"], "Succeeded");
    let statuses = vm["properties"]["instanceView"]["statuses"].as_array().unwrap();
    assert!(statuses.iter().any(|s| s["code"] == "PowerState/running"), "{vm}");
    // The request the provider sent is recorded.
    assert_eq!(world.lock().unwrap().vm_puts()[0]["properties"]["priority"], "Spot");

    // A NIC a VM holds is not deleted.
    assert_eq!(c.call(reqwest::Method::DELETE, &nic_path("n1"), None).await.0, 400);

    let (status, headers, _) = c.call(reqwest::Method::DELETE, &vm_path("vm1"), None).await;
    assert_eq!(status, 202);
    let op = headers["azure-asyncoperation"].to_str().unwrap().to_owned();
    let (_, _, vm) = c.call(reqwest::Method::GET, &vm_path("vm1"), None).await;
    assert_eq!(vm["properties"]["provisioningState"], "Deleting");
    for _ in 0..3 {
        c.call(reqwest::Method::GET, &op, None).await;
    }
    let w = world.lock().unwrap();
    assert!(w.vms.is_empty() && w.nics.is_empty() && w.disks.is_empty());
}

#[tokio::test]
async fn faults_apply_to_matching_puts() {
    let (endpoint, world) = fake::start().await;
    let c = Client::new(&endpoint);
    let (_, _, nic) = c.call(reqwest::Method::PUT, &nic_path("n1"), Some(&nic_body())).await;
    let nic_id = nic["id"].as_str().unwrap().to_owned();
    {
        let mut w = world.lock().unwrap();
        w.faults.push((
            fake::FaultMatch::new("Standard_D2s_v5", "1", "Regular"),
            fake::Fault::Sync { status: 409, code: "Never".into(), message: "regular only".into() },
            true,
        ));
        w.faults.push((fake::FaultMatch::any(), fake::Fault::Throttled { retry_after_secs: 7 }, false));
        w.faults.push((
            fake::FaultMatch::new("*", "1", "Spot"),
            fake::Fault::Async { code: "SkuNotAvailable".into(), message: "no capacity".into() },
            false,
        ));
    }
    let (status, headers, err) = c.call(reqwest::Method::PUT, &vm_path("vm1"), Some(&vm_body(&nic_id))).await;
    assert_eq!((status, err["error"]["code"].as_str()), (429, Some("TooManyRequests")));
    assert_eq!(headers["retry-after"], "7");
    let (status, headers, _) = c.call(reqwest::Method::PUT, &vm_path("vm1"), Some(&vm_body(&nic_id))).await;
    assert_eq!(status, 201);
    let op = headers["azure-asyncoperation"].to_str().unwrap().to_owned();
    let mut last = Value::Null;
    for _ in 0..3 {
        last = c.call(reqwest::Method::GET, &op, None).await.2;
    }
    assert_eq!(last["status"], "Failed");
    assert_eq!(last["error"]["code"], "SkuNotAvailable");
    let (_, _, vm) = c.call(reqwest::Method::GET, &vm_path("vm1"), None).await;
    assert_eq!(vm["properties"]["provisioningState"], "Failed");
    assert_eq!(world.lock().unwrap().faults.len(), 1, "the sticky fault stays");
}

#[tokio::test]
async fn missing_resources_and_paging() {
    let (endpoint, world) = fake::start().await;
    let c = Client::new(&endpoint);
    let (status, _, err) = c.call(reqwest::Method::GET, &vm_path("nope"), None).await;
    assert_eq!((status, err["error"]["code"].as_str()), (404, Some("ResourceNotFound")));
    assert_eq!(c.call(reqwest::Method::DELETE, &vm_path("nope"), None).await.0, 204);
    assert_eq!(c.call(reqwest::Method::DELETE, &nic_path("nope"), None).await.0, 204);
    let disk = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/disks/nope?api-version={}",
        fake::api_version("Disks_Delete")
    );
    assert_eq!(c.call(reqwest::Method::DELETE, &disk, None).await.0, 204);

    {
        let mut w = world.lock().unwrap();
        for (i, name) in ["Standard_D2s_v5", "Standard_D4s_v5", "Standard_D8s_v5"].iter().enumerate() {
            w.skus.push(fake::sku(name, "standardDSv5Family", LOCATION, &["1"], &[("vCPUs", &(2 << i).to_string())]));
        }
        w.skus.push(fake::sku("Standard_D2s_v5", "standardDSv5Family", "westus", &[], &[]));
        w.price_page_size = 2;
        for region in [LOCATION, LOCATION, LOCATION, "westus"] {
            w.prices.push(fake::price_item(
                "Standard_D2s_v5",
                region,
                "D2s v5",
                "Virtual Machines Dsv5 Series",
                "D2s v5",
                0.1,
            ));
        }
    }
    let mut url = format!(
        "/subscriptions/{SUB}/providers/Microsoft.Compute/skus?api-version={}&$filter=location%20eq%20%27{LOCATION}%27",
        fake::api_version("ResourceSkus_List")
    );
    let mut names = Vec::new();
    loop {
        let (status, _, page) = c.call(reqwest::Method::GET, &url, None).await;
        assert_eq!(status, 200, "{page}");
        names.extend(page["value"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap().to_owned()));
        match page["nextLink"].as_str() {
            Some(next) => url = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(names, ["Standard_D2s_v5", "Standard_D4s_v5", "Standard_D8s_v5"]);

    let filter = format!(
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and currencyCode eq 'USD' and \
         armRegionName eq '{LOCATION}'"
    );
    let encoded: String = filter.replace(' ', "%20").replace('\'', "%27");
    let first = reqwest::get(format!(
        "{endpoint}/api/retail/prices?api-version={}&$filter={encoded}",
        fake::PRICES_API_VERSION
    ))
    .await
    .unwrap();
    let page: Value = first.json().await.unwrap();
    assert_eq!(page["Count"], 2);
    let next = page["NextPageLink"].as_str().unwrap();
    assert!(next.contains("$skip=2") || next.contains("%24skip=2"), "{next}");
    let page: Value = reqwest::get(next).await.unwrap().json().await.unwrap();
    assert_eq!(page["Count"], 1);
    assert!(page["NextPageLink"].is_null());
}

#[tokio::test]
async fn lists_restarts_and_galleries() {
    let (endpoint, world) = fake::start().await;
    let c = Client::new(&endpoint);
    let (_, _, nic) = c.call(reqwest::Method::PUT, &nic_path("n1"), Some(&nic_body())).await;
    let mut body = vm_body(nic["id"].as_str().unwrap());
    body.as_object_mut().unwrap().remove("location");
    let (status, _, err) = c.call(reqwest::Method::PUT, &vm_path("vm0"), Some(&body)).await;
    assert_eq!(status, 400, "a VM without a location: {err}");
    let mut body = vm_body(nic["id"].as_str().unwrap());
    body["properties"]["licenseType"] = Value::Null;
    assert_eq!(c.call(reqwest::Method::PUT, &vm_path("vm0"), Some(&body)).await.0, 400, "null is no value");

    for i in 0..3 {
        let name = format!("n{i}");
        let (_, _, nic) = c.call(reqwest::Method::PUT, &nic_path(&name), Some(&nic_body())).await;
        let mut body = vm_body(nic["id"].as_str().unwrap());
        body["properties"]["priority"] = json!("Regular");
        body.as_object_mut().unwrap().remove("zones");
        let (status, _, vm) = c.call(reqwest::Method::PUT, &vm_path(&format!("vm{i}")), Some(&body)).await;
        assert_eq!(status, 201, "{vm}");
    }
    let mut url = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines?api-version={}",
        fake::api_version("VirtualMachines_List")
    );
    let mut names = Vec::new();
    loop {
        let (status, _, page) = c.call(reqwest::Method::GET, &url, None).await;
        assert_eq!(status, 200, "{page}");
        names.extend(page["value"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_owned()));
        match page["nextLink"].as_str() {
            Some(next) => url = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(names, ["vm0", "vm1", "vm2"]);

    let restart = vm_path("vm1").replace("/vm1?", "/vm1/restart?");
    let (status, headers, _) = c.call(reqwest::Method::POST, &restart, None).await;
    assert_eq!(status, 202);
    assert!(headers.contains_key("azure-asyncoperation"));
    let missing = vm_path("vm9").replace("/vm9?", "/vm9/restart?");
    assert_eq!(c.call(reqwest::Method::POST, &missing, None).await.0, 404);

    world.lock().unwrap().gallery_versions.insert(
        ("tenon-1a2b".into(), "ubuntu".into()),
        vec![fake::gallery_version("tenon-1a2b", "ubuntu", "1.0.0", LOCATION)],
    );
    let versions = format!(
        "/subscriptions/{SUB}/providers/Microsoft.Compute/locations/{LOCATION}/communityGalleries/tenon-1a2b/images/ubuntu/versions?api-version={}",
        fake::api_version("CommunityGalleryImageVersions_List")
    );
    let (status, _, page) = c.call(reqwest::Method::GET, &versions, None).await;
    assert_eq!(status, 200);
    assert_eq!(page["value"][0]["name"], "1.0.0");
    assert_eq!(c.call(reqwest::Method::GET, &versions.replace("/ubuntu/", "/other/"), None).await.0, 404);
}
