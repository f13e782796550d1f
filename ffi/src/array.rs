//! Shardings and arrays.

use std::sync::Arc;

use colocated_core::{Array, ArraySpec, Error, MemoryKind, Result, Sharding};

use crate::buffer::{colocated_buffer, colocated_dtype, dtype_of};
use crate::client::{colocated_client, device_list, ClientShell};
use crate::device::{colocated_device, colocated_memory_kind};
use crate::error::colocated_error;
use crate::event::colocated_event;
use crate::handle::{
    colocated_string_view, get, get_list, handle, put_box, read_versioned, slice, tagged, take,
    versioned,
};
use crate::{boundary, boundary_void};

/// A sharding: a device list plus a layout. Owned by the caller; destroy with
/// `colocated_sharding_destroy`. Immutable.
///
/// Thread-safety: any thread.
#[repr(C)]
pub struct colocated_sharding {
    tag: u64,
    pub(crate) sharding: Sharding,
    shell: Arc<ClientShell>,
    devices: Vec<*const colocated_device>,
}

/// A sharded array: global shape, dtype, sharding and one buffer per device.
/// Owned by the caller; destroy with `colocated_array_destroy`.
///
/// Thread-safety: any thread.
#[repr(C)]
pub struct colocated_array {
    tag: u64,
    pub(crate) array: Array,
    pub(crate) shell: Arc<ClientShell>,
}

tagged! {
    colocated_sharding => 0xC010_CA7E_0000_0030,
    colocated_array => 0xC010_CA7E_0000_0031,
}

// SAFETY: the device pointers are borrowed from the shell this handle keeps alive.
unsafe impl Send for colocated_sharding {}
// SAFETY: as above; immutable.
unsafe impl Sync for colocated_sharding {}

impl colocated_sharding {
    pub(crate) fn make(sharding: Sharding, shell: Arc<ClientShell>) -> colocated_sharding {
        let devices = sharding
            .devices()
            .iter()
            .map(|d| shell.device_handle(d))
            .collect();
        let tag = <colocated_sharding as crate::handle::Tagged>::TAG;
        colocated_sharding {
            tag,
            sharding,
            shell,
            devices,
        }
    }
}

impl colocated_array {
    pub(crate) fn make(array: Array, shell: Arc<ClientShell>) -> colocated_array {
        let tag = <colocated_array as crate::handle::Tagged>::TAG;
        colocated_array { tag, array, shell }
    }
}

/// The shell of the client that `devices` belong to.
unsafe fn shell_of(
    devices: *const *const colocated_device,
    n: usize,
    client: *const colocated_client,
) -> Result<Arc<ClientShell>> {
    let c = handle(client, "client")?;
    for d in device_list(devices, n)? {
        c.shell.client.check_device(&d)?;
    }
    Ok(c.shell.clone())
}

/// A sharding in which each of `devices` holds the whole array. `*out` is caller
/// owned. Errors: `invalid_argument` (no devices, repeated device, device of another
/// client).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_create_replicated(
    client: *const colocated_client,
    devices: *const *const colocated_device,
    num_devices: usize,
    out: *mut *mut colocated_sharding,
) -> *mut colocated_error {
    boundary(|| {
        let shell = shell_of(devices, num_devices, client)?;
        let sharding = Sharding::replicated(device_list(devices, num_devices)?)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        put_box(out, colocated_sharding::make(sharding, shell), "out")
    })
}

/// Arguments of `colocated_sharding_create_named`: JAX's
/// `NamedSharding(Mesh(devices.reshape(mesh_shape), axis_names), PartitionSpec(...))`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_named_sharding_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The client (required).
    pub client: *const colocated_client,
    /// Mesh devices, row-major over `mesh_shape`.
    pub devices: *const *const colocated_device,
    /// Number of devices (the product of `mesh_shape`).
    pub num_devices: usize,
    /// Mesh shape.
    pub mesh_shape: *const usize,
    /// Number of mesh axes.
    pub num_mesh_axes: usize,
    /// One name per mesh axis (NULL: `"axis0"`, `"axis1"`, …).
    pub axis_names: *const colocated_string_view,
    /// For each array dimension `d`, `partition_counts[d]` mesh axis indices are
    /// taken in turn from `partition_axes` (0 entries: not split).
    pub partition_counts: *const usize,
    /// Number of array dimensions the spec covers (later ones are not split).
    pub num_partition_dims: usize,
    /// Mesh axis indices, concatenated over dimensions (major axis first).
    pub partition_axes: *const u32,
}
versioned!(colocated_named_sharding_args, required: partition_axes,
    fields: [struct_size, client, devices, num_devices, mesh_shape, num_mesh_axes, axis_names, partition_counts, num_partition_dims, partition_axes]);

/// A sharding split over a mesh. `*out` is caller owned. Errors:
/// `invalid_argument` (mesh shape not matching the devices, repeated names or
/// axes, axis out of range, devices of another client).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_create_named(
    args: *const colocated_named_sharding_args,
    out: *mut *mut colocated_sharding,
) -> *mut colocated_error {
    boundary(|| {
        let a = read_versioned(args, false)?;
        let shell = shell_of(a.devices, a.num_devices, a.client)?;
        let devices = device_list(a.devices, a.num_devices)?;
        let mesh_shape = slice(a.mesh_shape, a.num_mesh_axes, "mesh_shape")?.to_vec();
        let axis_names = if a.axis_names.is_null() {
            (0..a.num_mesh_axes).map(|i| format!("axis{i}")).collect()
        } else {
            slice(a.axis_names, a.num_mesh_axes, "axis_names")?
                .iter()
                .map(|v| v.to_str("axis name").map(str::to_string))
                .collect::<Result<Vec<_>>>()?
        };
        let counts = slice(a.partition_counts, a.num_partition_dims, "partition_counts")?;
        let total = counts.iter().try_fold(0usize, |acc, n| acc.checked_add(*n));
        let total = total.ok_or_else(|| Error::invalid_argument("partition_counts overflow"))?;
        let axes = slice(a.partition_axes, total, "partition_axes")?;
        let mut partition = Vec::with_capacity(counts.len());
        let mut at = 0;
        for &n in counts {
            partition.push(axes[at..at + n].iter().map(|a| *a as usize).collect());
            at += n;
        }
        let sharding = Sharding::named(devices, mesh_shape, axis_names, partition)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        put_box(out, colocated_sharding::make(sharding, shell), "out")
    })
}

/// Releases a sharding. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_destroy(sharding: *mut colocated_sharding) {
    boundary_void(|| drop(take(sharding)));
}

/// The sharding's devices in mesh order; buffer `i` of an array is on device `i`.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_devices(
    handle_: *const colocated_sharding,
    items: *mut *const *const colocated_device,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |s| &s.devices)
}
/// Whether every device holds the whole array.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_is_fully_replicated(
    handle_: *const colocated_sharding,
    out: *mut bool,
) -> *mut colocated_error {
    get(handle_, out, |s| s.sharding.is_fully_replicated())
}

/// The kind of memory the sharding puts shards in: the kind it was given
/// (`colocated_sharding_with_memory_kind`), else its first device's default.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_memory_kind(
    handle_: *const colocated_sharding,
    out: *mut colocated_memory_kind,
) -> *mut colocated_error {
    get(handle_, out, |s| {
        colocated_memory_kind::of(s.sharding.memory_kind_or_default())
    })
}

/// A new sharding like `sharding` with its shards in memory of `kind` (a
/// `colocated_memory_kind` value; 0: each device's default memory). Arrays
/// made or placed with it go to that memory; a colocated call's cache and
/// its outputs tell shardings of different kinds apart. Errors:
/// `invalid_argument` (a kind no value names, a device without memory of
/// that kind).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_with_memory_kind(
    sharding: *const colocated_sharding,
    kind: u32,
    out: *mut *mut colocated_sharding,
) -> *mut colocated_error {
    boundary(|| {
        let s = handle(sharding, "sharding")?;
        let kind = match kind {
            0 => None,
            v => Some(MemoryKind::from_u32(v).ok_or_else(|| {
                Error::invalid_argument(format!("memory kind {v} is none of 0, 1, 2, 3"))
            })?),
        };
        let with = s.sharding.with_memory_kind(kind)?;
        put_box(out, colocated_sharding::make(with, s.shell.clone()), "out")
    })
}

/// The slice of a global array of shape `dims` that the device at `device_index`
/// (in `colocated_sharding_devices`) holds: `starts` and `limits` are caller arrays
/// of `num_dims` entries. Either may be NULL. Errors: `invalid_argument` (index out
/// of range, uneven split).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_sharding_shard_index(
    sharding: *const colocated_sharding,
    device_index: usize,
    dims: *const i64,
    num_dims: usize,
    starts: *mut i64,
    limits: *mut i64,
) -> *mut colocated_error {
    boundary(|| {
        let s = handle(sharding, "sharding")?;
        let dims = slice(dims, num_dims, "dims")?;
        let index = s.sharding.shard_index(device_index, dims)?;
        for (i, r) in index.iter().enumerate() {
            if !starts.is_null() {
                *starts.add(i) = r.start;
            }
            if !limits.is_null() {
                *limits.add(i) = r.end;
            }
        }
        Ok(())
    })
}

/// Arguments shared by `colocated_array_assemble` and `colocated_array_from_host`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_array_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The client (required).
    pub client: *const colocated_client,
    /// Element type (`colocated_dtype`).
    pub dtype: u32,
    /// Global dimensions (NULL for a scalar).
    pub dims: *const i64,
    /// Number of dimensions.
    pub num_dims: usize,
    /// Layout (required).
    pub sharding: *const colocated_sharding,
    /// assemble: one buffer per sharding device, in its order.
    pub buffers: *const *const colocated_buffer,
    /// assemble: number of buffers.
    pub num_buffers: usize,
    /// from_host: row-major global data (strings: `colocated_string_view`s).
    pub data: *const std::ffi::c_void,
    /// from_host: bytes at `data`.
    pub data_size: usize,
}
versioned!(colocated_array_args, required: sharding,
    fields: [struct_size, client, dtype, dims, num_dims, sharding, buffers, num_buffers, data, data_size]);

unsafe fn spec_of(a: &colocated_array_args) -> Result<(Arc<ClientShell>, ArraySpec)> {
    let c = handle(a.client, "client")?;
    let s = handle(a.sharding, "sharding")?;
    if let Some(d) = s.sharding.devices().first() {
        c.shell.client.check_device(d)?;
    }
    let dims = slice(a.dims, a.num_dims, "dims")?.to_vec();
    Ok((
        c.shell.clone(),
        ArraySpec::new(dims, dtype_of(a.dtype)?, s.sharding.clone())?,
    ))
}

/// Assembles an array from per-device buffers (`buffers`, `num_buffers`). `*out`
/// is caller owned; the array shares the buffers. Errors: `invalid_argument`
/// (count, device order, shard shape or dtype mismatch), `failed_precondition`
/// (a deleted buffer).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_assemble(
    args: *const colocated_array_args,
    out: *mut *mut colocated_array,
) -> *mut colocated_error {
    boundary(|| {
        let a = read_versioned(args, false)?;
        let (shell, spec) = spec_of(&a)?;
        let buffers = slice(a.buffers, a.num_buffers, "buffers")?
            .iter()
            .enumerate()
            .map(|(i, b)| handle(*b, &format!("buffers[{i}]")).map(|b| b.buffer.clone()))
            .collect::<Result<Vec<_>>>()?;
        let array = Array::assemble(spec, buffers)?;
        put_box(out, colocated_array::make(array, shell), "out")
    })
}

/// Splits row-major global host data (`data`, `data_size`) into per-device copies.
/// `*out` is caller owned. Errors: `invalid_argument` (size, dims, split).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_from_host(
    args: *const colocated_array_args,
    out: *mut *mut colocated_array,
) -> *mut colocated_error {
    boundary(|| {
        let a = read_versioned(args, false)?;
        let (shell, spec) = spec_of(&a)?;
        let array = if spec.dtype == colocated_core::DType::String {
            let stride = std::mem::size_of::<colocated_string_view>();
            let views = slice(
                a.data.cast::<colocated_string_view>(),
                a.data_size / stride,
                "data",
            )?;
            let strings = views
                .iter()
                .map(|v| v.to_str("string element"))
                .collect::<Result<Vec<&str>>>()?;
            Array::from_host_strings(&shell.client, &strings, spec)?
        } else {
            let data = slice(a.data.cast::<u8>(), a.data_size, "data")?;
            Array::from_host_bytes(&shell.client, data, spec)?
        };
        put_box(out, colocated_array::make(array, shell), "out")
    })
}

/// Waits for the array and gathers it into `dst` (row-major, `dst_size` bytes =
/// elements × element size). Dense dtypes only. Errors: `invalid_argument` (size,
/// string dtype), `failed_precondition` (deleted), the producer's error.
/// Thread-safety: any thread; blocks until the array is ready.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_to_host(
    array: *const colocated_array,
    dst: *mut std::ffi::c_void,
    dst_size: usize,
) -> *mut colocated_error {
    boundary(|| {
        let a = handle(array, "array")?;
        let expected = a.array.on_host_size()?;
        if expected != dst_size {
            return Err(Error::invalid_argument(format!(
                "dst is {dst_size} bytes but the array is {expected}"
            )));
        }
        if dst_size == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(Error::invalid_argument("dst is NULL"));
        }
        a.array
            .to_host_into(std::slice::from_raw_parts_mut(dst.cast::<u8>(), dst_size))
    })
}

/// Releases the array handle (its buffers live on while other handles use them).
/// Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_destroy(array: *mut colocated_array) {
    boundary_void(|| drop(take(array)));
}

/// Deletes every buffer of the array (see `colocated_buffer_delete`).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_delete(
    array: *const colocated_array,
) -> *mut colocated_error {
    boundary(|| {
        handle(array, "array")?.array.delete();
        Ok(())
    })
}

/// Whether any buffer of the array was deleted.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_is_deleted(
    handle_: *const colocated_array,
    out: *mut bool,
) -> *mut colocated_error {
    get(handle_, out, |a| a.array.is_deleted())
}
/// The element type.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_dtype(
    handle_: *const colocated_array,
    out: *mut colocated_dtype,
) -> *mut colocated_error {
    get(handle_, out, |a| {
        colocated_dtype::from_core(a.array.dtype())
    })
}
/// The number of per-device buffers.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_num_buffers(
    handle_: *const colocated_array,
    out: *mut usize,
) -> *mut colocated_error {
    get(handle_, out, |a| a.array.buffers().len())
}

/// The global dimensions: `*dims` is borrowed from the array.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_dims(
    array: *const colocated_array,
    dims: *mut *const i64,
    num_dims: *mut usize,
) -> *mut colocated_error {
    get_list(array, dims, num_dims, |a| a.array.shape())
}

/// The array's sharding (a new handle the caller owns).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_sharding(
    array: *const colocated_array,
    out: *mut *mut colocated_sharding,
) -> *mut colocated_error {
    boundary(|| {
        let a = handle(array, "array")?;
        put_box(
            out,
            colocated_sharding::make(a.array.sharding().clone(), a.shell.clone()),
            "out",
        )
    })
}

/// Buffer `index` (on sharding device `index`): a new handle the caller owns,
/// sharing the data. Errors: `invalid_argument` for an index out of range.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_buffer(
    array: *const colocated_array,
    index: usize,
    out: *mut *mut colocated_buffer,
) -> *mut colocated_error {
    boundary(|| {
        let a = handle(array, "array")?;
        let b = a.array.buffers().get(index).ok_or_else(|| {
            Error::invalid_argument(format!(
                "buffer {index} is out of range ({} buffers)",
                a.array.buffers().len()
            ))
        })?;
        put_box(
            out,
            colocated_buffer::make(b.clone(), a.shell.clone()),
            "out",
        )
    })
}

/// A new event (caller owned) ready when every buffer of the array is.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_array_ready_event(
    array: *const colocated_array,
    out: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        let a = handle(array, "array")?;
        put_box(out, colocated_event::make(a.array.ready_event()), "out")
    })
}
