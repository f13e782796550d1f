//! Shardings: a device list plus a layout — one device's, or split over a mesh
//! as JAX's `NamedSharding(Mesh(devices, axis_names, axis_types),
//! PartitionSpec(...))`.

use std::ops::Range;
use std::sync::Arc;

use crate::device::{Device, MemoryKind};
use crate::error::{Error, Result};

/// How a mesh axis is used (JAX's `jax.sharding.AxisType`). Shardings keep
/// and compare it; layouts do not depend on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AxisType {
    /// The compiler decides (JAX's default for `Mesh`).
    #[default]
    Auto = 0,
    /// Sharding is part of the array's type (JAX's default for `make_mesh`).
    Explicit = 1,
    /// The program handles the axis itself.
    Manual = 2,
}

impl AxisType {
    /// JAX's name of the type: `Auto`, `Explicit` or `Manual`.
    pub fn name(self) -> &'static str {
        match self {
            AxisType::Auto => "Auto",
            AxisType::Explicit => "Explicit",
            AxisType::Manual => "Manual",
        }
    }

    /// The type named `name` (see [`name`](Self::name)); `invalid_argument`
    /// for another name.
    pub fn from_name(name: &str) -> Result<AxisType> {
        match name {
            "Auto" => Ok(AxisType::Auto),
            "Explicit" => Ok(AxisType::Explicit),
            "Manual" => Ok(AxisType::Manual),
            _ => Err(Error::invalid_argument(format!(
                "unknown mesh axis type '{name}' (expected Auto, Explicit or Manual)"
            ))),
        }
    }

    /// The type of wire value `v` (as `AxisType as u32`); `invalid_argument`
    /// for a value no type has.
    pub fn from_u32(v: u32) -> Result<AxisType> {
        match v {
            0 => Ok(AxisType::Auto),
            1 => Ok(AxisType::Explicit),
            2 => Ok(AxisType::Manual),
            _ => Err(Error::invalid_argument(format!(
                "unknown mesh axis type {v}"
            ))),
        }
    }
}

struct Inner {
    devices: Vec<Device>,
    mesh_shape: Vec<usize>,
    axis_names: Vec<String>,
    /// One per mesh axis.
    axis_types: Vec<AxisType>,
    /// Made for one device without a mesh (JAX's `SingleDeviceSharding`).
    single_device: bool,
    /// For each array dimension, the mesh axes it is split over (major first);
    /// missing trailing dimensions are replicated.
    partition: Vec<Vec<usize>>,
    /// The kind of memory the shards are in; `None`: each device's default
    /// memory (a kind that is every device's default is kept as `None`).
    memory_kind: Option<MemoryKind>,
}

/// How an array is laid out over devices. Cheap to clone; compare with
/// [`Sharding::equivalent`].
#[derive(Clone)]
pub struct Sharding(Arc<Inner>);

impl std::fmt::Debug for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<u32> = self.0.devices.iter().map(Device::id).collect();
        let memory = match self.0.memory_kind {
            Some(kind) => format!(", memory_kind={}", kind.name()),
            None => String::new(),
        };
        if self.0.single_device {
            return write!(f, "SingleDevice(device={ids:?}{memory})");
        }
        if self.is_fully_replicated() {
            return write!(f, "Replicated(devices={ids:?}{memory})");
        }
        let spec: Vec<String> = self
            .0
            .partition
            .iter()
            .map(|axes| match axes.as_slice() {
                [] => "None".to_string(),
                [a] => format!("'{}'", self.0.axis_names[*a]),
                many => format!(
                    "({})",
                    many.iter()
                        .map(|a| format!("'{}'", self.0.axis_names[*a]))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
            .collect();
        write!(
            f,
            "Named(mesh={:?}{:?}, spec=P({}), devices={ids:?}{memory})",
            self.0.axis_names,
            self.0.mesh_shape,
            spec.join(", ")
        )
    }
}

impl Sharding {
    /// Every device holds the whole array (a one-axis mesh named `replica`).
    pub fn replicated(devices: Vec<Device>) -> Result<Sharding> {
        let n = devices.len();
        Sharding::named(devices, vec![n], vec!["replica".to_string()], vec![])
    }

    /// The whole array on one device, without a mesh (JAX's
    /// `SingleDeviceSharding`; its layout is that of a one-device mesh with
    /// one axis named `replica`).
    pub fn single_device(device: Device) -> Sharding {
        Sharding(Arc::new(Inner {
            devices: vec![device],
            mesh_shape: vec![1],
            axis_names: vec!["replica".to_string()],
            axis_types: vec![AxisType::Auto],
            single_device: true,
            partition: vec![],
            memory_kind: None,
        }))
    }

    /// A mesh of `devices` (row-major over `mesh_shape`, with one name per axis,
    /// every axis of type [`AxisType::Auto`]) and, for each array dimension, the
    /// mesh axes it is split over. Even over one device it is a mesh's
    /// sharding, not [`single_device`](Self::single_device)'s.
    pub fn named(
        devices: Vec<Device>,
        mesh_shape: Vec<usize>,
        axis_names: Vec<String>,
        partition: Vec<Vec<usize>>,
    ) -> Result<Sharding> {
        if devices.is_empty() {
            return Err(Error::invalid_argument(
                "a sharding needs at least one device",
            ));
        }
        if mesh_shape.len() != axis_names.len() {
            return Err(Error::invalid_argument(format!(
                "mesh has {} axes but {} axis names",
                mesh_shape.len(),
                axis_names.len()
            )));
        }
        let size = mesh_shape
            .iter()
            .try_fold(1usize, |acc, d| acc.checked_mul(*d));
        if size != Some(devices.len()) {
            return Err(Error::invalid_argument(format!(
                "mesh shape {mesh_shape:?} does not hold {} devices",
                devices.len()
            )));
        }
        for (i, name) in axis_names.iter().enumerate() {
            if axis_names[..i].contains(name) {
                return Err(Error::invalid_argument(format!(
                    "mesh axis name '{name}' is repeated"
                )));
            }
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::invalid_argument(format!(
                    "{d} appears twice in the sharding"
                )));
            }
            if d.client_id() != devices[0].client_id() {
                return Err(Error::invalid_argument(
                    "a sharding's devices must belong to one client",
                ));
            }
        }
        let mut used = vec![false; mesh_shape.len()];
        for axes in &partition {
            for &a in axes {
                if a >= mesh_shape.len() {
                    return Err(Error::invalid_argument(format!(
                        "partition names mesh axis {a} but the mesh has {} axes",
                        mesh_shape.len()
                    )));
                }
                if std::mem::replace(&mut used[a], true) {
                    return Err(Error::invalid_argument(format!(
                        "mesh axis '{}' is used twice in the partition spec",
                        axis_names[a]
                    )));
                }
            }
        }
        let mut partition = partition;
        while partition.last().is_some_and(Vec::is_empty) {
            partition.pop();
        }
        let axis_types = vec![AxisType::Auto; mesh_shape.len()];
        Ok(Sharding(Arc::new(Inner {
            devices,
            mesh_shape,
            axis_names,
            axis_types,
            single_device: false,
            partition,
            memory_kind: None,
        })))
    }

    /// This mesh's sharding with mesh axes of `axis_types` (one per axis);
    /// `invalid_argument` for another number of types, or for a
    /// [`single_device`](Self::single_device) sharding (which has no mesh).
    pub fn with_axis_types(&self, axis_types: Vec<AxisType>) -> Result<Sharding> {
        if self.0.single_device {
            return Err(Error::invalid_argument(
                "a single device's sharding has no mesh axes to give types",
            ));
        }
        if axis_types.len() != self.0.mesh_shape.len() {
            return Err(Error::invalid_argument(format!(
                "mesh has {} axes but {} axis types",
                self.0.mesh_shape.len(),
                axis_types.len()
            )));
        }
        Ok(Sharding(Arc::new(Inner {
            devices: self.0.devices.clone(),
            mesh_shape: self.0.mesh_shape.clone(),
            axis_names: self.0.axis_names.clone(),
            axis_types,
            single_device: false,
            partition: self.0.partition.clone(),
            memory_kind: self.0.memory_kind,
        })))
    }

    /// This sharding with its shards in memory of `kind` (`None`: each
    /// device's default memory, as is a kind that is every device's
    /// default); `invalid_argument` when a device has no memory of `kind`.
    pub fn with_memory_kind(&self, kind: Option<MemoryKind>) -> Result<Sharding> {
        let kind = match kind {
            Some(kind) => {
                for d in &self.0.devices {
                    if !d.memory_kinds().contains(&kind) {
                        return Err(Error::invalid_argument(format!(
                            "{d} has no memory of kind '{}' (it has {})",
                            kind.name(),
                            d.memory_kinds()
                                .iter()
                                .map(|k| format!("'{}'", k.name()))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )));
                    }
                }
                let default = |d: &Device| d.default_memory_space().kind() == kind;
                (!self.0.devices.iter().all(default)).then_some(kind)
            }
            None => None,
        };
        if kind == self.0.memory_kind {
            return Ok(self.clone());
        }
        Ok(Sharding(Arc::new(Inner {
            devices: self.0.devices.clone(),
            mesh_shape: self.0.mesh_shape.clone(),
            axis_names: self.0.axis_names.clone(),
            axis_types: self.0.axis_types.clone(),
            single_device: self.0.single_device,
            partition: self.0.partition.clone(),
            memory_kind: kind,
        })))
    }

    /// The kind of memory the shards are in, when not each device's default
    /// (see [`with_memory_kind`](Self::with_memory_kind)).
    pub fn memory_kind(&self) -> Option<MemoryKind> {
        self.0.memory_kind
    }

    /// The kind of memory the shards are in: [`memory_kind`](Self::memory_kind),
    /// else the first device's default.
    pub fn memory_kind_or_default(&self) -> MemoryKind {
        self.0
            .memory_kind
            .unwrap_or_else(|| self.0.devices[0].default_memory_space().kind())
    }

    /// A sharding read from the wire (`executable.proto`'s `Sharding`, the
    /// colocated protocol's `HostLayout`): a mesh's when `mesh` is set; when
    /// not (a single device's, or an older writer's, which never sets it), a
    /// single device's if it is one device unsplit, else a mesh's. Empty
    /// `axis_types` (older writers): every axis `Auto`. `memory_kind` is a
    /// [`MemoryKind`] value, 0 (older writers too) for the default memory.
    pub(crate) fn from_wire(
        devices: Vec<Device>,
        mesh_shape: Vec<usize>,
        axis_names: Vec<String>,
        axis_types: &[u32],
        mesh: bool,
        partition: Vec<Vec<usize>>,
        memory_kind: u32,
    ) -> Result<Sharding> {
        let memory_kind = match memory_kind {
            0 => None,
            v => Some(MemoryKind::from_u32(v).ok_or_else(|| {
                Error::invalid_argument(format!("memory kind {v} is none of 1, 2, 3"))
            })?),
        };
        let named = Sharding::named(devices, mesh_shape, axis_names, partition)?;
        let sharding = if !mesh && named.0.devices.len() == 1 && named.0.partition.is_empty() {
            Sharding::single_device(named.0.devices[0].clone())
        } else if axis_types.is_empty() {
            named
        } else {
            let types = axis_types
                .iter()
                .map(|&t| AxisType::from_u32(t))
                .collect::<Result<Vec<_>>>()?;
            named.with_axis_types(types)?
        };
        sharding.with_memory_kind(memory_kind)
    }

    /// The memory kind as the wire carries it (see [`from_wire`](Self::from_wire)).
    pub(crate) fn wire_memory_kind(&self) -> u32 {
        self.0.memory_kind.map_or(0, |k| k as u32)
    }

    /// The axis types as the wire carries them (see [`from_wire`](Self::from_wire)).
    pub(crate) fn wire_axis_types(&self) -> Vec<u32> {
        self.0.axis_types.iter().map(|&t| t as u32).collect()
    }

    /// Devices in mesh (row-major) order; buffer `i` of an array lives on device `i`.
    pub fn devices(&self) -> &[Device] {
        &self.0.devices
    }
    /// Mesh shape.
    pub fn mesh_shape(&self) -> &[usize] {
        &self.0.mesh_shape
    }
    /// Mesh axis names.
    pub fn axis_names(&self) -> &[String] {
        &self.0.axis_names
    }
    /// Mesh axis types, one per axis.
    pub fn axis_types(&self) -> &[AxisType] {
        &self.0.axis_types
    }
    /// Per array dimension, the mesh axes it is split over.
    pub fn partition(&self) -> &[Vec<usize>] {
        &self.0.partition
    }
    /// True when made for one device without a mesh
    /// ([`single_device`](Self::single_device)).
    pub fn is_single_device(&self) -> bool {
        self.0.single_device
    }
    /// True when every device holds the whole array.
    pub fn is_fully_replicated(&self) -> bool {
        self.0
            .partition
            .iter()
            .all(|axes| axes.iter().all(|&a| self.0.mesh_shape[a] == 1))
    }
    /// An address that identifies this sharding object while it lives.
    pub fn identity(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// True when both handles are the same object (the cheap check of fast paths).
    pub fn same_as(&self, other: &Sharding) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Same devices in the same order, the same memory kind, and the same split of every dimension of a
    /// rank-`rank` array (however the meshes are named: see [`PartialEq`] for
    /// the same sharding).
    pub fn equivalent(&self, other: &Sharding, rank: usize) -> bool {
        if self.same_as(other) {
            return true;
        }
        self.0.memory_kind == other.0.memory_kind
            && self.0.devices == other.0.devices
            && (0..rank).all(|d| self.dim_split(d) == other.dim_split(d))
            && (0..self.0.devices.len())
                .all(|i| (0..rank).all(|d| self.part_index(i, d) == other.part_index(i, d)))
    }

    fn dim_split(&self, dim: usize) -> usize {
        self.0.partition.get(dim).map_or(1, |axes| {
            axes.iter().map(|&a| self.0.mesh_shape[a]).product()
        })
    }

    fn part_index(&self, device_pos: usize, dim: usize) -> usize {
        let Some(axes) = self.0.partition.get(dim) else {
            return 0;
        };
        let coords = self.coords(device_pos);
        axes.iter()
            .fold(0, |acc, &a| acc * self.0.mesh_shape[a] + coords[a])
    }

    fn coords(&self, mut pos: usize) -> smallvec::SmallVec<[usize; 4]> {
        let mut coords = smallvec::smallvec![0; self.0.mesh_shape.len()];
        for (c, &n) in coords.iter_mut().zip(&self.0.mesh_shape).rev() {
            *c = pos % n;
            pos /= n;
        }
        coords
    }

    /// The shape each device holds for a global `shape`; `invalid_argument` when a
    /// split dimension does not divide evenly or the spec has more dims than `shape`.
    pub fn shard_shape(&self, shape: &[i64]) -> Result<Vec<i64>> {
        if self.0.partition.len() > shape.len() {
            return Err(Error::invalid_argument(format!(
                "the partition spec has {} dimensions but the array has rank {}",
                self.0.partition.len(),
                shape.len()
            )));
        }
        shape
            .iter()
            .enumerate()
            .map(|(d, &n)| {
                if n < 0 {
                    return Err(Error::invalid_argument(format!(
                        "dimension {d} is negative ({n})"
                    )));
                }
                let parts = self.dim_split(d) as i64;
                if n % parts != 0 {
                    return Err(Error::invalid_argument(format!(
                        "dimension {d} of size {n} does not split evenly into {parts} parts"
                    )));
                }
                Ok(n / parts)
            })
            .collect()
    }

    /// Where a fresh array of `shape` made like one of this sharding goes:
    /// this sharding when it splits `shape` evenly, else the array whole on
    /// each device of the same mesh (same names, axis types and memory kind).
    pub fn fitted(&self, shape: &[i64]) -> Result<Sharding> {
        if self.shard_shape(shape).is_ok() {
            return Ok(self.clone());
        }
        let replicated = Sharding(Arc::new(Inner {
            devices: self.0.devices.clone(),
            mesh_shape: self.0.mesh_shape.clone(),
            axis_names: self.0.axis_names.clone(),
            axis_types: self.0.axis_types.clone(),
            single_device: self.0.single_device,
            partition: vec![],
            memory_kind: self.0.memory_kind,
        }));
        replicated.shard_shape(shape)?;
        Ok(replicated)
    }

    /// The slice of a global `shape` that the device at `device_pos` holds.
    pub fn shard_index(&self, device_pos: usize, shape: &[i64]) -> Result<Vec<Range<i64>>> {
        if device_pos >= self.0.devices.len() {
            return Err(Error::invalid_argument(format!(
                "device position {device_pos} is out of range for {} devices",
                self.0.devices.len()
            )));
        }
        let shard = self.shard_shape(shape)?;
        Ok(shard
            .iter()
            .enumerate()
            .map(|(d, &len)| {
                let start = self.part_index(device_pos, d) as i64 * len;
                start..start + len
            })
            .collect())
    }

    /// For each device (in order), which copy of its shard of a global
    /// `shape` it holds: its replica id (0 for the first device holding that
    /// slice, 1 for the next, …) and the position of the first device that
    /// holds the same slice (its own for replica 0). A slice needs computing
    /// once, at the positions whose replica id is 0.
    pub fn replicas(&self, shape: &[i64]) -> Result<Vec<Replica>> {
        let mut seen: Vec<(Vec<Range<i64>>, usize, usize)> = Vec::new();
        let mut replicas = Vec::with_capacity(self.0.devices.len());
        for pos in 0..self.0.devices.len() {
            let index = self.shard_index(pos, shape)?;
            match seen.iter_mut().find(|(i, _, _)| *i == index) {
                Some((_, first, count)) => {
                    replicas.push(Replica {
                        id: *count,
                        first: *first,
                    });
                    *count += 1;
                }
                None => {
                    replicas.push(Replica { id: 0, first: pos });
                    seen.push((index, pos, 1));
                }
            }
        }
        Ok(replicas)
    }

    /// Host indices the devices live on, in order of first appearance.
    pub fn host_indices(&self) -> Vec<usize> {
        let mut hosts = Vec::new();
        for d in &self.0.devices {
            if !hosts.contains(&d.host_index()) {
                hosts.push(d.host_index());
            }
        }
        hosts
    }

    /// True when `self` and `other` use the same set of devices (order aside).
    pub fn same_device_set(&self, other: &Sharding) -> bool {
        same_device_set(&self.0.devices, &other.0.devices)
    }
}

/// The same sharding as JAX compares them: both one device's, or both a
/// mesh's with the same devices in the same shape, the same axis names and
/// types, the same partition spec (trailing unsplit dimensions aside), and
/// the same memory kind.
impl PartialEq for Sharding {
    fn eq(&self, other: &Sharding) -> bool {
        self.same_as(other)
            || (self.0.single_device == other.0.single_device
                && self.0.memory_kind == other.0.memory_kind
                && self.0.devices == other.0.devices
                && self.0.mesh_shape == other.0.mesh_shape
                && self.0.axis_names == other.0.axis_names
                && self.0.axis_types == other.0.axis_types
                && self.0.partition == other.0.partition)
    }
}

impl Eq for Sharding {}

/// Which copy of its shard a device holds (see [`Sharding::replicas`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica {
    /// 0 for the first device holding the slice, 1 for the next, …
    pub id: usize,
    /// Position of the first device holding the same slice.
    pub first: usize,
}

/// True when both lists hold the same devices, in any order.
pub fn same_device_set(a: &[Device], b: &[Device]) -> bool {
    a.len() == b.len() && a.iter().all(|d| b.contains(d))
}
