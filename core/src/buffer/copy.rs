//! Copies between devices and memory spaces, across hosts.

use super::create::device_of;
use super::{host, Buffer, Storage, UsageHold};
use crate::device::{Device, MemorySpace};
use crate::dispatch::Task;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::future::Progress;

impl Buffer {
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
            if remote.copies_directly_to(&to, self.0.dtype) {
                let keep = (held.clone(), hold);
                return remote.copy_to_worker(&to, dst.clone(), progress, keep);
            }
        }
        let to = dst.host_for_new_data();
        if to.takes_directly(&held) {
            drop(hold);
            return to.put(dst, held, progress);
        }
        let (read_progress, put_progress) = match to.in_process() {
            true => (progress, None),
            false => (None, progress),
        };
        drop(to);
        let out = dst.clone();
        let put: host::Fetched = Box::new(move |data| match data {
            Ok(data) => out.host_for_new_data().put(&out, data, put_progress),
            Err(e) => out.finish(Err(e)),
        });
        self.host().fetch(self, held, hold, read_progress, put);
    }
}
