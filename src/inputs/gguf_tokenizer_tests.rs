//! The GGUF tokenizer on vocabularies written byte by byte: SentencePiece's merge order in closed
//! form, byte fallback, the BOS policy, and the refusals. llama.cpp's own ids on real vocabularies
//! are in tests/gguf_tokenizer.rs.

use super::*;
use crate::models::gguf_table::tests::gguf;

fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

/// An array of type `ty` (GGUF's value codes) from already-encoded elements.
fn array(ty: u32, items: Vec<Vec<u8>>) -> Vec<u8> {
    let mut b = ty.to_le_bytes().to_vec();
    b.extend((items.len() as u64).to_le_bytes());
    items.into_iter().for_each(|i| b.extend(i));
    b
}

/// A SentencePiece vocabulary: (token, score, type); 256 byte tokens follow.
fn spm(
    tokens: &[(&str, f32, i32)],
    extra: Vec<(&'static str, u32, Vec<u8>)>,
) -> tempfile::NamedTempFile {
    let mut all: Vec<(String, f32, i32)> = tokens
        .iter()
        .map(|(t, s, y)| (t.to_string(), *s, *y))
        .collect();
    all.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
    let mut meta = vec![
        ("general.architecture", 8, string("llama")),
        ("tokenizer.ggml.model", 8, string("llama")),
        (
            "tokenizer.ggml.tokens",
            9,
            array(8, all.iter().map(|t| string(&t.0)).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            9,
            array(6, all.iter().map(|t| t.1.to_le_bytes().to_vec()).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            9,
            array(5, all.iter().map(|t| t.2.to_le_bytes().to_vec()).collect()),
        ),
        (
            "tokenizer.ggml.bos_token_id",
            4,
            1u32.to_le_bytes().to_vec(),
        ),
        (
            "tokenizer.ggml.unknown_token_id",
            4,
            0u32.to_le_bytes().to_vec(),
        ),
    ];
    meta.extend(extra);
    let f = tempfile::Builder::new().suffix(".gguf").tempfile().unwrap();
    std::fs::write(f.path(), gguf(&meta, &[])).unwrap();
    f
}

const VOCAB: &[(&str, f32, i32)] = &[
    ("<unk>", 0.0, 2),
    ("<s>", 0.0, 3),
    ("</s>", 0.0, 3),
    ("a", -10.0, 1),
    ("b", -11.0, 1),
    ("▁", -12.0, 1),
    ("ab", -1.0, 1),
    ("▁a", -2.0, 1),
    ("▁ab", -3.0, 1),
    ("ba", -0.5, 1),
];

fn ids(t: &GgufTokenizer, text: &str) -> Vec<u32> {
    t.tokenizer.encode(text, false).unwrap().get_ids().to_vec()
}

/// "ab ab" → a b ▁ a b: "ab" (−1) merges at 0 and then at 3 (leftmost first), then "▁ab" (−3):
/// [ab, ▁ab]. "aba": "ba" (−0.5) outranks "ab" (−1): [a, ba]. "c" is no token: its byte.
#[test]
fn sentencepiece_merges_by_score_leftmost_first() {
    let f = spm(VOCAB, vec![("tokenizer.ggml.add_space_prefix", 7, vec![0])]);
    let t = load(f.path()).unwrap();
    assert_eq!(ids(&t, "ab ab"), vec![6, 8]);
    assert_eq!(ids(&t, "aba"), vec![3, 9]);
    let c = VOCAB.len() as u32 + u32::from(b'c');
    assert_eq!(ids(&t, "c"), vec![c]);
    // The control token in the text is split out before the model (parse_special).
    assert_eq!(ids(&t, "ab<s>ab"), vec![6, 1, 6]);
    // SentencePiece adds a BOS by default (no add_bos_token key).
    assert_eq!(t.bos, Some(1));
}

#[test]
fn add_space_prefix_and_add_bos_are_read() {
    let f = spm(
        VOCAB,
        vec![
            ("tokenizer.ggml.add_space_prefix", 7, vec![1]),
            ("tokenizer.ggml.add_bos_token", 7, vec![0]),
        ],
    );
    let t = load(f.path()).unwrap();
    assert_eq!(ids(&t, "ab"), vec![8], "▁ prefixed: ▁ab");
    assert_eq!(t.bos, None);
}

fn refusal(extra: Vec<(&'static str, u32, Vec<u8>)>, vocab: &[(&str, f32, i32)]) -> String {
    let f = spm(vocab, extra);
    match load(f.path()) {
        Ok(_) => panic!("accepted"),
        Err(e) => {
            assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
            e.to_string()
        }
    }
}

#[test]
fn other_tokenizer_types_and_bad_vocabularies_are_refused_by_name() {
    let mut meta = vec![("tokenizer.ggml.model", 8, string("bert"))];
    // A second key of the same name replaces the first in candle's map.
    let e = refusal(std::mem::take(&mut meta), VOCAB);
    assert!(e.contains("'bert'") && e.contains("tokenizer.json"), "{e}");
    let e = refusal(
        vec![(
            "tokenizer.ggml.bos_token_id",
            4,
            100000u32.to_le_bytes().to_vec(),
        )],
        VOCAB,
    );
    assert!(
        e.contains("bos_token_id") && e.contains("outside the vocabulary"),
        "{e}"
    );
    let twice = [VOCAB, &[("ab", -4.0, 1)]].concat();
    let e = refusal(vec![], &twice);
    assert!(e.contains("\"ab\" appears twice"), "{e}");
    let nan = [VOCAB, &[("abc", f32::NAN, 1)]].concat();
    let e = refusal(vec![], &nan);
    assert!(e.contains("tokenizer.ggml.scores[10]"), "{e}");
    let e = refusal(
        vec![
            ("tokenizer.ggml.model", 8, string("gpt2")),
            ("tokenizer.ggml.pre", 8, string("tekken")),
        ],
        VOCAB,
    );
    assert!(e.contains("'tekken'") && e.contains("smollm"), "{e}");
}
