//! A cache of one window's post-RoPE Q/K/V (issue 33): a researcher who reruns the same model,
//! layer, window and n while iterating on a method pays for the decoder forward once.
//!
//! An entry is a safetensors file holding `q`, `k`, `v` exactly as the forward returned them (the
//! run's dtype), named by the sha256 of its key: the forward's code version, the numerical
//! dependencies' versions, the input configuration (model, layer, dtype, device, seeds, embedding
//! policy; paths left out), the sha256 of every input file (config, tokenizer, weights, corpus),
//! n and the window. The key is also stored in the entry with the sha256 of the tensor bytes; an
//! entry whose key or bytes do not verify is recomputed and replaced. Entries are written
//! atomically; past the size cap the least recently used are removed.
//!
//! Only decoder models are cached by default: a BERT layer's Q/K/V cost milliseconds, less than
//! reading them back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use sha2::{Digest, Sha256};

use crate::config::InputConfig;

/// The version of the Q/K/V computation: bump it whenever the forward's arithmetic changes (the
/// layers before L, RoPE, the projections, the embedding pipeline), so that no entry computed by
/// the old code is read by the new. (3: the fused kernel's own FMA tile products and exponential;
/// 4: that exponential's shorter chain and paired sums, which round differently; 5: its
/// degree-5 polynomial, scripts/fit-exp-poly.py; 6: the key names the instruction sets, [`simd`].)
pub const FORWARD_VERSION: &str = "qkv-forward-6";

/// The instruction sets the forward's arithmetic ran on, for the key. `gemm` (candle's matmul)
/// takes its AVX-512 kernels where the CPU has avx512f and its FMA ones elsewhere, and their sums
/// block by their own tiles and cache sizes; the fused kernel of the attention before layer L runs
/// on [`Simd::chosen`]'s path, and its portable path rounds otherwise than its microkernels. So
/// the same forward can give other bits on another CPU or under `AB_SIMD`, and an entry written
/// on one must not be read as the other's (a shared or copied cache directory). The AVX2 and
/// AVX-512 paths agree bit for bit (tested), but the key names the path all the same: it costs a
/// recompute only where someone forces a path, and stays right if the paths ever diverge.
pub fn simd() -> String {
    use crate::numerics::flash::{tiles, Simd};
    format!(
        "gemm {}, flash {}",
        tiles::gemm_isa(),
        Simd::chosen().name()
    )
}

/// Where the cache lives unless the caller says: `$APPROX_BENCH_QKV_CACHE` (a directory, or
/// `off`), else `$XDG_CACHE_HOME/approx-bench/qkv`, else `~/.cache/approx-bench/qkv`.
pub const CACHE_VAR: &str = "APPROX_BENCH_QKV_CACHE";

/// The most bytes the cache keeps (the least recently used entries go first):
/// `$APPROX_BENCH_QKV_CACHE_MAX_GB`, else 16 GB.
pub const MAX_VAR: &str = "APPROX_BENCH_QKV_CACHE_MAX_GB";

/// Whether and where to cache.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CacheSetting {
    /// Decoders only, in the default directory (see [`CACHE_VAR`]).
    #[default]
    Default,
    /// Never.
    Off,
    /// In this directory (every model).
    Dir(PathBuf),
}

impl CacheSetting {
    /// `off` or a directory, as `--qkv-cache` takes it.
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "off" | "none" | "" => Self::Off,
            d => Self::Dir(PathBuf::from(d)),
        }
    }

    /// The directory to use for a model (`decoder`: whether it is one), if any.
    pub fn resolve(&self, decoder: bool) -> Option<PathBuf> {
        match self {
            Self::Off => None,
            Self::Dir(d) => Some(d.clone()),
            Self::Default => {
                let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
                match var(CACHE_VAR) {
                    Some(v) => Self::parse(&v).resolve(true).filter(|_| decoder),
                    None if !decoder => None,
                    None => var("XDG_CACHE_HOME")
                        .map(PathBuf::from)
                        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                        .map(|c| c.join("approx-bench").join("qkv")),
                }
            }
        }
    }
}

/// How a run used the cache (the manifest records it).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheUse {
    pub dir: String,
    /// Windows read from the cache.
    pub hits: usize,
    /// Windows computed (and stored).
    pub misses: usize,
    /// Entries that failed verification and were recomputed (counted in `misses` too).
    pub rejected: usize,
}

/// An open cache for one input configuration.
pub struct QkvCache {
    dir: PathBuf,
    /// The key's fields but n and the window, as JSON.
    base: serde_json::Value,
    usage: Mutex<CacheUse>,
    /// The most bytes the cache holds ([`MAX_VAR`]), read when it is opened.
    cap: u64,
}

/// The cache's cap in bytes: `$APPROX_BENCH_QKV_CACHE_MAX_GB` GB, else 16 GB. A value that is not
/// a finite number ≥ 0 is a usage error when the cache is opened (it used to fall back to 16 GB
/// without a word, so a typo left a cache growing past what its user asked for).
pub fn cap_bytes() -> Result<u64> {
    let Ok(raw) = std::env::var(MAX_VAR) else {
        return Ok(16_000_000_000);
    };
    match raw.trim().parse::<f64>() {
        Ok(gb) if gb.is_finite() && gb >= 0.0 => Ok((gb * 1e9) as u64),
        _ => Err(crate::usage!(
            "{MAX_VAR}={raw:?}: not a size in GB; give a number at least 0 (e.g. {MAX_VAR}=16), or unset it for the default 16"
        )),
    }
}

impl QkvCache {
    /// The cache in `dir` for `inputs`, whose files (role, path) are hashed here (memoized).
    pub fn open(dir: &Path, inputs: &InputConfig, files: &[(String, PathBuf)]) -> Result<Self> {
        let cap = cap_bytes()?;
        std::fs::create_dir_all(dir).map_err(|e| {
            crate::usage!(
                "--qkv-cache {}: cannot create the directory ({e}); give a writable directory, or --qkv-cache off",
                dir.display()
            )
        })?;
        let mut hashes: Vec<(String, String)> = files
            .iter()
            .map(|(role, path)| Ok((role.clone(), crate::file_hash::sha256_file(path)?.0)))
            .collect::<Result<_>>()?;
        hashes.sort();
        let mut config = serde_json::to_value(inputs)?;
        // Paths are not the inputs: their contents (the hashes) are.
        if let Some(o) = config.as_object_mut() {
            o.remove("model_source");
            o.remove("corpus");
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            base: serde_json::json!({
                "forward": FORWARD_VERSION,
                "simd": simd(),
                "dependencies": env!("APPROX_BENCH_DEPS"),
                "inputs": config,
                "files": hashes,
            }),
            usage: Mutex::new(CacheUse {
                dir: dir.display().to_string(),
                ..CacheUse::default()
            }),
            cap,
        })
    }

    /// What the run did with the cache so far.
    pub fn usage(&self) -> CacheUse {
        self.usage.lock().expect("cache usage").clone()
    }

    fn key(&self, n: usize, window: usize) -> String {
        let mut k = self.base.clone();
        k["n"] = n.into();
        k["window"] = window.into();
        k.to_string()
    }

    fn path_of(&self, key: &str) -> PathBuf {
        let h = format!("{:x}", Sha256::digest(key.as_bytes()));
        self.dir.join(format!("{}.safetensors", &h[..32]))
    }

    /// Window `window` of length `n`: from the cache when a verified entry is there, else from
    /// `compute`, whose result is stored. A failure to store is a warning, never an error: the
    /// run has its Q/K/V.
    pub fn get_or_compute(
        &self,
        n: usize,
        window: usize,
        device: &Device,
        compute: impl FnOnce() -> Result<(Tensor, Tensor, Tensor)>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let key = self.key(n, window);
        let path = self.path_of(&key);
        let mut rejected = false;
        if path.is_file() {
            match read_entry(&path, &key, device) {
                Ok(qkv) => {
                    // Touched, so that the size cap removes the least recently used.
                    let _ = std::fs::File::options()
                        .append(true)
                        .open(&path)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                    self.usage.lock().expect("cache usage").hits += 1;
                    return Ok(qkv);
                }
                Err(_) => rejected = true,
            }
        }
        let qkv = compute()?;
        {
            let mut u = self.usage.lock().expect("cache usage");
            u.misses += 1;
            u.rejected += rejected as usize;
        }
        if let Err(e) = write_entry(&path, &key, &qkv).and_then(|_| self.trim()) {
            eprintln!(
                "warning: the Q/K/V cache {} could not store window {window} at n = {n} ({e:#}); the run goes on without it",
                self.dir.display()
            );
        }
        Ok(qkv)
    }

    /// Removes the least recently used entries while the cache holds more than its cap
    /// ([`MAX_VAR`]).
    fn trim(&self) -> Result<()> {
        self.trim_to(self.cap)
    }

    fn trim_to(&self, cap: u64) -> Result<()> {
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = std::fs::read_dir(&self.dir)?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= cap {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
        Ok(())
    }
}

/// The tensor's values as little-endian bytes (f32 or f64).
fn bytes_of(t: &Tensor) -> Result<(safetensors::Dtype, Vec<u8>)> {
    let t = t.to_device(&Device::Cpu)?.flatten_all()?;
    Ok(match t.dtype() {
        DType::F64 => (
            safetensors::Dtype::F64,
            t.to_vec1::<f64>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        ),
        _ => (
            safetensors::Dtype::F32,
            t.to_dtype(DType::F32)?
                .to_vec1::<f32>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        ),
    })
}

const NAMES: [&str; 3] = ["q", "k", "v"];

fn write_entry(path: &Path, key: &str, qkv: &(Tensor, Tensor, Tensor)) -> Result<()> {
    let tensors = [&qkv.0, &qkv.1, &qkv.2];
    let mut payload = Sha256::new();
    let mut data = Vec::with_capacity(3);
    for t in tensors {
        let (dtype, bytes) = bytes_of(t)?;
        payload.update(&bytes);
        data.push((dtype, t.dims().to_vec(), bytes));
    }
    let views: Vec<(&str, safetensors::tensor::TensorView)> = NAMES
        .iter()
        .zip(&data)
        .map(|(name, (dtype, shape, bytes))| {
            Ok((
                *name,
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)?,
            ))
        })
        .collect::<Result<_>>()?;
    let meta = HashMap::from([
        ("key".to_string(), key.to_string()),
        (
            "payload_sha256".to_string(),
            format!("{:x}", payload.finalize()),
        ),
    ]);
    let bytes = safetensors::serialize(views, Some(meta))?;
    crate::atomic_file::write(path, &bytes)
}

/// The entry's Q/K/V if its key is `key` and its bytes hash to the recorded sha256.
fn read_entry(path: &Path, key: &str, device: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)?;
    let meta = meta.metadata().clone().unwrap_or_default();
    anyhow::ensure!(
        meta.get("key").map(String::as_str) == Some(key),
        "another key"
    );
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let mut payload = Sha256::new();
    let mut out = Vec::with_capacity(3);
    for name in NAMES {
        let view = st.tensor(name)?;
        payload.update(view.data());
        // The stored little-endian bytes, read back as the dtype they were written in (the
        // host is little-endian: x86_64 and aarch64, as candle assumes too).
        let t = match view.dtype() {
            safetensors::Dtype::F64 => {
                Tensor::from_raw_buffer(view.data(), DType::F64, view.shape(), device)?
            }
            safetensors::Dtype::F32 => {
                Tensor::from_raw_buffer(view.data(), DType::F32, view.shape(), device)?
            }
            other => anyhow::bail!("unexpected dtype {other:?}"),
        };
        out.push(t);
    }
    anyhow::ensure!(
        meta.get("payload_sha256") == Some(&format!("{:x}", payload.finalize())),
        "the tensor bytes do not match their recorded sha256"
    );
    let v = out.pop().expect("three");
    let k = out.pop().expect("three");
    let q = out.pop().expect("three");
    Ok((q, k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qkv(dtype: DType) -> (Tensor, Tensor, Tensor) {
        let dev = Device::Cpu;
        let t = |s: f64, shape: (usize, usize, usize)| {
            let n = shape.0 * shape.1 * shape.2;
            Tensor::from_vec(
                (0..n).map(|i| (i as f64 * s).sin()).collect::<Vec<_>>(),
                shape,
                &dev,
            )
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
        };
        (t(0.37, (4, 8, 2)), t(1.1, (2, 8, 2)), t(-0.2, (2, 8, 2)))
    }

    fn same(a: &Tensor, b: &Tensor) -> bool {
        a.dtype() == b.dtype()
            && a.dims() == b.dims()
            && a.to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                == b.to_dtype(DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap()
    }

    #[test]
    fn entries_round_trip_bit_for_bit_and_a_bad_entry_is_recomputed() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.txt");
        std::fs::write(&corpus, "a b c\n").unwrap();
        let files = vec![("corpus".to_string(), corpus.clone())];
        let inputs = crate::config::InputConfig::new(&Default::default()).unwrap();
        for dtype in [DType::F32, DType::F64] {
            let cache =
                QkvCache::open(&dir.path().join(format!("{dtype:?}")), &inputs, &files).unwrap();
            let want = qkv(dtype);
            let mut calls = 0;
            let mut get = |n, w| {
                cache
                    .get_or_compute(n, w, &Device::Cpu, || {
                        calls += 1;
                        Ok(want.clone())
                    })
                    .unwrap()
            };
            let first = get(8, 0);
            let again = get(8, 0);
            let other = get(8, 1);
            assert_eq!(calls, 2, "window 0 computed once, window 1 once");
            for (a, b) in [(&first, &again), (&again, &want), (&other, &want)] {
                assert!(same(&a.0, &b.0) && same(&a.1, &b.1) && same(&a.2, &b.2));
            }
            assert_eq!((cache.usage().hits, cache.usage().misses), (1, 2));
            // A flipped byte in the tensor data fails verification: recomputed and replaced.
            let path = cache.path_of(&cache.key(8, 0));
            let mut bytes = std::fs::read(&path).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            let mut recomputed = false;
            let back = cache
                .get_or_compute(8, 0, &Device::Cpu, || {
                    recomputed = true;
                    Ok(want.clone())
                })
                .unwrap();
            assert!(recomputed && same(&back.0, &want.0));
            assert_eq!(cache.usage().rejected, 1);
            assert!(
                read_entry(&path, &cache.key(8, 0), &Device::Cpu).is_ok(),
                "replaced"
            );
        }
        // Another corpus is another key.
        let a = QkvCache::open(dir.path(), &inputs, &files).unwrap();
        std::fs::write(&corpus, "a b d\n").unwrap();
        let b = QkvCache::open(dir.path(), &inputs, &files).unwrap();
        assert_ne!(a.key(8, 0), b.key(8, 0));
    }

    #[test]
    fn the_cap_removes_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.txt");
        std::fs::write(&corpus, "a\n").unwrap();
        let inputs = crate::config::InputConfig::new(&Default::default()).unwrap();
        let cache =
            QkvCache::open(&dir.path().join("q"), &inputs, &[("corpus".into(), corpus)]).unwrap();
        for w in 0..3 {
            write_entry(
                &cache.path_of(&cache.key(8, w)),
                &cache.key(8, w),
                &qkv(DType::F32),
            )
            .unwrap();
            let t =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + w as u64);
            std::fs::File::options()
                .append(true)
                .open(cache.path_of(&cache.key(8, w)))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        let one = std::fs::metadata(cache.path_of(&cache.key(8, 0)))
            .unwrap()
            .len();
        cache.trim_to(2 * one).unwrap();
        assert!(!cache.path_of(&cache.key(8, 0)).exists(), "the oldest went");
        assert!(
            cache.path_of(&cache.key(8, 1)).exists() && cache.path_of(&cache.key(8, 2)).exists()
        );
    }
}
