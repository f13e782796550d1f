//! Core errors as Python exceptions. The exception classes are defined once, in
//! `colocated/_errors.py` (each subclasses `ColocatedError` and the builtin that
//! fits, which `create_exception!` cannot express); this module builds instances
//! with the package's hook (`error_from_core`, see `crate::hooks`).

use colocated_core::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The Python exception for a core error (its class follows the code; a remote
/// traceback makes it a `RemoteError`).
pub fn to_py(py: Python<'_>, err: &Error) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let from_core = crate::hooks::hooks(py)?.error_from_core.bind(py);
        let exc = from_core.call1((err.code().name(), err.message(), err.remote_traceback()))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|_| PyRuntimeError::new_err(err.to_string()))
}

/// `Result` adaptor: `core_call().map_err(py_err)?`.
pub fn py_err(err: Error) -> PyErr {
    Python::attach(|py| to_py(py, &err))
}
