//! `care_last_error_detail`: the sentence behind a failed call's code names the argument, its
//! size and what to fix; a success clears it; calls that return no code leave it; it is per
//! thread; a buffer too small reports the size and keeps the text. (`abi_args.rs` checks, for
//! every entry point and every fault row, that a detail exists and that a length, layout,
//! struct-size or flag fault gets a sentence of its own.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::ptr::{null, null_mut};

use care_ffi::advantage::*;
use care_ffi::care_result;
use care_ffi::care_result::*;
use care_ffi::detail::care_last_error_detail;
use care_ffi::loss::*;
use care_ffi::result::care_result_message;
use care_ffi::rubric::*;
use care_ffi::version::care_version;

mod common;
use common::last_error_detail as detail;

/// The default loss options, to change one field of.
fn default_loss_options() -> care_loss_options {
    let mut o = std::mem::MaybeUninit::<care_loss_options>::uninit();
    assert_eq!(
        unsafe { care_loss_options_default(o.as_mut_ptr()) },
        CARE_OK
    );
    unsafe { o.assume_init() }
}

fn sz<T>() -> u32 {
    size_of::<T>() as u32
}

/// `rewards` grouped by `group_size` (or `offsets`) into `out`.
fn advantages(
    rewards: &[f32],
    group_size: u32,
    offsets: Option<&[u32]>,
    out: &mut [f32],
) -> care_result {
    let rw = care_rewards {
        struct_size: sz::<care_rewards>(),
        rewards: rewards.as_ptr(),
        rewards_len: rewards.len(),
        valid: null(),
        valid_len: 0,
        lengths: null(),
        lengths_len: 0,
        baselines: null(),
        baselines_len: 0,
    };
    let layout = care_group_layout {
        struct_size: sz::<care_group_layout>(),
        group_size,
        offsets: offsets.map_or(null(), <[u32]>::as_ptr),
        offsets_len: offsets.map_or(0, <[u32]>::len),
    };
    let outs = care_advantage_outputs {
        struct_size: sz::<care_advantage_outputs>(),
        advantages: out.as_mut_ptr(),
        advantages_len: out.len(),
        stats: null_mut(),
        stats_len: 0,
    };
    unsafe { care_group_advantages(&rw, &layout, null(), &outs) }
}

struct Loss {
    logp: Vec<f32>,
    old: Vec<f32>,
    offsets: Vec<u32>,
    mask: Vec<u8>,
    adv: Vec<f32>,
    grad: Vec<f32>,
}

impl Loss {
    /// Two sequences of 2 and 3 tokens.
    fn new() -> Loss {
        Loss {
            logp: vec![-1.0; 5],
            old: vec![-1.1; 5],
            offsets: vec![0, 2, 5],
            mask: vec![1; 5],
            adv: vec![1.0, -1.0],
            grad: vec![0.0; 5],
        }
    }

    fn inputs(&self) -> care_loss_inputs {
        care_loss_inputs {
            struct_size: sz::<care_loss_inputs>(),
            dtype: care_dtype::CARE_DTYPE_F32 as u32,
            logp: self.logp.as_ptr().cast(),
            logp_len: self.logp.len(),
            logp_old: self.old.as_ptr().cast(),
            logp_old_len: self.old.len(),
            logp_ref: null(),
            logp_ref_len: 0,
            seq_offsets: self.offsets.as_ptr(),
            seq_offsets_len: self.offsets.len(),
            mask: self.mask.as_ptr(),
            mask_len: self.mask.len(),
            advantages: self.adv.as_ptr(),
            advantages_len: self.adv.len(),
            advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
            max_seq_len: 0,
            logp_rollout: null(),
            logp_rollout_len: 0,
        }
    }

    fn run(&mut self, inputs: &care_loss_inputs, options: *const care_loss_options) -> care_result {
        let mut loss = 0.0;
        let (g, n) = (self.grad.as_mut_ptr(), self.grad.len());
        unsafe { care_policy_loss(inputs, options, g, n, &mut loss, null_mut()) }
    }
}

#[test]
fn a_group_size_that_does_not_divide_the_rewards_names_both_sizes() {
    let mut out = [0.0f32; 2];
    assert_eq!(
        advantages(&[1.0, 0.0], 3, None, &mut out),
        CARE_ERR_INVALID_LAYOUT
    );
    assert_eq!(
        detail(),
        "care_rewards.rewards has 2 values, not a multiple of care_group_layout.group_size 3"
    );
}

#[test]
fn offsets_that_do_not_end_at_the_reward_count_say_where_they_end() {
    let mut out = [0.0f32; 3];
    let r = advantages(&[1.0, 0.0, 1.0], 0, Some(&[0, 2]), &mut out);
    assert_eq!(r, CARE_ERR_INVALID_LAYOUT);
    assert_eq!(
        detail(),
        "care_group_layout.offsets ends at 2 but care_rewards.rewards has 3 values; the last \
         offset must equal the length"
    );
}

#[test]
fn an_output_of_the_wrong_length_is_named_with_both_sizes() {
    let mut out = [0.0f32; 3];
    assert_eq!(
        advantages(&[1.0, 0.0], 2, None, &mut out),
        CARE_ERR_LENGTH_MISMATCH
    );
    assert_eq!(
        detail(),
        "care_advantage_outputs.advantages_len is 3 but rewards_len is 2; they must be equal"
    );
}

#[test]
fn a_short_per_token_array_of_the_loss_is_named_against_logp_len() {
    let mut l = Loss::new();
    l.mask.pop();
    let inputs = l.inputs();
    assert_eq!(l.run(&inputs, null()), CARE_ERR_LENGTH_MISMATCH);
    assert_eq!(
        detail(),
        "care_loss_inputs.mask_len is 4 but care_loss_inputs.logp_len is 5; every per-token \
         array has one entry per token"
    );
    let mut l = Loss::new();
    l.old.pop();
    let inputs = l.inputs();
    assert_eq!(l.run(&inputs, null()), CARE_ERR_LENGTH_MISMATCH);
    assert!(
        detail().starts_with("care_loss_inputs.logp_old_len is 4 but"),
        "{}",
        detail()
    );
}

#[test]
fn per_sequence_advantages_are_counted_against_the_sequences() {
    let mut l = Loss::new();
    l.adv.push(0.5);
    let inputs = l.inputs();
    assert_eq!(l.run(&inputs, null()), CARE_ERR_LENGTH_MISMATCH);
    assert_eq!(
        detail(),
        "care_loss_inputs.advantages_len is 3 but there are 2 sequences (seq_offsets_len - 1); \
         per-sequence advantages have one entry per sequence"
    );
}

#[test]
fn decreasing_sequence_offsets_name_the_entry() {
    let mut l = Loss::new();
    l.offsets = vec![0, 3, 2, 5];
    l.adv = vec![1.0, 0.0, -1.0];
    let inputs = l.inputs();
    assert_eq!(l.run(&inputs, null()), CARE_ERR_INVALID_LAYOUT);
    assert_eq!(
        detail(),
        "care_loss_inputs.seq_offsets[2] is smaller than care_loss_inputs.seq_offsets[1]; the \
         offsets must not decrease"
    );
}

#[test]
fn an_option_outside_its_domain_is_named_with_its_domain() {
    let mut l = Loss::new();
    let mut o = default_loss_options();
    o.eps_low = -0.1;
    let inputs = l.inputs();
    assert_eq!(l.run(&inputs, &o), CARE_ERR_INVALID_ARGUMENT);
    assert_eq!(
        detail(),
        "care_loss_options.eps_low must be finite and >= 0"
    );
}

#[test]
fn an_unknown_enum_value_lists_the_valid_ones_by_name() {
    let mut l = Loss::new();
    let mut o = default_loss_options();
    o.kl_estimator = 99;
    let inputs = l.inputs();
    assert_eq!(l.run(&inputs, &o), CARE_ERR_INVALID_ARGUMENT);
    let d = detail();
    assert!(
        d.starts_with("care_loss_options.kl_estimator is 99; valid values: 0 ("),
        "{d}"
    );
    assert!(d.contains("k3"), "{d}");
}

#[test]
fn a_struct_size_from_an_older_header_says_both_sizes_and_the_fix() {
    let mut l = Loss::new();
    let mut inputs = l.inputs();
    inputs.struct_size = 16;
    assert_eq!(l.run(&inputs, null()), CARE_ERR_STRUCT_SIZE);
    let d = detail();
    let want = format!(
        "care_loss_inputs.struct_size is 16 but this library's care_loss_inputs has {} bytes",
        size_of::<care_loss_inputs>()
    );
    assert!(d.starts_with(&want), "{d}");
    assert!(d.contains("sizeof(care_loss_inputs)"), "{d}");
}

#[test]
fn a_flag_that_is_neither_0_nor_1_is_named_with_its_value() {
    let mut p = std::mem::MaybeUninit::<care_format_policy>::uninit();
    assert_eq!(
        unsafe { care_format_policy_default(p.as_mut_ptr()) },
        CARE_OK
    );
    let mut p = unsafe { p.assume_init() };
    p.allow_think = 7;
    let text = b"{}";
    let mut rubric: *const care_rubric = null();
    let r = unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), &p, &mut rubric) };
    assert_eq!(r, CARE_ERR_INVALID_BOOL);
    assert_eq!(
        detail(),
        "care_format_policy.allow_think is 7; a flag must be 0 or 1"
    );
}

#[test]
fn a_freed_handle_is_named_as_not_live() {
    let text = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/data/rubric_sft_1.json"),
    )
    .unwrap();
    let mut rubric: *const care_rubric = null();
    let r = unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut rubric) };
    assert_eq!(r, CARE_OK);
    assert_eq!(unsafe { care_rubric_free(rubric) }, CARE_OK);
    let mut w = [0.0f64; 3];
    assert_eq!(
        unsafe { care_rubric_weights(rubric, w.as_mut_ptr(), 3) },
        CARE_ERR_INVALID_HANDLE
    );
    let d = detail();
    assert!(d.contains("is not a live care_rubric handle"), "{d}");
}

#[test]
fn a_success_clears_the_detail_and_calls_without_a_code_keep_it() {
    let mut out = [0.0f32; 2];
    assert_eq!(
        advantages(&[1.0, 0.0], 3, None, &mut out),
        CARE_ERR_INVALID_LAYOUT
    );
    let kept = detail();
    // Reading the message or the version is not a call that returns a code.
    let _ = care_result_message(CARE_ERR_INVALID_LAYOUT as u32);
    let _ = care_version();
    assert_eq!(detail(), kept);
    assert_eq!(advantages(&[1.0, 0.0], 2, None, &mut out), CARE_OK);
    assert_eq!(detail(), "");
}

#[test]
fn a_failure_no_check_described_reads_as_its_code_message() {
    // A NULL required output parameter: the code says all there is.
    let r = unsafe { care_loss_options_default(null_mut()) };
    assert_eq!(r, CARE_ERR_NULL_POINTER);
    let msg = unsafe { std::ffi::CStr::from_ptr(care_result_message(r as u32)) };
    assert_eq!(detail(), msg.to_str().unwrap());
}

#[test]
fn a_buffer_too_small_reports_the_size_and_keeps_the_detail() {
    let mut out = [0.0f32; 2];
    assert_eq!(
        advantages(&[1.0, 0.0], 3, None, &mut out),
        CARE_ERR_INVALID_LAYOUT
    );
    let full = detail();
    let mut n = 0usize;
    let r = unsafe { care_last_error_detail(null_mut(), 0, &mut n) };
    assert_eq!(r, CARE_ERR_BUFFER_TOO_SMALL);
    assert_eq!(n, full.len());
    let mut small = [0u8; 4];
    let r = unsafe { care_last_error_detail(small.as_mut_ptr().cast(), 4, &mut n) };
    assert_eq!(r, CARE_ERR_BUFFER_TOO_SMALL);
    assert_eq!(small, [0u8; 4], "nothing copied into a buffer too small");
    assert_eq!(detail(), full);
}

#[test]
fn each_thread_reads_its_own_last_call() {
    let mut out = [0.0f32; 2];
    assert_eq!(
        advantages(&[1.0, 0.0], 3, None, &mut out),
        CARE_ERR_INVALID_LAYOUT
    );
    let here = detail();
    let there = std::thread::spawn(|| {
        let mut out = [0.0f32; 2];
        assert_eq!(advantages(&[1.0, 0.0], 2, None, &mut out), CARE_OK);
        detail()
    })
    .join()
    .unwrap();
    assert_eq!(there, "");
    assert_eq!(detail(), here);
}

/// Clip-Cov and KL-Cov need room for their covariance selection: a fixed part and 8 bytes per
/// token on top of `CARE_GPU_WORKSPACE_BYTES`; every other loss needs only that.
#[test]
fn the_covariance_losses_ask_for_a_workspace_that_grows_with_the_tokens() {
    use care_ffi::gpu::{CARE_GPU_WORKSPACE_BYTES, care_gpu_policy_loss_workspace_bytes};
    let bytes = |o: &care_loss_options, n: usize| {
        let mut b = 0usize;
        assert_eq!(
            unsafe { care_gpu_policy_loss_workspace_bytes(o, n, &raw mut b) },
            CARE_OK
        );
        b
    };
    let mut o = default_loss_options();
    assert_eq!(bytes(&o, 0), CARE_GPU_WORKSPACE_BYTES);
    assert_eq!(bytes(&o, 100_000), CARE_GPU_WORKSPACE_BYTES);
    for p in [
        care_policy_loss_kind::CARE_POLICY_LOSS_CLIP_COV,
        care_policy_loss_kind::CARE_POLICY_LOSS_KL_COV,
    ] {
        o.policy_loss = p as u32;
        let fixed = bytes(&o, 0);
        assert!(
            fixed > CARE_GPU_WORKSPACE_BYTES && fixed % 16 == 0,
            "{fixed}"
        );
        assert_eq!(bytes(&o, 1000) - fixed, 8000);
        let mut b = 7usize;
        assert_eq!(
            unsafe { care_gpu_policy_loss_workspace_bytes(&o, usize::MAX, &raw mut b) },
            CARE_ERR_INVALID_ARGUMENT
        );
        assert_eq!(b, 7, "nothing is written on failure");
        assert!(detail().contains("32 bits"), "{}", detail());
    }
}

/// The paper's rubric `rubric_sft_1` (3 + 2 + 3 = 8 criteria).
fn paper_rubric() -> *const care_rubric {
    let text = common::fixture("rubric_sft_1.json");
    let mut rubric: *const care_rubric = null();
    let r = unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut rubric) };
    assert_eq!(r, CARE_OK);
    rubric
}

#[test]
fn scores_that_do_not_fit_the_rubric_name_both_sizes() {
    let rubric = paper_rubric();
    let scores = [5.0f64; 6];
    let mut reward = -1.0;
    let r = unsafe {
        care_ffi::reward::care_policy_reward(
            rubric,
            scores.as_ptr(),
            6,
            null(),
            &mut reward,
            null_mut(),
        )
    };
    assert_eq!(r, CARE_ERR_SCORE_SHAPE);
    assert_eq!(reward, -1.0, "the output is untouched");
    let d = detail();
    assert!(
        d.contains(
            "scores_len is 6 but the rubric has 8 criteria (3 Cognitive, 2 Affective, 3 Proactive)"
        ),
        "{d}"
    );
    unsafe { care_rubric_free(rubric) };
}

#[test]
fn a_missing_or_out_of_range_score_is_named_by_its_index_and_policy() {
    let rubric = paper_rubric();
    let mut reward = -1.0;
    let mut scores = [5.0f64; 8];
    scores[3] = f64::NAN;
    let r = unsafe {
        care_ffi::reward::care_policy_reward(
            rubric,
            scores.as_ptr(),
            8,
            null(),
            &mut reward,
            null_mut(),
        )
    };
    assert_eq!(r, CARE_ERR_MISSING_SCORE);
    let d = detail();
    assert!(
        d.contains("scores[3] is NaN") && d.contains("CARE_MISSING_SKIP"),
        "{d}"
    );
    // The preference pair names the array at fault: here the rejected one.
    let chosen = [5.0f64; 8];
    let mut rejected = [4.0f64; 8];
    rejected[6] = 7.0;
    let pair = care_ffi::reward::care_preference_pair {
        struct_size: sz::<care_ffi::reward::care_preference_pair>(),
        chosen: chosen.as_ptr(),
        chosen_len: 8,
        rejected: rejected.as_ptr(),
        rejected_len: 8,
    };
    let r = unsafe {
        care_ffi::reward::care_preference_reward(
            rubric,
            &pair,
            null(),
            null(),
            &mut reward,
            null_mut(),
        )
    };
    assert_eq!(r, CARE_ERR_SCORE_OUT_OF_RANGE);
    let d = detail();
    assert!(
        d.contains("care_preference_pair.rejected[6] is 7, not an integer in 0..=5")
            && d.contains("CARE_RANGE_CLAMP"),
        "{d}"
    );
    unsafe { care_rubric_free(rubric) };
}

#[test]
fn a_rubric_that_fails_to_parse_names_what_is_missing() {
    let mut rubric: *const care_rubric = null();
    let r = unsafe { care_rubric_parse(c"{}".as_ptr(), 2, null(), &mut rubric) };
    assert_ne!(r, CARE_OK);
    assert!(rubric.is_null());
    let d = detail();
    assert!(d.contains("categories"), "the missing key is named: {d}");
    assert!(
        d.starts_with("the rubric breaks the format contract (1 violation"),
        "{d}"
    );
    // A broken weight: the validator's own sentence.
    let text = String::from_utf8(common::fixture("rubric_sft_1.json"))
        .unwrap()
        .replacen("\"category_weight\": 0.4", "\"category_weight\": 0.5", 1);
    let r = unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut rubric) };
    assert_eq!(r, CARE_ERR_FORMAT_VIOLATION);
    let d = detail();
    assert!(d.contains("weight_sum"), "{d}");
}

#[test]
fn a_judge_answer_without_json_says_what_was_expected() {
    let rubric = paper_rubric();
    let text = "I would rate this response highly.";
    let mut scores = [0.0f64; 8];
    let r = unsafe {
        care_ffi::reward::care_judge_output_parse(
            rubric,
            text.as_ptr().cast(),
            text.len(),
            scores.as_mut_ptr(),
            8,
            null_mut(),
        )
    };
    assert_eq!(r, CARE_ERR_NO_JUDGE_JSON);
    let d = detail();
    assert!(
        d.contains("criterion_scores") && d.contains("34 bytes"),
        "{d}"
    );
    let r = unsafe {
        care_ffi::reward::care_judge_output_parse(
            rubric,
            text.as_ptr().cast(),
            text.len(),
            scores.as_mut_ptr(),
            7,
            null_mut(),
        )
    };
    assert_eq!(r, CARE_ERR_SCORE_SHAPE);
    let d = detail();
    assert!(
        d.contains("scores_len is 7 but the rubric has 8 criteria"),
        "{d}"
    );
    unsafe { care_rubric_free(rubric) };
}

#[test]
fn an_invalid_profile_names_its_violations() {
    let text = "{\"name\": \"x\"}";
    let mut p: *const care_ffi::profile::care_profile = null();
    let r =
        unsafe { care_ffi::profile::care_profile_parse(text.as_ptr().cast(), text.len(), &mut p) };
    assert_eq!(r, CARE_ERR_INVALID_PROFILE);
    let d = detail();
    assert!(d.starts_with("the profile is invalid ("), "{d}");
    assert!(d.contains("dimensions"), "the missing member is named: {d}");
}
