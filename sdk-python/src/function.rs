//! The controller's side of `colocated.colocated_python` and
//! `colocated_python_class`: a translation of core's colocated functions and
//! objects (the call rules, the cache of compiled programs per input spec,
//! discovery, the object lifecycle) to Python. The Python package supplies
//! only what is Python's: the pickled host callable, its tree structures and
//! its sharding objects (see `_Site` in `colocated._colocated_python`).

use std::sync::Mutex;

use colocated_core as core;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::array::ArrayImpl;
use crate::client::Device;
use crate::errors::{py_err, to_py};
use crate::event::Event;
use crate::executable::Executable;
use crate::executor::{host_callback, LANGUAGE};
use crate::fork::ForkSafe;
use crate::sharding::Sharding;

/// A spec leaf from Python: dtype name, shape and core sharding.
pub(crate) type SpecLeaf<'py> = (String, Vec<i64>, PyRef<'py, Sharding>);

/// The core spec of a spec leaf.
pub(crate) fn array_spec(leaf: &SpecLeaf<'_>) -> PyResult<core::ArraySpec> {
    let dtype = core::DType::from_name(&leaf.0).map_err(py_err)?;
    let (_, sharding) = leaf.2.get()?;
    core::ArraySpec::new(leaf.1.clone(), dtype, sharding.clone()).map_err(py_err)
}

/// Core's tree key of a call of `n` positional arrays and no keywords (the
/// fast path's calls; `_tree_key` in `_colocated_python.py` takes the same
/// key for such a structure).
#[pyfunction]
pub fn flat_tree_key(n: usize) -> u64 {
    core::flat_tree_key(n)
}

/// A tree key no structure has yet, from core's interner: the Python package
/// interns every other structure by its optree treedef (equal treedefs, one
/// key), and takes each new one's key here.
#[pyfunction]
pub fn new_tree_key() -> u64 {
    core::new_tree_key()
}

/// What the Python package keeps with a compiled program: what the fast path
/// needs to call it and wrap its outputs without Python code.
pub struct PyEntry {
    /// `Some(n)` when the program takes `n` positional arrays and no keywords.
    flat_arity: Option<usize>,
    /// The callers' sharding objects of the outputs (`None`: derived from the
    /// output array when asked).
    out_shardings: Vec<Option<Py<PyAny>>>,
    out_treedef: Py<PyAny>,
    /// True when the output tree is one array (no unflatten needed).
    out_leaf: bool,
}

/// One call's `_Site` (see `colocated._colocated_python`) as core's call
/// site. A Python exception it raises is kept, to be raised as it was.
struct PySite {
    site: Py<PyAny>,
    error: Mutex<Option<PyErr>>,
    /// The client of the call (its shardings' devices).
    client: core::Client,
}

impl PySite {
    fn with<T>(
        &self,
        f: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<T>,
    ) -> core::Result<T> {
        crate::interpreter::attach(|py| {
            f(py, self.site.bind(py)).map_err(|e| {
                let message = e.to_string();
                *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                core::Error::invalid_argument(message)
            })
        })
        .ok_or_else(crate::interpreter::exiting_error)?
    }
}

impl core::CallSite for PySite {
    type Entry = PyEntry;

    fn payload(&self, devices: &[core::Device]) -> core::Result<core::Payload> {
        let remote = devices.iter().any(|d| d.process_index() != 0);
        self.with(|py, site| {
            let (bytes, callbacks): (Vec<u8>, Vec<Py<PyAny>>) = site
                .call_method1(pyo3::intern!(py, "payload"), (remote,))?
                .extract()?;
            let host_callbacks = callbacks
                .into_iter()
                .enumerate()
                .map(|(i, f)| host_callback(format!("host callback {i}"), f))
                .collect();
            Ok(core::Payload {
                bytes,
                host_callbacks,
            })
        })
    }

    fn declared_outputs(&self) -> core::Result<Option<core::Outputs>> {
        self.with(|py, site| {
            let declared = site.call_method0(pyo3::intern!(py, "declared"))?;
            if declared.is_none() {
                return Ok(None);
            }
            let leaves: Vec<SpecLeaf<'_>> = declared.extract()?;
            let specs = leaves
                .iter()
                .map(array_spec)
                .collect::<PyResult<Vec<_>>>()?;
            Ok(Some(core::Outputs::declared(Vec::new(), specs)))
        })
    }

    fn entry(&self, outputs: &core::Outputs) -> core::Result<PyEntry> {
        self.with(|py, site| {
            let origins: Vec<Option<usize>> = outputs
                .origins
                .iter()
                .map(|o| match o {
                    core::OutputOrigin::Input(j) => Some(*j),
                    core::OutputOrigin::New => None,
                })
                .collect();
            let shardings = outputs
                .specs
                .iter()
                .map(|spec| {
                    Py::new(
                        py,
                        Sharding::wrap(self.client.clone(), spec.sharding.clone()),
                    )
                })
                .collect::<PyResult<Vec<_>>>()?;
            let (out_treedef, out_shardings, flat_arity, out_leaf) = site
                .call_method1(
                    pyo3::intern!(py, "entry"),
                    (PyBytes::new(py, &outputs.structure), origins, shardings),
                )?
                .extract()?;
            Ok(PyEntry {
                flat_arity,
                out_shardings,
                out_treedef,
                out_leaf,
            })
        })
    }

    /// Two hosts' pickled structures compared as Python objects (their bytes
    /// may differ, e.g. in a dict's insertion order).
    fn same_structure(&self, a: &[u8], b: &[u8]) -> bool {
        crate::interpreter::attach(|py| {
            self.site
                .bind(py)
                .call_method1(
                    pyo3::intern!(py, "same_structure"),
                    (PyBytes::new(py, a), PyBytes::new(py, b)),
                )
                .and_then(|same| same.extract::<bool>())
                .unwrap_or(false)
        })
        .unwrap_or(false)
    }
}

/// A colocated object's handle: dropping it destroys the object on every
/// host it ran on, after the calls already made on it (core's
/// `ColocatedObject`).
#[pyclass(module = "colocated._colocated", frozen)]
pub struct ColocatedObject {
    inner: ForkSafe<core::ColocatedObject>,
}

#[pymethods]
impl ColocatedObject {
    /// A new object (with a random id), or with `obj_id` a new handle of
    /// that existing object (in a forked child, which cannot use its
    /// parent's handles).
    #[new]
    #[pyo3(signature = (obj_id=None))]
    fn new(obj_id: Option<u64>) -> Self {
        let object = match obj_id {
            Some(id) => core::ColocatedObject::with_id(id),
            None => core::ColocatedObject::new(),
        };
        ColocatedObject {
            inner: ForkSafe::new(object),
        }
    }

    /// The object's id on its hosts (see `host_object`).
    #[getter]
    fn id(&self) -> PyResult<u64> {
        Ok(self.inner.get().map_err(py_err)?.id())
    }

    /// False in a child forked after the handle was made (it cannot be used
    /// there; make another with the same id).
    #[getter]
    fn usable(&self) -> bool {
        self.inner.get().is_ok()
    }
}

/// Controller-side state of one colocated function: core's colocated
/// function (its specialization and its cache of compiled programs), and the
/// client of its specialized devices.
#[pyclass(module = "colocated._colocated", frozen, weakref)]
pub struct FunctionState {
    function: ForkSafe<core::ColocatedFunction<PyEntry>>,
    /// The client of the specialized `devices`.
    devices_client: Option<ForkSafe<core::Client>>,
}

impl FunctionState {
    fn function(&self) -> PyResult<&core::ColocatedFunction<PyEntry>> {
        self.function.get().map_err(py_err)
    }
}

/// Wraps `outputs` as `colocated.Array`s with the entry's sharding objects
/// and unflattens them into the entry's output tree.
fn wrap_outputs<'py>(
    py: Python<'py>,
    client: &core::Client,
    entry: &PyEntry,
    outputs: Vec<core::Array>,
) -> PyResult<Bound<'py, PyAny>> {
    let wrap = crate::hooks::hooks(py)?.wrap_array.bind(py);
    let mut wrapped = Vec::with_capacity(outputs.len());
    for (array, sharding) in outputs.into_iter().zip(&entry.out_shardings) {
        let impl_ = Bound::new(py, ArrayImpl::wrap(client.clone(), array))?;
        wrapped.push(wrap.call1((impl_, sharding.as_ref().map(|s| s.bind(py))))?);
    }
    if entry.out_leaf && wrapped.len() == 1 {
        if let Some(out) = wrapped.pop() {
            return Ok(out);
        }
    }
    entry
        .out_treedef
        .bind(py)
        .call_method1(pyo3::intern!(py, "unflatten"), (PyList::new(py, wrapped)?,))
}

#[pymethods]
impl FunctionState {
    /// State for a function named `name`, specialized with `devices` and/or
    /// `in_specs` (a tree key and one spec leaf per argument leaf).
    #[new]
    #[pyo3(signature = (name, devices=None, in_specs=None))]
    fn new(
        name: String,
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
        let function =
            core::ColocatedFunction::new(name, LANGUAGE, devices, in_specs).map_err(py_err)?;
        Ok(FunctionState {
            function: ForkSafe::new(function),
            devices_client,
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
        let Ok(function) = self.function.get() else {
            return general();
        };
        if kwargs.is_some_and(|k| !k.is_empty()) {
            return general();
        }
        let array_type = crate::hooks::hooks(py)?.array_type.bind(py);
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
            tree: core::flat_tree_key(arrays.len()),
            leaves: arrays.iter().map(|a| a.spec().clone()).collect(),
        };
        let Some(entry) = function.cached(&spec).map_err(|e| to_py(py, &e))? else {
            return general();
        };
        if entry.data.flat_arity != Some(arrays.len()) {
            return general();
        }
        crate::streams::enter_call_scope(py)?;
        let run = entry.execute(&arrays).map_err(py_err)?;
        wrap_outputs(py, entry.executable().client(), &entry.data, run.outputs)
    }

    /// Any call (`tree` key, argument arrays): runs it as core's colocated
    /// function does — the cached program, or one compiled for the outputs
    /// `site.declared()` gives, or a synchronous discovery run. `site` (a
    /// `_Site`) supplies the payloads and the Python forms of the outputs;
    /// `objects` are the colocated objects the call uses (the one it is a
    /// method of, those among its arguments; handles a forked child cannot
    /// use are left out). Returns the result tree and the call's status
    /// (None when it already finished).
    #[pyo3(signature = (tree, arrays, site, objects=Vec::new()))]
    fn call_general<'py>(
        &self,
        py: Python<'py>,
        tree: u64,
        arrays: Vec<PyRef<'py, ArrayImpl>>,
        site: Py<PyAny>,
        objects: Vec<PyRef<'py, ColocatedObject>>,
    ) -> PyResult<(Bound<'py, PyAny>, Option<Event>)> {
        let function = self.function()?;
        let inputs = arrays
            .iter()
            .map(|a| a.array().cloned())
            .collect::<PyResult<Vec<_>>>()?;
        let spec = core::CallSpec {
            tree,
            leaves: inputs.iter().map(|a| a.spec().clone()).collect(),
        };
        // The call rules first: a call without arrays or devices fails here.
        function.check(&spec).map_err(|e| to_py(py, &e))?;
        let client = match (arrays.first(), &self.devices_client) {
            (Some(array), _) => array.client()?.clone(),
            (None, Some(client)) => client.get().map_err(py_err)?.clone(),
            (None, None) => {
                return Err(py_err(core::Error::internal(
                    "a call without arrays ran without devices",
                )))
            }
        };
        let objects: Vec<&core::ColocatedObject> =
            objects.iter().filter_map(|o| o.inner.get().ok()).collect();
        crate::streams::enter_call_scope(py)?;
        let site = PySite {
            site,
            error: Mutex::new(None),
            client: client.clone(),
        };
        let called = py.detach(|| function.call(&client, &spec, &inputs, &site, &objects));
        let call = match called {
            Ok(call) => call,
            Err(e) => {
                let raised = site.error.lock().unwrap_or_else(|p| p.into_inner()).take();
                return Err(raised.unwrap_or_else(|| to_py(py, &e)));
            }
        };
        let status = call.status.map(Event::wrap);
        let result = wrap_outputs(py, &client, &call.entry.data, call.outputs)?;
        Ok((result, status))
    }

    /// Compiles the program for the call spec (`tree` key, spec leaves) ahead
    /// of a call, with the outputs `site.declared()` gives (core's
    /// `compile_ahead`): its payload is portable (cloudpickled), so the
    /// executable serializes for any client of the same hosts. Raises
    /// `InvalidArgumentError` without declared outputs.
    #[pyo3(signature = (tree, specs, site))]
    fn compile_ahead(
        &self,
        py: Python<'_>,
        tree: u64,
        specs: Vec<SpecLeaf<'_>>,
        site: Py<PyAny>,
    ) -> PyResult<Executable> {
        let function = self.function()?;
        let spec = core::CallSpec {
            tree,
            leaves: specs.iter().map(array_spec).collect::<PyResult<_>>()?,
        };
        let client = match (specs.first(), &self.devices_client) {
            (Some(leaf), _) => leaf.2.get()?.0.clone(),
            (None, Some(client)) => client.get().map_err(py_err)?.clone(),
            (None, None) => {
                return Err(py_err(core::Error::invalid_argument(
                    "compiling a function without arguments needs it specialized with devices",
                )))
            }
        };
        let site = PySite {
            site,
            error: Mutex::new(None),
            client: client.clone(),
        };
        let compiled = py.detach(|| function.compile_ahead(&client, &spec, &site));
        match compiled {
            Ok(entry) => Ok(Executable {
                inner: ForkSafe::new(entry.executable().clone()),
            }),
            Err(e) => {
                let raised = site.error.lock().unwrap_or_else(|p| p.into_inner()).take();
                Err(raised.unwrap_or_else(|| to_py(py, &e)))
            }
        }
    }

    /// `(hits, misses, currsize)`.
    fn cache_info(&self) -> PyResult<(u64, u64, usize)> {
        let info = self.function()?.cache_info();
        Ok((info.hits, info.misses, info.currsize))
    }

    /// Drops every cached program.
    fn clear(&self) -> PyResult<()> {
        self.function()?.clear();
        Ok(())
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
