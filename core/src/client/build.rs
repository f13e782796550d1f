//! Starting a client: a local one, or one connected to a cluster's workers,
//! and building its topology (hosts, devices, memory spaces) from the local
//! host's devices and each worker's.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use super::plugin::plugin_devices;
use super::{
    Client, ClientInner, ClientOptions, ClusterOptions, Host, LocalHost,
    DEFAULT_MAX_EXECUTOR_THREADS, NEXT_CLIENT_ID,
};
use crate::backend::PjrtBackend;
use crate::device::{
    CpuBackend, Device, DeviceBackend, DeviceInner, MemoryKind, MemorySpace, MemorySpaceInner,
};
use crate::dispatch::Dispatcher;
use crate::error::{Error, Result};
use crate::remote::{HostEvents, RemoteHost, RemoteSlot};
use crate::session::{ConnectOptions, RemoteSession};

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
        let attempts = RemoteSession::connect_all(&options.workers);
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
        // Each with how it was reached (every attempt succeeded, in order).
        let sessions = sessions
            .into_iter()
            .filter_map(Result::ok)
            .zip(options.workers.iter().cloned())
            .collect();
        Client::build(&options.local, options.include_local, sessions)
    }

    fn build(
        options: &ClientOptions,
        include_local: bool,
        sessions: Vec<(RemoteSession, ConnectOptions)>,
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
        type HostSpec = (
            u32,
            String,
            Vec<RemoteDevice>,
            Option<(RemoteSession, ConnectOptions)>,
        );
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
        for (i, (session, reached)) in sessions.into_iter().enumerate() {
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
            specs.push((i as u32 + 1, name, devices, Some((session, reached))));
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
        let events = HostEvents::new(specs.len());
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
            remotes.push(session.map(|(session, reached)| {
                let host = RemoteHost {
                    session,
                    local_ids: host_devices.iter().map(|d| d.local_id).collect(),
                    first_device: first,
                };
                RemoteSlot::new(host, host_index, events.clone(), reached)
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
            events,
        })))
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
