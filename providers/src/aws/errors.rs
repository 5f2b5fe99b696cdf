//! How AWS answers become [`CloudError`]s: one place for every service's error codes and for the
//! per-override codes `CreateFleet` reports.

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use tenon_core::cloud::CloudError;

use super::provider::NAME;

/// What a per-override `CreateFleet` error code means for the launches after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FleetFault {
    /// Not about capacity: the request itself is wrong (a `CreateError` when nothing launched).
    Request,
    /// No capacity for the offering now.
    Capacity,
    /// The vCPU quota of the type's bucket is used up, for the override's capacity type (quota is handled
    /// as capacity, as Karpenter does).
    VcpuQuota,
    /// No spot instance can be launched now: the account's spot count limit, or the spot service-linked
    /// role cannot be created.
    NoSpot,
    /// The override's subnet has no free address.
    SubnetFull,
    /// The capacity reservation the override targets is full.
    ReservationFull,
}

/// The meaning of a per-override `CreateFleet` error code.
pub(super) fn fleet_fault(code: &str) -> FleetFault {
    match code {
        "InsufficientInstanceCapacity" | "UnfulfillableCapacity" | "Unsupported" | "MaxFleetCountExceeded" => {
            FleetFault::Capacity
        }
        "VcpuLimitExceeded" => FleetFault::VcpuQuota,
        "MaxSpotInstanceCountExceeded" | "AuthFailure.ServiceLinkedRoleCreationNotPermitted" => FleetFault::NoSpot,
        "InsufficientFreeAddressesInSubnet" => FleetFault::SubnetFull,
        "ReservationCapacityExceeded" | "InsufficientCapacityReservation" => FleetFault::ReservationFull,
        _ => FleetFault::Request,
    }
}

/// Whether a `CreateFleet` error code says a launch template it names is gone
/// (`InvalidLaunchTemplateName.NotFoundException`, `InvalidLaunchTemplateId.NotFound`).
pub(super) fn launch_template_missing(code: &str) -> bool {
    code.contains("LaunchTemplate") && code.contains("NotFound")
}

/// An AWS SDK error (any service's: they share one response type) as a [`CloudError`] by its code.
pub(super) fn sdk_error<E>(op: &str, e: SdkError<E, aws_sdk_ec2::config::http::HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let code = e.code().unwrap_or_default().to_owned();
    let message = format!("{op}: {}", DisplayErrorContext(&e));
    match code.as_str() {
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" => CloudError::NotFound(message),
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
            CloudError::Throttled { retry_after: None }
        }
        "UnauthorizedOperation" | "AuthFailure" | "AccessDenied" | "AccessDeniedException" | "InvalidClientTokenId" => {
            CloudError::Unauthorized(message)
        }
        _ => CloudError::message(NAME, message),
    }
}

pub(super) fn sqs_error<E>(op: &str, e: SdkError<E, aws_sdk_sqs::config::http::HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    CloudError::message(NAME, format!("{op}: {}", DisplayErrorContext(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_codes_are_classified_as_karpenter_classifies_them() {
        for code in ["InsufficientInstanceCapacity", "UnfulfillableCapacity", "Unsupported", "MaxFleetCountExceeded"] {
            assert_eq!(fleet_fault(code), FleetFault::Capacity, "{code}");
        }
        assert_eq!(fleet_fault("VcpuLimitExceeded"), FleetFault::VcpuQuota);
        assert_eq!(fleet_fault("MaxSpotInstanceCountExceeded"), FleetFault::NoSpot);
        assert_eq!(fleet_fault("AuthFailure.ServiceLinkedRoleCreationNotPermitted"), FleetFault::NoSpot);
        assert_eq!(fleet_fault("InsufficientFreeAddressesInSubnet"), FleetFault::SubnetFull);
        assert_eq!(fleet_fault("ReservationCapacityExceeded"), FleetFault::ReservationFull);
        assert_eq!(fleet_fault("InvalidParameterValue"), FleetFault::Request);
        assert!(launch_template_missing("InvalidLaunchTemplateName.NotFoundException"));
        assert!(launch_template_missing("InvalidLaunchTemplateId.NotFound"));
        assert!(!launch_template_missing("InvalidAMIID.NotFound"));
    }
}
