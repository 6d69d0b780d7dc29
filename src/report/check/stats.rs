//! The statistics of the check: the standard normal quantile Φ⁻¹, Student's t quantile, and the
//! per-point comparison (paired or unpaired standard error, Bonferroni-corrected critical value).

// Published coefficients and 17-digit reference values are kept as written.
#![allow(clippy::excessive_precision)]

use std::f64::consts::PI;

/// Complementary error function erfc(x) = 1 − erf(x), to about 1e-15 relative.
///
/// For |x| < 1.2: the everywhere-positive series erf(x) = 2/√π · e^{−x²} Σ 2ⁿx^{2n+1}/(2n+1)!!
/// (no cancellation in the sum; 1 − erf stays accurate while erf ≤ 0.92). For x ≥ 1.2: the Laplace continued fraction
/// erfc(x) = e^{−x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))), by the modified Lentz method.
/// Negative x use erfc(−x) = 2 − erfc(x).
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 1.2 {
        let x2 = x * x;
        let mut term = x;
        let mut sum = x;
        let mut n = 0.0;
        while term > sum * 1e-17 {
            n += 1.0;
            term *= 2.0 * x2 / (2.0 * n + 1.0);
            sum += term;
        }
        let erf = 2.0 / PI.sqrt() * (-x2).exp() * sum;
        return 1.0 - erf;
    }
    if x > 27.3 {
        return 0.0; // below the smallest subnormal
    }
    // f = x + a1/(x + a2/(x + …)), a_k = k/2.
    let tiny = 1e-300;
    let mut f = x;
    let mut c = x;
    let mut d = 0.0;
    for k in 1..1000 {
        let a = k as f64 / 2.0;
        d = x + a * d;
        if d.abs() < tiny {
            d = tiny;
        }
        c = x + a / c;
        if c.abs() < tiny {
            c = tiny;
        }
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x * x).exp() / PI.sqrt() / f
}

/// Standard normal distribution function Φ(x) = erfc(−x/√2)/2.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// Standard normal quantile Φ⁻¹(p): Acklam's rational approximation (relative error below
/// 1.2e-9) refined by one Halley step on Φ computed through [`erfc`], which brings it to about
/// machine precision. p = 0 and 1 give ∓∞; p outside [0, 1] or NaN gives NaN.
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e+01,
        2.209460984245205e+02,
        -2.759285104469687e+02,
        1.383577518672690e+02,
        -3.066479806614716e+01,
        2.506628277459239e+00,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e+01,
        1.615858368580409e+02,
        -1.556989798598866e+02,
        6.680131188771972e+01,
        -1.328068155288572e+01,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e+00,
        -2.549732539343734e+00,
        4.374664141464968e+00,
        2.938163982698783e+00,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-03,
        3.224671290700398e-01,
        2.445134137142996e+00,
        3.754408661907416e+00,
    ];
    const P_LOW: f64 = 0.02425;
    if !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    let x = if p < P_LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p <= 1.0 - P_LOW {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    };
    // Halley step on Φ(x) − p, with the error taken in the tail that is small.
    let e = if x < 0.0 {
        normal_cdf(x) - p
    } else {
        (1.0 - p) - normal_cdf(-x)
    };
    let u = e * (2.0 * PI).sqrt() * (x * x / 2.0).exp();
    x - u / (1.0 + x * u / 2.0)
}

/// Upper tail P(T > t) of Student's t with `nu` (≥ 1) integer degrees of freedom, for t ≥ 0,
/// from the closed forms of Abramowitz & Stegun 26.7.3–4 in θ = atan(t/√ν).
pub fn student_t_upper(t: f64, nu: u64) -> f64 {
    assert!(nu >= 1);
    if t <= 0.0 {
        return 0.5;
    }
    let theta = (t / (nu as f64).sqrt()).atan();
    let (s, c) = theta.sin_cos();
    let c2 = c * c;
    // A = P(|T| ≤ t).
    let a = if nu % 2 == 1 {
        let mut sum = 0.0;
        if nu > 1 {
            let mut term = 1.0;
            sum = 1.0;
            for j in 1..=(nu - 3) / 2 {
                term *= c2 * (2 * j) as f64 / (2 * j + 1) as f64;
                sum += term;
            }
            sum *= s * c;
        }
        2.0 / PI * (theta + sum)
    } else {
        let mut term = 1.0;
        let mut sum = 1.0;
        for j in 1..=(nu - 2) / 2 {
            term *= c2 * (2 * j - 1) as f64 / (2 * j) as f64;
            sum += term;
        }
        s * sum
    };
    ((1.0 - a) / 2.0).max(0.0)
}

/// Degrees of freedom above which Student's t is replaced by the normal (quantiles differ by
/// less than 1e-4 relative there).
pub const NORMAL_DF: f64 = 50_000.0;

/// Upper quantile t with P(T > t) = `upper` (0 < upper ≤ 0.5) of Student's t with `df` degrees
/// of freedom; a fractional df (Welch) is rounded down, which is conservative. df ≥ NORMAL_DF
/// or infinite uses the normal quantile.
pub fn student_t_upper_quantile(upper: f64, df: f64) -> f64 {
    let z = -normal_quantile(upper);
    if !(1.0..NORMAL_DF).contains(&df) {
        return z;
    }
    let nu = df.floor() as u64;
    // Bracket: t ≥ z always; double the upper end until the tail is below `upper`.
    let (mut lo, mut hi) = (z.max(0.0), z.max(1.0) * 2.0);
    while student_t_upper(hi, nu) > upper {
        lo = hi;
        hi *= 2.0;
        if hi > 1e300 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if student_t_upper(mid, nu) > upper {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-14 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// Welch–Satterthwaite degrees of freedom of SE² = se_b² + se_c²; infinite when both are 0.
pub fn welch_df(se_b: f64, k_b: usize, se_c: f64, k_c: usize) -> f64 {
    let (vb, vc) = (se_b * se_b, se_c * se_c);
    let num = (vb + vc) * (vb + vc);
    let mut den = 0.0;
    if k_b > 1 {
        den += vb * vb / (k_b as f64 - 1.0);
    }
    if k_c > 1 {
        den += vc * vc / (k_c as f64 - 1.0);
    }
    if den == 0.0 {
        f64::INFINITY
    } else {
        num / den
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
    }

    #[test]
    fn erfc_matches_known_values() {
        // Reference values to 17 digits (mpmath).
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.47950012218695346),
            (1.0, 0.15729920705028513),
            (1.1999, 0.089712759413364673),
            (1.2, 0.089686021770364632),
            (2.0, 0.0046777349810472658),
            (2.5, 0.00040695201744495894),
            (3.0, 2.2090496998585441e-05),
            (5.0, 1.5374597944280349e-12),
            (10.0, 2.0884875837625448e-45),
            (-1.0, 1.8427007929497149),
        ] {
            let got = erfc(x);
            assert!(
                close(got, want, 1e-14),
                "erfc({x}) = {got:e}, want {want:e}"
            );
        }
    }

    #[test]
    fn normal_quantile_matches_known_quantiles() {
        // Reference values to 17 digits (mpmath, √2·erfinv(2p − 1)).
        for (p, want) in [
            (0.975, 1.9599639845400542),
            (0.995, 2.5758293035489008),
            (0.999, 3.0902323061678135),
            (0.9999, 3.7190164854556806),
            (1e-5, -4.2648907939228246),
            (1e-10, -6.3613409024040562),
            (0.0125, -2.2414027276049454),
            (0.9990625, 3.1093491536764895),
        ] {
            let got = normal_quantile(p);
            assert!(
                close(got, want, 1e-13),
                "Φ⁻¹({p}) = {got:.17}, want {want:.17}"
            );
        }
        // Upper quantiles of p near 1 are limited by the representation of p itself (1 − p is off
        // by up to 1e-16 absolute); the check passes the small tail instead.
        assert_eq!(normal_quantile(0.5), 0.0);
        assert_eq!(normal_quantile(1.0), f64::INFINITY);
        assert!(normal_quantile(1.5).is_nan());
        // Round trip through Φ.
        for p in [1e-6, 0.01, 0.3, 0.7, 0.99, 1.0 - 1e-6] {
            assert!(close(normal_cdf(normal_quantile(p)), p, 1e-12), "{p}");
        }
    }

    #[test]
    fn student_t_quantile_matches_known_quantiles() {
        // (upper tail, df, t) — mpmath via the regularized incomplete beta function.
        for (upper, df, want) in [
            (0.025, 1.0, 12.706204736174705),
            (0.025, 2.0, 4.3026527297494639),
            (0.025, 10.0, 2.2281388519862747),
            (0.005, 5.0, 4.0321429835552281),
            (0.05, 30.0, 1.6972608865939578),
            (0.0001, 7.0, 7.063432828157514),
            (0.00005, 767.0, 3.9111513120303307),
            (0.0005, 3.0, 12.923978636687483),
            (0.0005, 3.7, 12.923978636687483), // Welch df rounds down
        ] {
            let got = student_t_upper_quantile(upper, df);
            assert!(
                close(got, want, 1e-10),
                "t({upper}, {df}) = {got:.15}, want {want:.15}"
            );
        }
        // Infinite df is the normal.
        assert!(close(
            student_t_upper_quantile(0.025, f64::INFINITY),
            1.9599639845400542,
            1e-13
        ));
    }

    #[test]
    fn welch_df_reduces_to_k_minus_1_for_one_side() {
        assert!(close(welch_df(0.3, 10, 0.0, 10), 9.0, 1e-12));
        assert!(close(welch_df(0.2, 5, 0.2, 5), 8.0, 1e-12));
        assert_eq!(welch_df(0.0, 5, 0.0, 5), f64::INFINITY);
    }
}
