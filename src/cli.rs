//! Command-line definitions. The sweep is the main job (no subcommand); subcommands redraw
//! figures, check against a baseline, merge shards, dump one window's Q/K/V, and benchmark.
//!
//! This module belongs to the binary: the library never sees clap. Arguments become the library's
//! plain configuration here (`InputArgs::options`, `SweepArgs::options`, `CheckArgs::request`),
//! and the library's enums are read through [`ChoiceParser`].

use std::ffi::OsStr;
use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};

use approx_bench::attention::{Mask, Target};
use approx_bench::check::{Against, CheckRequest};
use approx_bench::config::{
    Choice, Dtype, EmbeddingPolicy, FigurePreset, InitScheme, InputOptions, ModelKind, RunOptions,
};
use approx_bench::report::check::CheckOptions;
use approx_bench::report::figures::Statistic;

#[derive(Debug, Parser)]
#[command(
    name = "approx-bench",
    version,
    about = "Spectral-norm error of fast-attention approximations against exact softmax attention",
    long_about = "Measures how far fast-attention approximations are from exact attention, on \
                  the real Q/K/V of a model's layer.\n\n\
                  Without a subcommand it runs the sweep: the trial grid lengths × windows × \
                  heads × methods × d on one layer of an encoder (BERT-style; Wikitext-2 by \
                  default) or of a decoder LLM (Llama, Mistral, Qwen; safetensors or GGUF; \
                  causal attention by default), and writes trials.csv, summary.csv and \
                  manifest.json into --out (rerun the same command to resume). The methods span \
                  every family: low rank and Nyström, random features, sampling, sparse and \
                  hashing, sparse + low-rank hybrids, the LLM-era causal prefill methods, \
                  quantized KV caches and SageAttention kernels and, with --decode N_F, \
                  decode-time KV-cache compression; --target kernelized scores Skyformer's \
                  Gaussian-kernel target instead of softmax.\n\n\
                  Subcommands: e2e runs a method in every layer of a decoder and measures the \
                  damage at the output (next-token KL, top-1 agreement and NLL against the exact \
                  model) beside each layer's operator error; dump-qkv writes a window's Q/K/V \
                  for your own method and score scores its outputs; plot, merge, check, anchors \
                  and bench work on runs.\n\n\
                  Every method's definition, what d means, its cost, the metric and the \
                  protocols: docs/reference.md (the § numbers cited in the help texts are its \
                  headings).",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Worker threads for the whole process (heads and row blocks run in parallel; results do
    /// not depend on it). Default: RAYON_NUM_THREADS if set, else every available core.
    #[arg(long, global = true, value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub sweep: SweepArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write one window's per-head Q, K, V ([heads, n, p], f32) and token ids to a safetensors file.
    DumpQkv(DumpArgs),
    /// Draw the figures (PNG) from one or more finished runs' summary.csv.
    Plot(PlotArgs),
    /// Score your own method's outputs, computed anywhere on `dump-qkv` inputs: writes a run
    /// (trials.csv, summary.csv, manifest.json) that plot, check and merge take like any other.
    Score(ScoreArgs),
    /// Combine shard outputs (--shard K/N runs, the sweep's or e2e's) into one run with summary and manifest.
    Merge(MergeArgs),
    /// Time each stage (Q/K/V, exact attention with GFLOP/s, every method and d, the metric) on window 0
    /// of each length, and report peak memory. Takes the sweep's flags; --windows and --out are ignored.
    Bench(BenchArgs),
    /// Compare a run with a baseline: regressions beyond the noise, missing points, new
    /// non-finite trials and configuration changes. Exit 0 pass, 1 fail, 2 unusable input.
    Check(CheckArgs),
    /// Compare runs with the published values of both Figure 1s (docs/reference.md §4): a markdown
    /// table of every matched anchor point with mean ± SE and the ratio, and the calibration score.
    Anchors(AnchorsArgs),
    /// A method in every layer of a decoder LLM, the damage at the output (docs/reference.md §10):
    /// next-token KL, top-1 and NLL against the exact run, beside every layer's operator error.
    /// Writes e2e.csv, e2e_layers.csv, summary.csv (which operator metric predicts the KL),
    /// ids.txt and manifest.json; rerun the same command to resume.
    E2e(E2eArgs),
}

#[derive(Debug, Clone, Args)]
pub struct E2eArgs {
    #[command(flatten)]
    pub inputs: InputArgs,
    /// Window lengths n, comma-separated (windows of the corpus; ignored with --ids).
    #[arg(long, value_delimiter = ',', default_value = "1024")]
    pub lengths: Vec<usize>,
    /// Windows per length.
    #[arg(long, default_value_t = 4)]
    pub windows: usize,
    /// Continuation tokens n_f: the scored positions are the last n_f predictions of each window
    /// (docs/reference.md §10.1); decode methods compress the first n − n_f tokens' cache.
    #[arg(long, default_value_t = 256)]
    pub n_f: usize,
    /// Methods, comma-separated ids or presets: `prefill` (the §7 causal methods), `quant` (the §8
    /// methods, d = 0), `decode` (the §9 methods and the cache reads dkv_q4_0, dkivi2), `all`
    /// (the three), `kvpress` (kvpress's presses, one set per K/V head: snapkv_press, …). The mode
    /// follows the method: §9 ids, presses and d-prefixed §8 caches run in decode mode.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub methods: Vec<String>,
    /// Budgets d (keys per query, prompt keys kept per head), comma-separated; §8 methods run once.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    pub features: Vec<usize>,
    /// Token ids from a file instead of the corpus: text (each line one window of
    /// whitespace-separated ids) or .npy (integers, 1-D one window, 2-D one row per window).
    #[arg(long)]
    pub ids: Option<PathBuf>,
    /// Layers ℓ* of the one-layer view (the method on the exact run's Q/K/V of ℓ*) [default: 0 and L/2].
    #[arg(long, value_delimiter = ',')]
    pub one_layer: Option<Vec<usize>>,
    /// Also write e2e_positions.csv: per scored position KL, both argmaxes and both NLLs.
    #[arg(long)]
    pub positions: bool,
    /// Also write e2e_heads.csv: every layer's error columns (e2e_layers.csv's) per query head.
    #[arg(long)]
    pub per_head: bool,
    /// Base seed of every trial's stream (the §7–§9 methods are deterministic).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory.
    #[arg(long, default_value = "results/e2e-latest")]
    pub out: PathBuf,
    /// Print the correlation table (summary.csv) at the end.
    #[arg(long)]
    pub summary: bool,
    /// No per-point lines and no KL report on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Run only shard K of N (1-based): the windows w with w mod N = K − 1, whose rows are those
    /// of an unsharded run. Join the shards' directories with `approx-bench merge`.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
}

impl E2eArgs {
    pub fn request(&self, command: Vec<String>) -> anyhow::Result<approx_bench::e2e::E2eRequest> {
        // Flags of the sweep that an e2e run has no use for are refused, not ignored (issue 57).
        if let Some(l) = self.inputs.layer {
            return Err(approx_bench::usage!(
                "--layer {l}: e2e puts the method in every layer; drop --layer (--one-layer L,… names the layers whose one-layer error is reported)"
            ));
        }
        if self.inputs.embedding_dropout != 0.0 {
            return Err(approx_bench::usage!(
                "--embedding-dropout {}: e2e runs the model in eval mode; drop the flag",
                self.inputs.embedding_dropout
            ));
        }
        Ok(approx_bench::e2e::E2eRequest {
            inputs: approx_bench::config::InputConfig::new(&self.inputs.options())?,
            lengths: self.lengths.clone(),
            windows: self.windows,
            n_f: self.n_f,
            methods: approx_bench::e2e::expand_methods(&self.methods),
            user_methods: Default::default(),
            features: self.features.clone(),
            ids_file: self.ids.clone(),
            out: self.out.clone(),
            seed: self.seed,
            one_layer: self.one_layer.clone(),
            positions: self.positions,
            per_head: self.per_head,
            quiet: self.quiet,
            command,
            shard: self
                .shard
                .as_deref()
                .map(approx_bench::config::Shard::parse)
                .transpose()?,
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct AnchorsArgs {
    /// Run directories or summary.csv files (rows are matched by model kind, n, method and d).
    #[arg(long, required = true)]
    pub from: Vec<PathBuf>,
    /// Only this model kind.
    #[arg(long, value_parser = ChoiceParser::<ModelKind>::new())]
    pub model: Option<ModelKind>,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub sweep: SweepArgs,
    /// Timed repetitions per stage (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
}

/// Model, corpus and Q/K/V options shared by the sweep and `dump-qkv`.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// Q/K/V weights: `pretrained` (needs model.safetensors) or `initialized` (HF init from --model-seed).
    #[arg(long, value_parser = ChoiceParser::<ModelKind>::new(), default_value = "pretrained")]
    pub model: ModelKind,
    /// Hugging Face model id, fetched through the hub cache (HF_HOME).
    #[arg(long, default_value = "bert-base-cased")]
    pub model_id: String,
    /// Hub revision (branch, tag or commit) of --model-id.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Local model directory (config.json, tokenizer.json or vocab.txt, model.safetensors) instead of the hub.
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
    /// Seed of the Hugging Face-style initialization (--model initialized or --embeddings-from initialized).
    #[arg(long, default_value_t = 12345)]
    pub model_seed: u64,
    /// Initialization of Linear layers when initialized: `hf` (N(0, 0.02²), biases 0) or `pytorch`
    /// (nn.Linear's default kaiming-uniform, uniform biases).
    #[arg(long, value_parser = ChoiceParser::<InitScheme>::new(), default_value = "hf")]
    pub init: InitScheme,
    /// Dropout probability applied to the embedding output, as in a model left in training mode
    /// (seeded per window; 0 = eval mode).
    #[arg(long, default_value_t = 0.0)]
    pub embedding_dropout: f64,
    /// Source of the embedding tables; defaults to --model (docs/reference.md §1.4 item 8).
    #[arg(long, value_parser = ChoiceParser::<ModelKind>::new())]
    pub embeddings_from: Option<ModelKind>,
    /// How token ids become X. The default `word-pos-first` (positions for the first 512 tokens only) is
    /// the calibrated pipeline that reproduces both papers' initialized anchors (results/README.md);
    /// `word-pos` is the recommendation of docs/reference.md §1.4 (positions modulo the table).
    #[arg(long, value_parser = ChoiceParser::<EmbeddingPolicy>::new(), default_value = "word-pos-first")]
    pub embedding: EmbeddingPolicy,
    /// Layer whose Q/K/V are measured (earlier layers run exactly over the window) [default: 0; a
    /// family with sliding layers (gemma2, gemma3, gpt-oss): its first full-attention layer].
    #[arg(long)]
    pub layer: Option<usize>,
    /// Raw text corpus file (e.g. wiki.test.raw) or a parquet file with a `text` column, instead of the hub dataset.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Split of the hub dataset Salesforce/wikitext (wikitext-2-raw-v1) when no --corpus is given.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Compute device: cpu, cuda or cuda:N (cuda needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Working dtype of Q/K/V, exact attention and the methods (Skyformer's kernel and core, and the metric, use f64 regardless).
    #[arg(long, value_parser = ChoiceParser::<Dtype>::new(), default_value = "f32")]
    pub dtype: Dtype,
    /// Where a window's computed Q/K/V are kept, so that a rerun of the same model, layer, window
    /// and n skips the forward: a directory (any model), or `off`. Default: decoders only, in
    /// $APPROX_BENCH_QKV_CACHE, else $XDG_CACHE_HOME/approx-bench/qkv (~/.cache/...); at most
    /// $APPROX_BENCH_QKV_CACHE_MAX_GB (16) GB, least recently used first out. Results do not
    /// depend on it.
    #[arg(long)]
    pub qkv_cache: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub inputs: InputArgs,
    /// What the methods approximate and are scored against. Each method estimates one target;
    /// a method of the other is refused with the list of those that fit.
    #[arg(long, value_parser = ChoiceParser::<Target>::new(), default_value = "softmax")]
    pub target: Target,
    /// Which keys a query attends to: `causal` (j ≤ i) or `none` [default: causal for decoder
    /// models (llama, mistral, qwen2, qwen3), none for BERT]. Under causal, d counts keys per query,
    /// the default d grid is 16..2048 and the default lengths 2048, 8192 (docs/reference.md
    /// §7.2–7.3).
    #[arg(long, value_parser = ChoiceParser::<Mask>::new())]
    pub mask: Option<Mask>,
    /// Preset of a paper's Figure 1: sets --lengths, --methods and --features unless given.
    /// `skyformer`: n = 512..4096, skyformer/nystromformer/performer/informer; `skeinformer`: n = 1024, 4096,
    /// skeinformer/vmean/informer/linformer; both d = 8..256.
    #[arg(long, value_parser = ChoiceParser::<FigurePreset>::new())]
    pub figure: Option<FigurePreset>,
    /// Sequence lengths n, comma-separated [default: 512,1024,2048,4096].
    #[arg(long, value_delimiter = ',')]
    pub lengths: Option<Vec<String>>,
    /// Numbers of features d, comma-separated [default: 8,16,32,64,128,256].
    #[arg(long, value_delimiter = ',')]
    pub features: Option<Vec<String>>,
    /// Methods, comma-separated ids or presets: `all` (every method of --target with a budget d),
    /// `field` (every softmax-target method with a budget d), `quant` (the quantized family:
    /// KV caches, KIVI, SageAttention; run once per head, d = 0), `figure` (the methods of both
    /// Figure 1s), `kernelized` (every kernelized-target method) [default: figure, or kernelized
    /// with --target kernelized; all under --mask causal]. `--list-methods` lists them.
    #[arg(long, value_delimiter = ',')]
    pub methods: Option<Vec<String>>,
    /// Windows per length (consecutive, non-overlapping, from the start of the corpus).
    #[arg(long, default_value_t = 64)]
    pub windows: usize,
    /// Attention heads to measure, comma-separated (default: all heads of the layer).
    #[arg(long, value_delimiter = ',')]
    pub heads: Option<Vec<usize>>,
    /// Base seed of every trial's random stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory for trials.csv, summary.csv, manifest.json.
    #[arg(long, default_value = "results/latest")]
    pub out: PathBuf,
    /// Start over: discard the trials, summary and manifest already in --out (otherwise a run with the
    /// same configuration resumes, and one with another configuration is refused).
    #[arg(long)]
    pub force: bool,
    /// No progress bar and no end summary on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// List every method (id, family, masks, target, bits per K/V value, what d means) and exit.
    #[arg(long)]
    pub list_methods: bool,
    /// The decode protocol (docs/reference.md §9.1): each window is a prompt and a continuation of
    /// N_F tokens; the §9 methods compress the prompt's cache, and the error is that of the N_F
    /// continuation queries reading it. 256 is the recommended value. Decoders only; implies
    /// --mask causal; default methods `decode` (the §9 family; `quant` adds the §8 KV caches,
    /// `kvpress` kvpress's presses).
    #[arg(long, value_name = "N_F")]
    pub decode: Option<usize>,
    /// Run only shard K of N (1-based): a deterministic 1/N slice of the (n, window) units, whose rows are
    /// identical to the same rows of an unsharded run. Combine shards with `approx-bench merge`.
    #[arg(long)]
    pub shard: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct MergeArgs {
    /// Shard output directories (each from a run with the same configuration and a different --shard): a
    /// sweep's, or `e2e`'s (their rows joined, summary.csv and e2e.png recomputed over every window).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Directory for the merged trials.csv, summary.csv and manifest.json.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct ScoreArgs {
    /// Directory of `dump-qkv` outputs (<file>.safetensors with its <file>.safetensors.json).
    #[arg(long)]
    pub qkv: PathBuf,
    /// Directory of your outputs: <NAME>-n<N>-w<W>-d<D>.safetensors, each with one tensor
    /// `o_hat` [heads, n, p], for every dumped (n, window) and every d.
    #[arg(long)]
    pub approx: PathBuf,
    /// Your method's name (letters, digits, '_', '-', '.'; not a built-in id).
    #[arg(long)]
    pub name: String,
    /// What your Ô approximates: softmax attention, or the Gaussian-kernel product C·V.
    #[arg(long, value_parser = ChoiceParser::<Target>::new(), default_value = "softmax")]
    pub target: Target,
    /// Output directory of the run.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace a run already in --out.
    #[arg(long)]
    pub force: bool,
    /// The decode protocol (docs/reference.md §9.1): your files hold the continuation's N_F rows,
    /// `o_hat` [heads, N_F, p], scored against the exact causal rows n − N_F..n (decoder dumps).
    #[arg(long, value_name = "N_F")]
    pub decode: Option<usize>,
}

#[derive(Debug, Clone, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub inputs: InputArgs,
    /// Window length n.
    #[arg(long)]
    pub length: usize,
    /// Window index (0-based).
    #[arg(long, default_value_t = 0)]
    pub window: usize,
    /// Output safetensors file.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// A run directory (with summary.csv and manifest.json) or a summary.csv file; repeat to combine runs.
    #[arg(long, required = true)]
    pub from: Vec<PathBuf>,
    /// Where the PNGs go (default: the first --from directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// What the points show: `mean` ± 1 standard error (the papers' figures), or the `median` of
    /// the trials without bars (files get a `-median` suffix), for methods with a few wild trials.
    #[arg(long, value_parser = ChoiceParser::<Statistic>::new(), default_value_t = Statistic::Mean)]
    pub statistic: Statistic,
}

#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("against").required(true).args(["current", "rerun"])))]
pub struct CheckArgs {
    /// Baseline: a run directory (summary.csv, trials.csv, manifest.json) or a summary.csv file.
    #[arg(long)]
    pub baseline: PathBuf,
    /// Run to check: a run directory or a summary.csv file (a file alone allows only the unpaired test and no configuration check).
    #[arg(long)]
    pub current: Option<PathBuf>,
    /// Re-run the baseline's own configuration (from its manifest.json) and check that run.
    #[arg(long)]
    pub rerun: bool,
    /// Output directory of --rerun (default: a new directory under the system temp dir).
    #[arg(long, requires = "rerun")]
    pub out: Option<PathBuf>,
    /// Family-wise false-positive rate over all compared points (Bonferroni-corrected).
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Relative slack: a regression must exceed the noise bound plus this fraction of the baseline mean.
    #[arg(long, default_value_t = 0.01)]
    pub slack: f64,
    /// Fail on improvements beyond the bound too (each direction then gets alpha/2).
    #[arg(long)]
    pub two_sided: bool,
    /// Report configuration changes without failing on them (not with --exact, which needs the same configuration).
    #[arg(long)]
    pub allow_config_change: bool,
    /// Demand trial-level equality of the error within 1e-12 relative (reproducibility check).
    #[arg(long)]
    pub exact: bool,
    /// Markdown report (default: check.md in --rerun's output directory, else in the working directory;
    /// never in --baseline or --current).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

impl InputArgs {
    /// The `--qkv-cache` setting.
    pub fn qkv_cache(&self) -> approx_bench::inputs::qkv_cache::CacheSetting {
        self.qkv_cache
            .as_deref()
            .map(approx_bench::inputs::qkv_cache::CacheSetting::parse)
            .unwrap_or_default()
    }

    /// The library's input options (validated by `InputConfig::new`).
    pub fn options(&self) -> InputOptions {
        InputOptions {
            model: self.model,
            model_id: self.model_id.clone(),
            revision: self.revision.clone(),
            model_dir: self.model_dir.clone(),
            model_seed: self.model_seed,
            init: self.init,
            embedding_dropout: self.embedding_dropout,
            embeddings_from: self.embeddings_from,
            embedding: self.embedding,
            layer: self.layer.unwrap_or(0),
            corpus: self.corpus.clone(),
            split: self.split.clone(),
            device: self.device.clone(),
            dtype: self.dtype,
        }
    }
}

impl SweepArgs {
    /// Where and how the sweep writes: `--out`, `--force`, `--quiet`, the cache and the shard.
    pub fn sweep_options(
        &self,
        command: Vec<String>,
    ) -> anyhow::Result<approx_bench::sweep::SweepOptions> {
        Ok(approx_bench::sweep::SweepOptions {
            out: self.out.clone(),
            force: self.force,
            quiet: self.quiet,
            command,
            qkv_cache: self.inputs.qkv_cache(),
            shard: self
                .shard
                .as_deref()
                .map(approx_bench::config::Shard::parse)
                .transpose()?,
        })
    }

    /// The library's sweep options (validated by `RunConfig::new`).
    pub fn options(&self) -> RunOptions {
        RunOptions {
            inputs: self.inputs.options(),
            target: self.target,
            mask: self.mask,
            figure: self.figure,
            lengths: self.lengths.clone(),
            features: self.features.clone(),
            methods: self.methods.clone(),
            windows: self.windows,
            heads: self.heads.clone(),
            seed: self.seed,
            user_methods: Default::default(),
            decode: self.decode,
        }
    }
}

impl ScoreArgs {
    /// The score request of these flags, for `command` (recorded in the manifest).
    pub fn request(self, command: Vec<String>) -> approx_bench::score::ScoreRequest {
        approx_bench::score::ScoreRequest {
            qkv: self.qkv,
            approx: self.approx,
            name: self.name,
            target: self.target,
            out: self.out,
            force: self.force,
            command,
            decode: self.decode,
        }
    }
}

impl CheckArgs {
    /// The library's check request; `command` is the command line, for a re-run's manifest.
    pub fn request(&self, command: Vec<String>) -> anyhow::Result<CheckRequest> {
        let against = match (&self.current, self.rerun) {
            (Some(path), false) => Against::Current(path.clone()),
            (None, true) => Against::Rerun {
                out: self.out.clone(),
            },
            _ => {
                return Err(approx_bench::usage!(
                    "give either --current DIR_OR_SUMMARY or --rerun"
                ))
            }
        };
        Ok(CheckRequest {
            baseline: self.baseline.clone(),
            against,
            report: self.report.clone(),
            options: CheckOptions {
                alpha: self.alpha,
                slack: self.slack,
                two_sided: self.two_sided,
                allow_config_change: self.allow_config_change,
                exact: self.exact,
            },
            command,
        })
    }
}

/// Clap's value parser for a library [`Choice`]: the values and their help as possible values,
/// and clap's own error for any other, as `#[derive(ValueEnum)]` would give. The library's enums
/// carry their names and help themselves, so no enum is declared twice.
#[derive(Clone)]
pub struct ChoiceParser<T>(std::marker::PhantomData<T>);

impl<T: Choice> ChoiceParser<T> {
    pub fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T: Choice> TypedValueParser for ChoiceParser<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        // A value that is not UTF-8 is refused as an invalid value (not as invalid UTF-8), like clap's
        // enum parser does.
        let value = value.to_string_lossy();
        let all = self.possible_values().into_iter().flatten();
        let name = PossibleValuesParser::new(all).parse_ref(cmd, arg, OsStr::new(&*value))?;
        Ok(T::from_name(&name).expect("a possible value names a choice"))
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(T::ALL.iter().map(|v| {
            let value = PossibleValue::new(v.name());
            match v.help() {
                "" => value,
                help => value.help(help),
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The library's defaults (what the Python package uses) are the CLI's.
    #[test]
    fn the_flags_defaults_are_the_librarys() {
        let cli = Cli::try_parse_from(["approx-bench"]).unwrap();
        assert_eq!(cli.sweep.inputs.options(), InputOptions::default());
        assert_eq!(cli.sweep.options(), RunOptions::default());
    }
}
