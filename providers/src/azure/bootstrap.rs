//! How an Azure VM joins the cluster: the custom data it boots with.
//!
//! - **AKS** ([`AksBootstrap`]): AKS node images (the `AKSUbuntu` and `AKSAzureLinux` galleries) carry
//!   their provisioning scripts (`/opt/azure/containers/provision_start.sh` and the files it sources).
//!   The custom data is the script that hands them the node's configuration as environment variables:
//!   the API server, the cluster CA, a TLS bootstrap token, the subscription, resource group and network
//!   the node is in, the kubelet's flags and labels. The kubelet's reservations and eviction threshold are
//!   written as flags, the same figures tenon schedules with, so the node's allocatable is what tenon
//!   expected. The bootstrap token is a secret: the custom data is never logged.
//! - **A bootstrap of one's own** ([`Bootstrap::Own`]), for self-managed Kubernetes on Azure: the
//!   settings' custom data (a cloud-init document or script) is passed as it is, with the node's labels,
//!   taints and max pods appended as environment variables in a comment-safe trailer the script may
//!   source (`/etc/tenon/node.env`, written by cloud-init's `write_files` when the data is cloud-config,
//!   or exported at the top of a shell script). See docs/azure.md.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use k8s_openapi::api::core::v1::Taint;

use crate::kubelet::kubelet_labels;

/// A value that is not printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "<redacted>" })
    }
}

/// The cluster facts AKS nodes join with.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AksBootstrap {
    /// The API server's URL (`https://<cluster>-dns-<id>.hcp.eastus.azmk8s.io:443`).
    pub cluster_endpoint: String,
    /// The cluster CA bundle, base64 PEM.
    pub ca_bundle: String,
    /// A TLS bootstrap token (`<id>.<secret>`).
    pub bootstrap_token: Secret,
    /// The tenant of the subscription.
    pub tenant_id: String,
    /// The cluster DNS service's address (`10.0.0.10`).
    pub dns_service_ip: String,
    /// The client id of the kubelet's identity (`USER_ASSIGNED_IDENTITY_ID`), if any.
    pub kubelet_identity_client_id: Option<String>,
    /// The network security group of the node resource group (`aks-agentpool-<id>-nsg`).
    pub network_security_group: String,
    /// The route table (kubenet), if any.
    pub route_table: String,
}

/// How nodes join.
#[derive(Debug, Clone, PartialEq)]
pub enum Bootstrap {
    /// AKS's node provisioning, from [`AksBootstrap`].
    Aks(AksBootstrap),
    /// Custom data of one's own, base64 or plain text (a cloud-config or a script).
    Own(String),
}

/// What one node needs beside the cluster facts.
#[derive(Debug, Clone)]
pub struct NodeFacts<'a> {
    /// The cluster's Kubernetes version (`1.33.2`).
    pub kubernetes_version: &'a str,
    /// The subscription, node resource group and location.
    pub subscription_id: &'a str,
    /// The node resource group.
    pub resource_group: &'a str,
    /// The location.
    pub location: &'a str,
    /// The subnet's id, parsed: (vnet resource group, vnet, subnet).
    pub subnet: (&'a str, &'a str, &'a str),
    /// The network plugin as AKS names it (`azure`, `kubenet`, `none`) and its mode (`overlay`).
    pub network_plugin: &'a str,
    /// The network policy (`""`, `calico`, `azure`, `cilium`).
    pub network_policy: &'a str,
    /// `amd64` or `arm64`.
    pub arch: &'a str,
    /// Whether the VM has NVIDIA GPUs (AKS installs the driver).
    pub nvidia_gpu: bool,
    /// The node's labels (those the kubelet may set on itself).
    pub labels: &'a BTreeMap<String, String>,
    /// Its taints and startup taints.
    pub taints: &'a [Taint],
    /// Pods per node.
    pub max_pods: i64,
    /// Kube-reserved CPU in millicores and memory in MiB.
    pub kube_reserved: (i64, i64),
    /// Hard-eviction memory threshold in MiB.
    pub eviction_memory_mib: i64,
    /// The class's kubelet flags (`--cpu-manager-policy=static`, …).
    pub kubelet_flags: Vec<(String, String)>,
    /// The admin user.
    pub admin_username: &'a str,
}

/// The host of a URL (`https://host:443/path` → `host`).
pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', '?']).next().unwrap_or(rest);
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(']') || h.starts_with('[') => h,
        _ => host,
    }
}

/// `--register-with-taints`' value, with `karpenter.sh/unregistered=true:NoExecute` (the core removes it
/// once the node registers).
pub fn taints_flag(taints: &[Taint]) -> String {
    let mut out: Vec<String> = taints
        .iter()
        .map(|t| match &t.value {
            Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
            _ => format!("{}:{}", t.key, t.effect),
        })
        .collect();
    if !taints.iter().any(|t| t.key == tenon_core::api::labels::UNREGISTERED_TAINT) {
        out.push(format!("{}=true:NoExecute", tenon_core::api::labels::UNREGISTERED_TAINT));
    }
    out.join(",")
}

fn quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

impl AksBootstrap {
    /// The kubelet's flags for `node`.
    pub fn kubelet_flags(&self, node: &NodeFacts<'_>) -> String {
        let mut flags: BTreeMap<String, String> = [
            ("--anonymous-auth", "false"),
            ("--authentication-token-webhook", "true"),
            ("--authorization-mode", "Webhook"),
            ("--client-ca-file", "/etc/kubernetes/certs/ca.crt"),
            ("--cloud-provider", "external"),
            ("--cluster-domain", "cluster.local"),
            ("--enforce-node-allocatable", "pods"),
            ("--image-gc-high-threshold", "85"),
            ("--image-gc-low-threshold", "80"),
            ("--kubeconfig", "/var/lib/kubelet/kubeconfig"),
            ("--pod-manifest-path", "/etc/kubernetes/manifests"),
            ("--protect-kernel-defaults", "true"),
            ("--read-only-port", "0"),
            ("--resolv-conf", "/run/systemd/resolve/resolv.conf"),
            ("--rotate-certificates", "true"),
            ("--streaming-connection-idle-timeout", "4h"),
            ("--tls-cert-file", "/etc/kubernetes/certs/kubeletserver.crt"),
            ("--tls-private-key-file", "/etc/kubernetes/certs/kubeletserver.key"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let dns = if self.dns_service_ip.is_empty() { "10.0.0.10" } else { &self.dns_service_ip };
        flags.insert("--cluster-dns".into(), dns.to_owned());
        flags.insert("--max-pods".into(), node.max_pods.to_string());
        flags.insert(
            "--kube-reserved".into(),
            format!("cpu={}m,memory={}Mi", node.kube_reserved.0, node.kube_reserved.1),
        );
        flags.insert(
            "--eviction-hard".into(),
            format!("memory.available<{}Mi,nodefs.available<10%,nodefs.inodesFree<5%", node.eviction_memory_mib),
        );
        flags.insert("--register-with-taints".into(), taints_flag(node.taints));
        for (k, v) in &node.kubelet_flags {
            flags.insert(k.clone(), v.clone());
        }
        flags.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }

    /// The custom data (base64) of `node`.
    pub fn custom_data(&self, node: &NodeFacts<'_>) -> String {
        let labels: Vec<String> = kubelet_labels(node.labels).iter().map(|(k, v)| format!("{k}={v}")).collect();
        let (plugin, mode) = node.network_plugin.split_once('/').unwrap_or((node.network_plugin, ""));
        // AKS's provisioning treats Azure CNI overlay, and no plugin, as `none`: the CNI comes as a daemonset.
        let plugin = if plugin == "none" || mode == "overlay" { "none" } else { plugin };
        let minor = node.kubernetes_version.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()).unwrap_or(0);
        let kube_binary = if minor < 34 {
            format!(
                "https://acs-mirror.azureedge.net/kubernetes/v{}/binaries/kubernetes-node-linux-{}.tar.gz",
                node.kubernetes_version, node.arch
            )
        } else {
            String::new()
        };
        let vars: Vec<(&str, String)> = vec![
            ("ADMINUSER", node.admin_username.to_owned()),
            ("TENANT_ID", self.tenant_id.clone()),
            ("KUBERNETES_VERSION", node.kubernetes_version.to_owned()),
            ("KUBE_BINARY_URL", kube_binary),
            ("SUBSCRIPTION_ID", node.subscription_id.to_owned()),
            ("RESOURCE_GROUP", node.resource_group.to_owned()),
            ("LOCATION", node.location.to_owned()),
            ("VM_TYPE", "standard".into()),
            ("SUBNET", node.subnet.2.to_owned()),
            ("NETWORK_SECURITY_GROUP", self.network_security_group.clone()),
            ("VIRTUAL_NETWORK", node.subnet.1.to_owned()),
            ("VIRTUAL_NETWORK_RESOURCE_GROUP", node.subnet.0.to_owned()),
            ("ROUTE_TABLE", self.route_table.clone()),
            ("NETWORK_PLUGIN", plugin.to_owned()),
            ("NETWORK_POLICY", node.network_policy.to_owned()),
            ("USE_MANAGED_IDENTITY_EXTENSION", "true".into()),
            ("USE_INSTANCE_METADATA", "true".into()),
            ("LOAD_BALANCER_SKU", "Standard".into()),
            ("CONTAINER_RUNTIME", "containerd".into()),
            ("CLI_TOOL", "ctr".into()),
            ("USER_ASSIGNED_IDENTITY_ID", self.kubelet_identity_client_id.clone().unwrap_or_default()),
            ("API_SERVER_NAME", host_of(&self.cluster_endpoint).to_owned()),
            ("IS_VHD", "true".into()),
            ("GPU_NODE", node.nvidia_gpu.to_string()),
            ("CONFIG_GPU_DRIVER_IF_NEEDED", node.nvidia_gpu.to_string()),
            ("ENABLE_GPU_DEVICE_PLUGIN_IF_NEEDED", "false".into()),
            ("NEEDS_CONTAINERD", "true".into()),
            ("NEEDS_CGROUPV2", "true".into()),
            ("TARGET_CLOUD", "AzurePublicCloud".into()),
            ("TARGET_ENVIRONMENT", "AzurePublicCloud".into()),
            ("CSE_HELPERS_FILEPATH", "/opt/azure/containers/provision_source.sh".into()),
            ("CSE_DISTRO_HELPERS_FILEPATH", "/opt/azure/containers/provision_source_distro.sh".into()),
            ("CSE_INSTALL_FILEPATH", "/opt/azure/containers/provision_installs.sh".into()),
            ("CSE_DISTRO_INSTALL_FILEPATH", "/opt/azure/containers/provision_installs_distro.sh".into()),
            ("CSE_CONFIG_FILEPATH", "/opt/azure/containers/provision_configs.sh".into()),
            ("ENABLE_TLS_BOOTSTRAPPING", "true".into()),
            ("TLS_BOOTSTRAP_TOKEN", self.bootstrap_token.0.clone()),
            ("KUBELET_FLAGS", self.kubelet_flags(node)),
            ("KUBELET_NODE_LABELS", labels.join(",")),
            ("KUBE_CA_CRT", self.ca_bundle.clone()),
            ("MCR_REPOSITORY_BASE", "mcr.microsoft.com".into()),
            ("CSE_TIMEOUT", "15m".into()),
        ];
        let mut script =
            String::from("#!/bin/bash\n# Written by tenon: AKS node provisioning for this node.\nset -o allexport\n");
        script.push_str("echo '#EOF' >> /opt/azure/manifest.json\n");
        script.push_str("mkdir -p /var/log/azure/Microsoft.Azure.Extensions.CustomScript/events\n");
        script.push_str(
            "for i in $(seq 1 1200); do grep -Fq EOF /opt/azure/containers/provision.sh && break; \
             if [ \"$i\" -eq 1200 ]; then exit 100; else sleep 1; fi; done\n",
        );
        for (k, v) in vars {
            script.push_str(&format!("{k}={}\n", quote(&v)));
        }
        script.push_str("/usr/bin/nohup /bin/bash -c \"/bin/bash /opt/azure/containers/provision_start.sh\"\n");
        base64::engine::general_purpose::STANDARD.encode(script)
    }
}

/// The custom data (base64) of a bootstrap of one's own: `data` (base64 or text) with the node's facts
/// as `TENON_NODE_LABELS`, `TENON_NODE_TAINTS` and `TENON_MAX_PODS`: written to `/etc/tenon/node.env`
/// by a `write_files` entry appended to a cloud-config, or exported after the shebang of a script.
pub fn own_custom_data(
    data: &str,
    labels: &BTreeMap<String, String>,
    taints: &[Taint],
    max_pods: i64,
) -> Result<String, String> {
    let engine = base64::engine::general_purpose::STANDARD;
    let text = match engine.decode(data.trim()) {
        Ok(bytes) => {
            String::from_utf8(bytes).map_err(|_| "the custom data is base64 of something not UTF-8".to_owned())?
        }
        Err(_) => data.to_owned(),
    };
    let labels: Vec<String> = kubelet_labels(labels).iter().map(|(k, v)| format!("{k}={v}")).collect();
    let env = format!(
        "TENON_NODE_LABELS={}\nTENON_NODE_TAINTS={}\nTENON_MAX_PODS={max_pods}\n",
        quote(&labels.join(",")),
        quote(&taints_flag(taints)),
    );
    let out = if text.starts_with("#cloud-config") {
        if text.lines().any(|l| l.starts_with("write_files:")) {
            return Err("a cloud-config of one's own may not have write_files: tenon appends its own".into());
        }
        let indented: String = env.lines().map(|l| format!("      {l}\n")).collect();
        format!(
            "{}\nwrite_files:\n  - path: /etc/tenon/node.env\n    permissions: '0644'\n    content: |\n{indented}",
            text.trim_end()
        )
    } else if let Some(rest) = text.strip_prefix("#!") {
        let (shebang, body) = rest.split_once('\n').unwrap_or((rest, ""));
        format!("#!{shebang}\nset -a\n{env}set +a\n{body}")
    } else {
        return Err("custom data of one's own must be a #cloud-config document or a #! script".into());
    };
    Ok(engine.encode(out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use base64::Engine;

    fn decode(s: &str) -> String {
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
    }

    #[test]
    fn hosts_are_read_from_urls() {
        assert_eq!(host_of("https://c-dns-1.hcp.eastus.azmk8s.io:443"), "c-dns-1.hcp.eastus.azmk8s.io");
        assert_eq!(host_of("https://10.0.0.1/"), "10.0.0.1");
        assert_eq!(host_of("api.example.com"), "api.example.com");
    }

    #[test]
    fn own_custom_data_gets_the_nodes_facts() {
        let labels = BTreeMap::from([("team".to_owned(), "ml".to_owned())]);
        let taints = [Taint { key: "gpu".into(), effect: "NoSchedule".into(), ..Default::default() }];
        let script = decode(&own_custom_data("#!/bin/bash\nkubeadm join\n", &labels, &taints, 110).unwrap());
        assert!(script.starts_with("#!/bin/bash\nset -a\nTENON_NODE_LABELS='team=ml'\nTENON_NODE_TAINTS='gpu:NoSchedule,karpenter.sh/unregistered=true:NoExecute'\n"), "{script}");
        assert!(script.ends_with("kubeadm join\n"));
        let cc = decode(&own_custom_data("#cloud-config\nruncmd: [kubeadm join]\n", &labels, &[], 30).unwrap());
        assert!(cc.contains("write_files:\n  - path: /etc/tenon/node.env") && cc.contains("TENON_MAX_PODS=30"), "{cc}");
        assert!(own_custom_data("plain words", &labels, &[], 30).is_err());
    }
}
