//! Tests of the check on real computations: seeded Q/K/V → a method's output → ‖O − Ô‖₂ per
//! trial → TrialRows → summary → check.

use candle_core::Tensor;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::*;
use crate::attention::{vmean::VMean, HeadInputs, Method};
use crate::config::{Dtype, EmbeddingPolicy, InputConfig, ModelKind, RunConfig};
use crate::numerics::sampling::{self, TrialKey, TrialRng};
use crate::numerics::spectral;
use crate::report::manifest::{InputFile, Manifest};
use crate::report::summary;
use crate::tensor_util::test_device;

const P: usize = 8;

/// The trial grid of a test run.
struct Grid {
    ns: Vec<usize>,
    ds: Vec<usize>,
    windows: usize,
    heads: usize,
}

fn small_grid() -> Grid {
    Grid {
        ns: vec![16, 24],
        ds: vec![2, 4],
        windows: 4,
        heads: 3,
    }
}

/// One head's seeded Q/K/V, the same in every run (the "corpus"): Q, K ~ N(0, 0.25) (logits of
/// std 0.25, attention moderately far from uniform), V ~ N(2, 1).
fn head(n: usize, window: usize, head: usize) -> HeadInputs {
    let mut rng = TrialRng::seed_from_u64(sampling::derive_labeled_seed(
        2024,
        &format!("data/{n}/{window}/{head}"),
    ));
    let mut draw = |shift: f64| {
        let v: Vec<f64> = (0..n * P)
            .map(|_| {
                let x: f64 = StandardNormal.sample(&mut rng);
                shift + x
            })
            .collect();
        Tensor::from_vec(v, (n, P), &test_device()).unwrap()
    };
    let (q, k, v) = (
        (draw(0.0) * 0.5).unwrap(),
        (draw(0.0) * 0.5).unwrap(),
        draw(2.0),
    );
    HeadInputs::new(q, k, v).unwrap()
}

type Approx<'a> = &'a dyn Fn(&HeadInputs, usize, &mut TrialRng) -> Tensor;

/// Runs `f` as method `method` over the grid with run seed `seed`, as the sweep does.
fn trials(method: &str, seed: u64, grid: &Grid, f: Approx) -> Vec<TrialRow> {
    let mut rows = Vec::new();
    for &n in &grid.ns {
        for w in 0..grid.windows {
            for h in 0..grid.heads {
                let head = head(n, w, h);
                for &d in &grid.ds {
                    let key = TrialKey {
                        seed,
                        n,
                        window: w,
                        head: h,
                        method,
                        d,
                    };
                    let out = f(&head, d, &mut key.rng());
                    let norms = spectral::error_norms(&head.exact().unwrap().output, &out).unwrap();
                    let exact_norm = head.exact().unwrap().norm().unwrap();
                    rows.push(TrialRow {
                        model: "initialized".into(),
                        model_id: "test".into(),
                        layer: 0,
                        n,
                        window: w,
                        head: h,
                        method: method.into(),
                        d,
                        seed: key.derive_seed(),
                        error: norms.spectral,
                        rel_error: norms.spectral / exact_norm,
                        frob_error: norms.frobenius,
                        exact_norm,
                        nonfinite_rows: 0,
                        macs: 0.0,
                        seconds: 0.0,
                        target: Default::default(),
                        mask: Default::default(),
                        kv_head: Some(h),
                        mass: None,
                        keys: None,
                        ..TrialRow::default()
                    });
                }
            }
        }
    }
    rows
}

fn vmean(h: &HeadInputs, d: usize, rng: &mut TrialRng) -> Tensor {
    VMean.approximate(h, d, rng).unwrap().output
}

/// Test-only broken V-Mean: the right output scaled by 1.03.
fn vmean_biased(h: &HeadInputs, d: usize, rng: &mut TrialRng) -> Tensor {
    (vmean(h, d, rng) * 1.03).unwrap()
}

/// Test-only random method: every row is the mean of d rows of V drawn uniformly with
/// replacement (a random V-Mean whose error varies with the seed).
fn subset_vmean(h: &HeadInputs, d: usize, rng: &mut TrialRng) -> Tensor {
    let idx: Vec<u32> = sampling::uniform_with_replacement(rng, h.n(), d)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    let idx = Tensor::from_vec(idx, d, &test_device()).unwrap();
    h.v.index_select(&idx, 0)
        .unwrap()
        .mean_keepdim(0)
        .unwrap()
        .broadcast_as(h.v.shape())
        .unwrap()
        .contiguous()
        .unwrap()
}

fn manifest(grid: &Grid, methods: &[&str], corpus_sha: &str, source: &str) -> Manifest {
    Manifest {
        tool: "approx-bench".into(),
        version: "0.1.0".into(),
        dependencies: String::new(),
        build: String::new(),
        command: vec![],
        config: RunConfig {
            target: Default::default(),
            mask: Default::default(),
            inputs: InputConfig {
                model: ModelKind::Initialized,
                embeddings_from: ModelKind::Initialized,
                model_source: source.into(),
                model_seed: 1,
                embedding: EmbeddingPolicy::WordPos,
                layer: 0,
                corpus: "file:/data/corpus.txt".into(),
                device: "cpu".into(),
                dtype: Dtype::F64,
                init: Default::default(),
                embedding_dropout: 0.0,
            },
            lengths: grid.ns.clone(),
            features: grid.ds.clone(),
            methods: methods.iter().map(|s| s.to_string()).collect(),
            windows: grid.windows,
            heads: None,
            seed: 0,
            user_methods: Default::default(),
            decode: None,
        },
        model_id: "test".into(),
        heads: grid.heads,
        head_dim: P,
        corpus_tokens: 1000,
        inputs: vec![InputFile {
            role: "corpus".into(),
            path: "/data/corpus.txt".into(),
            sha256: corpus_sha.into(),
            bytes: 10,
        }],
        started: String::new(),
        finished: None,
        status: "complete".into(),
        trials: 0,
        threads: 1,
        features_cuda: false,
        shard: None,
        merged_from: Vec::new(),
        qkv_cache: None,
        decode: None,
        sliding_window: None,
        memory: None,
    }
}

fn side(label: &str, rows: Vec<TrialRow>) -> RunData {
    RunData::from_parts(label, summary::summarize(&rows, &[]), Some(rows), None)
}

fn summary_only(label: &str, rows: &[TrialRow]) -> RunData {
    RunData::from_parts(label, summary::summarize(rows, &[]), None, None)
}

#[test]
fn a_biased_method_is_caught_and_an_unbiased_copy_passes() {
    let grid = small_grid();
    let base = side("base", trials("vmean", 0, &grid, &vmean));
    let broken = side("broken", trials("vmean", 0, &grid, &vmean_biased));
    let r = check(&base, &broken, &CheckOptions::default()).unwrap();
    assert_eq!(r.exit_code(), 1, "{}", render::table(&r));
    assert_eq!(r.compared, 4);
    assert_eq!(r.points.len(), 4);
    for p in &r.points {
        assert_eq!(p.status, Status::Regression, "{p:?}");
        assert!(p.failing);
        assert_eq!(p.method, "vmean");
        assert_eq!(p.test, Test::Paired { pairs: 12 });
        let (b, c) = (p.baseline.unwrap(), p.current.unwrap());
        assert!((p.bound - (p.critical * p.se + 0.01 * b.mean)).abs() < 1e-12 * b.mean);
        assert!(p.difference > p.bound && (p.difference - (c.mean - b.mean)).abs() < 1e-12);
    }
    let table = render::table(&r);
    let worst = &r.points[0];
    let (b, c) = (worst.baseline.unwrap(), worst.current.unwrap());
    let first_row = table.lines().find(|l| l.starts_with("REGRESSION")).unwrap();
    for needle in [
        "vmean".to_string(),
        format!(" {} ", worst.n),
        format!(" {} ", worst.d),
        render::num(b.mean),
        render::num(c.mean),
        render::num(worst.bound),
        "paired k=12".to_string(),
    ] {
        assert!(
            first_row.contains(&needle),
            "«{needle}» not in «{first_row}»"
        );
    }
    assert!(table.contains("FAIL (exit 1): 4 regression"), "{table}");
    assert!(render::markdown(&r).contains("| **REGRESSION** | initialized |"));

    // An unbiased copy, computed again from scratch, passes.
    let copy = side("copy", trials("vmean", 0, &grid, &vmean));
    let r = check(&base, &copy, &CheckOptions::default()).unwrap();
    assert_eq!(r.exit_code(), 0, "{}", render::table(&r));
    // V-Mean is deterministic: the paired SE is 0 and the 1 % slack alone is the bound.
    for p in &r.points {
        assert_eq!((p.status, p.difference, p.se), (Status::Pass, 0.0, 0.0));
        assert_eq!(p.bound, 0.01 * p.baseline.unwrap().mean);
    }
}

#[test]
fn the_paired_test_sees_a_small_bias_the_unpaired_test_cannot() {
    // Every trial's error 0.5 % larger (Ô + 0.005·(Ô − O)), with 0.1 % slack: far below the
    // spread of the error between windows and heads, so only the paired test can see it; on the
    // summaries alone it is noise.
    let grid = small_grid();
    let rows_b = trials("vmean", 0, &grid, &vmean);
    let rows_c = trials("vmean", 0, &grid, &|h, d, r| {
        let o = vmean(h, d, r);
        (&o + ((&o - &h.exact().unwrap().output).unwrap() * 0.005).unwrap()).unwrap()
    });
    let opts = CheckOptions {
        slack: 0.001,
        ..Default::default()
    };
    let paired = check(
        &side("b", rows_b.clone()),
        &side("c", rows_c.clone()),
        &opts,
    )
    .unwrap();
    assert_eq!(
        paired.count(Status::Regression),
        4,
        "{}",
        render::table(&paired)
    );
    let unpaired = check(
        &summary_only("b", &rows_b),
        &summary_only("c", &rows_c),
        &opts,
    )
    .unwrap();
    assert_eq!(unpaired.exit_code(), 0, "{}", render::table(&unpaired));
    assert!(unpaired.points.iter().all(|p| p.test == Test::Unpaired));
}

/// Runs `runs` current runs with seeds 1..=runs against the baseline (seed 0) and counts failures.
fn failing_runs(runs: u64, opts: &CheckOptions, paired: bool, f: Approx) -> usize {
    let grid = Grid {
        ns: vec![16, 24],
        ds: vec![2, 4],
        windows: 6,
        heads: 4,
    };
    let base_rows = trials("subset_vmean", 0, &grid, f);
    let base = if paired {
        side("base", base_rows)
    } else {
        summary_only("base", &base_rows)
    };
    let mut fails = 0;
    for seed in 1..=runs {
        let rows = trials("subset_vmean", seed, &grid, f);
        let cur = if paired {
            side("cur", rows)
        } else {
            summary_only("cur", &rows)
        };
        let r = check(&base, &cur, opts).unwrap();
        assert_eq!(r.compared, 4);
        fails += r.exit_code() as usize;
    }
    fails
}

#[test]
fn honest_noise_of_a_random_method_passes_at_the_nominal_rate() {
    let runs = 20;
    let allowed = (0.05 * runs as f64).ceil() as usize;
    // The defaults, and the strictest setting: no slack (the noise bound alone) and two-sided.
    for opts in [
        CheckOptions::default(),
        CheckOptions {
            slack: 0.0,
            two_sided: true,
            ..Default::default()
        },
    ] {
        for paired in [true, false] {
            let fails = failing_runs(runs, &opts, paired, &subset_vmean);
            assert!(fails <= allowed, "{opts:?}, paired = {paired}: {fails} of {runs} honest runs failed (allowed {allowed})");
        }
    }
    // The same test has power: the random method made 50 % worse fails every run.
    let worse = |h: &HeadInputs, d: usize, r: &mut TrialRng| {
        let o = subset_vmean(h, d, r);
        // Ô + 0.5·(Ô − O): the error grows by exactly 50 % per trial.
        (&o + ((&o - &h.exact().unwrap().output).unwrap() * 0.5).unwrap()).unwrap()
    };
    let grid = Grid {
        ns: vec![16, 24],
        ds: vec![2, 4],
        windows: 6,
        heads: 4,
    };
    let base = side("base", trials("subset_vmean", 0, &grid, &subset_vmean));
    for seed in 1..=5 {
        let cur = side("cur", trials("subset_vmean", seed, &grid, &worse));
        let r = check(&base, &cur, &CheckOptions::default()).unwrap();
        assert!(
            r.count(Status::Regression) >= 1,
            "seed {seed}: {}",
            render::table(&r)
        );
    }
}

#[test]
fn honest_noise_from_a_seeded_distribution_passes_at_the_nominal_rate() {
    // Summary-level noise with unequal trial counts (the unpaired Welch path): 40 independent
    // pairs of runs with log-normal trial errors (40 baseline trials, 12 current ones). The
    // false-positive rate is a probability over both runs, so each pair draws its own baseline;
    // against one fixed baseline the failures of later runs are correlated through it.
    let draw = |seed: u64, k: usize| -> Vec<SummaryRow> {
        let mut rng = TrialRng::seed_from_u64(seed);
        (0..6)
            .map(|i| {
                let errs: Vec<f64> = (0..k)
                    .map(|_| {
                        let x: f64 = StandardNormal.sample(&mut rng);
                        (0.3 * x).exp() * (1.0 + i as f64)
                    })
                    .collect();
                let (mean, stderr) = crate::report::summary::mean_stderr(&errs);
                SummaryRow {
                    model: "initialized".into(),
                    n: 512,
                    method: format!("m{i}"),
                    d: 16,
                    trials: k,
                    mean,
                    stderr,
                    median: crate::report::summary::median(&errs),
                    rel_mean: 0.0,
                    rel_stderr: 0.0,
                    nonfinite_trials: 0,
                    flagged_trials: 0,
                    macs: 0.0,
                    seconds_mean: 0.0,
                    target: Default::default(),
                    mask: Default::default(),
                    keys_mean: None,
                    mass_mean: None,
                    cos_sim_mean: None,
                    rel_l1_mean: None,
                    rmse_mean: None,
                    kv_bits: None,
                    kv_read_mean: None,
                    n_f: None,
                    kv_union_mean: None,
                }
            })
            .collect()
    };
    let runs = 40;
    for opts in [
        CheckOptions::default(),
        CheckOptions {
            slack: 0.0,
            ..Default::default()
        },
    ] {
        let fails: i32 = (1..=runs)
            .map(|s| {
                let base = RunData::from_parts("base", draw(2 * s, 40), None, None);
                check(
                    &base,
                    &RunData::from_parts("cur", draw(2 * s + 1, 12), None, None),
                    &opts,
                )
                .unwrap()
                .exit_code()
            })
            .sum();
        assert!(
            fails as f64 <= (opts.alpha * runs as f64).ceil(),
            "{opts:?}: {fails} of {runs} failed"
        );
    }
}

#[test]
fn improvements_are_reported_and_fail_only_when_two_sided() {
    let grid = small_grid();
    let base = side("b", trials("vmean", 0, &grid, &vmean_biased));
    let better = side("c", trials("vmean", 0, &grid, &vmean));
    let r = check(&base, &better, &CheckOptions::default()).unwrap();
    assert_eq!(r.count(Status::Improvement), 4);
    assert_eq!(r.exit_code(), 0);
    let r = check(
        &base,
        &better,
        &CheckOptions {
            two_sided: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn configuration_drift_is_reported_as_such() {
    let grid = small_grid();
    let rows = trials("vmean", 0, &grid, &vmean);
    let sha_a = "a".repeat(64);
    let sha_b = "b".repeat(64);
    let mk = |sha: &str, src: &str| {
        RunData::from_parts(
            "x",
            summary::summarize(&rows, &[]),
            Some(rows.clone()),
            Some(manifest(&grid, &["vmean"], sha, src)),
        )
    };
    let base = mk(&sha_a, "hub:bert-base-cased@main");
    let r = check(
        &base,
        &mk(&sha_b, "hub:bert-base-uncased@main"),
        &CheckOptions::default(),
    )
    .unwrap();
    let msgs: Vec<&str> = r
        .findings
        .iter()
        .filter(|f| f.failing)
        .map(|f| f.message.as_str())
        .collect();
    assert!(
        msgs.contains(&"corpus sha256: aaaaaaaaaaaa… → bbbbbbbbbbbb…"),
        "{msgs:?}"
    );
    assert!(
        msgs.contains(&"model source: hub:bert-base-cased@main → hub:bert-base-uncased@main"),
        "{msgs:?}"
    );
    assert!(r.findings.iter().all(|f| f.kind == "config change"));
    assert_eq!(
        r.exit_code(),
        1,
        "identical numbers, but the configuration changed"
    );
    assert!(
        render::table(&r).contains("CONFIG CHANGE: corpus sha256: aaaaaaaaaaaa… → bbbbbbbbbbbb…")
    );
    // Allowed: still reported, no longer failing.
    let allow = CheckOptions {
        allow_config_change: true,
        ..Default::default()
    };
    let r = check(&base, &mk(&sha_b, "hub:bert-base-uncased@main"), &allow).unwrap();
    assert_eq!(r.exit_code(), 0);
    assert_eq!(r.findings.len(), 2);
    // A moved model directory with identical files is a note, not a change.
    let r = check(
        &mk(&sha_a, "dir:/a/model"),
        &mk(&sha_a, "dir:/b/model"),
        &CheckOptions::default(),
    )
    .unwrap();
    assert_eq!(r.exit_code(), 0);
    assert_eq!(r.findings[0].kind, "note");
    assert!(r.findings[0]
        .message
        .contains("dir:/a/model → dir:/b/model"));
    // Grid and seed changes name the field.
    let mut other = manifest(&grid, &["vmean"], &sha_a, "dir:/a/model");
    other.config.seed = 3;
    other.config.features = vec![4, 2, 8];
    let changes: Vec<String> =
        drift::compare(&manifest(&grid, &["vmean"], &sha_a, "dir:/a/model"), &other)
            .iter()
            .map(|c| c.to_string())
            .collect();
    assert_eq!(changes, vec!["seed: 0 → 3", "features: 2,4 → 2,4,8"]);
    // Without manifests, the configuration is said to be unchecked.
    let r = check(
        &side("b", rows.clone()),
        &side("c", rows.clone()),
        &CheckOptions::default(),
    )
    .unwrap();
    assert!(r.findings[0]
        .message
        .starts_with("configuration not compared: no manifest.json for b and c"));
    assert_eq!(r.exit_code(), 0);
}

#[test]
fn missing_points_on_either_side_are_findings() {
    let grid = small_grid();
    let rows = trials("vmean", 0, &grid, &vmean);
    let without = |n: usize, d: usize| {
        rows.iter()
            .filter(|r| !(r.n == n && r.d == d))
            .cloned()
            .collect::<Vec<_>>()
    };
    let r = check(
        &side("b", rows.clone()),
        &side("c", without(24, 4)),
        &CheckOptions::default(),
    )
    .unwrap();
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.points[0].status, Status::Missing);
    assert_eq!((r.points[0].n, r.points[0].d), (24, 4));
    assert!(render::table(&r)
        .lines()
        .any(|l| l.starts_with("MISSING") && l.contains("vmean")));
    let r = check(
        &side("b", without(16, 2)),
        &side("c", rows.clone()),
        &CheckOptions::default(),
    )
    .unwrap();
    assert_eq!(r.exit_code(), 0, "a new point is reported, not failed");
    let new: Vec<&PointResult> = r
        .points
        .iter()
        .filter(|p| p.status == Status::New)
        .collect();
    assert_eq!(new.len(), 1);
    assert_eq!((new[0].n, new[0].d), (16, 2));
}

#[test]
fn new_nonfinite_trials_fail() {
    let grid = small_grid();
    let rows = trials("vmean", 0, &grid, &vmean);
    let mut broken = rows.clone();
    broken[5].error = f64::NAN;
    broken[5].nonfinite_rows = 3;
    let r = check(
        &side("b", rows.clone()),
        &side("c", broken.clone()),
        &CheckOptions::default(),
    )
    .unwrap();
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.points[0].status, Status::NewNonFinite);
    assert_eq!((r.points[0].n, r.points[0].d), (broken[5].n, broken[5].d));
    assert!(r.points[0]
        .notes
        .iter()
        .any(|n| n == "non-finite trials rose from 0 to 1"));
    assert!(r.points[0]
        .notes
        .iter()
        .any(|n| n.contains("flagged rows") && n.ends_with("rose from 0 to 1")));
    assert!(render::table(&r)
        .lines()
        .any(|l| l.starts_with("NONFINITE")));
    // Still compared on the finite pairs.
    assert_eq!(r.points[0].test, Test::Paired { pairs: 11 });
    // The other way round it is only a note.
    let r = check(
        &side("b", broken),
        &side("c", rows),
        &CheckOptions::default(),
    )
    .unwrap();
    assert_eq!(r.exit_code(), 0, "{}", render::table(&r));
}

#[test]
fn an_edited_summary_is_not_replaced_by_its_trials() {
    let grid = small_grid();
    let rows = trials("vmean", 0, &grid, &vmean);
    let mut base = side("b", rows.clone());
    base.summary[0].mean *= 0.5;
    let r = check(&base, &side("c", rows), &CheckOptions::default()).unwrap();
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.points[0].status, Status::Regression);
    assert_eq!(r.points[0].test, Test::Unpaired);
    assert!(r
        .findings
        .iter()
        .any(|f| f.kind == "warning" && f.message.contains("does not reproduce")));
}

#[test]
fn exact_mode_passes_identical_trials_and_fails_on_a_1e9_change() {
    let grid = small_grid();
    let rows = trials("subset_vmean", 7, &grid, &subset_vmean);
    let again = trials("subset_vmean", 7, &grid, &subset_vmean);
    let opts = CheckOptions {
        exact: true,
        ..Default::default()
    };
    let r = check(&side("b", rows.clone()), &side("c", again.clone()), &opts).unwrap();
    assert_eq!(r.exit_code(), 0, "{}", render::table(&r));
    assert_eq!(r.worst_trial.as_ref().unwrap().rel, 0.0);
    let mut tiny = again.clone();
    tiny[3].error *= 1.0 + 1e-14;
    assert_eq!(
        check(&side("b", rows.clone()), &side("c", tiny), &opts)
            .unwrap()
            .exit_code(),
        0
    );
    let mut changed = again;
    changed[9].error *= 1.0 + 1e-9;
    let r = check(&side("b", rows.clone()), &side("c", changed.clone()), &opts).unwrap();
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.count(Status::ExactMismatch), 1);
    let w = r.worst_trial.as_ref().unwrap();
    assert_eq!(
        (w.window, w.head, w.point.1, w.point.3),
        (
            changed[9].window,
            changed[9].head,
            changed[9].n,
            changed[9].d
        )
    );
    assert!((w.rel - 1e-9).abs() < 1e-12);
    assert!(render::table(&r).contains(&format!(
        "worst trial: initialized n={} subset_vmean d={}",
        changed[9].n, changed[9].d
    )));
    // The statistical check would have passed it.
    assert_eq!(
        check(
            &side("b", rows.clone()),
            &side("c", changed),
            &CheckOptions::default()
        )
        .unwrap()
        .exit_code(),
        0
    );
    // Without trials, --exact is a usage error.
    let e = check(
        &summary_only("b.csv", &rows),
        &side("c", rows.clone()),
        &opts,
    )
    .unwrap_err();
    assert!(
        e.downcast_ref::<crate::UsageError>().is_some()
            && e.to_string().contains("b.csv has no trials.csv"),
        "{e}"
    );
}

#[test]
fn malformed_or_empty_inputs_are_usage_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("summary.csv");
    std::fs::write(
        &bad,
        "model,n,method,d,trials,mean\ninitialized,16,vmean,4,8,notanumber\n",
    )
    .unwrap();
    let e = load(&bad, "--baseline").unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    assert!(e.to_string().contains(&bad.display().to_string()), "{e}");
    // A directory with a malformed summary names the file inside it.
    let e = load(dir.path(), "--baseline").unwrap_err();
    assert!(
        e.downcast_ref::<crate::UsageError>().is_some() && e.to_string().contains("summary.csv"),
        "{e}"
    );
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let e = load(&empty, "--current").unwrap_err();
    assert!(
        e.downcast_ref::<crate::UsageError>().is_some() && e.to_string().contains("no data rows"),
        "{e}"
    );
    let e = load(&dir.path().join("nope"), "--baseline").unwrap_err();
    assert!(e.to_string().contains("no such file or directory"), "{e}");
    let e = load(&dir.path().join("sub"), "--baseline").unwrap_err();
    assert!(e.to_string().contains("no such file"), "{e}");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let e = load(&dir.path().join("sub"), "--baseline").unwrap_err();
    assert!(
        e.to_string().contains("neither summary.csv nor trials.csv"),
        "{e}"
    );
    std::fs::write(dir.path().join("sub/summary.csv"), "x\n1\n").unwrap();
    std::fs::write(dir.path().join("sub/manifest.json"), "{").unwrap();
    let e = load(&dir.path().join("sub"), "--baseline").unwrap_err();
    assert!(
        e.downcast_ref::<crate::UsageError>().is_some() && e.to_string().contains("manifest.json"),
        "{e}"
    );
}

#[test]
fn bad_options_are_usage_errors() {
    let grid = small_grid();
    let b = side("b", trials("vmean", 0, &grid, &vmean));
    for opts in [
        CheckOptions {
            alpha: 0.0,
            ..Default::default()
        },
        CheckOptions {
            alpha: 1.0,
            ..Default::default()
        },
        CheckOptions {
            slack: -0.1,
            ..Default::default()
        },
    ] {
        let e = check(&b, &b, &opts).unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some());
    }
}

#[test]
fn bonferroni_critical_value_grows_with_the_number_of_points() {
    // With m points and α = 0.05 the paired critical value is t_{k−1} at α/m.
    let grid = small_grid();
    let rows_b = trials("subset_vmean", 0, &grid, &subset_vmean);
    let rows_c = trials("subset_vmean", 1, &grid, &subset_vmean);
    let r = check(
        &side("b", rows_b),
        &side("c", rows_c),
        &CheckOptions::default(),
    )
    .unwrap();
    for p in &r.points {
        assert_eq!(p.df, 11.0);
        let want = stats::student_t_upper_quantile(0.05 / 4.0, 11.0);
        assert!((p.critical - want).abs() < 1e-12);
        assert!(p.critical > stats::student_t_upper_quantile(0.05, 11.0));
    }
}

#[test]
fn runs_of_different_targets_are_never_compared() {
    let grid = small_grid();
    let base = side("base", trials("vmean", 0, &grid, &vmean));
    let mut rows = trials("vmean", 0, &grid, &vmean);
    for r in &mut rows {
        r.target = crate::attention::Target::Kernelized;
    }
    let other = side("kernelized-run", rows.clone());
    let err = format!(
        "{:#}",
        check(&base, &other, &CheckOptions::default()).unwrap_err()
    );
    assert!(
        err.contains("base measures the softmax target and kernelized-run the kernelized target"),
        "{err}"
    );
    // A directory mixing both targets is refused on load, naming the file.
    let dir = tempfile::tempdir().unwrap();
    let mut mixed = trials("vmean", 0, &grid, &vmean);
    mixed.extend(rows);
    let path = dir.path().join("trials.csv");
    let (mut w, _) = crate::report::trials::TrialWriter::open(&path).unwrap();
    for r in &mixed {
        w.append(r).unwrap();
    }
    let err = format!("{:#}", load::load(dir.path(), "--current").unwrap_err());
    assert!(err.contains("holds points of both targets"), "{err}");
}
