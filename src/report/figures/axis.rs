//! Axes: scales, ranges, tick positions and tick labels (pure functions).

/// How raw values map to the drawing coordinate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    Log2,
    Log10,
}

impl Scale {
    pub fn fwd(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log2 => v.log2(),
            Scale::Log10 => v.log10(),
        }
    }
    /// Whether a raw value can be placed on this scale.
    pub fn admits(self, v: f64) -> bool {
        v.is_finite() && (self == Scale::Linear || v > 0.0)
    }
}

/// How tick values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickFormat {
    /// Plain numbers with up to 4 significant digits (8, 0.25, 1.5, 100).
    Number,
    /// Durations: 200 µs, 5 ms, 1.5 s.
    Seconds,
    /// Powers of ten as 10⁶, other values as 2×10⁶.
    Power10,
}

/// One axis: raw range, raw tick positions (labelled, with grid lines) and minor grid positions.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub scale: Scale,
    pub lo: f64,
    pub hi: f64,
    pub ticks: Vec<f64>,
    pub minor: Vec<f64>,
    pub format: TickFormat,
}

impl Axis {
    /// x axis over d values on log₂ spacing, ticks exactly at the d values present.
    pub fn features(ds: &[usize]) -> Axis {
        let mut ds: Vec<f64> = ds.iter().filter(|&&d| d > 0).map(|&d| d as f64).collect();
        ds.sort_by(f64::total_cmp);
        ds.dedup();
        let (lo, hi) = match (ds.first(), ds.last()) {
            (Some(&a), Some(&b)) if a < b => (a / 2f64.powf(0.3), b * 2f64.powf(0.3)),
            (Some(&a), _) => (a / 2.0, a * 2.0),
            _ => (1.0, 2.0),
        };
        Axis {
            scale: Scale::Log2,
            lo,
            hi,
            ticks: ds,
            minor: vec![],
            format: TickFormat::Number,
        }
    }

    /// An axis spanning the raw data values `vals` (non-admissible ones ignored) with a margin.
    /// Linear axes start at 0 when the data are non-negative and would come within a margin of 0.
    pub fn fit(scale: Scale, vals: &[f64], format: TickFormat) -> Axis {
        let vals: Vec<f64> = vals.iter().copied().filter(|&v| scale.admits(v)).collect();
        let (mut lo, mut hi) = vals
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        if !lo.is_finite() {
            (lo, hi) = if scale == Scale::Linear {
                (0.0, 1.0)
            } else {
                (1.0, 10.0)
            };
        }
        match scale {
            // A single value gets a range around it: ±10 % (linear) or ×/÷ 10^0.15 (log).
            Scale::Linear => {
                let pad = if hi > lo {
                    0.06 * (hi - lo)
                } else {
                    0.1 * lo.abs().max(1e-12)
                };
                let l = lo - pad;
                lo = if lo >= 0.0 && l < 0.0 { 0.0 } else { l };
                hi += pad;
            }
            Scale::Log2 | Scale::Log10 => {
                let (a, b) = (lo.log10(), hi.log10());
                let pad = if b > a { 0.06 * (b - a) } else { 0.15 };
                lo = 10f64.powf(a - pad);
                hi = 10f64.powf(b + pad);
            }
        }
        let (ticks, minor) = match scale {
            Scale::Linear => (linear_ticks(lo, hi, 6), vec![]),
            _ => log_ticks(lo, hi),
        };
        Axis {
            scale,
            lo,
            hi,
            ticks,
            minor,
            format,
        }
    }

    pub fn range(&self) -> std::ops::Range<f64> {
        self.scale.fwd(self.lo)..self.scale.fwd(self.hi)
    }

    /// The label of the tick at drawing coordinate `t` (empty when `t` is not a tick).
    pub fn label_at(&self, t: f64) -> String {
        let tol = 1e-9 * (1.0 + t.abs());
        self.ticks
            .iter()
            .find(|&&v| (self.scale.fwd(v) - t).abs() <= tol)
            .map(|&v| format_tick(v, self.format))
            .unwrap_or_default()
    }

    /// Clamps a raw value into the axis (used for error bars that leave a log axis below 0).
    pub fn clamp(&self, v: f64) -> f64 {
        if self.scale.admits(v) {
            v.clamp(self.lo, self.hi)
        } else {
            self.lo
        }
    }
}

/// "Nice" ticks (1, 2, 2.5, 5 × 10^k steps), about `target` of them, inside [lo, hi].
pub fn linear_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    if !lo.is_finite() || !hi.is_finite() || hi <= lo {
        return vec![];
    }
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last)
        .map(|k| round_sig(k as f64 * step, 12))
        .collect()
}

/// Ticks for a log axis: decades (with 2 and 5 between when they fit), or, for ranges under a
/// decade, linear nice ticks. The second vector is the minor grid (2..9 × 10^k).
pub fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    if hi.is_nan() || lo.is_nan() || hi <= lo || lo <= 0.0 {
        return (vec![], vec![]);
    }
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let within = |v: &f64| *v >= lo * (1.0 - 1e-12) && *v <= hi * (1.0 + 1e-12);
    let decade = |mults: &[f64]| -> Vec<f64> {
        (a..=b)
            .flat_map(|e| mults.iter().map(move |m| round_sig(m * 10f64.powi(e), 12)))
            .filter(within)
            .collect()
    };
    let minor = decade(&[2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    let decades = decade(&[1.0]);
    if decades.len() >= 4 {
        return (decades, minor);
    }
    let one_two_five = decade(&[1.0, 2.0, 5.0]);
    if one_two_five.len() >= 3 {
        return (one_two_five, minor);
    }
    let mut lin = linear_ticks(lo, hi, 5);
    if lin.len() < 3 {
        lin = linear_ticks(lo, hi, 8);
    }
    (lin, vec![])
}

fn round_sig(v: f64, digits: i32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(digits - 1 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// Up to 4 significant digits, trailing zeros dropped.
pub fn format_number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-4..1e6).contains(&a) {
        return format!("{:e}", round_sig(v, 3));
    }
    let decimals = (3 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{:.*}", decimals, round_sig(v, 4));
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn superscript(e: i32) -> String {
    e.to_string()
        .chars()
        .map(|c| match c {
            '-' => '⁻',
            '0' => '⁰',
            '1' => '¹',
            '2' => '²',
            '3' => '³',
            '4' => '⁴',
            '5' => '⁵',
            '6' => '⁶',
            '7' => '⁷',
            '8' => '⁸',
            _ => '⁹',
        })
        .collect()
}

pub fn format_tick(v: f64, f: TickFormat) -> String {
    match f {
        TickFormat::Number => format_number(v),
        TickFormat::Seconds => {
            let (x, unit) = if v >= 1.0 {
                (v, "s")
            } else if v >= 1e-3 {
                (v * 1e3, "ms")
            } else {
                (v * 1e6, "µs")
            };
            format!("{} {unit}", format_number(x))
        }
        TickFormat::Power10 => {
            if v <= 0.0 {
                return format_number(v);
            }
            let e = v.log10().floor() as i32;
            let m = round_sig(v / 10f64.powi(e), 3);
            if (m - 1.0).abs() < 1e-9 {
                format!("10{}", superscript(e))
            } else {
                format!("{}×10{}", format_number(m), superscript(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_axis_ticks_are_the_d_values() {
        let a = Axis::features(&[256, 8, 16, 16, 64]);
        assert_eq!(a.ticks, vec![8.0, 16.0, 64.0, 256.0]);
        assert!(a.lo < 8.0 && a.hi > 256.0);
        assert_eq!(a.label_at(Scale::Log2.fwd(64.0)), "64");
        assert_eq!(a.label_at(5.5), "");
    }

    #[test]
    fn log_ticks_pick_decades_or_finer() {
        let (t, _) = log_ticks(0.9, 110.0);
        assert_eq!(t, vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        let (t, minor) = log_ticks(0.001, 20.0);
        assert_eq!(t, vec![0.001, 0.01, 0.1, 1.0, 10.0]);
        assert!(minor.contains(&0.002) && minor.contains(&20.0));
        // Under a decade: linear nice ticks, at least three of them.
        let (t, _) = log_ticks(1.3, 2.2);
        assert!(t.len() >= 3, "{t:?}");
        assert!(t.iter().all(|&v| (1.3..=2.2).contains(&v)));
    }

    #[test]
    fn linear_axis_starts_at_zero_when_close() {
        let a = Axis::fit(Scale::Linear, &[0.05, 2.0, f64::NAN], TickFormat::Number);
        assert_eq!(a.lo, 0.0, "non-negative data never get a negative axis");
        assert!(a.hi > 2.0 && a.hi < 2.3);
        let a = Axis::fit(Scale::Linear, &[0.3, 2.0], TickFormat::Number);
        assert!(a.lo > 0.15 && a.lo < 0.3);
        let b = Axis::fit(Scale::Linear, &[4.0, 4.7], TickFormat::Number);
        assert!(
            b.lo > 3.9,
            "a narrow range far from 0 is not stretched to 0"
        );
        let l = Axis::fit(Scale::Log10, &[-1.0, 0.0, 2.0, 30.0], TickFormat::Number);
        assert!(
            l.lo > 1.0 && l.lo < 2.0,
            "non-positive values are ignored on log axes"
        );
    }

    #[test]
    fn tick_labels() {
        assert_eq!(format_number(2.5), "2.5");
        assert_eq!(format_number(100.0), "100");
        assert_eq!(format_number(0.0125), "0.0125");
        assert_eq!(format_tick(0.0002, TickFormat::Seconds), "200 µs");
        assert_eq!(format_tick(0.005, TickFormat::Seconds), "5 ms");
        assert_eq!(format_tick(1e6, TickFormat::Power10), "10⁶");
        assert_eq!(format_tick(2e-3, TickFormat::Power10), "2×10⁻³");
    }
}
