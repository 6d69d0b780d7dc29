//! Inputs, in the order the data flows: files from the hub or local paths (`hub`), the text
//! corpus as token windows (`corpus`), BERT weights pretrained or initialized (`model`), and the
//! per-head Q, K, V of one window (`qkv`); decoder LLMs (Llama, Mistral, Qwen2/3, safetensors or
//! GGUF) as a Q/K/V source in `models`.

pub mod corpus;
pub mod decoder;
pub mod dump;
pub mod gguf_tokenizer;
pub mod hub;
// BERT's weights and its Q/K/V forward live in models/ (bert.rs, bert_qkv.rs, issue 54); these
// paths keep working.
pub use crate::models::bert as model;
pub use crate::models::bert_qkv as qkv;
// The model room moved to `crate::models`; `inputs::models::…` paths keep working.
pub use crate::models;
pub mod qkv_cache;

use std::path::PathBuf;

use anyhow::Result;
use candle_core::Device;

use crate::config::{InputConfig, ModelKind};

/// The model whose layer L gives Q, K, V.
pub enum Model {
    /// A BERT encoder (docs/reference.md §1.4).
    Bert {
        config: candle_transformers::models::bert::Config,
        weights: model::BertWeights,
    },
    /// A decoder LLM (docs/reference.md §7.1, §7.7): Llama, Mistral, Qwen2/3 or a §7.7 family,
    /// loaded through layer L (or whole for an end-to-end run); its layer L has its own
    /// attention spec (scale, cap, window, sinks).
    Decoder(Box<dyn models::Decoder>),
}

impl Model {
    /// The decoder, None for BERT.
    pub fn decoder(&self) -> Option<&dyn models::Decoder> {
        match self {
            Model::Decoder(d) => Some(d.as_ref()),
            Model::Bert { .. } => None,
        }
    }

    /// A §7.7 family's decoder (not a Llama-style one), None otherwise: its dump is more than
    /// Q, K, V, and its layer's spec is its own.
    pub fn family(&self) -> Option<&dyn models::Decoder> {
        self.decoder().filter(|d| !is_llama_style(*d))
    }
}

/// Whether a decoder is one of the Llama-style families (llama, mistral, qwen2, qwen3), whose
/// dump is Q, K, V alone (the Q/K/V cache keeps it) and whose sweep may also run `--mask none`.
fn is_llama_style(d: &dyn models::Decoder) -> bool {
    models::DecoderFamily::from_model_type(d.model_type()).is_some()
}

/// Everything a sweep or a dump needs, resolved and loaded once.
pub struct Prepared {
    pub model: Model,
    pub corpus: corpus::Corpus,
    pub device: Device,
    /// Display id of the model (hub id or directory name).
    pub model_id: String,
    /// Every input file read (for the manifest's hashes).
    pub files: Vec<(String, PathBuf)>,
    /// Where computed Q/K/V are kept and found again ([`Prepared::use_qkv_cache`]); None: none.
    pub qkv_cache: Option<qkv_cache::QkvCache>,
    /// How a decoder's weight matrices are kept and their memory estimate (issue 56); None
    /// for BERT.
    pub weight_plan: Option<decoder::WeightPlan>,
}

impl Prepared {
    /// The decoder's shape, None for BERT.
    fn decoder_shape(&self) -> Option<models::DecoderShape> {
        self.model.decoder().map(|d| d.shape())
    }
    /// Query heads H.
    pub fn heads(&self) -> usize {
        match &self.model {
            Model::Bert { config, .. } => config.num_attention_heads,
            Model::Decoder(d) => d.shape().heads,
        }
    }
    /// K/V heads H_kv (= H without grouped-query heads).
    pub fn kv_heads(&self) -> usize {
        self.decoder_shape()
            .map_or_else(|| self.heads(), |s| s.kv_heads)
    }
    pub fn head_dim(&self) -> usize {
        match &self.model {
            Model::Bert { config, .. } => config.hidden_size / config.num_attention_heads,
            Model::Decoder(d) => d.shape().head_dim,
        }
    }
    /// p_v, the value head dim (≠ p_qk for MLA).
    pub fn head_dim_v(&self) -> usize {
        self.decoder_shape()
            .map_or_else(|| self.head_dim(), |s| s.head_dim_v)
    }
    /// The model's layer count L.
    pub fn layers(&self) -> usize {
        match &self.model {
            Model::Bert { config, .. } => config.num_hidden_layers,
            Model::Decoder(d) => d.shape().layers,
        }
    }
    /// The positions the model was trained on.
    pub fn max_positions(&self) -> usize {
        match &self.model {
            Model::Bert { config, .. } => config.max_position_embeddings,
            Model::Decoder(d) => d.shape().max_position_embeddings,
        }
    }
    /// The mask of the model's own attention: causal for decoders, none for BERT (§7.2).
    pub fn native_mask(&self) -> crate::attention::Mask {
        match &self.model {
            Model::Bert { .. } => crate::attention::Mask::None,
            Model::Decoder(_) => crate::attention::Mask::Causal,
        }
    }

    /// Layer `layer`'s exact attention for heads of size `p` under the run's `mask`: a decoder's
    /// own under its causal mask (its scale, cap, window and sinks, from its config; a
    /// Mistral/Qwen sliding layer's target is windowed, as transformers computes it and as
    /// e2e's hook sees it, issue 54), else the mask's plain one (`--mask none`, the Llama-style
    /// decoders' bidirectional diagnostic, and BERT).
    pub fn layer_spec(
        &self,
        layer: usize,
        mask: crate::attention::Mask,
        p: usize,
    ) -> crate::attention::AttentionSpec {
        match self.model.decoder() {
            Some(d) if mask == crate::attention::Mask::Causal => d.attention_spec(layer),
            _ => crate::attention::AttentionSpec::of_mask(mask, p),
        }
    }

    /// The decoder as the end-to-end protocol runs it (docs/reference.md §10.1); None for BERT.
    pub fn whole_decoder(&self) -> Option<&dyn models::Decoder> {
        self.model.decoder()
    }

    /// The `model_type` of a decoder whose layers are Multi-head Latent Attention
    /// (deepseek_v2/v3), else None.
    pub fn mla_model_type(&self) -> Option<&'static str> {
        self.model
            .decoder()
            .filter(|d| d.is_mla())
            .map(|d| d.model_type())
    }

    /// The values of an MLA layer's latent row, r + d_R (None for other models).
    pub fn mla_latent_width(&self) -> Option<usize> {
        self.model.decoder().and_then(|d| d.mla_latent_width())
    }

    /// Refuses a sweep a §7.7 family's layer cannot have: a mask other than its own causal one
    /// (the spec is the layer's).
    pub fn check_family_sweep(&self, mask: crate::attention::Mask) -> Result<()> {
        let Some(model) = self.model.family() else {
            return Ok(());
        };
        let name = model.model_type();
        if mask != crate::attention::Mask::Causal {
            return Err(crate::usage!(
                "a {name} layer's attention is causal (its spec, docs/reference.md §7.7): drop --mask none"
            ));
        }
        Ok(())
    }

    /// Turns the Q/K/V cache on as `setting` says for this model (decoders by default).
    pub fn use_qkv_cache(
        &mut self,
        setting: &qkv_cache::CacheSetting,
        inputs: &InputConfig,
    ) -> Result<()> {
        let decoder = self.model.decoder().is_some();
        // A family's dump is more than Q, K, V (its spec, sinks, MLA's latent): not cached.
        let family = self.model.family().is_some();
        self.qkv_cache = match setting.resolve(decoder).filter(|_| !family) {
            Some(dir) => Some(qkv_cache::QkvCache::open(&dir, inputs, &self.files)?),
            None => None,
        };
        Ok(())
    }

    /// Q ([H, n, p]), K and V ([H_kv, n, p]) in the run's dtype, of window `window` of length
    /// `n`: what the sweep measures, `dump-qkv` writes and the Python package's `inputs` returns.
    pub fn window_qkv(
        &self,
        inputs: &InputConfig,
        n: usize,
        window: usize,
    ) -> Result<(
        candle_core::Tensor,
        candle_core::Tensor,
        candle_core::Tensor,
    )> {
        let (q, k, v, _) = self.window_qkv_latent(inputs, n, window)?;
        Ok((q, k, v))
    }

    /// [`Self::window_qkv`] and, on an MLA layer, the window's latent rows and the layer's W_kvb
    /// (docs/reference.md §7.7.5), which the §8 caches quantize there.
    pub fn window_qkv_latent(
        &self,
        inputs: &InputConfig,
        n: usize,
        window: usize,
    ) -> Result<WindowQkv> {
        let ids = self.corpus.window(n, window)?;
        let compute = || match &self.model {
            Model::Bert { config, weights } => qkv::window_qkv_dropout(
                weights,
                config,
                &ids,
                inputs.embedding,
                inputs.candle_dtype(),
                inputs.dropout_for(n, window),
            ),
            Model::Decoder(d) => {
                let dump = d.layer_dump(&ids, inputs.candle_dtype())?;
                Ok((dump.q, dump.k, dump.v))
            }
        };
        let (q, k, v, latent) = match (self.model.family(), &self.qkv_cache) {
            (Some(model), _) => {
                let dump = model.layer_dump(&ids, inputs.candle_dtype())?;
                let latent = if model.is_mla() {
                    Some(std::sync::Arc::new(mla_latent(&dump)?))
                } else {
                    None
                };
                (dump.q, dump.k, dump.v, latent)
            }
            (_, Some(cache)) => {
                let (q, k, v) = cache.get_or_compute(n, window, &self.device, compute)?;
                (q, k, v, None)
            }
            (_, None) => {
                let (q, k, v) = compute()?;
                (q, k, v, None)
            }
        };
        check_finite_forward(inputs, n, window, &[("Q", &q), ("K", &k), ("V", &v)])?;
        Ok((q, k, v, latent))
    }

    /// A §7.7 family's layer-L dump (Q, K, V, the layer's spec, its extra tensors and sidecar
    /// fields) of window `window` of length `n`, in the run's dtype; None for other models.
    pub fn family_dump(
        &self,
        inputs: &InputConfig,
        n: usize,
        window: usize,
    ) -> Result<Option<models::LayerDump>> {
        let Some(model) = self.model.family() else {
            return Ok(None);
        };
        let ids = self.corpus.window(n, window)?;
        let dump = model.layer_dump(&ids, inputs.candle_dtype())?;
        check_finite_forward(
            inputs,
            n,
            window,
            &[("Q", &dump.q), ("K", &dump.k), ("V", &dump.v)],
        )?;
        Ok(Some(dump))
    }
}

/// A window's Q, K, V and, on an MLA layer, its latent view.
pub type WindowQkv = (
    candle_core::Tensor,
    candle_core::Tensor,
    candle_core::Tensor,
    Option<std::sync::Arc<crate::attention::latent::LayerLatent>>,
);

/// The latent view of an MLA layer's dump: its `kv_latent` and `w_kv_b` extras.
fn mla_latent(dump: &models::LayerDump) -> Result<crate::attention::latent::LayerLatent> {
    let get = |name: &str| {
        dump.extra
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| anyhow::anyhow!("an MLA layer's dump lacks its '{name}'"))
    };
    crate::attention::latent::LayerLatent::new(get("kv_latent")?, get("w_kv_b")?)
}

/// The weights were checked finite when loaded: a NaN or ∞ in a forward's output comes from the
/// forward itself (an overflow), and is named here rather than blamed on the device later.
fn check_finite_forward(
    inputs: &InputConfig,
    n: usize,
    window: usize,
    tensors: &[(&str, &candle_core::Tensor)],
) -> Result<()> {
    for (name, t) in tensors {
        if let Some((at, value)) = crate::tensor_util::first_non_finite(t)? {
            return Err(crate::usage!(
                "layer {}'s {name} of window {window} at n = {n} holds {value} at [head, position, dim] = {at:?}, although every weight is finite: the forward overflowed in {:?}; try --dtype f64, or check the model's weights and config",
                inputs.layer,
                inputs.candle_dtype()
            ));
        }
    }
    Ok(())
}

/// Resolves files (hub cache or local), reads config and tokenizer, tokenizes the corpus and
/// loads or initializes the weights.
pub fn prepare(inputs: &InputConfig) -> Result<Prepared> {
    prepare_for(inputs, usize::MAX)
}

/// [`prepare`] tokenizing only the corpus's first `need_tokens` tokens or so (whole rows): what a
/// run of `windows` windows of length up to `n` reads.
pub fn prepare_for(inputs: &InputConfig, need_tokens: usize) -> Result<Prepared> {
    prepare_depth(inputs, need_tokens, models::Depth::Through(inputs.layer))
}

/// [`prepare_for`] with a decoder loaded to `depth` (the whole model for an end-to-end run,
/// docs/reference.md §10.1); a BERT encoder is refused at [`models::Depth::Whole`].
pub fn prepare_depth(
    inputs: &InputConfig,
    need_tokens: usize,
    depth: models::Depth,
) -> Result<Prepared> {
    let device = qkv::device(&inputs.device)?;
    let source = inputs.source();
    let corpus_path = || -> Result<PathBuf> {
        Ok(match inputs.corpus.strip_prefix("file:") {
            Some(p) => PathBuf::from(p),
            None => hub::wikitext_parquet(
                &hub::Hub::from_env()?,
                inputs.corpus.rsplit('/').next().unwrap_or("test"),
            )?,
        })
    };
    if let Some(files) = decoder::resolve(&source, inputs, depth, hub::Hub::from_env)? {
        let (model, weight_plan) = decoder::load_decoder(&files, inputs, depth, &device)?;
        let vocab_size = model.shape().vocab_size;
        let model = Model::Decoder(model);
        let (tokenizer, bos) = decoder_tokenizer(&files)?;
        // No token needed (an e2e run whose windows are --ids): no corpus is read or fetched.
        let corpus_path = (need_tokens > 0).then(corpus_path).transpose()?;
        let mut corpus = match &corpus_path {
            Some(path) => corpus::tokenize_prefix(path, &tokenizer, vocab_size, need_tokens)?,
            None => corpus::Corpus {
                path: PathBuf::new(),
                ids: Vec::new(),
                bos: None,
                complete: true,
            },
        };
        corpus.bos = bos;
        let mut list = vec![
            ("config".to_string(), files.config.clone()),
            (
                "tokenizer".to_string(),
                files.tokenizer.path().to_path_buf(),
            ),
        ];
        if let Some(t) = &files.tokenizer_config {
            list.push(("tokenizer_config".to_string(), t.clone()));
        }
        match &files.weights {
            Some(decoder::Weights::Safetensors { path, shards }) => {
                if path.extension().is_some_and(|e| e == "json") {
                    list.push(("weights_index".to_string(), path.clone()));
                }
                list.extend(shards.iter().map(|s| ("weights".to_string(), s.clone())));
            }
            Some(decoder::Weights::Gguf(g)) if *g != files.config => {
                list.push(("weights".to_string(), g.clone()))
            }
            _ => {}
        }
        if let Some(path) = corpus_path {
            list.push(("corpus".to_string(), path));
        }
        return Ok(Prepared {
            model,
            corpus,
            device,
            model_id: hub::source_name(&source),
            files: list,
            qkv_cache: None,
            weight_plan: Some(weight_plan),
        });
    }
    if depth == models::Depth::Whole {
        if let crate::config::ModelSource::Dir(dir) = &source {
            if !dir.exists() {
                return Err(crate::usage!(
                    "--model-dir {}: no such file or directory; give a decoder's directory (config.json and weights, or a .gguf) or a .gguf file",
                    dir.display()
                ));
            }
        }
        return Err(crate::usage!(
            "{}: an end-to-end run needs a decoder LLM (Llama, Mistral, Qwen; safetensors or GGUF), not a BERT encoder",
            hub::source_name(&source)
        ));
    }
    let files = hub::model_files(
        &source,
        inputs.needs_pretrained_weights(),
        hub::Hub::from_env,
    )?;
    let config = model::load_config(&files.config)?;
    let tokenizer = corpus::load_tokenizer(&files.tokenizer)?;
    let corpus_path = corpus_path()?;
    let corpus = corpus::tokenize_prefix(&corpus_path, &tokenizer, config.vocab_size, need_tokens)?;
    let from = |kind: ModelKind| match kind {
        ModelKind::Pretrained => model::WeightSource::Pretrained(
            files
                .weights
                .as_deref()
                .expect("weights resolved when needed"),
        ),
        ModelKind::Initialized => model::WeightSource::Initialized {
            seed: inputs.model_seed,
            scheme: inputs.init,
        },
    };
    let weights = model::load(
        &config,
        inputs.layer,
        &from(inputs.embeddings_from),
        &from(inputs.model),
        &device,
    )?;
    let mut list = vec![
        ("config".to_string(), files.config.clone()),
        ("tokenizer".to_string(), files.tokenizer.clone()),
    ];
    if let Some(w) = &files.weights {
        list.push(("weights".to_string(), w.clone()));
    }
    list.push(("corpus".to_string(), corpus_path));
    Ok(Prepared {
        model: Model::Bert { config, weights },
        corpus,
        device,
        model_id: hub::source_name(&source),
        files: list,
        qkv_cache: None,
        weight_plan: None,
    })
}

/// A decoder's tokenizer and its BOS policy (docs/reference.md §7.1 "Tokens"), from its tokenizer.json
/// or from its GGUF's own metadata; one line on stderr says which when a GGUF is involved.
fn decoder_tokenizer(
    files: &decoder::DecoderFiles,
) -> Result<(tokenizers::Tokenizer, Option<u32>)> {
    match &files.tokenizer {
        decoder::TokenizerFile::Json(path) => {
            if let Some(decoder::Weights::Gguf(g)) = &files.weights {
                if path.parent() == g.parent() {
                    eprintln!(
                        "tokenizer: {} (beside the GGUF; its own tokenizer.ggml.* vocabulary is not used)",
                        path.display()
                    );
                }
            }
            let tokenizer = corpus::load_tokenizer(path)?;
            let bos = models::bos_token(path, files.tokenizer_config.as_deref())?;
            Ok((tokenizer, bos))
        }
        decoder::TokenizerFile::Gguf(path) => {
            let g = gguf_tokenizer::load(path)?;
            eprintln!("tokenizer: {} of {}", g.describe, path.display());
            Ok((g.tokenizer, g.bos))
        }
    }
}
