//! A client of a plugin: its platform, devices and memories.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::plugin::{call, new_args, Plugin};
use crate::sys;
use crate::types::{self, Value};

/// A memory a device addresses (`device`, `pinned_host`, `unpinned_host`, ...).
/// Valid as long as its client.
#[derive(Clone, Debug)]
pub struct Memory {
    pub(crate) raw: *mut sys::PJRT_Memory,
    id: i32,
    kind: String,
}

/// An addressable device of a client. Valid as long as its client.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) raw: *mut sys::PJRT_Device,
    id: i32,
    local_hardware_id: i32,
    process_index: i32,
    kind: String,
    attributes: Vec<(String, Value)>,
    memories: Vec<Memory>,
    default_memory: Option<usize>,
}

// SAFETY: the handles are the plugin's, immutable and usable from any thread;
// the data beside them is plain.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}
// SAFETY: as above.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Memory {
    /// The plugin's id of the memory.
    pub fn id(&self) -> i32 {
        self.id
    }
    /// Its kind (`"device"`, `"pinned_host"`, `"unpinned_host"`).
    pub fn kind(&self) -> &str {
        &self.kind
    }
}

impl Device {
    /// The plugin's global device id.
    pub fn id(&self) -> i32 {
        self.id
    }
    /// The id of the device on its host (its ordinal).
    pub fn local_hardware_id(&self) -> i32 {
        self.local_hardware_id
    }
    /// The process the device belongs to (0 in a single-process client).
    pub fn process_index(&self) -> i32 {
        self.process_index
    }
    /// The device kind, as the plugin names it (`"cpu"`, `"NVIDIA H100 80GB HBM3"`).
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// The plugin's attributes of the device.
    pub fn attributes(&self) -> &[(String, Value)] {
        &self.attributes
    }
    /// The memories the device addresses.
    pub fn memories(&self) -> &[Memory] {
        &self.memories
    }
    /// The memory buffers go to by default.
    pub fn default_memory(&self) -> Option<&Memory> {
        self.default_memory.map(|i| &self.memories[i])
    }
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut sys::PJRT_Client,
    platform_name: String,
    platform_version: String,
    devices: Vec<Device>,
}

// SAFETY: PJRT clients are thread-safe; the rest is immutable.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut a = new_args!(
            PJRT_Client_Destroy_Args,
            PJRT_Client_Destroy_Args_STRUCT_SIZE
        );
        a.client = self.raw;
        // Nothing is left to do when the plugin fails to destroy its client.
        let _ = call!(self.plugin.api(), PJRT_Client_Destroy, &mut a);
    }
}

/// A client of a plugin. Cheap to clone; buffers and executables keep it alive.
#[derive(Clone)]
pub struct Client(pub(crate) Arc<ClientInner>);

impl Client {
    /// Creates a client with the plugin's create `options` (for XLA's CPU
    /// plugin `cpu_device_count`; for the CUDA plugin its allocator options).
    /// The plugin checks the options: one it does not know, or of the wrong
    /// type, is its error (`invalid_argument`).
    pub fn create(plugin: &Arc<Plugin>, options: &[(String, Value)]) -> Result<Client> {
        let named = types::to_named_values(options);
        let mut a = new_args!(PJRT_Client_Create_Args, PJRT_Client_Create_Args_STRUCT_SIZE);
        a.create_options = named.as_ptr();
        a.num_options = named.len();
        call!(plugin.api(), PJRT_Client_Create, &mut a)?;
        if a.client.is_null() {
            return Err(Error::internal("PJRT_Client_Create returned no client"));
        }
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw: a.client,
            platform_name: String::new(),
            platform_version: String::new(),
            devices: Vec::new(),
        };
        // From here on `inner` destroys the client if a query fails.
        let mut name = new_args!(
            PJRT_Client_PlatformName_Args,
            PJRT_Client_PlatformName_Args_STRUCT_SIZE
        );
        name.client = inner.raw;
        call!(plugin.api(), PJRT_Client_PlatformName, &mut name)?;
        // SAFETY: owned by the client, `platform_name_size` bytes.
        inner.platform_name =
            unsafe { types::string_of(name.platform_name, name.platform_name_size) };
        let mut version = new_args!(
            PJRT_Client_PlatformVersion_Args,
            PJRT_Client_PlatformVersion_Args_STRUCT_SIZE
        );
        version.client = inner.raw;
        if call!(plugin.api(), PJRT_Client_PlatformVersion, &mut version).is_ok() {
            // SAFETY: as above.
            inner.platform_version = unsafe {
                types::string_of(version.platform_version, version.platform_version_size)
            };
        }
        let mut devices = new_args!(
            PJRT_Client_AddressableDevices_Args,
            PJRT_Client_AddressableDevices_Args_STRUCT_SIZE
        );
        devices.client = inner.raw;
        call!(plugin.api(), PJRT_Client_AddressableDevices, &mut devices)?;
        let raw_devices = if devices.addressable_devices.is_null() {
            &[][..]
        } else {
            // SAFETY: the list lives as long as the client.
            unsafe {
                std::slice::from_raw_parts(
                    devices.addressable_devices,
                    devices.num_addressable_devices,
                )
            }
        };
        for &raw in raw_devices {
            let device = describe_device(plugin, raw)?;
            inner.devices.push(device);
        }
        Ok(Client(Arc::new(inner)))
    }

    /// The plugin this client runs on.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.0.plugin
    }
    /// The platform (`"cpu"`, `"cuda"`, `"tpu"`, ...).
    pub fn platform_name(&self) -> &str {
        &self.0.platform_name
    }
    /// The platform's version text (the CUDA version, ...; may be empty).
    pub fn platform_version(&self) -> &str {
        &self.0.platform_version
    }
    /// The devices this process addresses, in the plugin's order.
    pub fn devices(&self) -> &[Device] {
        &self.0.devices
    }
    /// The addressable device with the plugin's id `id`.
    pub fn device(&self, id: i32) -> Option<&Device> {
        self.0.devices.iter().find(|d| d.id == id)
    }
}

fn describe_device(plugin: &Arc<Plugin>, raw: *mut sys::PJRT_Device) -> Result<Device> {
    let api = plugin.api();
    let mut d = new_args!(
        PJRT_Device_GetDescription_Args,
        PJRT_Device_GetDescription_Args_STRUCT_SIZE
    );
    d.device = raw;
    call!(api, PJRT_Device_GetDescription, &mut d)?;
    let description = d.device_description;
    let mut id = new_args!(
        PJRT_DeviceDescription_Id_Args,
        PJRT_DeviceDescription_Id_Args_STRUCT_SIZE
    );
    id.device_description = description;
    call!(api, PJRT_DeviceDescription_Id, &mut id)?;
    let mut process = new_args!(
        PJRT_DeviceDescription_ProcessIndex_Args,
        PJRT_DeviceDescription_ProcessIndex_Args_STRUCT_SIZE
    );
    process.device_description = description;
    call!(api, PJRT_DeviceDescription_ProcessIndex, &mut process)?;
    let mut kind = new_args!(
        PJRT_DeviceDescription_Kind_Args,
        PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE
    );
    kind.device_description = description;
    call!(api, PJRT_DeviceDescription_Kind, &mut kind)?;
    let mut attributes = new_args!(
        PJRT_DeviceDescription_Attributes_Args,
        PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE
    );
    attributes.device_description = description;
    call!(api, PJRT_DeviceDescription_Attributes, &mut attributes)?;
    let mut hardware = new_args!(
        PJRT_Device_LocalHardwareId_Args,
        PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE
    );
    hardware.device = raw;
    call!(api, PJRT_Device_LocalHardwareId, &mut hardware)?;
    let mut memories = new_args!(
        PJRT_Device_AddressableMemories_Args,
        PJRT_Device_AddressableMemories_Args_STRUCT_SIZE
    );
    memories.device = raw;
    call!(api, PJRT_Device_AddressableMemories, &mut memories)?;
    let raw_memories = if memories.memories.is_null() {
        &[][..]
    } else {
        // SAFETY: the list lives as long as the device (the client).
        unsafe { std::slice::from_raw_parts(memories.memories, memories.num_memories) }
    };
    let mut described = Vec::with_capacity(raw_memories.len());
    for &m in raw_memories {
        described.push(describe_memory(plugin, m)?);
    }
    let mut default = new_args!(
        PJRT_Device_DefaultMemory_Args,
        PJRT_Device_DefaultMemory_Args_STRUCT_SIZE
    );
    default.device = raw;
    let default_memory = match call!(api, PJRT_Device_DefaultMemory, &mut default) {
        Ok(()) => described.iter().position(|m| m.raw == default.memory),
        Err(_) => None,
    };
    Ok(Device {
        raw,
        id: id.id,
        local_hardware_id: hardware.local_hardware_id,
        process_index: process.process_index,
        // SAFETY: owned by the description, `device_kind_size` bytes.
        kind: unsafe { types::string_of(kind.device_kind, kind.device_kind_size) },
        // SAFETY: the plugin returned `num_attributes` values owned by the description.
        attributes: unsafe {
            types::named_values(attributes.attributes, attributes.num_attributes)
        },
        memories: described,
        default_memory,
    })
}

fn describe_memory(plugin: &Arc<Plugin>, raw: *mut sys::PJRT_Memory) -> Result<Memory> {
    let api = plugin.api();
    let mut id = new_args!(PJRT_Memory_Id_Args, PJRT_Memory_Id_Args_STRUCT_SIZE);
    id.memory = raw;
    call!(api, PJRT_Memory_Id, &mut id)?;
    let mut kind = new_args!(PJRT_Memory_Kind_Args, PJRT_Memory_Kind_Args_STRUCT_SIZE);
    kind.memory = raw;
    call!(api, PJRT_Memory_Kind, &mut kind)?;
    Ok(Memory {
        raw,
        id: id.id,
        // SAFETY: owned by the memory, `kind_size` bytes.
        kind: unsafe { types::string_of(kind.kind, kind.kind_size) },
    })
}
