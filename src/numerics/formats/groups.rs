//! Integer groups of docs/reference.md §8.2: KIVI's asymmetric b-bit groups (`jy-yuan/KIVI`
//! `quant/new_pack.py`) and SageAttention's symmetric INT8/INT4 groups (`thu-ml/SageAttention`
//! `triton/quant_per_block.py`), both computed in the run's dtype `T`, one `T` operation at a
//! time in the order written in §8.2 (so an f64 run and an f32 run differ only by T's roundings).

use super::float::RunFloat;

/// KIVI asymmetric group in place: mn = min x, mx = max x, s = (mx − mn)/(2ᵇ − 1),
/// q = round_half_even(clamp((x − mn)/s, 0, 2ᵇ − 1)), x̂ = q·s + mn; x̂ = mn when s = 0.
///
/// As in KIVI the value is clamped before it is rounded (`clamp_(0, 2**bit-1).round_()`, torch's
/// round being half-to-even); x̂ is a product then a sum (no fused multiply-add). s and mn stay
/// in T: KIVI keeps them in the model's fp16 ([P≠C] in §8.2, far below the 2–4-bit error).
pub fn asym_group_roundtrip<T: RunFloat>(x: &mut [T], bits: u32) {
    assert!((1..=24).contains(&bits), "asymmetric group: {bits} bits");
    let Some(&first) = x.first() else { return };
    let (mut mn, mut mx) = (first, first);
    for &v in x.iter() {
        if v < mn {
            mn = v;
        }
        if v > mx {
            mx = v;
        }
    }
    let top = T::from_f64(((1u32 << bits) - 1) as f64);
    let s = (mx - mn) / top;
    if s == T::ZERO {
        x.fill(mn);
        return;
    }
    for v in x.iter_mut() {
        let t = (*v - mn) / s;
        let t = if t < T::ZERO {
            T::ZERO
        } else if t > top {
            top
        } else {
            t
        };
        *v = t.round_ties_even() * s + mn;
    }
}

/// SageAttention symmetric group in place: s = max|x|/Q_max, q = clamp(round_half_away(x/s),
/// −Q_max, Q_max), x̂ = s·q; s = 0 gives x̂ = 0 (Q_max = 127 for INT8, 7 for INT4).
///
/// round_half_away is the exact rounding (`T::round`). SageAttention's Triton kernel writes it
/// as `x += 0.5·sign(x)` then a truncating cast, which differs only where x/s lies within half
/// an ulp below a .5 (the addition then rounds up); §8.2 specifies the exact rounding.
pub fn sym_group_roundtrip<T: RunFloat>(x: &mut [T], qmax: i32) {
    assert!(qmax >= 1, "symmetric group: Q_max {qmax}");
    let amax = x
        .iter()
        .fold(T::ZERO, |a, &v| if v.abs() > a { v.abs() } else { a });
    let qm = T::from_f64(qmax as f64);
    let s = amax / qm;
    if s == T::ZERO {
        x.fill(T::ZERO);
        return;
    }
    for v in x.iter_mut() {
        let q = (*v / s).round_half_away();
        let q = if q > qm {
            qm
        } else if q < -qm {
            -qm
        } else {
            q
        };
        *v = s * q;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asym_hand_example_rounds_half_to_even() {
        // mn = −1, mx = 2, b = 2: s = 1; (x − mn)/s = 0, 1, 1.5, 3 → codes 0, 1, 2, 3
        let mut x = [-1.0f64, 0.0, 0.5, 2.0];
        asym_group_roundtrip(&mut x, 2);
        assert_eq!(x, [-1.0, 0.0, 1.0, 2.0]);
        // 0.5 → 0 and 2.5 → 2 (half to even), not 1 and 3
        let mut x = [0.0f32, 0.5, 2.5, 3.0];
        asym_group_roundtrip(&mut x, 2);
        assert_eq!(x, [0.0, 0.0, 2.0, 3.0]);
        // b = 4: s = 15/15 = 1 on 0..15, x̂ = x for integers
        let mut x: Vec<f64> = (0..16).map(f64::from).collect();
        asym_group_roundtrip(&mut x, 4);
        assert_eq!(x, (0..16).map(f64::from).collect::<Vec<_>>());
    }

    #[test]
    fn asym_zero_range_gives_mn() {
        let mut x = [2.5f32; 7];
        asym_group_roundtrip(&mut x, 2);
        assert_eq!(x, [2.5; 7]);
        let mut e: [f64; 0] = [];
        asym_group_roundtrip(&mut e, 4);
    }

    /// Codes in 0..2ᵇ−1 (x̂ on the grid mn + q·s) and |x̂ − x| ≤ s/2 up to T's rounding.
    fn asym_properties<T: RunFloat>(eps: f64) {
        let mut state = 12345u64;
        for bits in [2u32, 3, 4, 8] {
            for g in 0..200 {
                let x: Vec<T> = (0..32)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        T::from_f64(
                            ((state >> 11) as f64 / (1u64 << 53) as f64 - 0.3) * (g as f64 + 0.5),
                        )
                    })
                    .collect();
                let mut y = x.clone();
                asym_group_roundtrip(&mut y, bits);
                let top = ((1u32 << bits) - 1) as f64;
                let (mn, mx) = x.iter().fold((f64::MAX, f64::MIN), |(a, b), v| {
                    (a.min(v.to_f64()), b.max(v.to_f64()))
                });
                let s = (mx - mn) / top;
                for (a, b) in x.iter().zip(&y) {
                    let q = (b.to_f64() - mn) / s;
                    assert!(q > -eps * top && q < top * (1.0 + eps), "code {q} of {top}");
                    assert!((q - q.round()).abs() < eps * top, "off grid: {q}");
                    assert!(
                        (b.to_f64() - a.to_f64()).abs() <= s * (0.5 + eps * top),
                        "error > s/2"
                    );
                }
            }
        }
    }

    #[test]
    fn asym_codes_in_range_and_error_at_most_half_step() {
        asym_properties::<f64>(1e-12);
        asym_properties::<f32>(1e-5);
    }

    #[test]
    fn sym_hand_example_rounds_half_away() {
        // max|x| = 127: s = 1; 0.5 → 1, −0.5 → −1, 1.5 → 2, −2.5 → −3, 2.5 → 3 (half-even would
        // give 0, 0, 2, −2, 2)
        let mut x = [127.0f64, 0.5, -0.5, 1.5, -2.5, 2.5, -127.0];
        sym_group_roundtrip(&mut x, 127);
        assert_eq!(x, [127.0, 1.0, -1.0, 2.0, -3.0, 3.0, -127.0]);
        // INT4: max 7·2 = 14 → s = 2; 3 → 1.5 → 2 → 4; −5 → −2.5 → −3 → −6
        let mut x = [14.0f32, 3.0, -5.0, -14.0, 0.9];
        sym_group_roundtrip(&mut x, 7);
        assert_eq!(x, [14.0, 4.0, -6.0, -14.0, 0.0]);
    }

    #[test]
    fn sym_zero_scale_gives_zero() {
        let mut x = [0.0f32, -0.0, 0.0];
        sym_group_roundtrip(&mut x, 127);
        assert!(x.iter().all(|v| v.to_bits() == 0));
    }

    #[test]
    fn sym_error_at_most_half_step() {
        let mut state = 99u64;
        for qmax in [127, 7] {
            for _ in 0..500 {
                let x: Vec<f64> = (0..64)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                        ((state >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 7.0
                    })
                    .collect();
                let mut y = x.clone();
                sym_group_roundtrip(&mut y, qmax);
                let s = x.iter().fold(0.0f64, |a, v| a.max(v.abs())) / qmax as f64;
                for (a, b) in x.iter().zip(&y) {
                    let q = b / s;
                    assert!(q.abs() <= qmax as f64 * (1.0 + 1e-12) && (q - q.round()).abs() < 1e-9);
                    assert!((a - b).abs() <= s * (0.5 + 1e-12));
                }
            }
        }
    }
}
