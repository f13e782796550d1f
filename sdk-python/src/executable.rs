//! Compiled programs as Python sees them: `Executable` (a colocated Python
//! program, a StableHLO module or a deserialized executable, run on the
//! calling thread's stream) and `ProgramCache`, core's cache of one program per
//! call spec for the programs `colocated.jit` makes.

use colocated_core as core;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::array::ArrayImpl;
use crate::client::Device;
use crate::errors::{py_err, to_py};
use crate::event::Event;
use crate::executor::{host_callback, LANGUAGE};
use crate::fork::ForkSafe;
use crate::function::{array_spec, SpecLeaf};

/// A compiled colocated Python program.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct Executable {
    /// Core's executable (`FunctionState.compile_ahead` makes one too).
    pub(crate) inner: ForkSafe<core::LoadedExecutable>,
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
            output_structure: Vec::new(),
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

    /// Compiles a StableHLO module (MLIR text) for `devices` of a PJRT
    /// plugin (core's `compile_stablehlo`).
    #[staticmethod]
    fn compile_stablehlo(
        py: Python<'_>,
        module: Vec<u8>,
        devices: Vec<PyRef<'_, Device>>,
    ) -> PyResult<Self> {
        let first = devices.first().ok_or_else(|| {
            py_err(core::Error::invalid_argument(
                "an XLA program needs devices",
            ))
        })?;
        let client = first.client.get().map_err(py_err)?.clone();
        let devices = devices
            .iter()
            .map(|d| d.inner.get().cloned().map_err(py_err))
            .collect::<PyResult<Vec<_>>>()?;
        let exe = py
            .detach(|| client.compile_stablehlo(&module, &devices))
            .map_err(|e| to_py(py, &e))?;
        Ok(Executable {
            inner: ForkSafe::new(exe),
        })
    }

    /// Loads bytes of `serialize()` on `client` (core's
    /// `deserialize_and_load`: an XLA program compiled on the same plugin
    /// and version loads without compiling).
    #[staticmethod]
    fn deserialize_and_load(
        py: Python<'_>,
        data: Vec<u8>,
        client: PyRef<'_, crate::client::Client>,
    ) -> PyResult<Self> {
        let client = client.inner.get().map_err(py_err)?.clone();
        let exe = py
            .detach(|| client.deserialize_and_load(&data, core::CompileOptions::default()))
            .map_err(|e| to_py(py, &e))?;
        Ok(Executable {
            inner: ForkSafe::new(exe),
        })
    }

    /// The devices the program runs on.
    fn devices(&self) -> PyResult<Vec<Device>> {
        let exe = self.inner.get().map_err(py_err)?;
        Ok(exe
            .devices()
            .iter()
            .map(|d| Device::new(exe.client().clone(), d.clone()))
            .collect())
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
        let (outputs, status) = self.run(py, &arrays)?;
        Ok((outputs, Event::wrap(status)))
    }

    /// [`execute`](Self::execute) without the status: the outputs only.
    fn call(&self, py: Python<'_>, arrays: Vec<PyRef<'_, ArrayImpl>>) -> PyResult<Vec<ArrayImpl>> {
        Ok(self.run(py, &arrays)?.0)
    }
}

impl Executable {
    /// Runs the program without the GIL (as `jax.jit` hands a program to its
    /// plugin: a program that needs Python takes the GIL back itself).
    fn run(
        &self,
        py: Python<'_>,
        arrays: &[PyRef<'_, ArrayImpl>],
    ) -> PyResult<(Vec<ArrayImpl>, core::Event)> {
        let exe = self.inner.get().map_err(py_err)?;
        crate::streams::enter_call_scope(py)?;
        let args = arrays
            .iter()
            .map(|a| a.array().cloned())
            .collect::<PyResult<Vec<_>>>()?;
        let options = core::ExecuteOptions::default();
        let run = py.detach(|| exe.execute(&args, &options)).map_err(py_err)?;
        let outputs = run
            .outputs
            .into_iter()
            .map(|a| ArrayImpl::wrap(exe.client().clone(), a))
            .collect();
        Ok((outputs, run.status))
    }
}

/// Core's cache of one program per call spec ([`core::SpecCache`]) for a
/// program that the SDK makes itself (`colocated.jit`'s): the spec is a tree
/// key (the SDK's id of what else the program depends on) and the input
/// arrays' specs, compared as colocated functions' are.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct ProgramCache {
    cache: core::SpecCache<std::sync::Arc<Py<PyAny>>>,
}

fn call_spec(tree: u64, arrays: &[PyRef<'_, ArrayImpl>]) -> PyResult<core::CallSpec> {
    Ok(core::CallSpec {
        tree,
        leaves: arrays
            .iter()
            .map(|a| a.array().map(|a| a.spec().clone()))
            .collect::<PyResult<_>>()?,
    })
}

#[pymethods]
impl ProgramCache {
    #[new]
    fn new() -> Self {
        ProgramCache {
            cache: core::SpecCache::default(),
        }
    }

    /// The program for `tree` and the specs of `arrays`, or None (a hit or
    /// a miss, counted).
    fn get(
        &self,
        py: Python<'_>,
        tree: u64,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let spec = call_spec(tree, &arrays)?;
        Ok(self.cache.get(&spec).map(|v| v.clone_ref(py)))
    }

    /// Keeps `program` for `tree` and the specs of `arrays`.
    fn insert(
        &self,
        tree: u64,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
        program: Py<PyAny>,
    ) -> PyResult<()> {
        let spec = call_spec(tree, &arrays)?;
        self.cache.insert(&spec, std::sync::Arc::new(program));
        Ok(())
    }

    /// `(hits, misses, size)`.
    fn info(&self) -> (u64, u64, usize) {
        let info = self.cache.info();
        (info.hits, info.misses, info.currsize)
    }

    /// Drops every program and resets the counts.
    fn clear(&self) {
        self.cache.clear();
    }
}
