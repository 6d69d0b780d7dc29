//! What a sweep refuses before it reads a window because of the layer it measures
//! (docs/reference.md §7.7.6): methods that lack a feature of the layer's spec, and the §8
//! methods on an MLA layer.

use anyhow::Result;

use crate::attention;
use crate::config::RunConfig;
use crate::inputs;
use crate::usage;

/// Everything a run refuses of its methods on the layer it measures, before it reads a window:
/// the §8 methods an MLA layer does not take, a head size a method's format does not fit (a
/// latent-row cache on MLA groups the latent row's width), and a spec feature a method lacks.
/// The sweep's and `bench`'s.
pub(crate) fn refuse_for_layer(
    cfg: &RunConfig,
    prepared: &inputs::Prepared,
    methods: &[Box<dyn attention::Method>],
) -> Result<()> {
    refuse_quantized_mla(cfg, prepared, methods)?;
    for m in methods {
        let p = match prepared.mla_latent_width() {
            Some(width) if m.reads_mla_latent() => width,
            _ => prepared.head_dim(),
        };
        m.check_head_dim(p).map_err(|why| {
            usage!(
                "--methods {}: {why}; the model's heads have p = {p} — leave {} out for this model",
                m.id(),
                m.id()
            )
        })?;
    }
    refuse_methods_beyond_spec(cfg, prepared, methods)
}

/// Refuses KIVI and SageAttention on an MLA layer (docs/reference.md §7.7.6, MLA), naming them
/// and the methods that do run: MLA caches one latent row [c_j; k_pe,j] per token, which the KV
/// caches quantize ([`attention::Method::reads_mla_latent`]), while quantizing the materialised
/// per-head K/V would measure a cache nobody deploys, and what KIVI's per-channel K groups or
/// SageAttention's kernels do on the latent row is not specified.
fn refuse_quantized_mla(
    cfg: &RunConfig,
    prepared: &inputs::Prepared,
    methods: &[Box<dyn attention::Method>],
) -> Result<()> {
    let Some(model_type) = prepared.mla_model_type() else {
        return Ok(());
    };
    let ids =
        |ms: &[&dyn attention::Method]| ms.iter().map(|m| m.id()).collect::<Vec<_>>().join(",");
    let (refused, run): (Vec<&dyn attention::Method>, Vec<_>) =
        methods.iter().map(|m| m.as_ref()).partition(|m| {
            // The latent cache has a prefill form only: under --decode every §8 method goes.
            m.family() == attention::Family::Quantized
                && (!m.reads_mla_latent() || cfg.decode.is_some())
        });
    if refused.is_empty() {
        return Ok(());
    }
    if let Some(n_f) = cfg.decode {
        return Err(usage!(
            "--decode {n_f} on layer {} of {model_type} (Multi-head Latent Attention): the §8 methods' latent-row cache has no decode form yet (docs/reference.md §7.7.6), so these methods are refused there: {}; {}",
            cfg.inputs.layer,
            ids(&refused),
            if run.is_empty() {
                "run the §9 methods instead (e.g. --methods snapkv,dec_window)".to_string()
            } else {
                format!("run the others with --methods {}", ids(&run))
            }
        ));
    }
    let others = if run.is_empty() {
        "run the KV caches (kv_f16 … kv_q4_0) or the sparse, low-rank or §9 methods there instead (e.g. --methods kv_q8_0,window,topk)"
            .to_string()
    } else {
        format!("run the others with --methods {}", ids(&run))
    };
    Err(usage!(
        "layer {} of {model_type} is Multi-head Latent Attention: its cache holds one latent row [c; k_pe] per token, not per-head K/V; the KV caches (kv_f16 … kv_q4_0) quantize that row, but what KIVI and SageAttention do on it is not specified (docs/reference.md §7.7.6), so these methods are refused there: {}; {others}",
        cfg.inputs.layer,
        ids(&refused)
    ))
}

/// Refuses, before any window is read, the methods that do not implement what the run's layer
/// spec has at its longest length (docs/reference.md §7.7.6), naming them and the methods that
/// do run there; every trial is refused the same way ([`attention::refuse_unimplemented_spec`]).
fn refuse_methods_beyond_spec(
    cfg: &RunConfig,
    prepared: &inputs::Prepared,
    methods: &[Box<dyn attention::Method>],
) -> Result<()> {
    let p = prepared.head_dim();
    let spec = prepared.layer_spec(cfg.inputs.layer, cfg.mask, p);
    let n = cfg.lengths.iter().max().copied().unwrap_or(0);
    let features = spec.features(p, n);
    let support =
        |m: &dyn attention::Method| attention::spec_support_under(m, cfg.decode.is_some());
    let (refused, run): (Vec<&dyn attention::Method>, Vec<_>) = methods
        .iter()
        .map(|m| m.as_ref())
        .partition(|m| features.first_missing(support(*m)).is_some());
    let Some(first) = refused.first() else {
        return Ok(());
    };
    let feature = features.first_missing(support(*first)).unwrap_or("");
    let ids =
        |ms: &[&dyn attention::Method]| ms.iter().map(|m| m.id()).collect::<Vec<_>>().join(",");
    let others = if run.is_empty() {
        "none of the chosen methods implements it yet".to_string()
    } else {
        format!("run the others with --methods {}", ids(&run))
    };
    Err(usage!(
        "layer {} (n up to {n}) has {feature} ({spec}), which these methods do not implement yet (docs/reference.md §7.7.6): {}; {others}",
        cfg.inputs.layer,
        ids(&refused)
    ))
}
