//! `logsoftmax_{fwd,bwd}_{f32,bf16,f16}` under the host emulator, through the same plans as on
//! the GPU (`care_kernels::plan::logsoftmax`), against the f64 reference `care_core::logsoftmax`.
//!
//! Relations checked: (1) oracle: `logp`, `entropy`, `lse` and `dlogits` equal the reference
//! within `care_kernels::tolerance` (`LogSoftmax`, `LogSoftmaxGrad`) on random shapes (`V = 1`, `V` not a multiple of the vector width,
//! row strides and base offsets that break 16-byte alignment), rows with `-inf` entries, all
//! `-inf` rows, all-equal rows, `+-1e4` logits, temperatures 0.6 and 1.0, masked rows, `i32`
//! and `i64` targets, warp and block teams, grid-stride loops; (2) masked rows are never read
//! (they hold NaN here) and get exact zeros; (3) in place equals out of place bit for bit;
//! (4) two fiber schedules give bit-identical outputs; (5) the fused logits-to-loss path equals
//! `care_core::logsoftmax::logits_policy_loss`; (6) a bad target sets the status bit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::grpo::{Advantages, LogProb, LossInputs, LossOptions};
use care_core::logsoftmax::{
    LogSoftmaxOptions, Logits, LogitsLossBuffers as CpuLossBuffers, logits_policy_loss,
    row_lse_entropy, selective_log_softmax, selective_log_softmax_backward,
};
use care_kernels::params::LossStatsRaw;
use care_kernels::tolerance::{Quantity, Tolerance, tolerance};
use care_kernels::{
    Dtype, LogSoftmaxGrads, LogSoftmaxOutputs, LogitsBuffers, LogitsLossBuffers, Tuning,
    WORKSPACE_BYTES, log_softmax_backward, log_softmax_forward, log_softmax_status,
    logits_loss_forward,
};
use care_kernels_emu::{Emulator, addr, addr_mut};
use proptest::prelude::*;

mod common;

use std::cell::RefCell;

use common::{Device, GpuDevice};

thread_local! {
    /// Where `forward` / `backward` run: the emulator (`None`) or this GPU. Tests run on
    /// several threads, so each thread has its own choice; only the `gpu_*` test sets it.
    static GPU: RefCell<Option<GpuDevice>> = const { RefCell::new(None) };
}

fn emu(seed: u64) -> Emulator {
    Emulator { seed }
}

/// The forward tolerance of a row of scale `s` (logp, entropy, lse).
fn forward_bound(dtype: Dtype, s: f64) -> f64 {
    tolerance(Quantity::LogSoftmax, dtype)
        .unwrap()
        .bound(s, 0.0)
}

/// The backward tolerance of one element: row scale `s`, gradient scale `g`, reference `want`.
fn backward_bound(dtype: Dtype, s: f64, g: f64, want: f64) -> f64 {
    tolerance(Quantity::LogSoftmaxGrad, dtype)
        .unwrap()
        .bound_through(s, g, want)
}

trait El: LogProb + bytemuck::Pod + core::fmt::Debug {
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

/// xorshift64*, for the row contents (proptest picks the shape and the seed).
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
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Row kinds: the edge cases of the issue, mixed into every case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Random,
    SomeNegInf,
    AllEqual,
    Extreme,
    AllNegInf,
}

#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    vocab: usize,
    stride: usize,
    /// Elements before row 0 (shifts the 16-byte alignment of every row).
    offset: usize,
    /// `offset + rows * stride` values; stride gaps and masked rows hold NaN.
    logits: Vec<f32>,
    targets: Vec<i64>,
    mask: Option<Vec<u8>>,
    temperature: f64,
    i64_targets: bool,
    kinds: Vec<Kind>,
}

#[allow(clippy::too_many_arguments)]
fn make_case(
    rows: usize,
    vocab: usize,
    pad: usize,
    offset: usize,
    seed: u64,
    temperature: f64,
    masked: bool,
    i64_targets: bool,
) -> Case {
    let mut r = Rng(seed | 1);
    let stride = vocab + pad;
    let mut logits = vec![f32::NAN; offset + rows * stride];
    let mut targets = Vec::with_capacity(rows);
    let mut kinds = Vec::with_capacity(rows);
    let mask: Option<Vec<u8>> =
        masked.then(|| (0..rows).map(|_| u8::from(r.below(4) != 0)).collect());
    for i in 0..rows {
        let kind = match r.below(10) {
            0 => Kind::SomeNegInf,
            1 => Kind::AllEqual,
            2 => Kind::Extreme,
            3 if r.below(3) == 0 => Kind::AllNegInf,
            _ => Kind::Random,
        };
        let y = r.below(vocab as u64) as usize;
        let row = &mut logits[offset + i * stride..offset + i * stride + vocab];
        let c = (r.unit() - 0.5) * 20.0;
        for (j, x) in row.iter_mut().enumerate() {
            *x = match kind {
                Kind::Random => c + (r.unit() - 0.5) * 16.0,
                Kind::SomeNegInf => {
                    if r.below(3) == 0 || (j == y && r.below(2) == 0) {
                        f32::NEG_INFINITY
                    } else {
                        c + (r.unit() - 0.5) * 8.0
                    }
                }
                Kind::AllEqual => c,
                Kind::Extreme => match r.below(3) {
                    0 => 1e4,
                    1 => -1e4,
                    _ => (r.unit() - 0.5) * 2e4,
                },
                Kind::AllNegInf => f32::NEG_INFINITY,
            };
        }
        if mask.as_ref().is_some_and(|m| m[i] == 0) {
            // Masked rows are never read: poison them.
            row.fill(f32::NAN);
        }
        targets.push(y as i64);
        kinds.push(kind);
    }
    Case {
        rows,
        vocab,
        stride,
        offset,
        logits,
        targets,
        mask,
        temperature,
        i64_targets,
        kinds,
    }
}

/// The scale of a row for the tolerance: the largest finite `|x / T|`, at least 1.
fn row_scale(row: &[f64], t: f64) -> f64 {
    row.iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |a, x| a.max((x / t).abs()))
}

/// The rows the CPU reference computes: counted rows that have a softmax. A counted row of
/// only `-inf` logits is an error for the reference (`NonFinite`); the kernel, which cannot
/// refuse, writes NaN for it (`is_neg_inf_row`, checked where the outputs are compared).
fn reference_mask(c: &Case) -> Vec<u8> {
    (0..c.rows)
        .map(|i| u8::from(c.mask.as_ref().is_none_or(|m| m[i] != 0) && !is_neg_inf_row(c, i)))
        .collect()
}

/// Row `i` is counted and all `-inf` (an `AllNegInf` row, or a `SomeNegInf` row that drew
/// `-inf` everywhere).
fn is_neg_inf_row(c: &Case, i: usize) -> bool {
    let start = c.offset + i * c.stride;
    c.mask.as_ref().is_none_or(|m| m[i] != 0)
        && c.logits[start..start + c.vocab]
            .iter()
            .all(|&x| x == f32::NEG_INFINITY)
}

struct Fwd {
    logp: Vec<f32>,
    entropy: Vec<f32>,
    lse: Vec<f32>,
    status: u32,
}

struct Dev<T: El> {
    data: Vec<T>,
    t32: Vec<i32>,
    t64: Vec<i64>,
}

impl<T: El> Dev<T> {
    fn new(c: &Case) -> Self {
        Dev {
            data: c.logits.iter().map(|&x| T::from_f32(x)).collect(),
            t32: c.targets.iter().map(|&y| y as i32).collect(),
            t64: c.targets.clone(),
        }
    }
    fn rows(&self, c: &Case) -> LogitsBuffers {
        LogitsBuffers {
            dtype: T::DTYPE,
            logits: addr(&self.data) + (c.offset * size_of::<T>()) as u64,
            rows: c.rows as u64,
            vocab: c.vocab as u32,
            stride: c.stride as u64,
            targets: if c.i64_targets {
                addr(&self.t64)
            } else {
                addr(&self.t32)
            },
            targets_i64: c.i64_targets,
            mask: c.mask.as_deref().map_or(0, addr),
        }
    }
    fn logits(&self, c: &Case) -> Logits<'_, T> {
        Logits::new(&self.data[c.offset..], c.rows, c.vocab, c.stride).unwrap()
    }
}

fn forward<T: El>(c: &Case, dev: &Dev<T>, tuning: Tuning, seed: u64, entropy: bool) -> Fwd {
    if let Some(f) =
        GPU.with_borrow_mut(|g| g.as_mut().map(|g| forward_gpu(g, c, dev, tuning, entropy)))
    {
        return f;
    }
    let n = c.rows;
    let mut logp = vec![f32::NAN; n];
    let mut ent = vec![f32::NAN; n];
    let mut lse = vec![f32::NAN; n];
    let mut status = [0x5555_5555u32];
    let out = LogSoftmaxOutputs {
        logp: addr_mut(&mut logp),
        entropy: if entropy { addr_mut(&mut ent) } else { 0 },
        lse: addr_mut(&mut lse),
        status: addr_mut(&mut status),
    };
    let opts = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    // SAFETY: host buffers of the documented sizes.
    unsafe { log_softmax_forward(&emu(seed), &dev.rows(c), &out, &opts, tuning) }.unwrap();
    Fwd {
        logp,
        entropy: ent,
        lse,
        status: status[0],
    }
}

/// `forward` on the GPU: the same buffers uploaded (same misalignment), outputs poisoned.
fn forward_gpu<T: El>(
    g: &mut GpuDevice,
    c: &Case,
    dev: &Dev<T>,
    tuning: Tuning,
    entropy: bool,
) -> Fwd {
    let n = c.rows;
    let nan = vec![f32::NAN; n];
    let mut rows = dev.rows(c);
    rows.logits = g.upload(&dev.data) + (c.offset * size_of::<T>()) as u64;
    rows.targets = if c.i64_targets {
        g.upload(&dev.t64)
    } else {
        g.upload(&dev.t32)
    };
    rows.mask = c.mask.as_deref().map_or(0, |m| g.upload(m));
    let out = LogSoftmaxOutputs {
        logp: g.upload(&nan),
        entropy: if entropy { g.upload(&nan) } else { 0 },
        lse: g.upload(&nan),
        status: g.upload(&[0x5555_5555u32]),
    };
    let opts = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    let b = g.launcher(0);
    // SAFETY: device buffers of the documented sizes, alive in `g` until it is dropped.
    unsafe { log_softmax_forward(&b, &rows, &out, &opts, tuning) }.unwrap();
    b.synchronize().unwrap();
    Fwd {
        logp: g.download(out.logp, n),
        entropy: if entropy {
            g.download(out.entropy, n)
        } else {
            nan.clone()
        },
        lse: g.download(out.lse, n),
        status: g.download::<u32>(out.status, 1)[0],
    }
}

/// `|got - want| <= tol`; NaN matches NaN only, an infinity only itself.
fn close(got: f64, want: f64, tol: f64) -> bool {
    Tolerance::within(got, want, tol)
}

fn check_forward<T: El>(c: &Case, tuning: Tuning, seed: u64) -> Result<(), TestCaseError> {
    let dev = Dev::<T>::new(c);
    let got = forward(c, &dev, tuning, seed, true);
    // A counted all -inf row has no softmax: the kernel flags it, as the reference refuses it.
    let want_status = if (0..c.rows).any(|i| is_neg_inf_row(c, i)) {
        Err(care_core::Error::NonFinite)
    } else {
        Ok(())
    };
    prop_assert_eq!(log_softmax_status(got.status), want_status);
    let n = c.rows;
    let (mut logp, mut ent, mut lse) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let opts = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    selective_log_softmax(
        &dev.logits(c),
        &c.targets,
        Some(&reference_mask(c)),
        &opts,
        &mut logp,
        Some(&mut ent),
        Some(&mut lse),
    )
    .unwrap();
    let logits = dev.logits(c);
    for i in 0..n {
        if is_neg_inf_row(c, i) {
            prop_assert!(got.logp[i].is_nan() && got.entropy[i].is_nan(), "row {i}");
            continue;
        }
        let row: Vec<f64> = logits.row(i).unwrap().iter().map(|x| x.to_f64()).collect();
        let t = forward_bound(T::DTYPE, row_scale(&row, c.temperature));
        let what = |q: &str, g: f32, w: f64| {
            format!(
                "row {i} ({:?}) {q}: got {g}, want {w}, tol {t:e}, V {}",
                c.kinds[i], c.vocab
            )
        };
        prop_assert!(
            close(f64::from(got.logp[i]), logp[i], t),
            "{}",
            what("logp", got.logp[i], logp[i])
        );
        prop_assert!(
            close(f64::from(got.entropy[i]), ent[i], t),
            "{}",
            what("entropy", got.entropy[i], ent[i])
        );
        prop_assert!(
            close(f64::from(got.lse[i]), lse[i], t),
            "{}",
            what("lse", got.lse[i], lse[i])
        );
    }
    Ok(())
}

/// dL/dlogp and dL/dH per row.
fn grads(c: &Case, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut r = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
    let g = (0..c.rows).map(|_| (r.unit() - 0.5) * 4.0).collect();
    let e = (0..c.rows).map(|_| (r.unit() - 0.5) * 2.0).collect();
    (g, e)
}

/// Runs the backward pass; returns dlogits widened to f64, dense `[rows, V]`.
fn backward<T: El>(
    c: &Case,
    fwd: &Fwd,
    g: &[f32],
    e: Option<&[f32]>,
    in_place: bool,
    tuning: Tuning,
    seed: u64,
) -> Vec<f64> {
    if let Some(d) = GPU.with_borrow_mut(|gd| {
        gd.as_mut()
            .map(|gd| backward_gpu::<T>(gd, c, fwd, g, e, in_place, tuning))
    }) {
        return d;
    }
    let mut dev = Dev::<T>::new(c);
    let mut rows = dev.rows(c);
    // In place writes into the logits: hand out their address from a unique borrow.
    rows.logits = addr_mut(&mut dev.data) + (c.offset * size_of::<T>()) as u64;
    // Out of place: a separate buffer with its own stride and misalignment, poisoned.
    let dstride = c.vocab + 3;
    let doff = 1;
    let mut sep = vec![T::from_f32(f32::NAN); doff + c.rows * dstride];
    let (dlogits, ds) = if in_place {
        (rows.logits, c.stride as u64)
    } else {
        (
            addr_mut(&mut sep) + (doff * size_of::<T>()) as u64,
            dstride as u64,
        )
    };
    let gr = LogSoftmaxGrads {
        lse: addr(&fwd.lse),
        entropy: addr(&fwd.entropy),
        dlogp: addr(g),
        dentropy: e.map_or(0, addr),
        dlogits,
        dstride: ds,
    };
    let opts = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    // SAFETY: host buffers of the documented sizes; in place uses the logits' own layout.
    unsafe { log_softmax_backward(&emu(seed), &rows, &gr, &opts, tuning) }.unwrap();
    let (buf, off, st): (&[T], usize, usize) = if in_place {
        (&dev.data, c.offset, c.stride)
    } else {
        (&sep, doff, dstride)
    };
    let mut out = Vec::with_capacity(c.rows * c.vocab);
    for i in 0..c.rows {
        out.extend(
            buf[off + i * st..off + i * st + c.vocab]
                .iter()
                .map(|x| x.to_f64()),
        );
    }
    out
}

/// `backward` on the GPU, with the same layouts (separate buffer: stride `V + 3`, offset 1).
fn backward_gpu<T: El>(
    gd: &mut GpuDevice,
    c: &Case,
    fwd: &Fwd,
    g: &[f32],
    e: Option<&[f32]>,
    in_place: bool,
    tuning: Tuning,
) -> Vec<f64> {
    let dev = Dev::<T>::new(c);
    let mut rows = dev.rows(c);
    let base = gd.upload(&dev.data);
    rows.logits = base + (c.offset * size_of::<T>()) as u64;
    rows.targets = gd.upload(&dev.t64);
    rows.targets_i64 = true;
    rows.mask = c.mask.as_deref().map_or(0, |m| gd.upload(m));
    let (dstride, doff) = (c.vocab + 3, 1);
    let sep = vec![T::from_f32(f32::NAN); doff + c.rows * dstride];
    let sep_base = gd.upload(&sep);
    let (dlogits, ds) = if in_place {
        (rows.logits, c.stride as u64)
    } else {
        (sep_base + (doff * size_of::<T>()) as u64, dstride as u64)
    };
    let gr = LogSoftmaxGrads {
        lse: gd.upload(&fwd.lse),
        entropy: gd.upload(&fwd.entropy),
        dlogp: gd.upload(g),
        dentropy: e.map_or(0, |e| gd.upload(e)),
        dlogits,
        dstride: ds,
    };
    let opts = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    let b = gd.launcher(0);
    // SAFETY: device buffers of the documented sizes; in place uses the logits' own layout.
    unsafe { log_softmax_backward(&b, &rows, &gr, &opts, tuning) }.unwrap();
    b.synchronize().unwrap();
    let (buf, off, st): (Vec<T>, usize, usize) = if in_place {
        (gd.download(base, dev.data.len()), c.offset, c.stride)
    } else {
        (gd.download(sep_base, sep.len()), doff, dstride)
    };
    let mut out = Vec::with_capacity(c.rows * c.vocab);
    for i in 0..c.rows {
        out.extend(
            buf[off + i * st..off + i * st + c.vocab]
                .iter()
                .map(|x| x.to_f64()),
        );
    }
    out
}

fn check_backward<T: El>(c: &Case, tuning: Tuning, seed: u64) -> Result<(), TestCaseError> {
    let dev = Dev::<T>::new(c);
    let fwd = forward(c, &dev, tuning, seed, true);
    let (g, e) = grads(c, seed);
    let with_ent = seed.is_multiple_of(2);
    let ent = with_ent.then_some(&e[..]);
    let got = backward::<T>(c, &fwd, &g, ent, false, tuning, seed);
    let got_in_place = backward::<T>(c, &fwd, &g, ent, true, tuning, seed.wrapping_add(1));
    for (a, b) in got.iter().zip(&got_in_place) {
        prop_assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "in place {b} != out of place {a}"
        );
    }
    let g64: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
    let e64: Vec<f64> = e.iter().map(|&x| f64::from(x)).collect();
    let mut want = vec![0.0f64; c.rows * c.vocab];
    let opts = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    let logits = dev.logits(c);
    selective_log_softmax_backward(
        &logits,
        &c.targets,
        Some(&reference_mask(c)),
        &opts,
        &g64,
        with_ent.then_some(&e64[..]),
        &mut want,
    )
    .unwrap();
    for i in 0..c.rows {
        let dense = &want[i * c.vocab..(i + 1) * c.vocab];
        let gotr = &got[i * c.vocab..(i + 1) * c.vocab];
        if c.mask.as_ref().is_some_and(|m| m[i] == 0) {
            prop_assert!(
                gotr.iter().all(|x| x.to_bits() == 0),
                "masked row {i} not exactly 0"
            );
            continue;
        }
        let row: Vec<f64> = logits.row(i).unwrap().iter().map(|x| x.to_f64()).collect();
        let (_, h) = row_lse_entropy(logits.row(i).unwrap(), 1.0 / c.temperature);
        if !h.is_finite() {
            // All -inf (or NaN) rows: the gradient is NaN on both sides, nothing to compare.
            continue;
        }
        let scale = row_scale(&row, c.temperature);
        let ge = if with_ent { f64::from(e[i]).abs() } else { 0.0 };
        let gscale = (f64::from(g[i]).abs() + ge * (1.0 + h.abs() + 2.0 * scale)) / c.temperature;
        for j in 0..c.vocab {
            let t = backward_bound(T::DTYPE, scale, gscale, dense[j]);
            prop_assert!(
                close(gotr[j], dense[j], t),
                "row {i} ({:?}) j {j}: got {}, want {}, tol {t:e}, V {}",
                c.kinds[i],
                gotr[j],
                dense[j],
                c.vocab
            );
        }
    }
    Ok(())
}

fn shape() -> impl Strategy<Value = (usize, usize, usize, usize)> {
    (
        1usize..14,
        prop_oneof![
            Just(1usize),
            1usize..40,
            Just(8usize),
            Just(64usize),
            60usize..300,
            2040usize..2060,
        ],
        0usize..4,
        0usize..8,
    )
}

fn tuning() -> impl Strategy<Value = Tuning> {
    (
        prop_oneof![
            Just(None),
            Just(Some(32u32)),
            Just(Some(64)),
            Just(Some(96))
        ],
        prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
        prop_oneof![Just(None), Just(Some(1u32)), Just(Some(2))],
    )
        .prop_map(|(threads, block_team, max_blocks)| Tuning {
            threads,
            block_team,
            max_blocks,
            ..Tuning::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn pt_forward_matches_reference(
        (rows, vocab, pad, offset) in shape(),
        seed in any::<u64>(),
        t in prop_oneof![Just(1.0f64), Just(0.6)],
        masked in any::<bool>(),
        i64_targets in any::<bool>(),
        dt in 0u8..3,
        tn in tuning(),
    ) {
        let c = make_case(rows, vocab, pad, offset, seed, t, masked, i64_targets);
        match dt {
            0 => check_forward::<f32>(&c, tn, seed)?,
            1 => check_forward::<half::bf16>(&c, tn, seed)?,
            _ => check_forward::<half::f16>(&c, tn, seed)?,
        }
    }

    #[test]
    fn pt_backward_matches_reference_in_and_out_of_place(
        (rows, vocab, pad, offset) in shape(),
        seed in any::<u64>(),
        t in prop_oneof![Just(1.0f64), Just(0.6)],
        masked in any::<bool>(),
        dt in 0u8..3,
        tn in tuning(),
    ) {
        let c = make_case(rows, vocab, pad, offset, seed, t, masked, true);
        match dt {
            0 => check_backward::<f32>(&c, tn, seed)?,
            1 => check_backward::<half::bf16>(&c, tn, seed)?,
            _ => check_backward::<half::f16>(&c, tn, seed)?,
        }
    }
}

#[test]
fn large_vocab_rows_in_every_dtype() {
    // A few rows of a vocabulary that is not a multiple of 8, in block mode with the default
    // geometry, misaligned by one element.
    for (k, t) in [(0u64, 1.0f64), (1, 0.6)] {
        let c = make_case(3, 5003, 1, 1, 0xC0FFEE + k, t, false, k == 0);
        check_forward::<f32>(&c, Tuning::default(), 7).unwrap();
        check_forward::<half::bf16>(&c, Tuning::default(), 8).unwrap();
        check_forward::<half::f16>(&c, Tuning::default(), 9).unwrap();
        check_backward::<half::bf16>(&c, Tuning::default(), 10).unwrap();
        check_backward::<half::f16>(&c, Tuning::default(), 11).unwrap();
        check_backward::<f32>(&c, Tuning::default(), 12).unwrap();
    }
}

#[test]
fn vocab_one_gives_zero_logp_and_entropy() {
    let mut c = make_case(5, 1, 0, 0, 3, 0.6, false, false);
    for (x, k) in c.logits.iter_mut().zip(&mut c.kinds) {
        *x = 3.5;
        *k = Kind::Random;
    }
    let dev = Dev::<half::bf16>::new(&c);
    let f = forward(&c, &dev, Tuning::default(), 1, true);
    assert!(f.logp.iter().all(|&x| x == 0.0), "{:?}", f.logp);
    assert!(f.entropy.iter().all(|&x| x == 0.0), "{:?}", f.entropy);
    assert!(
        f.lse.iter().all(|&x| (x - 3.5 / 0.6).abs() < 1e-5),
        "{:?}",
        f.lse
    );
}

#[test]
fn all_equal_row_is_uniform() {
    let v = 1000;
    let mut c = make_case(2, v, 0, 0, 5, 1.0, false, false);
    c.logits.fill(-2.25);
    c.kinds = vec![Kind::AllEqual; 2];
    let dev = Dev::<f32>::new(&c);
    let f = forward(&c, &dev, Tuning::default(), 2, true);
    let ln_v = (v as f32).ln();
    for i in 0..2 {
        assert!((f.logp[i] + ln_v).abs() < 1e-5, "{}", f.logp[i]);
        assert!((f.entropy[i] - ln_v).abs() < 1e-5, "{}", f.entropy[i]);
    }
}

#[test]
fn two_schedules_are_bit_identical() {
    let c = make_case(9, 777, 2, 3, 42, 0.6, true, true);
    let dev = Dev::<half::bf16>::new(&c);
    for tn in [
        Tuning::default(),
        Tuning {
            threads: Some(64),
            block_team: Some(true),
            max_blocks: Some(2),
            ..Tuning::default()
        },
    ] {
        let a = forward(&c, &dev, tn, 1, true);
        let b = forward(&c, &dev, tn, 2, true);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.logp), bits(&b.logp));
        assert_eq!(bits(&a.entropy), bits(&b.entropy));
        assert_eq!(bits(&a.lse), bits(&b.lse));
    }
}

#[test]
fn rows_without_a_softmax_set_the_non_finite_status_as_the_reference_refuses_them() {
    let ni = f32::NEG_INFINITY;
    // Each case: one bad counted row among good ones, and the temperature.
    let bad: [(&str, [f32; 4], f64); 5] = [
        ("all -inf", [ni, ni, ni, ni], 1.0),
        ("+inf", [0.0, f32::INFINITY, 1.0, 2.0], 1.0),
        ("NaN", [0.0, f32::NAN, 1.0, 2.0], 1.0),
        ("scaled to +inf", [3e38, 0.0, 1.0, 2.0], 0.5),
        ("NaN among -inf", [ni, f32::NAN, ni, ni], 1.0),
    ];
    for (what, row, t) in bad {
        for masked in [false, true] {
            let mut c = make_case(3, 4, 0, 0, 9, t, false, false);
            c.kinds = vec![Kind::Random; 3];
            c.logits = [[0.25, -0.5, 0.0, 0.125], row, [0.0, 0.0, 0.5, -1.0]].concat();
            c.targets = vec![0, 2, 3];
            // Masking the bad row out: nothing is read, nothing is flagged.
            c.mask = masked.then(|| vec![1, 0, 1]);
            let dev = Dev::<f32>::new(&c);
            let f = forward(&c, &dev, Tuning::default(), 5, true);
            let mut lp = vec![0.0; 3];
            let o = LogSoftmaxOptions { temperature: t };
            let cpu = selective_log_softmax(
                &dev.logits(&c),
                &c.targets,
                c.mask.as_deref(),
                &o,
                &mut lp,
                None,
                None,
            );
            let want = if masked {
                Ok(())
            } else {
                Err(care_core::Error::NonFinite)
            };
            assert_eq!(
                log_softmax_status(f.status),
                want,
                "{what}, masked {masked}"
            );
            assert_eq!(cpu, want, "the CPU reference: {what}, masked {masked}");
            assert!(f.logp[0].is_finite() && f.logp[2].is_finite(), "{what}");
            if !masked {
                assert!(!f.lse[1].is_finite(), "{what}: lse {}", f.lse[1]);
            }
        }
    }
    // A finite logit whose scaled value underflows to -inf has probability 0, as a -inf logit:
    // no flag, and the CPU reference accepts it too.
    let mut c = make_case(1, 4, 0, 0, 9, 0.5, false, false);
    c.kinds = vec![Kind::Random; 1];
    c.logits = vec![-3e38, 0.0, 1.0, 2.0];
    c.targets = vec![0];
    let dev = Dev::<f32>::new(&c);
    let f = forward(&c, &dev, Tuning::default(), 5, false);
    assert_eq!(log_softmax_status(f.status), Ok(()));
    assert_eq!(f.logp[0], f32::NEG_INFINITY);
    let mut lp = vec![0.0; 1];
    let o = LogSoftmaxOptions { temperature: 0.5 };
    selective_log_softmax(&dev.logits(&c), &c.targets, None, &o, &mut lp, None, None).unwrap();
    assert!(lp[0] < -1e38, "{}", lp[0]);
}

#[test]
fn bad_target_sets_the_status_and_writes_nan() {
    let mut c = make_case(4, 50, 0, 0, 9, 1.0, false, false);
    c.kinds = vec![Kind::Random; 4];
    for x in &mut c.logits {
        *x = 0.5;
    }
    c.targets[1] = 50; // == V
    c.targets[2] = -100; // an ignore index
    for i64_targets in [false, true] {
        c.i64_targets = i64_targets;
        let dev = Dev::<f32>::new(&c);
        let f = forward(&c, &dev, Tuning::default(), 3, false);
        assert_eq!(
            log_softmax_status(f.status),
            Err(care_core::Error::InvalidArgument)
        );
        assert!(f.logp[1].is_nan() && f.logp[2].is_nan());
        assert!(f.logp[0].is_finite() && f.logp[3].is_finite());
        // The CPU reference refuses the same input.
        let mut lp = vec![0.0; 4];
        let r = selective_log_softmax(
            &dev.logits(&c),
            &c.targets,
            None,
            &LogSoftmaxOptions::default(),
            &mut lp,
            None,
            None,
        );
        assert_eq!(r, Err(care_core::Error::InvalidArgument));
    }
}

#[test]
fn plan_rejects_bad_arguments() {
    let c = make_case(2, 10, 0, 0, 1, 1.0, false, false);
    let dev = Dev::<f32>::new(&c);
    let mut logp = vec![0f32; 2];
    let out = LogSoftmaxOutputs {
        logp: addr_mut(&mut logp),
        entropy: 0,
        lse: 0,
        status: 0,
    };
    let emu = emu(1);
    let mut rows = dev.rows(&c);
    let bad_t = LogSoftmaxOptions { temperature: 0.0 };
    // SAFETY: every call below is rejected before any launch, or uses valid host buffers.
    unsafe {
        assert!(log_softmax_forward(&emu, &rows, &out, &bad_t, Tuning::default()).is_err());
        let bad_threads = Tuning {
            threads: Some(48),
            ..Tuning::default()
        };
        let ok = LogSoftmaxOptions::default();
        assert!(log_softmax_forward(&emu, &rows, &out, &ok, bad_threads).is_err());
        rows.stride = 9; // < vocab
        assert!(log_softmax_forward(&emu, &rows, &out, &ok, Tuning::default()).is_err());
        rows = dev.rows(&c);
        let lse = vec![0f32; 2];
        // In place with a different stride would overwrite unread logits.
        let gr = LogSoftmaxGrads {
            lse: addr(&lse),
            entropy: 0,
            dlogp: 0,
            dentropy: 0,
            dlogits: rows.logits,
            dstride: 11,
        };
        assert!(log_softmax_backward(&emu, &rows, &gr, &ok, Tuning::default()).is_err());
        // dentropy without the saved entropy.
        let gr2 = LogSoftmaxGrads {
            dlogits: rows.logits,
            dstride: 10,
            dentropy: addr(&lse),
            ..gr
        };
        assert!(log_softmax_backward(&emu, &rows, &gr2, &ok, Tuning::default()).is_err());
    }
}

#[test]
fn fused_logits_loss_matches_reference() {
    for (dt, seed) in [(0u8, 11u64), (1, 12), (2, 13)] {
        // 3 sequences over 10 rows, V = 301, a mask, off-policy ratio, temperature 0.6.
        let mut c = make_case(10, 301, 0, 0, seed, 0.6, true, false);
        // Keep every counted row finite so that the loss is finite.
        for (i, k) in c.kinds.clone().iter().enumerate() {
            if matches!(k, Kind::AllNegInf | Kind::SomeNegInf | Kind::Extreme) {
                for j in 0..c.vocab {
                    if c.mask.as_ref().is_none_or(|m| m[i] != 0) {
                        c.logits[i * c.stride + j] = ((i * 7 + j * 13) % 17) as f32 * 0.3;
                    }
                }
                c.kinds[i] = Kind::Random;
            }
        }
        match dt {
            0 => check_fused::<f32>(&c, seed),
            1 => check_fused::<half::bf16>(&c, seed),
            _ => check_fused::<half::f16>(&c, seed),
        }
    }
}

fn check_fused<T: El>(c: &Case, seed: u64) {
    let seq = [0u32, 4, 7, 10];
    let adv = [0.8f32, -1.2, 0.3];
    let mut r = Rng(seed);
    let old: Vec<f32> = (0..c.rows).map(|_| -3.0 - r.unit() * 2.0).collect();
    let old64: Vec<f64> = old.iter().map(|&x| f64::from(x)).collect();
    let loss = LossOptions::default();
    let lsm = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    let mut dev = Dev::<T>::new(c);

    // CPU reference.
    let logits = dev.logits(c);
    let mut lp = vec![0.0f64; c.rows];
    let mut dlp = vec![0.0f32; c.rows];
    let mut dl = vec![0.0f64; c.rows * c.vocab];
    let dummy = vec![0.0f64; c.rows];
    let inputs = LossInputs {
        logp: &dummy,
        logp_old: Some(&old64),
        logp_ref: None,
        seq_offsets: &seq,
        mask: c.mask.as_deref(),
        advantages: Advantages::PerSequence(&adv),
        logp_rollout: None,
    };
    let want = logits_policy_loss(
        &logits,
        &c.targets,
        &lsm,
        &inputs,
        &loss,
        CpuLossBuffers {
            logp: &mut lp,
            dlogp: &mut dlp,
            dlogits: &mut dl,
        },
    )
    .unwrap();

    // Kernels: forward (logp, lse, loss, stats, dlogp), then backward in place (the logits'
    // address comes from a unique borrow, since the backward pass writes there).
    let mut rows = dev.rows(c);
    rows.logits = addr_mut(&mut dev.data) + (c.offset * size_of::<T>()) as u64;
    let mut logp = vec![f32::NAN; c.rows];
    let mut lse = vec![f32::NAN; c.rows];
    let mut dlogp = vec![f32::NAN; c.rows];
    let mut stats = [LossStatsRaw::EMPTY];
    #[repr(align(16))]
    struct Ws([u8; WORKSPACE_BYTES]);
    let mut ws = Ws([0x55; WORKSPACE_BYTES]);
    let buf = LogitsLossBuffers {
        logp: addr_mut(&mut logp),
        lse: addr_mut(&mut lse),
        dlogp: addr_mut(&mut dlogp),
        logp_old: addr(&old),
        logp_ref: 0,
        adv: addr(&adv),
        adv_per_token: false,
        seq_offsets: addr(&seq),
        n_seq: 3,
        max_seq_len: 0,
        stats: addr_mut(&mut stats),
        workspace: addr_mut(&mut ws.0),
    };
    let emu = emu(seed);
    // SAFETY: host buffers of the documented sizes.
    unsafe { logits_loss_forward(&emu, &rows, &buf, &lsm, &loss, Tuning::default()) }.unwrap();
    let st = stats[0].to_core();
    assert!(
        (st.loss - want.loss).abs() <= 1e-5 + 1e-4 * want.loss.abs(),
        "loss {} vs {}",
        st.loss,
        want.loss
    );
    assert_eq!(st.tokens, want.stats.tokens);
    let gmax = dlp.iter().fold(0f32, |a, x| a.max(x.abs()));
    for i in 0..c.rows {
        assert!(
            (dlogp[i] - dlp[i]).abs() <= 1e-6 + 1e-4 * gmax,
            "dlogp[{i}] {} vs {}",
            dlogp[i],
            dlp[i]
        );
    }
    let gr = LogSoftmaxGrads {
        lse: addr(&lse),
        entropy: 0,
        dlogp: addr(&dlogp),
        dentropy: 0,
        dlogits: rows.logits,
        dstride: c.stride as u64,
    };
    // SAFETY: in place over the host logits.
    unsafe { log_softmax_backward(&emu, &rows, &gr, &lsm, Tuning::default()) }.unwrap();
    for i in 0..c.rows {
        for j in 0..c.vocab {
            let got = dev.data[i * c.stride + j].to_f64();
            let w = dl[i * c.vocab + j];
            let t = backward_bound(
                T::DTYPE,
                10.0 / c.temperature,
                f64::from(gmax) / c.temperature,
                w,
            );
            assert!(
                close(got, w, t),
                "dlogits[{i}][{j}] {got} vs {w} (tol {t:e})"
            );
        }
    }
}

/// The random cases of the property tests (fixed RNG, `CARE_GPU_CASES`) and the large-vocabulary
/// rows on the GPU, forward and backward, every dtype; skipped without a driver.
#[test]
fn gpu_logsoftmax_matches_reference() {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let Some(gpu) = common::gpu("gpu_logsoftmax_matches_reference") else {
        return;
    };
    GPU.with_borrow_mut(|g| *g = Some(gpu));
    let config = ProptestConfig {
        cases: common::gpu_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = (
        shape(),
        any::<u64>(),
        prop_oneof![Just(1.0f64), Just(0.6)],
        any::<bool>(),
        0u8..3,
        tuning(),
    );
    let result = runner.run(
        &strategy,
        |((rows, vocab, pad, offset), seed, t, masked, dt, tn)| {
            let c = make_case(rows, vocab, pad, offset, seed, t, masked, seed % 3 == 0);
            match dt {
                0 => {
                    check_forward::<f32>(&c, tn, seed)?;
                    check_backward::<f32>(&c, tn, seed)
                }
                1 => {
                    check_forward::<half::bf16>(&c, tn, seed)?;
                    check_backward::<half::bf16>(&c, tn, seed)
                }
                _ => {
                    check_forward::<half::f16>(&c, tn, seed)?;
                    check_backward::<half::f16>(&c, tn, seed)
                }
            }
        },
    );
    // A 151,936-wide vocabulary (the benchmark's), misaligned by one element, both temperatures.
    let wide = || {
        for (k, t) in [(0u64, 1.0f64), (1, 0.6)] {
            let c = make_case(4, 151_936, 0, 1, 0xBEEF + k, t, true, true);
            check_forward::<half::bf16>(&c, Tuning::default(), 1).unwrap();
            check_backward::<half::bf16>(&c, Tuning::default(), 2).unwrap();
            check_forward::<f32>(&c, Tuning::default(), 3).unwrap();
        }
    };
    if result.is_ok() {
        wide();
    }
    GPU.with_borrow_mut(|g| *g = None);
    result.unwrap();
}

/// The safe API over `cudarc` buffers (`log_softmax_on`, `log_softmax_backward_on`) on a GPU,
/// against the reference; skipped without a driver.
#[test]
fn gpu_safe_api_matches_reference() {
    use care_kernels::cuda::{
        DeviceLogSoftmaxGrads, DeviceLogits, log_softmax_backward_on, log_softmax_on,
    };
    use care_kernels::cudarc::driver::CudaContext;
    if common::gpu("gpu_safe_api_matches_reference").is_none() {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let c = make_case(6, 3001, 0, 0, 77, 0.6, true, true);
    let host = Dev::<half::bf16>::new(&c);
    let logits = stream.clone_htod(&host.data).unwrap();
    let targets = stream.clone_htod(&host.t64).unwrap();
    let mask = stream.clone_htod(c.mask.as_deref().unwrap()).unwrap();
    let input = DeviceLogits {
        logits: &logits,
        rows: c.rows,
        vocab: c.vocab as u32,
        stride: c.stride,
        targets: &targets,
        mask: Some(&mask),
    };
    let opts = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    let mut logp = stream.alloc_zeros::<f32>(c.rows).unwrap();
    let mut lse = stream.alloc_zeros::<f32>(c.rows).unwrap();
    log_softmax_on(&stream, &input, &opts, &mut logp, None, Some(&mut lse)).unwrap();
    let got = stream.clone_dtoh(&logp).unwrap();
    let mut want = vec![0.0; c.rows];
    selective_log_softmax(
        &host.logits(&c),
        &c.targets,
        Some(&reference_mask(&c)),
        &opts,
        &mut want,
        None,
        None,
    )
    .unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if is_neg_inf_row(&c, i) {
            assert!(g.is_nan(), "row {i}");
            continue;
        }
        let row: Vec<f64> = host
            .logits(&c)
            .row(i)
            .unwrap()
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let t = forward_bound(Dtype::Bf16, row_scale(&row, c.temperature));
        assert!(close(f64::from(*g), *w, t), "row {i}: {g} vs {w}");
    }
    let g: Vec<f32> = (0..c.rows).map(|i| i as f32 - 2.5).collect();
    let dlogp = stream.clone_htod(&g).unwrap();
    let mut d = stream.alloc_zeros::<half::bf16>(c.rows * c.vocab).unwrap();
    let grads = DeviceLogSoftmaxGrads {
        lse: &lse,
        dlogp: &dlogp,
        entropy_and_grad: None,
    };
    log_softmax_backward_on(&stream, &input, &opts, &grads, &mut d).unwrap();
    let got = stream.clone_dtoh(&d).unwrap();
    let g64: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
    let mut want = vec![0.0; c.rows * c.vocab];
    selective_log_softmax_backward(
        &host.logits(&c),
        &c.targets,
        Some(&reference_mask(&c)),
        &opts,
        &g64,
        None,
        &mut want,
    )
    .unwrap();
    for (k, (a, w)) in got.iter().zip(&want).enumerate() {
        let i = k / c.vocab;
        if is_neg_inf_row(&c, i) {
            continue;
        }
        let row: Vec<f64> = host
            .logits(&c)
            .row(i)
            .unwrap()
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let s = row_scale(&row, c.temperature);
        let gs = f64::from(g[i]).abs() / c.temperature;
        let t = backward_bound(Dtype::Bf16, s, gs, *w);
        assert!(close(a.to_f64(), *w, t), "element {k}: {a} vs {w}");
    }
    // Bad target: the status becomes the reference's error.
    let mut bad = c.targets.clone();
    bad[0] = c.vocab as i64;
    let bad_t = stream.clone_htod(&bad).unwrap();
    let bad_in = DeviceLogits {
        targets: &bad_t,
        mask: None,
        ..input
    };
    let r = log_softmax_on(&stream, &bad_in, &opts, &mut logp, None, None);
    assert!(matches!(
        r,
        Err(care_kernels::KernelError::Core(
            care_core::Error::InvalidArgument
        ))
    ));
}

/// Clip-Cov and KL-Cov need a workspace that grows with the tokens; the fused path's is fixed,
/// so it refuses them before any launch.
#[test]
fn fused_path_refuses_the_covariance_losses() {
    for policy_loss in [
        care_core::grpo::PolicyLoss::ClipCov,
        care_core::grpo::PolicyLoss::KlCov,
    ] {
        let loss = LossOptions {
            policy_loss,
            ..LossOptions::default()
        };
        let rows = LogitsBuffers {
            dtype: Dtype::F32,
            logits: 0,
            rows: 4,
            vocab: 8,
            stride: 8,
            targets: 0,
            targets_i64: false,
            mask: 0,
        };
        let buf = LogitsLossBuffers {
            logp: 0,
            lse: 0,
            dlogp: 0,
            logp_old: 0,
            logp_ref: 0,
            adv: 0,
            adv_per_token: false,
            seq_offsets: 0,
            n_seq: 1,
            max_seq_len: 0,
            stats: 0,
            workspace: 16,
        };
        // SAFETY: refused before any launch or access.
        let r = unsafe {
            logits_loss_forward(
                &emu(1),
                &rows,
                &buf,
                &LogSoftmaxOptions::default(),
                &loss,
                Tuning::default(),
            )
        };
        assert!(
            matches!(
                r,
                Err(care_kernels::KernelError::Core(
                    care_core::Error::InvalidArgument
                ))
            ),
            "{policy_loss:?}"
        );
    }
}
