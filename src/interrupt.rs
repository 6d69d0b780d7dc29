//! Interruption by SIGINT or SIGTERM (issue 32). The CLI installs the handlers once at start-up.
//! While a loop that polls the flag is running ([`polling`]: the sweep, which stops between
//! trials with every finished row on disk, and the decoder forward inside it, between layers), a
//! signal only sets the flag; the run then ends with [`Interrupted`], which says how far it got
//! and how to resume, and the CLI exits 128 + the signal's number (130, 143) as a shell does.
//! Outside such a loop (plotting, merging, a dump), and at a second signal, the process ends at
//! once with that status (the files are consistent at every moment anyway: rows are whole lines,
//! the rest is renamed into place).
//!
//! The library never installs handlers itself: an embedding host (the Python face) keeps its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::Result;

/// The last signal received (0: none); shared with the handlers.
static SIGNAL: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

fn flag() -> &'static Arc<AtomicUsize> {
    SIGNAL.get_or_init(|| Arc::new(AtomicUsize::new(0)))
}

/// True while no loop polls the flag: a signal then ends the process at once.
static NOT_POLLING: OnceLock<Arc<std::sync::atomic::AtomicBool>> = OnceLock::new();

fn not_polling() -> &'static Arc<std::sync::atomic::AtomicBool> {
    NOT_POLLING.get_or_init(|| Arc::new(std::sync::atomic::AtomicBool::new(true)))
}

/// While alive, a signal sets the flag instead of ending the process: hold it around a loop that
/// polls [`requested`] or [`check`].
pub struct Polling {
    _private: (),
}

/// Starts a polling section (see [`Polling`]).
pub fn polling() -> Polling {
    not_polling().store(false, Ordering::SeqCst);
    Polling { _private: () }
}

impl Drop for Polling {
    fn drop(&mut self) {
        not_polling().store(true, Ordering::SeqCst);
    }
}

/// A run stopped by a signal: every row finished before it is kept.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {}{}", signal_name(*.signal), .progress.as_deref().map(|p| format!(" {p}")).unwrap_or_default())]
pub struct Interrupted {
    pub signal: i32,
    /// e.g. "after 12 of 40 trials; rerun the same command to resume".
    pub progress: Option<String>,
}

impl Interrupted {
    /// The shell's convention for a process ended by a signal.
    pub fn exit_code(&self) -> i32 {
        128 + self.signal
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Installs the SIGINT and SIGTERM handlers (Unix; a no-op elsewhere). Inside a polling section
/// the first signal sets the flag; outside one, or a second time, it ends the process at once with
/// 128 + its number.
pub fn install() -> Result<()> {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            // The shutdowns go first: on the first signal inside a polling section both
            // conditions are false, and the flags below are set.
            signal_hook::flag::register_conditional_shutdown(
                sig,
                128 + sig,
                not_polling().clone(),
            )?;
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, armed.clone())?;
            signal_hook::flag::register(sig, armed.clone())?;
            signal_hook::flag::register_usize(sig, flag().clone(), sig as usize)?;
        }
    }
    Ok(())
}

/// An embedding host's own check for a pending interruption (the Python face: its SIGINT
/// handler only runs when the main thread asks, so a long run must ask it), returning the signal
/// it stands for; set with [`set_host_check`].
static HOST_CHECK: OnceLock<std::sync::Mutex<Option<fn() -> Option<i32>>>> = OnceLock::new();

fn host_check() -> &'static std::sync::Mutex<Option<fn() -> Option<i32>>> {
    HOST_CHECK.get_or_init(|| std::sync::Mutex::new(None))
}

/// Sets (or clears) the embedding host's check, which [`requested`] and [`check`] then consult
/// at every poll: a signal it reports sets the flag as a handled signal does.
pub fn set_host_check(check: Option<fn() -> Option<i32>>) {
    *host_check().lock().expect("host check lock") = check;
}

/// Clears the flag: an embedding host starts each call of the library afresh (the CLI never
/// does; a signal ends its one run).
pub fn reset() {
    flag().store(0, Ordering::SeqCst);
}

/// The signal received so far, if any.
pub fn requested() -> Option<i32> {
    if flag().load(Ordering::SeqCst) == 0 {
        let host = *host_check().lock().expect("host check lock");
        if let Some(signal) = host.and_then(|f| f()) {
            flag().store(signal as usize, Ordering::SeqCst);
        }
    }
    match flag().load(Ordering::SeqCst) {
        0 => None,
        s => Some(s as i32),
    }
}

/// `Err(Interrupted)` once a signal has arrived: for loops whose partial work is worth nothing
/// (a forward through the layers), so they stop at once.
pub fn check() -> Result<()> {
    match requested() {
        None => Ok(()),
        Some(signal) => Err(Interrupted {
            signal,
            progress: None,
        }
        .into()),
    }
}

/// Marks the run as interrupted by `signal` where an embedding host saw it (a user's callable
/// raised KeyboardInterrupt): the polling loops stop as at a handled signal.
pub fn request(signal: i32) {
    flag().store(signal as usize, Ordering::SeqCst);
}

/// Marks the process as interrupted without a signal: for tests of the polling loops.
#[doc(hidden)]
pub fn request_for_test(signal: i32) {
    flag().store(signal as usize, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_exit_codes_are_the_shells() {
        let i = super::Interrupted {
            signal: libc::SIGINT,
            progress: Some("after 3 of 9 trials".into()),
        };
        assert_eq!(i.exit_code(), 130);
        assert_eq!(i.to_string(), "interrupted by SIGINT after 3 of 9 trials");
        let t = super::Interrupted {
            signal: libc::SIGTERM,
            progress: None,
        };
        assert_eq!(t.exit_code(), 143);
    }
}
