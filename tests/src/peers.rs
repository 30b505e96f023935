//! The peers' GRPO formulas, written independently of `care-core`: each function transcribes
//! one function of verl, TRL or OpenRLHF (named in its docs, with the snapshot it was read at)
//! onto padded `[B][T]` rows of `f64`, keeping the peer's order of operations and its quirks
//! (an `eps` in a denominator, a mean over every row). The differential suite
//! (`tests/peers.rs`) runs them against `care-core` on random batches.
//!
//! Snapshots: verl `volcengine/verl@b178a3c` (`verl/trainer/ppo/core_algos.py`,
//! `rollout_corr_helper.py`) and `verl-project/verl@1dda039` where noted ("new verl"); TRL
//! `huggingface/trl@f2cd577` (`grpo_trainer.py::_compute_loss`); OpenRLHF
//! `OpenRLHF/OpenRLHF@3c3be62` (`openrlhf/models/loss.py`).

// Test oracle: an unknown option name is a bug in the calling test, so it panics; the
// transcriptions index rows and columns as the peers' tensor code does.
#![allow(clippy::panic, clippy::needless_range_loop)]

/// A padded batch: `rows[b][t]`, with a mask of the same shape (1.0 = response token).
pub type Rows = Vec<Vec<f64>>;

/// verl `SAFETY_BOUND`.
pub const SAFETY_BOUND: f64 = 20.0;

fn masked_sum(v: &[f64], m: &[f64]) -> f64 {
    v.iter().zip(m).map(|(a, b)| a * b).sum()
}

fn msum(m: &[f64]) -> f64 {
    m.iter().sum()
}

/// verl `masked_mean` over one row (`sum / (mask.sum() + 1e-8)`).
pub fn masked_mean_row(v: &[f64], m: &[f64]) -> f64 {
    masked_sum(v, m) / (msum(m) + 1e-8)
}

/// verl `masked_mean` over a whole batch.
pub fn masked_mean(v: &Rows, m: &Rows) -> f64 {
    let s: f64 = v.iter().zip(m).map(|(a, b)| masked_sum(a, b)).sum();
    let n: f64 = m.iter().map(|r| msum(r)).sum();
    s / (n + 1e-8)
}

fn clamp(x: f64, lo: f64, hi: f64) -> f64 {
    x.max(lo).min(hi)
}

/// verl `compute_rollout_correction_weights` with a `"lower_upper"` threshold (IcePop, new
/// verl): the token or sequence weight `exp(clamp(log ratio, +-20))`, masked, kept where it lies
/// in `[lower, upper]` and 0 elsewhere.
pub fn verl_icepop_weights(
    old: &Rows,
    rollout: &Rows,
    mask: &Rows,
    sequence: bool,
    lower: f64,
    upper: f64,
) -> Rows {
    let raw = verl_is_weights(old, rollout, mask, sequence, f64::INFINITY);
    map_rows(&raw, |w| if w >= lower && w <= upper { w } else { 0.0 })
}

/// verl `compute_rollout_correction_weights` (without batch normalization): token or
/// sequence importance weights, masked, truncated at `threshold`.
pub fn verl_is_weights(
    old: &Rows,
    rollout: &Rows,
    mask: &Rows,
    sequence: bool,
    threshold: f64,
) -> Rows {
    old.iter()
        .zip(rollout)
        .zip(mask)
        .map(|((o, r), m)| {
            let lr: Vec<f64> = o.iter().zip(r).map(|(a, b)| a - b).collect();
            let w: Vec<f64> = if sequence {
                let s = clamp(masked_sum(&lr, m), -SAFETY_BOUND, SAFETY_BOUND).exp();
                vec![s; lr.len()]
            } else {
                lr.iter()
                    .map(|x| clamp(*x, -SAFETY_BOUND, SAFETY_BOUND).exp())
                    .collect()
            };
            w.iter()
                .zip(m)
                .map(|(w, m)| (w * m).min(threshold))
                .collect()
        })
        .collect()
}

/// One verl `rollout_rs` option with its threshold spec, already parsed: `k1` options carry
/// `(lower, upper)` ratio bounds, the others an upper bound (`lower` unused).
#[derive(Clone, Copy, Debug)]
pub struct RsOption {
    /// verl's option name (`token_k1` ... `seq_max_k3`).
    pub name: &'static str,
    /// Lower ratio bound (`k1` only).
    pub lower: f64,
    /// Upper bound.
    pub upper: f64,
}

/// verl `compute_rollout_rejection_mask`: the response mask with every token or sequence that
/// fails an option set to 0 (options chain with AND). Transcribed with verl's sign: `token_k1
/// = -log_ratio`, kept when `log(lower) <= token_k1 <= log(upper)`.
pub fn verl_rs_mask(old: &Rows, rollout: &Rows, mask: &Rows, options: &[RsOption]) -> Rows {
    let mut out = mask.clone();
    for (bi, ((o, r), m)) in old.iter().zip(rollout).zip(mask).enumerate() {
        let lr: Vec<f64> = o
            .iter()
            .zip(r)
            .map(|(a, b)| clamp(a - b, -SAFETY_BOUND, SAFETY_BOUND))
            .collect();
        let k1: Vec<f64> = lr.iter().map(|x| -x).collect();
        let k2: Vec<f64> = lr.iter().map(|x| 0.5 * x * x).collect();
        let k3: Vec<f64> = lr.iter().map(|x| x.exp() - 1.0 - x).collect();
        let seq_max = |v: &[f64]| {
            let mx = v
                .iter()
                .zip(m)
                .filter(|(_, m)| **m > 0.0)
                .map(|(x, _)| *x)
                .fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY { 0.0 } else { mx }
        };
        for opt in options {
            let (lo, hi) = (opt.lower.ln(), opt.upper.ln());
            let k1_ok = |s: f64| s >= lo && s <= hi;
            let up_ok = |s: f64| s <= opt.upper;
            let keep: Vec<bool> = match opt.name {
                "token_k1" => k1.iter().map(|&s| k1_ok(s)).collect(),
                "token_k2" => k2.iter().map(|&s| up_ok(s)).collect(),
                "token_k3" => k3.iter().map(|&s| up_ok(s)).collect(),
                name => {
                    let stat = match name {
                        "seq_sum_k1" => masked_sum(&k1, m),
                        "seq_sum_k2" => masked_sum(&k2, m),
                        "seq_sum_k3" => masked_sum(&k3, m),
                        "seq_mean_k1" => masked_mean_row(&k1, m),
                        "seq_mean_k2" => masked_mean_row(&k2, m),
                        "seq_mean_k3" => masked_mean_row(&k3, m),
                        "seq_max_k2" => seq_max(&k2),
                        "seq_max_k3" => seq_max(&k3),
                        other => panic!("unknown option {other}"),
                    };
                    let ok = if name.ends_with("k1") {
                        k1_ok(stat)
                    } else {
                        up_ok(stat)
                    };
                    vec![ok; lr.len()]
                }
            };
            for (t, k) in keep.into_iter().enumerate() {
                if !k {
                    out[bi][t] = 0.0;
                }
            }
        }
    }
    out
}

/// verl `compute_offpolicy_metrics` (the entries `care` reports as sums): `kl`, `k3_kl`,
/// `log_ppl_diff`, `log_ppl_abs_diff`, `chi2_token`, `chi2_seq`. Means over every row.
pub fn verl_offpolicy_metrics(old: &Rows, rollout: &Rows, mask: &Rows) -> [f64; 6] {
    let diff = |a: &Rows, b: &Rows| -> Rows {
        a.iter()
            .zip(b)
            .map(|(x, y)| x.iter().zip(y).map(|(p, q)| p - q).collect())
            .collect()
    };
    let kl = masked_mean(&diff(rollout, old), mask);
    let lr = diff(old, rollout);
    let k3: Rows = lr
        .iter()
        .map(|r| r.iter().map(|x| x.exp() - x - 1.0).collect())
        .collect();
    let k3_kl = masked_mean(&k3, mask);
    let b = old.len() as f64;
    let mut log_ppl_diff = 0.0;
    let mut log_ppl_abs = 0.0;
    let mut chi2_seq = 0.0;
    for ((o, r), m) in old.iter().zip(rollout).zip(mask) {
        let d = masked_mean_row(r, m) - masked_mean_row(o, m);
        log_ppl_diff += d;
        log_ppl_abs += d.abs();
        let l: Vec<f64> = o.iter().zip(r).map(|(a, b)| a - b).collect();
        let s = clamp(masked_sum(&l, m), -SAFETY_BOUND, SAFETY_BOUND);
        chi2_seq += (2.0 * s).exp();
    }
    let rho2: Rows = lr
        .iter()
        .map(|r| {
            r.iter()
                .map(|x| {
                    let rho = clamp(*x, -SAFETY_BOUND, SAFETY_BOUND).exp();
                    rho * rho
                })
                .collect()
        })
        .collect();
    let chi2_token = masked_mean(&rho2, mask) - 1.0;
    [
        kl,
        k3_kl,
        log_ppl_diff / b,
        log_ppl_abs / b,
        chi2_token,
        chi2_seq / b - 1.0,
    ]
}

/// verl `compute_gae_advantage_return`, before its `masked_whiten`: `(advantages, returns)`.
/// Masked positions carry the running value (verl's quirk; they do not count anywhere).
pub fn verl_gae(rewards: &Rows, values: &Rows, mask: &Rows, gamma: f64, lam: f64) -> (Rows, Rows) {
    let mut adv = rewards.clone();
    let mut ret = rewards.clone();
    for b in 0..rewards.len() {
        let (mut nextvalues, mut lastgaelam) = (0.0, 0.0);
        for t in (0..rewards[b].len()).rev() {
            let delta = rewards[b][t] + gamma * nextvalues - values[b][t];
            let lastgaelam_ = delta + gamma * lam * lastgaelam;
            let m = mask[b][t];
            nextvalues = values[b][t] * m + (1.0 - m) * nextvalues;
            lastgaelam = lastgaelam_ * m + (1.0 - m) * lastgaelam;
            adv[b][t] = lastgaelam;
            ret[b][t] = lastgaelam + values[b][t];
        }
    }
    (adv, ret)
}

/// verl `compute_reinforce_plus_plus_outcome_advantage` before whitening, up to
/// `verl-project/verl@8a1bf6d` (2026-08-09, verl #7300; `volcengine/verl@b178a3c` has it):
/// `running_return *= response_mask[t]` after each step, so the return restarts at 0 before a
/// masked token, whose own reward is dropped. The returns at masked positions are what verl
/// stores there (never counted).
pub fn verl_reinforce_pp_returns_reset(rewards: &Rows, mask: &Rows, gamma: f64) -> Rows {
    let mut ret = rewards.clone();
    for b in 0..rewards.len() {
        let mut running = 0.0;
        for t in (0..rewards[b].len()).rev() {
            running = rewards[b][t] + gamma * running;
            ret[b][t] = running;
            running *= mask[b][t];
        }
    }
    ret
}

/// New verl `compute_reinforce_plus_plus_outcome_advantage` before whitening: the returns
/// (masked tokens skipped and set to 0).
pub fn verl_reinforce_pp_returns(rewards: &Rows, mask: &Rows, gamma: f64) -> Rows {
    let mut ret = rewards.clone();
    for b in 0..rewards.len() {
        let mut running = 0.0;
        for t in (0..rewards[b].len()).rev() {
            let m = mask[b][t];
            let new = rewards[b][t] + gamma * running;
            ret[b][t] = new * m;
            running = new * m + running * (1.0 - m);
        }
    }
    ret
}

/// verl `masked_whiten` (unbiased `masked_var`, `rsqrt(var + 1e-8)`), then `* mask`.
pub fn verl_masked_whiten(v: &Rows, mask: &Rows) -> Rows {
    let mean = masked_mean(v, mask);
    let centered: Rows = v
        .iter()
        .map(|r| r.iter().map(|x| (x - mean) * (x - mean)).collect())
        .collect();
    let n: f64 = mask.iter().map(|r| msum(r)).sum();
    let var = masked_mean(&centered, mask) * n / (n - 1.0);
    v.iter()
        .zip(mask)
        .map(|(r, m)| {
            r.iter()
                .zip(m)
                .map(|(x, m)| (x - mean) / (var + 1e-8).sqrt() * m)
                .collect()
        })
        .collect()
}

fn groups_of(index: &[usize]) -> Vec<Vec<usize>> {
    let mut ids: Vec<usize> = index.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids.iter()
        .map(|&g| (0..index.len()).filter(|&i| index[i] == g).collect())
        .collect()
}

fn torch_std(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt()
}

/// verl `compute_grpo_outcome_advantage`: `(r - mean_g) / (std_g + eps)` (`torch.std`, Bessel)
/// with `norm`, `r - mean_g` without; a singleton's mean is 0 and its std 1.
pub fn verl_grpo(scores: &[f64], index: &[usize], eps: f64, norm: bool) -> Vec<f64> {
    let mut adv = scores.to_vec();
    for g in groups_of(index) {
        let xs: Vec<f64> = g.iter().map(|&i| scores[i]).collect();
        let (mean, std) = if g.len() == 1 {
            (0.0, 1.0)
        } else {
            (xs.iter().sum::<f64>() / xs.len() as f64, torch_std(&xs))
        };
        for &i in &g {
            adv[i] = if norm {
                (scores[i] - mean) / (std + eps)
            } else {
                scores[i] - mean
            };
        }
    }
    adv
}

/// verl `compute_rloo_outcome_advantage`: `r * n / (n - 1) - mean * n / (n - 1)` per group; a
/// singleton keeps its reward. `vectorized`: `compute_rloo_vectorized_outcome_advantage`, 0 for
/// a singleton.
pub fn verl_rloo(scores: &[f64], index: &[usize], vectorized: bool) -> Vec<f64> {
    let mut adv = scores.to_vec();
    for g in groups_of(index) {
        let n = g.len() as f64;
        let mean = g.iter().map(|&i| scores[i]).sum::<f64>() / n;
        for &i in &g {
            adv[i] = if g.len() > 1 {
                scores[i] * n / (n - 1.0) - mean * n / (n - 1.0)
            } else if vectorized {
                0.0
            } else {
                scores[i]
            };
        }
    }
    adv
}

/// verl `compute_grpo_passk_outcome_advantage`: only the group's best sample (`torch.topk`'s
/// first) gets `r_max - r_second`, divided by `std + eps` when `norm`. `None` where verl raises
/// (a group with fewer than two samples).
pub fn verl_grpo_passk(scores: &[f64], index: &[usize], eps: f64, norm: bool) -> Option<Vec<f64>> {
    let mut adv = vec![0.0; scores.len()];
    for g in groups_of(index) {
        if g.len() < 2 {
            return None;
        }
        let mut order = g.clone();
        // torch.topk on ties: the first index (sorted stable by value, descending).
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let (i_max, r_max, r_2) = (order[0], scores[order[0]], scores[order[1]]);
        let mut a = r_max - r_2;
        if norm {
            let xs: Vec<f64> = g.iter().map(|&i| scores[i]).collect();
            a /= torch_std(&xs) + eps;
        }
        adv[i_max] = a;
    }
    Some(adv)
}

/// verl `compute_opo_outcome_advantage`: `r - sum(len * r) / sum(len)` per group; a singleton
/// has baseline 0.
pub fn verl_opo(scores: &[f64], lengths: &[f64], index: &[usize]) -> Vec<f64> {
    let mut adv = scores.to_vec();
    for g in groups_of(index) {
        let b = if g.len() == 1 {
            0.0
        } else {
            let lr: f64 = g.iter().map(|&i| lengths[i] * scores[i]).sum();
            let l: f64 = g.iter().map(|&i| lengths[i]).sum();
            lr / l
        };
        for &i in &g {
            adv[i] = scores[i] - b;
        }
    }
    adv
}

/// verl `compute_remax_outcome_advantage` on token rewards: the reward-to-go minus the
/// sample's baseline on every response token.
pub fn verl_remax(rewards: &Rows, baselines: &[f64], mask: &Rows) -> Rows {
    rewards
        .iter()
        .zip(mask)
        .zip(baselines)
        .map(|((r, m), b)| {
            let mut out = vec![0.0; r.len()];
            let mut acc = 0.0;
            for t in (0..r.len()).rev() {
                acc += r[t] * m[t];
                out[t] = acc - b * m[t];
            }
            out
        })
        .collect()
}

/// verl `compute_reinforce_plus_plus_baseline_outcome_advantage`: `r - mean_g` (a singleton's
/// mean is 0), tiled over the response, whitened over the batch's tokens, times the mask.
pub fn verl_reinforce_pp_baseline(scores: &[f64], index: &[usize], mask: &Rows) -> Rows {
    let mut s = scores.to_vec();
    for g in groups_of(index) {
        let mean = if g.len() == 1 {
            0.0
        } else {
            g.iter().map(|&i| scores[i]).sum::<f64>() / g.len() as f64
        };
        for &i in &g {
            s[i] = scores[i] - mean;
        }
    }
    let tiled: Rows = mask
        .iter()
        .zip(&s)
        .map(|(m, a)| m.iter().map(|x| a * x).collect())
        .collect();
    verl_masked_whiten(&tiled, mask)
}

/// verl `compute_gpg_outcome_advantage`: `alpha * (r - mean_g)` with `alpha = B /
/// count_nonzero(scores)` (a singleton's mean is 0; `f_norm = 1`).
pub fn verl_gpg(scores: &[f64], index: &[usize]) -> Vec<f64> {
    let nonzero = scores.iter().filter(|&&x| x != 0.0).count().max(1);
    let alpha = scores.len() as f64 / nonzero as f64;
    let mut adv = scores.to_vec();
    for g in groups_of(index) {
        let mean = if g.len() == 1 {
            0.0
        } else {
            g.iter().map(|&i| scores[i]).sum::<f64>() / g.len() as f64
        };
        for &i in &g {
            adv[i] = alpha * (scores[i] - mean);
        }
    }
    adv
}

/// GPG's reference code (`AMAP-ML/GPG`, `open_r1/trainer/grpo_trainer.py`, `adjust_gd`):
/// `r - mean_g` per group of `g` samples, and the loss divided by `inverse_alpha` = the share
/// of groups whose reward std exceeds `1e-5`; the loss is linear in the advantage, so this
/// returns the advantage times `1 / (inverse_alpha + 1e-5)`.
pub fn gpg_reference(scores: &[f64], g: usize) -> Vec<f64> {
    let groups: Vec<&[f64]> = scores.chunks(g).collect();
    let valid = groups.iter().filter(|xs| torch_std(xs) > 1e-5).count();
    let inverse_alpha = (valid as f64 / groups.len() as f64).min(1.0);
    let scale = 1.0 / (inverse_alpha + 1e-5);
    groups
        .iter()
        .flat_map(|xs| {
            let m = xs.iter().sum::<f64>() / xs.len() as f64;
            xs.iter().map(move |x| (x - m) * scale)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Policy losses

/// A padded micro-batch for the policy losses: log-probs `[B][T]`, per-token advantages (a
/// per-sequence advantage is a constant row), the response mask.
#[derive(Clone, Debug)]
pub struct LossBatch {
    /// Current log-probs.
    pub logp: Rows,
    /// Old (proximal) log-probs.
    pub old: Rows,
    /// Reference log-probs.
    pub rf: Rows,
    /// Advantages per token.
    pub adv: Rows,
    /// Response mask (1.0 / 0.0).
    pub mask: Rows,
}

fn zip_rows(a: &Rows, b: &Rows, f: impl Fn(f64, f64) -> f64) -> Rows {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.iter().zip(y).map(|(p, q)| f(*p, *q)).collect())
        .collect()
}

fn map_rows(a: &Rows, f: impl Fn(f64) -> f64) -> Rows {
    a.iter()
        .map(|r| r.iter().map(|x| f(*x)).collect())
        .collect()
}

/// Which version of verl's `agg_loss`: `volcengine/verl@b178a3c` divides
/// `seq-mean-token-sum-norm` by the horizon only; `verl-project/verl@1dda039` takes the
/// sequence mean first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerlVersion {
    /// b178a3c (until early 2026).
    Old,
    /// 1dda039 (2026-08).
    New,
}

/// verl `agg_loss` (one rank, no global batch info; `loss_scale_factor` = the padded length).
pub fn verl_agg_loss(loss: &Rows, mask: &Rows, mode: &str, version: VerlVersion) -> f64 {
    let seq_sums: Vec<f64> = loss
        .iter()
        .zip(mask)
        .map(|(l, m)| masked_sum(l, m))
        .collect();
    let counts: Vec<f64> = mask.iter().map(|m| msum(m)).collect();
    let non_empty = counts.iter().filter(|&&c| c > 0.0).count() as f64;
    let horizon = mask.first().map_or(0, Vec::len) as f64;
    match mode {
        "token-mean" => seq_sums.iter().sum::<f64>() / counts.iter().sum::<f64>(),
        "seq-mean-token-sum" => {
            let s: f64 = seq_sums
                .iter()
                .zip(&counts)
                .filter(|(_, c)| **c > 0.0)
                .map(|(s, _)| s)
                .sum();
            s / non_empty
        }
        "seq-mean-token-mean" => {
            let s: f64 = seq_sums
                .iter()
                .zip(&counts)
                .filter(|(_, c)| **c > 0.0)
                .map(|(s, c)| s / (c + 1e-8))
                .sum();
            s / non_empty
        }
        "token-sum" => seq_sums.iter().sum::<f64>(),
        "seq-mean-token-sum-norm" => match version {
            VerlVersion::Old => seq_sums.iter().sum::<f64>() / horizon,
            VerlVersion::New => {
                let s: f64 = seq_sums
                    .iter()
                    .zip(&counts)
                    .filter(|(_, c)| **c > 0.0)
                    .map(|(s, _)| s)
                    .sum();
                s / non_empty / horizon
            }
        },
        other => panic!("unknown loss_agg_mode {other}"),
    }
}

fn clamp20(x: f64) -> f64 {
    clamp(x, -20.0, 20.0)
}

/// verl `compute_policy_loss_vanilla` (dual clip `c` always on), times `is` if given, then
/// `agg_loss`.
pub fn verl_vanilla(b: &LossBatch, eps: (f64, f64), c: f64, mode: &str, is: Option<&Rows>) -> f64 {
    let ratio = zip_rows(&b.logp, &b.old, |l, o| clamp20(l - o).exp());
    let mut pg: Rows = ratio
        .iter()
        .zip(&b.adv)
        .map(|(r, a)| {
            r.iter()
                .zip(a)
                .map(|(&rho, &a)| {
                    let p1 = -a * rho;
                    let p2 = -a * clamp(rho, 1.0 - eps.0, 1.0 + eps.1);
                    let l1 = p1.max(p2);
                    if a < 0.0 { (-a * c).min(l1) } else { l1 }
                })
                .collect()
        })
        .collect();
    if let Some(w) = is {
        pg = zip_rows(&pg, w, |l, w| l * w);
    }
    verl_agg_loss(&pg, &b.mask, mode, VerlVersion::Old)
}

/// verl `compute_policy_loss_bypass_mode` (new verl): `old_log_prob` is the rollout
/// log-probs. Under `no_grad` it computes the importance weights (`is`: sequence level or not,
/// and the threshold) and the rejection mask (`rs`) of the current `log_prob` against them;
/// `ppo_clip` then runs `compute_policy_loss_vanilla` with the rollout log-probs as the old
/// ones and **no** weights, `reinforce` runs `compute_policy_loss_reinforce`: `-A * logp * w`
/// (the weights detached; without `is`, `-A * logp`). Both aggregate over the rejection mask.
pub fn verl_bypass(
    b: &LossBatch,
    rollout: &Rows,
    loss_type: &str,
    is: Option<(bool, f64)>,
    rs: &[RsOption],
    mode: &str,
) -> f64 {
    let w = is.map(|(seq, c)| verl_is_weights(&b.logp, rollout, &b.mask, seq, c));
    let mask = if rs.is_empty() {
        b.mask.clone()
    } else {
        verl_rs_mask(&b.logp, rollout, &b.mask, rs)
    };
    let eb = LossBatch {
        old: rollout.clone(),
        mask,
        ..b.clone()
    };
    match loss_type {
        "ppo_clip" => verl_vanilla(&eb, (0.2, 0.2), 3.0, mode, None),
        "reinforce" => {
            let mut pg = zip_rows(&eb.adv, &eb.logp, |a, l| -a * l);
            if let Some(w) = &w {
                pg = zip_rows(&pg, w, |l, w| l * w);
            }
            verl_agg_loss(&pg, &eb.mask, mode, VerlVersion::New)
        }
        other => panic!("unknown loss_type {other}"),
    }
}

/// verl `kl_penalty_forward` (`kl`/`k1`, `abs`, `mse`/`k2`, `low_var_kl`/`k3`).
pub fn verl_kl(logp: f64, rf: f64, kind: &str) -> f64 {
    match kind {
        "k1" => logp - rf,
        "abs" => (logp - rf).abs(),
        "k2" => 0.5 * (logp - rf) * (logp - rf),
        "k3" => {
            let kl = clamp20(rf - logp);
            clamp(kl.exp() - kl - 1.0, -10.0, 10.0)
        }
        other => panic!("unknown kl {other}"),
    }
}

/// verl `compute_policy_loss_gspo` (the GSPO-token value; `seq-mean-token-mean` forced).
pub fn verl_gspo(b: &LossBatch, eps: (f64, f64), is: Option<&Rows>) -> f64 {
    let mut pg = Rows::new();
    for i in 0..b.logp.len() {
        let m = &b.mask[i];
        let d: Vec<f64> = b.logp[i]
            .iter()
            .zip(&b.old[i])
            .map(|(l, o)| l - o)
            .collect();
        let mean = masked_sum(&d, m) / msum(m).max(1.0);
        let s = mean.min(10.0).exp();
        pg.push(
            b.adv[i]
                .iter()
                .map(|&a| (-a * s).max(-a * clamp(s, 1.0 - eps.0, 1.0 + eps.1)))
                .collect(),
        );
    }
    if let Some(w) = is {
        pg = zip_rows(&pg, w, |l, w| l * w);
    }
    verl_agg_loss(&pg, &b.mask, "seq-mean-token-mean", VerlVersion::Old)
}

/// verl `compute_policy_loss_sapo` (`seq-mean-token-mean` forced).
pub fn verl_sapo(b: &LossBatch, tau: (f64, f64)) -> f64 {
    let ratio = zip_rows(&b.logp, &b.old, |l, o| clamp20(l - o).exp());
    let pg = zip_rows(&ratio, &b.adv, |r, a| {
        let t = if a > 0.0 { tau.0 } else { tau.1 };
        let gate = 1.0 / (1.0 + (-(t * (r - 1.0))).exp()) * (4.0 / t);
        -gate * a
    });
    verl_agg_loss(&pg, &b.mask, "seq-mean-token-mean", VerlVersion::Old)
}

/// verl `compute_policy_loss_gpg`.
pub fn verl_gpg_loss(b: &LossBatch, mode: &str) -> f64 {
    let pg = zip_rows(&b.logp, &b.adv, |l, a| -l * a);
    verl_agg_loss(&pg, &b.mask, mode, VerlVersion::Old)
}

/// verl `compute_policy_loss_cispo`.
pub fn verl_cispo(b: &LossBatch, eps: (f64, f64), mode: &str) -> f64 {
    let ratio = zip_rows(&b.logp, &b.old, |l, o| clamp20(l - o).exp());
    let w = map_rows(&ratio, |r| clamp(r, 1.0 - eps.0, 1.0 + eps.1));
    let wa = zip_rows(&w, &b.adv, |w, a| -w * a);
    let pg = zip_rows(&wa, &b.logp, |x, l| x * l);
    verl_agg_loss(&pg, &b.mask, mode, VerlVersion::Old)
}

/// verl `compute_policy_loss_kl_cov`: the `k = max(1, int(N * ratio))` valid tokens of
/// largest covariance get `+ coef * |log ratio|` (no clip at all).
pub fn verl_kl_cov(b: &LossBatch, ratio_k: f64, coef: f64, mode: &str) -> f64 {
    let mut valid = Vec::new();
    for i in 0..b.logp.len() {
        for t in 0..b.logp[i].len() {
            if b.mask[i][t] > 0.0 {
                valid.push((i, t));
            }
        }
    }
    let n = valid.len() as f64;
    let mean_a = valid.iter().map(|&(i, t)| b.adv[i][t]).sum::<f64>() / n;
    let mean_l = valid.iter().map(|&(i, t)| b.logp[i][t]).sum::<f64>() / n;
    let mut cov: Vec<(f64, (usize, usize))> = valid
        .iter()
        .map(|&(i, t)| ((b.adv[i][t] - mean_a) * (b.logp[i][t] - mean_l), (i, t)))
        .collect();
    // torch.topk compares with `>`, so -0.0 and +0.0 tie; a stable sort keeps ties in index
    // order (what care documents; torch's order among ties is unspecified).
    cov.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(core::cmp::Ordering::Equal));
    let k = ((n * ratio_k) as usize).max(1);
    let mut pg = zip_rows(&b.logp, &b.old, |l, o| (l - o).exp());
    pg = zip_rows(&pg, &b.adv, |r, a| -a * r);
    for &(_, (i, t)) in cov.iter().take(k) {
        pg[i][t] += coef * (b.logp[i][t] - b.old[i][t]).abs();
    }
    verl_agg_loss(&pg, &b.mask, mode, VerlVersion::Old)
}

/// verl `compute_policy_loss_clip_cov` with `clip_num >=` the number of candidates (so its
/// random choice takes them all): the candidates' terms are multiplied by 0.
pub fn verl_clip_cov_all(b: &LossBatch, eps: (f64, f64), lb: f64, ub: f64, mode: &str) -> f64 {
    let mean = |v: &Rows| masked_mean(v, &b.mask);
    let (mean_a, mean_l) = (mean(&b.adv), mean(&b.logp));
    let ratio = zip_rows(&b.logp, &b.old, |l, o| (l - o).exp());
    let mut pg = Rows::new();
    for i in 0..b.logp.len() {
        let mut row = Vec::new();
        for t in 0..b.logp[i].len() {
            let (a, r) = (b.adv[i][t], ratio[i][t]);
            let p1 = -a * r;
            let p2 = -a * clamp(r, 1.0 - eps.0, 1.0 + eps.1);
            let clip_by_origin = p2 > p1 && b.mask[i][t] > 0.0;
            let cov = (a - mean_a) * (b.logp[i][t] - mean_l);
            let cand = !clip_by_origin && cov < ub && cov > lb && b.mask[i][t] > 0.0;
            row.push(if cand { 0.0 } else { p1.max(p2) });
        }
        pg.push(row);
    }
    verl_agg_loss(&pg, &b.mask, mode, VerlVersion::Old)
}

/// verl `compute_policy_loss_geo_mean` (GMPO): `torch.mean` over every row of
/// `-mean_t(A) * exp(mean_t d~)`, with the sequence IS weight the geometric mean of `is`.
pub fn verl_geo_mean(b: &LossBatch, eps: (f64, f64), is: Option<&Rows>) -> f64 {
    let mut total = 0.0;
    for i in 0..b.logp.len() {
        let m = &b.mask[i];
        let n = msum(m);
        let mut sd = 0.0;
        for t in 0..m.len() {
            let d = b.logp[i][t] - b.old[i][t];
            let sgn = b.adv[i][t].signum() * f64::from(u8::from(b.adv[i][t] != 0.0));
            let dc = clamp(d, -eps.0, eps.1);
            let dmin = sgn * (sgn * d).min(sgn * dc);
            sd += dmin * m[t];
        }
        let ratio = (sd / (n + 1e-8)).exp();
        let a = masked_sum(&b.adv[i], m) / (n + 1e-8);
        let mut l = -a * ratio;
        if let Some(w) = is {
            let lw: f64 = w[i].iter().zip(m).map(|(w, m)| (w + 1e-10).ln() * m).sum();
            l *= (lw / (n + 1e-8)).exp();
        }
        total += l;
    }
    total / b.logp.len() as f64
}

/// TRL `GRPOTrainer.get_gamma_weights` (VESPO, default `k`/`lambda`): the detached Gamma
/// weight of one row from its summed clamped log ratio and, with the vLLM ratio `is`, the sum
/// of its clamped logs over the row (TRL's ratio is 1 at masked positions).
pub fn trl_vespo_weight(lr: &[f64], m: &[f64], a: f64, is: Option<&[f64]>) -> f64 {
    let lower = 1e-8f64.ln();
    let mut s: f64 = lr.iter().zip(m).map(|(x, m)| clamp20(*x) * m).sum();
    if let Some(w) = is {
        s += w.iter().map(|w| clamp(w.ln(), lower, 20.0)).sum::<f64>();
    }
    let log_w = clamp(s, lower, 20.0);
    let (k, lam) = if a >= 0.0 {
        (2.0, 3.0f64)
    } else {
        (3.0, 2.0f64)
    };
    let lam = lam.max(1e-4);
    let phi = (lam + k * log_w - lam * log_w.exp()).exp();
    if phi.is_finite() { phi } else { 0.0 }
}

/// TRL `GRPOTrainer._compute_loss` on one process without gradient accumulation: `loss_type`
/// is `grpo`, `bnpo`, `dr_grpo`, `dapo`, `cispo`, `sapo`, `luspo` (needs `sequence`) or
/// `vespo`; `sequence` is `importance_sampling_level="sequence"`; `beta` the k3 term (no
/// clamps); `is` the vLLM importance-sampling ratio it multiplies the policy term by (VESPO
/// folds it into its weight instead). Advantages are per sequence (column 0 of `adv`).
#[allow(clippy::too_many_arguments)]
pub fn trl_loss(
    b: &LossBatch,
    loss_type: &str,
    sequence: bool,
    eps: (f64, f64),
    beta: f64,
    max_completion_length: f64,
    is: Option<&Rows>,
) -> f64 {
    let rows = b.logp.len();
    let mut per_token: Rows = Vec::new();
    for i in 0..rows {
        let m = &b.mask[i];
        let a = b.adv[i][0];
        let lr: Vec<f64> = b.logp[i]
            .iter()
            .zip(&b.old[i])
            .map(|(l, o)| l - o)
            .collect();
        let seq_lw = masked_sum(&lr, m) / msum(m).max(1.0);
        let mut row = Vec::new();
        for t in 0..m.len() {
            let coef_1 = if sequence { seq_lw.exp() } else { lr[t].exp() };
            let mut l = match loss_type {
                "cispo" => -coef_1.min(eps.1) * a * b.logp[i][t],
                "vespo" => {
                    let phi = trl_vespo_weight(&lr, m, a, is.map(|w| &w[i][..]));
                    -phi * a * b.logp[i][t]
                }
                "sapo" => {
                    let temp = if a > 0.0 { 1.0 } else { 1.05 };
                    -(1.0 / (1.0 + (-(temp * (coef_1 - 1.0))).exp())) * 4.0 / temp * a
                }
                _ => {
                    let coef_2 = clamp(coef_1, 1.0 - eps.0, 1.0 + eps.1);
                    -(coef_1 * a).min(coef_2 * a)
                }
            };
            if let (Some(w), false) = (is, loss_type == "vespo") {
                l *= w[i][t];
            }
            if beta != 0.0 {
                let x = b.rf[i][t] - b.logp[i][t];
                l += beta * (x.exp() - x - 1.0);
            }
            row.push(l);
        }
        per_token.push(row);
    }
    let sums: Vec<f64> = per_token
        .iter()
        .zip(&b.mask)
        .map(|(l, m)| masked_sum(l, m))
        .collect();
    let counts: Vec<f64> = b.mask.iter().map(|m| msum(m)).collect();
    let total: f64 = sums.iter().sum();
    let tokens: f64 = counts.iter().sum();
    match loss_type {
        "grpo" | "sapo" => {
            sums.iter()
                .zip(&counts)
                .map(|(s, c)| s / c.max(1.0))
                .sum::<f64>()
                / rows as f64
        }
        "bnpo" | "dapo" | "cispo" | "vespo" => total / tokens.max(1.0),
        // `(per_token_loss * mask.sum(1)).mean()`: with the sequence level every token of a row
        // holds the row's loss, so this is each row's loss times its length, over every row.
        "luspo" => {
            sums.iter()
                .zip(&counts)
                .map(|(s, c)| if *c > 0.0 { s / c * c } else { 0.0 })
                .sum::<f64>()
                / rows as f64
        }
        "dr_grpo" => total / (rows as f64 * max_completion_length),
        other => panic!("unknown loss_type {other}"),
    }
}

/// TRL's vLLM importance-sampling ratio (`vllm_importance_sampling_mode`), before it
/// multiplies the loss: `token_truncate`, `token_mask`, `sequence_truncate`,
/// `sequence_mask`, with `clip_min = None`.
pub fn trl_vllm_is(old: &Rows, rollout: &Rows, mask: &Rows, mode: &str, clip_max: f64) -> Rows {
    let mut out = Rows::new();
    for i in 0..old.len() {
        let m = &mask[i];
        let diff: Vec<f64> = old[i]
            .iter()
            .zip(&rollout[i])
            .zip(m)
            .map(|((o, r), m)| (o - r) * m)
            .collect();
        let seq = diff.iter().sum::<f64>();
        out.push(
            diff.iter()
                .map(|&d| {
                    let r = if mode.starts_with("sequence") {
                        seq.exp()
                    } else {
                        d.exp()
                    };
                    if mode.ends_with("truncate") {
                        r.min(clip_max)
                    } else if r > clip_max {
                        0.0
                    } else {
                        r
                    }
                })
                .collect(),
        );
    }
    out
}

/// OpenRLHF `PolicyLoss.forward`: `ppo` (clamped ratio, optional dual clip) or `gspo`
/// (`exp(mean log ratio)`, gradient through the mean); `token_level_loss`; the vLLM correction
/// `tis` / `icepop` / `seq-mask-tis` with `[low, high]` against `rollout` (ppo); under `gspo`
/// the vLLM correction takes the sequence ratio against `rollout` instead of `old` and applies
/// no weight.
#[allow(clippy::too_many_arguments)]
pub fn orlhf_policy_loss(
    b: &LossBatch,
    kind: &str,
    eps: (f64, f64),
    dual_clip: Option<f64>,
    token_level: bool,
    vllm: Option<(&Rows, &str, f64, f64)>,
) -> f64 {
    let token_level = token_level && kind != "gspo";
    let mut loss = Rows::new();
    for i in 0..b.logp.len() {
        let m = &b.mask[i];
        let raw: Vec<f64> = b.logp[i]
            .iter()
            .zip(&b.old[i])
            .map(|(l, o)| l - o)
            .collect();
        let seq_lr: Vec<f64> = match (vllm, kind) {
            (Some((rollout, ..)), "gspo") => b.logp[i]
                .iter()
                .zip(&rollout[i])
                .map(|(l, r)| l - r)
                .collect(),
            _ => raw.clone(),
        };
        let seq_ratio = (masked_sum(&seq_lr, m) / msum(m).max(1.0)).exp();
        let mut row = Vec::new();
        for t in 0..m.len() {
            let ratio = if kind == "gspo" {
                seq_ratio * m[t]
            } else {
                clamp20(raw[t]).exp()
            };
            let a = b.adv[i][t];
            let (s1, s2) = (ratio * a, clamp(ratio, 1.0 - eps.0, 1.0 + eps.1) * a);
            let mut l = match dual_clip {
                None => -s1.min(s2),
                Some(c) => {
                    let c1 = s1.min(s2);
                    if a < 0.0 { -(c1.max(c * a)) } else { -c1 }
                }
            };
            if let (Some((rollout, ty, low, high)), "ppo") = (vllm, kind) {
                let rlr = b.old[i][t] - rollout[i][t];
                let w = match ty {
                    "icepop" => {
                        let v = rlr.exp();
                        if v >= low && v <= high { v } else { 0.0 }
                    }
                    "seq-mask-tis" => {
                        let sr: Vec<f64> =
                            (0..m.len()).map(|u| b.old[i][u] - rollout[i][u]).collect();
                        let g = (masked_sum(&sr, m) / msum(m)).exp();
                        let keep = g >= low && g <= high;
                        f64::from(u8::from(keep)) * rlr.exp()
                    }
                    _ => clamp(rlr.exp(), low, high),
                };
                l *= w;
            }
            row.push(l);
        }
        loss.push(row);
    }
    // OpenRLHF's masked_mean has no eps; aggregate_loss adds 1e-8 to the per-sequence count.
    if token_level {
        let s: f64 = loss
            .iter()
            .zip(&b.mask)
            .map(|(l, m)| masked_sum(l, m))
            .sum();
        s / b.mask.iter().map(|m| msum(m)).sum::<f64>()
    } else {
        let mut s = 0.0;
        let mut n = 0.0;
        for (l, m) in loss.iter().zip(&b.mask) {
            let c = msum(m);
            if c > 0.0 {
                s += masked_sum(l, m) / (c + 1e-8);
                n += 1.0;
            }
        }
        s / n
    }
}
