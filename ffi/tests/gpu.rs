//! The GPU entry points on real device memory against the CPU entry points, within the kernels'
//! tolerance table (`care_kernels::tolerance`). Skips (passes with a note) when
//! `care_gpu_available()` reports no driver or device; without one, `tests/abi_args.rs` checks
//! that every GPU function returns `CARE_ERR_CUDA_UNAVAILABLE` after its argument checks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use care_ffi::advantage::*;
use care_ffi::care_result::*;
use care_ffi::gpu::*;
use care_ffi::loss::*;
use care_kernels::Dtype;
use care_kernels::tolerance::{Quantity, tolerance};
use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut};

#[test]
fn gpu_entry_points_match_the_cpu_when_a_device_is_present() {
    if care_gpu_available() != CARE_OK {
        // Like the kernel crates' GPU tests: a visible skip, or a failure where a GPU is required.
        assert!(
            std::env::var("CARE_REQUIRE_GPU").as_deref() != Ok("1"),
            "CARE_REQUIRE_GPU=1 but no CUDA driver or device (CARE_ERR_CUDA_UNAVAILABLE)"
        );
        eprintln!(
            "skipped GPU test: no CUDA driver or device (CARE_ERR_CUDA_UNAVAILABLE; set CARE_REQUIRE_GPU=1 to make this a failure)"
        );
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let cu_stream = stream.cu_stream() as *mut c_void;

    // ---- advantages: two presets, fixed groups ---------------------------------------------
    let n = 64;
    let g = 8;
    let rewards: Vec<f32> = (0..n).map(|i| ((i * 37) % 11) as f32 / 10.0).collect();
    for preset in [0u32, 4] {
        let mut o = unsafe { std::mem::zeroed::<care_advantage_options>() };
        // SAFETY: valid output.
        assert_eq!(
            unsafe { care_advantage_options_preset(preset, &mut o) },
            CARE_OK
        );
        let mut want = vec![0f32; n];
        let c_rewards = care_rewards {
            struct_size: size_of::<care_rewards>() as u32,
            rewards: rewards.as_ptr(),
            rewards_len: n,
            valid: null(),
            valid_len: 0,
        };
        let layout = care_group_layout {
            struct_size: size_of::<care_group_layout>() as u32,
            group_size: g,
            offsets: null(),
            offsets_len: 0,
        };
        let out = care_advantage_outputs {
            struct_size: size_of::<care_advantage_outputs>() as u32,
            advantages: want.as_mut_ptr(),
            advantages_len: n,
            stats: null_mut(),
            stats_len: 0,
        };
        // SAFETY: valid host buffers.
        let code = unsafe { care_group_advantages(&c_rewards, &layout, &o, &out) };
        assert_eq!(code, CARE_OK);

        let d_r = stream.clone_htod(&rewards).unwrap();
        let mut d_adv = stream.alloc_zeros::<f32>(n).unwrap();
        let mut d_ws = stream.alloc_zeros::<u8>(CARE_GPU_WORKSPACE_BYTES).unwrap();
        {
            let (pr, _a) = d_r.device_ptr(&stream);
            let (pa, _b) = d_adv.device_ptr_mut(&stream);
            let (pw, _c) = d_ws.device_ptr_mut(&stream);
            // The same structs as the CPU call, holding device addresses.
            let d_rewards = care_rewards {
                rewards: pr as *const f32,
                ..c_rewards
            };
            let d_out = care_advantage_outputs {
                advantages: pa as *mut f32,
                ..out
            };
            let launch = launch(cu_stream, pw as *mut c_void);
            // SAFETY: device buffers of the stated sizes on this stream's context.
            unsafe {
                let code =
                    care_gpu_group_advantages(&d_rewards, &layout, &o, &d_out, null(), &launch);
                assert_eq!(code, CARE_OK);
                assert_eq!(care_gpu_group_advantages_status(&launch), CARE_OK);
            }
        }
        let got = stream.clone_dtoh(&d_adv).unwrap();
        let tol = tolerance(Quantity::Advantage, Dtype::F32).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!(
                tol.accepts(f64::from(*a), f64::from(*b), f64::from(*b)),
                "preset {preset}: {a} vs {b}"
            );
        }
    }

    // ---- loss: f32, per-sequence advantages, with a mask ---------------------------------
    let seq: Vec<u32> = vec![0, 7, 7, 20, 32];
    let t = 32;
    let logp: Vec<f32> = (0..t).map(|i| -0.3 - 0.05 * (i % 9) as f32).collect();
    let old: Vec<f32> = logp
        .iter()
        .enumerate()
        .map(|(i, x)| x + 0.1 * ((i % 5) as f32 - 2.0))
        .collect();
    let mask: Vec<u8> = (0..t).map(|i| u8::from(i % 6 != 5)).collect();
    let adv = [0.7f32, -1.0, 0.3, -0.2];
    let mut lo = unsafe { std::mem::zeroed::<care_loss_options>() };
    // SAFETY: valid output.
    assert_eq!(unsafe { care_loss_options_preset(0, &mut lo) }, CARE_OK);
    let mut want_grad = vec![0f32; t];
    let mut want_loss = 0.0;
    let inputs = care_loss_inputs {
        struct_size: size_of::<care_loss_inputs>() as u32,
        dtype: care_dtype::CARE_DTYPE_F32 as u32,
        logp: logp.as_ptr().cast(),
        logp_len: t,
        logp_old: old.as_ptr().cast(),
        logp_old_len: t,
        logp_ref: null(),
        logp_ref_len: 0,
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: seq.len(),
        mask: mask.as_ptr(),
        mask_len: t,
        advantages: adv.as_ptr(),
        advantages_len: 4,
        advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
        max_seq_len: 0,
    };
    // SAFETY: valid host buffers.
    let code = unsafe {
        care_policy_loss(
            &inputs,
            &lo,
            want_grad.as_mut_ptr(),
            t,
            &mut want_loss,
            null_mut(),
        )
    };
    assert_eq!(code, CARE_OK);

    let d_logp = stream.clone_htod(&logp).unwrap();
    let d_old = stream.clone_htod(&old).unwrap();
    let d_seq = stream.clone_htod(&seq).unwrap();
    let d_mask = stream.clone_htod(&mask).unwrap();
    let d_adv = stream.clone_htod(&adv).unwrap();
    let mut d_grad = stream.alloc_zeros::<f32>(t).unwrap();
    let mut d_stats = stream.alloc_zeros::<u8>(CARE_GPU_LOSS_STATS_BYTES).unwrap();
    let mut d_ws = stream.alloc_zeros::<u8>(CARE_GPU_WORKSPACE_BYTES).unwrap();
    let mut st = unsafe { std::mem::zeroed::<care_loss_stats>() };
    {
        let (pl, _a) = d_logp.device_ptr(&stream);
        let (po, _b) = d_old.device_ptr(&stream);
        let (ps, _c) = d_seq.device_ptr(&stream);
        let (pm, _d) = d_mask.device_ptr(&stream);
        let (pa, _e) = d_adv.device_ptr(&stream);
        let (pg, _f) = d_grad.device_ptr_mut(&stream);
        let (pst, _g) = d_stats.device_ptr_mut(&stream);
        let (pw, _h) = d_ws.device_ptr_mut(&stream);
        let d_inputs = care_loss_inputs {
            logp: pl as *const c_void,
            logp_old: po as *const c_void,
            seq_offsets: ps as *const u32,
            mask: pm as *const u8,
            advantages: pa as *const f32,
            ..inputs
        };
        let launch = launch(cu_stream, pw as *mut c_void);
        let pst = pst as *mut c_void;
        let f32_code = care_dtype::CARE_DTYPE_F32 as u32;
        // SAFETY: device buffers of the stated sizes on this stream's context.
        unsafe {
            assert_eq!(
                care_gpu_loss_stats_reset(pst, CARE_GPU_LOSS_STATS_BYTES, &launch),
                CARE_OK
            );
            let code = care_gpu_policy_loss(
                &d_inputs,
                &lo,
                pg as *mut c_void,
                t,
                f32_code,
                pst,
                CARE_GPU_LOSS_STATS_BYTES,
                &launch,
            );
            assert_eq!(code, CARE_OK);
            assert_eq!(
                care_gpu_loss_stats_read(pst, CARE_GPU_LOSS_STATS_BYTES, &launch, &mut st),
                CARE_OK
            );
        }
    }
    let grad = stream.clone_dtoh(&d_grad).unwrap();
    let tl = tolerance(Quantity::Loss, Dtype::F32).unwrap();
    // Scale 1: the per-token losses here are O(1), so sum_t w_t |l_t| <= 1 (token mean).
    assert!(
        tl.accepts(st.loss, want_loss, 1.0),
        "loss {} vs {want_loss}",
        st.loss
    );
    let tg = tolerance(Quantity::Grad, Dtype::F32).unwrap();
    let gmax = want_grad.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (a, b) in grad.iter().zip(&want_grad) {
        assert!(
            tg.accepts(f64::from(*a), f64::from(*b), f64::from(gmax)),
            "grad {a} vs {b}"
        );
    }
    assert_eq!(st.tokens, mask.iter().filter(|&&m| m != 0).count() as f64);
}

/// A `care_gpu_launch` on `stream` with the workspace at `ws`.
fn launch(stream: *mut c_void, ws: *mut c_void) -> care_gpu_launch {
    care_gpu_launch {
        struct_size: size_of::<care_gpu_launch>() as u32,
        stream,
        workspace: ws,
        workspace_len: CARE_GPU_WORKSPACE_BYTES,
    }
}
