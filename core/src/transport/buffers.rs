//! Bytes over the wire: chunking, and the pooled memory that transfers send
//! from and receive into.

use bytes::Bytes;

use crate::error::{Error, Result};

/// Bytes per chunk of a buffer transfer (well under the message limit).
pub const CHUNK_BYTES: usize = 2 << 20;

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
pub(crate) fn recycle(data: Box<[u8]>) {
    if data.len() < WARM_RECEIVE_MIN_BYTES {
        return;
    }
    let mut pool = warm_receive().lock().unwrap_or_else(|e| e.into_inner());
    let kept: usize = pool.iter().map(|b| b.len()).sum();
    if kept + data.len() <= WARM_RECEIVE_MAX_BYTES {
        pool.push(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
