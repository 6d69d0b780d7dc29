//! SageAttention on a layer beyond its mask (docs/reference.md §7.7.6), against §8.4 written out
//! literally in float64 here: τ folded into Q′, K smoothed, the kernel's quantizers, the logits
//! with the smoothing's row constant added back and capped, then per row its key blocks from the
//! one holding its first window key to its diagonal, the running maximum, and the sink in ℓ after
//! the last block. Also: no windowed §8 method reads a key outside the key blocks its query block
//! needs.

use super::kivi::Kivi;
use super::kv_cache::{CacheFormat, KvCache};
use super::online_softmax::{KEY_BLOCK, QUERY_BLOCK};
use super::sage::{e4m3_p, e4m3_per_channel, Sage, SageKernel};
use super::spec_tests::{full_spec, head, max_diff, out, qkv, Qkv, N, P};
use super::HostMat;
use crate::attention::spec::AttentionSpec;
use crate::attention::Method;
use crate::numerics::formats::{sym_group_roundtrip, RunFloat};

/// Row i of an [n, p] row-major matrix.
fn row(x: &[f64], i: usize) -> &[f64] {
    &x[i * P..(i + 1) * P]
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The mean of each block of `rows` rows (summed in order, then divided), and the rows less
/// their block's mean.
fn block_means(x: &[f64], rows: usize) -> (Vec<Vec<f64>>, Vec<f64>) {
    let mut means = Vec::new();
    let mut less = Vec::with_capacity(x.len());
    for block in x.chunks(rows * P) {
        let r = (block.len() / P) as f64;
        let mut m = vec![0.0; P];
        block
            .chunks(P)
            .for_each(|t| m.iter_mut().zip(t).for_each(|(a, b)| *a += b));
        m.iter_mut().for_each(|a| *a /= r);
        block
            .chunks(P)
            .for_each(|t| less.extend(t.iter().zip(&m).map(|(a, b)| a - b)));
        means.push(m);
    }
    (means, less)
}

/// Symmetric integer groups of `rows` rows.
fn sym(x: &mut [f64], rows: usize, qmax: i32) {
    x.chunks_mut(rows * P)
        .for_each(|g| sym_group_roundtrip(g, qmax));
}

/// The kernel's logits S (capped) and its V̂ and Q_P, in float64.
fn sage_logits(kernel: SageKernel, (q, k, v): &Qkv, spec: &AttentionSpec) -> SageInputs {
    let qp: Vec<f64> = q.iter().map(|x| x * spec.scale).collect();
    let (kbar, ks) = block_means(k, N);
    let kbar = &kbar[0];
    let (mut qh, mut kh, mut vh) = (qp.clone(), ks.clone(), v.clone());
    let mut qbar: Option<Vec<Vec<f64>>> = None;
    let e4m3_v = |v: &mut Vec<f64>| {
        let mut m = HostMat {
            rows: N,
            cols: P,
            data: v.clone(),
        };
        e4m3_per_channel(&mut m);
        *v = m.data;
    };
    let quant_p: fn(f64) -> f64 = match kernel {
        SageKernel::Sage1 => {
            sym(&mut qh, QUERY_BLOCK, 127);
            sym(&mut kh, KEY_BLOCK, 127);
            vh.iter_mut().for_each(|x| *x = x.round_f16());
            |x| x.round_f16()
        }
        SageKernel::Sage2Int8 => {
            sym(&mut qh, 1, 127);
            sym(&mut kh, 1, 127);
            e4m3_v(&mut vh);
            e4m3_p::<f64>
        }
        SageKernel::Sage2Int4 | SageKernel::Identity => {
            let (means, less) = block_means(&qp, QUERY_BLOCK);
            qbar = Some(means);
            qh = less;
            if kernel == SageKernel::Sage2Int4 {
                sym(&mut qh, 1, 7);
                sym(&mut kh, 1, 7);
                e4m3_v(&mut vh);
                e4m3_p::<f64>
            } else {
                |x| x
            }
        }
    };
    let s = (0..N)
        .map(|i| {
            let shift = dot(row(&qp, i), kbar);
            (0..N)
                .map(|j| {
                    let mean = qbar
                        .as_ref()
                        .map_or(0.0, |b| dot(&b[i / QUERY_BLOCK], row(&ks, j)));
                    let s = dot(row(&qh, i), row(&kh, j)) + mean + shift;
                    spec.softcap.map_or(s, |c| c * (s / c).tanh())
                })
                .collect()
        })
        .collect();
    SageInputs { s, vh, quant_p }
}

struct SageInputs {
    s: Vec<Vec<f64>>,
    vh: Vec<f64>,
    quant_p: fn(f64) -> f64,
}

/// §8.4's recursion for row i over its key blocks, then Ô_i = acc/(ℓ + e^{σ − m}).
fn literal_row(x: &SageInputs, spec: &AttentionSpec, i: usize) -> Vec<f64> {
    let lo = (i + 1).saturating_sub(spec.window.unwrap_or(N));
    let (mut m, mut l, mut acc) = (f64::NEG_INFINITY, 0.0, vec![0.0; P]);
    for c0 in (lo / KEY_BLOCK * KEY_BLOCK..=i).step_by(KEY_BLOCK) {
        let keys = c0.max(lo)..(c0 + KEY_BLOCK).min(i + 1);
        let m_new = keys.clone().fold(m, |a, j| a.max(x.s[i][j]));
        let r = (m - m_new).exp();
        l *= r;
        acc.iter_mut().for_each(|a| *a *= r);
        for j in keys {
            let pij = (x.s[i][j] - m_new).exp();
            l += pij;
            let qp = (x.quant_p)(pij);
            acc.iter_mut()
                .zip(row(&x.vh, j))
                .for_each(|(a, &v)| *a += qp * v);
        }
        m = m_new;
    }
    let denom = l + spec.sink(0).map_or(0.0, |s| (s - m).exp());
    acc.iter().map(|a| a / denom).collect()
}

/// Every SageAttention kernel under the full spec (a sink above the cap and one below) is the
/// literal float64 kernel; the spec matters (the plain causal kernel is far from it).
#[test]
fn sage_under_a_full_spec_is_its_literal_float64_kernel() {
    let x = qkv(4);
    for sink in [6.0, 1.0] {
        let spec = full_spec(100, sink);
        let h = head(&x, spec.clone());
        for kernel in [
            SageKernel::Sage1,
            SageKernel::Sage2Int8,
            SageKernel::Sage2Int4,
            SageKernel::Identity,
        ] {
            let inputs = sage_logits(kernel, &x, &spec);
            let want: Vec<f64> = (0..N)
                .flat_map(|i| literal_row(&inputs, &spec, i))
                .collect();
            let m = Sage { kernel };
            let got = out(&m, &h);
            let e = max_diff(&got, &want);
            assert!(e < 1e-12, "{kernel:?} σ = {sink}: {e}");
            let plain = head(&x, AttentionSpec::causal(P, None));
            assert!(max_diff(&got, &out(&m, &plain)) > 0.1, "{kernel:?}");
        }
    }
}

/// Under a window of 40 a query block from row 128 on needs no key of key block 0: with V's rows
/// 0..64 NaN, those rows come out finite and with the same bits as with V's rows zero, for the
/// caches (the spec kernels), KIVI and SageAttention (the online softmax), each with its formats
/// the identity (so that no scale or group mixes the NaN into other tokens).
#[test]
fn windowed_runs_never_read_keys_outside_the_window() {
    let (q, k, mut v) = qkv(5);
    let spec = full_spec(40, 1.0);
    v[..KEY_BLOCK * P].iter_mut().for_each(|x| *x = 0.0);
    let zero = head(&(q.clone(), k.clone(), v.clone()), spec.clone());
    v[..KEY_BLOCK * P].iter_mut().for_each(|x| *x = f64::NAN);
    let nan = head(&(q, k, v), spec);
    let methods: [Box<dyn Method>; 3] = [
        Box::new(KvCache {
            format: CacheFormat::Identity,
        }),
        Box::new(Kivi { bits: 0 }),
        Box::new(Sage {
            kernel: SageKernel::Identity,
        }),
    ];
    for m in methods {
        let (a, b) = (out(m.as_ref(), &zero), out(m.as_ref(), &nan));
        let bits = |x: &[f64]| {
            x[QUERY_BLOCK * P..]
                .iter()
                .map(|y| y.to_bits())
                .collect::<Vec<_>>()
        };
        assert!(a.iter().all(|y| y.is_finite()), "{}", m.id());
        assert!(bits(&a) == bits(&b), "{}", m.id());
        // The rows that see the NaN keys do take them (the test is not vacuous).
        assert!(b[..P].iter().any(|y| y.is_nan()), "{}", m.id());
    }
}
