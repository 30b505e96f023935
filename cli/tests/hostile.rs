//! Hostile lines through `care_cli::process_line`, the exact per-line code path of the binary:
//! every one gives exactly one single-line JSON object with the line number, and an error code
//! where the line cannot be processed. Never a panic, never a hang.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_cli::Command;
use care_core::grpo::AdvantageOptions;
use care_core::{FormatPolicy, GeneratorOptions};

fn commands() -> Vec<Command> {
    vec![
        Command::Validate(FormatPolicy::PAPER),
        Command::Score(care_cli::cmd::score::Options::default()),
        Command::GeneratorReward(GeneratorOptions::PAPER),
        Command::Advantages(AdvantageOptions::default().into()),
        Command::Loss(Box::default()),
    ]
}

const RUBRIC: &str = include_str!("../data/rubric_sft_1.json");

fn hostile_lines() -> Vec<(String, Vec<u8>)> {
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    let deep_obj = "{\"a\":".repeat(50_000) + "1" + &"}".repeat(50_000);
    let rubric_line = serde_json::to_string(&serde_json::json!({"text": RUBRIC})).unwrap();
    let mut v: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), b"".to_vec()),
        ("spaces".into(), b"   \t ".to_vec()),
        ("nesting 100k".into(), deep.clone().into_bytes()),
        ("object nesting 50k".into(), deep_obj.into_bytes()),
        ("1e999".into(), br#"{"rewards":[1e999],"group_size":1}"#.to_vec()),
        ("-1e999".into(), br#"{"logp":[-1e999],"seq_offsets":[0,1],"advantages":[1]}"#.to_vec()),
        ("-0".into(), br#"{"rewards":[-0,0],"group_size":2,"logp":[-0],"seq_offsets":[0,1],"advantages":[-0]}"#.to_vec()),
        ("invalid utf8".into(), b"{\"text\":\"\xc3\x28\"}".to_vec()),
        ("overlong utf8".into(), b"{\"text\":\"\xc0\xaf\"}".to_vec()),
        ("lone surrogate".into(), br#"{"text":"\ud800"}"#.to_vec()),
        ("lone low surrogate".into(), br#"{"text":"\udc00x"}"#.to_vec()),
        ("escaped NUL".into(), br#"{"text":"a\u0000b","rubric":"\u0000","judge":"\u0000"}"#.to_vec()),
        ("raw NUL".into(), b"{\"text\":\"a\x00b\"}".to_vec()),
        ("NUL outside".into(), b"\x00".to_vec()),
        ("BOM".into(), b"\xef\xbb\xbf{\"text\":\"x\"}".to_vec()),
        ("duplicate keys".into(), br#"{"rewards":[1],"rewards":[2],"group_size":1}"#.to_vec()),
        ("nested duplicate".into(), br#"{"rubric":{"categories":[],"categories":[]},"scores":[[],[],[]]}"#.to_vec()),
        ("huge integer".into(), br#"{"rewards":[1],"group_size":18446744073709551616}"#.to_vec()),
        ("huge offsets".into(), br#"{"rewards":[1],"group_offsets":[0,4294967295]}"#.to_vec()),
        ("negative offsets".into(), br#"{"logp":[1],"seq_offsets":[0,-1],"advantages":[1]}"#.to_vec()),
        ("not object".into(), b"[1,2,3]".to_vec()),
        ("string".into(), b"\"text\"".to_vec()),
        ("null".into(), b"null".to_vec()),
        ("rubric deep text".into(), serde_json::to_vec(&serde_json::json!({"text": deep, "rubric": deep, "scores": [[],[],[]]})).unwrap()),
        ("judge deep".into(), serde_json::to_vec(&serde_json::json!({"rubric": RUBRIC, "judge": format!("{{\"criterion_scores\":{deep}}}")})).unwrap()),
        ("judge many braces".into(), serde_json::to_vec(&serde_json::json!({"rubric": RUBRIC, "judge": "{".repeat(200_000)})).unwrap()),
        ("judge many fences".into(), serde_json::to_vec(&serde_json::json!({"rubric": RUBRIC, "judge": "```json\n{".repeat(20_000)})).unwrap()),
        ("many responses".into(), serde_json::to_vec(&serde_json::json!({"rubric": RUBRIC, "responses": vec![serde_json::json!({"scores": [[5,5,5],[5,5],[5,5,5]]}); 5000]})).unwrap()),
        ("scores NaN-ish".into(), serde_json::to_vec(&serde_json::json!({"rubric": RUBRIC, "scores": [[1e308, -1e308, 5],[5,5],[5,5,5]]})).unwrap()),
        ("tactics odd".into(), serde_json::to_vec(&serde_json::json!({"rubric": RUBRIC, "chosen_scores": [[5,5,5],[5,5],[5,5,5]], "rejected_scores": [[5,5,5],[5,5],[5,5,5]], "chosen_tactics": ["\u{0}", "", "[", "[]", "QUESTION "]})).unwrap()),
        ("valid rubric".into(), rubric_line.into_bytes()),
        ("id object".into(), br#"{"id":{"a":[1,"\n"]},"rewards":[1,0],"group_size":2}"#.to_vec()),
    ];
    // A rubric with far more criteria than any capacity.
    let many: Vec<serde_json::Value> = (0..500)
        .map(|i| serde_json::json!({"title": format!("t{i}"), "description": "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5"}))
        .collect();
    let big = serde_json::json!({"categories": [{"category": "Cognitive Empathy", "weight_rationale": "x", "category_weight": 1, "criteria": many}]});
    v.push((
        "500 criteria".into(),
        serde_json::to_vec(
            &serde_json::json!({"text": big.to_string(), "rubric": big, "scores": [[], [], []]}),
        )
        .unwrap(),
    ));
    v
}

#[test]
fn every_hostile_line_gives_one_json_line_per_command() {
    for cmd in commands() {
        for (name, line) in hostile_lines() {
            let (out, ok) = care_cli::process_line(&cmd, 42, &line);
            assert!(!out.contains('\n'), "{cmd:?} {name}: output spans lines");
            let v: serde_json::Value = serde_json::from_str(&out)
                .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {out}"));
            assert_eq!(v["line"], 42, "{name}: {out}");
            if ok {
                assert!(v.get("error").is_none(), "{name}: {out}");
            } else {
                let code = v["error"]["code"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: {out}"));
                assert!(!code.is_empty() && !v["error"]["message"].as_str().unwrap().is_empty());
            }
        }
    }
}

#[test]
fn hostile_lines_get_the_documented_codes() {
    let adv = Command::Advantages(AdvantageOptions::default().into());
    let code = |line: &[u8]| -> String {
        let (out, ok) = care_cli::process_line(&adv, 1, line);
        assert!(!ok, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["error"]["code"].as_str().unwrap().to_owned()
    };
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    assert_eq!(code(deep.as_bytes()), "not_json");
    assert_eq!(code(br#"{"rewards":[1e999],"group_size":1}"#), "not_json");
    assert_eq!(code(b"{\"a\":\"\xff\"}"), "invalid_utf8");
    assert_eq!(code(br#"{"a":"\ud800"}"#), "not_json");
    assert_eq!(code(b"{\"a\":\"\x00\"}"), "not_json");
    assert_eq!(code(b"\xef\xbb\xbf{}"), "not_json");
    assert_eq!(
        code(br#"{"rewards":[1],"rewards":[1],"group_size":1}"#),
        "duplicate_key"
    );
    assert_eq!(code(b""), "not_json");

    // -0 is an ordinary zero reward.
    let (out, ok) = care_cli::process_line(&adv, 1, br#"{"rewards":[-0,1],"group_size":2}"#);
    assert!(ok, "{out}");
    // The id is copied through verbatim (re-serialized, so still one line).
    let (out, ok) = care_cli::process_line(
        &adv,
        3,
        br#"{"id":{"a":[1,"\n"]},"rewards":[1,0],"group_size":2}"#,
    );
    assert!(ok);
    assert!(
        out.starts_with(r#"{"line":3,"id":{"a":[1,"\n"]},"advantages":"#),
        "{out}"
    );
}
