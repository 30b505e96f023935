//! The `care` binary (placeholder until the subcommands are wired).
fn main() {}
