//! Clients and their topology (devices, memory spaces, hosts), streams, and the
//! registry of native functions with the execution context they see.

use std::ffi::CString;
use std::sync::Arc;
use std::time::Duration;

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::{
    AttributeValue, Client, ClientOptions, ClusterOptions, Device, Error, Result, Stream,
};

use crate::device::{
    colocated_attribute_type, colocated_device, colocated_device_attribute, colocated_host,
    colocated_memory_space,
};
use crate::error::colocated_error;
use crate::handle::{
    colocated_string_view, get, get_list, handle, put, put_box, read_versioned, slice, tagged,
    take, versioned,
};
use crate::{boundary, boundary_void};

/// Everything the C view of one client owns; shared by every handle made from it.
pub(crate) struct ClientShell {
    pub client: Client,
    platform_name: CString,
    platform_version: CString,
    default_backend: CString,
    devices: Vec<colocated_device>,
    device_ptrs: Vec<*const colocated_device>,
    memory_spaces: Vec<colocated_memory_space>,
    memory_ptrs: Vec<*const colocated_memory_space>,
    /// Owns the boxes `host_ptrs` points into.
    #[allow(dead_code)]
    hosts: Vec<colocated_host>,
    host_ptrs: Vec<*const colocated_host>,
}

// SAFETY: the raw pointers point into boxes owned by the same shell, which is
// immutable after construction.
unsafe impl Send for ClientShell {}
// SAFETY: as above.
unsafe impl Sync for ClientShell {}

impl ClientShell {
    pub(crate) fn new(client: Client) -> Arc<ClientShell> {
        let cstr = |s: &str| CString::new(s).unwrap_or_default();
        let mut memory_spaces: Vec<colocated_memory_space> = client
            .memory_spaces()
            .iter()
            .map(|m| colocated_memory_space {
                tag: <colocated_memory_space as crate::handle::Tagged>::TAG,
                memory: m.clone(),
                kind_name: cstr(m.kind().name()),
                devices: Vec::new(),
            })
            .collect();
        let devices: Vec<colocated_device> = client
            .devices()
            .iter()
            .map(|d| {
                let strings: Vec<CString> = d
                    .attributes()
                    .iter()
                    .flat_map(|(k, v)| {
                        let value = match v {
                            AttributeValue::String(s) => cstr(s),
                            _ => CString::default(),
                        };
                        [cstr(k), value]
                    })
                    .collect();
                let attributes = d
                    .attributes()
                    .iter()
                    .enumerate()
                    .map(|(i, (_, v))| {
                        let (type_, int_value, bool_value) = match v {
                            AttributeValue::Int(n) => {
                                (colocated_attribute_type::COLOCATED_ATTRIBUTE_INT, *n, false)
                            }
                            AttributeValue::String(_) => (
                                colocated_attribute_type::COLOCATED_ATTRIBUTE_STRING,
                                0,
                                false,
                            ),
                            AttributeValue::Bool(b) => {
                                (colocated_attribute_type::COLOCATED_ATTRIBUTE_BOOL, 0, *b)
                            }
                        };
                        colocated_device_attribute {
                            name: colocated_string_view::of_cstr(&strings[2 * i]),
                            type_,
                            int_value,
                            string_value: colocated_string_view::of_cstr(&strings[2 * i + 1]),
                            bool_value,
                        }
                    })
                    .collect();
                let memory = d
                    .memory_spaces()
                    .iter()
                    .filter_map(|m| memory_spaces.iter().find(|x| x.memory == *m))
                    .map(|b| b as *const colocated_memory_space)
                    .collect();
                colocated_device {
                    tag: <colocated_device as crate::handle::Tagged>::TAG,
                    device: d.clone(),
                    kind: cstr(d.kind()),
                    platform: cstr(d.platform()),
                    backend: cstr(d.backend()),
                    to_string: cstr(&d.to_string_short()),
                    debug_string: cstr(&d.debug_string()),
                    strings,
                    attributes,
                    memory_spaces: memory,
                }
            })
            .collect();
        let device_ptrs: Vec<*const colocated_device> =
            devices.iter().map(|d| d as *const _).collect();
        for m in &mut memory_spaces {
            m.devices = m
                .memory
                .device_ids()
                .iter()
                .filter_map(|id| devices.iter().position(|d| d.device.id() == *id))
                .map(|i| device_ptrs[i])
                .collect();
        }
        let memory_ptrs = memory_spaces.iter().map(|m| m as *const _).collect();
        let hosts: Vec<colocated_host> = client
            .hosts()
            .iter()
            .map(|h| colocated_host {
                tag: <colocated_host as crate::handle::Tagged>::TAG,
                index: h.index(),
                process_index: h.process_index(),
                name: cstr(h.name()),
                devices: h
                    .device_ids()
                    .iter()
                    .filter_map(|id| devices.iter().position(|d| d.device.id() == *id))
                    .map(|i| device_ptrs[i])
                    .collect(),
                remote: h.is_remote(),
            })
            .collect();
        let host_ptrs = hosts.iter().map(|h| h as *const _).collect();
        Arc::new(ClientShell {
            platform_name: cstr(client.platform_name()),
            platform_version: cstr(client.platform_version()),
            default_backend: cstr(client.default_backend()),
            client,
            devices,
            device_ptrs,
            memory_spaces,
            memory_ptrs,
            hosts,
            host_ptrs,
        })
    }

    /// The borrowed handle of `device` (of this client).
    pub fn device_handle(&self, device: &Device) -> *const colocated_device {
        self.devices
            .iter()
            .find(|d| d.device == *device)
            .map_or(std::ptr::null(), |d| d as *const _)
    }

    /// The borrowed handle of `memory`.
    pub fn memory_handle(
        &self,
        memory: &colocated_core::MemorySpace,
    ) -> *const colocated_memory_space {
        self.memory_spaces
            .iter()
            .find(|m| m.memory == *memory)
            .map_or(std::ptr::null(), |m| m as *const _)
    }
}

/// A client: the entry point. Every object made from it keeps what it needs alive,
/// so the client handle may be destroyed before them.
///
/// Thread-safety: every client function may be called from any thread.
#[repr(C)]
pub struct colocated_client {
    pub(crate) tag: u64,
    pub(crate) shell: Arc<ClientShell>,
}

impl colocated_client {
    pub(crate) fn new(shell: Arc<ClientShell>) -> colocated_client {
        colocated_client {
            tag: <colocated_client as crate::handle::Tagged>::TAG,
            shell,
        }
    }
}

/// An ordering domain for executions and transfers (see `colocated_execute_options`).
/// Owned by the caller; destroy with `colocated_stream_destroy`. Work already
/// submitted on it still runs.
#[repr(C)]
pub struct colocated_stream {
    tag: u64,
    pub(crate) stream: Stream,
}

tagged! {
    colocated_client => 0xC010_CA7E_0000_0001,
    colocated_stream => 0xC010_CA7E_0000_0005,
}

/// Options of `colocated_client_create_local`. Zero fields mean "default".
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_client_options {
    /// `sizeof` (or `COLOCATED_STRUCT_SIZE(colocated_client_options, F)` for the
    /// last field `F` the caller knows: `executor_threads` in API 1.0 and 1.1).
    pub struct_size: usize,
    /// CPU devices of the local host (0: the number of cores).
    pub num_cpu_devices: u32,
    /// Executor threads the local host keeps running (0: the number of cores, at
    /// least 2).
    pub executor_threads: u32,
    /// The most executor threads the local host runs at once (0: 256, and never
    /// fewer than `executor_threads`; at most 4096). While every thread is busy
    /// (a program blocked in I/O or waiting for another stream) and a stream has
    /// work, one more starts; those beyond `executor_threads` exit after 10 s
    /// idle. Since API 1.2.
    pub max_executor_threads: u32,
    /// Must be zero (room for a later field; keeps the struct free of padding).
    /// Since API 1.2.
    pub reserved: u32,
    /// A PJRT plugin whose devices join the CPU devices, as the default
    /// backend: the plugin library's path, or a name in
    /// `PJRT_NAMES_AND_LIBRARY_PATHS` (`name:path,...`). Empty: none. Borrowed
    /// for the call. Since API 1.5.
    pub pjrt_plugin: colocated_string_view,
    /// The plugin client's create options, `KEY=VALUE` each (an integer, a
    /// number, `true` or `false`, or text: `cpu_device_count=4`). Borrowed for
    /// the call. Since API 1.5.
    pub pjrt_options: *const colocated_string_view,
    /// Number of `pjrt_options`. Since API 1.5.
    pub num_pjrt_options: usize,
}
versioned!(colocated_client_options, required: struct_size, fields: [struct_size, num_cpu_devices, executor_threads, max_executor_threads, reserved, pjrt_plugin, pjrt_options, num_pjrt_options]);

/// `invalid_argument` unless a struct's `reserved` field is zero.
fn check_reserved(reserved: u32, what: &str) -> Result<()> {
    if reserved != 0 {
        return Err(Error::invalid_argument(format!(
            "{what}.reserved must be zero, got {reserved}"
        )));
    }
    Ok(())
}

/// The local host's core options from the C fields (0: default).
fn local_options(
    num_cpu_devices: u32,
    executor_threads: u32,
    max_executor_threads: u32,
) -> ClientOptions {
    let given = |n: u32| (n != 0).then_some(n as usize);
    ClientOptions {
        num_cpu_devices: given(num_cpu_devices),
        executor_threads: given(executor_threads),
        max_executor_threads: given(max_executor_threads),
        pjrt: None,
    }
}

/// Creates a client whose only host is this process, with CPU devices and,
/// when `options` names a PJRT plugin, that plugin's devices. `options` may be
/// NULL (defaults). On success `*out` is a new client the caller owns (destroy
/// with `colocated_client_destroy`).
///
/// Errors: `invalid_argument` for a bad options struct, out-of-range counts, a
/// malformed PJRT option, or a file that is not a PJRT plugin; `not_found` for a
/// missing plugin; `failed_precondition` for a plugin of an API version this
/// library does not accept; the plugin's own errors.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_create_local(
    options: *const colocated_client_options,
    out: *mut *mut colocated_client,
) -> *mut colocated_error {
    boundary(|| {
        let o = read_versioned(options, true)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        check_reserved(o.reserved, "colocated_client_options")?;
        let mut options = local_options(
            o.num_cpu_devices,
            o.executor_threads,
            o.max_executor_threads,
        );
        options.pjrt = pjrt_options(&o)?;
        let client = Client::new_local(options)?;
        put_box(out, colocated_client::new(ClientShell::new(client)), "out")
    })
}

/// Options of `colocated_client_connect`. Zero fields mean "default"; the fields
/// through `num_workers` are required.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_connect_options {
    /// `sizeof` (or `COLOCATED_STRUCT_SIZE(colocated_connect_options, F)` for the
    /// last field `F` the caller knows: `executor_threads` in API 1.1).
    pub struct_size: usize,
    /// The workers' addresses, `HOST:PORT` each (borrowed for the call); worker `i`
    /// becomes process `i + 1`.
    pub workers: *const colocated_string_view,
    /// Number of workers (0 with `include_local`: a client of this process only).
    pub num_workers: usize,
    /// The workers' token (empty: none, only for a worker started as insecure).
    pub token: colocated_string_view,
    /// CA certificate(s), PEM, that the workers' TLS certificates must chain to
    /// (copied). Empty: plain TCP.
    pub tls_ca: *const u8,
    /// Size of `tls_ca` in bytes.
    pub tls_ca_size: usize,
    /// The name the workers' certificates must carry (empty: the host part of
    /// each address). Used only with `tls_ca`.
    pub tls_domain: colocated_string_view,
    /// Bound, in milliseconds, of connecting to each worker and of each later
    /// request to it (0: 10 seconds).
    pub timeout_ms: u32,
    /// 1: this process is a host too (process 0, first in `colocated_client_hosts`);
    /// 0: only the workers are. Other values are `invalid_argument`.
    pub include_local: u32,
    /// CPU devices of the local host, when `include_local` (0: the number of cores).
    pub num_cpu_devices: u32,
    /// Executor threads this process keeps running (0: the number of cores, at
    /// least 2).
    pub executor_threads: u32,
    /// The most executor threads this process runs at once (0: 256), as in
    /// `colocated_client_options`. Since API 1.2.
    pub max_executor_threads: u32,
    /// Must be zero (room for a later field; keeps the struct free of padding).
    /// Since API 1.2.
    pub reserved: u32,
}
versioned!(colocated_connect_options, required: num_workers,
    fields: [struct_size, workers, num_workers, token, tls_ca, tls_ca_size, tls_domain, timeout_ms, include_local, num_cpu_devices, executor_threads, max_executor_threads, reserved]);

/// The core options of a caller's `colocated_connect_options`.
unsafe fn cluster_options(o: &colocated_connect_options) -> Result<ClusterOptions> {
    check_reserved(o.reserved, "colocated_connect_options")?;
    let include_local = match o.include_local {
        0 => false,
        1 => true,
        n => {
            return Err(Error::invalid_argument(format!(
                "include_local must be 0 or 1, got {n}"
            )))
        }
    };
    let token = match o.token.to_str("token")? {
        "" => None,
        text => Some(Token::new(text)?),
    };
    let tls_ca = slice(o.tls_ca, o.tls_ca_size, "tls_ca")?;
    let tls_ca = (!tls_ca.is_empty()).then(|| tls_ca.to_vec());
    let tls_domain = match o.tls_domain.to_str("tls_domain")? {
        "" => None,
        domain => Some(domain.to_string()),
    };
    let addresses = slice(o.workers, o.num_workers, "workers")?
        .iter()
        .enumerate()
        .map(|(i, address)| address.to_str(&format!("workers[{i}]")))
        .collect::<Result<Vec<_>>>()?;
    let mut connect = ConnectOptions::new("", token);
    if o.timeout_ms != 0 {
        connect.timeout = Duration::from_millis(u64::from(o.timeout_ms));
    }
    connect.tls_ca = tls_ca;
    connect.tls_domain = tls_domain;
    let local = local_options(
        o.num_cpu_devices,
        o.executor_threads,
        o.max_executor_threads,
    );
    Ok(ClusterOptions::uniform(
        addresses,
        &connect,
        include_local,
        local,
    ))
}

/// Creates a client of worker hosts (and of this process too, with
/// `include_local`): connects to every worker and opens a session on each.
/// Devices get global ids host after host. `options` is required and only read
/// during the call. On success `*out` is a new client the caller owns (destroy
/// with `colocated_client_destroy`; the sessions close, without blocking, once
/// every object made from the client is gone); on error `*out` is not written.
///
/// Blocking: connects to the workers at once, waiting up to `timeout_ms` for
/// each (a worker that refuses connections, still starting, is tried again
/// until then).
/// Errors: `invalid_argument` for a bad options struct, an address that does not
/// parse, a bad token, out-of-range counts or no host at all (no workers and
/// `include_local` 0); `unavailable` for a worker that cannot be reached (for
/// several failing workers, one error names each);
/// `unauthenticated` for a token a worker refuses; `failed_precondition` for a
/// worker that speaks no common protocol version or release, or has no devices;
/// `unimplemented` for a worker with devices this build cannot drive. Messages
/// about a worker name its address.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_connect(
    options: *const colocated_connect_options,
    out: *mut *mut colocated_client,
) -> *mut colocated_error {
    boundary(|| {
        let o = read_versioned(options, false)?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let client = Client::connect(&cluster_options(&o)?)?;
        put_box(out, colocated_client::new(ClientShell::new(client)), "out")
    })
}

/// Releases the caller's client handle. Objects made from the client stay usable;
/// when the last of them is gone, the runtime stops (executor threads end; sessions
/// on worker hosts are closed in the background). Accepts NULL.
///
/// Thread-safety: any thread, once per handle, with no other call using it.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_destroy(client: *mut colocated_client) {
    boundary_void(|| drop(take(client)));
}

/// The PJRT options of `o` (core's rules, as a worker's flags), or none.
unsafe fn pjrt_options(
    o: &colocated_client_options,
) -> Result<Option<colocated_core::PjrtOptions>> {
    let plugin = o.pjrt_plugin.to_str("pjrt_plugin")?;
    let options = crate::handle::slice(o.pjrt_options, o.num_pjrt_options, "pjrt_options")?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let text = s.to_str(&format!("pjrt_options[{i}]"))?;
            colocated_core::worker::parse_pjrt_option(text)
        })
        .collect::<Result<Vec<_>>>()?;
    colocated_core::PjrtOptions::of((!plugin.is_empty()).then_some(plugin), options)
}

/// The default backend's name: a PJRT plugin's (its platform, such as
/// `"cuda"`; `"pjrt_cpu"` for XLA's CPU plugin) when the client has one, else
/// `"cpu"`. Since API 1.5.
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_default_backend(
    handle_: *const colocated_client,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(handle_, "colocated_client")?;
        put(
            out,
            colocated_string_view::of_cstr(&c.shell.default_backend),
            "out",
        )
    })
}

/// The platform name (`"colocated"`).
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_platform_name(
    handle_: *const colocated_client,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(handle_, "colocated_client")?;
        put(
            out,
            colocated_string_view::of_cstr(&c.shell.platform_name),
            "out",
        )
    })
}
/// The runtime version (`"0.2.0"`).
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_platform_version(
    handle_: *const colocated_client,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(handle_, "colocated_client")?;
        put(
            out,
            colocated_string_view::of_cstr(&c.shell.platform_version),
            "out",
        )
    })
}
/// The controller's process index (0).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_process_index(
    handle_: *const colocated_client,
    out: *mut u32,
) -> *mut colocated_error {
    get(handle_, out, |c| c.shell.client.process_index())
}
/// Every device of every host, ordered by id.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_devices(
    handle_: *const colocated_client,
    items: *mut *const *const colocated_device,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |c| &c.shell.device_ptrs)
}
/// The devices this client can place data on and run programs on.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_addressable_devices(
    handle_: *const colocated_client,
    items: *mut *const *const colocated_device,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |c| &c.shell.device_ptrs)
}
/// Every memory space of every host.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_memory_spaces(
    handle_: *const colocated_client,
    items: *mut *const *const colocated_memory_space,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |c| &c.shell.memory_ptrs)
}
/// The hosts, in process-index order.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_hosts(
    handle_: *const colocated_client,
    items: *mut *const *const colocated_host,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |c| &c.shell.host_ptrs)
}

/// The device with global `id` (borrowed). Errors: `not_found`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_lookup_device(
    client: *const colocated_client,
    id: u32,
    out: *mut *const colocated_device,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let d = c.shell.client.lookup_device(id)?;
        put(out, c.shell.device_handle(&d), "out")
    })
}

/// Maps each of `devices` to the CPU device of the same host, in order (JAX's
/// `colocated_cpu_devices`). `out` is a caller array of `num_devices` entries that
/// receives borrowed handles. Errors: `invalid_argument` for a device of another
/// client.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_cpu_devices(
    client: *const colocated_client,
    devices: *const *const colocated_device,
    num_devices: usize,
    out: *mut *const colocated_device,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let devices = device_list(devices, num_devices)?;
        let mapped = c.shell.client.colocated_cpu_devices(&devices)?;
        if num_devices > 0 && out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        for (i, d) in mapped.iter().enumerate() {
            std::ptr::write(out.add(i), c.shell.device_handle(d));
        }
        Ok(())
    })
}

/// Reads a C array of device handles.
pub(crate) unsafe fn device_list(
    devices: *const *const colocated_device,
    n: usize,
) -> Result<Vec<Device>> {
    slice(devices, n, "devices")?
        .iter()
        .enumerate()
        .map(|(i, d)| handle(*d, &format!("devices[{i}]")).map(|d| d.device.clone()))
        .collect()
}

/// Creates a stream (an ordering domain) for `client`. The caller owns `*out`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_create_stream(
    client: *const colocated_client,
    out: *mut *mut colocated_stream,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let stream = c.shell.client.create_stream();
        let tag = <colocated_stream as crate::handle::Tagged>::TAG;
        put_box(out, colocated_stream { tag, stream }, "out")
    })
}

/// The stream's id (also its track id in traces).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_stream_id(
    handle_: *const colocated_stream,
    out: *mut u64,
) -> *mut colocated_error {
    get(handle_, out, |s| s.stream.id())
}

/// Destroys a stream handle; work already submitted on it still runs. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_stream_destroy(stream: *mut colocated_stream) {
    boundary_void(|| drop(take(stream)));
}
