//! `group_advantages_f32`, `batch_std_f32` and `group_alpha_f32`, run under the host emulator
//! through the same launch plan as on the GPU, against the `care-core` CPU reference, for every
//! baseline (OPO's lengths and ReMax's external baselines included), the std floor and the GPG
//! factor.
//!
//! Relations checked: (1) oracle: advantages, per-group stats, token broadcast and error status
//! equal the reference within `care_kernels::tolerance`; (2) schedule independence: two fiber
//! schedules (seeds) give bit-identical outputs; (3) team independence: warp-per-group and
//! block-per-group give bit-identical outputs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::Error;
use care_core::grpo::{
    AdvantageOptions, Baseline, GroupInputs, GroupLayout, GroupStats, Preset, Reweight, Scale,
    SingletonPolicy, StdKind, broadcast_to_tokens, group_advantages_with,
};
use care_kernels::plan::{AdvantageBuffers, AdvantageInputs, DeviceGroups};
use care_kernels::tolerance::{Quantity, tolerance};
use care_kernels::{Dtype, KernelError, Tuning, WORKSPACE_BYTES, advantage_status};
use care_kernels_emu::{Emulator, addr, addr_mut};

mod common;
use common::{Device, EmuDevice};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Layout {
    Fixed(u32),
    Offsets(Vec<u32>),
}

#[derive(Clone, Debug)]
struct Case {
    rewards: Vec<f32>,
    valid: Option<Vec<u8>>,
    layout: Layout,
    opts: AdvantageOptions,
    /// Token lengths per sample and the token mask, for the fused broadcast.
    broadcast: Option<(Vec<u32>, Option<Vec<u8>>)>,
    /// Response lengths (OPO) and external baselines (ReMax), one per sample.
    lengths: Vec<u32>,
    baselines: Vec<f32>,
}

/// Deterministic per-sample lengths and external baselines for `n` samples.
fn extra_inputs(n: usize) -> (Vec<u32>, Vec<f32>) {
    (
        (0..n).map(|i| (i * 7 % 13) as u32).collect(),
        (0..n).map(|i| ((i * 29 % 17) as f32 - 8.0) / 8.0).collect(),
    )
}

#[derive(Clone, Debug, PartialEq)]
struct KernelOut {
    adv: Vec<f32>,
    stats: Vec<GroupStats>,
    adv_tok: Vec<f32>,
    status: u32,
}

fn num_groups(c: &Case) -> usize {
    match &c.layout {
        Layout::Fixed(g) => c.rewards.len().checked_div(*g as usize).unwrap_or(0),
        Layout::Offsets(o) => o.len() - 1,
    }
}

fn tok_offsets(lens: &[u32]) -> Vec<u32> {
    let mut o = vec![0u32];
    for l in lens {
        o.push(o.last().unwrap() + l);
    }
    o
}

fn run_kernel<D: Device>(
    dev: &mut D,
    c: &Case,
    tuning: Tuning,
    seed: u64,
) -> Result<KernelOut, KernelError<<D::B as care_kernels::Launcher>::Error>> {
    dev.reset();
    let n = c.rewards.len();
    let b = num_groups(c);
    let (toff, tmask) = match &c.broadcast {
        Some((lens, m)) => (tok_offsets(lens), m.clone()),
        None => (Vec::new(), None),
    };
    let n_tok = toff.last().copied().unwrap_or(0) as usize;
    // Outputs are poisoned: every entry must be written.
    let adv = dev.upload(&vec![f32::NAN; n]);
    let stats = dev.upload(&vec![0xEEEE_EEEEu32; 4 * b]);
    let ws = dev.upload(&[0xAAu8; WORKSPACE_BYTES]);
    let adv_tok = dev.upload(&vec![f32::NAN; n_tok]);
    let groups = match &c.layout {
        Layout::Fixed(g) => DeviceGroups::Fixed { group_size: *g },
        Layout::Offsets(o) => DeviceGroups::Offsets {
            ptr: dev.upload(o),
            num_groups: (o.len() - 1) as u32,
        },
    };
    let buf = AdvantageBuffers {
        rewards: dev.upload(&c.rewards),
        valid: match &c.valid {
            Some(v) => dev.upload(v),
            None => 0,
        },
        n: n as u32,
        groups,
        adv,
        group_stats: stats,
        tok_offsets: if c.broadcast.is_some() {
            dev.upload(&toff)
        } else {
            0
        },
        tok_mask: match &tmask {
            Some(m) => dev.upload(m),
            None => 0,
        },
        adv_tok: if c.broadcast.is_some() { adv_tok } else { 0 },
        workspace: ws,
        batch_std: 0,
    };
    let inputs = AdvantageInputs {
        baselines: dev.upload(&c.baselines),
        lengths: dev.upload(&c.lengths),
    };
    // SAFETY: every address was uploaded with the documented size.
    unsafe {
        care_kernels::group_advantages_with(&dev.launcher(seed), &buf, &inputs, &c.opts, tuning)
    }?;
    let raw: Vec<u32> = dev.download(stats, 4 * b);
    let stats = raw
        .chunks_exact(4)
        .map(|q| GroupStats {
            count: q[0],
            mean: f32::from_bits(q[1]),
            std: f32::from_bits(q[2]),
            zero_variance: q[3],
        })
        .collect();
    Ok(KernelOut {
        adv: dev.download(adv, n),
        stats,
        adv_tok: if c.broadcast.is_some() {
            dev.download(adv_tok, n_tok)
        } else {
            Vec::new()
        },
        status: dev.download::<u32>(ws, 1)[0],
    })
}

type Reference = (Vec<f32>, Vec<GroupStats>, Vec<f32>);

fn run_reference(c: &Case) -> Result<Reference, Error> {
    let n = c.rewards.len();
    let mut adv = vec![0f32; n];
    let mut stats = vec![GroupStats::default(); num_groups(c)];
    let layout = match &c.layout {
        Layout::Fixed(g) => GroupLayout::Fixed {
            group_size: *g as usize,
        },
        Layout::Offsets(o) => GroupLayout::Offsets(o),
    };
    let inputs = GroupInputs {
        lengths: Some(&c.lengths),
        baselines: Some(&c.baselines),
        ..GroupInputs::new(&c.rewards, c.valid.as_deref(), layout)
    };
    group_advantages_with(&inputs, &c.opts, &mut adv, Some(&mut stats))?;
    let mut tok = Vec::new();
    if let Some((lens, mask)) = &c.broadcast {
        let o = tok_offsets(lens);
        tok = vec![0f32; *o.last().unwrap() as usize];
        broadcast_to_tokens(&adv, &o, mask.as_deref(), &mut tok)?;
    }
    Ok((adv, stats, tok))
}

fn assert_matches(c: &Case, k: &KernelOut, r: &Reference) {
    let tol = tolerance(Quantity::Advantage, Dtype::F32).unwrap();
    let stol = tolerance(Quantity::GroupStat, Dtype::F32).unwrap();
    for (i, (&g, &w)) in k.adv.iter().zip(&r.0).enumerate() {
        assert!(
            tol.accepts(f64::from(g), f64::from(w), f64::from(w)),
            "adv[{i}]: kernel {g} vs reference {w}\n{c:?}"
        );
    }
    for (gi, (gs, rs)) in k.stats.iter().zip(&r.1).enumerate() {
        assert_eq!(gs.count, rs.count, "group {gi} count");
        assert_eq!(
            gs.zero_variance, rs.zero_variance,
            "group {gi} zero_variance"
        );
        assert!(
            stol.accepts(f64::from(gs.mean), f64::from(rs.mean), f64::from(rs.mean)),
            "group {gi} mean {gs:?} vs {rs:?}"
        );
        assert!(
            stol.accepts(f64::from(gs.std), f64::from(rs.std), f64::from(rs.std)),
            "group {gi} std {gs:?} vs {rs:?}"
        );
    }
    assert_eq!(k.adv_tok.len(), r.2.len());
    for (t, (&g, &w)) in k.adv_tok.iter().zip(&r.2).enumerate() {
        assert!(
            tol.accepts(f64::from(g), f64::from(w), f64::from(w)),
            "adv_tok[{t}]: {g} vs {w}"
        );
    }
    assert_eq!(k.status, 0);
}

fn check_case(c: &Case, threads: u32, seed: u64) {
    check_case_on(&mut EmuDevice::default(), c, threads, seed);
}

/// Runs one case in every team mode and two schedules, and checks all relations: each run
/// against the reference, and the two schedules of one mode bit for bit (team modes sum in
/// different orders, so across modes only the tolerance applies).
fn check_case_on<D: Device>(dev: &mut D, c: &Case, threads: u32, seed: u64) {
    let reference = run_reference(c);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for mode in [None, Some(true), Some(false)] {
        let tuning = Tuning {
            threads: Some(threads),
            warp_per_group: mode,
            ..Tuning::default()
        };
        let mut first: Option<KernelOut> = None;
        for s in [seed, seed ^ 0x5555_5555] {
            let k = match run_kernel(dev, c, tuning, s) {
                Ok(k) => k,
                Err(e) => panic!("kernel failed: {e:?} with {tuning:?}\n{c:?}"),
            };
            match &reference {
                Ok(r) => assert_matches(c, &k, r),
                Err(e) => assert_eq!(advantage_status(k.status), Err(*e), "status for {c:?}"),
            }
            match &first {
                None => first = Some(k),
                Some(f) => {
                    assert_eq!(bits(&f.adv), bits(&k.adv), "schedule dependence {tuning:?}");
                    assert_eq!(bits(&f.adv_tok), bits(&k.adv_tok), "schedule dependence");
                }
            }
        }
    }
}

fn opts_strategy() -> impl Strategy<Value = AdvantageOptions> {
    (
        prop_oneof![
            Just(Baseline::Mean),
            Just(Baseline::LeaveOneOut),
            Just(Baseline::None),
            Just(Baseline::LengthWeighted),
            Just(Baseline::External),
            Just(Baseline::PassK)
        ],
        prop_oneof![
            Just(Scale::GroupStd),
            Just(Scale::BatchStd),
            Just(Scale::None)
        ],
        prop_oneof![Just(StdKind::Unbiased), Just(StdKind::Biased)],
        prop_oneof![
            Just(SingletonPolicy::Zero),
            Just(SingletonPolicy::Raw),
            Just(SingletonPolicy::Error)
        ],
        prop_oneof![Just(0.0), Just(1e-9), Just(1e-6), Just(1e-4)],
        prop_oneof![3 => Just(0.0), 1 => Just(1e-3), 1 => Just(0.5)],
        any::<bool>(),
    )
        .prop_map(
            |(baseline, scale, std_kind, singleton, eps, std_floor, gpg)| AdvantageOptions {
                baseline,
                scale,
                std_kind,
                singleton,
                eps,
                std_floor,
                reweight: if gpg { Reweight::Gpg } else { Reweight::None },
            },
        )
}

fn reward_strategy() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -3.0f32..3.0,
        3 => prop_oneof![Just(0.0f32), Just(0.25), Just(0.5), Just(1.0)],
        1 => Just(f32::NAN),
    ]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let fixed = (
        prop_oneof![
            Just(1u32),
            Just(2),
            Just(3),
            Just(4),
            Just(5),
            Just(8),
            Just(31),
            Just(33),
            Just(64),
            Just(129)
        ],
        0usize..6,
    )
        .prop_flat_map(|(g, b)| {
            (
                Just(Layout::Fixed(g)),
                prop::collection::vec(reward_strategy(), g as usize * b),
            )
        });
    let csr = prop::collection::vec(
        prop_oneof![8 => 0u32..12, 1 => 30u32..80, 1 => 140u32..200],
        0..8,
    )
    .prop_flat_map(|sizes| {
        let o = tok_offsets(&sizes);
        let n = *o.last().unwrap() as usize;
        (
            Just(Layout::Offsets(o)),
            prop::collection::vec(reward_strategy(), n),
        )
    });
    (
        prop_oneof![fixed, csr],
        opts_strategy(),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_flat_map(|((layout, rewards), opts, with_valid, with_tokens, salt)| {
            let n = rewards.len();
            let valid = if with_valid {
                prop::collection::vec(prop_oneof![4 => Just(1u8), 1 => Just(0u8)], n)
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            let bc = if with_tokens {
                prop::collection::vec(0u32..7, n)
                    .prop_flat_map(move |lens| {
                        let t: u32 = lens.iter().sum();
                        let mask = if salt % 2 == 0 {
                            Just(None).boxed()
                        } else {
                            prop::collection::vec(0u8..2, t as usize)
                                .prop_map(Some)
                                .boxed()
                        };
                        (Just(lens), mask)
                    })
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            (Just(layout), Just(rewards), valid, Just(opts), bc).prop_map(
                |(layout, rewards, valid, opts, broadcast)| {
                    let (lengths, baselines) = extra_inputs(rewards.len());
                    Case {
                        rewards,
                        valid,
                        layout,
                        opts,
                        broadcast,
                        lengths,
                        baselines,
                    }
                },
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Oracle + schedule independence + team independence on random layouts and options.
    #[test]
    fn pt_advantages_match_reference(c in case_strategy(), threads in prop_oneof![Just(32u32), Just(64), Just(256)], seed in any::<u64>()) {
        check_case(&c, threads, seed);
    }
}

fn simple(rewards: Vec<f32>, layout: Layout, opts: AdvantageOptions) -> Case {
    let (lengths, baselines) = extra_inputs(rewards.len());
    Case {
        rewards,
        valid: None,
        layout,
        opts,
        broadcast: None,
        lengths,
        baselines,
    }
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 101) as f32) / 101.0).collect()
}

#[test]
fn empty_batch_launches_nothing_and_succeeds() {
    for layout in [Layout::Fixed(4), Layout::Offsets(vec![0])] {
        check_case(&simple(vec![], layout, AdvantageOptions::default()), 256, 1);
    }
}

/// Runs with the tuned (GPU) geometry only and compares with the reference.
fn check_default(c: &Case) {
    check_default_on(&mut EmuDevice::default(), c);
}

fn check_default_on<D: Device>(dev: &mut D, c: &Case) {
    let k = run_kernel(dev, c, Tuning::default(), 11).unwrap();
    match run_reference(c) {
        Ok(r) => assert_matches(c, &k, &r),
        Err(e) => assert_eq!(advantage_status(k.status), Err(e)),
    }
}

#[test]
fn group_of_one_thousand_and_thousand_groups() {
    for preset in Preset::ALL {
        let opts = AdvantageOptions::preset(preset);
        check_default(&simple(ramp(1000), Layout::Fixed(1000), opts));
        // G = 1: every group is a singleton (an error under the openrlhf preset).
        check_default(&simple(ramp(1000), Layout::Fixed(1), opts));
        check_default(&simple(ramp(4000), Layout::Fixed(4), opts));
    }
    // Both team modes and two schedules on the large shapes, once.
    let opts = AdvantageOptions::preset(Preset::Verl);
    check_case(&simple(ramp(1000), Layout::Fixed(1000), opts), 256, 7);
    check_case(&simple(ramp(1000), Layout::Fixed(1), opts), 128, 8);
}

#[test]
fn block_mode_with_large_group_uses_many_threads() {
    // 5000 samples: the default geometry takes 1024-thread blocks.
    let c = simple(
        ramp(5000),
        Layout::Offsets(vec![0, 5000]),
        AdvantageOptions::default(),
    );
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 3).unwrap();
    assert_matches(&c, &k, &run_reference(&c).unwrap());
}

#[test]
fn all_equal_and_near_equal_groups() {
    // Exactly equal: A = 0, not NaN, with eps = 0 too. Near-equal (1.0 vs 1.00001): the full
    // normalized signal, as in the reference (no variance floor).
    let opts = AdvantageOptions {
        eps: 0.0,
        ..AdvantageOptions::default()
    };
    let c = simple(
        vec![0.7, 0.7, 0.7, 1.0, 1.00001, 1.0, 1.00001],
        Layout::Offsets(vec![0, 3, 7]),
        opts,
    );
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1).unwrap();
    assert_eq!(&k.adv[..3], &[0.0, 0.0, 0.0]);
    assert!(k.adv[3] < -0.8 && k.adv[4] > 0.8, "{:?}", k.adv);
    check_case(&c, 64, 2);
}

/// Finite rewards near `f32::MAX` under Dr. GRPO give `A[1] = -4/3 * MAX` in f64: the kernel
/// saturates at `-f32::MAX` like the reference's `narrow_f32` (found by the `advantages` fuzz
/// target on the CPU side), and the group std (beyond the f32 range too) saturates as well.
#[test]
fn advantages_beyond_the_f32_range_saturate_like_the_reference() {
    let c = simple(
        vec![f32::MAX, -f32::MAX, f32::MAX],
        Layout::Fixed(3),
        AdvantageOptions::preset(Preset::DrGrpo),
    );
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1).unwrap();
    let r = run_reference(&c).unwrap();
    assert_eq!(k.status, 0);
    assert!(k.adv.iter().all(|a| a.is_finite()), "{:?}", k.adv);
    assert_eq!(k.adv[1], -f32::MAX);
    assert_eq!(k.adv, r.0);
    assert_eq!(k.stats[0].std, f32::MAX);
    assert_eq!(k.stats[0].std, r.1[0].std);
}

/// External baselines (ReMax) under std scaling with a zero std (a singleton group, a group of
/// equal rewards, a batch of one sample) and `eps = 0`: the std counts as 1, so `A = r - b`,
/// finite, on the GPU as in the reference (the CPU gave infinity; found by the `advantages`
/// fuzz target).
#[test]
fn external_baselines_with_a_zero_std_count_it_as_one() {
    for scale in [Scale::GroupStd, Scale::BatchStd] {
        let opts = AdvantageOptions {
            baseline: Baseline::External,
            scale,
            eps: 0.0,
            ..AdvantageOptions::default()
        };
        let cases = [
            (vec![4.0f32], Layout::Fixed(1)),
            (vec![0.5, 0.5, 0.5], Layout::Fixed(3)),
            (vec![2.0, 2.0, 1.0, 3.0], Layout::Offsets(vec![0, 2, 4])),
        ];
        for (rewards, layout) in cases {
            let c = simple(rewards, layout, opts);
            let r = run_reference(&c).unwrap();
            assert!(r.0.iter().all(|a| a.is_finite()), "{:?} {c:?}", r.0);
            let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 5).unwrap();
            assert_matches(&c, &k, &r);
            let fixed = matches!(c.layout, Layout::Fixed(_));
            if fixed && (scale == Scale::GroupStd || c.rewards.len() == 1) {
                for (i, a) in r.0.iter().enumerate() {
                    assert_eq!(*a, c.rewards[i] - c.baselines[i], "A[{i}]");
                }
            }
        }
    }
}

#[test]
fn infinite_reward_reports_non_finite() {
    let c = simple(
        vec![1.0, f32::INFINITY, 0.0, 0.5],
        Layout::Fixed(2),
        AdvantageOptions::default(),
    );
    assert_eq!(run_reference(&c).err(), Some(Error::NonFinite));
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1).unwrap();
    assert_eq!(advantage_status(k.status), Err(Error::NonFinite));
}

#[test]
fn singleton_error_policy_reports_singleton() {
    let mut c = simple(
        vec![1.0, f32::NAN, 0.0, 0.5],
        Layout::Fixed(2),
        AdvantageOptions::preset(Preset::OpenRlhf),
    );
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1).unwrap();
    assert_eq!(advantage_status(k.status), Err(Error::SingletonGroup));
    c.rewards[1] = 2.0;
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1).unwrap();
    assert_eq!(k.status, 0);
}

#[test]
fn bad_layouts_are_rejected_before_launch() {
    let c = simple(ramp(10), Layout::Fixed(3), AdvantageOptions::default());
    assert!(matches!(
        run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1),
        Err(KernelError::Core(Error::InvalidLayout))
    ));
    let c = simple(ramp(10), Layout::Fixed(0), AdvantageOptions::default());
    assert!(matches!(
        run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1),
        Err(KernelError::Core(Error::InvalidLayout))
    ));
    let bad = Tuning {
        threads: Some(48),
        ..Tuning::default()
    };
    let c = simple(ramp(10), Layout::Fixed(5), AdvantageOptions::default());
    assert!(matches!(
        run_kernel(&mut EmuDevice::default(), &c, bad, 1),
        Err(KernelError::Core(Error::InvalidArgument))
    ));
}

#[test]
fn malformed_offsets_never_index_out_of_bounds() {
    // Offsets past n and decreasing: the kernel clamps them (results are meaningless, memory
    // stays in bounds; the sentinel after `adv` is untouched).
    let rewards = ramp(6);
    let offsets = vec![0u32, 4, 2, 99];
    let mut adv = vec![0f32; 7];
    let mut ws = vec![0u8; WORKSPACE_BYTES];
    adv[6] = 12345.0;
    let buf = AdvantageBuffers {
        rewards: addr(&rewards),
        valid: 0,
        n: 6,
        groups: DeviceGroups::Offsets {
            ptr: addr(&offsets),
            num_groups: 3,
        },
        adv: addr_mut(&mut adv),
        group_stats: 0,
        tok_offsets: 0,
        tok_mask: 0,
        adv_tok: 0,
        workspace: addr_mut(&mut ws),
        batch_std: 0,
    };
    // SAFETY: live host buffers; `adv` has one extra sentinel slot.
    unsafe {
        care_kernels::group_advantages(
            &Emulator { seed: 1 },
            &buf,
            &AdvantageOptions::default(),
            Tuning::default(),
        )
    }
    .unwrap();
    assert_eq!(adv[6], 12345.0);
}

/// The same random cases as `pt_advantages_match_reference` (fixed RNG), and the large shapes,
/// on the GPU.
#[test]
fn gpu_advantages_match_reference() {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let Some(gpu) = common::gpu("gpu_advantages_match_reference") else {
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
    let strategy = (
        case_strategy(),
        prop_oneof![Just(32u32), Just(64), Just(256)],
        any::<u64>(),
    );
    runner
        .run(&strategy, |(c, threads, seed)| {
            check_case_on(&mut *gpu.borrow_mut(), &c, threads, seed);
            Ok(())
        })
        .unwrap();
    // SPEC §11 phases on the GPU.
    let ranks = (
        case_strategy(),
        1usize..4,
        prop::collection::vec(prop::collection::vec(0.0f64..1.0, 2), 1..5),
    );
    runner
        .run(&ranks, |(c, k, cuts)| {
            check_ranks_on(&mut *gpu.borrow_mut(), &c, k, &cuts, 0);
            Ok(())
        })
        .unwrap();
    let mut gpu = gpu.into_inner();
    for preset in Preset::ALL {
        let opts = AdvantageOptions::preset(preset);
        check_default_on(&mut gpu, &simple(ramp(1000), Layout::Fixed(1000), opts));
        check_default_on(&mut gpu, &simple(ramp(1000), Layout::Fixed(1), opts));
        check_default_on(&mut gpu, &simple(ramp(4000), Layout::Fixed(4), opts));
        check_default_on(
            &mut gpu,
            &simple(ramp(5000), Layout::Offsets(vec![0, 5000]), opts),
        );
        check_default_on(&mut gpu, &simple(vec![], Layout::Fixed(4), opts));
    }
}

#[test]
fn caller_batch_std_replaces_the_local_one() {
    // A caller-provided (say, all-reduced) batch std is used as is: with the std of this call's
    // own rewards it reproduces the reference; with twice that, advantages halve.
    let rewards = ramp(24);
    let opts = AdvantageOptions::preset(Preset::TrlBatch);
    let n = rewards.len() as f64;
    let mean = rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / n;
    let m2: f64 = rewards.iter().map(|&r| (f64::from(r) - mean).powi(2)).sum();
    let std = (m2 / (n - 1.0)).sqrt() as f32;
    let run = |s: f32| {
        let mut adv = vec![0f32; 24];
        let mut ws = vec![0u8; WORKSPACE_BYTES];
        let bs = [s];
        let buf = AdvantageBuffers {
            rewards: addr(&rewards),
            valid: 0,
            n: 24,
            groups: DeviceGroups::Fixed { group_size: 6 },
            adv: addr_mut(&mut adv),
            group_stats: 0,
            tok_offsets: 0,
            tok_mask: 0,
            adv_tok: 0,
            workspace: addr_mut(&mut ws),
            batch_std: addr(&bs),
        };
        // SAFETY: live host buffers of the documented sizes.
        unsafe {
            care_kernels::group_advantages(&Emulator { seed: 2 }, &buf, &opts, Tuning::default())
        }
        .unwrap();
        adv
    };
    let c = simple(rewards.clone(), Layout::Fixed(6), opts);
    let (want, _, _) = run_reference(&c).unwrap();
    let tol = tolerance(Quantity::Advantage, Dtype::F32).unwrap();
    let got = run(std);
    for (g, w) in got.iter().zip(&want) {
        assert!(
            tol.accepts(f64::from(*g), f64::from(*w), f64::from(*w)),
            "{g} vs {w}"
        );
    }
    let half = run(2.0 * std + 1e-4);
    for (h, g) in half.iter().zip(&got) {
        assert!(
            (f64::from(*h) * 2.0 - f64::from(*g)).abs() < 1e-4,
            "{h} vs {g}"
        );
    }
}

/// One rank's share of a case: for every group, a contiguous slice of its samples.
struct RankShare {
    case: Case,
    /// Global index of each local sample.
    global: Vec<usize>,
}

/// Splits every group of `c` over `k` ranks at the cut fractions `cuts` (one list per group).
fn split_ranks(c: &Case, k: usize, cuts: &[Vec<f64>]) -> Vec<RankShare> {
    let o = match &c.layout {
        Layout::Fixed(g) => (0..=num_groups(c))
            .map(|i| i as u32 * g)
            .collect::<Vec<u32>>(),
        Layout::Offsets(o) => o.clone(),
    };
    // Per rank: rewards, valid bytes, CSR offsets, global index of each sample, lengths and
    // external baselines.
    type Share = (Vec<f32>, Vec<u8>, Vec<u32>, Vec<usize>, Vec<u32>, Vec<f32>);
    let mut ranks: Vec<Share> = (0..k)
        .map(|_| {
            (
                Vec::new(),
                Vec::new(),
                vec![0u32],
                Vec::new(),
                Vec::new(),
                Vec::new(),
            )
        })
        .collect();
    for (g, w) in o.windows(2).enumerate() {
        let (a, b) = (w[0] as usize, w[1] as usize);
        let mut bounds: Vec<usize> = cuts[g % cuts.len()]
            .iter()
            .take(k - 1)
            .map(|f| a + ((b - a) as f64 * f) as usize)
            .collect();
        bounds.sort_unstable();
        bounds.insert(0, a);
        bounds.push(b);
        for (r, rank) in ranks.iter_mut().enumerate() {
            for i in bounds[r]..bounds[r + 1] {
                rank.4.push(c.lengths[i]);
                rank.5.push(c.baselines[i]);
                rank.0.push(c.rewards[i]);
                rank.1.push(c.valid.as_ref().map_or(1, |v| v[i]));
                rank.3.push(i);
            }
            let len = rank.0.len() as u32;
            rank.2.push(len);
        }
    }
    ranks
        .into_iter()
        .map(
            |(rewards, valid, offsets, global, lengths, baselines)| RankShare {
                case: Case {
                    rewards,
                    valid: c.valid.as_ref().map(|_| valid),
                    layout: Layout::Offsets(offsets),
                    opts: c.opts,
                    broadcast: None,
                    lengths,
                    baselines,
                },
                global,
            },
        )
        .collect()
}

fn rank_buffers<D: Device>(
    dev: &mut D,
    c: &Case,
    adv: u64,
    stats: u64,
    ws: u64,
) -> AdvantageBuffers {
    let Layout::Offsets(o) = &c.layout else {
        unreachable!("rank shares use CSR offsets")
    };
    AdvantageBuffers {
        rewards: dev.upload(&c.rewards),
        valid: match &c.valid {
            Some(v) => dev.upload(v),
            None => 0,
        },
        n: c.rewards.len() as u32,
        groups: DeviceGroups::Offsets {
            ptr: dev.upload(o),
            num_groups: (o.len() - 1) as u32,
        },
        adv,
        group_stats: stats,
        tok_offsets: 0,
        tok_mask: 0,
        adv_tok: 0,
        workspace: ws,
        batch_std: 0,
    }
}

/// SPEC §11 on the kernels: partial sums, all-reduce, partial squares, all-reduce, finalize on
/// `k` simulated ranks reproduce the single-rank reference on the whole batch.
fn check_ranks_on<D: Device>(dev: &mut D, c: &Case, k: usize, cuts: &[Vec<f64>], seed: u64) {
    dev.reset();
    let shares = split_ranks(c, k, cuts);
    let b = num_groups(c);
    let t = Tuning::default();
    let ws: Vec<u64> = (0..k)
        .map(|_| dev.upload(&[0u8; WORKSPACE_BYTES]))
        .collect();
    let bufs: Vec<AdvantageBuffers> = shares
        .iter()
        .zip(&ws)
        .map(|(s, &w)| {
            let n = s.case.rewards.len();
            let adv = dev.upload(&vec![f32::NAN; n]);
            let stats = dev.upload(&vec![0u32; 4 * b]);
            rank_buffers(dev, &s.case, adv, stats, w)
        })
        .collect();
    // Step 1 and its all-reduce (a sum over ranks).
    let mut sums = vec![0f64; 2 * b];
    for buf in &bufs {
        let out = dev.upload(&vec![f64::NAN; 2 * b]);
        // SAFETY: uploaded buffers of the documented sizes.
        unsafe { care_kernels::group_partial_sums(&dev.launcher(seed), buf, out, t) }.unwrap();
        for (acc, x) in sums.iter_mut().zip(dev.download::<f64>(out, 2 * b)) {
            *acc += x;
        }
    }
    // Step 2 and its all-reduce.
    let mut m2 = vec![0f64; b];
    for buf in &bufs {
        let s = dev.upload(&sums);
        let out = dev.upload(&vec![f64::NAN; b]);
        // SAFETY: as above.
        unsafe { care_kernels::group_partial_squares(&dev.launcher(seed), buf, s, out, t) }
            .unwrap();
        for (acc, x) in m2.iter_mut().zip(dev.download::<f64>(out, b)) {
            *acc += x;
        }
    }
    let reference = run_reference(c);
    let tol = tolerance(Quantity::Advantage, Dtype::F32).unwrap();
    for ((buf, share), &w) in bufs.iter().zip(&shares).zip(&ws) {
        let (s, q) = (dev.upload(&sums), dev.upload(&m2));
        // SAFETY: as above.
        let inputs = AdvantageInputs {
            baselines: dev.upload(&share.case.baselines),
            lengths: 0,
        };
        let r = unsafe {
            care_kernels::group_advantages_finalize_with(
                &dev.launcher(seed),
                buf,
                &inputs,
                s,
                q,
                &c.opts,
                t,
            )
        };
        if matches!(c.opts.baseline, Baseline::LengthWeighted | Baseline::PassK) {
            // They need a whole group on one rank, on the GPU as on the CPU.
            assert!(matches!(r, Err(KernelError::Core(Error::InvalidArgument))));
            return;
        }
        r.unwrap();
        let status = dev.download::<u32>(w, 1)[0];
        let adv = dev.download::<f32>(buf.adv, share.global.len());
        match &reference {
            Err(e) => assert_eq!(advantage_status(status), Err(*e), "{c:?}"),
            Ok((want, want_stats, _)) => {
                assert_eq!(status, 0, "{c:?}");
                for (&a, &gi) in adv.iter().zip(&share.global) {
                    let w = want[gi];
                    assert!(
                        tol.accepts(f64::from(a), f64::from(w), f64::from(w)),
                        "sample {gi}: {a} vs {w}\n{c:?}"
                    );
                }
                let raw = dev.download::<u32>(buf.group_stats, 4 * b);
                for (g, (q, r)) in raw.chunks_exact(4).zip(want_stats).enumerate() {
                    assert_eq!((q[0], q[3]), (r.count, r.zero_variance), "group {g}");
                    assert!(tol.accepts(
                        f64::from(f32::from_bits(q[1])),
                        f64::from(r.mean),
                        f64::from(r.mean)
                    ));
                    assert!(tol.accepts(
                        f64::from(f32::from_bits(q[2])),
                        f64::from(r.std),
                        f64::from(r.std)
                    ));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Groups split over 1-3 ranks at random points reproduce the single-rank reference.
    #[test]
    fn pt_ranks_reproduce_single_rank(
        c in case_strategy(),
        k in 1usize..4,
        cuts in prop::collection::vec(prop::collection::vec(0.0f64..1.0, 2), 1..5),
        seed in any::<u64>(),
    ) {
        check_ranks_on(&mut EmuDevice::default(), &c, k, &cuts, seed);
    }
}

#[test]
fn finalize_rejects_invalid_moments() {
    let c = simple(
        ramp(4),
        Layout::Offsets(vec![0, 4]),
        AdvantageOptions::default(),
    );
    let mut dev = EmuDevice::default();
    let ws = dev.upload(&[0u8; WORKSPACE_BYTES]);
    let adv = dev.upload(&[0f32; 4]);
    let buf = rank_buffers(&mut dev, &c, adv, 0, ws);
    let sums = dev.upload(&[4.0f64, 2.0]);
    let m2 = dev.upload(&[-1.0f64]);
    // SAFETY: uploaded buffers of the documented sizes.
    unsafe {
        care_kernels::group_advantages_finalize(
            &Emulator { seed: 1 },
            &buf,
            sums,
            m2,
            &c.opts,
            Tuning::default(),
        )
    }
    .unwrap();
    assert_eq!(
        advantage_status(dev.download::<u32>(ws, 1)[0]),
        Err(Error::InvalidArgument)
    );
}

#[test]
fn new_baselines_std_floor_and_gpg_factor() {
    // Ragged groups with ties, an all-equal group and a singleton.
    let rewards = vec![
        0.5, 1.0, 1.0, 0.25, 0.75, 0.75, 0.75, 2.0, 0.1, 0.3, 0.2, 0.9,
    ];
    let layout = Layout::Offsets(vec![0, 4, 7, 8, 12]);
    for preset in [Preset::Opo, Preset::Remax, Preset::GrpoPassK, Preset::Gpg] {
        let opts = AdvantageOptions::preset(preset);
        check_case(&simple(rewards.clone(), layout.clone(), opts), 64, 3);
        let floored = AdvantageOptions {
            std_floor: 0.5,
            scale: Scale::GroupStd,
            ..opts
        };
        check_case(&simple(rewards.clone(), layout.clone(), floored), 32, 9);
    }
    // The GPG factor is 12 / (12 - 4) here (the all-equal group and the singleton are silent).
    let c = simple(rewards, layout, AdvantageOptions::preset(Preset::Gpg));
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1).unwrap();
    let mean = (0.5f64 + 1.0 + 1.0 + 0.25) / 4.0;
    let want = ((0.5 - mean) * 12.0 / 8.0) as f32;
    assert!((k.adv[0] - want).abs() <= 1e-6, "{} vs {want}", k.adv[0]);
}

/// verl's `gpg` (the peer suite's class 4): `alpha = N / max(1, count_nonzero(r))` and a
/// singleton keeps `alpha * r`; the case [1, 0 | 2] gives [0.75, -0.75, 3].
#[test]
fn verl_gpg_preset_with_a_singleton() {
    let c = simple(
        vec![1.0, 0.0, 2.0],
        Layout::Offsets(vec![0, 2, 3]),
        AdvantageOptions::preset(Preset::VerlGpg),
    );
    check_case(&c, 32, 1);
    let k = run_kernel(&mut EmuDevice::default(), &c, Tuning::default(), 1).unwrap();
    assert_eq!(k.adv, [0.75, -0.75, 3.0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The `verl_gpg` preset (the nonzero factor) on random ragged batches with NaN rewards,
    /// zeros and singletons: the kernel against the reference.
    #[test]
    fn pt_verl_gpg_matches_reference(c in case_strategy(), seed in any::<u64>()) {
        let c = Case { opts: AdvantageOptions::preset(Preset::VerlGpg), ..c };
        check_case(&c, 64, seed);
    }
}

#[test]
fn baselines_without_their_inputs_are_refused() {
    let mut dev = EmuDevice::default();
    let c = simple(ramp(4), Layout::Fixed(2), AdvantageOptions::default());
    let buf = rank_buffers(
        &mut dev,
        &Case {
            layout: Layout::Offsets(vec![0, 2, 4]),
            ..c.clone()
        },
        0,
        0,
        0,
    );
    let ws = dev.upload(&[0u8; WORKSPACE_BYTES]);
    let adv = dev.upload(&[0f32; 4]);
    let buf = AdvantageBuffers {
        adv,
        workspace: ws,
        ..buf
    };
    for preset in [Preset::Opo, Preset::Remax] {
        let opts = AdvantageOptions::preset(preset);
        // SAFETY: uploaded buffers of the documented sizes.
        let r = unsafe {
            care_kernels::group_advantages(&Emulator { seed: 1 }, &buf, &opts, Tuning::default())
        };
        assert!(
            matches!(r, Err(KernelError::Core(Error::InvalidArgument))),
            "{preset:?}"
        );
    }
}
