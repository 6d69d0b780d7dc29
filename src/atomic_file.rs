//! Files written whole or not at all (issue 32): the content goes to a temporary name in the
//! target's directory, is flushed to disk, and is renamed over the target, so a kill or a full
//! disk leaves either the old file or the new one, never a torn one.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The temporary name for `path`: hidden, unique to this process, and with the same extension
/// (plotters picks the image format from it).
pub fn temporary_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.partial-{}{ext}", std::process::id()))
}

/// Writes `path` through `write`, which is given the temporary path to create; renames it into
/// place once `write` succeeded and the file is on disk. On failure the temporary file is removed
/// and `path` is untouched.
pub fn write_with(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    // Temporaries of `path` that a killed process left (a SIGINT in `plot`, a SIGXFSZ in the
    // cache) would pile up; an hour's age keeps those of a writer on another host sharing the
    // directory, whose process this host cannot see.
    remove_stale_temporaries(path, STALE_AFTER);
    let tmp = temporary_name(path);
    let done = write(&tmp).and_then(|()| {
        // Durable before it replaces the old file (best effort where the FS cannot sync).
        if let Ok(f) = std::fs::File::open(&tmp) {
            let _ = f.sync_all();
        }
        std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |tmp| {
        std::fs::write(tmp, bytes)
            .with_context(|| format!("writing {} (disk full?)", path.display()))
    })
}

/// How old a dead process's temporary must be before any write removes it ([`write_with`]).
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes the temporary files of `path` ([`temporary_name`]) left by processes that no longer
/// run (a kill -9 or SIGXFSZ mid-write skips the cleanup of [`write_with`]) and last modified at
/// least `min_age` ago; those of live processes, and everything else, stay. A caller that holds
/// the directory's lock may pass zero. Best effort: a file that cannot be removed stays too.
pub fn remove_stale_temporaries(path: &Path, min_age: std::time::Duration) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!(".{}.partial-", name.to_string_lossy());
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix(&prefix) else {
            continue;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let old_enough = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if let (Ok(pid), true) = (digits.parse::<u32>(), old_enough) {
            if !process_alive(pid) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Whether process `pid` exists (kill(2) with signal 0: ESRCH means it does not). Where that
/// cannot be asked, every process counts as alive, so nothing is removed.
fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = i32::try_from(pid) else {
            return true;
        };
        // SAFETY: signal 0 sends nothing; it only checks that the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("figure.png");
        write(&p, b"old").unwrap();
        let e = write_with(&p, |tmp| {
            std::fs::write(tmp, b"half")?;
            anyhow::bail!("disk full")
        });
        assert!(e.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("figure.png")]);
        write(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(temporary_name(&p).extension().unwrap(), "png");
    }

    /// A temporary left by a dead process is removed, one of a live process (this one) and the
    /// other files stay.
    #[test]
    fn stale_temporaries_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trials.csv");
        // A pid above Linux's pid_max (2²²) belongs to no process.
        let dead = dir.path().join(".trials.csv.partial-4194400.csv");
        let live = temporary_name(&p);
        let other = dir.path().join(".summary.csv.partial-4194400.csv");
        for f in [&p, &dead, &live, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        // Too young for a writer's own sweep: kept (its process may run on another host).
        remove_stale_temporaries(&p, STALE_AFTER);
        assert!(dead.exists());
        remove_stale_temporaries(&p, std::time::Duration::ZERO);
        assert!(!dead.exists());
        assert!(live.exists() && other.exists() && p.exists());
        // An hour old: any write of the same target removes it.
        std::fs::write(&dead, b"x").unwrap();
        let hour_ago = std::time::SystemTime::now() - STALE_AFTER;
        std::fs::File::options()
            .write(true)
            .open(&dead)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        write(&p, b"new").unwrap();
        assert!(!dead.exists() && other.exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
    }
}
