//! Bottlerocket: TOML settings. The user's TOML is kept; the cluster, label, taint and kubelet settings
//! are written over it.

use std::collections::BTreeMap;

use toml::{Table, Value};

use super::{Options, kubelet_labels};

/// The settings TOML.
pub fn user_data(o: &Options<'_>) -> Result<String, String> {
    let mut doc: Table = match o.custom.filter(|c| !c.trim().is_empty()) {
        Some(c) => c.parse().map_err(|e| format!("userData: not TOML: {e}"))?,
        None => Table::new(),
    };
    let settings = table(&mut doc, "settings")?;
    let k8s = table(settings, "kubernetes")?;
    let str_map = |m: &BTreeMap<String, String>| -> Value {
        Value::Table(m.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
    };
    k8s.insert("cluster-name".into(), Value::String(o.cluster.name.clone()));
    k8s.insert("api-server".into(), Value::String(o.cluster.endpoint.clone()));
    if let Some(ca) = o.cluster.ca_bundle.as_deref().filter(|c| !c.is_empty()) {
        k8s.insert("cluster-certificate".into(), Value::String(ca.to_owned()));
    }
    // The claim's labels join the user's.
    let labels = table(k8s, "node-labels")?;
    for (key, v) in kubelet_labels(o.labels) {
        labels.insert(key, Value::String(v));
    }
    let mut taints: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for t in o.taints {
        let value = format!("{}:{}", t.value.as_deref().unwrap_or_default(), t.effect);
        taints.entry(t.key.clone()).or_default().push(Value::String(value));
    }
    k8s.insert("node-taints".into(), Value::Table(taints.into_iter().map(|(k, v)| (k, Value::Array(v))).collect()));
    let kubelet = o.kubelet;
    if let Some(p) = kubelet.max_pods {
        k8s.insert("max-pods".into(), Value::Integer(p));
    }
    if let Some(dns) = kubelet.cluster_dns.first() {
        k8s.insert("cluster-dns-ip".into(), Value::String(dns.clone()));
    }
    for (key, map) in [
        ("system-reserved", &kubelet.system_reserved),
        ("kube-reserved", &kubelet.kube_reserved),
        ("eviction-hard", &kubelet.eviction_hard),
        ("eviction-soft", &kubelet.eviction_soft),
        ("eviction-soft-grace-period", &kubelet.eviction_soft_grace_period),
    ] {
        if !map.is_empty() {
            k8s.insert(key.into(), str_map(map));
        }
    }
    if let Some(v) = kubelet.eviction_max_pod_grace_period {
        k8s.insert("eviction-max-pod-grace-period".into(), Value::Integer(v));
    }
    if let Some(v) = kubelet.image_gc_high_threshold_percent {
        k8s.insert("image-gc-high-threshold-percent".into(), Value::String(v.to_string()));
    }
    if let Some(v) = kubelet.image_gc_low_threshold_percent {
        k8s.insert("image-gc-low-threshold-percent".into(), Value::String(v.to_string()));
    }
    if let Some(v) = kubelet.cpu_cfs_quota {
        k8s.insert("cpu-cfs-quota-enforced".into(), Value::Boolean(v));
    }
    if o.raid0 {
        let commands = table(settings, "bootstrap-commands")?;
        let bind = [
            "apiclient",
            "ephemeral-storage",
            "bind",
            "--dirs",
            "/var/lib/containerd",
            "/var/lib/kubelet",
            "/var/log/pods",
        ];
        let cmd = |c: &[&str]| Value::Array(c.iter().map(|s| Value::String((*s).to_owned())).collect());
        let mut mount = Table::new();
        mount.insert(
            "commands".into(),
            Value::Array(vec![cmd(&["apiclient", "ephemeral-storage", "init"]), cmd(&bind)]),
        );
        mount.insert("essential".into(), Value::Boolean(true));
        mount.insert("mode".into(), Value::String("always".into()));
        commands.insert("000-mount-instance-storage".into(), Value::Table(mount));
    }
    toml::to_string(&doc).map_err(|e| e.to_string())
}

/// The table at `key` in `parent`, created when missing; an error when it is something else.
fn table<'t>(parent: &'t mut Table, key: &str) -> Result<&'t mut Table, String> {
    let v = parent.entry(key).or_insert_with(|| Value::Table(Table::new()));
    match v {
        Value::Table(t) => Ok(t),
        _ => Err(format!("userData: {key} is not a TOML table")),
    }
}
