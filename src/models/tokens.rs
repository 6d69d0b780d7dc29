//! Decoder token windows (docs/reference.md §7.1 "Tokens"): whether the tokenizer adds a BOS by default,
//! and window w of length n cut from the corpus token stream with that BOS at position 0.

use std::path::Path;

use anyhow::Result;
use serde_json::Value;

use crate::usage;

/// The BOS id exactly when the tokenizer adds one by default, else None.
///
/// `add_bos_token` in `tokenizer_config.json`, when it says true or false, decides (transformers
/// rebuilds the post-processor from it: Llama 2's and SmolLM2's configs carry it); without it the
/// tokenizer's own post-processor decides, found by encoding a short text with and without special
/// tokens (so a TemplateProcessing, a Sequence holding one, or any other processor is read as the
/// tokenizers library applies it). Llama adds `<s>` / `<|begin_of_text|>`; Qwen and SmolLM2 add none.
pub fn bos_token(
    tokenizer_json: &Path,
    tokenizer_config_json: Option<&Path>,
) -> Result<Option<u32>> {
    let tok = tokenizers::Tokenizer::from_file(tokenizer_json).map_err(|e| {
        usage!(
            "tokenizer {}: cannot read it ({e})",
            tokenizer_json.display()
        )
    })?;
    let config: Option<Value> = match tokenizer_config_json {
        Some(p) if p.is_file() => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| usage!("tokenizer config {}: cannot read it ({e})", p.display()))?;
            Some(
                serde_json::from_str(&text).map_err(|e| {
                    usage!("tokenizer config {}: not valid JSON ({e})", p.display())
                })?,
            )
        }
        _ => None,
    };
    let encode = |special: bool| -> Result<Vec<u32>> {
        Ok(tok
            .encode("a", special)
            .map_err(|e| {
                usage!(
                    "tokenizer {}: cannot encode text ({e})",
                    tokenizer_json.display()
                )
            })?
            .get_ids()
            .to_vec())
    };
    let plain = encode(false)?;
    let with = encode(true)?;
    // The post-processor adds a BOS when the special-token encoding is the plain one with one
    // more token in front (and perhaps an EOS behind).
    let template_bos = (with.len() > plain.len() && with[1..].starts_with(&plain)).then(|| with[0]);
    let add_bos = config
        .as_ref()
        .and_then(|c| c.get("add_bos_token"))
        .and_then(Value::as_bool);
    match add_bos {
        Some(false) => Ok(None),
        None => Ok(template_bos),
        Some(true) => {
            if let Some(id) = template_bos {
                return Ok(Some(id));
            }
            // The config asks for a BOS the post-processor does not add: its `bos_token`.
            let cfg = config.as_ref().expect("add_bos_token came from the config");
            let content = match cfg.get("bos_token") {
                Some(Value::String(s)) => Some(s.as_str()),
                Some(Value::Object(o)) => o.get("content").and_then(Value::as_str),
                _ => None,
            };
            content
                .and_then(|c| tok.token_to_id(c))
                .map(Some)
                .ok_or_else(|| {
                    usage!(
                        "tokenizer config {}: add_bos_token is true but its bos_token {:?} is not a token of {}",
                        tokenizer_config_json.expect("config read").display(),
                        content,
                        tokenizer_json.display()
                    )
                })
        }
    }
}

/// Window `w` of length `n` (docs/reference.md §7.1 "Tokens"): with a BOS, [BOS] +
/// stream[w(n−1) .. (w+1)(n−1)]; without, stream[wn .. (w+1)n]. None when the stream is too short
/// (or n is 0, or n is 1 with a BOS, which would hold no corpus token).
pub fn decoder_window(stream: &[u32], n: usize, w: usize, bos: Option<u32>) -> Option<Vec<u32>> {
    if w >= windows_available(stream.len(), n, bos) {
        return None;
    }
    Some(match bos {
        Some(b) => {
            let m = n - 1;
            std::iter::once(b)
                .chain(stream[w * m..(w + 1) * m].iter().copied())
                .collect()
        }
        None => stream[w * n..(w + 1) * n].to_vec(),
    })
}

/// How many windows of length `n` the stream gives under the BOS policy.
pub fn windows_available(stream_len: usize, n: usize, bos: Option<u32>) -> usize {
    let per_window = if bos.is_some() {
        n.saturating_sub(1)
    } else {
        n
    };
    stream_len.checked_div(per_window).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/decoders/tokenizers")
            .join(rel)
    }

    #[test]
    fn windows_with_and_without_bos() {
        let stream: Vec<u32> = (10..20).collect();
        assert_eq!(
            decoder_window(&stream, 4, 0, None),
            Some(vec![10, 11, 12, 13])
        );
        assert_eq!(
            decoder_window(&stream, 4, 1, None),
            Some(vec![14, 15, 16, 17])
        );
        assert_eq!(decoder_window(&stream, 4, 2, None), None);
        assert_eq!(windows_available(10, 4, None), 2);
        assert_eq!(
            decoder_window(&stream, 4, 0, Some(1)),
            Some(vec![1, 10, 11, 12])
        );
        assert_eq!(
            decoder_window(&stream, 4, 2, Some(1)),
            Some(vec![1, 16, 17, 18])
        );
        assert_eq!(decoder_window(&stream, 4, 3, Some(1)), None);
        assert_eq!(windows_available(10, 4, Some(1)), 3);
        assert_eq!(windows_available(10, 1, Some(1)), 0);
        assert_eq!(decoder_window(&stream, 0, 0, None), None);
    }

    #[test]
    fn bos_policy_from_the_post_processor_and_the_config() {
        let with = fixture("with_bos/tokenizer.json");
        let without = fixture("without_bos/tokenizer.json");
        assert_eq!(bos_token(&with, None).unwrap(), Some(1));
        assert_eq!(bos_token(&without, None).unwrap(), None);
        // add_bos_token in tokenizer_config.json decides when present.
        let dir = tempfile::tempdir().unwrap();
        let off = dir.path().join("off.json");
        std::fs::write(&off, r#"{"add_bos_token": false}"#).unwrap();
        assert_eq!(bos_token(&with, Some(&off)).unwrap(), None);
        let on = dir.path().join("on.json");
        std::fs::write(
            &on,
            r#"{"add_bos_token": true, "bos_token": {"content": "<s>"}}"#,
        )
        .unwrap();
        assert_eq!(bos_token(&without, Some(&on)).unwrap(), Some(1));
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"add_bos_token": true, "bos_token": "<nope>"}"#).unwrap();
        let e = bos_token(&without, Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("<nope>"), "{e}");
        // A missing config file is no config.
        let absent = dir.path().join("absent.json");
        assert_eq!(bos_token(&with, Some(&absent)).unwrap(), Some(1));
    }
}
