//! `--ids FILE`: token windows from a file, so that a reference implementation can be fed the
//! same windows (docs/reference.md §10.1). Text: each non-empty line one window of whitespace-separated
//! ids. `.npy`: a C-order array of unsigned or signed integers, 1-D (one window) or 2-D (one row
//! per window).

use std::path::Path;

use anyhow::Result;

use crate::usage;

/// The windows in `path`, each id checked against the model's vocabulary of `vocab`.
pub fn read_ids(path: &Path, vocab: usize) -> Result<Vec<Vec<u32>>> {
    let bytes = std::fs::read(path)
        .map_err(|e| usage!("--ids {}: cannot read it ({e})", path.display()))?;
    let windows = if path.extension().is_some_and(|e| e == "npy") {
        read_npy(path, &bytes)?
    } else {
        read_text(path, &bytes)?
    };
    if windows.is_empty() {
        return Err(usage!("--ids {}: holds no token ids", path.display()));
    }
    for (w, ids) in windows.iter().enumerate() {
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return Err(usage!(
                "--ids {}: token id {id} (window {w}, position {i}) is outside the model's vocabulary of {vocab}; the ids were made for another tokenizer",
                path.display()
            ));
        }
    }
    Ok(windows)
}

fn read_text(path: &Path, bytes: &[u8]) -> Result<Vec<Vec<u32>>> {
    let text = std::str::from_utf8(bytes).map_err(|_| {
        usage!(
            "--ids {}: not text; give whitespace-separated token ids (one window a line) or a .npy of integers",
            path.display()
        )
    })?;
    let mut out = Vec::new();
    for (line_no, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let ids = line
            .split_whitespace()
            .map(|t| {
                t.parse::<u32>().map_err(|_| {
                    usage!(
                        "--ids {}: line {}: '{t}' is not a token id (a non-negative integer)",
                        path.display(),
                        line_no + 1
                    )
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        out.push(ids);
    }
    Ok(out)
}

/// A .npy file's integer array as rows of u32.
fn read_npy(path: &Path, bytes: &[u8]) -> Result<Vec<Vec<u32>>> {
    let bad = |why: &str| {
        usage!(
            "--ids {}: {why}; write the ids as a C-order .npy of integers (numpy.save of an int32/int64 array) or as text",
            path.display()
        )
    };
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy file"));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize,
            12,
        ),
        _ => return Err(bad("an unknown .npy version")),
    };
    let header = bytes
        .get(start..start + header_len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad("a truncated .npy header"))?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}':"))? + key.len() + 3;
        Some(header[at..].trim_start())
    };
    let descr = field("descr")
        .and_then(|s| s.strip_prefix('\''))
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| bad("no dtype in the .npy header"))?;
    if field("fortran_order").is_some_and(|s| s.starts_with("True")) {
        return Err(bad("a Fortran-order array"));
    }
    let shape: Vec<usize> = field("shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .ok_or_else(|| bad("no shape in the .npy header"))?;
    let (rows, cols) = match shape[..] {
        [n] => (1, n),
        [w, n] => (w, n),
        _ => return Err(bad(&format!("an array of shape {shape:?}, not 1-D or 2-D"))),
    };
    let width = match descr {
        "<i8" | "<u8" => 8,
        "<i4" | "<u4" => 4,
        "<i2" | "<u2" => 2,
        "|i1" | "|u1" => 1,
        other => {
            return Err(bad(&format!(
                "values of dtype '{other}', not little-endian integers"
            )))
        }
    };
    let signed = descr.as_bytes()[1] == b'i';
    let data = &bytes[start + header_len..];
    if data.len() != rows * cols * width {
        return Err(bad(&format!(
            "{} data bytes where shape {shape:?} of '{descr}' needs {}",
            data.len(),
            rows * cols * width
        )));
    }
    let values: Vec<i128> = data
        .chunks_exact(width)
        .map(|c| {
            let mut b = [0u8; 16];
            b[..width].copy_from_slice(c);
            if signed && c[width - 1] & 0x80 != 0 {
                b[width..].fill(0xff);
            }
            i128::from_le_bytes(b)
        })
        .collect();
    if let Some(v) = values.iter().find(|&&v| v < 0 || v > u32::MAX as i128) {
        return Err(bad(&format!("the value {v}, which is no token id")));
    }
    Ok(values
        .chunks(cols.max(1))
        .take(rows)
        .map(|r| r.iter().map(|&v| v as u32).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend(data);
        b
    }

    #[test]
    fn text_and_npy_ids_read_alike_and_bad_files_are_usage_errors() {
        let dir = tempfile::tempdir().unwrap();
        let txt = dir.path().join("ids.txt");
        std::fs::write(&txt, "1 2 3\n\n4 5 6\n").unwrap();
        assert_eq!(
            read_ids(&txt, 10).unwrap(),
            vec![vec![1, 2, 3], vec![4, 5, 6]]
        );
        let data: Vec<u8> = [1i64, 2, 3, 4, 5, 6]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let p = dir.path().join("ids.npy");
        std::fs::write(&p, npy("<i8", "(2, 3)", &data)).unwrap();
        assert_eq!(
            read_ids(&p, 10).unwrap(),
            vec![vec![1, 2, 3], vec![4, 5, 6]]
        );
        let d32: Vec<u8> = [7i32, 8].iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&p, npy("<i4", "(2,)", &d32)).unwrap();
        assert_eq!(read_ids(&p, 10).unwrap(), vec![vec![7, 8]]);
        let usage = |path: &Path, vocab: usize, want: &str| {
            let e = read_ids(path, vocab).unwrap_err();
            assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
            let m = e.to_string();
            assert!(
                m.contains(want) && m.contains(&path.display().to_string()),
                "{m}"
            );
        };
        usage(&txt, 5, "token id 5 (window 1, position 1)");
        let f: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&p, npy("<f8", "(2,)", &f)).unwrap();
        usage(&p, 10, "dtype '<f8'");
        std::fs::write(&p, npy("<i8", "(3,)", &data[..16])).unwrap();
        usage(&p, 10, "data bytes");
        std::fs::write(&txt, "1 2 x\n").unwrap();
        usage(&txt, 10, "'x' is not a token id");
        usage(&dir.path().join("absent.txt"), 10, "cannot read");
    }
}
