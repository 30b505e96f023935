//! The fused one-pass path (`logits_loss_{f32,bf16,f16}`, `care_kernels::logits_loss_fused`)
//! against the three-kernel path (`logits_loss_forward` then `log_softmax_backward`) under the
//! host emulator.
//!
//! Relations checked, on random shapes (vocabularies that are not a multiple of the vector
//! width, odd strides and base offsets, sequences that span the blocks' row ranges, masks,
//! temperatures) for every token-local loss (clipped ratio with and without the dual clip,
//! CISPO, SAPO, GPG), KL estimator and aggregation, every dtype: (1) `logp` and `dlogits` equal
//! the three-kernel path's bit for bit at the same block size, out of place and in place; (2)
//! the loss statistics equal its statistics (counts exactly, sums within rounding: the two
//! paths sum in different orders); (3) two schedules (block order and fiber order) give
//! bit-identical outputs and statistics; (4) the options outside the fused path are refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::grpo::{Aggregation, KlEstimator, LossOptions, LossPreset, PolicyLoss, RatioLevel};
use care_core::logsoftmax::LogSoftmaxOptions;
use care_kernels::params::LossStatsRaw;
use care_kernels::{
    Dtype, FusedLossBuffers, KernelError, LogSoftmaxGrads, LogitsBuffers, LogitsLossBuffers,
    Tuning, WORKSPACE_BYTES, fused_supports, log_softmax_backward, logits_loss_forward,
    logits_loss_fused,
};
use proptest::prelude::*;

mod common;

use common::{Device, EmuDevice};

trait El: Copy + bytemuck::Pod {
    const DTYPE: Dtype;
    fn from_f32(x: f32) -> Self;
}
impl El for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
}
impl El for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}
impl El for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

#[derive(Clone, Debug)]
struct Case {
    vocab: usize,
    stride: usize,
    offset: usize,
    lens: Vec<u32>,
    logits: Vec<f32>,
    targets: Vec<i32>,
    mask: Option<Vec<u8>>,
    old: Vec<f32>,
    reference: Vec<f32>,
    adv: Vec<f32>,
    adv_per_token: bool,
    temperature: f64,
    opts: LossOptions,
}

impl Case {
    fn rows(&self) -> usize {
        self.lens.iter().sum::<u32>() as usize
    }
    fn offsets(&self) -> Vec<u32> {
        let mut o = vec![0u32];
        for l in &self.lens {
            o.push(o.last().unwrap() + l);
        }
        o
    }
}

struct Out {
    logp: Vec<f32>,
    dlogits: Vec<u16>,
    stats: LossStatsRaw,
}

/// The logits' storage: 16-byte aligned (`u128` chunks), `offset` elements before row 0.
fn store<T: El>(c: &Case) -> Vec<u128> {
    let vals: Vec<T> = c.logits.iter().map(|&x| T::from_f32(x)).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&vals);
    let mut v = vec![0u128; bytes.len().div_ceil(16) + 1];
    bytemuck::cast_slice_mut::<u128, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    v
}

/// The dlogits rows' bytes as 16-bit words (f32 as two words each), `vocab` elements per row.
fn rows_bits<T: El>(c: &Case, data: &[u128]) -> Vec<u16> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let es = size_of::<T>();
    let mut out = Vec::new();
    for i in 0..c.rows() {
        let at = (c.offset + i * c.stride) * es;
        for w in bytes[at..at + c.vocab * es].chunks(2) {
            out.push(u16::from_le_bytes([w[0], w[1]]));
        }
    }
    out
}

/// The case's buffers on a device.
struct On {
    data: u64,
    words: usize,
    targets: u64,
    mask: u64,
    seq: u64,
    old: u64,
    reference: u64,
    adv: u64,
    logp: u64,
    stats: u64,
    workspace: u64,
}

fn upload<T: El, D: Device>(dev: &mut D, c: &Case) -> On {
    let n = c.rows();
    let data = store::<T>(c);
    On {
        data: dev.upload(&data),
        words: data.len(),
        targets: dev.upload(&c.targets),
        mask: c.mask.as_ref().map_or(0, |m| dev.upload(m)),
        seq: dev.upload(&c.offsets()),
        old: dev.upload(&c.old),
        reference: dev.upload(&c.reference),
        adv: dev.upload(&c.adv),
        logp: dev.upload(&vec![0f32; n.max(1)]),
        stats: dev.upload(&[LossStatsRaw::EMPTY]),
        // Garbage in the workspace: the plans must reset what they read.
        workspace: dev.upload(&[0x55u8; WORKSPACE_BYTES]),
    }
}

fn rows_of<T: El>(c: &Case, on: &On) -> LogitsBuffers {
    LogitsBuffers {
        dtype: T::DTYPE,
        logits: on.data + (c.offset * size_of::<T>()) as u64,
        rows: c.rows() as u64,
        vocab: c.vocab as u32,
        stride: c.stride as u64,
        targets: on.targets,
        targets_i64: false,
        mask: on.mask,
    }
}

fn lsm(c: &Case) -> LogSoftmaxOptions {
    LogSoftmaxOptions {
        temperature: c.temperature,
    }
}

/// The three-kernel path, block team of `threads`, dlogits in place over the logits.
fn three_kernels<T: El, D: Device>(dev: &mut D, c: &Case, threads: u32, seed: u64) -> Out {
    let n = c.rows();
    let on = upload::<T, D>(dev, c);
    let rows = rows_of::<T>(c, &on);
    let lse = dev.upload(&vec![0f32; n.max(1)]);
    let dlogp = dev.upload(&vec![0f32; n.max(1)]);
    let buf = LogitsLossBuffers {
        logp: on.logp,
        lse,
        dlogp,
        logp_old: on.old,
        logp_ref: on.reference,
        adv: on.adv,
        adv_per_token: c.adv_per_token,
        seq_offsets: on.seq,
        n_seq: c.lens.len() as u32,
        max_seq_len: 0,
        stats: on.stats,
        workspace: on.workspace,
    };
    let tuning = Tuning {
        threads: Some(threads),
        block_team: Some(true),
        ..Tuning::default()
    };
    let l = dev.launcher(seed);
    // SAFETY: device buffers of the documented sizes.
    unsafe { logits_loss_forward(&l, &rows, &buf, &lsm(c), &c.opts, tuning) }.unwrap();
    let gr = LogSoftmaxGrads {
        lse,
        entropy: 0,
        dlogp,
        dentropy: 0,
        dlogits: rows.logits,
        dstride: c.stride as u64,
    };
    // SAFETY: in place over the device logits.
    unsafe { log_softmax_backward(&l, &rows, &gr, &lsm(c), tuning) }.unwrap();
    let out = Out {
        logp: dev.download(on.logp, n),
        dlogits: rows_bits::<T>(c, &dev.download::<u128>(on.data, on.words)),
        stats: dev.download(on.stats, 1)[0],
    };
    dev.reset();
    out
}

/// The fused path, `threads` per block and at most `blocks` blocks; in place or into a separate
/// buffer with the same layout.
fn fused<T: El, D: Device>(
    dev: &mut D,
    c: &Case,
    threads: u32,
    blocks: u32,
    in_place: bool,
    seed: u64,
) -> Out {
    let n = c.rows();
    let on = upload::<T, D>(dev, c);
    let rows = rows_of::<T>(c, &on);
    let out_buf = dev.upload(&vec![0xdead_beef_u128; on.words]);
    let dlogits = if in_place {
        rows.logits
    } else {
        out_buf + (c.offset * size_of::<T>()) as u64
    };
    let buf = FusedLossBuffers {
        logp: on.logp,
        lse: 0,
        dlogits,
        dstride: c.stride as u64,
        logp_old: on.old,
        logp_ref: on.reference,
        adv: on.adv,
        adv_per_token: c.adv_per_token,
        seq_offsets: on.seq,
        n_seq: c.lens.len() as u32,
        stats: on.stats,
        workspace: on.workspace,
    };
    let tuning = Tuning {
        threads: Some(threads),
        max_blocks: Some(blocks),
        ..Tuning::default()
    };
    let l = dev.launcher(seed);
    // SAFETY: device buffers of the documented sizes.
    unsafe { logits_loss_fused(&l, &rows, &buf, &lsm(c), &c.opts, tuning) }.unwrap();
    let status = dev.download::<u32>(on.workspace, 1)[0];
    assert_eq!(status, 0, "status");
    let words = dev.download::<u128>(if in_place { on.data } else { out_buf }, on.words);
    let out = Out {
        logp: dev.download(on.logp, n),
        dlogits: rows_bits::<T>(c, &words),
        stats: dev.download(on.stats, 1)[0],
    };
    dev.reset();
    out
}

fn check<T: El, D: Device>(
    dev: &mut D,
    c: &Case,
    threads: u32,
    blocks: u32,
    seed: u64,
) -> Result<(), TestCaseError> {
    let want = three_kernels::<T, D>(dev, c, threads, seed);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let a = fused::<T, D>(dev, c, threads, blocks, false, seed ^ 1);
    let b = fused::<T, D>(dev, c, threads, blocks, true, seed ^ 2);
    prop_assert_eq!(bits(&a.logp), bits(&want.logp), "logp");
    prop_assert!(a.dlogits == want.dlogits, "dlogits differ out of place");
    prop_assert!(b.dlogits == want.dlogits, "dlogits differ in place");
    // Schedules: a different block and fiber order, bit for bit (statistics included).
    prop_assert_eq!(
        format!("{:?}", a.stats),
        format!("{:?}", b.stats),
        "stats by schedule"
    );
    let (s, w) = (a.stats, want.stats);
    prop_assert_eq!(
        [
            s.tokens,
            s.sequences,
            s.clipped,
            s.clipped_low,
            s.clipped_high
        ],
        [
            w.tokens,
            w.sequences,
            w.clipped,
            w.clipped_low,
            w.clipped_high
        ]
    );
    prop_assert_eq!(
        [s.dual_clipped, s.log_ratio_clamped, s.non_finite],
        [w.dual_clipped, w.log_ratio_clamped, w.non_finite]
    );
    prop_assert_eq!(s.ratio_min.to_bits(), w.ratio_min.to_bits());
    prop_assert_eq!(s.ratio_max.to_bits(), w.ratio_max.to_bits());
    let tol = |x: f32| 1e-5 * (1.0 + w.tokens as f32) + 1e-4 * x.abs();
    for (name, got, want) in [
        ("loss", s.loss, w.loss),
        ("ppo_kl_sum", s.ppo_kl_sum, w.ppo_kl_sum),
        ("kl_sum", s.kl_sum, w.kl_sum),
        ("ratio_sum", s.ratio_sum, w.ratio_sum),
    ] {
        prop_assert!(
            (got - want).abs() <= tol(want),
            "{} {} vs {}",
            name,
            got,
            want
        );
    }
    Ok(())
}

fn opts_strategy() -> impl Strategy<Value = LossOptions> {
    (
        0usize..5,
        0usize..6,
        prop_oneof![Just(0.0f64), Just(0.04)],
        0usize..4,
        any::<bool>(),
    )
        .prop_map(|(pl, agg, beta, kl, global)| {
            let (policy_loss, dual_clip) = match pl {
                0 => (PolicyLoss::Clip, 0.0),
                1 => (PolicyLoss::Clip, 3.0),
                2 => (PolicyLoss::Cispo, 0.0),
                3 => (PolicyLoss::Sapo, 0.0),
                _ => (PolicyLoss::Gpg, 0.0),
            };
            let aggregation = [
                Aggregation::TokenMean,
                Aggregation::SeqMeanTokenMean,
                Aggregation::SeqMeanTokenSum,
                Aggregation::SeqMeanTokenSumNorm,
                Aggregation::TokenSum,
                Aggregation::TokenSumNorm,
            ][agg];
            let kl_estimator = [
                KlEstimator::K1,
                KlEstimator::Abs,
                KlEstimator::K2,
                KlEstimator::K3,
            ][kl];
            LossOptions {
                policy_loss,
                dual_clip,
                aggregation,
                beta,
                kl_estimator,
                // Caller's denominators, or the device pre-pass's (0).
                global_tokens: if global { 37.0 } else { 0.0 },
                global_sequences: if global { 5.0 } else { 0.0 },
                horizon: if global { 64.0 } else { 0.0 },
                ..LossOptions::default()
            }
        })
}

/// xorshift64* for the contents.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0u32..7, 1..5),
        prop_oneof![Just(1usize), 2usize..40, 200usize..700],
        0usize..5,
        0usize..9,
        any::<u64>(),
        any::<(bool, bool)>(),
        prop_oneof![Just(1.0f64), Just(0.6)],
        opts_strategy(),
    )
        .prop_map(
            |(lens, vocab, pad, offset, seed, (masked, per_tok), temperature, opts)| {
                let mut r = Rng(seed | 1);
                let n: usize = lens.iter().sum::<u32>() as usize;
                let stride = vocab + pad;
                let mut logits = vec![f32::NAN; offset + n * stride];
                for i in 0..n {
                    let c = (r.unit() - 0.5) * 10.0;
                    for j in 0..vocab {
                        logits[offset + i * stride + j] = c + (r.unit() - 0.5) * 12.0;
                    }
                }
                let targets = (0..n).map(|_| (r.next() % vocab as u64) as i32).collect();
                let mask = masked.then(|| {
                    (0..n)
                        .map(|_| u8::from(!r.next().is_multiple_of(4)))
                        .collect()
                });
                let old = (0..n).map(|_| -4.0 - r.unit() * 4.0).collect();
                let reference = (0..n).map(|_| -4.0 - r.unit() * 4.0).collect();
                let adv = (0..if per_tok { n } else { lens.len() })
                    .map(|_| (r.unit() - 0.5) * 3.0)
                    .collect();
                Case {
                    vocab,
                    stride,
                    offset,
                    lens,
                    logits,
                    targets,
                    mask,
                    old,
                    reference,
                    adv,
                    adv_per_token: per_tok,
                    temperature,
                    opts,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Fused = three kernels, bit for bit (logp, dlogits) at the same block size, every dtype;
    /// 1 to 3 blocks, so that sequences span the blocks' row ranges.
    #[test]
    fn pt_fused_equals_the_three_kernel_path(
        c in case_strategy(),
        threads in prop_oneof![Just(32u32), Just(64)],
        blocks in 1u32..4,
        seed in any::<u64>(),
    ) {
        let dev = &mut EmuDevice::default();
        check::<f32, _>(dev, &c, threads, blocks, seed)?;
        check::<half::bf16, _>(dev, &c, threads, blocks, seed)?;
        check::<half::f16, _>(dev, &c, threads, blocks, seed)?;
    }
}

#[test]
fn sequence_level_losses_and_the_rollout_correction_are_refused() {
    use proptest::strategy::ValueTree;
    let c = case_strategy()
        .new_tree(&mut proptest::test_runner::TestRunner::deterministic())
        .unwrap()
        .current();
    let refused = [
        LossOptions {
            ratio_level: RatioLevel::Sequence,
            ..LossOptions::default()
        },
        LossOptions {
            policy_loss: PolicyLoss::Gmpo,
            ..LossOptions::default()
        },
        LossOptions {
            policy_loss: PolicyLoss::KlCov,
            ..LossOptions::default()
        },
        LossOptions::preset(LossPreset::TrlVespo),
        // verl's bypass mode needs the rollout log-probs, which the fused path does not take.
        LossOptions::preset(LossPreset::VerlBypass),
    ];
    for opts in refused {
        assert!(!fused_supports(&opts), "{opts:?}");
        let c = Case { opts, ..c.clone() };
        let mut dev = EmuDevice::default();
        let on = upload::<f32, _>(&mut dev, &c);
        let rows = rows_of::<f32>(&c, &on);
        let buf = FusedLossBuffers {
            logp: 0,
            lse: 0,
            dlogits: rows.logits,
            dstride: c.stride as u64,
            logp_old: on.old,
            logp_ref: 0,
            adv: on.adv,
            adv_per_token: c.adv_per_token,
            seq_offsets: on.seq,
            n_seq: c.lens.len() as u32,
            stats: 0,
            workspace: on.workspace,
        };
        // SAFETY: refused before any launch.
        let r = unsafe {
            logits_loss_fused(
                &dev.launcher(1),
                &rows,
                &buf,
                &lsm(&c),
                &c.opts,
                Tuning::default(),
            )
        };
        assert_eq!(
            r,
            Err(KernelError::Core(care_core::Error::InvalidArgument)),
            "{:?}",
            c.opts
        );
    }
    assert!(fused_supports(&LossOptions::default()));
}

/// On a GPU: what the driver's JIT made of every entry of the checked-in PTX (registers, local
/// memory, shared memory, largest block), printed, and each within its launch bounds' register
/// budget without local memory (a spill), as `scripts/gen-ptx.sh --ptxas` finds for sm_80 and
/// sm_90.
#[test]
fn gpu_every_entry_loads_within_its_register_budget() {
    let Some(dev) = common::gpu("gpu_every_entry_loads_within_its_register_budget") else {
        return;
    };
    let _bind = dev.launcher(0);
    let info = care_kernels::cuda::kernel_info().unwrap();
    assert_eq!(info.len(), care_kernels::Kernel::ALL.len());
    for i in &info {
        let b = i.kernel.bounds();
        eprintln!(
            "{:24} {:>3} registers (budget {:>3}), {:>4} bytes local, {:>6} bytes shared, \
             {:>4} threads",
            i.kernel.name(),
            i.registers,
            b.register_budget(),
            i.local_bytes,
            i.shared_bytes,
            i.max_threads
        );
        assert!(i.within_budget(), "{i:?}");
        assert!(i.max_threads >= b.threads, "{i:?}");
    }
}

/// On a GPU: the random cases (fixed RNG, `CARE_GPU_CASES`) and a `[64, 151,936]` `bf16` case
/// (sequences spanning the blocks' row ranges, in place and out of place), fused against the
/// three-kernel path at the same block size: `logp` and `dlogits` bit for bit (the device-only
/// instructions, `ex2.approx` and the packed conversions, are the same in both paths).
#[test]
fn gpu_fused_equals_the_three_kernel_path() {
    let Some(mut dev) = common::gpu("gpu_fused_equals_the_three_kernel_path") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for i in 0..common::gpu_cases() {
        use proptest::strategy::ValueTree;
        let c = case_strategy().new_tree(&mut runner).unwrap().current();
        let blocks = 1 + i % 3;
        check::<f32, _>(&mut dev, &c, 64, blocks, 0).unwrap();
        check::<half::bf16, _>(&mut dev, &c, 64, blocks, 0).unwrap();
        check::<half::f16, _>(&mut dev, &c, 64, blocks, 0).unwrap();
    }
    let mut r = Rng(7);
    let (n, vocab) = (64usize, 151_936usize);
    let logits = (0..n * vocab).map(|_| (r.unit() - 0.5) * 12.0).collect();
    let c = Case {
        vocab,
        stride: vocab,
        offset: 0,
        lens: vec![10, 30, 24],
        logits,
        targets: (0..n).map(|_| (r.next() % vocab as u64) as i32).collect(),
        mask: Some((0..n).map(|i| u8::from(!i.is_multiple_of(5))).collect()),
        old: (0..n).map(|_| -12.0 - r.unit()).collect(),
        reference: (0..n).map(|_| -12.0 - r.unit()).collect(),
        adv: vec![0.7, -1.1, 0.4],
        adv_per_token: false,
        temperature: 0.6,
        opts: LossOptions {
            beta: 0.04,
            aggregation: Aggregation::SeqMeanTokenMean,
            ..LossOptions::default()
        },
    };
    check::<half::bf16, _>(&mut dev, &c, 256, 40, 0).unwrap();
}
