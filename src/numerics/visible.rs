//! Which keys a query row sees (docs/reference.md §7.2, §7.7.0): the one definition that the
//! exact target, its dense and fused kernels, the float64 checks and the methods read. The
//! attention module's user-facing choice (`Mask`: none | causal) and its layer spec
//! (`AttentionSpec`: causal and a window) both convert to it.

/// Which keys a query row sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visible {
    /// Every key.
    All,
    /// Keys j ≤ i, and with a sliding window W also j > i − W (W counts the diagonal).
    Causal { window: Option<usize> },
}

impl Visible {
    /// Causal (with `window`) or every key.
    pub fn new(causal: bool, window: Option<usize>) -> Self {
        if causal {
            Visible::Causal { window }
        } else {
            Visible::All
        }
    }

    /// Whether row i sees key j.
    #[inline(always)]
    pub fn sees(self, i: usize, j: usize) -> bool {
        match self {
            Visible::All => true,
            Visible::Causal { window } => j <= i && window.is_none_or(|w| j + w > i),
        }
    }

    /// The keys [lo, hi) any row of [r0, r1) sees among `nk`.
    pub fn span(self, r0: usize, r1: usize, nk: usize) -> (usize, usize) {
        match self {
            Visible::All => (0, nk),
            Visible::Causal { window } => {
                let lo = window.map_or(0, |w| (r0 + 1).saturating_sub(w));
                (lo, r1.min(nk))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The span holds exactly the keys some row of the range sees.
    #[test]
    fn the_span_is_the_union_of_the_rows_keys() {
        for vis in [
            Visible::All,
            Visible::Causal { window: None },
            Visible::Causal { window: Some(1) },
            Visible::Causal { window: Some(7) },
        ] {
            for (r0, r1) in [(0, 1), (3, 9), (10, 30)] {
                let (lo, hi) = vis.span(r0, r1, 40);
                for j in 0..40 {
                    let seen = (r0..r1).any(|i| vis.sees(i, j));
                    assert_eq!(
                        seen,
                        (lo..hi).contains(&j),
                        "{vis:?} rows {r0}..{r1} key {j}"
                    );
                }
            }
        }
        assert!(Visible::Causal { window: Some(3) }.sees(5, 3));
        assert!(!Visible::Causal { window: Some(3) }.sees(5, 2));
        assert!(!Visible::Causal { window: None }.sees(5, 6));
    }
}
