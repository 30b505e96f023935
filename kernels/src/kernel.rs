//! The kernel registry: every PTX module, every entry point, and the argument list each entry's
//! launcher passes, declared once in the `registry!` table below.
//!
//! From that table come [`Module`] (one per `.cu` file, with its checked-in PTX), [`Kernel`]
//! (one per `extern "C"` entry, named `op_dtype`), [`Kernel::params`] (the size and alignment of
//! each by-value parameter) and one typed [`Entry`] constant per kernel in [`entry`]. The launch
//! plans can only launch through an [`Entry`], whose type fixes the argument tuple; so the list
//! that `tests/registry.rs` compares with every `.entry` of `kernels/ptx/*.ptx` is the list the
//! launchers really pass.

use core::ffi::c_void;
use core::marker::PhantomData;

use care_core::Dtype;

use crate::params::{
    AdvParams, BatchStdParams, LogSoftmaxParams, LossParams, ReturnsParams, WhitenParams,
};

/// Size and alignment in bytes of one by-value kernel parameter: what a PTX `.param`
/// declares (`.param .align 8 .b8 name[136]`, `.param .u64 name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamLayout {
    /// `size_of` the argument.
    pub size: usize,
    /// `align_of` the argument.
    pub align: usize,
}

impl ParamLayout {
    /// The layout of `T`.
    pub const fn of<T>() -> ParamLayout {
        ParamLayout {
            size: size_of::<T>(),
            align: align_of::<T>(),
        }
    }
}

/// An entry's `__launch_bounds__(threads, min_blocks)`: the block size of its launch plan (no
/// launch uses more threads per block) and the blocks per SM its registers must allow, so that
/// `ptxas` (or the driver's JIT of the `compute_80` PTX) caps each thread at
/// `65536 / (threads * min_blocks)` registers instead of silently dropping occupancy.
/// `kernels/tests/registry.rs` checks both against the PTX's `.maxntid` and `.minnctapersm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchBounds {
    /// Threads per block of the plan's launches, at most.
    pub threads: u32,
    /// Blocks per SM the register budget allows.
    pub min_blocks: u32,
}

impl LaunchBounds {
    /// Registers per thread the bounds allow on an SM of 65,536 registers (allocated in
    /// multiples of 8).
    pub const fn register_budget(self) -> u32 {
        let r = 65536 / (self.threads * self.min_blocks);
        let r = if r > 255 { 255 } else { r };
        r / 8 * 8
    }
}

/// How an entry touches memory, which decides the static checks its PTX must pass
/// (`kernels/tests/registry.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Streams rows of logits or a long array: 128-bit global loads (`ld.global.v4`) on the hot
    /// path, the hardware `cvt.f32.f16` (never the software widening), no global atomics but
    /// the status word's `or` and the slot merge's ticket.
    Stream,
    /// Walks token or sample arrays element by element (coalesced scalar loads): no float
    /// atomics.
    Elementwise,
    /// A small pre-pass or one block: no checks beyond the launch bounds.
    Small,
}

/// A type the launchers pass by value as one kernel parameter.
///
/// # Safety
/// `Self` has the layout and meaning of the C parameter it stands for: a `#[repr(C)]` mirror
/// of a parameter struct (checked against the C compiler by the emulator's layout tests), or
/// `u64` for a device pointer.
pub unsafe trait Param: Copy {}

// SAFETY (all four): `#[repr(C)]` mirrors of `CareAdvParams`, `CareBatchStdParams`,
// `CareLossParams` and `CareLsmParams`, with the C layout (kernels/emu/tests/layout.rs).
unsafe impl Param for AdvParams {}
// SAFETY: see above.
unsafe impl Param for BatchStdParams {}
// SAFETY: see above.
unsafe impl Param for LossParams {}
// SAFETY: see above.
unsafe impl Param for LogSoftmaxParams {}
// SAFETY (both): `#[repr(C)]` mirrors of `CareReturnsParams` and `CareWhitenParams`, with the C
// layout (kernels/emu/tests/layout.rs).
unsafe impl Param for ReturnsParams {}
// SAFETY: see above.
unsafe impl Param for WhitenParams {}
// SAFETY: a device address is a 64-bit pointer on every CUDA target.
unsafe impl Param for u64 {}

/// The argument list of a kernel: a tuple of [`Param`]s in parameter order.
pub trait KernelArgs {
    /// Size and alignment of each parameter, in order.
    const LAYOUT: &'static [ParamLayout];

    /// Calls `f` with one pointer per argument, pointing at the argument's bytes (the
    /// `kernelParams` of `cuLaunchKernel`); the pointers are valid during the call.
    fn with_pointers<R>(&mut self, f: impl FnOnce(&[*mut c_void]) -> R) -> R;
}

impl<A: Param> KernelArgs for (A,) {
    const LAYOUT: &'static [ParamLayout] = &[ParamLayout::of::<A>()];

    fn with_pointers<R>(&mut self, f: impl FnOnce(&[*mut c_void]) -> R) -> R {
        f(&[(&raw mut self.0).cast()])
    }
}

impl<A: Param, B: Param> KernelArgs for (A, B) {
    const LAYOUT: &'static [ParamLayout] = &[ParamLayout::of::<A>(), ParamLayout::of::<B>()];

    fn with_pointers<R>(&mut self, f: impl FnOnce(&[*mut c_void]) -> R) -> R {
        f(&[(&raw mut self.0).cast(), (&raw mut self.1).cast()])
    }
}

/// A kernel and the type of its argument list: the only way the plans launch (see
/// [`crate::plan::Launcher`]). The constants are in [`entry`].
#[derive(Debug)]
pub struct Entry<A> {
    kernel: Kernel,
    args: PhantomData<fn(A)>,
}

impl<A> Clone for Entry<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Entry<A> {}

impl<A: KernelArgs> Entry<A> {
    /// The kernel.
    pub const fn kernel(self) -> Kernel {
        self.kernel
    }
}

/// Declares the registry. One block per module (`Variant "file stem"`), one line per entry
/// point: `Variant CONSTANT "symbol" (argument types...) [threads, min_blocks, Access]`.
macro_rules! registry {
    ($(
        $(#[$mdoc:meta])*
        $module:ident $stem:literal {
            $(
                $(#[$kdoc:meta])*
                $kernel:ident $constant:ident $symbol:literal ($($arg:ty),+)
                    [$threads:literal, $min_blocks:literal, $access:ident];
            )+
        }
    )+) => {
        /// A PTX module: one per `.cu` file in `kernels/cuda/`, generated into `kernels/ptx/`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Module {
            $($(#[$mdoc])* $module,)+
        }

        impl Module {
            /// Every module, in [`Module::index`] order.
            pub const ALL: &'static [Module] = &[$(Module::$module),+];

            /// The file stem: `kernels/cuda/<stem>.cu`, `kernels/ptx/<stem>.ptx`.
            pub const fn stem(self) -> &'static str {
                match self {
                    $(Module::$module => $stem,)+
                }
            }

            /// The checked-in PTX text (NVRTC 12.2, `compute_80`, PTX ISA 8.2), generated by
            /// `scripts/gen-ptx.sh` from `kernels/cuda/` and checked for freshness in CI.
            pub const fn ptx(self) -> &'static str {
                match self {
                    $(Module::$module => include_str!(concat!("../ptx/", $stem, ".ptx")),)+
                }
            }

            /// Position in [`Module::ALL`] (for per-context caches).
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        /// A kernel entry point (`extern "C"`, named `op_dtype`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $($($(#[$kdoc])* $kernel,)+)+
        }

        impl Kernel {
            /// Every kernel, module by module.
            pub const ALL: &'static [Kernel] = &[$($(Kernel::$kernel,)+)+];

            /// The symbol name in the PTX.
            pub const fn name(self) -> &'static str {
                match self {
                    $($(Kernel::$kernel => $symbol,)+)+
                }
            }

            /// The module that holds it.
            pub const fn module(self) -> Module {
                match self {
                    $($(Kernel::$kernel => Module::$module,)+)+
                }
            }

            /// Its `__launch_bounds__`, as in the `.cu` source.
            pub const fn bounds(self) -> LaunchBounds {
                match self {
                    $($(Kernel::$kernel => LaunchBounds {
                        threads: $threads,
                        min_blocks: $min_blocks,
                    },)+)+
                }
            }

            /// How it touches memory (which static checks its PTX must pass).
            pub const fn access(self) -> Access {
                match self {
                    $($(Kernel::$kernel => Access::$access,)+)+
                }
            }

            /// Size and alignment of each by-value parameter its launcher passes, in order: the
            /// [`KernelArgs::LAYOUT`] of its [`Entry`]'s argument tuple.
            pub const fn params(self) -> &'static [ParamLayout] {
                match self {
                    $($(Kernel::$kernel => <($($arg,)+) as KernelArgs>::LAYOUT,)+)+
                }
            }
        }

        /// One typed [`Entry`] per kernel: the kernel and the argument tuple of its launcher.
        pub mod entry {
            use super::*;
            $($(
                $(#[$kdoc])*
                pub const $constant: Entry<($($arg,)+)> = Entry {
                    kernel: Kernel::$kernel,
                    args: PhantomData,
                };
            )+)+
        }
    };
}

registry! {
    /// `advantages.cu`: group advantages and the batch std.
    Advantages "advantages" {
        /// Group advantages, rewards in `f32` (`CareAdvParams`).
        GroupAdvantagesF32 GROUP_ADVANTAGES_F32 "group_advantages_f32" (AdvParams)
            [256, 4, Elementwise];
        /// Batch std of the valid rewards, one block (`CareBatchStdParams`).
        BatchStdF32 BATCH_STD_F32 "batch_std_f32" (BatchStdParams) [256, 4, Small];
        /// The GPG factor `N / (N - M)`, one block (`CareAdvParams`).
        GroupAlphaF32 GROUP_ALPHA_F32 "group_alpha_f32" (AdvParams) [1024, 1, Small];
    }
    /// `grpo_loss.cu`: the fused policy loss, its default denominators and the covariance
    /// selection of Clip-Cov and KL-Cov.
    GrpoLoss "grpo_loss" {
        /// Fused loss, `f32` log-probs (`CareLossParams`).
        GrpoLossF32 GRPO_LOSS_F32 "grpo_loss_f32" (LossParams) [256, 4, Elementwise];
        /// Fused loss, `bf16` log-probs.
        GrpoLossBf16 GRPO_LOSS_BF16 "grpo_loss_bf16" (LossParams) [256, 4, Elementwise];
        /// Fused loss, `f16` log-probs.
        GrpoLossF16 GRPO_LOSS_F16 "grpo_loss_f16" (LossParams) [256, 4, Elementwise];
        /// Default denominators of the loss (`CareLossParams`, `CareLossDenoms*` output).
        GrpoLossDenoms GRPO_LOSS_DENOMS "grpo_loss_denoms" (LossParams, u64)
            [256, 4, Small];
        /// Clip-Cov / KL-Cov: sums of `A` and `logp` over the counted tokens, per block.
        GrpoCovMeans GRPO_COV_MEANS "grpo_cov_means" (LossParams) [256, 4, Small];
        /// Clip-Cov / KL-Cov: each token's covariance candidate key.
        GrpoCovKeys GRPO_COV_KEYS "grpo_cov_keys" (LossParams) [256, 4, Small];
        /// Clip-Cov / KL-Cov: one round of the radix select (`cov_round`).
        GrpoCovRadix GRPO_COV_RADIX "grpo_cov_radix" (LossParams) [256, 4, Small];
        /// Clip-Cov / KL-Cov: the cut of the top-k selection, one block.
        GrpoCovCut GRPO_COV_CUT "grpo_cov_cut" (LossParams) [1024, 1, Small];
        /// Fused logits to token-local loss to dlogits, `f32` logits (`CareLossParams`,
        /// `CareLsmParams`).
        LogitsLossF32 LOGITS_LOSS_F32 "logits_loss_f32" (LossParams, LogSoftmaxParams)
            [1024, 1, Stream];
        /// Fused logits to loss to dlogits, `bf16` logits.
        LogitsLossBf16 LOGITS_LOSS_BF16 "logits_loss_bf16" (LossParams, LogSoftmaxParams)
            [1024, 1, Stream];
        /// Fused logits to loss to dlogits, `f16` logits.
        LogitsLossF16 LOGITS_LOSS_F16 "logits_loss_f16" (LossParams, LogSoftmaxParams)
            [1024, 1, Stream];
    }
    /// `logsoftmax.cu`: the selective log-softmax, forward and backward.
    LogSoftmax "logsoftmax" {
        /// Forward, `f32` logits (`CareLsmParams`).
        LogSoftmaxFwdF32 LOG_SOFTMAX_FWD_F32 "logsoftmax_fwd_f32" (LogSoftmaxParams)
            [256, 6, Stream];
        /// Backward, `f32` logits.
        LogSoftmaxBwdF32 LOG_SOFTMAX_BWD_F32 "logsoftmax_bwd_f32" (LogSoftmaxParams)
            [256, 4, Stream];
        /// Forward, `bf16` logits.
        LogSoftmaxFwdBf16 LOG_SOFTMAX_FWD_BF16 "logsoftmax_fwd_bf16" (LogSoftmaxParams)
            [256, 6, Stream];
        /// Backward, `bf16` logits.
        LogSoftmaxBwdBf16 LOG_SOFTMAX_BWD_BF16 "logsoftmax_bwd_bf16" (LogSoftmaxParams)
            [256, 4, Stream];
        /// Forward, `f16` logits.
        LogSoftmaxFwdF16 LOG_SOFTMAX_FWD_F16 "logsoftmax_fwd_f16" (LogSoftmaxParams)
            [256, 6, Stream];
        /// Backward, `f16` logits.
        LogSoftmaxBwdF16 LOG_SOFTMAX_BWD_F16 "logsoftmax_bwd_f16" (LogSoftmaxParams)
            [256, 4, Stream];
    }
    /// `returns.cu`: the token-level estimators (discounted returns, GAE, whitening).
    Returns "returns" {
        /// Discounted returns, one warp per sequence (`CareReturnsParams`).
        DiscountedReturnsF32 DISCOUNTED_RETURNS_F32 "discounted_returns_f32" (ReturnsParams)
            [64, 16, Small];
        /// GAE advantages and returns, one warp per sequence (`CareReturnsParams`).
        GaeF32 GAE_F32 "gae_f32" (ReturnsParams) [64, 16, Small];
        /// Whitening statistics into the workspace, per-block slots merged by the last block
        /// (`CareWhitenParams`).
        WhitenStatsF32 WHITEN_STATS_F32 "whiten_stats_f32" (WhitenParams) [256, 4, Small];
        /// Whitening in place from those statistics (`CareWhitenParams`).
        WhitenApplyF32 WHITEN_APPLY_F32 "whiten_apply_f32" (WhitenParams) [256, 4, Stream];
        /// Whitening statistics of the double values `wide` (the f64 chain after returns or
        /// GAE).
        WhitenStatsF64 WHITEN_STATS_F64 "whiten_stats_f64" (WhitenParams) [256, 4, Small];
        /// The double values `wide` whitened into the float values `x`.
        WhitenApplyF64 WHITEN_APPLY_F64 "whiten_apply_f64" (WhitenParams) [256, 4, Stream];
    }
}

impl Kernel {
    /// The fused loss kernel for log-probs of `dtype`.
    pub const fn grpo_loss(dtype: Dtype) -> Entry<(LossParams,)> {
        match dtype {
            Dtype::F32 => entry::GRPO_LOSS_F32,
            Dtype::Bf16 => entry::GRPO_LOSS_BF16,
            Dtype::F16 => entry::GRPO_LOSS_F16,
        }
    }

    /// The fused logits-to-loss kernel for logits of `dtype`.
    pub const fn logits_loss(dtype: Dtype) -> Entry<(LossParams, LogSoftmaxParams)> {
        match dtype {
            Dtype::F32 => entry::LOGITS_LOSS_F32,
            Dtype::Bf16 => entry::LOGITS_LOSS_BF16,
            Dtype::F16 => entry::LOGITS_LOSS_F16,
        }
    }

    /// The log-softmax forward kernel for logits of `dtype`.
    pub const fn log_softmax_forward(dtype: Dtype) -> Entry<(LogSoftmaxParams,)> {
        match dtype {
            Dtype::F32 => entry::LOG_SOFTMAX_FWD_F32,
            Dtype::Bf16 => entry::LOG_SOFTMAX_FWD_BF16,
            Dtype::F16 => entry::LOG_SOFTMAX_FWD_F16,
        }
    }

    /// The log-softmax backward kernel for logits of `dtype`.
    pub const fn log_softmax_backward(dtype: Dtype) -> Entry<(LogSoftmaxParams,)> {
        match dtype {
            Dtype::F32 => entry::LOG_SOFTMAX_BWD_F32,
            Dtype::Bf16 => entry::LOG_SOFTMAX_BWD_BF16,
            Dtype::F16 => entry::LOG_SOFTMAX_BWD_F16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_dtype_entries_match_their_dtype() {
        // The module cache keys functions by name across every module: no two may collide.
        for (i, a) in Kernel::ALL.iter().enumerate() {
            assert!(Kernel::ALL[i + 1..].iter().all(|b| a.name() != b.name()));
        }
        for (i, m) in Module::ALL.iter().enumerate() {
            assert_eq!(m.index(), i);
        }
        for d in Dtype::ALL {
            let suffix = format!("_{}", d.name());
            assert_eq!(
                Kernel::grpo_loss(d).kernel().name(),
                format!("grpo_loss{suffix}")
            );
            let f = Kernel::log_softmax_forward(d).kernel().name();
            assert_eq!(f, format!("logsoftmax_fwd{suffix}"));
            let b = Kernel::log_softmax_backward(d).kernel().name();
            assert_eq!(b, format!("logsoftmax_bwd{suffix}"));
            let f = Kernel::logits_loss(d).kernel().name();
            assert_eq!(f, format!("logits_loss{suffix}"));
        }
    }

    #[test]
    fn argument_pointers_point_at_each_argument() {
        let mut args = (LossParams::default(), 0x1234_u64);
        let base = (&raw const args.0).cast::<u8>();
        let out = (&raw const args.1).cast::<u8>();
        args.with_pointers(|p| {
            assert_eq!(p.len(), 2);
            assert_eq!(p[0].cast::<u8>().cast_const(), base);
            assert_eq!(p[1].cast::<u8>().cast_const(), out);
        });
        assert_eq!(
            Kernel::GrpoLossDenoms.params(),
            &[
                ParamLayout::of::<LossParams>(),
                ParamLayout { size: 8, align: 8 }
            ]
        );
    }
}
