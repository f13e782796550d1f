//! Buffers: one device's data, with PJRT's host-buffer semantics, asynchronous
//! transfers, deletion and external references.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::client::Client;
use crate::device::{Device, MemorySpace};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::remote::{RemoteBuffer, RemoteHost};
use crate::storage::DenseBytes;

mod copy;
mod create;
mod external;
mod host;
mod local;
mod on_plugin;
mod on_worker;
mod read;

pub use external::ExternalReference;

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

    /// The host that holds this buffer's data (a worker's in its session
    /// now: asking never opens a new one; see [`host::holding`]).
    fn host(&self) -> host::Holder<'_> {
        host::holding(&self.0.client, &self.0.device)
    }

    /// The host where new data of this (pending) buffer goes: a worker's
    /// in its session for new work (see [`host::of`]).
    fn host_for_new_data(&self) -> host::Holder<'_> {
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

    fn data(&self) -> MutexGuard<'_, Slot> {
        self.0.data.lock().unwrap_or_else(|e| e.into_inner())
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
