//! Helpers shared by the integration tests of the C ABI.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository root (`ffi/..`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `include/care.h` as text.
pub fn header() -> String {
    std::fs::read_to_string(repo_root().join("include").join("care.h")).expect("include/care.h")
}

/// A fixture of `../shared/fixtures` (next to the repository, as in CI).
pub fn fixture(name: &str) -> Vec<u8> {
    let p = repo_root()
        .join("..")
        .join("shared")
        .join("fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Function names declared in the header: every `care_*(` that starts a declaration line
/// (cbindgen writes one declaration per line start; continuation lines are indented).
pub fn declared_functions(header: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in header.lines() {
        let t = line.trim_start();
        if t.starts_with("//") || t.starts_with('*') || t.starts_with("/*") || t.starts_with('#') {
            continue;
        }
        if line.starts_with(' ') {
            continue;
        }
        let Some(open) = line.find('(') else { continue };
        let before = &line[..open];
        let name = before
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next();
        if let Some(name) = name
            && name.starts_with("care_")
        {
            names.insert(name.to_string());
        }
    }
    names
}
