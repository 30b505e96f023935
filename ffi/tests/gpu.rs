//! The GPU entry points on real device memory against the CPU entry points, within the kernels'
//! tolerance table (`care_kernels::tolerance`). Skips (passes with a note) when
//! `care_gpu_available()` reports no driver or device; without one, `tests/abi_args.rs` checks
//! that every GPU function returns `CARE_ERR_CUDA_UNAVAILABLE` after its argument checks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use care_ffi::advantage::*;
use care_ffi::care_result::*;
use care_ffi::gae::*;
use care_ffi::gpu::*;
use care_ffi::logsoftmax::*;
use care_ffi::loss::*;
use care_kernels::Dtype;
use care_kernels::tolerance::{Quantity, Tolerance, tolerance};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

mod common;

/// Whether a CUDA driver and device are present; without them a visible skip, or a failure
/// where a GPU is required (`CARE_REQUIRE_GPU=1`), like the kernel crates' GPU tests.
fn gpu_present(test: &str) -> bool {
    if care_gpu_available() == CARE_OK {
        return true;
    }
    assert!(
        std::env::var("CARE_REQUIRE_GPU").as_deref() != Ok("1"),
        "CARE_REQUIRE_GPU=1 but no CUDA driver or device (CARE_ERR_CUDA_UNAVAILABLE)"
    );
    eprintln!(
        "skipped GPU test {test}: no CUDA driver or device (set CARE_REQUIRE_GPU=1 to make this a failure)"
    );
    false
}

#[test]
fn gpu_entry_points_match_the_cpu_when_a_device_is_present() {
    if !gpu_present("gpu_entry_points_match_the_cpu_when_a_device_is_present") {
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
            lengths: null(),
            lengths_len: 0,
            baselines: null(),
            baselines_len: 0,
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
    let inputs = common::f32_loss_inputs(&logp, &old, &seq, &mask, &adv, None);
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

    let d_in = DeviceLossInputs::upload(&stream, &logp, &old, &seq, &mask, &adv, None);
    let mut d_grad = stream.alloc_zeros::<f32>(t).unwrap();
    let mut d_stats = stream.alloc_zeros::<u8>(CARE_GPU_LOSS_STATS_BYTES).unwrap();
    let mut d_ws = stream.alloc_zeros::<u8>(CARE_GPU_WORKSPACE_BYTES).unwrap();
    let mut st = unsafe { std::mem::zeroed::<care_loss_stats>() };
    d_in.with(&stream, inputs, |d_inputs| {
        let (pg, _f) = d_grad.device_ptr_mut(&stream);
        let (pst, _g) = d_stats.device_ptr_mut(&stream);
        let (pw, _h) = d_ws.device_ptr_mut(&stream);
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
                d_inputs,
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
    });
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

    log_softmax_matches_the_cpu(&stream);
}

/// The selective log-softmax, its backward pass and the fused logits-to-loss forward on the
/// GPU against the CPU entry points, with the same structs (bf16 logits with a row stride, int64
/// targets, a row mask), within the kernels' tolerance table.
fn log_softmax_matches_the_cpu(stream: &std::sync::Arc<cudarc::driver::CudaStream>) {
    let cu_stream = stream.cu_stream() as *mut c_void;
    let (rows, vocab, stride, temperature) = (9usize, 13usize, 16usize, 0.7);
    let xf: Vec<f32> = (0..(rows - 1) * stride + vocab)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0)
        .collect();
    let x: Vec<u16> = xf
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let y: Vec<i64> = (0..rows).map(|i| ((i * 5) % vocab) as i64).collect();
    let mask: Vec<u8> = (0..rows).map(|i| u8::from(i != 4)).collect();
    let host = care_logits {
        struct_size: size_of::<care_logits>() as u32,
        dtype: care_dtype::CARE_DTYPE_BF16 as u32,
        logits: x.as_ptr().cast(),
        logits_len: x.len(),
        rows,
        vocab,
        row_stride: stride,
        targets: y.as_ptr().cast(),
        targets_len: rows,
        targets_i64: 1,
        mask: mask.as_ptr(),
        mask_len: rows,
        temperature,
    };
    let (mut lp, mut h, mut lse) = (vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]);
    let out = care_log_softmax_outputs {
        struct_size: size_of::<care_log_softmax_outputs>() as u32,
        logp: lp.as_mut_ptr(),
        logp_len: rows,
        entropy: h.as_mut_ptr(),
        entropy_len: rows,
        lse: lse.as_mut_ptr(),
        lse_len: rows,
    };
    // SAFETY: host buffers of the stated lengths.
    assert_eq!(unsafe { care_selective_log_softmax(&host, &out) }, CARE_OK);

    let d_x = stream.clone_htod(&x).unwrap();
    let d_y = stream.clone_htod(&y).unwrap();
    let d_m = stream.clone_htod(&mask).unwrap();
    let mut d_lp = stream.alloc_zeros::<f32>(rows).unwrap();
    let mut d_h = stream.alloc_zeros::<f32>(rows).unwrap();
    let mut d_lse = stream.alloc_zeros::<f32>(rows).unwrap();
    let mut d_ws = stream.alloc_zeros::<u8>(CARE_GPU_WORKSPACE_BYTES).unwrap();
    // The CPU's dL/dlogp, so that both backward passes read the same gradient.
    let g: Vec<f32> = (0..rows).map(|i| (i as f32 - 4.0) / 5.0).collect();
    let d_g = stream.clone_htod(&g).unwrap();
    let mut d_dx = stream.alloc_zeros::<u16>(rows * vocab).unwrap();
    {
        let (px, _a) = d_x.device_ptr(stream);
        let (py, _b) = d_y.device_ptr(stream);
        let (pm, _c) = d_m.device_ptr(stream);
        let (plp, _d) = d_lp.device_ptr_mut(stream);
        let (ph, _e) = d_h.device_ptr_mut(stream);
        let (plse, _f) = d_lse.device_ptr_mut(stream);
        let (pw, _g) = d_ws.device_ptr_mut(stream);
        let (pg, _h) = d_g.device_ptr(stream);
        let (pdx, _i) = d_dx.device_ptr_mut(stream);
        let dev = care_logits {
            logits: px as *const c_void,
            targets: py as *const c_void,
            mask: pm as *const u8,
            ..host
        };
        let d_out = care_log_softmax_outputs {
            logp: plp as *mut f32,
            entropy: ph as *mut f32,
            lse: plse as *mut f32,
            ..out
        };
        let launch = launch(cu_stream, pw as *mut c_void);
        let grads = care_log_softmax_grads {
            struct_size: size_of::<care_log_softmax_grads>() as u32,
            dlogp: pg as *const f32,
            dlogp_len: rows,
            dentropy: null(),
            dentropy_len: 0,
            lse: plse as *const f32,
            lse_len: rows,
            entropy: null(),
            entropy_len: 0,
        };
        // SAFETY: device buffers of the stated sizes on this stream's context.
        unsafe {
            assert_eq!(
                care_gpu_selective_log_softmax(&dev, &d_out, &launch),
                CARE_OK
            );
            assert_eq!(care_gpu_selective_log_softmax_status(&launch), CARE_OK);
            let code = care_gpu_selective_log_softmax_backward(
                &dev,
                &grads,
                pdx as *mut c_void,
                rows * vocab,
                vocab,
                &launch,
            );
            assert_eq!(code, CARE_OK);
        }
    }
    let fwd = tolerance(Quantity::LogSoftmax, Dtype::Bf16).unwrap();
    let row_scale = |i: usize| {
        x[i * stride..i * stride + vocab]
            .iter()
            .map(|&b| f64::from(half::bf16::from_bits(b).to_f32()) / temperature)
            .fold(1.0f64, |a, v| a.max(v.abs()))
    };
    for (name, got, want) in [
        ("logp", stream.clone_dtoh(&d_lp).unwrap(), &lp),
        ("entropy", stream.clone_dtoh(&d_h).unwrap(), &h),
        ("lse", stream.clone_dtoh(&d_lse).unwrap(), &lse),
    ] {
        for i in 0..rows {
            let (a, b) = (f64::from(got[i]), f64::from(want[i]));
            assert!(
                fwd.accepts(a, b, row_scale(i)),
                "{name} row {i}: {a} vs {b}"
            );
        }
    }
    let mut want_dx = vec![0f32; rows * vocab];
    let host_grads = care_log_softmax_grads {
        struct_size: size_of::<care_log_softmax_grads>() as u32,
        dlogp: g.as_ptr(),
        dlogp_len: rows,
        dentropy: null(),
        dentropy_len: 0,
        lse: null(),
        lse_len: 0,
        entropy: null(),
        entropy_len: 0,
    };
    // SAFETY: host buffers of the stated lengths.
    let code = unsafe {
        care_selective_log_softmax_backward(&host, &host_grads, want_dx.as_mut_ptr(), rows * vocab)
    };
    assert_eq!(code, CARE_OK);
    let bwd = tolerance(Quantity::LogSoftmaxGrad, Dtype::Bf16).unwrap();
    let got_dx = stream.clone_dtoh(&d_dx).unwrap();
    for (k, (a, w)) in got_dx.iter().zip(&want_dx).enumerate() {
        let i = k / vocab;
        let a = f64::from(half::bf16::from_bits(*a).to_f32());
        let gs = f64::from(g[i]).abs() / temperature;
        let bound = bwd.bound_through(row_scale(i), gs, f64::from(*w));
        assert!(
            Tolerance::within(a, f64::from(*w), bound),
            "dlogits {k}: {a} vs {w}"
        );
    }

    // The fused forward: loss, statistics and dL/dlogp against the CPU path.
    let seq = [0u32, 4, 9];
    let old: Vec<f32> = lp.iter().map(|v| v + 0.1).collect();
    let adv = [0.5f32, -1.0];
    let inputs = care_loss_inputs {
        struct_size: size_of::<care_loss_inputs>() as u32,
        dtype: care_dtype::CARE_DTYPE_F32 as u32,
        logp: null(),
        logp_len: 0,
        logp_old: old.as_ptr().cast(),
        logp_old_len: rows,
        logp_ref: null(),
        logp_ref_len: 0,
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: seq.len(),
        mask: null(),
        mask_len: 0,
        advantages: adv.as_ptr(),
        advantages_len: adv.len(),
        advantages_kind: care_advantages_kind::CARE_ADVANTAGES_PER_SEQUENCE as u32,
        max_seq_len: 5,
        logp_rollout: null(),
        logp_rollout_len: 0,
    };
    let (mut llp, mut llse, mut ldlogp) = (vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]);
    let lo = care_logits_loss_outputs {
        struct_size: size_of::<care_logits_loss_outputs>() as u32,
        logp: llp.as_mut_ptr(),
        logp_len: rows,
        lse: llse.as_mut_ptr(),
        lse_len: rows,
        dlogp: ldlogp.as_mut_ptr(),
        dlogp_len: rows,
    };
    let (mut loss, mut st) = (0.0, unsafe { std::mem::zeroed::<care_loss_stats>() });
    // SAFETY: host buffers of the stated lengths.
    let code = unsafe { care_logits_policy_loss(&host, &inputs, null(), &lo, &mut loss, &mut st) };
    assert_eq!(code, CARE_OK);
    let d_old = stream.clone_htod(&old).unwrap();
    let d_seq = stream.clone_htod(&seq).unwrap();
    let d_adv = stream.clone_htod(&adv).unwrap();
    let mut d_dlogp = stream.alloc_zeros::<f32>(rows).unwrap();
    let mut d_stats = stream.alloc_zeros::<u8>(CARE_GPU_LOSS_STATS_BYTES).unwrap();
    let mut gst = unsafe { std::mem::zeroed::<care_loss_stats>() };
    {
        let (px, _a) = d_x.device_ptr(stream);
        let (py, _b) = d_y.device_ptr(stream);
        let (pm, _c) = d_m.device_ptr(stream);
        let (plp, _d) = d_lp.device_ptr_mut(stream);
        let (plse, _f) = d_lse.device_ptr_mut(stream);
        let (pw, _g) = d_ws.device_ptr_mut(stream);
        let (po, _h) = d_old.device_ptr(stream);
        let (ps, _i) = d_seq.device_ptr(stream);
        let (pa, _j) = d_adv.device_ptr(stream);
        let (pdg, _k) = d_dlogp.device_ptr_mut(stream);
        let (pst, _l) = d_stats.device_ptr_mut(stream);
        let dev = care_logits {
            logits: px as *const c_void,
            targets: py as *const c_void,
            mask: pm as *const u8,
            ..host
        };
        let d_inputs = care_loss_inputs {
            logp_old: po as *const c_void,
            seq_offsets: ps as *const u32,
            advantages: pa as *const f32,
            ..inputs
        };
        let d_lo = care_logits_loss_outputs {
            logp: plp as *mut f32,
            lse: plse as *mut f32,
            dlogp: pdg as *mut f32,
            ..lo
        };
        let launch = launch(cu_stream, pw as *mut c_void);
        let pst = pst as *mut c_void;
        let n = CARE_GPU_LOSS_STATS_BYTES;
        // SAFETY: device buffers of the stated sizes on this stream's context.
        unsafe {
            assert_eq!(care_gpu_loss_stats_reset(pst, n, &launch), CARE_OK);
            let code = care_gpu_logits_policy_loss(&dev, &d_inputs, null(), &d_lo, pst, n, &launch);
            assert_eq!(code, CARE_OK);
            assert_eq!(care_gpu_selective_log_softmax_status(&launch), CARE_OK);
            assert_eq!(care_gpu_loss_stats_read(pst, n, &launch, &mut gst), CARE_OK);
        }
    }
    let tl = tolerance(Quantity::Loss, Dtype::F32).unwrap();
    assert!(
        tl.accepts(gst.loss, loss, 1.0),
        "loss {} vs {loss}",
        gst.loss
    );
    assert_eq!(gst.tokens, st.tokens);
    let tg = tolerance(Quantity::Grad, Dtype::F32).unwrap();
    let gmax = ldlogp.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in stream.clone_dtoh(&d_dlogp).unwrap().iter().zip(&ldlogp) {
        let (a, b) = (f64::from(*a), f64::from(*b));
        assert!(tg.accepts(a, b, f64::from(gmax)), "dlogp {a} vs {b}");
    }

    // The three-kernel path's backward from that dlogp, then the one-pass path, out of place
    // and in place over a copy of the logits: the same logp, lse, dlogits and statistics
    // within the tolerances (different block sizes), and in place equal to out of place.
    let three_lp = stream.clone_dtoh(&d_lp).unwrap();
    let three_lse = stream.clone_dtoh(&d_lse).unwrap();
    let mut d_dx3 = stream.alloc_zeros::<u16>(rows * vocab).unwrap();
    let mut d_dxf = stream.alloc_zeros::<u16>(rows * vocab).unwrap();
    let mut d_xin = stream.clone_htod(&x).unwrap();
    let mut fst = [unsafe { std::mem::zeroed::<care_loss_stats>() }; 2];
    {
        let (px, _a) = d_x.device_ptr(stream);
        let (py, _b) = d_y.device_ptr(stream);
        let (pm, _c) = d_m.device_ptr(stream);
        let (plp, _d) = d_lp.device_ptr_mut(stream);
        let (plse, _f) = d_lse.device_ptr_mut(stream);
        let (pw, _g) = d_ws.device_ptr_mut(stream);
        let (po, _h) = d_old.device_ptr(stream);
        let (ps, _i) = d_seq.device_ptr(stream);
        let (pa, _j) = d_adv.device_ptr(stream);
        let (pdg, _k) = d_dlogp.device_ptr(stream);
        let (pst, _l) = d_stats.device_ptr_mut(stream);
        let (pdx3, _m) = d_dx3.device_ptr_mut(stream);
        let (pdxf, _n) = d_dxf.device_ptr_mut(stream);
        let (pxin, _o) = d_xin.device_ptr_mut(stream);
        let dev = care_logits {
            logits: px as *const c_void,
            targets: py as *const c_void,
            mask: pm as *const u8,
            ..host
        };
        let d_inputs = care_loss_inputs {
            logp_old: po as *const c_void,
            seq_offsets: ps as *const u32,
            advantages: pa as *const f32,
            ..inputs
        };
        let launch = launch(cu_stream, pw as *mut c_void);
        let grads = care_log_softmax_grads {
            struct_size: size_of::<care_log_softmax_grads>() as u32,
            dlogp: pdg as *const f32,
            dlogp_len: rows,
            dentropy: null(),
            dentropy_len: 0,
            lse: plse as *const f32,
            lse_len: rows,
            entropy: null(),
            entropy_len: 0,
        };
        let pst = pst as *mut c_void;
        let n = CARE_GPU_LOSS_STATS_BYTES;
        let mut supported = 7u32;
        // SAFETY (all calls): device buffers of the stated sizes on this stream's context.
        unsafe {
            assert_eq!(
                care_logits_policy_loss_fused_supported(null(), &mut supported),
                CARE_OK
            );
            assert_eq!(supported, 1);
            let code = care_gpu_selective_log_softmax_backward(
                &dev,
                &grads,
                pdx3 as *mut c_void,
                rows * vocab,
                vocab,
                &launch,
            );
            assert_eq!(code, CARE_OK);
            let out = care_gpu_fused_loss_outputs {
                struct_size: size_of::<care_gpu_fused_loss_outputs>() as u32,
                dlogits: pdxf as *mut c_void,
                dlogits_len: rows * vocab,
                dlogits_row_stride: vocab,
                logp: plp as *mut f32,
                logp_len: rows,
                lse: plse as *mut f32,
                lse_len: rows,
                stats: pst,
                stats_len: n,
            };
            assert_eq!(care_gpu_loss_stats_reset(pst, n, &launch), CARE_OK);
            let code = care_gpu_logits_policy_loss_fused(&dev, &d_inputs, null(), &out, &launch);
            assert_eq!(code, CARE_OK);
            assert_eq!(care_gpu_selective_log_softmax_status(&launch), CARE_OK);
            assert_eq!(
                care_gpu_loss_stats_read(pst, n, &launch, &mut fst[0]),
                CARE_OK
            );
            // In place: the gradient over (a copy of) the logits, rows at the logits' stride.
            let inplace = care_logits {
                logits: pxin as *const c_void,
                ..dev
            };
            let out = care_gpu_fused_loss_outputs {
                dlogits: pxin as *mut c_void,
                dlogits_len: x.len(),
                dlogits_row_stride: stride,
                ..out
            };
            assert_eq!(care_gpu_loss_stats_reset(pst, n, &launch), CARE_OK);
            let code =
                care_gpu_logits_policy_loss_fused(&inplace, &d_inputs, null(), &out, &launch);
            assert_eq!(code, CARE_OK);
            assert_eq!(
                care_gpu_loss_stats_read(pst, n, &launch, &mut fst[1]),
                CARE_OK
            );
            // A sequence-level loss: refused before any launch, with the reason.
            let mut gmpo = std::mem::zeroed::<care_loss_options>();
            assert_eq!(care_loss_options_default(&mut gmpo), CARE_OK);
            gmpo.policy_loss = care_policy_loss_kind::CARE_POLICY_LOSS_GMPO as u32;
            assert_eq!(
                care_logits_policy_loss_fused_supported(&gmpo, &mut supported),
                CARE_OK
            );
            assert_eq!(supported, 0);
            let code = care_gpu_logits_policy_loss_fused(&dev, &d_inputs, &gmpo, &out, &launch);
            assert_eq!(code, CARE_ERR_INVALID_ARGUMENT);
        }
    }
    for (name, got, want) in [
        ("fused logp", stream.clone_dtoh(&d_lp).unwrap(), &three_lp),
        ("fused lse", stream.clone_dtoh(&d_lse).unwrap(), &three_lse),
    ] {
        for i in 0..rows {
            let (a, b) = (f64::from(got[i]), f64::from(want[i]));
            assert!(
                fwd.accepts(a, b, row_scale(i)),
                "{name} row {i}: {a} vs {b}"
            );
        }
    }
    let (three, one) = (
        stream.clone_dtoh(&d_dx3).unwrap(),
        stream.clone_dtoh(&d_dxf).unwrap(),
    );
    let g3 = stream.clone_dtoh(&d_dlogp).unwrap();
    for (k, (a, w)) in one.iter().zip(&three).enumerate() {
        let i = k / vocab;
        let (a, w) = (
            f64::from(half::bf16::from_bits(*a).to_f32()),
            f64::from(half::bf16::from_bits(*w).to_f32()),
        );
        let bound = bwd.bound_through(row_scale(i), f64::from(g3[i]).abs() / temperature, w);
        assert!(
            Tolerance::within(a, w, bound),
            "fused dlogits {k}: {a} vs {w}"
        );
    }
    let inplace = stream.clone_dtoh(&d_xin).unwrap();
    for i in 0..rows {
        assert_eq!(
            inplace[i * stride..i * stride + vocab],
            one[i * vocab..(i + 1) * vocab],
            "in place row {i}"
        );
    }
    for s in &fst {
        assert!(
            tl.accepts(s.loss, gst.loss, 1.0),
            "fused loss {} vs {}",
            s.loss,
            gst.loss
        );
        assert_eq!(s.tokens, gst.tokens);
        assert_eq!(s.sequences, gst.sequences);
    }
}

/// `care_gpu_policy_loss_into` accumulates the rollout diagnostics that
/// `care_rollout_correction` computes on the same inputs (token- and sequence-level weights
/// with truncation, a token and a sequence rejection criterion, a mask and an empty sequence):
/// every count exactly, every sum within the loss tolerance (at the scale of the sum, or twice
/// the token count where terms cancel);
/// a second call without a reset doubles every field, and a reset empties the accumulator.
#[test]
fn gpu_rollout_diagnostics_match_care_rollout_correction() {
    let seq: Vec<u32> = vec![0, 9, 9, 21, 33];
    let t = 33;
    let old: Vec<f32> = (0..t).map(|i| -0.3 - 0.05 * (i % 9) as f32).collect();
    // Rollout log-ratios on a grid of 0.08 nats in [-0.4, 0.4]: every weight and k1 verdict is
    // at least 0.02 nats from the bounds below, so f32 and f64 agree on each.
    let rollout: Vec<f32> = old
        .iter()
        .enumerate()
        .map(|(i, x)| x + 0.08 * (((i * 7) % 11) as f32 - 5.0))
        .collect();
    let logp: Vec<f32> = old.iter().map(|x| x + 0.01).collect();
    let mask: Vec<u8> = (0..t).map(|i| u8::from(i % 6 != 5)).collect();
    let adv = [0.7f32, -1.0, 0.3, -0.2];
    let inputs = common::f32_loss_inputs(&logp, &old, &seq, &mask, &adv, Some(&rollout[..]));
    // The CPU reference first (also without a GPU): the fixture must reject and truncate.
    let levels = [
        care_is_level::CARE_IS_TOKEN,
        care_is_level::CARE_IS_SEQUENCE,
    ];
    let cases: Vec<(care_loss_options, care_rollout_stats)> = levels
        .iter()
        .map(|&level| {
            let mut lo = unsafe { std::mem::zeroed::<care_loss_options>() };
            // SAFETY: valid output.
            assert_eq!(unsafe { care_loss_options_default(&mut lo) }, CARE_OK);
            lo.rollout.is_level = level as u32;
            lo.rollout.is_threshold = 1.2;
            lo.rollout.reject[care_rejection::CARE_REJECT_TOKEN_K1 as usize] = care_reject_bound {
                lower: 0.7,
                upper: 1.45,
            };
            lo.rollout.reject[care_rejection::CARE_REJECT_SEQ_MAX_K3 as usize] =
                care_reject_bound {
                    lower: 0.0,
                    upper: 10.0,
                };
            let mut want = unsafe { std::mem::zeroed::<care_rollout_stats>() };
            let (mut w, mut keep) = (vec![0f32; t], vec![0u8; t]);
            // SAFETY: valid host buffers.
            let code = unsafe {
                care_rollout_correction(
                    &inputs,
                    &lo,
                    w.as_mut_ptr(),
                    t,
                    keep.as_mut_ptr(),
                    t,
                    &mut want,
                )
            };
            assert_eq!(code, CARE_OK);
            assert!(
                want.rejected_tokens > 0.0 && want.truncated > 0.0,
                "{level:?}: {want:?}"
            );
            assert!(want.rejected_tokens < want.tokens, "{level:?}: {want:?}");
            (lo, want)
        })
        .collect();
    if !gpu_present("gpu_rollout_diagnostics_match_care_rollout_correction") {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let cu_stream = stream.cu_stream() as *mut c_void;

    let d_in =
        DeviceLossInputs::upload(&stream, &logp, &old, &seq, &mask, &adv, Some(&rollout[..]));
    let mut d_rstats = stream
        .alloc_zeros::<u32>(CARE_GPU_ROLLOUT_STATS_BYTES / 4)
        .unwrap();
    let mut d_ws = stream.alloc_zeros::<u8>(CARE_GPU_WORKSPACE_BYTES).unwrap();
    for (level, (lo, want)) in levels.iter().zip(&cases) {
        let mut got = [unsafe { std::mem::zeroed::<care_rollout_stats>() }; 3];
        d_in.with(&stream, inputs, |d_inputs| {
            let (prs, _g) = d_rstats.device_ptr_mut(&stream);
            let (pw, _h) = d_ws.device_ptr_mut(&stream);
            let out = care_gpu_loss_outputs {
                struct_size: size_of::<care_gpu_loss_outputs>() as u32,
                grad_dtype: care_dtype::CARE_DTYPE_F32 as u32,
                grad: null_mut(),
                grad_len: 0,
                stats: null_mut(),
                stats_len: 0,
                rollout_stats: prs as *mut c_void,
                rollout_stats_len: CARE_GPU_ROLLOUT_STATS_BYTES,
            };
            let launch = launch(cu_stream, pw as *mut c_void);
            let prs = prs as *mut c_void;
            let n = CARE_GPU_ROLLOUT_STATS_BYTES;
            // SAFETY: device buffers of the stated sizes on this stream's context.
            unsafe {
                assert_eq!(care_gpu_rollout_stats_reset(prs, n, &launch), CARE_OK);
                assert_eq!(
                    care_gpu_policy_loss_into(d_inputs, lo, &out, &launch),
                    CARE_OK
                );
                assert_eq!(
                    care_gpu_rollout_stats_read(prs, n, &launch, &mut got[0]),
                    CARE_OK
                );
                assert_eq!(
                    care_gpu_policy_loss_into(d_inputs, lo, &out, &launch),
                    CARE_OK
                );
                assert_eq!(
                    care_gpu_rollout_stats_read(prs, n, &launch, &mut got[1]),
                    CARE_OK
                );
                assert_eq!(care_gpu_rollout_stats_reset(prs, n, &launch), CARE_OK);
                assert_eq!(
                    care_gpu_rollout_stats_read(prs, n, &launch, &mut got[2]),
                    CARE_OK
                );
            }
        });
        let tol = tolerance(Quantity::Loss, Dtype::F32).unwrap();
        let fields = |s: &care_rollout_stats| {
            [
                ("tokens", s.tokens, true),
                ("sequences", s.sequences, true),
                ("rejected_tokens", s.rejected_tokens, true),
                ("rejected_sequences", s.rejected_sequences, true),
                ("truncated", s.truncated, true),
                ("non_finite", s.non_finite, true),
                ("weight_sum", s.weight_sum, false),
                ("kl_sum", s.kl_sum, false),
                ("k3_sum", s.k3_sum, false),
                ("log_ppl_diff_sum", s.log_ppl_diff_sum, false),
                ("log_ppl_abs_diff_sum", s.log_ppl_abs_diff_sum, false),
                ("chi2_token_sum", s.chi2_token_sum, false),
                ("chi2_seq_sum", s.chi2_seq_sum, false),
            ]
        };
        // Scale: the sum itself, or twice the token count for the sums that cancel (every
        // per-token term but the sequence chi2 is below 2 in magnitude here).
        for (k, times) in [(0, 1.0), (1, 2.0)] {
            for ((name, g, exact), (_, w, _)) in fields(&got[k]).into_iter().zip(fields(want)) {
                let w = times * w;
                if exact {
                    assert_eq!(g, w, "{level:?} call {k}: {name}");
                } else {
                    let s = w.abs().max(2.0 * t as f64);
                    assert!(
                        tol.accepts(g, w, s),
                        "{level:?} call {k}: {name} {g} vs {w}"
                    );
                }
            }
        }
        for (name, g, _) in fields(&got[2]) {
            assert_eq!(g, 0.0, "{level:?} after the reset: {name}");
        }
    }
}

/// Clip-Cov and KL-Cov through the C ABI: the workspace sized by
/// `care_gpu_policy_loss_workspace_bytes`, and the device's loss, gradient and token count
/// equal `care_policy_loss`'s within the tolerance, so the device selected the same tokens (the
/// fixture's equal covariances are exact ties, from equal inputs, which the tie rule settles
/// the same way on both; a too-small workspace is refused first).
#[test]
fn gpu_covariance_losses_match_care_policy_loss() {
    let seq: Vec<u32> = vec![0, 40, 40, 97, 160];
    let t = 160;
    let logp: Vec<f32> = (0..t).map(|i| -0.2 - 0.031 * (i % 53) as f32).collect();
    let old: Vec<f32> = (0..t)
        .map(|i| logp[i] + 0.02 * ((i % 5) as f32 - 2.0))
        .collect();
    let mask: Vec<u8> = (0..t).map(|i| u8::from(i % 7 != 3)).collect();
    let adv = [1.3f32, -0.4, 0.6, -1.1];
    let inputs = common::f32_loss_inputs(&logp, &old, &seq, &mask, &adv, None);
    let mut cases = Vec::new();
    for kind in [
        care_policy_loss_kind::CARE_POLICY_LOSS_KL_COV,
        care_policy_loss_kind::CARE_POLICY_LOSS_CLIP_COV,
    ] {
        let mut lo = unsafe { std::mem::zeroed::<care_loss_options>() };
        // SAFETY: valid output.
        assert_eq!(unsafe { care_loss_options_default(&mut lo) }, CARE_OK);
        lo.policy_loss = kind as u32;
        lo.cov_ratio = 0.1;
        lo.clip_cov_lb = -10.0;
        lo.clip_cov_ub = 10.0;
        let (mut grad, mut loss) = (vec![0f32; t], 0f64);
        // SAFETY: valid host buffers.
        let code =
            unsafe { care_policy_loss(&inputs, &lo, grad.as_mut_ptr(), t, &mut loss, null_mut()) };
        assert_eq!(code, CARE_OK);
        let mut ws = 0usize;
        // SAFETY: valid output.
        let code = unsafe { care_gpu_policy_loss_workspace_bytes(&lo, t, &mut ws) };
        assert_eq!(code, CARE_OK);
        assert!(ws >= CARE_GPU_WORKSPACE_BYTES + 8 * t, "{kind:?}: {ws}");
        cases.push((kind, lo, grad, loss, ws));
    }
    if !gpu_present("gpu_covariance_losses_match_care_policy_loss") {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let cu_stream = stream.cu_stream() as *mut c_void;
    let d_in = DeviceLossInputs::upload(&stream, &logp, &old, &seq, &mask, &adv, None);
    for (kind, lo, want_grad, want_loss, ws) in &cases {
        let mut d_grad = stream.alloc_zeros::<f32>(t).unwrap();
        let mut d_stats = stream.alloc_zeros::<u8>(CARE_GPU_LOSS_STATS_BYTES).unwrap();
        let mut d_ws = stream.alloc_zeros::<u8>(*ws).unwrap();
        let mut st = unsafe { std::mem::zeroed::<care_loss_stats>() };
        d_in.with(&stream, inputs, |d_inputs| {
            let (pg, _f) = d_grad.device_ptr_mut(&stream);
            let (pst, _g) = d_stats.device_ptr_mut(&stream);
            let (pw, _h) = d_ws.device_ptr_mut(&stream);
            let small = launch(cu_stream, pw as *mut c_void);
            let sized = care_gpu_launch {
                workspace_len: *ws,
                ..small
            };
            let pst = pst as *mut c_void;
            let n = CARE_GPU_LOSS_STATS_BYTES;
            // SAFETY: device buffers of the stated sizes on this stream's context.
            unsafe {
                assert_eq!(care_gpu_loss_stats_reset(pst, n, &small), CARE_OK);
                let g = pg as *mut c_void;
                let f32_ = care_dtype::CARE_DTYPE_F32 as u32;
                assert_eq!(
                    care_gpu_policy_loss(d_inputs, lo, g, t, f32_, pst, n, &small),
                    CARE_ERR_BUFFER_TOO_SMALL,
                    "{kind:?}"
                );
                assert_eq!(
                    care_gpu_policy_loss(d_inputs, lo, g, t, f32_, pst, n, &sized),
                    CARE_OK,
                    "{kind:?}"
                );
                assert_eq!(care_gpu_loss_stats_read(pst, n, &small, &mut st), CARE_OK);
            }
        });
        let got = stream.clone_dtoh(&d_grad).unwrap();
        let tol = tolerance(Quantity::Grad, Dtype::F32).unwrap();
        let gmax = want_grad
            .iter()
            .fold(0f64, |m, &x| m.max(f64::from(x).abs()));
        for i in 0..t {
            let (g, w) = (f64::from(got[i]), f64::from(want_grad[i]));
            assert!(tol.accepts(g, w, gmax), "{kind:?} grad[{i}]: {g} vs {w}");
        }
        let ltol = tolerance(Quantity::Loss, Dtype::F32).unwrap();
        assert!(
            ltol.accepts(st.loss, *want_loss, want_loss.abs().max(1.0)),
            "{kind:?}: loss {} vs {want_loss}",
            st.loss
        );
        assert_eq!(st.tokens, mask.iter().filter(|&&m| m != 0).count() as f64);
    }
}

/// The host inputs of an f32 loss call (`common::f32_loss_inputs`) copied to the device.
struct DeviceLossInputs {
    logp: CudaSlice<f32>,
    old: CudaSlice<f32>,
    rollout: Option<CudaSlice<f32>>,
    seq: CudaSlice<u32>,
    mask: CudaSlice<u8>,
    adv: CudaSlice<f32>,
}

impl DeviceLossInputs {
    fn upload(
        stream: &Arc<CudaStream>,
        logp: &[f32],
        old: &[f32],
        seq: &[u32],
        mask: &[u8],
        adv: &[f32],
        rollout: Option<&[f32]>,
    ) -> Self {
        DeviceLossInputs {
            logp: stream.clone_htod(logp).unwrap(),
            old: stream.clone_htod(old).unwrap(),
            rollout: rollout.map(|r| stream.clone_htod(r).unwrap()),
            seq: stream.clone_htod(seq).unwrap(),
            mask: stream.clone_htod(mask).unwrap(),
            adv: stream.clone_htod(adv).unwrap(),
        }
    }

    /// Runs `f` with `host` (the struct of the same inputs on the host) pointing at the device
    /// copies; the pointers are valid while `f` runs.
    fn with<R>(
        &self,
        stream: &Arc<CudaStream>,
        host: care_loss_inputs,
        f: impl FnOnce(&care_loss_inputs) -> R,
    ) -> R {
        let (pl, _a) = self.logp.device_ptr(stream);
        let (po, _b) = self.old.device_ptr(stream);
        let roll = self.rollout.as_ref().map(|r| r.device_ptr(stream));
        let (ps, _d) = self.seq.device_ptr(stream);
        let (pm, _e) = self.mask.device_ptr(stream);
        let (pa, _f) = self.adv.device_ptr(stream);
        f(&care_loss_inputs {
            logp: pl as *const c_void,
            logp_old: po as *const c_void,
            logp_rollout: roll.as_ref().map_or(null(), |(p, _)| *p as *const c_void),
            seq_offsets: ps as *const u32,
            mask: pm as *const u8,
            advantages: pa as *const f32,
            ..host
        })
    }
}

/// A `care_gpu_launch` on `stream` with the workspace at `ws`.
#[test]
fn gpu_returns_gae_and_whiten_match_the_cpu_entry_points() {
    // Ragged sequences (one empty, one fully masked), gamma/lambda inside (0, 1).
    let seq: Vec<u32> = vec![0, 5, 5, 9, 40];
    let t = 40;
    let rewards: Vec<f32> = (0..t).map(|i| ((i * 13) % 7) as f32 * 0.3 - 0.8).collect();
    let values: Vec<f32> = (0..t).map(|i| ((i * 5) % 9) as f32 * 0.2 - 0.5).collect();
    let mut mask: Vec<u8> = (0..t).map(|i| u8::from(i % 4 != 3)).collect();
    mask[5..9].fill(0);
    let mut go = unsafe { std::mem::zeroed::<care_gae_options>() };
    let mut wo = unsafe { std::mem::zeroed::<care_whiten_options>() };
    // SAFETY (all calls of this block): valid host buffers of the stated lengths.
    let (want_ret, want_adv, want_gret, want_w, want_mean, want_std) = unsafe {
        assert_eq!(care_gae_options_default(&mut go), CARE_OK);
        assert_eq!(care_whiten_options_default(&mut wo), CARE_OK);
        go.gamma = 0.97;
        go.lambda = 0.9;
        let tr = care_token_rewards {
            struct_size: size_of::<care_token_rewards>() as u32,
            token_rewards: rewards.as_ptr(),
            token_rewards_len: t,
            values: null(),
            values_len: 0,
            seq_offsets: seq.as_ptr(),
            seq_offsets_len: seq.len(),
            mask: mask.as_ptr(),
            mask_len: t,
        };
        let mut ret = vec![0f32; t];
        assert_eq!(
            care_discounted_returns(&tr, &go, ret.as_mut_ptr(), t),
            CARE_OK
        );
        let tr = care_token_rewards {
            values: values.as_ptr(),
            values_len: t,
            ..tr
        };
        let (mut adv, mut gret) = (vec![0f32; t], vec![0f32; t]);
        let code = care_gae(&tr, &go, adv.as_mut_ptr(), t, gret.as_mut_ptr(), t);
        assert_eq!(code, CARE_OK);
        let mut w = adv.clone();
        let (mut mean, mut std) = (0.0, 0.0);
        let code = care_whiten(
            w.as_mut_ptr(),
            t,
            mask.as_ptr(),
            t,
            &wo,
            &mut mean,
            &mut std,
        );
        assert_eq!(code, CARE_OK);
        (ret, adv, gret, w, mean, std)
    };
    if !gpu_present("gpu_returns_gae_and_whiten_match_the_cpu_entry_points") {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let cu_stream = stream.cu_stream() as *mut c_void;
    let d_r = stream.clone_htod(&rewards).unwrap();
    let d_v = stream.clone_htod(&values).unwrap();
    let d_seq = stream.clone_htod(&seq).unwrap();
    let bad: Vec<u32> = vec![0, 5, 3, 9, 40];
    let d_bad = stream.clone_htod(&bad).unwrap();
    let d_mask = stream.clone_htod(&mask).unwrap();
    let mut d_ret = stream.alloc_zeros::<f32>(t).unwrap();
    let mut d_adv = stream.alloc_zeros::<f32>(t).unwrap();
    let mut d_gret = stream.alloc_zeros::<f32>(t).unwrap();
    let mut d_ws = stream.alloc_zeros::<u8>(CARE_GPU_WORKSPACE_BYTES).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    {
        let (pr, _a) = d_r.device_ptr(&stream);
        let (pv, _b) = d_v.device_ptr(&stream);
        let (ps, _c) = d_seq.device_ptr(&stream);
        let (pm, _d) = d_mask.device_ptr(&stream);
        let (pret, _e) = d_ret.device_ptr_mut(&stream);
        let (padv, _f) = d_adv.device_ptr_mut(&stream);
        let (pgret, _g) = d_gret.device_ptr_mut(&stream);
        let (pw, _h) = d_ws.device_ptr_mut(&stream);
        let (pbad, _i) = d_bad.device_ptr(&stream);
        let launch = launch(cu_stream, pw as *mut c_void);
        let tr = care_token_rewards {
            struct_size: size_of::<care_token_rewards>() as u32,
            token_rewards: pr as *const f32,
            token_rewards_len: t,
            values: null(),
            values_len: 0,
            seq_offsets: ps as *const u32,
            seq_offsets_len: seq.len(),
            mask: pm as *const u8,
            mask_len: t,
        };
        let trv = care_token_rewards {
            values: pv as *const f32,
            values_len: t,
            ..tr
        };
        // SAFETY (all calls): device buffers of the stated sizes on this stream's context.
        unsafe {
            let code = care_gpu_discounted_returns(&tr, &go, pret as *mut f32, t, &launch);
            assert_eq!(code, CARE_OK);
            assert_eq!(care_gpu_gae_status(&launch), CARE_OK);
            let code = care_gpu_gae(
                &trv,
                &go,
                padv as *mut f32,
                t,
                pgret as *mut f32,
                t,
                &launch,
            );
            assert_eq!(code, CARE_OK);
            assert_eq!(care_gpu_gae_status(&launch), CARE_OK);
            // A decreasing offsets pair: reported by the status, as the CPU's error.
            let badv = care_token_rewards {
                seq_offsets: pbad as *const u32,
                ..trv
            };
            let code = care_gpu_gae(
                &badv,
                &go,
                padv as *mut f32,
                t,
                pgret as *mut f32,
                t,
                &launch,
            );
            assert_eq!(code, CARE_OK);
            assert_eq!(care_gpu_gae_status(&launch), CARE_ERR_INVALID_LAYOUT);
            // Again with good offsets, then whiten the advantages in place.
            let code = care_gpu_gae(
                &trv,
                &go,
                padv as *mut f32,
                t,
                pgret as *mut f32,
                t,
                &launch,
            );
            assert_eq!(code, CARE_OK);
        }
    }
    // Returns and GAE: bit-identical to the CPU entry points.
    assert_eq!(bits(&stream.clone_dtoh(&d_ret).unwrap()), bits(&want_ret));
    assert_eq!(bits(&stream.clone_dtoh(&d_adv).unwrap()), bits(&want_adv));
    assert_eq!(bits(&stream.clone_dtoh(&d_gret).unwrap()), bits(&want_gret));
    let (mut mean, mut std) = (f64::NAN, f64::NAN);
    {
        let (padv, _a) = d_adv.device_ptr_mut(&stream);
        let (pm, _b) = d_mask.device_ptr(&stream);
        let (pw, _c) = d_ws.device_ptr_mut(&stream);
        let launch = launch(cu_stream, pw as *mut c_void);
        // SAFETY: device buffers of the stated sizes on this stream's context.
        unsafe {
            let code = care_gpu_whiten(padv as *mut f32, t, pm as *const u8, t, &wo, &launch);
            assert_eq!(code, CARE_OK);
            assert_eq!(
                care_gpu_whiten_status(&launch, &mut mean, &mut std),
                CARE_OK
            );
        }
    }
    let got = stream.clone_dtoh(&d_adv).unwrap();
    let tol = tolerance(Quantity::Whiten, Dtype::F32).unwrap();
    let counted = want_adv.iter().zip(&mask).filter(|(_, m)| **m != 0);
    let max = counted.fold(0.0f64, |a, (x, _)| a.max(f64::from(*x).abs()));
    assert!(
        tol.accepts(mean, want_mean, max),
        "mean {mean} vs {want_mean}"
    );
    assert!(tol.accepts(std, want_std, max), "std {std} vs {want_std}");
    let scale = max / (want_std * want_std + wo.eps).sqrt();
    for (i, (a, b)) in got.iter().zip(&want_w).enumerate() {
        let bound = tol.bound(scale, f64::from(*b));
        assert!(
            Tolerance::within(f64::from(*a), f64::from(*b), bound),
            "whiten[{i}]: {a} vs {b}"
        );
    }
    // A counted NaN: CARE_ERR_NON_FINITE from the status, values untouched.
    let mut poisoned = got.clone();
    poisoned[0] = f32::NAN;
    let mut d_p = stream.clone_htod(&poisoned).unwrap();
    {
        let (pp, _a) = d_p.device_ptr_mut(&stream);
        let (pw, _b) = d_ws.device_ptr_mut(&stream);
        let launch = launch(cu_stream, pw as *mut c_void);
        // SAFETY: as above; no mask.
        unsafe {
            let code = care_gpu_whiten(pp as *mut f32, t, null(), 0, &wo, &launch);
            assert_eq!(code, CARE_OK);
            let code = care_gpu_whiten_status(&launch, &mut mean, null_mut());
            assert_eq!(code, CARE_ERR_NON_FINITE);
        }
    }
    assert_eq!(bits(&stream.clone_dtoh(&d_p).unwrap()), bits(&poisoned));
}

/// The f64 chains (`care_gpu_discounted_returns_whitened`, `care_gpu_gae_whitened`) against
/// the CPU's: the returns bit for bit, the whitened values, mean and std within `Whiten`, on
/// returns around 500 with a small spread (where rounding before whitening shows), a counted
/// NaN reported by the status with the advantages untouched, and a short workspace refused.
#[test]
fn gpu_whitened_chains_match_the_cpu_entry_points() {
    let seq: Vec<u32> = (0..=32u32).map(|i| 3 * i).collect();
    let t = 96;
    let rewards: Vec<f32> = (0..t)
        .map(|i| {
            if i % 3 == 2 {
                500.0
            } else {
                50.0 + (i as f32 * 0.37).sin() * 1e-3
            }
        })
        .collect();
    let values: Vec<f32> = (0..t).map(|i| ((i * 5) % 9) as f32 * 0.2 - 0.5).collect();
    let mask: Vec<u8> = (0..t).map(|i| u8::from(i % 7 != 3)).collect();
    let mut go = unsafe { std::mem::zeroed::<care_gae_options>() };
    let mut wo = unsafe { std::mem::zeroed::<care_whiten_options>() };
    // SAFETY: valid outputs.
    unsafe {
        assert_eq!(care_gae_options_default(&mut go), CARE_OK);
        assert_eq!(care_whiten_options_default(&mut wo), CARE_OK);
    }
    go.gamma = 0.9;
    go.lambda = 0.95;
    wo.count_eps = 1e-8;
    let host = |values: Option<&[f32]>| care_token_rewards {
        struct_size: size_of::<care_token_rewards>() as u32,
        token_rewards: rewards.as_ptr(),
        token_rewards_len: t,
        values: values.map_or(null(), <[f32]>::as_ptr),
        values_len: values.map_or(0, <[f32]>::len),
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: seq.len(),
        mask: mask.as_ptr(),
        mask_len: t,
    };
    // (advantages, returns, mean, std) of the CPU entry point.
    let cpu = |gae: bool| {
        let (mut adv, mut ret) = (vec![0f32; t], vec![0f32; t]);
        let (mut mean, mut std) = (0.0, 0.0);
        // SAFETY: host buffers of the stated lengths.
        let code = unsafe {
            if gae {
                let tr = host(Some(&values));
                care_gae_whitened(
                    &tr,
                    &go,
                    &wo,
                    adv.as_mut_ptr(),
                    t,
                    ret.as_mut_ptr(),
                    t,
                    &mut mean,
                    &mut std,
                )
            } else {
                let tr = host(None);
                care_discounted_returns_whitened(
                    &tr,
                    &go,
                    &wo,
                    adv.as_mut_ptr(),
                    t,
                    ret.as_mut_ptr(),
                    t,
                    &mut mean,
                    &mut std,
                )
            }
        };
        assert_eq!(code, CARE_OK);
        (adv, ret, mean, std)
    };
    let want = [cpu(false), cpu(true)];
    if !gpu_present("gpu_whitened_chains_match_the_cpu_entry_points") {
        return;
    }
    let mut ws_len = 0usize;
    // SAFETY: valid output.
    assert_eq!(
        unsafe { care_gpu_whitened_workspace_bytes(t, &mut ws_len) },
        CARE_OK
    );
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let mut poisoned = rewards.clone();
    poisoned[4] = f32::NAN; // counted (4 % 7 != 3)
    let d_r = stream.clone_htod(&rewards).unwrap();
    let d_nan = stream.clone_htod(&poisoned).unwrap();
    let d_v = stream.clone_htod(&values).unwrap();
    let d_seq = stream.clone_htod(&seq).unwrap();
    let d_mask = stream.clone_htod(&mask).unwrap();
    let mut d_ws = stream.alloc_zeros::<u8>(ws_len).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let tol = tolerance(Quantity::Whiten, Dtype::F32).unwrap();
    for (gae, (w_adv, w_ret, w_mean, w_std)) in [false, true].into_iter().zip(&want) {
        let mut d_adv = stream.alloc_zeros::<f32>(t).unwrap();
        let mut d_ret = stream.alloc_zeros::<f32>(t).unwrap();
        let dev = ChainBuffers {
            values: &d_v,
            seq: &d_seq,
            mask: &d_mask,
            seq_len: seq.len(),
        };
        let mut run = |rewards: &CudaSlice<f32>, len: usize, out: &mut (f64, f64)| {
            let ws = (&mut d_ws, len);
            chained(
                &stream, &dev, rewards, &mut d_adv, &mut d_ret, ws, gae, &go, &wo, out,
            )
        };
        let mut got = (f64::NAN, f64::NAN);
        // A workspace without room for the f64 values: refused before any launch.
        assert_eq!(run(&d_r, ws_len - 1, &mut got), CARE_ERR_BUFFER_TOO_SMALL);
        assert_eq!(run(&d_r, ws_len, &mut got), CARE_OK);
        let (mean, std) = got;
        // A counted NaN reward: the status says so, nothing is written to the statistics'
        // outputs and the advantages stay as they were.
        let kept = stream.clone_dtoh(&d_adv).unwrap();
        let mut run = |rewards: &CudaSlice<f32>, out: &mut (f64, f64)| {
            let ws = (&mut d_ws, ws_len);
            chained(
                &stream, &dev, rewards, &mut d_adv, &mut d_ret, ws, gae, &go, &wo, out,
            )
        };
        let mut untouched = (7.0, 7.0);
        assert_eq!(run(&d_nan, &mut untouched), CARE_ERR_NON_FINITE);
        assert_eq!(untouched, (7.0, 7.0));
        assert_eq!(bits(&stream.clone_dtoh(&d_adv).unwrap()), bits(&kept));
        assert_eq!(bits(&stream.clone_dtoh(&d_ret).unwrap()), bits(w_ret));
        let max = 600.0;
        assert!(tol.accepts(mean, *w_mean, max), "mean {mean} vs {w_mean}");
        assert!(tol.accepts(std, *w_std, max), "std {std} vs {w_std}");
        let scale = max / (w_std * w_std + wo.eps).sqrt();
        let got = stream.clone_dtoh(&d_adv).unwrap();
        for (i, (a, b)) in got.iter().zip(w_adv).enumerate() {
            let bound = tol.bound(scale, f64::from(*b));
            assert!(
                Tolerance::within(f64::from(*a), f64::from(*b), bound),
                "gae {gae} adv[{i}]: {a} vs {b}"
            );
        }
    }
}

/// The device inputs of [`chained`] besides the rewards.
struct ChainBuffers<'a> {
    values: &'a CudaSlice<f32>,
    seq: &'a CudaSlice<u32>,
    mask: &'a CudaSlice<u8>,
    seq_len: usize,
}

/// One chained call (`care_gpu_gae_whitened` with `gae`, else
/// `care_gpu_discounted_returns_whitened`) with a workspace of `ws.1` bytes, then its status
/// with the mean and std into `out`.
#[allow(clippy::too_many_arguments)] // one argument per buffer
fn chained(
    stream: &Arc<CudaStream>,
    dev: &ChainBuffers<'_>,
    rewards: &CudaSlice<f32>,
    adv: &mut CudaSlice<f32>,
    ret: &mut CudaSlice<f32>,
    ws: (&mut CudaSlice<u8>, usize),
    gae: bool,
    go: &care_gae_options,
    wo: &care_whiten_options,
    out: &mut (f64, f64),
) -> care_ffi::care_result {
    let t = rewards.len();
    let (pr, _a) = rewards.device_ptr(stream);
    let (pv, _b) = dev.values.device_ptr(stream);
    let (ps, _c) = dev.seq.device_ptr(stream);
    let (pm, _d) = dev.mask.device_ptr(stream);
    let (padv, _e) = adv.device_ptr_mut(stream);
    let (pret, _f) = ret.device_ptr_mut(stream);
    let (pw, _g) = ws.0.device_ptr_mut(stream);
    let mut l = launch(stream.cu_stream() as *mut c_void, pw as *mut c_void);
    l.workspace_len = ws.1;
    let tr = care_token_rewards {
        struct_size: size_of::<care_token_rewards>() as u32,
        token_rewards: pr as *const f32,
        token_rewards_len: t,
        values: if gae { pv as *const f32 } else { null() },
        values_len: if gae { t } else { 0 },
        seq_offsets: ps as *const u32,
        seq_offsets_len: dev.seq_len,
        mask: pm as *const u8,
        mask_len: t,
    };
    let (a, r) = (padv as *mut f32, pret as *mut f32);
    // SAFETY (both): device buffers of the stated sizes on this stream's context.
    let code = unsafe {
        if gae {
            care_gpu_gae_whitened(&tr, go, wo, a, t, r, t, &l)
        } else {
            care_gpu_discounted_returns_whitened(&tr, go, wo, a, t, r, t, &l)
        }
    };
    if code != CARE_OK {
        return code;
    }
    unsafe { care_gpu_whitened_status(&l, &mut out.0, &mut out.1) }
}

fn launch(stream: *mut c_void, ws: *mut c_void) -> care_gpu_launch {
    care_gpu_launch {
        struct_size: size_of::<care_gpu_launch>() as u32,
        stream,
        workspace: ws,
        workspace_len: CARE_GPU_WORKSPACE_BYTES,
    }
}
