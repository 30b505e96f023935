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
    for cmd in ["validate", "score", "pref", "advantages", "loss"] {
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
        "loss_valid.jsonl",
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
    for cmd in ["validate", "score", "pref", "advantages", "loss", "demo"] {
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
