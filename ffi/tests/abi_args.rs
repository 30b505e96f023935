//! Every exported function, called with each required pointer NULL and with mismatched
//! lengths, returns the documented code and leaves its outputs untouched; `_free(NULL)` is a
//! no-op. The test ends by checking that it called every function `care.h` declares.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
#![allow(clippy::too_many_lines)]

mod common;

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void};
use std::ptr::{null, null_mut};

use care_ffi::advantage::*;
use care_ffi::gpu::*;
use care_ffi::loss::*;
use care_ffi::reward::*;
use care_ffi::rubric::*;
use care_ffi::version::*;
use care_ffi::{care_result, result::care_result_message};

use care_result::*;

/// Records which functions were exercised.
struct Cover(BTreeSet<String>);

impl Cover {
    /// `f(None)` is a valid call and must give `ok`; `f(Some(i))` sets required pointer `i` to
    /// NULL and must give `CARE_ERR_NULL_POINTER`.
    fn nulls(
        &mut self,
        name: &str,
        required: usize,
        ok: care_result,
        mut f: impl FnMut(Option<usize>) -> care_result,
    ) {
        assert_eq!(f(None), ok, "{name}: the valid call");
        for i in 0..required {
            assert_eq!(
                f(Some(i)),
                CARE_ERR_NULL_POINTER,
                "{name}: required pointer #{i} is NULL"
            );
        }
        self.0.insert(name.to_string());
    }

    fn saw(&mut self, name: &str) {
        self.0.insert(name.to_string());
    }
}

/// `v`, or NULL when `k` selects pointer `i`.
fn p<T>(k: Option<usize>, i: usize, v: *const T) -> *const T {
    if k == Some(i) { null() } else { v }
}

fn m<T>(k: Option<usize>, i: usize, v: *mut T) -> *mut T {
    if k == Some(i) { null_mut() } else { v }
}

fn rubric_text() -> Vec<u8> {
    common::fixture("rubric_sft_1.json")
}

fn parse(text: &[u8]) -> *const care_rubric {
    let mut r: *const care_rubric = null();
    // SAFETY: valid pointers.
    let code = unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut r) };
    assert_eq!(code, CARE_OK);
    r
}

/// A fake, aligned device address: GPU functions must reject arguments before touching it.
fn fake<T>() -> *mut T {
    0x1000 as *mut T
}

#[test]
fn every_exported_function_checks_pointers_and_lengths() {
    let mut cov = Cover(BTreeSet::new());
    let text = rubric_text();
    let rubric = parse(&text);
    let total = 8usize; // rubric_sft_1: 3 + 2 + 3 criteria

    // ---- versions and codes (no pointer arguments) -------------------------------------------
    assert!(!care_version().is_null());
    assert_eq!(care_abi_version(), CARE_ABI_VERSION);
    assert!(!care_result_message(123_456).is_null());
    cov.saw("care_version");
    cov.saw("care_abi_version");
    cov.saw("care_result_message");

    // SAFETY (whole test): every non-NULL pointer is valid for its stated length.
    unsafe {
        // ---- option initializers -------------------------------------------------------------
        let mut ao = std::mem::zeroed::<care_advantage_options>();
        cov.nulls("care_advantage_options_default", 1, CARE_OK, |k| {
            care_advantage_options_default(m(k, 0, &raw mut ao))
        });
        cov.nulls("care_advantage_options_preset", 1, CARE_OK, |k| {
            care_advantage_options_preset(1, m(k, 0, &raw mut ao))
        });
        assert_eq!(
            care_advantage_options_preset(99, &mut ao),
            CARE_ERR_INVALID_ARGUMENT
        );
        cov.nulls("care_advantage_options_preset_by_name", 2, CARE_OK, |k| {
            care_advantage_options_preset_by_name(
                p(k, 0, c"rloo".as_ptr()),
                4,
                m(k, 1, &raw mut ao),
            )
        });
        assert_eq!(
            care_advantage_options_preset_by_name(c"grpo".as_ptr(), 4, &mut ao),
            CARE_ERR_INVALID_ARGUMENT
        );
        let mut lo = std::mem::zeroed::<care_loss_options>();
        cov.nulls("care_loss_options_default", 1, CARE_OK, |k| {
            care_loss_options_default(m(k, 0, &raw mut lo))
        });
        cov.nulls("care_loss_options_preset", 1, CARE_OK, |k| {
            care_loss_options_preset(0, m(k, 0, &raw mut lo))
        });
        assert_eq!(
            care_loss_options_preset(2, &mut lo),
            CARE_ERR_INVALID_ARGUMENT
        );
        cov.nulls("care_loss_options_preset_by_name", 2, CARE_OK, |k| {
            care_loss_options_preset_by_name(p(k, 0, c"verl".as_ptr()), 4, m(k, 1, &raw mut lo))
        });
        let mut so = std::mem::zeroed::<care_score_options>();
        cov.nulls("care_score_options_default", 1, CARE_OK, |k| {
            care_score_options_default(m(k, 0, &raw mut so))
        });
        let mut po = std::mem::zeroed::<care_pref_options>();
        cov.nulls("care_pref_options_default", 1, CARE_OK, |k| {
            care_pref_options_default(m(k, 0, &raw mut po))
        });
        let mut go = std::mem::zeroed::<care_generator_options>();
        cov.nulls("care_generator_options_default", 1, CARE_OK, |k| {
            care_generator_options_default(m(k, 0, &raw mut go))
        });
        let mut fp = std::mem::zeroed::<care_format_policy>();
        cov.nulls("care_format_policy_default", 1, CARE_OK, |k| {
            care_format_policy_default(m(k, 0, &raw mut fp))
        });
        cov.nulls("care_format_policy_lenient", 1, CARE_OK, |k| {
            care_format_policy_lenient(m(k, 0, &raw mut fp))
        });

        // A struct_size too small for what the library reads is refused.
        let mut small = ao;
        small.struct_size = 4;
        let r = [1.0f32, 2.0];
        let mut a = [0f32; 2];
        assert_eq!(
            care_group_advantages(
                r.as_ptr(),
                2,
                null(),
                0,
                2,
                null(),
                0,
                &small,
                a.as_mut_ptr(),
                2,
                null_mut(),
                0
            ),
            CARE_ERR_STRUCT_SIZE
        );

        // ---- advantages ----------------------------------------------------------------------
        let rewards = [1.0f32, 2.0, 3.0, 5.0];
        let valid = [1u8; 4];
        let offs = [0u32, 2, 4];
        let mut adv = [7f32; 4];
        let mut stats = [std::mem::zeroed::<care_group_stats>(); 2];
        cov.nulls("care_group_advantages", 5, CARE_OK, |k| {
            care_group_advantages(
                p(k, 0, rewards.as_ptr()),
                4,
                p(k, 1, valid.as_ptr()),
                4,
                0,
                p(k, 2, offs.as_ptr()),
                3,
                null(),
                m(k, 3, adv.as_mut_ptr()),
                4,
                m(k, 4, stats.as_mut_ptr()),
                2,
            )
        });
        adv = [7.0; 4];
        for (code, call) in [
            (
                CARE_ERR_LENGTH_MISMATCH,
                care_group_advantages(
                    rewards.as_ptr(),
                    4,
                    valid.as_ptr(),
                    3,
                    2,
                    null(),
                    0,
                    null(),
                    adv.as_mut_ptr(),
                    4,
                    null_mut(),
                    0,
                ),
            ),
            (
                CARE_ERR_LENGTH_MISMATCH,
                care_group_advantages(
                    rewards.as_ptr(),
                    4,
                    null(),
                    0,
                    2,
                    null(),
                    0,
                    null(),
                    adv.as_mut_ptr(),
                    3,
                    null_mut(),
                    0,
                ),
            ),
            (
                CARE_ERR_LENGTH_MISMATCH,
                care_group_advantages(
                    rewards.as_ptr(),
                    4,
                    null(),
                    0,
                    2,
                    null(),
                    0,
                    null(),
                    adv.as_mut_ptr(),
                    4,
                    stats.as_mut_ptr(),
                    1,
                ),
            ),
            (
                CARE_ERR_INVALID_LAYOUT,
                care_group_advantages(
                    rewards.as_ptr(),
                    4,
                    null(),
                    0,
                    3,
                    null(),
                    0,
                    null(),
                    adv.as_mut_ptr(),
                    4,
                    null_mut(),
                    0,
                ),
            ),
            (
                CARE_ERR_INVALID_ARGUMENT,
                care_group_advantages(
                    rewards.as_ptr(),
                    4,
                    null(),
                    0,
                    2,
                    offs.as_ptr(),
                    3,
                    null(),
                    adv.as_mut_ptr(),
                    4,
                    null_mut(),
                    0,
                ),
            ),
        ] {
            assert_eq!(call, code);
        }
        assert_eq!(adv, [7.0; 4], "outputs are untouched on failure");

        let mut sums = [care_group_sums {
            count: 0.0,
            sum: 0.0,
        }; 2];
        cov.nulls("care_group_partial_sums", 2, CARE_OK, |k| {
            care_group_partial_sums(
                p(k, 0, rewards.as_ptr()),
                4,
                null(),
                0,
                2,
                null(),
                0,
                m(k, 1, sums.as_mut_ptr()),
                2,
            )
        });
        assert_eq!(
            care_group_partial_sums(
                rewards.as_ptr(),
                4,
                null(),
                0,
                2,
                null(),
                0,
                sums.as_mut_ptr(),
                1
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        let mut m2 = [0f64; 2];
        cov.nulls("care_group_partial_squares", 3, CARE_OK, |k| {
            care_group_partial_squares(
                p(k, 0, rewards.as_ptr()),
                4,
                null(),
                0,
                2,
                null(),
                0,
                p(k, 1, sums.as_ptr()),
                2,
                m(k, 2, m2.as_mut_ptr()),
                2,
            )
        });
        assert_eq!(
            care_group_partial_squares(
                rewards.as_ptr(),
                4,
                null(),
                0,
                2,
                null(),
                0,
                sums.as_ptr(),
                1,
                m2.as_mut_ptr(),
                2
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        cov.nulls("care_group_advantages_finalize", 4, CARE_OK, |k| {
            care_group_advantages_finalize(
                p(k, 0, rewards.as_ptr()),
                4,
                null(),
                0,
                2,
                null(),
                0,
                p(k, 1, sums.as_ptr()),
                2,
                p(k, 2, m2.as_ptr()),
                2,
                null(),
                m(k, 3, adv.as_mut_ptr()),
                4,
                null_mut(),
                0,
            )
        });
        assert_eq!(
            care_group_advantages_finalize(
                rewards.as_ptr(),
                4,
                null(),
                0,
                2,
                null(),
                0,
                sums.as_ptr(),
                2,
                m2.as_ptr(),
                1,
                null(),
                adv.as_mut_ptr(),
                4,
                null_mut(),
                0,
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        let seq = [0u32, 3, 5];
        let mut tok = [0f32; 5];
        let seq_adv = [1.0f32, -1.0];
        cov.nulls("care_broadcast_to_tokens", 3, CARE_OK, |k| {
            care_broadcast_to_tokens(
                p(k, 0, seq_adv.as_ptr()),
                2,
                p(k, 1, seq.as_ptr()),
                3,
                null(),
                0,
                m(k, 2, tok.as_mut_ptr()),
                5,
            )
        });
        assert_eq!(
            care_broadcast_to_tokens(
                seq_adv.as_ptr(),
                1,
                seq.as_ptr(),
                3,
                null(),
                0,
                tok.as_mut_ptr(),
                5
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        // A NULL pointer with a non-zero length is NULL even for an optional input.
        assert_eq!(
            care_broadcast_to_tokens(
                seq_adv.as_ptr(),
                2,
                seq.as_ptr(),
                3,
                null(),
                5,
                tok.as_mut_ptr(),
                5
            ),
            CARE_ERR_NULL_POINTER
        );

        // ---- loss ------------------------------------------------------------------------------
        let logp = [-1.0f32, -1.2, -0.7, -2.0, -0.1];
        let old = [-1.1f32, -1.0, -0.7, -1.5, -0.2];
        let mask = [1u8, 1, 0, 1, 1];
        let mut grad = [9f32; 5];
        let mut loss = 42.0f64;
        let mut st = std::mem::zeroed::<care_loss_stats>();
        cov.nulls("care_policy_loss_f32", 5, CARE_OK, |k| {
            care_policy_loss_f32(
                p(k, 0, logp.as_ptr()),
                5,
                old.as_ptr(),
                5,
                null(),
                0,
                p(k, 1, seq.as_ptr()),
                3,
                mask.as_ptr(),
                5,
                p(k, 2, seq_adv.as_ptr()),
                2,
                0,
                null(),
                m(k, 3, grad.as_mut_ptr()),
                5,
                m(k, 4, &raw mut loss),
                &raw mut st,
            )
        });
        grad = [9.0; 5];
        loss = 42.0;
        for (code, call) in [
            (
                CARE_ERR_LENGTH_MISMATCH,
                care_policy_loss_f32(
                    logp.as_ptr(),
                    5,
                    old.as_ptr(),
                    4,
                    null(),
                    0,
                    seq.as_ptr(),
                    3,
                    null(),
                    0,
                    seq_adv.as_ptr(),
                    2,
                    0,
                    null(),
                    grad.as_mut_ptr(),
                    5,
                    &mut loss,
                    null_mut(),
                ),
            ),
            (
                CARE_ERR_LENGTH_MISMATCH,
                care_policy_loss_f32(
                    logp.as_ptr(),
                    5,
                    null(),
                    0,
                    null(),
                    0,
                    seq.as_ptr(),
                    3,
                    mask.as_ptr(),
                    4,
                    seq_adv.as_ptr(),
                    2,
                    0,
                    null(),
                    grad.as_mut_ptr(),
                    5,
                    &mut loss,
                    null_mut(),
                ),
            ),
            (
                CARE_ERR_LENGTH_MISMATCH,
                care_policy_loss_f32(
                    logp.as_ptr(),
                    5,
                    null(),
                    0,
                    null(),
                    0,
                    seq.as_ptr(),
                    3,
                    null(),
                    0,
                    seq_adv.as_ptr(),
                    2,
                    1,
                    null(),
                    grad.as_mut_ptr(),
                    5,
                    &mut loss,
                    null_mut(),
                ),
            ),
            (
                CARE_ERR_LENGTH_MISMATCH,
                care_policy_loss_f32(
                    logp.as_ptr(),
                    5,
                    null(),
                    0,
                    null(),
                    0,
                    seq.as_ptr(),
                    3,
                    null(),
                    0,
                    seq_adv.as_ptr(),
                    2,
                    0,
                    null(),
                    grad.as_mut_ptr(),
                    4,
                    &mut loss,
                    null_mut(),
                ),
            ),
            (
                CARE_ERR_INVALID_LAYOUT,
                care_policy_loss_f32(
                    logp.as_ptr(),
                    5,
                    null(),
                    0,
                    null(),
                    0,
                    [0u32, 3, 4].as_ptr(),
                    3,
                    null(),
                    0,
                    seq_adv.as_ptr(),
                    2,
                    0,
                    null(),
                    grad.as_mut_ptr(),
                    5,
                    &mut loss,
                    null_mut(),
                ),
            ),
            (
                CARE_ERR_INVALID_ARGUMENT,
                care_policy_loss_f32(
                    logp.as_ptr(),
                    5,
                    null(),
                    0,
                    null(),
                    0,
                    seq.as_ptr(),
                    3,
                    null(),
                    0,
                    seq_adv.as_ptr(),
                    2,
                    7,
                    null(),
                    grad.as_mut_ptr(),
                    5,
                    &mut loss,
                    null_mut(),
                ),
            ),
        ] {
            assert_eq!(call, code);
        }
        assert_eq!(
            (grad, loss),
            ([9.0; 5], 42.0),
            "outputs are untouched on failure"
        );
        let h: Vec<u16> = logp
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        let f: Vec<u16> = logp
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        cov.nulls("care_policy_loss_bf16", 5, CARE_OK, |k| {
            care_policy_loss_bf16(
                p(k, 0, h.as_ptr()),
                5,
                null(),
                0,
                null(),
                0,
                p(k, 1, seq.as_ptr()),
                3,
                null(),
                0,
                p(k, 2, seq_adv.as_ptr()),
                2,
                0,
                null(),
                m(k, 3, grad.as_mut_ptr()),
                5,
                m(k, 4, &raw mut loss),
                null_mut(),
            )
        });
        assert_eq!(
            care_policy_loss_bf16(
                h.as_ptr(),
                5,
                h.as_ptr(),
                3,
                null(),
                0,
                seq.as_ptr(),
                3,
                null(),
                0,
                seq_adv.as_ptr(),
                2,
                0,
                null(),
                grad.as_mut_ptr(),
                5,
                &mut loss,
                null_mut()
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        cov.nulls("care_policy_loss_f16", 5, CARE_OK, |k| {
            care_policy_loss_f16(
                p(k, 0, f.as_ptr()),
                5,
                null(),
                0,
                null(),
                0,
                p(k, 1, seq.as_ptr()),
                3,
                null(),
                0,
                p(k, 2, seq_adv.as_ptr()),
                2,
                0,
                null(),
                m(k, 3, grad.as_mut_ptr()),
                5,
                m(k, 4, &raw mut loss),
                null_mut(),
            )
        });
        assert_eq!(
            care_policy_loss_f16(
                f.as_ptr(),
                5,
                null(),
                0,
                f.as_ptr(),
                4,
                seq.as_ptr(),
                3,
                null(),
                0,
                seq_adv.as_ptr(),
                2,
                0,
                null(),
                grad.as_mut_ptr(),
                5,
                &mut loss,
                null_mut()
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        let mut acc = std::mem::zeroed::<care_loss_stats>();
        cov.nulls("care_loss_stats_empty", 1, CARE_OK, |k| {
            care_loss_stats_empty(m(k, 0, &raw mut acc))
        });
        cov.nulls("care_loss_stats_add", 2, CARE_OK, |k| {
            care_loss_stats_add(m(k, 0, &raw mut acc), p(k, 1, &raw const st))
        });

        // ---- rubric ----------------------------------------------------------------------------
        let tp: *const c_char = text.as_ptr().cast();
        let mut r2: *const care_rubric = null();
        cov.nulls("care_rubric_parse", 2, CARE_OK, |k| {
            care_rubric_parse(p(k, 0, tp), text.len(), null(), m(k, 1, &raw mut r2))
        });
        care_rubric_free(r2);
        let mut bad_policy = fp;
        bad_policy.struct_size = 0;
        r2 = null();
        assert_eq!(
            care_rubric_parse(tp, text.len(), &bad_policy, &mut r2),
            CARE_ERR_STRUCT_SIZE
        );
        assert!(r2.is_null(), "no handle on failure");
        assert_eq!(
            care_rubric_parse(c"[1] x".as_ptr(), 5, null(), &mut r2),
            CARE_ERR_TRAILING_TEXT
        );
        assert_eq!(
            care_rubric_parse(c"nope".as_ptr(), 4, null(), &mut r2),
            CARE_ERR_NOT_JSON
        );
        assert_eq!(
            care_rubric_parse(c"\xff".as_ptr(), 1, null(), &mut r2),
            CARE_ERR_NOT_JSON
        );
        assert!(r2.is_null());
        cov.nulls("care_rubric_clone", 2, CARE_OK, |k| {
            care_rubric_clone(p(k, 0, rubric), m(k, 1, &raw mut r2))
        });
        care_rubric_free(r2);
        care_rubric_free(null());
        cov.saw("care_rubric_free");
        let mut w = [0f64; 3];
        cov.nulls("care_rubric_weights", 2, CARE_OK, |k| {
            care_rubric_weights(p(k, 0, rubric), m(k, 1, w.as_mut_ptr()), 3)
        });
        assert_eq!(
            care_rubric_weights(rubric, w.as_mut_ptr(), 2),
            CARE_ERR_LENGTH_MISMATCH
        );
        let mut counts = [0usize; 3];
        cov.nulls("care_rubric_criteria_counts", 2, CARE_OK, |k| {
            care_rubric_criteria_counts(p(k, 0, rubric), m(k, 1, counts.as_mut_ptr()), 3)
        });
        assert_eq!(
            care_rubric_criteria_counts(rubric, counts.as_mut_ptr(), 4),
            CARE_ERR_LENGTH_MISMATCH
        );
        let mut n = 0usize;
        cov.nulls("care_rubric_total_criteria", 2, CARE_OK, |k| {
            care_rubric_total_criteria(p(k, 0, rubric), m(k, 1, &raw mut n))
        });
        assert_eq!(n, total);
        let (mut t, mut tl, mut d, mut dl) = (null::<c_char>(), 0usize, null::<c_char>(), 0usize);
        cov.nulls("care_rubric_criterion", 5, CARE_OK, |k| {
            care_rubric_criterion(
                p(k, 0, rubric),
                1,
                0,
                m(k, 1, &raw mut t),
                m(k, 2, &raw mut tl),
                m(k, 3, &raw mut d),
                m(k, 4, &raw mut dl),
            )
        });
        assert_eq!(
            care_rubric_criterion(rubric, 1, 2, &mut t, &mut tl, &mut d, &mut dl),
            CARE_ERR_OUT_OF_RANGE
        );
        assert_eq!(
            care_rubric_criterion(rubric, 3, 0, &mut t, &mut tl, &mut d, &mut dl),
            CARE_ERR_INVALID_ARGUMENT
        );

        let mut rep: *mut care_validation_report = null_mut();
        cov.nulls("care_rubric_validate", 2, CARE_OK, |k| {
            care_validation_report_free(rep);
            rep = null_mut();
            care_rubric_validate(p(k, 0, tp), text.len(), null(), m(k, 1, &raw mut rep))
        });
        let mut fmt = 0.5;
        cov.nulls("care_r_fmt", 2, CARE_OK, |k| {
            care_r_fmt(p(k, 0, tp), text.len(), null(), m(k, 1, &raw mut fmt))
        });
        assert_eq!(fmt, 1.0);
        // A report with violations, for the accessors.
        let broken = br#"{"categories":[{"category":"Cognitive Empathy"}]}"#;
        care_validation_report_free(rep);
        rep = null_mut();
        assert_eq!(
            care_rubric_validate(broken.as_ptr().cast(), broken.len(), null(), &mut rep),
            CARE_OK
        );
        cov.nulls("care_validation_report_count", 2, CARE_OK, |k| {
            care_validation_report_count(p(k, 0, rep), m(k, 1, &raw mut n))
        });
        assert!(n > 0);
        let (mut rf, mut parsed, mut over) = (0f64, 0u32, 0u32);
        cov.nulls("care_validation_report_summary", 4, CARE_OK, |k| {
            care_validation_report_summary(
                p(k, 0, rep),
                m(k, 1, &raw mut rf),
                m(k, 2, &raw mut parsed),
                m(k, 3, &raw mut over),
            )
        });
        let mut vi = std::mem::zeroed::<care_violation>();
        cov.nulls("care_validation_report_violation", 2, CARE_OK, |k| {
            care_validation_report_violation(p(k, 0, rep), 0, m(k, 1, &raw mut vi))
        });
        assert_eq!(
            care_validation_report_violation(rep, n, &mut vi),
            CARE_ERR_OUT_OF_RANGE
        );
        let mut buf = [0 as c_char; 1024];
        let mut len = 0usize;
        cov.nulls("care_validation_report_message", 2, CARE_OK, |k| {
            care_validation_report_message(
                p(k, 0, rep),
                0,
                buf.as_mut_ptr(),
                buf.len(),
                m(k, 1, &raw mut len),
            )
        });
        assert_eq!(
            care_validation_report_message(rep, n, buf.as_mut_ptr(), buf.len(), &mut len),
            CARE_ERR_OUT_OF_RANGE
        );
        let need = len;
        len = 0;
        assert_eq!(
            care_validation_report_message(rep, 0, buf.as_mut_ptr(), need - 1, &mut len),
            CARE_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(len, need, "the required size is reported");
        assert_eq!(
            care_validation_report_message(rep, 0, null_mut(), 5, &mut len),
            CARE_ERR_NULL_POINTER
        );
        cov.nulls("care_validation_report_feedback", 2, CARE_OK, |k| {
            care_validation_report_feedback(
                p(k, 0, rep),
                buf.as_mut_ptr(),
                buf.len(),
                m(k, 1, &raw mut len),
            )
        });
        care_validation_report_free(rep);
        care_validation_report_free(null_mut());
        cov.saw("care_validation_report_free");

        // ---- rewards ---------------------------------------------------------------------------
        let scores = [4.0f64, 5.0, 4.0, 5.0, 3.0, 5.0, 5.0, 4.0];
        let mut reward = -1.0f64;
        let mut detail = std::mem::zeroed::<care_reward_detail>();
        cov.nulls("care_policy_reward", 3, CARE_OK, |k| {
            care_policy_reward(
                p(k, 0, rubric),
                p(k, 1, scores.as_ptr()),
                total,
                null(),
                m(k, 2, &raw mut reward),
                &raw mut detail,
            )
        });
        reward = -1.0;
        assert_eq!(
            care_policy_reward(
                rubric,
                scores.as_ptr(),
                total - 1,
                null(),
                &mut reward,
                null_mut()
            ),
            CARE_ERR_SCORE_SHAPE
        );
        assert_eq!(reward, -1.0);
        let batch: Vec<f64> = scores.iter().chain(scores.iter()).copied().collect();
        let mut rewards2 = [0f64; 2];
        let mut brep = std::mem::zeroed::<care_batch_report>();
        cov.nulls("care_policy_reward_batch", 3, CARE_OK, |k| {
            care_policy_reward_batch(
                p(k, 0, rubric),
                p(k, 1, batch.as_ptr()),
                2 * total,
                null(),
                m(k, 2, rewards2.as_mut_ptr()),
                2,
                &raw mut brep,
            )
        });
        rewards2 = [-1.0; 2];
        assert_eq!(
            care_policy_reward_batch(
                rubric,
                batch.as_ptr(),
                2 * total - 1,
                null(),
                rewards2.as_mut_ptr(),
                2,
                null_mut()
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        assert_eq!(rewards2, [-1.0; 2]);
        let rejected = [3.0f64, 5.0, 4.0, 4.0, 2.0, 5.0, 4.0, 4.0];
        cov.nulls("care_preference_reward", 4, CARE_OK, |k| {
            care_preference_reward(
                p(k, 0, rubric),
                p(k, 1, scores.as_ptr()),
                total,
                p(k, 2, rejected.as_ptr()),
                total,
                null(),
                null(),
                m(k, 3, &raw mut reward),
                null_mut(),
            )
        });
        assert_eq!(
            care_preference_reward(
                rubric,
                scores.as_ptr(),
                total,
                rejected.as_ptr(),
                total - 1,
                null(),
                null(),
                &mut reward,
                null_mut()
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        let labels = [c"Question".as_ptr(), c"Information".as_ptr()];
        let label_lens = [8usize, 11];
        let mut sc = std::mem::zeroed::<care_strategy_counts>();
        cov.nulls("care_strategy_count", 3, CARE_OK, |k| {
            care_strategy_count(
                p(k, 0, labels.as_ptr()),
                p(k, 1, label_lens.as_ptr()),
                2,
                0,
                m(k, 2, &raw mut sc),
            )
        });
        assert_eq!(
            care_strategy_count(labels.as_ptr(), label_lens.as_ptr(), 2, 5, &mut sc),
            CARE_ERR_INVALID_ARGUMENT
        );
        let null_label = [null::<c_char>()];
        assert_eq!(
            care_strategy_count(null_label.as_ptr(), [3usize].as_ptr(), 1, 0, &mut sc),
            CARE_ERR_NULL_POINTER
        );
        let wts = [0.4f64, 0.35, 0.25];
        let cnt = [1u32, 0, 2];
        cov.nulls("care_alignment_reward", 3, CARE_OK, |k| {
            care_alignment_reward(
                p(k, 0, wts.as_ptr()),
                3,
                p(k, 1, cnt.as_ptr()),
                3,
                m(k, 2, &raw mut reward),
            )
        });
        assert_eq!(
            care_alignment_reward(wts.as_ptr(), 2, cnt.as_ptr(), 3, &mut reward),
            CARE_ERR_LENGTH_MISMATCH
        );
        let mut gr = std::mem::zeroed::<care_generator_result>();
        cov.nulls("care_generator_reward", 6, CARE_OK, |k| {
            care_generator_reward(
                p(k, 0, tp),
                text.len(),
                p(k, 1, scores.as_ptr()),
                total,
                p(k, 2, rejected.as_ptr()),
                total,
                p(k, 3, labels.as_ptr()),
                p(k, 4, label_lens.as_ptr()),
                2,
                null(),
                null(),
                null(),
                null(),
                m(k, 5, &raw mut gr),
            )
        });
        assert_eq!(
            care_generator_reward(
                tp,
                text.len(),
                scores.as_ptr(),
                total,
                rejected.as_ptr(),
                3,
                labels.as_ptr(),
                label_lens.as_ptr(),
                2,
                null(),
                null(),
                null(),
                null(),
                &mut gr
            ),
            CARE_ERR_SCORE_SHAPE
        );
        let ctx = [c"I feel stuck.".as_ptr()];
        let ctx_lens = [13usize];
        cov.nulls("care_judge_prompt_render", 5, CARE_OK, |k| {
            care_judge_prompt_render(
                p(k, 0, rubric),
                p(k, 1, ctx.as_ptr()),
                p(k, 2, ctx_lens.as_ptr()),
                1,
                p(k, 3, c"Hi".as_ptr()),
                2,
                c"Hello".as_ptr(),
                5,
                null_mut(),
                0,
                m(k, 4, &raw mut len),
            )
            .pipe(|r| {
                if r == CARE_ERR_BUFFER_TOO_SMALL {
                    CARE_OK
                } else {
                    r
                }
            })
        });
        let judge = br#"{"criterion_scores":[]}"#;
        let mut out_scores = [0f64; 8];
        cov.nulls("care_judge_output_parse", 3, CARE_OK, |k| {
            care_judge_output_parse(
                p(k, 0, rubric),
                p(k, 1, judge.as_ptr().cast()),
                judge.len(),
                m(k, 2, out_scores.as_mut_ptr()),
                total,
                null_mut(),
            )
        });
        out_scores = [1.0; 8];
        assert_eq!(
            care_judge_output_parse(
                rubric,
                judge.as_ptr().cast(),
                judge.len(),
                out_scores.as_mut_ptr(),
                total - 1,
                null_mut()
            ),
            CARE_ERR_SCORE_SHAPE
        );
        assert_eq!(
            care_judge_output_parse(
                rubric,
                c"no json".as_ptr(),
                7,
                out_scores.as_mut_ptr(),
                total,
                null_mut()
            ),
            CARE_ERR_NO_JUDGE_JSON
        );
        assert_eq!(out_scores, [1.0; 8], "outputs are untouched on failure");

        // ---- GPU (fake device addresses: arguments are checked before any driver call) -------
        let gpu_ok = care_gpu_available();
        cov.saw("care_gpu_available");
        let no_gpu = gpu_ok != CARE_OK;
        let expect = if no_gpu {
            CARE_ERR_CUDA_UNAVAILABLE
        } else {
            CARE_OK
        };
        let ws = fake::<c_void>();
        let cover_gpu = |cov: &mut Cover,
                         name: &str,
                         required: usize,
                         f: &mut dyn FnMut(Option<usize>) -> care_result| {
            if no_gpu {
                cov.nulls(name, required, expect, f);
            } else {
                // Only the NULL checks: the valid call would launch on fake addresses.
                for i in 0..required {
                    assert_eq!(f(Some(i)), CARE_ERR_NULL_POINTER, "{name}: pointer #{i}");
                }
                cov.saw(name);
            }
        };
        cover_gpu(&mut cov, "care_gpu_group_advantages", 3, &mut |k| {
            care_gpu_group_advantages(
                p(k, 0, fake::<f32>()),
                8,
                null(),
                0,
                4,
                null(),
                0,
                null(),
                m(k, 1, fake::<f32>()),
                8,
                null_mut(),
                0,
                null(),
                m(k, 2, ws),
                64,
                null_mut(),
            )
        });
        assert_eq!(
            care_gpu_group_advantages(
                fake::<f32>(),
                8,
                null(),
                0,
                4,
                null(),
                0,
                null(),
                fake::<f32>(),
                7,
                null_mut(),
                0,
                null(),
                ws,
                64,
                null_mut()
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        assert_eq!(
            care_gpu_group_advantages(
                fake::<f32>(),
                8,
                null(),
                0,
                4,
                null(),
                0,
                null(),
                fake::<f32>(),
                8,
                null_mut(),
                0,
                null(),
                ws,
                32,
                null_mut()
            ),
            CARE_ERR_BUFFER_TOO_SMALL
        );
        cover_gpu(&mut cov, "care_gpu_advantage_status", 1, &mut |k| {
            care_gpu_advantage_status(p(k, 0, ws.cast_const()), 64, null_mut())
        });
        cover_gpu(&mut cov, "care_gpu_loss_stats_reset", 1, &mut |k| {
            care_gpu_loss_stats_reset(m(k, 0, ws), CARE_GPU_LOSS_STATS_BYTES, null_mut())
        });
        assert_eq!(
            care_gpu_loss_stats_reset(ws, 8, null_mut()),
            CARE_ERR_LENGTH_MISMATCH
        );
        let mut gst = std::mem::zeroed::<care_loss_stats>();
        let gst_ptr = &raw mut gst;
        cover_gpu(&mut cov, "care_gpu_loss_stats_read", 2, &mut |k| {
            care_gpu_loss_stats_read(
                p(k, 0, ws.cast_const()),
                CARE_GPU_LOSS_STATS_BYTES,
                null_mut(),
                m(k, 1, gst_ptr),
            )
        });
        cover_gpu(&mut cov, "care_gpu_policy_loss", 4, &mut |k| {
            care_gpu_policy_loss(
                0,
                p(k, 0, fake::<c_void>()),
                5,
                null(),
                0,
                null(),
                0,
                p(k, 1, fake::<u32>()),
                3,
                null(),
                0,
                p(k, 2, fake::<f32>()),
                2,
                0,
                null(),
                0,
                fake::<c_void>(),
                5,
                0,
                null_mut(),
                0,
                m(k, 3, ws),
                64,
                null_mut(),
            )
        });
        assert_eq!(
            care_gpu_policy_loss(
                0,
                fake::<c_void>(),
                5,
                fake::<c_void>(),
                4,
                null(),
                0,
                fake::<u32>(),
                3,
                null(),
                0,
                fake::<f32>(),
                2,
                0,
                null(),
                0,
                null_mut(),
                0,
                0,
                null_mut(),
                0,
                ws,
                64,
                null_mut()
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        assert_eq!(
            care_gpu_policy_loss(
                3,
                fake::<c_void>(),
                5,
                null(),
                0,
                null(),
                0,
                fake::<u32>(),
                3,
                null(),
                0,
                fake::<f32>(),
                2,
                0,
                null(),
                0,
                null_mut(),
                0,
                0,
                null_mut(),
                0,
                ws,
                64,
                null_mut()
            ),
            CARE_ERR_INVALID_ARGUMENT
        );

        // ---- selective log-softmax (CPU reference and GPU) ------------------------------------
        let logits = [0.5f32, -1.0, 2.0, 0.0, 1.0, -0.5];
        let targets = [2i32, 0];
        let mut lp = [9f32; 2];
        cov.nulls("care_log_softmax", 3, CARE_OK, |k| {
            care_ffi::logsoftmax::care_log_softmax(
                0,
                p(k, 0, logits.as_ptr().cast()),
                6,
                2,
                3,
                3,
                p(k, 1, targets.as_ptr().cast()),
                2,
                0,
                null(),
                0,
                1.0,
                m(k, 2, lp.as_mut_ptr()),
                2,
                null_mut(),
                0,
                null_mut(),
                0,
            )
        });
        lp = [9.0; 2];
        assert_eq!(
            care_ffi::logsoftmax::care_log_softmax(
                0,
                logits.as_ptr().cast(),
                6,
                2,
                3,
                3,
                targets.as_ptr().cast(),
                2,
                0,
                null(),
                0,
                1.0,
                lp.as_mut_ptr(),
                1,
                null_mut(),
                0,
                null_mut(),
                0,
            ),
            CARE_ERR_LENGTH_MISMATCH
        );
        assert_eq!(lp, [9.0; 2], "outputs are untouched on failure");
        let dlogp = [1.0f32, -0.5];
        let mut dl = [0f32; 6];
        cov.nulls("care_log_softmax_backward", 4, CARE_OK, |k| {
            care_ffi::logsoftmax::care_log_softmax_backward(
                0,
                p(k, 0, logits.as_ptr().cast()),
                6,
                2,
                3,
                3,
                p(k, 1, targets.as_ptr().cast()),
                2,
                0,
                null(),
                0,
                1.0,
                p(k, 2, dlogp.as_ptr()),
                2,
                null(),
                0,
                m(k, 3, dl.as_mut_ptr()),
                6,
            )
        });
        cover_gpu(&mut cov, "care_gpu_log_softmax", 4, &mut |k| {
            care_ffi::logsoftmax::care_gpu_log_softmax(
                0,
                p(k, 0, fake::<c_void>()),
                2,
                3,
                3,
                p(k, 1, fake::<c_void>()),
                2,
                0,
                null(),
                0,
                1.0,
                m(k, 2, fake::<f32>()),
                2,
                null_mut(),
                0,
                null_mut(),
                0,
                m(k, 3, ws),
                64,
                null_mut(),
            )
        });
        cover_gpu(&mut cov, "care_gpu_log_softmax_status", 1, &mut |k| {
            care_ffi::logsoftmax::care_gpu_log_softmax_status(p(k, 0, ws.cast_const()), 64, null_mut())
        });
        cover_gpu(&mut cov, "care_gpu_log_softmax_backward", 4, &mut |k| {
            care_ffi::logsoftmax::care_gpu_log_softmax_backward(
                0,
                p(k, 0, fake::<c_void>()),
                2,
                3,
                3,
                p(k, 1, fake::<c_void>()),
                2,
                0,
                null(),
                0,
                1.0,
                p(k, 2, fake::<f32>()),
                2,
                null(),
                0,
                fake::<f32>(),
                2,
                null(),
                0,
                m(k, 3, fake::<c_void>()),
                3,
                null_mut(),
            )
        });
        cover_gpu(&mut cov, "care_gpu_logits_policy_loss", 8, &mut |k| {
            care_ffi::logsoftmax::care_gpu_logits_policy_loss(
                0,
                p(k, 0, fake::<c_void>()),
                2,
                3,
                3,
                p(k, 1, fake::<c_void>()),
                2,
                0,
                null(),
                0,
                1.0,
                null(),
                0,
                null(),
                0,
                p(k, 2, fake::<u32>()),
                2,
                p(k, 3, fake::<f32>()),
                1,
                0,
                null(),
                0,
                m(k, 4, fake::<f32>()),
                2,
                m(k, 5, fake::<f32>()),
                2,
                m(k, 6, fake::<f32>()),
                2,
                null_mut(),
                0,
                m(k, 7, ws),
                64,
                null_mut(),
            )
        });
    }
    // SAFETY: the handle from `parse`, released once.
    unsafe { care_rubric_free(rubric) };

    let declared = common::declared_functions(&common::header());
    let missed: Vec<_> = declared.difference(&cov.0).collect();
    assert!(
        missed.is_empty(),
        "functions of care.h this test does not call: {missed:?}"
    );
    let unknown: Vec<_> = cov.0.difference(&declared).collect();
    assert!(unknown.is_empty(), "called but not in care.h: {unknown:?}");
}

/// `x.pipe(f)` = `f(x)`, to post-process a result inline.
trait Pipe: Sized {
    fn pipe<R>(self, f: impl FnOnce(Self) -> R) -> R {
        f(self)
    }
}
impl<T> Pipe for T {}
