//! Remote hosts from Python: a worker served by this process (`python -m
//! colocated.worker`, which runs Python programs too), and `RemoteSession`, the
//! low-level session of a controller on one worker (private, under the coming
//! `colocated.connect`).

use std::time::Duration;

use colocated_core as core;
use core::transport::isolate::IsolateCommand;
use core::transport::session::{ConnectOptions, RemoteSession as CoreSession};
use core::transport::worker::{TlsIdentity, Worker, WorkerOptions};
use core::transport::{proto, Token};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::client::Client;
use crate::errors::{py_err, to_py};

pub(crate) fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            py_err(core::Error::invalid_argument(format!(
                "{name} must be a positive number of seconds"
            )))
        })
}

fn token(text: Option<String>) -> PyResult<Option<Token>> {
    text.map(Token::new).transpose().map_err(py_err)
}

/// The token of `token`, else of the file `token_file`, else of
/// `COLOCATED_TOKEN` (core's rules: a file's or the variable's surrounding
/// whitespace is ignored); `None` when there is none. `InvalidArgumentError`
/// for both at once, an unreadable file or an empty token.
pub(crate) fn token_from(
    token: Option<String>,
    token_file: Option<std::path::PathBuf>,
) -> PyResult<Option<Token>> {
    match (token, token_file) {
        (Some(_), Some(_)) => Err(py_err(core::Error::invalid_argument(
            "give token or token_file, not both",
        ))),
        (Some(text), None) => self::token(Some(text)),
        (None, Some(path)) => Token::from_file(&path).map(Some).map_err(py_err),
        (None, None) => Token::from_env().map_err(py_err),
    }
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

/// Starts a worker on `listen` serving `client` (the package's default client,
/// so that devices in pickled programs resolve to the served ones; it runs
/// native and Python programs). Every request must carry the token of
/// `token`, else of the file `token_file`, else of `COLOCATED_TOKEN`; with none
/// of them, `insecure=True` serves anyone. With `exit_after_idle` (seconds),
/// `WorkerHandle.idle_expired` becomes true once the worker has had no session
/// for that long. With `isolate` (a command line: program, then arguments),
/// the worker is a supervisor that runs each session in a child worker of
/// that command (given `--listen HOST:0 --token-file F --single-session`)
/// and redirects the controller there. `single_session=True` serves exactly
/// one session: `idle_expired` becomes true once it ended, or when none
/// opened within the handshake deadline.
#[pyfunction]
#[pyo3(signature = (client, listen, *, token=None, token_file=None, insecure=false, heartbeat_interval=1.0, session_timeout=10.0, tls_cert=None, tls_key=None, exit_after_idle=None, isolate=None, single_session=false))]
#[allow(clippy::too_many_arguments)]
pub fn start_worker(
    py: Python<'_>,
    client: PyRef<'_, Client>,
    listen: &str,
    token: Option<String>,
    token_file: Option<std::path::PathBuf>,
    insecure: bool,
    heartbeat_interval: f64,
    session_timeout: f64,
    tls_cert: Option<Vec<u8>>,
    tls_key: Option<Vec<u8>>,
    exit_after_idle: Option<f64>,
    isolate: Option<Vec<String>>,
    single_session: bool,
) -> PyResult<WorkerHandle> {
    let token = match (&token, &token_file, insecure) {
        // An insecure worker does not pick up a token from the environment.
        (None, None, true) => None,
        _ => token_from(token, token_file)?,
    };
    if token.is_none() && !insecure {
        return Err(py_err(core::Error::invalid_argument(
            "a worker requires a token (or insecure=True, which lets anyone run code here)",
        )));
    }
    let listen = listen.parse().map_err(|e| {
        py_err(core::Error::invalid_argument(format!(
            "bad listen address {listen:?}: {e}"
        )))
    })?;
    let client = client.inner.get().map_err(py_err)?.clone();
    let mut options = WorkerOptions::new(token);
    options.listen = listen;
    options.heartbeat_interval = seconds("heartbeat_interval", heartbeat_interval)?;
    options.session_timeout = seconds("session_timeout", session_timeout)?;
    options.exit_after_idle = exit_after_idle
        .map(|s| seconds("exit_after_idle", s))
        .transpose()?;
    options.single_session = single_session;
    options.isolate = match isolate {
        None => None,
        Some(command) => {
            let mut command = command.into_iter();
            let program = command.next().ok_or_else(|| {
                py_err(core::Error::invalid_argument(
                    "isolate needs a command line: a program, then its arguments",
                ))
            })?;
            Some(IsolateCommand {
                program: program.into(),
                args: command.collect(),
            })
        }
    };
    options.tls = match (tls_cert, tls_key) {
        (Some(cert_pem), Some(key_pem)) => Some(TlsIdentity { cert_pem, key_pem }),
        (None, None) => None,
        _ => {
            return Err(py_err(core::Error::invalid_argument(
                "tls_cert and tls_key go together",
            )))
        }
    };
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

/// Installs a worker's logging: to stderr, what `COLOCATED_LOG` selects, else
/// colocated's warnings (refused requests, an insecure or exposed worker). A
/// library user's process stays silent unless it sets `COLOCATED_LOG`; only
/// `python -m colocated.worker` calls this, before anything else can.
#[pyfunction]
pub fn init_worker_logging() {
    core::trace::init_with_default_log(WORKER_DEFAULT_LOG);
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

/// A controller's session on one worker (private, low level): buffers by
/// handle, executables, executions. Every network wait releases the GIL.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct RemoteSession {
    inner: CoreSession,
}

#[pymethods]
impl RemoteSession {
    /// Opens a session on the worker at `address` (`HOST:PORT`).
    #[new]
    #[pyo3(signature = (address, *, token=None, timeout=10.0, tls_ca=None))]
    fn new(
        py: Python<'_>,
        address: String,
        token: Option<String>,
        timeout: f64,
        tls_ca: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let mut options = ConnectOptions::new(address, self::token(token)?);
        options.timeout = seconds("timeout", timeout)?;
        options.tls_ca = tls_ca;
        let inner = py
            .detach(|| CoreSession::connect(&options))
            .map_err(|e| to_py(py, &e))?;
        Ok(RemoteSession { inner })
    }

    /// The worker's devices: `(local id, kind)` each.
    fn devices(&self) -> Vec<(u32, String)> {
        self.inner
            .host()
            .devices
            .iter()
            .map(|d| (d.local_id, d.kind.clone()))
            .collect()
    }

    /// The program languages the worker runs.
    fn languages(&self) -> Vec<String> {
        self.inner.host().languages.clone()
    }

    /// A handle no object of this session has used yet.
    fn new_handle(&self) -> u64 {
        self.inner.new_handle()
    }

    /// Uploads `data` (row-major bytes) as buffer `handle` of dtype `dtype` (a
    /// core name such as `"int32"`) and `dims` on the worker's device `device`.
    fn put_buffer(
        &self,
        py: Python<'_>,
        handle: u64,
        device: u32,
        dtype: &str,
        dims: Vec<i64>,
        data: Vec<u8>,
    ) -> PyResult<()> {
        let dtype = core::DType::from_name(dtype).map_err(py_err)?;
        let spec = proto::BufferSpec {
            device,
            dtype: dtype as u32,
            dims,
        };
        py.detach(|| self.inner.put_buffer(handle, spec, data.into()))
            .map_err(|e| to_py(py, &e))
    }

    /// The bytes of buffer `handle` (waits until it is ready; raises the error
    /// of the execution that failed to make it).
    fn get_buffer<'py>(&self, py: Python<'py>, handle: u64) -> PyResult<Bound<'py, PyBytes>> {
        let data = py
            .detach(|| self.inner.get_buffer(handle))
            .map_err(|e| to_py(py, &e))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Loads a serialized executable (for the worker's devices) as `handle`;
    /// returns `(input buffers, output buffers)` of an execution.
    fn load_executable(
        &self,
        py: Python<'_>,
        handle: u64,
        executable: Vec<u8>,
    ) -> PyResult<(u32, u32)> {
        py.detach(|| self.inner.load_executable(handle, executable))
            .map_err(|e| to_py(py, &e))
    }

    /// Queues an execution on `stream`: `inputs` and `outputs` are buffer
    /// handles, argument-major.
    fn execute(
        &self,
        py: Python<'_>,
        executable: u64,
        inputs: Vec<u64>,
        outputs: Vec<u64>,
        stream: u64,
    ) -> PyResult<()> {
        py.detach(|| self.inner.execute(executable, &inputs, &outputs, stream))
            .map_err(|e| to_py(py, &e))
    }

    /// Queues an execution on the session's ordered control stream without
    /// waiting for the worker (a refusal fails the outputs; `flush` reports it).
    fn execute_async(
        &self,
        py: Python<'_>,
        executable: u64,
        inputs: Vec<u64>,
        outputs: Vec<u64>,
        stream: u64,
    ) -> PyResult<()> {
        py.detach(|| {
            self.inner
                .execute_async(executable, &inputs, &outputs, stream)
        })
        .map_err(|e| to_py(py, &e))
    }

    /// Waits until the worker took every queued operation; raises the first
    /// refusal since the last flush.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.flush()).map_err(|e| to_py(py, &e))
    }

    /// Closes the session (idempotent).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.disconnect())
            .map_err(|e| to_py(py, &e))
    }
}
