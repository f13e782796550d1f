//! Buffer data on a worker host: uploaded into a handle of the client's
//! session there, downloaded back (see `remote` for the transfers).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::host::{Fetched, HostData};
use super::{write_on_host, Buffer, HostDst, Storage, UsageHold};
use crate::device::{Device, MemorySpace};
use crate::dtype::{checked_byte_size, DType};
use crate::error::{Error, Result};
use crate::future::{Event, Progress};
use crate::remote::{RemoteBuffer, RemoteHost, UploadTarget};
use crate::session::UploadStop;
use crate::storage::DenseBytes;
use crate::transport::encode_strings;

impl HostData for Arc<RemoteHost> {
    fn in_process(&self) -> bool {
        false
    }

    fn check_dtype(&self, dtype: DType) -> Result<()> {
        RemoteHost::check_dtype(self, dtype)
    }

    fn put_copy(&self, dst: &Buffer, src: &[u8], progress: Option<Progress>) {
        // Chunk by chunk while the chunks already copied travel.
        self.upload_copy(dst.clone(), src, progress);
    }

    fn put(&self, dst: &Buffer, data: Arc<Storage>, progress: Option<Progress>) {
        match Arc::try_unwrap(data) {
            // Data nobody else holds travels as it is.
            Ok(Storage::Dense(bytes)) => {
                self.upload(dst.clone(), Bytes::from_owner(bytes), progress)
            }
            Ok(data) => put_shared(self, dst, &data, progress),
            Err(data) => put_shared(self, dst, &data, progress),
        }
    }

    fn fetch(
        &self,
        src: &Buffer,
        held: Arc<Storage>,
        keep: UsageHold,
        progress: Option<Progress>,
        done: Fetched,
    ) {
        let Storage::Remote(remote) = &*held else {
            return done(Err(not_on_worker(src)));
        };
        // The hold and `held` keep the worker's copy until the end.
        if src.dtype() == DType::String {
            let count = src.num_elements();
            return remote.download_strings(count, progress, (keep, held.clone()), move |s| {
                done(s.map(|s| Arc::new(Storage::Strings(s))))
            });
        }
        let len = checked_byte_size(src.dtype(), src.dims()).unwrap_or(0);
        let received = Arc::new(Mutex::new(vec![0u8; len]));
        let sink = received.clone();
        let write = move |at: usize, chunk: &[u8]| {
            let mut data = sink.lock().unwrap_or_else(|e| e.into_inner());
            data[at..at + chunk.len()].copy_from_slice(chunk);
        };
        let finished = Event::new();
        remote.download(len, write, progress, (keep, held.clone()), finished.clone());
        finished.when_ready(move |status| {
            done(status.map(|()| {
                let data = std::mem::take(&mut *received.lock().unwrap_or_else(|e| e.into_inner()));
                Arc::new(Storage::Dense(DenseBytes::owning(data)))
            }))
        });
    }

    fn read_into(
        &self,
        src: &Buffer,
        held: Arc<Storage>,
        dst: HostDst,
        keep: UsageHold,
        done: Event,
    ) {
        if src.dtype() == DType::String {
            // Their size is known only with them: read, then check and write.
            let fetched: Fetched = Box::new(move |strings| {
                done.set_if_pending(strings.and_then(|s| write_on_host(&s, dst)));
            });
            return self.fetch(src, held, keep, None, fetched);
        }
        let Storage::Remote(remote) = &*held else {
            return done.set_if_pending(Err(not_on_worker(src)));
        };
        let len = dst.len();
        let write = move |at: usize, chunk: &[u8]| dst.write_at(at, chunk);
        // The hold and `held` keep the worker's copy until the end.
        remote.download(len, write, None, (keep, held.clone()), done);
    }
}

/// Sends data of this process that others still hold (or strings, encoded
/// for the wire) to `dst`.
fn put_shared(host: &Arc<RemoteHost>, dst: &Buffer, data: &Storage, progress: Option<Progress>) {
    match data {
        Storage::Dense(bytes) => host.upload_copy(dst.clone(), bytes.as_slice(), progress),
        Storage::Strings(strings) => match encode_strings(strings) {
            Ok(encoded) => host.upload(dst.clone(), Bytes::from(encoded), progress),
            Err(e) => dst.finish(Err(e)),
        },
        Storage::Remote(_) | Storage::Device(_) => dst.finish(Err(Error::internal(
            "data on a worker or a plugin device put on a worker without a read",
        ))),
    }
}

fn not_on_worker(buffer: &Buffer) -> Error {
    Error::internal(format!("{buffer:?} is on a worker but its data is not"))
}

/// A pending buffer of a worker's device is what an upload fills.
impl UploadTarget for Buffer {
    fn spec(&self) -> (&Device, &MemorySpace, DType, &[i64]) {
        (
            self.device(),
            self.memory_space(),
            self.dtype(),
            self.dims(),
        )
    }

    fn stop_if_deleted(&self, stop: UploadStop) {
        Buffer::stop_if_deleted(self, Box::new(move || stop.stop()));
    }

    fn sent_to(&self, host: &Arc<RemoteHost>, handle: u64) {
        self.promise_on_worker(host, handle, None);
    }

    fn finish(self, result: Result<()>, remote: Option<RemoteBuffer>) {
        match (result, remote) {
            (Ok(()), Some(remote)) => Buffer::finish(&self, Ok(Arc::new(Storage::Remote(remote)))),
            (Ok(()), None) => Buffer::finish(
                &self,
                Err(Error::internal("an upload ended without the worker's copy")),
            ),
            (Err(e), _) => Buffer::finish(&self, Err(e)),
        }
    }
}
