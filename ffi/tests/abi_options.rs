//! Every option field of the policy-loss family, the rollout correction and the advantage
//! estimators reaches the core through the C structs. Per field: a C call with the field set
//! (by its C name, as a C caller would) equals the core with the same Rust field set, bit for
//! bit, and the core result with the field set differs from the one without it on these
//! inputs, so a decoder that dropped or misread the field fails the first or the second check.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::ptr::null;

use care_core::grpo::{
    AdvantageOptions, Advantages, Aggregation, Baseline, GroupInputs, GroupLayout, GroupStats,
    IsLevel, LossInputs, LossOptions, PolicyLoss, RatioLevel, Rejection, RejectionMode, Reweight,
    RolloutInputs, SequenceCount, group_advantages_with, policy_loss, rollout_correction,
};
use care_ffi::advantage::*;
use care_ffi::care_result::*;
use care_ffi::loss::care_advantages_kind::*;
use care_ffi::loss::care_dtype::*;
use care_ffi::loss::*;

/// The loss fixture: four sequences (one empty, one fully masked), ratios that clip, and
/// rollout log-probs with a spike of 1.5 nats every seventh token so that every rejection
/// criterion has something to reject.
struct LossFx {
    seq: Vec<u32>,
    logp: Vec<f32>,
    old: Vec<f32>,
    rollout: Vec<f32>,
    mask: Vec<u8>,
    adv: Vec<f32>,
    tok_adv: Vec<f32>,
}

impl LossFx {
    fn new() -> LossFx {
        let seq = vec![0u32, 6, 6, 13, 18, 26];
        let t = 26usize;
        let wave = |i: usize, k: f32| ((i as f32) * k).sin();
        let logp: Vec<f32> = (0..t).map(|i| -1.5 + 1.2 * wave(i, 1.3)).collect();
        let old: Vec<f32> = logp
            .iter()
            .enumerate()
            .map(|(i, x)| x + 0.6 * wave(i, 2.1))
            .collect();
        let rollout: Vec<f32> = old
            .iter()
            .enumerate()
            .map(|(i, x)| x + if i % 7 == 2 { 1.5 } else { 0.1 * wave(i, 0.7) })
            .collect();
        // Sequence 3 (tokens 13..18) is fully masked; one more token of sequence 4 is masked.
        let mask: Vec<u8> = (0..t)
            .map(|i| u8::from(!(13..18).contains(&i) && i != 21))
            .collect();
        let adv = vec![1.5f32, -0.5, 0.75, 2.0, -2.5];
        let tok_adv: Vec<f32> = (0..t).map(|i| 2.0 * wave(i, 0.9)).collect();
        LossFx {
            seq,
            logp,
            old,
            rollout,
            mask,
            adv,
            tok_adv,
        }
    }

    fn inputs(&self, per_token: bool) -> LossInputs<'_, f32> {
        LossInputs {
            logp: &self.logp,
            logp_old: Some(&self.old),
            logp_ref: None,
            seq_offsets: &self.seq,
            mask: Some(&self.mask),
            advantages: if per_token {
                Advantages::PerToken(&self.tok_adv)
            } else {
                Advantages::PerSequence(&self.adv)
            },
            logp_rollout: Some(&self.rollout),
        }
    }

    fn c_inputs(&self, per_token: bool) -> care_loss_inputs {
        let t = self.logp.len();
        let (adv, kind) = if per_token {
            (&self.tok_adv, CARE_ADVANTAGES_PER_TOKEN)
        } else {
            (&self.adv, CARE_ADVANTAGES_PER_SEQUENCE)
        };
        care_loss_inputs {
            struct_size: size_of::<care_loss_inputs>() as u32,
            dtype: CARE_DTYPE_F32 as u32,
            logp: self.logp.as_ptr().cast(),
            logp_len: t,
            logp_old: self.old.as_ptr().cast(),
            logp_old_len: t,
            logp_ref: null(),
            logp_ref_len: 0,
            seq_offsets: self.seq.as_ptr(),
            seq_offsets_len: self.seq.len(),
            mask: self.mask.as_ptr(),
            mask_len: t,
            advantages: adv.as_ptr(),
            advantages_len: adv.len(),
            advantages_kind: kind as u32,
            max_seq_len: 0,
            logp_rollout: self.rollout.as_ptr().cast(),
            logp_rollout_len: t,
        }
    }
}

/// Loss, gradient and the stats that the options can move, as bits.
fn core_loss(fx: &LossFx, per_token: bool, o: &LossOptions) -> (u64, Vec<u32>, [u64; 4]) {
    let mut grad = vec![0f32; fx.logp.len()];
    let out = policy_loss(&fx.inputs(per_token), o, &mut grad).unwrap();
    let s = &out.stats;
    (
        out.loss.to_bits(),
        grad.iter().map(|x| x.to_bits()).collect(),
        [s.tokens, s.sequences, s.clipped, s.ratio_sum].map(f64::to_bits),
    )
}

fn c_loss(fx: &LossFx, per_token: bool, o: &care_loss_options) -> (u64, Vec<u32>, [u64; 4]) {
    let t = fx.logp.len();
    let c = fx.c_inputs(per_token);
    let (mut grad, mut loss) = (vec![7f32; t], 7.0);
    let mut s = unsafe { std::mem::zeroed::<care_loss_stats>() };
    // SAFETY: valid buffers of the stated lengths.
    let code = unsafe { care_policy_loss(&c, o, grad.as_mut_ptr(), t, &mut loss, &mut s) };
    assert_eq!(code, CARE_OK);
    (
        loss.to_bits(),
        grad.iter().map(|x| x.to_bits()).collect(),
        [s.tokens, s.sequences, s.clipped, s.ratio_sum].map(f64::to_bits),
    )
}

/// Weights, keep flags and the rejected-token count of the rollout correction alone.
fn core_rollout(fx: &LossFx, o: &LossOptions) -> (Vec<u32>, Vec<u8>, u64) {
    let t = fx.logp.len();
    let (mut w, mut k) = (vec![0f32; t], vec![0u8; t]);
    let inputs = RolloutInputs {
        logp_old: &fx.old,
        logp_rollout: &fx.rollout,
        seq_offsets: &fx.seq,
        mask: Some(&fx.mask),
    };
    let st = rollout_correction(&inputs, &o.rollout, &mut w, &mut k).unwrap();
    (
        w.iter().map(|x| x.to_bits()).collect(),
        k,
        st.rejected_tokens.to_bits(),
    )
}

fn c_rollout(fx: &LossFx, o: &care_loss_options) -> (Vec<u32>, Vec<u8>, u64) {
    let t = fx.logp.len();
    let c = fx.c_inputs(false);
    let (mut w, mut k) = (vec![7f32; t], vec![7u8; t]);
    let mut st = unsafe { std::mem::zeroed::<care_rollout_stats>() };
    // SAFETY: valid buffers of the stated lengths.
    let code =
        unsafe { care_rollout_correction(&c, o, w.as_mut_ptr(), t, k.as_mut_ptr(), t, &mut st) };
    assert_eq!(code, CARE_OK);
    (
        w.iter().map(|x| x.to_bits()).collect(),
        k,
        st.rejected_tokens.to_bits(),
    )
}

/// Sets one field on both sides: the core's options and the C struct.
type Set = fn(&mut LossOptions, &mut care_loss_options);

/// One field under test: the options it is changed from (`base`), the change, and whether the
/// advantages are per token.
struct LossCase {
    name: &'static str,
    base: Set,
    change: Set,
    per_token: bool,
}

fn nothing(_: &mut LossOptions, _: &mut care_loss_options) {}

fn cov_base(o: &mut LossOptions, c: &mut care_loss_options, kind: PolicyLoss, ck: u32) {
    o.policy_loss = kind;
    c.policy_loss = ck;
    // A share and window wide enough that the selection picks tokens of this fixture (its
    // covariances lie within +-5, so moving either end past 5 empties the window).
    (o.cov_ratio, c.cov_ratio) = (0.25, 0.25);
    (o.clip_cov_lb, c.clip_cov_lb) = (-10.0, -10.0);
    (o.clip_cov_ub, c.clip_cov_ub) = (10.0, 10.0);
}

fn clip_cov_base(o: &mut LossOptions, c: &mut care_loss_options) {
    use care_policy_loss_kind::CARE_POLICY_LOSS_CLIP_COV;
    cov_base(o, c, PolicyLoss::ClipCov, CARE_POLICY_LOSS_CLIP_COV as u32);
}

fn kl_cov_base(o: &mut LossOptions, c: &mut care_loss_options) {
    use care_policy_loss_kind::CARE_POLICY_LOSS_KL_COV;
    cov_base(o, c, PolicyLoss::KlCov, CARE_POLICY_LOSS_KL_COV as u32);
}

fn sapo_base(o: &mut LossOptions, c: &mut care_loss_options) {
    o.policy_loss = PolicyLoss::Sapo;
    c.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_SAPO as u32;
}

fn gmpo_is_base(o: &mut LossOptions, c: &mut care_loss_options) {
    o.policy_loss = PolicyLoss::Gmpo;
    c.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_GMPO as u32;
    token_is_base(o, c);
}

fn token_is_base(o: &mut LossOptions, c: &mut care_loss_options) {
    o.rollout.is_level = IsLevel::Token;
    c.rollout.is_level = care_is_level::CARE_IS_TOKEN as u32;
    // A threshold the weights of this fixture reach.
    (o.rollout.is_threshold, c.rollout.is_threshold) = (1.2, 1.2);
}

fn reject_token_k1(o: &mut LossOptions, c: &mut care_loss_options) {
    o.rollout.set_bound(Rejection::TokenK1, 0.5, 2.0);
    c.rollout.reject[care_rejection::CARE_REJECT_TOKEN_K1 as usize] = care_reject_bound {
        lower: 0.5,
        upper: 2.0,
    };
}

fn loss_cases() -> Vec<LossCase> {
    use care_policy_loss_kind::*;
    macro_rules! case {
        ($name:expr, $base:expr, |$o:ident, $c:ident| $change:expr) => {
            case!($name, $base, |$o, $c| $change, false)
        };
        ($name:expr, $base:expr, |$o:ident, $c:ident| $change:expr, $per_token:expr) => {
            LossCase {
                name: $name,
                base: $base,
                change: |$o: &mut LossOptions, $c: &mut care_loss_options| $change,
                per_token: $per_token,
            }
        };
    }
    let mut v = vec![
        case!("policy_loss CISPO", nothing, |o, c| {
            o.policy_loss = PolicyLoss::Cispo;
            c.policy_loss = CARE_POLICY_LOSS_CISPO as u32
        }),
        case!("policy_loss SAPO", nothing, |o, c| {
            o.policy_loss = PolicyLoss::Sapo;
            c.policy_loss = CARE_POLICY_LOSS_SAPO as u32
        }),
        case!("policy_loss GPG", nothing, |o, c| {
            o.policy_loss = PolicyLoss::Gpg;
            c.policy_loss = CARE_POLICY_LOSS_GPG as u32
        }),
        case!("policy_loss GMPO", nothing, |o, c| {
            o.policy_loss = PolicyLoss::Gmpo;
            c.policy_loss = CARE_POLICY_LOSS_GMPO as u32
        }),
        case!("policy_loss Clip-Cov", nothing, |o, c| clip_cov_base(o, c)),
        case!("policy_loss KL-Cov", nothing, |o, c| kl_cov_base(o, c)),
        case!(
            "ratio_level GSPO-token (per-token advantages)",
            nothing,
            |o, c| {
                o.ratio_level = RatioLevel::SequenceToken;
                c.ratio_level = care_ratio_level::CARE_RATIO_SEQUENCE_TOKEN as u32
            },
            true
        ),
        case!("aggregation token-sum-norm", nothing, |o, c| {
            o.aggregation = Aggregation::TokenSumNorm;
            c.aggregation = care_aggregation::CARE_AGGREGATION_TOKEN_SUM_NORM as u32
        }),
        case!(
            "sequence_count all (seq-mean-token-mean)",
            |o, c| {
                o.aggregation = Aggregation::SeqMeanTokenMean;
                c.aggregation = care_aggregation::CARE_AGGREGATION_SEQ_MEAN_TOKEN_MEAN as u32
            },
            |o, c| {
                o.sequence_count = SequenceCount::All;
                c.sequence_count = care_sequence_count::CARE_SEQUENCE_COUNT_ALL as u32
            }
        ),
        case!("sapo_tau_pos", sapo_base, |o, c| {
            (o.sapo_tau_pos, c.sapo_tau_pos) = (3.0, 3.0)
        }),
        case!("sapo_tau_neg", sapo_base, |o, c| {
            (o.sapo_tau_neg, c.sapo_tau_neg) = (0.3, 0.3)
        }),
        case!("cov_ratio (Clip-Cov)", clip_cov_base, |o, c| {
            (o.cov_ratio, c.cov_ratio) = (0.6, 0.6)
        }),
        case!("clip_cov_lb", clip_cov_base, |o, c| {
            (o.clip_cov_lb, c.clip_cov_lb) = (5.0, 5.0)
        }),
        case!("clip_cov_ub", clip_cov_base, |o, c| {
            (o.clip_cov_ub, c.clip_cov_ub) = (-5.0, -5.0)
        }),
        case!("cov_ratio (KL-Cov)", kl_cov_base, |o, c| {
            (o.cov_ratio, c.cov_ratio) = (0.6, 0.6)
        }),
        case!("kl_cov_coef", kl_cov_base, |o, c| {
            (o.kl_cov_coef, c.kl_cov_coef) = (3.0, 3.0)
        }),
        // (`bypass` needs a line without logp_old: abi_results' verl_classes_through_the_c_abi.)
        case!("gmpo_weight_floor", gmpo_is_base, |o, c| {
            (o.gmpo_weight_floor, c.gmpo_weight_floor) = (1e-3, 1e-3)
        }),
        case!("rollout.is_level token", nothing, |o, c| token_is_base(
            o, c
        )),
        case!("rollout.is_level sequence", nothing, |o, c| {
            o.rollout.is_level = IsLevel::Sequence;
            c.rollout.is_level = care_is_level::CARE_IS_SEQUENCE as u32;
            (o.rollout.is_threshold, c.rollout.is_threshold) = (1.2, 1.2)
        }),
        case!("rollout.is_threshold", token_is_base, |o, c| {
            (o.rollout.is_threshold, c.rollout.is_threshold) = (1.05, 1.05)
        }),
        case!("rollout.is_threshold_low", token_is_base, |o, c| {
            (o.rollout.is_threshold_low, c.rollout.is_threshold_low) = (0.95, 0.95)
        }),
        case!("rollout.log_ratio_clamp", token_is_base, |o, c| {
            (o.rollout.log_ratio_clamp, c.rollout.log_ratio_clamp) = (0.01, 0.01)
        }),
        case!(
            "rollout.rejection_mode zero_weight",
            reject_token_k1,
            |o, c| {
                o.rollout.rejection_mode = RejectionMode::ZeroWeight;
                c.rollout.rejection_mode = care_rejection_mode::CARE_REJECTION_ZERO_WEIGHT as u32
            }
        ),
    ];
    // One case per rejection criterion: the token/sequence k1 criteria take a two-sided ratio
    // window, the others an upper bound the spikes of the fixture exceed.
    macro_rules! reject {
        ($name:expr, $crit:ident, $lower:expr, $upper:expr) => {
            case!($name, nothing, |o, c| {
                o.rollout.set_bound(Rejection::$crit, $lower, $upper);
                c.rollout.reject[Rejection::$crit as usize] = care_reject_bound {
                    lower: $lower,
                    upper: $upper,
                }
            })
        };
    }
    v.extend([
        reject!("reject token_k1", TokenK1, 0.5, 2.0),
        reject!("reject token_k2", TokenK2, 0.0, 0.5),
        reject!("reject token_k3", TokenK3, 0.0, 0.3),
        reject!("reject seq_sum_k1", SeqSumK1, 0.5, 2.0),
        reject!("reject seq_sum_k2", SeqSumK2, 0.0, 1.0),
        reject!("reject seq_sum_k3", SeqSumK3, 0.0, 0.5),
        reject!("reject seq_mean_k1", SeqMeanK1, 0.9, 1.1),
        reject!("reject seq_mean_k2", SeqMeanK2, 0.0, 0.05),
        reject!("reject seq_mean_k3", SeqMeanK3, 0.0, 0.05),
        reject!("reject seq_max_k2", SeqMaxK2, 0.0, 0.5),
        reject!("reject seq_max_k3", SeqMaxK3, 0.0, 0.3),
    ]);
    v
}

#[test]
fn every_loss_option_field_reaches_the_core() {
    let fx = LossFx::new();
    let mut criteria = std::collections::BTreeSet::new();
    for case in loss_cases() {
        let (mut o, mut c) = (LossOptions::default(), unsafe {
            std::mem::zeroed::<care_loss_options>()
        });
        // SAFETY: valid output.
        assert_eq!(unsafe { care_loss_options_default(&mut c) }, CARE_OK);
        (case.base)(&mut o, &mut c);
        let before = core_loss(&fx, case.per_token, &o);
        let rollout_before = core_rollout(&fx, &o);
        (case.change)(&mut o, &mut c);
        let want = core_loss(&fx, case.per_token, &o);
        assert_eq!(c_loss(&fx, case.per_token, &c), want, "{}", case.name);
        assert_ne!(
            want, before,
            "{}: the field changes nothing here",
            case.name
        );
        if case.name.starts_with("rollout") || case.name.starts_with("reject") {
            let want = core_rollout(&fx, &o);
            assert_eq!(c_rollout(&fx, &c), want, "{}", case.name);
            assert_ne!(want, rollout_before, "{}", case.name);
        }
        if let Some(k) = o.rollout.reject.iter().position(|b| b.upper != 0.0) {
            criteria.insert(k);
        }
    }
    assert_eq!(
        criteria.len(),
        Rejection::ALL.len(),
        "every criterion tested"
    );
}

/// The rollout correction with `logp_rollout == logp_old` through the C ABI: every weight 1,
/// nothing rejected, under every criterion at once (the property of the core, checked at the
/// boundary: the C struct's rollout block must not turn a no-op into a rejection).
#[test]
fn equal_rollout_log_probs_reject_nothing_through_the_c_abi() {
    let mut fx = LossFx::new();
    fx.rollout = fx.old.clone();
    let mut c = unsafe { std::mem::zeroed::<care_loss_options>() };
    // SAFETY: valid output.
    assert_eq!(unsafe { care_loss_options_default(&mut c) }, CARE_OK);
    c.rollout.is_level = care_is_level::CARE_IS_TOKEN as u32;
    for (k, b) in c.rollout.reject.iter_mut().enumerate() {
        *b = if matches!(k, 0 | 3 | 6) {
            care_reject_bound {
                lower: 0.99,
                upper: 1.01,
            }
        } else {
            care_reject_bound {
                lower: 0.0,
                upper: 1e-6,
            }
        };
    }
    let (w, keep, rejected) = c_rollout(&fx, &c);
    assert_eq!(f64::from_bits(rejected), 0.0);
    for (i, m) in fx.mask.iter().enumerate() {
        assert_eq!(keep[i], *m, "token {i}");
        let want = if *m != 0 { 1.0f32 } else { 0.0 };
        assert_eq!(f32::from_bits(w[i]), want, "token {i}");
    }
}

// ---- advantages

struct AdvFx {
    rewards: Vec<f32>,
    lengths: Vec<u32>,
    baselines: Vec<f32>,
}

/// Three groups of four: ordinary rewards, a group whose rewards are all equal (no signal:
/// GPG's `M`), and one with a tiny spread (the std floor binds).
fn adv_fx() -> AdvFx {
    AdvFx {
        rewards: vec![
            0.1, 0.7, 0.4, 0.9, //
            0.5, 0.5, 0.5, 0.5, //
            0.30, 0.31, 0.30, 0.32,
        ],
        lengths: vec![3, 9, 5, 12, 4, 4, 8, 2, 7, 1, 6, 10],
        baselines: vec![0.2, 0.6, 0.1, 0.3, 0.4, 0.9, 0.0, 0.5, 0.3, 0.2, 0.1, 0.4],
    }
}

fn core_adv(fx: &AdvFx, o: &AdvantageOptions) -> Vec<u32> {
    let layout = GroupLayout::Fixed { group_size: 4 };
    let inputs = GroupInputs {
        lengths: Some(&fx.lengths),
        baselines: Some(&fx.baselines),
        ..GroupInputs::new(&fx.rewards, None, layout)
    };
    let mut adv = vec![0f32; fx.rewards.len()];
    let mut stats = vec![GroupStats::default(); 3];
    group_advantages_with(&inputs, o, &mut adv, Some(&mut stats)).unwrap();
    adv.iter().map(|x| x.to_bits()).collect()
}

fn c_adv(fx: &AdvFx, o: &care_advantage_options) -> Vec<u32> {
    let n = fx.rewards.len();
    let rw = care_rewards {
        struct_size: size_of::<care_rewards>() as u32,
        rewards: fx.rewards.as_ptr(),
        rewards_len: n,
        valid: null(),
        valid_len: 0,
        lengths: fx.lengths.as_ptr(),
        lengths_len: n,
        baselines: fx.baselines.as_ptr(),
        baselines_len: n,
    };
    let layout = care_group_layout {
        struct_size: size_of::<care_group_layout>() as u32,
        group_size: 4,
        offsets: null(),
        offsets_len: 0,
    };
    let mut adv = vec![7f32; n];
    let mut stats = vec![unsafe { std::mem::zeroed::<care_group_stats>() }; 3];
    let out = care_advantage_outputs {
        struct_size: size_of::<care_advantage_outputs>() as u32,
        advantages: adv.as_mut_ptr(),
        advantages_len: n,
        stats: stats.as_mut_ptr(),
        stats_len: 3,
    };
    // SAFETY: valid buffers of the stated lengths.
    assert_eq!(
        unsafe { care_group_advantages(&rw, &layout, o, &out) },
        CARE_OK
    );
    adv.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_advantage_option_field_reaches_the_core() {
    type SetA = fn(&mut AdvantageOptions, &mut care_advantage_options);
    let cases: [(&str, SetA); 5] = [
        ("reweight gpg", |o, c| {
            o.reweight = Reweight::Gpg;
            c.reweight = care_reweight::CARE_REWEIGHT_GPG as u32
        }),
        ("std_floor", |o, c| (o.std_floor, c.std_floor) = (0.1, 0.1)),
        ("baseline length_weighted (lengths)", |o, c| {
            o.baseline = Baseline::LengthWeighted;
            c.baseline = care_baseline::CARE_BASELINE_LENGTH_WEIGHTED as u32
        }),
        ("baseline external (baselines)", |o, c| {
            o.baseline = Baseline::External;
            c.baseline = care_baseline::CARE_BASELINE_EXTERNAL as u32
        }),
        ("baseline pass_k", |o, c| {
            o.baseline = Baseline::PassK;
            c.baseline = care_baseline::CARE_BASELINE_PASS_K as u32
        }),
    ];
    let fx = adv_fx();
    let base = core_adv(&fx, &AdvantageOptions::default());
    for (name, set) in cases {
        let mut o = AdvantageOptions::default();
        let mut c = unsafe { std::mem::zeroed::<care_advantage_options>() };
        // SAFETY: valid output.
        assert_eq!(unsafe { care_advantage_options_default(&mut c) }, CARE_OK);
        set(&mut o, &mut c);
        let want = core_adv(&fx, &o);
        assert_eq!(c_adv(&fx, &c), want, "{name}");
        assert_ne!(want, base, "{name}: the field changes nothing here");
    }
}

/// The std floor through the C ABI on the group it exists for: a spread of 0.01 divided by
/// `max(std, floor) + eps` instead of `std + eps`, so no advantage exceeds `spread / floor`.
#[test]
fn the_std_floor_bounds_a_tiny_group_through_the_c_abi() {
    let fx = adv_fx();
    let mut c = unsafe { std::mem::zeroed::<care_advantage_options>() };
    // SAFETY: valid output.
    assert_eq!(unsafe { care_advantage_options_default(&mut c) }, CARE_OK);
    let free: Vec<f32> = c_adv(&fx, &c).into_iter().map(f32::from_bits).collect();
    c.std_floor = 0.1;
    let floored: Vec<f32> = c_adv(&fx, &c).into_iter().map(f32::from_bits).collect();
    // Group 3: mean 0.3075, std (unbiased) about 0.0096: unfloored advantages near 1.3.
    assert!(free[8..].iter().any(|a| a.abs() > 1.0), "{free:?}");
    assert!(floored[8..].iter().all(|a| a.abs() < 0.13), "{floored:?}");
    // The floor does not bind on group 1 (std about 0.34), so it is unchanged.
    assert_eq!(free[..4], floored[..4]);
}
