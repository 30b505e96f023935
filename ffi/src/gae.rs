//! The token-level estimators (SPEC §18): discounted returns, GAE over token rewards and
//! values, and whitening, on the CPU.

use core::mem::size_of;

use care_core::grpo::{GaeOptions, StdKind, WhitenOptions};

use crate::args::{self, Out};
use crate::result::{care_result, map_error};

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
    }
}

fn whiten_to_c(o: &WhitenOptions) -> care_whiten_options {
    care_whiten_options {
        struct_size: size_of::<care_whiten_options>() as u32,
        std_kind: o.std_kind as u32,
        eps: o.eps,
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
