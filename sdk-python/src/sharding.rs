//! `Sharding`: the core layout behind a Python `NamedSharding` or
//! `SingleDeviceSharding`. The Python classes build one lazily and keep it.

use colocated_core as core;
use pyo3::prelude::*;

use crate::client::Device;
use crate::errors::py_err;
use crate::fork::ForkSafe;

/// A core sharding plus the client its devices belong to.
#[pyclass(module = "colocated._colocated", frozen)]
pub struct Sharding {
    pub(crate) client: ForkSafe<core::Client>,
    pub(crate) inner: ForkSafe<core::Sharding>,
}

impl Sharding {
    pub(crate) fn wrap(client: core::Client, sharding: core::Sharding) -> Self {
        Sharding {
            client: ForkSafe::new(client),
            inner: ForkSafe::new(sharding),
        }
    }

    pub(crate) fn get(&self) -> PyResult<(&core::Client, &core::Sharding)> {
        Ok((
            self.client.get().map_err(py_err)?,
            self.inner.get().map_err(py_err)?,
        ))
    }
}

pub(crate) fn ranges(index: &[std::ops::Range<i64>]) -> Vec<(i64, i64)> {
    index.iter().map(|r| (r.start, r.end)).collect()
}

#[pymethods]
impl Sharding {
    /// A mesh of `devices` (row-major over `mesh_shape`, one name per axis, and
    /// one `AxisType` name per axis: "Auto", "Explicit" or "Manual", default
    /// "Auto") and, per array dimension, the indices of the mesh axes it is
    /// split over.
    #[staticmethod]
    #[pyo3(signature = (devices, mesh_shape, axis_names, partition, axis_types=None))]
    fn named(
        devices: Vec<PyRef<'_, Device>>,
        mesh_shape: Vec<usize>,
        axis_names: Vec<String>,
        partition: Vec<Vec<usize>>,
        axis_types: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let client = match devices.first() {
            Some(d) => d.client.get().map_err(py_err)?.clone(),
            None => {
                return Err(py_err(core::Error::invalid_argument(
                    "a sharding needs at least one device",
                )))
            }
        };
        let devices: Vec<core::Device> = devices
            .iter()
            .map(|d| d.inner.get().cloned())
            .collect::<Result<_, _>>()
            .map_err(py_err)?;
        let mut sharding =
            core::Sharding::named(devices, mesh_shape, axis_names, partition).map_err(py_err)?;
        if let Some(names) = axis_types {
            let types = names
                .iter()
                .map(|n| core::AxisType::from_name(n))
                .collect::<Result<Vec<_>, _>>()
                .map_err(py_err)?;
            sharding = sharding.with_axis_types(types).map_err(py_err)?;
        }
        Ok(Sharding::wrap(client, sharding))
    }

    /// The whole array on one device.
    #[staticmethod]
    fn single_device(device: PyRef<'_, Device>) -> PyResult<Self> {
        let client = device.client.get().map_err(py_err)?.clone();
        let device = device.inner.get().map_err(py_err)?.clone();
        Ok(Sharding::wrap(
            client,
            core::Sharding::single_device(device),
        ))
    }

    /// The devices in mesh (row-major) order, as objects of the sharding's own
    /// client: shard `i` lives on device `i`.
    #[getter]
    fn devices(&self) -> PyResult<Vec<crate::client::Device>> {
        let (client, sharding) = self.get()?;
        Ok(sharding
            .devices()
            .iter()
            .map(|d| crate::client::Device::new(client.clone(), d.clone()))
            .collect())
    }

    /// Device ids in mesh (row-major) order: shard `i` lives on device `i`.
    #[getter]
    fn device_ids(&self) -> Vec<u32> {
        self.inner
            .metadata()
            .devices()
            .iter()
            .map(|d| d.id())
            .collect()
    }

    /// Mesh shape.
    #[getter]
    fn mesh_shape(&self) -> Vec<usize> {
        self.inner.metadata().mesh_shape().to_vec()
    }

    /// Mesh axis names.
    #[getter]
    fn axis_names(&self) -> Vec<String> {
        self.inner.metadata().axis_names().to_vec()
    }

    /// Mesh axis types, one `AxisType` name per axis.
    #[getter]
    fn axis_types(&self) -> Vec<&'static str> {
        self.inner
            .metadata()
            .axis_types()
            .iter()
            .map(|t| t.name())
            .collect()
    }

    /// True for one device's sharding made without a mesh (a
    /// `SingleDeviceSharding`'s), false for a mesh's.
    #[getter]
    fn is_single_device(&self) -> bool {
        self.inner.metadata().is_single_device()
    }

    /// Per array dimension, the mesh axes it is split over.
    #[getter]
    fn partition(&self) -> Vec<Vec<usize>> {
        self.inner.metadata().partition().to_vec()
    }

    /// True when every device holds the whole array.
    #[getter]
    fn is_fully_replicated(&self) -> bool {
        self.inner.metadata().is_fully_replicated()
    }

    /// The shape each device holds; `InvalidArgumentError` when a split dimension
    /// does not divide evenly or the spec has more dimensions than `shape`.
    fn shard_shape(&self, shape: Vec<i64>) -> PyResult<Vec<i64>> {
        self.inner.metadata().shard_shape(&shape).map_err(py_err)
    }

    /// For each device (in order), the `(start, stop)` range per dimension it holds.
    fn shard_indices(&self, shape: Vec<i64>) -> PyResult<Vec<Vec<(i64, i64)>>> {
        let sharding = self.inner.metadata();
        (0..sharding.devices().len())
            .map(|pos| sharding.shard_index(pos, &shape).map(|i| ranges(&i)))
            .collect::<Result<_, _>>()
            .map_err(py_err)
    }

    /// For each device (in order), `(replica id, position of the first
    /// device holding the same slice)` of an array of `shape`.
    fn replicas(&self, shape: Vec<i64>) -> PyResult<Vec<(usize, usize)>> {
        let replicas = self
            .inner
            .get()
            .map_err(py_err)?
            .replicas(&shape)
            .map_err(py_err)?;
        Ok(replicas.iter().map(|r| (r.id, r.first)).collect())
    }

    /// Where a fresh array of `shape` made like one of this sharding goes
    /// (core's rule): None for this sharding itself, else the sharding.
    fn fitted(&self, shape: Vec<i64>) -> PyResult<Option<Self>> {
        let (client, sharding) = self.get()?;
        let fitted = sharding.fitted(&shape).map_err(py_err)?;
        Ok((!fitted.same_as(sharding)).then(|| Sharding::wrap(client.clone(), fitted)))
    }

    /// The kind of memory the shards are in (`"pinned_host"`, ...), None for
    /// each device's default memory.
    #[getter]
    fn memory_kind(&self) -> Option<&'static str> {
        self.inner
            .metadata()
            .memory_kind()
            .map(core::MemoryKind::name)
    }

    /// This sharding with its shards in memory of `kind` (None: each
    /// device's default).
    #[pyo3(signature = (kind))]
    fn with_memory_kind(&self, kind: Option<&str>) -> PyResult<Self> {
        let (client, sharding) = self.get()?;
        let kind = kind
            .map(core::MemoryKind::from_name)
            .transpose()
            .map_err(py_err)?;
        let sharding = sharding.with_memory_kind(kind).map_err(py_err)?;
        Ok(Sharding::wrap(client.clone(), sharding))
    }

    /// Same devices in the same order, the same memory kind and the same
    /// split of every dimension of a rank-`rank` array.
    fn equivalent(&self, other: PyRef<'_, Sharding>, rank: usize) -> bool {
        self.inner
            .metadata()
            .equivalent(other.inner.metadata(), rank)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner.metadata())
    }
}
