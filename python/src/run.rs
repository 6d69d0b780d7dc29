//! The options of `inputs` and `sweep`: Python keyword arguments (the CLI's long flags with
//! underscores, same meanings) → the library's [`InputOptions`] / [`RunOptions`]. Values are
//! parsed by the library's own `FromStr` of each choice, so errors read as the CLI's do.

use std::path::PathBuf;
use std::str::FromStr;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use approx_bench::config::{InputOptions, RunOptions};

fn bad(key: &str, e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{key}: {e}"))
}

fn choice<T: FromStr>(key: &str, v: &Bound<'_, PyAny>) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    let s: String = v.extract().map_err(|_| bad(key, "expected a string"))?;
    s.parse().map_err(|e| bad(key, e))
}

fn list(key: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(s) = v.extract::<String>() {
        return Ok(s.split(',').map(|x| x.trim().to_string()).collect());
    }
    let items: Vec<Bound<'_, PyAny>> = v
        .try_iter()
        .map_err(|_| bad(key, "expected a list"))?
        .collect::<PyResult<_>>()?;
    items.iter().map(|x| Ok(x.str()?.to_string())).collect()
}

/// Reads the input keywords out of `kw` (removing them), onto the library's defaults.
pub fn input_options(kw: &Bound<'_, PyDict>) -> PyResult<InputOptions> {
    let mut o = InputOptions::default();
    let take = |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        let v = kw.get_item(key)?;
        if v.is_some() {
            kw.del_item(key)?;
        }
        Ok(v.filter(|v| !v.is_none()))
    };
    if let Some(v) = take("model")? {
        o.model = choice("model", &v)?;
    }
    if let Some(v) = take("model_id")? {
        o.model_id = v.extract()?;
    }
    if let Some(v) = take("revision")? {
        o.revision = v.extract()?;
    }
    if let Some(v) = take("model_dir")? {
        o.model_dir = Some(PathBuf::from(v.str()?.to_string()));
    }
    if let Some(v) = take("model_seed")? {
        o.model_seed = v.extract()?;
    }
    if let Some(v) = take("init")? {
        o.init = choice("init", &v)?;
    }
    if let Some(v) = take("embedding_dropout")? {
        o.embedding_dropout = v.extract()?;
    }
    if let Some(v) = take("embeddings_from")? {
        o.embeddings_from = Some(choice("embeddings_from", &v)?);
    }
    if let Some(v) = take("embedding")? {
        o.embedding = choice("embedding", &v)?;
    }
    if let Some(v) = take("layer")? {
        o.layer = v.extract()?;
    }
    if let Some(v) = take("corpus")? {
        o.corpus = Some(PathBuf::from(v.str()?.to_string()));
    }
    if let Some(v) = take("split")? {
        o.split = v.extract()?;
    }
    if let Some(v) = take("device")? {
        o.device = v.extract()?;
    }
    if let Some(v) = take("dtype")? {
        o.dtype = choice("dtype", &v)?;
    }
    Ok(o)
}

/// Reads the sweep keywords (and the input ones) out of `kw`; anything left is an error.
pub fn run_options(kw: &Bound<'_, PyDict>, methods: Vec<String>) -> PyResult<RunOptions> {
    let inputs = input_options(kw)?;
    let take = |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        let v = kw.get_item(key)?;
        if v.is_some() {
            kw.del_item(key)?;
        }
        Ok(v.filter(|v| !v.is_none()))
    };
    let mut o = RunOptions {
        inputs,
        methods: Some(methods),
        ..RunOptions::default()
    };
    if let Some(v) = take("target")? {
        o.target = choice("target", &v)?;
    }
    if let Some(v) = take("mask")? {
        o.mask = Some(choice("mask", &v)?);
    }
    if let Some(v) = take("figure")? {
        o.figure = Some(choice("figure", &v)?);
    }
    if let Some(v) = take("lengths")? {
        o.lengths = Some(list("lengths", &v)?);
    }
    if let Some(v) = take("features")? {
        o.features = Some(list("features", &v)?);
    }
    if let Some(v) = take("windows")? {
        o.windows = v.extract()?;
    }
    if let Some(v) = take("heads")? {
        o.heads = Some(v.extract()?);
    }
    if let Some(v) = take("seed")? {
        o.seed = v.extract()?;
    }
    if let Some(v) = take("decode")? {
        o.decode = Some(v.extract()?);
    }
    reject_leftovers(kw)?;
    Ok(o)
}

/// `qkv_cache` (the CLI's `--qkv-cache`: a directory, or "off"), removed from `kw`; absent or
/// None: the default (decoders only, in the user's cache directory).
pub fn qkv_cache(
    kw: &Bound<'_, PyDict>,
) -> PyResult<approx_bench::inputs::qkv_cache::CacheSetting> {
    use approx_bench::inputs::qkv_cache::CacheSetting;
    let Some(v) = kw.get_item("qkv_cache")? else {
        return Ok(CacheSetting::Default);
    };
    kw.del_item("qkv_cache")?;
    if v.is_none() {
        return Ok(CacheSetting::Default);
    }
    Ok(CacheSetting::parse(&v.str()?.to_string()))
}

pub fn reject_leftovers(kw: &Bound<'_, PyDict>) -> PyResult<()> {
    if let Some((k, _)) = kw.iter().next() {
        return Err(PyValueError::new_err(format!(
            "unknown option {k}: the options are the CLI's long flags with underscores (see approx-bench --help)"
        )));
    }
    Ok(())
}
