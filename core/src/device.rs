//! Devices, memory spaces and the device backend trait.

use std::fmt;
use std::sync::Arc;

/// The platform name every client reports.
pub const PLATFORM_NAME: &str = "colocated";

use crate::error::{Error, Result};

/// A device attribute value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    /// An integer attribute.
    Int(i64),
    /// A string attribute.
    String(String),
    /// A boolean attribute.
    Bool(bool),
}

/// What a kind of device provides. CPU devices are the only backend now; a CUDA
/// backend implements the same trait.
pub trait DeviceBackend: Send + Sync + 'static {
    /// The device kind (`"cpu"`).
    fn kind(&self) -> &'static str;
    /// Attributes of the device with this local hardware id.
    fn attributes(&self, local_hardware_id: usize) -> Vec<(String, AttributeValue)>;
}

/// The CPU backend: device memory is host memory.
pub struct CpuBackend;

impl DeviceBackend for CpuBackend {
    fn kind(&self) -> &'static str {
        "cpu"
    }

    fn attributes(&self, local_hardware_id: usize) -> Vec<(String, AttributeValue)> {
        vec![
            ("core_on_chip".to_string(), AttributeValue::Int(0)),
            (
                "local_hardware_id".to_string(),
                AttributeValue::Int(local_hardware_id as i64),
            ),
            (
                "vendor".to_string(),
                AttributeValue::String(std::env::consts::ARCH.to_string()),
            ),
            ("supports_strings".to_string(), AttributeValue::Bool(true)),
        ]
    }
}

/// The kind of a memory space. Values are part of the C ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MemoryKind {
    /// The device's own memory.
    Device = 1,
    /// Host memory pinned for fast transfers.
    PinnedHost = 2,
    /// Ordinary host memory.
    UnpinnedHost = 3,
}

impl MemoryKind {
    /// The PJRT name (`"device"`, `"pinned_host"`, `"unpinned_host"`).
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Device => "device",
            MemoryKind::PinnedHost => "pinned_host",
            MemoryKind::UnpinnedHost => "unpinned_host",
        }
    }

    /// The kind of PJRT name `name` (see [`name`](Self::name));
    /// `invalid_argument` for a name no kind has.
    pub fn from_name(name: &str) -> crate::error::Result<MemoryKind> {
        [
            MemoryKind::Device,
            MemoryKind::PinnedHost,
            MemoryKind::UnpinnedHost,
        ]
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| {
            crate::error::Error::invalid_argument(format!(
                "memory kind '{name}' is none of 'device', 'pinned_host', 'unpinned_host'"
            ))
        })
    }

    /// The kind of C ABI value `v` (as `MemoryKind as u32`), or `None` for a
    /// value no kind has.
    pub fn from_u32(v: u32) -> Option<MemoryKind> {
        match v {
            1 => Some(MemoryKind::Device),
            2 => Some(MemoryKind::PinnedHost),
            3 => Some(MemoryKind::UnpinnedHost),
            _ => None,
        }
    }
}

pub(crate) struct MemorySpaceInner {
    pub id: u32,
    pub kind: MemoryKind,
    pub device_ids: Vec<u32>,
    pub client_id: u64,
    pub host_index: usize,
}

/// A place where buffers live. Cheap to clone; identity is `(client, id)`.
#[derive(Clone)]
pub struct MemorySpace(pub(crate) Arc<MemorySpaceInner>);

impl MemorySpace {
    /// Client-unique id.
    pub fn id(&self) -> u32 {
        self.0.id
    }
    /// The kind of memory.
    pub fn kind(&self) -> MemoryKind {
        self.0.kind
    }
    /// Ids of the devices that can address this memory space.
    pub fn device_ids(&self) -> &[u32] {
        &self.0.device_ids
    }
    /// Index of the host that owns this memory (in `Client::hosts`).
    pub fn host_index(&self) -> usize {
        self.0.host_index
    }
    pub(crate) fn client_id(&self) -> u64 {
        self.0.client_id
    }
}

impl PartialEq for MemorySpace {
    fn eq(&self, other: &Self) -> bool {
        self.0.client_id == other.0.client_id && self.0.id == other.0.id
    }
}

impl fmt::Debug for MemorySpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MemorySpace(id={}, kind={})",
            self.0.id,
            self.0.kind.name()
        )
    }
}

pub(crate) struct DeviceInner {
    pub id: u32,
    /// The platform (`"cpu"` for this runtime's CPU devices; a PJRT plugin's
    /// platform, such as `"cuda"`, for its devices).
    pub platform: Arc<str>,
    pub kind: Arc<str>,
    /// `"cpu"` for this runtime's CPU devices; a PJRT plugin's backend name.
    pub backend: Arc<str>,
    /// The plugin device behind it, for a device of a PJRT plugin of this
    /// process.
    pub pjrt: Option<Arc<crate::backend::PjrtDevice>>,
    pub process_index: u32,
    pub host_index: usize,
    pub local_hardware_id: u32,
    pub attributes: Vec<(String, AttributeValue)>,
    pub memory_spaces: Vec<MemorySpace>,
    pub client_id: u64,
}

/// One device. Cheap to clone; identity is `(client, id)`.
#[derive(Clone)]
pub struct Device(pub(crate) Arc<DeviceInner>);

impl Device {
    /// Globally unique id within the client.
    pub fn id(&self) -> u32 {
        self.0.id
    }
    /// The device kind: `"cpu"` for this runtime's CPU devices; a PJRT
    /// plugin's name for its device (`"NVIDIA H100 80GB HBM3"`, `"cpu"`).
    pub fn kind(&self) -> &str {
        &self.0.kind
    }
    /// The platform: `"cpu"` for this runtime's CPU devices (where colocated
    /// Python, Node and native functions run); a PJRT plugin's platform for
    /// its devices (`"cuda"`, `"cpu"` for XLA's CPU plugin, ...).
    pub fn platform(&self) -> &str {
        &self.0.platform
    }
    /// The backend the device belongs to: `"cpu"` for this runtime's CPU
    /// devices; a PJRT plugin's backend name for its devices (see
    /// `Client::default_backend`).
    pub fn backend(&self) -> &str {
        &self.0.backend
    }
    /// True for this runtime's own CPU devices (not a plugin's): the devices
    /// colocated programs of Python, Node and native functions run on.
    pub fn is_host_cpu(&self) -> bool {
        &*self.0.backend == "cpu"
    }
    /// Process index of the host that owns the device.
    pub fn process_index(&self) -> u32 {
        self.0.process_index
    }
    /// Index of the owning host in `Client::hosts`.
    pub fn host_index(&self) -> usize {
        self.0.host_index
    }
    /// The device's index among its host's devices of the same kind.
    pub fn local_hardware_id(&self) -> u32 {
        self.0.local_hardware_id
    }
    /// Backend-defined attributes.
    pub fn attributes(&self) -> &[(String, AttributeValue)] {
        &self.0.attributes
    }
    /// Memory spaces this device can address; the first is the default.
    pub fn memory_spaces(&self) -> &[MemorySpace] {
        &self.0.memory_spaces
    }
    /// The memory space buffers go to unless told otherwise.
    pub fn default_memory_space(&self) -> &MemorySpace {
        &self.0.memory_spaces[0]
    }
    /// The kinds of the memory spaces this device can address, default first.
    pub fn memory_kinds(&self) -> Vec<MemoryKind> {
        self.0.memory_spaces.iter().map(MemorySpace::kind).collect()
    }
    /// The memory space of kind `name` (`"device"`, `"pinned_host"`,
    /// `"unpinned_host"`) that this device addresses; `invalid_argument`,
    /// naming the kinds it has (in JAX's words), for any other name.
    pub fn memory_space_by_kind(&self, name: &str) -> Result<&MemorySpace> {
        self.0
            .memory_spaces
            .iter()
            .find(|m| m.kind().name() == name)
            .ok_or_else(|| {
                let kinds: Vec<&str> = self.memory_kinds().iter().map(|k| k.name()).collect();
                Error::invalid_argument(format!(
                    "Could not find memory addressable by device {kind}. Device {kind} can address the \
                     following memory kinds: {}. Got memory kind: {name}",
                    kinds.join(", "),
                    kind = self.0.platform,
                ))
            })
    }
    /// Short form, as JAX prints it: `CpuDevice(id=3)`.
    pub fn to_string_short(&self) -> String {
        let mut kind = self.0.platform.to_string();
        if let Some(first) = kind.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        format!("{kind}Device(id={})", self.0.id)
    }
    /// Long form with placement: `cpu:3 (process 0, host 0, local 3)`.
    pub fn debug_string(&self) -> String {
        format!(
            "{}:{} (process {}, host {}, local {})",
            self.0.platform,
            self.0.id,
            self.0.process_index,
            self.0.host_index,
            self.0.local_hardware_id
        )
    }
    pub(crate) fn client_id(&self) -> u64 {
        self.0.client_id
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.0.client_id == other.0.client_id && self.0.id == other.0.id
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_short())
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_short())
    }
}
