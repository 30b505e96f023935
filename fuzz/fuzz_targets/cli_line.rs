//! One CLI input line through `care_cli::process_line`, the exact per-line code path of the
//! `care` binary, for each subcommand (validate, score, score --profile, generator-reward, advantages, loss): never panics, and the output is always exactly one
//! JSON object (valid JSON, no newline) carrying the line number, with an `error.code` string
//! on error lines.
#![no_main]

use care_cli::Command;
use care_cli::cmd::{score, score_profile};
use care_core::grpo::{AdvantageOptions, LossOptions, LossPreset, Preset};
use care_core::profile::ProfileBuf;
use care_core::{FormatPolicy, GeneratorOptions, MissingPolicy, RangePolicy, ScoreOptions};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, LazyLock};

/// The built-in profiles, parsed once.
static PROFILES: LazyLock<[Arc<ProfileBuf>; 2]> = LazyLock::new(|| {
    ["kardia", "care"].map(|n| Arc::new(ProfileBuf::builtin(n).expect("built-in profile")))
});

fuzz_target!(|data: &[u8]| {
    let Some((&sel, line)) = data.split_first() else {
        return;
    };
    // The selector byte picks the subcommand (low 3 bits) and its options (high bits).
    let hi = usize::from(sel >> 3);
    let format = if hi & 1 == 0 {
        FormatPolicy::PAPER
    } else {
        FormatPolicy::lenient()
    };
    let cmd = match sel % 8 {
        0 => Command::Advantages(AdvantageOptions::default().into()),
        1 => Command::Advantages(
            AdvantageOptions::preset(Preset::ALL[hi % Preset::ALL.len()]).into(),
        ),
        2 => Command::Loss(Box::default()),
        3 => Command::Loss(Box::new(LossOptions::preset(
            LossPreset::ALL[hi % LossPreset::ALL.len()],
        ))),
        4 => Command::Validate(format),
        5 => Command::Score(score::Options {
            score: score_options(hi),
            format,
        }),
        // `care score --profile`: kardia, or care (whose rubric uses `format`).
        7 => Command::ScoreProfile(score_profile::Options {
            profile: PROFILES[(hi >> 2) & 1].clone(),
            score: score_options(hi),
            format,
        }),
        _ => Command::GeneratorReward(GeneratorOptions {
            format,
            ..GeneratorOptions::PAPER
        }),
    };
    let (out, ok) = care_cli::process_line(&cmd, 7, line);
    assert!(!out.contains('\n'), "output spans lines: {out}");
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    assert_eq!(v.get("line").and_then(|l| l.as_u64()), Some(7), "{out}");
    if ok {
        assert!(v.get("error").is_none(), "{out}");
    } else {
        assert!(
            v.pointer("/error/code").and_then(|c| c.as_str()).is_some(),
            "{out}"
        );
    }
});

/// Score policies from the selector's high bits.
fn score_options(hi: usize) -> ScoreOptions {
    ScoreOptions {
        missing: [
            MissingPolicy::Error,
            MissingPolicy::Zero,
            MissingPolicy::Skip,
        ][(hi >> 1) % 3],
        out_of_range: if hi & 8 == 0 {
            RangePolicy::Error
        } else {
            RangePolicy::Clamp
        },
        uniform_weights: hi & 16 != 0,
    }
}
