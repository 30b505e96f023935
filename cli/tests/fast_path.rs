//! The one-pass line scanner (`care_cli::scan`) against the reference path (the strict check
//! and serde_json), over the fuzz seeds, the bundled rubrics and random mutations of them.
//!
//! Relations checked:
//! * every subcommand writes byte-identical output lines, with the same success flag, on the
//!   fast path ([`care_cli::process_line`]) and on the reference path
//!   ([`care_cli::process_line_reference`]);
//! * a line the scanner accepts is accepted by `check_strict`, and its top-level members are
//!   the ones serde_json splits out, with the same raw text.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use care_cli::Command;
use care_cli::cmd::{score, score_profile};
use care_cli::input::{Line, object};
use care_cli::json::check_strict;
use care_cli::scan::{Scratch, scan_line, with_reference_path};
use care_core::grpo::AdvantageOptions;
use care_core::profile::ProfileBuf;
use care_core::{FormatPolicy, GeneratorOptions, ScoreOptions};
use proptest::prelude::*;

fn commands() -> Vec<Command> {
    let profile = Arc::new(ProfileBuf::builtin("kardia").expect("built-in profile"));
    vec![
        Command::Validate(FormatPolicy::PAPER),
        Command::Validate(FormatPolicy::lenient()),
        Command::Score(score::Options {
            score: ScoreOptions::default(),
            format: FormatPolicy::PAPER,
        }),
        Command::ScoreProfile(score_profile::Options {
            profile,
            score: ScoreOptions::default(),
            format: FormatPolicy::PAPER,
        }),
        Command::GeneratorReward(GeneratorOptions::PAPER),
        Command::Advantages(AdvantageOptions::default().into()),
        Command::Loss(Box::default()),
    ]
}

/// Lines from the fuzz seeds and corpus of `cli_line` (selector byte dropped), the rubric
/// seeds and the bundled rubrics (each as an object line and inside `{"text": ..}`).
fn corpus() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut lines = Vec::new();
    for dir in ["fuzz/seeds/cli_line", "fuzz/corpus/cli_line"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        // A long fuzz corpus is sampled evenly, to keep the test quick.
        let step = (files.len() / 3000).max(1);
        for f in files.iter().step_by(step) {
            let data = std::fs::read(f).unwrap();
            if let Some((_, line)) = data.split_first() {
                lines.extend(line.split(|&c| c == b'\n').map(<[u8]>::to_vec));
            }
        }
    }
    let mut rubrics = Vec::new();
    for dir in ["fuzz/seeds/rubric_validate", "cli/data"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for f in files {
            rubrics.push(std::fs::read_to_string(f).unwrap());
        }
    }
    for r in rubrics {
        let compact: serde_json::Value = match serde_json::from_str(&r) {
            Ok(v) => v,
            Err(_) => {
                lines.push(serde_json::json!({ "text": r }).to_string().into_bytes());
                continue;
            }
        };
        let compact = compact.to_string();
        lines.push(compact.clone().into_bytes());
        // The same rubric with escapes the validator must decode: an anchor, a word and a quote
        // (as an object line the scan's index says which strings hold escapes).
        lines.push(
            compact
                .replacen("[1]", "\\u005b1]", 1)
                .replacen(" the ", " \\u0074he ", 2)
                .replacen("\"title\":\"", "\"title\":\"\\\"", 1)
                .into_bytes(),
        );
        lines.push(serde_json::json!({ "text": r }).to_string().into_bytes());
        lines.push(format!(r#"{{"id":"r-1","text":{}}}"#, serde_json::json!(compact)).into_bytes());
        lines.push(
            format!(r#"{{"rubric":{compact},"scores":[[1,2],[3,4],[5,0]],"id":7}}"#).into_bytes(),
        );
    }
    // A group under a rubric whose one category has no criteria: the score rows are empty,
    // which the one-pass group reader leaves to the general path (it used to split them with
    // `chunks_exact(0)`, a panic).
    lines.push(
        br#"{"rubric":{"categories":[{"category":"Cognitive Empathy","weight_rationale":"x","category_weight":1,"criteria":[]}]},"responses":[{"scores":[[],[],[]]},{"scores":[[],[],[]]}]}"#
            .to_vec(),
    );
    lines.retain(|l| !l.is_empty());
    lines
}

fn same_output(cmds: &[Command], line: &[u8]) -> Result<(), TestCaseError> {
    for cmd in cmds {
        let fast = care_cli::process_line(cmd, 3, line);
        let reference = care_cli::process_line_reference(cmd, 3, line);
        prop_assert_eq!(
            &fast,
            &reference,
            "{:?} on {:?}",
            cmd,
            String::from_utf8_lossy(line)
        );
    }
    Ok(())
}

fn scanner_agrees(line: &[u8]) -> Result<bool, TestCaseError> {
    let Ok(text) = std::str::from_utf8(line) else {
        return Ok(false);
    };
    let mut s = Scratch::default();
    if !scan_line(text, &mut s) {
        return Ok(false);
    }
    prop_assert!(check_strict(text).is_ok(), "accepted {text:?}");
    let reference = with_reference_path(|| Line::parse(text)).unwrap();
    let fast: Vec<(String, String)> = s
        .members(text)
        .map(|m| (m.key.to_owned(), m.value.to_owned()))
        .collect();
    let want: Vec<(String, String)> = object(&reference).map_or_else(
        |_| Vec::new(),
        |m| {
            m.iter()
                .map(|(k, v)| (k.to_owned(), v.get().to_owned()))
                .collect()
        },
    );
    prop_assert_eq!(fast, want, "{:?}", text);
    Ok(true)
}

#[test]
fn fast_and_reference_paths_agree_on_the_corpus() {
    let cmds = commands();
    let lines = corpus();
    assert!(lines.len() > 80, "corpus too small: {}", lines.len());
    let mut accepted = 0;
    for line in &lines {
        same_output(&cmds, line).unwrap();
        accepted += usize::from(scanner_agrees(line).unwrap());
    }
    // The comparison means something only if the fast path really runs on most lines.
    assert!(
        accepted * 2 > lines.len(),
        "scanner accepted only {accepted} of {} lines",
        lines.len()
    );
}

/// Bytes that steer a mutation towards the JSON grammar's edges.
const INTERESTING: &[&str] = &[
    "\"",
    "\\",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    " ",
    "\t",
    "\n",
    "0",
    "-",
    ".",
    "e",
    "E+",
    "1e999",
    "00",
    "\\u",
    "\\ud800",
    "\\udc00",
    "\\ud83d\\ude00",
    "\\u0041",
    "\\n",
    "\u{1}",
    "\u{7f}",
    "é",
    "\u{feff}",
    "null",
    "true",
    "\"id\":1,",
    "\"text\":",
    "\"text\":1,",
    "\"rubric\":",
    "[[1]]",
    "18446744073709551616",
    "-0",
    "1E2",
];

#[derive(Clone, Debug)]
enum Mutation {
    Insert(usize, usize),
    Delete(usize, usize),
    /// Copy a span elsewhere (duplicate keys, repeated members).
    Copy(usize, usize, usize),
    Byte(usize, u8),
    /// Insert where a value starts (after `:`, `[` or `,`): numbers and literals are rare
    /// among a rubric's bytes, so uniform positions would seldom reach their grammar.
    AtValue(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0..INTERESTING.len()).prop_map(|(at, k)| Mutation::Insert(at, k)),
        (any::<usize>(), 1usize..16).prop_map(|(at, n)| Mutation::Delete(at, n)),
        (any::<usize>(), 1usize..40, any::<usize>()).prop_map(|(a, n, b)| Mutation::Copy(a, n, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Byte(at, b)),
        (any::<usize>(), 0..INTERESTING.len()).prop_map(|(n, k)| Mutation::AtValue(n, k)),
    ]
}

fn apply(mut line: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = line.len().max(1);
        match *m {
            Mutation::Insert(at, k) => {
                let at = at % (line.len() + 1);
                line.splice(at..at, INTERESTING[k].bytes());
            }
            Mutation::Delete(at, len) => {
                let at = at % n;
                let end = (at + len).min(line.len());
                if at < end {
                    line.drain(at..end);
                }
            }
            Mutation::Copy(a, len, b) => {
                let a = a % n;
                let end = (a + len).min(line.len());
                let span: Vec<u8> = line.get(a..end).unwrap_or(&[]).to_vec();
                let b = b % (line.len() + 1);
                line.splice(b..b, span);
            }
            Mutation::Byte(at, byte) => {
                if let Some(c) = line.get_mut(at % n) {
                    *c = byte;
                }
            }
            Mutation::AtValue(nth, k) => {
                let starts: Vec<usize> = (1..=line.len())
                    .filter(|&i| matches!(line[i - 1], b':' | b'[' | b','))
                    .collect();
                if !starts.is_empty() {
                    let at = starts[nth % starts.len()];
                    line.splice(at..at, INTERESTING[k].bytes());
                }
            }
        }
    }
    line
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    /// Relation: for every mutation of a corpus line, every subcommand's output line is the
    /// same on both paths, and what the scanner accepts the strict check accepts with the same
    /// members.
    #[test]
    fn fast_and_reference_paths_agree_on_mutations(
        pick in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        thread_local! {
            static CORPUS: Vec<Vec<u8>> = corpus();
            static CMDS: Vec<Command> = commands();
        }
        let line = CORPUS.with(|c| apply(pick.get(c).clone(), &muts));
        CMDS.with(|cmds| same_output(cmds, &line))?;
        scanner_agrees(&line)?;
    }

    /// Relation: a `{"text": ..}` line whose string holds random escapes validates the same on
    /// both paths (escapes are decoded into the reused buffer on the fast path).
    #[test]
    fn escaped_text_members_agree(parts in prop::collection::vec(
        prop_oneof![
            "[a-z {}\\[\\]:,0-9]{0,12}".prop_map(|s| s),
            prop::sample::select(vec![
                "\\n", "\\t", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\r", "\\u00e9", "\\u20AC",
                "\\ud83d\\ude00", "\\ud800", "\\udfff", "\\u0000", "\\x", "\\u12",
            ]).prop_map(str::to_owned),
        ],
        0..24,
    )) {
        let body = parts.concat();
        let line = format!(r#"{{"id":1,"text":"{{\"categories\":{body}"}}"#);
        CMDS_VALIDATE.with(|cmds| same_output(cmds, line.as_bytes()))?;
        scanner_agrees(line.as_bytes())?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Relation: a number the scanner accepts is one serde_json accepts as a finite value, in
    /// any position (alone, in an array, as a member).
    #[test]
    fn numbers_the_scanner_accepts_are_json(
        num in "[-+0-9.eE]{1,12}|-?[0-9]{1,4}(\\.[0-9]{0,3})?([eE][-+]?[0-9]{0,3})?|[0-9]{195,205}|[1-9]e[0-9]{1,4}"
    ) {
        for text in [num.clone(), format!("[{num}]"), format!(r#"{{"id":{num},"text":"x"}}"#)] {
            scanner_agrees(text.as_bytes())?;
            CMDS_VALIDATE.with(|cmds| same_output(cmds, text.as_bytes()))?;
        }
    }
}

thread_local! {
    static CMDS_VALIDATE: Vec<Command> = vec![Command::Validate(FormatPolicy::PAPER)];
}

#[test]
fn strict_rules_hold_on_the_fast_path() {
    // Each of these must be refused exactly as the reference path refuses it.
    let rubric = care_benches_free_rubric();
    let cases = [
        (r#"{"text":"x","text":"y"}"#.to_owned(), "duplicate_key"),
        (r#"{"id":1,"text":"\ud800"}"#.to_owned(), "not_json"),
        (format!("\u{feff}{rubric}"), "not_json"),
        ("[".repeat(200) + &"]".repeat(200), "not_json"),
        (format!(r#"{{"text":{rubric},"x":1e999}}"#), "not_json"),
    ];
    let cmd = Command::Validate(FormatPolicy::PAPER);
    for (line, code) in cases {
        let (out, ok) = care_cli::process_line(&cmd, 1, line.as_bytes());
        assert!(!ok, "{line}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["error"]["code"], code, "{out}");
        assert_eq!(
            (out, ok),
            care_cli::process_line_reference(&cmd, 1, line.as_bytes())
        );
    }
}

/// A valid compact rubric (the first bundled one).
fn care_benches_free_rubric() -> String {
    let text = include_str!("../data/rubric_sft_1.json");
    serde_json::from_str::<serde_json::Value>(text)
        .unwrap()
        .to_string()
}
