//! Content hashes of input files, computed once per process.
//!
//! Two stages need the sha256 of the same (possibly 400 MB) file: the hub cache verifies a blob
//! against its name before using it, and the manifest records every input's hash. The memo keys
//! on (path, size, modification time), so a file replaced in between is hashed again.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

type Key = (PathBuf, u64, Option<SystemTime>);

static MEMO: Mutex<Option<HashMap<Key, String>>> = Mutex::new(None);

fn key(path: &Path) -> Result<Key> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Ok((canonical, meta.len(), meta.modified().ok()))
}

/// sha256 (lower-case hex) and size of a file, streamed; memoized per process.
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let k = key(path)?;
    if let Some(hex) = MEMO
        .lock()
        .expect("hash memo")
        .as_ref()
        .and_then(|m| m.get(&k))
    {
        return Ok((hex.clone(), k.1));
    }
    let mut h = Sha256::new();
    let total = stream(path, |chunk| h.update(chunk))?;
    let hex = format!("{:x}", h.finalize());
    if total == k.1 {
        MEMO.lock()
            .expect("hash memo")
            .get_or_insert_with(HashMap::new)
            .insert(k, hex.clone());
    }
    Ok((hex, total))
}

/// Git's blob id of a file: sha1("blob <len>\0" ‖ content), the etag the hub gives files that
/// are not stored with LFS (config.json, tokenizer.json, vocab.txt).
pub fn git_blob_sha1(path: &Path) -> Result<String> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {len}\0").as_bytes());
    stream(path, |chunk| h.update(chunk))?;
    Ok(format!("{:x}", h.finalize()))
}

fn stream(path: &Path, mut f: impl FnMut(&[u8])) -> Result<u64> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("hashing {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let k = file
            .read(&mut buf)
            .with_context(|| format!("hashing {}", path.display()))?;
        if k == 0 {
            return Ok(total);
        }
        total += k as u64;
        f(&buf[..k]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hello");
        std::fs::write(&p, b"hello\n").unwrap();
        // `sha256sum` and `git hash-object` of "hello\n".
        assert_eq!(
            sha256_file(&p).unwrap(),
            (
                "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03".to_string(),
                6
            )
        );
        assert_eq!(
            git_blob_sha1(&p).unwrap(),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }

    #[test]
    fn a_changed_file_is_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"one").unwrap();
        let a = sha256_file(&p).unwrap().0;
        std::fs::write(&p, b"two, longer").unwrap();
        let b = sha256_file(&p).unwrap().0;
        assert_ne!(a, b);
        assert_eq!(b, format!("{:x}", Sha256::digest(b"two, longer")));
    }
}
