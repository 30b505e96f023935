//! `care reward` into `care analyze` as one pipeline: the rubric is written as the generator
//! wrote it (so it validates under the paper's contract, key order included), and a turn's
//! `meta` (turn, emotion, variant) passes through as written into analyze's grouping.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const DEMO: &str = include_str!("../data/reward_demo.jsonl");

fn care() -> Command {
    Command::new(env!("CARGO_BIN_EXE_care"))
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("care-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The demo turn three times, each with its own `meta`, written with its members in the order
/// turn, emotion, variant (not sorted).
fn turns() -> String {
    let demo: Value = serde_json::from_str(DEMO.trim()).unwrap();
    let mut out = String::new();
    for (turn, emotion) in [(1, "sadness"), (2, "fear"), (3, "joy")] {
        let context = serde_json::to_string(&demo["context"]).unwrap();
        let responses = serde_json::to_string(&demo["responses"]).unwrap();
        out.push_str(&format!(
            "{{\"id\": \"t{turn}\", \"context\": {context}, \"responses\": {responses}, \
             \"meta\": {{\"turn\": {turn}, \"emotion\": \"{emotion}\", \"variant\": \"care\"}}}}\n"
        ));
    }
    out
}

fn run(args: &[&str], stdin: &[u8]) -> (bool, Vec<u8>, String) {
    let mut child = care()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn care_reward_output_is_care_analyze_input() {
    let dir = tempdir("reward-analyze");
    let (ok, rewards, err) = run(
        &["reward", "--scripted", "--no-cache", "-"],
        turns().as_bytes(),
    );
    assert!(ok, "{err}");
    let text = String::from_utf8(rewards.clone()).unwrap();
    for (i, line) in text.lines().enumerate() {
        // meta as written: members in the caller's order, byte for byte less whitespace.
        let turn = i + 1;
        assert!(
            line.contains(&format!("\"meta\":{{\"turn\":{turn},\"emotion\":")),
            "{line}"
        );
        // The rubric as the generator wrote it: the rationale before the weight.
        let rubric = &line[line.find("\"rubric\":").unwrap()..];
        assert!(
            rubric.find("\"weight_rationale\"").unwrap()
                < rubric.find("\"category_weight\"").unwrap(),
            "{rubric:.200}"
        );
    }

    let out = dir.join("report");
    let (ok, summary, err) = run(&["analyze", "-o", out.to_str().unwrap(), "-"], &rewards);
    assert!(ok, "{err}");
    let summary = String::from_utf8_lossy(&summary);
    assert!(summary.contains("3 analyzed, 0 skipped"), "{summary} {err}");
    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
    // Every rubric valid under the paper's contract (no key_order violation).
    let health = read("format_health.csv");
    assert!(
        health
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("care,3,0,0,3,3,"),
        "{health}"
    );
    // The turn and emotion views are filled from meta.
    let by_turn = read("weights_by_turn.csv");
    for turn in 1..=3 {
        assert!(by_turn.contains(&format!("\ncare,{turn},1,")), "{by_turn}");
    }
    let by_emotion = read("weights_by_emotion.csv");
    for e in ["sadness", "fear", "joy"] {
        assert!(
            by_emotion.contains(&format!("\ncare,{e},1,")),
            "{by_emotion}"
        );
    }
}

#[test]
fn a_turn_member_given_twice_is_an_analyze_error() {
    let line = json!({"rubric": null, "turn": 1, "meta": {"turn": 2}}).to_string();
    let dir = tempdir("reward-analyze-twice");
    let out = dir.join("report");
    let (_, _, err) = run(
        &["analyze", "-o", out.to_str().unwrap(), "-"],
        format!("{line}\n").as_bytes(),
    );
    let errors = std::fs::read_to_string(out.join("errors.jsonl")).unwrap_or_default();
    assert!(
        errors.contains("given twice") || err.contains("given twice"),
        "{err} {errors}"
    );
}
