//! The budget schedules of the layer-level methods (docs/reference.md §9.2), as their authors' code
//! computes them.

use anyhow::{ensure, Result};

/// SnapKV's observation window w (also PyramidKV's and Ada-KV's here).
pub const WINDOW: usize = 32;
/// PyramidKV's β.
pub const PYRAMID_BETA: usize = 20;
/// Ada-KV's α.
pub const ADAKV_ALPHA: f64 = 0.2;

/// What PyramidKV keeps in layer ℓ of L at average budget d for a prompt of n_p tokens
/// (KVCache-Factory `PyramidKVCluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyramidKeep {
    /// n_p < d: no compression.
    All,
    /// This many pooled top-score tokens plus the window of w.
    TopPlusWindow(usize),
}

/// PyramidKV's schedule: n_p < d keeps all; n_p < 2(d − w) is uniform SnapKV (d − w); otherwise
/// min = (d − w) // β, max = 2(d − w) − min (capped at n_p − w, then min = 2(d − w) − max),
/// steps = (max − min) // (L − 1), and layer ℓ keeps max − ℓ·steps. L < 2 is refused (no steps).
pub fn pyramid_keep(d: usize, n_p: usize, layers: usize, layer: usize) -> Result<PyramidKeep> {
    ensure!(
        layers >= 2,
        "pyramidkv needs a model of at least 2 layers (it has {layers})"
    );
    ensure!(layer < layers, "layer {layer} of a {layers}-layer model");
    ensure!(d > WINDOW, "pyramidkv needs d > w = {WINDOW} (d = {d})");
    if n_p < d {
        return Ok(PyramidKeep::All);
    }
    let b = d - WINDOW;
    if n_p < 2 * b {
        return Ok(PyramidKeep::TopPlusWindow(b));
    }
    let mut min = b / PYRAMID_BETA;
    let mut max = 2 * b - min;
    if max >= n_p - WINDOW {
        max = n_p - WINDOW;
        min = 2 * b - max;
    }
    let steps = (max - min) / (layers - 1);
    Ok(PyramidKeep::TopPlusWindow(max - layer * steps))
}

/// Ada-KV's per-head caps (`AdaKVCluster`): with B = d − w and each query head's (pooled) scores,
/// the layer's top H·B entries over all heads (ties to the lower head, then the lower position),
/// c_h of them in head h, and cap_h = round_half_even(c_h·(1 − α) + ⌊α·B⌋). The caps may sum to
/// less than H·B, and one head may exceed B.
pub fn adakv_caps(scores: &[Vec<f64>], b: usize) -> Vec<usize> {
    let mut all: Vec<(f64, usize, usize)> = scores
        .iter()
        .enumerate()
        .flat_map(|(h, s)| s.iter().enumerate().map(move |(j, &v)| (v, h, j)))
        .collect();
    // Descending score; equal scores keep (head, position) order: a stable sort of the
    // concatenation, which is already in that order. NaN sorts last.
    all.sort_by(|a, c| {
        c.0.partial_cmp(&a.0)
            .unwrap_or_else(|| a.0.is_nan().cmp(&c.0.is_nan()))
    });
    let take = (scores.len() * b).min(all.len());
    let mut counts = vec![0usize; scores.len()];
    for &(_, h, _) in &all[..take] {
        counts[h] += 1;
    }
    let floor = (ADAKV_ALPHA * b as f64).floor();
    counts
        .iter()
        .map(|&c| (c as f64 * (1.0 - ADAKV_ALPHA) + floor).round_ties_even() as usize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pyramid_budgets_at_each_branch_of_the_schedule() {
        // The docs/reference.md example: d = 64, n_p = 1792, L = 30: min 1, max 63, steps 2; the layers'
        // mean is 34 pooled tokens, not d − w = 32.
        let keep = |l| match pyramid_keep(64, 1792, 30, l).unwrap() {
            PyramidKeep::TopPlusWindow(k) => k,
            PyramidKeep::All => unreachable!(),
        };
        assert_eq!((keep(0), keep(1), keep(29)), (63, 61, 5));
        let mean = (0..30).map(keep).sum::<usize>() as f64 / 30.0;
        assert_eq!(mean, 34.0);
        // n_p < d: everything; n_p < 2(d − w): uniform SnapKV.
        assert_eq!(pyramid_keep(256, 200, 30, 3).unwrap(), PyramidKeep::All);
        assert_eq!(
            pyramid_keep(256, 400, 30, 3).unwrap(),
            PyramidKeep::TopPlusWindow(224)
        );
        // max capped at n_p − w (possible only where min ≤ w): d = 256, n_p = 460: b = 224, min
        // 11, max 437 ≥ 428, so max = 428, min = 20, steps = 408 // 29 = 14.
        assert_eq!(
            pyramid_keep(256, 460, 30, 0).unwrap(),
            PyramidKeep::TopPlusWindow(428)
        );
        assert_eq!(
            pyramid_keep(256, 460, 30, 29).unwrap(),
            PyramidKeep::TopPlusWindow(428 - 29 * 14)
        );
        assert!(pyramid_keep(64, 1792, 1, 0).is_err());
        assert!(pyramid_keep(32, 1792, 30, 0).is_err());
    }

    #[test]
    fn adakv_caps_by_hand_with_ties_to_the_lower_head() {
        // Two heads, B = 5 (α·B = 1): the top 10 of the 12 scores. Head 0 holds 7 of them, head 1
        // holds 3 (the tie at 0.5 between head 0 position 5 and head 1 position 0 goes to head 0).
        let h0 = vec![9.0, 8.0, 7.0, 6.0, 0.6, 0.5];
        let h1 = vec![0.5, 5.0, 4.0, 3.0, 0.1, 0.0];
        // Sorted: 9 8 7 6 5 4 3 0.6 0.5(h0) 0.5(h1) | 0.1 0.0 → head 0: 6, head 1: 4.
        let caps = adakv_caps(&[h0.clone(), h1.clone()], 5);
        // cap = round_half_even(c·0.8 + 1): 6 → 5.8 → 6; 4 → 4.2 → 4.
        assert_eq!(caps, vec![6, 4]);
        // Ties: with 0.6 lowered below the tie, the tie decides the 10th slot for head 0.
        let mut h0b = h0;
        h0b[4] = 0.05;
        // Sorted: 9 8 7 6 5 4 3 0.5(h0) 0.5(h1) 0.1 → head 0: 5, head 1: 5.
        assert_eq!(adakv_caps(&[h0b, h1], 5), vec![5, 5]);
    }
}
