//! The two f32 tile products of the fused exact kernel ([`super`]) on microkernels of our own
//! (issue 33), and its exponential and row statistics: S = Q̃_b K_cᵀ and acc += E V_c for a block
//! of up to [`super::QUERY_BLOCK`] rows and a tile of up to [`super::KEY_TILE`] keys.
//!
//! Why not `gemm` here: each tile is a small product (128 × 256 × 64), and `gemm` packs both
//! operands and dispatches afresh on every call. Here K and V are packed once per head into
//! 16-column panels (K: [p][16] per 16 keys; V: [nk][16] per 16 value columns, so that a tile's
//! panel is contiguous and does not alias in L1 as V's rows at a 256-byte stride do), and Q and E
//! are read in place (one broadcast per row and step).
//!
//! Two instruction sets, chosen once per process at run time ([`Simd::chosen`], issue 46):
//! AVX2 + FMA ([`avx2`]: 6 × 16 register tiles, 8-lane exponential) and AVX-512F ([`avx512`]:
//! 8 × 32 register tiles over two panels at once, 16-lane exponential). Both share the packed
//! layout and compute each output element as the same ordered chain of FMAs, the same exponential
//! operation by operation and the same pairing of the row sum, so their bits agree (tested): the
//! choice is one of speed only. Each is deterministic and thread-invariant for the same reason.

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;

/// Columns of a packed panel (one AVX-512 vector, two AVX2 vectors).
pub const NR: usize = 16;
/// Lanes of [`LaneStats`] per row: the widest path's vector (AVX2 fills the first 8).
pub const STAT_LANES: usize = 16;

/// The kernel's instruction-set paths, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// No microkernels: `gemm`'s products and the portable exponential (compiled for AVX2
    /// without FMA where the CPU has it; the bits equal the portable build's).
    Portable,
    /// AVX2 + FMA microkernels.
    Avx2,
    /// AVX-512F microkernels.
    Avx512,
}

/// The variable that forces a lower path: `avx512`, `avx2` or `portable`.
pub const SIMD_VAR: &str = "AB_SIMD";

impl Simd {
    /// The name `bench` prints and [`SIMD_VAR`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Portable => "portable",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
        }
    }

    /// The best path this CPU runs (detected once: the kernel's safe entry points check every
    /// path they are handed against it, per row for the exponential).
    #[inline]
    pub fn best() -> Simd {
        static BEST: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") && has!("fma") {
                    return if has!("avx512f") {
                        Simd::Avx512
                    } else {
                        Simd::Avx2
                    };
                }
            }
            Simd::Portable
        })
    }

    /// `self` if this CPU runs it; a panic otherwise (what keeps the kernel's safe methods from
    /// running an instruction the CPU lacks when handed a path by hand).
    #[inline]
    pub fn checked(self) -> Simd {
        assert!(
            self <= Simd::best(),
            "{self:?}: this CPU runs at most {:?}",
            Simd::best()
        );
        self
    }

    /// Every path this CPU runs, lowest first (what the tests exercise).
    pub fn runnable() -> Vec<Simd> {
        [Simd::Portable, Simd::Avx2, Simd::Avx512]
            .into_iter()
            .filter(|&s| s <= Simd::best())
            .collect()
    }

    /// The path for a request (`AB_SIMD`'s value, and whether the older `AB_NO_TILES` is set):
    /// the requested one, or the best the CPU has where it lacks it (never an instruction the CPU
    /// does not run). Unknown values are an error, so that a typo does not run another path.
    pub fn for_request(request: Option<&str>, no_tiles: bool) -> Result<Simd, String> {
        let wanted = match request.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("auto") if no_tiles => Simd::Portable,
            None | Some("") | Some("auto") => Simd::Avx512,
            Some("avx512") => Simd::Avx512,
            Some("avx2") => Simd::Avx2,
            Some("portable") => Simd::Portable,
            Some(other) => {
                return Err(format!(
                    "{SIMD_VAR}={other:?}: give avx512, avx2 or portable (or unset it for the best this CPU runs)"
                ))
            }
        };
        Ok(wanted.min(Simd::best()))
    }

    /// [`SIMD_VAR`] as the process has it, checked: a value it does not know is a usage error
    /// (the CLI asks this first, so that a typo stops the run with the fix rather than with
    /// [`Simd::chosen`]'s panic inside the kernel).
    pub fn from_env() -> anyhow::Result<Simd> {
        let var = std::env::var(SIMD_VAR).ok();
        let no_tiles = std::env::var_os("AB_NO_TILES").is_some();
        Simd::for_request(var.as_deref(), no_tiles).map_err(|e| crate::usage!("{e}"))
    }

    /// The path of this process: [`SIMD_VAR`] (or `AB_NO_TILES`, its older form for `portable`)
    /// read once. Decided once per process: the kernel asks per row, and reading the
    /// environment there cost 6 % of its time. An unknown value panics with the fix.
    #[inline]
    pub fn chosen() -> Simd {
        static CHOSEN: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let var = std::env::var(SIMD_VAR).ok();
            let no_tiles = std::env::var_os("AB_NO_TILES").is_some();
            Simd::for_request(var.as_deref(), no_tiles).unwrap_or_else(|e| panic!("{e}"))
        })
    }
}

/// The instruction set `gemm` (candle's CPU matmul, and the portable path's tile products) runs
/// in this process: its own dispatch takes its AVX-512 kernels where the CPU has avx512f (its
/// `x86-v4` feature, on in Cargo.toml), else FMA. Its sums block differently on the two, so the
/// forward's bits depend on it (the Q/K/V cache's key records it).
pub fn gemm_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "fma";
        }
    }
    "scalar"
}

/// `k` ([nk, p] row-major) as ⌈nk/16⌉ panels of [p][16], keys past nk zero.
pub fn pack_keys(k: &[f32], nk: usize, p: usize) -> Vec<f32> {
    let mut dst = vec![0.0; nk.div_ceil(NR) * p * NR];
    for (j, key) in k[..nk * p].chunks_exact(p).enumerate() {
        let panel = &mut dst[(j / NR) * p * NR..];
        for (l, &x) in key.iter().enumerate() {
            panel[l * NR + j % NR] = x;
        }
    }
    dst
}

/// `v` ([nk, pv] row-major, pv a multiple of 16) as pv/16 panels of [nk][16].
pub fn pack_values(v: &[f32], nk: usize, pv: usize) -> Vec<f32> {
    debug_assert!(pv.is_multiple_of(NR));
    let mut dst = vec![0.0; nk * pv];
    for (j, row) in v[..nk * pv].chunks_exact(pv).enumerate() {
        for (c, part) in row.chunks_exact(NR).enumerate() {
            dst[(c * nk + j) * NR..(c * nk + j + 1) * NR].copy_from_slice(part);
        }
    }
    dst
}

/// Per-row statistics of a score tile gathered in the microkernels' registers, in
/// [`STAT_LANES`] lanes per row: the running maximum, and a lane mask (all bits set) where a NaN
/// or +∞ was seen. Meaningful only when every column the panels compute belongs to the tile (kt a
/// multiple of 16) and no key of it is masked.
pub struct LaneStats {
    pub max: Vec<f32>,
    pub poison: Vec<f32>,
}

impl LaneStats {
    pub fn new(rows: usize) -> Self {
        Self {
            max: vec![f32::NEG_INFINITY; rows * STAT_LANES],
            poison: vec![0.0; rows * STAT_LANES],
        }
    }

    /// Lanes set to "nothing seen" for `rows` rows (the kernels call it before a tile).
    pub fn reset(&mut self, rows: usize) {
        assert!(self.max.len() >= rows * STAT_LANES && self.poison.len() >= rows * STAT_LANES);
        self.max[..rows * STAT_LANES].fill(f32::NEG_INFINITY);
        self.poison[..rows * STAT_LANES].fill(0.0);
    }

    /// Row r's maximum and whether it met NaN or +∞.
    pub fn row(&self, r: usize) -> (f32, bool) {
        let lanes = r * STAT_LANES..(r + 1) * STAT_LANES;
        let max = self.max[lanes.clone()]
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        let bad = self.poison[lanes].iter().any(|x| x.to_bits() != 0);
        (max, bad)
    }
}

/// [`avx2::scores`] or [`avx512::scores`] as `simd` says.
///
/// # Safety
/// `simd` is [`Simd::Avx2`] or above and this CPU runs it (≤ [`Simd::best`]); the rest as the
/// kernels say.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline]
pub unsafe fn scores(
    simd: Simd,
    q: &[f32],
    rows: usize,
    p: usize,
    packed: &[f32],
    c0: usize,
    kt: usize,
    s: &mut [f32],
    ld: usize,
    stats: Option<&mut LaneStats>,
) {
    debug_assert!(simd >= Simd::Avx2 && simd <= Simd::best());
    match simd {
        Simd::Avx512 => avx512::scores(q, rows, p, packed, c0, kt, s, ld, stats),
        _ => avx2::scores(q, rows, p, packed, c0, kt, s, ld, stats),
    }
}

/// [`avx2::accumulate_values`] or [`avx512::accumulate_values`] as `simd` says.
///
/// # Safety
/// As [`scores`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline]
pub unsafe fn accumulate_values(
    simd: Simd,
    e: &[f32],
    ld: usize,
    rows: usize,
    packed: &[f32],
    nk: usize,
    c0: usize,
    kt: usize,
    pv: usize,
    acc: &mut [f32],
) {
    debug_assert!(simd >= Simd::Avx2 && simd <= Simd::best());
    match simd {
        Simd::Avx512 => avx512::accumulate_values(e, ld, rows, packed, nk, c0, kt, pv, acc),
        _ => avx2::accumulate_values(e, ld, rows, packed, nk, c0, kt, pv, acc),
    }
}

/// [`avx2::exp_shifted`] or [`avx512::exp_shifted`] as `simd` says.
///
/// # Safety
/// As [`scores`].
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn exp_shifted(simd: Simd, row: &mut [f32], m: f32) -> f64 {
    debug_assert!(simd >= Simd::Avx2 && simd <= Simd::best());
    match simd {
        Simd::Avx512 => avx512::exp_shifted(row, m),
        _ => avx2::exp_shifted(row, m),
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
