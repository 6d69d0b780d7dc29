//! An MLA layer's latent view of one window (docs/reference.md §7.7.5): what its deployed cache
//! holds, one latent row [c_j; k_pe,j] per token shared by every head, and the `kv_b_proj`
//! weight that absorbs into the query and the output. The §8 caches on an MLA layer quantize
//! this row (§7.7.6, MLA) rather than the materialised per-head K/V, which nobody caches.
//!
//! Absorbed form of head h (W_h = W_kvb[h] = [W_UK,h; W_UV,h], [d_nope + d_v, r]):
//! q_h·k_h,j = q_nope,h·(W_UK,h c_j) + q_pe,h·k_pe,j = [W_UK,hᵀ q_nope,h; q_pe,h]·[c_j; k_pe,j],
//! and v_h,j = W_UV,h c_j, so O_h = W_UV,h Σ_j P_ij c_j. The dump writes k_pe in the pair layout
//! of K's (and Q's) rope dims, so no reordering is needed (a test checks the absorbed form
//! against the materialised target on every DeepSeek fixture).

use std::sync::Arc;

use anyhow::Result;
use candle_core::Tensor;

use crate::usage;

/// One window's MLA latent and the layer's W_kvb, in the run's dtype on the run's device.
pub struct LayerLatent {
    /// [n, r + d_R]: the normed c_j, then the post-RoPE k_pe,j (the dump's `kv_latent`).
    pub latent: Tensor,
    /// [H, d_nope + d_v, r] (the dump's `w_kv_b`).
    pub w_kv_b: Tensor,
}

impl LayerLatent {
    /// The latent and W_kvb, checked against each other: W_kvb's r must leave a rope part.
    pub fn new(latent: Tensor, w_kv_b: Tensor) -> Result<Self> {
        let (_, width) = latent.dims2()?;
        let (_, _, r) = w_kv_b.dims3()?;
        if r >= width {
            return Err(usage!(
                "kv_latent has {width} values per token, but w_kv_b's rank r = {r} leaves no rope part (docs/reference.md §7.7.5: the latent is [c; k_pe], r + d_R values)"
            ));
        }
        Ok(Self { latent, w_kv_b })
    }

    /// r, the rank of c.
    pub fn rank(&self) -> usize {
        self.w_kv_b.dims()[2]
    }

    /// r + d_R, the values a token's latent row holds.
    pub fn width(&self) -> usize {
        self.latent.dims()[1]
    }
}

/// Head `head`'s view of a layer's latent.
#[derive(Clone)]
pub struct HeadLatent {
    pub layer: Arc<LayerLatent>,
    pub head: usize,
}

impl HeadLatent {
    /// d_R, the rope dims at the end of the latent row and of q.
    pub fn d_rope(&self) -> usize {
        self.layer.width() - self.layer.rank()
    }

    /// Checks this view against the head's Q [n, d_nope + d_R] and V [n, d_v]: W_kvb[h] must be
    /// [d_nope + d_v, r] and the latent must have the head's n rows.
    pub fn check(&self, q: &Tensor, v: &Tensor) -> Result<()> {
        let ((n, p), (_, d_v)) = (q.dims2()?, v.dims2()?);
        let (heads, rows, r) = self.layer.w_kv_b.dims3()?;
        let (d_rope, latent_n) = (self.d_rope(), self.layer.latent.dims()[0]);
        let fits = self.head < heads && latent_n == n && p > d_rope && rows == p - d_rope + d_v;
        if !fits {
            return Err(usage!(
                "head {} with Q [{n}, {p}] and V [{n}, {d_v}] does not fit the MLA latent [{latent_n}, {}] and w_kv_b [{heads}, {rows}, {r}] (docs/reference.md §7.7.5: w_kv_b is [H, d_nope + d_v, r], Q's head size d_nope + d_R)",
                self.head,
                self.layer.width()
            ));
        }
        Ok(())
    }

    /// q̃ = [q_nope W_UK,h; q_pe] [n, r + d_R]: the query that dots the latent row.
    pub fn absorbed_query(&self, q: &Tensor) -> Result<Tensor> {
        let d_nope = q.dims()[1] - self.d_rope();
        let w_uk = self.layer.w_kv_b.get(self.head)?.narrow(0, 0, d_nope)?;
        // Contiguous operands: a column slice's row stride is not every device's matmul layout.
        let q_nope = q.narrow(1, 0, d_nope)?.contiguous()?.matmul(&w_uk)?;
        let q_pe = q.narrow(1, d_nope, self.d_rope())?;
        Ok(Tensor::cat(&[&q_nope, &q_pe], 1)?.contiguous()?)
    }

    /// O_h = Y W_UV,hᵀ [n, d_v] from Y = P·Ĉ [n, r], the attention-weighted latent c.
    pub fn output(&self, y: &Tensor, d_v: usize) -> Result<Tensor> {
        let w = self.layer.w_kv_b.get(self.head)?;
        let d_nope = w.dims()[0] - d_v;
        let w_uv = w.narrow(0, d_nope, d_v)?.t()?.contiguous()?;
        Ok(y.contiguous()?.matmul(&w_uv)?)
    }
}
