//! `care_selective_log_softmax` (the CPU entry point) and its backward pass never return
//! `CARE_OK` with NaN in their outputs: inputs without a softmax are errors, named by code,
//! and nothing is written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ptr::null;

use care_ffi::care_result::{self, CARE_ERR_INVALID_ARGUMENT, CARE_ERR_NON_FINITE, CARE_OK};
use care_ffi::logsoftmax::{
    care_log_softmax_grads, care_log_softmax_outputs, care_logits, care_selective_log_softmax,
    care_selective_log_softmax_backward,
};

/// `f32` logits `[rows, v]`, target 0 on every row, optional mask.
fn logits<'a>(x: &'a [f32], v: usize, y: &'a [i32], mask: Option<&'a [u8]>, t: f64) -> care_logits {
    care_logits {
        struct_size: size_of::<care_logits>() as u32,
        dtype: 0,
        logits: x.as_ptr().cast(),
        logits_len: x.len(),
        rows: x.len() / v,
        vocab: v,
        row_stride: v,
        targets: y.as_ptr().cast(),
        targets_len: y.len(),
        targets_i64: 0,
        mask: mask.map_or(null(), <[u8]>::as_ptr),
        mask_len: mask.map_or(0, <[u8]>::len),
        temperature: t,
    }
}

/// Forward, returning the result and the three outputs (pre-filled with 7.0).
fn forward(x: &[f32], v: usize, mask: Option<&[u8]>, t: f64) -> (care_result, Vec<f32>) {
    let rows = x.len() / v;
    let y = vec![0i32; rows];
    let mut out = vec![7.0f32; 3 * rows];
    let (lp, rest) = out.split_at_mut(rows);
    let (h, lse) = rest.split_at_mut(rows);
    let o = care_log_softmax_outputs {
        struct_size: size_of::<care_log_softmax_outputs>() as u32,
        logp: lp.as_mut_ptr(),
        logp_len: rows,
        entropy: h.as_mut_ptr(),
        entropy_len: rows,
        lse: lse.as_mut_ptr(),
        lse_len: rows,
    };
    let l = logits(x, v, &y, mask, t);
    // SAFETY: every pointer is valid for the length passed with it.
    let r = unsafe { care_selective_log_softmax(&l, &o) };
    (r, out)
}

fn backward(x: &[f32], v: usize, g: &[f32], t: f64) -> (care_result, Vec<f32>) {
    let rows = x.len() / v;
    let y = vec![0i32; rows];
    let mut d = vec![7.0f32; rows * v];
    let grads = care_log_softmax_grads {
        struct_size: size_of::<care_log_softmax_grads>() as u32,
        dlogp: g.as_ptr(),
        dlogp_len: g.len(),
        dentropy: null(),
        dentropy_len: 0,
        lse: null(),
        lse_len: 0,
        entropy: null(),
        entropy_len: 0,
    };
    let l = logits(x, v, &y, None, t);
    // SAFETY: as in `forward`.
    let r = unsafe { care_selective_log_softmax_backward(&l, &grads, d.as_mut_ptr(), d.len()) };
    (r, d)
}

#[test]
fn inputs_without_a_softmax_are_errors_and_write_nothing() {
    let ni = f32::NEG_INFINITY;
    let cases: [(&[f32], f64, care_result); 6] = [
        // 1/T overflows (1e-320 even overflows f64; 1e-39 overflows float).
        (&[0.0, 1.0, 2.0], 1e-320, CARE_ERR_INVALID_ARGUMENT),
        (&[0.0, 1.0, 2.0], 1e-39, CARE_ERR_INVALID_ARGUMENT),
        // A row of only -inf logits.
        (&[ni, ni, ni], 1.0, CARE_ERR_NON_FINITE),
        (&[0.0, 1.0, 2.0, ni, ni, ni], 1.0, CARE_ERR_NON_FINITE),
        // A +inf and a NaN logit.
        (&[0.0, f32::INFINITY, 2.0], 1.0, CARE_ERR_NON_FINITE),
        (&[0.0, f32::NAN, 2.0], 1.0, CARE_ERR_NON_FINITE),
    ];
    for (x, t, want) in cases {
        let (r, out) = forward(x, 3, None, t);
        assert_eq!(r, want, "{x:?} T={t:e}");
        assert!(out.iter().all(|&v| v == 7.0), "outputs untouched: {out:?}");
        let (r, d) = backward(x, 3, &vec![1.0; x.len() / 3], t);
        assert_eq!(r, want, "backward {x:?} T={t:e}");
        assert!(d.iter().all(|&v| v == 7.0));
    }
    // A NaN gradient on a counted row.
    let (r, _) = backward(&[0.0, 1.0, 2.0], 3, &[f32::NAN], 1.0);
    assert_eq!(r, CARE_ERR_NON_FINITE);
}

#[test]
fn masked_rows_are_not_read_and_successes_hold_no_nan() {
    let ni = f32::NEG_INFINITY;
    // Row 0 is all -inf but masked; row 1 has a -inf target logit (logp = -inf, documented).
    let x = [ni, ni, ni, ni, 0.5, 1.0];
    let (r, out) = forward(&x, 3, Some(&[0, 1]), 1e-30);
    assert_eq!(r, CARE_OK);
    assert!(out.iter().all(|v| !v.is_nan()), "{out:?}");
    assert_eq!(out[1], f32::NEG_INFINITY, "logp of a -inf target");
    let (r, out) = forward(&[0.0, 1e-3, -1e-3], 3, None, 4.25e-39);
    assert_eq!(r, CARE_OK, "the smallest accepted temperature");
    assert!(out.iter().all(|v| !v.is_nan()), "{out:?}");
}
