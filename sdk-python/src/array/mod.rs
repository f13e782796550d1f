//! `ArrayImpl`: a core array (shape, dtype, core sharding, one buffer per device)
//! behind the Python `colocated.Array`, and `HostView`, a pinned view of one
//! buffer's bytes that numpy arrays can alias without a copy. The ways an array
//! is made are in `construct`, the fast path of small values in `small`: each
//! holds its methods of `ArrayImpl` (pyo3's `multiple-pymethods`).

mod construct;
mod small;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use colocated_core as core;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::errors::{py_err, to_py};
use crate::event::Event;
use crate::fork::ForkSafe;
use crate::sharding::{ranges, Sharding};

/// Host memory handed over by the Python side: the address and length of a
/// C-contiguous numpy array that the caller keeps alive and unchanged during the
/// call (the data is copied before the call returns).
#[derive(Clone, Copy)]
struct HostBytes {
    ptr: usize,
    len: usize,
}

impl HostBytes {
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes for the lifetime `'a`.
    unsafe fn slice<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(self.ptr as *const u8, self.len)
        }
    }
}

pub(crate) fn dtype_from_name(name: &str) -> PyResult<core::DType> {
    core::DType::from_name(name).map_err(py_err)
}

/// The memory kind named `name` (None: the sharding's, else each device's default), checked
/// against the sharding's first device: an unknown name is an
/// `InvalidArgumentError` that lists the kinds the device has.
fn parse_memory_kind(
    sharding: &core::Sharding,
    name: Option<&str>,
) -> PyResult<Option<core::MemoryKind>> {
    // Without a name: the sharding's memory kind (core's rule), if any.
    let Some(name) = name else {
        return Ok(sharding.memory_kind());
    };
    let space = sharding.devices()[0]
        .memory_space_by_kind(name)
        .map_err(py_err)?;
    Ok(Some(space.kind()))
}

/// `device`'s memory space of `kind` (None: its default).
fn memory_space(
    device: &core::Device,
    kind: Option<core::MemoryKind>,
) -> core::Result<Option<&core::MemorySpace>> {
    kind.map(|k| device.memory_space_by_kind(k.name()))
        .transpose()
}

/// The native half of `colocated.Array`.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct ArrayImpl {
    client: ForkSafe<core::Client>,
    pub(crate) inner: ForkSafe<core::Array>,
}

impl ArrayImpl {
    /// The client the array belongs to.
    pub(crate) fn client(&self) -> PyResult<&core::Client> {
        self.client.get().map_err(py_err)
    }

    pub(crate) fn wrap(client: core::Client, array: core::Array) -> Self {
        ArrayImpl {
            client: ForkSafe::new(client),
            inner: ForkSafe::new(array),
        }
    }

    pub(crate) fn array(&self) -> PyResult<&core::Array> {
        self.inner.get().map_err(py_err)
    }

    fn buffer(&self, i: usize) -> PyResult<&core::Buffer> {
        let buffers = self.array()?.buffers();
        buffers.get(i).ok_or_else(|| {
            py_err(core::Error::invalid_argument(format!(
                "shard {i} is out of range for {} shards",
                buffers.len()
            )))
        })
    }
}

/// Bytes of a copy that crossed hosts so far, for progress bars (updated by
/// network threads; read without waiting).
#[pyclass(module = "colocated._colocated", frozen)]
pub struct CopyProgress(Arc<(AtomicU64, AtomicU64)>);

#[pymethods]
impl CopyProgress {
    /// Bytes that arrived so far.
    #[getter]
    fn done(&self) -> u64 {
        self.0 .0.load(Ordering::Relaxed)
    }

    /// Bytes in all (0 until the first report).
    #[getter]
    fn total(&self) -> u64 {
        self.0 .1.load(Ordering::Relaxed)
    }
}

#[pymethods]
impl ArrayImpl {
    /// Global shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.metadata().shape())
    }

    /// The kind of memory the shards are in (`"device"`, `"pinned_host"`,
    /// `"unpinned_host"`).
    #[getter]
    fn memory_kind(&self) -> &'static str {
        self.inner.metadata().memory_kind().name()
    }

    /// Element type name (`"float32"`, `"bfloat16"`, `"string"`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.metadata().dtype().name()
    }

    /// Element type as a numpy dtype.
    #[getter]
    fn np_dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        small::numpy(py)?
            .dtype(py, self.inner.metadata().dtype())
            .cloned()
    }

    /// The core sharding.
    #[getter]
    fn sharding(&self) -> Sharding {
        Sharding::wrap(
            self.client.metadata().clone(),
            self.inner.metadata().sharding().clone(),
        )
    }

    /// Number of shards (one per device of the sharding).
    #[getter]
    fn num_shards(&self) -> usize {
        self.inner.metadata().buffers().len()
    }

    /// The array placed on `sharding` (in each device's memory of
    /// `memory_kind`), as `device_put` places an array: as it is (then
    /// `None`: the caller keeps its own object), shard by shard host to host,
    /// or gathered and put again in the background (see the core's
    /// `Array::put_to`); at once. Returns it and a `CopyProgress` counting the
    /// bytes that crossed hosts.
    #[pyo3(signature = (sharding, memory_kind=None))]
    fn put_to(
        &self,
        py: Python<'_>,
        sharding: PyRef<'_, Sharding>,
        memory_kind: Option<&str>,
    ) -> PyResult<(Option<Self>, CopyProgress)> {
        // On the stream of the calling work item, as the item's executions.
        crate::streams::enter_call_scope(py)?;
        let (client, core_sharding) = sharding.get()?;
        let kind = parse_memory_kind(core_sharding, memory_kind)?;
        let array = self.array()?;
        let counters = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let report = counters.clone();
        let progress: core::session::Progress = Arc::new(move |done, total| {
            report.1.store(total, Ordering::Relaxed);
            report.0.fetch_max(done, Ordering::Relaxed);
        });
        let placed = array
            .put_to(client, core_sharding.clone(), kind, Some(progress))
            .map_err(py_err)?;
        let placed = (!placed.same_as(array)).then(|| ArrayImpl::wrap(client.clone(), placed));
        Ok((placed, CopyProgress(counters)))
    }

    /// True when some shard's data cannot be viewed in place by this process
    /// (on a worker, or on a PJRT plugin's accelerator): it is read by a copy.
    #[getter]
    fn on_workers(&self) -> bool {
        !self.inner.metadata().is_host_addressable()
    }

    /// Shard `i` as a single-device array sharing its buffer.
    fn shard(&self, i: usize) -> PyResult<Self> {
        let buffer = self.buffer(i)?.clone();
        let sharding = core::Sharding::single_device(buffer.device().clone());
        let spec = core::ArraySpec::new(buffer.dims().to_vec(), buffer.dtype(), sharding)
            .map_err(py_err)?;
        let array = core::Array::assemble(spec, vec![buffer]).map_err(py_err)?;
        Ok(ArrayImpl::wrap(self.client.metadata().clone(), array))
    }

    /// The `(start, stop)` range per dimension that shard `i` holds.
    fn shard_index(&self, i: usize) -> PyResult<Vec<(i64, i64)>> {
        let index = self.inner.metadata().shard_index(i).map_err(py_err)?;
        Ok(ranges(&index))
    }

    /// Ready when every shard is.
    fn ready_event(&self) -> PyResult<Event> {
        Ok(Event::wrap(self.array()?.ready_event()))
    }

    /// True when every shard is ready.
    fn is_ready(&self) -> PyResult<bool> {
        Ok(self
            .array()?
            .buffers()
            .iter()
            .all(|b| b.ready_event().is_ready()))
    }

    /// Blocks (without the GIL) until every shard is ready; raises the error of a
    /// failed producer.
    fn block_until_ready(&self, py: Python<'_>) -> PyResult<()> {
        let array = self.array()?;
        for buffer in array.buffers() {
            let event = buffer.ready_event();
            if let Some(status) = event.status() {
                status.map_err(|e| to_py(py, &e))?;
                continue;
            }
            py.detach(|| event.wait()).map_err(|e| to_py(py, &e))?;
        }
        Ok(())
    }

    /// Deletes every shard (in-flight work keeps the data until it finishes).
    fn delete(&self) -> PyResult<()> {
        self.array()?.delete();
        Ok(())
    }

    /// True when any shard was deleted.
    fn is_deleted(&self) -> PyResult<bool> {
        Ok(self.array()?.is_deleted())
    }

    /// Waits (without the GIL) for shard `i` and pins its bytes; `None` when
    /// they are not its dense row-major bytes (a plugin's own layout): read
    /// them with a copy.
    fn host_view(&self, py: Python<'_>, i: usize) -> PyResult<Option<HostView>> {
        let buffer = self.buffer(i)?;
        if buffer.dtype() == core::DType::String {
            return Err(py_err(core::Error::invalid_argument(
                "string shards have no byte view; use to_host_strings",
            )));
        }
        // Only a buffer that is not ready yet is worth releasing the GIL for.
        let pin = if buffer.ready_event().is_ready() {
            buffer.acquire_external_reference()
        } else {
            py.detach(|| buffer.acquire_external_reference())
        }
        .map_err(py_err)?;
        // A plugin's own layout (another order, tiles, padding) is copied.
        let dense = buffer.on_host_size().map_err(py_err)? == pin.len()
            && buffer.is_dense_row_major().unwrap_or(false);
        if !dense {
            return Ok(None);
        }
        Ok(Some(HostView {
            pin: ForkSafe::new(pin),
        }))
    }

    /// A DLPack capsule of shard `i`'s device memory on a GPU plugin's
    /// device (pinned until its consumer is done with it), for another
    /// library in this process to read in place (`jax.dlpack.from_dlpack`).
    /// Waits (without the GIL) for the shard. `None` when the plugin keeps
    /// it in a layout of its own.
    fn device_dlpack<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        let buffer = self.buffer(i)?;
        let pin = py
            .detach(|| buffer.acquire_external_reference())
            .map_err(py_err)?;
        if !buffer.is_dense_row_major().unwrap_or(false) {
            return Ok(None);
        }
        let device = buffer.device();
        let id = i32::try_from(device.local_hardware_id()).map_err(|_| {
            PyValueError::new_err("the device's local hardware id is out of DLPack's range")
        })?;
        crate::dlpack::export(
            py,
            pin,
            buffer.dtype(),
            buffer.dims(),
            device.platform(),
            id,
        )
        .map(Some)
    }

    /// Shard `i`'s bytes, copied (cheaper than a pinned view for small shards).
    /// Waits without the GIL if the shard is not ready.
    fn shard_bytes<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyBytes>> {
        let buffer = self.buffer(i)?;
        let bytes = if buffer.ready_event().is_ready() {
            buffer.to_host_vec()
        } else {
            py.detach(|| buffer.to_host_vec())
        }
        .map_err(py_err)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Waits (without the GIL) and gathers the array row-major into `nbytes` at
    /// address `ptr` (a writable C-contiguous array the caller keeps alive).
    fn to_host_into(&self, py: Python<'_>, ptr: usize, nbytes: usize) -> PyResult<()> {
        let array = self.array()?;
        let out = HostBytes { ptr, len: nbytes };
        py.detach(|| {
            // SAFETY: the caller keeps a writable array of `nbytes` at `ptr` alive
            // and does not touch it during the call.
            let dst = unsafe {
                if out.len == 0 {
                    &mut [][..]
                } else {
                    std::slice::from_raw_parts_mut(out.ptr as *mut u8, out.len)
                }
            };
            array.to_host_into(dst)
        })
        .map_err(py_err)
    }

    /// Waits (without the GIL) and gathers a string array's elements row-major.
    fn to_host_strings(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let array = self.array()?;
        py.detach(|| array.to_host_strings()).map_err(py_err)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner.metadata())
    }
}

/// A pinned, read-only view of one buffer's bytes. numpy arrays made from it (via
/// `__array_interface__`) keep it, and so the pin, alive; the bytes stay valid
/// even if the array is deleted meanwhile.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct HostView {
    pin: ForkSafe<core::ExternalReference>,
}

#[pymethods]
impl HostView {
    /// Byte length.
    fn __len__(&self) -> usize {
        self.pin.metadata().len()
    }

    /// The numpy array interface: a read-only uint8 vector over the pinned bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let pin = self.pin.get().map_err(py_err)?;
        let out = PyDict::new(py);
        out.set_item("version", 3)?;
        out.set_item("shape", (pin.len(),))?;
        out.set_item("typestr", "|u1")?;
        // A zero-length view still needs a non-null address.
        let ptr = if pin.is_empty() {
            1
        } else {
            pin.data_ptr() as usize
        };
        out.set_item("data", (ptr, true))?;
        Ok(out)
    }
}
