//! The token-level estimators (SPEC §18) on the device: `discounted_returns_f32`, `gae_f32`,
//! and the whitening pair `whiten_stats_f32` + `whiten_apply_f32`.
//!
//! Returns and GAE run the CPU reference's reverse scan, one warp per sequence staging coalesced
//! tiles through shared memory and one lane scanning each, with the same double operations in
//! the same order: their outputs equal `care_core::grpo::{discounted_returns, gae}` bit for bit.
//! Whitening reduces in a different order than the reference (per-block moments merged with
//! Chan's formula), so its outputs agree within the
//! [`Whiten`](crate::tolerance::Quantity::Whiten) tolerance.

use core::mem::offset_of;

use care_core::Error;
use care_core::grpo::{GaeOptions, MaskedToken, StdKind, WhitenOptions};

use super::{KernelError, Launcher, launch};
use crate::geometry::{Tuning, returns_geometry, whiten_apply_geometry, whiten_stats_geometry};
use crate::kernel::entry;
use crate::params::{
    ReturnsParams, STATUS_TOKENS_LAYOUT, STATUS_WHITEN_NON_FINITE, WhitenParams, WhitenStatsRaw,
    WhitenWorkRaw,
};

/// Device inputs of [`discounted_returns`] and [`gae`]: the CSR token layout of SPEC §10.
/// Addresses are 0 where absent (a per-token array may be absent only when `n_tok` is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBuffers {
    /// `f32[n_tok]` token rewards.
    pub rewards: u64,
    /// `f32[n_tok]` critic values (required by [`gae`], not read by [`discounted_returns`]).
    pub values: u64,
    /// `u32[n_seq + 1]` CSR offsets (`o[0] = 0`, non-decreasing, `o[n_seq] = n_tok`). The kernels
    /// clamp every offset into `0..=n_tok` and report a malformed layout in the status word
    /// ([`tokens_status`]), so it never indexes out of bounds.
    pub seq_offsets: u64,
    /// Number of sequences.
    pub n_seq: u32,
    /// Number of tokens.
    pub n_tok: u32,
    /// `u8[n_tok]` token mask (0 = masked), or 0: every token counts.
    pub mask: u64,
    /// At least [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES) of device memory, 16-byte aligned;
    /// holds the status word read by [`tokens_status`].
    pub workspace: u64,
}

/// Discounted returns `G_t = r_t + gamma * G_next` over each sequence's counted tokens into
/// `returns` (`f32[n_tok]`; masked tokens get 0), as `care_core::grpo::discounted_returns`.
///
/// A malformed offsets layout cannot stop the kernel: it sets the status word (read it back
/// from `workspace[0..4]` and map it with [`tokens_status`]); the outputs are then unspecified.
///
/// # Safety
/// Every address in `buf` and `returns` is valid device memory of the launcher with the
/// documented sizes, and stays valid until the launch completes.
pub unsafe fn discounted_returns<L: Launcher>(
    launcher: &L,
    buf: &TokenBuffers,
    returns: u64,
    opts: &GaeOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe { launch_tokens(launcher, buf, None, returns, 0, buf.workspace, opts, tuning) }
}

/// GAE advantages into `advantages` and returns `A_t + V_t` into `returns` (both `f32[n_tok]`;
/// masked tokens get 0), as `care_core::grpo::gae`. `buf.values` is required. Status as
/// [`discounted_returns`].
///
/// # Safety
/// As [`discounted_returns`]; `advantages` holds `n_tok` entries.
pub unsafe fn gae<L: Launcher>(
    launcher: &L,
    buf: &TokenBuffers,
    advantages: u64,
    returns: u64,
    opts: &GaeOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe {
        launch_tokens(
            launcher,
            buf,
            Some(advantages),
            returns,
            0,
            buf.workspace,
            opts,
            tuning,
        )
    }
}

/// `advantages`: `None` for discounted returns, the GAE output otherwise (ignored with `wide`:
/// the advantages go only to `wide`); `wide`: the `f64[n_tok]` values to whiten, or 0; `status`:
/// the status word (zeroed here).
#[allow(clippy::too_many_arguments)] // one argument per buffer
unsafe fn launch_tokens<L: Launcher>(
    launcher: &L,
    buf: &TokenBuffers,
    advantages: Option<u64>,
    returns: u64,
    wide: u64,
    status: u64,
    opts: &GaeOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    opts.validate()?;
    tuning.check()?;
    let is_gae = advantages.is_some();
    let reset = opts.masked_token == MaskedToken::Reset;
    if is_gae && reset {
        // As care_core::grpo::gae: no version of verl's GAE resets at a masked token.
        return Err(Error::InvalidArgument.into());
    }
    // A per-token array may be absent only when there are no tokens.
    let missing = buf.rewards == 0
        || returns == 0
        || (is_gae && (buf.values == 0 || (advantages == Some(0) && wide == 0)));
    if buf.seq_offsets == 0 || buf.workspace == 0 || (missing && buf.n_tok > 0) {
        return Err(Error::InvalidArgument.into());
    }
    // SAFETY: the status word is inside the workspace (caller contract).
    unsafe { launcher.memset_zero(status, 4) }.map_err(KernelError::Backend)?;
    let p = ReturnsParams {
        rewards: buf.rewards,
        values: if is_gae { buf.values } else { 0 },
        seq_offsets: buf.seq_offsets,
        mask: buf.mask,
        adv: advantages.unwrap_or(0),
        ret: returns,
        status,
        n_seq: buf.n_seq,
        n_tok: buf.n_tok,
        gamma: opts.gamma,
        lambda: opts.lambda,
        masked_reset: u32::from(reset),
        pad0: 0,
        wide,
    };
    let e = if is_gae {
        entry::GAE_F32
    } else {
        entry::DISCOUNTED_RETURNS_F32
    };
    // SAFETY: the buffers of `p` have the documented sizes (caller contract); the kernel clamps
    // every offset into `0..=n_tok` and runs one warp per sequence, as the geometry gives.
    unsafe { launch(launcher, e, returns_geometry(buf.n_seq, tuning), (p,)) }
}

/// Maps the status word of [`discounted_returns`] or [`gae`] (read back from
/// `workspace[0..4]`) to the error the CPU reference returns: [`Error::InvalidLayout`].
pub fn tokens_status(status: u32) -> Result<(), Error> {
    if status & STATUS_TOKENS_LAYOUT != 0 {
        Err(Error::InvalidLayout)
    } else {
        Ok(())
    }
}

/// Device buffers of [`whiten`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhitenBuffers {
    /// `f32[n]` values, whitened in place.
    pub values: u64,
    /// `u8[n]` mask (0 = masked: the value becomes 0), or 0: every value counts.
    pub mask: u64,
    /// Number of values.
    pub n: u64,
    /// At least [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES) of device memory, 16-byte aligned;
    /// holds the [`WhitenStatsRaw`] read by [`whiten_result`].
    pub workspace: u64,
}

/// Whitens the counted values in place over the whole call, `(x - mean) / sqrt(var + eps)`
/// with the two-pass centered variance in double, masked values becoming 0, as
/// `care_core::grpo::whiten`: `whiten_stats_f32` (per-block statistics merged with Chan's
/// formula in a fixed order: bit-identical from run to run) then `whiten_apply_f32`. An empty batch launches nothing.
///
/// A non-finite counted value cannot stop the launch: the statistics record it, the values are
/// left as they were (as the reference, which refuses the call), and [`whiten_result`] of the
/// [`WhitenStatsRaw`] read back from the workspace returns [`Error::NonFinite`].
///
/// # Safety
/// Every address in `buf` is valid device memory of the launcher with the documented sizes,
/// and stays valid until the launches complete.
pub unsafe fn whiten<L: Launcher>(
    launcher: &L,
    buf: &WhitenBuffers,
    opts: &WhitenOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    opts.validate()?;
    tuning.check()?;
    if (buf.values == 0 && buf.n > 0) || buf.workspace == 0 {
        return Err(Error::InvalidArgument.into());
    }
    let stats = buf.workspace;
    // SAFETY: the workspace holds WORKSPACE_BYTES >= size_of::<WhitenWorkRaw>() (caller
    // contract). All zero is the result of an empty batch (mean 0, std 0, no status) and the
    // slot merge's arrival counter at its start.
    unsafe { launcher.memset_zero(stats, offset_of!(WhitenWorkRaw, pad0)) }
        .map_err(KernelError::Backend)?;
    if buf.n == 0 {
        return Ok(());
    }
    let p = whiten_params(buf.values, 0, buf.mask, stats, buf.n, opts);
    // SAFETY: the values and mask hold `n` entries and the workspace a WhitenWorkRaw (caller
    // contract).
    unsafe { launch_whiten(launcher, p, tuning) }
}

fn whiten_params(
    x: u64,
    wide: u64,
    mask: u64,
    stats: u64,
    n: u64,
    opts: &WhitenOptions,
) -> WhitenParams {
    WhitenParams {
        x,
        mask,
        stats,
        n,
        eps: opts.eps,
        unbiased: u32::from(opts.std_kind == StdKind::Unbiased),
        pad0: 0,
        count_eps: opts.count_eps,
        wide,
    }
}

/// The statistics pass then the apply pass of `p` (the `_f64` pair with `p.wide`).
///
/// # Safety
/// `p`'s buffers hold `p.n` entries and `p.stats` a zeroed-as-[`whiten`]-does [`WhitenWorkRaw`].
unsafe fn launch_whiten<L: Launcher>(
    launcher: &L,
    p: WhitenParams,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    let (stats, apply) = if p.wide != 0 {
        (entry::WHITEN_STATS_F64, entry::WHITEN_APPLY_F64)
    } else {
        (entry::WHITEN_STATS_F32, entry::WHITEN_APPLY_F32)
    };
    // SAFETY (both): the caller's contract; the stats kernel uses at most STAT_SLOTS blocks,
    // the apply pass strides.
    unsafe { launch(launcher, stats, whiten_stats_geometry(p.n, tuning), (p,)) }?;
    unsafe { launch(launcher, apply, whiten_apply_geometry(p.n, tuning), (p,)) }
}

/// The `(mean, std)` of a [`whiten`] call from the statistics it left in the workspace, as
/// `care_core::grpo::whiten` returns them, or [`Error::NonFinite`] when a counted value was not
/// finite (the values were not changed).
pub fn whiten_result(stats: &WhitenStatsRaw) -> Result<(f64, f64), Error> {
    if stats.status & STATUS_WHITEN_NON_FINITE != 0 {
        Err(Error::NonFinite)
    } else {
        Ok((stats.mean, stats.std))
    }
}

const _: () = assert!(size_of::<WhitenStatsRaw>() <= super::WORKSPACE_BYTES);

/// Device outputs of [`discounted_returns_whitened`] and [`gae_whitened`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhitenedOutputs {
    /// `f32[n_tok]`: the whitened returns, or the whitened GAE advantages (masked: 0).
    pub advantages: u64,
    /// `f32[n_tok]`: the returns (discounted, or GAE's `A + V`; masked: 0), not whitened.
    pub returns: u64,
    /// Bytes at the [`TokenBuffers::workspace`]: at least
    /// [`whitened_workspace_bytes`].
    pub workspace_len: usize,
}

/// Offset in the workspace of the returns' layout status word of [`discounted_returns_whitened`]
/// and [`gae_whitened`] (the whitening's [`WhitenWorkRaw`] comes first, at 0).
pub const WHITENED_STATUS_OFFSET: usize = size_of::<WhitenWorkRaw>().next_multiple_of(16);

/// Bytes of workspace [`discounted_returns_whitened`] and [`gae_whitened`] need for `n_tok`
/// tokens: [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES) for the statistics and the status words,
/// then the unrounded values, 8 bytes a token, with 64 bytes to align them.
pub fn whitened_workspace_bytes(n_tok: u32) -> usize {
    super::WORKSPACE_BYTES + 64 + 8 * n_tok as usize
}

const _: () = assert!(WHITENED_STATUS_OFFSET + 4 <= super::WORKSPACE_BYTES);

/// Where the `f64` values go: after [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES), shifted so
/// that `&wide[i]` is 32-byte aligned wherever `&advantages[i]` is 16-byte aligned (the vector
/// path of `whiten_apply_f64`).
fn wide_address(workspace: u64, advantages: u64) -> u64 {
    let base = (workspace + super::WORKSPACE_BYTES as u64).next_multiple_of(32);
    // Elements of `advantages` before its first 16-byte boundary.
    let head = ((16 - (advantages & 15)) & 15) / 4;
    base + 8 * ((4 - head % 4) % 4)
}

/// Discounted returns and their whitening over the call's counted tokens, every intermediate in
/// `f64`, as `care_core::grpo::discounted_returns_whitened` (verl's `reinforce_plus_plus`): the
/// scan writes the returns in `f32` and, unrounded, in `f64` into the workspace; the whitening
/// (`whiten_stats_f64`, `whiten_apply_f64`) reads those and writes the whitened returns into
/// `out.advantages`. The returns equal the reference's bit for bit; the whitened values, mean
/// and std agree within the [`Whiten`](crate::tolerance::Quantity::Whiten) tolerance.
///
/// What the reference refuses before writing cannot stop the launches: a malformed layout sets
/// the returns' status word, a non-finite return the whitening's (the advantages are then left
/// as they were; the returns are written); [`whitened_result`] of the two, read back from
/// the workspace, gives the reference's error or its `(mean, std)`.
///
/// Errors: [`Error::InvalidArgument`] as [`discounted_returns`] and [`whiten`], and for a
/// workspace shorter than [`whitened_workspace_bytes`].
///
/// # Safety
/// As [`discounted_returns`]; `out`'s buffers hold `n_tok` entries and the workspace
/// `out.workspace_len` bytes.
pub unsafe fn discounted_returns_whitened<L: Launcher>(
    launcher: &L,
    buf: &TokenBuffers,
    out: &WhitenedOutputs,
    opts: &GaeOptions,
    whiten: &WhitenOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe { tokens_whitened(launcher, buf, false, out, opts, whiten, tuning) }
}

/// GAE with the advantages whitened over the call's counted tokens, every intermediate in `f64`,
/// as `care_core::grpo::gae_whitened` (verl's `gae`): the returns `A + V` into `out.returns`
/// (not whitened, bit-identical to the reference), the unrounded advantages into the workspace
/// and, whitened, into `out.advantages`. Statuses and errors as [`discounted_returns_whitened`].
///
/// # Safety
/// As [`discounted_returns_whitened`]; `buf.values` holds `n_tok` entries.
pub unsafe fn gae_whitened<L: Launcher>(
    launcher: &L,
    buf: &TokenBuffers,
    out: &WhitenedOutputs,
    opts: &GaeOptions,
    whiten: &WhitenOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe { tokens_whitened(launcher, buf, true, out, opts, whiten, tuning) }
}

unsafe fn tokens_whitened<L: Launcher>(
    launcher: &L,
    buf: &TokenBuffers,
    is_gae: bool,
    out: &WhitenedOutputs,
    opts: &GaeOptions,
    w: &WhitenOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    w.validate()?;
    if buf.workspace == 0 || out.workspace_len < whitened_workspace_bytes(buf.n_tok) {
        return Err(Error::InvalidArgument.into());
    }
    if buf.n_tok > 0 && out.advantages == 0 {
        return Err(Error::InvalidArgument.into());
    }
    let ws = buf.workspace;
    let wide = wide_address(ws, out.advantages);
    // SAFETY: the workspace holds whitened_workspace_bytes (checked above): the
    // WhitenWorkRaw at 0, the status word at WHITENED_STATUS_OFFSET and 8 * n_tok bytes
    // at `wide` (at most 56 bytes past WORKSPACE_BYTES); the other buffers as documented.
    unsafe {
        launch_tokens(
            launcher,
            buf,
            is_gae.then_some(0),
            out.returns,
            wide,
            ws + WHITENED_STATUS_OFFSET as u64,
            opts,
            tuning,
        )
    }?;
    // SAFETY: as above; zeroed as `whiten` zeroes it.
    unsafe { launcher.memset_zero(ws, offset_of!(WhitenWorkRaw, pad0)) }
        .map_err(KernelError::Backend)?;
    if buf.n_tok == 0 {
        return Ok(());
    }
    let p = whiten_params(out.advantages, wide, buf.mask, ws, u64::from(buf.n_tok), w);
    // SAFETY: `wide` holds the n_tok values the scan wrote; the rest as above.
    unsafe { launch_whiten(launcher, p, tuning) }
}

/// The `(mean, std)` of a [`discounted_returns_whitened`] or [`gae_whitened`] call from what it
/// left in the workspace (the [`WhitenStatsRaw`] at 0 and the status word at
/// [`WHITENED_STATUS_OFFSET`]), as the reference returns them: [`Error::InvalidLayout`]
/// for a malformed layout (the outputs are unspecified), else [`Error::NonFinite`] for a
/// non-finite counted value (the advantages were not written).
pub fn whitened_result(
    stats: &WhitenStatsRaw,
    tokens_status_word: u32,
) -> Result<(f64, f64), Error> {
    tokens_status(tokens_status_word)?;
    whiten_result(stats)
}
