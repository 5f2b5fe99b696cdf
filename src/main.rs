//! The `tenon` binary: the CLI over the providers built into this build.

use std::process::ExitCode;

/// The decision loops build and drop many small objects (scheduler clones, label maps, pod views) every
/// step; mimalloc serves them with far less overhead than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tenon::Operator::builder().builtins().run_cli()
}
