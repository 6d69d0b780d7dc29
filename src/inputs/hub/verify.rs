//! Is a file what the hub said it is? Checked before a download is linked into the cache and
//! every time a cached file is used, so a truncated or corrupt file is never a cache hit.
//!
//! - size against the size the hub announced (downloads only: the cache does not record it);
//! - content against the etag: a 64-hex etag is the sha256 of an LFS file, a 40-hex one the git
//!   blob id of a small file (the blob's name in the cache is its etag, so cached files are
//!   checked too);
//! - structure, for formats that state their own length: safetensors (header length + the last
//!   tensor's end offset = file size) and parquet (`PAR1` at both ends). This catches truncation
//!   even in caches laid out by hand, whose blobs are not named by hash.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::file_hash;

/// What the hub announced about a file; `None` where it did not say.
#[derive(Debug, Clone, Default)]
pub struct Expected<'a> {
    pub size: Option<u64>,
    pub etag: Option<&'a str>,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether an etag is an LFS sha256 (the bytes' own hash).
pub fn is_sha256(etag: &str) -> bool {
    is_hex(etag, 64)
}

/// Checks `path` (whose logical name on the hub is `filename`); `Err` says what is wrong.
pub fn check(path: &Path, filename: &str, expected: &Expected) -> Result<(), String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read it: {e}"))?
        .len();
    if let Some(size) = expected.size {
        if len != size {
            return Err(format!("{len} bytes, the hub announced {size}"));
        }
    }
    structure(path, filename, len)?;
    if let Some(etag) = expected.etag {
        let etag = etag.to_ascii_lowercase();
        if is_sha256(&etag) {
            let (got, _) = file_hash::sha256_file(path).map_err(|e| format!("{e:#}"))?;
            if got != etag {
                return Err(format!("sha256 {got}, expected {etag}"));
            }
        } else if is_hex(&etag, 40) {
            let got = file_hash::git_blob_sha1(path).map_err(|e| format!("{e:#}"))?;
            if got != etag {
                return Err(format!("git blob id {got}, expected {etag}"));
            }
        }
    }
    Ok(())
}

fn structure(path: &Path, filename: &str, len: u64) -> Result<(), String> {
    if filename.ends_with(".safetensors") {
        safetensors_length(path, len)
    } else if filename.ends_with(".parquet") {
        parquet_magic(path, len)
    } else {
        Ok(())
    }
}

/// A safetensors file is 8 bytes of header length n, n bytes of JSON header, then the tensors'
/// data; the largest `data_offsets` end is the data's length.
fn safetensors_length(path: &Path, len: u64) -> Result<(), String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| format!("{len} bytes: too short for a safetensors header"))?;
    let n = u64::from_le_bytes(n);
    if n > 100 << 20 || 8 + n > len {
        return Err(format!(
            "{len} bytes: the safetensors header claims {n} bytes of JSON"
        ));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| format!("reading the safetensors header: {e}"))?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| format!("the safetensors header is not JSON: {e}"))?;
    let end = json
        .as_object()
        .ok_or("the safetensors header is not a JSON object")?
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let want = 8 + n + end;
    if want != len {
        return Err(format!(
            "{len} bytes, its safetensors header says {want} (truncated or padded)"
        ));
    }
    Ok(())
}

fn parquet_magic(path: &Path, len: u64) -> Result<(), String> {
    let bad = || format!("{len} bytes: not a complete parquet file (no PAR1 at both ends)");
    if len < 12 {
        return Err(bad());
    }
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let (mut head, mut tail) = ([0u8; 4], [0u8; 4]);
    f.read_exact(&mut head).map_err(|_| bad())?;
    f.seek(SeekFrom::End(-4)).map_err(|_| bad())?;
    f.read_exact(&mut tail).map_err(|_| bad())?;
    if &head != b"PAR1" || &tail != b"PAR1" {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safetensors_bytes() -> Vec<u8> {
        let header = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header);
        v.extend_from_slice(&[0u8; 12]);
        v
    }

    #[test]
    fn a_whole_safetensors_file_passes_and_a_truncated_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("blob");
        let bytes = safetensors_bytes();
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(check(&p, "model.safetensors", &Expected::default()), Ok(()));
        std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
        let e = check(&p, "model.safetensors", &Expected::default()).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&p, &bytes[..5]).unwrap();
        assert!(check(&p, "model.safetensors", &Expected::default()).is_err());
        // The same bytes under another name are not parsed.
        assert_eq!(check(&p, "notes.bin", &Expected::default()), Ok(()));
    }

    #[test]
    fn size_and_both_kinds_of_etag_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        let sha = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
        let git = "ce013625030ba8dba906f756967f9e9ca394464a";
        for etag in [sha, git] {
            let ok = Expected {
                size: Some(6),
                etag: Some(etag),
            };
            assert_eq!(check(&p, "f", &ok), Ok(()));
        }
        let short = Expected {
            size: Some(7),
            etag: None,
        };
        assert!(check(&p, "f", &short).unwrap_err().contains("announced 7"));
        std::fs::write(&p, b"hellO\n").unwrap();
        for etag in [sha, git] {
            let e = Expected {
                size: Some(6),
                etag: Some(etag),
            };
            assert!(check(&p, "f", &e).is_err());
        }
        // An etag that is neither hash (e.g. a CDN's) checks nothing.
        let other = Expected {
            size: None,
            etag: Some("abc-1"),
        };
        assert_eq!(check(&p, "f", &other), Ok(()));
    }

    #[test]
    fn parquet_needs_its_magic_at_both_ends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"PAR1xxxxxxxxPAR1").unwrap();
        assert_eq!(check(&p, "a/test.parquet", &Expected::default()), Ok(()));
        std::fs::write(&p, b"PAR1xxxxxxxxPA").unwrap();
        assert!(check(&p, "a/test.parquet", &Expected::default()).is_err());
    }
}
