//! The `tenon` binary: the CLI over the providers built into this build.

use std::process::ExitCode;

fn main() -> ExitCode {
    tenon::Operator::builder().run_cli()
}
