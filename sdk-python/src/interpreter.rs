//! Python from the runtime's own threads, which must not touch an
//! interpreter that is shutting down: while CPython finalizes, a thread
//! that takes or gives back the GIL aborts the process. So `atexit` (the
//! module registers [`mark_exiting`]) stops the runtime's threads from
//! entering Python and waits for those inside it (a program still running
//! at exit) to leave before finalization begins.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use colocated_core as core;
use pyo3::prelude::*;

static EXITING: AtomicBool = AtomicBool::new(false);

/// The runtime's threads inside [`attach`] (or waiting for the GIL there).
static INSIDE: AtomicUsize = AtomicUsize::new(0);

/// How long exit waits for Python work of the runtime's threads to end.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Called by `atexit`: from here on the runtime's threads start no Python,
/// and exit waits (the GIL released, at most `EXIT_WAIT`) for those running
/// some to finish.
#[pyfunction]
pub(crate) fn mark_exiting(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + EXIT_WAIT;
        while INSIDE.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

struct Inside;

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether the interpreter is exiting (see the module's doc).
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// `f` with the GIL, or None once the interpreter is exiting.
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    INSIDE.fetch_add(1, Ordering::SeqCst);
    let _inside = Inside;
    // Checked after counting this thread in: exit either waits for it or
    // sees it refuse.
    if exiting() {
        return None;
    }
    Python::try_attach(f)
}

/// The error of Python work that a thread of the runtime cannot run any
/// more: the interpreter is exiting.
pub(crate) fn exiting_error() -> core::Error {
    core::Error::unavailable("the Python interpreter is exiting")
}

/// Registers [`mark_exiting`] with `atexit`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(mark_exiting, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
