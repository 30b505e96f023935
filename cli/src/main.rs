//! The `care` binary: parse arguments, hand over to [`care_cli::app::run`].
use std::io::Write;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

/// Looks at fd 0 and fd 1 before the Rust runtime starts: it reopens closed standard
/// descriptors on `/dev/null`, after which a closed stdout would swallow the output and a
/// closed stdin would read as empty, both with exit status 0. `care` reports them instead.
#[cfg(target_os = "linux")]
extern "C" fn check_standard_fds() {
    // SAFETY: fcntl(F_GETFD) only queries the descriptor table; it is async-signal-safe and
    // fine before `main`.
    let closed = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1;
    care_cli::engine::note_closed_at_start(closed(0), closed(1));
}

/// Runs `check_standard_fds` from the ELF constructors, which run before the Rust runtime's
/// start-up code in `main`.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static CHECK_STANDARD_FDS: extern "C" fn() = check_standard_fds;

fn main() -> ExitCode {
    match care_cli::args::Cli::try_parse() {
        Ok(cli) => care_cli::app::run(cli),
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                let _ = e.print();
                ExitCode::SUCCESS
            }
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                // One line, like every usage error, that names the subcommands.
                let cmd = care_cli::args::Cli::command();
                let names: Vec<&str> = cmd
                    .get_subcommands()
                    .filter(|c| !c.is_hide_set())
                    .map(|c| c.get_name())
                    .collect();
                let _ = writeln!(
                    std::io::stderr(),
                    "care: missing subcommand: one of {} (see care --help, or care <subcommand> --help)",
                    names.join(", ")
                );
                ExitCode::from(care_cli::app::EXIT_USAGE)
            }
            _ => {
                // Usage errors are one line on stderr (clap's own report spans several) and
                // exit status 2, like every other usage or I/O error of care. The possible
                // values and clap's "similar value" tip are kept on that line.
                let text = e.render().to_string();
                let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
                let first = lines.next().unwrap_or("usage error");
                let mut msg = first.strip_prefix("error: ").unwrap_or(first).to_owned();
                for l in lines {
                    if l.starts_with("[possible values:") || l.starts_with("tip:") {
                        msg.push_str("; ");
                        msg.push_str(l);
                    }
                }
                // Point at the help of the subcommand at fault: the first argument that names
                // one (clap's report does not always say which).
                let cmd = care_cli::args::Cli::command();
                let help = std::env::args()
                    .skip(1)
                    .filter(|a| !a.starts_with('-'))
                    .find_map(|a| cmd.find_subcommand(&a).map(|c| c.get_name().to_owned()))
                    .map_or_else(|| "care".to_owned(), |c| format!("care {c}"));
                let _ = writeln!(std::io::stderr(), "care: {msg} (see {help} --help)");
                ExitCode::from(care_cli::app::EXIT_USAGE)
            }
        },
    }
}
