//! DaemonSet overhead, charged per realization.
//!
//! A NodePool template and an instance type leave some labels open: a claim may land in one of several
//! zones, or realize `accelerator=gpu` or `accelerator=tpu`. DaemonSets select different realizations, and
//! no node ever runs two DaemonSets that select disjoint ones. So instead of summing every DaemonSet that
//! could match (which charges a GPU plugin and a TPU plugin to the same node), the overhead is computed per
//! realization of the labels DaemonSets disagree on, and the element-wise maximum is charged. A DaemonSet
//! whose selector mentions a label the node side leaves undefined is charged (it might match). Past 4,096
//! realizations the computation falls back to summing every compatible DaemonSet.

use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::requirements::{Requirement, Requirements};
use super::taints;
use crate::resources::Resources;

/// The most realizations enumerated before falling back to summing.
pub const MAX_REALIZATIONS: usize = 4096;

/// The pod a DaemonSet would run on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonPod {
    /// `namespace/name` of the DaemonSet.
    pub name: String,
    /// The pod's requests.
    pub requests: Resources,
    /// The OR-ed node requirements of the pod (nodeSelector ∩ each required term).
    pub alternatives: Vec<Requirements>,
    /// The pod's tolerations.
    pub tolerations: Vec<Toleration>,
}

impl DaemonPod {
    /// Whether the daemon pod tolerates every taint of a node.
    pub fn tolerates(&self, node_taints: &[Taint]) -> bool {
        taints::untolerated(node_taints, &self.tolerations, false).is_none()
    }

    /// Whether some alternative of the daemon could match a node described by `node` (keys the node side
    /// leaves undefined count as a match).
    pub fn might_match(&self, node: &Requirements) -> bool {
        self.alternatives.iter().any(|alt| node.is_intersecting(alt))
    }

    /// Whether the daemon runs on a registered node with exactly these `labels` (a key the node lacks
    /// fails `In` and `Exists`, as kube-scheduler judges it).
    pub fn runs_on(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.runs_on_with(|k| labels.get(k).map(String::as_str))
    }

    /// As [`DaemonPod::runs_on`], for a node whose labels `label` looks up by key.
    pub fn runs_on_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.alternatives.iter().any(|alt| alt.iter().all(|r| r.matches(label(r.key()))))
    }
}

/// The overhead of `daemons` on a node described by `node` (template requirements ∩ instance type), charged
/// per realization; the daemons must already be filtered by taints.
pub fn daemon_overhead(node: &Requirements, daemons: &[&DaemonPod]) -> Resources {
    let candidates: Vec<&DaemonPod> = daemons.iter().copied().filter(|d| d.might_match(node)).collect();
    if candidates.is_empty() {
        return Resources::ZERO;
    }
    // Keys the candidates mention that the node leaves open to several values.
    let mut choices: Vec<Vec<Requirement>> = Vec::new();
    let mut keys: Vec<&str> =
        candidates.iter().flat_map(|d| d.alternatives.iter().flat_map(|a| a.iter().map(Requirement::key))).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut total: usize = 1;
    for key in keys {
        let Some(open) = node.get(key).filter(|r| r.len() > 1) else { continue };
        let mentioned: Vec<String> = candidates
            .iter()
            .flat_map(|d| d.alternatives.iter().filter_map(|a| a.get(key)))
            .flat_map(|r| r.values().iter().cloned())
            .filter(|v| open.has(v))
            .collect();
        let mut options: Vec<Requirement> = Vec::new();
        let mut seen: Vec<&String> = Vec::new();
        for v in &mentioned {
            if !seen.contains(&v) {
                seen.push(v);
                options.push(Requirement::is_in(key, [v.clone()]));
            }
        }
        // The values no DaemonSet mentions form one more realization, if any remain.
        let rest = open.intersect(&Requirement::not_in(key, mentioned.iter().cloned()));
        if !rest.is_empty() {
            options.push(rest);
        }
        total = total.saturating_mul(options.len().max(1));
        choices.push(options);
    }
    if total > MAX_REALIZATIONS {
        return Resources::sum_of(candidates.iter().map(|d| &d.requests));
    }
    let mut worst = Resources::ZERO;
    let mut index = vec![0usize; choices.len()];
    loop {
        let mut realization = node.clone();
        for (c, i) in choices.iter().zip(&index) {
            realization.add(c[*i].clone());
        }
        let sum = Resources::sum_of(candidates.iter().filter(|d| d.might_match(&realization)).map(|d| &d.requests));
        worst.max_assign(&sum);
        // Next realization (odometer order).
        let mut k = 0;
        loop {
            if k == index.len() {
                return worst;
            }
            index[k] += 1;
            if index[k] < choices[k].len() {
                break;
            }
            index[k] = 0;
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceName;

    fn daemon(name: &str, cpu: i64, alt: Option<(&str, &str)>) -> DaemonPod {
        DaemonPod {
            name: name.into(),
            requests: Resources::cpu_memory(cpu, 0),
            alternatives: vec![
                alt.map(|(k, v)| [Requirement::is_in(k, [v])].into_iter().collect()).unwrap_or_default(),
            ],
            tolerations: Vec::new(),
        }
    }

    /// The cilium / gpu-plugin / tpu-plugin example of the fleet-pricing text.
    #[test]
    fn charges_the_worst_realization_not_the_sum() {
        let cilium = daemon("kube-system/cilium", 200, None);
        let gpu = daemon("kube-system/gpu-plugin", 500, Some(("example.com/accelerator", "gpu")));
        let tpu = daemon("kube-system/tpu-plugin", 300, Some(("example.com/accelerator", "tpu")));
        let node: Requirements = [Requirement::is_in("example.com/accelerator", ["gpu", "tpu"])].into_iter().collect();
        let overhead = daemon_overhead(&node, &[&cilium, &gpu, &tpu]);
        assert_eq!(overhead.get(ResourceName::CPU), 700, "max(200+500, 200+300), not 1000");
        // A node that can only be a GPU node pays for the GPU plugin only.
        let gpu_node: Requirements = [Requirement::is_in("example.com/accelerator", ["gpu"])].into_iter().collect();
        assert_eq!(daemon_overhead(&gpu_node, &[&cilium, &gpu, &tpu]).get(ResourceName::CPU), 700);
        let tpu_node: Requirements = [Requirement::is_in("example.com/accelerator", ["tpu"])].into_iter().collect();
        assert_eq!(daemon_overhead(&tpu_node, &[&cilium, &gpu, &tpu]).get(ResourceName::CPU), 500);
    }

    #[test]
    fn a_daemon_needing_a_label_to_exist_is_not_charged_to_a_type_without_it() {
        let mut gpu = daemon("gpu-plugin", 500, None);
        gpu.alternatives = vec![[Requirement::exists("example.com/gpu-name")].into_iter().collect()];
        let cpu_type: Requirements = [Requirement::does_not_exist("example.com/gpu-name")].into_iter().collect();
        assert_eq!(daemon_overhead(&cpu_type, &[&gpu]), Resources::ZERO);
        let gpu_type: Requirements = [Requirement::is_in("example.com/gpu-name", ["t4"])].into_iter().collect();
        assert_eq!(daemon_overhead(&gpu_type, &[&gpu]).get(ResourceName::CPU), 500);
    }

    #[test]
    fn undefined_labels_are_charged_conservatively() {
        let cilium = daemon("cilium", 200, None);
        let gpu = daemon("gpu-plugin", 500, Some(("example.com/accelerator", "gpu")));
        let tpu = daemon("tpu-plugin", 300, Some(("example.com/accelerator", "tpu")));
        // The node side says nothing about the label: either plugin might run, and nothing proves they
        // cannot both (the label could be anything), so each is charged.
        let overhead = daemon_overhead(&Requirements::new(), &[&cilium, &gpu, &tpu]);
        assert_eq!(overhead.get(ResourceName::CPU), 1000);
    }

    #[test]
    fn open_values_nobody_mentions_form_their_own_realization() {
        let gpu = daemon("gpu-plugin", 500, Some(("zone", "a")));
        let node: Requirements = [Requirement::exists("zone")].into_iter().collect();
        assert_eq!(daemon_overhead(&node, &[&gpu]).get(ResourceName::CPU), 500);
    }

    #[test]
    fn too_many_realizations_fall_back_to_the_sum() {
        // 13 binary keys → 8,192 realizations.
        let mut node = Requirements::new();
        let mut daemons = Vec::new();
        for i in 0..13 {
            let key = format!("k{i}");
            node.add(Requirement::is_in(&key, ["x", "y"]));
            daemons.push(daemon(&format!("x{i}"), 10, None));
            daemons.last_mut().unwrap().alternatives = vec![[Requirement::is_in(&key, ["x"])].into_iter().collect()];
            daemons.push(daemon(&format!("y{i}"), 10, None));
            daemons.last_mut().unwrap().alternatives = vec![[Requirement::is_in(&key, ["y"])].into_iter().collect()];
        }
        let refs: Vec<&DaemonPod> = daemons.iter().collect();
        assert_eq!(daemon_overhead(&node, &refs).get(ResourceName::CPU), 260, "every compatible daemon summed");
        // With 12 keys (4,096 realizations) the realization-aware answer holds: one of x/y per key.
        let refs: Vec<&DaemonPod> = daemons.iter().take(24).collect();
        let mut node12 = Requirements::new();
        for i in 0..12 {
            node12.add(Requirement::is_in(&format!("k{i}"), ["x", "y"]));
        }
        assert_eq!(daemon_overhead(&node12, &refs).get(ResourceName::CPU), 120);
    }
}
