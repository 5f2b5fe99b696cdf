//! Interruptions of Azure VMs, from a documented source: Azure Resource Health's VM annotations, which
//! Event Grid publishes on the *Health Resources* system topic as
//! `Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated`, delivered by an event
//! subscription to a Service Bus queue that the provider drains (`AzureSettings::interruption_queue`).
//!
//! Scheduled Events (IMDS) would warn earlier but answer only inside each VM; the Health Resources topic
//! covers every VM of the subscription from one place, which is what a controller needs. Of the
//! annotations (Resource Health's "virtual machine health annotations"):
//! - `VirtualMachinePreempted`: a spot VM evicted ([`InterruptionKind::SpotInterruption`]);
//! - planned maintenance, repairs and a host predicted to fail (`VirtualMachinePossiblyDegradedDueTo
//!   HardwareFailure`, `VirtualMachineRebootInitiatedForPlannedMaintenance`,
//!   `VirtualMachineMigrationInitiatedForRepair`, `VirtualMachineHostRebootedForRepair`):
//!   [`InterruptionKind::ScheduledChange`], so the node is replaced
//!   before the platform takes it;
//! - every other annotation (a user's restart, a deallocation tenon asked for) is not an interruption.
//!
//! Both Event Grid schemas are read: CloudEvents 1.0 (`type`, `subject`, `data`) and Event Grid's own
//! (`eventType`, `subject`, `data`), one event per message or an array of them.

use serde::Deserialize;
use tenon_core::cloud::InterruptionKind;

/// The event type read.
pub const RESOURCE_ANNOTATED: &str = "Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated";

/// Annotations that are a scheduled change of the VM's host.
pub const SCHEDULED_ANNOTATIONS: [&str; 4] = [
    "VirtualMachinePossiblyDegradedDueToHardwareFailure",
    "VirtualMachineRebootInitiatedForPlannedMaintenance",
    "VirtualMachineMigrationInitiatedForRepair",
    "VirtualMachineHostRebootedForRepair",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default, rename = "type")]
    cloud_event_type: Option<String>,
    #[serde(default)]
    event_type: Option<String>,
    #[serde(default)]
    data: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    resource_info: ResourceInfo,
}

#[derive(Debug, Deserialize)]
struct ResourceInfo {
    properties: Properties,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Properties {
    target_resource_id: String,
    #[serde(default)]
    annotation_name: String,
}

/// One interruption an event reports: the VM's resource id (lower-cased, as ids compare without case)
/// and its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// `/subscriptions/…/virtualMachines/<name>`, lower-cased.
    pub resource_id: String,
    /// What happens to it.
    pub kind: InterruptionKind,
    /// The annotation, for the log.
    pub annotation: String,
}

/// The kind an annotation means, if it is an interruption.
pub fn kind_of(annotation: &str) -> Option<InterruptionKind> {
    if annotation == "VirtualMachinePreempted" {
        Some(InterruptionKind::SpotInterruption)
    } else if SCHEDULED_ANNOTATIONS.contains(&annotation) {
        Some(InterruptionKind::ScheduledChange)
    } else {
        None
    }
}

/// The interruptions a queue message reports (none for other events); an error says why the message
/// does not read.
pub fn parse_message(body: &str) -> Result<Vec<Reported>, String> {
    let value: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let events: Vec<Event> = match value {
        serde_json::Value::Array(items) => items
            .into_iter()
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("not an event: {e}"))?,
        v => vec![serde_json::from_value(v).map_err(|e| format!("not an event: {e}"))?],
    };
    let mut out = Vec::new();
    for e in events {
        let ty = e.cloud_event_type.or(e.event_type).unwrap_or_default();
        if ty != RESOURCE_ANNOTATED {
            continue;
        }
        let data = e.data.ok_or("a ResourceAnnotated event without data")?;
        let data: Data = serde_json::from_value(data).map_err(|e| format!("a ResourceAnnotated event: {e}"))?;
        let p = data.resource_info.properties;
        if let Some(kind) = kind_of(&p.annotation_name) {
            out.push(Reported {
                resource_id: p.target_resource_id.to_ascii_lowercase(),
                kind,
                annotation: p.annotation_name,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn cloud_event(annotation: &str) -> String {
        serde_json::json!({
            "id": "1", "source": "/subscriptions/s", "specversion": "1.0", "type": RESOURCE_ANNOTATED,
            "subject": "/subscriptions/s/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachines/aks-a-1",
            "time": "2026-12-01T01:39:48.3385828Z",
            "data": {"resourceInfo": {
                "id": "/subscriptions/s/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachines/aks-a-1/providers/Microsoft.ResourceHealth/resourceAnnotations/current",
                "name": "current", "type": "Microsoft.ResourceHealth/resourceAnnotations",
                "properties": {
                    "targetResourceId": "/subscriptions/s/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachines/aks-a-1",
                    "targetResourceType": "Microsoft.Compute/virtualMachines", "occurredTime": "2026-12-01T01:39:48Z",
                    "annotationName": annotation, "reason": "r", "summary": "s", "context": "Platform Initiated",
                    "category": "Unplanned", "impactType": "Informational"}},
                "operationalInfo": {"resourceEventTime": "2026-12-01T01:39:48+00:00"}, "apiVersion": "2022-08-01"}
        })
        .to_string()
    }

    #[test]
    fn preemption_and_maintenance_annotations_are_interruptions() {
        let r = parse_message(&cloud_event("VirtualMachinePreempted")).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kind, InterruptionKind::SpotInterruption);
        assert_eq!(
            r[0].resource_id,
            "/subscriptions/s/resourcegroups/mc_rg/providers/microsoft.compute/virtualmachines/aks-a-1"
        );
        let r = parse_message(&cloud_event("VirtualMachinePossiblyDegradedDueToHardwareFailure")).unwrap();
        assert_eq!(r[0].kind, InterruptionKind::ScheduledChange);
        assert!(parse_message(&cloud_event("VirtualMachineRebootInitiatedByControlPlane")).unwrap().is_empty());
    }

    #[test]
    fn the_event_grid_schema_and_arrays_read_too_and_other_events_are_skipped() {
        let mut v: serde_json::Value = serde_json::from_str(&cloud_event("VirtualMachinePreempted")).unwrap();
        let o = v.as_object_mut().unwrap();
        let ty = o.remove("type").unwrap();
        o.insert("eventType".into(), ty);
        let other =
            serde_json::json!({"eventType": "Microsoft.Resources.ResourceWriteSuccess", "subject": "x", "data": {}});
        let r = parse_message(&serde_json::json!([v, other]).to_string()).unwrap();
        assert_eq!(r.len(), 1);
        assert!(parse_message("not json").unwrap_err().contains("not JSON"));
        let broken = serde_json::json!({"type": RESOURCE_ANNOTATED});
        assert!(parse_message(&broken.to_string()).is_err());
    }
}
