//! What the Python package hands this module once, at import
//! (`_colocated._register_hooks`, called by `colocated/__init__.py`): the few
//! Python callables and objects the native code calls, so that it imports no
//! private name of the package and looks each up once.
//!
//! Besides the hooks, the native code reads two attributes of the package's
//! objects on its hot paths, where a hook call would cost more than the
//! work: `Array._impl` (the `ArrayImpl` an `Array` wraps, a slot of the
//! `array_type` hook's class) and, as `FunctionBase`'s subclass contract,
//! `_state` (the `FunctionState` of a colocated function) and
//! `_call_general(args, kwargs)` (a call the native fast path leaves to
//! Python).

use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The package's hooks (see [`register_hooks`]).
pub(crate) struct Hooks {
    /// `colocated.Array`, for type checks by identity.
    pub array_type: Py<PyAny>,
    /// `(ArrayImpl, sharding or None) -> Array`: wraps a native array.
    pub wrap_array: Py<PyAny>,
    /// `(code name, message, remote traceback or None) -> exception`.
    pub error_from_core: Py<PyAny>,
    /// `colocated.ColocatedError`: an exception of the runtime's, whose
    /// `code` a host keeps when its code raises one.
    pub error_type: Py<PyAny>,
    /// `() -> bool`: whether the calling thread is a thread pool's worker.
    pub is_pool_thread: Py<PyAny>,
    /// `() -> int`: the stream scope of the pool's work item running now.
    pub work_item_scope: Py<PyAny>,
    /// `(device id, client id) -> (callable, args)`: a device's `__reduce__`.
    pub reduce_device: Py<PyAny>,
    /// `{core dtype name: numpy dtype}`.
    pub numpy_dtypes: Py<PyAny>,
    /// `(host callable, output structure or None) -> (function, input
    /// shardings) | None`: a program being loaded (its callable learns the
    /// structure its results must have, where core carries one), and its
    /// fast path when it takes positional arrays and returns one array.
    pub load_program: Py<PyAny>,
    /// `(Client) -> None`: tells the package of a client wrapper made here
    /// (core's default client's).
    pub register_client: Py<PyAny>,
}

static HOOKS: PyOnceLock<Hooks> = PyOnceLock::new();

/// Registers the package's hooks (see [`Hooks`] for what each is). Called
/// once per process by the package; a later call changes nothing (a module
/// reloaded keeps the hooks of its first import).
#[pyfunction]
#[pyo3(name = "_register_hooks", signature = (
    *, array_type, wrap_array, error_from_core, error_type, is_pool_thread, work_item_scope,
    reduce_device, numpy_dtypes, load_program, register_client
))]
#[allow(clippy::too_many_arguments)]
pub fn register_hooks(
    py: Python<'_>,
    array_type: Py<PyAny>,
    wrap_array: Py<PyAny>,
    error_from_core: Py<PyAny>,
    error_type: Py<PyAny>,
    is_pool_thread: Py<PyAny>,
    work_item_scope: Py<PyAny>,
    reduce_device: Py<PyAny>,
    numpy_dtypes: Py<PyAny>,
    load_program: Py<PyAny>,
    register_client: Py<PyAny>,
) {
    let _ = HOOKS.set(
        py,
        Hooks {
            array_type,
            wrap_array,
            error_from_core,
            error_type,
            is_pool_thread,
            work_item_scope,
            reduce_device,
            numpy_dtypes,
            load_program,
            register_client,
        },
    );
}

/// The package's hooks; `ImportError` before the package registered them.
pub(crate) fn hooks(py: Python<'_>) -> PyResult<&'static Hooks> {
    HOOKS.get(py).ok_or_else(|| {
        PyImportError::new_err(
            "colocated._colocated is used before the colocated package registered its hooks \
             (import colocated first)",
        )
    })
}
