//! Buffers: creation from host data, transfers, deletion, external references.

use std::sync::{Arc, Mutex};

use colocated_core::{Buffer, DType, Error, ExternalReference, HostBufferSemantics};

use crate::client::{colocated_client, ClientShell};
use crate::device::{colocated_device, colocated_memory_space};
use crate::error::colocated_error;
use crate::event::colocated_event;
use crate::handle::{
    colocated_string_view, get, get_list, handle, put, put_box, read_versioned, slice, tagged,
    take, versioned,
};
use crate::{boundary, boundary_void};

/// Element types (values never change).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum colocated_dtype {
    /// Not a dtype; rejected.
    COLOCATED_DTYPE_INVALID = 0,
    /// bool, one byte (0 or 1).
    COLOCATED_DTYPE_BOOL = 1,
    /// int8.
    COLOCATED_DTYPE_I8 = 2,
    /// int16.
    COLOCATED_DTYPE_I16 = 3,
    /// int32.
    COLOCATED_DTYPE_I32 = 4,
    /// int64.
    COLOCATED_DTYPE_I64 = 5,
    /// uint8.
    COLOCATED_DTYPE_U8 = 6,
    /// uint16.
    COLOCATED_DTYPE_U16 = 7,
    /// uint32.
    COLOCATED_DTYPE_U32 = 8,
    /// uint64.
    COLOCATED_DTYPE_U64 = 9,
    /// IEEE half.
    COLOCATED_DTYPE_F16 = 10,
    /// bfloat16.
    COLOCATED_DTYPE_BF16 = 11,
    /// float.
    COLOCATED_DTYPE_F32 = 12,
    /// double.
    COLOCATED_DTYPE_F64 = 13,
    /// Variable-length UTF-8 strings (see `colocated_buffer_from_host`).
    COLOCATED_DTYPE_STRING = 14,
}

impl colocated_dtype {
    pub(crate) fn from_core(d: DType) -> Self {
        use colocated_dtype::*;
        match d {
            DType::Bool => COLOCATED_DTYPE_BOOL,
            DType::I8 => COLOCATED_DTYPE_I8,
            DType::I16 => COLOCATED_DTYPE_I16,
            DType::I32 => COLOCATED_DTYPE_I32,
            DType::I64 => COLOCATED_DTYPE_I64,
            DType::U8 => COLOCATED_DTYPE_U8,
            DType::U16 => COLOCATED_DTYPE_U16,
            DType::U32 => COLOCATED_DTYPE_U32,
            DType::U64 => COLOCATED_DTYPE_U64,
            DType::F16 => COLOCATED_DTYPE_F16,
            DType::BF16 => COLOCATED_DTYPE_BF16,
            DType::F32 => COLOCATED_DTYPE_F32,
            DType::F64 => COLOCATED_DTYPE_F64,
            DType::String => COLOCATED_DTYPE_STRING,
        }
    }
}

/// Reads a dtype value from C (any `u32` may arrive).
pub(crate) fn dtype_of(raw: u32) -> colocated_core::Result<DType> {
    DType::from_u32(raw)
}

/// Host-buffer semantics (PJRT's).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum colocated_host_buffer_semantics {
    /// Default: same as IMMUTABLE_ONLY_DURING_CALL.
    COLOCATED_HOST_BUFFER_DEFAULT = 0,
    /// Copied during the call.
    COLOCATED_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL = 1,
    /// Unchanged by the caller until the done event is ready.
    COLOCATED_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 2,
    /// Aliased, not copied: valid and unchanged until the done event is ready.
    COLOCATED_HOST_BUFFER_IMMUTABLE_ZERO_COPY = 3,
}

/// A buffer handle: one device's data. Owned by the caller; destroy with
/// `colocated_buffer_destroy` (which releases this handle; the data is freed when
/// no handle, array or running program uses it, or at once by
/// `colocated_buffer_delete`).
///
/// Thread-safety: every buffer function may be called from any thread.
#[repr(C)]
pub struct colocated_buffer {
    pub(crate) tag: u64,
    pub(crate) buffer: Buffer,
    pub(crate) shell: Arc<ClientShell>,
    pins: Mutex<Vec<ExternalReference>>,
}

tagged! { colocated_buffer => 0xC010_CA7E_0000_0010 }

impl colocated_buffer {
    pub(crate) fn new(buffer: Buffer, shell: Arc<ClientShell>) -> colocated_buffer {
        colocated_buffer {
            tag: <colocated_buffer as crate::handle::Tagged>::TAG,
            buffer,
            shell,
            pins: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn make(buffer: Buffer, shell: Arc<ClientShell>) -> colocated_buffer {
        colocated_buffer::new(buffer, shell)
    }
}

/// Arguments of `colocated_buffer_from_host`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_buffer_from_host_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The client (required).
    pub client: *const colocated_client,
    /// Row-major element data. For `COLOCATED_DTYPE_STRING`: an array of
    /// `colocated_string_view`, one per element (always copied).
    pub data: *const std::ffi::c_void,
    /// Bytes at `data`: elements × element size (× `sizeof(colocated_string_view)`
    /// for strings).
    pub data_size: usize,
    /// Element type (`colocated_dtype`).
    pub dtype: u32,
    /// `colocated_host_buffer_semantics` (0: copy during the call).
    pub semantics: u32,
    /// Dimensions (may be NULL for a scalar).
    pub dims: *const i64,
    /// Number of dimensions.
    pub num_dims: usize,
    /// Target device (required).
    pub device: *const colocated_device,
    /// Target memory space (NULL: the device's default).
    pub memory_space: *const colocated_memory_space,
}
versioned!(colocated_buffer_from_host_args, required: device,
    fields: [struct_size, client, data, data_size, dtype, semantics, dims, num_dims, device, memory_space]);

/// Creates a buffer from host data. `*out` is a new buffer the caller owns.
/// `done_with_host_buffer` may be NULL; otherwise it receives a new event (caller
/// owned) that is ready when the caller may free or change `data` — at once for the
/// copying semantics, when the buffer and every user are gone for zero-copy.
///
/// Errors (`invalid_argument`): bad struct; NULL client/device; unknown dtype or
/// semantics; negative or overflowing dims; `data_size` not matching; a device or
/// memory space of another client; a memory space the device cannot address;
/// strings that are not UTF-8.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_from_host(
    args: *const colocated_buffer_from_host_args,
    out: *mut *mut colocated_buffer,
    done_with_host_buffer: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        let a = read_versioned(args, false)?;
        let client = handle(a.client, "client")?;
        let device = handle(a.device, "device")?;
        let memory = if a.memory_space.is_null() {
            None
        } else {
            Some(&handle(a.memory_space, "memory_space")?.memory)
        };
        let dtype = dtype_of(a.dtype)?;
        let dims = slice(a.dims, a.num_dims, "dims")?;
        let semantics = match a.semantics {
            0 => HostBufferSemantics::ImmutableOnlyDuringCall,
            v => HostBufferSemantics::from_u32(v)?,
        };
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let core = &client.shell.client;
        let (buffer, done) = if dtype == DType::String {
            let stride = std::mem::size_of::<colocated_string_view>();
            if a.data_size % stride != 0 {
                return Err(Error::invalid_argument(format!(
                    "data_size {} is not a multiple of sizeof(colocated_string_view) ({stride})",
                    a.data_size
                )));
            }
            let views = slice(
                a.data.cast::<colocated_string_view>(),
                a.data_size / stride,
                "data",
            )?;
            let strings = views
                .iter()
                .enumerate()
                .map(|(i, v)| v.to_str(&format!("string element {i}")))
                .collect::<colocated_core::Result<Vec<&str>>>()?;
            let buffer = Buffer::from_strings(core, &strings, dims, &device.device, memory)?;
            (buffer, colocated_core::Event::ready(Ok(())))
        } else {
            Buffer::from_host_raw(
                core,
                a.data.cast(),
                a.data_size,
                dtype,
                dims,
                &device.device,
                memory,
                semantics,
            )?
        };
        if !done_with_host_buffer.is_null() {
            *done_with_host_buffer = colocated_event::new_raw(done);
        }
        put_box(
            out,
            colocated_buffer::make(buffer, client.shell.clone()),
            "out",
        )
    })
}

/// Releases the caller's handle (not the data of other handles or arrays; see
/// `colocated_buffer_delete`). Unpins any pins this handle holds. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_destroy(buffer: *mut colocated_buffer) {
    boundary_void(|| drop(take(buffer)));
}

/// Frees the buffer's data once in-flight work and pins are done with it. Every
/// handle and array sharing the buffer sees it deleted: later uses fail with
/// `failed_precondition`. Deleting twice is allowed.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_delete(
    buffer: *const colocated_buffer,
) -> *mut colocated_error {
    boundary(|| {
        handle(buffer, "buffer")?.buffer.delete();
        Ok(())
    })
}

/// Whether the buffer was deleted.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_is_deleted(
    handle_: *const colocated_buffer,
    out: *mut bool,
) -> *mut colocated_error {
    get(handle_, out, |b| b.buffer.is_deleted())
}
/// The element type.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_dtype(
    handle_: *const colocated_buffer,
    out: *mut colocated_dtype,
) -> *mut colocated_error {
    get(handle_, out, |b| {
        colocated_dtype::from_core(b.buffer.dtype())
    })
}
/// The device (borrowed).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_device(
    handle_: *const colocated_buffer,
    out: *mut *const colocated_device,
) -> *mut colocated_error {
    get(handle_, out, |b| b.shell.device_handle(b.buffer.device()))
}
/// The memory space (borrowed).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_memory_space(
    handle_: *const colocated_buffer,
    out: *mut *const colocated_memory_space,
) -> *mut colocated_error {
    get(handle_, out, |b| {
        b.shell.memory_handle(b.buffer.memory_space())
    })
}

/// The dimensions: `*dims` is borrowed from the buffer, `*num_dims` long.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_dims(
    buffer: *const colocated_buffer,
    dims: *mut *const i64,
    num_dims: *mut usize,
) -> *mut colocated_error {
    get_list(buffer, dims, num_dims, |b| b.buffer.dims())
}

/// Bytes `colocated_buffer_to_host` writes. For strings this waits until the
/// buffer is ready: `(n + 1)` little-endian `uint64_t` offsets, then the UTF-8
/// bytes of every element back to back. Errors: `failed_precondition` if deleted;
/// the producer's error.
/// Thread-safety: any thread; may block (strings).
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_on_host_size(
    buffer: *const colocated_buffer,
    out: *mut usize,
) -> *mut colocated_error {
    boundary(|| put(out, handle(buffer, "buffer")?.buffer.on_host_size()?, "out"))
}

/// A new event (caller owned) that is ready when the buffer's data is.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_ready_event(
    buffer: *const colocated_buffer,
    out: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        let b = handle(buffer, "buffer")?;
        put_box(
            out,
            colocated_event::make(b.buffer.ready_event().clone()),
            "out",
        )
    })
}

/// Copies the data into `dst` (`dst_size` bytes, exactly
/// `colocated_buffer_on_host_size`) once the buffer is ready. Returns at once;
/// `*out` (caller owned) is ready when `dst` is written, or carries the failure.
/// `dst` must stay valid and untouched until then.
/// Errors now: `invalid_argument` (size, NULL dst), `failed_precondition` (deleted).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_to_host(
    buffer: *const colocated_buffer,
    dst: *mut std::ffi::c_void,
    dst_size: usize,
    out: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| {
        let b = handle(buffer, "buffer")?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let event = b.buffer.to_host_raw(dst.cast(), dst_size)?;
        put_box(out, colocated_event::make(event), "out")
    })
}

/// Pins the data and gives a raw pointer to it (dense dtypes): it stays valid, even
/// across `colocated_buffer_delete`, until the matching `colocated_buffer_unpin` on
/// this handle (or its destruction). Waits until the buffer is ready. Writing
/// through the pointer while programs read the buffer is a data race the caller
/// must prevent. On a PJRT plugin's device the pointer is the plugin's device
/// memory (host memory only for a host platform; a GPU address for the CUDA
/// plugin) and `size` the buffer's size there (since API 1.5; before, and for
/// a plugin without external references, `unimplemented`). Errors:
/// `failed_precondition` (deleted, or on a worker), `invalid_argument`
/// (string buffers), the producer's error.
/// Thread-safety: any thread; blocks until ready.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_pin(
    buffer: *const colocated_buffer,
    data: *mut *mut std::ffi::c_void,
    size: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let b = handle(buffer, "buffer")?;
        if b.buffer.dtype() == DType::String {
            return Err(Error::invalid_argument(
                "string buffers have no raw pointer; use colocated_buffer_to_host",
            ));
        }
        let pin = b.buffer.acquire_external_reference()?;
        put(data, pin.data_ptr().cast(), "data")?;
        if !size.is_null() {
            *size = pin.len();
        }
        b.pins.lock().unwrap_or_else(|e| e.into_inner()).push(pin);
        Ok(())
    })
}

/// Releases one pin taken with `colocated_buffer_pin` on this handle. Errors:
/// `failed_precondition` when the handle holds no pin.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_unpin(
    buffer: *const colocated_buffer,
) -> *mut colocated_error {
    boundary(|| {
        let b = handle(buffer, "buffer")?;
        let pin = b.pins.lock().unwrap_or_else(|e| e.into_inner()).pop();
        pin.map(drop)
            .ok_or_else(|| Error::failed_precondition("the buffer handle holds no pin"))
    })
}

/// Copies the buffer to `device` (its default memory space). Returns at once with a
/// new buffer (caller owned) that becomes ready after the copy, which runs in
/// program order on the calling thread's stream. Errors: `invalid_argument` (device
/// of another client), `failed_precondition` (deleted).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_copy_to_device(
    buffer: *const colocated_buffer,
    device: *const colocated_device,
    out: *mut *mut colocated_buffer,
) -> *mut colocated_error {
    boundary(|| {
        let b = handle(buffer, "buffer")?;
        let d = handle(device, "device")?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let copy = b.buffer.copy_to_device(&d.device)?;
        put_box(out, colocated_buffer::make(copy, b.shell.clone()), "out")
    })
}

/// Copies the buffer to `memory_space`, like `colocated_buffer_copy_to_device`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_buffer_copy_to_memory_space(
    buffer: *const colocated_buffer,
    memory_space: *const colocated_memory_space,
    out: *mut *mut colocated_buffer,
) -> *mut colocated_error {
    boundary(|| {
        let b = handle(buffer, "buffer")?;
        let m = handle(memory_space, "memory_space")?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let copy = b.buffer.copy_to_memory_space(&m.memory)?;
        put_box(out, colocated_buffer::make(copy, b.shell.clone()), "out")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_dtypes_match_core_dtypes() {
        for d in DType::ALL {
            assert_eq!(colocated_dtype::from_core(d) as u32, d as u32);
        }
    }
}
