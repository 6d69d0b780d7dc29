//! One writer per run directory (issue 32): a sweep holds an exclusive lock on `OUT/.lock` (flock
//! on Unix, through `std::fs::File::try_lock`) from before it touches OUT's files until it ends.
//! A second sweep into the same directory, which would append duplicate rows to trials.csv, is
//! refused at once with a usage error naming the directory and the holder's process id. The OS
//! drops the lock when its holder exits or dies, so a killed run never blocks a resume.

use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, Result};

/// The file locked inside a run directory.
pub const LOCK_FILE: &str = ".lock";

/// A held run-directory lock; released on drop (or when the process ends).
pub struct RunLock {
    _file: File,
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
            // Who holds it, for the message a second writer gets (informative only).
            let _ = file.set_len(0);
            let _ = writeln!(file, "{}", std::process::id());
            Ok(RunLock { _file: file })
        }
        Err(TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            Err(crate::usage!(
                "--out {} is being written by another approx-bench run (process {}); wait for it to finish, or choose another --out (two writers would duplicate rows)",
                out.display(),
                holder.trim()
            ))
        }
        Err(TryLockError::Error(e)) => {
            Err(anyhow!(e).context(format!("locking {}", path.display())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_and_the_lock_is_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path()).unwrap();
        let e = acquire(dir.path()).err().expect("refused while held");
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("another approx-bench run"), "{msg}");
        assert!(msg.contains(&std::process::id().to_string()), "{msg}");
        drop(first);
        assert!(
            acquire(dir.path()).is_ok(),
            "free again after the holder ends"
        );
    }
}
