//! The one error type the core matches on.

use std::sync::Arc;
use std::time::Duration;

use super::types::OfferingKey;

/// What went wrong in a provider call, classified so the core can react.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CloudError {
    /// No capacity for the named offerings: the core marks them unavailable, deletes the claim and lets
    /// provisioning try elsewhere.
    #[error("insufficient capacity for {}: {message}", fmt_offerings(.offerings))]
    InsufficientCapacity {
        /// The offerings that could not be launched.
        offerings: Vec<OfferingKey>,
        /// The provider's explanation.
        message: String,
    },
    /// "Not yet": capacity may appear shortly; retry after `retry_after`. Never a failure.
    #[error("launch deferred for {retry_after:?}: {reason}")]
    LaunchDeferred {
        /// When to try again.
        retry_after: Duration,
        /// Why the launch is deferred.
        reason: String,
    },
    /// The instance does not exist (or no longer does).
    #[error("not found: {0}")]
    NotFound(String),
    /// The claim's NodeClass cannot be used yet (unresolved images, subnets, inventory).
    #[error("node class not ready: {0}")]
    NodeClassNotReady(String),
    /// A launch failed in a way retrying may fix; the claim is kept with `Launched=Unknown`.
    #[error("create failed ({reason}): {message}")]
    Create {
        /// A CamelCase reason for the condition.
        reason: String,
        /// A human-readable message.
        message: String,
    },
    /// The provider's API is throttling; retry after the given delay if known.
    #[error("throttled{}", .retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    Throttled {
        /// How long to wait, if the API said.
        retry_after: Option<Duration>,
    },
    /// Credentials are missing, wrong or lack a permission.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The provider does not support this operation (for example `reboot`).
    #[error("{operation} is not supported by provider {provider}")]
    Unsupported {
        /// The provider's name.
        provider: String,
        /// The operation.
        operation: &'static str,
    },
    /// Anything else, with its source.
    #[error("provider {provider}: {source}")]
    Other {
        /// The provider's name.
        provider: String,
        /// The underlying error.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

fn fmt_offerings(offerings: &[OfferingKey]) -> String {
    if offerings.is_empty() {
        return "every compatible offering".into();
    }
    offerings.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

impl CloudError {
    /// An [`CloudError::Other`] from any error.
    pub fn other(provider: &str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Other { provider: provider.to_owned(), source: Arc::new(source) }
    }

    /// An [`CloudError::Other`] from a message.
    pub fn message(provider: &str, message: impl Into<String>) -> Self {
        Self::other(provider, std::io::Error::other(message.into()))
    }

    /// Whether this is [`CloudError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }

    /// A short CamelCase name of the variant, for metrics labels and conditions.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InsufficientCapacity { .. } => "InsufficientCapacity",
            Self::LaunchDeferred { .. } => "LaunchDeferred",
            Self::NotFound(_) => "NotFound",
            Self::NodeClassNotReady(_) => "NodeClassNotReady",
            Self::Create { .. } => "CreateError",
            Self::Throttled { .. } => "Throttled",
            Self::Unauthorized(_) => "Unauthorized",
            Self::Unsupported { .. } => "Unsupported",
            Self::Other { .. } => "Other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::CapacityType;

    #[test]
    fn messages_name_the_offerings() {
        let e = CloudError::InsufficientCapacity {
            offerings: vec![OfferingKey::new("p4d.24xlarge", "us-east-1a", CapacityType::Spot)],
            message: "sold out".into(),
        };
        assert_eq!(e.to_string(), "insufficient capacity for p4d.24xlarge/us-east-1a/spot: sold out");
        assert_eq!(e.kind(), "InsufficientCapacity");
        assert!(CloudError::NotFound("i-1".into()).is_not_found());
    }
}
