//! Outputs: per-trial rows, summaries, the run manifest, figures and the regression check.

pub mod anchors;
pub mod check;
pub mod console;
pub mod e2e_rows;
pub mod figures;
pub mod grid;
pub mod manifest;
pub mod merge;
pub mod run_lock;
pub mod summary;
pub mod trials;

/// Removes what a run writes into its directory (rows, summary, manifest, figures and the mark of
/// an unfinished merge), so that `--force` leaves nothing of the previous run; anything else there
/// is the user's and stays.
pub fn remove_run_outputs(dir: &std::path::Path) -> anyhow::Result<()> {
    for f in ["trials.csv", "summary.csv", "manifest.json", merge::MERGING] {
        remove_if_present(&dir.join(f))?;
    }
    for e in std::fs::read_dir(dir)?.flatten() {
        if figures::is_figure_name(&e.file_name().to_string_lossy()) {
            remove_if_present(&e.path())?;
        }
    }
    Ok(())
}

fn remove_if_present(p: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(anyhow::Error::new(e).context(format!("removing {}", p.display())))
        }
        _ => Ok(()),
    }
}
