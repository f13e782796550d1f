//! `HostEvent` and `HostStats`: what happens to a client's worker hosts (core's
//! host events and their counters) as Python objects, and the listener that
//! hands each event to a Python callback on the client's thread of events.

use colocated_core as core;
use pyo3::prelude::*;

use crate::errors::to_py;

/// An event of a client's worker host: its link broke (`"disconnected"`) or
/// came back (`"reconnected"`), its session was lost for good (`"lost"`), or
/// new work opened a session that replaced a lost one (`"reopened"`).
#[pyclass(module = "colocated", frozen, get_all)]
pub struct HostEvent {
    /// The host's index in `Client.hosts()`.
    host: usize,
    /// `"disconnected"`, `"reconnected"`, `"lost"` or `"reopened"`.
    kind: &'static str,
    /// Why, for `"disconnected"` and `"lost"` (a `ColocatedError` of the
    /// error's code), else None.
    error: Option<Py<PyAny>>,
}

#[pymethods]
impl HostEvent {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let error = match &self.error {
            Some(error) => error.bind(py).repr()?.to_string(),
            None => "None".to_string(),
        };
        Ok(format!(
            "HostEvent(host={}, kind={:?}, error={error})",
            self.host, self.kind
        ))
    }
}

/// How often each host event happened to a host since the client started.
#[pyclass(module = "colocated", frozen, get_all)]
pub struct HostStats {
    /// Links that broke (`"disconnected"` events).
    disconnects: u64,
    /// Links that came back, their session resumed (`"reconnected"`).
    reconnects: u64,
    /// Sessions lost for good (`"lost"`).
    sessions_lost: u64,
    /// Sessions opened to replace a lost one (`"reopened"`).
    sessions_reopened: u64,
}

impl HostStats {
    /// The Python view of core's counters.
    pub(crate) fn wrap(stats: core::HostStats) -> Self {
        HostStats {
            disconnects: stats.disconnects,
            reconnects: stats.reconnects,
            sessions_lost: stats.sessions_lost,
            sessions_reopened: stats.sessions_reopened,
        }
    }
}

#[pymethods]
impl HostStats {
    fn __repr__(&self) -> String {
        format!(
            "HostStats(disconnects={}, reconnects={}, sessions_lost={}, sessions_reopened={})",
            self.disconnects, self.reconnects, self.sessions_lost, self.sessions_reopened
        )
    }
}

/// Listens to `client`'s host events with `callback`, which core calls on the
/// client's thread of events: each event is handed to it as a `HostEvent`
/// with the GIL taken for the call only, and an exception it raises goes to
/// `sys.unraisablehook` (the listener stays). Returns the listener's id.
pub(crate) fn listen(client: &core::Client, callback: Py<PyAny>) -> core::Result<u64> {
    client.on_host_event(move |event: &core::HostEvent| {
        // try_attach: nothing to tell once the interpreter is shutting down.
        Python::try_attach(|py| {
            let told = HostEvent {
                host: event.host,
                kind: event.kind.name(),
                error: event
                    .error
                    .as_ref()
                    .map(|e| to_py(py, e).into_value(py).into_any()),
            };
            let called = Py::new(py, told).and_then(|told| callback.call1(py, (told,)));
            if let Err(err) = called {
                err.write_unraisable(py, Some(callback.bind(py)));
            }
        });
    })
}
