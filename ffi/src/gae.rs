//! The token-level estimators (SPEC §18): discounted returns, GAE over token rewards and
//! values, and whitening, on the CPU and (`care_gpu_*`, device pointers) on the GPU.

use core::mem::size_of;

use care_core::grpo::{GaeOptions, MaskedToken, StdKind, WhitenOptions};
use care_kernels::Tuning;
use care_kernels::params::WhitenStatsRaw;
use cudarc::driver::result as cu;

use crate::args::{self, Out};
use crate::gpu::{backend, care_gpu_launch, dev, driver_code, kernel_code, read_launch};
use crate::result::{care_result, map_error};

/// What a masked token does to the returns' reverse scan (`care_gae_options.masked_token`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_masked_token {
    /// Skipped: the chain carries across it (default; verl since 2026-08).
    CARE_MASKED_TOKEN_SKIP = 0,
    /// The return restarts at 0 before it (verl's `reinforce_plus_plus` before 2026-08;
    /// returns only, `care_gae` refuses it).
    CARE_MASKED_TOKEN_RESET = 1,
}

/// Options of `care_discounted_returns` and `care_gae`. Initialize with
/// `care_gae_options_default` (which sets `struct_size`), then change fields.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_gae_options {
    /// `sizeof(care_gae_options)`; lets the struct grow without breaking old callers.
    pub struct_size: u32,
    /// Discount `gamma` in `[0, 1]` (default 1).
    pub gamma: f64,
    /// GAE `lambda` in `[0, 1]` (default 1; not read by `care_discounted_returns`).
    pub lambda: f64,
    /// A `care_masked_token`.
    pub masked_token: u32,
}

/// Options of `care_whiten`. Initialize with `care_whiten_options_default` (which sets
/// `struct_size`), then change fields.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_whiten_options {
    /// `sizeof(care_whiten_options)`.
    pub struct_size: u32,
    /// A `care_std_kind`: unbiased (`n - 1`, default; verl) or biased (`n`; OpenRLHF).
    pub std_kind: u32,
    /// Added to the variance under the square root; finite and `>= 0` (default 1e-8).
    pub eps: f64,
    /// Added to the count in the means (default 0; verl's `masked_mean`: 1e-8).
    pub count_eps: f64,
}

/// The token inputs of `care_discounted_returns` and `care_gae`: `token_rewards[T]` on the
/// CSR layout `seq_offsets[B + 1]` (last entry `T`), the critic's `values[T]` (required by
/// `care_gae`; `(NULL, 0)` for `care_discounted_returns`, which does not read them) and an
/// optional `mask[T]` (`(NULL, 0)`: every token counts; non-zero = counted).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_token_rewards {
    /// `sizeof(care_token_rewards)`.
    pub struct_size: u32,
    /// One reward per token (an outcome reward sits on the last counted token).
    pub token_rewards: *const f32,
    /// Number of tokens `T`.
    pub token_rewards_len: usize,
    /// The critic's value per token, or NULL.
    pub values: *const f32,
    /// 0 or `T`.
    pub values_len: usize,
    /// CSR sequence offsets.
    pub seq_offsets: *const u32,
    /// `B + 1`.
    pub seq_offsets_len: usize,
    /// Optional token mask.
    pub mask: *const u8,
    /// 0 or `T`.
    pub mask_len: usize,
}

fn gae_to_c(o: &GaeOptions) -> care_gae_options {
    care_gae_options {
        struct_size: size_of::<care_gae_options>() as u32,
        gamma: o.gamma,
        lambda: o.lambda,
        masked_token: o.masked_token as u32,
    }
}

fn whiten_to_c(o: &WhitenOptions) -> care_whiten_options {
    care_whiten_options {
        struct_size: size_of::<care_whiten_options>() as u32,
        std_kind: o.std_kind as u32,
        eps: o.eps,
        count_eps: o.count_eps,
    }
}

/// The caller's GAE options (NULL: the defaults), checked by the core.
///
/// # Safety
/// As for [`args::options`].
unsafe fn read_gae_options(p: *const care_gae_options) -> Result<GaeOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, gae_to_c(&GaeOptions::default())) }?;
    let o = GaeOptions {
        gamma: c.gamma,
        lambda: c.lambda,
        masked_token: args::enum_arg(
            "care_gae_options.masked_token",
            c.masked_token,
            &MaskedToken::ALL,
        )?,
    };
    args::option_check("care_gae_options", o.check())?;
    Ok(o)
}

/// The caller's whitening options (NULL: the defaults), checked by the core.
///
/// # Safety
/// As for [`args::options`].
unsafe fn read_whiten_options(p: *const care_whiten_options) -> Result<WhitenOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, whiten_to_c(&WhitenOptions::default())) }?;
    let o = WhitenOptions {
        eps: c.eps,
        std_kind: args::enum_arg("care_whiten_options.std_kind", c.std_kind, &StdKind::ALL)?,
        count_eps: c.count_eps,
    };
    args::option_check("care_whiten_options", o.check())?;
    Ok(o)
}

/// The slices of a `care_token_rewards` (values optional here).
struct Tokens<'a> {
    rewards: &'a [f32],
    values: Option<&'a [f32]>,
    offsets: &'a [u32],
    mask: Option<&'a [u8]>,
}

/// # Safety
/// As for [`args::input`], and the pointers inside as for [`args::slice`].
unsafe fn read_tokens<'a>(p: *const care_token_rewards) -> Result<Tokens<'a>, care_result> {
    // SAFETY (all blocks): forwarded contract.
    let c = unsafe { args::input(p) }?;
    Ok(Tokens {
        rewards: unsafe { args::slice(c.token_rewards, c.token_rewards_len) }?,
        values: unsafe { args::opt_slice(c.values, c.values_len) }?,
        offsets: unsafe { args::slice(c.seq_offsets, c.seq_offsets_len) }?,
        mask: unsafe { args::opt_slice(c.mask, c.mask_len) }?,
    })
}

/// Describes the fault behind a `CARE_ERR_LENGTH_MISMATCH` or `CARE_ERR_INVALID_LAYOUT` of the
/// token rewards `t` and the outputs `outs` (each one per token); other codes are returned
/// untouched. Returns `code`.
fn explain_tokens(code: care_result, t: &Tokens<'_>, outs: &[(&str, usize)]) -> care_result {
    let set = crate::detail::set_if_empty;
    let n = t.rewards.len();
    let base = "care_token_rewards.token_rewards_len";
    if code == care_result::CARE_ERR_INVALID_LAYOUT {
        if let Some(f) = care_core::grpo::offsets_fault(t.offsets, n) {
            set(format_args!(
                "{}",
                f.named(
                    "care_token_rewards.seq_offsets",
                    "care_token_rewards.token_rewards"
                )
            ));
        }
    } else if code == care_result::CARE_ERR_LENGTH_MISMATCH {
        let arrays = [
            ("care_token_rewards.values_len", t.values.map(<[f32]>::len)),
            ("care_token_rewards.mask_len", t.mask.map(<[u8]>::len)),
        ];
        let first = arrays
            .into_iter()
            .filter_map(|(name, len)| len.map(|l| (name, l)))
            .chain(outs.iter().copied())
            .find(|&(_, len)| len != n);
        if let Some((name, len)) = first {
            set(format_args!(
                "{name} is {len} but {base} is {n}; every per-token array has one entry per token"
            ));
        }
    }
    code
}

/// Writes the default GAE options (`gamma = lambda = 1`, verl's for LLM training) into
/// `*options_out`, with `struct_size` set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gae_options_default(
    options_out: *mut care_gae_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(gae_to_c(&GaeOptions::default())) };
        care_result::CARE_OK
    }
}

/// Writes the default whitening options (unbiased variance, `eps = 1e-8`: verl's
/// `masked_whiten`) into `*options_out`, with `struct_size` set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_whiten_options_default(
    options_out: *mut care_whiten_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(whiten_to_c(&WhitenOptions::default())) };
        care_result::CARE_OK
    }
}

/// Discounted returns `G_t = r_t + gamma * G_next` over each sequence's counted tokens into
/// `returns_out[returns_len]` (`returns_len == T`; masked tokens get 0). `inputs->values` must
/// be `(NULL, 0)` (not read; `CARE_ERR_INVALID_ARGUMENT` otherwise, so that a caller who meant
/// `care_gae` is told). `options` NULL: the defaults (only `gamma` is read).
///
/// ```c
/// care_token_rewards in = {sizeof in, rewards, T, NULL, 0, offs, B + 1, mask, T};
/// float ret[T];
/// care_result r = care_discounted_returns(&in, NULL, ret, T);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_discounted_returns(
    inputs: *const care_token_rewards,
    options: *const care_gae_options,
    returns_out: *mut f32,
    returns_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let t = tri!(unsafe { read_tokens(inputs) });
        if t.values.is_some() {
            return crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!(
                    "care_token_rewards.values is set; care_discounted_returns reads no values \
                     (pass (NULL, 0), or call care_gae)"
                ),
            );
        }
        let opts = tri!(unsafe { read_gae_options(options) });
        let out = tri!(unsafe { args::slice_mut(returns_out, returns_len) });
        match care_core::grpo::discounted_returns(t.rewards, t.offsets, t.mask, &opts, out) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => explain_tokens(map_error(e), &t, &[("returns_len", returns_len)]),
        }
    }
}

/// Generalized advantage estimation as a reverse scan per sequence (SPEC §18): the advantages
/// into `advantages_out[advantages_len]` and the returns `A_t + V_t` (the value targets) into
/// `returns_out[returns_len]` (both `T`; masked tokens get 0). `inputs->values` is required.
/// Not whitened: call `care_whiten` on the advantages for verl's `gae`. `options` NULL: the
/// defaults.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gae(
    inputs: *const care_token_rewards,
    options: *const care_gae_options,
    advantages_out: *mut f32,
    advantages_len: usize,
    returns_out: *mut f32,
    returns_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let t = tri!(unsafe { read_tokens(inputs) });
        let values = tri!(t.values.ok_or_else(|| crate::detail::fail(
            care_result::CARE_ERR_NULL_POINTER,
            format_args!("care_token_rewards.values is NULL; care_gae needs the values V_t")
        )));
        let opts = tri!(unsafe { read_gae_options(options) });
        let adv = tri!(unsafe { args::slice_mut(advantages_out, advantages_len) });
        let ret = tri!(unsafe { args::slice_mut(returns_out, returns_len) });
        let outs = [("advantages_len", advantages_len), ("returns_len", returns_len)];
        match care_core::grpo::gae(t.rewards, values, t.offsets, t.mask, &opts, adv, ret) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => explain_tokens(map_error(e), &t, &outs),
        }
    }
}

/// Discounted returns and their whitening in one call, every intermediate in double (the
/// returns are never rounded to float before they are whitened): the returns into
/// `returns_out[returns_len]`, the whitened returns into `advantages_out[advantages_len]` (both
/// `T`; masked tokens get 0), their mean and std into `mean_out`, `std_out` (optional). verl's
/// `reinforce_plus_plus`. `inputs->values` must be `(NULL, 0)`. `gae_options`,
/// `whiten_options` NULL: the defaults. Errors as `care_discounted_returns`, and
/// `CARE_ERR_NON_FINITE` (nothing written) when a return is not finite.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub unsafe extern "C" fn care_discounted_returns_whitened(
    inputs: *const care_token_rewards,
    gae_options: *const care_gae_options,
    whiten_options: *const care_whiten_options,
    advantages_out: *mut f32,
    advantages_len: usize,
    returns_out: *mut f32,
    returns_len: usize,
    mean_out: *mut f64,
    std_out: *mut f64,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let t = tri!(unsafe { read_tokens(inputs) });
        if t.values.is_some() {
            return crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!(
                    "care_token_rewards.values is set; care_discounted_returns_whitened reads no \
                     values (pass (NULL, 0), or call care_gae_whitened)"
                ),
            );
        }
        let opts = tri!(unsafe { read_gae_options(gae_options) });
        let w = tri!(unsafe { read_whiten_options(whiten_options) });
        let mean_out = tri!(Out::optional(mean_out));
        let std_out = tri!(Out::optional(std_out));
        let adv = tri!(unsafe { args::slice_mut(advantages_out, advantages_len) });
        let ret = tri!(unsafe { args::slice_mut(returns_out, returns_len) });
        let outs = [("advantages_len", advantages_len), ("returns_len", returns_len)];
        let r = care_core::grpo::discounted_returns_whitened(
            t.rewards, t.offsets, t.mask, &opts, &w, adv, ret,
        );
        let (mean, std) = tri!(r.map_err(|e| explain_tokens(map_error(e), &t, &outs)));
        if let Some(o) = mean_out {
            unsafe { o.write(mean) };
        }
        if let Some(o) = std_out {
            unsafe { o.write(std) };
        }
        care_result::CARE_OK
    }
}

/// GAE with its advantages whitened in one call, every intermediate in double: as `care_gae`,
/// with `advantages_out` whitened over the counted tokens (verl's `gae`; the returns are not
/// whitened) and the advantages' mean and std before whitening into `mean_out`, `std_out`
/// (optional). Errors as `care_gae`, and `CARE_ERR_NON_FINITE` (nothing written).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub unsafe extern "C" fn care_gae_whitened(
    inputs: *const care_token_rewards,
    gae_options: *const care_gae_options,
    whiten_options: *const care_whiten_options,
    advantages_out: *mut f32,
    advantages_len: usize,
    returns_out: *mut f32,
    returns_len: usize,
    mean_out: *mut f64,
    std_out: *mut f64,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let t = tri!(unsafe { read_tokens(inputs) });
        let values = tri!(t.values.ok_or_else(|| crate::detail::fail(
            care_result::CARE_ERR_NULL_POINTER,
            format_args!("care_token_rewards.values is NULL; care_gae_whitened needs the values V_t")
        )));
        let opts = tri!(unsafe { read_gae_options(gae_options) });
        let w = tri!(unsafe { read_whiten_options(whiten_options) });
        let mean_out = tri!(Out::optional(mean_out));
        let std_out = tri!(Out::optional(std_out));
        let adv = tri!(unsafe { args::slice_mut(advantages_out, advantages_len) });
        let ret = tri!(unsafe { args::slice_mut(returns_out, returns_len) });
        let outs = [("advantages_len", advantages_len), ("returns_len", returns_len)];
        let r = care_core::grpo::gae_whitened(
            t.rewards, values, t.offsets, t.mask, &opts, &w, adv, ret,
        );
        let (mean, std) = tri!(r.map_err(|e| explain_tokens(map_error(e), &t, &outs)));
        if let Some(o) = mean_out {
            unsafe { o.write(mean) };
        }
        if let Some(o) = std_out {
            unsafe { o.write(std) };
        }
        care_result::CARE_OK
    }
}

/// Whitens `values[values_len]` in place over the counted tokens: `(x - mean) / sqrt(var +
/// eps)`, two-pass centered variance in double; masked values become 0. `mask` optional
/// (`(NULL, 0)`: all count; else `mask_len == values_len`). `mean_out`, `std_out` optional
/// (NULL to skip). `options` NULL: the defaults. Errors: `CARE_ERR_NON_FINITE` when a counted
/// value is not finite (the values are left as they were).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_whiten(
    values: *mut f32,
    values_len: usize,
    mask: *const u8,
    mask_len: usize,
    options: *const care_whiten_options,
    mean_out: *mut f64,
    std_out: *mut f64,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let mask = tri!(unsafe { args::opt_slice(mask, mask_len) });
        let opts = tri!(unsafe { read_whiten_options(options) });
        let mean_out = tri!(Out::optional(mean_out));
        let std_out = tri!(Out::optional(std_out));
        let v = tri!(unsafe { args::slice_mut(values, values_len) });
        let (mean, std) = tri!(care_core::grpo::whiten(v, mask, &opts).map_err(|e| {
            match mask.filter(|m| m.len() != values_len) {
                Some(m) => args::mismatch("mask_len", m.len(), "values_len", values_len),
                None => map_error(e),
            }
        }));
        if let Some(o) = mean_out {
            unsafe { o.write(mean) };
        }
        if let Some(o) = std_out {
            unsafe { o.write(std) };
        }
        care_result::CARE_OK
    }
}

// ---- on the GPU -------------------------------------------------------------------------------

/// The device addresses of a `care_token_rewards` whose pointers are device memory: the token
/// rewards, values (`gae`: required; otherwise they must be `(NULL, 0)`), offsets and mask,
/// and `T`. The offsets' contents cannot be read here: the kernels report a malformed layout
/// in the status word (`care_gpu_gae_status`).
///
/// # Safety
/// As for [`args::input`] (the struct itself is host memory).
unsafe fn device_tokens(
    p: *const care_token_rewards,
    gae: bool,
) -> Result<(care_kernels::TokenBuffers, usize), care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::input(p) }?;
    let n = c.token_rewards_len;
    let base = "care_token_rewards.token_rewards_len";
    let per_token = |len: usize, what: &str, r: Result<u64, care_result>| {
        r.map_err(|e| {
            if e == care_result::CARE_ERR_LENGTH_MISMATCH {
                args::mismatch(what, len, base, n)
            } else {
                e
            }
        })
    };
    let rewards = dev(c.token_rewards, n, n, true)?;
    let values = if gae {
        if c.values.is_null() {
            return Err(crate::detail::fail(
                care_result::CARE_ERR_NULL_POINTER,
                format_args!(
                    "care_token_rewards.values is NULL; GAE (care_gpu_gae, \
                     care_gpu_gae_whitened) needs the values V_t"
                ),
            ));
        }
        let r = dev(c.values, c.values_len, n, true);
        per_token(c.values_len, "care_token_rewards.values_len", r)?
    } else {
        if !c.values.is_null() || c.values_len != 0 {
            return Err(crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!(
                    "care_token_rewards.values is set; the discounted returns read no values \
                     (pass (NULL, 0), or call care_gpu_gae or care_gpu_gae_whitened)"
                ),
            ));
        }
        0
    };
    let Some(n_seq) = c.seq_offsets_len.checked_sub(1) else {
        return Err(crate::detail::fail(
            care_result::CARE_ERR_INVALID_LAYOUT,
            format_args!(
                "care_token_rewards.seq_offsets_len is 0; the offsets need B + 1 entries, [0] \
                 for no sequences"
            ),
        ));
    };
    if n_seq == 0 && n != 0 {
        return Err(crate::detail::fail(
            care_result::CARE_ERR_INVALID_LAYOUT,
            format_args!(
                "care_token_rewards.seq_offsets has no sequence but {base} is {n}; the last \
                 offset must be T"
            ),
        ));
    }
    let seq_offsets = dev(c.seq_offsets, c.seq_offsets_len, c.seq_offsets_len, true)?;
    let r = dev(c.mask, c.mask_len, n, false);
    let mask = per_token(c.mask_len, "care_token_rewards.mask_len", r)?;
    let too_big = |what: &str, v: usize| {
        crate::detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!("{what} is {v}; the GPU kernels take at most 2^32 - 1"),
        )
    };
    let n_tok = u32::try_from(n).map_err(|_| too_big(base, n))?;
    let n_seq = u32::try_from(n_seq)
        .map_err(|_| too_big("care_token_rewards.seq_offsets_len - 1", n_seq))?;
    let buf = care_kernels::TokenBuffers {
        rewards,
        values,
        seq_offsets,
        n_seq,
        n_tok,
        mask,
        workspace: 0,
    };
    Ok((buf, n))
}

/// A device output of one entry per token: required (NULL only for `T = 0`), `len == T`.
fn device_output(p: *mut f32, len: usize, what: &str, n: usize) -> Result<u64, care_result> {
    dev(p.cast_const(), len, n, true).map_err(|e| {
        if e == care_result::CARE_ERR_LENGTH_MISMATCH {
            args::mismatch(what, len, "care_token_rewards.token_rewards_len", n)
        } else {
            e
        }
    })
}

/// Discounted returns on the GPU, asynchronously on `launch->stream`: as
/// `care_discounted_returns` (same structs; `inputs` pointers and `d_returns[returns_len]`
/// are device memory), bit-identical to it. The offsets live in device memory, so a malformed
/// layout is found by the kernel: `care_gpu_gae_status` reports it (`CARE_ERR_INVALID_LAYOUT`;
/// the outputs are then unspecified, and no access leaves the buffers).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_discounted_returns(
    inputs: *const care_token_rewards,
    options: *const care_gae_options,
    d_returns: *mut f32,
    returns_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (mut buf, n) = tri!(unsafe { device_tokens(inputs, false) });
        let opts = tri!(unsafe { read_gae_options(options) });
        let ret = tri!(device_output(d_returns, returns_len, "returns_len", n));
        let l = tri!(unsafe { read_launch(launch, true) });
        buf.workspace = l.workspace;
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        let run = unsafe {
            care_kernels::discounted_returns(&b, &buf, ret, &opts, Tuning::default())
        };
        match run {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// GAE on the GPU, asynchronously on `launch->stream`: as `care_gae` (same structs; device
/// memory), bit-identical to it: advantages into `d_advantages[advantages_len]`, returns
/// `A_t + V_t` into `d_returns[returns_len]`. A malformed offsets layout is reported by
/// `care_gpu_gae_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_gae(
    inputs: *const care_token_rewards,
    options: *const care_gae_options,
    d_advantages: *mut f32,
    advantages_len: usize,
    d_returns: *mut f32,
    returns_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (mut buf, n) = tri!(unsafe { device_tokens(inputs, true) });
        let opts = tri!(unsafe { read_gae_options(options) });
        let adv = tri!(device_output(d_advantages, advantages_len, "advantages_len", n));
        let ret = tri!(device_output(d_returns, returns_len, "returns_len", n));
        let l = tri!(unsafe { read_launch(launch, true) });
        buf.workspace = l.workspace;
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        let run = unsafe { care_kernels::gae(&b, &buf, adv, ret, &opts, Tuning::default()) };
        match run {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// Synchronizes `launch->stream` and reads the status that `care_gpu_discounted_returns` or
/// `care_gpu_gae` left in `launch->workspace`: `CARE_OK`, or `CARE_ERR_INVALID_LAYOUT` when the
/// sequence offsets were not a CSR layout of the tokens (the CPU entry points refuse such a
/// call before writing; here the outputs are unspecified).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_gae_status(launch: *const care_gpu_launch) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let word = tri!(unsafe { crate::gpu::read_status(launch) });
        match care_kernels::tokens_status(word) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => crate::detail::fail(
                map_error(e),
                format_args!(
                    "care_token_rewards.seq_offsets is not a CSR layout of the tokens: it must \
                     start at 0, never decrease and end at T"
                ),
            ),
        }
    }
}

/// Whitening on the GPU, in place on the device values `d_values[values_len]`, asynchronously
/// on `launch->stream`: as `care_whiten` (`d_mask` optional, `(NULL, 0)`: all count) within
/// the documented tolerance, deterministic (no float atomics). The mean and std, and the
/// `CARE_ERR_NON_FINITE` of a non-finite counted value (the values are then left as they were),
/// are read back by `care_gpu_whiten_status` from `launch->workspace`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_whiten(
    d_values: *mut f32,
    values_len: usize,
    d_mask: *const u8,
    mask_len: usize,
    options: *const care_whiten_options,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let values = tri!(dev(d_values.cast_const(), values_len, values_len, true));
        let mask = tri!(dev(d_mask, mask_len, values_len, false).map_err(|e| {
            if e == care_result::CARE_ERR_LENGTH_MISMATCH {
                args::mismatch("mask_len", mask_len, "values_len", values_len)
            } else {
                e
            }
        }));
        let opts = tri!(unsafe { read_whiten_options(options) });
        let l = tri!(unsafe { read_launch(launch, true) });
        let buf = care_kernels::WhitenBuffers {
            values,
            mask,
            n: values_len as u64,
            workspace: l.workspace,
        };
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        let run = unsafe { care_kernels::whiten(&b, &buf, &opts, Tuning::default()) };
        match run {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// Synchronizes `launch->stream` and reads what `care_gpu_whiten` left in `launch->workspace`:
/// `CARE_OK` with the mean and std of the counted values into `*mean_out` and `*std_out`
/// (each optional: NULL to skip; written only on success), or `CARE_ERR_NON_FINITE` when a
/// counted value was not finite (the values were not changed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_whiten_status(
    launch: *const care_gpu_launch,
    mean_out: *mut f64,
    std_out: *mut f64,
) -> care_result {
    ffi_panic_boundary! {
        let mean_out = tri!(Out::optional(mean_out));
        let std_out = tri!(Out::optional(std_out));
        // SAFETY (all blocks): forwarded contract.
        let l = tri!(unsafe { read_launch(launch, true) });
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        tri!(b.synchronize().map_err(driver_code));
        let mut raw = WhitenStatsRaw::default();
        // SAFETY: the stream is idle (synchronized); the workspace holds at least
        // CARE_GPU_WORKSPACE_BYTES >= size_of::<WhitenStatsRaw>() bytes.
        tri!(unsafe { cu::memcpy_dtoh_sync(bytemuck::bytes_of_mut(&mut raw), l.workspace) }
            .map_err(driver_code));
        let (mean, std) = tri!(care_kernels::whiten_result(&raw).map_err(|e| {
            crate::detail::fail(
                map_error(e),
                format_args!("a counted value passed to care_gpu_whiten is NaN or infinite"),
            )
        }));
        if let Some(o) = mean_out {
            unsafe { o.write(mean) };
        }
        if let Some(o) = std_out {
            unsafe { o.write(std) };
        }
        care_result::CARE_OK
    }
}

// ---- the f64 chains on the GPU ----------------------------------------------------------------

/// The bytes of workspace `care_gpu_discounted_returns_whitened` and `care_gpu_gae_whitened`
/// need for `n_tokens` tokens, into `*out_bytes`: `CARE_GPU_WORKSPACE_BYTES` plus 8 bytes per
/// token (the unrounded values between the scan and the whitening) and 64. `n_tokens` above
/// `UINT32_MAX` is `CARE_ERR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_whitened_workspace_bytes(
    n_tokens: usize,
    out_bytes: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(out_bytes));
        let Ok(n) = u32::try_from(n_tokens) else {
            return crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!("n_tokens is {n_tokens}; the kernels index tokens with 32 bits"),
            );
        };
        // SAFETY: `out_bytes` is valid for a write (contract; NULL and alignment checked).
        unsafe { out.write(care_kernels::whitened_workspace_bytes(n)) };
        care_result::CARE_OK
    }
}

/// The body of the two chained GPU entry points: every argument checked, then the launches.
///
/// # Safety
/// As for [`args::input`] on the structs; the pointers inside and the outputs are device memory
/// of the lengths they state.
#[allow(clippy::too_many_arguments)] // one argument per buffer
unsafe fn whitened_on(
    inputs: *const care_token_rewards,
    gae_options: *const care_gae_options,
    whiten_options: *const care_whiten_options,
    d_advantages: *mut f32,
    advantages_len: usize,
    d_returns: *mut f32,
    returns_len: usize,
    launch: *const care_gpu_launch,
    is_gae: bool,
) -> care_result {
    // SAFETY (all blocks): forwarded contract.
    let (mut buf, n) = tri!(unsafe { device_tokens(inputs, is_gae) });
    let opts = tri!(unsafe { read_gae_options(gae_options) });
    let w = tri!(unsafe { read_whiten_options(whiten_options) });
    let adv = tri!(device_output(
        d_advantages,
        advantages_len,
        "advantages_len",
        n
    ));
    let ret = tri!(device_output(d_returns, returns_len, "returns_len", n));
    if is_gae && opts.masked_token != MaskedToken::Skip {
        return crate::detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!(
                "care_gae_options.masked_token is CARE_MASKED_TOKEN_RESET; GAE skips masked \
                 tokens (no version of verl's GAE resets there)"
            ),
        );
    }
    let l = tri!(unsafe { read_launch(launch, true) });
    let need = care_kernels::whitened_workspace_bytes(buf.n_tok);
    if l.workspace_len < need {
        return crate::detail::fail(
            care_result::CARE_ERR_BUFFER_TOO_SMALL,
            format_args!(
                "care_gpu_launch.workspace_len is {} but the chain needs {need} bytes for {n} \
                 tokens (8 per token for the unrounded values); size the workspace with \
                 care_gpu_whitened_workspace_bytes",
                l.workspace_len
            ),
        );
    }
    buf.workspace = l.workspace;
    let out = care_kernels::WhitenedOutputs {
        advantages: adv,
        returns: ret,
        workspace_len: l.workspace_len,
    };
    let b = tri!(unsafe { backend(l.stream, l.workspace) });
    let t = Tuning::default();
    // SAFETY: every address is caller device memory of the documented, cross-checked size; the
    // workspace holds `need` bytes.
    let run = unsafe {
        if is_gae {
            care_kernels::gae_whitened(&b, &buf, &out, &opts, &w, t)
        } else {
            care_kernels::discounted_returns_whitened(&b, &buf, &out, &opts, &w, t)
        }
    };
    match run {
        Ok(()) => care_result::CARE_OK,
        Err(e) => kernel_code(e),
    }
}

/// `care_discounted_returns_whitened` on the GPU, asynchronously on `launch->stream`: the same
/// structs (the `inputs` pointers and both outputs device memory), every intermediate in double
/// (the scan leaves the unrounded returns in the workspace, which the whitening reads): the
/// returns bit-identical to the CPU's, the whitened returns within the documented tolerance.
/// The workspace is `care_gpu_whitened_workspace_bytes(T)` (shorter:
/// `CARE_ERR_BUFFER_TOO_SMALL`). What the CPU function refuses before writing is found by the
/// kernels: `care_gpu_whitened_status` reports a malformed layout (`CARE_ERR_INVALID_LAYOUT`;
/// outputs unspecified) or a non-finite return (`CARE_ERR_NON_FINITE`; the advantages are left
/// as they were, the returns are written), and otherwise gives the mean and std.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub unsafe extern "C" fn care_gpu_discounted_returns_whitened(
    inputs: *const care_token_rewards,
    gae_options: *const care_gae_options,
    whiten_options: *const care_whiten_options,
    d_advantages: *mut f32,
    advantages_len: usize,
    d_returns: *mut f32,
    returns_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract of the entry point.
        unsafe {
            whitened_on(inputs, gae_options, whiten_options, d_advantages, advantages_len,
                        d_returns, returns_len, launch, false)
        }
    }
}

/// `care_gae_whitened` on the GPU, asynchronously on `launch->stream`: GAE's returns `A + V`
/// into `d_returns` (bit-identical to the CPU's), its advantages whitened in double into
/// `d_advantages` (within the documented tolerance). Workspace and status as
/// `care_gpu_discounted_returns_whitened`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub unsafe extern "C" fn care_gpu_gae_whitened(
    inputs: *const care_token_rewards,
    gae_options: *const care_gae_options,
    whiten_options: *const care_whiten_options,
    d_advantages: *mut f32,
    advantages_len: usize,
    d_returns: *mut f32,
    returns_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract of the entry point.
        unsafe {
            whitened_on(inputs, gae_options, whiten_options, d_advantages, advantages_len,
                        d_returns, returns_len, launch, true)
        }
    }
}

/// Synchronizes `launch->stream` and reads what `care_gpu_discounted_returns_whitened` or
/// `care_gpu_gae_whitened` left in `launch->workspace`: `CARE_OK` with the mean and std of the
/// unrounded values before whitening into `*mean_out` and `*std_out` (each optional; written
/// only on success), `CARE_ERR_INVALID_LAYOUT` when the sequence offsets were not a CSR layout,
/// else `CARE_ERR_NON_FINITE` when a counted value was not finite, as the CPU functions refuse
/// those calls.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_whitened_status(
    launch: *const care_gpu_launch,
    mean_out: *mut f64,
    std_out: *mut f64,
) -> care_result {
    ffi_panic_boundary! {
        let mean_out = tri!(Out::optional(mean_out));
        let std_out = tri!(Out::optional(std_out));
        // SAFETY (all blocks): forwarded contract.
        let l = tri!(unsafe { read_launch(launch, true) });
        if l.workspace_len < care_kernels::WHITENED_STATUS_OFFSET + 4 {
            return care_result::CARE_ERR_BUFFER_TOO_SMALL; // unreachable: read_launch checks more
        }
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        tri!(b.synchronize().map_err(driver_code));
        let mut raw = WhitenStatsRaw::default();
        let mut word = [0u8; 4];
        // SAFETY: the stream is idle (synchronized); the workspace holds at least
        // CARE_GPU_WORKSPACE_BYTES, past the WhitenStatsRaw and the status word.
        tri!(unsafe { cu::memcpy_dtoh_sync(bytemuck::bytes_of_mut(&mut raw), l.workspace) }
            .map_err(driver_code));
        let at = l.workspace + care_kernels::WHITENED_STATUS_OFFSET as u64;
        tri!(unsafe { cu::memcpy_dtoh_sync(&mut word, at) }.map_err(driver_code));
        let r = care_kernels::whitened_result(&raw, u32::from_ne_bytes(word));
        let (mean, std) = tri!(r.map_err(|e| {
            let why = if e == care_core::Error::InvalidLayout {
                "care_token_rewards.seq_offsets is not a CSR layout of the tokens: it must start \
                 at 0, never decrease and end at T"
            } else {
                "a counted return or advantage is NaN or infinite; the advantages were not written"
            };
            crate::detail::fail(map_error(e), format_args!("{why}"))
        }));
        if let Some(o) = mean_out {
            unsafe { o.write(mean) };
        }
        if let Some(o) = std_out {
            unsafe { o.write(std) };
        }
        care_result::CARE_OK
    }
}
