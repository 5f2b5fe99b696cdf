//! A small typed client of Azure Resource Manager: bearer tokens from an `azure_identity` credential,
//! `GET` of one resource or of a paged list (`nextLink`), `PUT` and `DELETE` with their long-running
//! operations polled through `Azure-AsyncOperation` (or `Location`), and ARM's error body read into an
//! [`ArmError`]. The resources' shapes are the provider's own serde types.
//!
//! Tokens are asked of the credential for every call (the credentials cache them until shortly before
//! they expire); a token is never logged, and neither are request bodies (custom data carries the
//! bootstrap token).

use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use reqwest::{Method, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::errors::ArmError;

/// The public cloud's Resource Manager.
pub const PUBLIC_ENDPOINT: &str = "https://management.azure.com";

/// The client.
#[derive(Clone)]
pub struct Arm {
    http: reqwest::Client,
    base: String,
    scope: String,
    credential: Arc<dyn TokenCredential>,
    /// How often a long-running operation is polled when ARM does not say (`Retry-After`).
    pub poll: Duration,
    /// How long a long-running operation may take.
    pub timeout: Duration,
}

impl std::fmt::Debug for Arm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arm").field("base", &self.base).finish_non_exhaustive()
    }
}

/// A list page, as every ARM list answers.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page<T> {
    #[serde(default = "Vec::new")]
    value: Vec<T>,
    #[serde(default)]
    next_link: Option<String>,
}

/// A long-running operation's status (`Azure-AsyncOperation`).
#[derive(serde::Deserialize)]
struct OperationStatus {
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(serde::Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

#[derive(serde::Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

/// What a `PUT` or `DELETE` started: done already, or an operation to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Nothing to wait for: a synchronous answer.
    Done,
    /// Nothing to wait for: a `DELETE` of what was already gone (204).
    Absent,
    /// The operation's status URL.
    Operation(String),
}

impl Arm {
    /// A client of the Resource Manager at `base` (no trailing slash), with tokens of `credential` for
    /// `scope` (`<base>/.default` for the public cloud).
    pub fn new(http: reqwest::Client, base: &str, scope: &str, credential: Arc<dyn TokenCredential>) -> Self {
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            scope: scope.to_owned(),
            credential,
            poll: Duration::from_secs(5),
            timeout: Duration::from_secs(15 * 60),
        }
    }

    /// The absolute URL of `path` (`/subscriptions/…`) with `api-version`.
    pub fn url(&self, path: &str, api_version: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{path}{sep}api-version={api_version}", self.base)
    }

    async fn token(&self, context: &str) -> Result<String, ArmError> {
        let t = self.credential.get_token(&[self.scope.as_str()], None).await.map_err(|e| ArmError {
            status: 401,
            code: "CredentialUnavailable".into(),
            message: e.to_string(),
            retry_after: None,
            context: context.to_owned(),
        })?;
        Ok(t.token.secret().to_owned())
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
        context: &str,
    ) -> Result<reqwest::Response, ArmError> {
        let token = self.token(context).await?;
        let mut req = self.http.request(method, url).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| transport(context, &e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_of(resp, context).await)
    }

    /// `GET url` as a `T`.
    pub async fn get<T: DeserializeOwned>(&self, url: &str, context: &str) -> Result<T, ArmError> {
        let resp = self.send(Method::GET, url, None, context).await?;
        decode(resp, context).await
    }

    /// Every item of a paged list, following `nextLink`.
    pub async fn list<T: DeserializeOwned>(&self, url: &str, context: &str) -> Result<Vec<T>, ArmError> {
        let mut out = Vec::new();
        let mut next = Some(url.to_owned());
        let mut pages = 0usize;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > 10_000 {
                return Err(invalid(context, "more than 10,000 pages: nextLink does not end"));
            }
            let page: Page<T> = self.get(&url, context).await?;
            out.extend(page.value);
            next = page.next_link.filter(|l| !l.is_empty());
        }
        Ok(out)
    }

    /// `PUT url` with `body`: the resource as answered, and the operation it started.
    pub async fn put(&self, url: &str, body: &Value, context: &str) -> Result<(Value, Started), ArmError> {
        let resp = self.send(Method::PUT, url, Some(body), context).await?;
        let started = operation_of(&resp);
        let value = decode(resp, context).await?;
        Ok((value, started))
    }

    /// `DELETE url`: what it started (`Absent` when it was already gone).
    pub async fn delete(&self, url: &str, context: &str) -> Result<Started, ArmError> {
        let resp = self.send(Method::DELETE, url, None, context).await?;
        Ok(if resp.status() == StatusCode::NO_CONTENT { Started::Absent } else { operation_of(&resp) })
    }

    /// `POST url` (an action such as `restart`), its operation waited for.
    pub async fn post(&self, url: &str, context: &str) -> Result<(), ArmError> {
        let resp = self.send(Method::POST, url, Some(&Value::Object(Default::default())), context).await?;
        let started = operation_of(&resp);
        self.wait(&started, context).await
    }

    /// `POST url` with no body, answered as it is: the status, the headers (lower-case names) and the
    /// body. Service Bus's receive answers this way (201 with a message, 204 with none).
    pub async fn post_raw(
        &self,
        url: &str,
        context: &str,
    ) -> Result<(u16, std::collections::HashMap<String, String>, String), ArmError> {
        let token = self.token(context).await?;
        let resp = self
            .http
            .post(url)
            .bearer_auth(token)
            .header(header::CONTENT_LENGTH, "0")
            .send()
            .await
            .map_err(|e| transport(context, &e))?;
        if !resp.status().is_success() {
            return Err(error_of(resp, context).await);
        }
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let body = resp.text().await.map_err(|e| transport(context, &e))?;
        Ok((status, headers, body))
    }

    /// The base URL (a Service Bus queue's, for its client).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Waits for `started` to end: `Ok` once it succeeded, its error once it failed, a timeout error
    /// after [`Self::timeout`].
    pub async fn wait(&self, started: &Started, context: &str) -> Result<(), ArmError> {
        let Started::Operation(url) = started else { return Ok(()) };
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let resp = self.send(Method::GET, url, None, context).await?;
            let retry = retry_after(&resp).unwrap_or(self.poll);
            // A `Location` poll answers 202 while running and 200/204 once done, perhaps with no body.
            let code = resp.status();
            let text = resp.text().await.map_err(|e| transport(context, &e))?;
            let status: OperationStatus = if text.trim().is_empty() {
                OperationStatus {
                    status: if code == StatusCode::ACCEPTED { "InProgress" } else { "Succeeded" }.into(),
                    error: None,
                }
            } else {
                serde_json::from_str(&text)
                    .map_err(|e| invalid(context, &format!("the operation's status does not read: {e}")))?
            };
            match status.status.as_str() {
                "Succeeded" => return Ok(()),
                "Failed" | "Canceled" => {
                    let e = status.error.unwrap_or_default();
                    return Err(ArmError {
                        status: 200,
                        code: if e.code.is_empty() { status.status } else { e.code },
                        message: e.message,
                        retry_after: None,
                        context: context.to_owned(),
                    });
                }
                _ if tokio::time::Instant::now() + retry > deadline => {
                    return Err(ArmError {
                        status: 0,
                        code: "OperationTimedOut".into(),
                        message: format!("the operation did not end within {:?}", self.timeout),
                        retry_after: None,
                        context: context.to_owned(),
                    });
                }
                _ => tokio::time::sleep(retry).await,
            }
        }
    }
}

fn transport(context: &str, e: &reqwest::Error) -> ArmError {
    ArmError {
        status: 0,
        code: "RequestFailed".into(),
        message: e.to_string(),
        retry_after: None,
        context: context.to_owned(),
    }
}

fn invalid(context: &str, message: &str) -> ArmError {
    ArmError {
        status: 0,
        code: "InvalidResponse".into(),
        message: message.to_owned(),
        retry_after: None,
        context: context.to_owned(),
    }
}

fn operation_of(resp: &reqwest::Response) -> Started {
    let h = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    match h("azure-asyncoperation").or_else(|| h("location").filter(|_| resp.status() == StatusCode::ACCEPTED)) {
        Some(url) => Started::Operation(url),
        None => Started::Done,
    }
}

fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let v = resp.headers().get(header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

async fn decode<T: DeserializeOwned>(resp: reqwest::Response, context: &str) -> Result<T, ArmError> {
    let bytes = resp.bytes().await.map_err(|e| transport(context, &e))?;
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(&mut de)
        .map_err(|e| invalid(context, &format!("the answer does not read at {}: {}", e.path(), e.inner())))
}

async fn error_of(resp: reqwest::Response, context: &str) -> ArmError {
    let status = resp.status().as_u16();
    let retry_after = retry_after(&resp);
    let text = resp.text().await.unwrap_or_default();
    let (code, message) = match serde_json::from_str::<ErrorEnvelope>(&text) {
        Ok(e) => (e.error.code, e.error.message),
        Err(_) => (format!("Http{status}"), text.chars().take(512).collect()),
    };
    ArmError { status, code, message, retry_after, context: context.to_owned() }
}
