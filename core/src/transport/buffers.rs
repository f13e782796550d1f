//! Buffers over the wire: spec validation, chunking, buffers that own the
//! bytes a transfer received, and the bytes a buffer travels as.

use bytes::Bytes;

use super::proto::BufferSpec;
use super::strings::encode_strings;
use crate::buffer::{Buffer, HostBufferSemantics};
use crate::client::Client;
use crate::device::{Device, MemoryKind, MemorySpace};
use crate::dtype::{checked_byte_size, DType};
use crate::error::{Error, Result};

/// Bytes per chunk of a buffer transfer (well under the message limit).
pub const CHUNK_BYTES: usize = 2 << 20;

/// A buffer spec checked against a worker's client: its device, element type,
/// dimensions and size.
pub(crate) struct CheckedSpec {
    pub device: Device,
    /// The device's memory the buffer goes to.
    pub memory: MemorySpace,
    pub dtype: DType,
    pub dims: Vec<i64>,
    /// The byte size of a dense buffer; the number of elements of a string
    /// buffer (whose size on the wire shows only as its bytes arrive).
    pub size: usize,
}

/// Checks a spec from the wire: a device of this host, a known element type,
/// valid dimensions whose byte size (dense) fits in memory, a memory kind
/// the device addresses. Strings live in CPU memory only.
pub(crate) fn check_spec(client: &Client, spec: &BufferSpec) -> Result<CheckedSpec> {
    let device = client
        .devices()
        .iter()
        .find(|d| d.id() == spec.device)
        .cloned()
        .ok_or_else(|| {
            Error::invalid_argument(format!("this host has no device {}", spec.device))
        })?;
    let dtype = DType::from_u32(spec.dtype)?;
    if dtype == DType::String && !device.is_host_cpu() {
        return Err(Error::invalid_argument(
            "string buffers live in CPU memory only",
        ));
    }
    let memory = match spec.memory_kind {
        0 => device.default_memory_space().clone(),
        kind => {
            let kind = MemoryKind::from_u32(kind).ok_or_else(|| {
                Error::invalid_argument(format!("memory kind {kind} is none of 1, 2, 3"))
            })?;
            device.memory_space_by_kind(kind.name())?.clone()
        }
    };
    let size = checked_byte_size(dtype, &spec.dims)?;
    Ok(CheckedSpec {
        memory,
        device,
        dtype,
        dims: spec.dims.clone(),
        size,
    })
}

/// The checked spec of a request that carries bytes of fixed-size elements
/// only (`request`: its name, for the errors; `strings`: where string
/// buffers go instead): `invalid_argument` when it has no spec or a string
/// one.
pub(crate) fn check_fixed_size_spec(
    client: &Client,
    spec: Option<&BufferSpec>,
    request: &str,
    strings: &str,
) -> Result<CheckedSpec> {
    let spec =
        spec.ok_or_else(|| Error::invalid_argument(format!("a {request} without its spec")))?;
    let spec = check_spec(client, spec)?;
    if spec.dtype == DType::String {
        return Err(Error::invalid_argument(format!("string buffers {strings}")));
    }
    Ok(spec)
}

/// The bytes `buffer` travels as (GetBuffer, and what PutBuffer takes): its
/// row-major bytes, or a string buffer's elements as `StringElements`. Waits
/// until the buffer is ready.
pub(crate) fn wire_bytes(buffer: &Buffer) -> Result<Vec<u8>> {
    if buffer.dtype() != DType::String {
        return buffer.to_host_vec();
    }
    let storage = buffer.read_strings()?.wait()?;
    encode_strings(storage.strings()?)
}

/// Whether a download that went from `before` to `after` bytes of `total`
/// reports progress: once per [`CHUNK_BYTES`] and at the end (the data
/// arrives in frames of a few KiB).
pub(crate) fn reports_progress(before: u64, after: u64, total: u64) -> bool {
    after >= total || after / CHUNK_BYTES as u64 != before / CHUNK_BYTES as u64
}

/// `data` cut into chunks of at most `CHUNK_BYTES` (views, no copies); one empty
/// chunk for empty data, so that a transfer always has a first message.
pub(crate) fn chunks(data: Bytes) -> Vec<Bytes> {
    if data.is_empty() {
        return vec![data];
    }
    (0..data.len())
        .step_by(CHUNK_BYTES)
        .map(|start| data.slice(start..data.len().min(start + CHUNK_BYTES)))
        .collect()
}

/// How many chunk buffers a process keeps warm between uploads (see
/// [`copy_chunk`]).
const WARM_CHUNKS: usize = 8;

/// How many copied chunks an upload queues for the network before its copier
/// waits: uploads up to this many chunks return as soon as they are copied,
/// larger ones keep at most this much memory in flight.
pub(crate) const INFLIGHT_CHUNKS: usize = 32;

/// Chunk buffers that uploads sent and let go of, kept for the next copies:
/// writing into memory that was just used is several times faster than into
/// fresh pages, which the kernel must zero first.
fn warm_chunks() -> &'static crossbeam_queue::ArrayQueue<Vec<u8>> {
    static POOL: std::sync::OnceLock<crossbeam_queue::ArrayQueue<Vec<u8>>> =
        std::sync::OnceLock::new();
    POOL.get_or_init(|| crossbeam_queue::ArrayQueue::new(WARM_CHUNKS))
}

/// A chunk in a pooled buffer (of capacity [`CHUNK_BYTES`]), which goes back
/// to the pool when the last view of it is dropped.
struct WarmChunk(Vec<u8>);

impl AsRef<[u8]> for WarmChunk {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for WarmChunk {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.0);
        buf.clear();
        // A full pool just frees it.
        let _ = warm_chunks().push(buf);
    }
}

/// A copy of `src` (at most [`CHUNK_BYTES`]) in a pooled chunk buffer, or in
/// a new one (not zeroed first: the copy is its first write).
pub(crate) fn copy_chunk(src: &[u8]) -> Bytes {
    debug_assert!(src.len() <= CHUNK_BYTES);
    if src.len() > CHUNK_BYTES {
        return Bytes::copy_from_slice(src);
    }
    let mut buf = warm_chunks()
        .pop()
        .unwrap_or_else(|| Vec::with_capacity(CHUNK_BYTES));
    buf.extend_from_slice(src);
    Bytes::from_owner(WarmChunk(buf))
}

/// A copy of `src` in one allocation, for an upload whose caller must not
/// wait for the network (it travels as it is, in views of [`CHUNK_BYTES`]):
/// into a kept buffer of that size when there is one (see
/// [`receive_buffer`]; the copy goes back there once sent), else into fresh
/// memory, of huge pages where the kernel gives them, which another core
/// faults in ahead of the copy (see [`Prefault`](crate::prefault::Prefault)). `resource_exhausted` when the
/// memory cannot be had.
pub(crate) fn copy_whole(src: &[u8]) -> Result<Bytes> {
    /// Bytes copied between reports to the helper that faults pages in.
    const STEP: usize = 4 << 20;
    let (mut copy, warm) = match kept_buffer(src.len()) {
        Some(kept) => (kept, true),
        None => (fresh_buffer(src.len())?, false),
    };
    let prefault = if warm {
        None
    } else {
        prefer_huge_pages(&mut copy);
        crate::prefault::Prefault::start(copy.as_mut_ptr(), src.len())
    };
    for step in src.chunks(STEP) {
        copy.extend_from_slice(step);
        if let Some(p) = &prefault {
            p.written(copy.len());
        }
    }
    drop(prefault);
    Ok(Bytes::from_owner(Recycled(copy.into_boxed_slice())))
}

/// Asks the kernel to back the (fresh, untouched) capacity of a large transfer
/// buffer with huge pages: writing into a fresh buffer page-faults on every
/// page, and with 2 MiB pages there are 512 times fewer faults. Only advice:
/// where the kernel declines, nothing changes.
pub(crate) fn prefer_huge_pages(data: &mut Vec<u8>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = data.as_mut_ptr() as usize;
        let end = start + data.capacity();
        let first = start.next_multiple_of(HUGE);
        let last = end - end % HUGE;
        if last > first {
            // SAFETY: [first, last) lies inside the vector's own allocation,
            // which nothing else uses; the advice does not change its contents.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = data;
}

/// Bytes that go back to the kept buffers (see [`recycle`]) when the last
/// view of them is dropped.
struct Recycled(Box<[u8]>);

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.0));
    }
}

/// Receive buffers of at least this size go back to [`warm_receive`] when their
/// buffer is freed.
const WARM_RECEIVE_MIN_BYTES: usize = 4 << 20;

/// The most bytes of freed receive buffers a process keeps for reuse.
const WARM_RECEIVE_MAX_BYTES: usize = 512 << 20;

/// Freed receive buffers (and the copies of uploads that were sent), kept so
/// that the next transfer of the same size writes into warm memory instead
/// of fresh pages (which the kernel zeroes on first write): a caching
/// allocator for the common case of transfers of one size again and again.
/// Bounded by `WARM_RECEIVE_MAX_BYTES`.
fn warm_receive() -> &'static std::sync::Mutex<Vec<Box<[u8]>>> {
    static POOL: std::sync::OnceLock<std::sync::Mutex<Vec<Box<[u8]>>>> = std::sync::OnceLock::new();
    POOL.get_or_init(Default::default)
}

/// An empty vector with room for exactly `bytes`: a kept receive buffer of
/// that size when there is one, else a fresh allocation (`resource_exhausted`
/// when that fails). A kept buffer may have held another session's data: it
/// becomes a buffer only once a transfer has overwritten all of it.
pub(crate) fn receive_buffer(bytes: usize) -> Result<Vec<u8>> {
    match kept_buffer(bytes) {
        Some(data) => Ok(data),
        None => fresh_buffer(bytes),
    }
}

/// A kept buffer of exactly `bytes`, emptied, if there is one.
fn kept_buffer(bytes: usize) -> Option<Vec<u8>> {
    if bytes < WARM_RECEIVE_MIN_BYTES {
        return None;
    }
    let mut pool = warm_receive().lock().unwrap_or_else(|e| e.into_inner());
    let i = pool.iter().position(|b| b.len() == bytes)?;
    let mut data = pool.swap_remove(i).into_vec();
    data.clear();
    Some(data)
}

/// A fresh empty vector with room for exactly `bytes`.
fn fresh_buffer(bytes: usize) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    data.try_reserve_exact(bytes)
        .map_err(|_| Error::resource_exhausted(format!("cannot allocate {bytes} bytes")))?;
    Ok(data)
}

/// Keeps a freed receive buffer for [`receive_buffer`] if it is large and the
/// pool has room; frees it otherwise.
fn recycle(data: Box<[u8]>) {
    if data.len() < WARM_RECEIVE_MIN_BYTES {
        return;
    }
    let mut pool = warm_receive().lock().unwrap_or_else(|e| e.into_inner());
    let kept: usize = pool.iter().map(|b| b.len()).sum();
    if kept + data.len() <= WARM_RECEIVE_MAX_BYTES {
        pool.push(data);
    }
}

/// A buffer on `spec.device` that owns `data` (no copy): the bytes are freed
/// (or kept for the next transfer of that size) when the buffer's last user
/// lets go of them.
pub(crate) fn buffer_owning(client: &Client, spec: &CheckedSpec, data: Vec<u8>) -> Result<Buffer> {
    if data.len() != spec.size {
        return Err(Error::invalid_argument(format!(
            "got {} bytes but the spec needs {}",
            data.len(),
            spec.size
        )));
    }
    let data = data.into_boxed_slice();
    // SAFETY: the boxed bytes do not move when the box does; the box is kept by
    // the "done with host buffer" callback, which runs once nothing reads them.
    let (buffer, done) = unsafe {
        Buffer::from_host_raw(
            client,
            data.as_ptr(),
            data.len(),
            spec.dtype,
            &spec.dims,
            &spec.device,
            Some(&spec.memory),
            HostBufferSemantics::ImmutableZeroCopy,
        )
    }?;
    done.when_ready(move |_| recycle(data));
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientOptions;
    use crate::error::ErrorCode;

    #[test]
    fn pooled_chunk_copies_hold_exactly_their_bytes_across_reuse() {
        for round in 0..3u8 {
            let held: Vec<(Vec<u8>, Bytes)> = [0usize, 1, 4096, CHUNK_BYTES]
                .iter()
                .map(|&n| {
                    let src: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_add(round)).collect();
                    let copy = copy_chunk(&src);
                    (src, copy)
                })
                .collect();
            for (src, copy) in &held {
                assert_eq!(&copy[..], &src[..]);
            }
            // Dropping them returns their buffers; the next round reuses them
            // and must still see only its own bytes.
        }
    }

    #[test]
    fn whole_copies_hold_their_bytes_and_a_sent_one_is_reused_for_the_same_size() {
        // A size no other test uses.
        let n = WARM_RECEIVE_MIN_BYTES + 54_321;
        let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let copy = copy_whole(&src).unwrap();
        assert_eq!(&copy[..], &src[..]);
        let address = copy.as_ptr();
        drop(copy);
        let other: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_add(1)).collect();
        let again = copy_whole(&other).unwrap();
        assert_eq!(again.as_ptr(), address);
        assert_eq!(&again[..], &other[..]);
        assert!(copy_whole(&[]).unwrap().is_empty());
    }

    #[test]
    fn freed_large_receive_buffers_are_reused_for_the_same_size_only() {
        // A size no other test uses.
        let n = WARM_RECEIVE_MIN_BYTES + 12_345;
        let mut data = receive_buffer(n).unwrap();
        assert!(data.is_empty() && data.capacity() >= n);
        data.resize(n, 7);
        let kept = data.into_boxed_slice();
        let address = kept.as_ptr();
        recycle(kept);
        assert!(receive_buffer(n + 1).unwrap().capacity() > n);
        let again = receive_buffer(n).unwrap();
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty() && again.capacity() == n);
        // Small buffers are not kept.
        let small = vec![1u8; 4096].into_boxed_slice();
        recycle(small);
        assert!(warm_receive()
            .lock()
            .unwrap()
            .iter()
            .all(|b| b.len() >= WARM_RECEIVE_MIN_BYTES));
    }

    #[test]
    fn chunks_cover_the_data_in_order() {
        let data = Bytes::from(
            (0..(2 * CHUNK_BYTES + 5))
                .map(|i| i as u8)
                .collect::<Vec<_>>(),
        );
        let parts = chunks(data.clone());
        assert_eq!(
            parts.iter().map(Bytes::len).collect::<Vec<_>>(),
            [CHUNK_BYTES, CHUNK_BYTES, 5]
        );
        assert_eq!(parts.concat(), data.to_vec());
        assert_eq!(chunks(Bytes::new()).len(), 1);
    }

    #[test]
    fn a_string_buffer_for_a_plugin_device_is_refused_from_the_wire() {
        // XLA's CPU plugin's devices are of kind "cpu" too, but not the
        // host's CPU devices: strings do not go there.
        let Some(plugin) = std::env::var_os("COLOCATED_TEST_PJRT_PLUGIN") else {
            return;
        };
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: Some(1),
            executor_threads: Some(1),
            pjrt: Some(crate::PjrtOptions {
                plugin: plugin.into(),
                options: vec![("cpu_device_count".into(), crate::PjrtValue::Int64(1))],
            }),
            ..Default::default()
        })
        .unwrap();
        let device = client.backend_devices(None).unwrap()[0].clone();
        assert_eq!(device.kind(), "cpu");
        let spec = BufferSpec {
            device: device.id(),
            dtype: DType::String as u32,
            dims: vec![2],
            memory_kind: 0,
        };
        let e = check_spec(&client, &spec).err().unwrap();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains("CPU memory only"), "{e}");
        // A spec's memory kind places the buffer in the plugin's memory of
        // that kind.
        let pinned = BufferSpec {
            dtype: DType::F32 as u32,
            memory_kind: MemoryKind::PinnedHost as u32,
            ..spec
        };
        let checked = check_spec(&client, &pinned).unwrap();
        let buffer = buffer_owning(&client, &checked, vec![1u8; 8]).unwrap();
        assert_eq!(buffer.memory_space().kind(), MemoryKind::PinnedHost);
        assert_eq!(
            buffer.memory_space(),
            device.memory_space_by_kind("pinned_host").unwrap()
        );
        assert_eq!(buffer.to_host_vec().unwrap(), vec![1u8; 8]);
    }

    #[test]
    fn specs_from_the_wire_are_checked() {
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: Some(2),
            executor_threads: Some(1),
            ..Default::default()
        })
        .unwrap();
        let spec = |device, dtype, dims: Vec<i64>| BufferSpec {
            device,
            dtype,
            dims,
            memory_kind: 0,
        };
        let ok = check_spec(&client, &spec(1, DType::F32 as u32, vec![2, 3])).unwrap();
        assert_eq!((ok.device.id(), ok.size), (1, 24));
        let strings = check_spec(&client, &spec(0, DType::String as u32, vec![2, 3])).unwrap();
        assert_eq!((strings.dtype, strings.size), (DType::String, 6));
        for (bad, code) in [
            (
                spec(2, DType::F32 as u32, vec![2]),
                ErrorCode::InvalidArgument,
            ),
            (spec(0, 99, vec![2]), ErrorCode::InvalidArgument),
            (
                spec(0, DType::F32 as u32, vec![-1]),
                ErrorCode::InvalidArgument,
            ),
            (
                spec(0, DType::F64 as u32, vec![i64::MAX, i64::MAX]),
                ErrorCode::InvalidArgument,
            ),
            (
                spec(0, DType::String as u32, vec![-1]),
                ErrorCode::InvalidArgument,
            ),
            // A memory kind the protocol does not name.
            (
                BufferSpec {
                    memory_kind: 4,
                    ..spec(0, DType::F32 as u32, vec![2])
                },
                ErrorCode::InvalidArgument,
            ),
        ] {
            assert_eq!(
                check_spec(&client, &bad).err().map(|e| e.code()),
                Some(code),
                "{bad:?}"
            );
        }
        let buffer = buffer_owning(&client, &ok, vec![7u8; 24]).unwrap();
        assert_eq!(buffer.to_host_vec().unwrap(), vec![7u8; 24]);
        assert_eq!(buffer.memory_space().kind(), MemoryKind::Device);
        assert!(buffer_owning(&client, &ok, vec![0u8; 23]).is_err());
        // Each kind a CPU device addresses.
        for kind in [MemoryKind::PinnedHost, MemoryKind::UnpinnedHost] {
            let spec = BufferSpec {
                memory_kind: kind as u32,
                ..spec(1, DType::F32 as u32, vec![2, 3])
            };
            let checked = check_spec(&client, &spec).unwrap();
            let buffer = buffer_owning(&client, &checked, vec![7u8; 24]).unwrap();
            assert_eq!(buffer.memory_space().kind(), kind);
        }
    }
}
