//! Arrays: a global shape and dtype, a sharding, and one buffer per device.

use std::ops::Range;
use std::sync::Arc;

use crate::buffer::{Buffer, Kept};
use crate::device::{Device, MemoryKind, MemorySpace};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::{Event, Progress};
use crate::sharding::Sharding;
use crate::spec::ArraySpec;

mod construct;
mod layout;
mod placement;
mod to_host;

struct Inner {
    spec: ArraySpec,
    buffers: Vec<Buffer>,
}

/// A sharded array. Cheap to clone.
///
/// Thread-safety: every method may be called from any thread.
#[derive(Clone)]
pub struct Array(Arc<Inner>);

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Array({} {:?})",
            self.0.spec.describe(),
            self.0.spec.sharding
        )
    }
}

impl Array {
    /// True when both handles are the same array (clones of one another), as
    /// [`put_to`](Self::put_to) returns an array laid out that way already.
    pub fn same_as(&self, other: &Array) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// An array of buffers the runtime made to fit `spec` (unchecked), its
    /// sharding saying the kind of memory they are in.
    pub(crate) fn from_parts(mut spec: ArraySpec, buffers: Vec<Buffer>) -> Array {
        if let Some(first) = buffers.first() {
            let kind = first.memory_space().kind();
            if spec.sharding.memory_kind_or_default() != kind {
                // (Fails only for a kind a device lacks, which its buffer is in.)
                if let Ok(sharding) = spec.sharding.with_memory_kind(Some(kind)) {
                    spec.sharding = sharding;
                }
            }
        }
        Array(Arc::new(Inner { spec, buffers }))
    }

    /// The kind of memory the shards are in (the sharding's: every shard is
    /// in the same kind).
    pub fn memory_kind(&self) -> MemoryKind {
        self.0.spec.sharding.memory_kind_or_default()
    }

    /// True when every shard's data is in this process's memory (see
    /// [`Buffer::is_in_process`]); false when a shard is on a worker or a
    /// PJRT plugin's device.
    pub fn is_in_process(&self) -> bool {
        self.buffers().iter().all(Buffer::is_in_process)
    }

    /// True when this process can view every shard's bytes in place (see
    /// [`Buffer::is_host_addressable`]).
    pub fn is_host_addressable(&self) -> bool {
        self.buffers().iter().all(Buffer::is_host_addressable)
    }

    /// The spec (shape, dtype, sharding).
    pub fn spec(&self) -> &ArraySpec {
        &self.0.spec
    }
    /// Global shape.
    pub fn shape(&self) -> &[i64] {
        &self.0.spec.shape
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.spec.dtype
    }
    /// Layout over devices.
    pub fn sharding(&self) -> &Sharding {
        &self.0.spec.sharding
    }
    /// One buffer per device, in the sharding's device order.
    pub fn buffers(&self) -> &[Buffer] {
        &self.0.buffers
    }
    /// The slice of the global array that buffer `i` holds.
    pub fn shard_index(&self, i: usize) -> Result<Vec<Range<i64>>> {
        self.0.spec.sharding.shard_index(i, &self.0.spec.shape)
    }
    /// Ready when every buffer is.
    pub fn ready_event(&self) -> Event {
        if let [one] = &self.0.buffers[..] {
            return one.ready_event().clone();
        }
        let events: Vec<Event> = self
            .0
            .buffers
            .iter()
            .map(|b| b.ready_event().clone())
            .collect();
        Event::join(&events)
    }
    /// Deletes every buffer.
    pub fn delete(&self) {
        self.0.buffers.iter().for_each(Buffer::delete);
    }
    /// True when any buffer was deleted.
    pub fn is_deleted(&self) -> bool {
        self.0.buffers.iter().any(Buffer::is_deleted)
    }

    /// Keeps every buffer of `arrays` for work submitted later (see
    /// [`Kept`]); `failed_precondition` if one is deleted already.
    pub fn keep(arrays: &[Array]) -> Result<Kept> {
        Kept::new(arrays.iter().flat_map(|a| a.0.buffers.iter()))
    }
}

/// One progress report per shard (of `sizes` bytes each; 0: it reports
/// nothing) that adds up the shards' bytes into `progress(done, in all)`.
fn shard_progress(progress: Option<Progress>, sizes: &[u64]) -> Vec<Option<Progress>> {
    let Some(progress) = progress else {
        return vec![None; sizes.len()];
    };
    let total: u64 = sizes.iter().sum();
    let done: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new(sizes.iter().map(|_| Default::default()).collect());
    sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            (size > 0).then(|| {
                let (done, progress) = (done.clone(), progress.clone());
                Arc::new(move |bytes: u64, _of: u64| {
                    use std::sync::atomic::Ordering::Relaxed;
                    done[i].store(bytes, Relaxed);
                    progress(done.iter().map(|d| d.load(Relaxed)).sum(), total);
                }) as Progress
            })
        })
        .collect()
}

/// The sharding of `spec` in the memory `buffers` are in, when it says
/// another (`None`: it says theirs); `invalid_argument` when the buffers are
/// in different kinds of memory, or the sharding names a kind they are not in.
fn in_memory_of(spec: &ArraySpec, buffers: &[Buffer]) -> Result<Option<Sharding>> {
    let Some(first) = buffers.first() else {
        return Ok(None);
    };
    let kind = first.memory_space().kind();
    if let Some((i, other)) = buffers
        .iter()
        .enumerate()
        .find(|(_, b)| b.memory_space().kind() != kind)
    {
        return Err(Error::invalid_argument(format!(
            "buffer 0 is in {} memory but buffer {i} in {} memory; an array's shards are in one kind",
            kind.name(),
            other.memory_space().kind().name()
        )));
    }
    let sharding = &spec.sharding;
    if let Some(want) = sharding.memory_kind().filter(|&want| want != kind) {
        return Err(Error::invalid_argument(format!(
            "the buffers are in {} memory but the sharding's memory kind is {}",
            kind.name(),
            want.name()
        )));
    }
    if sharding.memory_kind_or_default() == kind {
        return Ok(None);
    }
    sharding.with_memory_kind(Some(kind)).map(Some)
}

/// `device`'s memory space of `kind` (None: its default one).
fn memory_space(device: &Device, kind: Option<MemoryKind>) -> Result<Option<&MemorySpace>> {
    kind.map(|k| device.memory_space_by_kind(k.name()))
        .transpose()
}
