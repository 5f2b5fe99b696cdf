//! AL2: `/etc/eks/bootstrap.sh` joins the node; its kubelet settings are flags.

use std::net::IpAddr;

use super::mime::{self, Part};
use super::{Options, node_labels_flag, taint_string};

/// The MIME archive: the user's parts first, then the bootstrap script.
pub fn user_data(o: &Options<'_>) -> Result<String, String> {
    let mut parts = match o.custom.filter(|c| !c.trim().is_empty()) {
        None => Vec::new(),
        Some(c) if mime::is_archive(c) => mime::parse(c)?,
        Some(c) => vec![Part { content_type: mime::SHELL.into(), content: c.to_owned() }],
    };
    parts.push(Part { content_type: mime::SHELL.into(), content: script(o) });
    Ok(mime::serialize(&parts))
}

/// Single-quotes `s` for the shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The bootstrap script.
pub fn script(o: &Options<'_>) -> String {
    let k = o.kubelet;
    let mut s = String::from(
        "#!/bin/bash -xe\nexec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1\n",
    );
    s.push_str(&format!(
        "/etc/eks/bootstrap.sh {} --apiserver-endpoint {}",
        quote(&o.cluster.name),
        quote(&o.cluster.endpoint)
    ));
    if let Some(ca) = o.cluster.ca_bundle.as_deref().filter(|c| !c.is_empty()) {
        s.push_str(&format!(" --b64-cluster-ca {}", quote(ca)));
    }
    if let Some(dns) = k.cluster_dns.first() {
        if dns.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6()) {
            s.push_str(" \\\n--ip-family ipv6");
        }
        s.push_str(&format!(" \\\n--dns-cluster-ip {}", quote(dns)));
    }
    if k.max_pods.is_some() {
        s.push_str(" \\\n--use-max-pods false");
    }
    let args = kubelet_args(o);
    if !args.is_empty() {
        s.push_str(&format!(" \\\n--kubelet-extra-args {}", quote(&args.join(" "))));
    }
    if o.raid0 {
        s.push_str(" \\\n--local-disks raid0");
    }
    s.push('\n');
    s
}

/// The kubelet flags of the class's settings, the labels and the taints.
pub fn kubelet_args(o: &Options<'_>) -> Vec<String> {
    let k = o.kubelet;
    let mut args = Vec::new();
    args.extend(node_labels_flag(o.labels));
    let taints: Vec<String> = o.taints.iter().map(taint_string).collect();
    args.push(format!("--register-with-taints={}", taints.join(",")));
    let join = |m: &std::collections::BTreeMap<String, String>, sep: &str| {
        m.iter().map(|(k, v)| format!("{k}{sep}{v}")).collect::<Vec<_>>().join(",")
    };
    if let Some(p) = k.max_pods {
        args.push(format!("--max-pods={p}"));
    }
    if let Some(p) = k.pods_per_core {
        args.push(format!("--pods-per-core={p}"));
    }
    for (flag, map, sep) in [
        ("--system-reserved", &k.system_reserved, "="),
        ("--kube-reserved", &k.kube_reserved, "="),
        ("--eviction-hard", &k.eviction_hard, "<"),
        ("--eviction-soft", &k.eviction_soft, "<"),
        ("--eviction-soft-grace-period", &k.eviction_soft_grace_period, "="),
    ] {
        if !map.is_empty() {
            args.push(format!("{flag}={}", join(map, sep)));
        }
    }
    if let Some(v) = k.eviction_max_pod_grace_period {
        args.push(format!("--eviction-max-pod-grace-period={v}"));
    }
    if let Some(v) = k.image_gc_high_threshold_percent {
        args.push(format!("--image-gc-high-threshold={v}"));
    }
    if let Some(v) = k.image_gc_low_threshold_percent {
        args.push(format!("--image-gc-low-threshold={v}"));
    }
    if let Some(v) = k.cpu_cfs_quota {
        args.push(format!("--cpu-cfs-quota={v}"));
    }
    args
}
