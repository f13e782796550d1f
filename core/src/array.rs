//! Arrays: a global shape and dtype, a sharding, and one buffer per device.

use std::ops::Range;
use std::sync::Arc;

use crate::buffer::{Buffer, Kept};
use crate::client::Client;
use crate::device::{Device, MemoryKind, MemorySpace};
use crate::dtype::{checked_byte_size, checked_num_elements, DType};
use crate::error::{Error, Result};
use crate::future::{Event, Progress};
use crate::prefault::Prefault;
use crate::sharding::Sharding;
use crate::spec::ArraySpec;
use crate::storage::HostMemory;

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
    /// Assembles an array of `spec` from single-device arrays, one per device
    /// of its sharding, matched by device (in any order), without copying:
    /// the new array shares their buffers. With `memory_kind`, each must be
    /// in memory of that kind. `invalid_argument` (saying which) for an array
    /// over several devices, two on one device, a device of the sharding
    /// with none, or another memory kind, dtype or shard shape.
    pub fn from_single_device_arrays(
        spec: ArraySpec,
        arrays: &[Array],
        memory_kind: Option<MemoryKind>,
    ) -> Result<Array> {
        let devices = spec.sharding.devices();
        if arrays.len() != devices.len() {
            return Err(Error::invalid_argument(format!(
                "the sharding has {} devices but {} arrays were given",
                devices.len(),
                arrays.len()
            )));
        }
        let mut by_device: Vec<Option<Buffer>> = vec![None; devices.len()];
        for (i, a) in arrays.iter().enumerate() {
            let [one] = a.buffers() else {
                return Err(Error::invalid_argument(format!(
                    "each array must be on a single device, but array {i} is on {} devices",
                    a.buffers().len()
                )));
            };
            let got = one.memory_space().kind();
            if memory_kind.is_some_and(|want| want != got) {
                return Err(Error::invalid_argument(format!(
                    "array {i} is in {} memory but the sharding's memory kind is {}",
                    got.name(),
                    memory_kind.map_or("", MemoryKind::name)
                )));
            }
            // One on a device the sharding lacks leaves a device without one.
            let Some(pos) = devices.iter().position(|d| d == one.device()) else {
                continue;
            };
            if by_device[pos].replace(one.clone()).is_some() {
                return Err(Error::invalid_argument(format!(
                    "two arrays are on {}",
                    one.device()
                )));
            }
        }
        if let Some(missing) = by_device.iter().position(Option::is_none) {
            let on: Vec<u32> = arrays
                .iter()
                .flat_map(|a| a.buffers().iter().map(|b| b.device().id()))
                .collect();
            return Err(Error::invalid_argument(format!(
                "no array is on {}, which the sharding uses (the arrays are on devices {on:?})",
                devices[missing]
            )));
        }
        let buffers = by_device.into_iter().flatten().collect();
        Array::assemble(spec, buffers)
    }

    /// Assembles an array from one buffer per device of `spec.sharding`, in the
    /// sharding's device order; each must hold that device's shard.
    pub fn assemble(spec: ArraySpec, buffers: Vec<Buffer>) -> Result<Array> {
        let devices = spec.sharding.devices();
        if buffers.len() != devices.len() {
            return Err(Error::invalid_argument(format!(
                "the sharding has {} devices but {} buffers were given",
                devices.len(),
                buffers.len()
            )));
        }
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        for (i, (b, d)) in buffers.iter().zip(devices).enumerate() {
            b.check_live()?;
            if b.device() != d {
                return Err(Error::invalid_argument(format!(
                    "buffer {i} is on {} but the sharding puts shard {i} on {d}",
                    b.device()
                )));
            }
            if b.dtype() != spec.dtype || b.dims() != shard.as_slice() {
                return Err(Error::invalid_argument(format!(
                    "buffer {i} is {}{:?} but shard {i} of {} is {}{shard:?}",
                    b.dtype().name(),
                    b.dims(),
                    spec.describe(),
                    spec.dtype.name()
                )));
            }
        }
        Ok(Array(Arc::new(Inner { spec, buffers })))
    }

    /// Copies the array to `sharding`, shard by shard: shard `i` moves to
    /// device `i` of `sharding`, within a host or across hosts (see
    /// [`Buffer::copy_to_device_with_progress`]). Returns at once; the copies
    /// run in the calling thread's program order. `progress(bytes done, bytes
    /// in all)` reports the bytes that crossed hosts, over all shards, from
    /// network threads. `invalid_argument` unless every shard keeps its index
    /// (same shape of mesh and partition; a reshard is a gather and a split).
    pub fn copy_to_sharding(
        &self,
        sharding: Sharding,
        progress: Option<Progress>,
    ) -> Result<Array> {
        let spec = ArraySpec::new(self.0.spec.shape.clone(), self.0.spec.dtype, sharding)?;
        let n = self.0.buffers.len();
        if spec.sharding.devices().len() != n {
            return Err(Error::invalid_argument(format!(
                "the array has {n} shards but the target sharding {}",
                spec.sharding.devices().len()
            )));
        }
        if !self.keeps_layout(&spec)? {
            return Err(Error::invalid_argument(
                "the target sharding lays the array out differently; copy its shards one \
                 by one, or gather and put it again",
            ));
        }
        let sizes: Vec<u64> = self
            .0
            .buffers
            .iter()
            .map(|b| b.on_host_size().map(|s| s as u64))
            .collect::<Result<_>>()?;
        let reports = shard_progress(progress, &sizes);
        let buffers = self
            .0
            .buffers
            .iter()
            .zip(spec.sharding.devices())
            .zip(reports)
            .map(|((b, d), report)| b.copy_to_device_with_progress(d, report))
            .collect::<Result<Vec<_>>>()?;
        Ok(Array::from_parts(spec, buffers))
    }

    /// Whether `spec` (this array's shape and dtype on another sharding)
    /// gives each shard the index it has here.
    fn keeps_layout(&self, spec: &ArraySpec) -> Result<bool> {
        if spec.sharding.devices().len() != self.0.buffers.len() {
            return Ok(false);
        }
        for i in 0..self.0.buffers.len() {
            if spec.sharding.shard_index(i, &spec.shape)? != self.shard_index(i)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The array placed on `sharding` of `client` (in each device's memory
    /// of `memory_kind`; with `None`, its default memory), as `device_put`
    /// of an array places it in every SDK:
    /// - as it is (this array) when it is laid out that way already: an
    ///   equivalent sharding, in memory of that kind;
    /// - shard by shard when each shard keeps its index, the devices are
    ///   `client`'s (the array's own client) and the memory is the devices'
    ///   default:
    ///   a shard on a worker goes from host to host directly, not through this
    ///   process ([`copy_to_sharding`](Self::copy_to_sharding); returns at
    ///   once);
    /// - otherwise gathered into this process and put again, on a thread of
    ///   its own: the new array's buffers are ready once that is done (this
    ///   array is kept for it, even if deleted meanwhile), and fail with its
    ///   error if it fails.
    ///
    /// `progress(bytes done, bytes in all)` reports what crosses hosts, from
    /// network threads: the shards copied between hosts, or the put (string
    /// arrays report nothing).
    pub fn put_to(
        &self,
        client: &Client,
        sharding: Sharding,
        memory_kind: Option<MemoryKind>,
        progress: Option<Progress>,
    ) -> Result<Array> {
        let default_kind = sharding
            .devices()
            .first()
            .map(|d| d.default_memory_space().kind());
        let target_kind = memory_kind.or(default_kind);
        let rank = self.0.spec.shape.len();
        if target_kind == Some(self.memory_kind())
            && self.0.spec.sharding.equivalent(&sharding, rank)
        {
            return Ok(self.clone());
        }
        let spec = ArraySpec::new(self.0.spec.shape.clone(), self.0.spec.dtype, sharding)?;
        let own_client = self
            .0
            .buffers
            .iter()
            .all(|b| b.client().id() == client.id());
        // Copies land in each device's default memory.
        if target_kind == default_kind && own_client && self.keeps_layout(&spec)? {
            return self.copy_to_sharding(spec.sharding, progress);
        }
        self.put_gathered(client, spec, memory_kind, progress)
    }

    /// The gather and put of [`put_to`](Self::put_to): an array of pending
    /// buffers at once, filled by a thread that gathers this array and puts
    /// it again.
    fn put_gathered(
        &self,
        client: &Client,
        spec: ArraySpec,
        memory_kind: Option<MemoryKind>,
        progress: Option<Progress>,
    ) -> Result<Array> {
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        let mut targets = Vec::with_capacity(spec.sharding.devices().len());
        for device in spec.sharding.devices() {
            client.check_device(device)?;
            let memory = memory_space(device, memory_kind)?
                .unwrap_or_else(|| device.default_memory_space())
                .clone();
            targets.push(Buffer::new(
                client,
                device.clone(),
                memory,
                spec.dtype,
                &shard,
                Event::new(),
            ));
        }
        let placed = Array::from_parts(spec.clone(), targets.clone());
        let kept = Array::keep(std::slice::from_ref(self))?;
        let (source, client) = (self.clone(), client.clone());
        let gather = move || {
            let put = || -> Result<Array> {
                let array = kept.use_in(|| {
                    if spec.dtype == DType::String {
                        let strings = source.to_host_strings()?;
                        Array::from_host_strings_in(&client, &strings, spec, memory_kind)
                    } else {
                        let bytes = source.to_host_bytes()?;
                        Array::from_host_bytes_with_progress(
                            &client,
                            &bytes,
                            spec,
                            memory_kind,
                            progress,
                        )
                    }
                })?;
                drop(kept);
                array.ready_event().wait()?;
                Ok(array)
            };
            match put() {
                Ok(array) => {
                    for (target, made) in targets.iter().zip(array.buffers()) {
                        target.finish(made.storage());
                    }
                }
                Err(e) => {
                    for target in &targets {
                        target.finish(Err(e.clone()));
                    }
                }
            }
        };
        std::thread::Builder::new()
            .name("colocated-gather".into())
            .spawn(gather)
            .map_err(|e| {
                Error::resource_exhausted(format!("cannot start a thread to gather the array: {e}"))
            })?;
        Ok(placed)
    }

    /// True when both handles are the same array (clones of one another), as
    /// [`put_to`](Self::put_to) returns an array laid out that way already.
    pub fn same_as(&self, other: &Array) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// An array of buffers the runtime made to fit `spec` (unchecked).
    pub(crate) fn from_parts(spec: ArraySpec, buffers: Vec<Buffer>) -> Array {
        Array(Arc::new(Inner { spec, buffers }))
    }

    /// Splits row-major host bytes of the global array into per-device copies.
    pub fn from_host_bytes(client: &Client, data: &[u8], spec: ArraySpec) -> Result<Array> {
        Array::from_host_bytes_in(client, data, spec, None)
    }

    /// [`from_host_bytes`](Self::from_host_bytes) into each device's memory
    /// space of `memory_kind` (default: each device's default memory space);
    /// `invalid_argument`, naming the kinds a device has, when it lacks it.
    pub fn from_host_bytes_in(
        client: &Client,
        data: &[u8],
        spec: ArraySpec,
        memory_kind: Option<MemoryKind>,
    ) -> Result<Array> {
        Array::from_host_bytes_with_progress(client, data, spec, memory_kind, None)
    }

    /// [`from_host_bytes_in`](Self::from_host_bytes_in), reporting
    /// `progress(bytes done, bytes in all)` on network threads as the shards
    /// that go to workers travel (over all of them; shards of this host
    /// report nothing).
    pub fn from_host_bytes_with_progress(
        client: &Client,
        data: &[u8],
        spec: ArraySpec,
        memory_kind: Option<MemoryKind>,
        progress: Option<Progress>,
    ) -> Result<Array> {
        let elem = spec
            .dtype
            .byte_size()
            .ok_or_else(|| Error::invalid_argument("use from_host_strings for string arrays"))?;
        let expected = checked_byte_size(spec.dtype, &spec.shape)?;
        if data.len() != expected {
            return Err(Error::invalid_argument(format!(
                "data is {} bytes but {} needs {expected}",
                data.len(),
                spec.describe()
            )));
        }
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        let shard_bytes = checked_byte_size(spec.dtype, &shard)?;
        let devices = spec.sharding.devices();
        let remote: Vec<u64> = devices
            .iter()
            .map(|d| match client.remote(d.host_index()) {
                Some(_) => shard_bytes as u64,
                None => 0,
            })
            .collect();
        let mut reports = shard_progress(progress, &remote).into_iter();
        let mut buffers = Vec::with_capacity(devices.len());
        for (pos, device) in devices.iter().enumerate() {
            let memory = memory_space(device, memory_kind)?;
            let report = reports.next().flatten();
            if shard_bytes == data.len() {
                // The shard is the whole array (one device, or replicated).
                buffers.push(Buffer::from_bytes_reporting(
                    client, data, spec.dtype, &shard, device, memory, report,
                )?);
                continue;
            }
            let index = spec.sharding.shard_index(pos, &spec.shape)?;
            // The block is copied once, into memory its buffer takes over
            // (kept as it is here, sent as it is to a worker).
            let mut block = HostMemory::zeroed(shard_bytes)?;
            copy_block(
                data,
                &spec.shape,
                &index,
                block.as_mut_slice(),
                elem,
                Direction::GlobalToShard,
            );
            buffers.push(Buffer::from_memory_reporting(
                client, block, spec.dtype, &shard, device, memory, report,
            )?);
        }
        // Made here to fit `spec`: one buffer per device, of the shard's shape.
        Ok(Array::from_parts(spec, buffers))
    }

    /// Splits row-major strings of the global array into per-device string buffers.
    pub fn from_host_strings<S: AsRef<str>>(
        client: &Client,
        strings: &[S],
        spec: ArraySpec,
    ) -> Result<Array> {
        Array::from_host_strings_in(client, strings, spec, None)
    }

    /// [`from_host_strings`](Self::from_host_strings) into each device's
    /// memory space of `memory_kind` (as [`from_host_bytes_in`](Self::from_host_bytes_in)).
    pub fn from_host_strings_in<S: AsRef<str>>(
        client: &Client,
        strings: &[S],
        spec: ArraySpec,
        memory_kind: Option<MemoryKind>,
    ) -> Result<Array> {
        if spec.dtype != DType::String {
            return Err(Error::invalid_argument(
                "from_host_strings needs dtype string",
            ));
        }
        let n = checked_num_elements(&spec.shape)?;
        if strings.len() != n {
            return Err(Error::invalid_argument(format!(
                "{} strings given but {} needs {n}",
                strings.len(),
                spec.describe()
            )));
        }
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        let mut buffers = Vec::new();
        for (pos, device) in spec.sharding.devices().iter().enumerate() {
            let index = spec.sharding.shard_index(pos, &spec.shape)?;
            let picked: Vec<&str> = element_indices(&spec.shape, &index)
                .map(|i| strings[i].as_ref())
                .collect();
            let memory = memory_space(device, memory_kind)?;
            buffers.push(Buffer::from_strings(
                client, &picked, &shard, device, memory,
            )?);
        }
        Array::assemble(spec, buffers)
    }

    /// The kind of memory the shards are in (that of the first shard; the
    /// constructors place every shard in the same kind).
    pub fn memory_kind(&self) -> MemoryKind {
        self.0.buffers[0].memory_space().kind()
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

    /// Waits for the array and gathers it into row-major host bytes.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.on_host_size()?];
        self.to_host_into(&mut out)?;
        Ok(out)
    }

    /// Bytes of the gathered row-major array (dense dtypes; `invalid_argument`
    /// for strings).
    pub fn on_host_size(&self) -> Result<usize> {
        let spec = &self.0.spec;
        if spec.dtype == DType::String {
            return Err(Error::invalid_argument(
                "use to_host_strings for string arrays",
            ));
        }
        checked_byte_size(spec.dtype, &spec.shape)
    }

    /// Waits for the array and gathers it into `out`, which must be exactly
    /// [`Array::on_host_size`] bytes (checked before waiting).
    pub fn to_host_into(&self, out: &mut [u8]) -> Result<()> {
        let spec = &self.0.spec;
        let expected = self.on_host_size()?;
        if out.len() != expected {
            return Err(Error::invalid_argument(format!(
                "destination is {} bytes but {} needs {expected}",
                out.len(),
                spec.describe()
            )));
        }
        let elem = spec.dtype.byte_size().unwrap_or(1);
        let replicated = spec.sharding.is_fully_replicated();
        let wanted = if replicated { 1 } else { self.0.buffers.len() };
        // Everything that can fail is known before the first read starts.
        let shards = (0..wanted)
            .map(|pos| Ok((self.0.buffers[pos].on_host_size()?, self.shard_index(pos)?)))
            .collect::<Result<Vec<_>>>()?;
        let base = out.as_mut_ptr();
        // Fresh destination memory (a new NumPy array, say) is faulted in on
        // another core while the shards arrive; stopped before returning.
        let prefault = Prefault::start(base, out.len());
        // Every shard's read starts before the first wait: shards on workers
        // download in parallel. A shard whose block is one run of `out` is
        // read straight into it; others into memory of their own, then
        // copied. A block that several shards hold (partial replication) is
        // read once.
        let mut seen = std::collections::HashSet::with_capacity(wanted);
        let mut reads = Vec::with_capacity(wanted);
        for (pos, (size, index)) in shards.into_iter().enumerate() {
            if !seen.insert(index.clone()) {
                continue;
            }
            let buffer = &self.0.buffers[pos];
            let run = contiguous_run(&spec.shape, &index, elem)
                .filter(|run| run.len() == size && run.end <= out.len());
            let (staged, done) = match run {
                // SAFETY: the run lies inside `out`, the runs of different
                // blocks do not overlap, and `out` is not touched until every
                // read's event is ready: every event is waited for below.
                Some(run) => (None, unsafe {
                    buffer.to_host_raw(base.add(run.start), size)
                }),
                None => {
                    let mut shard = vec![0u8; size];
                    // SAFETY: `shard` is exactly that long, and is neither
                    // moved nor touched until its event is ready: every
                    // event is waited for below before `reads` is dropped.
                    let done = unsafe { buffer.to_host_raw(shard.as_mut_ptr(), size) };
                    (Some(shard), done)
                }
            };
            reads.push((staged, index, done));
        }
        let waited: Vec<Result<()>> = reads
            .iter()
            .map(|(_, _, done)| match done {
                Ok(event) => event.wait(),
                Err(e) => Err(e.clone()),
            })
            .collect();
        drop(prefault);
        for ((staged, index, _), status) in reads.iter().zip(waited) {
            status?;
            if let Some(shard) = staged {
                copy_block(
                    shard,
                    &spec.shape,
                    index,
                    out,
                    elem,
                    Direction::ShardToGlobal,
                );
            }
        }
        Ok(())
    }

    /// Waits for a string array and gathers its elements in row-major order
    /// (shards on workers download in parallel; a replicated array reads one).
    pub fn to_host_strings(&self) -> Result<Vec<String>> {
        let spec = &self.0.spec;
        let mut out = vec![String::new(); checked_num_elements(&spec.shape)?];
        let wanted = if spec.sharding.is_fully_replicated() {
            1
        } else {
            self.0.buffers.len()
        };
        // Every shard's read starts before the first wait: shards on workers
        // download in parallel.
        let reads = self.0.buffers[..wanted]
            .iter()
            .map(Buffer::read_strings)
            .collect::<Result<Vec<_>>>()?;
        for (pos, read) in reads.into_iter().enumerate() {
            let index = self.shard_index(pos)?;
            let strings = read.wait()?;
            for (i, s) in element_indices(&spec.shape, &index).zip(strings.strings()?) {
                out[i] = s.to_string();
            }
        }
        Ok(out)
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

/// `device`'s memory space of `kind` (None: its default one).
fn memory_space(device: &Device, kind: Option<MemoryKind>) -> Result<Option<&MemorySpace>> {
    kind.map(|k| device.memory_space_by_kind(k.name()))
        .transpose()
}

#[derive(Clone, Copy)]
enum Direction {
    GlobalToShard,
    ShardToGlobal,
}

/// The bytes of a row-major array of `shape` (elements of `elem` bytes) that
/// block `index` covers, when they are one run: every dimension after the
/// first one the block cuts is whole, and every one before it has one index.
fn contiguous_run(shape: &[i64], index: &[Range<i64>], elem: usize) -> Option<Range<usize>> {
    let mut cut = shape.len();
    while cut > 0 && index[cut - 1].start == 0 && index[cut - 1].end == shape[cut - 1] {
        cut -= 1;
    }
    if cut > 1 && index[..cut - 1].iter().any(|r| r.end - r.start != 1) {
        return None;
    }
    let start = shape.iter().zip(index).try_fold(0i64, |at, (&dim, r)| {
        at.checked_mul(dim)?.checked_add(r.start)
    })?;
    let len = index
        .iter()
        .try_fold(1i64, |n, r| n.checked_mul(r.end - r.start))?;
    let start = usize::try_from(start).ok()?.checked_mul(elem)?;
    let len = usize::try_from(len).ok()?.checked_mul(elem)?;
    Some(start..start.checked_add(len)?)
}

/// Copies the block `index` of a row-major global array (of `shape`) between the
/// global bytes and a dense shard, one contiguous innermost run at a time.
fn copy_block(
    src: &[u8],
    shape: &[i64],
    index: &[Range<i64>],
    dst: &mut [u8],
    elem: usize,
    dir: Direction,
) {
    let rank = shape.len();
    if rank == 0 {
        let n = elem.min(src.len()).min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
        return;
    }
    let run = (index[rank - 1].end - index[rank - 1].start) as usize * elem;
    if run == 0 {
        return;
    }
    let mut shard_at = 0usize;
    for start in element_indices(&shape[..rank], &block_rows(index)) {
        let global_at = (start + index[rank - 1].start as usize) * elem;
        match dir {
            Direction::GlobalToShard => {
                dst[shard_at..shard_at + run].copy_from_slice(&src[global_at..global_at + run])
            }
            Direction::ShardToGlobal => {
                dst[global_at..global_at + run].copy_from_slice(&src[shard_at..shard_at + run])
            }
        }
        shard_at += run;
    }
}

/// The block's rows: the same ranges with the innermost reduced to its first column.
fn block_rows(index: &[Range<i64>]) -> Vec<Range<i64>> {
    let mut rows = index.to_vec();
    if let Some(last) = rows.last_mut() {
        *last = 0..1;
    }
    rows
}

/// Row-major flat indices of the elements of block `index` in an array of `shape`.
fn element_indices<'a>(
    shape: &'a [i64],
    index: &'a [Range<i64>],
) -> impl Iterator<Item = usize> + 'a {
    let total: usize = index
        .iter()
        .map(|r| (r.end - r.start).max(0) as usize)
        .product();
    let mut counter: Vec<i64> = index.iter().map(|r| r.start).collect();
    (0..total).map(move |k| {
        let flat = counter
            .iter()
            .zip(shape)
            .fold(0usize, |acc, (&c, &n)| acc * n as usize + c as usize);
        if k + 1 < total {
            for d in (0..counter.len()).rev() {
                counter[d] += 1;
                if counter[d] < index[d].end {
                    break;
                }
                counter[d] = index[d].start;
            }
        }
        flat
    })
}

#[cfg(test)]
mod tests {
    use super::contiguous_run;

    #[test]
    fn a_block_is_one_run_when_only_its_leading_dimensions_are_cut() {
        let shape = [4, 6, 2];
        // Rows 1..3 of a (4, 6, 2) array of 4-byte elements.
        assert_eq!(
            contiguous_run(&shape, &[1..3, 0..6, 0..2], 4),
            Some(48..144)
        );
        // One row, columns 2..4: a run too.
        assert_eq!(contiguous_run(&shape, &[2..3, 2..4, 0..2], 1), Some(28..32));
        // Two rows cut in the columns: not one run.
        assert_eq!(contiguous_run(&shape, &[0..2, 0..3, 0..2], 1), None);
        // The last dimension cut over several rows: not one run.
        assert_eq!(contiguous_run(&shape, &[0..4, 0..6, 0..1], 1), None);
        // The whole array, and a scalar.
        assert_eq!(contiguous_run(&shape, &[0..4, 0..6, 0..2], 2), Some(0..96));
        assert_eq!(contiguous_run(&[], &[], 8), Some(0..8));
        // An empty block is an empty run.
        assert_eq!(contiguous_run(&shape, &[2..2, 0..6, 0..2], 1), Some(24..24));
    }
}
