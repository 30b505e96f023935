//! The statistics of `care analyze`: Wilson score intervals for proportions, Student-t
//! intervals for means, and a streaming mean/variance (sufficient statistics, never rows).

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
