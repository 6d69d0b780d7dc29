use std::path::Path;

use plotters::prelude::*;

use super::draw::Figure;
use super::*;

fn row(model: &str, n: usize, method: &str, d: usize, mean: f64) -> SummaryRow {
    SummaryRow {
        model: model.into(),
        n,
        method: method.into(),
        d,
        trials: if mean.is_finite() { 6 } else { 0 },
        mean,
        stderr: mean.abs() * 0.03,
        median: mean,
        rel_mean: mean / 10.0,
        rel_stderr: 0.001,
        nonfinite_trials: if mean.is_finite() { 0 } else { 6 },
        flagged_trials: 0,
        macs: (n * d * 64) as f64 * 4.0,
        seconds_mean: 1e-5 * (n * d) as f64 / 64.0,
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
}

const DS: [usize; 6] = [8, 16, 32, 64, 128, 256];
/// Both figures' methods, then two more (a curve beside the papers' and the SVD floor).
fn methods() -> Vec<&'static str> {
    let mut m = crate::config::FIGURE_METHODS.to_vec();
    m.extend(["performer_favor", "svd_optimal"]);
    m
}

/// Two models, n ∈ {512, 1024, 4096}, nine methods; one NaN mean and one point with non-finite trials.
fn synthetic() -> Vec<SummaryRow> {
    let mut rows = vec![];
    for model in ["initialized", "pretrained"] {
        for n in [512, 1024, 4096] {
            for (k, m) in methods().iter().enumerate() {
                for d in DS {
                    let level =
                        (n as f64 / 512.0).sqrt() * if *m == "linformer" { 15.0 } else { 1.5 };
                    let mean = if *m == "svd_optimal" {
                        0.3 / (d as f64).sqrt()
                    } else {
                        level * (1.0 + 0.05 * k as f64) / (d as f64).powf(0.1)
                    };
                    rows.push(row(model, n, m, d, mean));
                }
            }
        }
    }
    for r in rows.iter_mut() {
        if r.model == "initialized" && r.n == 1024 && r.method == "performer_favor" && r.d == 8 {
            *r = row("initialized", 1024, "performer_favor", 8, f64::NAN);
        }
        if r.model == "initialized" && r.n == 1024 && r.method == "performer" && r.d == 16 {
            r.nonfinite_trials = 2;
            r.trials = 4;
        }
    }
    rows
}

fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

fn names(paths: &[std::path::PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn draws_every_figure_with_the_expected_size() {
    let dir = tempfile::tempdir().unwrap();
    let rows = synthetic();
    let run = RunData::new("bert-base-cased", rows.clone());
    let out = dir.path().join("figs");
    let written = draw_all(&[run], &out, Statistic::Mean).unwrap();
    assert_eq!(
        names(&written),
        [
            "skyformer-fig1.png",
            "skeinformer-fig1.png",
            "all-methods-initialized.png",
            "accuracy-cost-initialized.png",
            "all-methods-pretrained.png",
            "accuracy-cost-pretrained.png"
        ]
    );
    // Skyformer: 2 rows × 3 columns (512, 1024, 4096) of 460 px + margins.
    let sky = figs::skyformer(&rows, Statistic::Mean).unwrap();
    assert_eq!((sky.rows(), sky.cols), (2, 3));
    assert_eq!(png_size(&written[0]), sky.size());
    assert_eq!(sky.size().0, 3 * 460 + 2 * draw::MARGIN);
    // Skeinformer: 1 × 4.
    let skein = figs::skeinformer(&rows, Statistic::Mean).unwrap();
    assert_eq!((skein.rows(), skein.cols), (1, 4));
    assert_eq!(png_size(&written[1]), skein.size());
    assert_eq!(skein.size().0, 4 * 460 + 2 * draw::MARGIN);
    // All methods: 3 lengths in 2 columns → 2 rows; accuracy-cost: one row of 2 panels per n.
    let all = figs::all_methods(&rows, "initialized", Statistic::Mean).unwrap();
    assert_eq!((all.rows(), all.cols), (2, 2));
    assert_eq!(png_size(&written[2]), all.size());
    let ac = figs::accuracy_cost(&rows, "initialized", Statistic::Mean).unwrap();
    assert_eq!((ac.rows(), ac.cols), (3, 2));
    assert_eq!(png_size(&written[3]), ac.size());
    for p in &written {
        assert!(
            std::fs::metadata(p).unwrap().len() > 10_000,
            "{} looks empty",
            p.display()
        );
    }
}

#[test]
fn one_row_is_one_panel_height_shorter_than_two() {
    let rows = synthetic();
    let init: Vec<SummaryRow> = rows
        .iter()
        .filter(|r| r.model == "initialized")
        .cloned()
        .collect();
    let both = figs::skyformer(&rows, Statistic::Mean).unwrap();
    let one = figs::skyformer(&init, Statistic::Mean).unwrap();
    assert_eq!(one.rows(), 1);
    assert_eq!(one.size().0, both.size().0);
    assert_eq!(both.size().1 - one.size().1, both.panel_h);
}

#[test]
fn skyformer_panels_follow_the_data() {
    // Only initialized, only n = 1024 and 4096 → one row, those two columns.
    let mut rows = vec![];
    for n in [4096, 1024] {
        for d in DS {
            rows.push(row("initialized", n, "informer", d, 2.0));
        }
    }
    let p = skyformer_panels(&rows);
    assert_eq!(
        p,
        vec![
            ("initialized".to_string(), 1024),
            ("initialized".to_string(), 4096)
        ]
    );
    assert_eq!(
        grid(&p),
        (vec!["initialized".to_string()], vec![1024, 4096])
    );

    // A length that is not in the paper's grid, a method that is not in the figure, and a
    // panel whose only method is all NaN add no panels.
    rows.push(row("pretrained", 300, "skyformer", 16, 1.0));
    rows.push(row("pretrained", 512, "vmean", 16, 1.0));
    rows.push(row("pretrained", 2048, "performer", 16, f64::NAN));
    rows.push(row("pretrained", 2048, "nystromformer", 32, 1.1));
    let p = skyformer_panels(&rows);
    assert_eq!(p.len(), 3);
    assert_eq!(p[2], ("pretrained".to_string(), 2048));
    // The grid keeps rows aligned: the pretrained row gets the 1024/4096 columns as empty cells.
    let (models, ns) = grid(&p);
    assert_eq!(models, ["initialized", "pretrained"]);
    assert_eq!(ns, [1024, 2048, 4096]);
    let f = figs::skyformer(&rows, Statistic::Mean).unwrap();
    let present: Vec<bool> = f.cells.iter().map(Option::is_some).collect();
    assert_eq!(present, [true, false, true, false, true, false]);
    assert_eq!(f.empty_titles[1], "initialized n=2048");
}

#[test]
fn skeinformer_panels_in_paper_order() {
    let mut rows = vec![];
    for (model, n) in [
        ("pretrained", 4096),
        ("initialized", 4096),
        ("pretrained", 1024),
        ("initialized", 1024),
        ("initialized", 2048),
    ] {
        rows.push(row(model, n, "vmean", 64, 2.0));
    }
    let p = skeinformer_panels(&rows);
    let want: Vec<(String, usize)> = [
        ("initialized", 1024),
        ("initialized", 4096),
        ("pretrained", 1024),
        ("pretrained", 4096),
    ]
    .iter()
    .map(|(m, n)| (m.to_string(), *n))
    .collect();
    assert_eq!(p, want);
    // Skyformer's methods are absent: no Skyformer figure.
    assert!(skyformer_panels(&rows).is_empty());
    assert!(figs::skyformer(&rows, Statistic::Mean).is_none());
}

#[test]
fn stand_in_models_are_named_in_titles() {
    assert_eq!(
        model_label("initialized", "bert-base-cased", Some("initialized")),
        "initialized"
    );
    assert_eq!(
        model_label("pretrained", "all-MiniLM-L6-v2", Some("pretrained")),
        "pretrained (all-MiniLM-L6-v2)"
    );
    assert_eq!(
        model_label("initialized", "bert-base-cased", Some("pretrained")),
        "initialized (pretrained embeddings)"
    );
    assert_eq!(
        model_label("initialized", "unknown", None),
        "initialized (model unknown)"
    );

    let rows: Vec<SummaryRow> = DS
        .iter()
        .map(|&d| row("pretrained", 1024, "informer", d, 1.5))
        .collect();
    let mut mini = RunData::new("all-MiniLM-L6-v2", rows.clone());
    mini.embeddings_from = Some("pretrained".into());
    let combined = combine(&[mini, RunData::new("bert-base-cased", rows)]);
    let f = figs::skyformer(&combined, Statistic::Mean).unwrap();
    let titles: Vec<String> = f.cells.iter().flatten().map(|p| p.title.clone()).collect();
    assert_eq!(
        titles,
        ["pretrained n=1024", "pretrained (all-MiniLM-L6-v2) n=1024"]
    );
    assert_eq!(
        slug("pretrained (all-MiniLM-L6-v2)"),
        "pretrained-all-MiniLM-L6-v2"
    );
}

#[test]
fn nan_means_are_skipped_and_nonfinite_points_flagged() {
    let rows = synthetic();
    let f = figs::all_methods(&rows, "initialized", Statistic::Mean).unwrap();
    let p1024 = f.cells[1].as_ref().unwrap();
    assert_eq!(p1024.title, "initialized n=1024");
    assert!(p1024.y.lo > 0.0);
    assert!(
        f.notes
            .iter()
            .any(|n| n
                .contains("Not drawn: Performer (textbook FAVOR+) n=1024 d=8 (no finite trial)")),
        "{:?}",
        f.notes
    );
    assert!(f
        .legend
        .iter()
        .any(|l| matches!(l, draw::LegendItem::Ring(_))));
    let performer = p1024
        .series
        .iter()
        .find(|s| s.style == style::all_methods_style("performer", 0))
        .unwrap();
    assert_eq!(
        performer.points.iter().filter(|q| q.nonfinite > 0).count(),
        1
    );
    // Linear y (Skyformer figure): a NaN mean must not pull the axis down to 0.
    let mut rows: Vec<SummaryRow> = DS
        .iter()
        .map(|&d| row("initialized", 1024, "informer", d, 2.0 + d as f64 / 256.0))
        .collect();
    rows.push(row("initialized", 1024, "skyformer", 16, f64::NAN));
    let sky = figs::skyformer(&rows, Statistic::Mean).unwrap();
    let p = sky.cells[0].as_ref().unwrap();
    assert!(p.y.lo > 1.5, "y axis starts at {}", p.y.lo);
    // A figure without non-finite trials has no ring in its legend.
    assert!(!sky
        .legend
        .iter()
        .any(|l| matches!(l, draw::LegendItem::Ring(_))));
}

#[test]
fn text_renders_with_the_embedded_font() {
    let rows = synthetic();
    let f: Figure = figs::skeinformer(&rows, Statistic::Mean).unwrap();
    let (w, h) = f.size();
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        f.render(&root).unwrap();
        root.present().unwrap();
    }
    // The title band (top 40 px) holds only text: it must have dark pixels.
    let dark = buf[..(w * 40 * 3) as usize]
        .chunks(3)
        .filter(|p| p.iter().all(|&c| c < 100))
        .count();
    assert!(dark > 500, "only {dark} dark pixels in the title band");
}

#[test]
fn load_run_reads_a_dir_or_a_bare_summary() {
    let dir = tempfile::tempdir().unwrap();
    let rows = synthetic();
    summary::write(&dir.path().join("summary.csv"), &rows).unwrap();
    let run = load_run(dir.path()).unwrap();
    assert_eq!(run.model_id, "unknown");
    assert_eq!(run.rows.len(), rows.len());
    assert!(
        run.rows
            .iter()
            .zip(&rows)
            .all(|(a, b)| a.mean.to_bits() == b.mean.to_bits()
                || (a.mean.is_nan() && b.mean.is_nan()))
    );
    let bare = load_run(&dir.path().join("summary.csv")).unwrap();
    assert_eq!(bare.model_id, "unknown");
    let e = load_run(&dir.path().join("nope")).unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some());
    assert!(e.to_string().contains("nope"), "{e}");
    // Only-NaN data draws nothing.
    let nan = vec![row("initialized", 1024, "informer", 16, f64::NAN)];
    assert!(draw_all(
        &[RunData::new("bert-base-cased", nan)],
        &dir.path().join("x"),
        Statistic::Mean
    )
    .unwrap()
    .is_empty());
}

#[test]
fn long_panel_titles_wrap_before_n() {
    super::style::ensure_font().unwrap();
    let (px, lines) = draw::title_lines("initialized n=1024", 460);
    assert_eq!((px, lines.len()), (20, 1));
    let long = "initialized (all-MiniLM-L6-v2; pretrained embeddings) n=1024";
    let (_, lines) = draw::title_lines(long, 460);
    assert_eq!(
        lines,
        [
            "initialized (all-MiniLM-L6-v2; pretrained embeddings)",
            "n=1024"
        ]
    );
    // A figure with such a title is taller by the second title line, never clipped.
    let rows: Vec<SummaryRow> = DS
        .iter()
        .map(|&d| row("initialized", 1024, "informer", d, 2.0))
        .collect();
    let short = figs::skyformer(&rows, Statistic::Mean).unwrap();
    let mut run = RunData::new("all-MiniLM-L6-v2", rows);
    run.embeddings_from = Some("pretrained".into());
    let wrapped = figs::skyformer(&combine(&[run]), Statistic::Mean).unwrap();
    assert_eq!(wrapped.cells[0].as_ref().unwrap().title, long);
    assert_eq!(wrapped.size().0, short.size().0);
    let _ = (short, wrapped);
}

#[test]
fn median_figures_plot_the_median_column_without_bars_beside_the_mean_ones() {
    let rows: Vec<SummaryRow> = synthetic()
        .into_iter()
        .map(|r| SummaryRow {
            median: r.mean * 0.5,
            ..r
        })
        .collect();
    let med = Statistic::Median.apply(rows.clone());
    assert!(med
        .iter()
        .zip(&rows)
        .all(|(m, r)| m.mean.to_bits() == r.median.to_bits() && m.stderr.is_nan() && m.d == r.d));
    let f = figs::skyformer(&med, Statistic::Median).unwrap();
    assert!(
        f.notes[0].starts_with("Median (no error bars) over"),
        "{}",
        f.notes[0]
    );
    let dir = tempfile::tempdir().unwrap();
    let run = RunData::new("bert-base-cased", rows);
    let written = draw_all(&[run], dir.path(), Statistic::Median).unwrap();
    assert!(!written.is_empty());
    assert!(written.iter().all(|p| p
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .ends_with("-median")));
    // Summaries from before the median column (NaN medians) have nothing to draw.
    let old: Vec<SummaryRow> = synthetic()
        .into_iter()
        .map(|r| SummaryRow {
            median: f64::NAN,
            ..r
        })
        .collect();
    let none = draw_all(
        &[RunData::new("bert-base-cased", old)],
        &dir.path().join("old"),
        Statistic::Median,
    )
    .unwrap();
    assert!(none.is_empty());
}

/// A field run (a sparse method among the softmax rows) gets `field.png`; a kernelized run gets
/// `kernelized.png` and none of the softmax figures; neither figure appears without its rows.
#[test]
fn field_and_kernelized_figures_follow_the_rows_targets() {
    let dir = tempfile::tempdir().unwrap();
    let names = |written: &[std::path::PathBuf]| -> Vec<String> {
        written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    let plain = names(
        &draw_all(
            &[RunData::new("bert-base-cased", synthetic())],
            dir.path(),
            Statistic::Mean,
        )
        .unwrap(),
    );
    assert!(
        !plain
            .iter()
            .any(|n| n == "field.png" || n == "kernelized.png"),
        "{plain:?}"
    );

    let mut field_rows = synthetic();
    for model in ["initialized", "pretrained"] {
        for n in [1024, 4096] {
            for d in DS {
                field_rows.push(row(model, n, "window", d, 2.0));
                field_rows.push(row(model, n, "topk", d, 1.0));
            }
        }
    }
    let out = dir.path().join("field");
    let written = names(
        &draw_all(
            &[RunData::new("bert-base-cased", field_rows)],
            &out,
            Statistic::Mean,
        )
        .unwrap(),
    );
    assert!(written.contains(&"field.png".to_string()), "{written:?}");
    // Two models × (n = 1024, 4096, accuracy–cost) panels.
    let (w, h) = png_size(&out.join("field.png"));
    assert!(w > 3 * 600 && h > 2 * 500, "{w}×{h}");

    let kern: Vec<SummaryRow> = ["zero", "skyformer_gauss", "rff_gauss", "exact_kernelized"]
        .iter()
        .flat_map(|m| {
            DS.map(|d| SummaryRow {
                target: crate::attention::Target::Kernelized,
                ..row("initialized", 1024, m, d, 3.0)
            })
        })
        .collect();
    let out = dir.path().join("kern");
    let written = names(
        &draw_all(
            &[RunData::new("bert-base-cased", kern.clone())],
            &out,
            Statistic::Mean,
        )
        .unwrap(),
    );
    assert_eq!(written, vec!["kernelized.png".to_string()]);
    assert!(draw_all(
        &[RunData::new("bert-base-cased", kern)],
        &out,
        Statistic::Median
    )
    .unwrap()
    .is_empty());
}

/// Within one figure no two methods look alike: with every registered method drawn together (a
/// superset of any figure's), their styles (colour, dash, width, marker) are pairwise distinct.
/// The references share one grey, so this is what keeps V-Mean apart from `h2o` and `topk`.
#[test]
fn no_two_methods_of_a_figure_share_a_style() {
    // The two floors share the floor's style; they never meet (`exact_kernelized` is the
    // kernelized target's, `svd_optimal` the softmax target's).
    let all: Vec<String> = crate::attention::method_ids()
        .iter()
        .filter(|m| **m != "exact_kernelized")
        .map(|m| m.to_string())
        .collect();
    // results/decoder's set: every prefill method beside the causal forms it runs.
    let decoder: Vec<String> = ["vmean", "performer_favor", "window", "topk", "svd_optimal"]
        .into_iter()
        .chain(crate::attention::method_ids().into_iter().filter(|m| {
            crate::attention::describe(m)
                .is_some_and(|(f, _)| f == crate::attention::Family::Prefill)
        }))
        .map(String::from)
        .collect();
    assert_eq!(decoder.len(), 12, "{decoder:?}"); // the seven prefill methods are found
    for drawn in [&all, &decoder] {
        let styles: Vec<_> = drawn.iter().map(|m| style::field_style(m, drawn)).collect();
        for (a, sa) in drawn.iter().zip(&styles) {
            for (b, sb) in drawn.iter().zip(&styles) {
                assert!(a == b || sa != sb, "{a} and {b} share a style: {sa:?}");
            }
        }
    }
}

/// Figure titles name the layer of every decoder run (layers 0 and 15 sit side by side) and of a
/// BERT run past layer 0, never BERT's layer 0 (the papers' setting): the committed causal
/// baseline's manifest as it is (layer 15) and moved to layer 0, and a bidirectional layer-0 one.
#[test]
fn titles_name_a_decoder_runs_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/baseline");
    let causal = root.join("smollm2-causal");
    let title = |dir: &Path| load_run(dir).unwrap().model_id;
    assert!(title(&causal).ends_with(" layer 15"), "{}", title(&causal));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(causal.join("summary.csv"), dir.path().join("summary.csv")).unwrap();
    let manifest = std::fs::read_to_string(causal.join("manifest.json")).unwrap();
    assert_eq!(manifest.matches("\"layer\": 15").count(), 1);
    let at_0 = manifest.replace("\"layer\": 15", "\"layer\": 0");
    std::fs::write(dir.path().join("manifest.json"), at_0).unwrap();
    assert!(
        title(dir.path()).ends_with(" layer 0"),
        "{}",
        title(dir.path())
    );
    let bert = title(&root.join("minilm-pretrained"));
    assert!(!bert.contains("layer"), "{bert}");
}

/// A figure whose drawing fails part way (here: its temporary file cannot be created, as on a full
/// disk) leaves the previous figure as it was and no temporary file (issue 32).
#[test]
fn a_failed_drawing_leaves_the_previous_figure_intact() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunData::new("bert-base-cased", synthetic());
    let out = dir.path().join("figs");
    draw_all(std::slice::from_ref(&run), &out, Statistic::Mean).unwrap();
    let fig = out.join("skyformer-fig1.png");
    let before = std::fs::read(&fig).unwrap();
    assert!(before.starts_with(b"\x89PNG"));
    // The temporary name this process would write is taken by a directory.
    let blocker = crate::atomic_file::temporary_name(&fig);
    std::fs::create_dir(&blocker).unwrap();
    assert!(draw_all(&[run], &out, Statistic::Mean).is_err());
    assert_eq!(
        std::fs::read(&fig).unwrap(),
        before,
        "the old figure is intact"
    );
    std::fs::remove_dir(&blocker).unwrap();
    let stray: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial-"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}
