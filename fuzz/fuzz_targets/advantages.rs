//! Group advantages (every baseline, the std floor, the GPG factor, lengths and external
//! baselines), the token broadcast, and the token-level estimators (discounted returns, GAE,
//! whitening) on arbitrary layouts, masks, values and options:
//! no panic, no out-of-bounds (every buffer has exactly its claimed length, so ASan sees any
//! overrun), invalid samples get exactly 0, outputs finite whenever the call succeeds (a
//! success means every valid reward was finite), f32 outputs finite too (they narrow with
//! `narrow_f32`, which saturates: an f32 difference of two rewards near `f32::MAX` used to
//! overflow to infinity, see `care-tests`' regressions), and nothing is written on error.
#![no_main]

use arbitrary::Arbitrary;
use care_core::grpo::{
    AdvantageOptions, Baseline, GaeOptions, GroupInputs, GroupLayout, GroupStats, Reweight, Scale,
    SingletonPolicy, StdKind, WhitenOptions, broadcast_to_tokens, discounted_returns, gae,
    group_advantages_with, narrow_f32, whiten,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Layout {
    Fixed(u8),
    /// Group sizes, turned into CSR offsets.
    Sizes(Vec<u8>),
    /// Raw offsets, mostly invalid.
    Raw(Vec<u32>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    rewards: Vec<f32>,
    valid: Option<Vec<bool>>,
    layout: Layout,
    baseline: u8,
    scale: u8,
    biased: bool,
    singleton: u8,
    eps: f64,
    std_floor: f64,
    gpg: bool,
    lengths: Option<Vec<u32>>,
    baselines: Option<Vec<f32>>,
    out_len_delta: i8,
    stats: bool,
    token_mask: Vec<bool>,
    gamma: f64,
    lambda: f64,
    whiten_eps: f64,
}

fuzz_target!(|inp: Input| {
    let n = inp.rewards.len();
    let offsets: Vec<u32>;
    let layout = match &inp.layout {
        Layout::Fixed(g) => GroupLayout::Fixed {
            group_size: usize::from(*g),
        },
        Layout::Sizes(s) => {
            let mut o = vec![0u32];
            for &k in s {
                o.push(o.last().unwrap() + u32::from(k));
            }
            // Close the layout over all samples so that most inputs reach the arithmetic.
            if (*o.last().unwrap() as usize) < n {
                o.push(n as u32);
            }
            offsets = o;
            GroupLayout::Offsets(&offsets)
        }
        Layout::Raw(o) => GroupLayout::Offsets(o),
    };
    let valid: Option<Vec<u8>> = inp.valid.as_ref().map(|v| {
        (0..n)
            .map(|i| u8::from(v.get(i).copied().unwrap_or(true)))
            .collect()
    });
    let opts = AdvantageOptions {
        baseline: [
            Baseline::Mean,
            Baseline::LeaveOneOut,
            Baseline::None,
            Baseline::LengthWeighted,
            Baseline::External,
            Baseline::PassK,
        ][usize::from(inp.baseline % 6)],
        scale: [Scale::GroupStd, Scale::BatchStd, Scale::None][usize::from(inp.scale % 3)],
        std_kind: if inp.biased {
            StdKind::Biased
        } else {
            StdKind::Unbiased
        },
        singleton: [
            SingletonPolicy::Zero,
            SingletonPolicy::Raw,
            SingletonPolicy::Error,
        ][usize::from(inp.singleton % 3)],
        eps: inp.eps,
        std_floor: inp.std_floor,
        reweight: if inp.gpg {
            Reweight::Gpg
        } else {
            Reweight::None
        },
    };
    let inputs = GroupInputs {
        lengths: inp.lengths.as_deref(),
        baselines: inp.baselines.as_deref(),
        ..GroupInputs::new(&inp.rewards, valid.as_deref(), layout)
    };
    let out_len = n.saturating_add_signed(isize::from(inp.out_len_delta % 2));
    let groups = layout.validate(n).unwrap_or(0);
    let mut stats = vec![GroupStats::default(); groups];
    let sentinel = 12345.0f64;
    let mut out = vec![sentinel; out_len];
    let res = group_advantages_with(
        &inputs,
        &opts,
        &mut out,
        inp.stats.then_some(&mut stats[..]),
    );
    let is_valid = |i: usize| !inp.rewards[i].is_nan() && valid.as_ref().is_none_or(|v| v[i] != 0);
    match res {
        Ok(()) => {
            assert_eq!(out_len, n);
            for (i, a) in out.iter().enumerate() {
                assert!(a.is_finite(), "A[{i}] = {a} for {inp:?}");
                if !is_valid(i) {
                    assert_eq!(*a, 0.0, "invalid sample {i}: {a}");
                }
            }
            // The f32 output agrees with the f64 one rounded, and stays finite in range.
            let mut out32 = vec![0.0f32; n];
            group_advantages_with(&inputs, &opts, &mut out32, None).unwrap();
            for i in 0..n {
                assert_eq!(out32[i], narrow_f32(out[i]));
                assert!(out32[i].is_finite(), "f32 A[{i}] = {}", out32[i]);
            }
        }
        Err(_) => assert!(out.iter().all(|&x| x == sentinel), "written on error"),
    }

    // Token broadcast: masked tokens get exactly 0, others their sequence's advantage.
    if let GroupLayout::Offsets(o) = layout {
        let t = o.last().copied().unwrap_or(0) as usize;
        if t <= 1 << 16 {
            let b = o.len().saturating_sub(1);
            let adv: Vec<f32> = (0..b)
                .map(|i| inp.rewards.get(i).copied().unwrap_or(f32::NAN))
                .collect();
            let mask: Vec<u8> = (0..t)
                .map(|i| u8::from(inp.token_mask.get(i).copied().unwrap_or(i % 3 != 0)))
                .collect();
            token_estimators(&inp, o, &mask);
            let mut tok = vec![7.0f32; t];
            if broadcast_to_tokens(&adv, o, Some(&mask), &mut tok).is_ok() {
                for (s, w) in o.windows(2).enumerate() {
                    for i in w[0] as usize..w[1] as usize {
                        if mask[i] == 0 {
                            assert_eq!(tok[i].to_bits(), 0.0f32.to_bits());
                        } else {
                            assert_eq!(tok[i].to_bits(), adv[s].to_bits());
                        }
                    }
                }
            }
        }
    }
});

/// Discounted returns, GAE and whitening on the token layout `o` (rewards and values taken from
/// the reward column, cycled): nothing written on error; on success masked tokens are exactly
/// 0, and finite inputs give finite outputs.
fn token_estimators(inp: &Input, o: &[u32], mask: &[u8]) {
    let t = mask.len();
    let col = |k: usize| -> Vec<f32> {
        (0..t)
            .map(|i| {
                inp.rewards
                    .get((i + k) % inp.rewards.len().max(1))
                    .copied()
                    .unwrap_or(0.5)
            })
            .collect()
    };
    let (r, v) = (col(0), col(1));
    let finite = r.iter().chain(&v).all(|x| x.is_finite());
    let g = GaeOptions {
        gamma: inp.gamma,
        lambda: inp.lambda,
        ..GaeOptions::default()
    };
    let (mut a, mut ret) = (vec![7.0f32; t], vec![7.0f32; t]);
    match gae(&r, &v, o, Some(mask), &g, &mut a, &mut ret) {
        Ok(()) => {
            for i in 0..t {
                if mask[i] == 0 {
                    assert_eq!((a[i].to_bits(), ret[i].to_bits()), (0, 0));
                } else if finite {
                    assert!(
                        a[i].is_finite() && ret[i].is_finite(),
                        "GAE {i}: {} {}",
                        a[i],
                        ret[i]
                    );
                }
            }
            let w = WhitenOptions {
                eps: inp.whiten_eps,
                std_kind: if inp.biased {
                    StdKind::Biased
                } else {
                    StdKind::Unbiased
                },
                ..WhitenOptions::default()
            };
            let before = a.clone();
            match whiten(&mut a, Some(mask), &w) {
                Ok(_) => {
                    for i in 0..t {
                        if mask[i] == 0 {
                            assert_eq!(a[i].to_bits(), 0);
                        } else if finite {
                            assert!(a[i].is_finite(), "whitened {i}: {}", a[i]);
                        }
                    }
                }
                Err(_) => {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&before), "whiten wrote on error");
                }
            }
        }
        Err(_) => assert!(
            a.iter().chain(&ret).all(|&x| x == 7.0),
            "GAE wrote on error"
        ),
    }
    let mut g2 = vec![7.0f32; t];
    if discounted_returns(&r, o, Some(mask), &g, &mut g2).is_err() {
        assert!(g2.iter().all(|&x| x == 7.0), "returns written on error");
    }
}
