//! Where the Azure provider's tokens come from: only the standard credential chains of `azure_identity`,
//! tried in a fixed order and the first that yields a token kept.
//!
//! 1. Workload identity (AKS's federated service-account token): when `AZURE_FEDERATED_TOKEN_FILE` is set,
//!    with `AZURE_CLIENT_ID` and `AZURE_TENANT_ID` (AKS's webhook sets all three).
//! 2. A service principal from the environment: `AZURE_TENANT_ID`, `AZURE_CLIENT_ID` and
//!    `AZURE_CLIENT_SECRET`.
//! 3. Managed identity (IMDS, App Service): the user-assigned identity `AZURE_CLIENT_ID` names when set,
//!    the system-assigned one otherwise.
//! 4. Developer tools: the Azure CLI (`az account get-access-token`), then the Azure Developer CLI.
//!
//! No secret is logged: the chain's errors say which sources were tried and why each failed, in
//! `azure_identity`'s words, which carry no token or secret.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use azure_core::credentials::{AccessToken, Secret, TokenCredential, TokenRequestOptions};
use azure_identity::{
    ClientSecretCredential, DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
    UserAssignedId, WorkloadIdentityCredential,
};

/// The chain, built from the environment.
pub struct Chain {
    sources: Vec<(&'static str, Arc<dyn TokenCredential>)>,
    chosen: Mutex<Option<usize>>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("sources", &self.sources.iter().map(|(n, _)| *n).collect::<Vec<_>>()).finish()
    }
}

impl Chain {
    /// The sources the environment makes possible, in the order above; an error when none can be built.
    pub fn from_env() -> Result<Self, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut sources: Vec<(&'static str, Arc<dyn TokenCredential>)> = Vec::new();
        let mut skipped = Vec::new();
        if var("AZURE_FEDERATED_TOKEN_FILE").is_some() {
            match WorkloadIdentityCredential::new(None) {
                Ok(c) => sources.push(("workload identity", c)),
                Err(e) => skipped.push(format!("workload identity: {e}")),
            }
        }
        if let (Some(tenant), Some(client), Some(secret)) =
            (var("AZURE_TENANT_ID"), var("AZURE_CLIENT_ID"), var("AZURE_CLIENT_SECRET"))
        {
            match ClientSecretCredential::new(&tenant, client, Secret::new(secret), None) {
                Ok(c) => sources.push(("environment (client secret)", c)),
                Err(e) => skipped.push(format!("environment: {e}")),
            }
        }
        let options = ManagedIdentityCredentialOptions {
            user_assigned_id: var("AZURE_CLIENT_ID").map(UserAssignedId::ClientId),
            ..Default::default()
        };
        match ManagedIdentityCredential::new(Some(options)) {
            Ok(c) => sources.push(("managed identity", c)),
            Err(e) => skipped.push(format!("managed identity: {e}")),
        }
        match DeveloperToolsCredential::new(None) {
            Ok(c) => sources.push(("developer tools (Azure CLI)", c)),
            Err(e) => skipped.push(format!("developer tools: {e}")),
        }
        if sources.is_empty() {
            return Err(format!("no Azure credential can be built: {}", skipped.join("; ")));
        }
        Ok(Self { sources, chosen: Mutex::new(None) })
    }

    /// The names of the sources, in order.
    pub fn sources(&self) -> Vec<&'static str> {
        self.sources.iter().map(|(n, _)| *n).collect()
    }
}

#[async_trait]
impl TokenCredential for Chain {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let chosen = *self.chosen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = chosen {
            return self.sources[i].1.get_token(scopes, options).await;
        }
        let mut failures = Vec::new();
        for (i, (name, source)) in self.sources.iter().enumerate() {
            match source.get_token(scopes, options.clone()).await {
                Ok(t) => {
                    tracing::info!(source = name, "Azure credentials found");
                    *self.chosen.lock().unwrap_or_else(PoisonError::into_inner) = Some(i);
                    return Ok(t);
                }
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        Err(azure_core::Error::with_message(
            azure_core::error::ErrorKind::Credential,
            format!("no Azure credential source gave a token: {}", failures.join("; ")),
        ))
    }
}
