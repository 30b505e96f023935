//! Checks of `include/care.h` against the built library:
//! * the header compiles as C11 and C++17 with `-Wall -Wextra -Wpedantic -Werror`, and a
//!   C file that takes the address of every declared function links against `libcare.a`;
//! * the functions declared in the header are exactly the `care_*` symbols that `libcare.so`
//!   exports (`nm -D --defined-only`);
//! * the version macros agree with the crate version.
//!
//! Needs a C and a C++ compiler (`cc`, `c++`, or `$CC`/`$CXX`) and binutils' `nm`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use common::{declared_functions, repo_root};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn tool(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_declares_exactly_the_exported_symbols() {
    let header = common::header();
    let declared = declared_functions(&header);
    assert!(
        declared.contains("care_result_message"),
        "parser found {declared:?}"
    );

    let so = common::libcare_dir().join("libcare.so");
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
        .unwrap_or_else(|e| panic!("nm on {}: {e}", so.display()));
    assert!(out.status.success(), "nm failed on {}", so.display());
    let exported: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_addr, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T" && name.starts_with("care_")).then(|| name.to_string())
        })
        .collect();

    let missing: Vec<_> = declared.difference(&exported).collect();
    let undeclared: Vec<_> = exported.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "declared in care.h but not exported: {missing:?}"
    );
    assert!(
        undeclared.is_empty(),
        "exported but not in care.h: {undeclared:?}"
    );
}

#[test]
fn header_compiles_as_c11_and_cxx17_and_every_function_links() {
    let header = common::header();
    let declared = declared_functions(&header);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("care-header-check");
    std::fs::create_dir_all(&dir).expect("tmp dir");

    // Taking the address of each function makes the linker resolve every declaration.
    let mut src = String::from("#include \"care.h\"\n#include <stdio.h>\n");
    src.push_str("_Static_assert(CARE_OK == 0, \"CARE_OK is 0\");\n");
    // The C compiler must lay every struct out as Rust does (size and alignment).
    for (name, size, align) in struct_layouts() {
        src.push_str(&format!(
            "_Static_assert(sizeof(struct {name}) == {size} && _Alignof(struct {name}) == {align}, \"{name} layout\");\n"
        ));
    }
    src.push_str("int main(void) {\n  const void *fns[] = {\n");
    for f in &declared {
        src.push_str(&format!("    (const void *)(size_t)&{f},\n"));
    }
    src.push_str("  };\n  size_t n = 0;\n  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) n += fns[i] != NULL;\n");
    src.push_str("  printf(\"%zu\\n\", n);\n");
    src.push_str("  return care_abi_version() == CARE_ABI_VERSION ? 0 : 1;\n}\n");
    let c = dir.join("all_functions.c");
    std::fs::write(&c, &src).expect("write C file");
    let cpp = dir.join("header.cpp");
    std::fs::write(
        &cpp,
        "#include \"care.h\"\nstatic_assert(CARE_OK == 0, \"ok is 0\");\nint main() { return care_abi_version() == CARE_ABI_VERSION ? 0 : 1; }\n",
    )
    .expect("write C++ file");

    let include = repo_root().join("include");
    let warn = ["-Wall", "-Wextra", "-Wpedantic", "-Werror"];
    let lib = common::libcare_dir();
    let exe_c = dir.join("all_functions");
    run(Command::new(tool("CC", "cc"))
        .arg("-std=c11")
        .args(warn)
        .arg("-I")
        .arg(&include)
        .arg(&c)
        .arg(lib.join("libcare.a"))
        .args(["-lpthread", "-ldl", "-lm"])
        .arg("-o")
        .arg(&exe_c));
    let out = Command::new(&exe_c).output().expect("run C program");
    assert!(out.status.success(), "ABI version check failed in C");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        declared.len().to_string(),
        "every declared function has an address"
    );

    run(Command::new(tool("CXX", "c++"))
        .arg("-std=c++17")
        .args(warn)
        .arg("-I")
        .arg(&include)
        .arg(&cpp)
        .arg("-fsyntax-only"));
}

#[test]
fn header_version_macros_match_the_crate() {
    let header = common::header();
    let get = |name: &str| -> Option<String> {
        header.lines().find_map(|l| {
            l.strip_prefix("#define ")?
                .strip_prefix(name)?
                .strip_prefix(' ')
                .map(|v| v.trim().to_string())
        })
    };
    let v = format!(
        "{}.{}.{}",
        get("CARE_VERSION_MAJOR").unwrap_or_default(),
        get("CARE_VERSION_MINOR").unwrap_or_default(),
        get("CARE_VERSION_PATCH").unwrap_or_default()
    );
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        get("CARE_ABI_VERSION"),
        Some(care_ffi::version::CARE_ABI_VERSION.to_string())
    );
}

#[test]
fn header_result_codes_match_the_rust_enum() {
    let header = common::header();
    for r in care_ffi::care_result::ALL {
        let want = format!("  {r:?} = {},", r as u32);
        assert!(header.contains(&want), "care.h lacks `{}`", want.trim());
    }
}

/// The enums of the policy-loss family, the rollout correction and the advantage estimators are
/// in `care.h` with the numbers the library decodes, and each C number is the core enum's own
/// number (the library decodes a C value by its index in the core's `ALL` table).
#[test]
fn header_has_the_option_enums_with_the_core_numbers() {
    use care_core::grpo::{
        Aggregation, Baseline, Bypass, IsLevel, MaskedToken, PolicyLoss, RatioLevel, Rejection,
        RejectionMode, Reweight, SequenceCount,
    };
    use care_ffi::advantage::*;
    use care_ffi::gae::*;
    use care_ffi::loss::*;
    macro_rules! pairs {
        ($($c:ident::$v:ident => $core:expr),* $(,)?) => {
            vec![$((stringify!($v), $c::$v as u32, $core as u32)),*]
        };
    }
    let pairs = pairs![
        care_reweight::CARE_REWEIGHT_NONE => Reweight::None,
        care_reweight::CARE_REWEIGHT_GPG => Reweight::Gpg,
        care_reweight::CARE_REWEIGHT_NONZERO => Reweight::Nonzero,
        care_bypass::CARE_BYPASS_OFF => Bypass::Off,
        care_bypass::CARE_BYPASS_ON => Bypass::On,
        care_masked_token::CARE_MASKED_TOKEN_SKIP => MaskedToken::Skip,
        care_masked_token::CARE_MASKED_TOKEN_RESET => MaskedToken::Reset,
        care_baseline::CARE_BASELINE_LENGTH_WEIGHTED => Baseline::LengthWeighted,
        care_baseline::CARE_BASELINE_EXTERNAL => Baseline::External,
        care_baseline::CARE_BASELINE_PASS_K => Baseline::PassK,
        care_aggregation::CARE_AGGREGATION_TOKEN_SUM_NORM => Aggregation::TokenSumNorm,
        care_ratio_level::CARE_RATIO_SEQUENCE_TOKEN => RatioLevel::SequenceToken,
        care_policy_loss_kind::CARE_POLICY_LOSS_CLIP => PolicyLoss::Clip,
        care_policy_loss_kind::CARE_POLICY_LOSS_CISPO => PolicyLoss::Cispo,
        care_policy_loss_kind::CARE_POLICY_LOSS_SAPO => PolicyLoss::Sapo,
        care_policy_loss_kind::CARE_POLICY_LOSS_GPG => PolicyLoss::Gpg,
        care_policy_loss_kind::CARE_POLICY_LOSS_CLIP_COV => PolicyLoss::ClipCov,
        care_policy_loss_kind::CARE_POLICY_LOSS_KL_COV => PolicyLoss::KlCov,
        care_policy_loss_kind::CARE_POLICY_LOSS_GMPO => PolicyLoss::Gmpo,
        care_policy_loss_kind::CARE_POLICY_LOSS_VESPO => PolicyLoss::Vespo,
        care_sequence_count::CARE_SEQUENCE_COUNT_NON_EMPTY => SequenceCount::NonEmpty,
        care_sequence_count::CARE_SEQUENCE_COUNT_ALL => SequenceCount::All,
        care_is_level::CARE_IS_OFF => IsLevel::Off,
        care_is_level::CARE_IS_TOKEN => IsLevel::Token,
        care_is_level::CARE_IS_SEQUENCE => IsLevel::Sequence,
        care_rejection_mode::CARE_REJECTION_DROP => RejectionMode::Drop,
        care_rejection_mode::CARE_REJECTION_ZERO_WEIGHT => RejectionMode::ZeroWeight,
        care_rejection::CARE_REJECT_TOKEN_K1 => Rejection::TokenK1,
        care_rejection::CARE_REJECT_TOKEN_K2 => Rejection::TokenK2,
        care_rejection::CARE_REJECT_TOKEN_K3 => Rejection::TokenK3,
        care_rejection::CARE_REJECT_SEQ_SUM_K1 => Rejection::SeqSumK1,
        care_rejection::CARE_REJECT_SEQ_SUM_K2 => Rejection::SeqSumK2,
        care_rejection::CARE_REJECT_SEQ_SUM_K3 => Rejection::SeqSumK3,
        care_rejection::CARE_REJECT_SEQ_MEAN_K1 => Rejection::SeqMeanK1,
        care_rejection::CARE_REJECT_SEQ_MEAN_K2 => Rejection::SeqMeanK2,
        care_rejection::CARE_REJECT_SEQ_MEAN_K3 => Rejection::SeqMeanK3,
        care_rejection::CARE_REJECT_SEQ_MAX_K2 => Rejection::SeqMaxK2,
        care_rejection::CARE_REJECT_SEQ_MAX_K3 => Rejection::SeqMaxK3,
    ];
    let header = common::header();
    for (name, c, core) in pairs {
        assert_eq!(c, core, "{name}: the C number is not the core's");
        let want = format!("  {name} = {c},");
        assert!(header.contains(&want), "care.h lacks `{}`", want.trim());
    }
    // Every table the decoder indexes has exactly the C enum's values.
    assert_eq!(PolicyLoss::ALL.len(), 8);
    assert_eq!(Rejection::ALL.len(), CARE_REJECTION_COUNT);
    assert_eq!(IsLevel::ALL.len(), 3);
    assert_eq!(Reweight::ALL.len(), 3);
    assert_eq!(Bypass::ALL.len(), 2);
    assert_eq!(MaskedToken::ALL.len(), 2);
    assert!(header.contains(&format!(
        "#define CARE_REJECTION_COUNT {CARE_REJECTION_COUNT}"
    )));
}

/// `(C name, size, alignment)` of every `#[repr(C)]` struct of the API, as Rust lays them out.
fn struct_layouts() -> Vec<(&'static str, usize, usize)> {
    use care_ffi::advantage::*;
    use care_ffi::gpu::*;
    use care_ffi::logsoftmax::*;
    use care_ffi::loss::*;
    use care_ffi::profile::*;
    use care_ffi::reward::*;
    use care_ffi::rubric::*;
    use std::mem::{align_of, size_of};
    macro_rules! layouts {
        ($($t:ident),* $(,)?) => { vec![$((stringify!($t), size_of::<$t>(), align_of::<$t>())),*] };
    }
    layouts![
        care_rewards,
        care_group_layout,
        care_advantage_outputs,
        care_advantage_options,
        care_group_stats,
        care_group_sums,
        care_loss_inputs,
        care_loss_options,
        care_loss_stats,
        care_reject_bound,
        care_rollout_options,
        care_rollout_stats,
        care_logits,
        care_log_softmax_outputs,
        care_log_softmax_grads,
        care_logits_loss_outputs,
        care_gpu_launch,
        care_gpu_loss_outputs,
        care_score_options,
        care_preference_options,
        care_generator_options,
        care_preference_pair,
        care_generator_inputs,
        care_judge_prompt_inputs,
        care_fired,
        care_reward_detail,
        care_group_report,
        care_strategy_counts,
        care_generator_result,
        care_judge_report,
        care_format_policy,
        care_violation,
        care_profile_violation,
        care_profile_info,
        care_span,
        care_output_violation,
        care_output_check,
        care_profile_response,
        care_profile_group,
        care_profile_reward_result,
        care_profile_group_outputs,
        care_profile_group_report,
    ]
}
