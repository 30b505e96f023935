//! The documentation tells the truth about the code it describes:
//!
//! * every `SPEC §n` (or `§n.m`) cited in a source file resolves to a numbered heading of
//!   `docs/SPEC.md`;
//! * the error-code table of `docs/SPEC.md` lists exactly `care_core::Error::ALL`, with each
//!   variant's number and code;
//! * every relative link in `README.md` and `docs/*.md` points at a file that exists, and every
//!   `#anchor` into a Markdown file names one of its headings.
//! * the shell and Python examples of the README and the docs' quick starts carry well-formed
//!   `doc-check` markers and parse (`scripts/doc-examples.py --check-only`; CI runs them).
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository root")
        .to_path_buf()
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Source files that may cite the contract (skips build outputs, generated PTX and fuzz data).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            let skip = name.starts_with('.')
                || matches!(
                    name.as_str(),
                    "target" | "ptx" | "corpus" | "artifacts" | "seeds" | "node_modules"
                );
            if !skip {
                sources(&p, out);
            }
        } else if [
            ".rs", ".cu", ".cuh", ".h", ".c", ".cpp", ".hpp", ".py", ".sh", ".md",
        ]
        .iter()
        .any(|ext| name.ends_with(ext))
        {
            out.push(p);
        }
    }
}

/// The section numbers (`9`, `9.1`, ...) of the numbered headings of a Markdown file:
/// `## 9. Title` or `### 9.1 Title`.
fn spec_sections(spec: &str) -> BTreeSet<String> {
    spec.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| l.trim_start_matches('#').trim())
        .filter_map(|l| {
            let num: String = l
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let num = num.trim_end_matches('.').to_string();
            (!num.is_empty()).then_some(num)
        })
        .collect()
}

/// Every `§n` / `§n.m` after `SPEC` in a text (`SPEC §9`, `SPEC §9-§11`, `SPEC §2, §3`).
fn cited_sections(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("SPEC") {
        // The citation runs until the end of the line or a closing bracket.
        let rest = &text[i + 4..];
        let end = rest.find(['\n', ')', ']', ';']).unwrap_or(rest.len());
        for part in rest[..end].split('§').skip(1) {
            let num: String = part
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let num = num.trim_end_matches('.').to_string();
            if !num.is_empty() {
                out.push(num);
            }
        }
    }
    out
}

#[test]
fn every_spec_section_cited_in_the_code_is_a_heading_of_docs_spec() {
    let root = repo();
    let sections = spec_sections(&read(&root.join("docs/SPEC.md")));
    assert!(sections.contains("10"), "SPEC headings: {sections:?}");
    let mut files = Vec::new();
    for d in [
        "core", "kernels", "ffi", "cli", "tests", "benches", "fuzz", "python", "examples",
        "scripts", "include", "loop", "docs",
    ] {
        sources(&root.join(d), &mut files);
    }
    files.push(root.join("README.md"));
    let mut missing = Vec::new();
    let mut cited = 0;
    // This file cites sections in its own scanner tests.
    files.retain(|f| !f.ends_with("tests/tests/docs.rs"));
    for f in &files {
        let text = read(f);
        for s in cited_sections(&text) {
            cited += 1;
            if !sections.contains(&s) {
                missing.push(format!(
                    "{}: SPEC §{s}",
                    f.strip_prefix(&root).unwrap_or(f).display()
                ));
            }
        }
    }
    assert!(
        cited > 50,
        "found only {cited} citations: is the scan broken?"
    );
    assert!(
        missing.is_empty(),
        "citations without a heading in docs/SPEC.md:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_error_table_of_the_spec_lists_every_error_with_its_number_and_code() {
    let spec = read(&repo().join("docs/SPEC.md"));
    let rows: BTreeSet<(u32, String)> = spec
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            // | number | `code` | meaning |
            let n = cells.get(1)?.parse::<u32>().ok()?;
            let code = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
            (n >= 100).then(|| (n, code.to_string()))
        })
        .collect();
    let want: BTreeSet<(u32, String)> = care_core::Error::ALL
        .iter()
        .map(|e| (e.number(), e.code().to_string()))
        .collect();
    assert_eq!(rows, want, "docs/SPEC.md §14 against care_core::Error::ALL");
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation other than `-` and `_`
/// dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(md: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for l in md.lines() {
        if l.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && l.starts_with('#') {
            out.insert(anchor(l.trim_start_matches('#')));
        }
    }
    out
}

/// `[text](target)` links outside code blocks and code spans.
fn links(md: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for l in md.lines() {
        if l.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Drop code spans so `a[i](x)` in code is not read as a link.
        let mut plain = String::new();
        for (i, part) in l.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let tail = &rest[i + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo();
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.push(root.join("README.md"));
    let mut broken = Vec::new();
    for doc in &docs {
        let text = read(doc);
        for link in links(&text) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            let (file, frag) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let target = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap_or(&root).join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", doc.display()));
                continue;
            }
            if !frag.is_empty() && target.extension().is_some_and(|x| x == "md") {
                let have = anchors(&read(&target));
                if !have.contains(frag) {
                    broken.push(format!("{}: {link} (no heading #{frag})", doc.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_and_citation_scanners_find_what_they_should() {
    assert_eq!(cited_sections("see SPEC §9-§11 and §2"), ["9", "11", "2"]);
    assert_eq!(cited_sections("(SPEC §10.2.)"), ["10.2"]);
    assert_eq!(
        links("a [x](docs/A.md#b) `[y](z)` [w](#c)"),
        ["docs/A.md#b", "#c"]
    );
    assert_eq!(
        anchor("9. Group advantages (GRPO and friends)"),
        "9-group-advantages-grpo-and-friends"
    );
    let s = spec_sections("## 9. A\n### 9.1 B\n## Notes\n");
    assert!(s.contains("9") && s.contains("9.1") && s.len() == 2);
}

/// The executable-docs markers and syntax (`scripts/doc-examples.py --check-only`: every
/// `doc-check` marker sits before a checked block and is well formed, every `ci-runs` command
/// is in the block and in `.ci/run`, every block passes `bash -n` or `compile()`). Running the
/// blocks is a CI step of its own (it builds the release binaries).
#[test]
fn the_readme_and_quick_start_examples_are_well_marked_and_parse() {
    let root = repo();
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/doc-examples.py"))
        .arg("--check-only")
        .current_dir(&root)
        .output()
        .expect("python3 runs scripts/doc-examples.py");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
