//! The advantage estimators beyond GRPO/RLOO/Dr. GRPO (SPEC §9): OPO, ReMax, pass@k, GPG and
//! the std floor. Hand-worked goldens, the error cases, a literal transcription of each formula
//! as a property test, and the cross-rank form.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use care_core::Error;
use care_core::grpo::{
    AdvantageOptions, Baseline, GroupInputs, GroupLayout, GroupSums, Preset, Reweight, Scale,
    SingletonPolicy, group_advantages, group_advantages_finalize_with, group_advantages_with,
    group_partial_squares, group_partial_sums,
};
use proptest::prelude::*;

fn run(inputs: &GroupInputs<'_>, o: &AdvantageOptions) -> Result<Vec<f64>, Error> {
    let mut out = vec![f64::NAN; inputs.rewards.len()];
    group_advantages_with(inputs, o, &mut out, None)?;
    Ok(out)
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "index {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn opo_length_weighted_baseline() {
    // b = (2*1 + 4*0 + 6*1) / 12 = 2/3.
    let r = [1.0f32, 0.0, 1.0];
    let lengths = [2u32, 4, 6];
    let inputs = GroupInputs {
        lengths: Some(&lengths),
        ..GroupInputs::new(&r, None, GroupLayout::Fixed { group_size: 3 })
    };
    let o = AdvantageOptions::preset(Preset::Opo);
    close(
        &run(&inputs, &o).unwrap(),
        &[1.0 / 3.0, -2.0 / 3.0, 1.0 / 3.0],
        1e-15,
    );
    // verl's singleton: baseline 0, A = r. Zero lengths: the plain mean.
    let r2 = [0.5f32, 1.0, 0.0];
    let inputs = GroupInputs {
        lengths: Some(&[7, 0, 0]),
        ..GroupInputs::new(&r2, None, GroupLayout::Offsets(&[0, 1, 3]))
    };
    close(&run(&inputs, &o).unwrap(), &[0.5, 0.5, -0.5], 0.0);
    // No lengths: an error, before any write.
    let mut out = [7.0f64; 3];
    let e = group_advantages(
        &r,
        None,
        GroupLayout::Fixed { group_size: 3 },
        &o,
        &mut out,
        None,
    );
    assert_eq!(e, Err(Error::InvalidArgument));
    assert_eq!(out, [7.0; 3]);
}

#[test]
fn remax_per_sample_baseline() {
    // Not group-relative: an all-equal group and a singleton keep r - b.
    let r = [1.0f32, 1.0, 0.5];
    let b = [0.25f32, 1.0, 0.75];
    let inputs = GroupInputs {
        baselines: Some(&b),
        ..GroupInputs::new(&r, None, GroupLayout::Offsets(&[0, 2, 3]))
    };
    let o = AdvantageOptions::preset(Preset::Remax);
    close(&run(&inputs, &o).unwrap(), &[0.75, 0.0, -0.25], 0.0);
    // A NaN baseline on a valid sample is an error; on an invalid one it is never read.
    let bad = [f32::NAN, 1.0, 0.75];
    let inputs = GroupInputs {
        baselines: Some(&bad),
        ..GroupInputs::new(&r, None, GroupLayout::Offsets(&[0, 2, 3]))
    };
    assert_eq!(run(&inputs, &o), Err(Error::NonFinite));
    let inputs = GroupInputs {
        baselines: Some(&bad),
        ..GroupInputs::new(&r, Some(&[0, 1, 1]), GroupLayout::Offsets(&[0, 2, 3]))
    };
    close(&run(&inputs, &o).unwrap(), &[0.0, 0.0, -0.25], 0.0);
    let short = GroupInputs {
        baselines: Some(&b[..2]),
        ..GroupInputs::new(&r, None, GroupLayout::Offsets(&[0, 2, 3]))
    };
    assert_eq!(run(&short, &o), Err(Error::LengthMismatch));
}

#[test]
fn pass_at_k_only_the_best_gets_the_margin() {
    let layout = GroupLayout::Fixed { group_size: 4 };
    // Unscaled: r_max - r_second = 0.9 - 0.5 for the best, 0 for the others.
    let r = [0.2f32, 0.9, 0.5, 0.1];
    let o = AdvantageOptions {
        baseline: Baseline::PassK,
        scale: Scale::None,
        ..AdvantageOptions::default()
    };
    let got = run(&GroupInputs::new(&r, None, layout), &o).unwrap();
    close(&got, &[0.0, 0.9f32 as f64 - 0.5, 0.0, 0.0], 0.0);
    // verl's grpo_passk divides by the group std + 1e-6.
    let o = AdvantageOptions::preset(Preset::GrpoPassK);
    let xs = r.map(f64::from);
    let mean = xs.iter().sum::<f64>() / 4.0;
    let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 3.0).sqrt();
    let got = run(&GroupInputs::new(&r, None, layout), &o).unwrap();
    close(
        &got,
        &[0.0, (xs[1] - xs[2]) / (std + 1e-6), 0.0, 0.0],
        1e-14,
    );
    // A tie for the best: every advantage is 0.
    let tie = [0.2f32, 0.9, 0.5, 0.9];
    let got = run(&GroupInputs::new(&tie, None, layout), &o).unwrap();
    assert_eq!(got, [0.0; 4]);
    // A singleton under the preset is an error (verl needs two samples).
    let one = [0.3f32];
    let e = run(
        &GroupInputs::new(&one, None, GroupLayout::Fixed { group_size: 1 }),
        &o,
    );
    assert_eq!(e, Err(Error::SingletonGroup));
}

#[test]
fn gpg_alpha_undoes_the_dilution_of_groups_without_signal() {
    // N = 8, M = 4 (the all-equal group): alpha = 2.
    let r = [1.0f32, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0];
    let o = AdvantageOptions::preset(Preset::Gpg);
    let got = run(
        &GroupInputs::new(&r, None, GroupLayout::Fixed { group_size: 4 }),
        &o,
    )
    .unwrap();
    close(&got, &[1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0], 0.0);
    // Every group without signal: alpha = 1 and every advantage 0.
    let flat = [1.0f32; 4];
    let got = run(
        &GroupInputs::new(&flat, None, GroupLayout::Fixed { group_size: 2 }),
        &o,
    )
    .unwrap();
    assert_eq!(got, [0.0; 4]);
    // With the group std (F_norm = std) as well.
    let o = AdvantageOptions {
        scale: Scale::GroupStd,
        eps: 0.0,
        ..o
    };
    let s = (1.0f64 / 3.0).sqrt(); // std of [1, 0, 1, 0]
    let got = run(
        &GroupInputs::new(&r, None, GroupLayout::Fixed { group_size: 4 }),
        &o,
    )
    .unwrap();
    close(&got[..4], &[1.0 / s, -1.0 / s, 1.0 / s, -1.0 / s], 1e-15);
}

#[test]
fn std_floor_caps_the_amplification_of_rounding_residues() {
    // std = 7.07e-6: without a floor, A = +-0.707; with floor 1e-3, A = +-(5e-6 / 1e-3).
    let r = [1.0f32, 1.00001];
    let layout = GroupLayout::Fixed { group_size: 2 };
    let o = AdvantageOptions {
        eps: 0.0,
        ..AdvantageOptions::default()
    };
    let d = (f64::from(1.00001f32) - 1.0) / 2.0;
    let plain = run(&GroupInputs::new(&r, None, layout), &o).unwrap();
    let h = std::f64::consts::FRAC_1_SQRT_2;
    close(&plain, &[-h, h], 1e-9);
    let o = AdvantageOptions {
        std_floor: 1e-3,
        ..o
    };
    let floored = run(&GroupInputs::new(&r, None, layout), &o).unwrap();
    close(&floored, &[-d / 1e-3, d / 1e-3], 1e-12);
    // A floor below the std changes nothing; a bad floor is an error.
    let low = AdvantageOptions {
        std_floor: 1e-9,
        ..o
    };
    assert_eq!(
        run(&GroupInputs::new(&r, None, layout), &low).unwrap(),
        plain
    );
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let b = AdvantageOptions {
            std_floor: bad,
            ..o
        };
        assert_eq!(b.validate(), Err(Error::InvalidArgument));
    }
}

#[test]
fn new_presets_by_name_and_all_equal_groups() {
    for p in [
        Preset::Opo,
        Preset::Remax,
        Preset::GrpoPassK,
        Preset::Gpg,
        Preset::ReinforcePpBaseline,
    ] {
        assert_eq!(Preset::from_name(p.name()), Some(p));
    }
    // All-equal groups give exactly 0 for OPO, pass@k and GPG (ReMax is not group-relative).
    let r = [0.1f32, 0.1, 0.1, 0.35, 0.35, 0.35, 0.35, 0.35];
    let lengths = [3u32, 1, 4, 1, 5, 9, 2, 6];
    for p in [
        Preset::Opo,
        Preset::GrpoPassK,
        Preset::Gpg,
        Preset::ReinforcePpBaseline,
    ] {
        let inputs = GroupInputs {
            lengths: Some(&lengths),
            ..GroupInputs::new(&r, None, GroupLayout::Offsets(&[0, 3, 8]))
        };
        assert_eq!(
            run(&inputs, &AdvantageOptions::preset(p)).unwrap(),
            [0.0; 8],
            "{p:?}"
        );
    }
}

/// The literal formulas, on vectors: OPO `r - sum l r / sum l`, ReMax `r - b`, pass@k
/// `max_j r_j - max_{j != i} r_j`, GPG `alpha (r - mean)`, each divided by the scale with the
/// std floor.
fn naive(
    r: &[f32],
    valid: &[u8],
    lengths: &[u32],
    base: &[f32],
    offsets: &[u32],
    o: &AdvantageOptions,
) -> Vec<f64> {
    let mut out = vec![0.0f64; r.len()];
    let groups: Vec<Vec<usize>> = offsets
        .windows(2)
        .map(|w| {
            (w[0] as usize..w[1] as usize)
                .filter(|&i| valid[i] != 0 && !r[i].is_nan())
                .collect()
        })
        .collect();
    let val = |i: usize| f64::from(r[i]);
    let std = |xs: &[f64]| {
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() as f64 - 1.0)).sqrt()
    };
    let all_zero = |g: &Vec<usize>| {
        o.baseline != Baseline::External && (g.len() < 2 || g.iter().all(|&i| r[i] == r[g[0]]))
    };
    let n: f64 = groups.iter().map(|g| g.len() as f64).sum();
    let m: f64 = groups
        .iter()
        .filter(|g| all_zero(g))
        .map(|g| g.len() as f64)
        .sum();
    let alpha = if o.reweight == Reweight::Gpg && n - m > 0.0 {
        n / (n - m)
    } else {
        1.0
    };
    for g in &groups {
        if g.is_empty() || all_zero(g) {
            continue;
        }
        let xs: Vec<f64> = g.iter().map(|&i| val(i)).collect();
        let d = match o.scale {
            Scale::GroupStd => {
                // External baselines: a zero std (undefined for one sample) counts as 1.
                let s = std(&xs);
                let degenerate = s.is_nan() || s == 0.0;
                let s = if o.baseline == Baseline::External && degenerate {
                    1.0
                } else {
                    s
                };
                s.max(o.std_floor) + o.eps
            }
            _ => 1.0,
        };
        for &i in g {
            let b = match o.baseline {
                Baseline::Mean => xs.iter().sum::<f64>() / xs.len() as f64,
                Baseline::LengthWeighted => {
                    let l: f64 = g.iter().map(|&j| f64::from(lengths[j])).sum();
                    g.iter()
                        .map(|&j| f64::from(lengths[j]) * val(j))
                        .sum::<f64>()
                        / l
                }
                Baseline::External => f64::from(base[i]),
                Baseline::PassK => {
                    let max = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let others = g
                        .iter()
                        .filter(|&&j| j != i)
                        .map(|&j| val(j))
                        .fold(f64::NEG_INFINITY, f64::max);
                    out[i] = alpha * (max - others) / d;
                    continue;
                }
                _ => f64::NAN,
            };
            out[i] = alpha * (val(i) - b) / d;
        }
    }
    out
}

type Batch = (Vec<f32>, Vec<u8>, Vec<u32>, Vec<f32>, Vec<u32>);

fn batch() -> impl Strategy<Value = Batch> {
    prop::collection::vec(2usize..6, 1..5).prop_flat_map(|sizes| {
        let n: usize = sizes.iter().sum();
        let mut offsets = vec![0u32];
        for s in &sizes {
            offsets.push(offsets.last().copied().unwrap() + *s as u32);
        }
        (
            prop::collection::vec(
                prop_oneof![(0u8..5).prop_map(|x| f32::from(x) * 0.25), -2.0f32..2.0],
                n,
            ),
            prop::collection::vec(prop_oneof![5 => Just(1u8), 1 => Just(0u8)], n),
            prop::collection::vec(1u32..50, n),
            prop::collection::vec(-1.0f32..1.0, n),
            Just(offsets),
        )
    })
}

fn options() -> impl Strategy<Value = AdvantageOptions> {
    (
        0usize..4,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0.0), Just(0.05)],
    )
        .prop_map(|(b, scale, gpg, floor)| AdvantageOptions {
            baseline: [
                Baseline::Mean,
                Baseline::LengthWeighted,
                Baseline::External,
                Baseline::PassK,
            ][b],
            scale: if scale { Scale::GroupStd } else { Scale::None },
            reweight: if gpg { Reweight::Gpg } else { Reweight::None },
            std_floor: floor,
            eps: 1e-6,
            singleton: SingletonPolicy::Zero,
            ..AdvantageOptions::default()
        })
}

proptest! {
    /// Relation: the allocation-free implementation equals the literal formulas of each new
    /// baseline, the GPG factor and the std floor.
    #[test]
    fn matches_the_literal_formulas((r, valid, lengths, base, offsets) in batch(), o in options()) {
        let inputs = GroupInputs {
            lengths: Some(&lengths),
            baselines: Some(&base),
            ..GroupInputs::new(&r, Some(&valid), GroupLayout::Offsets(&offsets))
        };
        let got = run(&inputs, &o).unwrap();
        let want = naive(&r, &valid, &lengths, &base, &offsets, &o);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert!((g - w).abs() <= 1e-9 * (1.0 + w.abs()), "i={} {} vs {} ({:?})", i, g, w, o);
        }
    }

    /// Relation: the cross-rank form (sums, squares, finalize) of the GPG factor, the std
    /// floor and the external baseline equals the single-rank result, on a split of every
    /// group between two ranks.
    #[test]
    fn cross_rank_equals_single_rank((r, valid, _l, base, offsets) in batch(), o in options(), cut in 0usize..6) {
        prop_assume!(!matches!(o.baseline, Baseline::LengthWeighted | Baseline::PassK));
        let whole = GroupInputs { baselines: Some(&base), ..GroupInputs::new(&r, Some(&valid), GroupLayout::Offsets(&offsets)) };
        let want = run(&whole, &o).unwrap();
        // Rank 0 takes the first `cut` samples of each group, rank 1 the rest.
        let mut idx = [Vec::new(), Vec::new()];
        let mut offs = [vec![0u32], vec![0u32]];
        for w in offsets.windows(2) {
            for i in w[0] as usize..w[1] as usize {
                idx[usize::from(i - w[0] as usize >= cut)].push(i);
            }
            for k in 0..2 {
                offs[k].push(idx[k].len() as u32);
            }
        }
        let pick = |k: usize| -> (Vec<f32>, Vec<u8>, Vec<f32>) {
            (idx[k].iter().map(|&i| r[i]).collect(), idx[k].iter().map(|&i| valid[i]).collect(), idx[k].iter().map(|&i| base[i]).collect())
        };
        let parts = [pick(0), pick(1)];
        let b = offsets.len() - 1;
        let mut sums = vec![GroupSums::default(); b];
        for k in 0..2 {
            let mut s = vec![GroupSums::default(); b];
            group_partial_sums(&parts[k].0, Some(&parts[k].1), GroupLayout::Offsets(&offs[k]), &mut s).unwrap();
            for (a, x) in sums.iter_mut().zip(&s) { a.count += x.count; a.sum += x.sum; }
        }
        let mut m2 = vec![0.0f64; b];
        for k in 0..2 {
            let mut q = vec![0.0f64; b];
            group_partial_squares(&parts[k].0, Some(&parts[k].1), GroupLayout::Offsets(&offs[k]), &sums, &mut q).unwrap();
            for (a, x) in m2.iter_mut().zip(&q) { *a += x; }
        }
        for k in 0..2 {
            let inputs = GroupInputs { baselines: Some(&parts[k].2), ..GroupInputs::new(&parts[k].0, Some(&parts[k].1), GroupLayout::Offsets(&offs[k])) };
            let mut out = vec![0.0f64; parts[k].0.len()];
            group_advantages_finalize_with(&inputs, &sums, &m2, &o, &mut out, None).unwrap();
            for (j, &i) in idx[k].iter().enumerate() {
                prop_assert!((out[j] - want[i]).abs() <= 1e-9 * (1.0 + want[i].abs()), "{} vs {}", out[j], want[i]);
            }
        }
    }
}

#[test]
fn finalize_rejects_the_baselines_that_need_a_whole_group() {
    let r = [1.0f32, 2.0];
    let sums = [GroupSums {
        count: 2.0,
        sum: 3.0,
    }];
    for b in [Baseline::LengthWeighted, Baseline::PassK] {
        let o = AdvantageOptions {
            baseline: b,
            ..AdvantageOptions::default()
        };
        let inputs = GroupInputs {
            lengths: Some(&[1, 1]),
            ..GroupInputs::new(&r, None, GroupLayout::Fixed { group_size: 2 })
        };
        let mut out = [9.0f64; 2];
        let e = group_advantages_finalize_with(&inputs, &sums, &[0.5], &o, &mut out, None);
        assert_eq!(e, Err(Error::InvalidArgument));
        assert_eq!(out, [9.0; 2]);
    }
    // verl's nonzero factor counts rewards, which the reduced moments do not carry.
    let o = AdvantageOptions::preset(Preset::VerlGpg);
    assert_eq!(o.reweight, Reweight::Nonzero);
    let inputs = GroupInputs::new(&r, None, GroupLayout::Fixed { group_size: 2 });
    let mut out = [9.0f64; 2];
    let e = group_advantages_finalize_with(&inputs, &sums, &[0.5], &o, &mut out, None);
    assert_eq!((e, out), (Err(Error::InvalidArgument), [9.0; 2]));
}

/// verl's `gpg`: `alpha = N / max(1, K)` over the nonzero valid rewards (a NaN reward is
/// invalid and counts in neither), a singleton keeps `alpha * r`; all-zero rewards give
/// `alpha = N` and advantages 0.
#[test]
fn nonzero_factor_golden() {
    let r = [1.0f32, 0.0, f32::NAN, 2.0];
    let o = AdvantageOptions::preset(Preset::VerlGpg);
    let mut out = [9.0f64; 4];
    group_advantages(
        &r,
        None,
        GroupLayout::Offsets(&[0, 3, 4]),
        &o,
        &mut out,
        None,
    )
    .unwrap();
    // N = 3 valid, K = 2 nonzero: alpha 1.5; group [1, 0] mean 0.5; singleton 2.
    assert_eq!(out, [0.75, -0.75, 0.0, 3.0]);
    let z = [0.0f32; 4];
    group_advantages(
        &z,
        None,
        GroupLayout::Fixed { group_size: 2 },
        &o,
        &mut out,
        None,
    )
    .unwrap();
    assert_eq!(out, [0.0; 4]);
}
