//! The client: topology (hosts, devices, memory spaces) and the local host runtime.

use std::any::Any;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use crate::device::{Device, MemorySpace};
use crate::dispatch::{nested_stream, thread_stream, Dispatcher, Stream, StreamSlot};
use crate::error::{Error, Result};
use crate::future::Event;
use crate::remote::{HostEvent, HostEvents, HostStats, RemoteHost, RemoteSlot};
use crate::session::ConnectOptions;

pub use crate::device::PLATFORM_NAME;

mod build;
mod plugin;

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Options of a local client.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// Number of CPU devices of the local host (default: the number of cores).
    pub num_cpu_devices: Option<usize>,
    /// Executor threads the local host keeps running (default: the number of
    /// cores, at least 2).
    pub executor_threads: Option<usize>,
    /// The most executor threads the local host may run at once (default:
    /// [`DEFAULT_MAX_EXECUTOR_THREADS`], and never fewer than
    /// `executor_threads`). When every thread is busy — a program sleeping,
    /// doing I/O, or waiting for another stream — and a stream has work, one
    /// more starts, so streams that block never starve each other; threads
    /// beyond `executor_threads` exit after 10 s without work.
    pub max_executor_threads: Option<usize>,
    /// A PJRT plugin whose devices join the local host's CPU devices (and
    /// become the client's default backend; see
    /// [`Client::default_backend`]). Loaded by this process at client
    /// creation; never at a worker's or a controller's request.
    pub pjrt: Option<crate::backend::PjrtOptions>,
}

/// The default of [`ClientOptions::max_executor_threads`].
pub const DEFAULT_MAX_EXECUTOR_THREADS: usize = 256;

/// Options of [`Client::connect`]: a controller driving worker hosts.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The workers; worker `i` becomes process `i + 1`.
    pub workers: Vec<ConnectOptions>,
    /// Whether the controller's own process is a host too (process 0, first in
    /// [`Client::hosts`]).
    pub include_local: bool,
    /// The local host's devices (when `include_local`) and executor threads.
    pub local: ClientOptions,
}

impl ClusterOptions {
    /// Options for the workers at `addresses`, each reached as `connect` says
    /// (its token, timeout, TLS settings; its own address is not used).
    pub fn uniform(
        addresses: impl IntoIterator<Item = impl Into<String>>,
        connect: &ConnectOptions,
        include_local: bool,
        local: ClientOptions,
    ) -> ClusterOptions {
        ClusterOptions {
            workers: addresses
                .into_iter()
                .map(|address| ConnectOptions {
                    address: address.into(),
                    ..connect.clone()
                })
                .collect(),
            include_local,
            local,
        }
    }
}

impl ClusterOptions {
    /// Options for the workers at `addresses` or, when none are given, for
    /// those `discovery` finds ([`find_workers`](crate::cluster::find_workers):
    /// `COLOCATED_WORKERS`, the Slurm job, Kubernetes), each reached as
    /// `connect` says. `not_found` when none are given or found (listing
    /// where it looked).
    pub fn find(
        addresses: &[String],
        discovery: &crate::cluster::Discovery,
        connect: &ConnectOptions,
        include_local: bool,
        local: ClientOptions,
    ) -> Result<ClusterOptions> {
        let found = crate::cluster::find_workers(addresses, discovery, &crate::cluster::System)?;
        Ok(ClusterOptions::uniform(
            found.addresses,
            connect,
            include_local,
            local,
        ))
    }
}

/// A host: a process that owns devices and runs programs on them.
#[derive(Clone, Debug)]
pub struct Host {
    pub(crate) index: usize,
    pub(crate) process_index: u32,
    pub(crate) name: String,
    pub(crate) device_ids: Vec<u32>,
    pub(crate) remote: bool,
}

impl Host {
    /// Index in [`Client::hosts`].
    pub fn index(&self) -> usize {
        self.index
    }
    /// Process index that the host's devices report.
    pub fn process_index(&self) -> u32 {
        self.process_index
    }
    /// A name for people: `"local"` or the worker's address.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Ids of the devices the host owns.
    pub fn device_ids(&self) -> &[u32] {
        &self.device_ids
    }
    /// True for a worker host (reached over the network), false for the
    /// controller's own process.
    pub fn is_remote(&self) -> bool {
        self.remote
    }
}

/// The in-process host: its dispatcher, and what it runs programs with.
pub(crate) struct LocalHost {
    pub dispatcher: Dispatcher,
    /// The host's languages. The registry belongs to the `executor` layer,
    /// which sits above the client (its programs see buffers and the
    /// client): the client only keeps it, and `executor::Languages::of`
    /// makes and reads it.
    pub languages: OnceLock<Box<dyn Any + Send + Sync>>,
}

pub(crate) struct ClientInner {
    pub id: u64,
    pub devices: Vec<Device>,
    pub memory_spaces: Vec<MemorySpace>,
    pub hosts: Vec<Host>,
    pub local: LocalHost,
    /// The worker of each host index (`None` for the local host).
    pub remotes: Vec<Option<RemoteSlot>>,
    /// What happens to the worker hosts: counters and listeners.
    pub events: Arc<HostEvents>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Whatever the trace writer still holds reaches the file before the
        // runtime of this client is gone (a no-op when tracing is off).
        crate::trace::flush();
    }
}

/// Entry point of the object model. Cheap to clone; every object made from a
/// client keeps it alive.
///
/// Thread-safety: every method may be called from any thread.
#[derive(Clone)]
pub struct Client(pub(crate) Arc<ClientInner>);

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Client(id={}, devices={})",
            self.0.id,
            self.0.devices.len()
        )
    }
}

impl Client {
    /// The worker of host `index` for new work (`None` for the local
    /// host): its session, or a new one when that was lost (see
    /// [`RemoteSlot`]).
    pub(crate) fn remote(&self, index: usize) -> Option<Arc<RemoteHost>> {
        self.0
            .remotes
            .get(index)
            .and_then(Option::as_ref)
            .map(RemoteSlot::for_work)
    }

    /// The worker of host `index` as it is now (`None` for the local host):
    /// for what exists already, which a new session would not hold.
    pub(crate) fn remote_now(&self, index: usize) -> Option<Arc<RemoteHost>> {
        self.0
            .remotes
            .get(index)
            .and_then(Option::as_ref)
            .map(RemoteSlot::current)
    }

    /// Whether host `index` is a worker.
    pub(crate) fn is_remote(&self, index: usize) -> bool {
        self.0.remotes.get(index).is_some_and(Option::is_some)
    }

    /// Ends the sessions with the client's workers now, instead of when the
    /// last object of the client goes: the workers free what the sessions
    /// hold, and work in flight there and every later use of a worker's
    /// device fail with `cancelled` (each [`host_lost`](Self::host_lost)
    /// event carries it). The local host stays usable. Closing twice does
    /// nothing.
    pub fn close(&self) {
        for remote in self.0.remotes.iter().flatten() {
            remote.close();
        }
    }

    /// Ready, with `unavailable`, once host `index`'s session is lost for
    /// good (see [`RemoteSession::lost`](crate::session::RemoteSession::lost));
    /// never ready for the local host. The event is that of the host's
    /// current session: after new work opened a new session with the
    /// worker, ask again for the new one's.
    pub fn host_lost(&self, index: usize) -> Result<Event> {
        if index >= self.0.hosts.len() {
            return Err(Error::invalid_argument(format!(
                "host {index} is out of range ({} hosts)",
                self.0.hosts.len()
            )));
        }
        let remote = self.0.remotes.get(index).and_then(Option::as_ref);
        Ok(match remote {
            Some(remote) => remote.current().session.lost().clone(),
            None => Event::new(),
        })
    }

    /// Calls `listener` with every event of the client's worker hosts from
    /// now on (a link broke, came back; a session lost for good, replaced
    /// by a new one), in order, on a thread of the client's own, never while
    /// a call of the client waits on it. It first hears the loss of each
    /// host whose current session was lost before it came (once). Returns
    /// the listener's id, for
    /// [`remove_host_listener`](Self::remove_host_listener).
    pub fn on_host_event(
        &self,
        listener: impl Fn(&HostEvent) + Send + Sync + 'static,
    ) -> Result<u64> {
        self.0.events.listen(listener)
    }

    /// Stops calling listener `id`; false if it was not listening.
    pub fn remove_host_listener(&self, id: u64) -> bool {
        self.0.events.unlisten(id)
    }

    /// How often each host event happened to host `index` since the client
    /// started (zeros for the local host).
    pub fn host_stats(&self, index: usize) -> Result<HostStats> {
        if index >= self.0.hosts.len() {
            return Err(Error::invalid_argument(format!(
                "host {index} is out of range ({} hosts)",
                self.0.hosts.len()
            )));
        }
        Ok(self.0.events.stats(index))
    }

    /// Process-unique id of this client.
    pub fn id(&self) -> u64 {
        self.0.id
    }
    /// `"colocated"`.
    pub fn platform_name(&self) -> &'static str {
        PLATFORM_NAME
    }
    /// The runtime version (`CARGO_PKG_VERSION`).
    pub fn platform_version(&self) -> &'static str {
        env!("CARGO_PKG_VERSION")
    }
    /// Process index of the controller (always 0: the controller is process 0).
    pub fn process_index(&self) -> u32 {
        0
    }
    /// Every device of every host, ordered by id.
    pub fn devices(&self) -> &[Device] {
        &self.0.devices
    }
    /// Devices this client can place buffers on and run programs on.
    pub fn addressable_devices(&self) -> &[Device] {
        &self.0.devices
    }
    /// The default backend, as JAX has one: a PJRT plugin's when a host has
    /// one (its platform, or `"pjrt_cpu"` for a plugin whose platform is
    /// `"cpu"`, such as XLA's CPU plugin), else `"cpu"`.
    pub fn default_backend(&self) -> &str {
        self.0
            .devices
            .iter()
            .find(|d| !d.is_host_cpu())
            .map_or("cpu", |d| d.backend())
    }

    /// The devices of `backend` (`None`: the default backend's), ordered by
    /// id. `"cpu"` names this runtime's CPU devices, where colocated Python,
    /// Node and native functions run. `not_found`, naming the backends there
    /// are, for any other name.
    pub fn backend_devices(&self, backend: Option<&str>) -> Result<Vec<Device>> {
        let name = backend.unwrap_or_else(|| self.default_backend());
        let devices: Vec<Device> = self
            .0
            .devices
            .iter()
            .filter(|d| d.backend() == name)
            .cloned()
            .collect();
        if devices.is_empty() {
            let mut names: Vec<&str> = self.0.devices.iter().map(Device::backend).collect();
            names.sort_unstable();
            names.dedup();
            return Err(Error::not_found(format!(
                "no devices of backend '{name}' in this client (it has {names:?})"
            )));
        }
        Ok(devices)
    }

    /// Every memory space of every host.
    pub fn memory_spaces(&self) -> &[MemorySpace] {
        &self.0.memory_spaces
    }
    /// The hosts, in process-index order.
    pub fn hosts(&self) -> &[Host] {
        &self.0.hosts
    }

    /// The device with global `id`, or `not_found`.
    pub fn lookup_device(&self, id: u32) -> Result<Device> {
        self.0
            .devices
            .get(id as usize)
            .filter(|d| d.id() == id)
            .or_else(|| self.0.devices.iter().find(|d| d.id() == id))
            .cloned()
            .ok_or_else(|| Error::not_found(format!("no device with id {id} in this client")))
    }

    /// The memory space with `id`, or `not_found`.
    pub fn lookup_memory_space(&self, id: u32) -> Result<MemorySpace> {
        self.0
            .memory_spaces
            .iter()
            .find(|m| m.id() == id)
            .cloned()
            .ok_or_else(|| Error::not_found(format!("no memory space with id {id} in this client")))
    }

    /// Maps each device to the CPU device of the same host, in order: a CPU device
    /// maps to itself, the k-th other device of a host to its k-th CPU device.
    pub fn colocated_cpu_devices(&self, devices: &[Device]) -> Result<Vec<Device>> {
        devices
            .iter()
            .map(|d| {
                self.check_device(d)?;
                if d.is_host_cpu() {
                    return Ok(d.clone());
                }
                let host = &self.0.hosts[d.host_index()];
                let host_devices: Vec<&Device> = host
                    .device_ids
                    .iter()
                    .filter_map(|id| self.0.devices.iter().find(|x| x.id() == *id))
                    .collect();
                let cpus: Vec<&&Device> = host_devices.iter().filter(|x| x.is_host_cpu()).collect();
                let position = host_devices
                    .iter()
                    .filter(|x| x.backend() == d.backend())
                    .position(|x| *x == d)
                    .unwrap_or(0);
                cpus.get(position % cpus.len().max(1))
                    .map(|x| (**x).clone())
                    .ok_or_else(|| {
                        Error::not_found(format!(
                            "host {} of {} has no CPU device",
                            host.name,
                            d.debug_string()
                        ))
                    })
            })
            .collect()
    }

    /// A new stream: an ordering domain for executions and transfers.
    pub fn create_stream(&self) -> Stream {
        Stream::new(self.0.local.dispatcher.id())
    }

    /// Holds the next place of `stream`'s program order for work that is
    /// not known yet (see [`StreamSlot`]); `invalid_argument` if the stream
    /// is another client's.
    pub fn reserve(&self, stream: &Stream) -> Result<StreamSlot> {
        self.check_stream(stream)?;
        Ok(self.0.local.dispatcher.reserve(stream))
    }

    /// `invalid_argument` unless `stream` was made by this client.
    pub fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.owner() != self.0.local.dispatcher.id() {
            return Err(Error::invalid_argument(format!(
                "stream {} belongs to another client",
                stream.id()
            )));
        }
        Ok(())
    }

    /// The calling thread's default stream for this client.
    pub fn current_stream(&self) -> Stream {
        thread_stream(self.0.local.dispatcher.id())
    }

    /// The stream of the calls made for the task this thread runs (see
    /// `ExecutionContext::nested_stream`).
    pub(crate) fn nested_stream(&self) -> Stream {
        nested_stream(self.0.local.dispatcher.id())
    }

    /// `invalid_argument` unless `device` belongs to this client.
    pub fn check_device(&self, device: &Device) -> Result<()> {
        if device.client_id() != self.0.id {
            return Err(Error::invalid_argument(format!(
                "{} belongs to another client",
                device.to_string_short()
            )));
        }
        Ok(())
    }

    /// `invalid_argument` unless `memory` belongs to this client.
    pub fn check_memory_space(&self, memory: &MemorySpace) -> Result<()> {
        if memory.client_id() != self.0.id {
            return Err(Error::invalid_argument(format!(
                "memory space {} belongs to another client",
                memory.id()
            )));
        }
        Ok(())
    }
}
