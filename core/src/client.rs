//! The client: topology (hosts, devices, memory spaces) and the local host runtime.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::backend::{PjrtBackend, PjrtDevice};
use crate::device::{
    CpuBackend, Device, DeviceBackend, DeviceInner, MemoryKind, MemorySpace, MemorySpaceInner,
};
use crate::dispatch::{thread_stream, Dispatcher, Stream, StreamSlot};
use crate::error::{Error, Result};
use crate::future::Event;
use crate::remote::RemoteHost;
use crate::session::{ConnectOptions, RemoteSession};

pub use crate::device::PLATFORM_NAME;

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
    pub remotes: Vec<Option<Arc<RemoteHost>>>,
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

/// A session with the worker of `options`, retrying while it refuses
/// connections (it has not started listening yet) until `options.timeout`
/// has passed.
fn connect_when_up(options: &ConnectOptions) -> Result<RemoteSession> {
    let deadline = std::time::Instant::now() + options.timeout;
    loop {
        match RemoteSession::connect(options) {
            Err(e) if e.code() == crate::error::ErrorCode::Unavailable => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(Error::unavailable(format!(
                        "{} (waited {:?} for it)",
                        e.message(),
                        options.timeout
                    )));
                }
                std::thread::sleep(left.min(std::time::Duration::from_millis(100)));
            }
            outcome => return outcome,
        }
    }
}

impl Client {
    /// A client whose only host is this process, with CPU devices.
    pub fn new_local(options: ClientOptions) -> Result<Client> {
        Client::build(&options, true, Vec::new())
    }

    /// A client of worker hosts (and of this process too, if
    /// `options.include_local`): connects to every worker at once and opens a
    /// session on each, waiting for workers that do not accept connections
    /// yet (still starting, as when a cluster manager starts them with the
    /// controller) until each one's `timeout`. Devices get global ids host
    /// after host; a worker's devices report `process_index` `i + 1`.
    ///
    /// Errors: no host at all (`invalid_argument`); a worker that cannot be
    /// reached in time (`unavailable`), refuses the token (`unauthenticated`)
    /// or speaks no common protocol or release (`failed_precondition`). With
    /// one worker failing, its error; with several, one error that names
    /// each (its code: the first that is not `unavailable`, if any).
    pub fn connect(options: &ClusterOptions) -> Result<Client> {
        // Before the sessions open: a traced controller asks its workers for
        // their spans as each session opens.
        crate::trace::init_from_env();
        if options.workers.is_empty() && !options.include_local {
            return Err(Error::invalid_argument(
                "a client needs at least one host: name workers or include the local host",
            ));
        }
        let attempts: Vec<Result<RemoteSession>> = std::thread::scope(|scope| {
            let started: Vec<_> = options
                .workers
                .iter()
                .map(|worker| scope.spawn(move || connect_when_up(worker)))
                .collect();
            started
                .into_iter()
                .map(|attempt| {
                    attempt
                        .join()
                        .unwrap_or_else(|_| Err(Error::internal("connecting panicked")))
                })
                .collect()
        });
        let total = attempts.len();
        let (sessions, failures): (Vec<_>, Vec<_>) = attempts.into_iter().partition(Result::is_ok);
        let mut failures: Vec<Error> = failures.into_iter().filter_map(Result::err).collect();
        match failures.len() {
            0 => {}
            1 => return Err(failures.remove(0)),
            n => {
                let code = failures
                    .iter()
                    .map(Error::code)
                    .find(|c| *c != crate::error::ErrorCode::Unavailable)
                    .unwrap_or(crate::error::ErrorCode::Unavailable);
                let each: Vec<String> = failures.iter().map(|e| e.message().to_string()).collect();
                return Err(Error::new(
                    code,
                    format!("{n} of {total} workers failed: {}", each.join("; ")),
                ));
            }
        }
        let sessions = sessions.into_iter().filter_map(Result::ok).collect();
        Client::build(&options.local, options.include_local, sessions)
    }

    fn build(
        options: &ClientOptions,
        include_local: bool,
        sessions: Vec<RemoteSession>,
    ) -> Result<Client> {
        crate::trace::init_from_env();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let num_local = if include_local {
            options.num_cpu_devices.unwrap_or(cores)
        } else {
            0
        };
        if include_local && (num_local == 0 || num_local > 4096) {
            return Err(Error::invalid_argument(format!(
                "num_cpu_devices must be between 1 and 4096, got {num_local}"
            )));
        }
        let threads = options.executor_threads.unwrap_or(cores.max(2));
        if threads == 0 || threads > 1024 {
            return Err(Error::invalid_argument(format!(
                "executor_threads must be between 1 and 1024, got {threads}"
            )));
        }
        let max_threads = match options.max_executor_threads {
            None => DEFAULT_MAX_EXECUTOR_THREADS.max(threads),
            Some(max) if max < threads || max > 4096 => {
                return Err(Error::invalid_argument(format!(
                    "max_executor_threads must be between executor_threads ({threads}) and 4096, got {max}"
                )));
            }
            Some(max) => max,
        };
        let id = NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed);
        let backend = CpuBackend;
        let plugin = match (&options.pjrt, include_local) {
            (Some(pjrt), true) => Some(PjrtBackend::open(pjrt)?),
            _ => None,
        };
        let num_plugin = plugin.as_ref().map_or(0, |p| p.client().devices().len());

        // (process index, name, devices, worker)
        type HostSpec = (u32, String, Vec<RemoteDevice>, Option<RemoteSession>);
        let mut specs: Vec<HostSpec> = Vec::new();
        if include_local {
            let cpu = || Arc::<str>::from(backend.kind());
            let devices = (0..num_local as u32)
                .map(|i| RemoteDevice {
                    local_id: i,
                    hardware: i,
                    platform: cpu(),
                    kind: cpu(),
                    backend: cpu(),
                    memories: Vec::new(),
                })
                .collect();
            specs.push((0, "local".to_string(), devices, None));
        }
        for (i, session) in sessions.into_iter().enumerate() {
            let info = session.host();
            if info.devices.is_empty() {
                return Err(Error::failed_precondition(format!(
                    "worker {} has no devices",
                    session.address()
                )));
            }
            let mut devices = Vec::with_capacity(info.devices.len());
            for d in &info.devices {
                // Workers from before PJRT plugins send no platform: CPU devices.
                let or_cpu = |s: &str| Arc::<str>::from(if s.is_empty() { "cpu" } else { s });
                // A plugin device's memories (a CPU device's are the host's,
                // below); a kind this release does not know is left out.
                let memories = match or_cpu(&d.backend).as_ref() {
                    "cpu" => Vec::new(),
                    _ => d
                        .memories
                        .iter()
                        .filter_map(|m| {
                            let kind = MemoryKind::from_u32(m.kind);
                            if kind.is_none() {
                                tracing::warn!(
                                    worker = %session.address(),
                                    device = d.local_id,
                                    kind = m.kind,
                                    "a memory of a kind this release does not know; left out"
                                );
                            }
                            Some((m.id, kind?))
                        })
                        .collect(),
                };
                devices.push(RemoteDevice {
                    local_id: d.local_id,
                    hardware: u32::try_from(d.local_hardware_id).unwrap_or(0),
                    platform: or_cpu(&d.platform),
                    kind: Arc::from(d.kind.as_str()),
                    backend: or_cpu(&d.backend),
                    memories,
                });
            }
            let name = session.address().to_string();
            specs.push((i as u32 + 1, name, devices, Some(session)));
        }
        let total: usize = specs.iter().map(|s| s.2.len()).sum::<usize>() + num_plugin;
        let total = u32::try_from(total)
            .ok()
            .filter(|n| *n <= 1 << 20)
            .ok_or_else(|| Error::invalid_argument("too many devices"))?;

        let host_count = specs.len() as u32;
        let mut devices = Vec::with_capacity(total as usize);
        let mut plugin_spaces = Vec::new();
        let mut memory_spaces = Vec::with_capacity(total as usize + 2 * specs.len());
        let mut host_spaces = Vec::with_capacity(2 * specs.len());
        let mut hosts = Vec::with_capacity(specs.len());
        let mut remotes = Vec::with_capacity(specs.len());
        for (host_index, (process_index, name, host_devices, session)) in
            specs.into_iter().enumerate()
        {
            let first = devices.len() as u32;
            // The local host's plugin devices follow its CPU devices.
            let host_plugin = plugin.as_ref().filter(|_| session.is_none());
            // A worker's plugin devices have their own memory only here (their
            // host memories are the plugin's, on the worker); its CPU devices
            // share the host's pinned and unpinned spaces.
            let cpu_count = host_devices.iter().filter(|d| &*d.backend == "cpu").count();
            let host_total =
                host_devices.len() as u32 + host_plugin.map_or(0, |_| num_plugin as u32);
            let device_ids: Vec<u32> = (first..first + host_total).collect();
            let cpu_ids: Vec<u32> = device_ids[..host_devices.len()]
                .iter()
                .zip(&host_devices)
                .filter(|(_, d)| &*d.backend == "cpu")
                .map(|(id, _)| *id)
                .collect();
            debug_assert_eq!(cpu_ids.len(), cpu_count);
            let space = |offset: u32, kind: MemoryKind| {
                MemorySpace(Arc::new(MemorySpaceInner {
                    id: total + 2 * host_index as u32 + offset,
                    kind,
                    device_ids: cpu_ids.to_vec(),
                    client_id: id,
                    host_index,
                }))
            };
            let pinned = space(0, MemoryKind::PinnedHost);
            let unpinned = space(1, MemoryKind::UnpinnedHost);
            // A worker's plugin memories that are not one device's own (its
            // pinned and unpinned host memories), each once, as (id there,
            // space here).
            let mut worker_spaces: Vec<(u32, MemorySpace)> = Vec::new();
            let mut users: Vec<(u32, MemoryKind, Vec<u32>)> = Vec::new();
            for (global, d) in device_ids.iter().zip(&host_devices) {
                for &(memory, kind) in &d.memories {
                    match users.iter_mut().find(|(m, _, _)| *m == memory) {
                        Some((_, _, ids)) => ids.push(*global),
                        None => users.push((memory, kind, vec![*global])),
                    }
                }
            }
            for (memory, kind, ids) in users {
                if kind == MemoryKind::Device && ids.len() == 1 {
                    continue; // the device's own (below)
                }
                let space = MemorySpace(Arc::new(MemorySpaceInner {
                    id: total + 2 * host_count + plugin_spaces.len() as u32,
                    kind,
                    device_ids: ids,
                    client_id: id,
                    host_index,
                }));
                plugin_spaces.push(space.clone());
                worker_spaces.push((memory, space));
            }
            for (global, d) in device_ids.iter().zip(&host_devices) {
                let own = MemorySpace(Arc::new(MemorySpaceInner {
                    id: *global,
                    kind: MemoryKind::Device,
                    device_ids: vec![*global],
                    client_id: id,
                    host_index,
                }));
                let host_cpu = &*d.backend == "cpu";
                let spaces = if host_cpu || d.memories.is_empty() {
                    match host_cpu {
                        true => vec![own.clone(), pinned.clone(), unpinned.clone()],
                        false => vec![own.clone()],
                    }
                } else {
                    // The worker's order: its default first.
                    d.memories
                        .iter()
                        .map(|(memory, _)| {
                            worker_spaces
                                .iter()
                                .find(|(m, _)| m == memory)
                                .map_or_else(|| own.clone(), |(_, space)| space.clone())
                        })
                        .collect()
                };
                if spaces.contains(&own) {
                    memory_spaces.push(own);
                }
                devices.push(Device(Arc::new(DeviceInner {
                    id: *global,
                    platform: d.platform.clone(),
                    kind: d.kind.clone(),
                    backend: d.backend.clone(),
                    pjrt: None,
                    process_index,
                    host_index,
                    local_hardware_id: d.hardware,
                    attributes: if host_cpu {
                        backend.attributes(d.hardware as usize)
                    } else {
                        Vec::new()
                    },
                    memory_spaces: spaces,
                    client_id: id,
                })));
            }
            if let Some(plugin) = host_plugin {
                let next_space = total + 2 * host_count + plugin_spaces.len() as u32;
                let (plugin_devices, own, shared) = plugin_devices(
                    plugin,
                    &device_ids[host_devices.len()..],
                    next_space,
                    process_index,
                    host_index,
                    id,
                )?;
                memory_spaces.extend(own);
                devices.extend(plugin_devices);
                plugin_spaces.extend(shared);
            }
            host_spaces.push(pinned);
            host_spaces.push(unpinned);
            remotes.push(session.map(|session| {
                Arc::new(RemoteHost {
                    session,
                    local_ids: host_devices.iter().map(|d| d.local_id).collect(),
                    first_device: first,
                })
            }));
            hosts.push(Host {
                index: host_index,
                process_index,
                name,
                device_ids,
                remote: remotes[host_index].is_some(),
            });
        }
        memory_spaces.extend(host_spaces);
        memory_spaces.extend(plugin_spaces);
        let dispatcher = Dispatcher::new(threads, max_threads, id, "local")?;
        tracing::debug!(
            client = id,
            devices = total,
            hosts = hosts.len(),
            threads,
            "created a client"
        );
        Ok(Client(Arc::new(ClientInner {
            id,
            devices,
            memory_spaces,
            hosts,
            local: LocalHost {
                dispatcher,
                languages: OnceLock::new(),
            },
            remotes,
        })))
    }

    /// The worker of host `index` (`None` for the local host).
    pub(crate) fn remote(&self, index: usize) -> Option<&Arc<RemoteHost>> {
        self.0.remotes.get(index).and_then(Option::as_ref)
    }

    /// Ends the sessions with the client's workers now, instead of when the
    /// last object of the client goes: the workers free what the sessions
    /// hold, and work in flight there and every later use of a worker's
    /// device fail with `cancelled` (each [`host_lost`](Self::host_lost)
    /// event carries it). The local host stays usable. Closing twice does
    /// nothing.
    pub fn close(&self) {
        for remote in self.0.remotes.iter().flatten() {
            remote.session.close();
        }
    }

    /// Ready, with `unavailable`, once host `index`'s worker is lost (see
    /// [`RemoteSession::lost`]); never ready for the local host.
    pub fn host_lost(&self, index: usize) -> Result<Event> {
        if index >= self.0.hosts.len() {
            return Err(Error::invalid_argument(format!(
                "host {index} is out of range ({} hosts)",
                self.0.hosts.len()
            )));
        }
        Ok(match self.remote(index) {
            Some(remote) => remote.session.lost().clone(),
            None => Event::new(),
        })
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

/// The devices of `plugin` on a host, with global ids `ids`; their own memory
/// spaces (a device's memory of kind `device` that no other device
/// addresses: it has the device's id, as a CPU device's does); and the memory
/// spaces they share (ids from `next_space`). A device's default memory comes
/// first among its spaces. `failed_precondition` for a device with no memory
/// of a kind this runtime models.
fn plugin_devices(
    plugin: &Arc<PjrtBackend>,
    ids: &[u32],
    mut next_space: u32,
    process_index: u32,
    host_index: usize,
    client_id: u64,
) -> Result<(Vec<Device>, Vec<MemorySpace>, Vec<MemorySpace>)> {
    let plugin_devices = plugin.client().devices();
    // Each of the plugin's memories, once, with the devices that address it.
    let mut memories: Vec<(colocated_pjrt::Memory, MemoryKind, Vec<u32>)> = Vec::new();
    for (device, &id) in plugin_devices.iter().zip(ids) {
        for m in device.memories() {
            let Some(kind) = memory_kind(m.kind()) else {
                continue;
            };
            match memories.iter_mut().find(|(x, _, _)| x.id() == m.id()) {
                Some((_, _, users)) => users.push(id),
                None => memories.push((m.clone(), kind, vec![id])),
            }
        }
    }
    let mut spaces: Vec<(i32, MemorySpace)> = Vec::new();
    let (mut owned, mut shared) = (Vec::new(), Vec::new());
    for (memory, kind, users) in &memories {
        let own = *kind == MemoryKind::Device && users.len() == 1;
        let space_id = if own {
            users[0]
        } else {
            next_space += 1;
            next_space - 1
        };
        let space = MemorySpace(Arc::new(MemorySpaceInner {
            id: space_id,
            kind: *kind,
            device_ids: users.clone(),
            client_id,
            host_index,
        }));
        if own {
            owned.push(space.clone());
        } else {
            shared.push(space.clone());
        }
        spaces.push((memory.id(), space));
    }
    let devices = plugin_devices
        .iter()
        .zip(ids)
        .map(|(device, &id)| -> Result<Device> {
            let default = device.default_memory().map(|m| m.id());
            let mut own: Vec<(u32, colocated_pjrt::Memory, MemorySpace)> = device
                .memories()
                .iter()
                .filter_map(|m| {
                    let space = spaces.iter().find(|(x, _)| *x == m.id())?.1.clone();
                    Some((space.id(), m.clone(), space))
                })
                .collect();
            if own.is_empty() {
                return Err(Error::failed_precondition(format!(
                    "PJRT device {} ({}) has no memory of kind device, pinned_host or \
                     unpinned_host",
                    device.id(),
                    device.kind()
                )));
            }
            // The default memory first.
            own.sort_by_key(|(_, m, _)| Some(m.id()) != default);
            let attributes = device
                .attributes()
                .iter()
                .filter_map(|(k, v)| attribute(v).map(|v| (k.clone(), v)))
                .collect();
            let pjrt = PjrtDevice::new(
                plugin.clone(),
                device.clone(),
                own.iter().map(|(s, m, _)| (*s, m.clone())).collect(),
            );
            Ok(Device(Arc::new(DeviceInner {
                id,
                platform: Arc::from(plugin.platform()),
                kind: Arc::from(device.kind()),
                backend: Arc::from(plugin.name()),
                pjrt: Some(Arc::new(pjrt)),
                process_index,
                host_index,
                local_hardware_id: u32::try_from(device.local_hardware_id()).unwrap_or(0),
                attributes,
                memory_spaces: own.into_iter().map(|(_, _, s)| s).collect(),
                client_id,
            })))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((devices, owned, shared))
}

/// A device attribute of a plugin's value (lists and floats are left out).
fn attribute(v: &colocated_pjrt::Value) -> Option<crate::device::AttributeValue> {
    use crate::device::AttributeValue;
    match v {
        colocated_pjrt::Value::String(s) => Some(AttributeValue::String(s.clone())),
        colocated_pjrt::Value::Int64(i) => Some(AttributeValue::Int(*i)),
        colocated_pjrt::Value::Bool(b) => Some(AttributeValue::Bool(*b)),
        colocated_pjrt::Value::Int64List(_) | colocated_pjrt::Value::Float(_) => None,
    }
}

/// The memory kind of a plugin memory's kind name; `None` for kinds this
/// runtime does not model.
fn memory_kind(name: &str) -> Option<MemoryKind> {
    match name {
        "device" => Some(MemoryKind::Device),
        "pinned_host" => Some(MemoryKind::PinnedHost),
        "unpinned_host" => Some(MemoryKind::UnpinnedHost),
        _ => None,
    }
}

/// A device of a host as the client is built: its id there, local hardware
/// id, platform, kind and backend.
/// A device of a host as the client learns it (the local host's CPU
/// devices, or a worker's devices from its `HostInfo`).
struct RemoteDevice {
    local_id: u32,
    hardware: u32,
    platform: Arc<str>,
    kind: Arc<str>,
    backend: Arc<str>,
    /// A plugin device's memories on its worker, as (id there, kind),
    /// default first; empty for CPU devices and from older workers.
    memories: Vec<(u32, MemoryKind)>,
}
