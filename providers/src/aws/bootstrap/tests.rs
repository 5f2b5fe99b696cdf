use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use serde_json::json;

use super::*;
use crate::aws::catalog::{self, Shape};
use crate::aws::kubelet::{AmiFamily, Kubelet};
use tenon_core::resources::{ResourceName, Resources};

fn cluster() -> ClusterInfo {
    ClusterInfo {
        name: "prod".into(),
        endpoint: "https://ABCD.gr7.us-west-2.eks.amazonaws.com".into(),
        ca_bundle: Some("Y2VydGlmaWNhdGU=".into()),
        service_cidr: Some("10.100.0.0/16".into()),
    }
}

fn taints() -> Vec<Taint> {
    vec![
        Taint {
            key: "nvidia.com/gpu".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        },
        Taint { key: "karpenter.sh/unregistered".into(), value: None, effect: "NoExecute".into(), time_added: None },
    ]
}

fn labels() -> BTreeMap<String, String> {
    [
        ("karpenter.sh/nodepool", "gpu"),
        ("team", "ml"),
        ("kubernetes.io/secret", "dropped"),
        ("node.kubernetes.io/role", "x"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn kubelet(v: serde_json::Value) -> Kubelet {
    Kubelet::parse(v.as_object()).unwrap()
}

fn options<'a>(
    cluster: &'a ClusterInfo,
    kubelet: &'a Kubelet,
    labels: &'a BTreeMap<String, String>,
    taints: &'a [Taint],
    custom: Option<&'a str>,
) -> Options<'a> {
    Options { cluster, kubelet, labels, taints, custom, raid0: false }
}

#[test]
fn al2023_user_data_is_a_node_config_after_the_users_parts() {
    let (c, l, t) = (cluster(), labels(), taints());
    let k = kubelet(json!({"maxPods": 42, "kubeReserved": {"cpu": "250m"}, "shutdownGracePeriod": "30s"}));
    let custom = "#!/bin/bash\necho user-script\n";
    let text = user_data(AmiFamily::Al2023, &options(&c, &k, &l, &t, Some(custom))).unwrap();
    let parts = mime::parse(&text).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].content_type, mime::SHELL);
    assert!(parts[0].content.contains("echo user-script"));
    assert_eq!(parts[1].content_type, mime::NODE_CONFIG);
    let doc: serde_json::Value = serde_yaml_ng::from_str(&parts[1].content).unwrap();
    assert_eq!(doc["kind"], "NodeConfig");
    assert_eq!(doc["apiVersion"], "node.eks.aws/v1alpha1");
    let spec = &doc["spec"];
    assert_eq!(spec["cluster"]["name"], "prod");
    assert_eq!(spec["cluster"]["apiServerEndpoint"], c.endpoint);
    assert_eq!(spec["cluster"]["certificateAuthority"], "Y2VydGlmaWNhdGU=");
    assert_eq!(spec["cluster"]["cidr"], "10.100.0.0/16");
    let config = &spec["kubelet"]["config"];
    assert_eq!(config["maxPods"], 42);
    assert_eq!(config["kubeReserved"]["cpu"], "250m");
    assert_eq!(config["shutdownGracePeriod"], "30s", "every kubelet field is passed through");
    let registered: Vec<String> = config["registerWithTaints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{}:{}", t["key"].as_str().unwrap(), t["effect"].as_str().unwrap()))
        .collect();
    assert_eq!(registered, ["nvidia.com/gpu:NoSchedule", "karpenter.sh/unregistered:NoExecute"]);
    assert_eq!(
        spec["kubelet"]["flags"],
        json!(["--node-labels=karpenter.sh/nodepool=gpu,node.kubernetes.io/role=x,team=ml"]),
        "a label the kubelet may not set itself is left out"
    );
    // A bare NodeConfig of the user's is a part of that type; a user MIME archive keeps its parts.
    let own = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    config:\n      maxPods: 7\n";
    let parts = mime::parse(&user_data(AmiFamily::Al2023, &options(&c, &k, &l, &t, Some(own))).unwrap()).unwrap();
    assert_eq!(parts[0].content_type, mime::NODE_CONFIG);
    assert!(parts[0].content.contains("maxPods: 7"));
    let archive = mime::serialize(&[mime::Part { content_type: mime::SHELL.into(), content: "echo a".into() }]);
    let parts = mime::parse(&user_data(AmiFamily::Al2023, &options(&c, &k, &l, &t, Some(&archive))).unwrap()).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].content, "echo a");
    // nodeadm cannot run without the service CIDR.
    let no_cidr = ClusterInfo { service_cidr: None, ..cluster() };
    let err = user_data(AmiFamily::Al2023, &options(&no_cidr, &k, &l, &t, None)).unwrap_err();
    assert!(err.contains("service CIDR"), "{err}");
}

#[test]
fn al2_user_data_runs_bootstrap_sh_with_the_kubelet_flags() {
    let (c, l, t) = (cluster(), labels(), taints());
    let k =
        kubelet(json!({"maxPods": 30, "clusterDNS": ["10.100.0.10"], "evictionHard": {"memory.available": "200Mi"}}));
    let text = user_data(AmiFamily::Al2, &options(&c, &k, &l, &t, Some("echo first"))).unwrap();
    let parts = mime::parse(&text).unwrap();
    assert_eq!(parts[0].content, "echo first");
    let script = &parts[1].content;
    assert!(script.starts_with("#!/bin/bash -xe\n"), "{script}");
    assert!(
        script.contains(
            "/etc/eks/bootstrap.sh 'prod' --apiserver-endpoint 'https://ABCD.gr7.us-west-2.eks.amazonaws.com'"
        )
    );
    assert!(script.contains("--b64-cluster-ca 'Y2VydGlmaWNhdGU='"));
    assert!(script.contains("--dns-cluster-ip '10.100.0.10'"));
    assert!(script.contains("--use-max-pods false"));
    let args = script.split("--kubelet-extra-args '").nth(1).unwrap().split('\'').next().unwrap();
    let args: Vec<&str> = args.split(' ').collect();
    assert!(args.contains(&"--max-pods=30"), "{args:?}");
    assert!(args.contains(&"--eviction-hard=memory.available<200Mi"), "{args:?}");
    assert!(
        args.contains(&"--register-with-taints=nvidia.com/gpu=true:NoSchedule,karpenter.sh/unregistered:NoExecute")
    );
    assert!(args.contains(&"--node-labels=karpenter.sh/nodepool=gpu,node.kubernetes.io/role=x,team=ml"));
}

#[test]
fn bottlerocket_user_data_writes_the_settings_over_the_users_toml() {
    let (c, l, t) = (cluster(), labels(), taints());
    let k = kubelet(json!({"maxPods": 50, "systemReserved": {"memory": "500Mi"}, "imageGCHighThresholdPercent": 85}));
    let custom = "[settings.host-containers.admin]\nenabled = true\n[settings.kubernetes]\napi-server = \"https://wrong\"\n[settings.kubernetes.node-labels]\nown = \"label\"\n";
    let text = user_data(AmiFamily::Bottlerocket, &options(&c, &k, &l, &t, Some(custom))).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    let settings = doc["settings"].as_table().unwrap();
    assert_eq!(settings["host-containers"]["admin"]["enabled"].as_bool(), Some(true), "the user's settings stay");
    let k8s = settings["kubernetes"].as_table().unwrap();
    assert_eq!(k8s["cluster-name"].as_str(), Some("prod"));
    assert_eq!(k8s["api-server"].as_str(), Some(c.endpoint.as_str()), "the cluster settings win");
    assert_eq!(k8s["cluster-certificate"].as_str(), Some("Y2VydGlmaWNhdGU="));
    assert_eq!(k8s["max-pods"].as_integer(), Some(50));
    assert_eq!(k8s["system-reserved"]["memory"].as_str(), Some("500Mi"));
    assert_eq!(k8s["image-gc-high-threshold-percent"].as_str(), Some("85"));
    let labels = k8s["node-labels"].as_table().unwrap();
    assert_eq!(labels["own"].as_str(), Some("label"));
    assert_eq!(labels["team"].as_str(), Some("ml"));
    assert!(!labels.contains_key("kubernetes.io/secret"));
    assert_eq!(k8s["node-taints"]["karpenter.sh/unregistered"][0].as_str(), Some(":NoExecute"));
    assert_eq!(k8s["node-taints"]["nvidia.com/gpu"][0].as_str(), Some("true:NoSchedule"));
    assert!(user_data(AmiFamily::Bottlerocket, &options(&c, &k, &l, &t, Some("not = [toml"))).is_err());
}

#[test]
fn custom_user_data_is_passed_untouched() {
    let (c, l, t) = (cluster(), labels(), taints());
    let k = kubelet(json!({"maxPods": 10}));
    let own = "#cloud-config\nruncmd: [my-join]\n";
    assert_eq!(user_data(AmiFamily::Custom, &options(&c, &k, &l, &t, Some(own))).unwrap(), own);
}

/// What the kubelet a rendered user data configures would report as allocatable, read back from the user
/// data itself (YAML, TOML or flags) and completed with the EKS images' own defaults: the same allocatable
/// the provider offers the scheduler for that instance type.
#[test]
fn the_allocatable_offered_is_what_the_rendered_kubelet_config_implies() {
    const MIB: i64 = 1 << 20;
    const GIB: i64 = 1 << 30;
    let shape = Shape::nitro("m5.2xlarge", 8, 32768);
    let root_gib = 50;
    let (c, l, t) = (cluster(), labels(), taints());
    let configs = [
        json!({}),
        json!({"maxPods": 110}),
        json!({"maxPods": 200, "podsPerCore": 8}),
        json!({"kubeReserved": {"cpu": "500m", "memory": "2Gi"}, "systemReserved": {"cpu": "100m", "memory": "300Mi", "ephemeral-storage": "2Gi"}}),
        json!({"evictionHard": {"memory.available": "5%", "nodefs.available": "15%"}, "evictionSoft": {"memory.available": "10%"}}),
    ];
    for family in [AmiFamily::Al2023, AmiFamily::Al2, AmiFamily::Bottlerocket] {
        for config in &configs {
            let k = kubelet(config.clone());
            let text = user_data(family, &options(&c, &k, &l, &t, None)).unwrap();
            let rendered = read_back(family, &text);
            // The image's defaults where the user data sets nothing: the VPC CNI's pod count, the EKS
            // kube-reserved formulas (memory from the ENI-limited count on the EKS images, from the pods run
            // on Bottlerocket), memory 100Mi and nodefs 10% hard eviction.
            let eni_pods = shape.max_enis * (shape.ipv4_per_eni - 1) + 2;
            let mut pods = rendered.max_pods.unwrap_or(eni_pods);
            if let Some(per_core) = rendered.pods_per_core {
                pods = pods.min(per_core * shape.vcpu);
            }
            let memory_pods = if family == AmiFamily::Bottlerocket { pods } else { eni_pods };
            let cpu_tiers = [600, 100, 50, 50, 25, 25, 25, 25]; // tenths of a millicore per core
            let mut reserved =
                Resources::cpu_memory(cpu_tiers.iter().sum::<i64>() / 10, (11 * memory_pods + 255) * MIB)
                    .with(ResourceName::EPHEMERAL_STORAGE, GIB);
            for (name, q) in &rendered.kube_reserved {
                let (slot, v) = Resources::parse_quantity(name, q).unwrap();
                reserved.set(slot, v);
            }
            for (name, q) in &rendered.system_reserved {
                let (slot, v) = Resources::parse_quantity(name, q).unwrap();
                reserved.set(slot, reserved.get(slot) + v);
            }
            // EC2's figure less the hypervisor's 7.5%, rounded up to the MiB.
            let memory = (shape.memory_mib - (shape.memory_mib as f64 * 0.075).ceil() as i64) * MIB;
            let storage = root_gib * GIB;
            let signal = |v: Option<&String>, capacity: i64, default: i64| match v {
                Some(v) if v.ends_with('%') => {
                    (capacity as f64 / 100.0 * v.trim_end_matches('%').parse::<f64>().unwrap()).ceil() as i64
                }
                Some(v) => Resources::parse_quantity("memory", v).unwrap().1,
                None => default,
            };
            let eviction =
                Resources::cpu_memory(0, signal(rendered.eviction_hard.get("memory.available"), memory, 100 * MIB))
                    .with(
                        ResourceName::EPHEMERAL_STORAGE,
                        signal(rendered.eviction_hard.get("nodefs.available"), storage, storage / 10),
                    );
            let mut capacity = Resources::cpu_memory(shape.vcpu * 1000, memory)
                .with(ResourceName::PODS, pods)
                .with(ResourceName::EPHEMERAL_STORAGE, storage);
            // Branch interfaces are the VPC resource controller's to advertise, not the kubelet's: no
            // kubelet setting holds any back.
            if let Some(n) = catalog::branch_interfaces(&shape.name) {
                capacity.set(ResourceName::intern(catalog::POD_ENI).unwrap(), n);
            }
            let implied = capacity.sub(&reserved).sub(&eviction);
            let offered = catalog::instance_type(&shape, root_gib, &k, family, 0.075, Vec::new()).allocatable();
            assert_eq!(offered, implied, "{family:?} {config}");
        }
    }
}

/// The kubelet settings a rendered user data carries.
#[derive(Debug, Default)]
struct Rendered {
    max_pods: Option<i64>,
    pods_per_core: Option<i64>,
    kube_reserved: BTreeMap<String, String>,
    system_reserved: BTreeMap<String, String>,
    eviction_hard: BTreeMap<String, String>,
}

fn read_back(family: AmiFamily, text: &str) -> Rendered {
    let map = |v: Option<&serde_json::Value>| -> BTreeMap<String, String> {
        v.and_then(|v| v.as_object())
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect())
            .unwrap_or_default()
    };
    match family {
        AmiFamily::Al2023 => {
            let parts = mime::parse(text).unwrap();
            let doc: serde_json::Value = serde_yaml_ng::from_str(&parts.last().unwrap().content).unwrap();
            let config = &doc["spec"]["kubelet"]["config"];
            Rendered {
                max_pods: config["maxPods"].as_i64(),
                pods_per_core: config["podsPerCore"].as_i64(),
                kube_reserved: map(config.get("kubeReserved")),
                system_reserved: map(config.get("systemReserved")),
                eviction_hard: map(config.get("evictionHard")),
            }
        }
        AmiFamily::Al2 => {
            let parts = mime::parse(text).unwrap();
            let script = &parts.last().unwrap().content;
            let args = script.split("--kubelet-extra-args '").nth(1).unwrap().split('\'').next().unwrap();
            let mut r = Rendered::default();
            for arg in args.split(' ') {
                let (flag, value) = arg.split_once('=').unwrap();
                let pairs = |sep: char| -> BTreeMap<String, String> {
                    value
                        .split(',')
                        .map(|kv| kv.split_once(sep).unwrap())
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect()
                };
                match flag {
                    "--max-pods" => r.max_pods = value.parse().ok(),
                    "--pods-per-core" => r.pods_per_core = value.parse().ok(),
                    "--kube-reserved" => r.kube_reserved = pairs('='),
                    "--system-reserved" => r.system_reserved = pairs('='),
                    "--eviction-hard" => r.eviction_hard = pairs('<'),
                    _ => {}
                }
            }
            r
        }
        AmiFamily::Bottlerocket => {
            let doc: toml::Table = text.parse().unwrap();
            let k8s = doc["settings"]["kubernetes"].as_table().unwrap();
            let map = |key: &str| -> BTreeMap<String, String> {
                k8s.get(key)
                    .and_then(|v| v.as_table())
                    .map(|t| t.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect())
                    .unwrap_or_default()
            };
            Rendered {
                max_pods: k8s.get("max-pods").and_then(|v| v.as_integer()),
                pods_per_core: None,
                kube_reserved: map("kube-reserved"),
                system_reserved: map("system-reserved"),
                eviction_hard: map("eviction-hard"),
            }
        }
        AmiFamily::Custom => Rendered::default(),
    }
}
