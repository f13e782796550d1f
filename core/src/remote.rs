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
use crate::format::pb;
use crate::future::Event;
use crate::future::{Completion, Progress};
use crate::program::Program;
use crate::session::{RemoteSession, UploadStop};
use crate::sharding::Sharding;
use crate::spec::ArraySpec;
use crate::transport::proto::BufferSpec;
use crate::transport::reports_progress;
use crate::transport::{
    StringDecoder, COPY_VERSION, GRANT_ANSWER_VERSION, MAX_SMALL_PUT_BYTES, SMALL_PUT_VERSION,
    STRINGS_VERSION,
};

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

/// A buffer held by a worker, under `handle` of the client's session there.
/// Dropping it deletes the worker's copy.
pub(crate) struct RemoteBuffer {
    pub host: Arc<RemoteHost>,
    pub handle: u64,
    /// The buffer's bytes, when this process has them: the worker sent them
    /// with the answer of the execution that made it (see
    /// [`INLINE_OUTPUTS_VERSION`](crate::transport::INLINE_OUTPUTS_VERSION)),
    /// or this process uploaded them in one control operation (see
    /// [`SMALL_PUT_VERSION`](crate::transport::SMALL_PUT_VERSION)). A read
    /// then needs no round trip.
    pub inline: Option<Bytes>,
}

impl Drop for RemoteBuffer {
    fn drop(&mut self) {
        self.host.session.delete_buffers_later(&[self.handle]);
    }
}

/// How long the grant of a copy between workers lives: the destination uses
/// it at once, when it takes the fetch.
const GRANT_TTL: std::time::Duration = std::time::Duration::from_secs(60);

impl RemoteBuffer {
    /// Whether a buffer of `dtype` here copies to worker `to` directly: both
    /// speak [`COPY_VERSION`] (strings go through this process).
    pub fn copies_directly_to(&self, to: &Arc<RemoteHost>, dtype: DType) -> bool {
        dtype != DType::String
            && !Arc::ptr_eq(&self.host, to)
            && self.host.session.version() >= COPY_VERSION
            && to.session.version() >= COPY_VERSION
    }

    /// Copies this buffer into `target` (a pending buffer of a device of
    /// worker `to`; see [`copies_directly_to`](Self::copies_directly_to)):
    /// this buffer's worker grants one read of it, and `to` reads it from
    /// there, so the data never passes this process. `progress` follows the
    /// bytes that arrived at `to`; `keep` lives until the copy ends.
    pub fn copy_to_worker(
        &self,
        to: &Arc<RemoteHost>,
        target: impl UploadTarget,
        progress: Option<Progress>,
        keep: impl Send + 'static,
    ) {
        let Some((handle, spec, done)) = to.start_upload(target, None) else {
            return;
        };
        let mut grant = [0u8; 32];
        if let Err(e) = getrandom::fill(&mut grant) {
            return done(Err(Error::internal(format!(
                "no randomness for a grant: {e}"
            ))));
        }
        let (source, to) = (self.host.clone(), to.clone());
        let fetch = move |granted: Result<()>| {
            if let Err(e) = granted {
                return done(Err(e));
            }
            to.session.fetch_buffer_then(
                handle,
                spec,
                &source.session,
                &grant,
                progress,
                Box::new(move |result| {
                    drop(keep);
                    done(result)
                }),
            );
        };
        let session = &self.host.session;
        if session.version() >= GRANT_ANSWER_VERSION {
            // The destination reads once the source holds the grant: a read
            // that came first would be refused (and retried).
            session.grant_read_then(self.handle, &grant, GRANT_TTL, Box::new(fetch));
        } else {
            // An older source may answer the grant only after what follows
            // it finished: both go at once, and the reader retries a refusal.
            session.grant_read_then(self.handle, &grant, GRANT_TTL, Box::new(|_| {}));
            fetch(Ok(()));
        }
    }

    /// Downloads the elements of a string buffer of `count` elements (checked
    /// as they arrive, see [`StringDecoder`]); `done` gets them, on a network
    /// thread. `keep` lives until then (it keeps the worker's copy alive).
    pub fn download_strings(
        &self,
        count: usize,
        progress: Option<Progress>,
        keep: impl Send + 'static,
        done: impl FnOnce(Result<Box<[Box<str>]>>) + Send + 'static,
    ) {
        let decoder = Arc::new(std::sync::Mutex::new(Some(StringDecoder::new(count))));
        let fed = decoder.clone();
        let address = self.host.session.address().to_string();
        let mut received = 0u64;
        let sink = move |total: u64, chunk: &[u8]| {
            let mut decoder = fed.lock().unwrap_or_else(|e| e.into_inner());
            let decoder = decoder
                .as_mut()
                .ok_or_else(|| Error::internal("bytes after the end of a download"))?;
            decoder.push(chunk).map_err(|e| bad_strings(&address, e))?;
            let before = received;
            received += chunk.len() as u64;
            let total = total.max(received);
            if let Some(progress) = progress
                .as_ref()
                .filter(|_| reports_progress(before, received, total))
            {
                progress(received, total);
            }
            Ok(())
        };
        let address = self.host.session.address().to_string();
        self.host.session.get_buffer_then(
            self.handle,
            sink,
            Box::new(move |result| {
                let decoder = decoder.lock().unwrap_or_else(|e| e.into_inner()).take();
                let strings = result.and_then(|()| match decoder {
                    Some(decoder) => decoder.finish().map_err(|e| bad_strings(&address, e)),
                    None => Err(Error::internal("a download of strings finished twice")),
                });
                drop(keep);
                done(strings);
            }),
        );
    }

    /// Downloads the buffer's bytes, which must be exactly `len`, into
    /// `write(offset, chunk)`; `done` gets the outcome. `keep` lives until then
    /// (it keeps the worker's copy, and the destination, alive).
    pub fn download(
        &self,
        len: usize,
        mut write: impl FnMut(usize, &[u8]) + Send + 'static,
        progress: Option<Progress>,
        keep: impl Send + 'static,
        done: Event,
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        if let Some(data) = self.inline.as_ref().filter(|d| d.len() == len) {
            // Sent with the execution (or upload) that made it. A buffer of a
            // lost (or closed) session reads as any other of it: it fails.
            if let Some(err) = self.host.session.lost().error() {
                drop(keep);
                done.set_if_pending(Err(err));
                return;
            }
            write(0, data);
            if let Some(progress) = &progress {
                progress(len as u64, len as u64);
            }
            drop(keep);
            done.set_if_pending(Ok(()));
            return;
        }
        if len <= crate::transport::MAX_INLINE_READ_BYTES {
            // One message on the control stream: no stream of its own to open.
            let address = self.host.session.address().to_string();
            self.host.session.read_small_buffer_then(
                self.handle,
                Box::new(move |result| {
                    let result = result.and_then(|data| {
                        if data.len() != len {
                            return Err(Error::internal(format!(
                                "worker {address} sent {} bytes of a {len}-byte buffer",
                                data.len()
                            )));
                        }
                        write(0, &data);
                        if let Some(progress) = &progress {
                            progress(len as u64, len as u64);
                        }
                        Ok(())
                    });
                    drop(keep);
                    done.set_if_pending(result);
                }),
            );
            return;
        }
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        let address = self.host.session.address().to_string();
        let sink = move |_total: u64, chunk: &[u8]| {
            let at = counter.load(Ordering::Relaxed);
            let end = at
                .checked_add(chunk.len())
                .filter(|end| *end <= len)
                .ok_or_else(|| {
                    Error::internal(format!(
                        "worker {address} sent more than the {len} bytes of the buffer"
                    ))
                })?;
            write(at, chunk);
            counter.store(end, Ordering::Relaxed);
            let (at, end, len) = (at as u64, end as u64, len as u64);
            if let Some(progress) = progress.as_ref().filter(|_| reports_progress(at, end, len)) {
                progress(end, len);
            }
            Ok(())
        };
        let address = self.host.session.address().to_string();
        self.host.session.get_buffer_then(
            self.handle,
            sink,
            Box::new(move |result| {
                let got = received.load(Ordering::Relaxed);
                let result = result.and_then(|()| {
                    if got == len {
                        Ok(())
                    } else {
                        Err(Error::internal(format!(
                            "worker {address} sent {got} bytes of a {len}-byte buffer"
                        )))
                    }
                });
                drop(keep);
                done.set_if_pending(result);
            }),
        );
    }
}

/// The error of a download of strings that a worker sent malformed: a broken
/// worker, not a mistake of the caller.
fn bad_strings(address: &str, err: Error) -> Error {
    Error::internal(format!(
        "worker {address} sent a bad string buffer: {}",
        err.message()
    ))
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

/// How one host's part of a program is laid out: for each input and output,
/// the positions (in the global sharding's device order) of the host's shards,
/// in the order of the host-local sharding's devices.
pub(crate) struct HostLocal {
    pub input_positions: Vec<Vec<usize>>,
    pub output_positions: Vec<Vec<usize>>,
    /// The serialized host-local program, in the worker's device ids.
    pub executable: pb::Executable,
}

/// The host-local form of `program` for `host` (see the module docs).
/// `unimplemented` when a spec's shards on the host do not form one block of
/// the mesh and of the array, or the worker cannot hold a spec's dtype.
pub(crate) fn host_local(
    program: &Program,
    host: &RemoteHost,
    host_index: usize,
    num_host_callbacks: usize,
) -> Result<HostLocal> {
    let locals = |specs: &[ArraySpec], what: &str| -> Result<(Vec<_>, Vec<_>)> {
        let locals = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                local_spec(spec, host_index, &|d| host.local_id(d))
                    .map_err(|e| e.context(format!("{what} {i} on {}", host.session.address())))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(locals.into_iter().unzip())
    };
    for spec in program.input_specs.iter().chain(&program.output_specs) {
        host.check_dtype(spec.dtype)?;
    }
    let (input_specs, input_positions) = locals(&program.input_specs, "input")?;
    let (output_specs, output_positions) = locals(&program.output_specs, "output")?;
    let device_ids = program
        .devices
        .iter()
        .filter(|d| d.host_index() == host_index)
        .map(|d| host.local_id(d))
        .collect::<Result<Vec<_>>>()?;
    Ok(HostLocal {
        input_positions,
        output_positions,
        executable: pb::Executable {
            name: program.name.clone(),
            language: program.language.clone(),
            payload: program.payload.clone(),
            input_specs,
            output_specs,
            device_ids,
            num_host_callbacks: num_host_callbacks as u32,
            platform_name: crate::device::PLATFORM_NAME.to_string(),
        },
    })
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut coords = vec![0; shape.len()];
    for (c, n) in coords.iter_mut().zip(shape).rev() {
        *c = i % n;
        i /= n;
    }
    coords
}

fn ravel(coords: &[usize], shape: &[usize]) -> usize {
    coords.iter().zip(shape).fold(0, |acc, (c, n)| acc * n + c)
}

/// The block index along one array dimension split over mesh axes `axes`.
fn block(coords: &[usize], mesh: &[usize], axes: &[usize]) -> usize {
    axes.iter().fold(0, |acc, &a| acc * mesh[a] + coords[a])
}

/// `spec` restricted to the shards of host `host_index`, with the devices
/// named by `device_id`, and their global positions in the local sharding's
/// device order (the sharding's own order, filtered).
pub(crate) fn local_spec(
    spec: &ArraySpec,
    host_index: usize,
    device_id: &dyn Fn(&Device) -> Result<u32>,
) -> Result<(pb::ArraySpec, Vec<usize>)> {
    let sharding: &Sharding = &spec.sharding;
    let mesh = sharding.mesh_shape();
    let devices = sharding.devices();
    let mine: Vec<usize> = (0..devices.len())
        .filter(|&i| devices[i].host_index() == host_index)
        .collect();
    if mine.is_empty() {
        return Err(Error::internal("the host has no shard of the spec"));
    }
    // The box of mesh coordinates the host's devices cover.
    let mut lo = vec![usize::MAX; mesh.len()];
    let mut hi = vec![0usize; mesh.len()];
    for &i in &mine {
        for (a, c) in unravel(i, mesh).into_iter().enumerate() {
            lo[a] = lo[a].min(c);
            hi[a] = hi[a].max(c + 1);
        }
    }
    let local_mesh: Vec<usize> = lo.iter().zip(&hi).map(|(l, h)| h - l).collect();
    if local_mesh.iter().product::<usize>() != mine.len() {
        return Err(Error::unimplemented(
            "the host's devices do not form one block of the mesh",
        ));
    }
    // Positions in local (row-major over the box) order.
    let positions: Vec<usize> = (0..mine.len())
        .map(|j| {
            let local = unravel(j, &local_mesh);
            let global: Vec<usize> = local.iter().zip(&lo).map(|(c, l)| c + l).collect();
            ravel(&global, mesh)
        })
        .collect();
    // Each dimension's blocks on the host must be a run of the global blocks,
    // in the same order.
    let partition = sharding.partition();
    let shard = sharding.shard_shape(&spec.shape)?;
    let mut shape = spec.shape.clone();
    for (d, axes) in partition.iter().enumerate() {
        let mut offset = None;
        for (j, &p) in positions.iter().enumerate() {
            let global = block(&unravel(p, mesh), mesh, axes);
            let local = block(&unravel(j, &local_mesh), &local_mesh, axes);
            match offset {
                None => offset = Some(global as i64 - local as i64),
                Some(o) if o == global as i64 - local as i64 => {}
                Some(_) => {
                    return Err(Error::unimplemented(format!(
                        "the host's shards of dimension {d} are not one block of the array"
                    )))
                }
            }
        }
        let blocks: usize = axes.iter().map(|&a| local_mesh[a]).product();
        shape[d] = shard[d] * blocks as i64;
    }
    let device_ids = positions
        .iter()
        .map(|&p| device_id(&devices[p]))
        .collect::<Result<Vec<_>>>()?;
    let local = pb::ArraySpec {
        dtype: spec.dtype as u32,
        shape,
        sharding: Some(pb::Sharding {
            device_ids,
            mesh_shape: local_mesh.iter().map(|n| *n as u64).collect(),
            axis_names: sharding.axis_names().to_vec(),
            partition: partition
                .iter()
                .map(|axes| pb::DimPartition {
                    mesh_axes: axes.iter().map(|a| *a as u32).collect(),
                })
                .collect(),
            axis_types: sharding.wire_axis_types(),
            mesh: !sharding.is_single_device(),
        }),
    };
    Ok((local, positions))
}
