//! `care demo`: the CARE loop on bundled paper data, printed as a table.

use std::io::Write;

/// Runs the demo, writing the table to `out`.
pub fn run(out: &mut dyn Write) -> Result<(), String> {
    writeln!(out, "care demo: not wired yet").map_err(|e| e.to_string())
}
