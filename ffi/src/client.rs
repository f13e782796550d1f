//! Clients and their topology (devices, memory spaces, hosts): the C view of a
//! client that every handle made from it shares, its getters and its destroy
//! function. Making a client is in `connect.rs`, its streams in `stream.rs`.

use std::ffi::CString;
use std::sync::Arc;

use colocated_core::{AttributeValue, Client, Device, Error, Result};

use crate::device::{
    colocated_attribute_type, colocated_device, colocated_device_attribute, colocated_host,
    colocated_memory_space,
};
use crate::error::colocated_error;
use crate::handle::{colocated_string_view, get, get_list, handle, put, slice, tagged, take};
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

tagged! {
    colocated_client => 0xC010_CA7E_0000_0001,
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
