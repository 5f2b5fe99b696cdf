//! How a Compute Engine instance joins a GKE cluster: what GKE's node images read at boot, copied from an
//! instance template of one of the cluster's own node pools and rewritten for the claim, as the community
//! Karpenter provider for GCP does.
//!
//! GKE's images boot from instance metadata: `kube-env` (the node's settings, `KEY: value` lines, among them
//! `KUBELET_ARGS`), `kubelet-config`, `kubeconfig`, `configure-sh`, `cluster-name` and the like. None of it
//! is published: a node pool's regional instance template holds it. The template is found by its
//! `cluster-name` metadata (and the node pool named in the settings, if one is), and from it the instance
//! takes those metadata keys as they are, except:
//! - `kube-env`'s `ZONE` is the launch's zone, and its `KUBELET_ARGS` register the node with the claim's
//!   labels (`--node-labels`), its taints and `karpenter.sh/unregistered:NoExecute`
//!   (`--register-with-taints`) and the class's pods (`--max-pods`); every other flag stays;
//! - `kube-labels` holds the same labels.
//!
//! The template also gives what the class and the settings leave unset: the network, subnetwork, the pods'
//! secondary range, the network tags GKE's firewall rules select nodes by, and the service account.

use std::collections::BTreeMap;

use google_cloud_compute_v1::model;
use k8s_openapi::api::core::v1::Taint;

/// The metadata keys an instance takes from the node pool's template as they are.
pub const COPIED_KEYS: [&str; 21] = [
    "cluster-location",
    "cluster-name",
    "cluster-uid",
    "common-psm1",
    "configure-sh",
    "containerd-configure-sh",
    "disable-address-manager",
    "disable-legacy-endpoints",
    "enable-os-login",
    "gci-ensure-gke-docker",
    "gci-metrics-enabled",
    "gci-update-strategy",
    "google-compute-enable-pcid",
    "install-ssh-psm1",
    "instance-template",
    "k8s-node-setup-psm1",
    "kubeconfig",
    "kubelet-config",
    "serial-port-logging-enable",
    "user-profile-psm1",
    "startup-script",
];

/// What a node pool's template says of its nodes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodePoolTemplate {
    /// The template's name.
    pub name: String,
    /// Its metadata.
    pub metadata: BTreeMap<String, String>,
    /// Its first interface's network and subnetwork.
    pub network: Option<String>,
    /// The subnetwork.
    pub subnetwork: Option<String>,
    /// The secondary range pod addresses come from.
    pub pod_range: Option<String>,
    /// Its network tags.
    pub tags: Vec<String>,
    /// Its service account.
    pub service_account: Option<String>,
    /// Its scopes.
    pub scopes: Vec<String>,
}

impl NodePoolTemplate {
    /// The template's facts, when it is a node pool's of cluster `cluster` (its `cluster-name` metadata).
    pub fn of(t: &model::InstanceTemplate, cluster: &str) -> Option<Self> {
        let p = t.properties.as_ref()?;
        let metadata: BTreeMap<String, String> = p
            .metadata
            .as_ref()
            .map(|m| {
                m.items.iter().filter_map(|i| Some((i.key.clone()?, i.value.clone().unwrap_or_default()))).collect()
            })
            .unwrap_or_default();
        if metadata.get("cluster-name").map(String::as_str) != Some(cluster) || !metadata.contains_key("kube-env") {
            return None;
        }
        let nic = p.network_interfaces.first();
        let account = p.service_accounts.first();
        Some(Self {
            name: t.name.clone().unwrap_or_default(),
            metadata,
            network: nic.and_then(|n| n.network.clone()),
            subnetwork: nic.and_then(|n| n.subnetwork.clone()),
            pod_range: nic.and_then(|n| n.alias_ip_ranges.first()).and_then(|r| r.subnetwork_range_name.clone()),
            tags: p.tags.as_ref().map(|t| t.items.clone()).unwrap_or_default(),
            service_account: account.and_then(|a| a.email.clone()),
            scopes: account.map(|a| a.scopes.clone()).unwrap_or_default(),
        })
    }
}

/// `kube-env` as its `KEY: value` lines (an indented line continues the value before it).
pub fn parse_kube_env(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if (line.starts_with(' ') || line.starts_with('\t')) && !out.is_empty() {
            if let Some(last) = out.last_mut() {
                last.1.push('\n');
                last.1.push_str(line);
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            out.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    out
}

/// `kube-env` back as text.
pub fn render_kube_env(entries: &[(String, String)]) -> String {
    entries.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

/// What one node's bootstrap says of it.
#[derive(Debug, Clone, Copy)]
pub struct NodeFacts<'a> {
    /// The launch's zone.
    pub zone: &'a str,
    /// The node's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its taints (with startup taints).
    pub taints: &'a [Taint],
    /// Its pods.
    pub max_pods: i64,
}

impl NodeFacts<'_> {
    /// The labels as the kubelet's `--node-labels` takes them: `k=v,k=v`.
    pub fn kubelet_labels(&self) -> String {
        self.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
    }

    /// The taints as the kubelet's `--register-with-taints` takes them (`k=v:Effect,…`), with
    /// `karpenter.sh/unregistered=true:NoExecute`, which the node keeps until it registers.
    pub fn kubelet_taints(&self) -> String {
        let mut taints: Vec<String> = self
            .taints
            .iter()
            .map(|t| format!("{}={}:{}", t.key, t.value.clone().unwrap_or_default(), t.effect))
            .collect();
        if !self.taints.iter().any(|t| t.key == tenon_core::api::labels::UNREGISTERED_TAINT) {
            taints.push(format!("{}=true:NoExecute", tenon_core::api::labels::UNREGISTERED_TAINT));
        }
        taints.join(",")
    }
}

/// Metadata keys a bootstrap of one's own reads the node's settings from (the metadata server's
/// `instance/attributes/<key>`): its labels (`--node-labels` form), taints (`--register-with-taints`
/// form, with `karpenter.sh/unregistered`) and pods (`--max-pods`).
pub const OWN_BOOTSTRAP_FACTS: [&str; 3] = ["karpenter-node-labels", "karpenter-node-taints", "karpenter-max-pods"];

/// Metadata keys that carry a bootstrap of one's own: the class sets one of them when nodes do not join
/// GKE, and neither when they do (GKE's node pool template writes them).
pub const OWN_BOOTSTRAP_KEYS: [&str; 2] = ["startup-script", "user-data"];

/// The instance metadata of a node that boots with a bootstrap of one's own (Kubernetes of one's own on
/// Compute Engine): the class's metadata, which must hold a `startup-script` or `user-data`, and the
/// node's settings under [`OWN_BOOTSTRAP_FACTS`]. An error names the field when the class has no
/// bootstrap.
pub fn own_metadata(
    node: &NodeFacts<'_>,
    class: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    if !OWN_BOOTSTRAP_KEYS.iter().any(|k| class.contains_key(*k)) {
        return Err("spec.metadata: without the GKE bootstrap, nodes join with a startup-script or user-data of the \
             class's own, and it has neither"
            .into());
    }
    let mut out = class.clone();
    out.insert(OWN_BOOTSTRAP_FACTS[0].into(), node.kubelet_labels());
    out.insert(OWN_BOOTSTRAP_FACTS[1].into(), node.kubelet_taints());
    out.insert(OWN_BOOTSTRAP_FACTS[2].into(), node.max_pods.to_string());
    Ok(out)
}

/// Refuses a class's own bootstrap (`startup-script`, `user-data`) when nodes join GKE, naming the field.
pub fn gke_class_metadata(class: &BTreeMap<String, String>) -> Result<(), String> {
    match OWN_BOOTSTRAP_KEYS.iter().find(|k| class.contains_key(**k)) {
        Some(k) => {
            Err(format!("spec.metadata.{k}: the GKE bootstrap writes it (set it only without the GKE bootstrap)"))
        }
        None => Ok(()),
    }
}

/// A value of `KUBELET_ARGS` (or kube-env) quoted as GKE writes it: in double quotes.
fn unquote(v: &str) -> &str {
    v.trim().trim_matches('"').trim_matches('\'')
}

/// The instance metadata of a node built from `template`: the copied keys, `kube-env` and `kube-labels`
/// rewritten for `node`, then the class's own `extra` keys (which hold no bootstrap key: see
/// [`gke_class_metadata`]).
pub fn node_metadata(
    template: &NodePoolTemplate,
    node: &NodeFacts<'_>,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> =
        COPIED_KEYS.iter().filter_map(|k| Some(((*k).to_owned(), template.metadata.get(*k)?.clone()))).collect();
    let labels = node.kubelet_labels();
    let taints = node.kubelet_taints();
    let mut env = parse_kube_env(template.metadata.get("kube-env").map(String::as_str).unwrap_or_default());
    let mut kubelet_args_seen = false;
    for (k, v) in &mut env {
        match k.as_str() {
            "ZONE" => *v = node.zone.to_owned(),
            "KUBELET_ARGS" => {
                kubelet_args_seen = true;
                let mut args: Vec<String> = unquote(v)
                    .split_whitespace()
                    .filter(|a| {
                        !a.starts_with("--node-labels=")
                            && !a.starts_with("--register-with-taints=")
                            && !a.starts_with("--max-pods=")
                    })
                    .map(str::to_owned)
                    .collect();
                args.push(format!("--max-pods={}", node.max_pods));
                args.push(format!("--node-labels={labels}"));
                args.push(format!("--register-with-taints={taints}"));
                *v = format!("\"{}\"", args.join(" "));
            }
            _ => {}
        }
    }
    if !kubelet_args_seen {
        let args = format!("--max-pods={} --node-labels={labels} --register-with-taints={taints}", node.max_pods);
        env.push(("KUBELET_ARGS".into(), format!("\"{args}\"")));
    }
    out.insert("kube-env".into(), render_kube_env(&env));
    out.insert("kube-labels".into(), labels);
    out.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn template() -> NodePoolTemplate {
        let kube_env = "CLUSTER_NAME: prod\nZONE: us-central1-a\nKUBELET_ARGS: \"--v=2 --cloud-provider=external --max-pods=110 --node-labels=cloud.google.com/gke-nodepool=default-pool\"\nCA_CERT: LS0t\n  bW9yZQ==\nKUBERNETES_MASTER_NAME: 10.0.0.2\n";
        NodePoolTemplate {
            name: "gke-prod-default-pool-1".into(),
            metadata: [
                ("kube-env".to_owned(), kube_env.to_owned()),
                ("cluster-name".to_owned(), "prod".to_owned()),
                ("configure-sh".to_owned(), "#!/bin/bash".to_owned()),
                ("kubeconfig".to_owned(), "apiVersion: v1".to_owned()),
                ("ssh-keys".to_owned(), "someone:key".to_owned()),
            ]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn kube_env_is_rewritten_for_the_claim_and_the_rest_copied() {
        let labels: BTreeMap<String, String> =
            [("karpenter.sh/nodepool".to_owned(), "gpu".to_owned()), ("team".to_owned(), "ml".to_owned())].into();
        let taints = vec![Taint {
            key: "nvidia.com/gpu".into(),
            value: Some("present".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }];
        let node = NodeFacts { zone: "us-central1-b", labels: &labels, taints: &taints, max_pods: 32 };
        let extra: BTreeMap<String, String> = [("block-project-ssh-keys".to_owned(), "true".to_owned())].into();
        let md = node_metadata(&template(), &node, &extra);
        assert_eq!(md["cluster-name"], "prod");
        assert_eq!(md["configure-sh"], "#!/bin/bash");
        assert!(!md.contains_key("ssh-keys"), "only the bootstrap's keys are copied");
        assert_eq!(md["block-project-ssh-keys"], "true");
        let env: BTreeMap<String, String> = parse_kube_env(&md["kube-env"]).into_iter().collect();
        assert_eq!(env["ZONE"], "us-central1-b");
        assert_eq!(env["CA_CERT"], "LS0t\n  bW9yZQ==", "continued values survive");
        let args = unquote(&env["KUBELET_ARGS"]).to_owned();
        assert!(args.starts_with("--v=2 --cloud-provider=external "), "{args}");
        assert!(args.contains("--max-pods=32") && !args.contains("--max-pods=110"), "{args}");
        assert!(args.contains("--node-labels=karpenter.sh/nodepool=gpu,team=ml"), "{args}");
        assert!(!args.contains("gke-nodepool=default-pool"), "the template's pool label is not the claim's");
        assert!(
            args.contains(
                "--register-with-taints=nvidia.com/gpu=present:NoSchedule,karpenter.sh/unregistered=true:NoExecute"
            ),
            "{args}"
        );
        assert_eq!(md["kube-labels"], "karpenter.sh/nodepool=gpu,team=ml");
    }
}
