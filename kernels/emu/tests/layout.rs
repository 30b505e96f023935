//! The Rust mirrors of the kernel parameter structs have the C compiler's layout (size,
//! alignment, every field offset), and the bf16/f16 conversions of `common.cuh` agree with the
//! `half` crate on every 16-bit pattern (widening) and on a dense sweep of f32 values
//! (narrowing, round to nearest even).
#![allow(clippy::unwrap_used)]

use care_kernels::params::layout;
use care_kernels_emu::{c_layout, convert};

#[test]
fn parameter_structs_match_the_c_layout() {
    assert_eq!(layout::adv(), c_layout::adv(), "CareAdvParams");
    assert_eq!(
        layout::group_stats(),
        c_layout::group_stats(),
        "CareGroupStats"
    );
    assert_eq!(
        layout::batch_std(),
        c_layout::batch_std(),
        "CareBatchStdParams"
    );
    assert_eq!(layout::loss(), c_layout::loss(), "CareLossParams");
    assert_eq!(layout::stats(), c_layout::stats(), "CareLossStats");
    assert_eq!(layout::denoms(), c_layout::denoms(), "CareLossDenoms");
    assert_eq!(layout::cov_work(), c_layout::cov_work(), "CareCovWork");
    assert_eq!(layout::loss_work(), c_layout::loss_work(), "CareLossWork");
    assert_eq!(
        layout::batch_std_work(),
        c_layout::batch_std_work(),
        "CareBatchStdWork"
    );
    assert_eq!(
        layout::whiten_work(),
        c_layout::whiten_work(),
        "CareWhitenWork"
    );
    assert_eq!(
        layout::rollout_stats(),
        c_layout::rollout_stats(),
        "CareRolloutStats"
    );
    assert_eq!(
        layout::log_softmax(),
        c_layout::log_softmax(),
        "CareLsmParams"
    );
    assert_eq!(layout::returns(), c_layout::returns(), "CareReturnsParams");
    assert_eq!(layout::whiten(), c_layout::whiten(), "CareWhitenParams");
    assert_eq!(
        layout::whiten_stats(),
        c_layout::whiten_stats(),
        "CareWhitenStats"
    );
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn widening_matches_half_on_every_pattern() {
    for h in 0..=u16::MAX {
        let f = convert::f16_to_f32(h);
        assert!(same(f, half::f16::from_bits(h).to_f32()), "f16 {h:#06x}");
        let b = convert::bf16_to_f32(h);
        assert!(same(b, half::bf16::from_bits(h).to_f32()), "bf16 {h:#06x}");
    }
}

#[test]
fn narrowing_matches_half_round_to_nearest_even() {
    // Every 2^13-th f32 pattern plus the neighbours of every f16/bf16 boundary region.
    let mut bits: u32 = 0;
    loop {
        for d in [0u32, 1, 0xfff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001] {
            let f = f32::from_bits(bits.wrapping_add(d));
            let h = convert::f32_to_f16(f);
            let want = half::f16::from_f32(f).to_bits();
            if f.is_nan() {
                assert!(half::f16::from_bits(h).is_nan(), "f16 NaN from {f}");
            } else {
                assert_eq!(h, want, "f16 from {f:e} ({:#010x})", f.to_bits());
            }
            let b = convert::f32_to_bf16(f);
            let want = half::bf16::from_f32(f).to_bits();
            if f.is_nan() {
                assert!(half::bf16::from_bits(b).is_nan(), "bf16 NaN from {f}");
            } else {
                assert_eq!(b, want, "bf16 from {f:e}");
            }
        }
        bits = match bits.checked_add(1 << 13) {
            Some(b) => b,
            None => break,
        };
    }
}
