//! `approx-bench dump-qkv`: one window's per-head Q, K, V and token ids as a safetensors file, for
//! cross-checks against other implementations (tests/reference), and its sidecar: the format
//! `score` reads back (it lives here, with its writer, so that `inputs` imports nothing of `score`).

use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_core::DType;

use serde::{Deserialize, Serialize};

use crate::config::InputConfig;
use crate::inputs;
use crate::usage;

/// Writes one window's Q ([H, n, p]), K and V ([H_kv, n, p]) in the run's dtype (f32, or f64 under
/// `--dtype f64`: a float64 cross-check then sees the very values the sweep quantizes or rounds,
/// not their f32 roundings) and token ids to a safetensors file; the sidecar JSON says H_kv and
/// the model's mask. Both files go to a temporary name and are renamed into place.
pub fn dump_qkv(
    inputs_cfg: &InputConfig,
    cache: &inputs::qkv_cache::CacheSetting,
    n: usize,
    window: usize,
    out: &Path,
) -> Result<()> {
    crate::config::check_length("--length", n)?;
    let mut prepared = inputs::prepare(inputs_cfg)?;
    prepared.use_qkv_cache(cache, inputs_cfg)?;
    let ids = prepared.corpus.window(n, window)?;
    // A §7.7 family's dump carries its layer's spec, extra tensors and sidecar fields.
    let family = prepared.family_dump(inputs_cfg, n, window)?;
    let (q, k, v) = match &family {
        Some(d) => (d.q.clone(), d.k.clone(), d.v.clone()),
        None => prepared.window_qkv(inputs_cfg, n, window)?,
    };
    let cpu = candle_core::Device::Cpu;
    let dtype = match inputs_cfg.candle_dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    // The layer's spec: the model's own (a §7.7 family's, a sliding window's), else its mask with τ = 1/√p.
    let spec = match &family {
        Some(d) => d.spec.clone(),
        None => prepared.layer_spec(
            inputs_cfg.layer,
            prepared.native_mask(),
            prepared.head_dim(),
        ),
    };
    let (mut extra, spec_tensors) =
        crate::attention::spec::spec_sidecar(&spec, prepared.head_dim_v())?;
    let mut map: std::collections::HashMap<String, candle_core::Tensor> =
        spec_tensors.into_iter().collect();
    map.insert("q".to_string(), q.to_dtype(dtype)?.to_device(&cpu)?);
    map.insert("k".to_string(), k.to_dtype(dtype)?.to_device(&cpu)?);
    map.insert("v".to_string(), v.to_dtype(dtype)?.to_device(&cpu)?);
    // A family's extra tensors (MLA's kv_latent, w_kv_b) and its own sidecar fields (phi3's
    // rope_factors, MLA's mla).
    if let Some(d) = &family {
        for (name, t) in &d.extra {
            map.insert(name.clone(), t.to_dtype(dtype)?.to_device(&cpu)?);
        }
        extra.extend(d.sidecar.clone());
    }
    map.insert(
        "token_ids".to_string(),
        candle_core::Tensor::from_vec(ids.to_vec(), ids.len(), &cpu)?,
    );
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| usage!("--out {}: cannot create its directory ({e})", out.display()))?;
    }
    let tmp = out.with_extension("safetensors.tmp");
    candle_core::safetensors::save(&map, &tmp)
        .and_then(|_| std::fs::rename(&tmp, out).map_err(candle_core::Error::wrap))
        .map_err(|e| usage!("--out {}: cannot write ({e})", out.display()))?;
    // What the file holds, for `score` (a user's Ô computed on these inputs is scored as a run
    // of this configuration).
    let info = DumpInfo {
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
        extra,
    };
    let side = sidecar(out);
    let side_tmp = side.with_extension("json.tmp");
    std::fs::write(&side_tmp, serde_json::to_string_pretty(&info)? + "\n")
        .and_then(|_| std::fs::rename(&side_tmp, &side))
        .map_err(|e| usage!("--out {}: cannot write ({e})", side.display()))?;
    Ok(())
}

/// The sidecar `dump-qkv` writes next to its safetensors file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DumpInfo {
    pub tool: String,
    pub version: String,
    pub inputs: InputConfig,
    pub model_id: String,
    pub n: usize,
    pub window: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// K/V heads: `k` and `v` are [kv_heads, n, p] and query head h reads K/V head
    /// ⌊h·kv_heads/heads⌋ (docs/reference.md §7.1). Absent in dumps from before it: = heads.
    #[serde(default)]
    pub kv_heads: Option<usize>,
    /// The mask of the model's own attention (causal for a decoder): what `score` measures Ô
    /// against. Absent in dumps from before it: none.
    #[serde(default, skip_serializing_if = "crate::attention::Mask::is_none")]
    pub mask: crate::attention::Mask,
    /// Every further field: the layer's spec ([`crate::attention::spec::spec_sidecar`]: scale,
    /// softcap, sliding_window, layer_type, head_dim_v) and a family's own (rope_factors, mla).
    /// Dumps from before the spec have none of them (read as τ = 1/√p, no cap, window or sinks).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl DumpInfo {
    /// The layer's spec the dump states: its sidecar's fields and its `sinks` tensor, if any
    /// (`what` names the sidecar in an error).
    pub fn spec(
        &self,
        sinks: Option<&candle_core::Tensor>,
        what: &str,
    ) -> Result<crate::attention::AttentionSpec> {
        crate::attention::spec::spec_from_sidecar(
            &self.extra,
            self.mask == crate::attention::Mask::Causal,
            (self.head_dim, self.heads),
            sinks,
            what,
        )
    }

    /// K/V heads of the dump.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads.unwrap_or(self.heads)
    }

    /// V's (and so O's) head width: the sidecar's `head_dim_v` (MLA's d_v differs from the
    /// query/key width p), else p. A value that is no positive integer is refused naming `what`.
    pub fn head_dim_v(&self, what: &str) -> Result<usize> {
        match self.extra.get("head_dim_v") {
            None | Some(serde_json::Value::Null) => Ok(self.head_dim),
            Some(v) => v
                .as_u64()
                .filter(|&d| d > 0)
                .map(|d| d as usize)
                .ok_or_else(|| {
                    usage!(
                        "{what}: head_dim_v is {v}, not a positive integer; dump the layer again with dump-qkv"
                    )
                }),
        }
    }
}

/// The sidecar's path for a dump file.
pub fn sidecar(dump: &Path) -> PathBuf {
    let mut s = dump.as_os_str().to_owned();
    s.push(".json");
    PathBuf::from(s)
}
