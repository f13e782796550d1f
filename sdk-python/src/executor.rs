//! The `python` language executor that hosts run: it loads a colocated Python
//! program (a cloudpickled host callable, or the controller's own callable by
//! reference) and runs it with the host's input arrays. What the programs
//! keep on a host — objects of colocated classes — is kept by core, per
//! session ([`host_object`]).

use std::sync::Arc;

use colocated_core as core;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::array::ArrayImpl;
use crate::errors::{py_err, to_py};

/// The language tag of colocated Python programs.
pub const LANGUAGE: &str = core::LANGUAGE_PYTHON;

/// Runs `python` programs: the payload is a cloudpickled callable that takes
/// one `ArrayImpl` per input and returns one per output (or, in a discovery
/// run, the outputs and their pickled tree structure).
pub struct PythonExecutor;

impl core::LanguageExecutor for PythonExecutor {
    fn load(&self, program: &core::Program) -> core::Result<Arc<dyn core::LoadedProgram>> {
        // The controller's own process hands its callable over by reference
        // (a value of core's registry, kept while the program lives).
        let local = if core::LocalValue::is_reference(&program.payload) {
            Some(core::LocalValue::resolve(&program.payload)?)
        } else {
            None
        };
        crate::interpreter::attach(|py| {
            let callable = match &local {
                Some(local) => local
                    .downcast_ref::<PyValue>()
                    .and_then(|v| v.0.as_ref())
                    .map(|v| v.clone_ref(py).into_bound(py))
                    .ok_or_else(|| {
                        pyo3::exceptions::PyValueError::new_err(
                            "the reference names a value of another language",
                        )
                    })?,
                None => py
                    .import("cloudpickle")?
                    .getattr("loads")?
                    .call1((PyBytes::new(py, &program.payload),))?,
            };
            let flat = FlatCall::of(&callable, &program.output_structure)?;
            Ok(Arc::new(PythonProgram {
                call: callable.unbind(),
                flat,
                _local: local.clone(),
            }) as Arc<dyn core::LoadedProgram>)
        })
        .ok_or_else(crate::interpreter::exiting_error)?
        .map_err(|e: PyErr| {
            core::Error::invalid_argument(format!("cannot load the colocated Python program: {e}"))
        })
    }

    /// Collects what the session's programs left in reference cycles (core
    /// destroyed the session's objects already), then gives the freed memory
    /// back to the system.
    fn session_ended(&self, _session: core::SessionKey) {
        // SAFETY: `Py_IsInitialized` may be called at any time, without the GIL.
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return;
        }
        crate::interpreter::attach(|py| {
            if let Err(e) = py.import("gc").and_then(|gc| gc.call_method0("collect")) {
                e.write_unraisable(py, None);
            }
        });
        release_freed_memory();
    }
}

extern "C" {
    /// mimalloc's own: returns the memory it holds free to the system
    /// (`force`: now, not after its purge delay). This module's Rust
    /// allocator is mimalloc (the `mimalloc` crate, see `lib.rs`, which links
    /// the library).
    fn mi_collect(force: bool);
}

/// Gives the memory both allocators of this process hold free back to the
/// system: mimalloc's (the Rust side's) and the C allocator's (CPython's
/// large objects and numpy's data).
fn release_freed_memory() {
    // SAFETY: `mi_collect` takes no pointers and may be called from any
    // thread at any time.
    unsafe {
        mi_collect(true);
    }
    core::release_freed_memory();
}

/// A loaded colocated Python program: a host callable (`_HostCall`) that takes a
/// list of `ArrayImpl`s and returns one per output spec.
struct PythonProgram {
    call: Py<PyAny>,
    /// The fast path of flat programs (see `FlatCall`).
    flat: Option<FlatCall>,
    /// The registration of the controller's own callable, which the program
    /// runs by reference: kept while the program is loaded.
    _local: Option<core::LocalValue>,
}

/// What a host needs to run a program that takes positional arrays and returns
/// one array without Python glue: the user function and the callers' sharding
/// objects of the inputs.
struct FlatCall {
    function: Py<PyAny>,
    in_shardings: Vec<Py<PyAny>>,
}

impl FlatCall {
    /// Hands a host callable being loaded the structure its results must
    /// have (core's `output_structure`, where the program has one: the
    /// callable checks it itself, more cheaply than it would pickle its
    /// result's), and returns its fast path when it takes positional arrays
    /// and returns one, as the package's `load_program` hook gives it (None
    /// for other callables, which always take the general path).
    fn of(call: &Bound<'_, PyAny>, structure: &[u8]) -> PyResult<Option<FlatCall>> {
        let py = call.py();
        let structure = (!structure.is_empty()).then(|| PyBytes::new(py, structure));
        let parts = crate::hooks::hooks(py)?
            .load_program
            .bind(py)
            .call1((call, structure))?;
        if parts.is_none() {
            return Ok(None);
        }
        let (function, shardings): (Bound<'_, PyAny>, Bound<'_, PyAny>) = parts.extract()?;
        let in_shardings = shardings
            .try_iter()?
            .map(|s| s.map(Bound::unbind))
            .collect::<PyResult<_>>()?;
        Ok(Some(FlatCall {
            function: function.unbind(),
            in_shardings,
        }))
    }
}

impl PythonProgram {
    /// Calls the program with `args` and returns its output arrays, and in a
    /// discovery run their pickled tree structure. Python errors (user code,
    /// or the output checks of `_HostCall`) carry their traceback.
    fn call(
        &self,
        py: Python<'_>,
        client: &core::Client,
        args: Vec<core::Array>,
        discovering: bool,
    ) -> core::Result<(Vec<core::Array>, Option<Vec<u8>>)> {
        let result = match &self.flat {
            Some(flat) if !discovering => match self.call_flat(py, flat, client, args) {
                Ok(Ok(arrays)) => return Ok((arrays, None)),
                Ok(Err(impls)) => impls,
                Err(e) => return Err(remote_error(py, e)),
            },
            _ => args
                .into_iter()
                .map(|a| Py::new(py, ArrayImpl::wrap(client.clone(), a)))
                .collect::<PyResult<Vec<_>>>()
                .and_then(|arrays| self.call.bind(py).call1((PyList::new(py, arrays)?,)))
                .map_err(|e| remote_error(py, e))?,
        };
        let bad = || {
            core::Error::invalid_argument(
                "a colocated Python function must return a pytree of colocated Arrays",
            )
        };
        let (impls, structure) = if discovering {
            let (impls, structure) = result
                .extract::<(Bound<'_, PyAny>, Vec<u8>)>()
                .map_err(|_| bad())?;
            (impls, Some(structure))
        } else {
            (result, None)
        };
        let impls = impls
            .extract::<Vec<PyRef<'_, ArrayImpl>>>()
            .map_err(|_| bad())?;
        let arrays = impls
            .iter()
            .map(|a| {
                a.array()
                    .cloned()
                    .map_err(|e| core::Error::internal(e.to_string()))
            })
            .collect::<core::Result<_>>()?;
        Ok((arrays, structure))
    }
    /// The flat fast path: the output array, or (for a result that is not one
    /// Array) what the general output checks of `_HostCall.outputs` return.
    fn call_flat<'py>(
        &self,
        py: Python<'py>,
        flat: &FlatCall,
        client: &core::Client,
        args: Vec<core::Array>,
    ) -> PyResult<Result<Vec<core::Array>, Bound<'py, PyAny>>> {
        let hooks = crate::hooks::hooks(py)?;
        let wrap = hooks.wrap_array.bind(py);
        let mut leaves = Vec::with_capacity(args.len());
        for (array, sharding) in args.into_iter().zip(&flat.in_shardings) {
            let impl_ = Bound::new(py, ArrayImpl::wrap(client.clone(), array))?;
            leaves.push(wrap.call1((impl_, sharding.bind(py)))?);
        }
        let out = flat.function.bind(py).call1(PyTuple::new(py, leaves)?)?;
        if out.get_type().is(hooks.array_type.bind(py)) {
            let impl_ = out.getattr(pyo3::intern!(py, "_impl"))?;
            return Ok(Ok(vec![impl_.cast::<ArrayImpl>()?.get().array()?.clone()]));
        }
        self.call
            .bind(py)
            .call_method1(pyo3::intern!(py, "outputs"), (out,))
            .map(Err)
    }
}

/// The text of a Python exception with its traceback, as the host saw it;
/// its code is the exception's own where it is one of the runtime's (a
/// `ColocatedError` raised on the host, such as the output checks'), else
/// `internal`.
fn remote_error(py: Python<'_>, err: PyErr) -> core::Error {
    let message = err.to_string();
    let value = err.value(py);
    let ours = crate::hooks::hooks(py)
        .and_then(|hooks| value.is_instance(hooks.error_type.bind(py)))
        .unwrap_or(false);
    let code = ours
        .then(|| value.getattr(pyo3::intern!(py, "code")).ok())
        .flatten()
        .and_then(|code| code.extract::<String>().ok())
        .and_then(|name| core::ErrorCode::from_name(&name))
        .unwrap_or(core::ErrorCode::Internal);
    let traceback = py
        .import("traceback")
        .and_then(|tb| {
            tb.call_method1(
                "format_exception",
                (err.get_type(py), err.value(py), err.traceback(py)),
            )
        })
        .and_then(|lines| lines.extract::<Vec<String>>())
        .map(|lines| lines.concat())
        .unwrap_or_else(|_| message.clone());
    core::Error::new(code, message).with_remote_traceback(traceback)
}

thread_local! {
    static THREAD_STATE_KEPT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives a runtime thread that runs Python one Python thread state for its whole
/// life. Without it every `Python::attach` on such a thread creates and destroys
/// a thread state, and with it the frame stack (an mmap and munmap per call).
fn keep_python_thread_state() {
    THREAD_STATE_KEPT.with(|kept| {
        if kept.get() || crate::interpreter::exiting() {
            return;
        }
        // SAFETY: all three calls are part of the stable ABI. A thread with a
        // thread state (a Python thread, or one inside `attach` further up its
        // stack) needs nothing now. A thread without one does not hold the GIL:
        // `PyGILState_Ensure` makes its state and takes the GIL, and
        // `PyEval_SaveThread` releases the GIL while the state (whose count
        // `Ensure` raised) stays for every later `attach` of this thread.
        unsafe {
            if pyo3::ffi::PyGILState_GetThisThreadState().is_null() {
                let _state = pyo3::ffi::PyGILState_Ensure();
                pyo3::ffi::PyEval_SaveThread();
                kept.set(true);
            }
        }
    });
}

impl core::LoadedProgram for PythonProgram {
    /// Python needs the GIL, which the calling thread holds until it waits: a
    /// call it waits on runs on that thread, with no GIL handoff.
    fn waiter_first(&self) -> bool {
        true
    }

    fn run(&self, ctx: &mut core::ExecutionContext<'_>) -> core::Result<()> {
        keep_python_thread_state();
        // `call_host_callback` from the program reaches these.
        let _callbacks = CurrentCallbacks::enter(ctx.host_callbacks());
        // The object store of the program's session.
        let _session = CurrentSession::enter(ctx.session());
        // The arrays as this host holds them: its part of each global array.
        let args = ctx.host_input_arrays()?;
        let (client, discovering) = (ctx.client(), ctx.discovering());
        let (outputs, structure) =
            crate::interpreter::attach(|py| self.call(py, client, args, discovering))
                .ok_or_else(crate::interpreter::exiting_error)??;
        ctx.set_host_outputs(outputs, structure)
    }
}

thread_local! {
    /// The session of the program running on this thread (`LOCAL` outside
    /// programs).
    static CURRENT_SESSION: std::cell::Cell<core::SessionKey> =
        const { std::cell::Cell::new(core::SessionKey::LOCAL) };
}

/// Makes a program's session current on this thread while it runs, and
/// restores the outer program's.
struct CurrentSession(core::SessionKey);

impl CurrentSession {
    fn enter(session: core::SessionKey) -> CurrentSession {
        CurrentSession(CURRENT_SESSION.with(|c| c.replace(session)))
    }
}

impl Drop for CurrentSession {
    fn drop(&mut self) {
        CURRENT_SESSION.with(|c| c.set(self.0));
    }
}

/// The session of the colocated program running on this thread: on a worker,
/// the key of the controller's session it runs for; 0 (the local session)
/// for programs a process runs for its own client, and outside programs.
#[pyfunction]
pub fn current_session() -> u64 {
    CURRENT_SESSION.with(|c| c.get()).as_u64()
}

/// A Python value that core keeps on a host (an object of a colocated class,
/// or its constructor's exception): released with the GIL taken, so that its
/// `__del__` runs when core drops it, on that thread.
struct PyValue(Option<Py<PyAny>>);

impl Drop for PyValue {
    fn drop(&mut self) {
        let Some(value) = self.0.take() else { return };
        // SAFETY: `Py_IsInitialized` may be called at any time, without the GIL.
        let value = std::cell::Cell::new(Some(value));
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0
            || crate::interpreter::attach(|_py| drop(value.take())).is_none()
        {
            // The interpreter is gone or going: nothing can run its destructor.
            std::mem::forget(value.take());
        }
    }
}

fn py_value(py: Python<'_>, value: &core::HostValue) -> PyResult<Py<PyAny>> {
    let value: &(dyn std::any::Any + Send + Sync) = &**value;
    value
        .downcast_ref::<PyValue>()
        .and_then(|v| v.0.as_ref())
        .map(|v| v.clone_ref(py))
        .ok_or_else(|| py_err(core::Error::internal("a host object of another language")))
}

/// A host callable of this process registered in core's registry of local
/// values, which its own host runs by reference (no serialization): the
/// registration lasts while this handle or a program loaded from its
/// reference lives.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct LocalProgram(core::LocalValue);

#[pymethods]
impl LocalProgram {
    /// Registers `callable`.
    #[new]
    fn new(callable: Py<PyAny>) -> LocalProgram {
        LocalProgram(core::LocalValue::register(Arc::new(PyValue(Some(
            callable,
        )))))
    }

    /// The program payload that names the callable (on this process only).
    #[getter]
    fn reference<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.0.reference().as_bytes())
    }
}

/// How many values (callables of this process run by reference) core's
/// registry holds now.
#[pyfunction]
pub fn local_values() -> usize {
    core::local_values()
}

/// The object `obj_id` of the running program's session on this host: built
/// by calling `build()` on first use (once, even with calls from several
/// streams), then the same object. A constructor that raised raises its
/// exception again on every later call.
#[pyfunction]
pub fn host_object(py: Python<'_>, obj_id: u64, build: Py<PyAny>) -> PyResult<Py<PyAny>> {
    let session = CURRENT_SESSION.with(|c| c.get());
    let built = py.detach(move || {
        core::host_object(session, obj_id, move || {
            Python::attach(|py| match build.bind(py).call0() {
                Ok(obj) => Ok(Arc::new(PyValue(Some(obj.unbind()))) as core::HostValue),
                Err(e) => {
                    Err(Arc::new(PyValue(Some(e.into_value(py).into_any()))) as core::HostValue)
                }
            })
        })
    });
    match built {
        Ok(obj) => py_value(py, &obj),
        Err(error) => Err(PyErr::from_value(py_value(py, &error)?.into_bound(py))),
    }
}

/// This host's id of the device the controller calls `id`, while a worker
/// loads a program that controller sent (None otherwise: ids are this
/// process's own). Raises `NotFoundError` for a device of the controller that
/// is not on this host.
#[pyfunction]
pub fn controller_device_id(id: u32) -> PyResult<Option<u32>> {
    core::controller_device_id(id).map_err(py_err)
}

/// How many objects of colocated classes the running program's session
/// (`every_session`: all sessions) holds on this host.
#[pyfunction]
#[pyo3(signature = (every_session=false))]
pub fn host_objects(every_session: bool) -> usize {
    core::host_objects((!every_session).then(|| CURRENT_SESSION.with(|c| c.get())))
}

/// How many discovery results the running program's session
/// (`every_session`: all sessions) has parked on this host, waiting for
/// their controller to take them.
#[pyfunction]
#[pyo3(signature = (every_session=false))]
pub fn parked_results(every_session: bool) -> usize {
    core::parked_results((!every_session).then(|| CURRENT_SESSION.with(|c| c.get())))
}

thread_local! {
    /// The host callbacks of the program running on this thread.
    static CURRENT_CALLBACKS: std::cell::RefCell<Vec<core::LoadedHostCallback>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Makes a program's host callbacks current on this thread while it runs, and
/// restores the outer program's (a program may wait on, and so run, another).
struct CurrentCallbacks(Vec<core::LoadedHostCallback>);

impl CurrentCallbacks {
    fn enter(callbacks: &[core::LoadedHostCallback]) -> CurrentCallbacks {
        let outer = CURRENT_CALLBACKS.with(|c| c.replace(callbacks.to_vec()));
        CurrentCallbacks(outer)
    }
}

impl Drop for CurrentCallbacks {
    fn drop(&mut self) {
        let outer = std::mem::take(&mut self.0);
        CURRENT_CALLBACKS.with(|c| *c.borrow_mut() = outer);
    }
}

/// Calls host callback `index` of the colocated program running on this thread
/// with `data` and returns its answer (from the controller, when the program
/// runs on a worker). Waits without the GIL. Raises `FailedPreconditionError`
/// outside a running program, `InvalidArgumentError` for an index it lacks,
/// and the callback's error.
#[pyfunction]
pub fn call_host_callback<'py>(
    py: Python<'py>,
    index: usize,
    data: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let callback = CURRENT_CALLBACKS.with(|c| {
        let callbacks = c.borrow();
        if callbacks.is_empty() {
            return Err(core::Error::failed_precondition(
                "host callbacks are called from inside a colocated program that was compiled with them",
            ));
        }
        callbacks.get(index).cloned().ok_or_else(|| {
            core::Error::invalid_argument(format!(
                "host callback {index} is out of range (the program has {})",
                callbacks.len()
            ))
        })
    });
    let callback = callback.map_err(py_err)?;
    // `data` borrows an immutable `bytes` the caller holds: readable without
    // the GIL.
    let answer = py
        .detach(move || callback.call(data))
        .map_err(|e| to_py(py, &e))?;
    Ok(PyBytes::new(py, &answer))
}

/// A Python callable (bytes -> bytes) as a host callback. A Python exception
/// becomes an error carrying its traceback.
pub(crate) fn host_callback(name: String, callable: Py<PyAny>) -> core::LoadedHostCallback {
    core::LoadedHostCallback::new(name, move |input| {
        crate::interpreter::attach(|py| {
            callable
                .bind(py)
                .call1((PyBytes::new(py, input),))
                .and_then(|answer| answer.extract::<Vec<u8>>())
                .map_err(|e| remote_error(py, e))
        })
        .ok_or_else(crate::interpreter::exiting_error)?
    })
}
