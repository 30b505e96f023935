//! Token-level advantages (SPEC §18): discounted returns (REINFORCE++), GAE
//! over token rewards and values, and masked whitening, each a reverse scan or a reduction per
//! sequence of the CSR token layout of SPEC §10.
//!
//! Over the counted tokens `t_1 < ... < t_n` of a sequence (a masked token is skipped: it
//! neither reads its reward or value nor breaks the chain, as verl's multi-turn observation
//! tokens; it gets 0 in every output):
//!
//! ```text
//! returns   G_t = r_t + gamma * G_next                       G after the last token = 0
//! GAE       delta_t = r_t + gamma * V_next - V_t             V after the last token = 0
//!           A_t = delta_t + gamma * lambda * A_next,  R_t = A_t + V_t
//! whiten    x'_t = (x_t - mean) / sqrt(var + eps)             over the counted tokens of the
//!                                                             batch; var unbiased by default
//! ```
//!
//! With `gamma = lambda = 1`, GAE telescopes to `A_t = G_t - V_t` (a property test). verl's
//! `gae` and `reinforce_plus_plus` whiten their advantages (`masked_whiten`, unbiased, eps
//! `1e-8`); OpenRLHF's `reinforce` whitens with the biased variance and `max(var, 1e-8)`
//! (identical unless `var < 1e-8`). Whitening across ranks takes two sum-reductions, as group
//! advantages do (SPEC §11): [`whiten_partial_sums`], [`whiten_partial_squares`], then
//! [`whiten_finalize`].

use super::advantage::{StdKind, std_from};
use super::dist::GroupSums;
use super::layout::validate_offsets;
use crate::error::{InvalidOption, domain};
use crate::names::named_enum;
use crate::{Error, Result};

/// Which estimator turns rewards into advantages: group-relative over outcome rewards
/// ([`group_advantages_with`](super::group_advantages_with), every baseline and preset), or
/// one of the token-level ones of this module over token rewards.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AdvantageEstimator {
    /// Group-relative advantages of outcome rewards (default).
    #[default]
    Group = 0,
    /// GAE over token rewards and values.
    Gae = 1,
    /// REINFORCE++: discounted returns of token rewards.
    ReinforcePp = 2,
}

named_enum!(AdvantageEstimator, "advantage estimator", {
    Group => "group", "Group-relative advantages of outcome rewards (GRPO, RLOO, OPO, ...)";
    Gae => "gae", "GAE over token rewards and values";
    ReinforcePp => "reinforce_pp", "REINFORCE++: discounted returns of token rewards";
});

/// Options of [`gae`] and [`discounted_returns`]. Field order (C): `gamma: f64, lambda: f64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct GaeOptions {
    /// Discount `gamma` in `[0, 1]` (1).
    pub gamma: f64,
    /// GAE `lambda` in `[0, 1]` (1; unused by [`discounted_returns`]).
    pub lambda: f64,
}

impl Default for GaeOptions {
    /// `gamma = lambda = 1` (verl's defaults for LLM training).
    fn default() -> Self {
        GaeOptions {
            gamma: 1.0,
            lambda: 1.0,
        }
    }
}

impl GaeOptions {
    /// Checks the fields, naming the first one outside its domain: both in `[0, 1]`.
    ///
    /// # Errors
    /// The field and its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        InvalidOption::require(unit(self.gamma), "gamma", domain::UNIT)?;
        InvalidOption::require(unit(self.lambda), "lambda", domain::UNIT)
    }

    /// [`GaeOptions::check`] as an [`Error`]: [`Error::InvalidArgument`] unless both are in
    /// `[0, 1]`.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }
}

/// Options of [`whiten`]. Field order (C): `eps: f64, std_kind: u32` (+4 bytes padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct WhitenOptions {
    /// Added to the variance under the square root (`1e-8`); finite, `>= 0`.
    pub eps: f64,
    /// Unbiased (`n - 1`, default; verl) or biased (`n`; OpenRLHF) variance.
    pub std_kind: StdKind,
}

impl Default for WhitenOptions {
    /// verl's `masked_whiten`: unbiased variance, `eps = 1e-8`.
    fn default() -> Self {
        WhitenOptions {
            eps: 1e-8,
            std_kind: StdKind::Unbiased,
        }
    }
}

impl WhitenOptions {
    /// Checks the fields, naming the one outside its domain: `eps` finite and `>= 0`.
    ///
    /// # Errors
    /// The field and its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        InvalidOption::require(
            domain::finite_non_negative(self.eps),
            "eps",
            domain::FINITE_NON_NEGATIVE,
        )
    }

    /// [`WhitenOptions::check`] as an [`Error`]: [`Error::InvalidArgument`] for a negative or
    /// non-finite eps.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }
}

#[inline]
fn counted(mask: Option<&[u8]>, t: usize) -> bool {
    mask.is_none_or(|m| m[t] != 0)
}

fn check_tokens(
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    n: usize,
    others: &[usize],
) -> Result<()> {
    validate_offsets(seq_offsets, n)?;
    if mask.is_some_and(|m| m.len() != n) || others.iter().any(|&l| l != n) {
        return Err(Error::LengthMismatch);
    }
    Ok(())
}

/// Discounted returns `G_t = r_t + gamma * G_next` over each sequence's counted tokens
/// (REINFORCE++, verl `reinforce_plus_plus` before whitening; with `gamma = 1`, the reward-to-go
/// of verl `remax`). Masked tokens get 0.
///
/// Errors: [`Error::InvalidArgument`] (options), [`Error::InvalidLayout`],
/// [`Error::LengthMismatch`]. Checks run before any write.
pub fn discounted_returns(
    token_rewards: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    returns: &mut [f32],
) -> Result<()> {
    opts.validate()?;
    check_tokens(seq_offsets, mask, token_rewards.len(), &[returns.len()])?;
    for w in seq_offsets.windows(2) {
        let mut g = 0.0f64;
        for t in (w[0] as usize..w[1] as usize).rev() {
            if counted(mask, t) {
                g = f64::from(token_rewards[t]) + opts.gamma * g;
                returns[t] = super::narrow_f32(g);
            } else {
                returns[t] = 0.0;
            }
        }
    }
    Ok(())
}

/// Generalized advantage estimation over token rewards and values, as a reverse scan per
/// sequence (the module docs' formula): writes the advantages `A_t` and the returns
/// `R_t = A_t + V_t` (the value targets). Masked tokens get 0 in both. Not whitened: call
/// [`whiten`] on the advantages for verl's `gae` estimator.
///
/// Errors: [`Error::InvalidArgument`] (options), [`Error::InvalidLayout`],
/// [`Error::LengthMismatch`]. Checks run before any write.
pub fn gae(
    token_rewards: &[f32],
    values: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    advantages: &mut [f32],
    returns: &mut [f32],
) -> Result<()> {
    opts.validate()?;
    let n = token_rewards.len();
    check_tokens(
        seq_offsets,
        mask,
        n,
        &[values.len(), advantages.len(), returns.len()],
    )?;
    let gl = opts.gamma * opts.lambda;
    for w in seq_offsets.windows(2) {
        let (mut next_v, mut last) = (0.0f64, 0.0f64);
        for t in (w[0] as usize..w[1] as usize).rev() {
            if !counted(mask, t) {
                (advantages[t], returns[t]) = (0.0, 0.0);
                continue;
            }
            let v = f64::from(values[t]);
            let delta = f64::from(token_rewards[t]) + opts.gamma * next_v - v;
            last = delta + gl * last;
            advantages[t] = super::narrow_f32(last);
            returns[t] = super::narrow_f32(last + v);
            next_v = v;
        }
    }
    Ok(())
}

/// Step 1 of a cross-rank [`whiten`]: this rank's count and `f64` sum of the counted values
/// (all-reduce with a sum). Errors: [`Error::LengthMismatch`].
pub fn whiten_partial_sums(values: &[f32], mask: Option<&[u8]>) -> Result<GroupSums> {
    if mask.is_some_and(|m| m.len() != values.len()) {
        return Err(Error::LengthMismatch);
    }
    let (mut count, mut sum) = (0.0f64, 0.0f64);
    for (t, &v) in values.iter().enumerate() {
        if counted(mask, t) {
            count += 1.0;
            sum += f64::from(v);
        }
    }
    Ok(GroupSums { count, sum })
}

/// Step 2: this rank's sum of squared deviations of the counted values from the global
/// `mean = sum / count` of the reduced step 1 (all-reduce with a sum).
/// Errors: [`Error::LengthMismatch`].
pub fn whiten_partial_squares(values: &[f32], mask: Option<&[u8]>, mean: f64) -> Result<f64> {
    if mask.is_some_and(|m| m.len() != values.len()) {
        return Err(Error::LengthMismatch);
    }
    let mut m2 = 0.0f64;
    for (t, &v) in values.iter().enumerate() {
        if counted(mask, t) {
            let d = f64::from(v) - mean;
            m2 += d * d;
        }
    }
    Ok(m2)
}

/// Step 3: whitens this rank's counted values in place from the reduced moments (`sums` of
/// step 1, `m2` of step 2); masked values become 0. Returns `(mean, std)`.
///
/// Errors: [`Error::InvalidArgument`] (options, or a negative or non-finite reduced value),
/// [`Error::LengthMismatch`]. Checks run before any write.
pub fn whiten_finalize(
    values: &mut [f32],
    mask: Option<&[u8]>,
    sums: GroupSums,
    m2: f64,
    opts: &WhitenOptions,
) -> Result<(f64, f64)> {
    opts.validate()?;
    if mask.is_some_and(|m| m.len() != values.len()) {
        return Err(Error::LengthMismatch);
    }
    let ok = |x: f64| x.is_finite() && x >= 0.0;
    if !(ok(sums.count) && sums.sum.is_finite() && ok(m2)) {
        return Err(Error::InvalidArgument);
    }
    let mean = if sums.count > 0.0 {
        sums.sum / sums.count
    } else {
        0.0
    };
    let std = std_from(m2, sums.count, opts.std_kind);
    let denom = match opts.std_kind {
        StdKind::Unbiased => sums.count - 1.0,
        StdKind::Biased => sums.count,
    };
    let var = if denom > 0.0 { m2 / denom } else { 0.0 };
    let scale = 1.0 / libm::sqrt(var + opts.eps);
    for (t, v) in values.iter_mut().enumerate() {
        *v = if counted(mask, t) {
            // A value equal to the mean is exactly 0, also when `var + eps = 0` (scale inf).
            let d = f64::from(*v) - mean;
            super::narrow_f32(if d == 0.0 { 0.0 } else { d * scale })
        } else {
            0.0
        };
    }
    Ok((mean, std))
}

/// Whitens the counted values in place over the whole call (one rank): `(x - mean) /
/// sqrt(var + eps)`, two-pass centered variance in `f64`; masked values become 0. Returns
/// `(mean, std)`. verl's `masked_whiten` with [`WhitenOptions::default`].
///
/// Errors: [`Error::InvalidArgument`] (options), [`Error::LengthMismatch`] (mask),
/// [`Error::NonFinite`] (a counted value is not finite: the statistics would be NaN). Checks
/// run before any write.
pub fn whiten(values: &mut [f32], mask: Option<&[u8]>, opts: &WhitenOptions) -> Result<(f64, f64)> {
    opts.validate()?;
    let sums = whiten_partial_sums(values, mask)?;
    if !sums.sum.is_finite() {
        return Err(Error::NonFinite);
    }
    let mean = if sums.count > 0.0 {
        sums.sum / sums.count
    } else {
        0.0
    };
    let m2 = whiten_partial_squares(values, mask, mean)?;
    whiten_finalize(values, mask, sums, m2, opts)
}
