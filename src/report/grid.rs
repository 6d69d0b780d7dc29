//! The trial grid of a run, which rows found on disk are checked against: a resume (the sweep)
//! and `merge` keep only rows that are trials of the run, so that a stray row (another run's,
//! an edited one) can neither take a real trial's place nor leave one silently missing.

use std::path::Path;

use anyhow::Result;

use crate::config::{RunConfig, Shard};
use crate::report::trials::TrialRow;
use crate::usage;

/// The trials of a run: its configuration, model name, heads and shard.
pub struct Grid<'a> {
    pub cfg: &'a RunConfig,
    pub model: &'a str,
    /// The heads measured: `--heads`, or every head of the model.
    pub heads: &'a [usize],
    pub shard: Option<Shard>,
    /// The layer's sliding window, which ends the d grid ([`crate::attention::layer_budgets`]).
    pub sliding_window: Option<usize>,
}

impl Grid<'_> {
    /// Why `r` is not a trial of this run, if it is not.
    pub fn outside(&self, r: &TrialRow) -> Option<String> {
        let cfg = self.cfg;
        let li = cfg.lengths.iter().position(|&n| n == r.n);
        Some(if r.model != self.model {
            format!("model {} (this run: {})", r.model, self.model)
        } else if r.layer != cfg.inputs.layer {
            format!("layer {} (this run: {})", r.layer, cfg.inputs.layer)
        } else if li.is_none() {
            format!("n = {} (not in --lengths)", r.n)
        } else if r.window >= cfg.windows {
            format!("window {} (--windows {})", r.window, cfg.windows)
        } else if self
            .shard
            .is_some_and(|s| !s.takes(li.unwrap_or(0) * cfg.windows + r.window))
        {
            format!("n = {}, window {} (not in this shard)", r.n, r.window)
        } else if !self.heads.contains(&r.head) {
            match cfg.heads {
                Some(_) => format!("head {} (not in --heads)", r.head),
                None => format!("head {} (the model has {} heads)", r.head, self.heads.len()),
            }
        } else if !cfg.methods.contains(&r.method) {
            format!("method {} (not in --methods)", r.method)
        } else if !crate::attention::layer_budgets(&r.method, &cfg.features, self.sliding_window)
            .contains(&r.d)
        {
            match self.sliding_window {
                Some(w) => format!(
                    "{} at d = {} (not in --features, which stop at the first d ≥ the layer's window {w})",
                    r.method, r.d
                ),
                None => format!("{} at d = {} (not in --features)", r.method, r.d),
            }
        } else if r.target != cfg.target || r.mask != cfg.mask {
            format!("target {:?}, mask {:?}", r.target, r.mask)
        } else {
            return self.contradiction(r);
        })
    }

    /// What a row of this grid says that no trial can (issue 44: an edited or corrupted row
    /// otherwise passes for a measurement): a seed other than the trial's own, or a negative
    /// error.
    fn contradiction(&self, r: &TrialRow) -> Option<String> {
        let seed = crate::numerics::sampling::TrialKey {
            seed: self.cfg.seed,
            n: r.n,
            window: r.window,
            head: r.head,
            method: &r.method,
            d: r.d,
        }
        .derive_seed();
        let negative = [
            ("error", r.error),
            ("rel_error", r.rel_error),
            ("frob_error", r.frob_error),
        ]
        .into_iter()
        .find(|(_, x)| *x < 0.0);
        if r.seed != seed {
            Some(format!(
                "seed {} (this trial's seed under --seed {} is {seed})",
                r.seed, self.cfg.seed
            ))
        } else {
            negative.map(|(name, x)| format!("{name} {x} (an error is at least 0)"))
        }
    }

    /// The first row of `path` outside the grid, as a usage error naming it, followed by
    /// `advice` (what the caller's user can do).
    pub fn check(&self, rows: &[TrialRow], path: &Path, advice: &str) -> Result<()> {
        for (i, r) in rows.iter().enumerate() {
            if let Some(why) = self.outside(r) {
                return Err(usage!(
                    "{}: row {} is not a trial of this run: {why}; {advice}",
                    path.display(),
                    i + 2
                ));
            }
        }
        Ok(())
    }
}
