//! What holds for every prefill method alike: registration, the causal-only refusal, GQA.

use candle_core::{DType, Tensor};

use crate::attention::test_util::{random_head, run_seeded};
use crate::attention::{
    by_id, family_method_ids, mask_method_ids, Family, HeadInputs, Mask, Target,
};
use crate::numerics::sampling::{normal_values, TrialRng};

const IDS: [&str; 7] = [
    "streaming",
    "h2o",
    "quest",
    "moba",
    "block_sparse",
    "xattention",
    "vertical_slash",
];

#[test]
fn registered_as_one_causal_only_family() {
    assert_eq!(family_method_ids(Family::Prefill), IDS);
    assert_eq!(Family::Prefill.name(), "prefill");
    let causal = mask_method_ids(Target::Softmax, Mask::Causal);
    let none = mask_method_ids(Target::Softmax, Mask::None);
    for id in IDS {
        let m = by_id(id).unwrap();
        assert_eq!(m.masks(), [Mask::Causal], "{id}");
        assert_eq!(m.targets(), [Target::Softmax], "{id}");
        assert!(causal.contains(&id) && !none.contains(&id), "{id}");
        assert!(!m.is_random());
        assert_eq!(m.is_oracle(), id == "h2o", "{id}");
        // The cost is the causal one whichever mask is asked, and positive.
        assert_eq!(
            m.macs(512, 64, 64),
            m.macs_masked(512, 64, 64, Mask::Causal)
        );
        assert!(m.macs(512, 64, 64) > 0.0);
    }
}

#[test]
fn the_bidirectional_mask_is_an_error_not_a_result() {
    let h = random_head(40, 8, 1, DType::F64);
    assert_eq!(h.mask, Mask::None);
    for id in IDS {
        let err = by_id(id)
            .unwrap()
            .approximate(
                &h,
                16,
                &mut <TrialRng as rand::SeedableRng>::seed_from_u64(0),
            )
            .err()
            .unwrap_or_else(|| panic!("{id} ran without a mask"));
        assert!(format!("{err:#}").contains("causal"), "{id}: {err:#}");
    }
}

/// A GQA layer (H = 4 query heads over H_kv = 2 K/V heads): query head h reads K/V head
/// ⌊h·H_kv/H⌋, as the sweep hands it. Each method's Ô for head h is computed from that shared
/// K/V — equal to the run on a private copy of it, different from the run on the other K/V head —
/// and heads 0 and 1, sharing K/V head 0, differ only through their queries.
#[test]
fn gqa_heads_read_their_shared_kv_head() {
    let (heads, kv_heads, n, p) = (4, 2, 70, 8);
    let dev = crate::tensor_util::test_device();
    let mut rng = <TrialRng as rand::SeedableRng>::seed_from_u64(9);
    let mut mk = |h: usize| {
        Tensor::from_vec(normal_values(&mut rng, h * n, p, 1.0), (h, n, p), &dev)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
    };
    let (q, k, v) = (mk(heads), mk(kv_heads), mk(kv_heads));
    let rows = |t: &Tensor| -> Vec<Vec<f64>> { t.to_vec2().unwrap() };
    let copy = |t: Tensor| Tensor::new(rows(&t), &dev).unwrap();
    for id in IDS {
        let m = by_id(id).unwrap();
        let d = 32;
        let run = |hq: usize, g: usize, private: bool| -> Vec<Vec<f64>> {
            let (kk, vv) = (k.get(g).unwrap(), v.get(g).unwrap());
            let (kk, vv) = if private {
                (copy(kk), copy(vv))
            } else {
                (kk, vv)
            };
            let head = HeadInputs::masked(q.get(hq).unwrap(), kk, vv, Mask::Causal).unwrap();
            rows(&run_seeded(m.as_ref(), &head, d, 0).output)
        };
        for h in 0..heads {
            let g = h * kv_heads / heads;
            let shared = run(h, g, false);
            assert_eq!(shared, run(h, g, true), "{id} head {h}");
            assert_ne!(
                shared,
                run(h, 1 - g, false),
                "{id} head {h} ignores its K/V head"
            );
        }
        assert_ne!(
            run(0, 0, false),
            run(1, 0, false),
            "{id}: heads 0 and 1 share K/V only"
        );
    }
}

/// At d = 16 the page methods keep only the own page (mean (i mod 16) + 1 keys: 8.5 on full
/// pages) and the block methods their two fixed blocks (≈ 24.5), as §7.6's evidence records (k8,
/// k24); the others hold |S_i| ≤ min(d, i+1).
#[test]
fn realised_keys_at_the_smallest_budget() {
    let h = crate::attention::test_util::causal(&random_head(512, 16, 3, DType::F64));
    let keys = |id: &str, d: usize| {
        run_seeded(by_id(id).unwrap().as_ref(), &h, d, 0)
            .support
            .unwrap()
            .keys
    };
    assert_eq!(keys("quest", 16), 8.5);
    assert_eq!(keys("moba", 16), 8.5);
    let block = (8.5 * 16.0 + 24.5 * 496.0) / 512.0;
    assert_eq!(keys("block_sparse", 16), block);
    assert_eq!(keys("xattention", 16), block);
    let budget = (0..512).map(|i| (i + 1).min(16)).sum::<usize>() as f64 / 512.0;
    assert_eq!(keys("streaming", 16), budget);
    for id in ["h2o", "vertical_slash"] {
        let k = keys(id, 16);
        assert!(k <= budget && k >= 0.5 * budget, "{id}: {k}");
    }
}

/// A covering budget gives exact causal attention (keys (n+1)/2, mass 1), for every method at the
/// budgets where its definition covers every row: d ≥ n for the page, block and window parts;
/// h2o at d ≥ 2n − 1 (r = ⌈d/2⌉ ≥ n) and vertical_slash at d ≥ 2n (n columns and n diagonals).
#[test]
fn covering_budgets_are_exact_causal_attention() {
    use super::{block_sparse, h2o, moba, quest, streaming, vertical_slash, xattention};
    use crate::attention::prefill::test_util::assert_covering_is_exact;
    let cases: [(&dyn crate::attention::Method, &[usize]); 7] = [
        (&streaming::Streaming, &[70, 71, 500]),
        (&h2o::H2o, &[139, 140, 500]),
        (&quest::Quest, &[70, 80, 500]),
        (&moba::Moba, &[70, 80, 500]),
        (&block_sparse::BlockSparse, &[70, 80, 500]),
        (&xattention::XAttention, &[70, 80, 500]),
        (&vertical_slash::VerticalSlash, &[140, 141, 500]),
    ];
    for (m, ds) in cases {
        assert_covering_is_exact(m, 70, ds);
    }
}
