//! How Compute Engine's answers become [`CloudError`]s: one place for its error codes.
//!
//! An operation that fails carries `error.errors[].code`, read here directly (the client's poller keeps only
//! the first error and maps `ZONE_RESOURCE_POOL_EXHAUSTED` to `Unknown`).

use tenon_core::cloud::CloudError;

use super::provider::NAME;

/// What one error code of a failed insert says about the offerings after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertFault {
    /// The zone has no capacity for the machine type now.
    Capacity,
    /// The subnetwork has no address left.
    IpSpace,
    /// A quota is used up: its metric (`CPUS`, `N2_CPUS`, `NVIDIA_L4_GPUS`, `PREEMPTIBLE_CPUS`, …).
    Quota(String),
    /// The request itself is wrong.
    Request,
}

/// The meaning of one `error.errors[]` entry.
pub fn insert_fault(code: &str, message: &str) -> InsertFault {
    match code {
        "ZONE_RESOURCE_POOL_EXHAUSTED" | "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" | "STOCKOUT" => {
            InsertFault::Capacity
        }
        "IP_SPACE_EXHAUSTED" | "IP_SPACE_EXHAUSTED_WITH_DETAILS" => InsertFault::IpSpace,
        "QUOTA_EXCEEDED" => InsertFault::Quota(quota_metric(message).unwrap_or("CPUS").to_owned()),
        _ => InsertFault::Request,
    }
}

/// The metric a quota message names: `Quota 'NVIDIA_L4_GPUS' exceeded. Limit: 8.0 in region us-central1.`
pub fn quota_metric(message: &str) -> Option<&str> {
    let rest = message.split_once("Quota '")?.1;
    let metric = rest.split_once('\'')?.0;
    (!metric.is_empty() && metric.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'))
        .then_some(metric)
}

/// Whether quota `metric` limits `machine_type` (whose GPUs are `gpu_model`, an accelerator type such as
/// `nvidia-tesla-a100`) bought as spot (`spot`): `CPUS` limits every type; `PREEMPTIBLE_*` only spot; a
/// family's CPUs (`N2_CPUS`) its types; a GPU model's quota (`NVIDIA_A100_GPUS`) the types with that
/// model (and its larger variants, `A100_80GB`, conservatively).
pub fn quota_limits(metric: &str, machine_type: &str, gpu_model: Option<&str>, spot: bool) -> bool {
    let (preemptible, metric) = match metric.strip_prefix("PREEMPTIBLE_") {
        Some(rest) => (true, rest),
        None => (false, metric),
    };
    if preemptible && !spot {
        return false;
    }
    if metric == "CPUS" {
        return true;
    }
    if let Some(model) = metric.strip_prefix("NVIDIA_").and_then(|m| m.strip_suffix("_GPUS")) {
        let Some(gpu) = gpu_model else { return false };
        let gpu = gpu.trim_start_matches("nvidia-").trim_start_matches("tesla-").to_ascii_uppercase().replace('-', "_");
        return gpu == model || gpu.starts_with(&format!("{model}_"));
    }
    if let Some(family) = metric.strip_suffix("_CPUS") {
        return machine_type.split('-').next().is_some_and(|f| f.eq_ignore_ascii_case(family));
    }
    false
}

/// A client error as a [`CloudError`]: 404 is gone, 403 unauthorized, 429 throttled.
pub fn client_error(op: &str, e: &google_cloud_compute_v1::Error) -> CloudError {
    let message = format!("{op}: {e}");
    match e.http_status_code() {
        Some(404) => CloudError::NotFound(message),
        Some(401 | 403) => CloudError::Unauthorized(message),
        Some(429) => CloudError::Throttled { retry_after: None },
        _ => CloudError::message(NAME, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_errors_are_classified() {
        assert_eq!(insert_fault("ZONE_RESOURCE_POOL_EXHAUSTED", ""), InsertFault::Capacity);
        assert_eq!(insert_fault("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", ""), InsertFault::Capacity);
        assert_eq!(insert_fault("IP_SPACE_EXHAUSTED", ""), InsertFault::IpSpace);
        let q = "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 8.0 in region us-central1.";
        assert_eq!(insert_fault("QUOTA_EXCEEDED", q), InsertFault::Quota("NVIDIA_L4_GPUS".into()));
        assert_eq!(insert_fault("INVALID_FIELD_VALUE", "bad"), InsertFault::Request);
    }

    #[test]
    fn quotas_limit_the_types_they_name() {
        assert!(quota_limits("CPUS", "n2-standard-8", None, false));
        assert!(quota_limits("N2_CPUS", "n2-standard-8", None, true));
        assert!(!quota_limits("N2_CPUS", "n2d-standard-8", None, true));
        assert!(quota_limits("PREEMPTIBLE_CPUS", "e2-standard-4", None, true));
        assert!(!quota_limits("PREEMPTIBLE_CPUS", "e2-standard-4", None, false));
        assert!(quota_limits("NVIDIA_L4_GPUS", "g2-standard-24", Some("nvidia-l4"), false));
        assert!(!quota_limits("NVIDIA_L4_GPUS", "a2-highgpu-1g", Some("nvidia-tesla-a100"), false));
        assert!(quota_limits("NVIDIA_A100_GPUS", "a2-highgpu-1g", Some("nvidia-tesla-a100"), false));
        assert!(quota_limits("NVIDIA_H100_GPUS", "a3-highgpu-8g", Some("nvidia-h100-80gb"), false));
        assert!(!quota_limits("PREEMPTIBLE_NVIDIA_L4_GPUS", "g2-standard-24", Some("nvidia-l4"), false));
        assert!(!quota_limits("NVIDIA_L4_GPUS", "n2-standard-8", None, false));
    }
}
