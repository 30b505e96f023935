//! One CLI input line through `care_cli::process_line`, the exact per-line code path of the
//! `care` binary, for each data subcommand: never panics, and the output is always exactly one
//! JSON object (valid JSON, no newline) carrying the line number, with an `error.code` string
//! on error lines.
#![no_main]

use care_cli::Command;
use care_core::grpo::{AdvantageOptions, LossOptions, LossPreset, Preset};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, line)) = data.split_first() else {
        return;
    };
    let cmd = match sel % 4 {
        0 => Command::Advantages(AdvantageOptions::default()),
        1 => Command::Advantages(AdvantageOptions::preset(
            Preset::ALL[usize::from(sel / 4) % Preset::ALL.len()],
        )),
        2 => Command::Loss(LossOptions::default()),
        _ => Command::Loss(LossOptions::preset(
            LossPreset::ALL[usize::from(sel / 4) % LossPreset::ALL.len()],
        )),
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
