"""Numerics shared by the independent reference implementations (score_dump.py, field_dump.py):
the metric by LAPACK, the Razavi et al. iterative inverse of METHODS.md §2.3 and the eigenvalue
pseudo-inverse of §2.3/§6.4.2. numpy only; nothing here is taken from the Rust sources."""

import math

import numpy as np


def spectral_norm(E: np.ndarray) -> float:
    """σ_max(E) by LAPACK SVD (the independent route of §1.2)."""
    if not np.all(np.isfinite(E)):
        return float("nan")
    return float(np.linalg.svd(E, compute_uv=False)[0])


def spectral_norm_gram(E: np.ndarray) -> float:
    """√λ_max(EᵀE) by a symmetric eigen-solver (used for the many randomized draws)."""
    if not np.all(np.isfinite(E)):
        return float("nan")
    G = E.T @ E
    return float(math.sqrt(max(np.linalg.eigvalsh(G)[-1], 0.0)))


def iter_inv(N: np.ndarray, T: int = 6) -> np.ndarray:
    """§2.3: Z₀ = Nᵀ/‖N‖₁ (largest column sum), Z ← ¼ Z (13I − Y(15I − Y(7I − Y))), Y = N Z."""
    d = N.shape[0]
    I = np.eye(d)
    Z = N.T / np.abs(N).sum(axis=0).max()
    for _ in range(T):
        Y = N @ Z
        Z = 0.25 * Z @ (13 * I - Y @ (15 * I - Y @ (7 * I - Y)))
    return Z


def pinv_sym(M: np.ndarray, rel_cut: float = 1e-10) -> np.ndarray:
    """§6.4.2: eigh of ½(M + Mᵀ), drop λ ≤ rel_cut·λ_max."""
    M = 0.5 * (M + M.T)
    w, U = np.linalg.eigh(M)
    keep = w > rel_cut * w.max()
    return (U[:, keep] / w[keep]) @ U[:, keep].T
