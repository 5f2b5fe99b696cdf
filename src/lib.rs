//! # tenon
//!
//! The `tenon` command and the library entry point a provider crate uses to build its own binary.
//!
//! A binary is an [`Operator`] with providers registered on it:
//!
//! ```no_run
//! use std::process::ExitCode;
//! use tenon_core::cloud::fake::FakeCloud;
//!
//! fn main() -> ExitCode {
//!     tenon::Operator::builder().provider(FakeCloud::builder().build()).run_cli()
//! }
//! ```
//!
//! See `examples/custom_provider.rs` for a complete provider.

pub mod builtins;
mod cli;
pub mod kube;
pub mod kwok;
pub mod metrics;
pub mod node_classes;
pub mod plan;
pub mod report;
pub mod run;
pub mod simulate;

use std::process::ExitCode;
use std::sync::Arc;

use tenon_core::cloud::{CloudProvider, DynCloudProvider, ProviderRegistry, RegistryError};

pub use cli::Cli;

/// A tenon operator: the CLI and controllers over a set of providers.
#[derive(Debug, Default)]
pub struct Operator {
    providers: Vec<DynCloudProvider>,
    builtins: bool,
}

impl Operator {
    /// An operator with no providers yet.
    pub fn builder() -> Self {
        Self::default()
    }

    /// Adds a provider.
    #[must_use]
    pub fn provider(mut self, provider: impl CloudProvider) -> Self {
        self.providers.push(Arc::new(provider));
        self
    }

    /// Adds the providers built into the `tenon` binary ([`builtins::BUILTINS`]), which `tenon run` builds
    /// and registers from settings when it connects to the cluster.
    #[must_use]
    pub fn builtins(mut self) -> Self {
        self.builtins = true;
        self
    }

    /// Whether the built-in providers are added.
    pub fn has_builtins(&self) -> bool {
        self.builtins
    }

    /// Adds an already shared provider.
    #[must_use]
    pub fn provider_arc(mut self, provider: DynCloudProvider) -> Self {
        self.providers.push(provider);
        self
    }

    /// The registry routing NodePools to the providers.
    pub fn registry(&self) -> Result<ProviderRegistry, RegistryError> {
        let mut registry = ProviderRegistry::new();
        for p in &self.providers {
            registry.register_arc(p.clone())?;
        }
        Ok(registry)
    }

    /// Parses the process's arguments and runs the command.
    pub fn run_cli(self) -> ExitCode {
        cli::run(self, std::env::args_os())
    }

    /// Runs the command given by `args` (the first item is the program name).
    pub fn run_with_args<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        cli::run(self, args)
    }
}
