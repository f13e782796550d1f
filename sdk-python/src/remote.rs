//! Remote hosts from Python: a worker served by this process (`python -m
//! colocated.worker`, which runs Python programs too), and `RemoteSession`, the
//! low-level session of a controller on one worker (private, under the coming
//! `colocated.connect`).

use std::time::Duration;

use colocated_core as core;
use core::transport::Token;
use core::worker::{Worker, WorkerFlags, WorkerKind, WorkerOptions, WORKER_FLAGS};
use pyo3::prelude::*;

use crate::client::Client;
use crate::errors::{py_err, to_py};

/// A positive number of seconds (core's rule), or `InvalidArgumentError`.
pub(crate) fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    core::worker::seconds(name, value).map_err(py_err)
}

/// The token a controller presents (core's rule, `Token::resolve`): `token`,
/// else the file `token_file`, else `COLOCATED_TOKEN`; `None` when there is
/// none.
pub(crate) fn token_from(
    token: Option<String>,
    token_file: Option<std::path::PathBuf>,
) -> PyResult<Option<Token>> {
    Token::resolve(token.as_deref(), token_file.as_deref()).map_err(py_err)
}

/// A worker serving this process's devices, with the Python executor (started
/// by `start_worker`). It stops with `shutdown()`, or when collected.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct WorkerHandle {
    worker: std::sync::Mutex<Option<Worker>>,
    address: String,
}

#[pymethods]
impl WorkerHandle {
    /// `HOST:PORT` the worker listens on.
    #[getter]
    fn address(&self) -> &str {
        &self.address
    }

    /// True once the worker has had no session for `exit_after_idle`
    /// seconds (never without it, or once shut down).
    #[getter]
    fn idle_expired(&self) -> bool {
        self.worker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(Worker::idle_expired)
    }

    /// Stops serving and closes every session (idempotent).
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        match worker {
            Some(worker) => py.detach(|| worker.shutdown()).map_err(|e| to_py(py, &e)),
            None => Ok(()),
        }
    }
}

/// A flag of core's tables as `(name, kind, default, repeatable, help,
/// aliases, hidden)`.
type FlagInfo = (
    &'static str,
    &'static str,
    Option<&'static str>,
    bool,
    &'static str,
    Vec<&'static str>,
    bool,
);

/// One flag of core's tables as a [`FlagInfo`].
fn flag_info(f: &core::worker::WorkerFlag) -> FlagInfo {
    (
        f.name,
        f.kind.name(),
        f.default,
        f.repeatable,
        f.help,
        f.aliases.to_vec(),
        f.hidden,
    )
}

/// The flags of `colocated status` after its addresses, from core's table
/// (as `worker_flags`).
#[pyfunction]
pub fn status_flags() -> Vec<FlagInfo> {
    core::worker::STATUS_FLAGS.iter().map(flag_info).collect()
}

/// `colocated status`: one line per worker (those given, else those found
/// as `cluster` says) and whether all answered. Waits without the GIL.
/// `InvalidArgumentError` naming a bad flag, `NotFoundError` when no worker
/// is given or found.
#[pyfunction]
#[pyo3(signature = (addresses, *, token_file=None, tls_ca=None, tls_domain=None, timeout, cluster, port=None))]
#[allow(clippy::too_many_arguments)]
pub fn status(
    py: Python<'_>,
    addresses: Vec<String>,
    token_file: Option<std::path::PathBuf>,
    tls_ca: Option<std::path::PathBuf>,
    tls_domain: Option<String>,
    timeout: f64,
    cluster: String,
    port: Option<String>,
) -> PyResult<(String, bool)> {
    let flags = core::worker::StatusFlags {
        addresses,
        token_file,
        tls_ca,
        tls_domain,
        timeout,
        cluster,
        port,
    };
    py.detach(|| flags.run())
        .map_err(|e| crate::errors::to_py(py, &e))
}

/// The flags of a worker's command line, from core's table (which `colocated
/// worker` is built from too): `(name, kind, default, repeatable, help,
/// aliases, hidden)` per flag, `kind` one of `switch`, `address`, `count`,
/// `seconds`, `path`, `port`, `name`; `hidden` for the flags help leaves out.
#[pyfunction]
pub fn worker_flags() -> Vec<FlagInfo> {
    WORKER_FLAGS.iter().map(flag_info).collect()
}

/// A worker's options, checked: made from the values of the worker flags by
/// core's rules, as `colocated worker` makes them (`InvalidArgumentError`
/// naming a bad flag), for a Python worker started by `command` (the
/// program, then the arguments before the flags: `[sys.executable, "-m",
/// "colocated.worker"]`). As the Python code controllers send runs there, it
/// runs each session in a worker process of its own, started by `command`,
/// unless `shared_sessions`. With `single_session`, `token_file` holds a
/// one-time token, read here and deleted.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct WorkerConfig {
    options: WorkerOptions,
    /// This process's own trace file (core's `WorkerFlags::trace_file`).
    trace_file: Option<std::path::PathBuf>,
}

#[pymethods]
impl WorkerConfig {
    #[new]
    #[pyo3(signature = (*, command, listen, port=None, token_file=None, insecure=false, tls_cert=None, tls_key=None, heartbeat_interval, session_timeout, exit_after_idle=None, cpu_devices=None, pjrt_plugin=None, pjrt_options=None, plugins=None, trace=None, isolate_sessions=false, shared_sessions=false, single_session=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        command: Vec<String>,
        listen: String,
        port: Option<String>,
        token_file: Option<std::path::PathBuf>,
        insecure: bool,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        heartbeat_interval: f64,
        session_timeout: f64,
        exit_after_idle: Option<f64>,
        cpu_devices: Option<usize>,
        pjrt_plugin: Option<String>,
        pjrt_options: Option<Vec<String>>,
        plugins: Option<Vec<std::path::PathBuf>>,
        trace: Option<std::path::PathBuf>,
        isolate_sessions: bool,
        shared_sessions: bool,
        single_session: bool,
    ) -> PyResult<Self> {
        let mut command = command.into_iter();
        let program = command.next().ok_or_else(|| {
            py_err(core::Error::invalid_argument(
                "a worker's command needs a program",
            ))
        })?;
        let kind = WorkerKind {
            program: program.into(),
            args: command.collect(),
            isolates_by_default: true,
        };
        let flags = WorkerFlags {
            listen,
            port,
            cpu_devices,
            pjrt_plugin,
            pjrt_options: pjrt_options.unwrap_or_default(),
            token_file,
            insecure,
            tls_cert,
            tls_key,
            heartbeat_interval,
            session_timeout,
            plugins: plugins.unwrap_or_default(),
            exit_after_idle,
            trace,
            isolate_sessions,
            shared_sessions,
            single_session,
        };
        Ok(WorkerConfig {
            options: flags.options(&kind).map_err(py_err)?,
            trace_file: flags.trace_file(),
        })
    }

    /// This process's own trace file (`--trace`; a session worker's is
    /// `NAME.PID.EXT`), or `None`.
    #[getter]
    fn trace_file(&self) -> Option<std::path::PathBuf> {
        self.trace_file.clone()
    }

    /// True for a session worker (`single_session`): it serves one session,
    /// and `WorkerHandle.idle_expired` becomes true once that ended.
    #[getter]
    fn single_session(&self) -> bool {
        self.options.single_session
    }
}

/// Starts a worker serving `client` (the package's default client, so that
/// devices in pickled programs resolve to the served ones; it runs native and
/// Python programs) as `config` says: a supervisor that runs each session in
/// a worker process of its own and redirects the controller there, unless
/// sessions are shared. A session worker (`single_session`) serves exactly
/// one session: `idle_expired` becomes true once it ended, when none opened
/// within the handshake deadline, or when stdin closes (its supervisor went).
#[pyfunction]
pub fn start_worker(
    py: Python<'_>,
    client: PyRef<'_, Client>,
    config: PyRef<'_, WorkerConfig>,
) -> PyResult<WorkerHandle> {
    let options = config.options.clone();
    let client = client.inner.get().map_err(py_err)?.clone();
    let worker = py
        .detach(|| Worker::start(client, options))
        .map_err(|e| to_py(py, &e))?;
    Ok(WorkerHandle {
        address: worker.local_addr().to_string(),
        worker: std::sync::Mutex::new(Some(worker)),
    })
}

/// What a Python worker logs when `COLOCATED_LOG` is unset: the warnings of
/// colocated's crates and of this module.
const WORKER_DEFAULT_LOG: &str = "colocated=warn,_colocated=warn";

/// Installs a worker's logging and tracing (core's `trace::init_worker`): to
/// stderr, what `COLOCATED_LOG` selects, else colocated's warnings (refused
/// requests, an insecure or exposed worker); `COLOCATED_TRACE` is ignored (it
/// names the controller's file: this worker's spans go to the controllers
/// that trace), and `trace`, when given (`--trace FILE`), receives this
/// worker's own trace. A library user's process stays silent unless it sets
/// `COLOCATED_LOG`; only `python -m colocated.worker` calls this, before
/// anything else can.
#[pyfunction]
#[pyo3(signature = (trace=None))]
pub fn init_worker_logging(trace: Option<std::path::PathBuf>) {
    core::trace::init_worker(WORKER_DEFAULT_LOG, trace.as_deref());
}

/// Loads the native-function plugin at `path` (a shared library exporting
/// `colocated_plugin_init`, see `colocated.h`) into `client`'s local host;
/// returns the names it registered. Raises `NotFoundError` for a missing file
/// and `InvalidArgumentError` for a library that is not a plugin.
#[pyfunction]
pub fn load_plugin(py: Python<'_>, client: PyRef<'_, Client>, path: &str) -> PyResult<Vec<String>> {
    let client = client.inner.get().map_err(py_err)?.clone();
    let path = std::path::PathBuf::from(path);
    py.detach(|| colocated_plugin::load_plugin(&client, &path))
        .map_err(|e| to_py(py, &e))
}
