//! The rows of an end-to-end run's `e2e.csv` (docs/reference.md §10.3), read once for every reader
//! (the correlation table, the figure): complete rows only, each with its window, its point
//! (mode, method, d) and its columns as numbers (NaN where a column is not one).

use std::path::Path;

use anyhow::Result;

use crate::usage;

/// One (mode, method, d).
pub type Point = (String, String, usize);

pub struct E2eRow {
    pub window: usize,
    pub point: Point,
    /// Every column of the header, parsed as f64 (NaN for text such as `mode`).
    pub values: Vec<f64>,
}

pub struct E2eRows {
    pub header: Vec<String>,
    pub rows: Vec<E2eRow>,
}

impl E2eRows {
    /// The rows of `path` with as many fields as its header.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage!("{}: cannot read it ({e})", path.display()))?;
        let mut lines = text.lines();
        let header: Vec<String> = lines
            .next()
            .unwrap_or("")
            .split(',')
            .map(String::from)
            .collect();
        if header.len() < 4 || header[..4] != ["window", "mode", "method", "d"] {
            return Err(usage!("{}: not an e2e.csv", path.display()));
        }
        let rows = lines
            .map(|l| l.split(',').collect::<Vec<&str>>())
            .filter(|f| f.len() == header.len())
            .map(|f| E2eRow {
                window: f[0].parse().unwrap_or(0),
                point: (
                    f[1].to_string(),
                    f[2].to_string(),
                    f[3].parse().unwrap_or(0),
                ),
                values: f.iter().map(|x| x.parse().unwrap_or(f64::NAN)).collect(),
            })
            .collect();
        Ok(Self { header, rows })
    }

    /// The index of column `name`, or an error naming the file's kind.
    pub fn col(&self, name: &str) -> Result<usize> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| usage!("an e2e.csv without a {name} column"))
    }
}
