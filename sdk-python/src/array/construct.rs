//! The ways `ArrayImpl` makes an array: from host bytes (copied or viewed in
//! place), from a DLPack capsule of device memory, from strings, from one host
//! shard per device, and assembled from single-device arrays: `ArrayImpl`'s
//! static methods, in a `#[pymethods]` block of their own (pyo3's
//! `multiple-pymethods`).

use colocated_core as core;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{dtype_from_name, memory_space, parse_memory_kind, ArrayImpl, HostBytes};
use crate::errors::py_err;
use crate::sharding::Sharding;

/// Copies at least this large release the GIL.
const DETACH_BYTES: usize = 1 << 20;

/// `invalid_argument` unless one shard was given per device of the spec's
/// sharding.
fn check_shard_count(spec: &core::ArraySpec, given: usize) -> PyResult<()> {
    let devices = spec.sharding.devices().len();
    if given != devices {
        return Err(py_err(core::Error::invalid_argument(format!(
            "the sharding has {devices} devices but {given} shards were given"
        ))));
    }
    Ok(())
}

#[pymethods]
impl ArrayImpl {
    /// Splits row-major host bytes of the global array (`nbytes` at address `ptr`,
    /// kept alive by the caller) over `sharding`'s devices, into their memory
    /// spaces of `memory_kind` (default: their default ones). Copies before
    /// returning; the GIL is released during the copy.
    #[staticmethod]
    #[pyo3(signature = (sharding, dtype, shape, ptr, nbytes, memory_kind=None))]
    fn from_host_bytes(
        py: Python<'_>,
        sharding: PyRef<'_, Sharding>,
        dtype: &str,
        shape: Vec<i64>,
        ptr: usize,
        nbytes: usize,
        memory_kind: Option<&str>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let spec = core::ArraySpec::new(shape, dtype_from_name(dtype)?, core_sharding.clone())
            .map_err(py_err)?;
        let data = HostBytes { ptr, len: nbytes };
        // SAFETY: the Python caller passes the address and size of an array it keeps
        // referenced (hence alive) for the duration of this call.
        let copy = || core::Array::from_host_bytes_in(client, unsafe { data.slice() }, spec, kind);
        // Releasing the GIL costs more than a small copy (and may hand it over).
        let array = if nbytes >= DETACH_BYTES {
            py.detach(copy)
        } else {
            copy()
        }
        .map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }

    /// An array of one buffer that reads the `nbytes` at address `ptr` in
    /// place where the runtime can (`ImmutableZeroCopy`: a CPU device of this
    /// process), keeping `owner`, the object that holds that memory
    /// unchanged, until the runtime lets go of them; the runtime copies them
    /// during the call for any other device. A sharding of several devices
    /// takes `from_host_bytes`'s copy.
    #[staticmethod]
    #[pyo3(signature = (sharding, dtype, shape, ptr, nbytes, owner, memory_kind=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_host_view(
        py: Python<'_>,
        sharding: PyRef<'_, Sharding>,
        dtype: &str,
        shape: Vec<i64>,
        ptr: usize,
        nbytes: usize,
        owner: Py<PyAny>,
        memory_kind: Option<&str>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let dtype_ = dtype_from_name(dtype)?;
        if core_sharding.devices().len() != 1 {
            return Self::from_host_bytes(py, sharding, dtype, shape, ptr, nbytes, memory_kind);
        }
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let device = &core_sharding.devices()[0];
        let spec = core::ArraySpec::new(shape, dtype_, core_sharding.clone()).map_err(py_err)?;
        // SAFETY: `owner` keeps the memory readable and unchanged until
        // `done`, whose callback drops it.
        let (buffer, done) = unsafe {
            core::Buffer::from_host_raw(
                client,
                ptr as *const u8,
                nbytes,
                dtype_,
                &spec.shape,
                device,
                memory_space(device, kind).map_err(py_err)?,
                core::HostBufferSemantics::ImmutableZeroCopy,
            )
        }
        .map_err(py_err)?;
        done.on_ready(move |_| drop(owner));
        let array = core::Array::assemble(spec, vec![buffer]).map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }

    /// An array of one buffer on a PJRT plugin's device that views the
    /// device memory behind `capsule` (a DLPack capsule of another library's
    /// array on the same device, `x.__dlpack__()` of a ready `jax.Array`)
    /// without a copy, keeping the capsule (which keeps the memory) until
    /// the plugin lets go of it. Checked first: the capsule's device,
    /// dtype, shape and dense row-major layout must be the array's.
    #[staticmethod]
    fn from_device_dlpack(
        sharding: PyRef<'_, Sharding>,
        dtype: &str,
        shape: Vec<i64>,
        capsule: Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let dtype_ = dtype_from_name(dtype)?;
        let [device] = core_sharding.devices() else {
            return Err(PyValueError::new_err(
                "a view of device memory is of one device",
            ));
        };
        let spec = core::ArraySpec::new(shape, dtype_, core_sharding.clone()).map_err(py_err)?;
        let id = i32::try_from(device.local_hardware_id()).map_err(|_| {
            PyValueError::new_err("the device's local hardware id is out of DLPack's range")
        })?;
        let data =
            crate::dlpack::device_data(&capsule, dtype_, &spec.shape, device.platform(), id)?;
        let owner = capsule.unbind();
        // SAFETY: the capsule keeps the memory (checked to be this device's,
        // of this spec) until the plugin lets go and `owner` is dropped.
        let buffer = unsafe {
            core::Buffer::view_of_device_memory(
                client,
                data,
                dtype_,
                &spec.shape,
                device,
                None,
                Box::new(move || drop(owner)),
            )
        }
        .map_err(py_err)?;
        let array = core::Array::assemble(spec, vec![buffer]).map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }

    /// Like `from_host_bytes`, from a `bytes` object (for small values, where
    /// reading a numpy array's address costs more than copying it).
    #[staticmethod]
    #[pyo3(signature = (sharding, dtype, shape, data, memory_kind=None))]
    fn from_bytes(
        sharding: PyRef<'_, Sharding>,
        dtype: &str,
        shape: Vec<i64>,
        data: &[u8],
        memory_kind: Option<&str>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let spec = core::ArraySpec::new(shape, dtype_from_name(dtype)?, core_sharding.clone())
            .map_err(py_err)?;
        let array = core::Array::from_host_bytes_in(client, data, spec, kind).map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }

    /// Splits row-major strings of the global array over `sharding`'s devices
    /// (into their memory spaces of `memory_kind`).
    #[staticmethod]
    #[pyo3(signature = (sharding, shape, strings, memory_kind=None))]
    fn from_host_strings(
        sharding: PyRef<'_, Sharding>,
        shape: Vec<i64>,
        strings: Vec<String>,
        memory_kind: Option<&str>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let spec = core::ArraySpec::new(shape, core::DType::String, core_sharding.clone())
            .map_err(py_err)?;
        let array =
            core::Array::from_host_strings_in(client, &strings, spec, kind).map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }

    /// Builds an array from one dense host shard per device of `sharding`, in its
    /// device order: `shards[i]` is `(ptr, nbytes)` of a C-contiguous array the
    /// caller keeps alive during the call, holding shard `i`; into the devices'
    /// memory spaces of `memory_kind`.
    #[staticmethod]
    #[pyo3(signature = (sharding, dtype, shape, shards, memory_kind=None))]
    fn from_host_shards(
        py: Python<'_>,
        sharding: PyRef<'_, Sharding>,
        dtype: &str,
        shape: Vec<i64>,
        shards: Vec<(usize, usize)>,
        memory_kind: Option<&str>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let dtype = dtype_from_name(dtype)?;
        let spec = core::ArraySpec::new(shape, dtype, core_sharding.clone()).map_err(py_err)?;
        check_shard_count(&spec, shards.len())?;
        let dims = core_sharding.shard_shape(&spec.shape).map_err(py_err)?;
        let build = || -> core::Result<core::Array> {
            let buffers = shards
                .iter()
                .zip(spec.sharding.devices())
                .map(|(&(ptr, len), device)| {
                    // SAFETY: as in `from_host_bytes`, each shard is kept alive by
                    // the caller for the duration of the call.
                    let data = unsafe { HostBytes { ptr, len }.slice() };
                    let memory = memory_space(device, kind)?;
                    core::Buffer::from_bytes_in(client, data, dtype, &dims, device, memory)
                })
                .collect::<core::Result<Vec<_>>>()?;
            core::Array::assemble(spec.clone(), buffers)
        };
        let array = py.detach(build).map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }

    /// Builds a string array from one row-major list of strings per device of
    /// `sharding`, in its device order (into their memory spaces of `memory_kind`).
    #[staticmethod]
    #[pyo3(signature = (sharding, shape, shards, memory_kind=None))]
    fn from_string_shards(
        sharding: PyRef<'_, Sharding>,
        shape: Vec<i64>,
        shards: Vec<Vec<String>>,
        memory_kind: Option<&str>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let spec = core::ArraySpec::new(shape, core::DType::String, core_sharding.clone())
            .map_err(py_err)?;
        check_shard_count(&spec, shards.len())?;
        let dims = core_sharding.shard_shape(&spec.shape).map_err(py_err)?;
        let buffers = shards
            .iter()
            .zip(spec.sharding.devices())
            .map(|(strings, device)| {
                let memory = memory_space(device, kind)?;
                core::Buffer::from_strings(client, strings, &dims, device, memory)
            })
            .collect::<core::Result<Vec<_>>>()
            .map_err(py_err)?;
        let array = core::Array::assemble(spec, buffers).map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }

    /// Assembles an array of `shape` and `sharding` from single-device arrays,
    /// one per device of the sharding, matched by device (in any order);
    /// with `memory_kind`, each must be in memory of that kind. No copy.
    #[staticmethod]
    #[pyo3(signature = (sharding, dtype, shape, arrays, memory_kind=None))]
    fn assemble(
        sharding: PyRef<'_, Sharding>,
        dtype: &str,
        shape: Vec<i64>,
        arrays: Vec<PyRef<'_, ArrayImpl>>,
        memory_kind: Option<&str>,
    ) -> PyResult<Self> {
        let (client, core_sharding) = sharding.get()?;
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let spec = core::ArraySpec::new(shape, dtype_from_name(dtype)?, core_sharding.clone())
            .map_err(py_err)?;
        let arrays = arrays
            .iter()
            .map(|a| a.array().cloned())
            .collect::<PyResult<Vec<_>>>()?;
        let array = core::Array::from_single_device_arrays(spec, &arrays, kind).map_err(py_err)?;
        Ok(ArrayImpl::wrap(client.clone(), array))
    }
}
