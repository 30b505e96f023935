//! The C ABI entry points called with arbitrary bytes and lengths: rubric parse, validation
//! report accessors (every index, tiny buffers), criterion accessors, judge-output parsing and
//! rewards on the parsed handle, and the group advantages with buffers of arbitrary (possibly
//! mismatched) lengths; the same bytes as a profile (validate, parse) and as a kardia policy
//! output (the output check with its spans, the group reward); every handle is freed once and
//! then refused (`CARE_ERR_INVALID_HANDLE`). Every buffer is allocated with exactly the length
//! passed, so AddressSanitizer catches any overrun; no call may panic (`CARE_ERR_PANIC`).
#![no_main]

use care_ffi::advantage::{
    care_advantage_outputs, care_group_advantages, care_group_layout, care_rewards,
};
use care_ffi::care_result::{self, *};
use care_ffi::loss::{
    care_loss_inputs, care_loss_options, care_loss_options_default, care_loss_stats,
    care_policy_loss, care_reject_bound, care_rollout_correction, care_rollout_stats,
};
use care_ffi::profile::*;
use care_ffi::reward::{care_judge_output_parse, care_policy_reward, care_policy_reward_group};
use care_ffi::rubric::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::c_char;
use std::ptr::{null, null_mut};

fn ok(r: care_result) -> bool {
    assert_ne!(r, CARE_ERR_PANIC, "a panic crossed into the C ABI");
    r == CARE_OK
}

fuzz_target!(|data: &[u8]| {
    advantages(data);
    loss(data);
    profiles(data);
    let (head, text) = data.split_at(data.len().min(4));
    let b = |i: usize| head.get(i).copied().unwrap_or(0);
    let tp = text.as_ptr().cast::<c_char>();
    unsafe {
        // r_fmt and the validation report agree.
        let mut rf = -1.0;
        assert!(ok(care_format_reward(tp, text.len(), null(), &mut rf)));
        let mut rep = null_mut();
        assert!(ok(care_rubric_validate(tp, text.len(), null(), &mut rep)));
        let (mut rf2, mut parsed, mut over) = (-1.0, 0u32, 0u32);
        assert!(ok(care_validation_report_summary(
            rep,
            &mut rf2,
            &mut parsed,
            &mut over
        )));
        assert_eq!(rf, rf2);
        let mut count = 0usize;
        assert!(ok(care_validation_report_count(rep, &mut count)));
        for i in 0..=count {
            let mut v = std::mem::zeroed::<care_violation>();
            let r = care_validation_report_violation(rep, i, &mut v);
            assert_eq!(ok(r), i < count);
            // A buffer of arbitrary size: either the message fits or the size is reported.
            let mut buf = vec![0u8; usize::from(b(0))];
            let mut len = 0usize;
            let r = care_validation_report_message(
                rep,
                i,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut len,
            );
            if i < count {
                assert!(
                    r == CARE_OK || (r == CARE_ERR_BUFFER_TOO_SMALL && len > buf.len()),
                    "{r:?}"
                );
            } else {
                assert!(!ok(r));
            }
        }
        let mut buf = vec![0u8; usize::from(b(1)) * 4];
        let mut len = 0usize;
        let r = care_validation_report_feedback(rep, buf.as_mut_ptr().cast(), buf.len(), &mut len);
        assert!(r == CARE_OK || r == CARE_ERR_BUFFER_TOO_SMALL, "{r:?}");
        assert!(ok(care_validation_report_free(rep)));
        assert_eq!(care_validation_report_free(rep), CARE_ERR_INVALID_HANDLE);
        assert_eq!(
            care_validation_report_count(rep, &mut count),
            CARE_ERR_INVALID_HANDLE
        );

        // Parse into a handle; accept iff r_fmt is 1.
        let mut rubric = null();
        let parsed_ok = ok(care_rubric_parse(tp, text.len(), null(), &mut rubric));
        assert_eq!(parsed_ok, rf == 1.0);
        if !parsed_ok {
            assert!(rubric.is_null());
            return;
        }
        let mut clone = null();
        assert!(ok(care_rubric_clone(rubric, &mut clone)));
        assert!(ok(care_rubric_free(rubric)));
        let mut total = 0usize;
        assert_eq!(
            care_rubric_total_criteria(rubric, &mut total),
            CARE_ERR_INVALID_HANDLE
        );
        let rubric = clone;
        let mut w = [0.0f64; 3];
        assert!(ok(care_rubric_weights(rubric, w.as_mut_ptr(), 3)));
        assert!(ok(care_rubric_total_criteria(rubric, &mut total)));
        for d in 0..4u32 {
            for i in 0..6usize {
                let (mut t, mut tl, mut de, mut dl) = (null(), 0usize, null(), 0usize);
                let _ = ok(care_rubric_criterion(
                    rubric, d, i, &mut t, &mut tl, &mut de, &mut dl,
                ));
            }
        }
        // Judge output: the same bytes, with the right length and a wrong one.
        let n = if b(2) & 1 == 0 {
            total
        } else {
            total + usize::from(b(2) >> 1)
        };
        let mut scores = vec![0.0f64; n];
        let r = care_judge_output_parse(rubric, tp, text.len(), scores.as_mut_ptr(), n, null_mut());
        if n != total {
            assert_eq!(r, CARE_ERR_SCORE_SHAPE);
        }
        // Rewards on scores taken from the input bytes (arbitrary f64 bit patterns included).
        let scores: Vec<f64> = text
            .chunks(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a[..c.len()].copy_from_slice(c);
                if b(3) & 1 == 0 {
                    f64::from(a[0] % 7)
                } else {
                    f64::from_le_bytes(a)
                }
            })
            .take(n)
            .collect();
        let mut reward = -1.0;
        if ok(care_policy_reward(
            rubric,
            scores.as_ptr(),
            scores.len(),
            null(),
            &mut reward,
            null_mut(),
        )) {
            assert!((0.0..=1.0).contains(&reward), "{reward}");
        }
        let m = usize::from(b(3) >> 1) % 5;
        let mut rewards = vec![0.0f64; m];
        let _ = ok(care_policy_reward_group(
            rubric,
            scores.as_ptr(),
            scores.len(),
            null(),
            rewards.as_mut_ptr(),
            m,
            null_mut(),
        ));
        assert!(ok(care_rubric_free(rubric)));
        assert_eq!(care_rubric_free(rubric), CARE_ERR_INVALID_HANDLE);
    }
});

/// The bytes as profile JSON (validated, parsed) and as kardia policy outputs (the output
/// check, whose spans must lie inside the output, and the group reward).
fn profiles(data: &[u8]) {
    let tp = data.as_ptr().cast::<c_char>();
    unsafe {
        let mut rep = null_mut();
        assert!(ok(care_profile_validate(tp, data.len(), &mut rep)));
        let (mut n, mut over) = (0usize, 0u32);
        assert!(ok(care_profile_report_count(rep, &mut n, &mut over)));
        let mut p = null();
        let r = care_profile_parse(tp, data.len(), &mut p);
        assert_eq!(ok(r), n == 0 && over == 0, "{r:?}");
        for i in 0..=n {
            let mut v = std::mem::zeroed::<care_profile_violation>();
            assert_eq!(ok(care_profile_report_violation(rep, i, &mut v)), i < n);
        }
        assert!(ok(care_profile_report_free(rep)));
        if ok(r) {
            assert!(ok(care_profile_free(p)));
        }
        let mut kardia = null();
        assert!(ok(care_profile_builtin(c"kardia".as_ptr(), 6, &mut kardia)));
        // Two outputs: the whole input, and its second half.
        let half = &data[data.len() / 2..];
        let outs = [data, half];
        for o in outs {
            let mut c = std::mem::zeroed::<care_output_check>();
            assert!(ok(care_profile_check_output(
                kardia,
                o.as_ptr().cast(),
                o.len(),
                &mut c
            )));
            for s in std::iter::once(&c.judge).chain(&c.spans[..c.span_count as usize]) {
                assert!(s.located == 0 || s.offset + s.len <= o.len());
            }
            assert_eq!(c.judge_needed == 1, c.format_reward == 1.0);
        }
        let ptrs: Vec<*const c_char> = outs.iter().map(|o| o.as_ptr().cast()).collect();
        let lens: Vec<usize> = outs.iter().map(|o| o.len()).collect();
        let scores: Vec<f64> = (0..10)
            .map(|i| f64::from(data.get(i).copied().unwrap_or(0) % 7))
            .collect();
        let g = care_profile_group {
            struct_size: size_of::<care_profile_group>() as u32,
            rubric: null(),
            outputs: ptrs.as_ptr(),
            output_lens: lens.as_ptr(),
            output_count: 2,
            scores: scores.as_ptr(),
            scores_len: scores.len(),
            gold_emotion: c"sadness".as_ptr(),
            gold_emotion_len: 7,
        };
        let mut rewards = [0.0f64; 2];
        let mut details = [std::mem::zeroed::<care_profile_reward_result>(); 2];
        let o = care_profile_group_outputs {
            struct_size: size_of::<care_profile_group_outputs>() as u32,
            rewards: rewards.as_mut_ptr(),
            rewards_len: 2,
            details: details.as_mut_ptr(),
            details_len: 2,
        };
        assert!(ok(care_profile_reward_group(
            kardia,
            &g,
            null(),
            &o,
            null_mut()
        )));
        for (r, d) in rewards.iter().zip(&details) {
            assert!(r.is_nan() || (0.0..=1.0).contains(r), "{r}");
            assert_eq!(r.to_bits(), d.reward.to_bits());
        }
        assert!(ok(care_profile_free(kardia)));
        assert_eq!(care_profile_free(kardia), CARE_ERR_INVALID_HANDLE);
    }
}

/// The group advantages through the C ABI with lengths taken from the input, each buffer
/// exactly as long as claimed.
fn advantages(data: &[u8]) {
    let rewards: Vec<f32> = data.chunks(4).map(|c| f32::from(c[0]) / 7.0).collect();
    let n = rewards.len();
    let b = |i: usize| data.get(i).copied().unwrap_or(0);
    let valid: Vec<u8> = (0..usize::from(b(0) % 3).min(1) * n)
        .map(|i| u8::from(i % 4 != 0))
        .collect();
    let out_len = (n + usize::from(b(1) % 3)).saturating_sub(1);
    let mut out = vec![0.0f32; out_len];
    let offsets: Vec<u32> = data
        .iter()
        .take(usize::from(b(2) % 6))
        .map(|&x| u32::from(x))
        .collect();
    let group_size = u32::from(b(3) % 5);
    let c_rewards = care_rewards {
        struct_size: size_of::<care_rewards>() as u32,
        rewards: rewards.as_ptr(),
        rewards_len: n,
        valid: if valid.is_empty() {
            null()
        } else {
            valid.as_ptr()
        },
        valid_len: valid.len(),
        lengths: null(),
        lengths_len: 0,
        baselines: null(),
        baselines_len: 0,
    };
    let layout = care_group_layout {
        struct_size: size_of::<care_group_layout>() as u32,
        group_size: if offsets.is_empty() { group_size } else { 0 },
        offsets: if offsets.is_empty() {
            null()
        } else {
            offsets.as_ptr()
        },
        offsets_len: offsets.len(),
    };
    let outputs = care_advantage_outputs {
        struct_size: size_of::<care_advantage_outputs>() as u32,
        advantages: out.as_mut_ptr(),
        advantages_len: out.len(),
        stats: null_mut(),
        stats_len: 0,
    };
    unsafe {
        ok(care_group_advantages(&c_rewards, &layout, null(), &outputs));
    }
}

/// The f32 policy loss through the C ABI: every (pointer, length) pair gets a length taken from
/// the input (so most calls mismatch), a buffer of exactly that length, and NULL for an
/// optional input when its length byte says so; the offsets come from the input too.
fn loss(data: &[u8]) {
    let b = |i: usize| data.get(i).copied().unwrap_or(0);
    let t = usize::from(b(4) % 17);
    let len = |k: usize| {
        let x = b(k);
        if x & 0x80 != 0 {
            t
        } else {
            usize::from(x % 19)
        }
    };
    let logp: Vec<f32> = (0..len(5)).map(|i| -f32::from(b(i)) / 16.0).collect();
    let old: Vec<f32> = (0..len(6)).map(|i| -f32::from(b(i + 1)) / 16.0).collect();
    let rf: Vec<f32> = (0..len(7)).map(|i| -f32::from(b(i + 2)) / 16.0).collect();
    let lr: Vec<f32> = (0..len(15)).map(|i| -f32::from(b(i + 4)) / 16.0).collect();
    let mask: Vec<u8> = (0..len(8)).map(|i| b(i) & 1).collect();
    let offsets: Vec<u32> = (0..usize::from(b(9) % 6))
        .map(|i| u32::from(b(10 + i) % 20))
        .collect();
    let adv: Vec<f32> = (0..len(11))
        .map(|i| f32::from(b(i + 3)) / 64.0 - 2.0)
        .collect();
    let mut grad = vec![0.0f32; len(12)];
    let opt = |v: &[f32], flag: bool| {
        if flag && v.is_empty() {
            null()
        } else {
            v.as_ptr()
        }
    };
    let mut loss = 0.0f64;
    let mut stats = unsafe { std::mem::zeroed::<care_loss_stats>() };
    let inputs = care_loss_inputs {
        struct_size: size_of::<care_loss_inputs>() as u32,
        dtype: 0, // f32
        logp: logp.as_ptr().cast(),
        logp_len: logp.len(),
        logp_old: opt(&old, b(13) & 1 != 0).cast(),
        logp_old_len: old.len(),
        logp_ref: opt(&rf, b(13) & 2 != 0).cast(),
        logp_ref_len: rf.len(),
        seq_offsets: offsets.as_ptr(),
        seq_offsets_len: offsets.len(),
        mask: if b(13) & 4 != 0 && mask.is_empty() {
            null()
        } else {
            mask.as_ptr()
        },
        mask_len: mask.len(),
        advantages: adv.as_ptr(),
        advantages_len: adv.len(),
        advantages_kind: u32::from(b(14) % 3),
        max_seq_len: 0,
        logp_rollout: opt(&lr, b(13) & 8 != 0).cast(),
        logp_rollout_len: lr.len(),
    };
    // The rollout correction's options: token weights and a token_k1 bound when asked.
    let mut lo = unsafe { std::mem::zeroed::<care_loss_options>() };
    unsafe {
        assert_eq!(care_loss_options_default(&mut lo), CARE_OK);
    }
    if b(13) & 16 != 0 {
        lo.rollout.is_level = 1;
        lo.rollout.reject[0] = care_reject_bound {
            lower: 0.5,
            upper: 2.0,
        };
    }
    unsafe {
        let r = care_policy_loss(
            &inputs,
            &lo,
            grad.as_mut_ptr(),
            grad.len(),
            &mut loss,
            &mut stats,
        );
        if ok(r) {
            assert_eq!(grad.len(), logp.len());
        }
        let (mut w, mut keep) = (vec![0.0f32; len(12)], vec![0u8; len(12)]);
        let mut rs = std::mem::zeroed::<care_rollout_stats>();
        let r = care_rollout_correction(
            &inputs,
            &lo,
            w.as_mut_ptr(),
            w.len(),
            keep.as_mut_ptr(),
            keep.len(),
            &mut rs,
        );
        if ok(r) {
            assert_eq!(w.len(), logp.len());
            assert!(keep.iter().all(|&k| k <= 1));
        }
    }
}
