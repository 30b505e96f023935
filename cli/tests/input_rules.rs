//! The rules every data subcommand applies to the members of its input lines, through the real
//! binary: numbers out of the `f32` range, non-finite inputs where the result would carry them,
//! unknown members (with the `meta` passthrough), sizes named in layout and length errors, the
//! hint for pretty-printed JSON, `--beta` without reference log-probs, and usage errors that
//! point at the subcommand's help.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn care(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_care"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    let bytes = stdin.as_bytes().to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = pipe.write_all(&bytes);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

/// The output lines of `care <args>` on `stdin`, parsed.
fn lines(args: &[&str], stdin: &str) -> Vec<serde_json::Value> {
    let out = care(args, stdin);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The `(code, message)` of the single output line, which must be an error line.
fn error(args: &[&str], line: &str) -> (String, String) {
    let out = lines(args, &format!("{line}\n"));
    assert_eq!(out.len(), 1);
    let e = out[0].get("error").unwrap_or_else(|| {
        panic!(
            "care {args:?} on {line}: expected an error line, got {}",
            out[0]
        )
    });
    (
        e["code"].as_str().unwrap().to_owned(),
        e["message"].as_str().unwrap().to_owned(),
    )
}

fn ok(args: &[&str], line: &str) -> serde_json::Value {
    let out = lines(args, &format!("{line}\n"));
    assert_eq!(out.len(), 1);
    assert!(
        out[0].get("error").is_none(),
        "care {args:?} on {line}: {}",
        out[0]
    );
    out[0].clone()
}

/// The first line of a bundled test input, as an object to edit.
fn data_line(name: &str) -> serde_json::Map<String, serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let text = std::fs::read_to_string(path).unwrap();
    match serde_json::from_str(text.lines().next().unwrap()).unwrap() {
        serde_json::Value::Object(m) => m,
        _ => panic!("{name}: first line is no object"),
    }
}

#[test]
fn numbers_beyond_the_f32_range_are_errors_naming_member_and_index() {
    // One rule for every f32 input of every subcommand: rounds to infinity -> error.
    for (args, line, place) in [
        (
            &["advantages"][..],
            r#"{"rewards":[1e39,0],"group_size":2}"#,
            "\"rewards\"[0]",
        ),
        (
            &["loss"][..],
            r#"{"logp":[-1,-2],"seq_offsets":[0,2],"advantages":[1e39]}"#,
            "\"advantages\"[0]",
        ),
        (
            &["loss"][..],
            r#"{"logp":[-1,-2],"logp_old":[-1,-4e38],"seq_offsets":[0,2],"advantages":[1]}"#,
            "\"logp_old\"[1]",
        ),
        (
            &["loss", "--beta", "0.1"][..],
            r#"{"logp":[-1,-2],"logp_ref":[-1e300,-1],"seq_offsets":[0,2],"advantages":[1]}"#,
            "\"logp_ref\"[0]",
        ),
    ] {
        let (code, msg) = error(args, line);
        assert_eq!(code, "non_finite", "{line}");
        assert!(
            msg.starts_with(place) && msg.contains("exceeds the f32 range"),
            "{msg}"
        );
    }
    // The largest finite f32 (and values that round to it) are accepted.
    let out = ok(
        &["advantages"],
        r#"{"rewards":[3.4028235e38,3.40282356e38],"group_size":2}"#,
    );
    assert_eq!(out["advantages"], serde_json::json!([0, 0]));
}

#[test]
fn a_null_input_on_a_counted_token_is_an_error_line_never_a_null_loss() {
    for (line, place) in [
        (
            r#"{"logp":[null,-2],"seq_offsets":[0,2],"advantages":[1]}"#,
            "\"logp\"[0]",
        ),
        (
            r#"{"logp":[-1,-2],"logp_old":[-1,null],"seq_offsets":[0,2],"advantages":[1]}"#,
            "\"logp_old\"[1]",
        ),
        (
            r#"{"logp":[-1,-2],"mask":[0,1],"logp_old":[null,-2],"advantages":[1,null],"seq_offsets":[0,2]}"#,
            "\"advantages\"[1]",
        ),
    ] {
        let (code, msg) = error(&["loss"], line);
        assert!(msg.starts_with(place), "{line}: {msg}");
        // advantages may not be null at all; log-probs only where masked.
        assert!(code == "non_finite" || code == "schema", "{code}");
    }
    // Masked tokens are never read: a null there is fine.
    let out = ok(
        &["loss"],
        r#"{"logp":[null,-2],"logp_old":[null,-2],"mask":[0,1],"seq_offsets":[0,2],"advantages":[1]}"#,
    );
    assert!(out["loss"].is_number());
    // The reference log-probs are read only for the KL term.
    ok(
        &["loss"],
        r#"{"logp":[-1,-2],"logp_ref":[null,-2],"seq_offsets":[0,2],"advantages":[1]}"#,
    );
    let (code, msg) = error(
        &["loss", "--beta", "0.1"],
        r#"{"logp":[-1,-2],"logp_ref":[null,-2],"seq_offsets":[0,2],"advantages":[1]}"#,
    );
    assert_eq!(
        (code.as_str(), msg.starts_with("\"logp_ref\"[0] is null")),
        ("non_finite", true),
        "{msg}"
    );
    // --strict counts it as a failed line.
    let out = care(
        &["loss", "--strict"],
        "{\"logp\":[null],\"seq_offsets\":[0,1],\"advantages\":[1]}\n",
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn beta_without_reference_log_probs_is_an_error_line() {
    let line = r#"{"logp":[-1,-2],"seq_offsets":[0,2],"advantages":[1]}"#;
    let (code, msg) = error(&["loss", "--beta", "0.1"], line);
    assert_eq!(code, "schema");
    assert!(
        msg.contains("\"logp_ref\"") && msg.contains("--beta 0.1"),
        "{msg}"
    );
    // --beta 0 (the default) and --kl none need no reference.
    ok(&["loss"], line);
    ok(&["loss", "--beta", "0.1", "--kl", "none"], line);
}

#[test]
fn an_unknown_member_is_an_error_naming_the_closest_known_one_in_every_subcommand() {
    let mut score = data_line("score_valid.jsonl");
    score.insert("scroes".into(), serde_json::json!(1));
    let mut pref = data_line("pref_valid.jsonl");
    pref.insert("chosen_tactic".into(), serde_json::json!([]));
    let mut kardia = data_line("score_profile_kardia.jsonl");
    kardia.insert("emotoin".into(), serde_json::json!("sad"));
    let cases: Vec<(Vec<&str>, String, &str, &str)> = vec![
        (
            vec!["validate"],
            r#"{"text":"{}","txet":1}"#.into(),
            "txet",
            "text",
        ),
        (
            vec!["score"],
            serde_json::to_string(&score).unwrap(),
            "scroes",
            "scores",
        ),
        (
            vec!["generator-reward"],
            serde_json::to_string(&pref).unwrap(),
            "chosen_tactic",
            "chosen_tactics",
        ),
        (
            vec!["score", "--profile", "kardia"],
            serde_json::to_string(&kardia).unwrap(),
            "emotoin",
            "emotion",
        ),
        (
            vec!["advantages"],
            r#"{"rewards":[1,0],"group_size":2,"vaild":[1,0]}"#.into(),
            "vaild",
            "valid",
        ),
        (
            vec!["loss"],
            r#"{"logp":[-1,-2],"maks":[1,0],"seq_offsets":[0,2],"advantages":[1]}"#.into(),
            "maks",
            "mask",
        ),
    ];
    for (args, line, typo, closest) in cases {
        let (code, msg) = error(&args, &line);
        assert_eq!(code, "schema", "{args:?}");
        assert!(
            msg.contains(&format!(
                "unknown member \"{typo}\" (did you mean \"{closest}\"?"
            )),
            "{args:?}: {msg}"
        );
        assert!(msg.contains("\"meta\""), "{msg}");
    }
    // A response of a group: that response fails, naming the member; the others score.
    let mut group = data_line("score_valid.jsonl");
    let scores = group.remove("scores").unwrap();
    group.insert(
        "responses".into(),
        serde_json::json!([{"scores": scores}, {"scores": scores, "judeg": "x"}]),
    );
    let out = ok(&["score"], &serde_json::to_string(&group).unwrap());
    assert!(out["rewards"][0].is_number());
    assert!(out["rewards"][1].is_null());
    let msg = out["errors"][1]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("\"responses\"[1]: unknown member \"judeg\" (did you mean \"judge\"?"),
        "{msg}"
    );
}

#[test]
fn meta_is_echoed_byte_for_byte_and_never_read() {
    let out = care(
        &["advantages"],
        "{\"meta\": {\"run\": 1e2, \"tags\": [\"a\"]}, \"rewards\":[1,0],\"group_size\":2,\"id\":-0}\n",
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(r#"{"line":1,"id":-0,"meta":{"run": 1e2, "tags": ["a"]},"advantages":"#),
        "{text}"
    );
}

#[test]
fn layout_and_length_errors_name_the_arrays_and_their_sizes() {
    for (args, line, code, want) in [
        (
            &["advantages"][..],
            r#"{"rewards":[1,0],"group_size":3}"#,
            "invalid_layout",
            "\"rewards\" has 2 values, not a multiple of \"group_size\" 3",
        ),
        (
            &["advantages"][..],
            r#"{"rewards":[1,0],"group_size":0}"#,
            "invalid_layout",
            "\"group_size\" is 0; it must be at least 1",
        ),
        (
            &["advantages"][..],
            r#"{"rewards":[1,0],"group_offsets":[0,1,3]}"#,
            "invalid_layout",
            "\"group_offsets\" ends at 3 but \"rewards\" has 2 values; the last offset must equal the length",
        ),
        (
            &["advantages"][..],
            r#"{"rewards":[1,0],"group_offsets":[0,2,1,2]}"#,
            "invalid_layout",
            "\"group_offsets\"[2] is smaller than \"group_offsets\"[1]; the offsets must not decrease",
        ),
        (
            &["advantages"][..],
            r#"{"rewards":[1,0],"group_size":2,"valid":[1]}"#,
            "length_mismatch",
            "\"valid\" has 1 value but \"rewards\" has 2 values; they must have one entry each",
        ),
        (
            &["loss"][..],
            r#"{"logp":[-1,-2],"logp_old":[-1],"seq_offsets":[0,2],"advantages":[1]}"#,
            "length_mismatch",
            "\"logp_old\" has 1 value but \"logp\" has 2 values; they must have one entry each",
        ),
        (
            &["loss"][..],
            r#"{"logp":[-1,-2],"mask":[1,1,1],"seq_offsets":[0,2],"advantages":[1]}"#,
            "length_mismatch",
            "\"mask\" has 3 values but \"logp\" has 2 values; they must have one entry each",
        ),
        (
            &["loss"][..],
            r#"{"logp":[-1,-2],"seq_offsets":[1,2],"advantages":[1]}"#,
            "invalid_layout",
            "\"seq_offsets\"[0] is 1; the offsets must start at 0",
        ),
        (
            &["loss"][..],
            r#"{"logp":[-1,-2],"seq_offsets":[0,2],"advantages":[1,2,3]}"#,
            "length_mismatch",
            "\"advantages\" has 3 values; expected 1 (one per sequence of \"seq_offsets\") or 2 (one per token of \"logp\")",
        ),
    ] {
        assert_eq!(
            error(args, line),
            (code.to_owned(), want.to_owned()),
            "{line}"
        );
    }
}

#[test]
fn a_pretty_printed_file_gets_a_json_lines_hint() {
    let pretty = "{\n  \"text\": \"x\",\n  \"id\": 1\n}\n";
    let out = lines(&["validate"], pretty);
    assert_eq!(out.len(), 4);
    for l in &out {
        assert_eq!(l["error"]["code"], "not_json");
        let msg = l["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("one JSON object per line") && msg.contains("jq -c"),
            "{msg}"
        );
    }
    // Broken JSON on one line of JSON Lines is not given the hint.
    let (_, msg) = error(&["validate"], "{\"text\": x}");
    assert!(!msg.contains("jq"), "{msg}");
}

#[test]
fn usage_errors_point_at_the_subcommand_help_and_bare_care_lists_subcommands() {
    let stderr = |args: &[&str]| {
        let out = care(args, "");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8(out.stderr).unwrap();
        assert_eq!(e.lines().count(), 1, "{e}");
        e
    };
    let e = stderr(&["advantages", "--preset", "grpo"]);
    assert!(
        e.contains("[possible values: verl, trl, trl_batch, openrlhf, dr_grpo, rloo, ")
            && e.contains("(see care advantages --help)"),
        "{e}"
    );
    let e = stderr(&["loss", "--presett", "verl"]);
    assert!(
        e.contains("similar argument exists: '--preset'") && e.contains("(see care loss --help)"),
        "{e}"
    );
    let e = stderr(&["pref", "--tau", "x"]);
    assert!(e.contains("(see care generator-reward --help)"), "{e}");
    let e = stderr(&["loss", "--clip-low", "-1"]);
    assert!(
        e.contains("--clip-low") && !e.contains("--clip-high"),
        "{e}"
    );
    let e = stderr(&[]);
    for sub in [
        "validate",
        "score",
        "generator-reward",
        "advantages",
        "loss",
        "demo",
    ] {
        assert!(e.contains(sub), "{e}");
    }
    // Every subcommand has its own help.
    for sub in [
        "validate",
        "score",
        "generator-reward",
        "pref",
        "advantages",
        "loss",
        "analyze",
        "demo",
    ] {
        let out = care(&[sub, "--help"], "");
        assert_eq!(out.status.code(), Some(0), "{sub}");
        assert!(
            String::from_utf8(out.stdout)
                .unwrap()
                .contains("Usage: care "),
            "{sub}"
        );
    }
}
