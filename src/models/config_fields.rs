//! Typed reads of a §7.7 family's config.json fields, with usage errors that name the checkpoint
//! and the field (the Llama path has its own reader in `decoder_config`).

use anyhow::Result;
use serde_json::Value;

use crate::usage;

/// config.json of one checkpoint; `what` names it in errors.
pub struct ConfigFields<'a> {
    pub v: &'a Value,
    pub what: &'a str,
}

impl<'a> ConfigFields<'a> {
    pub fn new(v: &'a Value, what: &'a str) -> Self {
        Self { v, what }
    }

    /// The field, None when absent or null.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.v.get(name).filter(|x| !x.is_null())
    }

    pub fn usize_opt(&self, name: &str) -> Result<Option<usize>> {
        self.get(name)
            .map(|x| {
                x.as_u64().map(|u| u as usize).ok_or_else(|| {
                    usage!(
                        "config {}: field \"{name}\" must be a non-negative integer, found {x}",
                        self.what
                    )
                })
            })
            .transpose()
    }

    pub fn usize_req(&self, name: &str) -> Result<usize> {
        self.usize_opt(name)?.ok_or_else(|| self.missing(name))
    }

    /// A required count that must be at least 1.
    pub fn positive(&self, name: &str) -> Result<usize> {
        match self.usize_req(name)? {
            0 => Err(usage!(
                "config {}: field \"{name}\" is 0; it must be at least 1",
                self.what
            )),
            k => Ok(k),
        }
    }

    pub fn f64_opt(&self, name: &str) -> Result<Option<f64>> {
        self.get(name)
            .map(|x| {
                x.as_f64().ok_or_else(|| {
                    usage!(
                        "config {}: field \"{name}\" must be a number, found {x}",
                        self.what
                    )
                })
            })
            .transpose()
    }

    pub fn f64_req(&self, name: &str) -> Result<f64> {
        self.f64_opt(name)?.ok_or_else(|| self.missing(name))
    }

    pub fn bool_opt(&self, name: &str) -> Result<Option<bool>> {
        self.get(name)
            .map(|x| {
                x.as_bool().ok_or_else(|| {
                    usage!(
                        "config {}: field \"{name}\" must be true or false, found {x}",
                        self.what
                    )
                })
            })
            .transpose()
    }

    pub fn str_opt(&self, name: &str) -> Result<Option<&'a str>> {
        self.get(name)
            .map(|x| {
                x.as_str().ok_or_else(|| {
                    usage!(
                        "config {}: field \"{name}\" must be a string, found {x}",
                        self.what
                    )
                })
            })
            .transpose()
    }

    fn missing(&self, name: &str) -> anyhow::Error {
        usage!(
            "config {}: field \"{name}\" is missing; this family's config.json needs it",
            self.what
        )
    }
}
