//! Buffers: one device's data in one of its memories.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::client::{Client, ClientInner, Device, Memory};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::plugin::{call, new_args};
use crate::sys;
use crate::types::ElementType;

/// How [`Client::buffer_from_host`] may use the caller's memory (PJRT's
/// `PJRT_HostBufferSemantics`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostBufferSemantics {
    /// Copied before the call returns.
    ImmutableOnlyDuringCall,
    /// Read until the "done with host buffer" event.
    ImmutableUntilTransferCompletes,
    /// May be aliased for the buffer's life (until the event).
    ImmutableZeroCopy,
    /// May be aliased and written for the buffer's life (until the event).
    MutableZeroCopy,
}

impl HostBufferSemantics {
    fn to_pjrt(self) -> sys::PJRT_HostBufferSemantics {
        match self {
            HostBufferSemantics::ImmutableOnlyDuringCall => {
                sys::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
            }
            HostBufferSemantics::ImmutableUntilTransferCompletes => {
                sys::PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes
            }
            HostBufferSemantics::ImmutableZeroCopy => {
                sys::PJRT_HostBufferSemantics_kImmutableZeroCopy
            }
            HostBufferSemantics::MutableZeroCopy => sys::PJRT_HostBufferSemantics_kMutableZeroCopy,
        }
    }
}

/// A buffer of a plugin's client. Dropping it destroys the handle (and frees
/// the device memory once in-flight work is done).
pub struct Buffer {
    raw: *mut sys::PJRT_Buffer,
    client: Arc<ClientInner>,
    element_type: ElementType,
    /// Inline up to rank 4 (no allocation of their own).
    dims: smallvec::SmallVec<[i64; 4]>,
}

// SAFETY: PJRT buffers may be used from any thread.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pjrt::Buffer({:?}{:?})", self.element_type, self.dims)
    }
}

/// The bytes of a dense array of `dims` elements of `element_type`, or
/// `invalid_argument` for a negative dimension or a size that overflows.
pub(crate) fn byte_size(element_type: ElementType, dims: &[i64]) -> Result<usize> {
    let mut n = element_type.size_in_bytes();
    for &d in dims {
        let d = usize::try_from(d)
            .map_err(|_| Error::invalid_argument(format!("negative dimension {d} in {dims:?}")))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| Error::invalid_argument(format!("dimensions {dims:?} overflow")))?;
    }
    Ok(n)
}

impl Client {
    /// A buffer on `memory` (a memory of one of this client's devices) with a
    /// dense, row-major copy of `len` bytes at `data`, of `element_type` and
    /// `dims`, and the event after which the plugin no longer reads `data`
    /// (none when it has finished already).
    ///
    /// Errors: `invalid_argument` when `len` is not the size `element_type`
    /// and `dims` give, or `memory` is not one of this client's; the plugin's
    /// errors otherwise.
    ///
    /// # Safety
    /// `data` points to `len` readable bytes that stay valid and unchanged
    /// (and, for `MutableZeroCopy`, writable) as `semantics` requires: until
    /// the call returns, or until the returned event is ready.
    pub unsafe fn buffer_from_host(
        &self,
        data: *const u8,
        len: usize,
        element_type: ElementType,
        dims: &[i64],
        semantics: HostBufferSemantics,
        memory: &Memory,
    ) -> Result<(Buffer, Option<Event>)> {
        let expected = byte_size(element_type, dims)?;
        if len != expected {
            return Err(Error::invalid_argument(format!(
                "{len} bytes for {element_type:?}{dims:?}, which takes {expected}"
            )));
        }
        self.check_memory(memory)?;
        let mut a = new_args!(
            PJRT_Client_BufferFromHostBuffer_Args,
            PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE
        );
        a.client = self.0.raw;
        // A zero-sized array still needs a valid pointer.
        a.data = if len == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            data.cast()
        };
        a.type_ = element_type.to_pjrt();
        a.dims = dims.as_ptr();
        a.num_dims = dims.len();
        a.host_buffer_semantics = semantics.to_pjrt();
        a.memory = memory.raw;
        call!(
            self.0.plugin.api(),
            PJRT_Client_BufferFromHostBuffer,
            &mut a
        )?;
        let done = Event::from_raw(&self.0.plugin, a.done_with_host_buffer);
        let buffer = self.adopt(a.buffer, element_type, dims)?;
        Ok((buffer, done))
    }

    /// A buffer of this client that views `len` bytes at `data` in
    /// `memory` without owning them (`PJRT_Client_CreateViewOfDeviceBuffer`),
    /// dense and row-major: memory another library allocated on the device
    /// (another client of the same plugin in this process, through DLPack).
    /// `on_delete` runs once the plugin is done with the memory (the buffer
    /// and every use of it gone), on whatever thread that happens; it runs
    /// before this returns when the plugin refuses the view.
    ///
    /// Errors: `invalid_argument` when `len` is not the size `element_type`
    /// and `dims` give, or `memory` is not one of this client's;
    /// `unimplemented` when the plugin has no views; the plugin's errors
    /// otherwise.
    ///
    /// # Safety
    /// `data` points to `len` bytes of `memory` as this plugin addresses
    /// them, ready (no write to them pending), that stay valid and
    /// unchanged until `on_delete` runs.
    pub unsafe fn view_of_device_buffer(
        &self,
        data: *mut u8,
        len: usize,
        element_type: ElementType,
        dims: &[i64],
        memory: &Memory,
        on_delete: Box<dyn FnOnce() + Send>,
    ) -> Result<Buffer> {
        let expected = match byte_size(element_type, dims) {
            Ok(expected) => expected,
            Err(e) => {
                on_delete();
                return Err(e);
            }
        };
        if len != expected {
            on_delete();
            return Err(Error::invalid_argument(format!(
                "{len} bytes for {element_type:?}{dims:?}, which takes {expected}"
            )));
        }
        if let Err(e) = self.check_memory(memory) {
            on_delete();
            return Err(e);
        }
        unsafe extern "C" fn deleted(_data: *mut std::ffi::c_void, arg: *mut std::ffi::c_void) {
            // SAFETY: `arg` is the box leaked below, handed back once.
            let callback = unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) };
            // A panic must not unwind into the plugin.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback));
        }
        let arg = Box::into_raw(Box::new(on_delete));
        let mut a = new_args!(
            PJRT_Client_CreateViewOfDeviceBuffer_Args,
            PJRT_Client_CreateViewOfDeviceBuffer_Args_STRUCT_SIZE
        );
        a.client = self.0.raw;
        a.device_buffer_ptr = if len == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            data.cast()
        };
        a.dims = dims.as_ptr();
        a.num_dims = dims.len();
        a.element_type = element_type.to_pjrt();
        a.on_delete_callback = Some(deleted);
        a.on_delete_callback_arg = arg.cast();
        a.memory = memory.raw;
        let result = call!(
            self.0.plugin.api(),
            PJRT_Client_CreateViewOfDeviceBuffer,
            &mut a
        );
        match result.and_then(|()| self.adopt(a.buffer, element_type, dims)) {
            Ok(buffer) => Ok(buffer),
            Err(e) => {
                if a.buffer.is_null() {
                    // SAFETY: no buffer holds the callback: it is still ours.
                    let on_delete = unsafe { Box::from_raw(arg) };
                    on_delete();
                }
                Err(e)
            }
        }
    }

    fn check_memory(&self, memory: &Memory) -> Result<()> {
        let ours = self
            .devices()
            .iter()
            .any(|d| d.memories().iter().any(|m| m.raw == memory.raw));
        if ours {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "memory {} ({}) is not a memory of this client's devices",
                memory.id(),
                memory.kind()
            )))
        }
    }

    fn check_device(&self, device: &Device) -> Result<()> {
        if self.devices().iter().any(|d| d.raw == device.raw) {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "device {} is not a device of this client",
                device.id()
            )))
        }
    }

    /// Takes ownership of `raw` (a buffer the plugin just made).
    pub(crate) fn adopt(
        &self,
        raw: *mut sys::PJRT_Buffer,
        element_type: ElementType,
        dims: &[i64],
    ) -> Result<Buffer> {
        if raw.is_null() {
            return Err(Error::internal("the PJRT plugin returned no buffer"));
        }
        Ok(Buffer {
            raw,
            client: self.0.clone(),
            element_type,
            dims: smallvec::SmallVec::from_slice(dims),
        })
    }
}

fn destroy(client: &ClientInner, raw: *mut sys::PJRT_Buffer) {
    let mut a = new_args!(
        PJRT_Buffer_Destroy_Args,
        PJRT_Buffer_Destroy_Args_STRUCT_SIZE
    );
    a.buffer = raw;
    // Nothing is left to do when the plugin fails to destroy a buffer.
    let _ = call!(client.plugin.api(), PJRT_Buffer_Destroy, &mut a);
}

impl Drop for Buffer {
    fn drop(&mut self) {
        destroy(&self.client, self.raw);
    }
}

impl Buffer {
    pub(crate) fn raw(&self) -> *mut sys::PJRT_Buffer {
        self.raw
    }

    pub(crate) fn client_arc(&self) -> &Arc<ClientInner> {
        &self.client
    }

    fn client(&self) -> Client {
        Client(self.client.clone())
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// The dimensions.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// The size of the dense host form ([`to_host`](Self::to_host)'s `len`).
    pub fn host_size(&self) -> usize {
        // Checked when the buffer was made or adopted.
        byte_size(self.element_type, &self.dims).unwrap_or(0)
    }

    /// The bytes the buffer takes on its device.
    pub fn on_device_size(&self) -> Result<usize> {
        let mut a = new_args!(
            PJRT_Buffer_OnDeviceSizeInBytes_Args,
            PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        call!(
            self.client.plugin.api(),
            PJRT_Buffer_OnDeviceSizeInBytes,
            &mut a
        )?;
        Ok(a.on_device_size_in_bytes)
    }

    /// The event that is ready when the buffer's data is (with the error of
    /// the work that was to produce it).
    pub fn ready_event(&self) -> Result<Event> {
        let mut a = new_args!(
            PJRT_Buffer_ReadyEvent_Args,
            PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        call!(self.client.plugin.api(), PJRT_Buffer_ReadyEvent, &mut a)?;
        Event::from_raw(&self.client.plugin, a.event)
            .ok_or_else(|| Error::internal("PJRT_Buffer_ReadyEvent returned no event"))
    }

    /// Copies the data, dense and row-major, into the `len` bytes at `dst`;
    /// the copy is done when the returned event is ready (none: done already).
    ///
    /// Errors: `invalid_argument` when `len` is not [`host_size`](Self::host_size).
    ///
    /// # Safety
    /// `dst` points to `len` writable bytes that stay valid, and are not read
    /// or written by anyone else, until the event is ready.
    pub unsafe fn to_host(&self, dst: *mut u8, len: usize) -> Result<Option<Event>> {
        let expected = self.host_size();
        if len != expected {
            return Err(Error::invalid_argument(format!(
                "{len} bytes for {:?}{:?}, which takes {expected}",
                self.element_type, self.dims
            )));
        }
        let mut a = new_args!(
            PJRT_Buffer_ToHostBuffer_Args,
            PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE
        );
        a.src = self.raw;
        // The plugin writes its own layout unless asked for another: a
        // buffer it keeps in another order (a module's result layout) is
        // asked for row-major.
        let row_major: SmallVec<[i64; 4]> = (0..self.dims.len() as i64).rev().collect();
        let mut host_layout = new_args!(
            PJRT_Buffer_MemoryLayout,
            PJRT_Buffer_MemoryLayout_STRUCT_SIZE
        );
        if !self.is_dense_row_major().unwrap_or(true) {
            let mut tiled = new_args!(
                PJRT_Buffer_MemoryLayout_Tiled,
                PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE
            );
            tiled.minor_to_major = row_major.as_ptr();
            tiled.minor_to_major_size = row_major.len();
            host_layout.__bindgen_anon_1.tiled = tiled;
            host_layout.type_ = sys::PJRT_Buffer_MemoryLayout_Type_Tiled;
            a.host_layout = &mut host_layout;
        }
        a.dst = if len == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            dst.cast()
        };
        a.dst_size = len;
        call!(self.client.plugin.api(), PJRT_Buffer_ToHostBuffer, &mut a)?;
        Ok(Event::from_raw(&self.client.plugin, a.event))
    }

    /// A copy on `device` (its default memory), made by the plugin.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer> {
        let client = self.client();
        client.check_device(device)?;
        let mut a = new_args!(
            PJRT_Buffer_CopyToDevice_Args,
            PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        a.dst_device = device.raw;
        call!(self.client.plugin.api(), PJRT_Buffer_CopyToDevice, &mut a)?;
        client.adopt(a.dst_buffer, self.element_type, &self.dims)
    }

    /// A copy in `memory`, made by the plugin.
    pub fn copy_to_memory(&self, memory: &Memory) -> Result<Buffer> {
        let client = self.client();
        client.check_memory(memory)?;
        let mut a = new_args!(
            PJRT_Buffer_CopyToMemory_Args,
            PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        a.dst_memory = memory.raw;
        call!(self.client.plugin.api(), PJRT_Buffer_CopyToMemory, &mut a)?;
        client.adopt(a.dst_buffer, self.element_type, &self.dims)
    }

    /// Frees the device memory once work in flight is done; the handle stays.
    pub fn delete(&self) -> Result<()> {
        let mut a = new_args!(PJRT_Buffer_Delete_Args, PJRT_Buffer_Delete_Args_STRUCT_SIZE);
        a.buffer = self.raw;
        call!(self.client.plugin.api(), PJRT_Buffer_Delete, &mut a)
    }

    /// Whether [`delete`](Self::delete) was called.
    pub fn is_deleted(&self) -> Result<bool> {
        let mut a = new_args!(
            PJRT_Buffer_IsDeleted_Args,
            PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        call!(self.client.plugin.api(), PJRT_Buffer_IsDeleted, &mut a)?;
        Ok(a.is_deleted)
    }

    /// True when the plugin keeps the data as dense row-major bytes
    /// (major-to-minor, untiled): what a view of its memory reads as the
    /// array. `Ok(false)` for any other layout; the plugin's error where it
    /// cannot say.
    pub fn is_dense_row_major(&self) -> Result<bool> {
        let mut a = new_args!(
            PJRT_Buffer_GetMemoryLayout_Args,
            PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        call!(
            self.client.plugin.api(),
            PJRT_Buffer_GetMemoryLayout,
            &mut a
        )?;
        if a.layout.type_ != sys::PJRT_Buffer_MemoryLayout_Type_Tiled {
            return Ok(false);
        }
        // SAFETY: the plugin filled the tiled variant (its type says so).
        let tiled = unsafe { a.layout.__bindgen_anon_1.tiled };
        if tiled.num_tiles != 0 || tiled.minor_to_major_size != self.dims.len() {
            return Ok(false);
        }
        if tiled.minor_to_major_size == 0 {
            return Ok(true);
        }
        if tiled.minor_to_major.is_null() {
            return Err(Error::internal(
                "the PJRT plugin gave a layout without dimensions",
            ));
        }
        // SAFETY: the plugin's array of `minor_to_major_size` entries, owned
        // by the buffer, which outlives this borrow.
        let minor_to_major =
            unsafe { std::slice::from_raw_parts(tiled.minor_to_major, tiled.minor_to_major_size) };
        let rank = minor_to_major.len() as i64;
        Ok(minor_to_major
            .iter()
            .zip((0..rank).rev())
            .all(|(&dim, row_major)| dim == row_major))
    }

    /// Pins the device memory and gives its address, valid until
    /// [`release_external_reference`](Self::release_external_reference).
    /// `unimplemented` where the plugin has no external references.
    pub fn acquire_external_reference(&self) -> Result<*mut u8> {
        let api = self.client.plugin.api();
        let mut a = new_args!(
            PJRT_Buffer_IncreaseExternalReferenceCount_Args,
            PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        call!(api, PJRT_Buffer_IncreaseExternalReferenceCount, &mut a)?;
        let mut p = new_args!(
            PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args,
            PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args_STRUCT_SIZE
        );
        p.buffer = self.raw;
        match call!(api, PJRT_Buffer_OpaqueDeviceMemoryDataPointer, &mut p) {
            Ok(()) => Ok(p.device_memory_ptr.cast()),
            Err(e) => {
                let _ = self.release_external_reference();
                Err(e)
            }
        }
    }

    /// Releases one [`acquire_external_reference`](Self::acquire_external_reference).
    pub fn release_external_reference(&self) -> Result<()> {
        let mut a = new_args!(
            PJRT_Buffer_DecreaseExternalReferenceCount_Args,
            PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE
        );
        a.buffer = self.raw;
        call!(
            self.client.plugin.api(),
            PJRT_Buffer_DecreaseExternalReferenceCount,
            &mut a
        )
    }
}
