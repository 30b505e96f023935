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

use super::advantage::{AdvantageValue, StdKind, std_from};
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

/// What a masked token does to the reverse scan of [`discounted_returns`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MaskedToken {
    /// It is skipped: it neither reads its reward nor breaks the chain (default; verl's
    /// multi-turn observation tokens, `reinforce_plus_plus` since 2026-08, GAE always).
    #[default]
    Skip = 0,
    /// The running return restarts at 0 before it (verl's `reinforce_plus_plus` until
    /// 2026-08: `running_return *= response_mask[t]`): the tokens before a masked token do
    /// not see the rewards after it. [`discounted_returns`] only.
    Reset = 1,
}

named_enum!(MaskedToken, "masked-token rule", {
    Skip => "skip", "A masked token is skipped: the chain carries across it";
    Reset => "reset", "The return restarts at 0 before a masked token (verl before 2026-08)";
});

/// Options of [`gae`] and [`discounted_returns`]. Field order (C): `gamma: f64, lambda: f64,
/// masked_token: u32` and 4 bytes of tail padding.
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
    /// What a masked token does to the returns' scan ([`MaskedToken::Skip`]; [`gae`] takes
    /// only that).
    #[cfg_attr(feature = "serde", serde(default))]
    pub masked_token: MaskedToken,
}

impl Default for GaeOptions {
    /// `gamma = lambda = 1` (verl's defaults for LLM training), masked tokens skipped.
    fn default() -> Self {
        GaeOptions {
            gamma: 1.0,
            lambda: 1.0,
            masked_token: MaskedToken::Skip,
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

/// Options of [`whiten`]. Field order (C): `eps: f64, std_kind: u32` (+4 bytes padding),
/// `count_eps: f64`.
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
    /// Added to the count in the two means (0: the exact means, default). verl's
    /// `masked_mean` divides by `count + 1e-8`: with `1e-8`, `mean = sum / (n + 1e-8)` and the
    /// variance is `(m2 / (n + 1e-8)) * n / (n - 1)` (biased: without the Bessel factor), so
    /// equal values whiten to a residue instead of 0, as there. Finite, `>= 0`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub count_eps: f64,
}

impl Default for WhitenOptions {
    /// verl's `masked_whiten` with exact means: unbiased variance, `eps = 1e-8`, `count_eps = 0`.
    fn default() -> Self {
        WhitenOptions {
            eps: 1e-8,
            std_kind: StdKind::Unbiased,
            count_eps: 0.0,
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
        )?;
        InvalidOption::require(
            domain::finite_non_negative(self.count_eps),
            "count_eps",
            domain::FINITE_NON_NEGATIVE,
        )
    }

    /// The mean of `count` values summing to `sum`: `sum / (count + count_eps)`, 0 when
    /// nothing counted. The `mean` that [`whiten_partial_squares`] takes.
    pub fn mean(&self, count: f64, sum: f64) -> f64 {
        if count > 0.0 {
            sum / (count + self.count_eps)
        } else {
            0.0
        }
    }

    /// [`WhitenOptions::check`] as an [`Error`]: [`Error::InvalidArgument`] for a negative or
    /// non-finite eps or count_eps.
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

/// The reverse scan of [`discounted_returns`]: `f(t, Some(G_t))` for each counted token and
/// `f(t, None)` for each masked one, every sequence from its last token. Inputs checked.
fn returns_scan(
    token_rewards: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    mut f: impl FnMut(usize, Option<f64>),
) {
    let reset = opts.masked_token == MaskedToken::Reset;
    for w in seq_offsets.windows(2) {
        let mut g = 0.0f64;
        for t in (w[0] as usize..w[1] as usize).rev() {
            if counted(mask, t) {
                g = f64::from(token_rewards[t]) + opts.gamma * g;
                f(t, Some(g));
            } else {
                if reset {
                    g = 0.0;
                }
                f(t, None);
            }
        }
    }
}

/// The reverse scan of [`gae`]: `f(t, Some((A_t, R_t)))` for each counted token and `f(t,
/// None)` for each masked one. Inputs checked.
fn gae_scan(
    token_rewards: &[f32],
    values: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    mut f: impl FnMut(usize, Option<(f64, f64)>),
) {
    let gl = opts.gamma * opts.lambda;
    for w in seq_offsets.windows(2) {
        let (mut next_v, mut last) = (0.0f64, 0.0f64);
        for t in (w[0] as usize..w[1] as usize).rev() {
            if !counted(mask, t) {
                f(t, None);
                continue;
            }
            let v = f64::from(values[t]);
            let delta = f64::from(token_rewards[t]) + opts.gamma * next_v - v;
            last = delta + gl * last;
            f(t, Some((last, last + v)));
            next_v = v;
        }
    }
}

/// Whitening of a value stream that `scan` replays (three times: sum, centered squares,
/// writes), so that the values are never stored rounded before they are whitened. `write(t,
/// x')` gets the whitened value of each counted token and 0 for each masked one. Returns
/// `(mean, std)`.
fn whiten_scan(
    opts: &WhitenOptions,
    scan: impl Fn(&mut dyn FnMut(usize, Option<f64>)),
    mut write: impl FnMut(usize, f64),
) -> Result<(f64, f64)> {
    let (mut count, mut sum) = (0.0f64, 0.0f64);
    scan(&mut |_, x| {
        if let Some(x) = x {
            count += 1.0;
            sum += x;
        }
    });
    if !sum.is_finite() {
        return Err(Error::NonFinite);
    }
    let mean = opts.mean(count, sum);
    let mut m2 = 0.0f64;
    scan(&mut |_, x| {
        if let Some(x) = x {
            let d = x - mean;
            m2 += d * d;
        }
    });
    let (scale, std) = whiten_scale(count, m2, opts);
    scan(&mut |t, x| write(t, x.map_or(0.0, |x| whitened(x, mean, scale))));
    Ok((mean, std))
}

/// `1 / sqrt(var + eps)` and the std, from the count and the centered sum of squares.
fn whiten_scale(count: f64, m2: f64, opts: &WhitenOptions) -> (f64, f64) {
    let denom = match opts.std_kind {
        StdKind::Unbiased => count - 1.0,
        StdKind::Biased => count,
    };
    let var = if denom <= 0.0 {
        0.0
    } else if opts.count_eps == 0.0 {
        m2 / denom
    } else {
        // verl's order: masked_mean of the squares, then the Bessel factor n / (n - 1).
        let v = m2 / (count + opts.count_eps);
        match opts.std_kind {
            StdKind::Unbiased => v * (count / (count - 1.0)),
            StdKind::Biased => v,
        }
    };
    (
        1.0 / libm::sqrt(var + opts.eps),
        std_from(m2, count, opts.std_kind),
    )
}

/// One whitened value: a value equal to the mean is exactly 0, also when `var + eps = 0`
/// (scale infinite).
#[inline]
fn whitened(x: f64, mean: f64, scale: f64) -> f64 {
    let d = x - mean;
    if d == 0.0 { 0.0 } else { d * scale }
}

/// Discounted returns `G_t = r_t + gamma * G_next` over each sequence's counted tokens
/// (REINFORCE++, verl `reinforce_plus_plus` before whitening; with `gamma = 1`, the reward-to-go
/// of verl `remax`). Masked tokens get 0 ([`MaskedToken`] says whether they break the chain).
///
/// Errors: [`Error::InvalidArgument`] (options), [`Error::InvalidLayout`],
/// [`Error::LengthMismatch`]. Checks run before any write.
pub fn discounted_returns<V: AdvantageValue>(
    token_rewards: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    returns: &mut [V],
) -> Result<()> {
    opts.validate()?;
    check_tokens(seq_offsets, mask, token_rewards.len(), &[returns.len()])?;
    returns_scan(token_rewards, seq_offsets, mask, opts, |t, g| {
        returns[t] = V::from_f64(g.unwrap_or(0.0));
    });
    Ok(())
}

/// [`discounted_returns`] and their whitening over the call's counted tokens in one call, every
/// intermediate in `f64` (the returns are never rounded before they are whitened): writes
/// `returns` and `advantages` (the whitened returns; masked tokens 0 in both) and returns the
/// `(mean, std)` of the returns. verl's `reinforce_plus_plus` with [`WhitenOptions::default`].
///
/// Errors: as [`discounted_returns`], and [`Error::NonFinite`] (a non-finite return: nothing
/// is written). Checks run before any write.
pub fn discounted_returns_whitened<V: AdvantageValue>(
    token_rewards: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    whiten: &WhitenOptions,
    advantages: &mut [V],
    returns: &mut [V],
) -> Result<(f64, f64)> {
    opts.validate()?;
    whiten.validate()?;
    let n = token_rewards.len();
    check_tokens(seq_offsets, mask, n, &[advantages.len(), returns.len()])?;
    let scan = |f: &mut dyn FnMut(usize, Option<f64>)| {
        returns_scan(token_rewards, seq_offsets, mask, opts, f);
    };
    let stats = whiten_scan(whiten, scan, |t, x| advantages[t] = V::from_f64(x))?;
    scan(&mut |t, g| returns[t] = V::from_f64(g.unwrap_or(0.0)));
    Ok(stats)
}

/// Generalized advantage estimation over token rewards and values, as a reverse scan per
/// sequence (the module docs' formula): writes the advantages `A_t` and the returns
/// `R_t = A_t + V_t` (the value targets). Masked tokens get 0 in both. Not whitened: see
/// [`gae_whitened`] for verl's `gae` estimator.
///
/// Errors: [`Error::InvalidArgument`] (options, [`MaskedToken::Reset`]),
/// [`Error::InvalidLayout`], [`Error::LengthMismatch`]. Checks run before any write.
pub fn gae<V: AdvantageValue>(
    token_rewards: &[f32],
    values: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    advantages: &mut [V],
    returns: &mut [V],
) -> Result<()> {
    check_gae(
        token_rewards,
        values,
        seq_offsets,
        mask,
        opts,
        advantages,
        returns,
    )?;
    gae_scan(token_rewards, values, seq_offsets, mask, opts, |t, ar| {
        let (a, r) = ar.unwrap_or((0.0, 0.0));
        (advantages[t], returns[t]) = (V::from_f64(a), V::from_f64(r));
    });
    Ok(())
}

fn check_gae<V>(
    token_rewards: &[f32],
    values: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    advantages: &[V],
    returns: &[V],
) -> Result<()> {
    opts.validate()?;
    if opts.masked_token != MaskedToken::Skip {
        // No version of verl's GAE resets at a masked token.
        return Err(Error::InvalidArgument);
    }
    let n = token_rewards.len();
    check_tokens(
        seq_offsets,
        mask,
        n,
        &[values.len(), advantages.len(), returns.len()],
    )
}

/// [`gae`] with the advantages whitened over the call's counted tokens, every intermediate in
/// `f64` (verl's `gae` estimator with [`WhitenOptions::default`]); the returns are not
/// whitened. Returns the `(mean, std)` of the advantages before whitening.
///
/// Errors: as [`gae`], and [`Error::NonFinite`] (a non-finite advantage: nothing is written).
/// Checks run before any write.
#[allow(clippy::too_many_arguments)] // one argument per buffer, as `gae`
pub fn gae_whitened<V: AdvantageValue>(
    token_rewards: &[f32],
    values: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &GaeOptions,
    whiten: &WhitenOptions,
    advantages: &mut [V],
    returns: &mut [V],
) -> Result<(f64, f64)> {
    check_gae(
        token_rewards,
        values,
        seq_offsets,
        mask,
        opts,
        advantages,
        returns,
    )?;
    whiten.validate()?;
    let scan = |f: &mut dyn FnMut(usize, Option<(f64, f64)>)| {
        gae_scan(token_rewards, values, seq_offsets, mask, opts, f);
    };
    let adv_scan = |f: &mut dyn FnMut(usize, Option<f64>)| scan(&mut |t, ar| f(t, ar.map(|x| x.0)));
    let stats = whiten_scan(whiten, adv_scan, |t, x| advantages[t] = V::from_f64(x))?;
    scan(&mut |t, ar| returns[t] = V::from_f64(ar.map_or(0.0, |x| x.1)));
    Ok(stats)
}

/// Step 1 of a cross-rank [`whiten`]: this rank's count and `f64` sum of the counted values
/// (all-reduce with a sum). Errors: [`Error::LengthMismatch`].
pub fn whiten_partial_sums<V: AdvantageValue>(
    values: &[V],
    mask: Option<&[u8]>,
) -> Result<GroupSums> {
    if mask.is_some_and(|m| m.len() != values.len()) {
        return Err(Error::LengthMismatch);
    }
    let (mut count, mut sum) = (0.0f64, 0.0f64);
    for (t, &v) in values.iter().enumerate() {
        if counted(mask, t) {
            count += 1.0;
            sum += v.to_f64();
        }
    }
    Ok(GroupSums { count, sum })
}

/// Step 2: this rank's sum of squared deviations of the counted values from the global
/// mean of the reduced step 1, [`WhitenOptions::mean`] (`sum / count` by default; all-reduce
/// with a sum).
/// Errors: [`Error::LengthMismatch`].
pub fn whiten_partial_squares<V: AdvantageValue>(
    values: &[V],
    mask: Option<&[u8]>,
    mean: f64,
) -> Result<f64> {
    if mask.is_some_and(|m| m.len() != values.len()) {
        return Err(Error::LengthMismatch);
    }
    let mut m2 = 0.0f64;
    for (t, &v) in values.iter().enumerate() {
        if counted(mask, t) {
            let d = v.to_f64() - mean;
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
pub fn whiten_finalize<V: AdvantageValue>(
    values: &mut [V],
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
    let mean = opts.mean(sums.count, sums.sum);
    let (scale, std) = whiten_scale(sums.count, m2, opts);
    for (t, v) in values.iter_mut().enumerate() {
        *v = V::from_f64(if counted(mask, t) {
            whitened(v.to_f64(), mean, scale)
        } else {
            0.0
        });
    }
    Ok((mean, std))
}

/// Whitens the counted values in place over the whole call (one rank): `(x - mean) /
/// sqrt(var + eps)`, two-pass centered variance in `f64`; masked values become 0. Returns
/// `(mean, std)`. verl's `masked_whiten` with [`WhitenOptions::default`]. `f32` or `f64`
/// values: the token estimators' own whitening ([`discounted_returns_whitened`],
/// [`gae_whitened`]) never rounds before whitening; so are `f64` values.
///
/// Errors: [`Error::InvalidArgument`] (options), [`Error::LengthMismatch`] (mask),
/// [`Error::NonFinite`] (a counted value is not finite: the statistics would be NaN). Checks
/// run before any write.
pub fn whiten<V: AdvantageValue>(
    values: &mut [V],
    mask: Option<&[u8]>,
    opts: &WhitenOptions,
) -> Result<(f64, f64)> {
    opts.validate()?;
    let sums = whiten_partial_sums(values, mask)?;
    if !sums.sum.is_finite() {
        return Err(Error::NonFinite);
    }
    let m2 = whiten_partial_squares(values, mask, opts.mean(sums.count, sums.sum))?;
    whiten_finalize(values, mask, sums, m2, opts)
}
