//! Moving an array: copies to another sharding, and puts onto devices
//! (gathered first where the shards cannot keep their layout).

use super::{memory_space, shard_progress, Array};
use crate::buffer::Buffer;
use crate::client::Client;
use crate::device::MemoryKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::{Event, Progress};
use crate::sharding::Sharding;
use crate::spec::ArraySpec;

impl Array {
    /// Copies the array to `sharding`, shard by shard: shard `i` moves to
    /// device `i` of `sharding`, within a host or across hosts (see
    /// [`Buffer::copy_to_device_with_progress`]). Returns at once; the copies
    /// run in the calling thread's program order. `progress(bytes done, bytes
    /// in all)` reports the bytes that crossed hosts, over all shards, from
    /// network threads. `invalid_argument` unless every shard keeps its index
    /// (same shape of mesh and partition; a reshard is a gather and a split),
    /// and for a sharding in other than the devices' default memory.
    pub fn copy_to_sharding(
        &self,
        sharding: Sharding,
        progress: Option<Progress>,
    ) -> Result<Array> {
        if let Some(kind) = sharding.memory_kind() {
            return Err(Error::invalid_argument(format!(
                "copies land in each device's default memory, not in {} memory: place the array \
                 with put_to",
                kind.name()
            )));
        }
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
    /// of `memory_kind`, else of the sharding's memory kind; with neither,
    /// its default memory), as `device_put`
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
        // The memory the array goes to: `memory_kind`, else the sharding's.
        let memory_kind = memory_kind.or(sharding.memory_kind());
        let sharding = sharding.with_memory_kind(memory_kind)?;
        let default_kind = sharding
            .devices()
            .first()
            .map(|d| d.default_memory_space().kind());
        let target_kind = memory_kind.or(default_kind);
        let rank = self.0.spec.shape.len();
        if self.0.spec.sharding.equivalent(&sharding, rank) {
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
}
