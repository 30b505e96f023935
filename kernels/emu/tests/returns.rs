//! `discounted_returns_f32`, `gae_f32`, `whiten_stats_f32` and `whiten_apply_f32`, run under the
//! host emulator through the same launch plans as on the GPU, against the `care-core` CPU
//! reference (`care_core::grpo::{discounted_returns, gae, whiten}`).
//!
//! Relations checked: (1) oracle: returns and GAE equal the reference bit for bit (tolerance row
//! `TokenReturn` is 0), whitened values, mean and std within the `Whiten` row, and every error
//! of the reference (a malformed layout, a non-finite counted value) is the status the kernels
//! report; (2) schedule and geometry independence: two fiber schedules and two block sizes give
//! bit-identical outputs; (3) a refused whitening leaves the values untouched, as the reference;
//! (4) the f64 chains (`discounted_returns_whitened`, `gae_whitened`) against the reference's
//! (`care_core::grpo::{discounted_returns_whitened, gae_whitened}`): returns bit for bit,
//! whitened values, mean and std within `Whiten`, at every alignment of the output, where
//! whitening the f32-rounded returns falls outside that tolerance.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::Error;
use care_core::grpo::{GaeOptions, MaskedToken, StdKind, WhitenOptions};
use care_kernels::params::WhitenStatsRaw;
use care_kernels::plan::{TokenBuffers, WhitenBuffers};
use care_kernels::tolerance::{Quantity, Tolerance, tolerance};
use care_kernels::{
    Dtype, KernelError, Tuning, WHITENED_STATUS_OFFSET, WORKSPACE_BYTES, WhitenedOutputs,
    discounted_returns, discounted_returns_whitened, gae, gae_whitened, tokens_status, whiten,
    whiten_result, whitened_result, whitened_workspace_bytes,
};
use care_kernels_emu::Emulator;

mod common;
use common::{Device, EmuDevice};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct TokCase {
    rewards: Vec<f32>,
    values: Vec<f32>,
    offsets: Vec<u32>,
    mask: Option<Vec<u8>>,
    opts: GaeOptions,
}

#[derive(Clone, Debug, PartialEq)]
struct TokOut {
    returns: Vec<f32>,
    adv: Vec<f32>,
    gae_returns: Vec<f32>,
    status_returns: u32,
    status_gae: u32,
}

fn offsets_of(lens: &[u32]) -> Vec<u32> {
    let mut o = vec![0u32];
    for &l in lens {
        o.push(o.last().unwrap() + l);
    }
    o
}

fn run_tokens<D: Device>(dev: &mut D, c: &TokCase, threads: u32, seed: u64) -> TokOut {
    let n = c.rewards.len();
    let buf = TokenBuffers {
        rewards: dev.upload(&c.rewards),
        values: dev.upload(&c.values),
        seq_offsets: dev.upload(&c.offsets),
        n_seq: (c.offsets.len() - 1) as u32,
        n_tok: n as u32,
        mask: c.mask.as_ref().map_or(0, |m| dev.upload(m)),
        workspace: dev.upload(&[0u8; WORKSPACE_BYTES]),
    };
    // Poisoned outputs: every entry must be written.
    let poison = vec![f32::from_bits(0x7fc0_dead); n];
    let (ret, adv, ret2) = (
        dev.upload(&poison),
        dev.upload(&poison),
        dev.upload(&poison),
    );
    let l = dev.launcher(seed);
    let tuning = Tuning {
        threads: Some(threads),
        ..Tuning::default()
    };
    // SAFETY: every buffer holds the documented number of entries.
    unsafe { discounted_returns(&l, &buf, ret, &c.opts, tuning) }.unwrap();
    let status_returns = dev.download::<u32>(buf.workspace, 1)[0];
    // SAFETY: as above.
    unsafe { gae(&l, &buf, adv, ret2, &c.opts, tuning) }.unwrap();
    let status_gae = dev.download::<u32>(buf.workspace, 1)[0];
    let out = TokOut {
        returns: dev.download(ret, n),
        adv: dev.download(adv, n),
        gae_returns: dev.download(ret2, n),
        status_returns,
        status_gae,
    };
    dev.reset();
    out
}

fn assert_exact(got: &[f32], want: &[f32], what: &str) {
    let t = tolerance(Quantity::TokenReturn, Dtype::F32).unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            t.accepts(f64::from(g), f64::from(w), f64::from(w)),
            "{what}[{i}]: kernel {g:e} ({:#x}), reference {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

fn check_tokens_on<D: Device>(dev: &mut D, c: &TokCase, threads: u32, seed: u64) -> TokOut {
    let k = run_tokens(dev, c, threads, seed);
    let n = c.rewards.len();
    let mut ret = vec![0f32; n];
    let r = care_core::grpo::discounted_returns(
        &c.rewards,
        &c.offsets,
        c.mask.as_deref(),
        &c.opts,
        &mut ret,
    );
    assert_eq!(tokens_status(k.status_returns), r.map(|_| ()));
    if r.is_ok() {
        assert_exact(&k.returns, &ret, "returns");
    }
    let (mut adv, mut ret2) = (vec![0f32; n], vec![0f32; n]);
    let r = care_core::grpo::gae(
        &c.rewards,
        &c.values,
        &c.offsets,
        c.mask.as_deref(),
        &c.opts,
        &mut adv,
        &mut ret2,
    );
    assert_eq!(tokens_status(k.status_gae), r.map(|_| ()));
    if r.is_ok() {
        assert_exact(&k.adv, &adv, "gae advantages");
        assert_exact(&k.gae_returns, &ret2, "gae returns");
    }
    k
}

fn check_tokens(c: &TokCase, threads: u32, seed: u64) {
    let mut dev = EmuDevice::default();
    let a = check_tokens_on(&mut dev, c, threads, seed);
    // Another schedule and block size: bit-identical.
    let b = run_tokens(
        &mut dev,
        c,
        if threads == 32 { 64 } else { 32 },
        seed ^ 0x9e37,
    );
    for (x, y) in [(&a.returns, &b.returns), (&a.adv, &b.adv)] {
        let bits = |v: &Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(x), bits(y));
    }
}

fn unit_strategy() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1.0), 0.0f64..=1.0]
}

fn value_strategy() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -4.0f32..4.0,
        1 => Just(0.0f32),
        1 => -3.0e38f32..3.0e38,
    ]
}

fn tok_case_strategy() -> impl Strategy<Value = TokCase> {
    (
        // Sequences of several 128-token tiles too (the kernels stage a sequence tile by tile).
        prop::collection::vec(prop_oneof![6 => 0u32..40, 1 => 100u32..400], 0..10),
        unit_strategy(),
        unit_strategy(),
        any::<bool>(),
    )
        .prop_flat_map(|(lens, gamma, lambda, masked)| {
            let n = lens.iter().sum::<u32>() as usize;
            (
                prop::collection::vec(value_strategy(), n),
                prop::collection::vec(value_strategy(), n),
                prop::collection::vec(
                    prop_oneof![3 => Just(1u8), 1 => Just(0u8), 1 => Just(7u8)],
                    n,
                ),
                Just(lens),
                Just(GaeOptions {
                    gamma,
                    lambda,
                    ..GaeOptions::default()
                }),
                Just(masked),
            )
        })
        .prop_map(|(rewards, values, mask, lens, opts, masked)| TokCase {
            rewards,
            values,
            offsets: offsets_of(&lens),
            mask: masked.then_some(mask),
            opts,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn pt_returns_and_gae_equal_the_reference_bit_for_bit(
        c in tok_case_strategy(),
        threads in prop_oneof![Just(32u32), Just(64)],
        seed in any::<u64>(),
    ) {
        check_tokens(&c, threads, seed);
    }
}

/// The returns alone (GAE refuses the reset rule) under `opts`, kernel against reference, bit
/// for bit.
fn check_returns_only(c: &TokCase, threads: u32, seed: u64) -> Vec<f32> {
    let mut dev = EmuDevice::default();
    let n = c.rewards.len();
    let buf = TokenBuffers {
        rewards: dev.upload(&c.rewards),
        values: 0,
        seq_offsets: dev.upload(&c.offsets),
        n_seq: (c.offsets.len() - 1) as u32,
        n_tok: n as u32,
        mask: c.mask.as_ref().map_or(0, |m| dev.upload(m)),
        workspace: dev.upload(&[0u8; WORKSPACE_BYTES]),
    };
    let ret = dev.upload(&vec![f32::from_bits(0x7fc0_dead); n]);
    let tuning = Tuning {
        threads: Some(threads),
        ..Tuning::default()
    };
    // SAFETY: every buffer holds the documented number of entries.
    unsafe { discounted_returns(&dev.launcher(seed), &buf, ret, &c.opts, tuning) }.unwrap();
    let status = dev.download::<u32>(buf.workspace, 1)[0];
    let got = dev.download::<f32>(ret, n);
    let mut want = vec![0f32; n];
    let r = care_core::grpo::discounted_returns(
        &c.rewards,
        &c.offsets,
        c.mask.as_deref(),
        &c.opts,
        &mut want,
    );
    assert_eq!(tokens_status(status), r.map(|_| ()));
    assert_exact(&got, &want, "returns");
    got
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    /// verl's REINFORCE++ before 2026-08 (the peer suite's class 2): the return restarts at 0
    /// before a masked token; the kernel equals the reference bit for bit.
    #[test]
    fn pt_masked_token_reset_equals_the_reference_bit_for_bit(
        c in tok_case_strategy(),
        threads in prop_oneof![Just(32u32), Just(64)],
        seed in any::<u64>(),
    ) {
        let c = TokCase { opts: GaeOptions { masked_token: MaskedToken::Reset, ..c.opts }, ..c };
        check_returns_only(&c, threads, seed);
    }
}

/// The issue's case: rewards [0, 0, 1 | 0.5], the middle token of the first sequence masked;
/// skip gives [1, 0, 1, 0.5] (verl since 2026-08), reset [0, 0, 1, 0.5] (verl before), and GAE
/// refuses the reset rule before any launch.
#[test]
fn masked_token_rules_on_the_issue_case() {
    for (rule, want) in [
        (MaskedToken::Skip, [1.0f32, 0.0, 1.0, 0.5]),
        (MaskedToken::Reset, [0.0, 0.0, 1.0, 0.5]),
    ] {
        let c = TokCase {
            rewards: vec![0.0, 0.0, 1.0, 0.5],
            values: vec![0.0; 4],
            offsets: vec![0, 3, 4],
            mask: Some(vec![1, 0, 1, 1]),
            opts: GaeOptions {
                masked_token: rule,
                ..GaeOptions::default()
            },
        };
        assert_eq!(check_returns_only(&c, 32, 1), want);
    }
    let mut dev = EmuDevice::default();
    let buf = TokenBuffers {
        rewards: dev.upload(&[0.0f32; 4]),
        values: dev.upload(&[0.0f32; 4]),
        seq_offsets: dev.upload(&[0u32, 4]),
        n_seq: 1,
        n_tok: 4,
        mask: 0,
        workspace: dev.upload(&[0u8; WORKSPACE_BYTES]),
    };
    let (a, r) = (dev.upload(&[0.0f32; 4]), dev.upload(&[0.0f32; 4]));
    let o = GaeOptions {
        masked_token: MaskedToken::Reset,
        ..GaeOptions::default()
    };
    // SAFETY: every buffer holds 4 entries.
    let e = unsafe { gae(&dev.launcher(0), &buf, a, r, &o, Tuning::default()) };
    assert!(matches!(e, Err(KernelError::Core(Error::InvalidArgument))));
}

fn ramp(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * k).collect()
}

#[test]
fn empty_batch_empty_and_fully_masked_sequences() {
    let opts = GaeOptions {
        gamma: 0.9,
        lambda: 0.95,
        ..GaeOptions::default()
    };
    // No sequence, no token.
    check_tokens(
        &TokCase {
            rewards: vec![],
            values: vec![],
            offsets: vec![0],
            mask: None,
            opts,
        },
        32,
        1,
    );
    // Empty sequences between others, and a fully masked one: all of its outputs are 0.
    let lens = [0u32, 3, 0, 4, 5, 0];
    let n = 12;
    let mut mask = vec![1u8; n];
    mask[3..7].fill(0); // the second non-empty sequence
    mask[8] = 0; // one masked token inside the last one
    let c = TokCase {
        rewards: ramp(n, 0.25),
        values: ramp(n, -0.5),
        offsets: offsets_of(&lens),
        mask: Some(mask),
        opts,
    };
    let k = check_tokens_on(&mut EmuDevice::default(), &c, 32, 7);
    assert!(k.returns[3..7].iter().all(|&x| x == 0.0));
    assert!(k.adv[3..7].iter().all(|&x| x == 0.0));
    assert_eq!((k.adv[8], k.gae_returns[8]), (0.0, 0.0));
}

#[test]
fn gamma_and_lambda_edges_and_long_sequences() {
    for (gamma, lambda) in [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0), (0.99, 0.95)] {
        let opts = GaeOptions {
            gamma,
            lambda,
            ..GaeOptions::default()
        };
        // One sequence of 5000 tokens, then 1000 sequences of 3: one thread each.
        let c = TokCase {
            rewards: ramp(5000, 0.01),
            values: ramp(5000, 0.02),
            offsets: vec![0, 5000],
            mask: None,
            opts,
        };
        let k = check_tokens_on(&mut EmuDevice::default(), &c, 64, 3);
        if gamma == 0.0 {
            // No discounting: the return is the reward itself.
            assert_eq!(k.returns, c.rewards);
        }
        if (gamma, lambda) == (1.0, 1.0) {
            // GAE telescopes to returns minus values (up to the f32 roundings of each).
            for t in 0..5000 {
                let want = f64::from(k.returns[t]) - f64::from(c.values[t]);
                assert!((f64::from(k.adv[t]) - want).abs() <= 1e-3, "{t}");
            }
        }
        let c = TokCase {
            rewards: ramp(3000, 1.0),
            values: ramp(3000, -1.0),
            offsets: offsets_of(&[3; 1000]),
            mask: Some((0..3000).map(|i| u8::from(i % 5 != 0)).collect()),
            opts,
        };
        check_tokens_on(&mut EmuDevice::default(), &c, 64, 4);
    }
}

#[test]
fn outputs_beyond_the_f32_range_saturate_like_the_reference() {
    let c = TokCase {
        rewards: vec![3.0e38; 4],
        values: vec![-3.0e38; 4],
        offsets: vec![0, 4],
        mask: None,
        opts: GaeOptions::default(),
    };
    let k = check_tokens_on(&mut EmuDevice::default(), &c, 32, 5);
    assert_eq!(k.returns[0], f32::MAX);
    assert_eq!(k.adv[0], f32::MAX);
}

#[test]
fn malformed_offsets_report_the_layout_and_stay_in_bounds() {
    // Each is refused by the reference with InvalidLayout: the kernels report it in the status
    // and never index outside the 6 tokens (the buffers are exactly that long).
    let bad = [
        vec![1u32, 6],
        vec![0, 4, 2, 6],
        vec![0, 3, 5],
        vec![0, 3, 9],
        vec![0, u32::MAX],
        vec![5],
    ];
    for offsets in bad {
        let c = TokCase {
            rewards: ramp(6, 1.0),
            values: ramp(6, 2.0),
            offsets: offsets.clone(),
            mask: None,
            opts: GaeOptions::default(),
        };
        let k = check_tokens_on(&mut EmuDevice::default(), &c, 32, 6);
        assert_eq!(
            tokens_status(k.status_gae),
            Err(Error::InvalidLayout),
            "{offsets:?}"
        );
    }
}

#[test]
fn missing_buffers_and_bad_options_are_refused_before_any_launch() {
    let l = Emulator { seed: 0 };
    let ws = [0u128; WORKSPACE_BYTES / 16];
    let buf = TokenBuffers {
        rewards: 16,
        values: 16,
        seq_offsets: 16,
        n_seq: 1,
        n_tok: 1,
        mask: 0,
        workspace: ws.as_ptr() as usize as u64,
    };
    let opts = GaeOptions::default();
    let t = Tuning::default();
    let err = |e: Error| Err(KernelError::Core(e));
    // SAFETY (all): refused before any access.
    unsafe {
        assert_eq!(
            discounted_returns(&l, &buf, 0, &opts, t),
            err(Error::InvalidArgument)
        );
        let nov = TokenBuffers { values: 0, ..buf };
        assert_eq!(gae(&l, &nov, 16, 16, &opts, t), err(Error::InvalidArgument));
        assert_eq!(gae(&l, &buf, 0, 16, &opts, t), err(Error::InvalidArgument));
        let bad = GaeOptions {
            gamma: 1.5,
            lambda: 1.0,
            ..GaeOptions::default()
        };
        assert_eq!(gae(&l, &buf, 16, 16, &bad, t), err(Error::InvalidArgument));
        let bad = GaeOptions {
            gamma: 1.0,
            lambda: f64::NAN,
            ..GaeOptions::default()
        };
        assert_eq!(
            discounted_returns(&l, &buf, 16, &bad, t),
            err(Error::InvalidArgument)
        );
        let t48 = Tuning {
            threads: Some(48),
            ..t
        };
        assert_eq!(
            discounted_returns(&l, &buf, 16, &opts, t48),
            err(Error::InvalidArgument)
        );
        let w = WhitenBuffers {
            values: 0,
            mask: 0,
            n: 1,
            workspace: buf.workspace,
        };
        assert_eq!(
            whiten(&l, &w, &WhitenOptions::default(), t),
            err(Error::InvalidArgument)
        );
        let w = WhitenBuffers { values: 16, ..w };
        let neg = WhitenOptions {
            eps: -1.0,
            ..WhitenOptions::default()
        };
        assert_eq!(whiten(&l, &w, &neg, t), err(Error::InvalidArgument));
    }
}

// ---- whitening -------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct WhitenCase {
    values: Vec<f32>,
    mask: Option<Vec<u8>>,
    opts: WhitenOptions,
}

fn run_whiten<D: Device>(
    dev: &mut D,
    c: &WhitenCase,
    tuning: Tuning,
    seed: u64,
) -> (Vec<f32>, WhitenStatsRaw) {
    let buf = WhitenBuffers {
        values: dev.upload(&c.values),
        mask: c.mask.as_ref().map_or(0, |m| dev.upload(m)),
        n: c.values.len() as u64,
        // Garbage in the workspace: the plan must reset what it reads.
        workspace: dev.upload(&[0xffu8; WORKSPACE_BYTES]),
    };
    // SAFETY: the buffers hold `n` entries and the workspace WORKSPACE_BYTES.
    unsafe { whiten(&dev.launcher(seed), &buf, &c.opts, tuning) }.unwrap();
    let stats: WhitenStatsRaw = dev.download(buf.workspace, 1)[0];
    let out = dev.download(buf.values, c.values.len());
    dev.reset();
    (out, stats)
}

fn check_whiten_on<D: Device>(dev: &mut D, c: &WhitenCase, tuning: Tuning, seed: u64) -> Vec<f32> {
    let (got, stats) = run_whiten(dev, c, tuning, seed);
    let mut want = c.values.clone();
    let r = care_core::grpo::whiten(&mut want, c.mask.as_deref(), &c.opts);
    let k = whiten_result(&stats);
    match r {
        Err(e) => {
            assert_eq!(k, Err(e));
            // Refused: the values are left as they were (bit for bit, NaNs included).
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&c.values));
        }
        Ok((mean, std)) => {
            let (kmean, kstd) = k.unwrap();
            let t = tolerance(Quantity::Whiten, Dtype::F32).unwrap();
            let counted: Vec<f64> = c
                .values
                .iter()
                .enumerate()
                .filter(|(i, _)| c.mask.as_ref().is_none_or(|m| m[*i] != 0))
                .map(|(_, &v)| f64::from(v))
                .collect();
            let max = counted.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            let inv = stats.scale;
            assert!(t.accepts(kmean, mean, max), "mean {kmean} vs {mean}");
            assert!(t.accepts(kstd, std, max), "std {kstd} vs {std}");
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let bound = t.bound(max * inv, f64::from(w));
                assert!(
                    Tolerance::within(f64::from(g), f64::from(w), bound),
                    "x[{i}]: kernel {g:e}, reference {w:e}, bound {bound:e}"
                );
                if c.mask.as_ref().is_some_and(|m| m[i] == 0) {
                    assert_eq!(g.to_bits(), 0, "masked x[{i}] is +0");
                }
            }
        }
    }
    got
}

fn check_whiten(c: &WhitenCase, seed: u64) {
    let mut dev = EmuDevice::default();
    // 32 threads: the statistics of up to 1200 values spread over up to 5 blocks (8 values a
    // thread), merged through the slots.
    let small = Tuning {
        threads: Some(32),
        max_blocks: Some(4),
        ..Tuning::default()
    };
    let a = check_whiten_on(&mut dev, c, small, seed);
    // Other schedules (block order and fiber order): bit-identical values and statistics (the
    // blocks' slots are merged in a fixed order, no atomics).
    let (b, sb) = run_whiten(&mut dev, c, small, seed ^ 0x51);
    let (_, sc) = run_whiten(&mut dev, c, small, seed ^ 0x77);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
    assert_eq!(format!("{sb:?}"), format!("{sc:?}"));
}

fn whiten_strategy() -> impl Strategy<Value = WhitenCase> {
    (
        prop::collection::vec(
            prop_oneof![
                20 => -10.0f32..10.0,
                2 => Just(1.5f32),
                1 => -3.0e38f32..3.0e38,
                1 => Just(f32::NAN),
                1 => Just(f32::INFINITY),
            ],
            0..1200,
        ),
        any::<bool>(),
        prop_oneof![Just(0.0f64), Just(1e-8), Just(1.0)],
        prop_oneof![Just(StdKind::Unbiased), Just(StdKind::Biased)],
        any::<u64>(),
        prop_oneof![3 => Just(0.0f64), 1 => Just(1e-8)],
    )
        .prop_map(|(values, masked, eps, std_kind, bits, count_eps)| {
            // The mask hides most of the non-finite values, so both outcomes are common.
            let mask: Vec<u8> = values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let bit = (bits >> (i % 64)) & 1 == 1;
                    u8::from(if v.is_finite() {
                        bit || i % 3 != 0
                    } else {
                        bit
                    })
                })
                .collect();
            WhitenCase {
                values,
                mask: masked.then_some(mask),
                opts: WhitenOptions {
                    eps,
                    std_kind,
                    count_eps,
                },
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn pt_whiten_matches_the_reference(c in whiten_strategy(), seed in any::<u64>()) {
        check_whiten(&c, seed);
    }
}

#[test]
fn whiten_edge_counts_and_equal_values() {
    let d = WhitenOptions::default();
    let cases = [
        // Empty batch: nothing launched, mean and std 0.
        (vec![], None, d),
        // Nothing counted: every value becomes 0.
        (vec![1.0, 2.0, f32::NAN], Some(vec![0, 0, 0]), d),
        // One counted value: it is the mean, so exactly 0 (also with eps 0: scale inf).
        (
            vec![3.0, 7.0],
            Some(vec![0, 1]),
            WhitenOptions { eps: 0.0, ..d },
        ),
        (vec![3.0, 7.0], Some(vec![1, 0]), d),
        // All counted values equal, eps 0: var 0, every output exactly 0.
        (vec![0.1; 100], None, WhitenOptions { eps: 0.0, ..d }),
        // A NaN or an infinity that counts: refused, untouched.
        (vec![1.0, f32::NAN, 2.0], None, d),
        (vec![1.0, f32::NEG_INFINITY, 2.0], Some(vec![1, 1, 0]), d),
        // A masked NaN does not count.
        (vec![1.0, f32::NAN, 2.0], Some(vec![1, 0, 1]), d),
        // Near-equal large values (catastrophic cancellation in E[x^2] - E[x]^2).
        (
            (0..1000).map(|i| 1.0e4 + (i % 7) as f32 * 1e-3).collect(),
            None,
            WhitenOptions {
                std_kind: StdKind::Biased,
                ..d
            },
        ),
    ];
    for (values, mask, opts) in cases {
        check_whiten(&WhitenCase { values, mask, opts }, 9);
    }
}

/// verl's `masked_mean` (`count_eps = 1e-8`, the peer suite's class 6): equal values whiten to
/// verl's residue instead of 0, near-equal large ones keep their spread; the kernel agrees.
#[test]
fn whiten_with_verls_count_eps() {
    let verl = WhitenOptions {
        count_eps: 1e-8,
        ..WhitenOptions::default()
    };
    for (values, mask) in [
        (vec![0.1f32; 16], None),
        (
            (0..1000).map(|i| 500.0 + (i % 7) as f32 * 1e-2).collect(),
            None,
        ),
        (vec![3.0, 7.0, 5.0], Some(vec![1, 1, 0])),
    ] {
        let c = WhitenCase {
            values,
            mask,
            opts: verl,
        };
        let got = check_whiten_on(&mut EmuDevice::default(), &c, Tuning::default(), 5);
        if c.values[0] == 0.1 {
            assert!(got.iter().all(|&x| x != 0.0 && x.abs() < 1e-3), "{got:?}");
        }
    }
}

#[test]
fn whiten_of_many_values_with_the_default_geometry() {
    let values: Vec<f32> = (0..100_000)
        .map(|i| ((i * 7919 % 10007) as f32).sqrt())
        .collect();
    let mask: Vec<u8> = (0..100_000).map(|i| u8::from(i % 3 != 0)).collect();
    let c = WhitenCase {
        values,
        mask: Some(mask),
        opts: WhitenOptions::default(),
    };
    check_whiten_on(&mut EmuDevice::default(), &c, Tuning::default(), 11);
}

/// The same random cases (fixed RNG) and large shapes on the GPU.
#[test]
fn gpu_returns_gae_and_whiten_match_reference() {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let Some(gpu) = common::gpu("gpu_returns_gae_and_whiten_match_reference") else {
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
    runner
        .run(&(tok_case_strategy(), any::<u64>()), |(c, seed)| {
            check_tokens_on(&mut *gpu.borrow_mut(), &c, 64, seed);
            Ok(())
        })
        .unwrap();
    runner
        .run(&whiten_strategy(), |c| {
            check_whiten_on(&mut *gpu.borrow_mut(), &c, Tuning::default(), 0);
            Ok(())
        })
        .unwrap();
    let mut gpu = gpu.into_inner();
    let c = TokCase {
        rewards: ramp(200_000, 0.01),
        values: ramp(200_000, 0.02),
        offsets: offsets_of(&[2000; 100]),
        mask: Some((0..200_000).map(|i| u8::from(i % 9 != 0)).collect()),
        opts: GaeOptions {
            gamma: 0.99,
            lambda: 0.95,
            ..GaeOptions::default()
        },
    };
    check_tokens_on(&mut gpu, &c, 64, 0);
    let w = WhitenCase {
        values: ramp(3_000_000, 0.5),
        mask: None,
        opts: WhitenOptions::default(),
    };
    check_whiten_on(&mut gpu, &w, Tuning::default(), 0);
}

// ---- the f64 chains: returns or GAE, then whitening, never rounded in between ---------------

/// What a chained call left: the returns, the whitened values and the two status sources.
struct Chained {
    returns: Vec<f32>,
    advantages: Vec<f32>,
    stats: WhitenStatsRaw,
    tokens_status: u32,
}

/// Runs `discounted_returns_whitened` (or `gae_whitened` with `gae`), the advantages output
/// `shift` floats past a 16-byte boundary (the plan aligns its f64 scratch to it).
fn run_whitened<D: Device>(
    dev: &mut D,
    c: &TokCase,
    w: &WhitenOptions,
    gae: bool,
    shift: usize,
    tuning: Tuning,
    seed: u64,
) -> Chained {
    let n = c.rewards.len();
    let ws_len = whitened_workspace_bytes(n as u32);
    let buf = TokenBuffers {
        rewards: dev.upload(&c.rewards),
        values: if gae { dev.upload(&c.values) } else { 0 },
        seq_offsets: dev.upload(&c.offsets),
        n_seq: (c.offsets.len() - 1) as u32,
        n_tok: n as u32,
        mask: c.mask.as_ref().map_or(0, |m| dev.upload(m)),
        // Garbage in the workspace: the plan must reset what it reads.
        workspace: dev.upload(&vec![0xffu8; ws_len]),
    };
    let poison = vec![f32::from_bits(0x7fc0_dead); n + shift];
    let adv = dev.upload(&poison) + 4 * shift as u64;
    let out = WhitenedOutputs {
        advantages: adv,
        returns: dev.upload(&poison[..n]),
        workspace_len: ws_len,
    };
    let l = dev.launcher(seed);
    // SAFETY: every buffer holds the documented number of entries, the workspace ws_len bytes.
    unsafe {
        if gae {
            gae_whitened(&l, &buf, &out, &c.opts, w, tuning)
        } else {
            discounted_returns_whitened(&l, &buf, &out, &c.opts, w, tuning)
        }
    }
    .unwrap();
    let got = Chained {
        returns: dev.download(out.returns, n),
        advantages: dev.download(adv, n),
        stats: dev.download(buf.workspace, 1)[0],
        tokens_status: dev.download(buf.workspace + WHITENED_STATUS_OFFSET as u64, 1)[0],
    };
    dev.reset();
    got
}

/// The chain on the device against the reference's: the same error, or the returns bit for
/// bit and the whitened values, mean and std within `Whiten`; a refused call leaves the
/// advantages as they were. Returns the device's advantages.
#[allow(clippy::too_many_arguments)] // the case and how to run it
fn check_whitened_on<D: Device>(
    dev: &mut D,
    c: &TokCase,
    w: &WhitenOptions,
    gae: bool,
    shift: usize,
    tuning: Tuning,
    seed: u64,
) -> Vec<f32> {
    let k = run_whitened(dev, c, w, gae, shift, tuning, seed);
    let n = c.rewards.len();
    let (mut adv, mut ret) = (vec![0f32; n], vec![0f32; n]);
    let m = c.mask.as_deref();
    let r = if gae {
        care_core::grpo::gae_whitened(
            &c.rewards, &c.values, &c.offsets, m, &c.opts, w, &mut adv, &mut ret,
        )
    } else {
        care_core::grpo::discounted_returns_whitened(
            &c.rewards, &c.offsets, m, &c.opts, w, &mut adv, &mut ret,
        )
    };
    let got = whitened_result(&k.stats, k.tokens_status);
    match r {
        Err(e) => {
            assert_eq!(got, Err(e), "{c:?}");
            if e == Error::NonFinite {
                // The whitening wrote nothing (the reference writes nothing at all).
                assert!(k.advantages.iter().all(|v| v.to_bits() == 0x7fc0_dead));
            }
        }
        Ok((mean, std)) => {
            let (kmean, kstd) = got.unwrap();
            assert_exact(&k.returns, &ret, "returns");
            // The scale of the whitened quantity: the largest unrounded value counted.
            let mut wide = vec![0f64; n];
            if gae {
                let mut r2 = vec![0f64; n];
                care_core::grpo::gae(
                    &c.rewards, &c.values, &c.offsets, m, &c.opts, &mut wide, &mut r2,
                )
                .unwrap();
            } else {
                care_core::grpo::discounted_returns(&c.rewards, &c.offsets, m, &c.opts, &mut wide)
                    .unwrap();
            }
            let max = wide.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            let t = tolerance(Quantity::Whiten, Dtype::F32).unwrap();
            assert!(t.accepts(kmean, mean, max), "mean {kmean} vs {mean}");
            assert!(t.accepts(kstd, std, max), "std {kstd} vs {std}");
            for (i, (&g, &want)) in k.advantages.iter().zip(&adv).enumerate() {
                let bound = t.bound(max * k.stats.scale, f64::from(want));
                assert!(
                    Tolerance::within(f64::from(g), f64::from(want), bound),
                    "adv[{i}]: kernel {g:e}, reference {want:e}, bound {bound:e}"
                );
                if m.is_some_and(|m| m[i] == 0) {
                    assert_eq!(g.to_bits(), 0, "masked adv[{i}] is +0");
                }
            }
        }
    }
    k.advantages
}

fn whiten_opts_strategy() -> impl Strategy<Value = WhitenOptions> {
    (
        prop_oneof![Just(0.0f64), Just(1e-8), Just(1.0)],
        prop_oneof![Just(StdKind::Unbiased), Just(StdKind::Biased)],
        prop_oneof![3 => Just(0.0f64), 1 => Just(1e-8)],
    )
        .prop_map(|(eps, std_kind, count_eps)| WhitenOptions {
            eps,
            std_kind,
            count_eps,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    /// The f64 chains against the reference's on random ragged batches (the returns with either
    /// masked-token rule), at every alignment of the output and two schedules.
    #[test]
    fn pt_whitened_chains_match_the_reference(
        c in tok_case_strategy(),
        w in whiten_opts_strategy(),
        reset in any::<bool>(),
        shift in 0usize..4,
        threads in prop_oneof![Just(None), Just(Some(32u32)), Just(Some(64))],
        seed in any::<u64>(),
    ) {
        let tuning = Tuning { threads, ..Tuning::default() };
        let mut dev = EmuDevice::default();
        let a = check_whitened_on(&mut dev, &c, &w, true, shift, tuning, seed);
        let b = run_whitened(&mut dev, &c, &w, true, shift, tuning, seed ^ 0x51);
        prop_assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.advantages.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let rule = if reset { MaskedToken::Reset } else { MaskedToken::Skip };
        let c = TokCase { opts: GaeOptions { masked_token: rule, ..c.opts }, ..c };
        check_whitened_on(&mut dev, &c, &w, false, shift, tuning, seed);
    }
}

/// Returns around 500 with a spread of 1e-3 (verl's `reinforce_plus_plus` on rewards of 50 and
/// 500 at gamma 0.9, the peer suite's class 6): the chain matches the f64 reference, while
/// whitening the returns after rounding them to f32 (the two-call route) does not.
#[test]
fn whitened_returns_are_not_rounded_before_whitening() {
    let b = 64;
    let mut rewards = Vec::new();
    for i in 0..b {
        let d = (i as f32 * 0.37).sin() * 1e-3;
        rewards.extend([50.0 + d, 500.0 - d]);
    }
    let c = TokCase {
        rewards,
        values: vec![0.0; 2 * b],
        offsets: (0..=b as u32).map(|i| 2 * i).collect(),
        mask: None,
        opts: GaeOptions {
            gamma: 0.9,
            ..GaeOptions::default()
        },
    };
    let w = WhitenOptions {
        count_eps: 1e-8,
        ..WhitenOptions::default()
    };
    let mut dev = EmuDevice::default();
    check_whitened_on(&mut dev, &c, &w, false, 1, Tuning::default(), 3);
    // The two-call route: returns rounded to f32, then whitened.
    let n = c.rewards.len();
    let (mut adv, mut ret) = (vec![0f32; n], vec![0f32; n]);
    care_core::grpo::discounted_returns_whitened(
        &c.rewards, &c.offsets, None, &c.opts, &w, &mut adv, &mut ret,
    )
    .unwrap();
    let mut rounded = ret.clone();
    care_core::grpo::whiten(&mut rounded, None, &w).unwrap();
    let t = tolerance(Quantity::Whiten, Dtype::F32).unwrap();
    let outside = rounded
        .iter()
        .zip(&adv)
        .filter(|&(&g, &want)| !t.accepts(f64::from(g), f64::from(want), 1.0))
        .count();
    assert!(
        outside > n / 2,
        "only {outside} of {n} rounded values differ"
    );
}

/// A counted non-finite reward (the whitening refuses: the advantages stay as they were), a
/// malformed layout (reported first), and the refusals before any launch: a workspace one byte
/// short, GAE with the reset rule, a missing advantages output.
#[test]
fn whitened_chains_report_and_refuse_as_the_reference() {
    let w = WhitenOptions::default();
    let mut c = TokCase {
        rewards: vec![1.0, f32::NAN, 2.0, 0.5],
        values: vec![0.0; 4],
        offsets: vec![0, 3, 4],
        mask: None,
        opts: GaeOptions::default(),
    };
    for gae in [false, true] {
        check_whitened_on(
            &mut EmuDevice::default(),
            &c,
            &w,
            gae,
            0,
            Tuning::default(),
            1,
        );
    }
    c.rewards[1] = 3.0;
    c.offsets = vec![0, 5, 4];
    for gae in [false, true] {
        let k = run_whitened(
            &mut EmuDevice::default(),
            &c,
            &w,
            gae,
            0,
            Tuning::default(),
            1,
        );
        assert_eq!(
            whitened_result(&k.stats, k.tokens_status),
            Err(Error::InvalidLayout)
        );
    }
    let mut dev = EmuDevice::default();
    let n = 4;
    let ws_len = whitened_workspace_bytes(n);
    let buf = TokenBuffers {
        rewards: dev.upload(&[1.0f32; 4]),
        values: dev.upload(&[0.0f32; 4]),
        seq_offsets: dev.upload(&[0u32, 4]),
        n_seq: 1,
        n_tok: n,
        mask: 0,
        workspace: dev.upload(&vec![0u8; ws_len]),
    };
    let out = WhitenedOutputs {
        advantages: dev.upload(&[0.0f32; 4]),
        returns: dev.upload(&[0.0f32; 4]),
        workspace_len: ws_len - 1,
    };
    let refused = |e: Result<(), KernelError<_>>| {
        assert!(
            matches!(e, Err(KernelError::Core(Error::InvalidArgument))),
            "{e:?}"
        );
    };
    let o = GaeOptions::default();
    let l = dev.launcher(0);
    // SAFETY (all): refused before any launch; the buffers hold 4 entries.
    refused(unsafe { discounted_returns_whitened(&l, &buf, &out, &o, &w, Tuning::default()) });
    let out = WhitenedOutputs {
        workspace_len: ws_len,
        ..out
    };
    let reset = GaeOptions {
        masked_token: MaskedToken::Reset,
        ..o
    };
    refused(unsafe { gae_whitened(&l, &buf, &out, &reset, &w, Tuning::default()) });
    let none = WhitenedOutputs {
        advantages: 0,
        ..out
    };
    refused(unsafe { gae_whitened(&l, &buf, &none, &o, &w, Tuning::default()) });
    let bad_w = WhitenOptions { eps: -1.0, ..w };
    refused(unsafe { discounted_returns_whitened(&l, &buf, &out, &o, &bad_w, Tuning::default()) });
}

/// The same random cases and a long batch on the GPU.
#[test]
fn gpu_whitened_chains_match_reference() {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let Some(gpu) = common::gpu("gpu_whitened_chains_match_reference") else {
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
    runner
        .run(
            &(
                tok_case_strategy(),
                whiten_opts_strategy(),
                0usize..4,
                any::<bool>(),
            ),
            |(c, w, shift, gae)| {
                check_whitened_on(
                    &mut *gpu.borrow_mut(),
                    &c,
                    &w,
                    gae,
                    shift,
                    Tuning::default(),
                    0,
                );
                Ok(())
            },
        )
        .unwrap();
    let mut gpu = gpu.into_inner();
    let c = TokCase {
        rewards: ramp(400_000, 0.01),
        values: ramp(400_000, 0.02),
        offsets: offsets_of(&[4000; 100]),
        mask: Some((0..400_000).map(|i| u8::from(i % 9 != 0)).collect()),
        opts: GaeOptions {
            gamma: 0.99,
            lambda: 0.95,
            ..GaeOptions::default()
        },
    };
    for gae in [false, true] {
        check_whitened_on(
            &mut gpu,
            &c,
            &WhitenOptions::default(),
            gae,
            1,
            Tuning::default(),
            0,
        );
    }
}
