//! Where a test's buffers live and its kernels run: the host emulator or a real GPU. The same
//! cases and checks run on both; the GPU variant is skipped, with a message, when no CUDA driver
//! is present, and the skip becomes a failure under `CARE_REQUIRE_GPU=1`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::sync::Arc;

use care_kernels::Launcher;
use care_kernels::cuda::{CudaLauncher, driver_available};
use care_kernels::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use care_kernels_emu::Emulator;

/// Memory and a launcher to run plans on.
pub trait Device {
    /// The launcher the plans run on.
    type B: Launcher<Error: core::fmt::Debug>;
    /// A launcher; `seed` drives the emulator's fiber schedule (ignored on a GPU).
    fn launcher(&self, seed: u64) -> Self::B;
    /// Copies `v` to the device and returns its address (16-byte aligned at least).
    fn upload<T: bytemuck::Pod>(&mut self, v: &[T]) -> u64;
    /// Copies `n` elements back from `addr` (after the stream is synchronized).
    fn download<T: bytemuck::Pod>(&mut self, addr: u64, n: usize) -> Vec<T>;
    /// Frees every buffer uploaded so far (their addresses become invalid).
    fn reset(&mut self);
}

/// Host memory (16-byte aligned chunks) and the fiber emulator.
#[derive(Default)]
pub struct EmuDevice {
    chunks: Vec<Vec<u128>>,
}

impl Device for EmuDevice {
    type B = Emulator;
    fn launcher(&self, seed: u64) -> Emulator {
        Emulator { seed }
    }
    fn upload<T: bytemuck::Pod>(&mut self, v: &[T]) -> u64 {
        let bytes: &[u8] = bytemuck::cast_slice(v);
        let mut chunk = vec![0u128; bytes.len().div_ceil(16).max(1)];
        bytemuck::cast_slice_mut::<u128, u8>(&mut chunk)[..bytes.len()].copy_from_slice(bytes);
        let a = chunk.as_ptr() as usize as u64;
        self.chunks.push(chunk);
        a
    }
    fn download<T: bytemuck::Pod>(&mut self, addr: u64, n: usize) -> Vec<T> {
        let mut out = vec![T::zeroed(); n];
        let len = core::mem::size_of_val(out.as_slice());
        // SAFETY: `addr` came from `upload` of at least `n` elements (tests' contract); the
        // chunk is still owned by `self`.
        unsafe {
            core::ptr::copy_nonoverlapping(
                addr as usize as *const u8,
                out.as_mut_ptr().cast::<u8>(),
                len,
            )
        };
        out
    }
    fn reset(&mut self) {
        self.chunks.clear();
    }
}

/// A CUDA device (ordinal 0) with one stream.
pub struct GpuDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    slices: Vec<(u64, CudaSlice<u8>)>,
}

impl Device for GpuDevice {
    type B = CudaLauncher;
    fn launcher(&self, _seed: u64) -> CudaLauncher {
        self.ctx.bind_to_thread().unwrap();
        // SAFETY: the stream belongs to the context just bound to this thread.
        unsafe { CudaLauncher::new(self.stream.cu_stream(), 0) }.unwrap()
    }
    fn upload<T: bytemuck::Pod>(&mut self, v: &[T]) -> u64 {
        let mut bytes: Vec<u8> = bytemuck::cast_slice(v).to_vec();
        bytes.resize(bytes.len().max(16), 0);
        let s = self.stream.clone_htod(&bytes).unwrap();
        let p = {
            let (p, _guard) = s.device_ptr(&self.stream);
            p
        };
        self.slices.push((p, s));
        p
    }
    fn download<T: bytemuck::Pod>(&mut self, addr: u64, n: usize) -> Vec<T> {
        self.stream.synchronize().unwrap();
        let (_, s) = self
            .slices
            .iter()
            .find(|(a, _)| *a == addr)
            .expect("address from upload");
        let bytes = self.stream.clone_dtoh(s).unwrap();
        let len = n * core::mem::size_of::<T>();
        let mut out = vec![T::zeroed(); n];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes[..len]);
        out
    }
    fn reset(&mut self) {
        self.stream.synchronize().unwrap();
        self.slices.clear();
    }
}

/// The GPU, or `None` after printing why the GPU test is skipped. Panics instead of skipping
/// when `CARE_REQUIRE_GPU=1`.
pub fn gpu(test: &str) -> Option<GpuDevice> {
    let require = std::env::var("CARE_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let skip = |why: String| {
        if require {
            panic!("{test}: CARE_REQUIRE_GPU=1 but {why}");
        }
        // Straight to the process's stderr, past the test harness's capture of `eprintln!`, so
        // that a plain `cargo test` shows the skip.
        let _ = writeln!(
            std::io::stderr(),
            "{test}: skipped GPU test: {why} (set CARE_REQUIRE_GPU=1 to make this a failure)"
        );
        None
    };
    if !driver_available() {
        return skip("no CUDA driver library (libcuda) found".into());
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => return skip(format!("no usable CUDA device: {e:?}")),
    };
    let stream = ctx.default_stream();
    Some(GpuDevice {
        ctx,
        stream,
        slices: Vec::new(),
    })
}

/// Random cases per GPU property test: `CARE_GPU_CASES`, default 256 (the sanitizer runs of
/// `scripts/gpu-check.sh` use fewer).
pub fn gpu_cases() -> u32 {
    std::env::var("CARE_GPU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}
