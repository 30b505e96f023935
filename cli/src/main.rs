//! The `care` binary: parse arguments, hand over to [`care_cli::app::run`].
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors and 0 for --help/--version, as documented.
    care_cli::app::run(care_cli::args::Cli::parse())
}
