//! Clients and their topology (devices, memory spaces, hosts), streams, and the
//! registry of native functions with the execution context they see.

use std::ffi::{c_void, CString};
use std::sync::{Arc, Weak};

use colocated_core::{
    AttributeValue, Client, ClientOptions, Device, Error, ExecutionContext, MemoryKind, Result,
    Stream,
};

use crate::buffer::colocated_buffer;
use crate::error::colocated_error;
use crate::executable::colocated_bytes;
use crate::handle::{
    colocated_string_view, get, get_list, get_str, handle, put, put_box, read_versioned, slice,
    tagged, take, versioned,
};
use crate::{boundary, boundary_void};

/// The type of a device attribute's value.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum colocated_attribute_type {
    /// `int_value` holds it.
    COLOCATED_ATTRIBUTE_INT = 1,
    /// `string_value` holds it.
    COLOCATED_ATTRIBUTE_STRING = 2,
    /// `bool_value` holds it.
    COLOCATED_ATTRIBUTE_BOOL = 3,
}

/// One device attribute (borrowed from the device).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_device_attribute {
    /// Attribute name.
    pub name: colocated_string_view,
    /// Which value field is meaningful.
    pub type_: colocated_attribute_type,
    /// Value when `type_` is INT.
    pub int_value: i64,
    /// Value when `type_` is STRING.
    pub string_value: colocated_string_view,
    /// Value when `type_` is BOOL.
    pub bool_value: bool,
}

/// Kinds of memory spaces.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum colocated_memory_kind {
    /// The device's own memory.
    COLOCATED_MEMORY_DEVICE = 1,
    /// Pinned host memory.
    COLOCATED_MEMORY_PINNED_HOST = 2,
    /// Ordinary host memory.
    COLOCATED_MEMORY_UNPINNED_HOST = 3,
}

/// A device (borrowed: owned by its client, valid while the client or any object
/// made from it lives).
#[repr(C)]
pub struct colocated_device {
    tag: u64,
    pub(crate) device: Device,
    kind: CString,
    to_string: CString,
    debug_string: CString,
    /// Owns the strings `attributes` points into.
    #[allow(dead_code)]
    strings: Vec<CString>,
    attributes: Vec<colocated_device_attribute>,
    memory_spaces: Vec<*const colocated_memory_space>,
}

/// A memory space (borrowed, like devices).
#[repr(C)]
pub struct colocated_memory_space {
    tag: u64,
    pub(crate) memory: colocated_core::MemorySpace,
    kind_name: CString,
    devices: Vec<*const colocated_device>,
}

/// A host: a process that owns devices (borrowed, like devices).
#[repr(C)]
pub struct colocated_host {
    tag: u64,
    index: usize,
    process_index: u32,
    name: CString,
    devices: Vec<*const colocated_device>,
}

/// Everything the C view of one client owns; shared by every handle made from it.
pub(crate) struct ClientShell {
    pub client: Client,
    platform_name: CString,
    platform_version: CString,
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
    fn new(client: Client) -> Arc<ClientShell> {
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
            })
            .collect();
        let host_ptrs = hosts.iter().map(|h| h as *const _).collect();
        Arc::new(ClientShell {
            platform_name: cstr(client.platform_name()),
            platform_version: cstr(client.platform_version()),
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
    tag: u64,
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
    colocated_device => 0xC010_CA7E_0000_0002,
    colocated_memory_space => 0xC010_CA7E_0000_0003,
    colocated_host => 0xC010_CA7E_0000_0004,
    colocated_stream => 0xC010_CA7E_0000_0005,
    colocated_execution_context => 0xC010_CA7E_0000_0006,
}

/// Options of `colocated_client_create_local`. Zero fields mean "default".
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_client_options {
    /// `COLOCATED_STRUCT_SIZE(colocated_client_options, executor_threads)` or `sizeof`.
    pub struct_size: usize,
    /// CPU devices of the local host (0: the number of cores).
    pub num_cpu_devices: u32,
    /// Executor threads of the local host (0: the number of cores, at least 2).
    pub executor_threads: u32,
}
versioned!(colocated_client_options, required: struct_size, fields: [struct_size, num_cpu_devices, executor_threads]);

/// Creates a client whose only host is this process, with CPU devices.
/// `options` may be NULL (defaults). On success `*out` is a new client the caller
/// owns (destroy with `colocated_client_destroy`).
///
/// Errors: `invalid_argument` for a bad options struct or out-of-range counts.
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
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: (o.num_cpu_devices != 0).then_some(o.num_cpu_devices as usize),
            executor_threads: (o.executor_threads != 0).then_some(o.executor_threads as usize),
        })?;
        put_box(out, colocated_client::new(ClientShell::new(client)), "out")
    })
}

/// Releases the caller's client handle. Objects made from the client stay usable;
/// the runtime (executor threads) stops when the last of them is gone. Accepts NULL.
///
/// Thread-safety: any thread, once per handle, with no other call using it.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_destroy(client: *mut colocated_client) {
    boundary_void(|| drop(take(client)));
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
/// The runtime version (`"0.1.0"`).
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

/// The device's global id.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_id(
    handle_: *const colocated_device,
    out: *mut u32,
) -> *mut colocated_error {
    get(handle_, out, |d| d.device.id())
}
/// The device kind (`"cpu"`).
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_kind(
    handle_: *const colocated_device,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |d| &d.kind)
}
/// The process index of the host that owns the device.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_process_index(
    handle_: *const colocated_device,
    out: *mut u32,
) -> *mut colocated_error {
    get(handle_, out, |d| d.device.process_index())
}
/// The device's index among its host's devices of its kind.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_local_hardware_id(
    handle_: *const colocated_device,
    out: *mut u32,
) -> *mut colocated_error {
    get(handle_, out, |d| d.device.local_hardware_id())
}
/// Short description, as JAX prints devices (`"CpuDevice(id=0)"`).
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_to_string(
    handle_: *const colocated_device,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |d| &d.to_string)
}
/// Long description with placement.
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_debug_string(
    handle_: *const colocated_device,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |d| &d.debug_string)
}
/// Memory spaces the device can address; the first is its default.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_memory_spaces(
    handle_: *const colocated_device,
    items: *mut *const *const colocated_memory_space,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |d| &d.memory_spaces)
}
/// The device's default memory space (borrowed).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_default_memory_space(
    handle_: *const colocated_device,
    out: *mut *const colocated_memory_space,
) -> *mut colocated_error {
    get(handle_, out, |d| d.memory_spaces[0])
}

/// The device's attributes: `*attributes` is a borrowed array of `*count` entries.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_attributes(
    device: *const colocated_device,
    attributes: *mut *const colocated_device_attribute,
    count: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let d = handle(device, "device")?;
        put(attributes, d.attributes.as_ptr(), "attributes")?;
        put(count, d.attributes.len(), "count")
    })
}

/// The memory space's id (unique within the client).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_memory_space_id(
    handle_: *const colocated_memory_space,
    out: *mut u32,
) -> *mut colocated_error {
    get(handle_, out, |m| m.memory.id())
}
/// The memory space's kind.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_memory_space_kind(
    handle_: *const colocated_memory_space,
    out: *mut colocated_memory_kind,
) -> *mut colocated_error {
    boundary(|| {
        let m = handle(handle_, "colocated_memory_space")?;
        put(
            out,
            match m.memory.kind() {
                MemoryKind::Device => colocated_memory_kind::COLOCATED_MEMORY_DEVICE,
                MemoryKind::PinnedHost => colocated_memory_kind::COLOCATED_MEMORY_PINNED_HOST,
                MemoryKind::UnpinnedHost => colocated_memory_kind::COLOCATED_MEMORY_UNPINNED_HOST,
            },
            "out",
        )
    })
}
/// The kind's name (`"device"`, `"pinned_host"`, `"unpinned_host"`).
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_memory_space_kind_name(
    handle_: *const colocated_memory_space,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |m| &m.kind_name)
}
/// The devices that can address this memory space.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_memory_space_devices(
    handle_: *const colocated_memory_space,
    items: *mut *const *const colocated_device,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |m| &m.devices)
}

/// The host's index in `colocated_client_hosts`.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_host_index(
    handle_: *const colocated_host,
    out: *mut usize,
) -> *mut colocated_error {
    get(handle_, out, |h| h.index)
}
/// The process index the host's devices report.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_host_process_index(
    handle_: *const colocated_host,
    out: *mut u32,
) -> *mut colocated_error {
    get(handle_, out, |h| h.process_index)
}
/// The host's name (`"local"` or a worker's address).
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_host_name(
    handle_: *const colocated_host,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |h| &h.name)
}
/// The devices the host owns.
///
/// `*items` is a borrowed array of `*count` borrowed handles.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_host_devices(
    handle_: *const colocated_host,
    items: *mut *const *const colocated_device,
    count: *mut usize,
) -> *mut colocated_error {
    get_list(handle_, items, count, |h| &h.devices)
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

/// A native function. It runs on an executor thread of the host (possibly several
/// at once, for different streams): it reads its host's input shards (`inputs`,
/// `num_inputs` borrowed buffers, argument-major), sets every output shard with
/// `colocated_execution_context_set_output`, and returns NULL, or an error it owns
/// no longer (the runtime takes it). `context` and the input handles are valid only
/// during the call.
pub type colocated_native_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        context: *mut colocated_execution_context,
        inputs: *const *const colocated_buffer,
        num_inputs: usize,
    ) -> *mut colocated_error,
>;

/// Destructor of user data, called exactly once.
pub type colocated_destructor = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// Arguments of `colocated_client_register_native_function`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_native_function_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The name programs use (`payload` of a `native` program). Copied.
    pub name: colocated_string_view,
    /// The function (required).
    pub function: colocated_native_fn,
    /// Passed to every call.
    pub user_data: *mut c_void,
    /// Called once with `user_data` when the client is gone (may be NULL).
    pub destructor: colocated_destructor,
}
versioned!(colocated_native_function_args, required: function, fields: [struct_size, name, function, user_data, destructor]);

/// Owns user data and runs its destructor exactly once — unless disarmed because
/// the call that was to take ownership failed (the caller still owns it then).
pub(crate) struct UserData {
    pub ptr: *mut c_void,
    pub destructor: colocated_destructor,
    armed: std::sync::atomic::AtomicBool,
}

impl UserData {
    pub fn new(ptr: *mut c_void, destructor: colocated_destructor) -> UserData {
        UserData {
            ptr,
            destructor,
            armed: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// The registration failed: ownership stays with the caller.
    pub fn disarm(&self) {
        self.armed.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
// SAFETY: the C contract of every registration says user data is used from any
// thread (documented on each registering function).
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}
impl Drop for UserData {
    fn drop(&mut self) {
        if !self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(d) = self.destructor {
            // SAFETY: the caller gave this destructor for this pointer.
            unsafe { d(self.ptr) };
        }
    }
}

/// Adds a native function to the local host's registry. `user_data` must be
/// usable from any thread; on success the library owns it and `destructor` runs
/// once when the client and everything made from it are gone. On error the
/// caller keeps ownership (the destructor is not called). Errors:
/// `invalid_argument` (no function, bad name), `already_exists`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_register_native_function(
    client: *const colocated_client,
    args: *const colocated_native_function_args,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(client, "client")?;
        let a = read_versioned(args, false)?;
        let name = a.name.to_str("name")?.to_string();
        let Some(function) = a.function else {
            return Err(Error::invalid_argument(
                "colocated_native_function_args.function is NULL",
            ));
        };
        let data = Arc::new(UserData::new(a.user_data, a.destructor));
        let captured = data.clone();
        let shell = Arc::downgrade(&c.shell);
        let registered = c.shell.client.register_native_function(&name, move |ctx| {
            call_native(function, &captured, &shell, ctx)
        });
        if registered.is_err() {
            data.disarm();
        }
        registered
    })
}

fn call_native(
    function: unsafe extern "C" fn(
        *mut c_void,
        *mut colocated_execution_context,
        *const *const colocated_buffer,
        usize,
    ) -> *mut colocated_error,
    data: &UserData,
    shell: &Weak<ClientShell>,
    ctx: &mut ExecutionContext<'_>,
) -> Result<()> {
    let shell = shell
        .upgrade()
        .ok_or_else(|| Error::cancelled("the client is gone"))?;
    let client = colocated_client::new(shell.clone());
    let inputs: Vec<colocated_buffer> = ctx
        .inputs()
        .iter()
        .map(|b| colocated_buffer::new(b.clone(), shell.clone()))
        .collect();
    let input_ptrs: Vec<*const colocated_buffer> = inputs.iter().map(|b| b as *const _).collect();
    let output_devices = ctx
        .output_shards()
        .iter()
        .map(|s| shell.device_handle(&s.device))
        .collect();
    let mut c_ctx = colocated_execution_context {
        tag: <colocated_execution_context as crate::handle::Tagged>::TAG,
        ctx: (ctx as *mut ExecutionContext<'_>).cast(),
        client: &client,
        output_devices,
    };
    // SAFETY: the C function's contract; every pointer passed is valid during the
    // call.
    let err = unsafe { function(data.ptr, &mut c_ctx, input_ptrs.as_ptr(), input_ptrs.len()) };
    // SAFETY: the function returns NULL or an error it hands over.
    match unsafe { colocated_error::take(err) } {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What a running native function sees; valid only during the call.
#[repr(C)]
pub struct colocated_execution_context {
    tag: u64,
    ctx: *mut c_void,
    client: *const colocated_client,
    output_devices: Vec<*const colocated_device>,
}

impl colocated_execution_context {
    fn core(&self) -> &ExecutionContext<'static> {
        // SAFETY: `ctx` points to the ExecutionContext of the running call, which
        // outlives this struct (created and dropped inside `call_native`).
        unsafe { &*self.ctx.cast::<ExecutionContext<'static>>() }
    }

    fn core_mut(&mut self) -> &mut ExecutionContext<'static> {
        // SAFETY: as in `core`; `&mut self` makes the access exclusive.
        unsafe { &mut *self.ctx.cast::<ExecutionContext<'static>>() }
    }
}

/// The client (borrowed, valid during the call) — to create output buffers.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_client(
    handle_: *const colocated_execution_context,
    out: *mut *const colocated_client,
) -> *mut colocated_error {
    get(handle_, out, |c| c.client)
}
/// How many output shards the function must set.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_num_outputs(
    handle_: *const colocated_execution_context,
    out: *mut usize,
) -> *mut colocated_error {
    get(handle_, out, |c| c.core().output_shards().len())
}

/// For each argument, how many of the function's `inputs` belong to it
/// (`*counts` is borrowed, `*num_args` entries).
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_input_shard_counts(
    context: *const colocated_execution_context,
    counts: *mut *const usize,
    num_args: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let list = c.core().input_shard_counts();
        put(counts, list.as_ptr(), "counts")?;
        put(num_args, list.len(), "num_args")
    })
}

/// Describes output shard `index`: its dtype, dims (borrowed), and device
/// (borrowed). Any out-parameter may be NULL. Errors: `invalid_argument` for an
/// index out of range.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_output_spec(
    context: *const colocated_execution_context,
    index: usize,
    dtype: *mut crate::buffer::colocated_dtype,
    dims: *mut *const i64,
    num_dims: *mut usize,
    device: *mut *const colocated_device,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let shards = c.core().output_shards();
        let s = shards.get(index).ok_or_else(|| {
            Error::invalid_argument(format!(
                "output shard {index} is out of range ({} shards)",
                shards.len()
            ))
        })?;
        if !dtype.is_null() {
            *dtype = crate::buffer::colocated_dtype::from_core(s.dtype);
        }
        if !dims.is_null() {
            *dims = s.dims.as_ptr();
        }
        if !num_dims.is_null() {
            *num_dims = s.dims.len();
        }
        if !device.is_null() {
            *device = c.output_devices[index];
        }
        Ok(())
    })
}

/// Sets output shard `index` to `buffer`. The runtime takes its own reference;
/// the caller still destroys its handle. Errors: `invalid_argument` for an index
/// out of range, a shard already set, or a buffer whose dtype, dims or device
/// differ from `colocated_execution_context_output_spec`.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_set_output(
    context: *mut colocated_execution_context,
    index: usize,
    buffer: *const colocated_buffer,
) -> *mut colocated_error {
    boundary(|| {
        handle(context, "context")?;
        let b = handle(buffer, "buffer")?;
        // SAFETY: checked non-NULL and of the right type just above.
        let c = unsafe { &mut *context };
        c.core_mut().set_output(index, b.buffer.clone())
    })
}

/// Calls host callback `index` (of the executable's compile options) with `input`
/// and returns its answer in `*out` (owned by the caller; destroy with
/// `colocated_bytes_destroy`). Errors: `invalid_argument` for an index out of
/// range; whatever the callback returned.
/// Thread-safety: the calling native function's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_execution_context_call_host_callback(
    context: *const colocated_execution_context,
    index: usize,
    input: *const u8,
    input_size: usize,
    out: *mut *mut colocated_bytes,
) -> *mut colocated_error {
    boundary(|| {
        let c = handle(context, "context")?;
        let input = slice(input, input_size, "input")?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let answer = c.core().call_host_callback(index, input)?;
        put_box(out, colocated_bytes::make(answer), "out")
    })
}
