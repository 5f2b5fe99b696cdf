//! Interruptions: EventBridge notices read from the SQS queue, matched to this cluster's instances.

use std::collections::{BTreeSet, HashMap};

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types as ec2;
use tenon_core::cloud::{CloudError, Interruption};

use super::errors::{sdk_error, sqs_error};
use super::events;
use super::instances::provider_id;
use super::provider::{AwsProvider, NAME};

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

    pub(super) async fn read_interruptions(&self) -> Result<Vec<Interruption>, CloudError> {
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
}
