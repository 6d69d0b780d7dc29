//! One writer per run directory (issue 32): every command that writes a run directory (the sweep,
//! `merge`, `score`, `check --rerun`) holds an exclusive lock on `OUT/.lock` (flock on Unix,
//! through `std::fs::File::try_lock`) from before it touches OUT's files until it is done with
//! them, figures included. A second writer, which would append duplicate rows to trials.csv, is
//! refused at once with a usage error naming the directory and the holder (host, process, start
//! time). The OS drops the lock when its holder exits or dies, so a lock left by a killed run is
//! simply taken over: the file's presence means nothing, only a live holder's lock does.

use std::fs::{File, TryLockError};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{anyhow, Result};

/// The file locked inside a run directory.
pub const LOCK_FILE: &str = ".lock";

/// A held run-directory lock; released on drop (or when the process ends).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// Creates `out` if needed and takes its lock.
pub fn create_and_lock(out: &Path) -> Result<RunLock> {
    std::fs::create_dir_all(out).map_err(|e| {
        crate::usage!(
            "--out {}: cannot create the directory ({e}); choose a writable --out",
            out.display()
        )
    })?;
    acquire(out)
}

/// Takes `out`'s lock (the directory must exist), or a usage error if another process holds it.
pub fn acquire(out: &Path) -> Result<RunLock> {
    let path = out.join(LOCK_FILE);
    let mut file = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| {
            crate::usage!(
                "--out {}: cannot write its lock file {LOCK_FILE} ({e}); choose a writable --out",
                out.display()
            )
        })?;
    match file.try_lock() {
        Ok(()) => {
            // Who holds it, for the message a second writer gets (informative only): one write of
            // the whole line at offset 0, then the length cut to it, so a reader sees the previous
            // holder's line, or this one, never an empty file once the first holder wrote.
            let line = format!(
                "process {} on {}, since {}\n",
                std::process::id(),
                hostname(),
                crate::report::manifest::now()
            );
            let _ = file
                .seek(SeekFrom::Start(0))
                .and_then(|_| file.write_all(line.as_bytes()))
                .and_then(|_| file.set_len(line.len() as u64));
            Ok(RunLock { _file: file })
        }
        Err(TryLockError::WouldBlock) => {
            let holder = read_holder(&path);
            Err(crate::usage!(
                "--out {} is being written by another approx-bench run ({}); wait for it to finish, or choose another --out (two writers would duplicate rows)",
                out.display(),
                match holder.trim() {
                    "" => "holder unknown",
                    h => h,
                }
            ))
        }
        Err(TryLockError::Error(e)) => {
            Err(anyhow!(e).context(format!("locking {}", path.display())))
        }
    }
}

/// The holder's line. A lock file just created by a holder that has not yet written its line is
/// empty for a few microseconds (two runs started together, as CI's race test does): wait briefly
/// for a complete line rather than report an unknown holder.
fn read_holder(path: &Path) -> String {
    for _ in 0..40 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.ends_with('\n') && !text.trim().is_empty() {
            return text;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    String::new()
}

/// Checks that files can be created in `out`. A directory the user cannot write is theirs to fix
/// (exit 2); a full disk or an I/O error is a runtime failure (exit 1), as everywhere else.
pub fn probe_writable(out: &Path) -> Result<()> {
    let probe = out.join(".write-test");
    if let Err(e) = std::fs::write(&probe, b"ok") {
        let _ = std::fs::remove_file(&probe);
        return Err(unwritable(e, out));
    }
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// What a failed write into `out` is: the user's to fix (permissions, a read-only file system:
/// exit 2), or a runtime failure (a full disk, an I/O error: exit 1).
fn unwritable(e: std::io::Error, out: &Path) -> anyhow::Error {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            crate::usage!(
                "--out {}: not writable ({e}); choose a writable --out",
                out.display()
            )
        }
        _ => anyhow!(e).context(format!("writing into --out {}", out.display())),
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "an unknown host".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_and_the_lock_is_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path()).unwrap();
        let e = acquire(dir.path()).expect_err("refused while held");
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("another approx-bench run"), "{msg}");
        assert!(
            msg.contains(&format!("process {} on {}", std::process::id(), hostname())),
            "{msg}"
        );
        assert!(msg.contains("since 20"), "{msg}");
        drop(first);
        assert!(
            acquire(dir.path()).is_ok(),
            "free again after the holder ends"
        );
    }

    #[test]
    fn a_full_disk_is_a_runtime_failure_and_a_read_only_directory_a_usage_error() {
        use std::io::{Error, ErrorKind};
        let out = Path::new("/runs/x");
        let full = unwritable(Error::from(ErrorKind::StorageFull), out);
        assert!(full.downcast_ref::<crate::UsageError>().is_none(), "{full}");
        assert!(format!("{full:#}").contains("/runs/x"));
        for kind in [ErrorKind::PermissionDenied, ErrorKind::ReadOnlyFilesystem] {
            let e = unwritable(Error::from(kind), out);
            assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        }
    }

    /// The race CI met: the second of two runs started together found the lock held and the file
    /// still empty ("holder unknown"). It now waits for the holder's line.
    #[test]
    fn a_holder_that_has_not_yet_written_its_line_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let _first = acquire(dir.path()).unwrap();
        let path = dir.path().join(LOCK_FILE);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                std::fs::write(&path, "process 7 on late-host, since 2026\n").unwrap();
            })
        };
        let msg = acquire(dir.path()).expect_err("refused").to_string();
        writer.join().unwrap();
        assert!(
            msg.contains("(process 7 on late-host, since 2026)"),
            "{msg}"
        );
    }

    #[test]
    fn a_stale_lock_file_without_a_holder_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(LOCK_FILE),
            "process 1 on elsewhere, since 2020-01-01T00:00:00Z\n",
        )
        .unwrap();
        let _held = acquire(dir.path()).expect("nobody holds it");
        let now = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert!(
            now.starts_with(&format!("process {} ", std::process::id())),
            "{now}"
        );
    }
}
