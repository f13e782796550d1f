//! `Event`: a core future as a Python object. Waits release the GIL; `on_ready`
//! callbacks run on the thread that completes the event, holding the GIL only
//! while the Python callback runs.

use std::time::Duration;

use colocated_core as core;
use pyo3::prelude::*;

use crate::errors::{py_err, to_py};
use crate::fork::ForkSafe;

/// A one-shot future of the runtime: ready once, with success or an error.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct Event {
    inner: ForkSafe<core::Event>,
}

impl Event {
    pub(crate) fn wrap(event: core::Event) -> Self {
        Event {
            inner: ForkSafe::new(event),
        }
    }
}

const CODES: [core::ErrorCode; 12] = [
    core::ErrorCode::Cancelled,
    core::ErrorCode::InvalidArgument,
    core::ErrorCode::DeadlineExceeded,
    core::ErrorCode::NotFound,
    core::ErrorCode::AlreadyExists,
    core::ErrorCode::PermissionDenied,
    core::ErrorCode::ResourceExhausted,
    core::ErrorCode::FailedPrecondition,
    core::ErrorCode::Unimplemented,
    core::ErrorCode::Internal,
    core::ErrorCode::Unavailable,
    core::ErrorCode::Unauthenticated,
];

#[pymethods]
impl Event {
    /// A pending event that the caller fulfils with `set`.
    #[new]
    fn new() -> Self {
        Event::wrap(core::Event::new())
    }

    /// Fulfils the event: with success, or with an error of `code` (a lower-case
    /// code name such as `"cancelled"`) and `message`. Runs the `on_ready`
    /// callbacks on this thread. `FailedPreconditionError` if already set.
    #[pyo3(signature = (code=None, message=""))]
    fn set(&self, py: Python<'_>, code: Option<&str>, message: &str) -> PyResult<()> {
        let event = self.inner.get().map_err(py_err)?;
        let result = match code {
            None => Ok(()),
            Some(name) => {
                let code = CODES.iter().find(|c| c.name() == name).ok_or_else(|| {
                    py_err(core::Error::invalid_argument(format!(
                        "unknown error code '{name}'"
                    )))
                })?;
                Err(core::Error::new(*code, message))
            }
        };
        // Detached: callbacks may run on this thread and take the GIL themselves.
        py.detach(|| event.set(result)).map_err(py_err)
    }

    /// An event ready when all `events` are; it fails with the first error (in
    /// argument order) among them.
    #[staticmethod]
    fn join(events: Vec<PyRef<'_, Event>>) -> PyResult<Self> {
        let events: Vec<core::Event> = events
            .iter()
            .map(|e| e.inner.get().cloned())
            .collect::<Result<_, _>>()
            .map_err(py_err)?;
        Ok(Event::wrap(core::Event::join(&events)))
    }

    /// True once the event has its result.
    fn is_ready(&self) -> PyResult<bool> {
        Ok(self.inner.get().map_err(py_err)?.is_ready())
    }

    /// Blocks (without the GIL) until ready; raises the event's error.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let event = self.inner.get().map_err(py_err)?;
        if let Some(status) = event.status() {
            return status.map_err(|e| to_py(py, &e));
        }
        py.detach(|| event.wait()).map_err(|e| to_py(py, &e))
    }

    /// Blocks at most `timeout` seconds; raises `DeadlineExceededError` if the
    /// event is still pending then, else the event's error.
    fn wait_timeout(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let event = self.inner.get().map_err(py_err)?;
        let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
            py_err(core::Error::invalid_argument(format!(
                "timeout must be a non-negative number of seconds, got {timeout}"
            )))
        })?;
        py.detach(|| event.wait_timeout(timeout))
            .map_err(|e| to_py(py, &e))
    }

    /// The error as an exception instance, or None (also while pending).
    fn error(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let event = self.inner.get().map_err(py_err)?;
        Ok(event
            .error()
            .map(|e| to_py(py, &e).into_value(py).into_any()))
    }

    /// Calls `callback(None)` on success or `callback(exception)` on failure,
    /// exactly once: now if ready, else on the runtime thread that completes the
    /// event. Exceptions the callback raises are reported as unraisable.
    fn on_ready(&self, callback: Py<PyAny>) -> PyResult<()> {
        let event = self.inner.get().map_err(py_err)?;
        event.on_ready(move |status| {
            // try_attach: nothing to run once the interpreter is shutting down.
            Python::try_attach(|py| {
                let arg = match status {
                    Ok(()) => py.None(),
                    Err(e) => to_py(py, &e).into_value(py).into_any(),
                };
                if let Err(err) = callback.call1(py, (arg,)) {
                    err.write_unraisable(py, Some(callback.bind(py)));
                }
            });
        });
        Ok(())
    }
}
