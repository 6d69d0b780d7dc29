//! Softmax restricted to a gathered key set per query (docs/reference.md §6.1 "Common form"), written
//! once for every restrict-and-renormalise method (window, top-k, BigBird, Reformer, and the
//! exact parts of the hybrids):
//!
//!   Ô_i = Σ_{j∈V_i} e^{s_ij − m_i} v_j / Σ_{j∈V_i} e^{s_ij − m_i},  s_ij = q_i·k_j/√p,  m_i = max_{j∈V_i} s_ij.
//!
//! The sets come as [`KeyGroup`]s: query rows that share one key list (a block of a block-sparse
//! pattern, or a single row for per-row sets), optionally thinned per row by a predicate (a sliding
//! window over a row block). Groups of similar size are padded to one shape and run as batched
//! products on the tensors' own device — gather K_J and V_J, S = Q_g K_Jᵀ, shifted exp, E·V_J — so
//! only the visited entries (plus the padding of a chunk) are ever formed, never an n×n mask.
//! Padded and filtered-out slots get −∞ (weight exactly 0, not −1e4).
//!
//! Precision follows exact attention (`attention/exact.rs`): on the CPU in f32 the exponentials
//! are the in-place vectorised ones with row sums accumulated in f64 and the normalisation applied
//! after E·V; elsewhere (f64, or another device) candle's ops in the working dtype. The index
//! lists are built on the host and uploaded; the products stay on the device. One exception:
//! small groups (single rows, tiny blocks) on the CPU run as plain f64 loops
//! (`key_sets/host.rs`), because a batch of thousands of tiny products is all call overhead.

use anyhow::{bail, ensure, Result};
use candle_core::{DType, Tensor, D};
use rayon::prelude::*;

use crate::numerics::shifted_exp::shifted_exp_rows_in_place;

mod host;

/// Query rows that all visit (a subset of) the same keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGroup {
    /// The group's query rows. Across all groups every query row appears exactly once.
    pub rows: Vec<usize>,
    /// The keys the rows may visit, without duplicates (a key is never counted twice).
    pub keys: Vec<usize>,
}

/// Which keys of its group's list a query row visits: `visits(i, j)`. `None` in
/// [`key_set_softmax`] means every key of the group.
pub type RowFilter<'a> = &'a (dyn Fn(usize, usize) -> bool + Sync);

/// How a row's logits come from q·k (docs/reference.md §7.7.6): s = τ·q·k, capped to c·tanh(s/c)
/// with a soft-cap, and a sink logit σ in every row's denominator (a key with a zero value that
/// no set holds). [`KeyLogits::plain`] is every method's before §7.7: τ = 1/√p alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyLogits {
    pub scale: f64,
    pub softcap: Option<f64>,
    pub sink: Option<f64>,
}

impl KeyLogits {
    /// τ = 1/√p, no cap, no sink.
    pub fn plain(p: usize) -> Self {
        Self {
            scale: 1.0 / (p as f64).sqrt(),
            softcap: None,
            sink: None,
        }
    }
}

/// Ô ([n, p_v], the inputs' dtype) and, on request, log Σ_{j∈V_i} e^{s_ij} ([n], f64): the
/// log-normaliser that lets a caller merge this part with another (a sampled residual, a
/// low-rank remainder) by log-sum-exp weights.
pub struct KeySetOutput {
    pub output: Tensor,
    pub log_normalizer: Option<Tensor>,
}

/// Gathered entries per chunk (slots × keys × max(rows, p)): about 2 MB of f32 per gathered
/// operand, so a chunk stays in cache-sized pieces and a head splits into several chunks that
/// run in parallel (as exact attention's row blocks do).
const CHUNK_ENTRIES: usize = 1 << 19;

/// Groups of at most this many (row, key) slots — and single rows — run as host loops on the
/// CPU: below it a batched gemm call costs more in fixed overhead than the loops in arithmetic
/// (BigBird and Reformer blocks at d ≤ 16, per-row sets).
const HOST_MAX_PAIRS: usize = 256;

/// Softmax of each query over its visited keys (see the module comment). Errors, never panics,
/// on mismatched shapes, a row covered zero or several times, an index out of range, a key
/// listed twice in a group, or a row that visits no key.
pub fn key_set_softmax(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    groups: &[KeyGroup],
    filter: Option<RowFilter>,
    want_log_normalizer: bool,
) -> Result<KeySetOutput> {
    let logits = KeyLogits::plain(q.dim(1)?);
    key_set_softmax_logits(q, k, v, groups, filter, want_log_normalizer, logits)
}

/// [`key_set_softmax`] with a layer's logits ([`KeyLogits`]). The log-normaliser stays over
/// the real keys of the set (a sink is no key): the mass a set captures is
/// e^{log-normaliser − log D} with D the exact row's, sink included (§7.7.6).
pub fn key_set_softmax_logits(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    groups: &[KeyGroup],
    filter: Option<RowFilter>,
    want_log_normalizer: bool,
    logits: KeyLogits,
) -> Result<KeySetOutput> {
    key_set_softmax_paths(q, k, v, groups, filter, want_log_normalizer, logits, true)
}

/// [`key_set_softmax_logits`] with the CPU's host loops switched on or off (tests run both).
#[allow(clippy::too_many_arguments)]
pub(crate) fn key_set_softmax_paths(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    groups: &[KeyGroup],
    filter: Option<RowFilter>,
    want_log_normalizer: bool,
    logits: KeyLogits,
    host_loops: bool,
) -> Result<KeySetOutput> {
    let out = key_set_softmax_unsunk(
        q,
        k,
        v,
        groups,
        filter,
        want_log_normalizer || logits.sink.is_some(),
        (logits.scale, logits.softcap),
        host_loops,
    )?;
    let Some(sink) = logits.sink else {
        return Ok(out);
    };
    // With a sink σ: Ô_i = Σ e^{s_ij} v_j / (e^σ + Σ e^{s_ij}) = (the set's softmax) · w_i with
    // w_i = 1/(1 + e^{σ − L_i}), L_i the set's log-normaliser: a factor in (0, 1], in f64.
    let lse = out.log_normalizer.expect("requested");
    let w = ((lse.affine(-1.0, sink)?.exp()? + 1.0)?.recip()?).to_dtype(out.output.dtype())?;
    Ok(KeySetOutput {
        output: out.output.broadcast_mul(&w.unsqueeze(1)?)?,
        log_normalizer: want_log_normalizer.then_some(lse),
    })
}

/// The set softmax without a sink, under scale τ and an optional soft-cap.
#[allow(clippy::too_many_arguments)]
fn key_set_softmax_unsunk(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    groups: &[KeyGroup],
    filter: Option<RowFilter>,
    want_log_normalizer: bool,
    (scale, softcap): (f64, Option<f64>),
    host_loops: bool,
) -> Result<KeySetOutput> {
    let (n, p) = q.dims2()?;
    let (nk, pk) = k.dims2()?;
    let (nv, _) = v.dims2()?;
    ensure!(
        pk == p && nv == nk,
        "key sets: q [{n}, {p}], k [{nk}, {pk}] and v [{nv}, _] do not fit together"
    );
    validate(groups, n, nk)?;
    let qs = (q * scale)?;

    // Chunks of groups of similar shape: sort by (keys, rows) and cut where the padded shape
    // would waste more than a quarter, or the chunk would pass its entry budget.
    let mut order: Vec<usize> = (0..groups.len())
        .filter(|&g| !groups[g].rows.is_empty())
        .collect();
    order.sort_by_key(|&g| (groups[g].keys.len(), groups[g].rows.len(), g));
    let mut chunks: Vec<&[usize]> = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let first = &groups[order[start]];
        let mut end = start + 1;
        let (mut r_max, mut l_max) = (first.rows.len(), first.keys.len());
        while end < order.len() {
            let g = &groups[order[end]];
            let (r, l) = (r_max.max(g.rows.len()), l_max.max(g.keys.len()));
            let fits = (end + 1 - start) * l * r.max(p) <= CHUNK_ENTRIES;
            let similar = 4 * l <= 5 * first.keys.len() + 32 && 4 * r <= 5 * first.rows.len() + 4;
            if !(fits && similar) {
                break;
            }
            (r_max, l_max, end) = (r, l, end + 1);
        }
        chunks.push(&order[start..end]);
        start = end;
    }

    // Chunks of small groups on the CPU (per-row sets, tiny blocks) take the host loops (see
    // `host.rs`); everything else the batched products on the device.
    let small = |chunk: &[usize]| {
        let r = chunk
            .iter()
            .map(|&g| groups[g].rows.len())
            .max()
            .unwrap_or(0);
        let l = chunk
            .iter()
            .map(|&g| groups[g].keys.len())
            .max()
            .unwrap_or(0);
        r == 1 || r * l <= HOST_MAX_PAIRS
    };
    let host = if host_loops && q.device().is_cpu() && chunks.iter().any(|c| small(c)) {
        Some(host::HostHead::new(&qs, k, v, softcap)?)
    } else {
        None
    };
    let parts = chunks
        .par_iter()
        .map(|chunk| match &host {
            Some(h) if small(chunk) => {
                h.run_groups(groups, chunk, filter, want_log_normalizer, v.dtype())
            }
            _ => run_chunk(
                &qs,
                (k, v),
                softcap,
                groups,
                chunk,
                filter,
                want_log_normalizer,
            ),
        })
        .collect::<Result<Vec<_>>>()?;

    // Row i's output sits at its first slot; one gather puts the rows back in order.
    let mut slot_of = vec![usize::MAX; n];
    let mut base = 0;
    for part in &parts {
        for (s, &row) in part.slot_rows.iter().enumerate() {
            if let Some(i) = row {
                slot_of[i] = base + s;
            }
        }
        base += part.slot_rows.len();
    }
    let idx = index_u32(&slot_of, q.device())?;
    let outs: Vec<&Tensor> = parts.iter().map(|c| &c.output).collect();
    let output = Tensor::cat(&outs, 0)?.index_select(&idx, 0)?;
    let log_normalizer = if want_log_normalizer {
        let logs: Vec<&Tensor> = parts
            .iter()
            .map(|c| c.log_normalizer.as_ref().expect("requested"))
            .collect();
        Some(Tensor::cat(&logs, 0)?.index_select(&idx, 0)?)
    } else {
        None
    };
    Ok(KeySetOutput {
        output,
        log_normalizer,
    })
}

/// Every query row exactly once, every index in range, no key twice within a group.
fn validate(groups: &[KeyGroup], n: usize, nk: usize) -> Result<()> {
    let mut seen = vec![false; n];
    let mut stamp = vec![usize::MAX; nk];
    for (g, group) in groups.iter().enumerate() {
        ensure!(!group.keys.is_empty(), "key sets: group {g} has no keys");
        for &i in &group.rows {
            ensure!(i < n, "key sets: query row {i} out of range (n = {n})");
            ensure!(!seen[i], "key sets: query row {i} is in two groups");
            seen[i] = true;
        }
        for &j in &group.keys {
            ensure!(j < nk, "key sets: key {j} out of range (n = {nk})");
            ensure!(stamp[j] != g, "key sets: key {j} listed twice in group {g}");
            stamp[j] = g;
        }
    }
    if let Some(i) = seen.iter().position(|&s| !s) {
        bail!("key sets: query row {i} is in no group");
    }
    Ok(())
}

/// One chunk's outputs, one slot per padded row (`None` for padding).
struct ChunkOut {
    output: Tensor,
    log_normalizer: Option<Tensor>,
    slot_rows: Vec<Option<usize>>,
}

fn run_chunk(
    qs: &Tensor,
    (k, v): (&Tensor, &Tensor),
    softcap: Option<f64>,
    groups: &[KeyGroup],
    chunk: &[usize],
    filter: Option<RowFilter>,
    want_log: bool,
) -> Result<ChunkOut> {
    let dev = qs.device();
    let (p, pv) = (qs.dim(1)?, v.dim(1)?);
    let g_count = chunk.len();
    let r_max = chunk
        .iter()
        .map(|&g| groups[g].rows.len())
        .max()
        .unwrap_or(0);
    let l_max = chunk
        .iter()
        .map(|&g| groups[g].keys.len())
        .max()
        .unwrap_or(0);

    // Padding repeats a group's first row or key; padded keys are masked, padded rows dropped.
    let mut row_idx = Vec::with_capacity(g_count * r_max);
    let mut slot_rows = Vec::with_capacity(g_count * r_max);
    let mut key_idx = Vec::with_capacity(g_count * l_max);
    let mut bias = vec![0f64; g_count * r_max * l_max];
    let mut masked = false;
    for (gi, &g) in chunk.iter().enumerate() {
        let KeyGroup { rows, keys } = &groups[g];
        key_idx.extend((0..l_max).map(|l| keys.get(l).copied().unwrap_or(keys[0])));
        for r in 0..r_max {
            let row = rows.get(r).copied();
            let i = row.unwrap_or(rows[0]); // groups without rows never reach a chunk
            row_idx.push(i);
            slot_rows.push(row);
            let b = &mut bias[(gi * r_max + r) * l_max..][..l_max];
            let mut visited = 0;
            for (l, slot) in b.iter_mut().enumerate() {
                let on = l < keys.len() && filter.is_none_or(|f| f(i, keys[l]));
                if on {
                    visited += 1;
                } else {
                    *slot = f64::NEG_INFINITY;
                    masked = true;
                }
            }
            if row.is_some() && visited == 0 {
                bail!("key sets: query row {i} visits no key");
            }
        }
    }
    let gather = |t: &Tensor, idx: &[usize], len: usize, width: usize| -> Result<Tensor> {
        Ok(t.index_select(&index_u32(idx, dev)?, 0)?
            .reshape((g_count, len, width))?)
    };
    let qg = gather(qs, &row_idx, r_max, p)?;
    let kg = gather(k, &key_idx, l_max, p)?;
    let vg = gather(v, &key_idx, l_max, pv)?;
    let mut s = qg.matmul(&kg.transpose(1, 2)?)?; // [G, R, L]
    if let Some(c) = softcap {
        s = ((s / c)?.tanh()? * c)?;
    }
    if masked {
        let b = Tensor::from_vec(bias, (g_count, r_max, l_max), dev)?.to_dtype(s.dtype())?;
        s = (s + b)?;
    }
    let rows = g_count * r_max;
    let s = s.reshape((rows, l_max))?;
    let (e, sums, log_norm) = match shifted_exp_rows_in_place(&s)? {
        // CPU f32: exp in place, row sums in f64 (as exact attention).
        Some(stats) => {
            let sums = Tensor::from_iter(stats.iter().map(|&(_, z)| z as f32), dev)?;
            let log = want_log
                .then(|| Tensor::from_iter(stats.iter().map(|&(m, z)| m as f64 + z.ln()), dev))
                .transpose()?;
            (s, sums, log)
        }
        None => {
            let m = s.max_keepdim(D::Minus1)?;
            let e = s.broadcast_sub(&m)?.exp()?;
            let z = e.sum_keepdim(D::Minus1)?;
            let log = want_log
                .then(|| -> Result<Tensor> {
                    Ok((m.to_dtype(DType::F64)? + z.to_dtype(DType::F64)?.log()?)?.squeeze(1)?)
                })
                .transpose()?;
            (e, z.squeeze(1)?, log)
        }
    };
    let ev = e.reshape((g_count, r_max, l_max))?.matmul(&vg)?; // [G, R, p_v]
    let output = ev
        .reshape((rows, pv))?
        .broadcast_div(&sums.unsqueeze(1)?.to_dtype(ev.dtype())?)?;
    Ok(ChunkOut {
        output,
        log_normalizer: log_norm,
        slot_rows,
    })
}

fn index_u32(idx: &[usize], dev: &candle_core::Device) -> Result<Tensor> {
    let v: Vec<u32> = idx
        .iter()
        .map(|&i| u32::try_from(i).map_err(|_| anyhow::anyhow!("index {i} exceeds u32")))
        .collect::<Result<_>>()?;
    Ok(Tensor::from_vec(v, idx.len(), dev)?)
}

/// One group per query row with its own key list (per-row sets: top-k, LSH unions).
pub fn per_row_groups(sets: Vec<Vec<usize>>) -> Vec<KeyGroup> {
    sets.into_iter()
        .enumerate()
        .map(|(i, keys)| KeyGroup {
            rows: vec![i],
            keys,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
