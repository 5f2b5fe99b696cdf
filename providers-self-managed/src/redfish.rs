//! A Redfish client over HTTP(S): power state, `ComputerSystem.Reset` and one-time boot overrides.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

use crate::bmc::{Bmc, BmcError, BmcErrorKind, BmcTarget, PowerState, ResetType};

/// Default time allowed for one BMC request.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Speaks Redfish to BMCs with Basic authentication. One client serves every machine.
#[derive(Debug, Clone)]
pub struct RedfishClient {
    verified: Client,
    unverified: Client,
}

impl RedfishClient {
    /// A client whose requests give up after `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, BmcError> {
        let build = |accept_invalid: bool| {
            Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout.min(Duration::from_secs(5)))
                .tls_danger_accept_invalid_certs(accept_invalid)
                .build()
                .map_err(|e| BmcError { url: String::new(), kind: BmcErrorKind::Unreachable(e.to_string()) })
        };
        Ok(Self { verified: build(false)?, unverified: build(true)? })
    }

    async fn call(
        &self,
        target: &BmcTarget,
        method: Method,
        url: String,
        body: Option<Value>,
    ) -> Result<Value, BmcError> {
        let client = if target.insecure_skip_tls_verify { &self.unverified } else { &self.verified };
        let mut request = client
            .request(method, &url)
            .basic_auth(&target.username, Some(&target.password))
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(body) = body {
            // Redfish services answer 415 without the JSON content type.
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| {
            let kind = if e.is_timeout() { BmcErrorKind::Timeout } else { BmcErrorKind::Unreachable(describe(&e)) };
            BmcError { url: url.clone(), kind }
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| BmcError {
            url: url.clone(),
            kind: if e.is_timeout() { BmcErrorKind::Timeout } else { BmcErrorKind::BadResponse(describe(&e)) },
        })?;
        if !status.is_success() {
            let kind = match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => BmcErrorKind::Unauthorized(status.as_u16()),
                StatusCode::NOT_FOUND => BmcErrorKind::SystemNotFound,
                _ => BmcErrorKind::Rejected { status: status.as_u16(), message: error_message(&text) },
            };
            return Err(BmcError { url, kind });
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| BmcError {
            url,
            kind: BmcErrorKind::BadResponse(format!("not JSON ({e}): {}", excerpt(&text))),
        })
    }
}

/// An error with its sources, on one line.
fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn excerpt(text: &str) -> String {
    let t: String = text.chars().take(200).collect();
    t.replace('\n', " ")
}

/// The message of a Redfish error envelope (`{"error": {"message": …}}`), or the body itself.
fn error_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| excerpt(text))
}

#[async_trait]
impl Bmc for RedfishClient {
    async fn power_state(&self, target: &BmcTarget) -> Result<PowerState, BmcError> {
        let url = target.system_url();
        let system = self.call(target, Method::GET, url.clone(), None).await?;
        match system.get("PowerState").and_then(Value::as_str) {
            Some("On") => Ok(PowerState::On),
            Some("Off") => Ok(PowerState::Off),
            Some("PoweringOn") => Ok(PowerState::PoweringOn),
            Some("PoweringOff") => Ok(PowerState::PoweringOff),
            other => Err(BmcError {
                url,
                kind: BmcErrorKind::BadResponse(format!(
                    "PowerState is {other:?}, not On, Off, PoweringOn or PoweringOff"
                )),
            }),
        }
    }

    async fn reset(&self, target: &BmcTarget, reset: ResetType) -> Result<(), BmcError> {
        let url = format!("{}/Actions/ComputerSystem.Reset", target.system_url());
        self.call(target, Method::POST, url, Some(json!({"ResetType": reset.as_str()}))).await.map(drop)
    }

    async fn set_pxe_boot_once(&self, target: &BmcTarget) -> Result<(), BmcError> {
        let body = json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}});
        self.call(target, Method::PATCH, target.system_url(), Some(body)).await.map(drop)
    }
}
