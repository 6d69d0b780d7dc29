use super::*;
use crate::attention::test_util::exact_error;
use nalgebra::DMatrix;
use rand::SeedableRng;

use crate::attention::test_util::{
    assert_all_finite, assert_seed_determines_output, gauss, in_f32, run_seeded, vmean_error,
};
use crate::numerics::spectral::error_norms;
use crate::tensor_util::to_dmatrix;

fn t64(m: &DMatrix<f64>) -> Tensor {
    from_dmatrix(m, &crate::tensor_util::test_device(), DType::F64).unwrap()
}

fn head(n: usize, p: usize, std: f64, seed: u64) -> HeadInputs {
    let mut rng = TrialRng::seed_from_u64(seed);
    let (q, k, v) = (
        gauss(&mut rng, n, p, std),
        gauss(&mut rng, n, p, std),
        gauss(&mut rng, n, p, 1.0),
    );
    HeadInputs::new(t64(&q), t64(&k), t64(&v)).unwrap()
}

/// φ(x̃) with every factor of the definition, m^{-1/2} e^{‖x̃‖²/2} [cos Ωx̃, sin Ωx̃], in f64.
fn full_features(x: &DMatrix<f64>, omega: &DMatrix<f64>) -> DMatrix<f64> {
    let (n, p) = x.shape();
    let m = omega.nrows();
    let xt = x * (p as f64).powf(-0.25);
    let proj = &xt * omega.transpose();
    DMatrix::from_fn(n, 2 * m, |i, c| {
        let h = (xt.row(i).norm_squared() / 2.0).exp() / (m as f64).sqrt();
        if c < m {
            h * proj[(i, c)].cos()
        } else {
            h * proj[(i, c - m)].sin()
        }
    })
}

/// (Ô, D̂) from the textbook formula for the Ω that `seed` draws.
fn textbook(h: &HeadInputs, d: usize, seed: u64) -> (DMatrix<f64>, Vec<f64>) {
    let omega = orthogonal_gaussian(&mut TrialRng::seed_from_u64(seed), frequencies(d), h.p());
    let fq = full_features(&to_dmatrix(&h.q).unwrap(), &omega);
    let fk = full_features(&to_dmatrix(&h.k).unwrap(), &omega);
    let v = to_dmatrix(&h.v).unwrap();
    let num = &fq * (fk.transpose() * &v);
    let den = &fq * (fk.transpose() * DMatrix::from_element(h.n(), 1, 1.0));
    let out = DMatrix::from_fn(h.n(), v.ncols(), |i, c| num[(i, c)] / den[(i, 0)]);
    (out, den.iter().copied().collect())
}

/// The dropped query factor, m^{-1/2} and the key shift cancel: Ô equals the textbook formula
/// entry by entry, and D̂ is the textbook D̂ times m·e^{−‖q̃_i‖²/2}·e^{−max_j ‖k̃_j‖²/2} (positive,
/// so every sign survives — also at d = 2, where many D̂ are negative).
#[test]
fn equals_the_textbook_formula_for_the_same_omega() {
    for (d, std) in [(64, 0.4), (16, 0.8), (2, 0.8)] {
        let h = head(40, 8, std, 1);
        let a = run_seeded(&PerformerTrig, &h, d, 7);
        let (want, want_den) = textbook(&h, d, 7);
        let got = to_dmatrix(&a.output).unwrap();
        let den: Vec<f64> = a.normalizer.unwrap().to_vec1().unwrap();
        let q = to_dmatrix(&h.q).unwrap() * (8f64).powf(-0.25);
        let k = to_dmatrix(&h.k).unwrap() * (8f64).powf(-0.25);
        let kmax = k
            .row_iter()
            .map(|r| r.norm_squared() / 2.0)
            .fold(f64::MIN, f64::max);
        let m = frequencies(d) as f64;
        let scale = want_den.iter().fold(0f64, |s, x| s.max(x.abs()));
        for i in 0..h.n() {
            let factor = m * (-q.row(i).norm_squared() / 2.0 - kmax).exp();
            let expect = want_den[i] * factor;
            assert!(
                (den[i] - expect).abs()
                    <= 1e-10 * expect.abs().max(1e-300) + 1e-14 * scale * factor
            );
            if want_den[i].abs() > 1e-3 * scale {
                for c in 0..got.ncols() {
                    let (x, y) = (got[(i, c)], want[(i, c)]);
                    assert!(
                        (x - y).abs() <= 1e-8 * y.abs().max(1e-3),
                        "d {d} ({i}, {c}): {x} vs {y}"
                    );
                }
            }
        }
        if d == 2 {
            let negative = den.iter().filter(|&&x| x <= 0.0).count();
            assert!(
                negative > 0,
                "d = 2 should give rows with D̂ ≤ 0 (kept, counted)"
            );
        }
    }
}

/// E_Ω[φ(q̃)·φ(k̃)] = exp(q·k/√p) (m = 6 > p = 4: a partial second QR block).
#[test]
fn features_are_unbiased_for_the_softmax_kernel() {
    let p = 4;
    let q = DMatrix::from_row_slice(1, p, &[0.9, 0.2, -0.2, 0.1]);
    let k = DMatrix::from_row_slice(1, p, &[0.6, -0.3, 0.1, 0.2]);
    let qk: f64 = (&q * k.transpose())[(0, 0)];
    let target = (qk / 2.0).exp();
    let mut rng = TrialRng::seed_from_u64(42);
    let draws = 20_000;
    let vals: Vec<f64> = (0..draws)
        .map(|_| {
            let om = orthogonal_gaussian(&mut rng, 6, p);
            (full_features(&q, &om) * full_features(&k, &om).transpose())[(0, 0)]
        })
        .collect();
    let mean = vals.iter().sum::<f64>() / draws as f64;
    let var = vals.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (draws - 1) as f64;
    let se = (var / draws as f64).sqrt();
    assert!(
        (mean - target).abs() < 4.0 * se,
        "{mean} ± {se} vs {target}"
    );
    assert!(se < 0.01 * target, "se {se}");
}

#[test]
fn many_features_converge_to_softmax_attention() {
    let h = head(12, 8, 0.3, 2);
    let floor = vmean_error(&h);
    let err = |d: usize| {
        let o = run_seeded(&PerformerTrig, &h, d, 3).output;
        exact_error(&h, &o)
    };
    let (coarse, fine) = (err(64), err(16384));
    assert!(fine < 0.1 * floor, "{fine} vs V-Mean {floor}");
    assert!(fine < coarse, "{fine} vs {coarse}");
}

/// §6.2.1's synthetic evidence (independent numpy, q, k, v ~ 0.5·N(0, 1), n = 512, p = 64): rows
/// with D̂ ≤ 0 are 500 of 4096 (8 draws) at d = 8 and none at d ≥ 128.
#[test]
fn share_of_rows_with_nonpositive_normaliser_matches_the_spec() {
    let heads: Vec<HeadInputs> = (0..8).map(|s| head(512, 64, 0.5, 100 + s)).collect();
    let count = |d: usize| -> usize {
        heads
            .iter()
            .enumerate()
            .map(|(s, h)| {
                let den = run_seeded(&PerformerTrig, h, d, s as u64)
                    .normalizer
                    .unwrap();
                den.to_vec1::<f64>()
                    .unwrap()
                    .iter()
                    .filter(|&&x| x <= 0.0)
                    .count()
            })
            .sum()
    };
    let at8 = count(8);
    assert!(
        (350..=650).contains(&at8),
        "d = 8: {at8} of 4096 (spec 500)"
    );
    assert_eq!(count(128), 0);
}

#[test]
fn odd_d_uses_its_floor_and_d_below_two_is_refused() {
    let h = head(30, 8, 0.5, 4);
    let a = run_seeded(&PerformerTrig, &h, 5, 9).output;
    let b = run_seeded(&PerformerTrig, &h, 4, 9).output;
    assert_eq!(to_dmatrix(&a).unwrap(), to_dmatrix(&b).unwrap());
    assert!(PerformerTrig.check(30, 1).is_err());
    assert!(PerformerTrig.check(30, 2).is_ok());
    let err = PerformerTrig.approximate(&h, 1, &mut TrialRng::seed_from_u64(1));
    assert!(err.is_err());
}

#[test]
fn seeded_reproducible_f32_agrees_and_cost() {
    let h = head(200, 64, 0.5, 5);
    let a = assert_seed_determines_output(&PerformerTrig, &h, 128, 11);
    assert_all_finite(&a.output);
    let b = run_seeded(&PerformerTrig, &in_f32(&h), 128, 11);
    assert_eq!(b.output.dtype(), DType::F32);
    let diff = error_norms(&a.output, &b.output.to_dtype(DType::F64).unwrap())
        .unwrap()
        .spectral;
    assert!(
        diff < 1e-4
            * error_norms(&a.output, &(&a.output * 0.0).unwrap())
                .unwrap()
                .spectral
    );
    // 3ndp + ⌈m/p⌉p³ (m = d/2).
    assert_eq!(
        PerformerTrig.macs(4096, 64, 64),
        3.0 * 4096.0 * 64.0 * 64.0 + 64f64.powi(3)
    );
    assert_eq!(
        PerformerTrig.macs(512, 64, 256),
        3.0 * 512.0 * 256.0 * 64.0 + 2.0 * 64f64.powi(3)
    );
}
