//! `approx-bench dump-qkv`: one window's per-head Q, K, V and token ids as a safetensors file, for
//! cross-checks against other implementations (tests/reference).

use std::path::Path;

use anyhow::Result;
use candle_core::DType;

use crate::config::InputConfig;
use crate::inputs;
use crate::usage;

/// Writes one window's Q ([H, n, p]), K and V ([H_kv, n, p]), f32, and token ids to a safetensors
/// file; the sidecar JSON says H_kv and the model's mask.
pub fn dump_qkv(inputs_cfg: &InputConfig, n: usize, window: usize, out: &Path) -> Result<()> {
    let prepared = inputs::prepare(inputs_cfg)?;
    let ids = prepared.corpus.window(n, window)?;
    let (q, k, v) = prepared.window_qkv(inputs_cfg, n, window)?;
    let cpu = candle_core::Device::Cpu;
    let mut map = std::collections::HashMap::new();
    map.insert("q".to_string(), q.to_dtype(DType::F32)?.to_device(&cpu)?);
    map.insert("k".to_string(), k.to_dtype(DType::F32)?.to_device(&cpu)?);
    map.insert("v".to_string(), v.to_dtype(DType::F32)?.to_device(&cpu)?);
    map.insert(
        "token_ids".to_string(),
        candle_core::Tensor::from_vec(ids.to_vec(), ids.len(), &cpu)?,
    );
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| usage!("--out {}: cannot create its directory ({e})", out.display()))?;
    }
    candle_core::safetensors::save(&map, out)
        .map_err(|e| usage!("--out {}: cannot write ({e})", out.display()))?;
    // What the file holds, for `score` (a user's Ô computed on these inputs is scored as a run
    // of this configuration).
    let info = crate::score::DumpInfo {
        tool: "approx-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        inputs: inputs_cfg.clone(),
        model_id: prepared.model_id.clone(),
        n,
        window,
        heads: prepared.heads(),
        head_dim: prepared.head_dim(),
        kv_heads: Some(prepared.kv_heads()),
        mask: prepared.native_mask(),
    };
    let side = crate::score::sidecar(out);
    std::fs::write(&side, serde_json::to_string_pretty(&info)? + "\n")
        .map_err(|e| usage!("--out {}: cannot write ({e})", side.display()))?;
    Ok(())
}
