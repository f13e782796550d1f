//! `_colocated.RemoteSession`: a controller's session on one worker driven by
//! hand, for the SDK's tests (the `testing` feature; the runtime's own
//! sessions live under `Client.connect`).

use colocated_core as core;
use core::session::{ConnectOptions, RemoteSession as CoreSession};
use core::transport::{proto, Token};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{py_err, to_py};
use crate::remote::seconds;

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
        let mut options =
            ConnectOptions::new(address, token.map(Token::new).transpose().map_err(py_err)?);
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
            memory_kind: 0,
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
