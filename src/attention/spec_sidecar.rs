//! A layer's spec in a dump (docs/reference.md §7.7.0, "Dump"): the sidecar's fields and the
//! `sinks` tensor, written by [`spec_sidecar`] and read back by [`spec_from_sidecar`]. Here, not
//! in `inputs`, so that the models (which never import `inputs`) write the same fields.
//!
//! The layer's window W is the field `sliding_window`, not §7.7.0's `window`: a dump's sidecar
//! already has `window`, the index of the corpus window the dump holds, and reading it as W would
//! give every old dump a wrong window.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde_json::{Map, Value};

use super::{default_scale, AttentionSpec, LayerType};

/// The dump's tensor of per-query-head sink logits ([H], f32).
pub const SINKS_TENSOR: &str = "sinks";

/// A spec's sidecar fields and the tensors stored beside Q, K, V.
pub type SpecDumpParts = (Map<String, Value>, Vec<(String, Tensor)>);

/// The sidecar fields that state `spec` for a dump whose V has head size `head_dim_v`:
/// `scale` (always), `softcap` (null or c), `sliding_window` (null or W), `layer_type` and
/// `head_dim_v`; and the tensors to store beside Q, K, V (`sinks` [H] in f32, when it has sinks).
pub fn spec_sidecar(spec: &AttentionSpec, head_dim_v: usize) -> Result<SpecDumpParts> {
    let mut side = Map::new();
    side.insert("scale".into(), spec.scale.into());
    side.insert("softcap".into(), spec.softcap.into());
    side.insert("sliding_window".into(), spec.window.into());
    side.insert("layer_type".into(), spec.layer_type().label().into());
    side.insert("head_dim_v".into(), head_dim_v.into());
    let mut tensors = Vec::new();
    if let Some(s) = &spec.sinks {
        let f32s: Vec<f32> = s.iter().map(|&x| x as f32).collect();
        let len = f32s.len();
        tensors.push((
            SINKS_TENSOR.into(),
            Tensor::from_vec(f32s, len, &Device::Cpu)?,
        ));
    }
    Ok((side, tensors))
}

/// The spec a dump states: from its sidecar's fields (`side`), its mask (`causal`), Q's head
/// size `p`, its `heads` query heads and its `sinks` tensor if the file has one. A dump written
/// before these fields existed has none of them: τ = 1/√p, no cap, no window, no sinks (what every
/// dump then was). Refuses a field of the wrong kind and a `layer_type` that contradicts the
/// window, naming `what` (the sidecar).
pub fn spec_from_sidecar(
    side: &Map<String, Value>,
    causal: bool,
    (p, heads): (usize, usize),
    sinks: Option<&Tensor>,
    what: &str,
) -> Result<AttentionSpec> {
    let number = |key: &str| -> Result<Option<f64>> {
        match side.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                crate::usage!("{what}: `{key}` is {v}; it must be a number or null")
            }),
        }
    };
    let window = match side.get("sliding_window") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            crate::usage!("{what}: `sliding_window` is {v}; it must be a whole number or null")
        })? as usize),
    };
    let sinks = match sinks {
        Some(t) => Some(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?),
        None => None,
    };
    let spec = AttentionSpec {
        causal,
        window,
        scale: number("scale")?.unwrap_or_else(|| default_scale(p)),
        softcap: number("softcap")?,
        sinks,
    };
    if let Some(v) = side.get("layer_type").filter(|v| !v.is_null()) {
        let name = v.as_str().unwrap_or_default();
        let stated = LayerType::parse(name, &format!("{what}: `layer_type`"))?;
        if stated != spec.layer_type() {
            return Err(crate::usage!(
                "{what}: `layer_type` is {name} but `sliding_window` is {:?}",
                spec.window
            ));
        }
    }
    spec.validate(heads, what)?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every feature round-trips through the JSON text and the f32 sinks tensor; an old sidecar
    /// gives the plain spec; a contradiction is refused by name.
    #[test]
    fn a_spec_round_trips_and_old_dumps_read_as_plain() {
        let spec = AttentionSpec::causal(64, Some(4096))
            .with_scale(0.0625)
            .with_softcap(Some(50.0))
            .with_sinks(Some(vec![0.5, -1.25, 2.0, 0.0]));
        let (side, tensors) = spec_sidecar(&spec, 64).unwrap();
        let text = serde_json::to_string(&side).unwrap();
        let side: Map<String, Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(side["layer_type"], "sliding_attention");
        assert_eq!(side["head_dim_v"], 64);
        let sinks = &tensors[0].1;
        let back = spec_from_sidecar(&side, true, (64, 4), Some(sinks), "x.json").unwrap();
        assert_eq!(back, spec);
        let plain = AttentionSpec::causal(64, None);
        let (side, tensors) = spec_sidecar(&plain, 64).unwrap();
        assert!(
            tensors.is_empty() && side["softcap"].is_null() && side["sliding_window"].is_null()
        );
        assert_eq!(
            spec_from_sidecar(&side, true, (64, 4), None, "x").unwrap(),
            plain
        );
        assert_eq!(
            spec_from_sidecar(&Map::new(), false, (64, 4), None, "x").unwrap(),
            AttentionSpec::bidirectional(64)
        );
        let mut bad = Map::new();
        bad.insert("layer_type".into(), "sliding_attention".into());
        let e = spec_from_sidecar(&bad, true, (64, 4), None, "d.json").unwrap_err();
        assert!(e.to_string().contains("d.json: `layer_type`"), "{e}");
    }
}
