//! Grouped-query attention's head map (docs/reference.md §7.1 "GQA"), written once: query head h of H
//! reads K/V head ⌊h·H_kv/H⌋, so each K/V head serves a contiguous group of H/H_kv query heads
//! (transformers' `repeat_kv`). The map is only defined where H_kv divides H ([`groups_fit`]).

/// The K/V head query head `h` reads, of `heads` query and `kv_heads` K/V heads.
#[inline]
pub fn kv_head(h: usize, heads: usize, kv_heads: usize) -> usize {
    h * kv_heads / heads
}

/// Whether `kv_heads` K/V heads can serve `heads` query heads: at least one, and dividing them.
pub fn groups_fit(heads: usize, kv_heads: usize) -> bool {
    kv_heads > 0 && heads.is_multiple_of(kv_heads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 query heads over 2 K/V heads: heads 0–3 read 0, 4–7 read 1 (contiguous groups, as
    /// `repeat_kv` lays them out); H_kv = H is the identity.
    #[test]
    fn groups_are_contiguous() {
        let map: Vec<usize> = (0..8).map(|h| kv_head(h, 8, 2)).collect();
        assert_eq!(map, [0, 0, 0, 0, 1, 1, 1, 1]);
        assert!((0..6).all(|h| kv_head(h, 6, 6) == h));
        assert!(groups_fit(9, 3) && !groups_fit(9, 2) && !groups_fit(4, 0));
    }
}
