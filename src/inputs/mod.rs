//! Inputs, in the order the data flows: files from the hub or local paths (`hub`), the text
//! corpus as token windows (`corpus`), BERT weights pretrained or initialized (`model`), and the
//! per-head Q, K, V of one window (`qkv`); decoder LLMs (Llama, Mistral, Qwen2/3, safetensors or
//! GGUF) as a Q/K/V source in `models`.

pub mod corpus;
pub mod dump;
pub mod hub;
pub mod model;
pub mod models;
pub mod qkv;

use std::path::PathBuf;

use anyhow::Result;
use candle_core::Device;

use crate::config::{InputConfig, ModelKind};

/// Everything a sweep or a dump needs, resolved and loaded once.
pub struct Prepared {
    pub config: candle_transformers::models::bert::Config,
    pub weights: model::BertWeights,
    pub corpus: corpus::Corpus,
    pub device: Device,
    /// Display id of the model (hub id or directory name).
    pub model_id: String,
    /// Every input file read (for the manifest's hashes).
    pub files: Vec<(String, PathBuf)>,
}

impl Prepared {
    pub fn heads(&self) -> usize {
        self.config.num_attention_heads
    }
    pub fn head_dim(&self) -> usize {
        self.config.hidden_size / self.config.num_attention_heads
    }

    /// Q, K, V ([heads, n, p], in the run's dtype) of window `window` of length `n`: what the
    /// sweep measures, `dump-qkv` writes and the Python package's `inputs` returns.
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
        let ids = self.corpus.window(n, window)?;
        qkv::window_qkv_dropout(
            &self.weights,
            &self.config,
            ids,
            inputs.embedding,
            inputs.candle_dtype(),
            inputs.dropout_for(n, window),
        )
    }
}

/// Resolves files (hub cache or local), reads config and tokenizer, tokenizes the corpus and
/// loads or initializes the weights.
pub fn prepare(inputs: &InputConfig) -> Result<Prepared> {
    let device = qkv::device(&inputs.device)?;
    let source = inputs.source();
    let files = hub::model_files(
        &source,
        inputs.needs_pretrained_weights(),
        hub::Hub::from_env,
    )?;
    let config = model::load_config(&files.config)?;
    let tokenizer = corpus::load_tokenizer(&files.tokenizer)?;
    let corpus_path = match inputs.corpus.strip_prefix("file:") {
        Some(p) => PathBuf::from(p),
        None => hub::wikitext_parquet(
            &hub::Hub::from_env()?,
            inputs.corpus.rsplit('/').next().unwrap_or("test"),
        )?,
    };
    let corpus = corpus::tokenize(&corpus_path, &tokenizer, config.vocab_size)?;
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
        config,
        weights,
        corpus,
        device,
        model_id: hub::source_name(&source),
        files: list,
    })
}
