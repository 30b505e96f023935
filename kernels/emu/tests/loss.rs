//! `grpo_loss_{f32,bf16,f16}` and `grpo_loss_denoms`, run under the host emulator through the
//! same launch plan as on the GPU, against `care_core::grpo::policy_loss`.
//!
//! Relations checked: (1) oracle: loss, gradient and every stat equal the reference within
//! `care_kernels::tolerance`, for every dtype, option and aggregation, token- and sequence-level
//! ratio, local and global denominators, odd sizes; tokens within 1e-4 of a kink of the
//! piecewise loss (clip bounds, clamps, dual clip) are exempt from the per-token gradient check
//! and from the exact clip counts, because f32 and f64 may fall on different sides of it;
//! (2) masked tokens get a gradient of exactly 0 whatever their inputs; (3) schedule
//! independence: two fiber schedules give a bit-identical gradient. The `gpu_*` test runs the
//! same cases on a real GPU (skipped with a message when there is no CUDA driver).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::grpo::{
    Advantages, Aggregation, KlEstimator, LogProb, LossInputs, LossOptions, LossStats, RatioLevel,
    aggregation_weight, kl_term, policy_loss, surrogate,
};
use care_kernels::params::LossStatsRaw;
use care_kernels::plan::LossBuffers;
use care_kernels::tolerance::{Quantity, tolerance};
use care_kernels::{Dtype, Tuning, WORKSPACE_BYTES};
mod common;
use common::{Device, EmuDevice};
use proptest::prelude::*;

trait Lp: LogProb + bytemuck::Pod + core::fmt::Debug {
    const DTYPE: Dtype;
    fn from_f32(x: f32) -> Self;
}
impl Lp for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
}
impl Lp for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}
impl Lp for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

/// Inputs in f32; converted to the dtype under test (the reference sees the same values).
#[derive(Clone, Debug)]
struct Case {
    lens: Vec<u32>,
    logp: Vec<f32>,
    logp_old: Option<Vec<f32>>,
    logp_ref: Option<Vec<f32>>,
    adv: Vec<f32>,
    adv_per_token: bool,
    mask: Option<Vec<u8>>,
    opts: LossOptions,
}

fn offsets(lens: &[u32]) -> Vec<u32> {
    let mut o = vec![0u32];
    for l in lens {
        o.push(o.last().unwrap() + l);
    }
    o
}

fn conv<T: Lp>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

fn run_reference<T: Lp>(c: &Case) -> (Vec<f32>, LossStats) {
    let logp = conv::<T>(&c.logp);
    let old = c.logp_old.as_deref().map(conv::<T>);
    let rf = c.logp_ref.as_deref().map(conv::<T>);
    let o = offsets(&c.lens);
    let inputs = LossInputs {
        logp: &logp,
        logp_old: old.as_deref(),
        logp_ref: rf.as_deref(),
        seq_offsets: &o,
        mask: c.mask.as_deref(),
        advantages: if c.adv_per_token {
            Advantages::PerToken(&c.adv)
        } else {
            Advantages::PerSequence(&c.adv)
        },
        logp_rollout: None,
    };
    let mut grad = vec![0f32; logp.len()];
    let out = policy_loss(&inputs, &c.opts, &mut grad).unwrap();
    (grad, out.stats)
}

/// Returns the gradient widened to f32 and the stats.
fn run_kernel_on<T: Lp, D: Device>(
    dev: &mut D,
    c: &Case,
    tuning: Tuning,
    seed: u64,
    grad_in_dtype: bool,
) -> (Vec<f32>, LossStats) {
    dev.reset();
    let logp = conv::<T>(&c.logp);
    let n_tok = logp.len();
    let o = offsets(&c.lens);
    // Outputs are poisoned: every entry must be written.
    let grad = if grad_in_dtype {
        dev.upload(&vec![T::from_f32(f32::NAN); n_tok])
    } else {
        dev.upload(&vec![f32::NAN; n_tok])
    };
    let stats = dev.upload(&[LossStatsRaw::EMPTY]);
    let buf = LossBuffers {
        dtype: T::DTYPE,
        logp: dev.upload(&logp),
        logp_old: match &c.logp_old {
            Some(v) => dev.upload(&conv::<T>(v)),
            None => 0,
        },
        logp_ref: match &c.logp_ref {
            Some(v) => dev.upload(&conv::<T>(v)),
            None => 0,
        },
        adv: dev.upload(&c.adv),
        adv_per_token: c.adv_per_token,
        mask: match &c.mask {
            Some(m) => dev.upload(m),
            None => 0,
        },
        seq_offsets: dev.upload(&o),
        n_seq: c.lens.len() as u32,
        n_tok: n_tok as u32,
        max_seq_len: 0,
        grad,
        grad_in_input_dtype: grad_in_dtype,
        stats,
        workspace: dev.upload(&[0x55u8; WORKSPACE_BYTES]),
        workspace_len: WORKSPACE_BYTES,
    };
    // SAFETY: every address was uploaded with the documented size and dtype.
    unsafe { care_kernels::grpo_loss(&dev.launcher(seed), &buf, &c.opts, tuning) }.unwrap();
    let g = if grad_in_dtype {
        dev.download::<T>(grad, n_tok)
            .iter()
            .map(|x| x.to_f64() as f32)
            .collect()
    } else {
        dev.download::<f32>(grad, n_tok)
    };
    (g, dev.download::<LossStatsRaw>(stats, 1)[0].to_core())
}

fn run_kernel<T: Lp>(
    c: &Case,
    tuning: Tuning,
    seed: u64,
    grad_in_dtype: bool,
) -> (Vec<f32>, LossStats) {
    run_kernel_on::<T, _>(&mut EmuDevice::default(), c, tuning, seed, grad_in_dtype)
}

/// Per-token data the checks need, from the reference's pure functions (f64).
struct Analysis {
    /// Tokens whose gradient the f32 kernel may legitimately get on the other side of a kink.
    near_kink: Vec<bool>,
    near_kink_count: f64,
    /// Magnitudes for the tolerances.
    loss_scale: f64,
    ppo_kl_scale: f64,
    kl_scale: f64,
}

fn counted(c: &Case, t: usize) -> bool {
    c.mask.as_ref().is_none_or(|m| m[t] != 0)
}

fn analyse<T: Lp>(c: &Case) -> Analysis {
    let o = offsets(&c.lens);
    let wide = |v: &[f32]| {
        conv::<T>(v)
            .iter()
            .map(|x| x.to_f64())
            .collect::<Vec<f64>>()
    };
    let lp = wide(&c.logp);
    let old = c.logp_old.as_deref().map(wide);
    let rf = c.logp_ref.as_deref().map(wide);
    let opts = &c.opts;
    let n_tok_total = lp.len();
    let mut near = vec![false; n_tok_total];
    let (mut loc_tok, mut loc_seq, mut loc_h) = (0.0, 0.0, 0.0f64);
    for w in o.windows(2) {
        let n = (w[0] as usize..w[1] as usize)
            .filter(|&t| counted(c, t))
            .count() as f64;
        loc_tok += n;
        if n > 0.0 {
            loc_seq += 1.0;
        }
        loc_h = loc_h.max(f64::from(w[1] - w[0]));
    }
    let pick = |g: f64, l: f64| if g > 0.0 { g } else { l };
    let (nt, ns, h) = (
        pick(opts.global_tokens, loc_tok),
        pick(opts.global_sequences, loc_seq),
        pick(opts.horizon, loc_h),
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
    let (mut loss_scale, mut ppo_kl_scale, mut kl_scale) = (0.0, 0.0, 0.0);
    for (i, w) in o.windows(2).enumerate() {
        let range = w[0] as usize..w[1] as usize;
        let toks: Vec<usize> = range.clone().filter(|&t| counted(c, t)).collect();
        let n_i = toks.len() as f64;
        let wt = aggregation_weight(opts.aggregation, n_i, nt, ns, h);
        let delta = |t: usize| -> (f64, bool) {
            let raw = old.as_ref().map_or(0.0, |o| lp[t] - o[t]);
            let cl = opts.log_ratio_clamp;
            (raw.clamp(-cl, cl), close(raw.abs(), cl))
        };
        let mut seq_rho = None;
        let mut seq_near = false;
        if opts.ratio_level == RatioLevel::Sequence && n_i > 0.0 {
            let mean = toks.iter().map(|&t| delta(t).0).sum::<f64>() / n_i;
            seq_near = close(mean, opts.seq_log_ratio_max);
            seq_rho = Some(mean.min(opts.seq_log_ratio_max).exp());
        }
        for &t in &toks {
            let a = f64::from(if c.adv_per_token { c.adv[t] } else { c.adv[i] });
            let (d, d_near) = delta(t);
            let rho = seq_rho.unwrap_or(d.exp());
            let s = surrogate(rho, a, opts);
            let mut k_near = false;
            let mut k = 0.0;
            if let Some(r) = rf.as_ref().filter(|_| opts.beta > 0.0) {
                let x = r[t] - lp[t];
                let kt = kl_term(x, opts);
                k = kt.k;
                k_near = close(x.abs(), opts.kl_input_clamp)
                    || (opts.kl_estimator == KlEstimator::K3
                        && close(x.exp() - x - 1.0, opts.kl_output_clamp));
                kl_scale += kt.k.abs();
            }
            let pg1 = -a * rho;
            let pg2 = -a * rho.clamp(1.0 - opts.eps_low, 1.0 + opts.eps_high);
            let dual_near =
                opts.dual_clip > 1.0 && a < 0.0 && close(-a * opts.dual_clip, pg1.max(pg2));
            near[t] = d_near
                || k_near
                || close(rho, 1.0 - opts.eps_low)
                || close(rho, 1.0 + opts.eps_high)
                || dual_near
                || seq_near;
            loss_scale += wt * (s.loss.abs() + opts.beta * k.abs());
            ppo_kl_scale += d.abs();
        }
        // GSPO: one token near a kink changes the sequence's shared gradient term.
        if seq_rho.is_some() && toks.iter().any(|&t| near[t]) {
            for &t in &toks {
                near[t] = true;
            }
        }
    }
    let near_kink_count = near.iter().filter(|&&b| b).count() as f64;
    Analysis {
        near_kink: near,
        near_kink_count,
        loss_scale,
        ppo_kl_scale,
        kl_scale,
    }
}

fn check_on<T: Lp, D: Device>(
    dev: &mut D,
    c: &Case,
    tuning: Tuning,
    seed: u64,
    grad_in_dtype: bool,
) {
    let (g_ref, s_ref) = run_reference::<T>(c);
    let (g, s) = run_kernel_on::<T, D>(dev, c, tuning, seed, grad_in_dtype);
    let an = analyse::<T>(c);
    let dt = T::DTYPE;
    let ltol = tolerance(Quantity::Loss, dt).unwrap();
    let gtol = tolerance(Quantity::Grad, dt).unwrap();
    let dtol = tolerance(Quantity::GradInputDtype, dt).unwrap();
    let gmax = g_ref.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
    let ctx = || {
        format!(
            "dtype {} grad_in_dtype {grad_in_dtype} tuning {tuning:?}\n{c:?}",
            dt.name()
        )
    };
    for t in 0..g.len() {
        if !counted(c, t) {
            assert_eq!(
                g[t].to_bits(),
                0,
                "masked token {t} gradient must be exactly +0: {}",
                ctx()
            );
            continue;
        }
        if an.near_kink[t] {
            continue;
        }
        let (got, want) = (f64::from(g[t]), f64::from(g_ref[t]));
        let ok = if grad_in_dtype {
            // Beyond the dtype's range (f16 max 65504) the stored gradient is +-inf, exactly
            // what rounding the reference to the dtype gives.
            let want_t = T::from_f32(g_ref[t]).to_f64();
            if want_t.is_infinite() {
                got == want_t
            } else {
                (got - want).abs() <= dtol.atol + dtol.rtol * want.abs() + gtol.rtol * gmax
            }
        } else {
            gtol.accepts(got, want, gmax)
        };
        assert!(
            ok,
            "grad[{t}]: kernel {got} vs reference {want} (max {gmax}): {}",
            ctx()
        );
    }
    assert_eq!(s.tokens, s_ref.tokens, "tokens: {}", ctx());
    assert_eq!(s.sequences, s_ref.sequences, "sequences: {}", ctx());
    assert_eq!(s.non_finite, s_ref.non_finite, "non_finite: {}", ctx());
    let slack = an.near_kink_count;
    for (name, a, b) in [
        ("clipped", s.clipped, s_ref.clipped),
        ("clipped_low", s.clipped_low, s_ref.clipped_low),
        ("clipped_high", s.clipped_high, s_ref.clipped_high),
        ("dual_clipped", s.dual_clipped, s_ref.dual_clipped),
        (
            "log_ratio_clamped",
            s.log_ratio_clamped,
            s_ref.log_ratio_clamped,
        ),
    ] {
        assert!(
            (a - b).abs() <= slack,
            "{name}: kernel {a} vs reference {b} (slack {slack}): {}",
            ctx()
        );
    }
    assert!(
        ltol.accepts(s.loss, s_ref.loss, an.loss_scale),
        "loss: kernel {} vs reference {} (scale {}): {}",
        s.loss,
        s_ref.loss,
        an.loss_scale,
        ctx()
    );
    assert!(
        ltol.accepts(s.ppo_kl_sum, s_ref.ppo_kl_sum, an.ppo_kl_scale),
        "ppo_kl_sum {} vs {}: {}",
        s.ppo_kl_sum,
        s_ref.ppo_kl_sum,
        ctx()
    );
    assert!(
        ltol.accepts(s.kl_sum, s_ref.kl_sum, an.kl_scale),
        "kl_sum {} vs {}: {}",
        s.kl_sum,
        s_ref.kl_sum,
        ctx()
    );
    assert!(
        ltol.accepts(s.ratio_sum, s_ref.ratio_sum, s_ref.ratio_sum),
        "ratio_sum {} vs {}: {}",
        s.ratio_sum,
        s_ref.ratio_sum,
        ctx()
    );
    assert!(
        ltol.accepts(s.ratio_min, s_ref.ratio_min, s_ref.ratio_min),
        "ratio_min {} vs {}: {}",
        s.ratio_min,
        s_ref.ratio_min,
        ctx()
    );
    assert!(
        ltol.accepts(s.ratio_max, s_ref.ratio_max, s_ref.ratio_max),
        "ratio_max {} vs {}: {}",
        s.ratio_max,
        s_ref.ratio_max,
        ctx()
    );
}

fn check_all_dtypes(c: &Case, tuning: Tuning, seed: u64, grad_in_dtype: bool) {
    check_all_dtypes_on(&mut EmuDevice::default(), c, tuning, seed, grad_in_dtype);
}

fn check_all_dtypes_on<D: Device>(
    dev: &mut D,
    c: &Case,
    tuning: Tuning,
    seed: u64,
    grad_in_dtype: bool,
) {
    check_on::<f32, D>(dev, c, tuning, seed, grad_in_dtype);
    check_on::<half::bf16, D>(dev, c, tuning, seed, grad_in_dtype);
    check_on::<half::f16, D>(dev, c, tuning, seed, grad_in_dtype);
}

fn opts_strategy() -> impl Strategy<Value = LossOptions> {
    let agg = prop_oneof![
        Just(Aggregation::TokenMean),
        Just(Aggregation::SeqMeanTokenMean),
        Just(Aggregation::SeqMeanTokenSum),
        Just(Aggregation::SeqMeanTokenSumNorm),
        Just(Aggregation::TokenSum)
    ];
    let kl = prop_oneof![
        Just(KlEstimator::K1),
        Just(KlEstimator::Abs),
        Just(KlEstimator::K2),
        Just(KlEstimator::K3)
    ];
    (
        agg,
        kl,
        prop_oneof![Just(RatioLevel::Token), Just(RatioLevel::Sequence)],
        prop_oneof![Just((0.2, 0.2)), Just((0.2, 0.28)), Just((0.1, 0.3))],
        prop_oneof![Just(0.0), Just(3.0)],
        prop_oneof![Just(0.0), Just(0.04), Just(0.5)],
        prop_oneof![
            Just((0.0, 0.0, 0.0)),
            Just((500.0, 9.0, 64.0)),
            Just((0.0, 0.0, 256.0)),
            Just((37.0, 0.0, 0.0))
        ],
    )
        .prop_map(
            |(aggregation, kl_estimator, ratio_level, (el, eh), dual, beta, (gt, gs, h))| {
                LossOptions {
                    eps_low: el,
                    eps_high: eh,
                    dual_clip: dual,
                    beta,
                    global_tokens: gt,
                    global_sequences: gs,
                    horizon: h,
                    aggregation,
                    ratio_level,
                    kl_estimator,
                    ..LossOptions::default()
                }
            },
        )
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let lens = prop::collection::vec(prop_oneof![8 => 0u32..24, 1 => 60u32..140], 0..7);
    (lens, opts_strategy(), any::<(bool, bool, bool, bool)>()).prop_flat_map(
        |(lens, opts, (has_old, has_ref, per_tok, has_mask))| {
            let n: usize = lens.iter().sum::<u32>() as usize;
            let b = lens.len();
            let logp = prop::collection::vec(-6.0f32..0.0, n);
            let noise = prop_oneof![12 => -0.6f32..0.6, 1 => Just(0.0f32), 1 => -30.0f32..30.0];
            let old = if has_old {
                prop::collection::vec(noise.clone(), n)
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            let rf = if has_ref {
                prop::collection::vec(prop_oneof![8 => -3.0f32..3.0, 1 => -30.0f32..30.0], n)
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            let adv = prop::collection::vec(
                prop_oneof![6 => -2.0f32..2.0, 1 => Just(0.0f32)],
                if per_tok { n } else { b },
            );
            // Some rows fully masked: a per-sequence "drop" flag on top of the per-token mask.
            let mask = if has_mask {
                (
                    prop::collection::vec(prop_oneof![3 => Just(1u8), 1 => Just(0u8)], n),
                    prop::collection::vec(prop_oneof![4 => Just(false), 1 => Just(true)], b),
                )
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            (
                Just(lens),
                logp,
                old,
                rf,
                adv,
                Just(per_tok),
                mask,
                Just(opts),
            )
                .prop_map(|(lens, logp, old, rf, adv, per_tok, mask, opts)| {
                    let o = offsets(&lens);
                    let mask = mask.map(|(mut m, drop)| {
                        for (i, d) in drop.iter().enumerate() {
                            if *d {
                                m[o[i] as usize..o[i + 1] as usize].fill(0);
                            }
                        }
                        m
                    });
                    let logp_old =
                        old.map(|nz: Vec<f32>| logp.iter().zip(&nz).map(|(l, z)| l + z).collect());
                    let logp_ref =
                        rf.map(|nz: Vec<f32>| logp.iter().zip(&nz).map(|(l, z)| l + z).collect());
                    let mut logp = logp;
                    // Masked tokens carry garbage that must not leak into anything.
                    if let Some(m) = &mask {
                        for (t, &k) in m.iter().enumerate() {
                            if k == 0 && t % 3 == 0 {
                                logp[t] = f32::NAN;
                            }
                        }
                    }
                    Case {
                        lens,
                        logp,
                        logp_old,
                        logp_ref,
                        adv,
                        adv_per_token: per_tok,
                        mask,
                        opts,
                    }
                })
        },
    )
}

fn tuning_strategy() -> impl Strategy<Value = Tuning> {
    (
        prop_oneof![Just(32u32), Just(64), Just(256)],
        prop_oneof![Just(None), Just(Some(1u32)), Just(Some(2)), Just(Some(3))],
    )
        .prop_map(|(threads, chunks)| Tuning {
            threads: Some(threads),
            loss_chunks: chunks,
            ..Tuning::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Oracle on random inputs, every dtype, f32 and input-dtype gradients.
    #[test]
    fn pt_loss_matches_reference(c in case_strategy(), tuning in tuning_strategy(), seed in any::<u64>(), grad_in_dtype in any::<bool>()) {
        check_all_dtypes(&c, tuning, seed, grad_in_dtype);
    }

    /// Schedule independence: the gradient is bit-identical under two fiber schedules.
    #[test]
    fn pt_gradient_is_schedule_independent(c in case_strategy(), tuning in tuning_strategy(), seed in any::<u64>()) {
        let (a, _) = run_kernel::<f32>(&c, tuning, seed, false);
        let (b, _) = run_kernel::<f32>(&c, tuning, seed.wrapping_add(0x9e37_79b9), false);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&a), bits(&b));
    }

    /// Schedule independence of the statistics: the blocks' slots are merged in slot order, so
    /// the sums are bit-identical whatever order the blocks ran in (the emulator draws the
    /// block order from the seed).
    #[test]
    fn pt_stats_are_schedule_independent(c in case_strategy(), tuning in tuning_strategy(), seed in any::<u64>()) {
        let (_, a) = run_kernel::<f32>(&c, tuning, seed, false);
        let (_, b) = run_kernel::<f32>(&c, tuning, seed.wrapping_add(0x9e37_79b9), false);
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}

fn base_case(lens: Vec<u32>) -> Case {
    let n: usize = lens.iter().sum::<u32>() as usize;
    let b = lens.len();
    Case {
        logp: (0..n).map(|t| -0.5 - (t % 7) as f32 * 0.3).collect(),
        logp_old: Some(
            (0..n)
                .map(|t| -0.5 - (t % 7) as f32 * 0.3 + ((t % 5) as f32 - 2.0) * 0.15)
                .collect(),
        ),
        logp_ref: Some((0..n).map(|t| -0.7 - (t % 3) as f32 * 0.2).collect()),
        adv: (0..b)
            .map(|i| if i % 2 == 0 { 1.0 } else { -0.7 })
            .collect(),
        adv_per_token: false,
        mask: None,
        lens,
        opts: LossOptions {
            beta: 0.04,
            dual_clip: 3.0,
            ..LossOptions::default()
        },
    }
}

#[test]
fn empty_input_and_one_token() {
    let c = base_case(vec![]);
    check_all_dtypes(&c, Tuning::default(), 1, false);
    let c = base_case(vec![1]);
    check_all_dtypes(&c, Tuning::default(), 2, false);
    let c = base_case(vec![0, 1, 0]);
    check_all_dtypes(&c, Tuning::default(), 3, true);
}

#[test]
fn long_sequence_not_a_multiple_of_the_block_over_many_chunks() {
    // 3000 tokens: default geometry gives 2 chunks of 2048; also force 5 chunks of 64 threads.
    let mut c = base_case(vec![3000, 257, 1]);
    for level in [RatioLevel::Token, RatioLevel::Sequence] {
        c.opts.ratio_level = level;
        check_all_dtypes(&c, Tuning::default(), 4, false);
        let t = Tuning {
            threads: Some(64),
            loss_chunks: Some(5),
            ..Tuning::default()
        };
        check_all_dtypes(&c, t, 5, false);
    }
}

#[test]
fn fully_masked_rows_and_garbage_under_the_mask() {
    let mut c = base_case(vec![5, 4, 6]);
    let mut m = vec![1u8; 15];
    m[5..9].fill(0); // sequence 1 fully masked
    c.logp[5..9].fill(f32::NAN);
    c.logp_old.as_mut().unwrap()[5..9].fill(f32::INFINITY);
    m[0] = 0;
    c.logp[0] = f32::NEG_INFINITY;
    c.mask = Some(m);
    for agg in [
        Aggregation::TokenMean,
        Aggregation::SeqMeanTokenMean,
        Aggregation::SeqMeanTokenSumNorm,
    ] {
        c.opts.aggregation = agg;
        check_all_dtypes(&c, Tuning::default(), 6, false);
        let (g, s) = run_kernel::<f32>(&c, Tuning::default(), 6, false);
        assert_eq!(s.sequences, 2.0);
        assert_eq!(s.tokens, 10.0);
        assert!(g[5..9].iter().all(|x| x.to_bits() == 0));
        assert!(s.loss.is_finite());
    }
}

#[test]
fn everything_masked_gives_zero_loss_and_empty_ratio_range() {
    let mut c = base_case(vec![3, 2]);
    c.mask = Some(vec![0; 5]);
    check_all_dtypes(&c, Tuning::default(), 7, false);
    let (g, s) = run_kernel::<f32>(&c, Tuning::default(), 7, false);
    assert!(g.iter().all(|x| x.to_bits() == 0));
    assert_eq!((s.loss, s.tokens, s.sequences), (0.0, 0.0, 0.0));
    assert_eq!(
        (s.ratio_min, s.ratio_max),
        (f64::INFINITY, f64::NEG_INFINITY)
    );
}

#[test]
fn non_finite_counted_inputs_are_counted() {
    let mut c = base_case(vec![4, 4]);
    c.logp[2] = f32::NAN;
    c.logp_ref.as_mut().unwrap()[6] = f32::INFINITY;
    let (_, s) = run_kernel::<f32>(&c, Tuning::default(), 8, false);
    let (_, r) = run_reference::<f32>(&c);
    assert_eq!(s.non_finite, 2.0);
    assert_eq!(r.non_finite, 2.0);
}

#[test]
fn huge_log_ratios_are_clamped_and_counted() {
    let mut c = base_case(vec![6]);
    let old = c.logp_old.as_mut().unwrap();
    old[1] = c.logp[1] - 25.0; // delta = +25 -> clamped to 20
    old[3] = c.logp[3] + 700.0; // delta = -700 -> clamped to -20
    check_all_dtypes(&c, Tuning::default(), 9, false);
    let (g, s) = run_kernel::<f32>(&c, Tuning::default(), 9, false);
    assert_eq!(s.log_ratio_clamped, 2.0);
    assert!(g.iter().all(|x| x.is_finite()));
}

#[test]
fn gspo_mean_cap_stops_the_surrogate_gradient() {
    let mut c = base_case(vec![4]);
    c.opts.ratio_level = RatioLevel::Sequence;
    c.opts.beta = 0.0;
    c.opts.seq_log_ratio_max = 0.05;
    let old = c.logp_old.as_mut().unwrap();
    for (o, l) in old.iter_mut().zip(&c.logp) {
        *o = l - 0.5; // mean delta 0.5 > 0.05
    }
    c.opts.eps_high = 10.0; // keep the ratio unclipped so only the cap can zero the gradient
    let (g, _) = run_kernel::<f32>(&c, Tuning::default(), 10, false);
    assert!(g.iter().all(|&x| x == 0.0), "{g:?}");
    check_all_dtypes(&c, Tuning::default(), 10, false);
}

/// The same random cases as `pt_loss_matches_reference` (fixed RNG) and the fixed shapes, on
/// the GPU, every dtype, both gradient dtypes.
#[test]
fn gpu_loss_matches_reference() {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let Some(gpu) = common::gpu("gpu_loss_matches_reference") else {
        return;
    };
    let gpu = std::cell::RefCell::new(gpu);
    let config = ProptestConfig {
        cases: common::gpu_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = (case_strategy(), tuning_strategy(), any::<bool>());
    runner
        .run(&strategy, |(c, tuning, grad_in_dtype)| {
            check_all_dtypes_on(&mut *gpu.borrow_mut(), &c, tuning, 0, grad_in_dtype);
            Ok(())
        })
        .unwrap();
    let mut gpu = gpu.into_inner();
    let mut c = base_case(vec![3000, 257, 1, 0]);
    for level in [RatioLevel::Token, RatioLevel::Sequence] {
        c.opts.ratio_level = level;
        for agg in [
            Aggregation::TokenMean,
            Aggregation::SeqMeanTokenMean,
            Aggregation::SeqMeanTokenSumNorm,
        ] {
            c.opts.aggregation = agg;
            check_all_dtypes_on(&mut gpu, &c, Tuning::default(), 0, false);
            check_all_dtypes_on(&mut gpu, &c, Tuning::default(), 0, true);
        }
    }
    check_all_dtypes_on(&mut gpu, &base_case(vec![]), Tuning::default(), 0, false);
    check_all_dtypes_on(&mut gpu, &base_case(vec![1]), Tuning::default(), 0, false);
}

/// Finite inputs whose gradient `|A| * rho * w` passes `f32::MAX` (here `A = -3e38`,
/// `rho = e^0.5`, unclipped since `A < 0` and `rho > 1`): the reference narrows with
/// `narrow_f32` and the kernel saturates its f32 product the same way, so the gradient is
/// `f32::MAX` on both, not `inf` (found by the `loss` fuzz target on the CPU side).
#[test]
fn f32_gradient_beyond_the_f32_range_saturates_like_the_reference() {
    let c = Case {
        lens: vec![1],
        logp: vec![0.0],
        logp_old: Some(vec![-0.5]),
        logp_ref: None,
        adv: vec![-3.0e38],
        adv_per_token: false,
        mask: None,
        opts: LossOptions::default(),
    };
    let (gk, sk) = run_kernel::<f32>(&c, Tuning::default(), 1, false);
    let (gr, sr) = run_reference::<f32>(&c);
    assert_eq!(gk, vec![f32::MAX]); // -A * rho * w > 0 for A < 0
    assert_eq!(gk, gr);
    assert_eq!((sk.non_finite, sr.non_finite), (0.0, 0.0));
}

#[test]
fn gradient_beyond_the_f16_range_is_infinite_in_f16_and_finite_in_f32() {
    // Found by the property test: token_sum weights and |A| = 1e5 give |g| > 65504, the largest
    // finite f16; the f16 gradient is then +-inf, as rounding the reference to f16 gives.
    let mut c = base_case(vec![3]);
    c.opts.aggregation = Aggregation::TokenSum;
    c.opts.beta = 0.0;
    c.adv = vec![1e5];
    let (g16, _) = run_kernel::<half::f16>(&c, Tuning::default(), 1, true);
    let (g32, _) = run_kernel::<half::f16>(&c, Tuning::default(), 1, false);
    assert!(g16.iter().any(|g| g.is_infinite()), "{g16:?}");
    assert!(g32.iter().all(|g| g.is_finite()), "{g32:?}");
    check_all_dtypes(&c, Tuning::default(), 1, true);
}

/// The sequences `lo..hi` of a case as a case of their own (a micro-batch).
fn slice_case(c: &Case, lo: usize, hi: usize) -> Case {
    let o = offsets(&c.lens);
    let (t0, t1) = (o[lo] as usize, o[hi] as usize);
    Case {
        lens: c.lens[lo..hi].to_vec(),
        logp: c.logp[t0..t1].to_vec(),
        logp_old: c.logp_old.as_ref().map(|v| v[t0..t1].to_vec()),
        logp_ref: c.logp_ref.as_ref().map(|v| v[t0..t1].to_vec()),
        adv: if c.adv_per_token {
            c.adv[t0..t1].to_vec()
        } else {
            c.adv[lo..hi].to_vec()
        },
        adv_per_token: c.adv_per_token,
        mask: c.mask.as_ref().map(|v| v[t0..t1].to_vec()),
        opts: c.opts,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// SPEC §11 relation: with the whole batch's denominators passed as global ones, the
    /// micro-batches' gradients are bit-identical to the whole batch's, their losses add up to
    /// its loss and their counts to its counts.
    #[test]
    fn pt_micro_batches_add_up(c in case_strategy(), cut in any::<prop::sample::Index>(), tuning in tuning_strategy()) {
        let o = offsets(&c.lens);
        let counted = |t: usize| c.mask.as_ref().is_none_or(|m| m[t] != 0);
        let mut whole = c.clone();
        let n_tok = (0..c.logp.len()).filter(|&t| counted(t)).count();
        let n_seq = o.windows(2).filter(|w| (w[0] as usize..w[1] as usize).any(counted)).count();
        let h = c.lens.iter().copied().max().unwrap_or(0);
        // A zero count means "this call's own" to the kernels; keep such degenerate batches local.
        prop_assume!(n_tok > 0 && n_seq > 0 && h > 0);
        whole.opts.global_tokens = n_tok as f64;
        whole.opts.global_sequences = n_seq as f64;
        whole.opts.horizon = f64::from(h);
        let k = cut.index(c.lens.len() + 1);
        let (gw, sw) = run_kernel::<f32>(&whole, tuning, 1, false);
        let (ga, sa) = run_kernel::<f32>(&slice_case(&whole, 0, k), tuning, 2, false);
        let (gb, sb) = run_kernel::<f32>(&slice_case(&whole, k, c.lens.len()), tuning, 3, false);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let joined: Vec<f32> = ga.iter().chain(&gb).copied().collect();
        prop_assert_eq!(bits(&gw), bits(&joined));
        prop_assert_eq!(sw.tokens, sa.tokens + sb.tokens);
        prop_assert_eq!(sw.sequences, sa.sequences + sb.sequences);
        prop_assert_eq!(sw.clipped, sa.clipped + sb.clipped);
        let tol = tolerance(Quantity::Loss, Dtype::F32).unwrap();
        let scale = analyse::<f32>(&whole).loss_scale;
        prop_assert!(tol.accepts(sa.loss + sb.loss, sw.loss, scale), "{} + {} vs {}", sa.loss, sb.loss, sw.loss);
    }
}

#[test]
fn sequences_stat_with_a_late_first_token_split_over_chunks() {
    // 200 tokens, the first 70 masked: with 32 threads and 3 chunks the first counted token
    // (70) falls in chunk 2, which alone must count the sequence; the second sequence is fully
    // masked and must not count.
    let mut c = base_case(vec![200, 40]);
    let mut m = vec![1u8; 240];
    m[..70].fill(0);
    m[200..].fill(0);
    c.mask = Some(m);
    for chunks in [1, 2, 3, 7] {
        let t = Tuning {
            threads: Some(32),
            loss_chunks: Some(chunks),
            ..Tuning::default()
        };
        let (_, s) = run_kernel::<f32>(&c, t, 5, false);
        assert_eq!((s.sequences, s.tokens), (1.0, 130.0), "chunks {chunks}");
        check_all_dtypes(&c, t, 5, false);
    }
}
