//! Colocated Python: the `python` language executor that hosts run, and the
//! controller-side function state (the input-spec cache and the call rules, both
//! from core) behind `colocated.colocated_python`.

use std::sync::Arc;

use colocated_core as core;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::array::ArrayImpl;
use crate::client::Device;
use crate::errors::{py_err, to_py};
use crate::event::Event;
use crate::fork::ForkSafe;
use crate::sharding::Sharding;

/// Payload prefix of a program whose callable lives in this process
/// (`_LOCAL_PROGRAMS` of `colocated._colocated_python`), followed by its key.
const LOCAL_PREFIX: &[u8] = b"colocated-local:";

/// The language tag of colocated Python programs.
pub const LANGUAGE: &str = core::LANGUAGE_PYTHON;

/// Runs `python` programs: the payload is a cloudpickled callable that takes one
/// `ArrayImpl` per input spec and returns one per output spec.
pub struct PythonExecutor;

impl core::LanguageExecutor for PythonExecutor {
    fn load(&self, program: &core::Program) -> core::Result<Arc<dyn core::LoadedProgram>> {
        Python::attach(|py| {
            // The controller's own process hands its callable over by reference.
            let callable = match program.payload.strip_prefix(LOCAL_PREFIX) {
                Some(key) => {
                    let key: u64 = std::str::from_utf8(key)
                        .ok()
                        .and_then(|k| k.parse().ok())
                        .ok_or_else(|| {
                            pyo3::exceptions::PyValueError::new_err(
                                "malformed local program reference",
                            )
                        })?;
                    py.import("colocated._colocated_python")?
                        .getattr("_LOCAL_PROGRAMS")?
                        .get_item(key)?
                }
                None => py
                    .import("cloudpickle")?
                    .getattr("loads")?
                    .call1((PyBytes::new(py, &program.payload),))?,
            };
            let flat = FlatCall::of(&callable)?;
            Ok(Arc::new(PythonProgram {
                call: callable.unbind(),
                flat,
            }) as Arc<dyn core::LoadedProgram>)
        })
        .map_err(|e: PyErr| {
            core::Error::invalid_argument(format!("cannot load the colocated Python program: {e}"))
        })
    }

    /// Drops what the session's programs left on this host — objects of
    /// colocated classes (their `__del__` runs here) and parked discovery
    /// results — then gives the freed memory back to the system.
    fn session_ended(&self, session: core::SessionKey) {
        // SAFETY: `Py_IsInitialized` may be called at any time, without the GIL.
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return;
        }
        Python::attach(|py| {
            let ended = py
                .import("colocated._colocated_class")
                .and_then(|m| m.call_method1("_end_session", (session.as_u64(),)));
            if let Err(e) = ended {
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
}

/// What a host needs to run a program that takes positional arrays and returns
/// one array without Python glue: the user function and the callers' sharding
/// objects of the inputs.
struct FlatCall {
    function: Py<PyAny>,
    in_shardings: Vec<Py<PyAny>>,
}

impl FlatCall {
    /// The fast path of a `_HostCall` whose `flat` and `out_leaf` hold (None for
    /// other callables, which always take the general path).
    fn of(call: &Bound<'_, PyAny>) -> PyResult<Option<FlatCall>> {
        let flag = |name: &str| -> bool {
            call.getattr(name)
                .and_then(|v| v.extract::<bool>())
                .unwrap_or(false)
        };
        if !flag("flat") || !flag("out_leaf") {
            return Ok(None);
        }
        let in_shardings = call
            .getattr("in_shardings")?
            .try_iter()?
            .map(|s| s.map(Bound::unbind))
            .collect::<PyResult<_>>()?;
        Ok(Some(FlatCall {
            function: call.getattr("fn")?.unbind(),
            in_shardings,
        }))
    }
}

impl PythonProgram {
    /// Calls the program with `args` and returns its output arrays. Python errors
    /// (user code, or the output checks of `_HostCall`) carry their traceback.
    fn call(
        &self,
        py: Python<'_>,
        client: &core::Client,
        args: Vec<core::Array>,
    ) -> core::Result<Vec<core::Array>> {
        let impls = match &self.flat {
            Some(flat) => match self.call_flat(py, flat, client, args) {
                Ok(Ok(arrays)) => return Ok(arrays),
                Ok(Err(impls)) => impls,
                Err(e) => return Err(remote_error(py, e)),
            },
            None => args
                .into_iter()
                .map(|a| Py::new(py, ArrayImpl::wrap(client.clone(), a)))
                .collect::<PyResult<Vec<_>>>()
                .and_then(|arrays| self.call.bind(py).call1((PyList::new(py, arrays)?,)))
                .map_err(|e| remote_error(py, e))?,
        };
        let impls = impls.extract::<Vec<PyRef<'_, ArrayImpl>>>().map_err(|_| {
            core::Error::invalid_argument(
                "a colocated Python function must return a pytree of colocated Arrays",
            )
        })?;
        impls
            .iter()
            .map(|a| {
                a.array()
                    .cloned()
                    .map_err(|e| core::Error::internal(e.to_string()))
            })
            .collect()
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
        let wrap = WRAP.import(py, "colocated._array", "_wrap")?;
        let mut leaves = Vec::with_capacity(args.len());
        for (array, sharding) in args.into_iter().zip(&flat.in_shardings) {
            let impl_ = Bound::new(py, ArrayImpl::wrap(client.clone(), array))?;
            leaves.push(wrap.call1((impl_, sharding.bind(py)))?);
        }
        let out = flat.function.bind(py).call1(PyTuple::new(py, leaves)?)?;
        let array_type = ARRAY_TYPE.import(py, "colocated._array", "Array")?;
        if out.get_type().is(array_type) {
            let impl_ = out.getattr(pyo3::intern!(py, "_impl"))?;
            return Ok(Ok(vec![impl_.cast::<ArrayImpl>()?.get().array()?.clone()]));
        }
        self.call
            .bind(py)
            .call_method1(pyo3::intern!(py, "outputs"), (out,))
            .map(Err)
    }
}

/// The text of a Python exception with its traceback, as the host saw it.
fn remote_error(py: Python<'_>, err: PyErr) -> core::Error {
    let message = err.to_string();
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
    core::Error::internal(message).with_remote_traceback(traceback)
}

thread_local! {
    static THREAD_STATE_KEPT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives a runtime thread that runs Python one Python thread state for its whole
/// life. Without it every `Python::attach` on such a thread creates and destroys
/// a thread state, and with it the frame stack (an mmap and munmap per call).
fn keep_python_thread_state() {
    THREAD_STATE_KEPT.with(|kept| {
        if kept.get() {
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
        // The object store and parked results of the program's session.
        let _session = CurrentSession::enter(ctx.session());
        // The arrays as this host holds them: its part of each global array.
        let (input_specs, output_specs) = (ctx.host_input_specs(), ctx.host_output_specs());
        let mut at = 0;
        let mut args = Vec::with_capacity(input_specs.len());
        for (spec, &count) in input_specs.iter().zip(ctx.input_shard_counts()) {
            if count != spec.sharding.devices().len() {
                return Err(core::Error::unimplemented(
                    "this host's shards of an input are not one block of the array",
                ));
            }
            let buffers = ctx.inputs()[at..at + count].to_vec();
            at += count;
            args.push(core::Array::assemble(spec.clone(), buffers)?);
        }
        let client = ctx.client();
        let outputs = Python::attach(|py| self.call(py, client, args))?;
        if outputs.len() != output_specs.len() {
            return Err(core::Error::invalid_argument(format!(
                "the function returned {} arrays but {} were expected",
                outputs.len(),
                output_specs.len()
            )));
        }
        for (o, (got, want)) in outputs.iter().zip(output_specs).enumerate() {
            if !got.spec().matches(want) {
                return Err(core::Error::invalid_argument(format!(
                    "output {o} is {} on {:?} but {} on {:?} was expected (outputs must use the inputs' devices)",
                    got.spec().describe(),
                    got.sharding(),
                    want.describe(),
                    want.sharding
                )));
            }
        }
        for (k, shard) in ctx.output_shards().iter().enumerate() {
            let (o, device) = (shard.output, &shard.device);
            let array = &outputs[o];
            let pos = array
                .sharding()
                .devices()
                .iter()
                .position(|d| d == device)
                .ok_or_else(|| {
                    core::Error::internal(format!("output {o} has no shard on {device}"))
                })?;
            ctx.set_output(k, array.buffers()[pos].clone())?;
        }
        Ok(())
    }
}

thread_local! {
    /// The session of the program running on this thread (`LOCAL` outside
    /// programs).
    static CURRENT_SESSION: std::cell::Cell<u64> =
        const { std::cell::Cell::new(core::SessionKey::LOCAL.as_u64()) };
}

/// Makes a program's session current on this thread while it runs, and
/// restores the outer program's.
struct CurrentSession(u64);

impl CurrentSession {
    fn enter(session: core::SessionKey) -> CurrentSession {
        CurrentSession(CURRENT_SESSION.with(|c| c.replace(session.as_u64())))
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
/// What programs leave on a host (objects of colocated classes, parked
/// discovery results) is kept per session and freed when it ends.
#[pyfunction]
pub fn current_session() -> u64 {
    CURRENT_SESSION.with(|c| c.get())
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
fn host_callback(name: String, callable: Py<PyAny>) -> core::LoadedHostCallback {
    core::LoadedHostCallback::new(name, move |input| {
        Python::attach(|py| {
            callable
                .bind(py)
                .call1((PyBytes::new(py, input),))
                .and_then(|answer| answer.extract::<Vec<u8>>())
                .map_err(|e| remote_error(py, e))
        })
    })
}

/// A spec leaf from Python: dtype name, shape and core sharding.
type SpecLeaf<'py> = (String, Vec<i64>, PyRef<'py, Sharding>);

fn array_spec(leaf: &SpecLeaf<'_>) -> PyResult<core::ArraySpec> {
    let dtype = core::DType::ALL
        .iter()
        .copied()
        .find(|d| d.name() == leaf.0)
        .ok_or_else(|| {
            py_err(core::Error::invalid_argument(format!(
                "unsupported dtype {}",
                leaf.0
            )))
        })?;
    let (_, sharding) = leaf.2.get()?;
    core::ArraySpec::new(leaf.1.clone(), dtype, sharding.clone()).map_err(py_err)
}

fn call_spec(tree: u64, arrays: &[PyRef<'_, ArrayImpl>]) -> PyResult<core::CallSpec> {
    let leaves = arrays
        .iter()
        .map(|a| a.array().map(|a| a.spec().clone()))
        .collect::<PyResult<_>>()?;
    Ok(core::CallSpec { tree, leaves })
}

/// The tree key of a call whose arguments are `n` positional arrays and no
/// keywords (`_FLAT_KEY` in `_colocated_python.py`); other calls use their tree
/// structure's hash. Entries remember their arity, so a hash that collides with
/// a flat key never takes the fast path.
fn flat_key(n: usize) -> u64 {
    FLAT_KEY | n as u64
}

/// High bits of every flat-call key.
const FLAT_KEY: u64 = 0xF1A7_0000_0000_0000;

static ARRAY_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static WRAP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A compiled program for one input spec, with what the fast path needs to call
/// it without Python code.
struct Entry {
    /// The Python `_Entry` (what the general path uses).
    py: Py<PyAny>,
    executable: ForkSafe<core::LoadedExecutable>,
    /// `Some(n)` when the program takes `n` positional arrays and no keywords.
    flat_arity: Option<usize>,
    /// The callers' sharding objects of the outputs.
    out_shardings: Vec<Py<PyAny>>,
    out_treedef: Py<PyAny>,
    /// True when the output tree is one array (no unflatten needed).
    out_leaf: bool,
}

/// Controller-side state of one colocated function: its specialization
/// (`devices`, `in_specs`) and its cache of compiled programs per input spec.
#[pyclass(module = "colocated._colocated", frozen, weakref)]
pub struct FunctionState {
    devices: Option<Vec<core::Device>>,
    /// The client of the specialized `devices`.
    devices_client: Option<ForkSafe<core::Client>>,
    in_specs: Option<core::CallSpec>,
    cache: core::SpecCache<Arc<Entry>>,
    /// Tags the state with the process that made it: a forked child takes the
    /// general path, which starts over.
    made_here: ForkSafe<()>,
}

impl FunctionState {
    /// Applies the call rules to `spec`: one device set, `devices` for
    /// argument-less calls, the specialized `in_specs`.
    fn check(&self, py: Python<'_>, spec: &core::CallSpec) -> PyResult<Vec<core::Device>> {
        let devices = spec
            .devices(self.devices.as_deref())
            .map_err(|e| to_py(py, &e))?;
        if let Some(expected) = &self.in_specs {
            spec.check_matches(expected).map_err(|e| to_py(py, &e))?;
        }
        Ok(devices)
    }
}

#[pymethods]
impl FunctionState {
    /// State for a function specialized with `devices` and/or `in_specs` (a tree
    /// key and one spec leaf per argument leaf).
    #[new]
    #[pyo3(signature = (devices=None, in_specs=None))]
    fn new(
        devices: Option<Vec<PyRef<'_, Device>>>,
        in_specs: Option<(u64, Vec<SpecLeaf<'_>>)>,
    ) -> PyResult<Self> {
        let devices_client = match devices.as_deref().and_then(|ds| ds.first()) {
            Some(d) => Some(ForkSafe::new(d.client.get().map_err(py_err)?.clone())),
            None => None,
        };
        let devices = devices
            .map(|ds| {
                ds.iter()
                    .map(|d| d.inner.get().cloned().map_err(py_err))
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?;
        let in_specs = in_specs
            .map(|(tree, leaves)| {
                Ok::<_, PyErr>(core::CallSpec {
                    tree,
                    leaves: leaves.iter().map(array_spec).collect::<PyResult<_>>()?,
                })
            })
            .transpose()?;
        Ok(FunctionState {
            devices,
            devices_client,
            in_specs,
            cache: core::SpecCache::default(),
            made_here: ForkSafe::new(()),
        })
    }

    /// The whole call when it is the common case — positional colocated Arrays,
    /// no keywords, a program already compiled for their spec — in one native
    /// step: the call rules, the cache lookup, the (asynchronous) execution and
    /// the wrapped outputs. Returns `NotImplemented` for anything else, which the
    /// general path handles (and counts as the cache miss).
    #[pyo3(signature = (args, kwargs=None))]
    fn call<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let general = || Ok(py.NotImplemented().into_bound(py));
        if self.made_here.get().is_err() || kwargs.is_some_and(|k| !k.is_empty()) {
            return general();
        }
        let array_type = ARRAY_TYPE.import(py, "colocated._array", "Array")?;
        let mut impls = Vec::with_capacity(args.len());
        for arg in args.iter() {
            if !arg.get_type().is(array_type) {
                return general();
            }
            impls.push(
                arg.getattr(pyo3::intern!(py, "_impl"))?
                    .cast_into::<ArrayImpl>()?,
            );
        }
        let arrays = impls
            .iter()
            .map(|i| i.get().array().cloned())
            .collect::<PyResult<Vec<_>>>()?;
        let spec = core::CallSpec {
            tree: flat_key(arrays.len()),
            leaves: arrays.iter().map(|a| a.spec().clone()).collect(),
        };
        self.check(py, &spec)?;
        let Some(entry) = self.cache.get_hit(&spec) else {
            return general();
        };
        let (Some(arity), Ok(exe)) = (entry.flat_arity, entry.executable.get()) else {
            return general();
        };
        if arity != arrays.len() {
            return general();
        }
        crate::streams::enter_call_scope(py)?;
        let run = exe
            .execute(&arrays, &core::ExecuteOptions::default())
            .map_err(py_err)?;
        let wrap = WRAP.import(py, "colocated._array", "_wrap")?;
        let mut outputs = Vec::with_capacity(run.outputs.len());
        for (array, sharding) in run.outputs.into_iter().zip(&entry.out_shardings) {
            let impl_ = Bound::new(py, ArrayImpl::wrap(exe.client().clone(), array))?;
            outputs.push(wrap.call1((impl_, sharding.bind(py)))?);
        }
        if entry.out_leaf && outputs.len() == 1 {
            if let Some(out) = outputs.pop() {
                return Ok(out);
            }
        }
        entry
            .out_treedef
            .bind(py)
            .call_method1(pyo3::intern!(py, "unflatten"), (PyList::new(py, outputs)?,))
    }

    /// Checks a call (`tree` key and argument arrays) against the rules — one
    /// device set, `devices` for argument-less calls, the specialized in_specs —
    /// and returns the cached entry for its spec, or None.
    fn lookup(
        &self,
        py: Python<'_>,
        tree: u64,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let spec = call_spec(tree, &arrays)?;
        self.check(py, &spec)?;
        Ok(self.cache.get(&spec).map(|entry| entry.py.clone_ref(py)))
    }

    /// The devices a call with these arguments runs on, as objects of the
    /// arrays' client (or of the specialized devices').
    fn call_devices(
        &self,
        py: Python<'_>,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
    ) -> PyResult<Vec<Device>> {
        let spec = call_spec(0, &arrays)?;
        let devices = spec
            .devices(self.devices.as_deref())
            .map_err(|e| to_py(py, &e))?;
        let client = match (arrays.first(), &self.devices_client) {
            (Some(array), _) => array.client()?.clone(),
            (None, Some(client)) => client.get().map_err(py_err)?.clone(),
            (None, None) => {
                return Err(py_err(core::Error::internal(
                    "a call without arrays ran without devices",
                )))
            }
        };
        Ok(devices
            .iter()
            .map(|d| Device::new(client.clone(), d.clone()))
            .collect())
    }

    /// Caches `entry` (a `_Entry`: `executable`, `out_treedef`, `out_shardings`)
    /// for calls shaped like `arrays` with tree key `tree`. `flat_arity` is the
    /// number of positional arrays of a flat call (None otherwise); `out_leaf`
    /// says the output tree is one array.
    fn insert(
        &self,
        tree: u64,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
        entry: Bound<'_, PyAny>,
        flat_arity: Option<usize>,
        out_leaf: bool,
    ) -> PyResult<()> {
        let spec = call_spec(tree, &arrays)?;
        let executable = entry.getattr("executable")?;
        let executable = executable
            .cast::<Executable>()?
            .get()
            .inner
            .get()
            .map_err(py_err)?;
        let out_shardings = entry
            .getattr("out_shardings")?
            .try_iter()?
            .map(|s| s.map(Bound::unbind))
            .collect::<PyResult<_>>()?;
        let cached = Entry {
            executable: ForkSafe::new(executable.clone()),
            flat_arity,
            out_shardings,
            out_treedef: entry.getattr("out_treedef")?.unbind(),
            out_leaf,
            py: entry.unbind(),
        };
        self.cache.insert(&spec, Arc::new(cached));
        Ok(())
    }

    /// `(hits, misses, currsize)`.
    fn cache_info(&self) -> (u64, u64, usize) {
        let info = self.cache.info();
        (info.hits, info.misses, info.currsize)
    }

    /// Drops every cached program.
    fn clear(&self) {
        self.cache.clear();
    }
}

/// The native base of `colocated.ColocatedFunction`: its `__call__`, so that a call
/// that takes the fast path (see `FunctionState.call`) runs no Python code of the
/// SDK. It reads the function's state from the `_state` attribute and leaves
/// every other call to the `_call_general(args, kwargs)` method.
#[pyclass(module = "colocated._colocated", subclass, dict, weakref, frozen)]
pub struct FunctionBase;

#[pymethods]
impl FunctionBase {
    /// Accepts (and ignores) the subclass's constructor arguments.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        FunctionBase
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let state = slf.getattr(pyo3::intern!(py, "_state"))?;
        let out = state
            .cast::<FunctionState>()?
            .get()
            .call(py, args, kwargs)?;
        if !out.is(py.NotImplemented()) {
            return Ok(out);
        }
        slf.call_method1(pyo3::intern!(py, "_call_general"), (args, kwargs))
    }
}

/// A compiled colocated Python program.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct Executable {
    inner: ForkSafe<core::LoadedExecutable>,
}

#[pymethods]
impl Executable {
    /// Compiles a `python` program: `payload` (cloudpickle bytes of the host
    /// callable), input and output spec leaves, the devices it runs on, and the
    /// host callbacks it may call (`bytes -> bytes` callables of this process,
    /// by index; see `call_host_callback`).
    #[staticmethod]
    #[pyo3(signature = (name, payload, input_specs, output_specs, devices, host_callbacks=Vec::new()))]
    fn compile(
        py: Python<'_>,
        name: String,
        payload: Vec<u8>,
        input_specs: Vec<SpecLeaf<'_>>,
        output_specs: Vec<SpecLeaf<'_>>,
        devices: Vec<PyRef<'_, Device>>,
        host_callbacks: Vec<Py<PyAny>>,
    ) -> PyResult<Self> {
        let first = devices
            .first()
            .ok_or_else(|| py_err(core::Error::invalid_argument("a program needs devices")))?;
        let client = first.client.get().map_err(py_err)?.clone();
        let program = core::Program {
            name,
            language: LANGUAGE.to_string(),
            payload,
            input_specs: input_specs
                .iter()
                .map(array_spec)
                .collect::<PyResult<_>>()?,
            output_specs: output_specs
                .iter()
                .map(array_spec)
                .collect::<PyResult<_>>()?,
            devices: devices
                .iter()
                .map(|d| d.inner.get().cloned().map_err(py_err))
                .collect::<PyResult<_>>()?,
        };
        let options = core::CompileOptions {
            host_callbacks: host_callbacks
                .into_iter()
                .enumerate()
                .map(|(i, f)| host_callback(format!("{} host callback {i}", program.name), f))
                .collect(),
        };
        // Loading on workers waits for them: without the GIL.
        let exe = py
            .detach(|| client.compile(program, options))
            .map_err(|e| to_py(py, &e))?;
        Ok(Executable {
            inner: ForkSafe::new(exe),
        })
    }

    /// The portable bytes of the executable (for a host with the same device
    /// ids, e.g. a worker).
    fn serialize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let exe = self.inner.get().map_err(py_err)?;
        Ok(PyBytes::new(py, &exe.serialize()))
    }

    /// Runs the program on the calling thread's stream (its work item's, on a
    /// thread pool's thread); returns the outputs at once (ready later) and the
    /// status event.
    fn execute(
        &self,
        py: Python<'_>,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
    ) -> PyResult<(Vec<ArrayImpl>, Event)> {
        let exe = self.inner.get().map_err(py_err)?;
        crate::streams::enter_call_scope(py)?;
        let args = arrays
            .iter()
            .map(|a| a.array().cloned())
            .collect::<PyResult<Vec<_>>>()?;
        let run = exe
            .execute(&args, &core::ExecuteOptions::default())
            .map_err(py_err)?;
        let outputs = run
            .outputs
            .into_iter()
            .map(|a| ArrayImpl::wrap(exe.client().clone(), a))
            .collect();
        Ok((outputs, Event::wrap(run.status)))
    }
}
