//! Devices, memory spaces and hosts: borrowed handles owned by their client.

use std::ffi::CString;

use colocated_core::{Device, MemoryKind};

use crate::boundary;
use crate::error::colocated_error;
use crate::handle::{colocated_string_view, get, get_list, get_str, handle, put, tagged};

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
    pub(crate) tag: u64,
    pub(crate) device: Device,
    pub(crate) kind: CString,
    pub(crate) platform: CString,
    pub(crate) backend: CString,
    pub(crate) to_string: CString,
    pub(crate) debug_string: CString,
    /// Owns the strings `attributes` points into.
    #[allow(dead_code)]
    pub(crate) strings: Vec<CString>,
    pub(crate) attributes: Vec<colocated_device_attribute>,
    pub(crate) memory_spaces: Vec<*const colocated_memory_space>,
}

/// A memory space (borrowed, like devices).
#[repr(C)]
pub struct colocated_memory_space {
    pub(crate) tag: u64,
    pub(crate) memory: colocated_core::MemorySpace,
    pub(crate) kind_name: CString,
    pub(crate) devices: Vec<*const colocated_device>,
}

/// A host: a process that owns devices (borrowed, like devices).
#[repr(C)]
pub struct colocated_host {
    pub(crate) tag: u64,
    pub(crate) index: usize,
    pub(crate) process_index: u32,
    pub(crate) name: CString,
    pub(crate) devices: Vec<*const colocated_device>,
    pub(crate) remote: bool,
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
/// The device's platform: `"cpu"` for CPU devices; a PJRT plugin's platform
/// (`"cuda"`, ...) for its devices. Since API 1.5.
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_platform(
    handle_: *const colocated_device,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |d| &d.platform)
}
/// The device's backend: `"cpu"` for the CPU devices colocated and native
/// programs run on; a PJRT plugin's backend name for its devices. Since API 1.5.
///
/// The string is borrowed from the object (NUL-terminated).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_device_backend(
    handle_: *const colocated_device,
    out: *mut colocated_string_view,
) -> *mut colocated_error {
    get_str(handle_, out, |d| &d.backend)
}
/// The device kind (`"cpu"`; a PJRT plugin's, such as `"NVIDIA H100 80GB HBM3"`).
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
impl colocated_memory_kind {
    /// The C value of `kind`.
    pub(crate) fn of(kind: MemoryKind) -> colocated_memory_kind {
        match kind {
            MemoryKind::Device => colocated_memory_kind::COLOCATED_MEMORY_DEVICE,
            MemoryKind::PinnedHost => colocated_memory_kind::COLOCATED_MEMORY_PINNED_HOST,
            MemoryKind::UnpinnedHost => colocated_memory_kind::COLOCATED_MEMORY_UNPINNED_HOST,
        }
    }
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
        put(out, colocated_memory_kind::of(m.memory.kind()), "out")
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
/// Whether the host is a worker reached over the network (`true`) rather than
/// this process (`false`, the host named `"local"`).
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_host_is_remote(
    handle_: *const colocated_host,
    out: *mut bool,
) -> *mut colocated_error {
    get(handle_, out, |h| h.remote)
}

tagged! {
    colocated_device => 0xC010_CA7E_0000_0002,
    colocated_memory_space => 0xC010_CA7E_0000_0003,
    colocated_host => 0xC010_CA7E_0000_0004,
}
