//! Test-only host emulation of the `care-kernels` CUDA kernels.
//!
//! `build.rs` compiles the very `kernels/cuda/*.cu` sources as C++ against `csrc/cuda_emu.h`,
//! which runs the threads of each block as cooperative fibers on the calling OS thread and
//! reshuffles their order (from a seed) at every barrier and warp collective. [`Emulator`]
//! implements [`care_kernels::Launcher`] for every kernel of the registry, so the tests run the
//! same launch plans as the GPU, with host addresses in place of device pointers.

use core::ffi::c_void;

use care_kernels::params::{
    AdvParams, BatchStdParams, LogSoftmaxParams, LossDenomsRaw, LossParams, ReturnsParams,
    WhitenParams,
};
use care_kernels::{Geometry, Kernel, Launcher};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Dim3 {
    x: u32,
    y: u32,
    z: u32,
}

impl From<(u32, u32, u32)> for Dim3 {
    fn from(d: (u32, u32, u32)) -> Self {
        Dim3 {
            x: d.0,
            y: d.1,
            z: d.2,
        }
    }
}

unsafe extern "C" {
    fn emu_launch_group_advantages_f32(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const AdvParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_batch_std_f32(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const BatchStdParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_group_alpha_f32(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const AdvParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_grpo_loss_f32(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const LossParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_grpo_loss_bf16(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const LossParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_grpo_loss_f16(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const LossParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_grpo_cov_means(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const LossParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_grpo_cov_keys(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const LossParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_grpo_cov_radix(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const LossParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_grpo_cov_cut(g: Dim3, b: Dim3, sh: usize, p: *const LossParams, seed: u64)
    -> i32;
    fn emu_launch_grpo_loss_denoms(
        g: Dim3,
        b: Dim3,
        sh: usize,
        p: *const LossParams,
        out: *mut LossDenomsRaw,
        seed: u64,
    ) -> i32;
    fn emu_launch_logits_loss_f32(
        g: Dim3,
        b: Dim3,
        p: *const LossParams,
        x: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logits_loss_bf16(
        g: Dim3,
        b: Dim3,
        p: *const LossParams,
        x: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logits_loss_f16(
        g: Dim3,
        b: Dim3,
        p: *const LossParams,
        x: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logsoftmax_fwd_f32(
        g: Dim3,
        b: Dim3,
        p: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logsoftmax_fwd_bf16(
        g: Dim3,
        b: Dim3,
        p: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logsoftmax_fwd_f16(
        g: Dim3,
        b: Dim3,
        p: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logsoftmax_bwd_f32(
        g: Dim3,
        b: Dim3,
        p: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logsoftmax_bwd_bf16(
        g: Dim3,
        b: Dim3,
        p: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_logsoftmax_bwd_f16(
        g: Dim3,
        b: Dim3,
        p: *const LogSoftmaxParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_discounted_returns_f32(
        g: Dim3,
        b: Dim3,
        p: *const ReturnsParams,
        seed: u64,
    ) -> i32;
    fn emu_launch_gae_f32(g: Dim3, b: Dim3, p: *const ReturnsParams, seed: u64) -> i32;
    fn emu_launch_whiten_stats_f32(g: Dim3, b: Dim3, p: *const WhitenParams, seed: u64) -> i32;
    fn emu_launch_whiten_apply_f32(g: Dim3, b: Dim3, p: *const WhitenParams, seed: u64) -> i32;
    fn emu_launch_whiten_stats_f64(g: Dim3, b: Dim3, p: *const WhitenParams, seed: u64) -> i32;
    fn emu_launch_whiten_apply_f64(g: Dim3, b: Dim3, p: *const WhitenParams, seed: u64) -> i32;
    fn emu_layout_returns(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_whiten(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_whiten_stats(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_whiten_work(out: *mut u32, cap: usize) -> usize;
    fn emu_selftest_publish(blocks: u32, threads: u32, sync: i32, out: *mut u32, seed: u64) -> i32;
    fn emu_selftest_divergent_barrier(seed: u64) -> i32;
    fn emu_selftest_block_order(blocks: u32, out: *mut u32, seed: u64) -> i32;
    fn emu_selftest_shuffle_after_exit(out: *mut f32, seed: u64) -> i32;
    fn emu_f16_to_f32(h: u16) -> f32;
    fn emu_bf16_to_f32(h: u16) -> f32;
    fn emu_f32_to_f16(f: f32) -> u16;
    fn emu_f32_to_bf16(f: f32) -> u16;
    fn emu_layout_adv(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_group_stats(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_batch_std(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_loss(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_stats(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_denoms(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_cov_work(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_loss_work(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_batch_std_work(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_rollout_stats(out: *mut u32, cap: usize) -> usize;
    fn emu_layout_lsm(out: *mut u32, cap: usize) -> usize;
}

/// Why an emulated launch failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmuError {
    /// Some threads returned while others wait at `__syncthreads` (code 1).
    BlockBarrier,
    /// A warp collective some lanes can never reach, or lanes waiting at different barriers
    /// (code 2).
    WarpCollective,
    /// A geometry the emulator rejects (code 3).
    Geometry,
    /// A launch whose argument count is not the registry's for the kernel.
    Arguments,
}

fn check(code: i32) -> Result<(), EmuError> {
    match code {
        0 => Ok(()),
        1 => Err(EmuError::BlockBarrier),
        2 => Err(EmuError::WarpCollective),
        _ => Err(EmuError::Geometry),
    }
}

/// The host emulator as a [`Launcher`]; `seed` drives the fiber schedule.
#[derive(Clone, Copy, Debug)]
pub struct Emulator {
    /// Seed of the fiber order (a different seed, a different interleaving at every barrier).
    pub seed: u64,
}

impl Launcher for Emulator {
    type Error = EmuError;

    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<(), EmuError> {
        // SAFETY: `ptr` is a writable host address of `bytes` bytes (trait contract).
        unsafe { core::ptr::write_bytes(ptr as usize as *mut u8, 0, bytes) };
        Ok(())
    }

    unsafe fn launch(
        &self,
        kernel: Kernel,
        g: Geometry,
        args: &[*mut c_void],
    ) -> Result<(), EmuError> {
        if args.len() != kernel.params().len() {
            return Err(EmuError::Arguments);
        }
        let (grid, block) = (Dim3::from(g.grid), Dim3::from(g.block));
        let s = self.seed;
        // SAFETY (all arms): the argument pointers point at parameter structs of the kernel's
        // C type (trait contract), and the addresses inside them are host memory.
        let code = match (kernel, args) {
            (Kernel::GroupAdvantagesF32, [p]) => unsafe {
                emu_launch_group_advantages_f32(grid, block, 0, p.cast(), s)
            },
            (Kernel::BatchStdF32, [p]) => unsafe {
                emu_launch_batch_std_f32(grid, block, 0, p.cast(), s)
            },
            (Kernel::GroupAlphaF32, [p]) => unsafe {
                emu_launch_group_alpha_f32(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoLossF32, [p]) => unsafe {
                emu_launch_grpo_loss_f32(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoLossBf16, [p]) => unsafe {
                emu_launch_grpo_loss_bf16(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoLossF16, [p]) => unsafe {
                emu_launch_grpo_loss_f16(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoCovMeans, [p]) => unsafe {
                emu_launch_grpo_cov_means(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoCovKeys, [p]) => unsafe {
                emu_launch_grpo_cov_keys(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoCovRadix, [p]) => unsafe {
                emu_launch_grpo_cov_radix(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoCovCut, [p]) => unsafe {
                emu_launch_grpo_cov_cut(grid, block, 0, p.cast(), s)
            },
            (Kernel::GrpoLossDenoms, [p, out]) => unsafe {
                // `out` points at the `CareLossDenoms*` argument, i.e. at an address.
                let addr = *(out.cast::<u64>());
                emu_launch_grpo_loss_denoms(
                    grid,
                    block,
                    0,
                    p.cast(),
                    addr as usize as *mut LossDenomsRaw,
                    s,
                )
            },
            (Kernel::LogitsLossF32, [p, x]) => unsafe {
                emu_launch_logits_loss_f32(grid, block, p.cast(), x.cast(), s)
            },
            (Kernel::LogitsLossBf16, [p, x]) => unsafe {
                emu_launch_logits_loss_bf16(grid, block, p.cast(), x.cast(), s)
            },
            (Kernel::LogitsLossF16, [p, x]) => unsafe {
                emu_launch_logits_loss_f16(grid, block, p.cast(), x.cast(), s)
            },
            (Kernel::LogSoftmaxFwdF32, [p]) => unsafe {
                emu_launch_logsoftmax_fwd_f32(grid, block, p.cast(), s)
            },
            (Kernel::LogSoftmaxFwdBf16, [p]) => unsafe {
                emu_launch_logsoftmax_fwd_bf16(grid, block, p.cast(), s)
            },
            (Kernel::LogSoftmaxFwdF16, [p]) => unsafe {
                emu_launch_logsoftmax_fwd_f16(grid, block, p.cast(), s)
            },
            (Kernel::LogSoftmaxBwdF32, [p]) => unsafe {
                emu_launch_logsoftmax_bwd_f32(grid, block, p.cast(), s)
            },
            (Kernel::LogSoftmaxBwdBf16, [p]) => unsafe {
                emu_launch_logsoftmax_bwd_bf16(grid, block, p.cast(), s)
            },
            (Kernel::LogSoftmaxBwdF16, [p]) => unsafe {
                emu_launch_logsoftmax_bwd_f16(grid, block, p.cast(), s)
            },
            (Kernel::DiscountedReturnsF32, [p]) => unsafe {
                emu_launch_discounted_returns_f32(grid, block, p.cast(), s)
            },
            (Kernel::GaeF32, [p]) => unsafe { emu_launch_gae_f32(grid, block, p.cast(), s) },
            (Kernel::WhitenStatsF32, [p]) => unsafe {
                emu_launch_whiten_stats_f32(grid, block, p.cast(), s)
            },
            (Kernel::WhitenApplyF32, [p]) => unsafe {
                emu_launch_whiten_apply_f32(grid, block, p.cast(), s)
            },
            (Kernel::WhitenStatsF64, [p]) => unsafe {
                emu_launch_whiten_stats_f64(grid, block, p.cast(), s)
            },
            (Kernel::WhitenApplyF64, [p]) => unsafe {
                emu_launch_whiten_apply_f64(grid, block, p.cast(), s)
            },
            _ => return Err(EmuError::Arguments),
        };
        check(code)
    }
}

/// The address of a slice's first element, as the kernels' `u64` pointers.
pub fn addr<T>(s: &[T]) -> u64 {
    s.as_ptr() as usize as u64
}

/// The address of a mutable slice's first element.
pub fn addr_mut<T>(s: &mut [T]) -> u64 {
    s.as_mut_ptr() as usize as u64
}

/// The bf16/f16 conversions of `common.cuh`, exposed for exhaustive tests.
pub mod convert {
    /// `care_f16_to_f32`.
    pub fn f16_to_f32(h: u16) -> f32 {
        // SAFETY: pure function of its argument.
        unsafe { super::emu_f16_to_f32(h) }
    }
    /// `care_bf16_to_f32`.
    pub fn bf16_to_f32(h: u16) -> f32 {
        // SAFETY: pure function of its argument.
        unsafe { super::emu_bf16_to_f32(h) }
    }
    /// `care_f32_to_f16` (round to nearest even).
    pub fn f32_to_f16(f: f32) -> u16 {
        // SAFETY: pure function of its argument.
        unsafe { super::emu_f32_to_f16(f) }
    }
    /// `care_f32_to_bf16` (round to nearest even).
    pub fn f32_to_bf16(f: f32) -> u16 {
        // SAFETY: pure function of its argument.
        unsafe { super::emu_f32_to_bf16(f) }
    }
}

/// The C compiler's layout of each parameter struct: size, alignment, field offsets.
pub mod c_layout {
    fn get(f: unsafe extern "C" fn(*mut u32, usize) -> usize) -> Vec<u32> {
        let mut v = vec![0u32; 64];
        // SAFETY: writes at most `cap` entries.
        let n = unsafe { f(v.as_mut_ptr(), v.len()) };
        v.truncate(n);
        v
    }
    /// `CareAdvParams`.
    pub fn adv() -> Vec<u32> {
        get(super::emu_layout_adv)
    }
    /// `CareGroupStats`.
    pub fn group_stats() -> Vec<u32> {
        get(super::emu_layout_group_stats)
    }
    /// `CareBatchStdParams`.
    pub fn batch_std() -> Vec<u32> {
        get(super::emu_layout_batch_std)
    }
    /// `CareLossParams`.
    pub fn loss() -> Vec<u32> {
        get(super::emu_layout_loss)
    }
    /// `CareLossStats`.
    pub fn stats() -> Vec<u32> {
        get(super::emu_layout_stats)
    }
    /// `CareLossDenoms`.
    pub fn denoms() -> Vec<u32> {
        get(super::emu_layout_denoms)
    }
    /// `CareCovWork`.
    pub fn cov_work() -> Vec<u32> {
        get(super::emu_layout_cov_work)
    }
    /// `CareBatchStdWork`.
    pub fn batch_std_work() -> Vec<u32> {
        get(super::emu_layout_batch_std_work)
    }
    /// `CareLossWork` (then `sizeof(CareLossSlot)`).
    pub fn loss_work() -> Vec<u32> {
        get(super::emu_layout_loss_work)
    }
    /// `CareRolloutStats`.
    pub fn rollout_stats() -> Vec<u32> {
        get(super::emu_layout_rollout_stats)
    }
    /// `CareLsmParams`.
    pub fn log_softmax() -> Vec<u32> {
        get(super::emu_layout_lsm)
    }
    /// `CareReturnsParams`.
    pub fn returns() -> Vec<u32> {
        get(super::emu_layout_returns)
    }
    /// `CareWhitenParams`.
    pub fn whiten() -> Vec<u32> {
        get(super::emu_layout_whiten)
    }
    /// `CareWhitenStats`.
    pub fn whiten_stats() -> Vec<u32> {
        get(super::emu_layout_whiten_stats)
    }
    /// `CareWhitenWork` (then `sizeof(CareMoments)`).
    pub fn whiten_work() -> Vec<u32> {
        get(super::emu_layout_whiten_work)
    }
}

/// Deliberately broken kernels (`csrc/selftest.cpp`) that show what the emulator catches.
pub mod selftest {
    use super::{EmuError, check};

    /// Thread 0 of each block publishes `blockIdx.x + 1` in shared memory and every thread
    /// copies it out, with or without the `__syncthreads` in between.
    pub fn publish(blocks: u32, threads: u32, sync: bool, seed: u64) -> Result<Vec<u32>, EmuError> {
        let mut out = vec![0u32; (blocks * threads) as usize];
        // SAFETY: `out` holds one entry per thread of the launch.
        let code = unsafe {
            super::emu_selftest_publish(blocks, threads, i32::from(sync), out.as_mut_ptr(), seed)
        };
        check(code).map(|()| out)
    }

    /// The order in which the blocks of a `blocks`-block grid ran (each block's index, first
    /// to last).
    pub fn block_order(blocks: u32, seed: u64) -> Result<Vec<u32>, EmuError> {
        let mut out = vec![0u32; blocks as usize];
        // SAFETY: `out` holds one entry per block of the launch.
        let code = unsafe { super::emu_selftest_block_order(blocks, out.as_mut_ptr(), seed) };
        check(code).map(|()| out)
    }

    /// Half of a block waits at a `__syncthreads` the other half never reaches.
    pub fn divergent_barrier(seed: u64) -> Result<(), EmuError> {
        // SAFETY: the kernel touches no memory.
        check(unsafe { super::emu_selftest_divergent_barrier(seed) })
    }

    /// A full-warp shuffle after one lane returned.
    pub fn shuffle_after_exit(seed: u64) -> Result<(), EmuError> {
        let mut out = [0f32; 32];
        // SAFETY: `out` holds one entry per thread.
        check(unsafe { super::emu_selftest_shuffle_after_exit(out.as_mut_ptr(), seed) })
    }
}
