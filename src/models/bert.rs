//! BERT weights for the embeddings and encoder layers 0..=L: pretrained (safetensors, with or
//! without the `bert.` prefix, LayerNorm `weight/bias` or `gamma/beta`) or freshly initialized
//! exactly as Hugging Face's `BertPreTrainedModel._init_weights` does.

use std::path::Path;

use anyhow::Result;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::bert::Config;

use crate::config::InitScheme;
use crate::numerics::sampling::{derive_labeled_seed, normal_values, TrialRng};
use crate::usage;
use rand::{Rng, SeedableRng};

/// Reads and validates config.json.
pub fn load_config(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage!("config {}: cannot read it ({e})", path.display()))?;
    let cfg: Config = serde_json::from_str(&text).map_err(|e| {
        usage!(
            "config {}: not a valid BERT config.json ({e})",
            path.display()
        )
    })?;
    if cfg.num_attention_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
        return Err(usage!(
            "config {}: hidden_size {} is not divisible by num_attention_heads {}",
            path.display(),
            cfg.hidden_size,
            cfg.num_attention_heads
        ));
    }
    Ok(cfg)
}

/// A Linear layer: y = x·Wᵀ + b, W [out, in].
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Tensor,
}

/// LayerNorm γ and β.
#[derive(Debug, Clone)]
pub struct LayerNormWeights {
    pub weight: Tensor,
    pub bias: Tensor,
}

/// Embedding tables and their LayerNorm.
#[derive(Debug, Clone)]
pub struct EmbeddingWeights {
    pub word: Tensor,
    pub position: Tensor,
    pub token_type: Tensor,
    pub layer_norm: LayerNormWeights,
}

/// One encoder layer. Layers before the measured one need all parts; the measured layer only
/// Q, K, V (`rest` is None then).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub rest: Option<LayerRest>,
}

/// Attention output projection, feed-forward block and their LayerNorms.
#[derive(Debug, Clone)]
pub struct LayerRest {
    pub attention_output: Linear,
    pub attention_norm: LayerNormWeights,
    pub intermediate: Linear,
    pub output: Linear,
    pub output_norm: LayerNormWeights,
}

/// Embeddings plus layers 0..=L, f32 on the run's device.
#[derive(Debug, Clone)]
pub struct BertWeights {
    pub embeddings: EmbeddingWeights,
    pub layers: Vec<LayerWeights>,
}

/// Something that yields named tensors of known shapes.
trait TensorSource {
    fn get(&mut self, name: &str, shape: &[usize], kind: Init) -> Result<Tensor>;
}

/// How a parameter is initialized: Hugging Face's `_init_weights`, or for Linear layers under
/// [`InitScheme::Pytorch`] PyTorch's own `nn.Linear.reset_parameters`.
#[derive(Clone, Copy)]
enum Init {
    /// N(0, initializer_range²) — Embedding weights (and Linear weights under HF init).
    Normal,
    /// A Linear weight with this fan-in.
    LinearWeight(usize),
    /// A Linear bias with this fan-in.
    LinearBias(usize),
    /// N(0, initializer_range²) with row `pad` zeroed — nn.Embedding(padding_idx = pad).
    NormalPadRow(usize),
    Zeros,
    Ones,
}

/// Pretrained weights from a safetensors file.
struct Pretrained<'a> {
    st: MmapedSafetensors,
    path: &'a Path,
    device: Device,
}

impl TensorSource for Pretrained<'_> {
    fn get(&mut self, name: &str, shape: &[usize], _kind: Init) -> Result<Tensor> {
        let mut candidates = vec![name.to_string(), format!("bert.{name}")];
        if let Some(stem) = name.strip_suffix("LayerNorm.weight") {
            candidates.push(format!("{stem}LayerNorm.gamma"));
            candidates.push(format!("bert.{stem}LayerNorm.gamma"));
        }
        if let Some(stem) = name.strip_suffix("LayerNorm.bias") {
            candidates.push(format!("{stem}LayerNorm.beta"));
            candidates.push(format!("bert.{stem}LayerNorm.beta"));
        }
        let names: std::collections::HashSet<String> =
            self.st.tensors().into_iter().map(|(n, _)| n).collect();
        let found = candidates.iter().find(|c| names.contains(*c)).ok_or_else(|| {
            usage!(
                "weights {}: tensor '{name}' is missing (also tried with the 'bert.' prefix and gamma/beta); \
                 the file does not hold a BERT model matching config.json",
                self.path.display()
            )
        })?;
        let t = self.st.load(found, &self.device).map_err(|e| {
            let em = crate::tensor_util::candle_message(&e);
            usage!(
                "weights {}: cannot read tensor '{found}' ({em})",
                self.path.display()
            )
        })?;
        if t.dims() != shape {
            return Err(usage!(
                "weights {}: tensor '{found}' has shape {:?} but config.json implies {:?}; the weights do not fit the config",
                self.path.display(),
                t.dims(),
                shape
            ));
        }
        crate::tensor_util::check_finite(&t, || {
            format!("weights {}: tensor '{found}'", self.path.display())
        })?;
        Ok(t.to_dtype(DType::F32)?)
    }
}

/// Hugging Face-style initialization, each tensor from its own seed (model seed, tensor name),
/// so the values do not depend on which tensors are built or in which order.
struct Initialized {
    seed: u64,
    std: f64,
    scheme: InitScheme,
    device: Device,
}

impl TensorSource for Initialized {
    fn get(&mut self, name: &str, shape: &[usize], kind: Init) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        let kind = match (self.scheme, kind) {
            (InitScheme::Hf, Init::LinearWeight(_)) => Init::Normal,
            (InitScheme::Hf, Init::LinearBias(_)) => Init::Zeros,
            (_, k) => k,
        };
        let t = match kind {
            Init::LinearWeight(fan_in) | Init::LinearBias(fan_in) => {
                let bound = 1.0 / (fan_in as f64).sqrt();
                let mut rng = TrialRng::seed_from_u64(derive_labeled_seed(self.seed, name));
                let v: Vec<f32> = (0..numel)
                    .map(|_| ((rng.random::<f64>() * 2.0 - 1.0) * bound) as f32)
                    .collect();
                Tensor::from_vec(v, shape, &self.device)?
            }
            Init::Zeros => Tensor::zeros(shape, DType::F32, &self.device)?,
            Init::Ones => Tensor::ones(shape, DType::F32, &self.device)?,
            Init::Normal | Init::NormalPadRow(_) => {
                let mut v = normal_rows(derive_labeled_seed(self.seed, name), shape, self.std);
                if let Init::NormalPadRow(pad) = kind {
                    let cols = shape[1];
                    if pad < shape[0] {
                        v[pad * cols..(pad + 1) * cols]
                            .iter_mut()
                            .for_each(|x| *x = 0.0);
                    }
                }
                Tensor::from_vec(v, shape, &self.device)?
            }
        };
        Ok(t)
    }
}

/// N(0, std²) values of a tensor, row by row in parallel, row r from its own seed (base, r), so
/// the values do not depend on the thread count.
fn normal_rows(base: u64, shape: &[usize], std: f64) -> Vec<f32> {
    use rayon::prelude::*;
    let numel: usize = shape.iter().product();
    let cols = if shape.len() > 1 {
        shape[1..].iter().product()
    } else {
        numel
    };
    let mut v = vec![0f32; numel];
    v.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(r, row)| {
            let mut rng =
                TrialRng::seed_from_u64(base ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let vals = normal_values(&mut rng, 1, row.len(), std);
            row.iter_mut().zip(vals).for_each(|(x, y)| *x = y as f32);
        });
    v
}

fn linear(
    src: &mut dyn TensorSource,
    prefix: &str,
    out_dim: usize,
    in_dim: usize,
) -> Result<Linear> {
    Ok(Linear {
        weight: src.get(
            &format!("{prefix}.weight"),
            &[out_dim, in_dim],
            Init::LinearWeight(in_dim),
        )?,
        bias: src.get(
            &format!("{prefix}.bias"),
            &[out_dim],
            Init::LinearBias(in_dim),
        )?,
    })
}

fn layer_norm(src: &mut dyn TensorSource, prefix: &str, dim: usize) -> Result<LayerNormWeights> {
    Ok(LayerNormWeights {
        weight: src.get(&format!("{prefix}.LayerNorm.weight"), &[dim], Init::Ones)?,
        bias: src.get(&format!("{prefix}.LayerNorm.bias"), &[dim], Init::Zeros)?,
    })
}

fn embeddings(src: &mut dyn TensorSource, cfg: &Config) -> Result<EmbeddingWeights> {
    let h = cfg.hidden_size;
    Ok(EmbeddingWeights {
        word: src.get(
            "embeddings.word_embeddings.weight",
            &[cfg.vocab_size, h],
            Init::NormalPadRow(cfg.pad_token_id),
        )?,
        position: src.get(
            "embeddings.position_embeddings.weight",
            &[cfg.max_position_embeddings, h],
            Init::Normal,
        )?,
        token_type: src.get(
            "embeddings.token_type_embeddings.weight",
            &[cfg.type_vocab_size, h],
            Init::Normal,
        )?,
        layer_norm: layer_norm(src, "embeddings", h)?,
    })
}

fn layers(src: &mut dyn TensorSource, cfg: &Config, upto: usize) -> Result<Vec<LayerWeights>> {
    let h = cfg.hidden_size;
    (0..=upto)
        .map(|l| {
            let p = format!("encoder.layer.{l}");
            let rest = if l < upto {
                Some(LayerRest {
                    attention_output: linear(src, &format!("{p}.attention.output.dense"), h, h)?,
                    attention_norm: layer_norm(src, &format!("{p}.attention.output"), h)?,
                    intermediate: linear(
                        src,
                        &format!("{p}.intermediate.dense"),
                        cfg.intermediate_size,
                        h,
                    )?,
                    output: linear(src, &format!("{p}.output.dense"), h, cfg.intermediate_size)?,
                    output_norm: layer_norm(src, &format!("{p}.output"), h)?,
                })
            } else {
                None
            };
            Ok(LayerWeights {
                query: linear(src, &format!("{p}.attention.self.query"), h, h)?,
                key: linear(src, &format!("{p}.attention.self.key"), h, h)?,
                value: linear(src, &format!("{p}.attention.self.value"), h, h)?,
                rest,
            })
        })
        .collect()
}

/// Where a group of weights comes from.
#[derive(Debug, Clone)]
pub enum WeightSource<'a> {
    Pretrained(&'a Path),
    Initialized { seed: u64, scheme: InitScheme },
}

fn source<'a>(
    ws: &WeightSource<'a>,
    cfg: &Config,
    device: &Device,
) -> Result<Box<dyn TensorSource + 'a>> {
    Ok(match ws {
        WeightSource::Pretrained(path) => {
            // SAFETY: the file is mapped read-only and not modified while the run holds it.
            let st = unsafe { MmapedSafetensors::new(path) }.map_err(|e| {
                let em = crate::tensor_util::candle_message(&e);
                usage!("weights {}: not a readable safetensors file ({em}); re-download it or pass another --model-dir", path.display())
            })?;
            Box::new(Pretrained {
                st,
                path,
                device: device.clone(),
            })
        }
        WeightSource::Initialized { seed, scheme } => Box::new(Initialized {
            seed: *seed,
            std: cfg.initializer_range,
            scheme: *scheme,
            device: device.clone(),
        }),
    })
}

/// Loads or initializes the embeddings and layers 0..=`layer`, each group from its own source
/// (docs/reference.md §1.4 item 8: the embedding source and the Q/K/V weight source are separate).
pub fn load(
    cfg: &Config,
    layer: usize,
    embeddings_from: &WeightSource,
    layers_from: &WeightSource,
    device: &Device,
) -> Result<BertWeights> {
    if layer >= cfg.num_hidden_layers {
        return Err(usage!(
            "--layer {layer} is beyond the model: it has {} layers (0..={})",
            cfg.num_hidden_layers,
            cfg.num_hidden_layers.saturating_sub(1)
        ));
    }
    let emb = embeddings(source(embeddings_from, cfg, device)?.as_mut(), cfg)?;
    let lay = layers(source(layers_from, cfg, device)?.as_mut(), cfg, layer)?;
    Ok(BertWeights {
        embeddings: emb,
        layers: lay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;

    pub(crate) fn tiny_config() -> Config {
        serde_json::from_str(
            r#"{"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 32, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                "max_position_embeddings": 8, "type_vocab_size": 2, "initializer_range": 0.02,
                "layer_norm_eps": 1e-12, "pad_token_id": 0}"#,
        )
        .unwrap()
    }

    #[test]
    fn initialized_weights_follow_hf_init_weights() {
        let cfg = tiny_config();
        let w = load(
            &cfg,
            1,
            &WeightSource::Initialized {
                seed: 3,
                scheme: InitScheme::Hf,
            },
            &WeightSource::Initialized {
                seed: 3,
                scheme: InitScheme::Hf,
            },
            &test_device(),
        )
        .unwrap();
        let word: Vec<Vec<f32>> = w.embeddings.word.to_vec2().unwrap();
        assert!(
            word[0].iter().all(|&x| x == 0.0),
            "padding row must be zero"
        );
        assert!(word[1].iter().any(|&x| x != 0.0));
        let ln: Vec<f32> = w.embeddings.layer_norm.weight.to_vec1().unwrap();
        assert!(ln.iter().all(|&x| x == 1.0));
        let b: Vec<f32> = w.layers[1].query.bias.to_vec1().unwrap();
        assert!(b.iter().all(|&x| x == 0.0));
        assert!(w.layers[1].rest.is_none() && w.layers[0].rest.is_some());
        // Same seed, same values; the tensor does not depend on what else was built.
        let w0 = load(
            &cfg,
            0,
            &WeightSource::Initialized {
                seed: 3,
                scheme: InitScheme::Hf,
            },
            &WeightSource::Initialized {
                seed: 3,
                scheme: InitScheme::Hf,
            },
            &test_device(),
        )
        .unwrap();
        let a: Vec<Vec<f32>> = w0.layers[0].query.weight.to_vec2().unwrap();
        let c: Vec<Vec<f32>> = w.layers[0].query.weight.to_vec2().unwrap();
        assert_eq!(a, c);
    }

    #[test]
    fn initialized_distribution_has_std_002() {
        let mut cfg = tiny_config();
        cfg.hidden_size = 256;
        cfg.num_attention_heads = 4;
        let w = load(
            &cfg,
            0,
            &WeightSource::Initialized {
                seed: 9,
                scheme: InitScheme::Hf,
            },
            &WeightSource::Initialized {
                seed: 9,
                scheme: InitScheme::Hf,
            },
            &test_device(),
        )
        .unwrap();
        let v: Vec<f32> = w.layers[0]
            .key
            .weight
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        // 65536 draws: SE of the mean 0.02/256 ≈ 7.8e-5, of the sd ≈ 0.02/√(2n) ≈ 5.5e-5.
        assert!(mean.abs() < 4e-4, "{mean}");
        assert!((sd - 0.02).abs() < 3e-4, "{sd}");
    }

    #[test]
    fn pytorch_linear_init_is_uniform_with_bound_one_over_root_fan_in() {
        let mut cfg = tiny_config();
        cfg.hidden_size = 256;
        let src = WeightSource::Initialized {
            seed: 4,
            scheme: InitScheme::Pytorch,
        };
        let w = load(&cfg, 0, &src, &src, &test_device()).unwrap();
        let v: Vec<f32> = w.layers[0]
            .query
            .weight
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let bound = 1.0 / 16.0;
        assert!(v.iter().all(|&x| (x as f64).abs() <= bound));
        let var = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64;
        // Var of U(−b, b) is b²/3.
        assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.02, "{var}");
        let b: Vec<f32> = w.layers[0].query.bias.to_vec1().unwrap();
        assert!(b.iter().any(|&x| x != 0.0) && b.iter().all(|&x| (x as f64).abs() <= bound));
        // Embeddings keep HF's N(0, 0.02²).
        let e: Vec<f32> = w
            .embeddings
            .position
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let sd = (e.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / e.len() as f64).sqrt();
        assert!((sd - 0.02).abs() < 0.002, "{sd}");
    }

    #[test]
    fn layer_beyond_model_is_a_clear_error() {
        let cfg = tiny_config();
        let e = load(
            &cfg,
            2,
            &WeightSource::Initialized {
                seed: 1,
                scheme: InitScheme::Hf,
            },
            &WeightSource::Initialized {
                seed: 1,
                scheme: InitScheme::Hf,
            },
            &test_device(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--layer 2 is beyond the model: it has 2 layers (0..=1)"
        );
    }
}
