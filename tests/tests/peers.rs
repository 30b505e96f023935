//! The differential suite of the GRPO step: `care-core` against the peers' formulas as
//! transcribed, independently of `care-core`, in `care_tests::peers` (verl, TRL, OpenRLHF), on
//! random padded batches with ragged responses, interior masks and fully masked rows.
//!
//! Relation checked everywhere: on ordinary inputs (log ratios well inside every clamp), each
//! peer configuration and the `care` options documented as its mapping give the same numbers
//! to `f32` rounding; where a difference is documented, the test states it exactly.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use care_core::grpo::{
    AdvantageOptions, Advantages, Aggregation, GaeOptions, GroupInputs, GroupLayout, IsLevel,
    KlEstimator, LossInputs, LossOptions, LossPreset, Preset, RatioLevel, RejectBound, Rejection,
    RejectionMode, RolloutInputs, RolloutOptions, Scale, WhitenOptions, broadcast_to_tokens,
    discounted_returns, gae, group_advantages_with, policy_loss, rollout_correction, whiten,
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

    /// verl `reinforce_plus_plus_baseline`: the `reinforce_pp_baseline` preset, broadcast to
    /// the tokens, then `whiten` over the batch's tokens.
    #[test]
    fn verl_reinforce_pp_baseline(g in groups(1), t in 1usize..5) {
        let a = care_adv(&g, &AdvantageOptions::preset(Preset::ReinforcePpBaseline)).unwrap();
        let n = g.rewards.len();
        let mask: Vec<u8> = (0..n * t).map(|k| u8::from(k % t <= (k / t) % t)).collect();
        prop_assume!(mask.iter().filter(|&&m| m != 0).count() >= 2);
        let a32: Vec<f32> = a.iter().map(|&x| x as f32).collect();
        let offs: Vec<u32> = (0..=n).map(|i| (i * t) as u32).collect();
        let mut tok = vec![0.0f32; n * t];
        broadcast_to_tokens(&a32, &offs, Some(&mask), &mut tok).unwrap();
        // verl's masked_mean divides by `count + 1e-8`: equal token advantages whiten to about
        // 5e-5 there and to exactly 0 here (a peer quirk, see GRPO.md), so compare where the
        // variance is real.
        let (_, std) = whiten(&mut tok.clone(), Some(&mask), &WhitenOptions::default()).unwrap();
        prop_assume!(std > 1e-3);
        whiten(&mut tok, Some(&mask), &WhitenOptions::default()).unwrap();
        let mrows: Rows = mask.chunks(t).map(|r| r.iter().map(|&m| f64::from(m)).collect()).collect();
        let want = peers::verl_reinforce_pp_baseline(&g.scores(), &g.index(), &mrows);
        for (i, row) in want.iter().enumerate() {
            for (j, &w) in row.iter().enumerate() {
                prop_assert!(close(f64::from(tok[i * t + j]), w, 1e-5), "[{}][{}] {} vs {}", i, j, tok[i * t + j], w);
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
        let kl_cov = LossOptions { cov_ratio: 0.3, ..LossOptions::preset(LossPreset::VerlKlCov) };
        same_loss(c.care(&kl_cov, per_token, false, false).0, peers::verl_kl_cov(&bt, 0.3, 1.0, "token-mean"))?;
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
        ] {
            let seq_ok = !matches!(ty, "cispo" | "sapo");
            let sequence = sequence && seq_ok;
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
