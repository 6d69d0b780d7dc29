//! The text corpus as token windows: Wikitext-2 rows (raw text file or hub parquet) → the
//! model's tokens (WordPiece or BPE; no special tokens, truncation and padding off) → consecutive
//! non-overlapping n-token windows (docs/reference.md §1.4 item 3), led by BOS for a decoder whose
//! tokenizer adds one (§7.1).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tokenizers::Tokenizer;

use crate::usage;

/// A tokenized corpus: the whole of it, or the prefix a run needs.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub path: PathBuf,
    pub ids: Vec<u32>,
    /// The token a decoder's tokenizer puts first (docs/reference.md §7.1): each window then starts with
    /// it and holds n − 1 stream tokens. None for BERT and tokenizers that add none.
    pub bos: Option<u32>,
    /// Whether `ids` is the whole corpus (false: a prefix of it, see [`tokenize_prefix`]).
    pub complete: bool,
}

/// Rows of the dataset as HF `datasets` gives them: CRLF → LF, whitespace-only lines empty.
/// Empty rows produce no tokens, so they are dropped here.
pub fn text_rows(path: &Path) -> Result<Vec<String>> {
    let bytes = std::fs::read(path).map_err(|e| {
        usage!(
            "corpus {}: cannot read it ({e}); pass an existing text file with --corpus",
            path.display()
        )
    })?;
    if path.extension().is_some_and(|e| e == "parquet") || bytes.starts_with(b"PAR1") {
        return parquet_rows(path);
    }
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(usage!(
            "corpus {}: the file is empty; pass a text file such as wiki.test.raw with --corpus",
            path.display()
        ));
    }
    if bytes.contains(&0) {
        return Err(usage!("corpus {}: the file is binary (it contains NUL bytes), not text; pass a UTF-8 text file with --corpus", path.display()));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        usage!(
            "corpus {}: not valid UTF-8 text (at byte {}); pass a UTF-8 text file with --corpus",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    let mut rows = Vec::new();
    for line in text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.trim().is_empty())
    {
        let pieces = split_long_row(line);
        let last = pieces.len() - 1;
        for (i, piece) in pieces.into_iter().enumerate() {
            rows.push(if i == last {
                format!("{piece}\n")
            } else {
                piece.to_string()
            });
        }
    }
    Ok(rows)
}

/// The longest row tokenized as one piece. Wikitext-2's longest line is 2.6 kB; a corpus without
/// newlines (one 20 MB row) would otherwise be tokenized whole: 2.4 GB of memory and 9.7 s, where
/// the same text with newlines takes 0.2 GB and 0.6 s, and a run that needs a prefix would still
/// pay for all of it.
const MAX_ROW_BYTES: usize = 16 * 1024;

/// `line` cut into pieces of at most [`MAX_ROW_BYTES`], each cut just before a space so that the
/// space starts the next piece: a whitespace pre-tokenizer (BERT) and a byte-level BPE (which
/// attaches a space to the word after it) then see the same words as in the whole line. A run of
/// [`MAX_ROW_BYTES`] without a space is cut at a character boundary (the only case that can
/// tokenize differently from the whole line; no natural-language corpus has one).
fn split_long_row(line: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = line;
    while rest.len() > MAX_ROW_BYTES {
        // Bytes, not chars: byte MAX_ROW_BYTES may be inside a character (a space never is).
        let mut cut = rest.as_bytes()[..=MAX_ROW_BYTES]
            .iter()
            .rposition(|&b| b == b' ')
            .filter(|&i| i > 0)
            .unwrap_or(MAX_ROW_BYTES);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    pieces.push(rest);
    pieces
}

/// The `text` column of a hub parquet file.
fn parquet_rows(path: &Path) -> Result<Vec<String>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader = SerializedFileReader::new(file).map_err(|e| {
        usage!(
            "corpus {}: not a readable parquet file ({e})",
            path.display()
        )
    })?;
    let mut rows = Vec::new();
    for row in reader
        .get_row_iter(None)
        .map_err(|e| usage!("corpus {}: {e}", path.display()))?
    {
        let row =
            row.map_err(|e| usage!("corpus {}: corrupt parquet row ({e})", path.display()))?;
        let text = row
            .get_column_iter()
            .find(|(name, _)| name.as_str() == "text")
            .map(|(_, f)| f.clone());
        match text {
            Some(Field::Str(s)) => {
                if !s.trim().is_empty() {
                    rows.push(s);
                }
            }
            Some(Field::Null) => {}
            _ => {
                return Err(usage!(
                    "corpus {}: parquet file has no string column 'text'",
                    path.display()
                ))
            }
        }
    }
    if rows.is_empty() {
        return Err(usage!(
            "corpus {}: the parquet file holds no text",
            path.display()
        ));
    }
    Ok(rows)
}

/// Loads a tokenizer from tokenizer.json, or builds BERT's WordPiece pipeline from vocab.txt
/// (lower-casing as tokenizer_config.json's `do_lower_case` says, default true as HF's
/// BertTokenizer). Truncation and padding are turned off (MiniLM's tokenizer.json turns both on).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let mut tok = if path.file_name().is_some_and(|f| f == "vocab.txt") {
        use tokenizers::models::wordpiece::WordPiece;
        use tokenizers::normalizers::bert::BertNormalizer;
        use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
        let lower = path
            .parent()
            .map(|d| d.join("tokenizer_config.json"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v.get("do_lower_case").and_then(|b| b.as_bool()))
            .unwrap_or(true);
        let wp = WordPiece::from_file(&path.to_string_lossy())
            .unk_token("[UNK]".into())
            .build()
            .map_err(|e| {
                usage!(
                    "tokenizer {}: cannot read the vocabulary ({e})",
                    path.display()
                )
            })?;
        let mut t = Tokenizer::new(wp);
        let _ = t.with_normalizer(Some(BertNormalizer::new(true, true, None, lower)));
        t.with_pre_tokenizer(Some(BertPreTokenizer));
        t
    } else {
        Tokenizer::from_file(path).map_err(|e| {
            usage!(
                "tokenizer {}: not a valid tokenizer.json ({e})",
                path.display()
            )
        })?
    };
    tok.with_truncation(None)
        .map_err(|e| anyhow::anyhow!("disabling truncation: {e}"))?;
    tok.with_padding(None);
    Ok(tok)
}

/// Tokenizes every row (no special tokens) and concatenates the ids. Row-wise tokenization
/// equals tokenizing the concatenated split for BERT, whose pre-tokenizer splits on whitespace
/// (and is how docs/reference.md §7.1 builds a decoder's stream too).
pub fn tokenize(path: &Path, tokenizer: &Tokenizer, vocab_size: usize) -> Result<Corpus> {
    tokenize_prefix(path, tokenizer, vocab_size, usize::MAX)
}

/// Rows tokenized per batch by [`tokenize_prefix`], and the most bytes a batch holds: a corpus
/// without newlines is 16 kB pieces, and 512 of them (8 MB) would tokenize far past a short run's
/// need (5.3 s against 0.6 s for the same 20 MB with newlines, before the byte cap).
const ROWS_PER_BATCH: usize = 512;
const BYTES_PER_BATCH: usize = 64 * 1024;

/// `rows` in consecutive batches of at most [`ROWS_PER_BATCH`] rows and, past the first row,
/// [`BYTES_PER_BATCH`] bytes.
fn row_batches(rows: &[String]) -> impl Iterator<Item = &[String]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut len = 0;
        while len < rest.len().min(ROWS_PER_BATCH)
            && (len == 0 || bytes + rest[len].len() <= BYTES_PER_BATCH)
        {
            bytes += rest[len].len();
            len += 1;
        }
        let (batch, tail) = rest.split_at(len);
        rest = tail;
        Some(batch)
    })
}

/// [`tokenize`] of the corpus's first rows only: batches of rows until at least `need` tokens
/// (or the whole corpus). A run that takes two windows of 2048 tokens then tokenizes a few
/// thousand rows' worth, not the whole split (0.6 s of a 1.7 s BERT run, more with a 49k BPE).
/// The ids are the same prefix the whole corpus gives: rows are tokenized independently.
pub fn tokenize_prefix(
    path: &Path,
    tokenizer: &Tokenizer,
    vocab_size: usize,
    need: usize,
) -> Result<Corpus> {
    let rows = text_rows(path)?;
    let mut ids: Vec<u32> = Vec::new();
    for batch in row_batches(&rows) {
        if ids.len() >= need {
            break;
        }
        let encodings = tokenizer
            .encode_batch(batch.to_vec(), false)
            .map_err(|e| anyhow::anyhow!("tokenizing {}: {e}", path.display()))?;
        ids.extend(encodings.iter().flat_map(|e| e.get_ids().iter().copied()));
    }
    let complete = ids.len() < need;
    if ids.is_empty() {
        return Err(usage!(
            "corpus {}: no tokens after tokenization",
            path.display()
        ));
    }
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab_size) {
        return Err(usage!(
            "the tokenizer produced token id {bad}, but the model's vocab_size is {vocab_size}: the tokenizer \
             belongs to another model; use the tokenizer that ships with the model"
        ));
    }
    Ok(Corpus {
        path: path.to_path_buf(),
        ids,
        bos: None,
        complete,
    })
}

/// "only 3 windows of n = 512 fit" / "no window of n = 512 fits".
fn fit_phrase(fit: usize, n: usize) -> String {
    match fit {
        0 => format!("no window of n = {n} fits"),
        1 => format!("only 1 window of n = {n} fits"),
        f => format!("only {f} windows of n = {n} fit"),
    }
}

impl Corpus {
    /// How many non-overlapping n-token windows fit (n − 1 stream tokens each with a BOS).
    pub fn windows_available(&self, n: usize) -> usize {
        super::models::windows_available(self.ids.len(), n.max(1), self.bos)
    }

    /// The window's token count as said in errors: the whole corpus's, or "at least" a prefix's.
    fn token_count(&self) -> String {
        if self.complete {
            format!("{} tokens", self.ids.len())
        } else {
            format!("more than {} tokens", self.ids.len())
        }
    }

    /// Window `w` (0-based) of length n: tokens [w·n, (w+1)·n), or with a BOS (docs/reference.md §7.1)
    /// [BOS] + tokens [w(n−1), (w+1)(n−1)).
    pub fn window(&self, n: usize, w: usize) -> Result<Vec<u32>> {
        let fit = self.windows_available(n);
        let window = (n > 0 && w < fit)
            .then(|| super::models::decoder_window(&self.ids, n, w, self.bos))
            .flatten();
        window.ok_or_else(|| {
            usage!(
                "corpus {} has {}: {}, so window {w} (0-based) does not exist; use a smaller window index or length, or a longer corpus",
                self.path.display(),
                self.token_count(),
                fit_phrase(fit, n),
            )
        })
    }

    /// Checks that `count` windows of every length fit.
    pub fn check_fits(&self, lengths: &[usize], count: usize) -> Result<()> {
        for &n in lengths {
            let fit = self.windows_available(n);
            if fit < count {
                let fix = if fit == 0 {
                    "use shorter --lengths, or a longer corpus".to_string()
                } else {
                    format!("lower --windows to at most {fit}, use shorter --lengths, or a longer corpus")
                };
                return Err(usage!(
                    "corpus {} has {}: {}, but --windows {count} were requested; {fix}",
                    self.path.display(),
                    self.token_count(),
                    fit_phrase(fit, n)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_hf_convention() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.raw");
        std::fs::write(&p, " \r\n = Title = \r\n \r\n Some text , here .\r\n").unwrap();
        let rows = text_rows(&p).unwrap();
        assert_eq!(
            rows,
            vec![
                " = Title = \n".to_string(),
                " Some text , here .\n".to_string()
            ]
        );
    }

    #[test]
    fn long_rows_are_cut_before_a_space_into_pieces_that_rebuild_the_line() {
        let word = "héllo wörld , ";
        let line = word.repeat(3 * MAX_ROW_BYTES / word.len());
        let pieces = split_long_row(&line);
        assert!(pieces.len() >= 3);
        assert_eq!(pieces.concat(), line);
        for p in &pieces {
            assert!(p.len() <= MAX_ROW_BYTES);
        }
        for p in &pieces[1..] {
            assert!(p.starts_with(' '), "cut just before a space: {:?}", &p[..8]);
        }
        // No space at all: cut at character boundaries.
        let solid = "ü".repeat(MAX_ROW_BYTES);
        let pieces = split_long_row(&solid);
        assert_eq!(pieces.concat(), solid);
        assert!(pieces.iter().all(|p| p.len() <= MAX_ROW_BYTES));
        // Short rows are one piece.
        assert_eq!(split_long_row("a b"), vec!["a b"]);
    }

    #[test]
    fn batches_cover_every_row_in_order_within_both_caps() {
        let rows: Vec<String> = (0..2000)
            .map(|i| {
                "x".repeat(if i % 7 == 0 {
                    MAX_ROW_BYTES
                } else {
                    1 + i % 50
                })
            })
            .collect();
        let batches: Vec<&[String]> = row_batches(&rows).collect();
        assert_eq!(batches.concat(), rows);
        for b in &batches {
            assert!(!b.is_empty() && b.len() <= ROWS_PER_BATCH);
            let bytes: usize = b.iter().map(String::len).sum();
            assert!(b.len() == 1 || bytes <= BYTES_PER_BATCH, "{bytes}");
        }
        // Short rows fill a batch by count; long pieces by bytes.
        let short = vec!["ab".to_string(); 1500];
        assert_eq!(
            row_batches(&short).map(<[String]>::len).collect::<Vec<_>>(),
            [512, 512, 476]
        );
        let long = vec!["y".repeat(MAX_ROW_BYTES); 10];
        assert_eq!(
            row_batches(&long).map(<[String]>::len).collect::<Vec<_>>(),
            [4, 4, 2]
        );
    }

    #[test]
    fn bad_corpus_files_get_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "  \n").unwrap();
        assert!(text_rows(&empty)
            .unwrap_err()
            .to_string()
            .contains("the file is empty"));
        let bin = dir.path().join("bin.txt");
        std::fs::write(&bin, [0u8, 1, 2, 3]).unwrap();
        assert!(text_rows(&bin).unwrap_err().to_string().contains("binary"));
        let missing = dir.path().join("nope.txt");
        assert!(text_rows(&missing)
            .unwrap_err()
            .to_string()
            .contains("cannot read it"));
    }

    #[test]
    fn windows_are_consecutive_and_too_few_tokens_says_how_many_fit() {
        let c = Corpus {
            path: "x".into(),
            ids: (0..10).collect(),
            bos: None,
            complete: true,
        };
        assert_eq!(c.window(3, 2).unwrap(), &[6, 7, 8]);
        // With a BOS each window holds n − 1 stream tokens after it (docs/reference.md §7.1).
        let b = Corpus {
            bos: Some(99),
            ..c.clone()
        };
        assert_eq!(b.windows_available(3), 5);
        assert_eq!(b.window(3, 0).unwrap(), &[99, 0, 1]);
        assert_eq!(b.window(3, 4).unwrap(), &[99, 8, 9]);
        assert!(b.window(3, 5).is_err());
        let e = c.check_fits(&[4], 3).unwrap_err().to_string();
        assert!(e.contains("only 2 windows of n = 4 fit"), "{e}");
    }
}
