//! The registry: every method in the order figures and tables list them, and the lookups by
//! id, family, target and mask that the configuration and the reports use.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::*;
use crate::numerics::formats::GgmlType;

/// The methods of both papers' Figure 1 (Skyformer's four, Skeinformer's four; Informer is
/// shared): the registry's first seven, in its order (legend order, baselines).
pub const FIGURE_METHODS: &[&str] = &[
    "skyformer",
    "nystromformer",
    "performer",
    "informer",
    "skeinformer",
    "vmean",
    "linformer",
];

/// Every method, in the order figures and tables list them.
pub fn registry() -> Vec<Box<dyn Method>> {
    use skeinformer::{SkeinVariant, Skeinformer};
    vec![
        Box::new(skyformer::Skyformer::pseudo_inverse()),
        Box::new(nystromformer::Nystromformer),
        Box::new(performer::Performer::reference()),
        Box::new(informer::Informer::log_factor()),
        Box::new(Skeinformer::new(SkeinVariant::Full)),
        Box::new(vmean::VMean),
        Box::new(linformer::Linformer::reference()),
        Box::new(skyformer::Skyformer::iterative()),
        Box::new(performer::Performer::favor()),
        Box::new(informer::Informer::direct()),
        Box::new(linformer::Linformer::unreduced_jlt()),
        Box::new(Skeinformer::new(SkeinVariant::Uniform)),
        Box::new(Skeinformer::new(SkeinVariant::NoNorm)),
        Box::new(Skeinformer::new(SkeinVariant::SimpleNorm)),
        Box::new(Skeinformer::new(SkeinVariant::NoPilot)),
        Box::new(svd_optimal::SvdOptimal),
        Box::new(column_uniform::ColumnUniform),
        Box::new(window::Window),
        Box::new(topk::TopK),
        Box::new(bigbird::BigBird),
        Box::new(reformer::Reformer),
        Box::new(performer_trig::PerformerTrig),
        Box::new(hyperattention::HyperAttention::reference()),
        Box::new(kdeformer::KdeFormer::reference()),
        Box::new(scatterbrain::Scatterbrain::smyrf()),
        Box::new(scatterbrain::Scatterbrain::local()),
        // The causal prefill methods (docs/reference.md §7.5).
        Box::new(prefill::streaming::Streaming),
        Box::new(prefill::h2o::H2o),
        Box::new(prefill::quest::Quest),
        Box::new(prefill::moba::Moba),
        Box::new(prefill::block_sparse::BlockSparse),
        Box::new(prefill::xattention::XAttention),
        Box::new(prefill::vertical_slash::VerticalSlash),
        // Decode-time KV-cache compression (docs/reference.md §9), `--decode N_F` only.
        Box::new(decode::methods::StaticDecode(decode::kept::Static::Window)),
        Box::new(decode::methods::StaticDecode(
            decode::kept::Static::Streaming,
        )),
        Box::new(decode::methods::StaticDecode(decode::kept::Static::SnapKv(
            decode::kept::Pool::Max7,
        ))),
        Box::new(decode::methods::StaticDecode(decode::kept::Static::SnapKv(
            decode::kept::Pool::Avg5,
        ))),
        Box::new(decode::methods::StaticDecode(
            decode::kept::Static::PyramidKv,
        )),
        Box::new(decode::methods::StaticDecode(decode::kept::Static::AdaKv)),
        Box::new(decode::methods::StaticDecode(decode::kept::Static::H2o)),
        Box::new(decode::methods::StaticDecode(decode::kept::Static::Tova)),
        Box::new(decode::methods::QuestDec),
        Box::new(decode::methods::TopkDec),
        Box::new(decode::methods::StaticDecode(
            decode::kept::Static::EvictOracle,
        )),
        // kvpress's presses (issue 58): one set per K/V head, kvpress's defaults.
        Box::new(press(decode::press::Press::SnapKv)),
        Box::new(press(decode::press::Press::PyramidKv)),
        Box::new(press(decode::press::Press::AdaKv)),
        Box::new(press(decode::press::Press::ObservedAttention)),
        Box::new(press(decode::press::Press::Tova)),
        Box::new(press(decode::press::Press::Knorm)),
        Box::new(press(decode::press::Press::KeyDiff)),
        Box::new(press(decode::press::Press::Cur)),
        Box::new(press(decode::press::Press::ExpectedAttention)),
        Box::new(press(decode::press::Press::LagKv)),
        // Quantized attention (docs/reference.md §8): the KV caches, KIVI, SageAttention's kernels.
        Box::new(quantized::kv_cache::KvCache {
            format: quantized::kv_cache::CacheFormat::F16,
        }),
        Box::new(quantized::kv_cache::KvCache {
            format: quantized::kv_cache::CacheFormat::Bf16,
        }),
        Box::new(quantized::kv_cache::KvCache {
            format: quantized::kv_cache::CacheFormat::Fp8,
        }),
        Box::new(quantized::kv_cache::KvCache::ggml(GgmlType::Q8_0)),
        Box::new(quantized::kv_cache::KvCache::ggml(GgmlType::Q5_1)),
        Box::new(quantized::kv_cache::KvCache::ggml(GgmlType::Q5_0)),
        Box::new(quantized::kv_cache::KvCache::ggml(GgmlType::Q4_1)),
        Box::new(quantized::kv_cache::KvCache::ggml(GgmlType::Q4_0)),
        Box::new(quantized::kivi::Kivi { bits: 4 }),
        Box::new(quantized::kivi::Kivi { bits: 2 }),
        Box::new(quantized::sage::Sage {
            kernel: quantized::sage::SageKernel::Sage1,
        }),
        Box::new(quantized::sage::Sage {
            kernel: quantized::sage::SageKernel::Sage2Int8,
        }),
        Box::new(quantized::sage::Sage {
            kernel: quantized::sage::SageKernel::Sage2Int4,
        }),
        // The kernelized target's methods (docs/reference.md §6.4).
        Box::new(exact_kernelized::ExactKernelized),
        Box::new(zero::Zero),
        Box::new(skyformer_gauss::SkyformerGauss::pseudo_inverse()),
        Box::new(skyformer_gauss::SkyformerGauss::iterative()),
        Box::new(performer_gauss::PerformerGauss),
        Box::new(rff_gauss::RffGauss),
    ]
}

/// A kvpress press as a method.
fn press(p: decode::press::Press) -> decode::methods::StaticDecode {
    decode::methods::StaticDecode(decode::kept::Static::Press(p))
}

/// A registered method's family and whether it is an oracle, looked up without building the
/// registry again (the reports ask for every row); None for an id outside the registry.
pub fn describe(id: &str) -> Option<(Family, bool)> {
    static MAP: OnceLock<HashMap<&'static str, (Family, bool)>> = OnceLock::new();
    MAP.get_or_init(|| {
        registry()
            .iter()
            .map(|m| (m.id(), (m.family(), m.is_oracle())))
            .collect()
    })
    .get(id)
    .copied()
}

/// The ids of the registered methods that estimate `target`, in registry order.
pub fn target_method_ids(target: Target) -> Vec<&'static str> {
    registry()
        .iter()
        .filter(|m| m.targets().contains(&target))
        .map(|m| m.id())
        .collect()
}

/// The ids of the registered methods that estimate `target` under `mask`, in registry order.
pub fn mask_method_ids(target: Target, mask: Mask) -> Vec<&'static str> {
    registry()
        .iter()
        .filter(|m| m.targets().contains(&target) && m.masks().contains(&mask))
        .map(|m| m.id())
        .collect()
}

/// The `field` preset (issue 13: every method of the field on one d axis): every registered
/// method whose target is softmax attention and that has a bidirectional form, in registry order
/// (the causal-only prefill methods of docs/reference.md §7.5 join it under `--mask causal`). The
/// quantized family (§8) has no d axis and is its own preset, `quant`.
pub fn field_method_ids() -> Vec<&'static str> {
    field_method_ids_masked(Mask::None)
}

/// The `field` preset under `mask`: the softmax methods with a form for it that have a budget d.
pub fn field_method_ids_masked(mask: Mask) -> Vec<&'static str> {
    registry()
        .iter()
        .filter(|m| m.targets().contains(&Target::Softmax) && m.masks().contains(&mask))
        .filter(|m| m.has_budget() && m.family() != Family::Decode)
        .map(|m| m.id())
        .collect()
}

/// The ids of the registered methods of one family, in registry order.
pub fn family_method_ids(family: Family) -> Vec<&'static str> {
    registry()
        .iter()
        .filter(|m| m.family() == family)
        .map(|m| m.id())
        .collect()
}

/// The budgets a method runs at in a sweep over the d grid `grid`: the grid, or d = 0 alone for a
/// method without a budget (the quantized family, docs/reference.md §8.1). A user's own method (not
/// registered) has a budget.
pub fn budgets(id: &str, grid: &[usize]) -> Vec<usize> {
    layer_budgets(id, grid, None)
}

/// [`budgets`] on a layer with a sliding window of `window` keys (docs/reference.md §7.7.6): the
/// grid stops at its first d ≥ W, since a larger d can keep no more keys than the window holds
/// and would repeat that point. The grid's order is kept; a layer without a window (or a method
/// without a budget) takes the whole grid. Every reader of a run's grid (the sweep, its resume,
/// `merge`'s trial count, `check`) goes through here, so they agree on which trials a run has.
pub fn layer_budgets(id: &str, grid: &[usize], window: Option<usize>) -> Vec<usize> {
    match (describe(id), window) {
        (Some((Family::Quantized, _)), _) => vec![0],
        (_, None) => grid.to_vec(),
        (_, Some(w)) => {
            let first_covering = grid.iter().copied().filter(|&d| d >= w).min();
            grid.iter()
                .copied()
                .filter(|&d| d < w || Some(d) == first_covering)
                .collect()
        }
    }
}

/// The methods that run under `--decode` (docs/reference.md §9.1): the §9 family, then the §8 KV caches.
pub fn decode_method_ids() -> Vec<&'static str> {
    registry()
        .iter()
        .filter(|m| m.decoding().is_some())
        .map(|m| m.id())
        .collect()
}

/// The kvpress presses' ids (issue 58: `*_press`, one per kvpress class), the `kvpress` preset;
/// the `decode` preset is the other §9 methods.
pub fn press_method_ids() -> Vec<&'static str> {
    family_method_ids(Family::Decode)
        .into_iter()
        .filter(|id| id.ends_with("_press"))
        .collect()
}

/// The §9 methods of the `decode` preset: the decode family without kvpress's presses.
pub fn decode_preset_ids() -> Vec<&'static str> {
    family_method_ids(Family::Decode)
        .into_iter()
        .filter(|id| !id.ends_with("_press"))
        .collect()
}

/// The ids of every registered method.
pub fn method_ids() -> Vec<&'static str> {
    registry().iter().map(|m| m.id()).collect()
}

/// Looks a method up by id; the error lists the known ids.
pub fn by_id(id: &str) -> std::result::Result<Box<dyn Method>, String> {
    registry()
        .into_iter()
        .find(|m| m.id() == id)
        .ok_or_else(|| {
            format!(
                "unknown method '{id}'; known methods: {}",
                method_ids().join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::layer_budgets;

    /// §7.7.6: on a sliding layer the grid stops at its first d ≥ W, in the grid's own order; a
    /// method without a budget and a layer without a window keep theirs.
    #[test]
    fn a_sliding_layers_grid_stops_at_its_first_budget_covering_the_window() {
        let grid = [16, 32, 64, 128, 256];
        assert_eq!(layer_budgets("topk", &grid, Some(64)), [16, 32, 64]);
        assert_eq!(layer_budgets("topk", &grid, Some(100)), [16, 32, 64, 128]);
        assert_eq!(layer_budgets("topk", &grid, Some(8)), [16]);
        assert_eq!(layer_budgets("topk", &grid, Some(1000)), grid);
        assert_eq!(layer_budgets("topk", &grid, None), grid);
        assert_eq!(
            layer_budgets("window", &[128, 16, 256, 64], Some(60)),
            [16, 64]
        );
        assert_eq!(layer_budgets("kv_q8_0", &grid, Some(64)), [0]);
        // A user's own method (not registered) has a budget, and stops too.
        assert_eq!(layer_budgets("mine", &grid, Some(64)), [16, 32, 64]);
    }
}
