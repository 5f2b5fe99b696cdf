//! The `tenon` command line.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tenon_core::settings::{self, Loaded};

use crate::Operator;

/// tenon: a Kubernetes node autoscaler, API-compatible with Karpenter.
#[derive(Debug, Parser)]
#[command(name = "tenon", version, about, long_about = None)]
pub struct Cli {
    /// A settings file (YAML, TOML or JSON); see `tenon settings`.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Overrides a setting, e.g. `--set max-consolidation-replacements=3` (repeatable).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE", value_parser = parse_key_value)]
    set: Vec<(String, String)>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of NodePool and NodeClaim.
    Crds,
    /// Print every setting with its value, where the value came from, and what it does.
    Settings,
    /// List the providers this binary carries and the NodeClass kinds they serve.
    Providers,
    /// Show what tenon would do to a cluster snapshot, and why.
    Plan {
        /// Snapshot files: Kubernetes objects (`kubectl get -o yaml`) and InstanceCatalog documents.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// `text` for a person, `json` for scripts.
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
        /// The time to plan at (RFC 3339), for budget schedules and durations; default now.
        #[arg(long)]
        now: Option<String>,
    },
    /// Run a workload scenario in virtual time and report what the fleet cost.
    Simulate {
        /// The scenario file (see examples/scenarios/).
        scenario: PathBuf,
        /// `text` for a person, `json` for scripts.
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
        /// Also write a self-contained HTML report here.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
        /// Run the scenario twice, with the settings of file A and of file B, and print both side by side.
        #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with = "report")]
        compare: Option<Vec<PathBuf>>,
    },
    /// Run the operator against a cluster.
    Run,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.trim().to_owned(), v.to_owned())).ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

pub(crate) fn run<I, T>(operator: Operator, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match execute(operator, cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_settings(cli: &Cli) -> Result<Loaded> {
    Ok(settings::load_from_process(cli.config.as_deref(), &cli.set)?)
}

/// The `--config` file's settings as flags, for the simulator to layer over a scenario's own settings.
fn config_flags(cli: &Cli) -> Result<Vec<(String, String)>> {
    cli.config.as_deref().map_or_else(|| Ok(Vec::new()), crate::simulate::settings_file)
}

fn execute(operator: Operator, cli: Cli) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match &cli.command {
        Command::Crds => {
            write!(out, "{}", tenon_core::api::crds_yaml().context("rendering the CRDs")?)?;
            let crds = if operator.has_builtins() { crate::builtins::crds() } else { Vec::new() };
            for crd in crds {
                write!(out, "---\n{}", serde_yaml_ng::to_string(&crd).context("rendering the CRDs")?)?;
            }
        }
        Command::Settings => {
            let loaded = load_settings(&cli)?;
            print_settings(&mut out, &loaded)?;
        }
        Command::Providers => {
            let registry = operator.registry()?;
            let builtins = if operator.has_builtins() { crate::builtins::BUILTINS } else { &[] };
            if registry.providers().is_empty() && builtins.is_empty() {
                writeln!(out, "no providers are built into this binary")?;
            }
            for p in registry.providers() {
                let kinds: Vec<String> = p.descriptor().node_classes.iter().map(ToString::to_string).collect();
                writeln!(out, "{:<16} {}", p.name(), kinds.join(", "))?;
            }
            for b in builtins {
                writeln!(out, "{:<16} {}/{}", b.name, b.group, b.kind)?;
            }
        }
        Command::Plan { files, output, now } => {
            let loaded = load_settings(&cli)?;
            let now = match now {
                Some(t) => {
                    t.parse::<jiff::Timestamp>().with_context(|| format!("--now {t:?} is not an RFC 3339 time"))?
                }
                None => jiff::Timestamp::now(),
            };
            let plan = crate::plan::compute(files, &loaded.settings, now)?;
            match output {
                Output::Json => {
                    serde_json::to_writer_pretty(&mut out, &plan)?;
                    writeln!(out)?;
                }
                Output::Text => crate::plan::print_text(&mut out, &plan)?,
            }
        }
        Command::Simulate { scenario, output, compare: Some(files), .. } => {
            // Each run: `--config`, then its own file, then `--set`, later layers winning.
            let base = config_flags(&cli)?;
            let runs = files
                .iter()
                .map(|f| {
                    let own = crate::simulate::settings_file(f)?;
                    let flags: Vec<_> = base.iter().chain(&own).chain(&cli.set).cloned().collect();
                    crate::simulate::run(scenario, &flags)
                })
                .collect::<Result<Vec<_>>>()?;
            match output {
                Output::Json => {
                    let both: Vec<_> = files
                        .iter()
                        .zip(&runs)
                        .map(|(f, r)| serde_json::json!({"settings": f.display().to_string(), "report": r}))
                        .collect();
                    serde_json::to_writer_pretty(&mut out, &both)?;
                    writeln!(out)?;
                }
                Output::Text => crate::simulate::print_comparison(&mut out, &files[0], &runs[0], &files[1], &runs[1])?,
            }
        }
        Command::Simulate { scenario, output, report: html, compare: None } => {
            // `--config`, then `--set`, over the scenario's own settings.
            let mut flags = config_flags(&cli)?;
            flags.extend(cli.set.iter().cloned());
            let report = crate::simulate::run(scenario, &flags)?;
            if let Some(path) = html {
                std::fs::write(path, crate::report::html(&report))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            match output {
                Output::Json => {
                    serde_json::to_writer_pretty(&mut out, &report)?;
                    writeln!(out)?;
                }
                Output::Text => crate::simulate::print_text(&mut out, &report)?,
            }
        }
        Command::Run => {
            let loaded = load_settings(&cli)?;
            init_logging(&loaded.settings.log_level);
            crate::builtins::check(&loaded.settings)?;
            let builtins = operator.has_builtins();
            crate::run::run(operator.registry()?, builtins, loaded.settings)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Logs to stderr at `level` (`RUST_LOG` overrides it).
fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

fn print_settings(out: &mut impl Write, loaded: &Loaded) -> Result<()> {
    let key_width = loaded.resolved.iter().map(|r| r.spec.key.len()).max().unwrap_or(0);
    let value_width = loaded.resolved.iter().map(|r| r.value.len().min(40)).max().unwrap_or(0);
    writeln!(out, "{:<key_width$}  {:<value_width$}  {:<7}  MEANING", "SETTING", "VALUE", "SOURCE")?;
    for r in &loaded.resolved {
        writeln!(
            out,
            "{:<key_width$}  {:<value_width$}  {:<7}  {}",
            r.spec.key,
            r.value,
            r.source.to_string(),
            r.spec.doc
        )?;
        writeln!(out, "{:<key_width$}  {:<value_width$}           env: {}", "", "", r.spec.env)?;
    }
    Ok(())
}
