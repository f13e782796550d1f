//! Buffers: one device's data, with PJRT's host-buffer semantics, asynchronous
//! transfers, deletion and external references.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::client::Client;
use crate::device::{Device, MemorySpace};
use crate::dispatch::Task;
use crate::dtype::{checked_byte_size, checked_num_elements, DType};
use crate::error::{Error, Result};
use crate::future::Event;
use crate::future::Progress;
use crate::remote::{RemoteBuffer, RemoteHost};
use crate::storage::{DenseBytes, HostMemory};
use host::HostData;

mod host;
mod local;
mod on_plugin;
mod on_worker;

/// What a buffer holds: bytes or strings on this host, or a handle of the
/// bytes a worker host holds.
pub(crate) enum Storage {
    Dense(DenseBytes),
    Strings(Box<[Box<str>]>),
    Remote(RemoteBuffer),
    /// A PJRT plugin's buffer (read and written through its backend).
    Device(crate::backend::DeviceData),
}

impl Storage {
    /// Bytes that `to_host` writes: the dense bytes, or for strings `(n + 1)`
    /// little-endian `u64` offsets followed by the concatenated UTF-8 bytes.
    /// (0 for remote data: its size comes from the buffer's dims.)
    pub fn on_host_size(&self) -> usize {
        match self {
            Storage::Dense(b) => b.len(),
            Storage::Strings(s) => (s.len() + 1) * 8 + s.iter().map(|x| x.len()).sum::<usize>(),
            Storage::Remote(_) | Storage::Device(_) => 0,
        }
    }

    /// Writes the on-host form into `dst`, which is exactly `on_host_size()` long
    /// (remote data is downloaded instead; see `Buffer::to_host_raw`).
    pub fn write_to(&self, dst: &mut [u8]) -> Result<()> {
        match self {
            Storage::Dense(b) => dst.copy_from_slice(b.as_slice()),
            Storage::Remote(_) | Storage::Device(_) => {
                return Err(Error::internal(
                    "data on a worker or a plugin device is read, not copied",
                ))
            }
            Storage::Strings(strings) => {
                let (offsets, bytes) = dst.split_at_mut((strings.len() + 1) * 8);
                let mut at = 0usize;
                for (i, s) in strings.iter().enumerate() {
                    offsets[i * 8..i * 8 + 8].copy_from_slice(&(at as u64).to_le_bytes());
                    bytes[at..at + s.len()].copy_from_slice(s.as_bytes());
                    at += s.len();
                }
                let n = strings.len();
                offsets[n * 8..n * 8 + 8].copy_from_slice(&(at as u64).to_le_bytes());
            }
        }
        Ok(())
    }

    /// The elements of string data; `invalid_argument` for any other.
    pub fn strings(&self) -> Result<&[Box<str>]> {
        match self {
            Storage::Strings(s) => Ok(s),
            Storage::Dense(_) | Storage::Remote(_) | Storage::Device(_) => {
                Err(Error::invalid_argument("not a string buffer"))
            }
        }
    }

    /// A deep copy (used by device-to-device copies).
    pub fn deep_copy(&self) -> Result<Storage> {
        Ok(match self {
            Storage::Dense(b) => Storage::Dense(DenseBytes::copy_of(b.as_slice())?),
            Storage::Strings(s) => Storage::Strings(s.clone()),
            Storage::Remote(_) | Storage::Device(_) => {
                return Err(Error::internal(
                    "a copy of data on a worker or a plugin device goes through its host",
                ))
            }
        })
    }
}

/// How `buffer_from_host` may use the caller's memory (PJRT's semantics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum HostBufferSemantics {
    /// The data is copied during the call; the caller may reuse it on return.
    ImmutableOnlyDuringCall = 1,
    /// The caller keeps the data unchanged until the "done with host buffer" event.
    ImmutableUntilTransferCompletes = 2,
    /// The buffer aliases the caller's memory, which must stay valid and unchanged
    /// until the "done with host buffer" event (the buffer and every user are gone).
    ImmutableZeroCopy = 3,
}

impl HostBufferSemantics {
    /// Converts the ABI value, or fails with `invalid_argument`.
    pub fn from_u32(v: u32) -> Result<Self> {
        match v {
            1 => Ok(Self::ImmutableOnlyDuringCall),
            2 => Ok(Self::ImmutableUntilTransferCompletes),
            3 => Ok(Self::ImmutableZeroCopy),
            _ => Err(Error::invalid_argument(format!(
                "unknown host buffer semantics {v}"
            ))),
        }
    }
}

enum Slot {
    /// Not filled yet; with what stops the transfer that fills it, if one
    /// can be stopped, and where a worker will hold it (see
    /// [`Buffer::promise_on_worker`]).
    Pending(Option<StopTransfer>, Option<OnWorker>),
    Ready(Arc<Storage>),
    Deleted,
}

/// Stops the transfer that fills a pending buffer.
pub(crate) type StopTransfer = Box<dyn FnOnce() + Send>;

/// Where a pending buffer will be: under `handle` of the client's session on
/// worker `host`, as the output of an execution sent there, or to be sent on
/// stream `unsent_on` (`None` once sent).
struct OnWorker {
    host: Arc<RemoteHost>,
    handle: u64,
    unsent_on: Option<u64>,
}

/// In `BufferInner::life`: set once the buffer is deleted. The bits below count
/// the usage holds (work in flight). Whoever moves `life` to exactly `DELETED`
/// (deleted, no holds) frees the data — `delete` or the last hold — so taking and
/// releasing holds, the submission path, is lock-free.
const DELETED: usize = 1 << (usize::BITS - 1);

/// Buffers kept, now, for work that an asynchronous SDK submits later (after
/// a compile, on another thread): deleting them meanwhile frees their data
/// only after that work, as if it had been submitted when they were kept.
/// The work must run inside [`use_in`](Self::use_in), which lets it use them.
pub struct Kept(Vec<UsageHold>);

impl Kept {
    /// Keeps `buffers`; `failed_precondition` if one is deleted already.
    pub fn new<'a>(buffers: impl IntoIterator<Item = &'a Buffer>) -> Result<Kept> {
        Ok(Kept(
            buffers
                .into_iter()
                .map(Buffer::hold)
                .collect::<Result<_>>()?,
        ))
    }

    /// Runs `f`, in which the kept buffers may be used even if they were
    /// deleted since they were kept.
    pub fn use_in<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Pop(usize);
        impl Drop for Pop {
            fn drop(&mut self) {
                KEPT.with(|k| k.borrow_mut().truncate(self.0));
            }
        }
        let depth = KEPT.with(|k| {
            let mut kept = k.borrow_mut();
            let depth = kept.len();
            kept.extend(self.0.iter().map(|h| Arc::as_ptr(&h.0 .0) as usize));
            depth
        });
        let _pop = Pop(depth);
        f()
    }
}

thread_local! {
    /// The buffers of the [`Kept`]s whose work this thread runs (addresses).
    static KEPT: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether the calling thread runs work a [`Kept`] kept `buffer` for.
fn kept_here(buffer: &Buffer) -> bool {
    let at = Arc::as_ptr(&buffer.0) as usize;
    KEPT.with(|k| k.borrow().contains(&at))
}

/// Dense data shared as `Bytes` ([`Buffer::shared_bytes`]), held.
struct HeldBytes {
    storage: Arc<Storage>,
    _hold: UsageHold,
}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        match &*self.storage {
            Storage::Dense(bytes) => bytes.as_slice(),
            // Made only of dense data.
            _ => &[],
        }
    }
}

/// Keeps a buffer's data alive for one piece of in-flight work (an execution, a
/// copy, a `to_host`), even if the buffer is deleted meanwhile.
pub(crate) struct UsageHold(Buffer);

impl Drop for UsageHold {
    fn drop(&mut self) {
        if self.0 .0.life.fetch_sub(1, Ordering::AcqRel) == DELETED | 1 {
            self.0.free();
        }
    }
}

pub(crate) struct BufferInner {
    client: Client,
    device: Device,
    memory_space: MemorySpace,
    dtype: DType,
    /// Inline up to rank 4 (no allocation of their own).
    dims: smallvec::SmallVec<[i64; 4]>,
    ready: Event,
    data: Mutex<Slot>,
    life: AtomicUsize,
}

/// One device's data. Cheap to clone (clones share the data and its state).
///
/// Thread-safety: every method may be called from any thread.
#[derive(Clone)]
pub struct Buffer(pub(crate) Arc<BufferInner>);

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({}{:?} on {})",
            self.0.dtype.name(),
            self.0.dims,
            self.0.device
        )
    }
}

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
pub(crate) struct HostDst(*mut u8, usize);
// SAFETY: the caller of `to_host_raw` guarantees the memory stays valid and is not
// accessed until the returned event is ready; we write it from one thread only.
unsafe impl Send for HostDst {}

impl HostDst {
    pub(crate) fn len(&self) -> usize {
        self.1
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0
    }

    /// Writes `chunk` at offset `at`; ignores what would not fit.
    fn write_at(&self, at: usize, chunk: &[u8]) {
        if at.checked_add(chunk.len()).is_some_and(|end| end <= self.1) {
            // SAFETY: in bounds (checked above); the caller of `to_host_raw`
            // keeps the memory valid and untouched until the event is ready.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), self.0.add(at), chunk.len()) }
        }
    }
}

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
        Buffer::from_memory_reporting(client, memory, dtype, dims, device, None, None)
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

    /// A buffer whose data arrives later: `fill` it, then set `ready`.
    pub(crate) fn new(
        client: &Client,
        device: Device,
        memory_space: MemorySpace,
        dtype: DType,
        dims: &[i64],
        ready: Event,
    ) -> Buffer {
        Buffer(Arc::new(BufferInner {
            client: client.clone(),
            device,
            memory_space,
            dtype,
            dims: smallvec::SmallVec::from_slice(dims),
            ready,
            data: Mutex::new(Slot::Pending(None, None)),
            life: AtomicUsize::new(0),
        }))
    }

    /// Finishes a pending buffer: fills it with `data` and makes it ready,
    /// or fails it.
    pub(crate) fn finish(&self, data: Result<Arc<Storage>>) {
        match data {
            Ok(data) => {
                self.fill_shared(data);
                self.0.ready.set_if_pending(Ok(()));
            }
            Err(e) => self.0.ready.set_if_pending(Err(e)),
        }
    }

    /// True when the buffer's data is a PJRT plugin's buffer already, ready
    /// or still being computed there (the plugin orders work on it).
    pub(crate) fn is_defined_on_device(&self) -> bool {
        matches!(&*self.data(), Slot::Ready(s) if matches!(**s, Storage::Device(_)))
    }

    /// True when the buffer's data is in this process's memory, where it can
    /// be viewed in place ([`acquire_external_reference`](Self::acquire_external_reference));
    /// false for data on a worker or a PJRT plugin's device, which is read
    /// by a copy ([`to_host_raw`](Self::to_host_raw)).
    pub fn is_in_process(&self) -> bool {
        self.host().in_process()
    }

    /// True when this process can view the buffer's bytes in place
    /// ([`acquire_external_reference`](Self::acquire_external_reference) gives
    /// their host address): data in this process's memory, or on a device
    /// of this process's PJRT plugin whose memory is this host's (platform
    /// `cpu`, as XLA's CPU plugin's). Whether the plugin lays them out as
    /// dense row-major bytes shows in the reference's length.
    pub fn is_host_addressable(&self) -> bool {
        self.is_in_process()
            || (self.0.device.0.pjrt.is_some() && self.0.device.platform() == "cpu")
    }

    /// The host that holds this buffer's data.
    fn host(&self) -> &dyn HostData {
        host::of(&self.0.client, &self.0.device)
    }

    /// Stores the data of a pending buffer (ignored if the buffer was deleted).
    pub(crate) fn fill(&self, storage: Storage) {
        self.fill_shared(Arc::new(storage));
    }

    pub(crate) fn fill_shared(&self, storage: Arc<Storage>) {
        let mut data = self.data();
        if matches!(*data, Slot::Pending(..)) {
            *data = Slot::Ready(storage);
        }
    }

    /// Records that worker `host` will hold this pending buffer under
    /// `handle`: an output of an execution sent there (`unsent_on: None`), or
    /// to be sent on stream `unsent_on`. Work sent to that worker after the
    /// execution may then name the buffer before it is ready: the worker
    /// applies operations in order and waits for the buffer itself. Nothing
    /// changes for a buffer that is no longer pending.
    pub(crate) fn promise_on_worker(
        &self,
        host: &Arc<RemoteHost>,
        handle: u64,
        unsent_on: Option<u64>,
    ) {
        if let Slot::Pending(_, on_worker) = &mut *self.data() {
            *on_worker = Some(OnWorker {
                host: host.clone(),
                handle,
                unsent_on,
            });
        }
    }

    /// The handle under which worker `host` holds this buffer, or will hold
    /// it (see [`promise_on_worker`](Self::promise_on_worker)); `None` for a
    /// buffer elsewhere, deleted, failed, or pending without a promise there.
    pub(crate) fn handle_on(&self, host: &Arc<RemoteHost>) -> Option<u64> {
        match &*self.data() {
            Slot::Ready(storage) => match &**storage {
                Storage::Remote(r) if Arc::ptr_eq(&r.host, host) => Some(r.handle),
                _ => None,
            },
            Slot::Pending(_, Some(on)) if Arc::ptr_eq(&on.host, host) => {
                let failed = matches!(self.0.ready.status(), Some(Err(_)));
                (!failed).then_some(on.handle)
            }
            _ => None,
        }
    }

    /// Whether work for worker `host` queued on stream `stream` may name
    /// this pending buffer without waiting for it: the execution that makes
    /// it there was sent, or goes first on the same stream.
    pub(crate) fn promised_on(&self, host: &Arc<RemoteHost>, stream: u64) -> bool {
        match &*self.data() {
            Slot::Pending(_, Some(on)) => {
                Arc::ptr_eq(&on.host, host) && on.unsent_on.is_none_or(|s| s == stream)
            }
            _ => false,
        }
    }

    /// Keeps `stop` while the buffer waits for its data: deleting the buffer
    /// when no work waits for it stops the transfer (its readiness then
    /// fails with `cancelled`). Stops at once if the buffer is deleted.
    pub(crate) fn stop_if_deleted(&self, stop: StopTransfer) {
        let mut data = self.data();
        match &mut *data {
            Slot::Pending(slot, _) => *slot = Some(stop),
            Slot::Deleted => {
                drop(data);
                stop();
            }
            Slot::Ready(_) => {}
        }
    }

    /// The client that owns the buffer.
    pub fn client(&self) -> &Client {
        &self.0.client
    }
    /// The device the buffer is on.
    pub fn device(&self) -> &Device {
        &self.0.device
    }
    /// The memory space the buffer is in.
    pub fn memory_space(&self) -> &MemorySpace {
        &self.0.memory_space
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// Dimensions (empty for a scalar).
    pub fn dims(&self) -> &[i64] {
        &self.0.dims
    }
    /// Ready when the data is there (or failed with the producer's error).
    pub fn ready_event(&self) -> &Event {
        &self.0.ready
    }
    /// True after [`Buffer::delete`].
    pub fn is_deleted(&self) -> bool {
        self.0.life.load(Ordering::Acquire) & DELETED != 0
    }
    /// True when both handles refer to the same buffer.
    pub fn same_as(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Frees the data once in-flight users and external references are done with
    /// it. Later uses fail with `failed_precondition`. Deleting twice is allowed.
    pub fn delete(&self) {
        if self.0.life.fetch_or(DELETED, Ordering::AcqRel) == 0 {
            self.free();
        }
    }

    /// Drops the data (once deleted and no work holds it).
    fn free(&self) {
        let freed = std::mem::replace(&mut *self.data(), Slot::Deleted);
        // Dropped after unlocking: releasing zero-copy memory runs user callbacks,
        // which may use this buffer again.
        match freed {
            // Nobody waits for the data it was getting.
            Slot::Pending(Some(stop), _) => stop(),
            freed => drop(freed),
        }
    }

    /// Registers in-flight work on the buffer; `failed_precondition` if deleted
    /// (unless the calling thread runs work a [`Kept`] kept it for).
    pub(crate) fn hold(&self) -> Result<UsageHold> {
        let mut life = self.0.life.load(Ordering::Acquire);
        loop {
            if life & DELETED != 0 {
                if kept_here(self) {
                    // A kept hold keeps `life` above DELETED: the data is there.
                    self.0.life.fetch_add(1, Ordering::AcqRel);
                    return Ok(UsageHold(self.clone()));
                }
                return Err(Error::failed_precondition(format!("{self:?} was deleted")));
            }
            match self.0.life.compare_exchange_weak(
                life,
                life + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(UsageHold(self.clone())),
                Err(now) => life = now,
            }
        }
    }

    /// `failed_precondition` if deleted (and not kept for the calling
    /// thread's work, see [`Kept`]).
    pub fn check_live(&self) -> Result<()> {
        if self.is_deleted() && !kept_here(self) {
            return Err(Error::failed_precondition(format!("{self:?} was deleted")));
        }
        Ok(())
    }

    /// The data of a ready buffer on this host.
    pub(crate) fn storage(&self) -> Result<Arc<Storage>> {
        match &*self.data() {
            Slot::Ready(s) => Ok(s.clone()),
            Slot::Deleted => Err(Error::failed_precondition(format!("{self:?} was deleted"))),
            Slot::Pending(..) => match self.0.ready.status() {
                Some(Err(e)) => Err(e),
                _ => Err(Error::failed_precondition(format!("{self:?} is not ready"))),
            },
        }
    }

    /// A ready dense buffer's data as `Bytes` without a copy: they keep the
    /// data, and a hold on the buffer, alive until the last view of them
    /// goes. `None` for data that is not dense bytes of this process.
    pub(crate) fn shared_bytes(&self) -> Result<Option<bytes::Bytes>> {
        let hold = self.hold()?;
        let storage = self.storage()?;
        if !matches!(*storage, Storage::Dense(_)) {
            return Ok(None);
        }
        Ok(Some(bytes::Bytes::from_owner(HeldBytes {
            storage,
            _hold: hold,
        })))
    }

    /// A new buffer sharing this ready buffer's data, with its own deletion state.
    pub(crate) fn view(&self) -> Result<Buffer> {
        let storage = self.storage()?;
        let inner = &self.0;
        let view = Buffer::new(
            &inner.client,
            inner.device.clone(),
            inner.memory_space.clone(),
            inner.dtype,
            &inner.dims,
            inner.ready.clone(),
        );
        view.fill_shared(storage);
        Ok(view)
    }

    /// Bytes `to_host` writes. Blocks until the buffer is ready (string sizes are
    /// known only then; the strings of a buffer on a worker are downloaded).
    pub fn on_host_size(&self) -> Result<usize> {
        self.check_live()?;
        if let Some(size) = self.0.dtype.byte_size() {
            return checked_byte_size(self.0.dtype, &self.0.dims)
                .map(|_| size * self.num_elements());
        }
        Ok(self.read_strings()?.wait()?.on_host_size())
    }

    fn num_elements(&self) -> usize {
        self.0.dims.iter().map(|d| *d as usize).product()
    }

    /// Copies the data into `dst` once the buffer is ready; the event reports the
    /// outcome. `len` must equal [`Buffer::on_host_size`] (dense buffers are checked
    /// now, string buffers when the data is there).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and untouched by the caller
    /// until the returned event is ready.
    pub unsafe fn to_host_raw(&self, dst: *mut u8, len: usize) -> Result<Event> {
        self.check_live()?;
        if let Some(size) = self.0.dtype.byte_size() {
            let expected = size * self.num_elements();
            if len != expected {
                return Err(Error::invalid_argument(format!(
                    "destination is {len} bytes but {self:?} needs {expected}"
                )));
            }
        }
        if dst.is_null() && len > 0 {
            return Err(Error::invalid_argument("destination is NULL"));
        }
        let dst = HostDst(dst, len);
        if self.host().in_process() && self.0.ready.is_ready() {
            // Copied during the call: the storage handle taken by `copy_out` keeps
            // the data alive even if another thread deletes the buffer meanwhile.
            return self
                .copy_out(dst)
                .map(|()| Event::ready_ok())
                .or_else(|e| Ok(Event::ready(Err(e))));
        }
        // Once ready, the host writes it (a worker's data is downloaded
        // straight into `dst`), without blocking any thread.
        let hold = self.hold()?;
        let done = Event::new();
        let (me, out) = (self.clone(), done.clone());
        self.0.ready.when_ready(move |status| {
            match status.and_then(|()| me.storage()) {
                Ok(held) => me.host().read_into(&me, held, dst, hold, out),
                Err(e) => out.set_if_pending(Err(e)),
            };
        });
        Ok(done)
    }

    fn copy_out(&self, dst: HostDst) -> Result<()> {
        let _span = tracing::trace_span!("to_host", bytes = dst.1).entered();
        self.0.ready.status().unwrap_or(Ok(()))?;
        write_on_host(&*self.storage()?, dst)
    }

    /// Waits for the buffer and returns a copy of its on-host form.
    pub fn to_host_vec(&self) -> Result<Vec<u8>> {
        if self.0.dtype == DType::String {
            // Read once: the size of strings is known only with them.
            let strings = self.read_strings()?.wait()?;
            let mut out = vec![0u8; strings.on_host_size()];
            strings.write_to(&mut out)?;
            return Ok(out);
        }
        self.0.ready.wait()?;
        let mut out = vec![0u8; self.on_host_size()?];
        // SAFETY: `out` is exactly that long and outlives the wait below.
        unsafe { self.to_host_raw(out.as_mut_ptr(), out.len())? }.wait()?;
        Ok(out)
    }

    /// Waits for a string buffer and returns its elements (downloaded from
    /// its worker, for a buffer on one).
    pub fn to_strings(&self) -> Result<Vec<String>> {
        let strings = self.read_strings()?.wait()?;
        Ok(strings.strings()?.iter().map(|x| x.to_string()).collect())
    }

    /// Starts reading this string buffer's elements: at once for a buffer of
    /// this host once it is ready, else downloaded from its worker (reads of
    /// several buffers proceed in parallel). `invalid_argument` for a dense
    /// buffer, `failed_precondition` for a deleted one.
    pub(crate) fn read_strings(&self) -> Result<StringsRead> {
        let done = Event::new();
        let slot = Arc::new(Mutex::new(None));
        let (out, sink) = (done.clone(), slot.clone());
        self.strings_then(None, move |strings| match strings {
            Ok(strings) => {
                *sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(strings);
                out.set_if_pending(Ok(()));
            }
            Err(e) => out.set_if_pending(Err(e)),
        })?;
        Ok(StringsRead {
            done,
            strings: slot,
        })
    }

    /// Calls `done` with this string buffer's elements (as `Storage::Strings`)
    /// once it is ready, downloading them first when they are on a worker,
    /// with `progress` reports. Never blocks: `done` runs on the thread that
    /// makes the buffer ready, a network thread, or this one.
    fn strings_then(
        &self,
        progress: Option<Progress>,
        done: impl FnOnce(Result<Arc<Storage>>) + Send + 'static,
    ) -> Result<()> {
        self.check_live()?;
        if self.0.dtype != DType::String {
            return Err(Error::invalid_argument(format!(
                "{self:?} is not a string buffer"
            )));
        }
        let hold = self.hold()?;
        let me = self.clone();
        self.0
            .ready
            .when_ready(move |status| match status.and_then(|()| me.storage()) {
                Ok(held) => me.host().fetch(&me, held, hold, progress, Box::new(done)),
                Err(e) => done(Err(e)),
            });
        Ok(())
    }

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

    /// Copies the buffer to `device`'s default memory space. Returns at once; the
    /// copy runs in program order on the calling thread's stream.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer> {
        self.copy_to_device_with_progress(device, None)
    }

    /// [`copy_to_device`](Self::copy_to_device), reporting `progress(bytes
    /// done, bytes in all)` on a network thread while the data crosses hosts:
    /// the bytes sent to the destination worker, or received from the source
    /// worker for a copy into this process. A copy within a host reports
    /// nothing.
    pub fn copy_to_device_with_progress(
        &self,
        device: &Device,
        progress: Option<Progress>,
    ) -> Result<Buffer> {
        self.0.client.check_device(device)?;
        self.copy_to(
            device.clone(),
            device.default_memory_space().clone(),
            progress,
        )
    }

    /// Copies the buffer to `memory_space` (of this buffer's device when that device
    /// can address it, else of the memory space's first device).
    pub fn copy_to_memory_space(&self, memory_space: &MemorySpace) -> Result<Buffer> {
        self.0.client.check_memory_space(memory_space)?;
        let device = if memory_space.device_ids().contains(&self.0.device.id()) {
            self.0.device.clone()
        } else {
            device_of(&self.0.client, memory_space)?
        };
        self.copy_to(device, memory_space.clone(), None)
    }

    fn copy_to(
        &self,
        device: Device,
        memory_space: MemorySpace,
        progress: Option<Progress>,
    ) -> Result<Buffer> {
        let hold = self.hold()?;
        let client = &self.0.client;
        let dst_host = device.host_index();
        // Across hosts, or into or out of memory this process does not hold
        // (a worker's, a plugin's): read on one side and put on the other.
        let crosses =
            self.0.device.host_index() != dst_host || !host::of(client, &device).in_process();
        for on in [&self.0.device, &device] {
            host::of(client, on).check_dtype(self.0.dtype)?;
        }
        if self.0.dtype == DType::String && !device.is_host_cpu() {
            return Err(Error::invalid_argument(
                "string buffers live in CPU memory only",
            ));
        }
        let ready = Event::new();
        let out = Buffer::new(
            client,
            device,
            memory_space,
            self.0.dtype,
            &self.0.dims,
            ready.clone(),
        );
        let (src, dst) = (self.clone(), out.clone());
        if crosses || !self.host().in_process() {
            // Not ordered by the stream's completion: the transfer runs on the
            // network threads, and `out` is ready when it is there.
            let task = Task {
                deps: vec![self.0.ready.clone()],
                completion: Event::ready_ok(),
                run: Box::new(move |status: Result<()>| match status {
                    Ok(()) => src.transfer(&dst, hold, progress),
                    Err(e) => dst.0.ready.set_if_pending(Err(e)),
                }),
                waiter_first: false,
                hands_off: false,
            };
            client
                .0
                .local
                .dispatcher
                .submit(&client.current_stream(), task);
            return Ok(out);
        }
        let task = Task {
            deps: vec![self.0.ready.clone()],
            completion: ready.clone(),
            run: Box::new(move |status: Result<()>| {
                let _span = tracing::debug_span!(
                    "copy_to_device",
                    from = src.0.device.id(),
                    to = dst.0.device.id()
                )
                .entered();
                let result = status
                    .and_then(|()| src.storage())
                    .and_then(|s| s.deep_copy());
                drop(hold);
                drop(_span);
                match result {
                    Ok(storage) => {
                        dst.fill(storage);
                        dst.0.ready.set_if_pending(Ok(()));
                    }
                    Err(e) => dst.0.ready.set_if_pending(Err(e)),
                }
            }),
            waiter_first: false,
            hands_off: false,
        };
        let stream = client.current_stream();
        client.0.local.dispatcher.submit(&stream, task);
        Ok(out)
    }

    /// Copies this ready buffer's data into `dst` (pending) across hosts:
    /// local to worker, worker to local, or worker to worker: read on this
    /// buffer's host, put on `dst`'s, or from worker to worker directly when
    /// both can. `dst` becomes ready, or fails, when the data is there.
    /// `progress` follows the bytes that cross into a worker, else those that
    /// come into this process.
    fn transfer(&self, dst: &Buffer, hold: UsageHold, progress: Option<Progress>) {
        let held = match self.storage() {
            Ok(s) => s,
            Err(e) => return dst.finish(Err(e)),
        };
        if let (Storage::Remote(remote), Some(to)) =
            (&*held, self.0.client.remote(dst.0.device.host_index()))
        {
            if remote.copies_directly_to(to, self.0.dtype) {
                let keep = (held.clone(), hold);
                return remote.copy_to_worker(to, dst.clone(), progress, keep);
            }
        }
        if dst.host().takes_directly(&held) {
            drop(hold);
            return dst.host().put(dst, held, progress);
        }
        let (read_progress, put_progress) = match dst.host().in_process() {
            true => (progress, None),
            false => (None, progress),
        };
        let out = dst.clone();
        let put: host::Fetched = Box::new(move |data| match data {
            Ok(data) => out.host().put(&out, data, put_progress),
            Err(e) => out.finish(Err(e)),
        });
        self.host().fetch(self, held, hold, read_progress, put);
    }

    fn data(&self) -> MutexGuard<'_, Slot> {
        self.0.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A read of a string buffer's elements in flight (see [`Buffer::read_strings`]).
pub(crate) struct StringsRead {
    done: Event,
    strings: Arc<Mutex<Option<Arc<Storage>>>>,
}

impl StringsRead {
    /// Waits for the read: the elements, as `Storage::Strings`.
    pub(crate) fn wait(self) -> Result<Arc<Storage>> {
        self.done.wait()?;
        self.strings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| Error::internal("a finished read of strings has no strings"))
    }
}

/// Writes the on-host form of `storage` into `dst`, which must be exactly its
/// size.
fn write_on_host(storage: &Storage, dst: HostDst) -> Result<()> {
    let needed = storage.on_host_size();
    if needed != dst.1 {
        return Err(Error::invalid_argument(format!(
            "destination is {} bytes but the buffer needs {needed}",
            dst.1
        )));
    }
    if needed > 0 {
        // SAFETY: the caller of `to_host_raw` guarantees `dst` is valid for
        // `dst.1` bytes until the event is ready.
        storage.write_to(unsafe { std::slice::from_raw_parts_mut(dst.0, dst.1) })?;
    }
    Ok(())
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
fn device_of(client: &Client, memory_space: &MemorySpace) -> Result<Device> {
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
