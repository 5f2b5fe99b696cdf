//! EventBridge events delivered through the interruption queue, parsed into interruption notices.

use serde_json::Value;
use tenon_core::cloud::InterruptionKind;

/// One instance named by an event, and what happens to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The EC2 instance id.
    pub instance_id: String,
    /// What happens to it.
    pub kind: InterruptionKind,
}

/// Parses one queue message body. `Ok(vec![])` for a well-formed event that asks nothing of tenon (an
/// instance starting, a Health event about another service); `Err` for a body that is not an event tenon
/// knows.
pub fn parse(body: &str) -> Result<Vec<Notice>, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let field = |k: &str| v.get(k).and_then(Value::as_str);
    let source = field("source").ok_or("no \"source\"")?;
    let detail_type = field("detail-type").ok_or("no \"detail-type\"")?;
    let detail = v.get("detail").ok_or("no \"detail\"")?;
    let instance_id = || {
        detail
            .get("instance-id")
            .and_then(Value::as_str)
            .filter(|s| s.starts_with("i-"))
            .map(str::to_owned)
            .ok_or_else(|| format!("{detail_type}: detail.instance-id is missing or not an instance id"))
    };
    match (source, detail_type) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => {
            Ok(vec![Notice { instance_id: instance_id()?, kind: InterruptionKind::SpotInterruption }])
        }
        ("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning") => {
            Ok(vec![Notice { instance_id: instance_id()?, kind: InterruptionKind::ReservationInterruption }])
        }
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => {
            Ok(vec![Notice { instance_id: instance_id()?, kind: InterruptionKind::Rebalance }])
        }
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let state = detail
                .get("state")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{detail_type}: detail.state is missing"))?;
            let kind = match state {
                "stopping" | "stopped" => InterruptionKind::Stopping,
                "shutting-down" | "terminated" => InterruptionKind::Terminating,
                _ => return Ok(Vec::new()),
            };
            Ok(vec![Notice { instance_id: instance_id()?, kind }])
        }
        ("aws.health", "AWS Health Event") => {
            let service = detail.get("service").and_then(Value::as_str).unwrap_or_default();
            let category = detail.get("eventTypeCategory").and_then(Value::as_str).unwrap_or_default();
            if service != "EC2" || category != "scheduledChange" {
                return Ok(Vec::new());
            }
            let entities = detail
                .get("affectedEntities")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("{detail_type}: detail.affectedEntities is missing"))?;
            Ok(entities
                .iter()
                .filter_map(|e| e.get("entityValue").and_then(Value::as_str))
                .filter(|id| id.starts_with("i-"))
                .map(|id| Notice { instance_id: id.to_owned(), kind: InterruptionKind::ScheduledChange })
                .collect())
        }
        _ => Err(format!("unknown event {source:?} / {detail_type:?}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn reads_the_five_event_kinds() {
        let spot = r#"{"version":"0","id":"1","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2",
            "account":"123456789012","time":"2026-01-01T00:00:00Z","region":"us-east-1",
            "resources":["arn:aws:ec2:us-east-1b:instance/i-0abc"],"detail":{"instance-id":"i-0abc","instance-action":"terminate"}}"#;
        assert_eq!(
            parse(spot).unwrap(),
            [Notice { instance_id: "i-0abc".into(), kind: InterruptionKind::SpotInterruption }]
        );
        let rebalance = r#"{"source":"aws.ec2","detail-type":"EC2 Instance Rebalance Recommendation","detail":{"instance-id":"i-1"}}"#;
        assert_eq!(parse(rebalance).unwrap()[0].kind, InterruptionKind::Rebalance);
        let stopping = r#"{"source":"aws.ec2","detail-type":"EC2 Instance State-change Notification","detail":{"instance-id":"i-1","state":"stopping"}}"#;
        assert_eq!(parse(stopping).unwrap()[0].kind, InterruptionKind::Stopping);
        let running = r#"{"source":"aws.ec2","detail-type":"EC2 Instance State-change Notification","detail":{"instance-id":"i-1","state":"running"}}"#;
        assert!(parse(running).unwrap().is_empty());
        let health = r#"{"source":"aws.health","detail-type":"AWS Health Event","detail":{"service":"EC2",
            "eventTypeCategory":"scheduledChange","affectedEntities":[{"entityValue":"i-1"},{"entityValue":"i-2"}]}}"#;
        assert_eq!(parse(health).unwrap().len(), 2);
        let reservation = r#"{"version":"0","source":"aws.ec2","detail-type":"EC2 Capacity Reservation Instance Interruption Warning",
            "detail":{"instance-id":"i-7","instance-action":"terminate"}}"#;
        assert_eq!(
            parse(reservation).unwrap(),
            [Notice { instance_id: "i-7".into(), kind: InterruptionKind::ReservationInterruption }]
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse("hello").is_err());
        assert!(parse("{}").is_err());
        assert!(
            parse(r#"{"source":"aws.ec2","detail-type":"EC2 Spot Instance Interruption Warning","detail":{}}"#)
                .is_err()
        );
        assert!(parse(r#"{"source":"x","detail-type":"y","detail":{}}"#).is_err());
    }
}
