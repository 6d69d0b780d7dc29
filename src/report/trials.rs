//! trials.csv: one row per (model, n, window, head, method, d), appended and flushed as each
//! trial finishes so that an interrupted run loses nothing already computed.

use serde::{Deserialize, Serialize};

/// One trial. Column order is the CSV schema (README "Output files").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialRow {
    /// `initialized` or `pretrained` (the Q/K/V weight source).
    pub model: String,
    /// Hub id or local directory of the model.
    pub model_id: String,
    pub layer: usize,
    pub n: usize,
    pub window: usize,
    pub head: usize,
    pub method: String,
    pub d: usize,
    /// The trial's derived seed (see numerics::sampling::TrialKey).
    pub seed: u64,
    /// ‖O − Ô‖₂ (NaN when Ô has non-finite entries).
    pub error: f64,
    /// error / ‖O‖₂.
    pub rel_error: f64,
    /// ‖O − Ô‖_F.
    pub frob_error: f64,
    /// ‖O‖₂.
    pub exact_norm: f64,
    /// Rows of Ô that are non-finite or whose estimated normalizer D̂ is ≤ 0 or non-finite.
    pub nonfinite_rows: usize,
    /// Analytic multiply-adds of the method at (n, p, d).
    pub macs: f64,
    /// Wall-clock seconds of the method's approximation (timing column; not reproducible).
    pub seconds: f64,
    /// What `error` is measured against (`softmax` or `kernelized`). The last column, so that
    /// files written before it existed read as softmax and positional readers keep working.
    #[serde(default)]
    pub target: crate::attention::Target,
    /// The target's mask (`none` or `causal`, docs/reference.md §7.2); files written before it read as
    /// none. The columns from here on came with decoder attention, after `target`, for the same
    /// reason `target` is last of its own generation.
    #[serde(default)]
    pub mask: crate::attention::Mask,
    /// The K/V head the query head reads, ⌊head·H_kv/H⌋ (the head itself without grouped-query
    /// heads); empty in files written before it.
    #[serde(default)]
    pub kv_head: Option<usize>,
    /// Restrict-and-renormalise methods: the mean over rows of the exact attention mass on the
    /// visited keys, Σ_{j∈S_i} P_ij; empty for every other method.
    #[serde(default)]
    pub mass: Option<f64>,
    /// Restrict-and-renormalise methods: the mean over rows of |S_i|, the keys per query actually
    /// visited; empty for every other method.
    #[serde(default)]
    pub keys: Option<f64>,
    /// ⟨O, Ô⟩/(‖O‖_F‖Ô‖_F) on the head's flattened output (docs/reference.md §8.5); the columns from here
    /// on came with quantized attention and are empty in files written before it.
    #[serde(default)]
    pub cos_sim: Option<f64>,
    /// Σ|O − Ô|/Σ|O|.
    #[serde(default)]
    pub rel_l1: Option<f64>,
    /// √(mean (O − Ô)²).
    #[serde(default)]
    pub rmse: Option<f64>,
    /// Bits per stored K/V value read (§8.5): the §8 formats' own, 16 for restrict-and-renormalise
    /// methods (keys from an f16 cache), empty for methods that read no cache.
    #[serde(default)]
    pub kv_bits: Option<f64>,
    /// The fraction of dense f16 attention's K/V traffic, Σ_i |S_i|·kv_bits / (16·Σ_i |D_i|).
    #[serde(default)]
    pub kv_read: Option<f64>,
    /// The decode protocol's continuation length (docs/reference.md §9.1): the rows scored are the n_f
    /// last of the window; empty for prefill runs and in files written before it.
    #[serde(default)]
    pub n_f: Option<usize>,
    /// Decode methods: the prompt keys the row's K/V head holds for its group of query heads,
    /// the union of their sets (§9.1, GQA traffic; per query sets: mean over the continuation).
    #[serde(default)]
    pub kv_union: Option<f64>,
    /// The layer's spec (docs/reference.md §7.7.6), so that runs merged across families stay
    /// comparable: `full_attention` or `sliding_attention`. The columns from here on came with
    /// the §7.7 families and are empty in files written before them.
    #[serde(default)]
    pub layer_type: Option<crate::attention::LayerType>,
    /// The layer's sliding window W, empty without one (`window` is the corpus window's index,
    /// as in the dump's sidecar).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// τ, the factor on q·k.
    #[serde(default)]
    pub scale: Option<f64>,
    /// The logit soft-cap c, empty without one.
    #[serde(default)]
    pub softcap: Option<f64>,
    /// Whether the layer has learned sink logits.
    #[serde(default)]
    pub sinks: Option<bool>,
    /// On a layer with sinks: the mean over rows of the target's sink probability, so that
    /// `mass` + `sink_mass` = 1 for a method that keeps every key.
    #[serde(default)]
    pub sink_mass: Option<f64>,
}

impl TrialRow {
    /// The identity of a trial within a run: what resume and `check --exact` match on.
    pub fn key(&self) -> (String, usize, usize, usize, String, usize) {
        (
            self.model.clone(),
            self.n,
            self.window,
            self.head,
            self.method.clone(),
            self.d,
        )
    }
}

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Key of a trial as stored: (model, n, window, head, method, d).
pub type TrialKeyOwned = (String, usize, usize, usize, String, usize);

/// Reads every complete row of a trials.csv.
pub fn read_rows(path: &Path) -> Result<Vec<TrialRow>> {
    let mut rdr = csv::Reader::from_path(path)
        .map_err(|e| crate::usage!("{}: cannot read trials ({e})", path.display()))?;
    let mut rows = Vec::new();
    for (i, r) in rdr.deserialize().enumerate() {
        let row: TrialRow =
            r.map_err(|e| crate::usage!("{}: malformed row {} ({e})", path.display(), i + 2))?;
        rows.push(row);
    }
    Ok(rows)
}

/// Appends trial rows, one flushed line each, so that a killed run keeps every finished trial.
pub struct TrialWriter {
    file: File,
    path: PathBuf,
}

impl TrialWriter {
    /// Opens `path` for appending. An existing file is resumed: a torn last line (a run killed
    /// mid-write) is cut off, and the keys of the complete rows are returned so they are skipped.
    pub fn open(path: &Path) -> Result<(Self, Vec<TrialRow>)> {
        let mut existing = Vec::new();
        if path.is_file() {
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)?;
            let keep = match bytes.iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => 0,
            };
            if keep < bytes.len() {
                f.set_len(keep as u64)?;
            }
            f.seek(SeekFrom::End(0))?;
            if keep > 0 {
                existing = read_rows(path)?;
                let header_line = bytes[..keep].split(|&b| b == b'\n').next().unwrap_or(&[]);
                if header_line != HEADER.join(",").as_bytes() {
                    // Written before a column was added (e.g. `target`): rewritten once in the
                    // current schema (the rows read with the new columns' defaults), so that the
                    // rows appended next line up with the header.
                    drop(f);
                    rewrite(path, &existing)?;
                }
            }
        }
        let fresh = !path.exists() || std::fs::metadata(path)?.len() == 0;
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                crate::usage!(
                    "cannot write {} ({e}); choose a writable --out",
                    path.display()
                )
            })?;
        if fresh {
            let mut w = csv::WriterBuilder::new()
                .has_headers(false)
                .from_writer(Vec::new());
            w.write_record(HEADER)?;
            file.write_all(&w.into_inner()?)
                .and_then(|_| file.flush())
                .with_context(|| format!("writing {} (disk full?)", path.display()))?;
        }
        Ok((
            Self {
                file,
                path: path.to_path_buf(),
            },
            existing,
        ))
    }

    /// Appends one row as a single write, then flushes it to the OS.
    pub fn append(&mut self, row: &TrialRow) -> Result<()> {
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        w.serialize(row)?;
        let line = w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
        self.file
            .write_all(&line)
            .and_then(|_| self.file.flush())
            .with_context(|| format!("writing {} (disk full?)", self.path.display()))?;
        Ok(())
    }
}

/// Replaces `path` by `rows` under the current header, through a temporary file renamed over it
/// (a crash leaves either the old file or the new one).
pub fn rewrite(path: &Path, rows: &[TrialRow]) -> Result<()> {
    crate::atomic_file::write_with(path, |tmp| {
        let mut w = csv::Writer::from_path(tmp)
            .with_context(|| format!("writing {} (disk full?)", path.display()))?;
        for r in rows {
            w.serialize(r)?;
        }
        w.flush()
            .with_context(|| format!("writing {} (disk full?)", path.display()))?;
        Ok(())
    })
}

/// The CSV header, in [`TrialRow`] field order.
pub const HEADER: &[&str] = &[
    "model",
    "model_id",
    "layer",
    "n",
    "window",
    "head",
    "method",
    "d",
    "seed",
    "error",
    "rel_error",
    "frob_error",
    "exact_norm",
    "nonfinite_rows",
    "macs",
    "seconds",
    "target",
    "mask",
    "kv_head",
    "mass",
    "keys",
    "cos_sim",
    "rel_l1",
    "rmse",
    "kv_bits",
    "kv_read",
    "n_f",
    "kv_union",
    "layer_type",
    "sliding_window",
    "scale",
    "softcap",
    "sinks",
    "sink_mass",
];

/// Keys of rows, for skipping on resume.
pub fn keys(rows: &[TrialRow]) -> HashSet<TrialKeyOwned> {
    rows.iter().map(|r| r.key()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(window: usize) -> TrialRow {
        TrialRow {
            model: "initialized".into(),
            model_id: "m".into(),
            layer: 0,
            n: 8,
            window,
            head: 0,
            method: "vmean".into(),
            d: 4,
            seed: 1,
            error: 0.5,
            rel_error: 0.1,
            frob_error: 0.7,
            exact_norm: 5.0,
            nonfinite_rows: 0,
            macs: 32.0,
            seconds: 0.001,
            target: crate::attention::Target::Softmax,
            mask: crate::attention::Mask::None,
            kv_head: Some(0),
            mass: None,
            keys: None,
            ..TrialRow::default()
        }
    }

    #[test]
    fn a_full_disk_is_a_clear_error() {
        // /dev/full accepts the open and fails every write with ENOSPC.
        let full = std::path::Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let err = match TrialWriter::open(full) {
            Ok((mut w, _)) => w.append(&row(0)).unwrap_err(),
            Err(e) => e,
        };
        let msg = format!("{err:#}");
        assert!(
            msg.contains("/dev/full") && (msg.contains("disk full") || msg.contains("No space")),
            "{msg}"
        );
    }

    #[test]
    fn a_file_from_before_the_target_column_reads_as_softmax_and_is_upgraded_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trials.csv");
        // The header before `target` and the decoder columns (mask, kv_head, mass, keys).
        let old_header = HEADER[..HEADER.len() - 18].join(",");
        std::fs::write(
            &p,
            format!("{old_header}\ninitialized,m,0,8,0,0,vmean,4,1,0.5,0.1,0.7,5.0,0,32.0,0.001\n"),
        )
        .unwrap();
        let old_row = TrialRow {
            kv_head: None,
            ..row(0)
        };
        assert_eq!(read_rows(&p).unwrap(), vec![old_row.clone()]);
        let (mut w, old) = TrialWriter::open(&p).unwrap();
        assert_eq!(old, vec![old_row.clone()]);
        let mut kernelized = row(1);
        kernelized.target = crate::attention::Target::Kernelized;
        w.append(&kernelized).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with(&HEADER.join(",")), "{text}");
        assert!(
            text.lines()
                .nth(1)
                .unwrap()
                .ends_with(",softmax,none,,,,,,,,,,,,,,,,"),
            "{text}"
        );
        assert_eq!(read_rows(&p).unwrap(), vec![old_row, kernelized]);
    }

    #[test]
    fn resume_drops_a_torn_last_line_and_keeps_complete_rows() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trials.csv");
        {
            let (mut w, old) = TrialWriter::open(&p).unwrap();
            assert!(old.is_empty());
            w.append(&row(0)).unwrap();
            w.append(&row(1)).unwrap();
        }
        // Simulate a kill mid-write.
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"initialized,m,0,8,2,0,vm").unwrap();
        drop(f);
        let (mut w, old) = TrialWriter::open(&p).unwrap();
        assert_eq!(old, vec![row(0), row(1)]);
        w.append(&row(2)).unwrap();
        assert_eq!(read_rows(&p).unwrap(), vec![row(0), row(1), row(2)]);
    }
}
