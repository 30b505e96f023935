//! The statistics of `care analyze`: Wilson score intervals for proportions, Newcombe's
//! intervals for differences of proportions (independent and paired), Student-t intervals for
//! means, Welch's interval for a difference of means, least-squares slopes, Spearman's rho with
//! its Fisher-z interval, and streaming moments (sufficient statistics, never rows).

/// `z` of a two-sided 95% interval: the 0.975 quantile of the standard normal distribution.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// A two-sided interval `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// Lower limit.
    pub lo: f64,
    /// Upper limit.
    pub hi: f64,
}

/// The Wilson score interval (Wilson 1927; "method 3" of Newcombe 1998, no continuity
/// correction) for `successes` out of `n` at normal quantile `z`; `None` when `n == 0`.
///
/// Unlike the Wald interval it stays inside `[0, 1]` and is not degenerate at 0 or `n`
/// successes, which matters for rates such as ties or rare strategies.
pub fn wilson(successes: u64, n: u64, z: f64) -> Option<Interval> {
    if n == 0 || successes > n {
        return None;
    }
    let n_f = n as f64;
    let p = successes as f64 / n_f;
    let z2 = z * z;
    let denom = 1.0 + z2 / n_f;
    let center = (p + z2 / (2.0 * n_f)) / denom;
    let half = z / denom * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt();
    // At 0 and n successes the exact limits are 0 and 1; rounding must not move them.
    let lo = if successes == 0 {
        0.0
    } else {
        (center - half).max(0.0)
    };
    let hi = if successes == n {
        1.0
    } else {
        (center + half).min(1.0)
    };
    Some(Interval { lo, hi })
}

/// The 95% Wilson interval.
pub fn wilson95(successes: u64, n: u64) -> Option<Interval> {
    wilson(successes, n, Z_95)
}

/// Mean and variance of a stream by Welford's update: exact count, numerically stable, and
/// O(1) memory however long the input.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Welford {
    /// Values seen.
    pub n: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    /// Adds one value.
    pub fn push(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    /// The mean (`None` before the first value).
    pub fn mean(&self) -> Option<f64> {
        (self.n > 0).then_some(self.mean)
    }

    /// The sample standard deviation (divisor `n - 1`; `None` below two values).
    pub fn sd(&self) -> Option<f64> {
        (self.n > 1).then(|| (self.m2.max(0.0) / (self.n - 1) as f64).sqrt())
    }

    /// The 95% Student-t interval of the mean, `mean +- t(0.975, n-1) * sd / sqrt(n)`
    /// (`None` below two values).
    pub fn ci95(&self) -> Option<Interval> {
        let (m, s) = (self.mean()?, self.sd()?);
        let half = t_quantile(0.975, (self.n - 1) as f64) * s / (self.n as f64).sqrt();
        Some(Interval {
            lo: m - half,
            hi: m + half,
        })
    }
}

impl Welford {
    /// The sample variance (divisor `n - 1`; `None` below two values).
    pub fn var(&self) -> Option<f64> {
        (self.n > 1).then(|| self.m2.max(0.0) / (self.n - 1) as f64)
    }

    /// Folds `other` in (Chan, Golub and LeVeque's pairwise update): the moments of the union.
    pub fn merge(&mut self, other: &Welford) {
        if other.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *other;
            return;
        }
        let n = self.n + other.n;
        let d = other.mean - self.mean;
        let (na, nb) = (self.n as f64, other.n as f64);
        self.mean += d * nb / n as f64;
        self.m2 += other.m2 + d * d * na * nb / n as f64;
        self.n = n;
    }

    /// The sum of squared deviations from the mean.
    pub fn m2(&self) -> f64 {
        self.m2.max(0.0)
    }
}

/// Newcombe's hybrid score interval for `p1 - p2` of two independent proportions `k1/n1` and
/// `k2/n2` (method 10 of Newcombe 1998, "Interval estimation for the difference between
/// independent proportions"): with the Wilson limits `(l1, u1)`, `(l2, u2)`,
/// `(p1 - p2 - sqrt((p1 - l1)^2 + (u2 - p2)^2), p1 - p2 + sqrt((u1 - p1)^2 + (p2 - l2)^2))`.
/// `None` when a denominator is 0.
pub fn newcombe(k1: u64, n1: u64, k2: u64, n2: u64) -> Option<Interval> {
    let (a, b) = (wilson95(k1, n1)?, wilson95(k2, n2)?);
    let (p1, p2) = (k1 as f64 / n1 as f64, k2 as f64 / n2 as f64);
    let d = p1 - p2;
    Some(Interval {
        lo: (d - ((p1 - a.lo).powi(2) + (b.hi - p2).powi(2)).sqrt()).max(-1.0),
        hi: (d + ((a.hi - p1).powi(2) + (p2 - b.lo).powi(2)).sqrt()).min(1.0),
    })
}

/// Newcombe's square-and-add interval for the difference `p1 - p2` of two proportions measured
/// on the same units (method 10 of Newcombe 1998, "Improved confidence intervals for the
/// difference between binomial proportions based on paired data"). The 2x2 table: `a` units
/// with both, `b` with the first only, `c` with the second only, `d` with neither; `n` their
/// sum, `p1 = (a + b)/n`, `p2 = (a + c)/n`, Wilson limits `(l1, u1)`, `(l2, u2)`, and the
/// correlation `phi = C / sqrt((a+b)(c+d)(a+c)(b+d))` with `C = ad - bc - n/2` when
/// `ad - bc > n/2`, `ad - bc` when it is negative, else 0 (0 when the root is 0):
/// `lo = p1 - p2 - sqrt((p1-l1)^2 - 2 phi (p1-l1)(u2-p2) + (u2-p2)^2)`,
/// `hi = p1 - p2 + sqrt((p2-l2)^2 - 2 phi (p2-l2)(u1-p1) + (u1-p1)^2)`. `None` when `n == 0`.
pub fn newcombe_paired(a: u64, b: u64, c: u64, d: u64) -> Option<Interval> {
    let n = a + b + c + d;
    let (w1, w2) = (wilson95(a + b, n)?, wilson95(a + c, n)?);
    let nf = n as f64;
    let (p1, p2) = ((a + b) as f64 / nf, (a + c) as f64 / nf);
    let (af, bf, cf, df) = (a as f64, b as f64, c as f64, d as f64);
    let root = ((af + bf) * (cf + df) * (af + cf) * (bf + df)).sqrt();
    let det = af * df - bf * cf;
    let corrected = if det > nf / 2.0 {
        det - nf / 2.0
    } else if det < 0.0 {
        det
    } else {
        0.0
    };
    let phi = if root > 0.0 { corrected / root } else { 0.0 };
    let diff = p1 - p2;
    let (e1, e2) = (p1 - w1.lo, w2.hi - p2);
    let (f1, f2) = (p2 - w2.lo, w1.hi - p1);
    Some(Interval {
        lo: (diff - (e1 * e1 - 2.0 * phi * e1 * e2 + e2 * e2).max(0.0).sqrt()).max(-1.0),
        hi: (diff + (f1 * f1 - 2.0 * phi * f1 * f2 + f2 * f2).max(0.0).sqrt()).min(1.0),
    })
}

/// Welch's interval for `mean(a) - mean(b)` of two independent samples:
/// `diff +- t(0.975, nu) sqrt(s_a^2/n_a + s_b^2/n_b)` with the Welch-Satterthwaite degrees of
/// freedom `nu = (v_a + v_b)^2 / (v_a^2/(n_a-1) + v_b^2/(n_b-1))`, `v = s^2/n`. `None` below two
/// values on either side; a zero standard error gives the point (both samples constant).
pub fn welch(a: &Welford, b: &Welford) -> Option<Interval> {
    let (ma, mb) = (a.mean()?, b.mean()?);
    let (va, vb) = (a.var()? / a.n as f64, b.var()? / b.n as f64);
    let d = ma - mb;
    let se2 = va + vb;
    if se2 <= 0.0 {
        return Some(Interval { lo: d, hi: d });
    }
    let nu = se2 * se2 / (va * va / (a.n - 1) as f64 + vb * vb / (b.n - 1) as f64);
    let half = t_quantile(0.975, nu) * se2.sqrt();
    Some(Interval {
        lo: d - half,
        hi: d + half,
    })
}

/// Streaming least squares of `y` on `x` (co-moments by Welford's update).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Regression {
    /// Points seen.
    pub n: u64,
    mx: f64,
    my: f64,
    sxx: f64,
    syy: f64,
    sxy: f64,
}

impl Regression {
    /// Adds the point `(x, y)`.
    pub fn push(&mut self, x: f64, y: f64) {
        self.n += 1;
        let n = self.n as f64;
        let dx = x - self.mx;
        let dy = y - self.my;
        self.mx += dx / n;
        self.my += dy / n;
        self.sxx += dx * (x - self.mx);
        self.syy += dy * (y - self.my);
        self.sxy += dx * (y - self.my);
    }

    /// Adds `k` points at `x` whose `y` have the moments `w` (a group of equal `x`, as
    /// [`Welford`] keeps it): the same as pushing them one by one, up to rounding.
    pub fn push_group(&mut self, x: f64, w: &Welford) {
        let Some(my) = w.mean() else { return };
        let (na, nb) = (self.n as f64, w.n as f64);
        let n = na + nb;
        let (dx, dy) = (x - self.mx, my - self.my);
        self.sxx += dx * dx * na * nb / n;
        self.syy += w.m2() + dy * dy * na * nb / n;
        self.sxy += dx * dy * na * nb / n;
        self.mx += dx * nb / n;
        self.my += dy * nb / n;
        self.n += w.n;
    }

    /// The mean of `x` (`None` before the first point).
    pub fn mean_x(&self) -> Option<f64> {
        (self.n > 0).then_some(self.mx)
    }

    /// The slope `b = Sxy / Sxx` (`None` below two points or when every `x` is the same).
    pub fn slope(&self) -> Option<f64> {
        (self.n >= 2 && self.sxx > 0.0).then(|| self.sxy / self.sxx)
    }

    /// The standard error of the slope, `sqrt(RSS / (n - 2) / Sxx)` with
    /// `RSS = Syy - Sxy^2 / Sxx` (`None` below three points).
    pub fn slope_se(&self) -> Option<f64> {
        let b = self.slope()?;
        (self.n >= 3)
            .then(|| ((self.syy - b * self.sxy).max(0.0) / (self.n - 2) as f64 / self.sxx).sqrt())
    }

    /// The 95% interval of the slope, `b +- t(0.975, n - 2) se(b)`.
    pub fn slope_ci95(&self) -> Option<Interval> {
        let (b, se) = (self.slope()?, self.slope_se()?);
        let half = t_quantile(0.975, (self.n - 2) as f64) * se;
        Some(Interval {
            lo: b - half,
            hi: b + half,
        })
    }
}

/// The interval of the difference of two slopes, `b_a - b_b +- t(0.975, nu) sqrt(se_a^2 +
/// se_b^2)` with Welch-Satterthwaite degrees of freedom from `n - 2` on each side.
pub fn slope_difference(a: &Regression, b: &Regression) -> Option<Interval> {
    let (ba, bb) = (a.slope()?, b.slope()?);
    let (va, vb) = (a.slope_se()?.powi(2), b.slope_se()?.powi(2));
    let d = ba - bb;
    let se2 = va + vb;
    if se2 <= 0.0 {
        return Some(Interval { lo: d, hi: d });
    }
    let nu = se2 * se2 / (va * va / (a.n - 2) as f64 + vb * vb / (b.n - 2) as f64);
    let half = t_quantile(0.975, nu) * se2.sqrt();
    Some(Interval {
        lo: d - half,
        hi: d + half,
    })
}

/// Spearman's rank correlation of the pairs (average ranks for ties): Pearson's correlation of
/// the ranks. `None` below three pairs or when either side is constant.
pub fn spearman(pairs: &[(f64, f64)]) -> Option<f64> {
    let n = pairs.len();
    if n < 3 {
        return None;
    }
    let rx = ranks(pairs.iter().map(|p| p.0));
    let ry = ranks(pairs.iter().map(|p| p.1));
    let mut r = Regression::default();
    for (x, y) in rx.iter().zip(&ry) {
        r.push(*x, *y);
    }
    (r.sxx > 0.0 && r.syy > 0.0).then(|| (r.sxy / (r.sxx * r.syy).sqrt()).clamp(-1.0, 1.0))
}

/// The 95% interval of Spearman's rho by Fisher's z with the variance `1.06 / (n - 3)` of
/// Fieller, Hartley and Pearson (1957): `tanh(atanh(rho) +- z sqrt(1.06 / (n - 3)))`.
/// `None` below four pairs.
pub fn spearman_ci95(rho: f64, n: u64) -> Option<Interval> {
    if n < 4 || !rho.is_finite() {
        return None;
    }
    // atanh(+-1) is infinite; the interval is then the point.
    let z = rho.clamp(-1.0 + 1e-15, 1.0 - 1e-15).atanh();
    let half = Z_95 * (1.06 / (n - 3) as f64).sqrt();
    Some(Interval {
        lo: (z - half).tanh(),
        hi: (z + half).tanh(),
    })
}

/// Ranks `1..=n` of the values, ties sharing their average rank (NaN sorts last).
fn ranks(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut idx: Vec<(usize, f64)> = values.enumerate().collect();
    idx.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out = vec![0.0; idx.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && idx[j + 1].1 == idx[i].1 {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &(k, _) in &idx[i..=j] {
            out[k] = avg;
        }
        i = j + 1;
    }
    out
}

/// A small deterministic generator (SplitMix64) for the bootstrap and the reservoirs: the same
/// seed gives the same report on every machine.
#[derive(Clone, Copy, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (`n > 0`; Lemire's multiply-shift, bias below 2^-32 for
    /// the sizes used here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// The `q` quantile (`0 <= q <= 1`) of sorted values by the nearest-rank rule on `n` values:
/// the value at position `ceil(q n)` (1-based; position 1 for `q = 0`).
pub fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let pos = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(pos.min(sorted.len()) - 1).copied()
}

/// The `p` quantile (`0.5 <= p < 1`) of Student's t distribution with `df > 0` degrees of
/// freedom, by bisection on the distribution function (to full double precision).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    if !(p.is_finite() && (0.5..1.0).contains(&p) && df.is_finite() && df > 0.0) {
        return f64::NAN;
    }
    // 1 - cdf(t) for t >= 0 is I_x(df/2, 1/2) / 2 with x = df / (df + t^2).
    let upper_tail = |t: f64| 0.5 * reg_inc_beta(df / (df + t * t), 0.5 * df, 0.5);
    let target = 1.0 - p;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while upper_tail(hi) > target {
        hi *= 2.0;
        if hi > 1e300 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if upper_tail(mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// `ln Gamma(x)` for `x > 0` (Lanczos approximation, g = 7, nine coefficients; relative error
/// below 1e-15), with the reflection formula below 0.5.
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = core::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * core::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularized incomplete beta function `I_x(a, b)`, by its continued fraction evaluated
/// with the modified Lentz method (on the side of the symmetry `I_x(a,b) = 1 - I_{1-x}(b,a)`
/// where the fraction converges fast).
fn reg_inc_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - ln_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

/// The continued fraction of `I_x(a, b)` (terms `d_{2m+1}`, `d_{2m}` of the standard expansion).
fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    let mut f = d;
    for m in 1..1000 {
        let m = f64::from(m);
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        f *= c * d;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        let step = c * d;
        f *= step;
        if (step - 1.0).abs() < 1e-16 {
            break;
        }
    }
    f
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// Newcombe, R. G. (1998). Two-sided confidence intervals for the single proportion:
    /// comparison of seven methods. Statistics in Medicine 17, 857-872, Table I, method 3
    /// (the Wilson score interval without continuity correction), printed to 4 decimals.
    #[test]
    fn wilson_matches_newcombe_1998_table_1() {
        let published = [
            (81, 263, 0.2553, 0.3662),
            (15, 148, 0.0624, 0.1605),
            (0, 20, 0.0000, 0.1611),
            (1, 29, 0.0061, 0.1718),
        ];
        for (x, n, lo, hi) in published {
            let ci = wilson95(x, n).unwrap();
            assert!(
                close(ci.lo, lo, 5e-5) && close(ci.hi, hi, 5e-5),
                "{x}/{n}: got [{:.4}, {:.4}], published [{lo}, {hi}]",
                ci.lo,
                ci.hi
            );
        }
    }

    #[test]
    fn wilson_edges() {
        assert_eq!(wilson95(0, 0), None);
        assert_eq!(wilson95(3, 2), None);
        let all = wilson95(10, 10).unwrap();
        assert_eq!(all.hi, 1.0);
        assert!(all.lo > 0.69 && all.lo < 0.73, "{all:?}");
        // Symmetry: the interval of n - x is the mirror image of that of x.
        let a = wilson95(7, 31).unwrap();
        let b = wilson95(24, 31).unwrap();
        assert!(close(a.lo, 1.0 - b.hi, 1e-15) && close(a.hi, 1.0 - b.lo, 1e-15));
    }

    /// Two-sided 95% critical values of Student's t as printed in standard tables (for example
    /// the NIST/SEMATECH e-Handbook of Statistical Methods, table 1.3.6.7.2), 3 decimals.
    #[test]
    fn t_quantile_matches_published_table() {
        let table = [
            (1.0, 12.706),
            (2.0, 4.303),
            (3.0, 3.182),
            (5.0, 2.571),
            (10.0, 2.228),
            (20.0, 2.086),
            (30.0, 2.042),
            (100.0, 1.984),
        ];
        for (df, t) in table {
            let got = t_quantile(0.975, df);
            assert!(close(got, t, 5e-4), "df {df}: got {got}, table {t}");
        }
        // df = 1 is the Cauchy distribution: the quantile is tan(pi (p - 1/2)) exactly.
        let cauchy = (core::f64::consts::PI * 0.475).tan();
        assert!(close(t_quantile(0.975, 1.0), cauchy, 1e-9 * cauchy));
        // Large df tends to the normal quantile.
        assert!(close(t_quantile(0.975, 1e9), Z_95, 1e-6));
        assert!(t_quantile(0.975, 0.0).is_nan());
    }

    /// Newcombe (1998), "Interval estimation for the difference between independent
    /// proportions: comparison of eleven methods", Statistics in Medicine 17, 873-890, Table II,
    /// method 10 (the hybrid score interval), printed to 4 decimals.
    #[test]
    fn newcombe_matches_newcombe_1998_table_2() {
        let published = [
            ((56, 70, 48, 80), (0.0524, 0.3339)),
            ((9, 10, 3, 10), (0.1705, 0.8090)),
            ((6, 7, 2, 7), (0.0582, 0.8062)),
            ((5, 56, 0, 29), (-0.0381, 0.1926)),
            ((0, 10, 0, 20), (-0.1611, 0.2775)),
            ((0, 10, 0, 10), (-0.2775, 0.2775)),
            ((10, 10, 0, 20), (0.6791, 1.0000)),
            ((10, 10, 0, 10), (0.6075, 1.0000)),
        ];
        for ((k1, n1, k2, n2), (lo, hi)) in published {
            let ci = newcombe(k1, n1, k2, n2).unwrap();
            assert!(
                close(ci.lo, lo, 5e-5) && close(ci.hi, hi, 5e-5),
                "{k1}/{n1} - {k2}/{n2}: [{:.4}, {:.4}], published [{lo}, {hi}]",
                ci.lo,
                ci.hi
            );
        }
        assert_eq!(newcombe(1, 0, 1, 2), None);
    }

    /// The paired interval on the Cavo et al. (2012) table of Fagerland, Lydersen and Laake,
    /// "Statistical Analysis of Contingency Tables" (2017), chapter 8 (59 both, 6 first only,
    /// 16 second only, 80 neither): estimate -0.0621, 95% interval -0.1186 to -0.0046.
    #[test]
    fn newcombe_paired_matches_the_published_example() {
        let ci = newcombe_paired(59, 6, 16, 80).unwrap();
        assert!(
            close(ci.lo, -0.1186, 5e-5) && close(ci.hi, -0.0046, 5e-5),
            "{ci:?}"
        );
        // With no association (phi = 0) it is the square-and-add of the two Wilson intervals.
        let a = newcombe_paired(0, 0, 0, 34).unwrap();
        let w = wilson95(0, 34).unwrap();
        assert!(close(a.lo, -w.hi, 1e-12) && close(a.hi, w.hi, 1e-12));
        // Mirror: swapping the two measurements negates the interval.
        let m = newcombe_paired(59, 16, 6, 80).unwrap();
        assert!(close(m.lo, -ci.hi, 1e-12) && close(m.hi, -ci.lo, 1e-12));
        assert_eq!(newcombe_paired(0, 0, 0, 0), None);
    }

    /// R's `sleep` data (Cushny and Peebles): `t.test(extra ~ group, data = sleep)` prints the
    /// Welch interval -3.3654832 to 0.2054832; with `paired = TRUE`, -2.4598858 to -0.7001142.
    #[test]
    fn welch_and_paired_t_match_r_on_the_sleep_data() {
        let g1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0];
        let g2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4];
        let (mut a, mut b, mut d) = (Welford::default(), Welford::default(), Welford::default());
        for (x, y) in g1.iter().zip(&g2) {
            a.push(*x);
            b.push(*y);
            d.push(x - y);
        }
        let w = welch(&a, &b).unwrap();
        assert!(
            close(w.lo, -3.3654832, 5e-7) && close(w.hi, 0.2054832, 5e-7),
            "{w:?}"
        );
        let p = d.ci95().unwrap();
        assert!(
            close(p.lo, -2.4598858, 5e-7) && close(p.hi, -0.7001142, 5e-7),
            "{p:?}"
        );
    }

    /// R's `cars` data: `confint(lm(dist ~ speed, cars))` prints the slope interval 3.096964 to
    /// 4.767853 around 3.932409; the same points pushed as groups of equal speed agree.
    #[test]
    fn the_slope_interval_matches_r_on_the_cars_data() {
        let speed = [
            4, 4, 7, 7, 8, 9, 10, 10, 10, 11, 11, 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14,
            15, 15, 15, 16, 16, 17, 17, 17, 18, 18, 18, 18, 19, 19, 19, 20, 20, 20, 20, 20, 22, 23,
            24, 24, 24, 24, 25,
        ];
        let dist = [
            2, 10, 4, 22, 16, 10, 18, 26, 34, 17, 28, 14, 20, 24, 28, 26, 34, 34, 46, 26, 36, 60,
            80, 20, 26, 54, 32, 40, 32, 40, 50, 42, 56, 76, 84, 36, 46, 68, 32, 48, 52, 56, 64, 66,
            54, 70, 92, 93, 120, 85,
        ];
        let mut r = Regression::default();
        let mut groups: std::collections::BTreeMap<i32, Welford> = Default::default();
        for (x, y) in speed.iter().zip(&dist) {
            r.push(f64::from(*x), f64::from(*y));
            groups.entry(*x).or_default().push(f64::from(*y));
        }
        let ci = r.slope_ci95().unwrap();
        assert!(close(r.slope().unwrap(), 3.932409, 5e-7));
        assert!(
            close(ci.lo, 3.096964, 5e-7) && close(ci.hi, 4.767853, 5e-7),
            "{ci:?}"
        );
        let mut g = Regression::default();
        for (x, w) in &groups {
            g.push_group(f64::from(*x), w);
        }
        let gci = g.slope_ci95().unwrap();
        assert!(close(gci.lo, ci.lo, 1e-9) && close(gci.hi, ci.hi, 1e-9));
        // A slope minus itself is 0, with a symmetric interval.
        let d = slope_difference(&r, &r).unwrap();
        assert!(close(d.lo, -d.hi, 1e-12) && d.lo < 0.0);
    }

    #[test]
    fn spearman_ranks_ties_and_its_interval() {
        // y ranks 1, 2, 3.5, 5, 3.5 against 1..5: rho = 0.8207826816681233 (Pearson on ranks).
        let pairs = [(1.0, 5.0), (2.0, 6.0), (3.0, 7.0), (4.0, 8.0), (5.0, 7.0)];
        let rho = spearman(&pairs).unwrap();
        let (rx, ry) = ([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.5, 5.0, 3.5]);
        let (mx, my) = (3.0, 3.0);
        let sxy: f64 = rx.iter().zip(&ry).map(|(x, y)| (x - mx) * (y - my)).sum();
        let sxx: f64 = rx.iter().map(|x| (x - mx) * (x - mx)).sum();
        let syy: f64 = ry.iter().map(|y| (y - my) * (y - my)).sum();
        assert!(close(rho, sxy / (sxx * syy).sqrt(), 1e-12));
        let ci = spearman_ci95(rho, 5).unwrap();
        let half = Z_95 * (1.06f64 / 2.0).sqrt();
        assert!(close(ci.lo, (rho.atanh() - half).tanh(), 1e-12));
        assert!(close(ci.hi, (rho.atanh() + half).tanh(), 1e-12));
        assert_eq!(spearman(&[(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)]), None);
        assert_eq!(spearman_ci95(0.5, 3), None);
    }

    #[test]
    fn welford_merge_is_the_union() {
        let (mut a, mut b, mut all) = (Welford::default(), Welford::default(), Welford::default());
        for (i, x) in [1.0, 4.0, 2.5, 8.0, -3.0, 0.5, 7.25].iter().enumerate() {
            if i < 3 {
                a.push(*x)
            } else {
                b.push(*x)
            }
            all.push(*x);
        }
        a.merge(&b);
        assert_eq!(a.n, all.n);
        assert!(close(a.mean().unwrap(), all.mean().unwrap(), 1e-12));
        assert!(close(a.var().unwrap(), all.var().unwrap(), 1e-12));
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(nearest_rank(&v, 0.0), Some(1.0));
        assert_eq!(nearest_rank(&v, 0.025), Some(1.0));
        assert_eq!(nearest_rank(&v, 0.5), Some(2.0));
        assert_eq!(nearest_rank(&v, 0.975), Some(4.0));
        assert_eq!(nearest_rank(&[], 0.5), None);
        let mut r = SplitMix(7);
        assert!((0..1000).all(|_| r.below(3) < 3));
    }

    #[test]
    fn welford_mean_sd_and_interval() {
        let mut w = Welford::default();
        assert_eq!((w.mean(), w.sd(), w.ci95()), (None, None, None));
        for x in [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0] {
            w.push(x);
        }
        assert_eq!(w.n, 8);
        assert!(close(w.mean().unwrap(), 5.0, 1e-15));
        // Sum of squared deviations 32, n - 1 = 7.
        assert!(close(w.sd().unwrap(), (32.0f64 / 7.0).sqrt(), 1e-14));
        let ci = w.ci95().unwrap();
        let half = t_quantile(0.975, 7.0) * (32.0f64 / 7.0).sqrt() / 8f64.sqrt();
        assert!(close(ci.lo, 5.0 - half, 1e-12) && close(ci.hi, 5.0 + half, 1e-12));
        let mut one = Welford::default();
        one.push(0.3);
        assert_eq!((one.mean(), one.ci95()), (Some(0.3), None));
    }
}
