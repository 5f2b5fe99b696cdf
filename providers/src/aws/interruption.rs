//! Interruptions: EventBridge notices read from the SQS queue, and EC2's status checks, matched to this
//! cluster's instances.
//!
//! The status checks are read every minute with `DescribeInstanceStatus`, as Karpenter's instance-status
//! controller reads them, queue or no queue: an instance or system check failed for two minutes makes the
//! instance `Impaired` (terminated without waiting for a graceful drain); a scheduled reboot, maintenance,
//! retirement or stop makes it a `ScheduledChange` (drained and replaced first). An event EC2 marks
//! completed or canceled asks nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types as ec2;
use tenon_core::clock;
use tenon_core::cloud::{CloudError, Interruption, InterruptionKind};

use super::errors::{sdk_error, sqs_error};
use super::events;
use super::instances::provider_id;
use super::provider::{AwsProvider, NAME, filter};

impl AwsProvider {
    /// Reads the interruption queue's URL (a URL setting is used as is).
    pub(super) async fn queue_url(&self, queue: &str) -> Result<String, CloudError> {
        if queue.starts_with("http://") || queue.starts_with("https://") {
            return Ok(queue.to_owned());
        }
        if let Some(u) = self.state().queue_url.clone() {
            return Ok(u);
        }
        let resp = self
            .sqs
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(|e| sqs_error(&format!("GetQueueUrl {queue}"), e))?;
        let url = resp
            .queue_url()
            .ok_or_else(|| CloudError::message(NAME, format!("GetQueueUrl {queue}: no QueueUrl in the answer")))?
            .to_owned();
        self.state().queue_url = Some(url.clone());
        Ok(url)
    }

    /// Everything interrupting this cluster's instances: the queue's notices, then the status checks'.
    /// A status check that cannot be read is logged; the queue's notices still come back.
    pub(super) async fn read_interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        let mut found = self.queue_interruptions().await?;
        match self.status_check_interruptions().await {
            Ok(more) => {
                let queued: BTreeSet<String> = found.iter().map(|f| f.provider_id.clone()).collect();
                found.extend(more.into_iter().filter(|m| !queued.contains(&m.provider_id)));
            }
            Err(e) => tracing::warn!(error = %e, "reading EC2 status checks"),
        }
        Ok(found)
    }

    /// The notices on the interruption queue, deleted once read.
    async fn queue_interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        let Some(queue) = self.settings.interruption_queue.clone() else { return Ok(Vec::new()) };
        let url = self.queue_url(&queue).await?;
        let mut notices: Vec<events::Notice> = Vec::new();
        let mut handles: Vec<String> = Vec::new();
        let wait = i32::try_from(self.settings.interruption_wait.as_secs().min(20)).unwrap_or(0);
        // A bounded number of batches per call, so one call never runs unbounded.
        for _ in 0..10 {
            let resp = self
                .sqs
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .wait_time_seconds(if handles.is_empty() { wait } else { 0 })
                .visibility_timeout(20)
                .send()
                .await
                .map_err(|e| sqs_error(&format!("ReceiveMessage {queue}"), e))?;
            let messages = resp.messages();
            if messages.is_empty() {
                break;
            }
            for m in messages {
                match events::parse(m.body().unwrap_or_default()) {
                    Ok(n) => notices.extend(n),
                    Err(e) => tracing::warn!(
                        queue = %queue,
                        message_id = m.message_id().unwrap_or_default(),
                        error = %e,
                        "dropping an unreadable interruption message"
                    ),
                }
                handles.extend(m.receipt_handle().map(str::to_owned));
            }
        }
        // Resolved before the messages are deleted: if the lookup fails, they come back after their
        // visibility timeout.
        let found = self.interruptions_of(notices).await?;
        // A delete that fails leaves its message to come back after its visibility timeout (acted on
        // twice, harmlessly); the interruptions already read are still returned.
        for handle in handles {
            if let Err(e) = self.sqs.delete_message().queue_url(&url).receipt_handle(handle).send().await {
                tracing::warn!(queue = %queue, error = %sqs_error("DeleteMessage", e), "an interruption message stays queued");
            }
        }
        Ok(found)
    }

    /// Interruption notices with provider ids, for this cluster's instances only.
    pub(super) async fn interruptions_of(&self, notices: Vec<events::Notice>) -> Result<Vec<Interruption>, CloudError> {
        if notices.is_empty() {
            return Ok(Vec::new());
        }
        // Provider ids carry the zone: look the instances up (ours only).
        let ids: BTreeSet<String> = notices.iter().map(|n| n.instance_id.clone()).collect();
        let mut zone_of: HashMap<String, String> = HashMap::new();
        let resp = self.ec2.describe_instances().set_instance_ids(Some(ids.iter().cloned().collect())).send().await;
        let instances: Vec<ec2::Instance> = match resp {
            Ok(r) => r.reservations().iter().flat_map(|r| r.instances()).cloned().collect(),
            // One unknown id fails the whole call: look the others up one by one.
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {
                let mut found = Vec::new();
                for id in &ids {
                    match self.describe(id).await {
                        Ok(i) => found.push(i),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
                found
            }
            Err(e) => return Err(sdk_error("DescribeInstances for interruption events", e)),
        };
        for i in &instances {
            if let (true, Some(id), Some(zone)) =
                (self.owned(i), i.instance_id(), i.placement().and_then(|p| p.availability_zone()))
            {
                zone_of.insert(id.to_owned(), zone.to_owned());
                // A reservation taking its instances back has no room for new ones.
                let reclaimed =
                    notices.iter().any(|n| n.instance_id == id && n.kind == InterruptionKind::ReservationInterruption);
                if let (true, Some(r)) = (reclaimed, i.capacity_reservation_id()) {
                    self.mark_reservation_unavailable(r);
                }
            }
        }
        Ok(notices
            .into_iter()
            .filter_map(|n| {
                let zone = zone_of.get(&n.instance_id)?;
                Some(Interruption { provider_id: provider_id(zone, &n.instance_id), kind: n.kind })
            })
            .collect())
    }

    /// What EC2's status checks say of this cluster's instances, read at most every
    /// [`STATUS_CHECK_PERIOD`]; nothing once EC2 has refused the permission (logged once).
    async fn status_check_interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
        let now = self.now();
        {
            let mut st = self.state();
            if st.status_checks_refused
                || st.status_checked.is_some_and(|at| clock::since(now, at) < STATUS_CHECK_PERIOD)
            {
                return Ok(Vec::new());
            }
            st.status_checked = Some(now);
        }
        let queries = [
            filter("instance-status.status", ["impaired"]),
            filter("system-status.status", ["impaired"]),
            filter("event.code", SCHEDULED_EVENTS),
        ];
        let mut kinds: BTreeMap<String, InterruptionKind> = BTreeMap::new();
        for query in queries {
            let mut pages = self.ec2.describe_instance_status().filters(query).into_paginator().send();
            while let Some(page) = pages.next().await {
                let page = match page {
                    Ok(p) => p,
                    Err(e) if e.code() == Some("UnauthorizedOperation") => {
                        self.state().status_checks_refused = true;
                        tracing::error!(
                            "ec2:DescribeInstanceStatus is not allowed: impaired instances are not replaced until the \
                             permission is granted and tenon restarts"
                        );
                        return Ok(Vec::new());
                    }
                    Err(e) => return Err(sdk_error("DescribeInstanceStatus", e)),
                };
                for s in page.instance_statuses() {
                    let Some(id) = s.instance_id() else { continue };
                    if let Some(kind) = status_kind(s, now) {
                        let slot = kinds.entry(id.to_owned()).or_insert(kind);
                        if kind == InterruptionKind::Impaired {
                            *slot = kind;
                        }
                    }
                }
            }
        }
        let notices = kinds.into_iter().map(|(instance_id, kind)| events::Notice { instance_id, kind }).collect();
        self.interruptions_of(notices).await
    }
}

/// How often EC2's status checks are read.
pub(super) const STATUS_CHECK_PERIOD: Duration = Duration::from_secs(60);

/// How long a check must have failed before the instance counts as impaired (EC2 re-runs its checks;
/// a passing blip is not a broken machine).
pub(super) const UNHEALTHY_THRESHOLD: Duration = Duration::from_secs(120);

/// The scheduled-event codes that take an instance away (or down) for a while.
const SCHEDULED_EVENTS: [&str; 5] =
    ["instance-reboot", "system-reboot", "system-maintenance", "instance-retirement", "instance-stop"];

/// What one instance's status says: `Impaired` for an instance or system check failed for
/// [`UNHEALTHY_THRESHOLD`], `ScheduledChange` for a scheduled event still to come, else nothing.
fn status_kind(s: &ec2::InstanceStatus, now: jiff::Timestamp) -> Option<InterruptionKind> {
    let failed_long = |summary: Option<&ec2::InstanceStatusSummary>| {
        let Some(summary) = summary else { return false };
        summary.details().iter().any(|d| {
            let failed = d.status().is_some_and(|st| st.as_str() == "failed");
            let since = d.impaired_since().and_then(|t| jiff::Timestamp::from_second(t.secs()).ok());
            failed && since.is_some_and(|t| clock::since(now, t) >= UNHEALTHY_THRESHOLD)
        })
    };
    if failed_long(s.instance_status()) || failed_long(s.system_status()) {
        return Some(InterruptionKind::Impaired);
    }
    let pending = s.events().iter().any(|e| {
        let code = e.code().map(|c| c.as_str()).unwrap_or_default();
        let done = e.description().is_some_and(|d| d.starts_with("[Completed]") || d.starts_with("[Canceled]"));
        SCHEDULED_EVENTS.contains(&code) && !done
    });
    pending.then_some(InterruptionKind::ScheduledChange)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn failed_checks_count_after_two_minutes_and_scheduled_events_until_done() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let check = |status: &str, since_secs: Option<i64>| {
            let mut d = ec2::InstanceStatusDetails::builder()
                .name(ec2::StatusName::Reachability)
                .status(ec2::StatusType::from(status));
            if let Some(s) = since_secs {
                d = d.impaired_since(aws_smithy_types::DateTime::from_secs(now.as_second() - s));
            }
            ec2::InstanceStatusSummary::builder()
                .status(ec2::SummaryStatus::from(if status == "failed" { "impaired" } else { "ok" }))
                .details(d.build())
                .build()
        };
        let ok = check("passed", None);
        let status = |instance: ec2::InstanceStatusSummary,
                      system: ec2::InstanceStatusSummary,
                      events: Vec<ec2::InstanceStatusEvent>| {
            ec2::InstanceStatus::builder()
                .instance_id("i-1")
                .instance_status(instance)
                .system_status(system)
                .set_events(Some(events))
                .build()
        };
        assert_eq!(
            status_kind(&status(check("failed", Some(120)), ok.clone(), vec![]), now),
            Some(InterruptionKind::Impaired)
        );
        assert_eq!(
            status_kind(&status(ok.clone(), check("failed", Some(600)), vec![]), now),
            Some(InterruptionKind::Impaired)
        );
        assert_eq!(
            status_kind(&status(check("failed", Some(60)), ok.clone(), vec![]), now),
            None,
            "a minute is a blip"
        );
        let event = |code: &str, description: &str| {
            ec2::InstanceStatusEvent::builder().code(ec2::EventCode::from(code)).description(description).build()
        };
        assert_eq!(
            status_kind(&status(ok.clone(), ok.clone(), vec![event("system-reboot", "scheduled reboot")]), now),
            Some(InterruptionKind::ScheduledChange)
        );
        assert_eq!(
            status_kind(
                &status(ok.clone(), ok.clone(), vec![event("system-reboot", "[Completed] scheduled reboot")]),
                now
            ),
            None
        );
        assert_eq!(status_kind(&status(ok.clone(), ok, vec![]), now), None);
    }
}
