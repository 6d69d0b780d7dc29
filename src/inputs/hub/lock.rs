//! One downloader per blob across processes: an exclusive lock on `.locks/<repo>/<etag>.lock`,
//! the file huggingface_hub locks too (flock on Unix), so approx-bench shards and Python jobs
//! sharing one cache cooperate.
//!
//! hf-hub 0.5 gives up after a few tries ("Lock acquisition failed") and hf-hub 1.0 after 10 s:
//! either kills the second shard on a cold cache, since bert-base-cased takes minutes. Here a
//! process that finds the lock held waits, says so, and watches the holder's `.incomplete` file:
//! it waits as long as that file grows (however slow the link), and gives up only after the
//! holder made no progress for `patience`, naming the lock. The OS drops the lock when its
//! holder dies, so a crashed process never blocks the others.

use std::fs::{File, TryLockError};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};

/// A held lock; released on drop.
pub struct BlobLock {
    _file: File,
}

/// What happened while acquiring.
pub enum Acquired {
    /// The lock was free.
    Free(BlobLock),
    /// Another process held it; we waited for it to finish.
    AfterWaiting(BlobLock),
}

/// Takes the lock at `path`, waiting for another holder as described above. `incomplete` is the
/// holder's partial download; `on_wait` is called once when waiting starts.
pub fn acquire(
    path: &Path,
    incomplete: &Path,
    patience: Duration,
    on_wait: impl FnOnce(),
) -> Result<Acquired> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => return Ok(Acquired::Free(BlobLock { _file: file })),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => {
            return Err(anyhow!(e).context(format!("locking {}", path.display())))
        }
    }
    on_wait();
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    let mut last = size(incomplete);
    let mut last_change = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        match file.try_lock() {
            Ok(()) => return Ok(Acquired::AfterWaiting(BlobLock { _file: file })),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => {
                return Err(anyhow!(e).context(format!("locking {}", path.display())))
            }
        }
        let now = size(incomplete);
        if now != last {
            last = now;
            last_change = Instant::now();
        } else if last_change.elapsed() > patience {
            return Err(anyhow!(
                "another process has held {} for {:.0} s without its download ({}) making progress. \
                 If no other approx-bench or huggingface download is running, remove the lock file and rerun",
                path.display(),
                last_change.elapsed().as_secs_f64(),
                incomplete.display()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits_while_the_first_makes_progress_then_gets_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("locks/x.lock");
        let part = dir.path().join("x.incomplete");
        let first = match acquire(&lock, &part, Duration::from_secs(5), || panic!()).unwrap() {
            Acquired::Free(l) => l,
            Acquired::AfterWaiting(_) => panic!("the lock was free"),
        };
        // The holder writes for 1.5 s (longer than the 0.5 s patience), then lets go.
        let part2 = part.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..15 {
                std::fs::write(&part2, vec![0u8; i + 1]).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(first);
        });
        let mut waited = false;
        let got = acquire(&lock, &part, Duration::from_millis(500), || waited = true).unwrap();
        writer.join().unwrap();
        assert!(waited);
        assert!(matches!(got, Acquired::AfterWaiting(_)));
    }

    #[test]
    fn a_holder_without_progress_is_given_up_on_naming_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("y.lock");
        let part = dir.path().join("y.incomplete");
        let _held = acquire(&lock, &part, Duration::from_secs(1), || {}).unwrap();
        let t0 = Instant::now();
        let e = match acquire(&lock, &part, Duration::from_millis(300), || {}) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("the lock is held"),
        };
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(e.contains("y.lock") && e.contains("without"), "{e}");
    }
}
