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

// Test oracle: an unknown option name is a bug in the calling test, so it panics.
#![allow(clippy::panic)]

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
