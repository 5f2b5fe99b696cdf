//! How Azure Resource Manager's errors become [`CloudError`]s and unavailable offerings: one place for
//! its error codes, with the time each verdict is kept.
//!
//! A VM create fails either at once (the `PUT` answers an error) or later (its long-running operation ends
//! `Failed`); both carry `{"error": {"code", "message"}}` and are classified the same way by
//! [`launch_fault`].

use std::time::Duration;

use tenon_core::cloud::{CapacityType, CloudError};

/// What a failed VM create says about the offerings: which of them to keep out, and for how long.
#[derive(Debug, Clone, PartialEq)]
pub enum LaunchFault {
    /// Keep out `scope` for `ttl`; the next offering is tried.
    Unavailable {
        /// What is out.
        scope: Scope,
        /// For how long.
        ttl: Duration,
    },
    /// No capacity, but nothing to keep out: the region's total cores quota is used up, and a smaller
    /// size may still fit (nothing cached, as karpenter-provider-azure does).
    RegionalQuota,
    /// The request itself is wrong (or anything not known to be about capacity).
    Request,
}

/// Which offerings a [`LaunchFault::Unavailable`] keeps out. Each is about the size that failed, in the
/// zone it was asked for, bought as it was bought, unless it says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every spot offering of every size (the subscription's low-priority cores are used up).
    AllSpot,
    /// Every size of the SKU family (`standardNCADSA100v4Family`), bought this way, in every zone: the
    /// family's cores quota is zero.
    Family,
    /// This size and the larger ones of its family, bought this way, in every zone: the family's cores
    /// quota has room, but not for this size.
    FamilyFromSize,
    /// This size, bought this way, in this zone.
    Offering,
    /// This size in this zone, bought either way.
    SizeInZone,
    /// This size bought this way, in every zone.
    SizeAnyZone,
}

/// One hour: what most capacity verdicts are kept for.
pub const HOUR: Duration = Duration::from_secs(3600);

/// The meaning of an ARM error (`code`, `message`) answered to a VM create bought as `capacity`.
///
/// | code (and message) | keeps out | for |
/// |---|---|---|
/// | `OperationNotAllowed`, "LowPriorityCores" | every spot offering | 1 h |
/// | `OperationNotAllowed`, "Family Cores quota", "Current Limit: 0" | the family, this capacity type | 1 h |
/// | `OperationNotAllowed`, "Family Cores quota" | the size and its family's larger sizes, this capacity type | 10 min |
/// | `OperationNotAllowed`, "Total Regional Cores quota" | nothing (a smaller size may fit) | — |
/// | `SkuNotAvailable` | the size, this capacity type, this zone | spot 1 h, on-demand 23 h |
/// | `ZonalAllocationFailed`, `AllocationFailed` | the size in this zone, both capacity types | 1 h |
/// | `OverconstrainedZonalAllocationRequest` | the size, this capacity type, this zone | 1 h |
/// | `OverconstrainedAllocationRequest` | the size, this capacity type, every zone | 1 h |
pub fn launch_fault(code: &str, message: &str, capacity: CapacityType) -> LaunchFault {
    let unavailable = |scope, ttl| LaunchFault::Unavailable { scope, ttl };
    match code {
        "OperationNotAllowed" | "QuotaExceeded" if message.contains("LowPriorityCores") => {
            unavailable(Scope::AllSpot, HOUR)
        }
        "OperationNotAllowed" | "QuotaExceeded" if message.contains("Family Cores quota") => {
            if current_limit(message) == Some(0) {
                unavailable(Scope::Family, HOUR)
            } else {
                unavailable(Scope::FamilyFromSize, Duration::from_secs(600))
            }
        }
        "OperationNotAllowed" | "QuotaExceeded" if message.contains("Total Regional Cores quota") => {
            LaunchFault::RegionalQuota
        }
        "SkuNotAvailable" => unavailable(
            Scope::Offering,
            if capacity == CapacityType::Spot { HOUR } else { Duration::from_secs(23 * 3600) },
        ),
        "ZonalAllocationFailed" | "AllocationFailed" => unavailable(Scope::SizeInZone, HOUR),
        "OverconstrainedZonalAllocationRequest" => unavailable(Scope::Offering, HOUR),
        "OverconstrainedAllocationRequest" => unavailable(Scope::SizeAnyZone, HOUR),
        _ => LaunchFault::Request,
    }
}

/// The `Current Limit: N` of a quota message.
pub fn current_limit(message: &str) -> Option<u64> {
    let rest = message.split_once("Current Limit: ")?.1;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// An ARM error, as every call reports one.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmError {
    /// The HTTP status (0 when the request never got an answer).
    pub status: u16,
    /// ARM's error code (`SkuNotAvailable`, `ResourceNotFound`, …), or a description of the transport
    /// failure.
    pub code: String,
    /// ARM's message.
    pub message: String,
    /// The `Retry-After` of a 429.
    pub retry_after: Option<Duration>,
    /// What was being done (`PUT virtualMachines/aks-default-abc12`).
    pub context: String,
}

impl std::fmt::Display for ArmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({}): {}", self.context, self.code, self.status, self.message)
    }
}

impl std::error::Error for ArmError {}

impl ArmError {
    /// Whether the resource is gone: a 404, or ARM's `ResourceNotFound` / `NotFound` code.
    pub fn is_not_found(&self) -> bool {
        self.status == 404 || matches!(self.code.as_str(), "ResourceNotFound" | "NotFound")
    }
}

impl From<ArmError> for CloudError {
    fn from(e: ArmError) -> Self {
        match e.status {
            401 | 403 => CloudError::Unauthorized(e.to_string()),
            429 => CloudError::Throttled { retry_after: e.retry_after },
            _ if e.is_not_found() => CloudError::NotFound(e.to_string()),
            _ => CloudError::Other { provider: super::NAME.to_owned(), source: std::sync::Arc::new(e) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_messages_are_told_apart() {
        let family = "Operation could not be completed as it results in exceeding approved standardNCADSA100v4Family \
                      Cores quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current \
                      Limit: 0, Current Usage: 0, Additional Required: 24, (Minimum) New Limit Required: 24.";
        assert_eq!(
            launch_fault("OperationNotAllowed", family, CapacityType::OnDemand),
            LaunchFault::Unavailable { scope: Scope::Family, ttl: HOUR }
        );
        let some =
            family.replace("Current Limit: 0", "Current Limit: 48").replace("Current Usage: 0", "Current Usage: 40");
        assert_eq!(
            launch_fault("OperationNotAllowed", &some, CapacityType::OnDemand),
            LaunchFault::Unavailable { scope: Scope::FamilyFromSize, ttl: Duration::from_secs(600) }
        );
        let spot = "Operation could not be completed as it results in exceeding approved LowPriorityCores quota. \
                    Current Limit: 10, Current Usage: 8, Additional Required: 4";
        assert_eq!(
            launch_fault("OperationNotAllowed", spot, CapacityType::Spot),
            LaunchFault::Unavailable { scope: Scope::AllSpot, ttl: HOUR }
        );
        let total = "Operation could not be completed as it results in exceeding approved Total Regional Cores quota. \
                     Current Limit: 100, Current Usage: 96, Additional Required: 8";
        assert_eq!(launch_fault("OperationNotAllowed", total, CapacityType::OnDemand), LaunchFault::RegionalQuota);
        assert_eq!(launch_fault("OperationNotAllowed", "something else", CapacityType::OnDemand), LaunchFault::Request);
        assert_eq!(current_limit("Current Limit: 350, Current Usage"), Some(350));
        assert_eq!(current_limit("no limit here"), None);
    }

    #[test]
    fn sku_not_available_is_kept_longer_for_on_demand() {
        let od = launch_fault("SkuNotAvailable", "", CapacityType::OnDemand);
        assert_eq!(od, LaunchFault::Unavailable { scope: Scope::Offering, ttl: Duration::from_secs(23 * 3600) });
        let spot = launch_fault("SkuNotAvailable", "", CapacityType::Spot);
        assert_eq!(spot, LaunchFault::Unavailable { scope: Scope::Offering, ttl: HOUR });
    }

    #[test]
    fn http_statuses_become_cloud_errors() {
        let e = |status, code: &str| ArmError {
            status,
            code: code.into(),
            message: "m".into(),
            retry_after: Some(Duration::from_secs(7)),
            context: "GET x".into(),
        };
        assert!(matches!(CloudError::from(e(401, "AuthenticationFailed")), CloudError::Unauthorized(_)));
        assert!(matches!(CloudError::from(e(403, "AuthorizationFailed")), CloudError::Unauthorized(_)));
        assert!(matches!(
            CloudError::from(e(429, "TooManyRequests")),
            CloudError::Throttled { retry_after: Some(d) } if d == Duration::from_secs(7)
        ));
        assert!(matches!(CloudError::from(e(404, "ResourceNotFound")), CloudError::NotFound(_)));
        assert!(matches!(CloudError::from(e(409, "Conflict")), CloudError::Other { .. }));
    }
}
