//! Argument checks of every exported function, as tables. Per entry point: a valid call (which
//! must write its outputs), then each required pointer parameter set to NULL in turn, then one
//! row per fault inside the inputs (a NULL pointer in an input struct, a length mismatch, a
//! `struct_size` too small, a boolean that is not 0 or 1, an unknown enum value, a value
//! outside its domain), each asserting the documented code and that no output changed (the one
//! exception, `CARE_ERR_BUFFER_TOO_SMALL`, reports the size it needs). Every row starts from a
//! fresh fixture, so each row holds exactly one fault. The test ends by checking that every
//! function `care.h` declares was called.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void};

use std::ptr::{null, null_mut};

use care_ffi::advantage::*;
use care_ffi::detail::care_last_error_detail;
use care_ffi::gae::*;
use care_ffi::gpu::*;
use care_ffi::logsoftmax::*;
use care_ffi::loss::*;
use care_ffi::profile::*;
use care_ffi::reward::*;
use care_ffi::rubric::*;
use care_ffi::version::*;
use care_ffi::{care_result, result::care_result_message};

use care_result::*;

/// A value whose every byte is 0xA5: what output buffers hold before a call, so that any write
/// shows. Only used for plain-number C structs (every bit pattern is a valid value).
fn junk<T: Copy>() -> T {
    let mut v = std::mem::MaybeUninit::<T>::uninit();
    // SAFETY: every byte is written, and `T` is a plain-number C struct.
    unsafe {
        std::ptr::write_bytes(v.as_mut_ptr(), 0xA5, 1);
        v.assume_init()
    }
}

/// `size_of::<T>()` as the `struct_size` field holds it.
fn sz<T>() -> u32 {
    size_of::<T>() as u32
}

/// `v`, or NULL when `k` selects parameter `i`.
fn p<T>(k: Option<usize>, i: usize, v: *const T) -> *const T {
    if k == Some(i) { null() } else { v }
}

fn m<T>(k: Option<usize>, i: usize, v: *mut T) -> *mut T {
    if k == Some(i) { null_mut() } else { v }
}

/// The buffer's address, or NULL for an empty buffer (rows set a NULL buffer by emptying it).
fn or_null<T>(v: &mut [T]) -> *mut T {
    if v.is_empty() {
        null_mut()
    } else {
        v.as_mut_ptr()
    }
}

/// A fake, aligned device address: GPU functions must reject arguments before touching it.
fn fake<T>() -> *mut T {
    0x1000 as *mut T
}

const T_TOK: usize = 5; // tokens of the loss fixture
const TOTAL: usize = 8; // criteria of rubric_sft_1 (3 + 2 + 3)
const KARDIA: usize = 5; // criteria of the kardia profile

/// A well-formed kardia output and a malformed one (no emotion span).
const KARDIA_OK: &[u8] =
    b"<|understanding_begin|>u<|understanding_end|><|reasoning_begin|>r<|reasoning_end|>\
<|emotion_begin|>Sad.<|emotion_end|><|response_begin|>I hear you.<|response_end|>";
const KARDIA_BAD: &[u8] = b"<|understanding_begin|>u<|understanding_end|> I hear you.";
/// A judge answer for kardia.
const KARDIA_JUDGE: &[u8] = br#"{"criterion_scores":[
  {"category":"relevance","criterion_title":"Relevance to the user's message","score":4},
  {"category":"empathy","criterion_title":"Empathy toward the user's feelings","score":5}]}"#;

/// Every input and output of every entry point, valid as built. Input structs point into the
/// fixture's own vectors (heap buffers, which stay put when the fixture moves).
struct Fx {
    // ---- handles the calls read
    rubric: *const care_rubric,
    report: *mut care_validation_report,
    report_count: usize,
    profile: *const care_profile,
    care_profile: *const care_profile,
    preport: *mut care_profile_report,
    preport_count: usize,
    // ---- inputs
    text: Vec<u8>,
    name: Vec<u8>,
    loss_name: Vec<u8>,
    preset: u32,
    rewards: Vec<f32>,
    valid: Vec<u8>,
    group_offsets: Vec<u32>,
    rw: care_rewards,
    layout: care_group_layout,
    ao: care_advantage_options,
    sums_in: Vec<care_group_sums>,
    m2_in: Vec<f64>,
    seq_adv: Vec<f32>,
    seq: Vec<u32>,
    tok_mask: Vec<u8>,
    tr_rewards: Vec<f32>,
    tr_values: Vec<f32>,
    tr: care_token_rewards,
    tr_ret: care_token_rewards,
    gae_o: care_gae_options,
    wo: care_whiten_options,
    logp: Vec<f32>,
    logp_old: Vec<f32>,
    li: care_loss_inputs,
    lo: care_loss_options,
    stats_in: care_loss_stats,
    stats_other: care_loss_stats,
    policy: care_format_policy,
    crit_dim: u32,
    crit_index: usize,
    viol_index: usize,
    scores: Vec<f64>,
    rejected: Vec<f64>,
    so: care_score_options,
    po: care_preference_options,
    go: care_generator_options,
    pair: care_preference_pair,
    labels: Vec<*const c_char>,
    label_lens: Vec<usize>,
    label_policy: u32,
    weights: Vec<f64>,
    counts_in: Vec<u32>,
    gi: care_generator_inputs,
    ctx: Vec<*const c_char>,
    ctx_lens: Vec<usize>,
    ji: care_judge_prompt_inputs,
    judge: Vec<u8>,
    profile_name: Vec<u8>,
    profile_text: Vec<u8>,
    p_index: usize,
    p_output: Vec<u8>,
    p_scores: Vec<f64>,
    gold: Vec<u8>,
    p_resp: care_profile_response,
    p_outputs: Vec<*const c_char>,
    p_output_lens: Vec<usize>,
    p_group_scores: Vec<f64>,
    p_group: care_profile_group,
    p_judge: Vec<u8>,
    logits: Vec<f32>,
    targets: Vec<i32>,
    row_mask: Vec<u8>,
    lg: care_logits,
    dlogp_in: Vec<f32>,
    grads: care_log_softmax_grads,
    lseq: Vec<u32>,
    lold: Vec<f32>,
    ladv: Vec<f32>,
    lli: care_loss_inputs,
    // ---- GPU inputs: fake device addresses (every fault is found before a driver call)
    launch: care_gpu_launch,
    d_rw: care_rewards,
    d_layout: care_group_layout,
    d_ado: care_advantage_outputs,
    d_batch_std: *const f32,
    d_li: care_loss_inputs,
    d_grad_len: usize,
    grad_dtype: u32,
    d_stats_len: usize,
    d_rstats_len: usize,
    d_glo: care_gpu_loss_outputs,
    d_lg: care_logits,
    d_lsm_out: care_log_softmax_outputs,
    d_grads: care_log_softmax_grads,
    d_dlogits_len: usize,
    d_dlogits_stride: usize,
    d_lli: care_loss_inputs,
    d_llo: care_logits_loss_outputs,
    d_flo: care_gpu_fused_loss_outputs,
    // ---- outputs
    fused_ok: u32,
    adv: Vec<f32>,
    group_stats: Vec<care_group_stats>,
    ado: care_advantage_outputs,
    ao_out: care_advantage_options,
    sums_out: Vec<care_group_sums>,
    m2_out: Vec<f64>,
    tokens: Vec<f32>,
    grad: Vec<f32>,
    logp_rollout: Vec<f32>,
    weights_out: Vec<f32>,
    keep_out: Vec<u8>,
    gae_adv: Vec<f32>,
    gae_ret: Vec<f32>,
    wh_values: Vec<f32>,
    wh_mean: f64,
    wh_std: f64,
    gae_o_out: care_gae_options,
    wo_out: care_whiten_options,
    ws_n: usize,
    ws_bytes: usize,
    rollout_stats: care_rollout_stats,
    loss: f64,
    stats: care_loss_stats,
    lo_out: care_loss_options,
    so_out: care_score_options,
    po_out: care_preference_options,
    go_out: care_generator_options,
    policy_out: care_format_policy,
    rubric_out: *const care_rubric,
    report_out: *mut care_validation_report,
    w_out: Vec<f64>,
    counts_out: Vec<usize>,
    total_out: usize,
    title: *const c_char,
    title_len: usize,
    desc: *const c_char,
    desc_len: usize,
    count_out: usize,
    summary: (f64, u32, u32),
    violation: care_violation,
    buf: Vec<u8>,
    buf_len: usize,
    len_out: usize,
    reward: f64,
    detail: care_reward_detail,
    group_rewards: Vec<f64>,
    group_report: care_group_report,
    strategy: care_strategy_counts,
    generated: care_generator_result,
    judge_scores: Vec<f64>,
    judge_report: care_judge_report,
    lsm_logp: Vec<f32>,
    lsm_entropy: Vec<f32>,
    lsm_lse: Vec<f32>,
    lsm_out: care_log_softmax_outputs,
    dlogits: Vec<f32>,
    ll_logp: Vec<f32>,
    ll_lse: Vec<f32>,
    ll_dlogp: Vec<f32>,
    llo: care_logits_loss_outputs,
    profile_out: *const care_profile,
    preport_out: *mut care_profile_report,
    p_name: *const c_char,
    p_name_len: usize,
    p_info: care_profile_info,
    p_weight: f64,
    p_criteria: usize,
    p_check: care_output_check,
    p_result: care_profile_reward_result,
    p_rewards: Vec<f64>,
    p_details: Vec<care_profile_reward_result>,
    p_gout: care_profile_group_outputs,
    p_greport: care_profile_group_report,
    p_judge_scores: Vec<f64>,
    p_violation: care_profile_violation,
    p_overflowed: u32,
}

impl Fx {
    fn new() -> Fx {
        let text = common::fixture("rubric_sft_1.json");
        let mut rubric = null();
        let mut report = null_mut();
        let broken = br#"{"categories":[{"category":"Cognitive Empathy"}]}"#;
        let mut report_count = 0;
        // SAFETY: valid pointers and lengths.
        unsafe {
            assert_eq!(
                care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut rubric),
                CARE_OK
            );
            assert_eq!(
                care_rubric_validate(broken.as_ptr().cast(), broken.len(), null(), &mut report),
                CARE_OK
            );
            assert_eq!(
                care_validation_report_count(report, &mut report_count),
                CARE_OK
            );
        }
        assert!(report_count > 0);
        let (mut profile, mut care_profile, mut preport, mut preport_count) =
            (null(), null(), null_mut(), 0);
        let bad_profile = br#"{"name":" ","dimensions":[{"name":"a","weight":2,"criteria":[]}]}"#;
        // SAFETY: valid pointers and lengths.
        unsafe {
            assert_eq!(
                care_profile_builtin(c"kardia".as_ptr(), 6, &mut profile),
                CARE_OK
            );
            assert_eq!(
                care_profile_builtin(c"care".as_ptr(), 4, &mut care_profile),
                CARE_OK
            );
            assert_eq!(
                care_profile_validate(bad_profile.as_ptr().cast(), bad_profile.len(), &mut preport),
                CARE_OK
            );
            assert_eq!(
                care_profile_report_count(preport, &mut preport_count, null_mut()),
                CARE_OK
            );
        }
        assert!(preport_count > 1);
        let mut f = Fx {
            rubric,
            report,
            report_count,
            profile,
            care_profile,
            preport,
            preport_count,
            text,
            name: b"rloo".to_vec(),
            loss_name: b"verl".to_vec(),
            preset: 1,
            rewards: vec![1.0, 2.0, 3.0, 5.0],
            valid: vec![1; 4],
            group_offsets: vec![0, 2, 4],
            rw: junk(),
            layout: junk(),
            ao: junk(),
            // Groups {1, 2} and {3, 5}: counts, sums and centered sums of squares.
            sums_in: vec![
                care_group_sums {
                    count: 2.0,
                    sum: 3.0,
                },
                care_group_sums {
                    count: 2.0,
                    sum: 8.0,
                },
            ],
            m2_in: vec![0.5, 2.0],
            seq_adv: vec![1.0, -1.0],
            seq: vec![0, 3, 5],
            tok_mask: vec![1, 1, 0, 1, 1],
            tr_rewards: vec![0.0, 0.5, 9.0, 0.0, 1.0],
            tr_values: vec![0.2, 0.4, 9.0, 0.1, 0.3],
            tr: junk(),
            tr_ret: junk(),
            gae_o: care_gae_options {
                struct_size: sz::<care_gae_options>(),
                gamma: 0.9,
                lambda: 0.8,
                masked_token: 0,
            },
            wo: care_whiten_options {
                struct_size: sz::<care_whiten_options>(),
                std_kind: care_std_kind::CARE_STD_BIASED as u32,
                eps: 1e-6,
                count_eps: 0.0,
            },
            logp: vec![-1.0, -1.2, -0.7, -2.0, -0.1],
            logp_old: vec![-1.1, -1.0, -0.7, -1.5, -0.2],
            li: junk(),
            lo: junk(),
            stats_in: junk(),
            stats_other: junk(),
            policy: junk(),
            crit_dim: 1,
            crit_index: 0,
            viol_index: 0,
            scores: (0..TOTAL).map(|i| (i % 6) as f64).collect(),
            rejected: (0..TOTAL).map(|i| ((i + 3) % 6) as f64).collect(),
            so: junk(),
            po: junk(),
            go: junk(),
            pair: junk(),
            labels: vec![c"Question".as_ptr(), c"Information".as_ptr()],
            label_lens: vec![8, 11],
            label_policy: 0,
            weights: vec![0.4, 0.35, 0.25],
            counts_in: vec![1, 0, 2],
            gi: junk(),
            ctx: vec![c"I feel stuck.".as_ptr()],
            ctx_lens: vec![13],
            ji: junk(),
            judge: br#"{"criterion_scores":[]}"#.to_vec(),
            profile_name: b"kardia".to_vec(),
            profile_text: std::fs::read(
                common::repo_root().join("cli/tests/data/profile_checklist.json"),
            )
            .expect("cli/tests/data/profile_checklist.json"),
            p_index: 0,
            p_output: KARDIA_OK.to_vec(),
            p_scores: vec![4.0, 5.0, 3.0, 5.0, 5.0],
            gold: b"sadness".to_vec(),
            p_resp: junk(),
            p_outputs: vec![KARDIA_OK.as_ptr().cast(), KARDIA_BAD.as_ptr().cast()],
            p_output_lens: vec![KARDIA_OK.len(), KARDIA_BAD.len()],
            p_group_scores: (0..2 * KARDIA).map(|i| (i % 6) as f64).collect(),
            p_group: junk(),
            p_judge: KARDIA_JUDGE.to_vec(),
            logits: vec![0.5, -1.0, 2.0, 0.0, 1.0, -0.5],
            targets: vec![2, 0],
            row_mask: vec![1, 1],
            lg: junk(),
            dlogp_in: vec![1.0, -0.5],
            grads: junk(),
            lseq: vec![0, 1, 2],
            lold: vec![-1.5, -0.4],
            ladv: vec![1.0, -1.0],
            lli: junk(),
            launch: care_gpu_launch {
                struct_size: sz::<care_gpu_launch>(),
                stream: null_mut(),
                workspace: fake(),
                // Room for the whitened chains' f64 values too (never touched: fake()).
                workspace_len: CARE_GPU_WORKSPACE_BYTES + 1024,
            },
            d_rw: care_rewards {
                struct_size: sz::<care_rewards>(),
                rewards: fake(),
                rewards_len: 8,
                valid: fake(),
                valid_len: 8,
                lengths: null(),
                lengths_len: 0,
                baselines: null(),
                baselines_len: 0,
            },
            d_layout: care_group_layout {
                struct_size: sz::<care_group_layout>(),
                group_size: 4,
                offsets: null(),
                offsets_len: 0,
            },
            d_ado: care_advantage_outputs {
                struct_size: sz::<care_advantage_outputs>(),
                advantages: fake(),
                advantages_len: 8,
                stats: fake(),
                stats_len: 2,
            },
            d_batch_std: null(),
            d_li: care_loss_inputs {
                struct_size: sz::<care_loss_inputs>(),
                dtype: care_dtype::CARE_DTYPE_F32 as u32,
                logp: fake(),
                logp_len: T_TOK,
                logp_old: fake(),
                logp_old_len: T_TOK,
                logp_ref: null(),
                logp_ref_len: 0,
                seq_offsets: fake(),
                seq_offsets_len: 3,
                mask: fake(),
                mask_len: T_TOK,
                advantages: fake(),
                advantages_len: 2,
                advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
                max_seq_len: 0,
                logp_rollout: null(),
                logp_rollout_len: 0,
            },
            d_grad_len: T_TOK,
            grad_dtype: care_dtype::CARE_DTYPE_F32 as u32,
            d_stats_len: CARE_GPU_LOSS_STATS_BYTES,
            d_rstats_len: CARE_GPU_ROLLOUT_STATS_BYTES,
            d_glo: care_gpu_loss_outputs {
                struct_size: sz::<care_gpu_loss_outputs>(),
                grad_dtype: care_dtype::CARE_DTYPE_F32 as u32,
                grad: fake(),
                grad_len: T_TOK,
                stats: fake(),
                stats_len: CARE_GPU_LOSS_STATS_BYTES,
                rollout_stats: fake(),
                rollout_stats_len: CARE_GPU_ROLLOUT_STATS_BYTES,
            },
            d_lg: care_logits {
                struct_size: sz::<care_logits>(),
                dtype: care_dtype::CARE_DTYPE_F32 as u32,
                logits: fake(),
                logits_len: 6,
                rows: 2,
                vocab: 3,
                row_stride: 3,
                targets: fake(),
                targets_len: 2,
                targets_i64: 0,
                mask: fake(),
                mask_len: 2,
                temperature: 1.0,
            },
            d_lsm_out: care_log_softmax_outputs {
                struct_size: sz::<care_log_softmax_outputs>(),
                logp: fake(),
                logp_len: 2,
                entropy: fake(),
                entropy_len: 2,
                lse: fake(),
                lse_len: 2,
            },
            d_grads: care_log_softmax_grads {
                struct_size: sz::<care_log_softmax_grads>(),
                dlogp: fake(),
                dlogp_len: 2,
                dentropy: fake(),
                dentropy_len: 2,
                lse: fake(),
                lse_len: 2,
                entropy: fake(),
                entropy_len: 2,
            },
            d_dlogits_len: 6,
            d_dlogits_stride: 3,
            d_lli: care_loss_inputs {
                struct_size: sz::<care_loss_inputs>(),
                dtype: care_dtype::CARE_DTYPE_F32 as u32,
                logp: null(),
                logp_len: 0,
                logp_old: fake(),
                logp_old_len: 2,
                logp_ref: null(),
                logp_ref_len: 0,
                seq_offsets: fake(),
                seq_offsets_len: 3,
                mask: null(),
                mask_len: 0,
                advantages: fake(),
                advantages_len: 2,
                advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
                max_seq_len: 0,
                logp_rollout: null(),
                logp_rollout_len: 0,
            },
            d_llo: care_logits_loss_outputs {
                struct_size: sz::<care_logits_loss_outputs>(),
                logp: fake(),
                logp_len: 2,
                lse: fake(),
                lse_len: 2,
                dlogp: fake(),
                dlogp_len: 2,
            },
            // In place over the logits (the same fake address and stride).
            d_flo: care_gpu_fused_loss_outputs {
                struct_size: sz::<care_gpu_fused_loss_outputs>(),
                dlogits: fake(),
                dlogits_len: 6,
                dlogits_row_stride: 3,
                logp: fake(),
                logp_len: 2,
                lse: fake(),
                lse_len: 2,
                stats: fake(),
                stats_len: CARE_GPU_LOSS_STATS_BYTES,
            },
            fused_ok: 7,
            adv: vec![7.0; 4],
            group_stats: vec![junk(); 2],
            ado: junk(),
            ao_out: junk(),
            sums_out: vec![junk(); 2],
            m2_out: vec![7.0; 2],
            tokens: vec![7.0; T_TOK],
            grad: vec![7.0; T_TOK],
            logp_rollout: vec![-1.0, -1.1, -0.6, -1.4, -0.3],
            weights_out: vec![7.0; T_TOK],
            keep_out: vec![7; T_TOK],
            gae_adv: vec![7.0; T_TOK],
            gae_ret: vec![7.0; T_TOK],
            wh_values: vec![1.0, 2.0, 9.0, 4.0, 0.5],
            wh_mean: 7.0,
            wh_std: 7.0,
            gae_o_out: junk(),
            wo_out: junk(),
            ws_n: T_TOK,
            ws_bytes: 0x5a5a,
            rollout_stats: junk(),
            loss: 7.0,
            stats: junk(),
            lo_out: junk(),
            so_out: junk(),
            po_out: junk(),
            go_out: junk(),
            policy_out: junk(),
            rubric_out: null(),
            report_out: null_mut(),
            w_out: vec![7.0; 3],
            counts_out: vec![7; 3],
            total_out: 7,
            title: null(),
            title_len: 7,
            desc: null(),
            desc_len: 7,
            count_out: 7,
            summary: (7.0, 7, 7),
            violation: junk(),
            buf: vec![0xA5; 16 * 1024],
            buf_len: 16 * 1024,
            len_out: 7,
            reward: 7.0,
            detail: junk(),
            group_rewards: vec![7.0],
            group_report: junk(),
            strategy: junk(),
            generated: junk(),
            judge_scores: vec![7.0; TOTAL],
            judge_report: junk(),
            lsm_logp: vec![7.0; 2],
            lsm_entropy: vec![7.0; 2],
            lsm_lse: vec![7.0; 2],
            lsm_out: junk(),
            dlogits: vec![7.0; 6],
            ll_logp: vec![7.0; 2],
            ll_lse: vec![7.0; 2],
            ll_dlogp: vec![7.0; 2],
            llo: junk(),
            profile_out: null(),
            preport_out: null_mut(),
            p_name: null(),
            p_name_len: 7,
            p_info: junk(),
            p_weight: 7.0,
            p_criteria: 7,
            p_check: junk(),
            p_result: junk(),
            p_rewards: vec![7.0; 2],
            p_details: vec![junk(); 2],
            p_gout: junk(),
            p_greport: junk(),
            p_judge_scores: vec![7.0; KARDIA],
            p_violation: junk(),
            p_overflowed: 7,
        };
        // SAFETY: valid output pointers.
        unsafe {
            assert_eq!(care_advantage_options_preset(0, &mut f.ao), CARE_OK);
            assert_eq!(care_loss_options_preset(0, &mut f.lo), CARE_OK);
            assert_eq!(care_loss_stats_empty(&mut f.stats_in), CARE_OK);
            assert_eq!(care_loss_stats_empty(&mut f.stats_other), CARE_OK);
            f.stats_other.tokens = 3.0;
            assert_eq!(care_format_policy_default(&mut f.policy), CARE_OK);
            assert_eq!(care_score_options_default(&mut f.so), CARE_OK);
            assert_eq!(care_preference_options_default(&mut f.po), CARE_OK);
            assert_eq!(care_generator_options_default(&mut f.go), CARE_OK);
        }
        f.rw = care_rewards {
            struct_size: sz::<care_rewards>(),
            rewards: f.rewards.as_ptr(),
            rewards_len: 4,
            valid: f.valid.as_ptr(),
            valid_len: 4,
            lengths: null(),
            lengths_len: 0,
            baselines: null(),
            baselines_len: 0,
        };
        f.layout = care_group_layout {
            struct_size: sz::<care_group_layout>(),
            group_size: 0,
            offsets: f.group_offsets.as_ptr(),
            offsets_len: 3,
        };
        f.li = care_loss_inputs {
            struct_size: sz::<care_loss_inputs>(),
            dtype: care_dtype::CARE_DTYPE_F32 as u32,
            logp: f.logp.as_ptr().cast(),
            logp_len: T_TOK,
            logp_old: f.logp_old.as_ptr().cast(),
            logp_old_len: T_TOK,
            logp_ref: f.logp_old.as_ptr().cast(),
            logp_ref_len: T_TOK,
            seq_offsets: f.seq.as_ptr(),
            seq_offsets_len: 3,
            mask: f.tok_mask.as_ptr(),
            mask_len: T_TOK,
            advantages: f.seq_adv.as_ptr(),
            advantages_len: 2,
            advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
            max_seq_len: 0,
            logp_rollout: f.logp_rollout.as_ptr().cast(),
            logp_rollout_len: T_TOK,
        };
        f.tr = care_token_rewards {
            struct_size: sz::<care_token_rewards>(),
            token_rewards: f.tr_rewards.as_ptr(),
            token_rewards_len: T_TOK,
            values: f.tr_values.as_ptr(),
            values_len: T_TOK,
            seq_offsets: f.seq.as_ptr(),
            seq_offsets_len: 3,
            mask: f.tok_mask.as_ptr(),
            mask_len: T_TOK,
        };
        f.tr_ret = care_token_rewards {
            values: null(),
            values_len: 0,
            ..f.tr
        };
        f.pair = care_preference_pair {
            struct_size: sz::<care_preference_pair>(),
            chosen: f.scores.as_ptr(),
            chosen_len: TOTAL,
            rejected: f.rejected.as_ptr(),
            rejected_len: TOTAL,
        };
        f.gi = care_generator_inputs {
            struct_size: sz::<care_generator_inputs>(),
            text: f.text.as_ptr().cast(),
            text_len: f.text.len(),
            chosen: f.scores.as_ptr(),
            chosen_len: TOTAL,
            rejected: f.rejected.as_ptr(),
            rejected_len: TOTAL,
            labels: f.labels.as_ptr(),
            label_lens: f.label_lens.as_ptr(),
            label_count: 2,
        };
        f.ji = care_judge_prompt_inputs {
            struct_size: sz::<care_judge_prompt_inputs>(),
            context: f.ctx.as_ptr(),
            context_lens: f.ctx_lens.as_ptr(),
            context_count: 1,
            seeker_turn: c"Hi".as_ptr(),
            seeker_turn_len: 2,
            response: c"Hello".as_ptr(),
            response_len: 5,
        };
        f.lg = care_logits {
            struct_size: sz::<care_logits>(),
            dtype: care_dtype::CARE_DTYPE_F32 as u32,
            logits: f.logits.as_ptr().cast(),
            logits_len: 6,
            rows: 2,
            vocab: 3,
            row_stride: 3,
            targets: f.targets.as_ptr().cast(),
            targets_len: 2,
            targets_i64: 0,
            mask: f.row_mask.as_ptr(),
            mask_len: 2,
            temperature: 0.7,
        };
        f.grads = care_log_softmax_grads {
            struct_size: sz::<care_log_softmax_grads>(),
            dlogp: f.dlogp_in.as_ptr(),
            dlogp_len: 2,
            dentropy: f.dlogp_in.as_ptr(),
            dentropy_len: 2,
            lse: null(),
            lse_len: 0,
            entropy: null(),
            entropy_len: 0,
        };
        f.lli = care_loss_inputs {
            struct_size: sz::<care_loss_inputs>(),
            dtype: care_dtype::CARE_DTYPE_F32 as u32,
            logp: null(),
            logp_len: 0,
            logp_old: f.lold.as_ptr().cast(),
            logp_old_len: 2,
            logp_ref: null(),
            logp_ref_len: 0,
            seq_offsets: f.lseq.as_ptr(),
            seq_offsets_len: 3,
            mask: null(),
            mask_len: 0,
            advantages: f.ladv.as_ptr(),
            advantages_len: 2,
            advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
            max_seq_len: 1,
            logp_rollout: null(),
            logp_rollout_len: 0,
        };
        f.ado = care_advantage_outputs {
            struct_size: sz::<care_advantage_outputs>(),
            advantages: f.adv.as_mut_ptr(),
            advantages_len: 4,
            stats: f.group_stats.as_mut_ptr(),
            stats_len: 2,
        };
        f.lsm_out = care_log_softmax_outputs {
            struct_size: sz::<care_log_softmax_outputs>(),
            logp: f.lsm_logp.as_mut_ptr(),
            logp_len: 2,
            entropy: f.lsm_entropy.as_mut_ptr(),
            entropy_len: 2,
            lse: f.lsm_lse.as_mut_ptr(),
            lse_len: 2,
        };
        f.p_resp = care_profile_response {
            struct_size: sz::<care_profile_response>(),
            rubric: null(),
            output: f.p_output.as_ptr().cast(),
            output_len: f.p_output.len(),
            scores: f.p_scores.as_ptr(),
            scores_len: KARDIA,
            gold_emotion: f.gold.as_ptr().cast(),
            gold_emotion_len: f.gold.len(),
        };
        f.p_group = care_profile_group {
            struct_size: sz::<care_profile_group>(),
            rubric: null(),
            outputs: f.p_outputs.as_ptr(),
            output_lens: f.p_output_lens.as_ptr(),
            output_count: 2,
            scores: f.p_group_scores.as_ptr(),
            scores_len: 2 * KARDIA,
            gold_emotion: f.gold.as_ptr().cast(),
            gold_emotion_len: f.gold.len(),
        };
        f.p_gout = care_profile_group_outputs {
            struct_size: sz::<care_profile_group_outputs>(),
            rewards: f.p_rewards.as_mut_ptr(),
            rewards_len: 2,
            details: f.p_details.as_mut_ptr(),
            details_len: 2,
        };
        f.llo = care_logits_loss_outputs {
            struct_size: sz::<care_logits_loss_outputs>(),
            logp: f.ll_logp.as_mut_ptr(),
            logp_len: 2,
            lse: f.ll_lse.as_mut_ptr(),
            lse_len: 2,
            dlogp: f.ll_dlogp.as_mut_ptr(),
            dlogp_len: 2,
        };
        f
    }

    /// Everything a call may write, each as text (Debug never reads struct padding), with its
    /// name. Inputs are included in case an implementation writes through a cast-away const.
    fn outputs(&self) -> Vec<(&'static str, String)> {
        macro_rules! snap {
            ($($field:ident),* $(,)?) => { vec![$((stringify!($field), format!("{:?}", self.$field))),*] };
        }
        snap!(
            fused_ok,
            adv,
            group_stats,
            ao_out,
            sums_out,
            m2_out,
            tokens,
            grad,
            weights_out,
            keep_out,
            gae_adv,
            gae_ret,
            wh_values,
            wh_mean,
            wh_std,
            gae_o_out,
            wo_out,
            ws_bytes,
            rollout_stats,
            loss,
            stats,
            lo_out,
            so_out,
            po_out,
            go_out,
            policy_out,
            rubric_out,
            report_out,
            w_out,
            counts_out,
            total_out,
            title,
            title_len,
            desc,
            desc_len,
            count_out,
            summary,
            violation,
            buf,
            len_out,
            reward,
            detail,
            group_rewards,
            group_report,
            strategy,
            generated,
            judge_scores,
            judge_report,
            lsm_logp,
            lsm_entropy,
            lsm_lse,
            dlogits,
            ll_logp,
            ll_lse,
            ll_dlogp,
            profile_out,
            preport_out,
            p_name,
            p_name_len,
            p_info,
            p_weight,
            p_criteria,
            p_check,
            p_result,
            p_rewards,
            p_details,
            p_greport,
            p_judge_scores,
            p_violation,
            p_overflowed,
            stats_in,
            rewards,
            logp,
            logits,
            scores,
            sums_in,
            m2_in,
        )
    }
}

/// The names of the outputs that differ between two snapshots.
fn changed(a: &[(&'static str, String)], b: &[(&'static str, String)]) -> Vec<&'static str> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.1 != y.1)
        .map(|(x, _)| x.0)
        .collect()
}

impl Drop for Fx {
    fn drop(&mut self) {
        // Handles from this library, released once each (NULL is a no-op). A row that freed a
        // handle or replaced it by another value gets CARE_ERR_INVALID_HANDLE here, by design.
        // SAFETY: any value is checked before use.
        unsafe {
            care_rubric_free(self.rubric);
            care_rubric_free(self.rubric_out);
            care_validation_report_free(self.report);
            care_validation_report_free(self.report_out);
            care_profile_free(self.profile);
            care_profile_free(self.care_profile);
            care_profile_free(self.profile_out);
            care_profile_report_free(self.preport);
            care_profile_report_free(self.preport_out);
        }
    }
}

type Row = (&'static str, fn(&mut Fx), care_result);

/// Rows: `"what": |f| mutation => CODE`.
macro_rules! rows {
    ($($what:literal : |$f:ident| $body:expr => $code:ident),* $(,)?) => {
        vec![$(($what, (|$f: &mut Fx| { $body; }) as fn(&mut Fx), $code)),*]
    };
}

/// One table entry: `case! { |f, k| function(arguments), nulls[, rows] }`; the arguments use
/// the fixture `f` and pass `p(k, i, ..)` / `m(k, i, ..)` for the `nulls` required pointers.
macro_rules! case {
    (|$f:ident, $k:ident| $fun:ident($($arg:expr),* $(,)?), $nulls:literal $(,)?) => {
        case!(|$f, $k| $fun($($arg),*), $nulls, Vec::new())
    };
    (|$f:ident, $k:ident| $fun:ident($($arg:expr),* $(,)?), $nulls:literal, $rows:expr $(,)?) => {
        Case::new(
            stringify!($fun),
            $nulls,
            |$f: &mut Fx, $k: Option<usize>| unsafe { $fun($($arg),*) },
            $rows,
        )
    };
}

/// One entry point: `call(f, k)` makes the call, passing NULL for required pointer parameter
/// `k` (of `nulls`); `rows` are faults inside the inputs.
struct Case {
    name: &'static str,
    nulls: usize,
    call: fn(&mut Fx, Option<usize>) -> care_result,
    rows: Vec<Row>,
    /// What the valid call returns (`None`: it must not be made, see the GPU cases).
    valid: Option<care_result>,
    /// Whether the valid call writes something the fixture can see.
    writes: bool,
}

impl Case {
    fn new(
        name: &'static str,
        nulls: usize,
        call: fn(&mut Fx, Option<usize>) -> care_result,
        rows: Vec<Row>,
    ) -> Case {
        Case {
            name,
            nulls,
            call,
            rows,
            valid: Some(CARE_OK),
            writes: true,
        }
    }

    fn run(&self) {
        let name = self.name;
        if let Some(want) = self.valid {
            let mut f = Fx::new();
            let before = f.outputs();
            assert_eq!((self.call)(&mut f, None), want, "{name}: the valid call");
            // The detail getter itself reads, and never resets, the previous call's detail.
            if want == CARE_OK && name != "care_last_error_detail" {
                assert_eq!(
                    common::last_error_detail(),
                    "",
                    "{name}: a success leaves no detail"
                );
            }
            if self.writes && want == CARE_OK {
                assert!(
                    !changed(&before, &f.outputs()).is_empty(),
                    "{name}: the valid call writes its outputs"
                );
            }
        }
        let nulls = (0..self.nulls).map(|i| {
            let what = format!("required pointer parameter #{i} is NULL");
            (what, None, Some(i), CARE_ERR_NULL_POINTER)
        });
        let rows = self
            .rows
            .iter()
            .map(|&(what, mutate, want)| (what.to_string(), Some(mutate), None, want));
        for (what, mutate, k, want) in nulls.chain(rows) {
            let mut f = Fx::new();
            if let Some(mutate) = mutate {
                mutate(&mut f);
            }
            let before = f.outputs();
            assert_eq!((self.call)(&mut f, k), want, "{name}: {what}");
            if name != "care_last_error_detail" {
                check_detail(name, &what, want, mutate.is_some());
            }
            if want != CARE_ERR_BUFFER_TOO_SMALL {
                let c = changed(&before, &f.outputs());
                assert!(
                    c.is_empty(),
                    "{name}: {what}: outputs written on failure: {c:?}"
                );
            }
        }
    }
}

/// The detail after a failed call: never empty, and for a fault inside the inputs whose code
/// names a class (a length, a layout, a struct size, a flag), a sentence of its own rather
/// than the code's message, since only the sentence says which field to fix.
fn check_detail(name: &str, what: &str, code: care_result, in_inputs: bool) {
    let d = common::last_error_detail();
    assert!(!d.is_empty(), "{name}: {what}: no detail");
    let generic = care_result_message_str(code);
    let classed = matches!(
        code,
        CARE_ERR_LENGTH_MISMATCH
            | CARE_ERR_STRUCT_SIZE
            | CARE_ERR_INVALID_BOOL
            | CARE_ERR_INVALID_LAYOUT
    );
    if in_inputs && classed {
        assert_ne!(
            d, generic,
            "{name}: {what}: only the code's message as the detail"
        );
    }
}

fn care_result_message_str(code: care_result) -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(care_result_message(code as u32)) }
        .to_string_lossy()
        .into_owned()
}

fn rewards_rows() -> Vec<Row> {
    rows![
        "rewards.struct_size too small": |f| f.rw.struct_size -= 1 => CARE_ERR_STRUCT_SIZE,
        "rewards.rewards NULL": |f| f.rw.rewards = null() => CARE_ERR_NULL_POINTER,
        "rewards.valid NULL with a length": |f| f.rw.valid = null() => CARE_ERR_NULL_POINTER,
        "rewards.valid_len != rewards_len": |f| f.rw.valid_len = 3 => CARE_ERR_LENGTH_MISMATCH,
        "rewards.lengths NULL with a length": |f| f.rw.lengths_len = 4 => CARE_ERR_NULL_POINTER,
        "rewards.baselines_len != rewards_len": |f| {
            f.rw.baselines = f.rewards.as_ptr();
            f.rw.baselines_len = 3
        } => CARE_ERR_LENGTH_MISMATCH,
        "layout.struct_size too small": |f| f.layout.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "layout.offsets NULL with a length": |f| f.layout.offsets = null() => CARE_ERR_NULL_POINTER,
        "layout: group size and offsets": |f| f.layout.group_size = 2 => CARE_ERR_INVALID_ARGUMENT,
        "layout: offsets do not end at N": |f| f.group_offsets[2] = 3 => CARE_ERR_INVALID_LAYOUT,
        "layout: group size does not divide N": |f| {
            f.layout.offsets = null();
            f.layout.offsets_len = 0;
            f.layout.group_size = 3
        } => CARE_ERR_INVALID_LAYOUT,
    ]
}

fn advantage_options_rows() -> Vec<Row> {
    rows![
        "options.struct_size too small": |f| f.ao.struct_size = 8 => CARE_ERR_STRUCT_SIZE,
        "options.scale unknown": |f| f.ao.scale = 3 => CARE_ERR_INVALID_ARGUMENT,
        "options.singleton unknown": |f| f.ao.singleton = 9 => CARE_ERR_INVALID_ARGUMENT,
        "options.reweight unknown": |f| f.ao.reweight = 3 => CARE_ERR_INVALID_ARGUMENT,
        "options.baseline unknown": |f| f.ao.baseline = 6 => CARE_ERR_INVALID_ARGUMENT,
        "options: a length-weighted baseline without lengths": |f| {
            f.ao.baseline = 3
        } => CARE_ERR_INVALID_ARGUMENT,
        "options.eps negative": |f| f.ao.eps = -1.0 => CARE_ERR_INVALID_ARGUMENT,
        "options.std_floor negative": |f| f.ao.std_floor = -1.0 => CARE_ERR_INVALID_ARGUMENT,
    ]
}

fn advantage_outputs_rows() -> Vec<Row> {
    rows![
        "outputs.struct_size too small": |f| f.ado.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "outputs.advantages NULL": |f| f.ado.advantages = null_mut() => CARE_ERR_NULL_POINTER,
        "outputs.advantages_len != N": |f| f.ado.advantages_len = 3 => CARE_ERR_LENGTH_MISMATCH,
        "outputs.stats NULL with a length": |f| f.ado.stats = null_mut() => CARE_ERR_NULL_POINTER,
        "outputs.stats_len != groups": |f| f.ado.stats_len = 1 => CARE_ERR_LENGTH_MISMATCH,
    ]
}

fn gae_options_rows() -> Vec<Row> {
    rows![
        "options.struct_size too small": |f| f.gae_o.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "options.gamma > 1": |f| f.gae_o.gamma = 1.5 => CARE_ERR_INVALID_ARGUMENT,
        "options.gamma NaN": |f| f.gae_o.gamma = f64::NAN => CARE_ERR_INVALID_ARGUMENT,
        "options.lambda < 0": |f| f.gae_o.lambda = -0.1 => CARE_ERR_INVALID_ARGUMENT,
        "options.masked_token unknown": |f| f.gae_o.masked_token = 2 => CARE_ERR_INVALID_ARGUMENT,
    ]
}

fn whiten_options_rows() -> Vec<Row> {
    rows![
        "whiten options.struct_size too small": |f| f.wo.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "whiten options.std_kind unknown": |f| f.wo.std_kind = 2 => CARE_ERR_INVALID_ARGUMENT,
        "whiten options.eps negative": |f| f.wo.eps = -1.0 => CARE_ERR_INVALID_ARGUMENT,
        "whiten options.count_eps NaN": |f| f.wo.count_eps = f64::NAN => CARE_ERR_INVALID_ARGUMENT,
    ]
}

fn loss_options_rows() -> Vec<Row> {
    rows![
        "options.struct_size too small": |f| f.lo.struct_size -= 8 => CARE_ERR_STRUCT_SIZE,
        "options.kl_estimator unknown": |f| f.lo.kl_estimator = 4 => CARE_ERR_INVALID_ARGUMENT,
        "options.aggregation unknown": |f| f.lo.aggregation = 6 => CARE_ERR_INVALID_ARGUMENT,
        "options.ratio_level unknown": |f| f.lo.ratio_level = 3 => CARE_ERR_INVALID_ARGUMENT,
        "options.policy_loss unknown": |f| f.lo.policy_loss = 8 => CARE_ERR_INVALID_ARGUMENT,
        "options.sequence_count unknown": |f| f.lo.sequence_count = 2 => CARE_ERR_INVALID_ARGUMENT,
        "options.bypass unknown": |f| f.lo.bypass = 2 => CARE_ERR_INVALID_ARGUMENT,
        "options.gmpo_weight_floor negative": |f| f.lo.gmpo_weight_floor = -1.0 => CARE_ERR_INVALID_ARGUMENT,
        "options.sapo_tau_neg 0": |f| f.lo.sapo_tau_neg = 0.0 => CARE_ERR_INVALID_ARGUMENT,
        "options: a sequence ratio with CISPO": |f| {
            f.lo.ratio_level = 1;
            f.lo.policy_loss = 1
        } => CARE_ERR_INVALID_ARGUMENT,
        "options.rollout.is_level unknown": |f| f.lo.rollout.is_level = 3 => CARE_ERR_INVALID_ARGUMENT,
        "options.rollout.rejection_mode unknown": |f| {
            f.lo.rollout.rejection_mode = 2
        } => CARE_ERR_INVALID_ARGUMENT,
        "options.rollout: a k2 bound with a lower end": |f| {
            f.lo.rollout.reject[1] = care_reject_bound { lower: 0.5, upper: 1.0 }
        } => CARE_ERR_INVALID_ARGUMENT,
        "options.rollout.is_threshold 0": |f| f.lo.rollout.is_threshold = 0.0 => CARE_ERR_INVALID_ARGUMENT,
        "options.eps_low negative": |f| f.lo.eps_low = -0.1 => CARE_ERR_INVALID_ARGUMENT,
        "options.beta NaN": |f| f.lo.beta = f64::NAN => CARE_ERR_INVALID_ARGUMENT,
    ]
}

fn policy_rows() -> Vec<Row> {
    rows![
        "policy.struct_size 0": |f| f.policy.struct_size = 0 => CARE_ERR_STRUCT_SIZE,
        "policy.allow_think 2": |f| f.policy.allow_think = 2 => CARE_ERR_INVALID_BOOL,
        "policy.meta_words 255": |f| f.policy.meta_words = 255 => CARE_ERR_INVALID_BOOL,
        "policy: min > max criteria": |f| f.policy.min_criteria = 5 => CARE_ERR_INVALID_ARGUMENT,
        "policy: tolerance < 0": |f| f.policy.weight_tolerance = -1.0 => CARE_ERR_INVALID_ARGUMENT,
    ]
}

fn score_options_rows() -> Vec<Row> {
    rows![
        "score options.struct_size too small": |f| f.so.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "score options.uniform_weights 2": |f| f.so.uniform_weights = 2 => CARE_ERR_INVALID_BOOL,
        "score options.missing unknown": |f| f.so.missing = 3 => CARE_ERR_INVALID_ARGUMENT,
        "score options: range policy": |f| f.so.out_of_range = 2 => CARE_ERR_INVALID_ARGUMENT,
    ]
}

/// A rubric handle that is not live: freed (a use after free), of another handle type, or a
/// value that never was a handle. Detected without reading through it.
fn rubric_handle_rows() -> Vec<Row> {
    rows![
        // SAFETY (the rows below): handles are checked, whatever their value.
        "rubric freed (use after free)": |f| assert_eq!(unsafe { care_rubric_free(f.rubric) }, CARE_OK) => CARE_ERR_INVALID_HANDLE,
        "a report handle as the rubric": |f| f.rubric = f.report.cast_const().cast() => CARE_ERR_INVALID_HANDLE,
        "a profile handle as the rubric": |f| f.rubric = f.profile.cast() => CARE_ERR_INVALID_HANDLE,
        "an address as the rubric": |f| f.rubric = (&raw const f.loss).cast() => CARE_ERR_INVALID_HANDLE,
    ]
}
/// As [`rubric_handle_rows`] for the validation report.
fn report_handle_rows() -> Vec<Row> {
    rows![
        "report freed (use after free)": |f| assert_eq!(unsafe { care_validation_report_free(f.report) }, CARE_OK) => CARE_ERR_INVALID_HANDLE,
        "a rubric handle as the report": |f| f.report = f.rubric.cast_mut().cast() => CARE_ERR_INVALID_HANDLE,
        "an address as the report": |f| f.report = (&raw mut f.loss).cast() => CARE_ERR_INVALID_HANDLE,
    ]
}
/// As [`rubric_handle_rows`] for the profile.
fn profile_handle_rows() -> Vec<Row> {
    rows![
        "profile freed (use after free)": |f| assert_eq!(unsafe { care_profile_free(f.profile) }, CARE_OK) => CARE_ERR_INVALID_HANDLE,
        "a rubric handle as the profile": |f| f.profile = f.rubric.cast() => CARE_ERR_INVALID_HANDLE,
        "a profile report as the profile": |f| f.profile = f.preport.cast_const().cast() => CARE_ERR_INVALID_HANDLE,
        "an address as the profile": |f| f.profile = (&raw const f.loss).cast() => CARE_ERR_INVALID_HANDLE,
    ]
}
/// As [`rubric_handle_rows`] for the profile report.
fn profile_report_handle_rows() -> Vec<Row> {
    rows![
        "profile report freed (use after free)": |f| assert_eq!(unsafe { care_profile_report_free(f.preport) }, CARE_OK) => CARE_ERR_INVALID_HANDLE,
        "a validation report as the profile report": |f| f.preport = f.report.cast() => CARE_ERR_INVALID_HANDLE,
        "an address as the profile report": |f| f.preport = (&raw mut f.loss).cast() => CARE_ERR_INVALID_HANDLE,
    ]
}
/// Faults of a `care_profile_response` (on the kardia profile).
fn profile_response_rows() -> Vec<Row> {
    rows![
        "response.struct_size short": |f| f.p_resp.struct_size -= 8 => CARE_ERR_STRUCT_SIZE,
        "response.output NULL": |f| f.p_resp.output = null() => CARE_ERR_NULL_POINTER,
        "response.scores NULL": |f| f.p_resp.scores = null() => CARE_ERR_NULL_POINTER,
        "scores_len != criteria": |f| f.p_resp.scores_len = 4 => CARE_ERR_SCORE_SHAPE,
        "a missing score": |f| f.p_scores[1] = f64::NAN => CARE_ERR_MISSING_SCORE,
        "a score out of range": |f| f.p_scores[0] = 6.0 => CARE_ERR_SCORE_OUT_OF_RANGE,
        "gold emotion missing": |f| {
            f.p_resp.gold_emotion = null();
            f.p_resp.gold_emotion_len = 0
        } => CARE_ERR_INVALID_ARGUMENT,
        "gold emotion blank": |f| {
            f.p_resp.gold_emotion = c" .".as_ptr();
            f.p_resp.gold_emotion_len = 2
        } => CARE_ERR_INVALID_ARGUMENT,
        "gold emotion not UTF-8": |f| f.p_resp.gold_emotion = c"\xff\xfe\xfd\xfc\xfb\xfa\xf9".as_ptr() => CARE_ERR_INVALID_UTF8,
        "gold emotion NULL with a length": |f| f.p_resp.gold_emotion = null() => CARE_ERR_NULL_POINTER,
        "a rubric for a fixed profile": |f| f.p_resp.rubric = f.rubric => CARE_ERR_INVALID_ARGUMENT,
        "a stale rubric handle": |f| {
            f.p_resp.rubric = f.rubric;
            // SAFETY: a live handle, released once.
            assert_eq!(unsafe { care_rubric_free(f.rubric) }, CARE_OK)
        } => CARE_ERR_INVALID_HANDLE,
        "a generated profile without its rubric": |f| f.profile = f.care_profile => CARE_ERR_INVALID_ARGUMENT,
    ]
}
/// Faults of a `care_profile_group` and its outputs (on the kardia profile).
fn profile_group_rows() -> Vec<Row> {
    rows![
        "group.struct_size short": |f| f.p_group.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "group.outputs NULL": |f| f.p_group.outputs = null() => CARE_ERR_NULL_POINTER,
        "group.output_lens NULL": |f| f.p_group.output_lens = null() => CARE_ERR_NULL_POINTER,
        "an output NULL with a length": |f| f.p_outputs[1] = null() => CARE_ERR_NULL_POINTER,
        "scores_len != M * criteria": |f| f.p_group.scores_len = 9 => CARE_ERR_LENGTH_MISMATCH,
        "gold emotion missing": |f| {
            f.p_group.gold_emotion = null();
            f.p_group.gold_emotion_len = 0
        } => CARE_ERR_INVALID_ARGUMENT,
        "a rubric for a fixed profile": |f| f.p_group.rubric = f.rubric => CARE_ERR_INVALID_ARGUMENT,
        "a generated profile without its rubric": |f| f.profile = f.care_profile => CARE_ERR_INVALID_ARGUMENT,
        "outputs.struct_size short": |f| f.p_gout.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "outputs.rewards NULL": |f| f.p_gout.rewards = null_mut() => CARE_ERR_NULL_POINTER,
        "rewards_len != M": |f| f.p_gout.rewards_len = 1 => CARE_ERR_LENGTH_MISMATCH,
        "details NULL with a length": |f| f.p_gout.details = null_mut() => CARE_ERR_NULL_POINTER,
        "details_len != M": |f| f.p_gout.details_len = 3 => CARE_ERR_LENGTH_MISMATCH,
    ]
}
/// Faults of a `care_judge_prompt_inputs` (`f.ji`) and of the prompt buffer.
fn judge_inputs_rows() -> Vec<Row> {
    rows![
        "inputs.struct_size short": |f| f.ji.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "inputs.context NULL": |f| f.ji.context = null() => CARE_ERR_NULL_POINTER,
        "inputs.context_lens NULL": |f| f.ji.context_lens = null() => CARE_ERR_NULL_POINTER,
        "inputs.seeker_turn NULL": |f| f.ji.seeker_turn = null() => CARE_ERR_NULL_POINTER,
        "response not UTF-8": |f| f.ji.response = c"\xff".as_ptr() => CARE_ERR_INVALID_UTF8,
        "buffer too small": |f| f.buf_len = 10 => CARE_ERR_BUFFER_TOO_SMALL,
    ]
}
fn preference_options_rows() -> Vec<Row> {
    rows![
        "preference options: size": |f| f.po.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
        "preference options.scale unknown": |f| f.po.scale = 2 => CARE_ERR_INVALID_ARGUMENT,
        "preference options.tau 0": |f| f.po.tau = 0.0 => CARE_ERR_INVALID_ARGUMENT,
    ]
}

fn logits_rows() -> Vec<Row> {
    rows![
        "logits.struct_size too small": |f| f.lg.struct_size -= 8 => CARE_ERR_STRUCT_SIZE,
        "logits.dtype unknown": |f| f.lg.dtype = 3 => CARE_ERR_INVALID_ARGUMENT,
        "logits.logits NULL": |f| f.lg.logits = null() => CARE_ERR_NULL_POINTER,
        "logits.logits_len short": |f| f.lg.logits_len = 5 => CARE_ERR_LENGTH_MISMATCH,
        "logits.vocab 0": |f| f.lg.vocab = 0 => CARE_ERR_INVALID_ARGUMENT,
        "logits.row_stride < vocab": |f| f.lg.row_stride = 2 => CARE_ERR_INVALID_ARGUMENT,
        "logits.targets NULL": |f| f.lg.targets = null() => CARE_ERR_NULL_POINTER,
        "logits.targets_len != rows": |f| f.lg.targets_len = 1 => CARE_ERR_LENGTH_MISMATCH,
        "logits.targets_i64 2": |f| f.lg.targets_i64 = 2 => CARE_ERR_INVALID_BOOL,
        "logits.mask NULL with a length": |f| f.lg.mask = null() => CARE_ERR_NULL_POINTER,
        "logits.mask_len != rows": |f| f.lg.mask_len = 1 => CARE_ERR_LENGTH_MISMATCH,
        "logits.temperature 0": |f| f.lg.temperature = 0.0 => CARE_ERR_INVALID_ARGUMENT,
        "logits.temperature inf": |f| f.lg.temperature = f64::INFINITY => CARE_ERR_INVALID_ARGUMENT,
    ]
}

/// The faults the GPU finds too, on a device `care_logits` (`f.d_lg`).
fn device_logits_rows() -> Vec<Row> {
    rows![
        "logits.struct_size short": |f| f.d_lg.struct_size -= 8 => CARE_ERR_STRUCT_SIZE,
        "logits.dtype unknown": |f| f.d_lg.dtype = 3 => CARE_ERR_INVALID_ARGUMENT,
        "logits.logits NULL": |f| f.d_lg.logits = null() => CARE_ERR_NULL_POINTER,
        "logits.logits_len short": |f| f.d_lg.logits_len = 5 => CARE_ERR_LENGTH_MISMATCH,
        "logits misaligned": |f| f.d_lg.logits = 0x1002 as *const c_void => CARE_ERR_INVALID_ARGUMENT,
        "logits.vocab 0": |f| f.d_lg.vocab = 0 => CARE_ERR_INVALID_ARGUMENT,
        "logits.vocab over u32": |f| {
            f.d_lg.vocab = 1 << 33;
            f.d_lg.row_stride = 1 << 33;
            f.d_lg.logits_len = usize::MAX
        } => CARE_ERR_INVALID_ARGUMENT,
        "logits.row_stride < vocab": |f| f.d_lg.row_stride = 2 => CARE_ERR_INVALID_ARGUMENT,
        "logits.targets NULL": |f| f.d_lg.targets = null() => CARE_ERR_NULL_POINTER,
        "logits.targets_len != rows": |f| f.d_lg.targets_len = 1 => CARE_ERR_LENGTH_MISMATCH,
        "logits.targets_i64 2": |f| f.d_lg.targets_i64 = 2 => CARE_ERR_INVALID_BOOL,
        "logits.mask NULL": |f| f.d_lg.mask = null() => CARE_ERR_NULL_POINTER,
        "logits.mask_len != rows": |f| f.d_lg.mask_len = 1 => CARE_ERR_LENGTH_MISMATCH,
        "logits.temperature 0": |f| f.d_lg.temperature = 0.0 => CARE_ERR_INVALID_ARGUMENT,
    ]
}

/// The faults of a `care_gpu_launch` (`workspace`: whether the call needs one).
fn launch_rows(workspace: bool) -> Vec<Row> {
    let mut rows = rows![
        "launch.struct_size short": |f| f.launch.struct_size = 8 => CARE_ERR_STRUCT_SIZE,
        "launch.workspace too small": |f| f.launch.workspace_len = 63 => CARE_ERR_BUFFER_TOO_SMALL,
        "launch.workspace misaligned": |f| {
            f.launch.workspace = 0x1008 as *mut c_void
        } => CARE_ERR_INVALID_ARGUMENT,
    ];
    if workspace {
        rows.extend(rows![
            "launch.workspace NULL": |f| f.launch.workspace = null_mut() => CARE_ERR_NULL_POINTER,
            "launch.workspace (NULL, 0)": |f| {
                f.launch.workspace = null_mut();
                f.launch.workspace_len = 0
            } => CARE_ERR_NULL_POINTER,
        ]);
    }
    rows
}

/// The tables of every CPU entry point.
fn cpu_cases() -> Vec<Case> {
    // SAFETY (every call below): the fixture's pointers are valid for their lengths; the
    // faults only shorten lengths, set NULLs or change numbers.
    vec![
        // ---- option initializers ---------------------------------------------------------
        case! { |f, k| care_advantage_options_default(m(k, 0, &raw mut f.ao_out)), 1 },
        case! { |f, k| care_advantage_options_preset(f.preset, m(k, 0, &raw mut f.ao_out)), 1,
            rows!["unknown preset": |f| f.preset = 99 => CARE_ERR_INVALID_ARGUMENT]
        },
        case! { |f, k| care_advantage_options_preset_by_name(
                p(k, 0, f.name.as_ptr().cast()), f.name.len(), m(k, 1, &raw mut f.ao_out)), 2,
            rows![
                "unknown name": |f| f.name = b"grpo".to_vec() => CARE_ERR_INVALID_ARGUMENT,
                "empty name": |f| f.name.clear() => CARE_ERR_INVALID_ARGUMENT,
                "name not UTF-8": |f| f.name = vec![0xff] => CARE_ERR_INVALID_UTF8,
            ]
        },
        case! { |f, k| care_loss_options_default(m(k, 0, &raw mut f.lo_out)), 1 },
        case! { |f, k| care_loss_options_preset(f.preset, m(k, 0, &raw mut f.lo_out)), 1,
            rows!["unknown preset": |f| f.preset = 99 => CARE_ERR_INVALID_ARGUMENT]
        },
        case! { |f, k| care_loss_options_preset_by_name(
                p(k, 0, f.loss_name.as_ptr().cast()), f.loss_name.len(),
                m(k, 1, &raw mut f.lo_out)), 2,
            rows!["unknown name": |f| f.loss_name = b"ppo".to_vec() => CARE_ERR_INVALID_ARGUMENT]
        },
        case! { |f, k| care_score_options_default(m(k, 0, &raw mut f.so_out)), 1 },
        case! { |f, k| care_preference_options_default(m(k, 0, &raw mut f.po_out)), 1 },
        case! { |f, k| care_generator_options_default(m(k, 0, &raw mut f.go_out)), 1 },
        case! { |f, k| care_format_policy_default(m(k, 0, &raw mut f.policy_out)), 1 },
        case! { |f, k| care_format_policy_lenient(m(k, 0, &raw mut f.policy_out)), 1 },
        // ---- advantages ------------------------------------------------------------------
        case! { |f, k| care_group_advantages(
                p(k, 0, &f.rw), p(k, 1, &f.layout), &f.ao, p(k, 2, &f.ado)), 3,
            [rewards_rows(), advantage_options_rows(), advantage_outputs_rows()].concat()
        },
        case! { |f, k| care_group_partial_sums(
                p(k, 0, &f.rw), p(k, 1, &f.layout),
                m(k, 2, f.sums_out.as_mut_ptr()), f.sums_out.len()), 3,
            [rewards_rows(), rows![
                "sums_len != B": |f| f.sums_out.truncate(1) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_group_partial_squares(
                p(k, 0, &f.rw), p(k, 1, &f.layout), p(k, 2, f.sums_in.as_ptr()), f.sums_in.len(),
                m(k, 3, f.m2_out.as_mut_ptr()), f.m2_out.len()), 4,
            [rewards_rows(), rows![
                "sums_len != B": |f| f.sums_in.truncate(1) => CARE_ERR_LENGTH_MISMATCH,
                "m2_len != B": |f| f.m2_out.truncate(1) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_group_advantages_finalize(
                p(k, 0, &f.rw), p(k, 1, &f.layout), p(k, 2, f.sums_in.as_ptr()), f.sums_in.len(),
                p(k, 3, f.m2_in.as_ptr()), f.m2_in.len(), &f.ao, p(k, 4, &f.ado)), 5,
            [rewards_rows(), advantage_options_rows(), advantage_outputs_rows(), rows![
                "sums_len != B": |f| f.sums_in.truncate(1) => CARE_ERR_LENGTH_MISMATCH,
                "m2_len != B": |f| f.m2_in.truncate(1) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_broadcast_to_tokens(
                p(k, 0, f.seq_adv.as_ptr()), f.seq_adv.len(), p(k, 1, f.seq.as_ptr()), f.seq.len(),
                f.tok_mask.as_ptr(), f.tok_mask.len(),
                m(k, 2, f.tokens.as_mut_ptr()), f.tokens.len()), 3,
            rows![
                "advantages_len != B": |f| f.seq_adv.truncate(1) => CARE_ERR_LENGTH_MISMATCH,
                "mask_len != T": |f| f.tok_mask.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "tokens_len != last offset": |f| f.tokens.truncate(4) => CARE_ERR_INVALID_LAYOUT,
                "offsets decrease": |f| f.seq[1] = 6 => CARE_ERR_INVALID_LAYOUT,
            ]
        },
        // ---- token-level estimators --------------------------------------------------------
        case! { |f, k| care_gae_options_default(m(k, 0, &raw mut f.gae_o_out)), 1 },
        case! { |f, k| care_whiten_options_default(m(k, 0, &raw mut f.wo_out)), 1 },
        case! { |f, k| care_discounted_returns(
                p(k, 0, &f.tr_ret), &f.gae_o, m(k, 1, f.gae_ret.as_mut_ptr()), f.gae_ret.len()), 2,
            [gae_options_rows(), rows![
                "inputs.values given": |f| {
                    f.tr_ret.values = f.tr_values.as_ptr();
                    f.tr_ret.values_len = T_TOK
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.values NULL with a length": |f| f.tr_ret.values_len = T_TOK => CARE_ERR_NULL_POINTER,
                "inputs.struct_size short": |f| f.tr_ret.struct_size -= 8 => CARE_ERR_STRUCT_SIZE,
                "inputs.token_rewards NULL": |f| f.tr_ret.token_rewards = null() => CARE_ERR_NULL_POINTER,
                "inputs.seq_offsets NULL": |f| f.tr_ret.seq_offsets = null() => CARE_ERR_NULL_POINTER,
                "inputs.seq_offsets end != T": |f| f.seq[2] = 4 => CARE_ERR_INVALID_LAYOUT,
                "inputs.mask NULL": |f| f.tr_ret.mask = null() => CARE_ERR_NULL_POINTER,
                "inputs.mask_len != T": |f| f.tr_ret.mask_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gae(
                p(k, 0, &f.tr), &f.gae_o, m(k, 1, f.gae_adv.as_mut_ptr()), f.gae_adv.len(),
                m(k, 2, f.gae_ret.as_mut_ptr()), f.gae_ret.len()), 3,
            [gae_options_rows(), rows![
                "inputs.struct_size short": |f| f.tr.struct_size -= 8 => CARE_ERR_STRUCT_SIZE,
                "inputs.token_rewards NULL": |f| f.tr.token_rewards = null() => CARE_ERR_NULL_POINTER,
                "inputs.values NULL": |f| f.tr.values = null() => CARE_ERR_NULL_POINTER,
                "inputs.values (NULL, 0)": |f| {
                    f.tr.values = null();
                    f.tr.values_len = 0
                } => CARE_ERR_NULL_POINTER,
                "inputs.values_len != T": |f| f.tr.values_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.seq_offsets NULL": |f| f.tr.seq_offsets = null() => CARE_ERR_NULL_POINTER,
                "inputs.seq_offsets end != T": |f| f.seq[2] = 4 => CARE_ERR_INVALID_LAYOUT,
                "inputs.seq_offsets decrease": |f| f.seq[1] = 6 => CARE_ERR_INVALID_LAYOUT,
                "inputs.mask NULL": |f| f.tr.mask = null() => CARE_ERR_NULL_POINTER,
                "inputs.mask_len != T": |f| f.tr.mask_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "advantages_len != T": |f| f.gae_adv.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_discounted_returns_whitened(
                p(k, 0, &f.tr_ret), &f.gae_o, &f.wo, m(k, 1, f.gae_adv.as_mut_ptr()), f.gae_adv.len(),
                m(k, 2, f.gae_ret.as_mut_ptr()), f.gae_ret.len(), &raw mut f.wh_mean, &raw mut f.wh_std), 3,
            [gae_options_rows(), whiten_options_rows(), rows![
                "inputs.values given": |f| {
                    f.tr_ret.values = f.tr_values.as_ptr();
                    f.tr_ret.values_len = T_TOK
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.token_rewards NULL": |f| f.tr_ret.token_rewards = null() => CARE_ERR_NULL_POINTER,
                "inputs.seq_offsets end != T": |f| f.seq[2] = 4 => CARE_ERR_INVALID_LAYOUT,
                "inputs.mask_len != T": |f| f.tr_ret.mask_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "advantages_len != T": |f| f.gae_adv.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "a counted reward is NaN": |f| f.tr_rewards[0] = f32::NAN => CARE_ERR_NON_FINITE,
            ]].concat()
        },
        case! { |f, k| care_gae_whitened(
                p(k, 0, &f.tr), &f.gae_o, &f.wo, m(k, 1, f.gae_adv.as_mut_ptr()), f.gae_adv.len(),
                m(k, 2, f.gae_ret.as_mut_ptr()), f.gae_ret.len(), &raw mut f.wh_mean, &raw mut f.wh_std), 3,
            [gae_options_rows(), whiten_options_rows(), rows![
                "inputs.values NULL": |f| f.tr.values = null() => CARE_ERR_NULL_POINTER,
                "inputs.values_len != T": |f| f.tr.values_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.seq_offsets decrease": |f| f.seq[1] = 6 => CARE_ERR_INVALID_LAYOUT,
                "advantages_len != T": |f| f.gae_adv.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "a counted value is inf": |f| f.tr_values[0] = f32::INFINITY => CARE_ERR_NON_FINITE,
            ]].concat()
        },
        case! { |f, k| care_whiten(
                m(k, 0, f.wh_values.as_mut_ptr()), f.wh_values.len(), f.tok_mask.as_ptr(),
                f.tok_mask.len(), &f.wo, &raw mut f.wh_mean, &raw mut f.wh_std), 1,
            rows![
                "options.struct_size too small": |f| f.wo.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "options.std_kind unknown": |f| f.wo.std_kind = 2 => CARE_ERR_INVALID_ARGUMENT,
                "options.eps negative": |f| f.wo.eps = -1.0 => CARE_ERR_INVALID_ARGUMENT,
                "options.eps NaN": |f| f.wo.eps = f64::NAN => CARE_ERR_INVALID_ARGUMENT,
                "mask_len != values_len": |f| f.tok_mask.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "a counted value is NaN": |f| f.wh_values[0] = f32::NAN => CARE_ERR_NON_FINITE,
                "a counted value is inf": |f| f.wh_values[4] = f32::INFINITY => CARE_ERR_NON_FINITE,
            ]
        },
        // Sizes the device chains' workspace; needs no driver.
        case! { |f, k| care_gpu_whitened_workspace_bytes(f.ws_n, m(k, 0, &raw mut f.ws_bytes)), 1,
            rows![
                "n_tokens above UINT32_MAX": |f| f.ws_n = usize::MAX => CARE_ERR_INVALID_ARGUMENT,
            ]
        },
        // Whether the one-pass path takes the options; needs no driver.
        case! { |f, k| care_logits_policy_loss_fused_supported(&f.lo, m(k, 0, &raw mut f.fused_ok)), 1,
            loss_options_rows()
        },
        // ---- loss ------------------------------------------------------------------------
        // Sizes the device loss's workspace; needs no driver.
        case! { |f, k| care_gpu_policy_loss_workspace_bytes(&f.lo, f.ws_n, m(k, 0, &raw mut f.ws_bytes)), 1,
            [loss_options_rows(), rows![
                "n_tokens above UINT32_MAX": |f| f.ws_n = usize::MAX => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_policy_loss(
                p(k, 0, &f.li), &f.lo, m(k, 1, f.grad.as_mut_ptr()), f.grad.len(),
                m(k, 2, &raw mut f.loss), &raw mut f.stats), 3,
            [loss_options_rows(), rows![
                "inputs.struct_size short": |f| f.li.struct_size -= 4 => CARE_ERR_STRUCT_SIZE,
                "inputs.dtype unknown": |f| f.li.dtype = 3 => CARE_ERR_INVALID_ARGUMENT,
                "inputs.logp NULL": |f| f.li.logp = null() => CARE_ERR_NULL_POINTER,
                "inputs.logp_old NULL": |f| f.li.logp_old = null() => CARE_ERR_NULL_POINTER,
                "inputs.logp_old_len != T": |f| f.li.logp_old_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.logp_ref_len != T": |f| f.li.logp_ref_len = 3 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.seq_offsets NULL": |f| f.li.seq_offsets = null() => CARE_ERR_NULL_POINTER,
                "inputs.seq_offsets end != T": |f| f.seq[2] = 4 => CARE_ERR_INVALID_LAYOUT,
                "inputs.mask NULL": |f| f.li.mask = null() => CARE_ERR_NULL_POINTER,
                "inputs.mask_len != T": |f| f.li.mask_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.advantages NULL": |f| f.li.advantages = null() => CARE_ERR_NULL_POINTER,
                "advantages_len != B": |f| f.li.advantages_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "per-token, B values": |f| f.li.advantages_kind = 1 => CARE_ERR_LENGTH_MISMATCH,
                "unknown adv. kind": |f| f.li.advantages_kind = 7 => CARE_ERR_INVALID_ARGUMENT,
                "grad_len != T": |f| f.grad.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "inputs.logp_rollout NULL": |f| f.li.logp_rollout = null() => CARE_ERR_NULL_POINTER,
                "inputs.logp_rollout_len != T": |f| {
                    f.li.logp_rollout_len = 4
                } => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_rollout_correction(
                p(k, 0, &f.li), &f.lo, m(k, 1, f.weights_out.as_mut_ptr()), f.weights_out.len(),
                m(k, 2, f.keep_out.as_mut_ptr()), f.keep_out.len(),
                &raw mut f.rollout_stats), 3,
            [loss_options_rows(), rows![
                "inputs.struct_size short": |f| f.li.struct_size -= 4 => CARE_ERR_STRUCT_SIZE,
                "inputs.dtype unknown": |f| f.li.dtype = 3 => CARE_ERR_INVALID_ARGUMENT,
                "inputs.logp_rollout absent": |f| {
                    f.li.logp_rollout = null();
                    f.li.logp_rollout_len = 0
                } => CARE_ERR_NULL_POINTER,
                "inputs.logp_rollout_len != T": |f| {
                    f.li.logp_rollout_len = 4
                } => CARE_ERR_LENGTH_MISMATCH,
                // Found by the `ffi` fuzz target: the other per-token inputs agreed with each
                // other but not with `logp`, and the call succeeded with a smaller `T`.
                "inputs.logp_len != the other per-token lengths": |f| {
                    f.li.logp_len = 4
                } => CARE_ERR_LENGTH_MISMATCH,
                "inputs.seq_offsets end != T": |f| f.seq[2] = 4 => CARE_ERR_INVALID_LAYOUT,
                "inputs.mask_len != T": |f| f.li.mask_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "weights_len != T": |f| f.weights_out.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "keep_len != T": |f| f.keep_out.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_loss_stats_empty(m(k, 0, &raw mut f.stats)), 1 },
        case! { |f, k| care_loss_stats_add(
        m(k, 0, &raw mut f.stats_in), p(k, 1, &f.stats_other)), 2 },
        // ---- rubric ----------------------------------------------------------------------
        case! { |f, k| care_rubric_parse(
                p(k, 0, f.text.as_ptr().cast()), f.text.len(), &f.policy,
                m(k, 1, &raw mut f.rubric_out)), 2,
            [policy_rows(), rows![
                "trailing bytes": |f| f.text = b"[1] x".to_vec() => CARE_ERR_TRAILING_TEXT,
                "text not JSON": |f| f.text = b"nope".to_vec() => CARE_ERR_NOT_JSON,
                "text not UTF-8": |f| f.text = vec![0xff] => CARE_ERR_NOT_JSON,
                "a rubric missing keys": |f| {
                    f.text = br#"{"categories":[{"category":"Cognitive Empathy"}]}"#.to_vec()
                } => CARE_ERR_SCHEMA,
                "2 criteria where 4 are required": |f| {
                    f.policy.min_criteria = 4
                } => CARE_ERR_FORMAT_VIOLATION,
            ]].concat()
        },
        case! { |f, k| care_rubric_clone(p(k, 0, f.rubric), m(k, 1, &raw mut f.rubric_out)), 2,
            rubric_handle_rows()
        },
        case! { |f, k| care_rubric_weights(
                p(k, 0, f.rubric), m(k, 1, f.w_out.as_mut_ptr()), f.w_out.len()), 2,
            [rubric_handle_rows(), rows![
                "weights_len != 3": |f| f.w_out.truncate(2) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_rubric_criteria_counts(
                p(k, 0, f.rubric), m(k, 1, f.counts_out.as_mut_ptr()), f.counts_out.len()), 2,
            [rubric_handle_rows(), rows![
                "counts_len != 3": |f| f.counts_out.push(0) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_rubric_total_criteria(
                p(k, 0, f.rubric), m(k, 1, &raw mut f.total_out)), 2,
            rubric_handle_rows()
        },
        case! { |f, k| care_rubric_criterion(
                p(k, 0, f.rubric), f.crit_dim, f.crit_index, m(k, 1, &raw mut f.title),
                m(k, 2, &raw mut f.title_len), m(k, 3, &raw mut f.desc),
                m(k, 4, &raw mut f.desc_len)), 5,
            [rubric_handle_rows(), rows![
                "index past the criteria": |f| f.crit_index = 2 => CARE_ERR_OUT_OF_RANGE,
                "unknown dimension": |f| f.crit_dim = 3 => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_rubric_validate(
                p(k, 0, f.text.as_ptr().cast()), f.text.len(), &f.policy,
                m(k, 1, &raw mut f.report_out)), 2,
            policy_rows()
        },
        case! { |f, k| care_format_reward(
                p(k, 0, f.text.as_ptr().cast()), f.text.len(), &f.policy,
                m(k, 1, &raw mut f.reward)), 2,
            policy_rows()
        },
        case! { |f, k| care_validation_report_count(
                p(k, 0, f.report), m(k, 1, &raw mut f.count_out)), 2,
            report_handle_rows()
        },
        case! { |f, k| care_validation_report_summary(
                p(k, 0, f.report), m(k, 1, &raw mut f.summary.0), m(k, 2, &raw mut f.summary.1),
                m(k, 3, &raw mut f.summary.2)), 4,
            report_handle_rows()
        },
        case! { |f, k| care_validation_report_violation(
                p(k, 0, f.report), f.viol_index, m(k, 1, &raw mut f.violation)), 2,
            [report_handle_rows(), rows![
                "index == count": |f| f.viol_index = f.report_count => CARE_ERR_OUT_OF_RANGE,
            ]].concat()
        },
        case! { |f, k| care_validation_report_message(
                p(k, 0, f.report), f.viol_index, or_null(&mut f.buf).cast(), f.buf_len,
                m(k, 1, &raw mut f.len_out)), 2,
            [report_handle_rows(), rows![
                "index == count": |f| f.viol_index = f.report_count => CARE_ERR_OUT_OF_RANGE,
                "buffer too small": |f| f.buf_len = 3 => CARE_ERR_BUFFER_TOO_SMALL,
                "buffer NULL with a length": |f| f.buf = Vec::new() => CARE_ERR_NULL_POINTER,
            ]].concat()
        },
        case! { |f, k| care_validation_report_feedback(
                p(k, 0, f.report), or_null(&mut f.buf).cast(), f.buf_len,
                m(k, 1, &raw mut f.len_out)), 2,
            [report_handle_rows(), rows![
                "buffer too small": |f| f.buf_len = 3 => CARE_ERR_BUFFER_TOO_SMALL,
            ]].concat()
        },
        // ---- rewards ---------------------------------------------------------------------
        case! { |f, k| care_policy_reward(
                p(k, 0, f.rubric), p(k, 1, f.scores.as_ptr()), f.scores.len(), &f.so,
                m(k, 2, &raw mut f.reward), &raw mut f.detail), 3,
            [score_options_rows(), rubric_handle_rows(), rows![
                "scores_len != criteria": |f| f.scores.truncate(7) => CARE_ERR_SCORE_SHAPE,
                "a missing score": |f| f.scores[3] = f64::NAN => CARE_ERR_MISSING_SCORE,
                "a score out of range": |f| f.scores[0] = 6.0 => CARE_ERR_SCORE_OUT_OF_RANGE,
            ]].concat()
        },
        case! { |f, k| care_policy_reward_group(
                p(k, 0, f.rubric), p(k, 1, f.scores.as_ptr()), f.scores.len(), &f.so,
                m(k, 2, f.group_rewards.as_mut_ptr()), f.group_rewards.len(),
                &raw mut f.group_report), 3,
            [score_options_rows(), rubric_handle_rows(), rows![
                "scores_len != G * criteria": |f| f.scores.truncate(7) => CARE_ERR_LENGTH_MISMATCH,
                "rewards_len too large": |f| f.group_rewards.push(0.0) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_preference_reward(
                p(k, 0, f.rubric), p(k, 1, &f.pair), &f.so, &f.po, m(k, 2, &raw mut f.reward),
                &raw mut f.detail), 3,
            [score_options_rows(), rubric_handle_rows(), preference_options_rows(), rows![
                "pair.struct_size short": |f| f.pair.struct_size = 8 => CARE_ERR_STRUCT_SIZE,
                "pair.chosen NULL": |f| f.pair.chosen = null() => CARE_ERR_NULL_POINTER,
                "pair.rejected NULL": |f| f.pair.rejected = null() => CARE_ERR_NULL_POINTER,
                "rejected_len != chosen": |f| f.pair.rejected_len = 7 => CARE_ERR_LENGTH_MISMATCH,
                "lengths != criteria": |f| {
                    f.pair.chosen_len = 7;
                    f.pair.rejected_len = 7
                } => CARE_ERR_SCORE_SHAPE,
            ]].concat()
        },
        case! { |f, k| care_strategy_counts_from_labels(
                p(k, 0, f.labels.as_ptr()), p(k, 1, f.label_lens.as_ptr()), f.labels.len(),
                f.label_policy, m(k, 2, &raw mut f.strategy)), 3,
            rows![
                "unknown label policy": |f| f.label_policy = 2 => CARE_ERR_INVALID_ARGUMENT,
                "a NULL label": |f| f.labels[1] = null() => CARE_ERR_NULL_POINTER,
                "unknown label": |f| f.labels[0] = c"Questio?".as_ptr() => CARE_ERR_UNKNOWN_LABEL,
            ]
        },
        case! { |f, k| care_alignment_reward(
                p(k, 0, f.weights.as_ptr()), f.weights.len(), p(k, 1, f.counts_in.as_ptr()),
                f.counts_in.len(), m(k, 2, &raw mut f.reward)), 3,
            rows![
                "weights_len != 3": |f| f.weights.truncate(2) => CARE_ERR_LENGTH_MISMATCH,
                "counts_len != 3": |f| f.counts_in.push(0) => CARE_ERR_LENGTH_MISMATCH,
            ]
        },
        case! { |f, k| care_generator_reward(
                p(k, 0, &f.gi), &f.policy, &f.so, &f.po, &f.go, m(k, 1, &raw mut f.generated)), 2,
            [policy_rows(), score_options_rows(), preference_options_rows(), rows![
                "inputs.struct_size short": |f| f.gi.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "inputs.text NULL": |f| f.gi.text = null() => CARE_ERR_NULL_POINTER,
                "inputs.chosen NULL": |f| f.gi.chosen = null() => CARE_ERR_NULL_POINTER,
                "rejected_len != criteria": |f| f.gi.rejected_len = 3 => CARE_ERR_SCORE_SHAPE,
                "inputs.labels NULL": |f| f.gi.labels = null() => CARE_ERR_NULL_POINTER,
                "inputs.label_lens NULL": |f| f.gi.label_lens = null() => CARE_ERR_NULL_POINTER,
                "options.struct_size short": |f| f.go.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "unknown label policy": |f| f.go.unknown_labels = 2 => CARE_ERR_INVALID_ARGUMENT,
                "options.lambda NaN": |f| f.go.lambda = f64::NAN => CARE_ERR_INVALID_ARGUMENT,
                "options.gamma infinite": |f| f.go.gamma = f64::INFINITY => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_judge_prompt_render(
                p(k, 0, f.rubric), p(k, 1, &f.ji), or_null(&mut f.buf).cast(), f.buf_len,
                m(k, 2, &raw mut f.len_out)), 3,
            [rubric_handle_rows(), judge_inputs_rows()].concat()
        },
        case! { |f, k| care_judge_output_parse(
                p(k, 0, f.rubric), p(k, 1, f.judge.as_ptr().cast()), f.judge.len(),
                m(k, 2, f.judge_scores.as_mut_ptr()), f.judge_scores.len(),
                &raw mut f.judge_report), 3,
            [rubric_handle_rows(), rows![
                "scores_len != criteria": |f| f.judge_scores.truncate(7) => CARE_ERR_SCORE_SHAPE,
                "no judge JSON": |f| f.judge = b"no json".to_vec() => CARE_ERR_NO_JUDGE_JSON,
            ]].concat()
        },
        // ---- profiles --------------------------------------------------------------------
        case! { |f, k| care_profile_builtin(
                p(k, 0, f.profile_name.as_ptr().cast()), f.profile_name.len(),
                m(k, 1, &raw mut f.profile_out)), 2,
            rows![
                "unknown name": |f| f.profile_name = b"kardia-r1".to_vec() => CARE_ERR_INVALID_ARGUMENT,
                "name not UTF-8": |f| f.profile_name = vec![0xff] => CARE_ERR_INVALID_UTF8,
            ]
        },
        case! { |f, k| care_profile_parse(
                p(k, 0, f.profile_text.as_ptr().cast()), f.profile_text.len(),
                m(k, 1, &raw mut f.profile_out)), 2,
            rows![
                "not JSON": |f| f.profile_text = b"{".to_vec() => CARE_ERR_NOT_JSON,
                "not UTF-8": |f| f.profile_text = vec![0xff] => CARE_ERR_NOT_JSON,
                "trailing text": |f| f.profile_text.extend(b" x") => CARE_ERR_TRAILING_TEXT,
                "a schema violation": |f| f.profile_text = br#"{"name":"x"}"#.to_vec() => CARE_ERR_INVALID_PROFILE,
                "weights off the simplex": |f| {
                    f.profile_text = br#"{"name":"x","dimensions":[{"name":"a","weight":0.5,"criteria":[{"title":"t","description":"d"}]}]}"#.to_vec()
                } => CARE_ERR_INVALID_PROFILE,
            ]
        },
        case! { |f, k| care_profile_validate(
                p(k, 0, f.profile_text.as_ptr().cast()), f.profile_text.len(),
                m(k, 1, &raw mut f.preport_out)), 2
        },
        case! { |f, k| care_profile_clone(p(k, 0, f.profile), m(k, 1, &raw mut f.profile_out)), 2,
            profile_handle_rows()
        },
        case! { |f, k| care_profile_name(
                p(k, 0, f.profile), m(k, 1, &raw mut f.p_name), m(k, 2, &raw mut f.p_name_len)), 3,
            profile_handle_rows()
        },
        case! { |f, k| care_profile_describe(p(k, 0, f.profile), m(k, 1, &raw mut f.p_info)), 2,
            profile_handle_rows()
        },
        case! { |f, k| care_profile_dimension(
                p(k, 0, f.profile), f.p_index, m(k, 1, &raw mut f.p_name),
                m(k, 2, &raw mut f.p_name_len), m(k, 3, &raw mut f.p_weight),
                m(k, 4, &raw mut f.p_criteria)), 5,
            [profile_handle_rows(), rows![
                "index past the dimensions": |f| f.p_index = 5 => CARE_ERR_OUT_OF_RANGE,
            ]].concat()
        },
        case! { |f, k| care_profile_span_name(
                p(k, 0, f.profile), f.p_index, m(k, 1, &raw mut f.p_name),
                m(k, 2, &raw mut f.p_name_len)), 3,
            [profile_handle_rows(), rows![
                "index past the spans": |f| f.p_index = 4 => CARE_ERR_OUT_OF_RANGE,
                "a profile without spans": |f| f.profile = f.care_profile => CARE_ERR_OUT_OF_RANGE,
            ]].concat()
        },
        case! { |f, k| care_profile_total_criteria(
                p(k, 0, f.profile), f.p_resp.rubric, m(k, 1, &raw mut f.p_criteria)), 2,
            [profile_handle_rows(), rows![
                "a rubric for a fixed profile": |f| f.p_resp.rubric = f.rubric => CARE_ERR_INVALID_ARGUMENT,
                "no rubric for a generated profile": |f| f.profile = f.care_profile => CARE_ERR_INVALID_ARGUMENT,
                "a report handle as the rubric": |f| {
                    f.p_resp.rubric = f.report.cast_const().cast()
                } => CARE_ERR_INVALID_HANDLE,
            ]].concat()
        },
        case! { |f, k| care_profile_check_output(
                p(k, 0, f.profile), p(k, 1, f.p_output.as_ptr().cast()), f.p_output.len(),
                m(k, 2, &raw mut f.p_check)), 3,
            profile_handle_rows()
        },
        case! { |f, k| care_last_error_detail(
                or_null(&mut f.buf).cast(), f.buf_len, m(k, 0, &raw mut f.len_out)), 1
        },
        case! { |f, k| care_profile_output_feedback(
                p(k, 0, f.profile), f.p_output.as_ptr().cast(), f.p_output.len(),
                or_null(&mut f.buf).cast(), f.buf_len, m(k, 1, &raw mut f.len_out)), 2,
            [profile_handle_rows(), rows![
                "buffer too small for the feedback": |f| {
                    f.p_output = KARDIA_BAD.to_vec();
                    f.buf_len = 3
                } => CARE_ERR_BUFFER_TOO_SMALL,
            ]].concat()
        },
        case! { |f, k| care_profile_reward(
                p(k, 0, f.profile), p(k, 1, &f.p_resp), &f.so, m(k, 2, &raw mut f.p_result)), 3,
            [profile_handle_rows(), score_options_rows(), profile_response_rows()].concat()
        },
        case! { |f, k| care_profile_reward_group(
                p(k, 0, f.profile), p(k, 1, &f.p_group), &f.so, p(k, 2, &f.p_gout),
                &raw mut f.p_greport), 3,
            [profile_handle_rows(), score_options_rows(), profile_group_rows()].concat()
        },
        case! { |f, k| care_profile_judge_prompt_render(
                p(k, 0, f.profile), f.p_resp.rubric, p(k, 1, &f.ji), or_null(&mut f.buf).cast(),
                f.buf_len, m(k, 2, &raw mut f.len_out)), 3,
            [profile_handle_rows(), judge_inputs_rows(), rows![
                "a rubric for a fixed profile": |f| f.p_resp.rubric = f.rubric => CARE_ERR_INVALID_ARGUMENT,
                "no rubric for a generated profile": |f| f.profile = f.care_profile => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_profile_judge_output_parse(
                p(k, 0, f.profile), f.p_resp.rubric, p(k, 1, f.p_judge.as_ptr().cast()),
                f.p_judge.len(), m(k, 2, f.p_judge_scores.as_mut_ptr()), f.p_judge_scores.len(),
                &raw mut f.judge_report), 3,
            [profile_handle_rows(), rows![
                "scores_len != criteria": |f| f.p_judge_scores.truncate(4) => CARE_ERR_SCORE_SHAPE,
                "no judge JSON": |f| f.p_judge = b"none".to_vec() => CARE_ERR_NO_JUDGE_JSON,
                "a rubric for a fixed profile": |f| f.p_resp.rubric = f.rubric => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_profile_report_count(
                p(k, 0, f.preport), m(k, 1, &raw mut f.count_out), &raw mut f.p_overflowed), 2,
            profile_report_handle_rows()
        },
        case! { |f, k| care_profile_report_violation(
                p(k, 0, f.preport), f.p_index, m(k, 1, &raw mut f.p_violation)), 2,
            [profile_report_handle_rows(), rows![
                "index == count": |f| f.p_index = f.preport_count => CARE_ERR_OUT_OF_RANGE,
            ]].concat()
        },
        case! { |f, k| care_profile_report_message(
                p(k, 0, f.preport), f.p_index, or_null(&mut f.buf).cast(), f.buf_len,
                m(k, 1, &raw mut f.len_out)), 2,
            [profile_report_handle_rows(), rows![
                "index == count": |f| f.p_index = f.preport_count => CARE_ERR_OUT_OF_RANGE,
                "buffer too small": |f| f.buf_len = 3 => CARE_ERR_BUFFER_TOO_SMALL,
            ]].concat()
        },
        case! { |f, k| care_profile_report_feedback(
                p(k, 0, f.preport), or_null(&mut f.buf).cast(), f.buf_len,
                m(k, 1, &raw mut f.len_out)), 2,
            [profile_report_handle_rows(), rows![
                "buffer too small": |f| f.buf_len = 3 => CARE_ERR_BUFFER_TOO_SMALL,
            ]].concat()
        },
        // ---- selective log-softmax -------------------------------------------------------
        case! { |f, k| care_selective_log_softmax(p(k, 0, &f.lg), p(k, 1, &f.lsm_out)), 2,
            [logits_rows(), rows![
                "a target outside 0..V": |f| f.targets[1] = 3 => CARE_ERR_INVALID_ARGUMENT,
                "outputs.struct_size short": |f| f.lsm_out.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "outputs.logp NULL": |f| f.lsm_out.logp = null_mut() => CARE_ERR_NULL_POINTER,
                "outputs.logp_len != rows": |f| f.lsm_out.logp_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "entropy_len != rows": |f| f.lsm_out.entropy_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "outputs.lse NULL": |f| f.lsm_out.lse = null_mut() => CARE_ERR_NULL_POINTER,
            ]].concat()
        },
        case! { |f, k| care_selective_log_softmax_backward(
                p(k, 0, &f.lg), p(k, 1, &f.grads), m(k, 2, f.dlogits.as_mut_ptr()),
                f.dlogits.len()), 3,
            [logits_rows(), rows![
                "grads.struct_size short": |f| f.grads.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "grads.dlogp_len != rows": |f| f.grads.dlogp_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "grads.dentropy NULL": |f| f.grads.dentropy = null() => CARE_ERR_NULL_POINTER,
                "grads.lse_len != rows": |f| {
                    f.grads.lse = f.dlogp_in.as_ptr();
                    f.grads.lse_len = 1
                } => CARE_ERR_LENGTH_MISMATCH,
                "dlogits_len != rows * V": |f| f.dlogits.truncate(5) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_logits_policy_loss(
                p(k, 0, &f.lg), p(k, 1, &f.lli), &f.lo, p(k, 2, &f.llo),
                m(k, 3, &raw mut f.loss), &raw mut f.stats), 4,
            [logits_rows(), loss_options_rows(), rows![
                "inputs.struct_size short": |f| f.lli.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "inputs.logp given": |f| {
                    f.lli.logp = f.lold.as_ptr().cast();
                    f.lli.logp_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.mask given": |f| {
                    f.lli.mask = f.row_mask.as_ptr();
                    f.lli.mask_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.dtype not f32": |f| f.lli.dtype = 1 => CARE_ERR_INVALID_ARGUMENT,
                "inputs.logp_rollout given (no rollout correction here)": |f| {
                    f.lli.logp_rollout = f.lold.as_ptr().cast();
                    f.lli.logp_rollout_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "logp_old_len != rows": |f| f.lli.logp_old_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "seq_offsets end != rows": |f| f.lseq[2] = 3 => CARE_ERR_INVALID_LAYOUT,
                "inputs.advantages NULL": |f| f.lli.advantages = null() => CARE_ERR_NULL_POINTER,
                "unknown adv. kind": |f| f.lli.advantages_kind = 2 => CARE_ERR_INVALID_ARGUMENT,
                "outputs.struct_size short": |f| f.llo.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "outputs.logp NULL": |f| f.llo.logp = null_mut() => CARE_ERR_NULL_POINTER,
                "outputs.dlogp_len != rows": |f| f.llo.dlogp_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "outputs.lse_len != rows": |f| f.llo.lse_len = 3 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
    ]
}

#[test]
fn every_exported_function_checks_its_arguments() {
    let mut covered = BTreeSet::new();
    assert!(!care_version().is_null());
    assert_eq!(care_abi_version(), CARE_ABI_VERSION);
    assert!(!care_result_message(123_456).is_null());
    covered.extend(["care_version", "care_abi_version", "care_result_message"].map(String::from));
    // Every `_free`: NULL is a no-op (CARE_OK); a live handle is released (CARE_OK); the same
    // handle again (a double free), a handle of another type and a value that never was a
    // handle are CARE_ERR_INVALID_HANDLE. The handle tests (tests/handles.rs) add the threads.
    // SAFETY: handles are checked, whatever their value.
    unsafe {
        let f = Fx::new();
        let address = (&raw const f.loss).cast::<u8>();
        let mut r2 = null();
        assert_eq!(care_rubric_clone(f.rubric, &mut r2), CARE_OK);
        assert_eq!(care_rubric_free(null()), CARE_OK);
        assert_eq!(care_rubric_free(r2), CARE_OK);
        assert_eq!(care_rubric_free(r2), CARE_ERR_INVALID_HANDLE);
        assert_eq!(care_rubric_free(f.profile.cast()), CARE_ERR_INVALID_HANDLE);
        assert_eq!(care_rubric_free(address.cast()), CARE_ERR_INVALID_HANDLE);
        let mut rep = null_mut();
        assert_eq!(
            care_rubric_validate(f.text.as_ptr().cast(), f.text.len(), null(), &mut rep),
            CARE_OK
        );
        assert_eq!(care_validation_report_free(null_mut()), CARE_OK);
        assert_eq!(care_validation_report_free(rep), CARE_OK);
        assert_eq!(care_validation_report_free(rep), CARE_ERR_INVALID_HANDLE);
        assert_eq!(
            care_validation_report_free(f.preport.cast()),
            CARE_ERR_INVALID_HANDLE
        );
        let mut p2 = null();
        assert_eq!(care_profile_clone(f.profile, &mut p2), CARE_OK);
        assert_eq!(care_profile_free(null()), CARE_OK);
        assert_eq!(care_profile_free(p2), CARE_OK);
        assert_eq!(care_profile_free(p2), CARE_ERR_INVALID_HANDLE);
        assert_eq!(care_profile_free(f.rubric.cast()), CARE_ERR_INVALID_HANDLE);
        assert_eq!(care_profile_free(address.cast()), CARE_ERR_INVALID_HANDLE);
        let mut pr = null_mut();
        assert_eq!(
            care_profile_validate(
                f.profile_text.as_ptr().cast(),
                f.profile_text.len(),
                &mut pr
            ),
            CARE_OK
        );
        assert_eq!(care_profile_report_free(null_mut()), CARE_OK);
        assert_eq!(care_profile_report_free(pr), CARE_OK);
        assert_eq!(care_profile_report_free(pr), CARE_ERR_INVALID_HANDLE);
        assert_eq!(
            care_profile_report_free(f.report.cast()),
            CARE_ERR_INVALID_HANDLE
        );
    }
    covered.extend(
        [
            "care_rubric_free",
            "care_validation_report_free",
            "care_profile_free",
            "care_profile_report_free",
        ]
        .map(String::from),
    );

    for case in cpu_cases() {
        case.run();
        assert!(covered.insert(case.name.to_string()), "{} twice", case.name);
    }
    assert!(matches!(
        care_gpu_available(),
        CARE_OK | CARE_ERR_CUDA_UNAVAILABLE
    ));
    covered.insert("care_gpu_available".to_string());
    for case in gpu_cases() {
        case.run();
        assert!(covered.insert(case.name.to_string()), "{} twice", case.name);
    }

    let declared = common::declared_functions(&common::header());
    let missed: Vec<_> = declared.difference(&covered).collect();
    assert!(
        missed.is_empty(),
        "functions of care.h this test does not call: {missed:?}"
    );
    let unknown: Vec<_> = covered.difference(&declared).collect();
    assert!(unknown.is_empty(), "called but not in care.h: {unknown:?}");
}

/// The faults of `care_gpu_policy_loss` and `care_gpu_policy_loss_into` outside their
/// outputs: the inputs, the options (with the CPU-only losses) and the launch.
fn gpu_loss_rows() -> Vec<Row> {
    [loss_options_rows(), launch_rows(true), rows![
        "inputs.struct_size short": |f| f.d_li.struct_size -= 4 => CARE_ERR_STRUCT_SIZE,
        "inputs.dtype unknown": |f| f.d_li.dtype = 3 => CARE_ERR_INVALID_ARGUMENT,
        "inputs.logp NULL": |f| f.d_li.logp = null() => CARE_ERR_NULL_POINTER,
        "inputs.logp_old_len != T": |f| f.d_li.logp_old_len = 4 => CARE_ERR_LENGTH_MISMATCH,
        "inputs.logp_old misaligned for its dtype": |f| {
            f.d_li.logp_old = 0x1002 as *const c_void
        } => CARE_ERR_INVALID_ARGUMENT,
        "inputs.seq_offsets NULL": |f| f.d_li.seq_offsets = null() => CARE_ERR_NULL_POINTER,
        "inputs: no sequence offsets": |f| f.d_li.seq_offsets_len = 0 => CARE_ERR_INVALID_LAYOUT,
        "inputs.mask_len != T": |f| f.d_li.mask_len = 4 => CARE_ERR_LENGTH_MISMATCH,
        "advantages_len != B": |f| f.d_li.advantages_len = 1 => CARE_ERR_LENGTH_MISMATCH,
        "unknown adv. kind": |f| f.d_li.advantages_kind = 7 => CARE_ERR_INVALID_ARGUMENT,
        "inputs.logp_rollout NULL with a length": |f| {
            f.d_li.logp_rollout_len = T_TOK
        } => CARE_ERR_NULL_POINTER,
        "inputs.logp_rollout_len != T": |f| {
            f.d_li.logp_rollout = fake();
            f.d_li.logp_rollout_len = 4
        } => CARE_ERR_LENGTH_MISMATCH,
        "inputs.logp_rollout misaligned": |f| {
            f.d_li.logp_rollout = 0x1001 as *const c_void;
            f.d_li.logp_rollout_len = T_TOK
        } => CARE_ERR_INVALID_ARGUMENT,
        "options.policy_loss Clip-Cov, workspace without room for its selection": |f| {
            f.lo.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_CLIP_COV as u32
        } => CARE_ERR_BUFFER_TOO_SMALL,
        "options.policy_loss KL-Cov, workspace without room for its selection": |f| {
            f.lo.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_KL_COV as u32
        } => CARE_ERR_BUFFER_TOO_SMALL,
    ]].concat()
}

/// The faults of a `care_token_rewards` on the device that the host can see (the offsets'
/// contents live in device memory: the kernels report those).
fn device_token_rows() -> Vec<Row> {
    rows![
        "inputs.struct_size short": |f| {
            f.tr.struct_size -= 8;
            f.tr_ret.struct_size -= 8
        } => CARE_ERR_STRUCT_SIZE,
        "inputs.token_rewards NULL": |f| {
            f.tr.token_rewards = null();
            f.tr_ret.token_rewards = null()
        } => CARE_ERR_NULL_POINTER,
        "inputs.token_rewards misaligned": |f| {
            f.tr.token_rewards = 0x1002 as *const f32;
            f.tr_ret.token_rewards = 0x1002 as *const f32
        } => CARE_ERR_INVALID_ARGUMENT,
        "inputs.seq_offsets NULL": |f| {
            f.tr.seq_offsets = null();
            f.tr_ret.seq_offsets = null()
        } => CARE_ERR_NULL_POINTER,
        "inputs: no sequence offsets": |f| {
            f.tr.seq_offsets_len = 0;
            f.tr_ret.seq_offsets_len = 0
        } => CARE_ERR_INVALID_LAYOUT,
        "inputs: no sequence but T tokens": |f| {
            f.tr.seq_offsets_len = 1;
            f.tr_ret.seq_offsets_len = 1
        } => CARE_ERR_INVALID_LAYOUT,
        "inputs.mask NULL": |f| {
            f.tr.mask = null();
            f.tr_ret.mask = null()
        } => CARE_ERR_NULL_POINTER,
        "inputs.mask_len != T": |f| {
            f.tr.mask_len = 4;
            f.tr_ret.mask_len = 4
        } => CARE_ERR_LENGTH_MISMATCH,
    ]
}

/// The tables of the GPU entry points, on fake device addresses: every fault is found before
/// any driver call. The valid call gives `CARE_ERR_CUDA_UNAVAILABLE` without a driver; with
/// one it is not made (it would launch on the fake addresses).
fn gpu_cases() -> Vec<Case> {
    // SAFETY (every call below): host structs are valid; device addresses are never touched.
    let cases = vec![
        case! { |f, k| care_gpu_group_advantages(
                p(k, 0, &f.d_rw), p(k, 1, &f.d_layout), &f.ao, p(k, 2, &f.d_ado), f.d_batch_std,
                p(k, 3, &f.launch)), 4,
            [advantage_options_rows(), launch_rows(true), rows![
                "rewards.struct_size short": |f| f.d_rw.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "rewards.rewards NULL": |f| f.d_rw.rewards = null() => CARE_ERR_NULL_POINTER,
                "rewards.valid_len != N": |f| f.d_rw.valid_len = 7 => CARE_ERR_LENGTH_MISMATCH,
                "rewards misaligned": |f| f.d_rw.rewards = 0x1002 as *const f32 => CARE_ERR_INVALID_ARGUMENT,
                "layout.struct_size short": |f| f.d_layout.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "layout: G does not divide N": |f| f.d_layout.group_size = 3 => CARE_ERR_INVALID_LAYOUT,
                "layout: G 0": |f| f.d_layout.group_size = 0 => CARE_ERR_INVALID_LAYOUT,
                "layout: G and offsets": |f| {
                    f.d_layout.offsets = fake();
                    f.d_layout.offsets_len = 3
                } => CARE_ERR_INVALID_ARGUMENT,
                "layout.offsets NULL": |f| f.d_layout.offsets_len = 3 => CARE_ERR_NULL_POINTER,
                "outputs.struct_size short": |f| f.d_ado.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "outputs.advantages NULL": |f| f.d_ado.advantages = null_mut() => CARE_ERR_NULL_POINTER,
                "advantages_len != N": |f| f.d_ado.advantages_len = 7 => CARE_ERR_LENGTH_MISMATCH,
                "stats_len != B": |f| f.d_ado.stats_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "batch_std misaligned": |f| f.d_batch_std = 0x1001 as *const f32 => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_gpu_group_advantages_status(p(k, 0, &f.launch)), 1, launch_rows(true) },
        case! { |f, k| care_gpu_loss_stats_reset(
                m(k, 0, fake::<c_void>()), f.d_stats_len, p(k, 1, &f.launch)), 2,
            [launch_rows(false), rows![
                "stats_len != CARE_GPU_LOSS_STATS_BYTES": |f| f.d_stats_len = 8 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_loss_stats_read(
                p(k, 0, fake::<c_void>()), f.d_stats_len, p(k, 1, &f.launch),
                m(k, 2, &raw mut f.stats)), 3,
            [launch_rows(false), rows![
                "stats_len != CARE_GPU_LOSS_STATS_BYTES": |f| f.d_stats_len = 64 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_policy_loss(
                p(k, 0, &f.d_li), &f.lo, fake(), f.d_grad_len, f.grad_dtype, fake(),
                f.d_stats_len, p(k, 1, &f.launch)), 2,
            [gpu_loss_rows(), rows![
                "grad_len != T": |f| f.d_grad_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "grad_dtype unknown": |f| f.grad_dtype = 3 => CARE_ERR_INVALID_ARGUMENT,
                "grad_dtype neither f32 nor the inputs'": |f| f.grad_dtype = 1 => CARE_ERR_INVALID_ARGUMENT,
                "stats_len != CARE_GPU_LOSS_STATS_BYTES": |f| f.d_stats_len = 8 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_policy_loss_into(
                p(k, 0, &f.d_li), &f.lo, p(k, 1, &f.d_glo), p(k, 2, &f.launch)), 3,
            [gpu_loss_rows(), rows![
                "outputs.struct_size short": |f| f.d_glo.struct_size -= 8 => CARE_ERR_STRUCT_SIZE,
                "outputs.grad_len != T": |f| f.d_glo.grad_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "outputs.grad NULL with a length": |f| f.d_glo.grad = null_mut() => CARE_ERR_NULL_POINTER,
                "outputs.grad_dtype unknown": |f| f.d_glo.grad_dtype = 3 => CARE_ERR_INVALID_ARGUMENT,
                "outputs.grad_dtype neither f32 nor the inputs'": |f| {
                    f.d_glo.grad_dtype = 1
                } => CARE_ERR_INVALID_ARGUMENT,
                "outputs.stats_len != CARE_GPU_LOSS_STATS_BYTES": |f| {
                    f.d_glo.stats_len = 8
                } => CARE_ERR_LENGTH_MISMATCH,
                "outputs.rollout_stats_len != CARE_GPU_ROLLOUT_STATS_BYTES": |f| {
                    f.d_glo.rollout_stats_len = CARE_GPU_LOSS_STATS_BYTES
                } => CARE_ERR_LENGTH_MISMATCH,
                "outputs.rollout_stats NULL with a length": |f| {
                    f.d_glo.rollout_stats = null_mut()
                } => CARE_ERR_NULL_POINTER,
                "outputs.rollout_stats misaligned": |f| {
                    f.d_glo.rollout_stats = 0x1002 as *mut c_void
                } => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_gpu_rollout_stats_reset(
                m(k, 0, fake::<c_void>()), f.d_rstats_len, p(k, 1, &f.launch)), 2,
            [launch_rows(false), rows![
                "rollout_stats_len != CARE_GPU_ROLLOUT_STATS_BYTES": |f| {
                    f.d_rstats_len = CARE_GPU_LOSS_STATS_BYTES
                } => CARE_ERR_LENGTH_MISMATCH,
                "rollout_stats_len 0": |f| f.d_rstats_len = 0 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_rollout_stats_read(
                p(k, 0, fake::<c_void>()), f.d_rstats_len, p(k, 1, &f.launch),
                m(k, 2, &raw mut f.rollout_stats)), 3,
            [launch_rows(false), rows![
                "rollout_stats_len != CARE_GPU_ROLLOUT_STATS_BYTES": |f| {
                    f.d_rstats_len = 56
                } => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_discounted_returns(
                p(k, 0, &f.tr_ret), &f.gae_o, m(k, 1, f.gae_ret.as_mut_ptr()), f.gae_ret.len(),
                p(k, 2, &f.launch)), 3,
            [gae_options_rows(), launch_rows(true), device_token_rows(), rows![
                "inputs.values given": |f| {
                    f.tr_ret.values = f.tr_values.as_ptr();
                    f.tr_ret.values_len = T_TOK
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.values NULL with a length": |f| f.tr_ret.values_len = T_TOK => CARE_ERR_INVALID_ARGUMENT,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_gae(
                p(k, 0, &f.tr), &f.gae_o, m(k, 1, f.gae_adv.as_mut_ptr()), f.gae_adv.len(),
                m(k, 2, f.gae_ret.as_mut_ptr()), f.gae_ret.len(), p(k, 3, &f.launch)), 4,
            [gae_options_rows(), launch_rows(true), device_token_rows(), rows![
                "inputs.values NULL": |f| f.tr.values = null() => CARE_ERR_NULL_POINTER,
                "inputs.values (NULL, 0)": |f| {
                    f.tr.values = null();
                    f.tr.values_len = 0
                } => CARE_ERR_NULL_POINTER,
                "inputs.values_len != T": |f| f.tr.values_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.values misaligned": |f| f.tr.values = 0x1001 as *const f32 => CARE_ERR_INVALID_ARGUMENT,
                "advantages_len != T": |f| f.gae_adv.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_gae_status(p(k, 0, &f.launch)), 1, launch_rows(true) },
        case! { |f, k| care_gpu_whiten(
                m(k, 0, f.wh_values.as_mut_ptr()), f.wh_values.len(), f.tok_mask.as_ptr(),
                f.tok_mask.len(), &f.wo, p(k, 1, &f.launch)), 2,
            [launch_rows(true), rows![
                "options.struct_size too small": |f| f.wo.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "options.std_kind unknown": |f| f.wo.std_kind = 2 => CARE_ERR_INVALID_ARGUMENT,
                "options.eps negative": |f| f.wo.eps = -1.0 => CARE_ERR_INVALID_ARGUMENT,
                "mask_len != values_len": |f| f.tok_mask.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_whiten_status(p(k, 0, &f.launch), &raw mut f.wh_mean, &raw mut f.wh_std), 1,
            launch_rows(true)
        },
        case! { |f, k| care_gpu_discounted_returns_whitened(
                p(k, 0, &f.tr_ret), &f.gae_o, &f.wo, m(k, 1, f.gae_adv.as_mut_ptr()),
                f.gae_adv.len(), m(k, 2, f.gae_ret.as_mut_ptr()), f.gae_ret.len(),
                p(k, 3, &f.launch)), 4,
            [gae_options_rows(), whiten_options_rows(), launch_rows(true), device_token_rows(), rows![
                "inputs.values given": |f| {
                    f.tr_ret.values = f.tr_values.as_ptr();
                    f.tr_ret.values_len = T_TOK
                } => CARE_ERR_INVALID_ARGUMENT,
                "advantages_len != T": |f| f.gae_adv.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "launch.workspace below care_gpu_whitened_workspace_bytes": |f| {
                    f.launch.workspace_len = CARE_GPU_WORKSPACE_BYTES
                } => CARE_ERR_BUFFER_TOO_SMALL,
            ]].concat()
        },
        case! { |f, k| care_gpu_gae_whitened(
                p(k, 0, &f.tr), &f.gae_o, &f.wo, m(k, 1, f.gae_adv.as_mut_ptr()), f.gae_adv.len(),
                m(k, 2, f.gae_ret.as_mut_ptr()), f.gae_ret.len(), p(k, 3, &f.launch)), 4,
            [gae_options_rows(), whiten_options_rows(), launch_rows(true), device_token_rows(), rows![
                "inputs.values NULL": |f| f.tr.values = null() => CARE_ERR_NULL_POINTER,
                "inputs.values_len != T": |f| f.tr.values_len = 4 => CARE_ERR_LENGTH_MISMATCH,
                "options.masked_token reset (GAE skips)": |f| {
                    f.gae_o.masked_token = care_masked_token::CARE_MASKED_TOKEN_RESET as u32
                } => CARE_ERR_INVALID_ARGUMENT,
                "advantages_len != T": |f| f.gae_adv.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "returns_len != T": |f| f.gae_ret.truncate(4) => CARE_ERR_LENGTH_MISMATCH,
                "launch.workspace below care_gpu_whitened_workspace_bytes": |f| {
                    f.launch.workspace_len = CARE_GPU_WORKSPACE_BYTES
                } => CARE_ERR_BUFFER_TOO_SMALL,
            ]].concat()
        },
        case! { |f, k| care_gpu_whitened_status(p(k, 0, &f.launch), &raw mut f.wh_mean, &raw mut f.wh_std), 1,
            launch_rows(true)
        },
        case! { |f, k| care_gpu_selective_log_softmax(
                p(k, 0, &f.d_lg), p(k, 1, &f.d_lsm_out), p(k, 2, &f.launch)), 3,
            [device_logits_rows(), launch_rows(true), rows![
                "outputs.struct_size short": |f| f.d_lsm_out.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "outputs.logp NULL": |f| f.d_lsm_out.logp = null_mut() => CARE_ERR_NULL_POINTER,
                "outputs.logp_len != rows": |f| f.d_lsm_out.logp_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "entropy_len != rows": |f| f.d_lsm_out.entropy_len = 1 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_selective_log_softmax_status(p(k, 0, &f.launch)), 1,
            launch_rows(true)
        },
        case! { |f, k| care_gpu_selective_log_softmax_backward(
                p(k, 0, &f.d_lg), p(k, 1, &f.d_grads), m(k, 2, fake::<c_void>()), f.d_dlogits_len,
                f.d_dlogits_stride, p(k, 3, &f.launch)), 4,
            [device_logits_rows(), launch_rows(false), rows![
                "grads.struct_size short": |f| f.d_grads.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "grads.lse (NULL, 0)": |f| {
                    f.d_grads.lse = null();
                    f.d_grads.lse_len = 0
                } => CARE_ERR_NULL_POINTER,
                "dentropy without entropy": |f| {
                    f.d_grads.entropy = null();
                    f.d_grads.entropy_len = 0
                } => CARE_ERR_INVALID_ARGUMENT,
                "grads.dlogp_len != rows": |f| f.d_grads.dlogp_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "dlogits_len short": |f| f.d_dlogits_len = 5 => CARE_ERR_LENGTH_MISMATCH,
                "dlogits stride < vocab": |f| f.d_dlogits_stride = 2 => CARE_ERR_INVALID_ARGUMENT,
            ]].concat()
        },
        case! { |f, k| care_gpu_logits_policy_loss(
                p(k, 0, &f.d_lg), p(k, 1, &f.d_lli), &f.lo, p(k, 2, &f.d_llo), fake(),
                f.d_stats_len, p(k, 3, &f.launch)), 4,
            [device_logits_rows(), loss_options_rows(), launch_rows(true), rows![
                "inputs.logp given": |f| {
                    f.d_lli.logp = fake();
                    f.d_lli.logp_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.mask given": |f| {
                    f.d_lli.mask = fake();
                    f.d_lli.mask_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.dtype not f32": |f| f.d_lli.dtype = 2 => CARE_ERR_INVALID_ARGUMENT,
                "inputs.logp_rollout given (no rollout correction here)": |f| {
                    f.d_lli.logp_rollout = fake();
                    f.d_lli.logp_rollout_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "options.policy_loss Clip-Cov (no covariance selection in the fused path)": |f| {
                    f.lo.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_CLIP_COV as u32
                } => CARE_ERR_INVALID_ARGUMENT,
                "options.policy_loss KL-Cov (no covariance selection in the fused path)": |f| {
                    f.lo.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_KL_COV as u32
                } => CARE_ERR_INVALID_ARGUMENT,
                "logp_old_len != rows": |f| f.d_lli.logp_old_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.advantages NULL": |f| f.d_lli.advantages = null() => CARE_ERR_NULL_POINTER,
                "outputs.struct_size short": |f| f.d_llo.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "outputs.lse (NULL, 0)": |f| {
                    f.d_llo.lse = null_mut();
                    f.d_llo.lse_len = 0
                } => CARE_ERR_NULL_POINTER,
                "outputs.dlogp_len != rows": |f| f.d_llo.dlogp_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "stats_len != CARE_GPU_LOSS_STATS_BYTES": |f| f.d_stats_len = 8 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
        case! { |f, k| care_gpu_logits_policy_loss_fused(
                p(k, 0, &f.d_lg), p(k, 1, &f.d_lli), &f.lo, p(k, 2, &f.d_flo), p(k, 3, &f.launch)), 4,
            [device_logits_rows(), loss_options_rows(), launch_rows(true), rows![
                "inputs.logp given": |f| {
                    f.d_lli.logp = fake();
                    f.d_lli.logp_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.mask given": |f| {
                    f.d_lli.mask = fake();
                    f.d_lli.mask_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "inputs.dtype not f32": |f| f.d_lli.dtype = 2 => CARE_ERR_INVALID_ARGUMENT,
                "inputs.logp_rollout given": |f| {
                    f.d_lli.logp_rollout = fake();
                    f.d_lli.logp_rollout_len = 2
                } => CARE_ERR_INVALID_ARGUMENT,
                "options.policy_loss GMPO (a sequence-level loss)": |f| {
                    f.lo.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_GMPO as u32
                } => CARE_ERR_INVALID_ARGUMENT,
                "options.policy_loss VESPO (a sequence-level loss)": |f| {
                    f.lo.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_VESPO as u32
                } => CARE_ERR_INVALID_ARGUMENT,
                "options.ratio_level sequence": |f| f.lo.ratio_level = 1 => CARE_ERR_INVALID_ARGUMENT,
                "options.bypass on (needs the rollout log-probs)": |f| f.lo.bypass = 1 => CARE_ERR_INVALID_ARGUMENT,
                "logp_old_len != rows": |f| f.d_lli.logp_old_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "inputs.advantages NULL": |f| f.d_lli.advantages = null() => CARE_ERR_NULL_POINTER,
                "outputs.struct_size short": |f| f.d_flo.struct_size = 4 => CARE_ERR_STRUCT_SIZE,
                "outputs.dlogits NULL": |f| f.d_flo.dlogits = null_mut() => CARE_ERR_NULL_POINTER,
                "outputs.dlogits_len short": |f| f.d_flo.dlogits_len = 5 => CARE_ERR_LENGTH_MISMATCH,
                "outputs.dlogits stride < vocab": |f| f.d_flo.dlogits_row_stride = 2 => CARE_ERR_INVALID_ARGUMENT,
                "outputs in place with another stride": |f| {
                    f.d_flo.dlogits_row_stride = 4;
                    f.d_flo.dlogits_len = 7
                } => CARE_ERR_INVALID_ARGUMENT,
                "outputs.logp_len != rows": |f| f.d_flo.logp_len = 1 => CARE_ERR_LENGTH_MISMATCH,
                "outputs.lse_len != rows": |f| f.d_flo.lse_len = 3 => CARE_ERR_LENGTH_MISMATCH,
                "outputs.stats_len != CARE_GPU_LOSS_STATS_BYTES": |f| f.d_flo.stats_len = 8 => CARE_ERR_LENGTH_MISMATCH,
            ]].concat()
        },
    ];
    // SAFETY: no pointer arguments.
    let gpu = care_gpu_available() == CARE_OK;
    cases
        .into_iter()
        .map(|c| Case {
            valid: if gpu {
                None
            } else {
                Some(CARE_ERR_CUDA_UNAVAILABLE)
            },
            writes: false,
            ..c
        })
        .collect()
}
