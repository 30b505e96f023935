//! Which response of a preference pair a rubric prefers (SPEC §7, "Preference outcome"),
//! decided in exact arithmetic.
//!
//! The outcome of a pair is the sign of `r_theta(chosen) - r_theta(rejected)` (Eq. 5 under the
//! pair's rubric): `win`, `tie` or `loss`, as the paper's Table 4 counts them. Floating point
//! cannot decide that sign: with weights `(0.35, 0.3, 0.35)` two responses whose Cognitive and
//! Proactive means differ by `+1/20` and `-1/20` are exactly tied, yet the two `f64` rewards
//! differ in the last bit. So the sign is computed here on exact values:
//!
//! * the scores of a dimension are integers (after the score policies), so its mean is the
//!   rational `S_d / k_d` of the integer sum and the count;
//! * a weight is the decimal number **as written** in the rubric JSON
//!   ([`crate::rubric::Category::weight_text`]), read digit by digit into an integer mantissa
//!   and a power of ten, never through `f64`; a weight given only as an `f64` (a caller's fixed
//!   weights, a rubric built in code) is the shortest decimal that reads back as that `f64`,
//!   which is what a JSON writer writes for it;
//! * the weights enter as §4 uses them: a weight that is negative, or whose `f64` value is not
//!   a positive finite number (`1e400`, `1e-400`), counts 0, and when no weight is left, or
//!   under the `uniform_weights` ablation, every dimension weighs the same. The positive scale
//!   of the L1 normalization does not change a sign, so it is left out.
//!
//! The sign of `sum_d w_d (S+_d / k+_d - S-_d / k-_d)` is then the sign of an integer: the
//! denominators are cleared and the three terms are brought to one power of ten in a
//! fixed-capacity big integer (no allocation). Nothing is rounded, so two responses that are
//! equal in exact arithmetic are a tie, and only they are.

use core::cmp::Ordering;

use crate::names::named_enum;
use crate::reward::{Fired, ScoreOptions, check_counts, resolve_raw};
use crate::rubric::Rubric;
use crate::{Error, Result};

/// Most significant digits read from one weight's text. Longer mantissas are
/// [`Error::Capacity`]; trailing and leading zeros do not count.
pub const MAX_WEIGHT_DIGITS: usize = 100;

/// Which response the rubric prefers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PreferenceOutcome {
    /// `r_theta(chosen) > r_theta(rejected)`.
    Win,
    /// Equal in exact arithmetic.
    Tie,
    /// `r_theta(chosen) < r_theta(rejected)`.
    Loss,
}

named_enum!(PreferenceOutcome, "preference outcome", {
    Win => "win", "The chosen response scores higher";
    Tie => "tie", "Both score the same, exactly";
    Loss => "loss", "The rejected response scores higher";
});

impl PreferenceOutcome {
    fn from_ordering(o: Ordering) -> Self {
        match o {
            Ordering::Greater => PreferenceOutcome::Win,
            Ordering::Equal => PreferenceOutcome::Tie,
            Ordering::Less => PreferenceOutcome::Loss,
        }
    }
}

/// One response's integer score sums and scored-criteria counts per dimension (after the score
/// policies), canonical order: the dimension mean of Eq. 5 is `sums[d] / (5 * counts[d])`, 0
/// when `counts[d] == 0`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DimensionSums {
    /// Sum of the raw `0..=5` scores of the dimension's scored criteria.
    pub sums: [u64; 3],
    /// Criteria scored (a criterion dropped by the `skip` policy is not counted).
    pub counts: [u64; 3],
}

/// The integer sums of a flat raw score slice laid out by `counts` (criteria per dimension),
/// under the score policies of `opts`.
///
/// # Errors
/// [`Error::ScoreShape`] when `scores.len()` is not the sum of `counts`; [`Error::MissingScore`]
/// and [`Error::ScoreOutOfRange`] under the `error` policies; [`Error::Capacity`] for a
/// dimension of more than `u32::MAX` criteria.
pub fn dimension_sums(
    counts: [usize; 3],
    scores: &[f64],
    opts: &ScoreOptions,
) -> Result<DimensionSums> {
    opts.validate()?;
    check_counts(counts, scores.len())?;
    let mut fired = Fired::default();
    let mut out = DimensionSums::default();
    let mut rest = scores;
    for (d, &n) in counts.iter().enumerate() {
        if u32::try_from(n).is_err() {
            return Err(Error::Capacity);
        }
        let (dim, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        for &raw in dim {
            if let Some(v) = resolve_raw(raw, opts, &mut fired)? {
                // An integer in 0..=5 after the policies.
                out.sums[d] += v as u64;
                out.counts[d] += 1;
            }
        }
    }
    Ok(out)
}

/// The outcome of a pair under `rubric`: flat raw score slices of the chosen and rejected
/// responses (criteria in canonical dimension order), compared exactly with the weights as the
/// rubric's JSON wrote them.
///
/// # Errors
/// As [`dimension_sums`] for either side; [`Error::Capacity`] for a weight of more than
/// [`MAX_WEIGHT_DIGITS`] significant digits; [`Error::InvalidWeights`] for a weight text that
/// is not a JSON number.
pub fn preference_outcome(
    rubric: &Rubric<'_>,
    chosen: &[f64],
    rejected: &[f64],
    opts: &ScoreOptions,
) -> Result<PreferenceOutcome> {
    let c = dimension_sums(rubric.counts(), chosen, opts)?;
    let r = dimension_sums(rubric.counts(), rejected, opts)?;
    compare_sums(
        rubric.weights(),
        rubric.weight_texts(),
        &c,
        &r,
        opts.uniform_weights,
    )
}

/// [`preference_outcome`] under caller-given weights (each the shortest decimal of its `f64`)
/// and criteria counts.
///
/// # Errors
/// As [`preference_outcome`].
pub fn preference_outcome_fixed(
    weights: [f64; 3],
    counts: [usize; 3],
    chosen: &[f64],
    rejected: &[f64],
    opts: &ScoreOptions,
) -> Result<PreferenceOutcome> {
    let c = dimension_sums(counts, chosen, opts)?;
    let r = dimension_sums(counts, rejected, opts)?;
    compare_sums(weights, ["", "", ""], &c, &r, opts.uniform_weights)
}

/// The exact comparison itself: `weights` as parsed, `texts` the JSON number each was read
/// from (`""`: use the shortest decimal of the `f64`), the two responses' sums, and whether the
/// `uniform_weights` ablation is on.
///
/// # Errors
/// [`Error::Capacity`] for a weight of more than [`MAX_WEIGHT_DIGITS`] significant digits or a
/// count above `u32::MAX`; [`Error::InvalidWeights`] for a text that is not a JSON number.
pub fn compare_sums(
    weights: [f64; 3],
    texts: [&str; 3],
    chosen: &DimensionSums,
    rejected: &DimensionSums,
    uniform: bool,
) -> Result<PreferenceOutcome> {
    let w = exact_weights(weights, texts, uniform)?;
    // Per dimension the difference of means as a fraction num / den (den > 0), in i128: sums
    // are at most 5 * counts and counts fit u32, so every product below fits.
    let mut num = [0i128; 3];
    let mut den = [1i128; 3];
    for d in 0..3 {
        let (sc, kc) = (chosen.sums[d], chosen.counts[d]);
        let (sr, kr) = (rejected.sums[d], rejected.counts[d]);
        for k in [kc, kr] {
            if u32::try_from(k).is_err() {
                return Err(Error::Capacity);
            }
        }
        if sc > 5 * kc || sr > 5 * kr {
            return Err(Error::ScoreOutOfRange);
        }
        let (sc, kc, sr, kr) = (
            i128::from(sc),
            i128::from(kc),
            i128::from(sr),
            i128::from(kr),
        );
        (num[d], den[d]) = match (kc > 0, kr > 0) {
            (true, true) => (sc * kr - sr * kc, kc * kr),
            (true, false) => (sc, kc),
            (false, true) => (-sr, kr),
            (false, false) => (0, 1),
        };
    }
    // The common exponent of the weights, so that every term is an integer.
    let e_min = w
        .iter()
        .filter(|x| !x.mant.is_zero())
        .map(|x| x.exp)
        .min()
        .unwrap_or(0);
    let (mut pos, mut neg) = (Big::ZERO, Big::ZERO);
    for d in 0..3 {
        if num[d] == 0 || w[d].mant.is_zero() {
            continue;
        }
        // num_d * prod_{e != d} den_e, then times the weight's mantissa and 10^(exp - e_min).
        let mut c = Big::from_u128(num[d].unsigned_abs());
        for (e, &de) in den.iter().enumerate() {
            if e != d {
                c = c.mul(&Big::from_u128(de.unsigned_abs()))?;
            }
        }
        let mut term = c.mul(&w[d].mant)?;
        let shift =
            u32::try_from(i64::from(w[d].exp) - i64::from(e_min)).map_err(|_| Error::Capacity)?;
        term.mul_pow10(shift)?;
        if num[d] > 0 {
            pos.add(&term)?;
        } else {
            neg.add(&term)?;
        }
    }
    Ok(PreferenceOutcome::from_ordering(pos.cmp(&neg)))
}

/// The weights the comparison uses (see the module docs).
fn exact_weights(weights: [f64; 3], texts: [&str; 3], uniform: bool) -> Result<[Decimal; 3]> {
    let one = Decimal {
        mant: Big::from_u128(1),
        exp: 0,
    };
    if uniform {
        return Ok([one; 3]);
    }
    let mut out = [Decimal::ZERO; 3];
    for ((slot, &w), &text) in out.iter_mut().zip(&weights).zip(&texts) {
        if !(w.is_finite() && w > 0.0) {
            continue;
        }
        *slot = if text.is_empty() {
            Decimal::from_f64(w)?
        } else {
            Decimal::parse(text)?
        };
    }
    if out.iter().all(|x| x.mant.is_zero()) {
        return Ok([one; 3]);
    }
    Ok(out)
}

/// A non-negative decimal `mant * 10^exp`.
#[derive(Clone, Copy)]
struct Decimal {
    mant: Big,
    exp: i32,
}

impl Decimal {
    const ZERO: Decimal = Decimal {
        mant: Big::ZERO,
        exp: 0,
    };

    /// Reads a JSON number (`-?int(.frac)?([eE][+-]?digits)?`) exactly. A negative number is
    /// 0 (§4 counts it so).
    fn parse(text: &str) -> Result<Decimal> {
        let b = text.as_bytes();
        let mut i = 0;
        let negative = b.first() == Some(&b'-');
        if negative {
            i += 1;
        }
        let int_start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let int = &b[int_start..i];
        let mut frac: &[u8] = &[];
        if b.get(i) == Some(&b'.') {
            let s = i + 1;
            i = s;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            frac = &b[s..i];
            if frac.is_empty() {
                return Err(Error::InvalidWeights);
            }
        }
        let mut exp: i64 = 0;
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            let minus = match b.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let s = i;
            while let Some(&c) = b.get(i).filter(|c| c.is_ascii_digit()) {
                // Saturates far beyond any exponent of a finite positive f64.
                exp = (exp * 10 + i64::from(c - b'0')).min(1 << 40);
                i += 1;
            }
            if i == s {
                return Err(Error::InvalidWeights);
            }
            if minus {
                exp = -exp;
            }
        }
        if int.is_empty() || i != b.len() {
            return Err(Error::InvalidWeights);
        }
        if negative {
            return Ok(Decimal::ZERO);
        }
        // The digits int ++ frac form the integer D; the value is D * 10^(exp - |frac|).
        let len = int.len() + frac.len();
        let digit = |k: usize| -> u8 {
            let c = if k < int.len() {
                int[k]
            } else {
                frac[k - int.len()]
            };
            c - b'0'
        };
        let Some(first) = (0..len).find(|&k| digit(k) != 0) else {
            return Ok(Decimal::ZERO);
        };
        let last = (0..len).rev().find(|&k| digit(k) != 0).unwrap_or(first);
        if last - first + 1 > MAX_WEIGHT_DIGITS {
            return Err(Error::Capacity);
        }
        let mut mant = Big::ZERO;
        for k in first..=last {
            mant.mul_small(10)?;
            mant.add_small(u32::from(digit(k)))?;
        }
        let e = exp - frac.len() as i64 + (len - 1 - last) as i64;
        let exp = i32::try_from(e).map_err(|_| Error::Capacity)?;
        Ok(Decimal { mant, exp })
    }

    /// The shortest decimal that reads back as `x` (Rust's `{:e}`, as JSON writers write it).
    fn from_f64(x: f64) -> Result<Decimal> {
        let mut buf = Buf {
            bytes: [0; 40],
            len: 0,
        };
        core::fmt::write(&mut buf, format_args!("{x:e}")).map_err(|_| Error::Capacity)?;
        let text = core::str::from_utf8(&buf.bytes[..buf.len]).map_err(|_| Error::Capacity)?;
        Decimal::parse(text)
    }
}

/// A small stack buffer for `core::fmt` (no allocation).
struct Buf {
    bytes: [u8; 40],
    len: usize,
}

impl core::fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        let dst = self.bytes.get_mut(self.len..end).ok_or(core::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Limbs of [`Big`]: 3072 bits. The largest value built is a weight mantissa (at most
/// [`MAX_WEIGHT_DIGITS`] digits, 333 bits) times the cleared denominators (below 2^196) times
/// the power of ten between the smallest and the largest positive finite weight (at most about
/// 10^731, 2429 bits): below 2^2960.
const LIMBS: usize = 96;

/// A fixed-capacity unsigned integer, little-endian base-2^32 limbs.
#[derive(Clone, Copy)]
struct Big {
    limbs: [u32; LIMBS],
    /// Limbs in use (the rest are 0).
    len: usize,
}

impl Big {
    const ZERO: Big = Big {
        limbs: [0; LIMBS],
        len: 0,
    };

    fn from_u128(x: u128) -> Big {
        let mut b = Big::ZERO;
        let mut x = x;
        while x > 0 {
            b.limbs[b.len] = x as u32;
            b.len += 1;
            x >>= 32;
        }
        b
    }

    fn is_zero(&self) -> bool {
        self.len == 0
    }

    fn trim(&mut self) {
        while self.len > 0 && self.limbs[self.len - 1] == 0 {
            self.len -= 1;
        }
    }

    fn push_carry(&mut self, carry: u64) -> Result<()> {
        if carry > 0 {
            let slot = self.limbs.get_mut(self.len).ok_or(Error::Capacity)?;
            *slot = carry as u32;
            self.len += 1;
        }
        Ok(())
    }

    fn mul_small(&mut self, m: u32) -> Result<()> {
        let mut carry = 0u64;
        for limb in &mut self.limbs[..self.len] {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        self.push_carry(carry)?;
        self.trim();
        Ok(())
    }

    fn add_small(&mut self, a: u32) -> Result<()> {
        let mut carry = u64::from(a);
        for limb in &mut self.limbs[..self.len] {
            if carry == 0 {
                break;
            }
            let v = u64::from(*limb) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        self.push_carry(carry)
    }

    fn add(&mut self, other: &Big) -> Result<()> {
        let n = self.len.max(other.len);
        let mut carry = 0u64;
        for i in 0..n {
            let v = u64::from(self.limbs[i]) + u64::from(other.limbs[i]) + carry;
            self.limbs[i] = v as u32;
            carry = v >> 32;
        }
        self.len = n;
        self.push_carry(carry)
    }

    fn mul(&self, other: &Big) -> Result<Big> {
        if self.is_zero() || other.is_zero() {
            return Ok(Big::ZERO);
        }
        if self.len + other.len > LIMBS + 1 {
            return Err(Error::Capacity);
        }
        // One spare limb: the product may need len_a + len_b limbs, the last possibly 0.
        let mut out = [0u32; LIMBS + 1];
        for (i, &a) in self.limbs[..self.len].iter().enumerate() {
            let mut carry = 0u64;
            for (j, &b) in other.limbs[..other.len].iter().enumerate() {
                let v = u64::from(a) * u64::from(b) + u64::from(out[i + j]) + carry;
                out[i + j] = v as u32;
                carry = v >> 32;
            }
            out[i + other.len] = carry as u32;
        }
        let mut len = self.len + other.len;
        while len > 0 && out[len - 1] == 0 {
            len -= 1;
        }
        if len > LIMBS {
            return Err(Error::Capacity);
        }
        let mut b = Big::ZERO;
        b.limbs[..len].copy_from_slice(&out[..len]);
        b.len = len;
        Ok(b)
    }

    fn mul_pow10(&mut self, mut k: u32) -> Result<()> {
        if self.is_zero() {
            return Ok(());
        }
        while k >= 9 {
            self.mul_small(1_000_000_000)?;
            k -= 9;
        }
        self.mul_small(10u32.pow(k))
    }

    fn cmp(&self, other: &Big) -> Ordering {
        self.len.cmp(&other.len).then_with(|| {
            self.limbs[..self.len]
                .iter()
                .rev()
                .cmp(other.limbs[..other.len].iter().rev())
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn dec(text: &str) -> (u128, i32) {
        let d = Decimal::parse(text).unwrap();
        let mut m = 0u128;
        for &l in d.mant.limbs[..d.mant.len].iter().rev() {
            m = (m << 32) | u128::from(l);
        }
        (m, d.exp)
    }

    #[test]
    fn decimals_read_as_written() {
        assert_eq!(dec("0.35"), (35, -2));
        assert_eq!(dec("0.350"), (35, -2));
        assert_eq!(dec("3.5e-1"), (35, -2));
        assert_eq!(dec("35E-2"), (35, -2));
        assert_eq!(dec("0.0035e2"), (35, -2));
        assert_eq!(dec("100"), (1, 2));
        assert_eq!(dec("1"), (1, 0));
        assert_eq!(dec("0"), (0, 0));
        assert_eq!(dec("0.000"), (0, 0));
        assert_eq!(dec("-0.5"), (0, 0), "a negative weight counts 0");
        // More digits than an f64 holds are kept.
        assert_eq!(
            dec("0.1000000000000000000001"),
            (1_000_000_000_000_000_000_001, -22)
        );
        for bad in ["", "-", ".5", "1.", "1e", "1e+", "0x1", "1.5.2", "1 ", "+1"] {
            assert!(Decimal::parse(bad).is_err(), "{bad:?}");
        }
        let long = format!("0.{}", "3".repeat(MAX_WEIGHT_DIGITS + 1));
        assert_eq!(Decimal::parse(&long).err(), Some(Error::Capacity));
        let ok = format!("0.{}000", "3".repeat(MAX_WEIGHT_DIGITS));
        assert!(Decimal::parse(&ok).is_ok(), "trailing zeros do not count");
    }

    #[test]
    fn an_f64_is_its_shortest_decimal() {
        let d = Decimal::from_f64(0.35).unwrap();
        assert_eq!((d.mant.limbs[0], d.mant.len, d.exp), (35, 1, -2));
        let d = Decimal::from_f64(f64::MAX).unwrap();
        assert_eq!(d.exp, 308 - 16);
        let d = Decimal::from_f64(f64::from_bits(1)).unwrap();
        assert_eq!((d.mant.limbs[0], d.exp), (5, -324));
    }

    #[test]
    fn big_arithmetic() {
        let mut a = Big::from_u128(u128::MAX);
        let b = a.mul(&a).unwrap();
        assert_eq!(b.len, 8);
        a.add(&Big::from_u128(1)).unwrap();
        assert_eq!(a.len, 5, "u128::MAX + 1 = 2^128");
        assert_eq!(a.cmp(&Big::from_u128(u128::MAX)), Ordering::Greater);
        let mut t = Big::from_u128(3);
        t.mul_pow10(30).unwrap();
        let mut u = Big::from_u128(3_000_000_000_000_000);
        u.mul_pow10(15).unwrap();
        assert_eq!(t.cmp(&u), Ordering::Equal);
        let mut huge = Big::from_u128(1);
        assert!(huge.mul_pow10(10_000).is_err(), "overflow is an error");
    }

    fn sums(s: [u64; 3], k: [u64; 3]) -> DimensionSums {
        DimensionSums { sums: s, counts: k }
    }

    /// The case that rounding split: weights (0.35, 0.3, 0.35), 4/2/4 criteria.
    #[test]
    fn cancelling_dimensions_are_an_exact_tie() {
        let chosen = [2.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0, 2.0, 2.0];
        let rejected = [3.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0, 1.0, 2.0];
        let opts = ScoreOptions::default();
        let w = [0.35, 0.3, 0.35];
        let r = |s: &[f64]| crate::reward::policy_reward_fixed(w, [4, 2, 4], s, &opts).unwrap();
        let (c, j) = (r(&chosen).dim_means, r(&rejected).dim_means);
        let weighted: f64 = (0..3).map(|d| w[d] * (c[d] - j[d])).sum();
        assert!(
            weighted < 0.0,
            "in f64 the weighted difference of the means is not 0: {weighted}"
        );
        let o = preference_outcome_fixed(w, [4, 2, 4], &chosen, &rejected, &opts).unwrap();
        assert_eq!(o, PreferenceOutcome::Tie);
        let uniform = ScoreOptions {
            uniform_weights: true,
            ..opts
        };
        let o = preference_outcome_fixed(w, [4, 2, 4], &chosen, &rejected, &uniform).unwrap();
        assert_eq!(o, PreferenceOutcome::Tie);
        // One point more on Affective breaks the tie, both ways.
        let mut better = chosen;
        better[5] = 3.0;
        let o = preference_outcome_fixed(w, [4, 2, 4], &better, &rejected, &opts).unwrap();
        assert_eq!(o, PreferenceOutcome::Win);
        let o = preference_outcome_fixed(w, [4, 2, 4], &rejected, &better, &opts).unwrap();
        assert_eq!(o, PreferenceOutcome::Loss);
    }

    #[test]
    fn weights_as_written_decide_what_f64_cannot() {
        let c = sums([1, 0, 0], [1, 1, 1]);
        let r = sums([0, 1, 0], [1, 1, 1]);
        // 0.1000000000000000000001 > 0.1 although both parse to the same f64.
        let w = [0.1, 0.1, 0.8];
        let t = ["0.1000000000000000000001", "0.1", "0.8"];
        assert_eq!(
            compare_sums(w, t, &c, &r, false).unwrap(),
            PreferenceOutcome::Win
        );
        assert_eq!(
            compare_sums(w, ["0.1", "0.10", "0.8"], &c, &r, false).unwrap(),
            PreferenceOutcome::Tie
        );
        // A weight far below the others still decides when the others cancel.
        let c = sums([1, 1, 0], [1, 1, 1]);
        let r = sums([0, 0, 1], [1, 1, 1]);
        let w = [1e-300, 0.5, 0.5];
        assert_eq!(
            compare_sums(w, ["1e-300", "0.5", "0.5"], &c, &r, false).unwrap(),
            PreferenceOutcome::Win
        );
    }

    #[test]
    fn weights_follow_section_4() {
        let c = sums([5, 0, 0], [1, 1, 1]);
        let r = sums([0, 5, 0], [1, 1, 1]);
        let cmp = |w: [f64; 3], t: [&str; 3]| compare_sums(w, t, &c, &r, false).unwrap();
        // Negative and non-finite (as f64) weights count 0.
        assert_eq!(
            cmp([-0.5, 0.5, 0.0], ["-0.5", "0.5", "0"]),
            PreferenceOutcome::Loss
        );
        assert_eq!(
            cmp([f64::INFINITY, 0.5, 0.0], ["1e400", "0.5", "0"]),
            PreferenceOutcome::Loss
        );
        assert_eq!(
            cmp([0.0, 0.5, 0.5], ["1e-400", "0.5", "0.5"]),
            PreferenceOutcome::Loss,
            "a weight whose f64 is 0 counts 0"
        );
        // Nothing positive: uniform.
        assert_eq!(
            cmp([0.0, -1.0, 0.0], ["0", "-1", "0"]),
            PreferenceOutcome::Tie
        );
        // Off the simplex: the scale does not matter.
        assert_eq!(
            cmp([5.0, 3.0, 2.0], ["5", "3", "2"]),
            cmp([0.5, 0.3, 0.2], ["0.5", "0.3", "0.2"])
        );
    }

    #[test]
    fn empty_dimensions_have_mean_zero_and_skip_counts_per_side() {
        // Chosen: Cog 3/1 -> 0.6; rejected: Cog has no scored criterion -> 0.
        let c = sums([3, 0, 0], [1, 0, 0]);
        let r = sums([0, 0, 0], [0, 0, 0]);
        assert_eq!(
            compare_sums([1.0, 0.0, 0.0], ["1", "0", "0"], &c, &r, false).unwrap(),
            PreferenceOutcome::Win
        );
        let skip = ScoreOptions {
            missing: crate::MissingPolicy::Skip,
            ..ScoreOptions::default()
        };
        let s = dimension_sums([2, 1, 0], &[4.0, f64::NAN, 2.0], &skip).unwrap();
        assert_eq!(s, sums([4, 2, 0], [1, 1, 0]));
        assert_eq!(
            dimension_sums([2, 1, 0], &[4.0, 2.0], &skip).err(),
            Some(Error::ScoreShape)
        );
        assert_eq!(
            dimension_sums([1, 0, 0], &[6.0], &ScoreOptions::default()).err(),
            Some(Error::ScoreOutOfRange)
        );
    }
}
