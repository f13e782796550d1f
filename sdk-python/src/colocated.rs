//! Colocated Python: the `python` language executor that hosts run, and the
//! controller-side function state (the input-spec cache and the call rules, both
//! from core) behind `colocated.colocated_python`.

use std::sync::Arc;

use colocated_core as core;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

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
            Ok(Arc::new(PythonProgram(callable.unbind())) as Arc<dyn core::LoadedProgram>)
        })
        .map_err(|e: PyErr| {
            core::Error::invalid_argument(format!("cannot load the colocated Python program: {e}"))
        })
    }
}

struct PythonProgram(Py<PyAny>);

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

impl core::LoadedProgram for PythonProgram {
    /// Python needs the GIL, which the calling thread holds until it waits: a
    /// call it waits on runs on that thread, with no GIL handoff.
    fn waiter_first(&self) -> bool {
        true
    }

    fn run(&self, ctx: &mut core::ExecutionContext<'_>) -> core::Result<()> {
        let program = ctx.program().clone();
        let mut at = 0;
        let mut args = Vec::with_capacity(program.input_specs.len());
        for (spec, &count) in program.input_specs.iter().zip(ctx.input_shard_counts()) {
            if count != spec.sharding.devices().len() {
                return Err(core::Error::unimplemented(
                    "colocated Python arrays restricted to one host of several are not supported yet",
                ));
            }
            let buffers = ctx.inputs()[at..at + count].to_vec();
            at += count;
            args.push(core::Array::assemble(spec.clone(), buffers)?);
        }
        let client = ctx.client().clone();
        let outputs: Vec<core::Array> = Python::attach(|py| {
            let arrays = args
                .into_iter()
                .map(|a| Py::new(py, ArrayImpl::wrap(client.clone(), a)))
                .collect::<PyResult<Vec<_>>>()
                .map_err(|e| remote_error(py, e))?;
            let result = self
                .0
                .call1(
                    py,
                    (PyList::new(py, arrays).map_err(|e| remote_error(py, e))?,),
                )
                .map_err(|e| remote_error(py, e))?;
            let result = result.bind(py);
            let impls = result.extract::<Vec<PyRef<'_, ArrayImpl>>>().map_err(|_| {
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
                .collect::<core::Result<Vec<_>>>()
        })?;
        if outputs.len() != program.output_specs.len() {
            return Err(core::Error::invalid_argument(format!(
                "the function returned {} arrays but {} were expected",
                outputs.len(),
                program.output_specs.len()
            )));
        }
        for (o, (got, want)) in outputs.iter().zip(&program.output_specs).enumerate() {
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
        let shards: Vec<(usize, core::Device)> = ctx
            .output_shards()
            .iter()
            .map(|s| (s.output, s.device.clone()))
            .collect();
        for (k, (o, device)) in shards.into_iter().enumerate() {
            let array = &outputs[o];
            let pos = array
                .sharding()
                .devices()
                .iter()
                .position(|d| *d == device)
                .ok_or_else(|| {
                    core::Error::internal(format!("output {o} has no shard on {device}"))
                })?;
            ctx.set_output(k, array.buffers()[pos].clone())?;
        }
        Ok(())
    }
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

/// Controller-side state of one colocated function: its specialization
/// (`devices`, `in_specs`) and its cache of compiled programs per input spec.
#[pyclass(module = "colocated._colocated", frozen, weakref)]
pub struct FunctionState {
    devices: Option<Vec<core::Device>>,
    in_specs: Option<core::CallSpec>,
    cache: core::SpecCache<Arc<Py<PyAny>>>,
}

#[pymethods]
impl FunctionState {
    /// State for a function specialized with `devices` and/or `in_specs` (a tree
    /// hash and one spec leaf per argument leaf).
    #[new]
    #[pyo3(signature = (devices=None, in_specs=None))]
    fn new(
        devices: Option<Vec<PyRef<'_, Device>>>,
        in_specs: Option<(u64, Vec<SpecLeaf<'_>>)>,
    ) -> PyResult<Self> {
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
            in_specs,
            cache: core::SpecCache::default(),
        })
    }

    /// Checks a call (`tree` hash and argument arrays) against the rules — one
    /// device set, `devices` for argument-less calls, the specialized in_specs —
    /// and returns the cached entry for its spec, or None.
    fn lookup(
        &self,
        py: Python<'_>,
        tree: u64,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let spec = call_spec(tree, &arrays)?;
        spec.devices(self.devices.as_deref())
            .map_err(|e| to_py(py, &e))?;
        if let Some(expected) = &self.in_specs {
            spec.check_matches(expected).map_err(|e| to_py(py, &e))?;
        }
        Ok(self.cache.get(&spec).map(|entry| entry.clone_ref(py)))
    }

    /// Ids of the devices a call with these arguments runs on.
    fn call_devices(
        &self,
        py: Python<'_>,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
    ) -> PyResult<Vec<u32>> {
        let spec = call_spec(0, &arrays)?;
        let devices = spec
            .devices(self.devices.as_deref())
            .map_err(|e| to_py(py, &e))?;
        Ok(devices.iter().map(core::Device::id).collect())
    }

    /// Caches `entry` for calls shaped like `arrays` with tree hash `tree`.
    fn insert(
        &self,
        tree: u64,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
        entry: Py<PyAny>,
    ) -> PyResult<()> {
        let spec = call_spec(tree, &arrays)?;
        self.cache.insert(&spec, Arc::new(entry));
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

/// A compiled colocated Python program.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct Executable {
    inner: ForkSafe<core::LoadedExecutable>,
}

#[pymethods]
impl Executable {
    /// Compiles a `python` program: `payload` (cloudpickle bytes of the host
    /// callable), input and output spec leaves, and the devices it runs on.
    #[staticmethod]
    fn compile(
        name: String,
        payload: Vec<u8>,
        input_specs: Vec<SpecLeaf<'_>>,
        output_specs: Vec<SpecLeaf<'_>>,
        devices: Vec<PyRef<'_, Device>>,
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
        let exe = client
            .compile(program, core::CompileOptions::default())
            .map_err(py_err)?;
        Ok(Executable {
            inner: ForkSafe::new(exe),
        })
    }

    /// Runs the program on the calling thread's stream; returns the outputs at once
    /// (ready later) and the status event.
    fn execute(&self, arrays: Vec<PyRef<'_, ArrayImpl>>) -> PyResult<(Vec<ArrayImpl>, Event)> {
        let exe = self.inner.get().map_err(py_err)?;
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
