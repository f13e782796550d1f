//! Worker hosts inside a [`Client`]: their sessions, the buffers they hold, and
//! the part of an executable each of them runs (SPEC §6).
//!
//! A remote buffer's data lives on its worker under a handle of the client's
//! session there; the controller keeps a [`RemoteBuffer`] in the buffer's storage,
//! whose drop deletes the worker's copy (on the ordered control stream, after
//! every execution sent before that reads it). A remote host runs the
//! *host-local* form of a program: every input and output restricted to the
//! shards on that host, with the shape of the block they cover, as JAX gives a
//! colocated Python function its host's part of each array.

use std::sync::Arc;

use bytes::Bytes;

use crate::device::{Device, MemorySpace};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::{Completion, Progress};
use crate::session::{RemoteSession, UploadStop};
use crate::transport::proto::BufferSpec;
use crate::transport::{MAX_SMALL_PUT_BYTES, SMALL_PUT_VERSION, STRINGS_VERSION};

mod buffers;
mod events;
mod host_local;
mod slot;

pub(crate) use buffers::RemoteBuffer;
pub(crate) use events::HostEvents;
pub use events::{HostEvent, HostEventKind, HostStats};
pub(crate) use host_local::{host_local, local_spec, HostLocal};
pub(crate) use slot::RemoteSlot;
/// How often an upload waiting for the network checks that its worker is
/// still there.
const LOST_CHECK: std::time::Duration = std::time::Duration::from_millis(20);

thread_local! {
    /// Set while a caller runs [`without_waiting`].
    static NO_WAITING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` so that the copies to workers it starts never wait for the
/// network: each copies its data at once, in one piece that travels as it
/// is (held until sent), instead of chunk by chunk as the network takes
/// them. For a caller that must not block, such as an event loop: the call
/// then costs one memory copy, and the transfer runs on network threads.
pub fn without_waiting<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            NO_WAITING.set(self.0);
        }
    }
    let _reset = Reset(NO_WAITING.replace(true));
    f()
}

/// One worker host of a client.
pub(crate) struct RemoteHost {
    pub session: RemoteSession,
    /// The worker's own id of each of its devices, by position among them.
    pub local_ids: Vec<u32>,
    /// Global id of the host's first device (the others follow in order).
    pub first_device: u32,
}

impl RemoteHost {
    /// The worker's id of `device` (a device of this host).
    pub fn local_id(&self, device: &Device) -> Result<u32> {
        device
            .id()
            .checked_sub(self.first_device)
            .and_then(|i| self.local_ids.get(i as usize))
            .copied()
            .ok_or_else(|| {
                Error::internal(format!(
                    "{device} is not a device of worker {}",
                    self.session.address()
                ))
            })
    }

    /// `unimplemented` for a dtype the worker cannot hold: strings on a
    /// worker that speaks a protocol version before [`STRINGS_VERSION`].
    pub fn check_dtype(&self, dtype: DType) -> Result<()> {
        let version = self.session.version();
        if dtype == DType::String && version < STRINGS_VERSION {
            return Err(Error::unimplemented(format!(
                "worker {} speaks protocol version {version}, which has no string buffers \
                 (they need version {STRINGS_VERSION}): upgrade the worker",
                self.session.address()
            )));
        }
        Ok(())
    }

    /// Uploads `data` (the bytes the target travels as) into `target` (a
    /// pending buffer of a device of this host), which the worker's copy
    /// fills once it has it.
    pub fn upload(
        self: &Arc<Self>,
        target: impl UploadTarget,
        data: Bytes,
        progress: Option<Progress>,
    ) {
        if self.puts_small(&target, data.len()) {
            return self.put_small(target, data, progress);
        }
        let watcher = target.clone();
        if let Some((handle, spec, done)) = self.start_upload(target, None) {
            let stop = self
                .session
                .put_buffer_then(handle, spec, data, progress, done);
            watcher.stop_if_deleted(stop);
        }
    }

    /// [`upload`](Self::upload) of a copy of `src`, made chunk by chunk while
    /// the chunks already copied travel; returns once `src` is copied. At most
    /// [`INFLIGHT_CHUNKS`](crate::transport::INFLIGHT_CHUNKS) chunks wait to be sent,
    /// and sent ones go back to a pool, so the copy overlaps the network and
    /// writes into warm memory. The wait for the network ends if the worker is
    /// lost. (On a thread of the network runtime, which must not block, and
    /// inside [`without_waiting`], nothing waits: `src` is copied at once, in
    /// one piece, and the copy travels as it is.)
    pub fn upload_copy(
        self: &Arc<Self>,
        target: impl UploadTarget,
        src: &[u8],
        progress: Option<Progress>,
    ) {
        if self.puts_small(&target, src.len()) {
            return self.put_small(target, Bytes::copy_from_slice(src), progress);
        }
        let may_block = tokio::runtime::Handle::try_current().is_err() && !NO_WAITING.get();
        if !may_block {
            return match crate::transport::copy_whole(src) {
                Ok(data) => self.upload(target, data, progress),
                Err(e) => target.finish(Err(e), None),
            };
        }
        let watcher = target.clone();
        let Some((handle, spec, done)) = self.start_upload(target, None) else {
            return;
        };
        let (chunks, rx) = tokio::sync::mpsc::channel(crate::transport::INFLIGHT_CHUNKS);
        let stop =
            self.session
                .put_buffer_chunks_then(handle, spec, src.len() as u64, rx, progress, done);
        watcher.stop_if_deleted(stop);
        let lost = self.session.lost();
        let send = |chunk: Bytes| {
            use tokio::sync::mpsc::error::TrySendError;
            match chunks.try_send(chunk) {
                Ok(()) => true,
                Err(TrySendError::Closed(_)) => false,
                // The network is behind: wait for room, unless the worker is
                // lost (then the upload fails and `done` reports it).
                Err(TrySendError::Full(chunk)) => {
                    let Ok(runtime) = crate::transport::runtime() else {
                        return false;
                    };
                    runtime.block_on(async {
                        while !lost.is_ready() {
                            let room = chunks.reserve();
                            match tokio::time::timeout(LOST_CHECK, room).await {
                                Ok(Ok(room)) => {
                                    room.send(chunk);
                                    return true;
                                }
                                Ok(Err(_)) => return false,
                                Err(_) => {}
                            }
                        }
                        false
                    })
                }
            }
        };
        if src.is_empty() {
            // The first message names the buffer, even when it is empty.
            send(Bytes::new());
        }
        for chunk in src.chunks(crate::transport::CHUNK_BYTES) {
            // A closed channel means the upload failed already; `done` has
            // reported it.
            if !send(crate::transport::copy_chunk(chunk)) {
                break;
            }
        }
    }

    /// Whether `bytes` of `target` go as one operation of the control stream
    /// ([`put_small`](Self::put_small)).
    fn puts_small(&self, target: &impl UploadTarget, bytes: usize) -> bool {
        bytes <= MAX_SMALL_PUT_BYTES
            && target.spec().2 != DType::String
            && self.session.version() >= SMALL_PUT_VERSION
    }

    /// Uploads the small `data` of `target` as one operation of the control
    /// stream: executions sent after it use it without waiting, and this
    /// process keeps the bytes for reads of it.
    fn put_small(
        self: &Arc<Self>,
        target: impl UploadTarget,
        data: Bytes,
        progress: Option<Progress>,
    ) {
        let watcher = target.clone();
        let len = data.len() as u64;
        let Some((handle, spec, done)) = self.start_upload(target, Some(data.clone())) else {
            return;
        };
        let done: Completion = Box::new(move |result| {
            if let (Ok(()), Some(progress)) = (&result, &progress) {
                progress(len, len);
            }
            done(result)
        });
        self.session.put_small_buffer_then(handle, spec, data, done);
        watcher.sent_to(self, handle);
    }

    /// A new handle for `target` on this worker, its spec there, and the
    /// completion that finishes the target when the upload ends (keeping
    /// `inline`, the bytes, for reads); `None` (with the target finished,
    /// failed) when its device is not this host's.
    fn start_upload(
        self: &Arc<Self>,
        target: impl UploadTarget,
        inline: Option<Bytes>,
    ) -> Option<(u64, BufferSpec, Completion)> {
        let (device, memory, dtype, dims) = target.spec();
        let spec = match self.local_id(device) {
            Ok(id) => BufferSpec {
                device: id,
                dtype: dtype as u32,
                dims: dims.to_vec(),
                // The device's default memory goes unnamed, as to workers
                // from before memory kinds travelled.
                memory_kind: match memory == device.default_memory_space() {
                    true => 0,
                    false => memory.kind() as u32,
                },
            },
            Err(e) => {
                target.finish(Err(e), None);
                return None;
            }
        };
        let handle = self.session.new_handle();
        let host = self.clone();
        let done: Completion = Box::new(move |result| {
            // On failure the worker may hold part of it: dropping this deletes it.
            let remote = RemoteBuffer {
                host,
                handle,
                inline,
            };
            target.finish(result, Some(remote));
        });
        Some((handle, spec, done))
    }
}

/// What an upload fills: a pending buffer of a device of the host.
pub(crate) trait UploadTarget: Clone + Send + 'static {
    /// Keeps `stop` while the upload runs: if nobody wants the data any
    /// more (the buffer is deleted with no work waiting for it), it stops the
    /// upload on the wire.
    fn stop_if_deleted(&self, stop: UploadStop);

    /// Its device, memory space, element type and dimensions.
    fn spec(&self) -> (&Device, &MemorySpace, DType, &[i64]);

    /// The operation that makes it on worker `host`, as `handle`, is sent
    /// (ordered with the session's executions): they may use it at once.
    fn sent_to(&self, host: &Arc<RemoteHost>, handle: u64);

    /// Called once: with the worker's copy when the upload ended (on success
    /// the target takes it; on failure dropping it deletes what the worker
    /// holds), or with none when the upload could not start.
    fn finish(self, result: Result<()>, remote: Option<RemoteBuffer>);
}

/// An executable loaded on a worker under `handle` of the client's session
/// there. Dropping it (after the last execution in flight lets go, since each
/// holds it) unloads it there and forgets its host callbacks.
pub(crate) struct RemoteExecutable {
    pub host: Arc<RemoteHost>,
    pub handle: u64,
}

impl Drop for RemoteExecutable {
    fn drop(&mut self) {
        self.host.session.unload_executable_later(self.handle);
    }
}
