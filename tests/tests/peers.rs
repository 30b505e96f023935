//! The differential suite of the GRPO step: `care-core` against the peers' formulas as
//! transcribed, independently of `care-core`, in `care_tests::peers` (verl, TRL, OpenRLHF), on
//! random padded batches with ragged responses, interior masks and fully masked rows.
//!
//! Relation checked everywhere: on ordinary inputs (log ratios well inside every clamp), each
//! peer configuration and the `care` options documented as its mapping give the same numbers
//! to `f32` rounding; where a difference is documented, the test states it exactly.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use care_core::grpo::{
    AdvantageOptions, Advantages, Aggregation, Bypass, GaeOptions, GroupInputs, GroupLayout,
    IsLevel, KlEstimator, LossInputs, LossOptions, LossPreset, MaskedToken, Preset, RatioLevel,
    RejectBound, Rejection, RejectionMode, RolloutInputs, RolloutOptions, Scale, WhitenOptions,
    broadcast_to_tokens, discounted_returns, discounted_returns_whitened, gae, gae_whitened,
    group_advantages_with, policy_loss, rollout_correction, whiten,
};
use care_tests::peers::{self, Rows, RsOption};
use proptest::prelude::*;

/// A padded `[B][T]` batch of `f32`-exact values, with the CSR layout `care` reads.
#[derive(Debug, Clone)]
struct Padded {
    b: usize,
    t: usize,
    /// Four value columns (log-probs or rewards and values), `f32`.
    cols: [Vec<f32>; 4],
    mask: Vec<u8>,
}

impl Padded {
    fn offsets(&self) -> Vec<u32> {
        (0..=self.b).map(|i| (i * self.t) as u32).collect()
    }
    fn rows(&self, c: usize) -> Rows {
        self.cols[c]
            .chunks(self.t)
            .map(|r| r.iter().map(|&x| f64::from(x)).collect())
            .collect()
    }
    fn mask_rows(&self) -> Rows {
        self.mask
            .chunks(self.t)
            .map(|r| r.iter().map(|&m| f64::from(m)).collect())
            .collect()
    }
    fn empty_rows(&self) -> usize {
        self.mask
            .chunks(self.t)
            .filter(|r| r.iter().all(|&m| m == 0))
            .count()
    }
}

/// Rows of random length (trailing padding), some interior masked tokens, and now and then a
/// fully masked row. Column 0 is a log-prob in `[-4, 0)`; columns 1-3 are column 0 plus a
/// small offset (rollout / reference log-probs), or plain values in `[-2, 2)` for rewards.
fn padded() -> impl Strategy<Value = Padded> {
    (1usize..6, 1usize..9).prop_flat_map(|(b, t)| {
        let n = b * t;
        (
            prop::collection::vec(-4.0f32..-0.01, n),
            prop::collection::vec(-0.6f32..0.6, n),
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(0usize..=t, b),
            prop::collection::vec(prop_oneof![6 => Just(1u8), 1 => Just(0u8)], n),
        )
            .prop_map(move |(lp, d, c2, c3, lens, holes)| {
                let mut mask = vec![0u8; n];
                for (i, &len) in lens.iter().enumerate() {
                    for j in 0..len {
                        mask[i * t + j] = holes[i * t + j];
                    }
                }
                let rollout = lp.iter().zip(&d).map(|(a, b)| a - b).collect();
                Padded {
                    b,
                    t,
                    cols: [lp, rollout, c2, c3],
                    mask,
                }
            })
    })
}

/// verl's `masked_whiten`: unbiased, `eps = 1e-8`, and `masked_mean`'s `count + 1e-8`.
const VERL_WHITEN: WhitenOptions = WhitenOptions {
    eps: 1e-8,
    std_kind: care_core::grpo::StdKind::Unbiased,
    count_eps: 1e-8,
};

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * (1.0 + b.abs())
}

fn run_rollout(
    p: &Padded,
    o: &RolloutOptions,
) -> (care_core::grpo::RolloutStats, Vec<f32>, Vec<u8>) {
    let inputs = RolloutInputs {
        logp_old: &p.cols[0],
        logp_rollout: &p.cols[1],
        seq_offsets: &p.offsets(),
        mask: Some(&p.mask),
    };
    let n = p.mask.len();
    let (mut w, mut keep) = (vec![0.0f32; n], vec![0u8; n]);
    let st = rollout_correction(&inputs, o, &mut w, &mut keep).unwrap();
    (st, w, keep)
}

const RS_NAMES: [&str; 11] = [
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// verl `rollout_is` token / sequence with `rollout_is_threshold` C: `care`'s weights.
    #[test]
    fn verl_rollout_is_weights(p in padded(), seq: bool, c in 0.5f64..3.0) {
        let o = RolloutOptions {
            is_level: if seq { IsLevel::Sequence } else { IsLevel::Token },
            is_threshold: c,
            ..RolloutOptions::default()
        };
        let (_, w, _) = run_rollout(&p, &o);
        let want = peers::verl_is_weights(&p.rows(0), &p.rows(1), &p.mask_rows(), seq, c);
        for (i, wr) in want.iter().enumerate() {
            for (j, &x) in wr.iter().enumerate() {
                let got = f64::from(w[i * p.t + j]);
                prop_assert!(close(got, x, 1e-6), "[{i}][{j}] {got} vs {x}");
            }
        }
    }

    /// verl `rollout_rs` (chained options, each with a one-number threshold; `k1` options get
    /// verl's default `[1/u, u]`): `care`'s mask after rejection.
    #[test]
    fn verl_rollout_rs_mask(p in padded(), picks in prop::collection::vec((0usize..11, 1.05f64..3.0), 1..4)) {
        let mut o = RolloutOptions::default();
        let mut opts = Vec::new();
        for &(k, u) in &picks {
            let r = Rejection::ALL[k];
            // k2/k3 thresholds on the scale of the statistics (x in [-0.6, 0.6]).
            let u = if r.is_k1() { u } else { (u - 1.0) * 0.2 };
            let b = if r.is_k1() { RejectBound::ratio(u) } else { RejectBound { lower: 0.0, upper: u } };
            o.reject[k] = b;
            opts.retain(|x: &RsOption| x.name != RS_NAMES[k]);
            opts.push(RsOption { name: RS_NAMES[k], lower: b.lower, upper: b.upper });
        }
        let (_, _, keep) = run_rollout(&p, &o);
        let want = peers::verl_rs_mask(&p.rows(0), &p.rows(1), &p.mask_rows(), &opts);
        for (i, wr) in want.iter().enumerate() {
            for (j, &x) in wr.iter().enumerate() {
                prop_assert_eq!(f64::from(keep[i * p.t + j]), x, "[{}][{}]", i, j);
            }
        }
    }

    /// verl `compute_offpolicy_metrics` from `care`'s sums. verl averages the per-sequence
    /// metrics over every row; a fully masked row adds 0 to `log_ppl_diff` and 1 to `chi2_seq`
    /// there, which the relation below accounts for exactly.
    #[test]
    fn verl_offpolicy_metrics(p in padded()) {
        let (st, _, _) = run_rollout(&p, &RolloutOptions::default());
        prop_assume!(st.tokens > 0.0);
        let [kl, k3, lpd, lpa, chi2_tok, chi2_seq] =
            peers::verl_offpolicy_metrics(&p.rows(0), &p.rows(1), &p.mask_rows());
        let b = p.b as f64;
        let empty = p.empty_rows() as f64;
        prop_assert!(close(st.kl_sum / st.tokens, kl, 1e-6));
        prop_assert!(close(st.k3_sum / st.tokens, k3, 1e-6));
        prop_assert!(close(st.log_ppl_diff_sum / b, lpd, 1e-6));
        prop_assert!(close(st.log_ppl_abs_diff_sum / b, lpa, 1e-6));
        prop_assert!(close(st.chi2_token_sum / st.tokens - 1.0, chi2_tok, 1e-6));
        prop_assert!(close((st.chi2_seq_sum + empty) / b - 1.0, chi2_seq, 1e-6));
        prop_assert_eq!(st.sequences, b - empty);
    }

    /// verl `gae` (before its whitening) and `care`'s GAE agree on every counted token; with
    /// verl's `masked_whiten` after both, they agree too.
    #[test]
    fn verl_gae_and_whitening(p in padded(), gamma in 0.0f64..=1.0, lam in 0.0f64..=1.0) {
        let o = GaeOptions { gamma, lambda: lam, ..GaeOptions::default() };
        let n = p.mask.len();
        let (mut a, mut r) = (vec![0.0f32; n], vec![0.0f32; n]);
        gae(&p.cols[2], &p.cols[3], &p.offsets(), Some(&p.mask), &o, &mut a, &mut r).unwrap();
        let (pa, pr) = peers::verl_gae(&p.rows(2), &p.rows(3), &p.mask_rows(), gamma, lam);
        for i in 0..p.b {
            for j in 0..p.t {
                if p.mask[i * p.t + j] != 0 {
                    prop_assert!(close(f64::from(a[i * p.t + j]), pa[i][j], 1e-5));
                    prop_assert!(close(f64::from(r[i * p.t + j]), pr[i][j], 1e-5));
                }
            }
        }
        let counted = p.mask.iter().filter(|&&m| m != 0).count();
        prop_assume!(counted >= 2);
        let pw = peers::verl_masked_whiten(&pa, &p.mask_rows());
        whiten(&mut a, Some(&p.mask), &WhitenOptions::default()).unwrap();
        for i in 0..p.b {
            for j in 0..p.t {
                prop_assert!(close(f64::from(a[i * p.t + j]), pw[i][j], 1e-4), "{} vs {}", a[i * p.t + j], pw[i][j]);
            }
        }
    }

    /// New verl `reinforce_plus_plus`: discounted returns that skip masked tokens.
    #[test]
    fn verl_reinforce_pp_returns(p in padded(), gamma in 0.0f64..=1.0) {
        let o = GaeOptions { gamma, lambda: 1.0, ..GaeOptions::default() };
        let mut g = vec![0.0f32; p.mask.len()];
        discounted_returns(&p.cols[2], &p.offsets(), Some(&p.mask), &o, &mut g).unwrap();
        let want = peers::verl_reinforce_pp_returns(&p.rows(2), &p.mask_rows(), gamma);
        for i in 0..p.b {
            for j in 0..p.t {
                prop_assert!(close(f64::from(g[i * p.t + j]), want[i][j], 1e-5));
            }
        }
    }
}

/// The one `k1` difference, stated exactly: an asymmetric band `[l, u]` bounds the ratio
/// `rho = pi_old / pi_rollout` in `care` (the method's write-up) and `1 / rho` in verl's code.
#[test]
fn k1_asymmetric_bounds_apply_to_the_ratio() {
    // rho = e^0.5 = 1.65: inside [0.3, 1.7]; 1/rho = 0.61 is also inside; rho = e^-1 = 0.37 is
    // inside, 1/rho = 2.72 is not.
    let p = Padded {
        b: 1,
        t: 2,
        cols: [
            vec![-1.0, -2.0],
            vec![-1.5, -1.0],
            vec![0.0; 2],
            vec![0.0; 2],
        ],
        mask: vec![1, 1],
    };
    let mut o = RolloutOptions::default();
    o.set_bound(Rejection::TokenK1, 0.3, 1.7);
    let (_, _, keep) = run_rollout(&p, &o);
    assert_eq!(keep, [1, 1]);
    let opts = [RsOption {
        name: "token_k1",
        lower: 0.3,
        upper: 1.7,
    }];
    let verl = peers::verl_rs_mask(&p.rows(0), &p.rows(1), &p.mask_rows(), &opts);
    assert_eq!(verl, vec![vec![1.0, 0.0]]);
}

/// Ragged groups of outcome rewards from a small discrete set (ties and all-equal groups are
/// common), with response lengths.
#[derive(Debug, Clone)]
struct Groups {
    rewards: Vec<f32>,
    lengths: Vec<u32>,
    baselines: Vec<f32>,
    offsets: Vec<u32>,
}

impl Groups {
    fn index(&self) -> Vec<usize> {
        let mut idx = Vec::new();
        for (g, w) in self.offsets.windows(2).enumerate() {
            idx.extend(std::iter::repeat_n(g, (w[1] - w[0]) as usize));
        }
        idx
    }
    fn scores(&self) -> Vec<f64> {
        self.rewards.iter().map(|&r| f64::from(r)).collect()
    }
}

fn groups(min: usize) -> impl Strategy<Value = Groups> {
    prop::collection::vec(min..6, 1..6).prop_flat_map(|sizes| {
        let n: usize = sizes.iter().sum();
        let mut offsets = vec![0u32];
        for s in &sizes {
            offsets.push(offsets.last().copied().unwrap() + *s as u32);
        }
        (
            prop::collection::vec((0u8..5).prop_map(|x| f32::from(x) * 0.25), n),
            prop::collection::vec(1u32..40, n),
            prop::collection::vec(-1.0f32..1.0, n),
            Just(offsets),
        )
            .prop_map(|(rewards, lengths, baselines, offsets)| Groups {
                rewards,
                lengths,
                baselines,
                offsets,
            })
    })
}

fn care_adv(g: &Groups, o: &AdvantageOptions) -> Result<Vec<f64>, care_core::Error> {
    let inputs = GroupInputs {
        lengths: Some(&g.lengths),
        baselines: Some(&g.baselines),
        ..GroupInputs::new(&g.rewards, None, GroupLayout::Offsets(&g.offsets))
    };
    let mut out = vec![0.0f64; g.rewards.len()];
    group_advantages_with(&inputs, o, &mut out, None)?;
    Ok(out)
}

fn all_close(got: &[f64], want: &[f64], rel: f64) -> Result<(), TestCaseError> {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        prop_assert!(close(*a, *b, rel), "[{}] {} vs {}", i, a, b);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// verl `grpo_passk` (with and without the std): the `grpo_passk` preset, and `PassK`
    /// without a scale; verl raises on a singleton, the preset's singleton policy `error` too.
    #[test]
    fn verl_grpo_passk(g in groups(1), norm: bool) {
        let o = AdvantageOptions {
            scale: if norm { Scale::GroupStd } else { Scale::None },
            ..AdvantageOptions::preset(Preset::GrpoPassK)
        };
        match peers::verl_grpo_passk(&g.scores(), &g.index(), 1e-6, norm) {
            Some(want) => all_close(&care_adv(&g, &o).unwrap(), &want, 1e-12)?,
            None => prop_assert_eq!(care_adv(&g, &o), Err(care_core::Error::SingletonGroup)),
        }
    }

    /// verl `grpo` (with and without `norm_adv_by_std_in_grpo`), `rloo` and `rloo_vectorized`:
    /// the `verl` preset, `dr_grpo` with singleton `raw`, `rloo` with singleton `raw` and `rloo`.
    #[test]
    fn verl_grpo_and_rloo(g in groups(1)) {
        let (s, idx) = (g.scores(), g.index());
        all_close(&care_adv(&g, &AdvantageOptions::preset(Preset::Verl)).unwrap(), &peers::verl_grpo(&s, &idx, 1e-6, true), 1e-12)?;
        let raw = |p: Preset| AdvantageOptions { singleton: care_core::grpo::SingletonPolicy::Raw, ..AdvantageOptions::preset(p) };
        all_close(&care_adv(&g, &raw(Preset::DrGrpo)).unwrap(), &peers::verl_grpo(&s, &idx, 1e-6, false), 1e-12)?;
        all_close(&care_adv(&g, &raw(Preset::Rloo)).unwrap(), &peers::verl_rloo(&s, &idx, false), 1e-12)?;
        all_close(&care_adv(&g, &AdvantageOptions::preset(Preset::Rloo)).unwrap(), &peers::verl_rloo(&s, &idx, true), 1e-12)?;
    }

    /// verl `opo`: the `opo` preset with the response lengths.
    #[test]
    fn verl_opo(g in groups(1)) {
        let lengths: Vec<f64> = g.lengths.iter().map(|&l| f64::from(l)).collect();
        let want = peers::verl_opo(&g.scores(), &lengths, &g.index());
        all_close(&care_adv(&g, &AdvantageOptions::preset(Preset::Opo)).unwrap(), &want, 1e-12)?;
    }

    /// verl `remax` with the reward on the last response token: the `remax` preset,
    /// broadcast to the response tokens.
    #[test]
    fn verl_remax(g in groups(1)) {
        let a = care_adv(&g, &AdvantageOptions::preset(Preset::Remax)).unwrap();
        let t = 4;
        let (mut rows, mut mask) = (Vec::new(), Vec::new());
        for (i, &r) in g.rewards.iter().enumerate() {
            let len = 1 + i % t;
            let mut row = vec![0.0; t];
            row[len - 1] = f64::from(r);
            rows.push(row);
            mask.push((0..t).map(|j| f64::from(u8::from(j < len))).collect::<Vec<f64>>());
        }
        let b: Vec<f64> = g.baselines.iter().map(|&x| f64::from(x)).collect();
        let want = peers::verl_remax(&rows, &b, &mask);
        for (i, row) in want.iter().enumerate() {
            for (j, &w) in row.iter().enumerate() {
                let got = if mask[i][j] > 0.0 { a[i] } else { 0.0 };
                prop_assert!(close(got, w, 1e-12), "[{}][{}] {} vs {}", i, j, got, w);
            }
        }
    }

    /// verl `reinforce_plus_plus_baseline`: the `reinforce_pp_baseline` preset in `f64`,
    /// broadcast to the tokens, then `whiten` over the batch's tokens with verl's
    /// `masked_mean` (`count_eps = 1e-8`): equal to 1e-6 everywhere, equal rewards included.
    #[test]
    fn verl_reinforce_pp_baseline(g in groups(1), t in 1usize..5) {
        let a = care_adv(&g, &AdvantageOptions::preset(Preset::ReinforcePpBaseline)).unwrap();
        let n = g.rewards.len();
        let mask: Vec<u8> = (0..n * t).map(|k| u8::from(k % t <= (k / t) % t)).collect();
        prop_assume!(mask.iter().filter(|&&m| m != 0).count() >= 2);
        let offs: Vec<u32> = (0..=n).map(|i| (i * t) as u32).collect();
        let mut tok = vec![0.0f64; n * t];
        broadcast_to_tokens(&a, &offs, Some(&mask), &mut tok).unwrap();
        whiten(&mut tok, Some(&mask), &VERL_WHITEN).unwrap();
        let mrows: Rows = mask.chunks(t).map(|r| r.iter().map(|&m| f64::from(m)).collect()).collect();
        let want = peers::verl_reinforce_pp_baseline(&g.scores(), &g.index(), &mrows);
        for (i, row) in want.iter().enumerate() {
            for (j, &w) in row.iter().enumerate() {
                prop_assert!(close(tok[i * t + j], w, 1e-6), "[{}][{}] {} vs {}", i, j, tok[i * t + j], w);
            }
        }
    }

    /// GPG as its paper and reference code define it (uniform groups): the `gpg` preset.
    #[test]
    fn gpg_reference_code(n_groups in 1usize..6, size in 2usize..6, seed in prop::collection::vec(0u8..5, 30)) {
        let r: Vec<f32> = (0..n_groups * size).map(|i| f32::from(seed[i % 30]) * 0.25).collect();
        let g = Groups {
            lengths: vec![1; r.len()],
            baselines: vec![0.0; r.len()],
            offsets: (0..=n_groups).map(|k| (k * size) as u32).collect(),
            rewards: r,
        };
        let want = peers::gpg_reference(&g.scores(), size);
        // The reference adds 1e-5 to the share of groups it divides by.
        all_close(&care_adv(&g, &AdvantageOptions::preset(Preset::Gpg)).unwrap(), &want, 1e-4)?;
    }
}

/// verl's `gpg` scales by `B / count_nonzero(rewards)`, not GPG's `N / (N - M)`: they differ
/// whenever some rewards are 0 or some groups have no signal. Stated exactly on one case.
#[test]
fn verl_gpg_alpha_differs_from_the_paper() {
    // Groups [1, 0] and [1, 1]: verl alpha = 4 / 3, GPG alpha = 4 / 2.
    let g = Groups {
        rewards: vec![1.0, 0.0, 1.0, 1.0],
        lengths: vec![1; 4],
        baselines: vec![0.0; 4],
        offsets: vec![0, 2, 4],
    };
    let verl = peers::verl_gpg(&g.scores(), &g.index());
    assert_eq!(verl, [0.5 * 4.0 / 3.0, -0.5 * 4.0 / 3.0, 0.0, 0.0]);
    let care = care_adv(&g, &AdvantageOptions::preset(Preset::Gpg)).unwrap();
    assert_eq!(care, [1.0, -1.0, 0.0, 0.0]);
}

// ---------------------------------------------------------------------------------------------
// Policy losses and presets

/// A padded batch for the losses (log ratios well inside every clamp), with one advantage per
/// sequence (`f32`-exact) and a rollout column.
#[derive(Debug, Clone)]
struct LossCase {
    b: usize,
    t: usize,
    logp: Vec<f64>,
    old: Vec<f64>,
    rf: Vec<f64>,
    rollout: Vec<f64>,
    adv: Vec<f32>,
    adv_tok: Vec<f32>,
    mask: Vec<u8>,
}

fn loss_case() -> impl Strategy<Value = LossCase> {
    (1usize..5, 1usize..7).prop_flat_map(|(b, t)| {
        let n = b * t;
        (
            prop::collection::vec(-3.0f64..-0.05, n),
            prop::collection::vec(-0.5f64..0.5, n),
            prop::collection::vec(-0.5f64..0.5, n),
            prop::collection::vec(-0.3f64..0.3, n),
            prop::collection::vec(-2.0f32..2.0, b),
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(1usize..=t, b),
            prop::collection::vec(prop_oneof![6 => Just(1u8), 1 => Just(0u8)], n),
        )
            .prop_map(
                move |(logp, d_old, d_ref, d_roll, adv, adv_tok, lens, holes)| {
                    let mut mask = vec![0u8; n];
                    for (i, &len) in lens.iter().enumerate() {
                        for j in 0..len {
                            mask[i * t + j] = holes[i * t + j];
                        }
                    }
                    LossCase {
                        b,
                        t,
                        old: logp.iter().zip(&d_old).map(|(l, d)| l - d).collect(),
                        rf: logp.iter().zip(&d_ref).map(|(l, d)| l + d).collect(),
                        rollout: logp
                            .iter()
                            .zip(&d_old)
                            .zip(&d_roll)
                            .map(|((l, d), r)| l - d - r)
                            .collect(),
                        logp,
                        adv,
                        adv_tok,
                        mask,
                    }
                },
            )
    })
}

impl LossCase {
    fn rows(&self, v: &[f64]) -> Rows {
        v.chunks(self.t).map(<[f64]>::to_vec).collect()
    }
    fn batch(&self, per_token: bool) -> peers::LossBatch {
        let adv: Vec<f64> = if per_token {
            self.adv_tok.iter().map(|&a| f64::from(a)).collect()
        } else {
            (0..self.b * self.t)
                .map(|k| f64::from(self.adv[k / self.t]))
                .collect()
        };
        peers::LossBatch {
            logp: self.rows(&self.logp),
            old: self.rows(&self.old),
            rf: self.rows(&self.rf),
            adv: self.rows(&adv),
            mask: self
                .mask
                .chunks(self.t)
                .map(|r| r.iter().map(|&m| f64::from(m)).collect())
                .collect(),
        }
    }
    fn tokens(&self) -> usize {
        self.mask.iter().filter(|&&m| m != 0).count()
    }
    fn care(
        &self,
        o: &LossOptions,
        per_token: bool,
        rollout: bool,
        reference: bool,
    ) -> (f64, Vec<f32>) {
        let offsets: Vec<u32> = (0..=self.b).map(|i| (i * self.t) as u32).collect();
        let inputs = LossInputs {
            logp: &self.logp[..],
            logp_old: Some(&self.old[..]),
            logp_ref: reference.then_some(&self.rf[..]),
            seq_offsets: &offsets,
            mask: Some(&self.mask),
            advantages: if per_token {
                Advantages::PerToken(&self.adv_tok)
            } else {
                Advantages::PerSequence(&self.adv)
            },
            logp_rollout: rollout.then_some(&self.rollout[..]),
        };
        let mut g = vec![0.0f32; self.logp.len()];
        let out = policy_loss(&inputs, o, &mut g).unwrap();
        (out.loss, g)
    }
    /// `care` without `logp_old`, with `logp_rollout` (verl's bypass mode and its on-policy
    /// counterpart).
    fn care_no_old(&self, o: &LossOptions, per_token: bool) -> (f64, Vec<f32>) {
        let offsets: Vec<u32> = (0..=self.b).map(|i| (i * self.t) as u32).collect();
        let inputs = LossInputs {
            logp: &self.logp[..],
            logp_old: None,
            logp_ref: None,
            seq_offsets: &offsets,
            mask: Some(&self.mask),
            advantages: if per_token {
                Advantages::PerToken(&self.adv_tok)
            } else {
                Advantages::PerSequence(&self.adv)
            },
            logp_rollout: Some(&self.rollout[..]),
        };
        let mut g = vec![0.0f32; self.logp.len()];
        let out = policy_loss(&inputs, o, &mut g).unwrap();
        (out.loss, g)
    }
}

/// A peer's loss as a function of the batch (for finite differences).
type PeerLoss = Box<dyn Fn(&peers::LossBatch) -> f64>;

fn same_loss(care: f64, peer: f64) -> Result<(), TestCaseError> {
    prop_assert!(close(care, peer, 1e-7), "care {} vs peer {}", care, peer);
    Ok(())
}

const VERL_MODES: [(&str, LossPreset); 4] = [
    ("token-mean", LossPreset::Verl),
    ("seq-mean-token-mean", LossPreset::VerlSeqMeanTokenMean),
    ("seq-mean-token-sum", LossPreset::VerlSeqMeanTokenSum),
    (
        "seq-mean-token-sum-norm",
        LossPreset::VerlSeqMeanTokenSumNorm,
    ),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// verl `vanilla` under each `loss_agg_mode`: the `verl*` presets; verl's KL loss
    /// (`use_kl_loss`, each estimator) is `--beta`; since 2026 verl's
    /// `seq-mean-token-sum-norm` is our `seq_mean_token_sum_norm` with the verl preset.
    #[test]
    fn verl_vanilla_presets(c in loss_case(), mode in 0usize..4, per_token: bool, kl in 0usize..4, beta in prop_oneof![Just(0.0), Just(0.05)]) {
        prop_assume!(c.tokens() > 0);
        let (name, preset) = VERL_MODES[mode];
        let kinds = ["k1", "abs", "k2", "k3"];
        let o = LossOptions { beta, kl_estimator: KlEstimator::ALL[kl], ..LossOptions::preset(preset) };
        let bt = c.batch(per_token);
        let kl_rows = Rows::from_iter(bt.logp.iter().zip(&bt.rf).map(|(l, r)| {
            l.iter().zip(r).map(|(&l, &r)| peers::verl_kl(l, r, kinds[kl])).collect::<Vec<f64>>()
        }));
        let peer = peers::verl_vanilla(&bt, (0.2, 0.2), 3.0, name, None)
            + beta * peers::verl_agg_loss(&kl_rows, &bt.mask, name, peers::VerlVersion::Old);
        same_loss(c.care(&o, per_token, false, true).0, peer)?;
        // verl's `token-sum` (2026-08): the plain sum on one rank.
        let sum = LossOptions { aggregation: Aggregation::TokenSum, ..LossOptions::preset(LossPreset::Verl) };
        same_loss(c.care(&sum, per_token, false, false).0, peers::verl_vanilla(&bt, (0.2, 0.2), 3.0, "token-sum", None))?;
        if name == "seq-mean-token-sum-norm" {
            let new = LossOptions { aggregation: Aggregation::SeqMeanTokenSumNorm, ..LossOptions::preset(LossPreset::Verl) };
            let p = peers::verl_agg_loss(&Rows::from_iter(bt.logp.iter().map(|r| vec![0.0; r.len()])), &bt.mask, name, peers::VerlVersion::New);
            prop_assert_eq!(p, 0.0);
            let vanilla_new = {
                let ratio: Rows = bt.logp.iter().zip(&bt.old).map(|(l, o)| l.iter().zip(o).map(|(l, o)| (l - o).exp()).collect()).collect();
                let pg: Rows = ratio.iter().zip(&bt.adv).map(|(r, a)| r.iter().zip(a).map(|(&rho, &a)| {
                    let l1 = (-a * rho).max(-a * rho.clamp(0.8, 1.2));
                    if a < 0.0 { (-a * 3.0).min(l1) } else { l1 }
                }).collect()).collect();
                peers::verl_agg_loss(&pg, &bt.mask, name, peers::VerlVersion::New)
            };
            same_loss(c.care(&new, per_token, false, false).0, vanilla_new)?;
        }
    }

    /// verl `gspo` (the GSPO-token value), `sapo`, `cispo`, `gpg`, `kl_cov`, `clip_cov` (all
    /// candidates selected) and `geo_mean`: their presets.
    #[test]
    fn verl_loss_family_presets(c in loss_case(), per_token: bool) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(per_token);
        let run = |p: LossPreset| c.care(&LossOptions::preset(p), per_token, false, false).0;
        same_loss(run(LossPreset::VerlGspo), peers::verl_gspo(&bt, (0.2, 0.2), None))?;
        same_loss(run(LossPreset::VerlSapo), peers::verl_sapo(&bt, (1.0, 1.05)))?;
        same_loss(run(LossPreset::VerlCispo), peers::verl_cispo(&bt, (0.2, 0.2), "token-mean"))?;
        same_loss(run(LossPreset::VerlGpg), peers::verl_gpg_loss(&bt, "token-mean"))?;
        // verl's `ppo_kl_coef` default (PolicyLossConfig, actor.yaml) is 0.1: the preset's.
        let kl_cov = LossOptions { cov_ratio: 0.3, ..LossOptions::preset(LossPreset::VerlKlCov) };
        same_loss(c.care(&kl_cov, per_token, false, false).0, peers::verl_kl_cov(&bt, 0.3, 0.1, "token-mean"))?;
        let clip_cov = LossOptions { cov_ratio: 1.0, clip_cov_lb: -0.2, clip_cov_ub: 0.3, ..LossOptions::preset(LossPreset::VerlClipCov) };
        same_loss(c.care(&clip_cov, per_token, false, false).0, peers::verl_clip_cov_all(&bt, (0.2, 0.2), -0.2, 0.3, "token-mean"))?;
        same_loss(run(LossPreset::VerlGeoMean), peers::verl_geo_mean(&bt, (0.2, 0.2), None))?;
    }

    /// verl's rollout correction inside the loss: `rollout_is` token or sequence weights on
    /// the policy term and `rollout_rs` (`token_k2`, `seq_mean_k1`) on the mask, for `vanilla`,
    /// `gspo` and `geo_mean`.
    #[test]
    fn verl_rollout_correction_in_the_loss(c in loss_case(), seq: bool, rs: bool) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(false);
        let roll = c.rows(&c.rollout);
        let w = peers::verl_is_weights(&bt.old, &roll, &bt.mask, seq, 1.5);
        let mut r = RolloutOptions { is_level: if seq { IsLevel::Sequence } else { IsLevel::Token }, is_threshold: 1.5, ..RolloutOptions::default() };
        let mut rb = bt.clone();
        if rs {
            r.reject[Rejection::TokenK2 as usize] = RejectBound { lower: 0.0, upper: 0.02 };
            r.reject[Rejection::SeqMeanK1 as usize] = RejectBound::ratio(1.15);
            let opts = [
                RsOption { name: "token_k2", lower: 0.0, upper: 0.02 },
                RsOption { name: "seq_mean_k1", lower: 1.0 / 1.15, upper: 1.15 },
            ];
            rb.mask = peers::verl_rs_mask(&bt.old, &roll, &bt.mask, &opts);
        }
        prop_assume!(rb.mask.iter().flatten().any(|&m| m > 0.0));
        for (preset, peer) in [
            (LossPreset::Verl, peers::verl_vanilla(&rb, (0.2, 0.2), 3.0, "token-mean", Some(&w))),
            (LossPreset::VerlGspo, peers::verl_gspo(&rb, (0.2, 0.2), Some(&w))),
        ] {
            let o = LossOptions { rollout: r, ..LossOptions::preset(preset) };
            same_loss(c.care(&o, false, true, false).0, peer)?;
        }
        // geo_mean takes the geometric mean of the token weights over the kept tokens.
        let o = LossOptions { rollout: r, ..LossOptions::preset(LossPreset::VerlGeoMean) };
        let peer = peers::verl_geo_mean(&rb, (0.2, 0.2), Some(&w));
        prop_assert!(close(c.care(&o, false, true, false).0, peer, 1e-6), "{}", peer);
    }

    /// TRL `grpo`, `bnpo`, `dr_grpo`, `dapo`, `cispo` (epsilon_high 5), `sapo`, the k3 `beta`
    /// term and sequence-level importance sampling: the `trl_*` presets.
    #[test]
    fn trl_presets(c in loss_case(), beta in prop_oneof![Just(0.0), Just(0.04)], sequence: bool) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(false);
        let max_len = c.t as f64 + 3.0;
        for (ty, preset) in [
            ("grpo", LossPreset::TrlGrpo),
            ("bnpo", LossPreset::TrlBnpo),
            ("dr_grpo", LossPreset::TrlDrGrpo),
            ("dapo", LossPreset::TrlDapo),
            ("cispo", LossPreset::TrlCispo),
            ("sapo", LossPreset::TrlSapo),
            ("luspo", LossPreset::TrlLuspo),
            ("vespo", LossPreset::TrlVespo),
        ] {
            let seq_ok = !matches!(ty, "cispo" | "sapo" | "vespo");
            // luspo requires the sequence level (TRL raises otherwise); with a KL term TRL's
            // (B, 1) loss broadcasts against the (B, T) KL before the length weighting, a shape
            // quirk outside the mapping, so luspo runs without it.
            let sequence = (sequence && seq_ok) || ty == "luspo";
            let beta = if ty == "luspo" { 0.0 } else { beta };
            let o = LossOptions {
                beta,
                horizon: max_len,
                ratio_level: if sequence { RatioLevel::Sequence } else { RatioLevel::Token },
                ..LossOptions::preset(preset)
            };
            let eps = if ty == "cispo" { (0.2, 5.0) } else { (0.2, 0.2) };
            let peer = peers::trl_loss(&bt, ty, sequence, eps, beta, max_len, None);
            same_loss(c.care(&o, false, false, true).0, peer)?;
        }
    }

    /// TRL's vLLM importance sampling (`token_truncate`, `token_mask`, `sequence_truncate`,
    /// `sequence_mask`, `clip_max = 3`): the rollout correction with the zero-weight mode.
    #[test]
    fn trl_vllm_importance_sampling(c in loss_case(), mode in 0usize..4) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(false);
        let roll = c.rows(&c.rollout);
        let name = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"][mode];
        let w = peers::trl_vllm_is(&bt.old, &roll, &bt.mask, name, 1.2);
        let mut r = RolloutOptions {
            is_level: if name.starts_with("sequence") { IsLevel::Sequence } else { IsLevel::Token },
            is_threshold: if name.ends_with("truncate") { 1.2 } else { f64::INFINITY },
            log_ratio_clamp: f64::INFINITY,
            rejection_mode: RejectionMode::ZeroWeight,
            ..RolloutOptions::default()
        };
        if name.ends_with("mask") {
            let k = if name.starts_with("sequence") { Rejection::SeqSumK1 } else { Rejection::TokenK1 };
            r.set_bound(k, 0.0, 1.2);
        }
        let o = LossOptions { rollout: r, ..LossOptions::preset(LossPreset::TrlDapo) };
        let peer = peers::trl_loss(&bt, "dapo", false, (0.2, 0.2), 0.0, 1.0, Some(&w));
        same_loss(c.care(&o, false, true, false).0, peer)?;
    }

    /// TRL `vespo` under its vLLM importance sampling (`token_truncate`, `token_mask`): the
    /// ratios fold into the Gamma weight's sequence ratio, as TRL's `get_gamma_weights` does.
    #[test]
    fn trl_vespo_with_vllm_importance_sampling(c in loss_case(), mask_mode: bool) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(false);
        let roll = c.rows(&c.rollout);
        let name = if mask_mode { "token_mask" } else { "token_truncate" };
        let w = peers::trl_vllm_is(&bt.old, &roll, &bt.mask, name, 1.2);
        let mut r = RolloutOptions {
            is_level: IsLevel::Token,
            is_threshold: if mask_mode { f64::INFINITY } else { 1.2 },
            log_ratio_clamp: f64::INFINITY,
            rejection_mode: RejectionMode::ZeroWeight,
            ..RolloutOptions::default()
        };
        if mask_mode {
            r.set_bound(Rejection::TokenK1, 0.0, 1.2);
        }
        let o = LossOptions { rollout: r, ..LossOptions::preset(LossPreset::TrlVespo) };
        let peer = peers::trl_loss(&bt, "vespo", false, (0.2, 0.2), 0.0, 1.0, Some(&w));
        same_loss(c.care(&o, false, true, false).0, peer)?;
    }

    /// OpenRLHF `PolicyLoss`: `ppo` token-level and per-sample, with and without `dual_clip`,
    /// `gspo`, and the vLLM corrections `tis`, `icepop`, `seq-mask-tis`.
    #[test]
    fn openrlhf_presets(c in loss_case(), per_token: bool, dual: bool, vllm in 0usize..4) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(per_token);
        let roll = c.rows(&c.rollout);
        let dual_clip = dual.then_some(3.0);
        for (preset, kind, token_level) in [
            (LossPreset::OpenRlhf, "ppo", true),
            (LossPreset::OpenRlhfSeq, "ppo", false),
            (LossPreset::OpenRlhfGspo, "gspo", false),
        ] {
            let mut o = LossOptions { dual_clip: dual_clip.unwrap_or(0.0), ..LossOptions::preset(preset) };
            let mut with_rollout = false;
            let mut v = None;
            if kind == "ppo" && vllm > 0 {
                let (ty, low, high) = [("tis", 0.8, 1.3), ("icepop", 0.8, 1.3), ("seq-mask-tis", 0.9, 1.1)][vllm - 1];
                v = Some((&roll, ty, low, high));
                with_rollout = true;
                let mut r = RolloutOptions { log_ratio_clamp: f64::INFINITY, is_level: IsLevel::Token, ..RolloutOptions::default() };
                match ty {
                    "tis" => { r.is_threshold = high; r.is_threshold_low = low; }
                    "icepop" => {
                        r.is_threshold = f64::INFINITY;
                        r.rejection_mode = RejectionMode::ZeroWeight;
                        r.set_bound(Rejection::TokenK1, low, high);
                    }
                    _ => {
                        r.is_threshold = f64::INFINITY;
                        r.rejection_mode = RejectionMode::ZeroWeight;
                        r.set_bound(Rejection::SeqMeanK1, low, high);
                    }
                }
                o.rollout = r;
            }
            let peer = peers::orlhf_policy_loss(&bt, kind, (0.2, 0.2), dual_clip, token_level, v);
            same_loss(c.care(&o, per_token, with_rollout, false).0, peer)?;
        }
        // OpenRLHF gspo under its vLLM correction takes the sequence ratio against the rollout
        // log-probs (no weight): `openrlhf_gspo` in bypass mode.
        if vllm > 0 {
            let v = Some((&roll, "tis", 0.8, 1.3));
            let peer = peers::orlhf_policy_loss(&bt, "gspo", (0.2, 0.2), dual_clip, false, v);
            let o = LossOptions {
                dual_clip: dual_clip.unwrap_or(0.0),
                bypass: Bypass::On,
                ..LossOptions::preset(LossPreset::OpenRlhfGspo)
            };
            same_loss(c.care_no_old(&o, per_token).0, peer)?;
        }
    }

    /// Gradients: care's analytic gradient against a central finite difference of the peer's
    /// own loss (verl vanilla under each mode, TRL grpo / dr_grpo / dapo, OpenRLHF ppo and
    /// gspo), where the peer has no stop-gradient.
    #[test]
    fn gradients_match_the_peers_finite_differences(c in loss_case(), which in 0usize..9) {
        prop_assume!(c.tokens() > 0);
        let max_len = c.t as f64 + 2.0;
        let (o, peer): (LossOptions, PeerLoss) = match which {
            0..=3 => (LossOptions::preset(VERL_MODES[which].1), Box::new(move |b| peers::verl_vanilla(b, (0.2, 0.2), 3.0, VERL_MODES[which].0, None))),
            4 => (LossOptions::preset(LossPreset::TrlGrpo), Box::new(|b| peers::trl_loss(b, "grpo", false, (0.2, 0.2), 0.0, 1.0, None))),
            5 => (LossOptions { horizon: max_len, ..LossOptions::preset(LossPreset::TrlDrGrpo) }, Box::new(move |b| peers::trl_loss(b, "dr_grpo", false, (0.2, 0.2), 0.0, max_len, None))),
            6 => (LossOptions::preset(LossPreset::TrlDapo), Box::new(|b| peers::trl_loss(b, "dapo", false, (0.2, 0.2), 0.0, 1.0, None))),
            7 => (LossOptions::preset(LossPreset::OpenRlhf), Box::new(|b| peers::orlhf_policy_loss(b, "ppo", (0.2, 0.2), None, true, None))),
            _ => (LossOptions::preset(LossPreset::OpenRlhfGspo), Box::new(|b| peers::orlhf_policy_loss(b, "gspo", (0.2, 0.2), None, false, None))),
        };
        let (_, g) = c.care(&o, false, false, false);
        let bt = c.batch(false);
        let h = 1e-6;
        for (k, &gk) in g.iter().enumerate() {
            let (i, t) = (k / c.t, k % c.t);
            let mut up = bt.clone();
            up.logp[i][t] += h;
            let mut dn = bt.clone();
            dn.logp[i][t] -= h;
            let (fu, f0, fd) = (peer(&up), peer(&bt), peer(&dn));
            let (fwd, bwd, central) = ((fu - f0) / h, (f0 - fd) / h, (fu - fd) / (2.0 * h));
            let scale = 1.0 + central.abs();
            if (fwd - bwd).abs() > 1e-4 * scale {
                continue; // a clip kink within h
            }
            prop_assert!((f64::from(gk) - central).abs() <= 2e-5 * scale, "token {}: care {} vs peer {}", k, gk, central);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The six classes where `care` and verl's own code differed (verl-project/verl@1dda039, and
// volcengine/verl@b178a3c for REINFORCE++): each verl-named preset or switch reproduces verl,
// and `care`'s own default keeps its choice. One exact case per class, then random cases.

/// Class 1, bypass mode, `loss_type = ppo_clip`: the ratio is `pi / pi_rollout` and no
/// importance weight is applied (`verl_bypass`); without the switch, `care` reads a line without
/// `logp_old` as on-policy (ratio 1) with the rollout weights applied.
#[test]
fn class1_bypass_ppo_clip() {
    let c = LossCase {
        b: 1,
        t: 1,
        logp: vec![-1.0],
        old: vec![f64::NAN],
        rf: vec![0.0],
        rollout: vec![-1.5],
        adv: vec![1.0],
        adv_tok: vec![1.0],
        mask: vec![1],
    };
    let bt = c.batch(false);
    let roll = c.rows(&c.rollout);
    for is in [None, Some((false, 2.0))] {
        let verl = peers::verl_bypass(&bt, &roll, "ppo_clip", is, &[], "token-mean");
        assert!((verl - -1.2).abs() < 1e-12, "{verl}");
        let mut o = LossOptions::preset(LossPreset::VerlBypass);
        if is.is_some() {
            o.rollout.is_level = IsLevel::Token;
            o.rollout.is_threshold = 2.0;
        }
        let (loss, g) = c.care_no_old(&o, false);
        assert!((loss - verl).abs() < 1e-12, "{loss}");
        assert_eq!(g, [0.0]); // the clip binds (ratio e^0.5 > 1.2)
        // care's own reading (no switch): on-policy, ratio 1, weight e^0.5 applied.
        let own = LossOptions {
            bypass: Bypass::Off,
            ..o
        };
        let (loss, g) = c.care_no_old(&own, false);
        let w = if is.is_some() { 0.5f64.exp() } else { 1.0 };
        assert!((loss - -w).abs() < 1e-7, "{loss}");
        assert!((f64::from(g[0]) - -w).abs() < 1e-6);
    }
    // Bypass reads the old log-probs from the rollout: both, or neither, is an error.
    let offsets = [0u32, 1];
    let mut g = [0.0f32];
    let o = LossOptions::preset(LossPreset::VerlBypass);
    for (old, roll) in [(Some(&[-1.0f64][..]), Some(&[-1.5f64][..])), (None, None)] {
        let inputs = LossInputs {
            logp: &[-1.0f64][..],
            logp_old: old,
            logp_ref: None,
            seq_offsets: &offsets,
            mask: None,
            advantages: Advantages::PerSequence(&[1.0]),
            logp_rollout: roll,
        };
        assert_eq!(
            policy_loss(&inputs, &o, &mut g).unwrap_err(),
            care_core::Error::InvalidArgument
        );
    }
}

/// Class 1, `loss_type = reinforce`: `-A * w * logp` with the weights detached, which is the
/// `verl_gpg` preset without `logp_old` (the same gradient as the clip preset on-policy, a
/// different loss value: `-A * w` there).
#[test]
fn class1_bypass_reinforce() {
    let c = LossCase {
        b: 1,
        t: 1,
        logp: vec![-1.0],
        old: vec![f64::NAN],
        rf: vec![0.0],
        rollout: vec![-1.5],
        adv: vec![1.0],
        adv_tok: vec![1.0],
        mask: vec![1],
    };
    let (bt, roll) = (c.batch(false), c.rows(&c.rollout));
    let verl = peers::verl_bypass(
        &bt,
        &roll,
        "reinforce",
        Some((false, 2.0)),
        &[],
        "token-mean",
    );
    let w = 0.5f64.exp();
    assert!((verl - w).abs() < 1e-12, "{verl}"); // -A * w * logp = w
    let mut o = LossOptions::preset(LossPreset::VerlGpg);
    o.rollout.is_level = IsLevel::Token;
    let (loss, g) = c.care_no_old(&o, false);
    assert!((loss - verl).abs() < 1e-12);
    assert!((f64::from(g[0]) - -w).abs() < 1e-6);
    let (loss_clip, g_clip) = c.care_no_old(
        &LossOptions {
            rollout: o.rollout,
            ..LossOptions::preset(LossPreset::Verl)
        },
        false,
    );
    assert!((loss_clip - -w).abs() < 1e-7);
    assert_eq!(g_clip, g);
}

/// Class 2, REINFORCE++ with an interior masked token: verl since 2026-08-09 (1dda039) skips
/// it, as `care` does by default; verl before (b178a3c) restarted the return there, which
/// `MaskedToken::Reset` reproduces. Whitened with verl's `masked_whiten` in both.
#[test]
fn class2_reinforce_pp_masked_token() {
    let rewards = [0.0f32, 0.0, 1.0, 0.5];
    let (offsets, mask) = ([0u32, 3, 4], [1u8, 0, 1, 1]);
    let rows: Rows = vec![vec![0.0, 0.0, 1.0], vec![0.5, 0.0, 0.0]];
    let mrows: Rows = vec![vec![1.0, 0.0, 1.0], vec![1.0, 0.0, 0.0]];
    let pos = [(0, 0), (0, 1), (0, 2), (1, 0)];
    for (rule, want_ret) in [
        (MaskedToken::Skip, [1.0f32, 0.0, 1.0, 0.5]),
        (MaskedToken::Reset, [0.0, 0.0, 1.0, 0.5]),
    ] {
        let o = GaeOptions {
            gamma: 1.0,
            masked_token: rule,
            ..GaeOptions::default()
        };
        let mut ret = [0.0f32; 4];
        discounted_returns(&rewards, &offsets, Some(&mask), &o, &mut ret).unwrap();
        assert_eq!(ret, want_ret, "{rule}");
        let peer = match rule {
            MaskedToken::Skip => peers::verl_reinforce_pp_returns(&rows, &mrows, 1.0),
            MaskedToken::Reset => peers::verl_reinforce_pp_returns_reset(&rows, &mrows, 1.0),
        };
        for (k, &(i, j)) in pos.iter().enumerate() {
            if mask[k] != 0 {
                assert_eq!(f64::from(ret[k]), peer[i][j]);
            }
        }
        let (mut adv, mut r2) = ([0.0f32; 4], [0.0f32; 4]);
        discounted_returns_whitened(
            &rewards,
            &offsets,
            Some(&mask),
            &o,
            &VERL_WHITEN,
            &mut adv,
            &mut r2,
        )
        .unwrap();
        assert_eq!(r2, ret);
        let pw = peers::verl_masked_whiten(&peer, &mrows);
        for (k, &(i, j)) in pos.iter().enumerate() {
            assert!(
                close(f64::from(adv[k]), pw[i][j], 1e-6),
                "{rule} [{k}] {} vs {}",
                adv[k],
                pw[i][j]
            );
        }
    }
    // GAE has no reset rule in any verl version.
    let o = GaeOptions {
        masked_token: MaskedToken::Reset,
        ..GaeOptions::default()
    };
    let (mut a, mut r) = ([0.0f32; 4], [0.0f32; 4]);
    assert_eq!(
        gae(
            &rewards,
            &rewards,
            &offsets,
            Some(&mask),
            &o,
            &mut a,
            &mut r
        )
        .unwrap_err(),
        care_core::Error::InvalidArgument
    );
}

/// Class 3, KL-Cov's coefficient: verl's configuration default `ppo_kl_coef = 0.1` in the
/// `verl_kl_cov` preset; `care`'s default keeps the function's own fallback, 1.
#[test]
fn class3_kl_cov_coefficient() {
    assert_eq!(LossOptions::preset(LossPreset::VerlKlCov).kl_cov_coef, 0.1);
    assert_eq!(LossOptions::default().kl_cov_coef, 1.0);
    // One token: mean-centered covariance 0, k = 1 selects it: -A rho + coef |delta|.
    let c = LossCase {
        b: 1,
        t: 1,
        logp: vec![-1.0],
        old: vec![-1.5],
        rf: vec![0.0],
        rollout: vec![0.0],
        adv: vec![1.0],
        adv_tok: vec![1.0],
        mask: vec![1],
    };
    let verl = peers::verl_kl_cov(&c.batch(false), 2e-4, 0.1, "token-mean");
    let (loss, _) = c.care(
        &LossOptions::preset(LossPreset::VerlKlCov),
        false,
        false,
        false,
    );
    assert!((loss - verl).abs() < 1e-12, "{loss} vs {verl}");
    assert!((verl - (-(0.5f64.exp()) + 0.05)).abs() < 1e-12);
}

/// Class 4, GPG with a singleton group: verl's `gpg` keeps `alpha * r` for a lone sample and
/// takes `alpha = B / count_nonzero(r)` (the `verl_gpg` advantage preset); the paper's `gpg`
/// preset gives it 0 and `alpha = N / (N - M)`.
#[test]
fn class4_gpg_singleton_groups() {
    let g = Groups {
        rewards: vec![1.0, 0.0, 2.0],
        lengths: vec![1; 3],
        baselines: vec![0.0; 3],
        offsets: vec![0, 2, 3],
    };
    let verl = peers::verl_gpg(&g.scores(), &g.index());
    assert_eq!(verl, [0.75, -0.75, 3.0]);
    assert_eq!(
        care_adv(&g, &AdvantageOptions::preset(Preset::VerlGpg)).unwrap(),
        verl
    );
    assert_eq!(
        care_adv(&g, &AdvantageOptions::preset(Preset::Gpg)).unwrap(),
        [0.75, -0.75, 0.0]
    );
}

/// Class 5, GMPO with rollout weights near 0: verl takes `ln(w + 1e-10)` (the `verl_geo_mean`
/// preset's `gmpo_weight_floor`); `care`'s default takes the exact log, so a weight of 0 (a
/// zero-weight rejection, an IcePop weight) zeroes the sequence.
#[test]
fn class5_gmpo_weight_floor() {
    // Token weights e^-20 (a rollout log ratio of -30, clamped at 20 by both) and 1: verl's
    // sequence weight is exp((ln(e^-20 + 1e-10) + ln(1 + 1e-10)) / 2), the exact one e^-10.
    let c = LossCase {
        b: 1,
        t: 2,
        logp: vec![-1.0, -1.2],
        old: vec![-1.1, -1.1],
        rf: vec![0.0; 2],
        rollout: vec![-1.1 + 30.0, -1.1],
        adv: vec![1.0],
        adv_tok: vec![1.0; 2],
        mask: vec![1, 1],
    };
    let bt = c.batch(false);
    let roll = c.rows(&c.rollout);
    let w = peers::verl_is_weights(&bt.old, &roll, &bt.mask, false, f64::INFINITY);
    assert!(close(w[0][0], (-20.0f64).exp(), 1e-12) && w[0][1] == 1.0);
    let verl = peers::verl_geo_mean(&bt, (0.2, 0.2), Some(&w));
    let r = RolloutOptions {
        is_level: IsLevel::Token,
        is_threshold: f64::INFINITY,
        ..RolloutOptions::default()
    };
    let preset = LossOptions {
        rollout: r,
        ..LossOptions::preset(LossPreset::VerlGeoMean)
    };
    let (loss, _) = c.care(&preset, false, true, false);
    assert!(close(loss, verl, 1e-9), "{loss} vs {verl}");
    let exact = LossOptions {
        gmpo_weight_floor: 0.0,
        ..preset
    };
    let (loss0, _) = c.care(&exact, false, true, false);
    // d~ = [0.1, -0.1] (inside the clip): the ratio is 1.
    assert!(close(loss0, -(-10.0f64).exp(), 1e-9), "{loss0}");
    let floored = (((-20.0f64).exp() + 1e-10).ln() + (1.0f64 + 1e-10).ln()) / 2.0;
    assert!(close(verl, -floored.exp(), 1e-9));
    assert!((loss0 - verl).abs() > 0.02 * verl.abs()); // 2.4% apart
    // A zero weight (IcePop, a zero-weight rejection): the exact geometric mean is 0, verl's
    // exp(ln(1e-10) / 2) = 1e-5.
    let mut z = r;
    z.rejection_mode = RejectionMode::ZeroWeight;
    z.set_bound(Rejection::TokenK1, 0.5, 2.0);
    let (lz0, _) = c.care(
        &LossOptions {
            rollout: z,
            ..exact
        },
        false,
        true,
        false,
    );
    assert_eq!(lz0, 0.0);
    let (lz, _) = c.care(
        &LossOptions {
            rollout: z,
            ..preset
        },
        false,
        true,
        false,
    );
    let wz: Rows = vec![vec![0.0, 1.0]];
    assert!(
        close(lz, peers::verl_geo_mean(&bt, (0.2, 0.2), Some(&wz)), 1e-9),
        "{lz}"
    );
}

/// Class 6, whitening with `f32` storage: the returns are never rounded before whitening
/// (`discounted_returns_whitened`), so returns near 500 with a small spread match verl's `f64`
/// path to 1e-6; whitening the stored `f32` returns afterwards does not.
#[test]
fn class6_whitening_in_f64() {
    // One sequence of 40 tokens: reward 500 + tiny steps at the last token... a reward per
    // token so that the returns climb from 500 by about 0.01 a token.
    let t = 40;
    let rewards: Vec<f32> = (0..t)
        .map(|j| if j == t - 1 { 500.123_46 } else { 0.010_37 })
        .collect();
    let offsets = [0u32, t as u32];
    let o = GaeOptions::default();
    let (mut adv, mut ret) = (vec![0.0f32; t], vec![0.0f32; t]);
    discounted_returns_whitened(
        &rewards,
        &offsets,
        None,
        &o,
        &VERL_WHITEN,
        &mut adv,
        &mut ret,
    )
    .unwrap();
    let rows: Rows = vec![rewards.iter().map(|&r| f64::from(r)).collect()];
    let mrows: Rows = vec![vec![1.0; t]];
    let want = peers::verl_masked_whiten(
        &peers::verl_reinforce_pp_returns(&rows, &mrows, 1.0),
        &mrows,
    );
    let err = |a: &[f32]| {
        a.iter()
            .zip(&want[0])
            .map(|(&x, &w)| (f64::from(x) - w).abs() / (1.0 + w.abs()))
            .fold(0.0, f64::max)
    };
    assert!(err(&adv) <= 1e-6, "{}", err(&adv));
    let mut stored = ret.clone();
    whiten(&mut stored, None, &VERL_WHITEN).unwrap();
    assert!(err(&stored) > 1e-5, "{}", err(&stored)); // what rounding the returns first costs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Class 1 on random batches: verl bypass mode, both loss types, with and without token or
    /// sequence weights and rejection: `verl_bypass` (ppo_clip) and `verl_gpg` without
    /// `logp_old` (reinforce), loss to 1e-7 and the gradient against a finite difference of
    /// verl's loss with its weights held fixed (verl detaches them).
    #[test]
    fn verl_bypass_mode(c in loss_case(), reinforce: bool, is in 0usize..3, rs: bool, per_token: bool) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(per_token);
        let roll = c.rows(&c.rollout);
        let is_cfg = match is { 0 => None, 1 => Some((false, 1.5)), _ => Some((true, 1.5)) };
        let mut r = RolloutOptions::default();
        if let Some((seq, thr)) = is_cfg {
            r.is_level = if seq { IsLevel::Sequence } else { IsLevel::Token };
            r.is_threshold = thr;
        }
        let mut opts = Vec::new();
        if rs {
            r.reject[Rejection::TokenK2 as usize] = RejectBound { lower: 0.0, upper: 0.1 };
            opts.push(RsOption { name: "token_k2", lower: 0.0, upper: 0.1 });
        }
        let peer_mask = if rs { peers::verl_rs_mask(&bt.logp, &roll, &bt.mask, &opts) } else { bt.mask.clone() };
        prop_assume!(peer_mask.iter().flatten().any(|&m| m > 0.0));
        let (ty, preset) = if reinforce { ("reinforce", LossPreset::VerlGpg) } else { ("ppo_clip", LossPreset::VerlBypass) };
        let o = LossOptions { rollout: r, ..LossOptions::preset(preset) };
        let (loss, g) = c.care_no_old(&o, per_token);
        let peer = peers::verl_bypass(&bt, &roll, ty, is_cfg, &opts, "token-mean");
        same_loss(loss, peer)?;
        // The gradient with verl's weights and mask held at their values (no_grad in verl).
        let w = is_cfg.map(|(seq, thr)| peers::verl_is_weights(&bt.logp, &roll, &bt.mask, seq, thr));
        let fixed = |b: &peers::LossBatch| -> f64 {
            let eb = peers::LossBatch { old: roll.clone(), mask: peer_mask.clone(), ..b.clone() };
            if reinforce {
                let mut pg: Rows = eb.adv.iter().zip(&eb.logp).map(|(a, l)| a.iter().zip(l).map(|(a, l)| -a * l).collect()).collect();
                if let Some(w) = &w {
                    pg = pg.iter().zip(w).map(|(p, w)| p.iter().zip(w).map(|(p, w)| p * w).collect()).collect();
                }
                peers::verl_agg_loss(&pg, &eb.mask, "token-mean", peers::VerlVersion::New)
            } else {
                peers::verl_vanilla(&eb, (0.2, 0.2), 3.0, "token-mean", None)
            }
        };
        let h = 1e-6;
        for (k, &gk) in g.iter().enumerate() {
            let (i, t) = (k / c.t, k % c.t);
            let (mut up, mut dn) = (bt.clone(), bt.clone());
            up.logp[i][t] += h;
            dn.logp[i][t] -= h;
            let (fu, f0, fd) = (fixed(&up), fixed(&bt), fixed(&dn));
            let (fwd, bwd, central) = ((fu - f0) / h, (f0 - fd) / h, (fu - fd) / (2.0 * h));
            let scale = 1.0 + central.abs();
            if (fwd - bwd).abs() > 1e-4 * scale {
                continue; // a clip kink within h
            }
            prop_assert!((f64::from(gk) - central).abs() <= 2e-5 * scale, "token {}: care {} vs verl {}", k, gk, central);
        }
    }

    /// Class 2 on random batches: REINFORCE++ returns and their whitening, verl 1dda039
    /// (`skip`, the default) and b178a3c (`reset`), every output to 1e-6 with verl's
    /// `masked_whiten`.
    #[test]
    fn verl_reinforce_pp_both_versions(p in padded(), gamma in 0.0f64..=1.0, reset: bool) {
        prop_assume!(p.mask.iter().filter(|&&m| m != 0).count() >= 2);
        let rule = if reset { MaskedToken::Reset } else { MaskedToken::Skip };
        let o = GaeOptions { gamma, masked_token: rule, ..GaeOptions::default() };
        let n = p.mask.len();
        let (mut adv, mut ret) = (vec![0.0f32; n], vec![0.0f32; n]);
        discounted_returns_whitened(&p.cols[2], &p.offsets(), Some(&p.mask), &o, &VERL_WHITEN, &mut adv, &mut ret).unwrap();
        let (rows, mrows) = (p.rows(2), p.mask_rows());
        let peer = if reset {
            peers::verl_reinforce_pp_returns_reset(&rows, &mrows, gamma)
        } else {
            peers::verl_reinforce_pp_returns(&rows, &mrows, gamma)
        };
        let pw = peers::verl_masked_whiten(&peer, &mrows);
        for i in 0..p.b {
            for j in 0..p.t {
                let k = i * p.t + j;
                if p.mask[k] != 0 {
                    prop_assert!(close(f64::from(ret[k]), peer[i][j], 1e-6));
                }
                prop_assert!(close(f64::from(adv[k]), pw[i][j], 1e-6), "[{}][{}] {} vs {}", i, j, adv[k], pw[i][j]);
            }
        }
    }

    /// Class 2's neighbour: verl `gae` whitened (`gae_whitened`, verl's `masked_whiten`) to
    /// 1e-6 on every token.
    #[test]
    fn verl_gae_whitened(p in padded(), gamma in 0.0f64..=1.0, lam in 0.0f64..=1.0) {
        prop_assume!(p.mask.iter().filter(|&&m| m != 0).count() >= 2);
        let o = GaeOptions { gamma, lambda: lam, ..GaeOptions::default() };
        let n = p.mask.len();
        let (mut a, mut r) = (vec![0.0f32; n], vec![0.0f32; n]);
        gae_whitened(&p.cols[2], &p.cols[3], &p.offsets(), Some(&p.mask), &o, &VERL_WHITEN, &mut a, &mut r).unwrap();
        let (pa, _) = peers::verl_gae(&p.rows(2), &p.rows(3), &p.mask_rows(), gamma, lam);
        let pw = peers::verl_masked_whiten(&pa, &p.mask_rows());
        for i in 0..p.b {
            for j in 0..p.t {
                prop_assert!(close(f64::from(a[i * p.t + j]), pw[i][j], 1e-6), "{} vs {}", a[i * p.t + j], pw[i][j]);
            }
        }
    }

    /// Class 4 on random groups (singletons, zeros, ties): the `verl_gpg` preset is verl's
    /// `gpg` to 1e-12.
    #[test]
    fn verl_gpg_advantages(g in groups(1)) {
        let want = peers::verl_gpg(&g.scores(), &g.index());
        all_close(&care_adv(&g, &AdvantageOptions::preset(Preset::VerlGpg)).unwrap(), &want, 1e-12)?;
    }

    /// Class 5 on random batches: GMPO under verl's rollout weights, truncated (TIS) or
    /// IcePop (weights outside the band are 0: in `care` the zero-weight rejection of the
    /// `token_k1` band), against verl's `ln(w + 1e-10)`.
    #[test]
    fn verl_geo_mean_rollout_weights(c in loss_case(), icepop: bool, seq: bool) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(false);
        let roll = c.rows(&c.rollout);
        let (w, r) = if icepop {
            let w = peers::verl_icepop_weights(&bt.old, &roll, &bt.mask, seq, 0.9, 1.1);
            let mut r = RolloutOptions {
                is_level: if seq { IsLevel::Sequence } else { IsLevel::Token },
                is_threshold: f64::INFINITY,
                rejection_mode: RejectionMode::ZeroWeight,
                ..RolloutOptions::default()
            };
            r.set_bound(if seq { Rejection::SeqSumK1 } else { Rejection::TokenK1 }, 0.9, 1.1);
            (w, r)
        } else {
            let w = peers::verl_is_weights(&bt.old, &roll, &bt.mask, seq, 1.5);
            let r = RolloutOptions {
                is_level: if seq { IsLevel::Sequence } else { IsLevel::Token },
                is_threshold: 1.5,
                ..RolloutOptions::default()
            };
            (w, r)
        };
        let o = LossOptions { rollout: r, ..LossOptions::preset(LossPreset::VerlGeoMean) };
        same_loss(c.care(&o, false, true, false).0, peers::verl_geo_mean(&bt, (0.2, 0.2), Some(&w)))?;
    }

    /// verl's IcePop (`rollout_is_threshold = "lower_upper"`, new verl) in the vanilla loss:
    /// `care`'s importance weights untruncated, the `k1` band as a zero-weight rejection.
    #[test]
    fn verl_icepop_in_the_loss(c in loss_case(), seq: bool) {
        prop_assume!(c.tokens() > 0);
        let bt = c.batch(false);
        let roll = c.rows(&c.rollout);
        let w = peers::verl_icepop_weights(&bt.old, &roll, &bt.mask, seq, 0.8, 1.25);
        let mut r = RolloutOptions {
            is_level: if seq { IsLevel::Sequence } else { IsLevel::Token },
            is_threshold: f64::INFINITY,
            rejection_mode: RejectionMode::ZeroWeight,
            ..RolloutOptions::default()
        };
        r.set_bound(if seq { Rejection::SeqSumK1 } else { Rejection::TokenK1 }, 0.8, 1.25);
        let o = LossOptions { rollout: r, ..LossOptions::preset(LossPreset::Verl) };
        same_loss(c.care(&o, false, true, false).0, peers::verl_vanilla(&bt, (0.2, 0.2), 3.0, "token-mean", Some(&w)))?;
    }

    /// Class 6 on random returns far from 0 with a small spread (the case `f32` storage
    /// breaks): the fused estimator + whitening against verl's `f64` path to 1e-6.
    #[test]
    fn verl_whitening_of_large_returns(base in 100.0f32..1000.0, steps in prop::collection::vec(-0.05f32..0.05, 2..64), cut in 0usize..64) {
        let t = steps.len();
        let mut rewards = steps.clone();
        rewards[t - 1] += base;
        let cut = cut.min(t);
        let offsets = [0u32, cut as u32, t as u32];
        let o = GaeOptions::default();
        let (mut adv, mut ret) = (vec![0.0f32; t], vec![0.0f32; t]);
        discounted_returns_whitened(&rewards, &offsets, None, &o, &VERL_WHITEN, &mut adv, &mut ret).unwrap();
        let pad = |v: &[f64]| -> Rows { vec![{ let mut r = v[..cut].to_vec(); r.resize(t, 0.0); r }, { let mut r = v[cut..].to_vec(); r.resize(t, 0.0); r }] };
        let rf: Vec<f64> = rewards.iter().map(|&r| f64::from(r)).collect();
        let ones = vec![1.0; t];
        let mut m = pad(&ones);
        m[0][cut..].fill(0.0);
        m[1][t - cut..].fill(0.0);
        let want = peers::verl_masked_whiten(&peers::verl_reinforce_pp_returns(&pad(&rf), &m, 1.0), &m);
        for (k, &x) in adv.iter().enumerate() {
            let (i, j) = if k < cut { (0, k) } else { (1, k - cut) };
            prop_assert!(close(f64::from(x), want[i][j], 1e-6), "[{}] {} vs {}", k, x, want[i][j]);
        }
    }
}
