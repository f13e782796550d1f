//! Making arrays: from single-device arrays, from buffers, and from host bytes
//! or strings split into per-device shards.

use std::sync::Arc;

use super::layout::{copy_block, element_indices, Direction};
use super::{memory_space, shard_progress, Array, Inner};
use crate::buffer::Buffer;
use crate::client::Client;
use crate::device::MemoryKind;
use crate::dtype::{checked_byte_size, checked_num_elements, DType};
use crate::error::{Error, Result};
use crate::future::Progress;
use crate::spec::ArraySpec;
use crate::storage::HostMemory;

impl Array {
    /// Assembles an array of `spec` from single-device arrays, one per device
    /// of its sharding, matched by device (in any order), without copying:
    /// the new array shares their buffers. With `memory_kind`, each must be
    /// in memory of that kind (and so must they with a sharding that names
    /// a memory kind). `invalid_argument` (saying which) for an array
    /// over several devices, two on one device, a device of the sharding
    /// with none, or another memory kind, dtype or shard shape.
    pub fn from_single_device_arrays(
        spec: ArraySpec,
        arrays: &[Array],
        memory_kind: Option<MemoryKind>,
    ) -> Result<Array> {
        let memory_kind = memory_kind.or(spec.sharding.memory_kind());
        let devices = spec.sharding.devices();
        if arrays.len() != devices.len() {
            return Err(Error::invalid_argument(format!(
                "the sharding has {} devices but {} arrays were given",
                devices.len(),
                arrays.len()
            )));
        }
        let mut by_device: Vec<Option<Buffer>> = vec![None; devices.len()];
        for (i, a) in arrays.iter().enumerate() {
            let [one] = a.buffers() else {
                return Err(Error::invalid_argument(format!(
                    "each array must be on a single device, but array {i} is on {} devices",
                    a.buffers().len()
                )));
            };
            let got = one.memory_space().kind();
            if memory_kind.is_some_and(|want| want != got) {
                return Err(Error::invalid_argument(format!(
                    "array {i} is in {} memory but the sharding's memory kind is {}",
                    got.name(),
                    memory_kind.map_or("", MemoryKind::name)
                )));
            }
            // One on a device the sharding lacks leaves a device without one.
            let Some(pos) = devices.iter().position(|d| d == one.device()) else {
                continue;
            };
            if by_device[pos].replace(one.clone()).is_some() {
                return Err(Error::invalid_argument(format!(
                    "two arrays are on {}",
                    one.device()
                )));
            }
        }
        if let Some(missing) = by_device.iter().position(Option::is_none) {
            let on: Vec<u32> = arrays
                .iter()
                .flat_map(|a| a.buffers().iter().map(|b| b.device().id()))
                .collect();
            return Err(Error::invalid_argument(format!(
                "no array is on {}, which the sharding uses (the arrays are on devices {on:?})",
                devices[missing]
            )));
        }
        let buffers = by_device.into_iter().flatten().collect();
        Array::assemble(spec, buffers)
    }

    /// Assembles an array from one buffer per device of `spec.sharding`, in the
    /// sharding's device order; each must hold that device's shard, all in
    /// one kind of memory (the sharding's, when it names one). The array's
    /// sharding says the kind they are in.
    pub fn assemble(spec: ArraySpec, buffers: Vec<Buffer>) -> Result<Array> {
        let devices = spec.sharding.devices();
        if buffers.len() != devices.len() {
            return Err(Error::invalid_argument(format!(
                "the sharding has {} devices but {} buffers were given",
                devices.len(),
                buffers.len()
            )));
        }
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        for (i, (b, d)) in buffers.iter().zip(devices).enumerate() {
            b.check_live()?;
            if b.device() != d {
                return Err(Error::invalid_argument(format!(
                    "buffer {i} is on {} but the sharding puts shard {i} on {d}",
                    b.device()
                )));
            }
            if b.dtype() != spec.dtype || b.dims() != shard.as_slice() {
                return Err(Error::invalid_argument(format!(
                    "buffer {i} is {}{:?} but shard {i} of {} is {}{shard:?}",
                    b.dtype().name(),
                    b.dims(),
                    spec.describe(),
                    spec.dtype.name()
                )));
            }
        }
        let spec = match super::in_memory_of(&spec, &buffers)? {
            Some(sharding) => ArraySpec { sharding, ..spec },
            None => spec,
        };
        Ok(Array(Arc::new(Inner { spec, buffers })))
    }

    /// Splits row-major host bytes of the global array into per-device copies.
    pub fn from_host_bytes(client: &Client, data: &[u8], spec: ArraySpec) -> Result<Array> {
        Array::from_host_bytes_in(client, data, spec, None)
    }

    /// [`from_host_bytes`](Self::from_host_bytes) into each device's memory
    /// space of `memory_kind` (default: the sharding's memory kind, else
    /// each device's default memory space);
    /// `invalid_argument`, naming the kinds a device has, when it lacks it.
    pub fn from_host_bytes_in(
        client: &Client,
        data: &[u8],
        spec: ArraySpec,
        memory_kind: Option<MemoryKind>,
    ) -> Result<Array> {
        Array::from_host_bytes_with_progress(client, data, spec, memory_kind, None)
    }

    /// [`from_host_bytes_in`](Self::from_host_bytes_in), reporting
    /// `progress(bytes done, bytes in all)` on network threads as the shards
    /// that go to workers travel (over all of them; shards of this host
    /// report nothing).
    pub fn from_host_bytes_with_progress(
        client: &Client,
        data: &[u8],
        spec: ArraySpec,
        memory_kind: Option<MemoryKind>,
        progress: Option<Progress>,
    ) -> Result<Array> {
        let memory_kind = memory_kind.or(spec.sharding.memory_kind());
        let elem = spec
            .dtype
            .byte_size()
            .ok_or_else(|| Error::invalid_argument("use from_host_strings for string arrays"))?;
        let expected = checked_byte_size(spec.dtype, &spec.shape)?;
        if data.len() != expected {
            return Err(Error::invalid_argument(format!(
                "data is {} bytes but {} needs {expected}",
                data.len(),
                spec.describe()
            )));
        }
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        let shard_bytes = checked_byte_size(spec.dtype, &shard)?;
        let devices = spec.sharding.devices();
        let remote: Vec<u64> = devices
            .iter()
            .map(|d| match client.remote(d.host_index()) {
                Some(_) => shard_bytes as u64,
                None => 0,
            })
            .collect();
        let mut reports = shard_progress(progress, &remote).into_iter();
        let mut buffers = Vec::with_capacity(devices.len());
        for (pos, device) in devices.iter().enumerate() {
            let memory = memory_space(device, memory_kind)?;
            let report = reports.next().flatten();
            if shard_bytes == data.len() {
                // The shard is the whole array (one device, or replicated).
                buffers.push(Buffer::from_bytes_reporting(
                    client, data, spec.dtype, &shard, device, memory, report,
                )?);
                continue;
            }
            let index = spec.sharding.shard_index(pos, &spec.shape)?;
            // The block is copied once, into memory its buffer takes over
            // (kept as it is here, sent as it is to a worker).
            let mut block = HostMemory::zeroed(shard_bytes)?;
            copy_block(
                data,
                &spec.shape,
                &index,
                block.as_mut_slice(),
                elem,
                Direction::GlobalToShard,
            );
            buffers.push(Buffer::from_memory_reporting(
                client, block, spec.dtype, &shard, device, memory, report,
            )?);
        }
        // Made here to fit `spec`: one buffer per device, of the shard's shape.
        Ok(Array::from_parts(spec, buffers))
    }

    /// Splits row-major strings of the global array into per-device string buffers.
    pub fn from_host_strings<S: AsRef<str>>(
        client: &Client,
        strings: &[S],
        spec: ArraySpec,
    ) -> Result<Array> {
        Array::from_host_strings_in(client, strings, spec, None)
    }

    /// [`from_host_strings`](Self::from_host_strings) into each device's
    /// memory space of `memory_kind` (as [`from_host_bytes_in`](Self::from_host_bytes_in)).
    pub fn from_host_strings_in<S: AsRef<str>>(
        client: &Client,
        strings: &[S],
        spec: ArraySpec,
        memory_kind: Option<MemoryKind>,
    ) -> Result<Array> {
        let memory_kind = memory_kind.or(spec.sharding.memory_kind());
        if spec.dtype != DType::String {
            return Err(Error::invalid_argument(
                "from_host_strings needs dtype string",
            ));
        }
        let n = checked_num_elements(&spec.shape)?;
        if strings.len() != n {
            return Err(Error::invalid_argument(format!(
                "{} strings given but {} needs {n}",
                strings.len(),
                spec.describe()
            )));
        }
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        let mut buffers = Vec::new();
        for (pos, device) in spec.sharding.devices().iter().enumerate() {
            let index = spec.sharding.shard_index(pos, &spec.shape)?;
            let picked: Vec<&str> = element_indices(&spec.shape, &index)
                .map(|i| strings[i].as_ref())
                .collect();
            let memory = memory_space(device, memory_kind)?;
            buffers.push(Buffer::from_strings(
                client, &picked, &shard, device, memory,
            )?);
        }
        Array::assemble(spec, buffers)
    }
}
