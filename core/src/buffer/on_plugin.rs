//! Buffer data on a PJRT plugin's device: the plugin holds it; puts upload
//! into the plugin, reads download from it, and a copy between two devices
//! of one plugin stays inside the plugin.

use std::sync::Arc;

use colocated_pjrt as pjrt;

use super::host::{Fetched, HostData};
use super::{Buffer, HostDst, Storage, UsageHold};
use crate::backend::pjrt::{element_type, to_error};
use crate::backend::{DeviceData, PjrtDevice};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::{Event, Progress};
use crate::storage::DenseBytes;

/// A plugin buffer on `dst`'s memory with the `len` bytes at `data`, and
/// the event after which the plugin no longer reads them.
///
/// # Safety
/// `data` is readable for `len` bytes until the call returns (`copy`) or
/// until the returned event is ready (otherwise).
unsafe fn upload(
    device: &PjrtDevice,
    dst: &Buffer,
    data: *const u8,
    len: usize,
    copy: bool,
) -> Result<(pjrt::Buffer, Option<pjrt::Event>)> {
    let memory = device.memory_for(dst.memory_space().id())?;
    let semantics = if copy {
        pjrt::HostBufferSemantics::ImmutableOnlyDuringCall
    } else {
        pjrt::HostBufferSemantics::ImmutableUntilTransferCompletes
    };
    device
        .backend()
        .client()
        .buffer_from_host(
            data,
            len,
            element_type(dst.dtype())?,
            dst.dims(),
            semantics,
            memory,
        )
        .map_err(to_error)
}

/// Fills `dst` with a view of the `len` bytes at `data` in its memory (see
/// [`Buffer::view_of_device_memory`]); `on_delete` runs when the plugin lets
/// go of them, or before this returns an error.
///
/// # Safety
/// As [`Buffer::view_of_device_memory`].
pub(super) unsafe fn view(
    device: &PjrtDevice,
    dst: &Buffer,
    data: *mut u8,
    len: usize,
    on_delete: Box<dyn FnOnce() + Send>,
) -> Result<()> {
    let (memory, element_type) = match device
        .memory_for(dst.memory_space().id())
        .and_then(|m| Ok((m, element_type(dst.dtype())?)))
    {
        Ok(found) => found,
        Err(e) => {
            on_delete();
            return Err(e);
        }
    };
    let buffer = device
        .backend()
        .client()
        .view_of_device_buffer(data, len, element_type, dst.dims(), memory, on_delete)
        .map_err(to_error)?;
    finish_with(device, dst, buffer);
    Ok(())
}

fn finish_with(device: &PjrtDevice, dst: &Buffer, buffer: pjrt::Buffer) {
    dst.finish(Ok(Arc::new(Storage::Device(DeviceData::new(
        buffer,
        device.backend(),
    )))));
}

impl HostData for PjrtDevice {
    fn in_process(&self) -> bool {
        false
    }

    fn check_dtype(&self, dtype: DType) -> Result<()> {
        element_type(dtype).map(|_| ())
    }

    fn put_copy(&self, dst: &Buffer, src: &[u8], _progress: Option<Progress>) {
        // SAFETY: copied during the call.
        match unsafe { upload(self, dst, src.as_ptr(), src.len(), true) } {
            Ok((buffer, _)) => finish_with(self, dst, buffer),
            Err(e) => dst.finish(Err(e)),
        }
    }

    fn put(&self, dst: &Buffer, data: Arc<Storage>, _progress: Option<Progress>) {
        let uploaded = match &*data {
            Storage::Dense(bytes) => {
                // SAFETY: `data` is kept until the plugin is done with it (below).
                unsafe { upload(self, dst, bytes.as_ptr(), bytes.len(), false) }
            }
            Storage::Device(held) if held.is_of(self.backend()) => {
                let memory = match self.memory_for(dst.memory_space().id()) {
                    Ok(m) => m,
                    Err(e) => return dst.finish(Err(e)),
                };
                held.buffer
                    .copy_to_memory(memory)
                    .map(|b| (b, None))
                    .map_err(to_error)
            }
            Storage::Device(_) | Storage::Strings(_) | Storage::Remote(_) => Err(Error::internal(
                "data put on a PJRT device without a read into this process",
            )),
        };
        match uploaded {
            Ok((buffer, done)) => {
                finish_with(self, dst, buffer);
                if let Some(done) = done {
                    done.on_ready(move |_| drop(data));
                }
            }
            Err(e) => dst.finish(Err(e)),
        }
    }

    fn takes_directly(&self, held: &Storage) -> bool {
        matches!(held, Storage::Device(d) if d.is_of(self.backend()))
    }

    fn fetch(
        &self,
        _src: &Buffer,
        held: Arc<Storage>,
        keep: UsageHold,
        _progress: Option<Progress>,
        done: Fetched,
    ) {
        let Storage::Device(data) = &*held else {
            return done(Ok(held));
        };
        let len = data.buffer.host_size();
        let bytes = match DenseBytes::allocate_with(len, |_| {}) {
            Ok(b) => b,
            Err(e) => return done(Err(e)),
        };
        // SAFETY: `bytes` is heap memory of `len` bytes, moved (not its
        // memory) into the callback, which runs once the copy is done.
        match unsafe { data.buffer.to_host(bytes.as_ptr(), len) } {
            Ok(None) => {
                drop(keep);
                done(Ok(Arc::new(Storage::Dense(bytes))))
            }
            Ok(Some(event)) => event.on_ready(move |r| {
                drop((keep, held));
                done(
                    r.map(|()| Arc::new(Storage::Dense(bytes)))
                        .map_err(to_error),
                )
            }),
            Err(e) => done(Err(to_error(e))),
        }
    }

    fn read_into(
        &self,
        _src: &Buffer,
        held: Arc<Storage>,
        dst: HostDst,
        keep: UsageHold,
        done: Event,
    ) {
        let Storage::Device(data) = &*held else {
            return done.set_if_pending(Err(Error::internal(
                "a PJRT device's buffer holds data of another kind",
            )));
        };
        // SAFETY: the caller of `to_host_raw` keeps `dst` valid and untouched
        // until `done` is ready, which happens after the copy.
        match unsafe { data.buffer.to_host(dst.ptr(), dst.len()) } {
            Ok(None) => done.set_if_pending(Ok(())),
            Ok(Some(event)) => event.on_ready(move |r| {
                drop((keep, held));
                done.set_if_pending(r.map_err(to_error));
            }),
            Err(e) => done.set_if_pending(Err(to_error(e))),
        }
    }
}
