//! Shardings: a device list plus a layout — replicated, or split over a mesh as
//! JAX's `NamedSharding(Mesh(devices, axis_names), PartitionSpec(...))`.

use std::ops::Range;
use std::sync::Arc;

use crate::device::Device;
use crate::error::{Error, Result};

struct Inner {
    devices: Vec<Device>,
    mesh_shape: Vec<usize>,
    axis_names: Vec<String>,
    /// For each array dimension, the mesh axes it is split over (major first);
    /// missing trailing dimensions are replicated.
    partition: Vec<Vec<usize>>,
}

/// How an array is laid out over devices. Cheap to clone; compare with
/// [`Sharding::equivalent`].
#[derive(Clone)]
pub struct Sharding(Arc<Inner>);

impl std::fmt::Debug for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<u32> = self.0.devices.iter().map(Device::id).collect();
        if self.is_fully_replicated() {
            return write!(f, "Replicated(devices={ids:?})");
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
            "Named(mesh={:?}{:?}, spec=P({}), devices={ids:?})",
            self.0.axis_names,
            self.0.mesh_shape,
            spec.join(", ")
        )
    }
}

impl Sharding {
    /// Every device holds the whole array.
    pub fn replicated(devices: Vec<Device>) -> Result<Sharding> {
        let n = devices.len();
        Sharding::named(devices, vec![n], vec!["replica".to_string()], vec![])
    }

    /// The whole array on one device.
    pub fn single_device(device: Device) -> Sharding {
        Sharding(Arc::new(Inner {
            devices: vec![device],
            mesh_shape: vec![1],
            axis_names: vec!["replica".to_string()],
            partition: vec![],
        }))
    }

    /// A mesh of `devices` (row-major over `mesh_shape`, with one name per axis) and,
    /// for each array dimension, the mesh axes it is split over.
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
        Ok(Sharding(Arc::new(Inner {
            devices,
            mesh_shape,
            axis_names,
            partition,
        })))
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
    /// Per array dimension, the mesh axes it is split over.
    pub fn partition(&self) -> &[Vec<usize>] {
        &self.0.partition
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

    /// Same devices in the same order, and the same split of every dimension of a
    /// rank-`rank` array.
    pub fn equivalent(&self, other: &Sharding, rank: usize) -> bool {
        if self.same_as(other) {
            return true;
        }
        self.0.devices == other.0.devices
            && (0..rank).all(|d| self.dim_split(d) == other.dim_split(d))
            && self.split_positions(rank) == other.split_positions(rank)
    }

    fn dim_split(&self, dim: usize) -> usize {
        self.0.partition.get(dim).map_or(1, |axes| {
            axes.iter().map(|&a| self.0.mesh_shape[a]).product()
        })
    }

    fn split_positions(&self, rank: usize) -> Vec<Vec<usize>> {
        (0..self.0.devices.len())
            .map(|i| (0..rank).map(|d| self.part_index(i, d)).collect())
            .collect()
    }

    fn part_index(&self, device_pos: usize, dim: usize) -> usize {
        let Some(axes) = self.0.partition.get(dim) else {
            return 0;
        };
        let coords = self.coords(device_pos);
        axes.iter()
            .fold(0, |acc, &a| acc * self.0.mesh_shape[a] + coords[a])
    }

    fn coords(&self, mut pos: usize) -> Vec<usize> {
        let mut coords = vec![0; self.0.mesh_shape.len()];
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
