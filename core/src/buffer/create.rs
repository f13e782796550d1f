//! Making buffers: from host bytes (with PJRT's host-buffer semantics), host
//! memory, strings, views of device memory, and pending buffers that an
//! upload fills.

use std::sync::Arc;

use super::{host, on_plugin, Buffer, HostBufferSemantics, Storage};
use crate::client::Client;
use crate::device::{Device, MemorySpace};
use crate::dtype::{checked_byte_size, checked_num_elements, DType};
use crate::error::{Error, Result};
use crate::future::Event;
use crate::future::Progress;
use crate::storage::{DenseBytes, HostMemory};

impl Buffer {
    /// Creates a buffer from dense host bytes on `memory_space` (of `device`).
    ///
    /// Returns the buffer and the "done with host buffer" event: after it is ready,
    /// the caller may free or reuse `data`.
    ///
    /// # Safety
    /// `data` must be valid for reads of `len` bytes: during the call for
    /// `ImmutableOnlyDuringCall`, else until the returned done event is ready.
    // The argument list mirrors PJRT's BufferFromHostBuffer, which users know.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn from_host_raw(
        client: &Client,
        data: *const u8,
        len: usize,
        dtype: DType,
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
        semantics: HostBufferSemantics,
    ) -> Result<(Buffer, Event)> {
        Buffer::from_host_reporting(
            client,
            data,
            len,
            dtype,
            dims,
            device,
            memory_space,
            semantics,
            None,
        )
    }

    /// A buffer on a PJRT plugin's `device` that views the `dtype` array of
    /// `dims` in device memory at `data` without owning or copying it: memory that
    /// another client of a plugin in this process allocated on the same
    /// device (a `jax.Array`'s, through DLPack), dense and row-major.
    /// `on_delete` runs once the plugin is done with the memory (this buffer
    /// and every use of it gone), on whatever thread that happens, or
    /// before this returns an error.
    ///
    /// Errors: `invalid_argument` for a device that is not a plugin's, a
    /// string dtype, or a size out of range; `unimplemented` when the
    /// plugin has no views; the plugin's errors (a misaligned address, say).
    ///
    /// # Safety
    /// `data` points to the array's bytes in the device's memory (`memory_space`,
    /// default: its default memory) as its plugin addresses them, with no
    /// write to them pending, that stay valid and unchanged until
    /// `on_delete` runs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn view_of_device_memory(
        client: &Client,
        data: *mut u8,
        dtype: DType,
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
        on_delete: Box<dyn FnOnce() + Send>,
    ) -> Result<Buffer> {
        let checked = (|| {
            let Some(pjrt) = &device.0.pjrt else {
                return Err(Error::invalid_argument(format!(
                    "device {} is not a PJRT plugin's device: only a plugin's device views device memory",
                    device.id()
                )));
            };
            if dtype == DType::String {
                return Err(Error::invalid_argument(
                    "a view of device memory cannot hold strings",
                ));
            }
            let len = checked_byte_size(dtype, dims)?;
            Ok((pjrt, len, placement(client, device, memory_space)?))
        })();
        let (pjrt, len, memory_space) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                on_delete();
                return Err(e);
            }
        };
        let buffer = Buffer::pending(client, device, memory_space, dtype, dims);
        match on_plugin::view(pjrt, &buffer, data, len, on_delete) {
            Ok(()) => Ok(buffer),
            Err(e) => {
                buffer.finish(Err(e.clone()));
                Err(e)
            }
        }
    }

    /// [`from_host_raw`](Self::from_host_raw), with `progress` of a copy to
    /// a worker.
    ///
    /// # Safety
    /// As [`from_host_raw`](Self::from_host_raw).
    #[allow(clippy::too_many_arguments)]
    unsafe fn from_host_reporting(
        client: &Client,
        data: *const u8,
        len: usize,
        dtype: DType,
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
        semantics: HostBufferSemantics,
        progress: Option<Progress>,
    ) -> Result<(Buffer, Event)> {
        if dtype == DType::String {
            return Err(Error::invalid_argument(
                "string buffers are made from strings, not bytes",
            ));
        }
        let expected = checked_byte_size(dtype, dims)?;
        if len != expected {
            return Err(Error::invalid_argument(format!(
                "data is {len} bytes but {}{dims:?} needs {expected}",
                dtype.name()
            )));
        }
        if data.is_null() && len > 0 {
            return Err(Error::invalid_argument("data is NULL"));
        }
        let memory_space = placement(client, device, memory_space)?;
        let _span =
            tracing::trace_span!("buffer_from_host", bytes = len, semantics = ?semantics).entered();
        // Readable for `len` bytes, as the caller guarantees (see Safety).
        let src = if len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(data, len)
        };
        let host = host::of(client, device);
        if semantics != HostBufferSemantics::ImmutableZeroCopy || !host.in_process() {
            // Copied during the call (on its way to a worker, whatever the
            // semantics: chunk by chunk while the chunks already copied travel).
            let buffer = Buffer::pending(client, device, memory_space, dtype, dims);
            host.put_copy(&buffer, src, progress);
            return Ok((buffer, Event::ready_ok()));
        }
        let done = Event::new();
        let on_release = done.clone();
        let release: Box<dyn FnOnce() + Send> = Box::new(move || on_release.set_if_pending(Ok(())));
        let bytes = DenseBytes::borrowed(data, len, Some(release));
        let buffer = Buffer::pending(client, device, memory_space, dtype, dims);
        buffer.finish(Ok(Arc::new(Storage::Dense(bytes))));
        Ok((buffer, done))
    }

    /// Creates a buffer of `dtype[dims]` on `device`'s default memory space from
    /// `memory`, which it takes over: without a copy on this host (the memory is
    /// freed when the buffer's last user lets go), copied to the worker for a
    /// device of a worker host.
    ///
    /// Errors: `invalid_argument` for a string dtype, a size that does not match
    /// `dtype[dims]`, or a device of another client.
    pub fn from_host_memory(
        client: &Client,
        memory: HostMemory,
        dtype: DType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        Buffer::from_host_memory_in(client, memory, dtype, dims, device, None)
    }

    /// [`from_host_memory`](Self::from_host_memory) into `memory_space`
    /// (default: the device's default memory space), which the device must
    /// address.
    ///
    /// Errors: as [`from_host_memory`](Self::from_host_memory), and
    /// `invalid_argument` for a memory space the device does not address.
    pub fn from_host_memory_in(
        client: &Client,
        memory: HostMemory,
        dtype: DType,
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
    ) -> Result<Buffer> {
        if dtype == DType::String {
            return Err(Error::invalid_argument(
                "string buffers are made from strings, not bytes",
            ));
        }
        let expected = checked_byte_size(dtype, dims)?;
        if memory.len() != expected {
            return Err(Error::invalid_argument(format!(
                "host memory is {} bytes but {}{dims:?} needs {expected}",
                memory.len(),
                dtype.name()
            )));
        }
        Buffer::from_memory_reporting(client, memory, dtype, dims, device, memory_space, None)
    }

    /// [`from_host_memory`](Self::from_host_memory) into `memory_space`
    /// (default: the device's default memory space), reporting `progress` as
    /// the memory travels to a worker. The caller checked that `memory` holds
    /// `dtype[dims]` (dense).
    pub(crate) fn from_memory_reporting(
        client: &Client,
        memory: HostMemory,
        dtype: DType,
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
        progress: Option<Progress>,
    ) -> Result<Buffer> {
        let memory_space = placement(client, device, memory_space)?;
        let buffer = Buffer::pending(client, device, memory_space, dtype, dims);
        let data = Arc::new(Storage::Dense(memory.into_dense()));
        host::of(client, device).put(&buffer, data, progress);
        Ok(buffer)
    }

    /// Creates a buffer from a copy of `data` on `device`'s default memory space.
    pub fn from_bytes(
        client: &Client,
        data: &[u8],
        dtype: DType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        Buffer::from_bytes_in(client, data, dtype, dims, device, None)
    }

    /// Creates a buffer from a copy of `data` on `device`, in `memory_space`
    /// (default: the device's default memory space), which the device must
    /// address.
    pub fn from_bytes_in(
        client: &Client,
        data: &[u8],
        dtype: DType,
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
    ) -> Result<Buffer> {
        Buffer::from_bytes_reporting(client, data, dtype, dims, device, memory_space, None)
    }

    /// [`from_bytes_in`](Self::from_bytes_in), reporting `progress(bytes
    /// sent, bytes in all)` on a network thread while a copy to a worker
    /// travels (a copy within this host reports nothing).
    pub(crate) fn from_bytes_reporting(
        client: &Client,
        data: &[u8],
        dtype: DType,
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
        progress: Option<Progress>,
    ) -> Result<Buffer> {
        // SAFETY: `data` is a valid slice for the duration of the call, and the
        // semantics copy it during the call.
        unsafe {
            Buffer::from_host_reporting(
                client,
                data.as_ptr(),
                data.len(),
                dtype,
                dims,
                device,
                memory_space,
                HostBufferSemantics::ImmutableOnlyDuringCall,
                progress,
            )
        }
        .map(|(b, _)| b)
    }

    /// Creates a string buffer (UTF-8 elements, row-major) on `device`, in
    /// `memory_space` (default: the device's default memory space). The
    /// strings are copied during the call. On a worker's device the buffer is
    /// ready once the worker has them (and fails with `resource_exhausted` if
    /// they take over
    /// [`MAX_STRING_BUFFER_BYTES`](crate::transport::MAX_STRING_BUFFER_BYTES)
    /// on the wire; `unimplemented` now for a worker too old for strings).
    pub fn from_strings<S: AsRef<str>>(
        client: &Client,
        strings: &[S],
        dims: &[i64],
        device: &Device,
        memory_space: Option<&MemorySpace>,
    ) -> Result<Buffer> {
        let n = checked_num_elements(dims)?;
        if strings.len() != n {
            return Err(Error::invalid_argument(format!(
                "{} strings given but dims {dims:?} need {n}",
                strings.len()
            )));
        }
        let memory_space = placement(client, device, memory_space)?;
        if !device.is_host_cpu() {
            return Err(Error::invalid_argument(format!(
                "string buffers live on CPU devices only, not on {device} (a {} device)",
                device.backend()
            )));
        }
        let host = host::of(client, device);
        host.check_dtype(DType::String)?;
        let elements = strings.iter().map(|s| Box::from(s.as_ref())).collect();
        let buffer = Buffer::pending(client, device, memory_space, DType::String, dims);
        host.put(&buffer, Arc::new(Storage::Strings(elements)), None);
        Ok(buffer)
    }

    /// A ready string buffer of this host that takes `elements` over (their
    /// number must match `dims`).
    pub(crate) fn of_strings(
        client: &Client,
        elements: Box<[Box<str>]>,
        dims: &[i64],
        device: &Device,
        memory_space: MemorySpace,
    ) -> Buffer {
        let buffer = Buffer::new(
            client,
            device.clone(),
            memory_space,
            DType::String,
            dims,
            Event::ready_ok(),
        );
        buffer.fill(Storage::Strings(elements));
        buffer
    }
}
/// Checks that `device` belongs to `client` and can address `memory_space`
/// (default: the device's default memory space), and returns the memory space.
fn placement(
    client: &Client,
    device: &Device,
    memory_space: Option<&MemorySpace>,
) -> Result<MemorySpace> {
    client.check_device(device)?;
    match memory_space {
        None => Ok(device.default_memory_space().clone()),
        Some(m) => {
            client.check_memory_space(m)?;
            if !m.device_ids().contains(&device.id()) {
                return Err(Error::invalid_argument(format!(
                    "{device} cannot address {m:?}"
                )));
            }
            Ok(m.clone())
        }
    }
}

/// The device a new buffer in `memory_space` goes to: its first device.
pub(super) fn device_of(client: &Client, memory_space: &MemorySpace) -> Result<Device> {
    client.check_memory_space(memory_space)?;
    let id = memory_space
        .device_ids()
        .first()
        .ok_or_else(|| Error::internal(format!("{memory_space:?} has no device")))?;
    client.lookup_device(*id)
}

impl Buffer {
    /// A buffer of `dtype[dims]` on `device` that is not ready yet: what an
    /// upload to the device's worker fills.
    pub(crate) fn pending(
        client: &Client,
        device: &Device,
        memory_space: MemorySpace,
        dtype: DType,
        dims: &[i64],
    ) -> Buffer {
        Buffer::new(
            client,
            device.clone(),
            memory_space,
            dtype,
            dims,
            Event::new(),
        )
    }
}
