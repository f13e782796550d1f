//! External references: a pinned view of a ready buffer's bytes, and whether
//! those bytes are the array's dense row-major bytes.

use std::sync::Arc;

use super::{Buffer, Storage};
use crate::error::{Error, Result};

/// A pinned view of a ready buffer's bytes on this host. The bytes stay valid (even
/// if the buffer is deleted) until this reference is dropped.
///
/// For a buffer on a PJRT plugin's device the view is the plugin's external
/// reference (`PJRT_Buffer_IncreaseExternalReferenceCount`): the address is
/// the plugin's device memory (host memory only for a host platform such as
/// XLA's CPU plugin; a GPU address for the CUDA plugin), and its length the
/// buffer's size on the device.
pub struct ExternalReference {
    storage: Arc<Storage>,
    /// The plugin's address of a plugin buffer's data (released on drop).
    device: Option<(DevicePtr, usize)>,
}

/// An address in a plugin's device memory.
struct DevicePtr(*mut u8);
// SAFETY: an address the plugin keeps valid while the external reference is
// held; it is only handed out, never dereferenced here.
unsafe impl Send for DevicePtr {}
// SAFETY: as above.
unsafe impl Sync for DevicePtr {}

impl Drop for ExternalReference {
    fn drop(&mut self) {
        if let (Some(_), Storage::Device(data)) = (&self.device, &*self.storage) {
            // Nothing is left to do when the plugin fails to release it.
            let _ = data.buffer.release_external_reference();
        }
    }
}

impl ExternalReference {
    /// Pointer to the first byte (dense buffers), valid while `self` lives.
    pub fn data_ptr(&self) -> *mut u8 {
        if let Some((ptr, _)) = &self.device {
            return ptr.0;
        }
        match &*self.storage {
            Storage::Dense(b) => b.as_ptr(),
            Storage::Strings(_) | Storage::Remote(_) | Storage::Device(_) => std::ptr::null_mut(),
        }
    }
    /// Byte length (dense buffers).
    pub fn len(&self) -> usize {
        if let Some((_, len)) = &self.device {
            return *len;
        }
        match &*self.storage {
            Storage::Dense(b) => b.as_slice().len(),
            Storage::Strings(_) | Storage::Remote(_) | Storage::Device(_) => 0,
        }
    }
    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A raw destination that outlives the call (the caller's promise in `to_host`).
impl Buffer {
    /// Waits until ready, then pins the data (see [`ExternalReference`]).
    /// `unimplemented` for a plugin that has no external references;
    /// `failed_precondition` for a buffer on a worker.
    pub fn acquire_external_reference(&self) -> Result<ExternalReference> {
        self.check_live()?;
        if self.0.device.0.pjrt.is_some() {
            self.0.ready.wait()?;
            let storage = self.storage()?;
            let Storage::Device(data) = &*storage else {
                return Err(Error::internal("a plugin device's buffer holds other data"));
            };
            // The runtime's readiness may come first (a put is ready once the
            // plugin has taken the bytes): the memory holds them only once
            // the plugin's own event says so.
            match data.buffer.ready_event() {
                Ok(event) => event.wait().map_err(crate::backend::pjrt::to_error)?,
                Err(e) if e.code() == colocated_pjrt::Code::Unimplemented => {}
                Err(e) => return Err(crate::backend::pjrt::to_error(e)),
            }
            let ptr = data
                .buffer
                .acquire_external_reference()
                .map_err(crate::backend::pjrt::to_error)?;
            let len = match data.buffer.on_device_size() {
                Ok(len) => len,
                Err(e) => {
                    let _ = data.buffer.release_external_reference();
                    return Err(crate::backend::pjrt::to_error(e));
                }
            };
            return Ok(ExternalReference {
                device: Some((DevicePtr(ptr), len)),
                storage,
            });
        }
        if !self.host().in_process() {
            return Err(Error::failed_precondition(format!(
                "{self:?} lives on worker {}: copy it to a local device, or read it with to_host",
                self.0.client.hosts()[self.0.device.host_index()].name()
            )));
        }
        self.0.ready.wait()?;
        Ok(ExternalReference {
            storage: self.storage()?,
            device: None,
        })
    }

    /// True when the buffer's bytes in memory are its dense row-major bytes,
    /// what a view through
    /// [`acquire_external_reference`](Self::acquire_external_reference)
    /// reads as the array: always for data of this process; for a PJRT
    /// plugin's buffer, when the plugin lays it out major-to-minor and
    /// untiled. Waits until the buffer is ready.
    pub fn is_dense_row_major(&self) -> Result<bool> {
        self.check_live()?;
        self.0.ready.wait()?;
        match &*self.storage()? {
            Storage::Device(data) => data
                .buffer
                .is_dense_row_major()
                .map_err(crate::backend::pjrt::to_error),
            _ => Ok(true),
        }
    }
}
