//! The tokenizer a GGUF carries in its `tokenizer.ggml.*` metadata (docs/reference.md §7.1 "Tokens"),
//! built on the `tokenizers` crate so that the corpus stream is cut exactly as from a tokenizer.json.
//! A user with only the .gguf (what the hub's GGUF repos and llama.cpp users have) gets the ids
//! llama.cpp gives: `tests/reference/gguf_tokenize.py` writes llama.cpp's ids of every Wikitext-2
//! test window and of hand-made edge cases, and the tests compare them token for token.
//!
//! - `llama` (SentencePiece BPE with scores and byte fallback: Gemma, Llama 2, Mistral). llama.cpp
//!   merges the adjacent pair whose concatenation is the highest-scoring token, leftmost first, and
//!   spells a symbol that is no token in its UTF-8 bytes (`<0xXX>`). The same algorithm is a BPE
//!   whose merges are every split (l, r) of a token into two tokens, ranked by the token's score
//!   (transformers' GGUF conversion builds the same list). Spaces become `▁`, and a `▁` is put in
//!   front of each text piece when `add_space_prefix` says so (llama.cpp's default for this type).
//! - `gpt2` (byte-level BPE with `tokenizer.ggml.merges`): the pre-tokenizer is llama.cpp's regex list
//!   for the `tokenizer.ggml.pre` name, each regex splitting the pieces of the one before (matches
//!   and the text between them both kept), then GPT-2's byte-to-character map. Llama 3's names also
//!   take a whole piece that is a token before merging (llama.cpp's `ignore_merges`).
//!
//! Control, user-defined and unknown tokens are split out of the text before either model, longest
//! first, as llama.cpp does when it parses special tokens (and as a tokenizer.json's added tokens
//! are). Other types and `pre` names are refused by name.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use candle_core::quantized::gguf_file::Value;
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as Normalizers};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizers;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::models::GgufFile;
use crate::usage;

/// llama.cpp's token types (`llama_token_type`).
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// GPT-2's regex as llama.cpp writes it (no trailing `\s+`: the text between matches is kept).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's regex, in llama.cpp's case-expanded form of `(?i:'s|…)`.
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` names read, with llama.cpp's regex list and `ignore_merges` for each
/// (src/llama-vocab.cpp). Names llama.cpp maps to other lists are refused rather than guessed.
const PRE_TOKENIZERS: &[(&[&str], &[&str], bool)] = &[
    (&["gpt-2", "phi-2", "mpt", "olmo"], &[GPT2_REGEX], false),
    (
        &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva",
        ],
        &[r"\p{N}", GPT2_REGEX],
        false,
    ),
    (
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"],
        &[LLAMA3_REGEX],
        true,
    ),
    (&["dbrx", "smaug-bpe"], &[LLAMA3_REGEX], false),
    (
        &["qwen2", "deepseek-r1-qwen", "stablelm2"],
        &[QWEN2_REGEX],
        false,
    ),
];

/// A GGUF's tokenizer, with the BOS policy of docs/reference.md §7.1 read from the same metadata.
pub struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    /// The BOS id when the tokenizer adds one by default (`add_bos_token`, else llama.cpp's
    /// default for the type), else None.
    pub bos: Option<u32>,
    /// What the stderr note and errors call it: "the GGUF's own tokenizer (llama, SentencePiece)".
    pub describe: String,
}

/// The metadata the tokenizer is built from.
struct GgufVocab<'a> {
    file: &'a GgufFile,
    tokens: Vec<String>,
    types: Vec<i64>,
}

/// Reads and builds the tokenizer of the GGUF at `path`.
pub fn load(path: &Path) -> Result<GgufTokenizer> {
    let file = GgufFile::open(path)?;
    from_file(&file)
}

/// The tokenizer of an open GGUF.
pub fn from_file(file: &GgufFile) -> Result<GgufTokenizer> {
    let model = string(file, "tokenizer.ggml.model")?.ok_or_else(|| {
        usage!(
            "GGUF {}: no tokenizer.ggml.model in its metadata, so it carries no tokenizer; put the model's \
             tokenizer.json beside it",
            file.path()
        )
    })?;
    let tokens = strings(file, "tokenizer.ggml.tokens")?.ok_or_else(|| {
        usage!(
            "GGUF {}: tokenizer.ggml.tokens is missing; put the model's tokenizer.json beside it",
            file.path()
        )
    })?;
    if tokens.is_empty() {
        return Err(usage!(
            "GGUF {}: tokenizer.ggml.tokens is empty",
            file.path()
        ));
    }
    let types = match integers(file, "tokenizer.ggml.token_type")? {
        Some(t) if t.len() != tokens.len() => {
            return Err(usage!(
            "GGUF {}: tokenizer.ggml.token_type has {} entries for {} tokens; the file is corrupt",
            file.path(),
            t.len(),
            tokens.len()
        ))
        }
        Some(t) => t,
        None => vec![1; tokens.len()],
    };
    let vocab = GgufVocab {
        file,
        tokens,
        types,
    };
    let (mut tokenizer, default_bos, describe) = match model.as_str() {
        "llama" => (
            vocab.sentencepiece()?,
            true,
            "the GGUF's own tokenizer (llama: SentencePiece BPE)".to_string(),
        ),
        "gpt2" => {
            let pre = string(file, "tokenizer.ggml.pre")?.unwrap_or_else(|| "default".into());
            let (tokenizer, llama3) = vocab.byte_level(&pre)?;
            (
                tokenizer,
                llama3,
                format!("the GGUF's own tokenizer (gpt2: byte-level BPE, pre-tokenizer {pre})"),
            )
        }
        other => {
            return Err(usage!(
                "GGUF {}: tokenizer.ggml.model is '{other}'; the GGUF's own tokenizer is built for 'llama' \
                 (SentencePiece) and 'gpt2' (byte-level BPE) only: put the model's tokenizer.json beside it",
                file.path()
            ))
        }
    };
    vocab.add_special_tokens(&mut tokenizer)?;
    let add_bos = boolean(file, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_bos);
    let bos = vocab.added_token("bos", add_bos)?;
    // add_eos_token is honoured where special tokens are added (the post-processor); the corpus
    // stream is tokenized without them and a window holds no EOS (§7.1), as on the tokenizer.json route.
    let add_eos = boolean(file, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let eos = vocab.added_token("eos", add_eos)?;
    vocab.post_processor(&mut tokenizer, bos, eos)?;
    Ok(GgufTokenizer {
        tokenizer,
        bos,
        describe,
    })
}

impl GgufVocab<'_> {
    fn path(&self) -> &str {
        self.file.path()
    }

    /// token → id; a text held twice keeps its first id (llama.cpp's `text_to_token` map keeps the last:
    /// both are refused instead, since the two would tokenize differently).
    fn ids(&self) -> Result<HashMap<String, u32>> {
        let mut ids = HashMap::with_capacity(self.tokens.len());
        for (i, t) in self.tokens.iter().enumerate() {
            if ids.insert(t.clone(), i as u32).is_some() {
                return Err(usage!(
                    "GGUF {}: token {t:?} appears twice in tokenizer.ggml.tokens; the vocabulary is corrupt",
                    self.path()
                ));
            }
        }
        Ok(ids)
    }

    /// `tokenizer.ggml.{name}_token_id`, checked against the vocabulary.
    fn special_id(&self, name: &str) -> Result<Option<u32>> {
        let key = format!("tokenizer.ggml.{name}_token_id");
        match self.file.meta_usize(&key)? {
            Some(id) if id >= self.tokens.len() => Err(usage!(
                "GGUF {}: {key} is {id}, outside the vocabulary of {}; the file is corrupt",
                self.path(),
                self.tokens.len()
            )),
            other => Ok(other.map(|id| id as u32)),
        }
    }

    /// The `name` token's id when the tokenizer adds it (`added`), else None; a file that adds a
    /// token it does not name is corrupt.
    fn added_token(&self, name: &str, added: bool) -> Result<Option<u32>> {
        match (added, self.special_id(name)?) {
            (false, _) => Ok(None),
            (true, Some(id)) => Ok(Some(id)),
            (true, None) => Err(usage!(
                "GGUF {}: the tokenizer adds its {} token but tokenizer.ggml.{name}_token_id is missing; the file is corrupt",
                self.path(),
                name.to_uppercase()
            )),
        }
    }

    /// SentencePiece BPE: merges from the scores, byte fallback, `▁` for spaces.
    fn sentencepiece(&self) -> Result<Tokenizer> {
        let scores = floats(self.file, "tokenizer.ggml.scores")?.ok_or_else(|| {
            usage!(
                "GGUF {}: tokenizer.ggml.scores is missing, which a 'llama' (SentencePiece) tokenizer needs",
                self.path()
            )
        })?;
        if scores.len() != self.tokens.len() {
            return Err(usage!(
                "GGUF {}: tokenizer.ggml.scores has {} entries for {} tokens; the file is corrupt",
                self.path(),
                scores.len(),
                self.tokens.len()
            ));
        }
        if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
            return Err(usage!(
                "GGUF {}: tokenizer.ggml.scores[{i}] is {}; the file is corrupt",
                self.path(),
                scores[i]
            ));
        }
        let ids = self.ids()?;
        let merges = score_merges(&self.tokens, &scores, &ids);
        let unk = self
            .special_id("unknown")?
            .map(|id| self.tokens[id as usize].clone());
        let mut bpe = BPE::builder()
            .vocab_and_merges(ids.into_iter().collect::<BpeVocab>(), merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(u) = unk {
            bpe = bpe.unk_token(u);
        }
        let bpe = bpe.build().map_err(|e| {
            usage!(
                "GGUF {}: its SentencePiece vocabulary cannot be built ({e})",
                self.path()
            )
        })?;
        let mut tokenizer = Tokenizer::new(bpe);
        let space_prefix = boolean(self.file, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
        let replace = Replace::new(" ", "▁")
            .map_err(|e| anyhow::anyhow!("the SentencePiece space normalizer: {e}"))?;
        let mut steps: Vec<NormalizerWrapper> = Vec::new();
        if space_prefix {
            // llama.cpp prefixes a space, then escapes every space: the same as a `▁` in front.
            steps.push(Prepend::new("▁".into()).into());
        }
        steps.push(replace.into());
        tokenizer
            .with_normalizer(Some(Normalizers::new(steps)))
            .map_err(|e| anyhow::anyhow!("the SentencePiece normalizer: {e}"))?;
        Ok(tokenizer)
    }

    /// Byte-level BPE with the merges the file stores and llama.cpp's pre-tokenizer for `pre`.
    /// Returns the tokenizer and whether `pre` is one of Llama 3's names (whose BOS llama.cpp adds
    /// by default).
    fn byte_level(&self, pre: &str) -> Result<(Tokenizer, bool)> {
        let Some((names, regexes, ignore_merges)) = PRE_TOKENIZERS
            .iter()
            .find(|(names, ..)| names.contains(&pre))
        else {
            let known: Vec<&str> = PRE_TOKENIZERS
                .iter()
                .flat_map(|(n, ..)| n.iter().copied())
                .collect();
            return Err(usage!(
                "GGUF {}: tokenizer.ggml.pre is '{pre}', a pre-tokenizer not built here (known: {}); put the \
                 model's tokenizer.json beside it",
                self.path(),
                known.join(", ")
            ));
        };
        let merges = strings(self.file, "tokenizer.ggml.merges")?.ok_or_else(|| {
            usage!(
                "GGUF {}: tokenizer.ggml.merges is missing, which a 'gpt2' (byte-level BPE) tokenizer needs",
                self.path()
            )
        })?;
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                // llama.cpp splits at the first space after the first byte (a piece may be a space).
                m.as_bytes()
                    .iter()
                    .skip(1)
                    .position(|&b| b == b' ')
                    .map(|p| (m[..p + 1].to_string(), m[p + 2..].to_string()))
                    .ok_or_else(|| {
                        usage!(
                            "GGUF {}: tokenizer.ggml.merges[{i}] is {m:?}, not two pieces separated by a space",
                            self.path()
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(self.ids()?.into_iter().collect::<BpeVocab>(), merges)
            .ignore_merges(*ignore_merges)
            .build()
            .map_err(|e| {
                usage!(
                    "GGUF {}: its byte-level BPE cannot be built ({e}); a merge names a piece that is no token",
                    self.path()
                )
            })?;
        let mut tokenizer = Tokenizer::new(bpe);
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        for regex in regexes.iter() {
            let split = Split::new(
                tokenizers::pre_tokenizers::split::SplitPattern::Regex((*regex).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| anyhow::anyhow!("pre-tokenizer regex {regex}: {e}"))?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        tokenizer.with_pre_tokenizer(Some(PreTokenizers::new(steps)));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        let llama3 = names.contains(&"llama-bpe");
        Ok((tokenizer, llama3))
    }

    /// Control, user-defined and unknown tokens, split out of the text before the model runs
    /// (matched on the raw text: llama.cpp partitions before escaping spaces or mapping bytes).
    fn add_special_tokens(&self, tokenizer: &mut Tokenizer) -> Result<()> {
        let special: Vec<AddedToken> = self
            .tokens
            .iter()
            .zip(&self.types)
            .filter(|(t, ty)| {
                !t.is_empty() && matches!(**ty, TYPE_CONTROL | TYPE_USER_DEFINED | TYPE_UNKNOWN)
            })
            .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
            .collect();
        tokenizer
            .add_special_tokens(special)
            .map_err(|e| anyhow::anyhow!("the special tokens: {e}"))?;
        Ok(())
    }

    /// The post-processor that adds BOS / EOS where special tokens are asked for.
    fn post_processor(
        &self,
        tokenizer: &mut Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Result<()> {
        if bos.is_none() && eos.is_none() {
            return Ok(());
        }
        let name = |id: u32| self.tokens[id as usize].clone();
        let mut single = Vec::new();
        let mut specials = Vec::new();
        if let Some(b) = bos {
            single.push(name(b));
            specials.push((name(b), b));
        }
        single.push("$A".to_string());
        if let Some(e) = eos {
            single.push(name(e));
            if Some(e) != bos {
                specials.push((name(e), e));
            }
        }
        let template = TemplateProcessing::builder()
            .try_single(single.join(" "))
            .map_err(|e| anyhow::anyhow!("the BOS/EOS template: {e}"))?
            .special_tokens(specials)
            .build()
            .map_err(|e| anyhow::anyhow!("the BOS/EOS template: {e}"))?;
        tokenizer.with_post_processor(Some(template));
        Ok(())
    }
}

/// SentencePiece's merges as a BPE list: every split of a token into two tokens, ranked by the
/// merged token's score, highest first (ties: the lower token id, then the lower left-piece id).
/// Scores are unique for the normal tokens of the vocabularies checked (Gemma 3: −id), so the
/// ranking is llama.cpp's "highest-scoring bigram first".
fn score_merges(
    tokens: &[String],
    scores: &[f32],
    ids: &HashMap<String, u32>,
) -> Vec<(String, String)> {
    let mut merges: Vec<(f32, u32, u32, usize)> = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        for (split, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(split);
            if let (Some(&li), Some(_)) = (ids.get(l), ids.get(r)) {
                merges.push((scores[id], id as u32, li, split));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges
        .into_iter()
        .map(|(_, id, _, split)| {
            let (l, r) = tokens[id as usize].split_at(split);
            (l.to_string(), r.to_string())
        })
        .collect()
}

fn string(file: &GgufFile, key: &str) -> Result<Option<String>> {
    match file.meta(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(usage!(
            "GGUF {}: metadata {key} is not a string",
            file.path()
        )),
    }
}

fn boolean(file: &GgufFile, key: &str) -> Result<Option<bool>> {
    match file.meta(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(usage!(
            "GGUF {}: metadata {key} is not a boolean",
            file.path()
        )),
    }
}

fn array<'a>(file: &'a GgufFile, key: &str) -> Result<Option<&'a [Value]>> {
    match file.meta(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a.as_slice())),
        Some(_) => Err(usage!(
            "GGUF {}: metadata {key} is not an array",
            file.path()
        )),
    }
}

/// The elements of array `key`, each read by `read` (None: not of the kind `kind`).
fn elements<T>(
    file: &GgufFile,
    key: &str,
    kind: &str,
    read: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Vec<T>>> {
    let Some(a) = array(file, key)? else {
        return Ok(None);
    };
    a.iter()
        .enumerate()
        .map(|(i, v)| {
            read(v).ok_or_else(|| usage!("GGUF {}: metadata {key}[{i}] is not {kind}", file.path()))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn strings(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    elements(file, key, "a string", |v| match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    })
}

fn integers(file: &GgufFile, key: &str) -> Result<Option<Vec<i64>>> {
    elements(file, key, "an integer", |v| match v {
        Value::I32(x) => Some(i64::from(*x)),
        Value::U32(x) => Some(i64::from(*x)),
        Value::I8(x) => Some(i64::from(*x)),
        Value::U8(x) => Some(i64::from(*x)),
        Value::I16(x) => Some(i64::from(*x)),
        Value::U16(x) => Some(i64::from(*x)),
        Value::I64(x) => Some(*x),
        _ => None,
    })
}

fn floats(file: &GgufFile, key: &str) -> Result<Option<Vec<f32>>> {
    elements(file, key, "a float", |v| match v {
        Value::F32(x) => Some(*x),
        Value::F64(x) => Some(*x as f32),
        _ => None,
    })
}

#[cfg(test)]
#[path = "gguf_tokenizer_tests.rs"]
mod tests;
