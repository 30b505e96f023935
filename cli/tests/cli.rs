//! End-to-end tests of the `care` binary: whole outputs on fixture files, exit codes, stdin,
//! thread-count independence, and agreement with `care-core` called directly.
//!
//! Expected outputs live next to the inputs as `<name>.out.jsonl`. They were generated once with
//! `CARE_BLESS=1 cargo test -p care-cli --test cli` and reviewed by hand (see the numbers checked
//! in the comments of each test); without `CARE_BLESS` a difference fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn care(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_care"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn care");
    // Feed stdin from another thread: with a large input the child fills its stdout pipe
    // before it has read all of stdin, so writing here first would deadlock.
    let mut pipe = child.stdin.take().unwrap();
    let bytes = stdin.unwrap_or_default().to_vec();
    let feeder = std::thread::spawn(move || {
        // A child that exits early (usage error) closes the pipe; that is not a test failure.
        let _ = pipe.write_all(&bytes);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

/// Runs `care <args> tests/data/<input>` and compares stdout with `tests/data/<expected>`.
fn golden(args: &[&str], input: &str, expected: &str) -> String {
    let path = data(input);
    let mut full: Vec<&str> = args.to_vec();
    let p = path.to_str().unwrap();
    full.push(p);
    let out = care(&full, None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).unwrap();
    let exp_path = data(expected);
    if std::env::var_os("CARE_BLESS").is_some() {
        std::fs::write(&exp_path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&exp_path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with CARE_BLESS=1 once)", exp_path.display()));
    assert_eq!(
        got, want,
        "output of care {args:?} {input} differs from {expected}"
    );
    got
}

fn input_lines(name: &str) -> usize {
    let bytes = std::fs::read(data(name)).unwrap();
    bytes.split(|&b| b == b'\n').filter(|_| true).count() - usize::from(bytes.ends_with(b"\n"))
}

/// Every output line is JSON with the right `"line"`, one per input line.
fn assert_one_line_per_input(out: &str, input: &str) {
    let n = input_lines(input);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), n, "{input}: one output line per input line");
    for (i, l) in lines.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["line"], (i + 1) as u64, "{l}");
    }
}

// ---------------------------------------------------------------------------------------------
// advantages

#[test]
fn advantages_valid_golden() {
    // Checked by hand: line 2 is the demo group, mean 0.5875, unbiased std 0.277305, so the first
    // advantage is 0.3375 / 0.277305 = 1.21707. Line 4: group [3,1,2] has mean 2, std 1, so
    // A = +-1/(1+1e-6) = +-0.999999; the empty group has count 0; [5,5] is zero-variance; the
    // singleton gets 0 (default policy). Line 5: valid rewards 0.2 and 0.6 give +-0.7071.
    let out = golden(
        &["advantages"],
        "advantages_valid.jsonl",
        "advantages_valid.out.jsonl",
    );
    assert_one_line_per_input(&out, "advantages_valid.jsonl");
    assert!(!out.contains("\"error\""));
}

#[test]
fn advantages_presets_golden() {
    // verl: singleton raw, so line 3's lone 0.5 gets 0.5 / (1 + 1e-6) = 0.4999995.
    let out = golden(
        &["advantages", "--preset", "verl"],
        "advantages_valid.jsonl",
        "advantages_verl.out.jsonl",
    );
    assert!(out.contains("0.4999995"));
    // trl eps 1e-4: 0.5 / (0.70710677 + 1e-4) = 0.7070068.
    let out = golden(
        &["advantages", "--preset", "trl"],
        "advantages_valid.jsonl",
        "advantages_trl.out.jsonl",
    );
    assert!(out.contains("0.7070068"), "{out}");
    // rloo without scale: [1,0] -> 1 - 0 = 1 and 0 - 1 = -1.
    let out = golden(
        &["advantages", "--preset", "rloo"],
        "advantages_valid.jsonl",
        "advantages_rloo.out.jsonl",
    );
    assert!(
        out.starts_with(r#"{"line":1,"id":"g1","advantages":[1,-1,0,0]"#),
        "{out}"
    );
    // Overrides after a preset: dr_grpo with the biased std still has no scale.
    golden(
        &[
            "advantages",
            "--preset",
            "dr_grpo",
            "--std",
            "biased",
            "--singleton",
            "raw",
        ],
        "advantages_valid.jsonl",
        "advantages_dr_grpo.out.jsonl",
    );
}

#[test]
fn advantages_invalid_golden() {
    let out = golden(
        &["advantages"],
        "advantages_invalid.jsonl",
        "advantages_invalid.out.jsonl",
    );
    assert_one_line_per_input(&out, "advantages_invalid.jsonl");
    assert_eq!(
        out.matches("\"error\"").count(),
        input_lines("advantages_invalid.jsonl")
    );
}

#[test]
fn mixed_malformed_lines_golden() {
    // Malformed JSON, an empty line, a duplicate key, 1e999, trailing text, a lone surrogate, a
    // BOM, invalid UTF-8, a raw NUL, 100k nesting, then CRLF and a last line without newline.
    let out = golden(
        &["advantages"],
        "advantages_mixed.jsonl",
        "advantages_mixed.out.jsonl",
    );
    assert_one_line_per_input(&out, "advantages_mixed.jsonl");
    for code in [
        "not_json",
        "duplicate_key",
        "invalid_utf8",
        "\"line\":13,\"advantages\"",
    ] {
        assert!(out.contains(code), "{code}");
    }
}

#[test]
fn empty_input_gives_empty_output_and_status_0() {
    for cmd in [
        "validate",
        "score",
        "generator-reward",
        "pref",
        "advantages",
        "loss",
    ] {
        let out = golden(&[cmd], "empty.jsonl", "empty.jsonl");
        assert_eq!(out, "");
    }
}

// ---------------------------------------------------------------------------------------------
// loss

#[test]
fn loss_valid_golden() {
    // Checked by hand (default options, token mean): line 4 has token 0 with rho = e^0.5 and
    // A = 1 clipped at -1.2, token 1 at rho 1 with A = -1 gives 1, token 2 with rho = e^-0.5 and
    // A = -1 clipped at 0.8; (-1.2 + 1 + 0.8) / 3 = 0.2, and only token 1 has a gradient, 1/3.
    // Line 6: the log ratio -29 is clamped to -20 (ppo_kl_sum 20), loss (0.8 - 1) / 2 = -0.1.
    let out = golden(&["loss"], "loss_valid.jsonl", "loss_valid.out.jsonl");
    assert_one_line_per_input(&out, "loss_valid.jsonl");
    assert!(out.contains(r#"{"line":4,"loss":0.2,"grad":[0,0.33333334,0,0]"#));
    assert!(!out.contains("\"error\""));
}

#[test]
fn loss_options_golden() {
    golden(
        &["loss", "--preset", "verl"],
        "loss_valid.jsonl",
        "loss_verl.out.jsonl",
    );
    golden(
        &[
            "loss",
            "--kl",
            "k3",
            "--beta",
            "0.1",
            "--agg",
            "seq_mean_token_mean",
            "--clip-low",
            "0.1",
            "--clip-high",
            "0.28",
        ],
        "loss_kl.jsonl",
        "loss_kl_dapo.out.jsonl",
    );
    golden(
        &[
            "loss",
            "--ratio",
            "sequence",
            "--agg",
            "seq_mean_token_sum_norm",
            "--horizon",
            "4",
            "--global-seqs",
            "8",
            "--log-ratio-clamp",
            "5",
        ],
        "loss_valid.jsonl",
        "loss_gspo.out.jsonl",
    );
    golden(
        &[
            "loss",
            "--agg",
            "token_sum",
            "--dual-clip",
            "2",
            "--kl",
            "none",
            "--beta",
            "1",
            "--global-tokens",
            "10",
        ],
        "loss_valid.jsonl",
        "loss_token_sum.out.jsonl",
    );
}

#[test]
fn loss_invalid_golden() {
    let out = golden(&["loss"], "loss_invalid.jsonl", "loss_invalid.out.jsonl");
    assert_one_line_per_input(&out, "loss_invalid.jsonl");
    assert_eq!(
        out.matches("\"error\"").count(),
        input_lines("loss_invalid.jsonl")
    );
}

// ---------------------------------------------------------------------------------------------
// engine behaviour through the binary

#[test]
fn stdin_dash_and_file_give_the_same_output() {
    let bytes = std::fs::read(data("advantages_mixed.jsonl")).unwrap();
    let from_stdin = care(&["advantages", "-"], Some(&bytes));
    let from_default = care(&["advantages"], Some(&bytes));
    let file = data("advantages_mixed.jsonl");
    let from_file = care(&["advantages", file.to_str().unwrap()], None);
    assert_eq!(from_stdin.stdout, from_file.stdout);
    assert_eq!(from_default.stdout, from_file.stdout);
}

#[test]
fn output_is_independent_of_thread_count() {
    let mut input = String::new();
    for i in 0..20_000u32 {
        if i % 997 == 0 {
            input.push_str("oops\n");
        }
        let r = [i % 7, i % 3, i % 5, i % 2];
        input.push_str(&format!(
            "{{\"rewards\":[{},{},{},{}],\"group_size\":2}}\n",
            r[0], r[1], r[2], r[3]
        ));
    }
    let one = care(&["advantages", "--threads", "1"], Some(input.as_bytes()));
    let many = care(&["advantages", "--threads", "5"], Some(input.as_bytes()));
    assert_eq!(one.status.code(), Some(0));
    assert_eq!(one.stdout, many.stdout);
    let text = String::from_utf8(one.stdout).unwrap();
    assert_eq!(text.lines().count(), input.lines().count());
}

#[test]
fn strict_exits_1_when_a_line_failed_and_0_otherwise() {
    let bad = care(
        &["advantages", "--strict"],
        Some(b"{\"rewards\":[1],\"group_size\":1}\nx\n"),
    );
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(String::from_utf8(bad.stdout).unwrap().lines().count(), 2);
    let good = care(
        &["advantages", "--strict"],
        Some(b"{\"rewards\":[1],\"group_size\":1}\n"),
    );
    assert_eq!(good.status.code(), Some(0));
    let lenient = care(&["advantages"], Some(b"x\n"));
    assert_eq!(lenient.status.code(), Some(0));
}

#[test]
fn usage_and_io_errors_exit_2_with_one_line_on_stderr() {
    let missing = care(&["advantages", "/nonexistent/care-input.jsonl"], None);
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8(missing.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("care: cannot open"), "{err}");
    assert!(missing.stdout.is_empty());

    let bad_eps = care(&["advantages", "--eps", "-1"], Some(b""));
    assert_eq!(bad_eps.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(bad_eps.stderr).unwrap().lines().count(),
        1
    );

    let bad_loss = care(&["loss", "--clip-low", "-0.5"], Some(b""));
    assert_eq!(bad_loss.status.code(), Some(2));

    let zero_max = care(&["advantages", "--max-line-bytes", "0"], Some(b""));
    assert_eq!(zero_max.status.code(), Some(2));

    for args in [
        &["advantages", "--preset", "nope"][..],
        &["frobnicate"][..],
        &["loss", "--agg", "mean"][..],
    ] {
        let o = care(args, Some(b""));
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn max_line_bytes_reports_line_too_long_and_goes_on() {
    let mut input = b"{\"rewards\":[1,0],\"group_size\":2}\n".to_vec();
    input.extend(std::iter::repeat_n(b' ', 5000));
    input.extend_from_slice(
        b"{\"rewards\":[1,0],\"group_size\":2}\n{\"rewards\":[0,1],\"group_size\":2}\n",
    );
    let out = care(&["advantages", "--max-line-bytes", "100"], Some(&input));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[1],
        r#"{"line":2,"error":{"code":"line_too_long","message":"line has 5032 bytes, more than the maximum of 100 (--max-line-bytes)"}}"#
    );
    assert!(lines[2].starts_with(r#"{"line":3,"advantages":[-0.70710576,0.70710576]"#));
}

#[test]
fn help_texts_have_examples() {
    let top = care(&["--help"], None);
    assert_eq!(top.status.code(), Some(0));
    let text = String::from_utf8(top.stdout).unwrap();
    assert!(text.contains("Examples:"), "{text}");
    for cmd in [
        "validate",
        "score",
        "generator-reward",
        "pref",
        "advantages",
        "loss",
        "demo",
    ] {
        let o = care(&[cmd, "--help"], None);
        assert_eq!(o.status.code(), Some(0), "{cmd}");
        let t = String::from_utf8(o.stdout).unwrap();
        assert!(t.contains("Example"), "{cmd} help has an example:\n{t}");
    }
}

// ---------------------------------------------------------------------------------------------
// agreement with the library

fn parse_f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        // The CLI prints the shortest digits that round-trip as f32, so parsing them as f32
        // gives back the exact bits the library wrote.
        .map(|x| x.to_string().parse::<f32>().unwrap())
        .collect()
}

#[test]
fn advantages_agree_with_the_library_bit_for_bit() {
    use care_core::grpo::{AdvantageOptions, GroupLayout, Preset, group_advantages};
    let input = std::fs::read_to_string(data("advantages_valid.jsonl")).unwrap();
    for (preset, opts) in [
        (None, AdvantageOptions::default()),
        (Some("verl"), AdvantageOptions::preset(Preset::Verl)),
        (
            Some("trl_batch"),
            AdvantageOptions::preset(Preset::TrlBatch),
        ),
        (Some("rloo"), AdvantageOptions::preset(Preset::Rloo)),
    ] {
        let mut args = vec!["advantages"];
        if let Some(p) = preset {
            args.extend(["--preset", p]);
        }
        let out = care(&args, Some(input.as_bytes()));
        let out = String::from_utf8(out.stdout).unwrap();
        for (inp, outp) in input.lines().zip(out.lines()) {
            let i: serde_json::Value = serde_json::from_str(inp).unwrap();
            let o: serde_json::Value = serde_json::from_str(outp).unwrap();
            let rewards: Vec<f32> = i["rewards"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().map_or(f32::NAN, |f| f as f32))
                .collect();
            let valid: Option<Vec<u8>> = i.get("valid").map(|v| {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| u8::from(x.as_bool().unwrap_or_else(|| x.as_u64() == Some(1))))
                    .collect()
            });
            let offsets: Vec<u32>;
            let layout = match i.get("group_offsets") {
                Some(o) => {
                    offsets = o
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as u32)
                        .collect();
                    GroupLayout::Offsets(&offsets)
                }
                None => GroupLayout::Fixed {
                    group_size: i["group_size"].as_u64().unwrap() as usize,
                },
            };
            let mut adv = vec![0.0f32; rewards.len()];
            group_advantages(&rewards, valid.as_deref(), layout, &opts, &mut adv, None).unwrap();
            let got = parse_f32s(&o["advantages"]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&adv), "{preset:?} {inp}");
        }
    }
}

#[test]
fn loss_agrees_with_the_library_bit_for_bit() {
    use care_core::grpo::{Advantages, LossInputs, LossOptions, LossPreset, policy_loss};
    let input = std::fs::read_to_string(data("loss_valid.jsonl")).unwrap();
    for (preset, opts) in [
        (None, LossOptions::default()),
        (Some("verl"), LossOptions::preset(LossPreset::Verl)),
    ] {
        let mut args = vec!["loss"];
        if let Some(p) = preset {
            args.extend(["--preset", p]);
        }
        let out = care(&args, Some(input.as_bytes()));
        let out = String::from_utf8(out.stdout).unwrap();
        for (inp, outp) in input.lines().zip(out.lines()) {
            let i: serde_json::Value = serde_json::from_str(inp).unwrap();
            let o: serde_json::Value = serde_json::from_str(outp).unwrap();
            let f32s = |k: &str| -> Option<Vec<f32>> {
                i.get(k).filter(|v| !v.is_null()).map(|v| {
                    v.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().map_or(f32::NAN, |f| f as f32))
                        .collect()
                })
            };
            let logp = f32s("logp").unwrap();
            let old = f32s("logp_old");
            let refp = f32s("logp_ref");
            let adv = f32s("advantages").unwrap();
            let seq: Vec<u32> = i["seq_offsets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let mask: Option<Vec<u8>> = i.get("mask").filter(|v| !v.is_null()).map(|v| {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| u8::from(x.as_bool().unwrap_or_else(|| x.as_u64() == Some(1))))
                    .collect()
            });
            let advantages = if adv.len() + 1 == seq.len() {
                Advantages::PerSequence(&adv)
            } else {
                Advantages::PerToken(&adv)
            };
            let inputs = LossInputs {
                logp: &logp,
                logp_old: old.as_deref(),
                logp_ref: refp.as_deref(),
                seq_offsets: &seq,
                mask: mask.as_deref(),
                advantages,
                logp_rollout: None,
            };
            let mut grad = vec![0.0f32; logp.len()];
            let lib = policy_loss(&inputs, &opts, &mut grad).unwrap();
            let printed = o["loss"].to_string().parse::<f64>().unwrap();
            assert_eq!(printed.to_bits(), lib.loss.to_bits(), "{inp}");
            let g = parse_f32s(&o["grad"]);
            assert_eq!(g.len(), grad.len());
            for (a, b) in g.iter().zip(&grad) {
                assert_eq!(a.to_bits(), b.to_bits(), "{inp}");
            }
            assert_eq!(o["stats"]["tokens"].as_f64().unwrap(), lib.stats.tokens);
            assert_eq!(o["stats"]["clipped"].as_f64().unwrap(), lib.stats.clipped);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// validate, score, pref

#[test]
fn validate_golden() {
    // The two paper rubrics and a minimal 2-2-2 rubric pass; a <think> prefix, a code fence and
    // the envelope break the default (paper) policy with trailing_text / schema.
    let out = golden(
        &["validate"],
        "validate_valid.jsonl",
        "validate_valid.out.jsonl",
    );
    assert_one_line_per_input(&out, "validate_valid.jsonl");
    let rewards: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["format_reward"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(rewards, [1, 1, 0, 0, 0, 1]);
    // The lenient flags accept all six.
    let out = golden(
        &[
            "validate",
            "--allow-think",
            "--allow-code-fence",
            "--allow-envelope",
        ],
        "validate_valid.jsonl",
        "validate_lenient.out.jsonl",
    );
    assert_eq!(out.matches("\"format_reward\":1").count(), 6, "{out}");

    // One broken rule per line: weight_sum (0.9), missing_category, category_order, key_order,
    // level_format, duplicate_title, empty_text, criteria_count (5 and 1), a meta word (a lint,
    // off by default, so that line passes), trailing_text, not_json, schema, unknown_category,
    // weight_range (1.5, and the sum 2.25), a non-string "text" (error line), <think> unclosed.
    let out = golden(
        &["validate"],
        "validate_invalid.jsonl",
        "validate_invalid.out.jsonl",
    );
    assert_one_line_per_input(&out, "validate_invalid.jsonl");
    let lines: Vec<&str> = out.lines().collect();
    for (i, code) in [
        "weight_sum",
        "missing_category",
        "category_order",
        "key_order",
        "level_format",
        "duplicate_title",
        "empty_text",
        "criteria_count",
    ]
    .iter()
    .enumerate()
    {
        assert!(
            lines[i].contains(&format!("\"code\":\"{code}\"")),
            "{}",
            lines[i]
        );
    }
    assert!(lines[0].contains("sum to 0.9"));
    assert!(lines[8].contains("\"format_reward\":1"));
    assert!(lines[14].contains("\"error\":{\"code\":\"schema\""));

    // Every option: the meta word is reported, order checks are off, 5 criteria are allowed
    // and 1 too, and a tolerance of 0.2 accepts the sum 0.9.
    let out = golden(
        &[
            "validate",
            "--meta-words",
            "--no-order",
            "--no-key-order",
            "--min-criteria",
            "1",
            "--max-criteria",
            "5",
            "--weight-tolerance",
            "0.2",
        ],
        "validate_invalid.jsonl",
        "validate_options.out.jsonl",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("\"format_reward\":1"), "{}", lines[0]);
    assert!(lines[2].contains("\"format_reward\":1"), "{}", lines[2]);
    assert!(lines[3].contains("\"format_reward\":1"), "{}", lines[3]);
    assert!(lines[7].contains("\"format_reward\":1"), "{}", lines[7]);
    assert!(lines[8].contains("\"code\":\"meta_word\""), "{}", lines[8]);
}

#[test]
fn score_golden() {
    // Line 1 is the paper's worked example (Appendix C.1): weights (0.40, 0.35, 0.25), scores
    // Cog (4,5), Aff (4,5), Pro (5,5) give r_theta = 0.925. Line 3 is demo response 1 under
    // rubric_sft_1: 0.4 * 14/15 + 0.25 * 0.9 + 0.35 * 14/15 = 0.925 as well. Line 8 mixes good
    // and broken responses in one group (null rewards, one error each); line 9's weights (2, 2,
    // missing) are normalized to (0.5, 0.5, 0).
    let out = golden(&["score"], "score_valid.jsonl", "score_valid.out.jsonl");
    assert_one_line_per_input(&out, "score_valid.jsonl");
    assert!(
        out.starts_with(r#"{"line":1,"id":"paper-C1","reward":0.925,"#),
        "{out}"
    );
    assert!(out.contains(r#""rewards":[1,0,null,null,null,null]"#));
    assert!(out.contains(r#""weights":[0.5,0.5,0],"format_reward":0"#));

    let out = golden(&["score"], "score_invalid.jsonl", "score_invalid.out.jsonl");
    assert_eq!(
        out.matches("\"error\"").count(),
        input_lines("score_invalid.jsonl")
    );

    // --missing zero scores the missing Aff criterion 0: 0.4*0.9 + 0.35*0.4 + 0.25*1 = 0.75;
    // --missing skip drops it: 0.4*0.9 + 0.35*0.8 + 0.25*1 = 0.89; --out-of-range clamp turns 7
    // into 5 and 5.5 into 5 (rounded half away from zero is 6, then clamped).
    let out = golden(
        &["score", "--missing", "zero", "--out-of-range", "clamp"],
        "score_invalid.jsonl",
        "score_lenient.out.jsonl",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("\"reward\":0.75,"), "{}", lines[0]);
    assert!(lines[1].contains("\"reward\":0.925,"), "{}", lines[1]);
    assert!(lines[1].contains("\"clamped\":1"), "{}", lines[1]);
    let out = golden(
        &["score", "--missing", "skip", "--uniform-weights"],
        "score_invalid.jsonl",
        "score_skip_uniform.out.jsonl",
    );
    // Uniform weights: (0.9 + 0.8 + 1) / 3 = 0.9 (up to rounding of the thirds).
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert!(
        (first["reward"].as_f64().unwrap() - 0.9).abs() < 1e-12,
        "{out}"
    );
    assert_eq!(first["fired"]["uniform_weights"], true);
}

#[test]
fn pref_golden() {
    // Line 1: the paper's worked example, r_pref = 0.211997...; tactics questioning (Cog) and
    // validation (Aff) sit on the two highest weights, so r_align = 1 and r_phi = r_pref + 0.1
    // + 0.3. Line 2 swaps chosen and rejected: r_pref is negated exactly.
    let out = golden(&["pref"], "pref_valid.jsonl", "pref_valid.out.jsonl");
    assert_one_line_per_input(&out, "pref_valid.jsonl");
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let r0 = v[0]["r_pref"].as_f64().unwrap();
    assert!((r0 - 0.211_997).abs() < 1e-6, "{r0}");
    assert_eq!(v[1]["r_pref"].as_f64().unwrap(), -r0);
    assert_eq!(v[0]["reward"].as_f64().unwrap(), r0 + 0.1 + 0.3);
    // Line 4: a rubric that does not parse gets 0 everywhere.
    assert_eq!(v[3]["reward"].as_f64().unwrap(), 0.0);
    assert_eq!(v[3]["parsed"], false);

    let out = golden(&["pref"], "pref_invalid.jsonl", "pref_invalid.out.jsonl");
    assert_eq!(
        out.matches("\"error\"").count(),
        input_lines("pref_invalid.jsonl")
    );

    // Options: raw scale saturates; lambda/gamma change only the combination; unknown labels
    // can be ignored; tau changes r_pref.
    let out = golden(
        &[
            "pref",
            "--scale",
            "raw",
            "--tau",
            "1.5",
            "--lambda",
            "0.5",
            "--gamma",
            "0",
            "--unknown-label",
            "ignore",
            "--out-of-range",
            "clamp",
        ],
        "pref_invalid.jsonl",
        "pref_options.out.jsonl",
    );
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["labels"]["unknown"], 1);
    let expect = first["r_pref"].as_f64().unwrap() + 0.5 * first["r_align"].as_f64().unwrap();
    assert_eq!(first["reward"].as_f64().unwrap(), expect);
}

#[test]
fn score_and_pref_agree_with_the_library() {
    /// The rubric text exactly as the line holds it (a string's content, or an object's raw
    /// JSON: re-serializing would reorder keys and break the key_order check).
    fn rubric_text(line: &str) -> String {
        let members: std::collections::BTreeMap<String, &serde_json::value::RawValue> =
            serde_json::from_str(line).unwrap();
        let raw = members["rubric"].get();
        match serde_json::from_str::<String>(raw) {
            Ok(s) => s,
            Err(_) => raw.to_owned(),
        }
    }
    use care_core::{
        FormatPolicy, GeneratorOptions, ScoreOptions, generator_reward, policy_reward, validate,
    };
    let input = std::fs::read_to_string(data("score_valid.jsonl")).unwrap();
    let out = String::from_utf8(care(&["score"], Some(input.as_bytes())).stdout).unwrap();
    for (inp, outp) in input.lines().zip(out.lines()) {
        let i: serde_json::Value = serde_json::from_str(inp).unwrap();
        let o: serde_json::Value = serde_json::from_str(outp).unwrap();
        let Some(scores) = i.get("scores") else {
            continue;
        };
        let text = rubric_text(inp);
        let mut scratch = vec![0u8; text.len()];
        let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
        let flat: Vec<f64> = scores
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| d.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
            .collect();
        let r = policy_reward(v.rubric.as_ref().unwrap(), &flat, &ScoreOptions::default()).unwrap();
        assert_eq!(o["reward"].as_f64().unwrap(), r.reward, "{inp}");
    }

    let input = std::fs::read_to_string(data("pref_valid.jsonl")).unwrap();
    let out = String::from_utf8(care(&["pref"], Some(input.as_bytes())).stdout).unwrap();
    for (inp, outp) in input.lines().zip(out.lines()) {
        let i: serde_json::Value = serde_json::from_str(inp).unwrap();
        let o: serde_json::Value = serde_json::from_str(outp).unwrap();
        let text = rubric_text(inp);
        let flat = |k: &str| -> Vec<f64> {
            i[k].as_array()
                .unwrap()
                .iter()
                .flat_map(|d| d.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect()
        };
        let tactics: Vec<&str> = i["chosen_tactics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        let mut scratch = vec![0u8; text.len()];
        let g = generator_reward(
            text.as_bytes(),
            &mut scratch,
            &flat("chosen_scores"),
            &flat("rejected_scores"),
            &tactics,
            &GeneratorOptions::PAPER,
        )
        .unwrap();
        assert_eq!(o["reward"].as_f64().unwrap(), g.reward, "{inp}");
        assert_eq!(o["r_pref"].as_f64().unwrap(), g.r_pref, "{inp}");
        assert_eq!(o["r_align"].as_f64().unwrap(), g.r_align, "{inp}");
    }
}

#[test]
fn generator_reward_is_pref_under_its_new_name() {
    // `care pref` is a documented alias: the same subcommand, byte for byte, with and without
    // options, on valid and invalid lines.
    for (args, input, expected) in [
        (&[][..], "pref_valid.jsonl", "pref_valid.out.jsonl"),
        (&[][..], "pref_invalid.jsonl", "pref_invalid.out.jsonl"),
        (
            &[
                "--scale",
                "raw",
                "--tau",
                "1.5",
                "--lambda",
                "0.5",
                "--gamma",
                "0",
                "--unknown-label",
                "ignore",
                "--out-of-range",
                "clamp",
            ][..],
            "pref_invalid.jsonl",
            "pref_options.out.jsonl",
        ),
    ] {
        let new: Vec<&str> = std::iter::once("generator-reward")
            .chain(args.iter().copied())
            .collect();
        let old: Vec<&str> = std::iter::once("pref")
            .chain(args.iter().copied())
            .collect();
        assert_eq!(golden(&new, input, expected), golden(&old, input, expected));
    }
    let help = String::from_utf8(care(&["--help"], None).stdout).unwrap();
    assert!(
        help.contains("generator-reward") && help.contains("[alias: pref]"),
        "{help}"
    );
}

#[test]
fn usage_errors_name_the_accepted_values_on_one_line() {
    let o = care(&["advantages", "--preset", "trlbatch"], Some(b""));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "[possible values: verl, trl, trl_batch, openrlhf, dr_grpo, rloo, opo, remax, \
             grpo_passk, gpg, reinforce_pp_baseline, verl_gpg]"
        ),
        "{err}"
    );
    assert!(err.contains("a similar value exists: 'trl_batch'"), "{err}");
    // Options outside their domain: the core's check, naming the flag.
    let o = care(&["loss", "--clip-low", "-0.5"], Some(b""));
    assert_eq!(
        String::from_utf8(o.stderr).unwrap(),
        "care: --clip-low: eps_low must be finite and >= 0\n"
    );
}

// ---------------------------------------------------------------------------------------------
// demo

#[test]
fn demo_prints_the_whole_loop_on_the_cpu() {
    // The CPU rendering is pure, so it is the golden; the binary prints it verbatim when no GPU
    // driver is present (on a GPU machine the device line and the last digits may differ).
    let rendered = care_cli::demo::render(&care_cli::device::Cpu).unwrap();
    let exp = data("demo.out.txt");
    if std::env::var_os("CARE_BLESS").is_some() {
        std::fs::write(&exp, &rendered).unwrap();
    }
    assert_eq!(rendered, std::fs::read_to_string(&exp).unwrap());
    assert!(rendered.contains("Device: CPU"));
    // Response 1 of the demo scores 0.9250 (checked by hand in score_golden) and the rubric
    // passes the format contract.
    assert!(rendered.contains("r_fmt = 1, 0 violations"));
    assert!(rendered.contains("0.9250"));

    let out = care(&["demo"], None);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    if care_kernels::cuda::driver_available() {
        assert!(text.contains("Device: "), "{text}");
    } else {
        assert_eq!(text, rendered);
    }
}

#[test]
fn group_scoring_agrees_with_the_core_batch_api() {
    // The demo group (six judge answers under rubric_sft_1) through `care score` and through
    // care_core::policy_reward_group on the same parsed scores: identical rewards, bit for bit.
    use care_core::{
        FormatPolicy, ScoreOptions, parse_judge_output, policy_reward_group, validate,
    };
    let line = std::fs::read_to_string(data("score_valid.jsonl"))
        .unwrap()
        .lines()
        .find(|l| l.contains("\"id\": \"group\""))
        .unwrap()
        .to_owned();
    let out = care(&["score"], Some(line.as_bytes()));
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rubric_text = include_str!("../data/rubric_sft_1.json");
    let mut scratch = vec![0u8; rubric_text.len()];
    let v = validate(rubric_text.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    let rubric = v.rubric.as_ref().unwrap();
    let i: serde_json::Value = serde_json::from_str(&line).unwrap();
    let mut flat = Vec::new();
    for r in i["responses"].as_array().unwrap() {
        let mut s = vec![0.0; rubric.total_criteria()];
        parse_judge_output(r["judge"].as_str().unwrap().as_bytes(), rubric, &mut s).unwrap();
        flat.extend(s);
    }
    let mut rewards = vec![0.0; 6];
    let rep = policy_reward_group(rubric, &ScoreOptions::default(), &flat, &mut rewards).unwrap();
    assert_eq!(rep.failed, 0);
    let cli: Vec<f64> = o["rewards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(cli, rewards);
}

// ---------------------------------------------------------------------------------------------
// The 2026 options: rollout correction, the policy-loss family, the new estimators

/// The `loss` member of output line `i` (0-based).
fn loss_of_line(out: &str, i: usize) -> f64 {
    let v: serde_json::Value = serde_json::from_str(out.lines().nth(i).unwrap()).unwrap();
    v["loss"].as_f64().unwrap()
}

fn assert_close(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-14 * (1.0 + want.abs()),
        "got {got}, want {want}"
    );
}

#[test]
fn loss_rollout_correction_golden() {
    // Line "tis": logp = logp_old = 0, A = 1, so pg = -1 per token; x = old - rollout =
    // [0, -1, 2, -0.5]; token TIS at C = 2: w = [1, e^-1, 2, e^-0.5], loss = -sum(w) / 4.
    let out = golden(
        &["loss", "--rollout-is", "token"],
        "loss_rollout.jsonl",
        "loss_rollout_tis.out.jsonl",
    );
    assert_one_line_per_input(&out, "loss_rollout.jsonl");
    let w: f64 = 1.0 + (-1.0f64).exp() + 2.0 + (-0.5f64).exp();
    assert_close(loss_of_line(&out, 0), -w / 4.0);
    assert!(out.contains(r#""rollout":{"tokens":4,"sequences":1,"rejected_tokens":0"#));
    // A line without rollout log-probs has no "rollout" member.
    assert!(out.contains(r#"{"line":4,"id":"no_rollout""#));
    let line4 = out.lines().nth(3).unwrap();
    assert!(!line4.contains("rollout\":{"), "{line4}");
    // Rejection: token_k2 <= 1 drops x = 2 (token 2 of line 1): (1 + e^-1 + e^-0.5) / 3.
    let out = golden(
        &[
            "loss",
            "--rollout-is",
            "token",
            "--rollout-rs",
            "token_k2,seq_mean_k1",
            "--rollout-rs-threshold",
            "1,10",
        ],
        "loss_rollout.jsonl",
        "loss_rollout_rs.out.jsonl",
    );
    let kept: f64 = 1.0 + (-1.0f64).exp() + (-0.5f64).exp();
    assert_close(loss_of_line(&out, 0), -kept / 3.0);
    assert!(out.contains(r#""rejected_tokens":1,"rejected_sequences":1"#));
}

#[test]
fn loss_family_and_presets_golden() {
    for (args, expected) in [
        (
            &["loss", "--preset", "verl_gspo"][..],
            "loss_verl_gspo.out.jsonl",
        ),
        (
            &["loss", "--preset", "trl_cispo"],
            "loss_trl_cispo.out.jsonl",
        ),
        (
            &["loss", "--preset", "verl_geo_mean"],
            "loss_verl_geo_mean.out.jsonl",
        ),
        (
            &["loss", "--policy-loss", "sapo", "--agg", "token_sum_norm"],
            "loss_sapo.out.jsonl",
        ),
        (
            &["loss", "--preset", "trl_grpo", "--no-clamps"],
            "loss_trl_grpo_no_clamps.out.jsonl",
        ),
        (
            &[
                "loss",
                "--policy-loss",
                "kl_cov",
                "--cov-ratio",
                "0.5",
                "--kl-cov-coef",
                "2",
            ],
            "loss_kl_cov.out.jsonl",
        ),
    ] {
        let out = golden(args, "loss_valid.jsonl", expected);
        assert_one_line_per_input(&out, "loss_valid.jsonl");
    }
    // Line 1 of loss_valid: logp - logp_old = [-1 - (-1.1f32), 0] (one sequence, A = 1).
    // CISPO capped at 5 (TRL): rho = [e^0.1, 1] inside, l = -rho * logp = [e^0.1, 2], token
    // mean.
    let out = std::fs::read_to_string(data("loss_trl_cispo.out.jsonl")).unwrap();
    let rho = (-1.0f64 - f64::from(-1.1f32)).exp();
    assert_close(loss_of_line(&out, 0), (rho + 2.0) / 2.0);
    let kl_cov = std::fs::read_to_string(data("loss_kl_cov.out.jsonl")).unwrap();
    assert!(kl_cov.contains("\"cov_selected\":"));
}

#[test]
fn advantages_estimators_golden() {
    // OPO: baseline (2*1 + 6*1) / 12 = 2/3.
    let out = golden(
        &[
            "advantages",
            "--baseline",
            "length_weighted",
            "--scale",
            "none",
        ],
        "advantages_estimators.jsonl",
        "advantages_opo.out.jsonl",
    );
    assert!(
        out.starts_with(r#"{"line":1,"id":"opo","advantages":[0.33333334,-0.6666667,0.33333334]"#)
    );
    // ReMax: r - b per sample.
    let out = golden(
        &["advantages", "--preset", "remax"],
        "advantages_estimators.jsonl",
        "advantages_remax.out.jsonl",
    );
    assert!(out.contains(r#"{"line":2,"id":"remax","advantages":[0.75,0,-0.25]"#));
    // pass@k without the std: only the best gets 1 - 0.5.
    let out = golden(
        &["advantages", "--preset", "grpo_passk", "--scale", "none"],
        "advantages_estimators.jsonl",
        "advantages_passk.out.jsonl",
    );
    assert!(out.contains(r#"{"line":3,"id":"passk","advantages":[0,0.5,0,0]"#));
    // GPG: alpha = 8 / (8 - 4) = 2 undoes the all-equal group's dilution.
    let out = golden(
        &["advantages", "--preset", "gpg"],
        "advantages_estimators.jsonl",
        "advantages_gpg.out.jsonl",
    );
    assert!(out.contains(r#"{"line":4,"id":"gpg","advantages":[1,-1,1,-1,0,0,0,0]"#));
    // REINFORCE++-baseline: [0.5, -0.5] broadcast to [0.5, 0.5, -0.5], whitened.
    let out = golden(
        &[
            "advantages",
            "--preset",
            "reinforce_pp_baseline",
            "--whiten",
        ],
        "advantages_estimators.jsonl",
        "advantages_reinforce_pp_baseline.out.jsonl",
    );
    assert!(
        out.contains(r#""token_advantages":[0.57735026,0.57735026,-1.1547005]"#),
        "{out}"
    );
    // The std floor: max(std, 1) + eps instead of std + eps.
    golden(
        &["advantages", "--std-floor", "1"],
        "advantages_valid.jsonl",
        "advantages_std_floor.out.jsonl",
    );
}

#[test]
fn advantages_token_estimators_golden() {
    // GAE, gamma = lambda = 0.5: line 1 by hand A = [-0.328125, 0.1875, 0.25], R = A + V; line 2
    // skips the masked token: A = [2, 0, 4, 1], R = [2, 0, 4, 2].
    let out = golden(
        &[
            "advantages",
            "--estimator",
            "gae",
            "--gamma",
            "0.5",
            "--lambda",
            "0.5",
        ],
        "advantages_tokens.jsonl",
        "advantages_gae.out.jsonl",
    );
    assert!(out.contains(r#""advantages":[-0.328125,0.1875,0.25],"returns":[0.171875,0.4375,1]"#));
    assert!(out.contains(r#""advantages":[2,0,4,1],"returns":[2,0,4,2]"#));
    // REINFORCE++: discounted returns, then whitened over the line's counted tokens.
    let out = golden(
        &[
            "advantages",
            "--estimator",
            "reinforce_pp",
            "--gamma",
            "0.5",
            "--whiten",
        ],
        "advantages_tokens.jsonl",
        "advantages_reinforce_pp.out.jsonl",
    );
    assert!(out.contains(r#""returns":[0.25,0.5,1]"#));
    assert!(out.contains(r#""returns":[3,0,4,2]"#));
}

#[test]
fn new_option_errors_name_the_flag() {
    let o = care(
        &[
            "loss",
            "--rollout-rs",
            "token_k4",
            "--rollout-rs-threshold",
            "2",
        ],
        Some(b""),
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.starts_with("care: --rollout-rs \"token_k4\""), "{err}");
    let o = care(
        &["loss", "--policy-loss", "cispo", "--ratio", "sequence"],
        Some(b""),
    );
    assert_eq!(
        String::from_utf8(o.stderr).unwrap(),
        "care: --ratio: ratio_level must be token unless the policy loss is clip\n"
    );
    let o = care(&["advantages", "--gamma", "2"], Some(b""));
    assert_eq!(o.status.code(), Some(2));
    // A baseline that needs an input the line lacks is a line error, not a silent default.
    let o = care(
        &["advantages", "--preset", "opo"],
        Some(br#"{"rewards":[1,0],"group_size":2}"#),
    );
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains(r#""code":"invalid_argument""#), "{out}");
}

/// The issue lines of the six verl classes (tests/tests/peers.rs pins each against verl's
/// formulas): the verl presets and switches give verl's numbers, the defaults `care`'s own.
#[test]
fn verl_classes_on_the_command_line() {
    let run = |args: &[&str], line: &str| {
        let o = care(args, Some(line.as_bytes()));
        assert_eq!(o.status.code(), Some(0));
        String::from_utf8(o.stdout).unwrap()
    };
    let line = r#"{"logp":[-1],"logp_rollout":[-1.5],"seq_offsets":[0,1],"advantages":[1]}"#;
    let out = run(&["loss", "--preset", "verl_bypass"], line);
    assert!(
        out.starts_with(r#"{"line":1,"loss":-1.2,"grad":[0],"#),
        "{out}"
    );
    let out = run(&["loss", "--preset", "verl"], line);
    assert!(
        out.starts_with(r#"{"line":1,"loss":-1,"grad":[-1],"#),
        "{out}"
    );
    let out = run(
        &["loss", "--preset", "verl_gpg", "--rollout-is", "token"],
        line,
    );
    assert!(
        out.starts_with(r#"{"line":1,"loss":1.6487212707001282,"#),
        "{out}"
    );
    let tok = r#"{"token_rewards":[0,0,1,0.5],"seq_offsets":[0,3,4],"mask":[1,0,1,1]}"#;
    let args = ["advantages", "--estimator", "reinforce_pp", "--gamma", "1"];
    assert!(run(&args, tok).contains(r#""returns":[1,0,1,0.5]"#));
    let reset = [&args[..], &["--masked-token", "reset"]].concat();
    assert!(run(&reset, tok).contains(r#""returns":[0,0,1,0.5]"#));
    let g = r#"{"rewards":[1,0,2],"group_offsets":[0,2,3]}"#;
    let out = run(&["advantages", "--preset", "verl_gpg"], g);
    assert!(out.contains(r#""advantages":[0.75,-0.75,3]"#), "{out}");
    let out = run(&["advantages", "--preset", "gpg"], g);
    assert!(out.contains(r#""advantages":[0.75,-0.75,0]"#), "{out}");
    // --bypass on with logp_old is an error line naming the conflict.
    let both = r#"{"logp":[-1],"logp_old":[-1],"logp_rollout":[-1.5],"seq_offsets":[0,1],"advantages":[1]}"#;
    let out = run(&["loss", "--preset", "verl_bypass"], both);
    assert!(
        out.contains("invalid_argument") && out.contains("logp_old"),
        "{out}"
    );
}
