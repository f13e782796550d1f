//! A PJRT plugin's devices as the client's: their ids, attributes and
//! memory spaces.

use std::sync::Arc;

use crate::backend::{PjrtBackend, PjrtDevice};
use crate::device::{Device, DeviceInner, MemoryKind, MemorySpace, MemorySpaceInner};
use crate::error::{Error, Result};

/// The devices of `plugin` on a host, with global ids `ids`; their own memory
/// spaces (a device's memory of kind `device` that no other device
/// addresses: it has the device's id, as a CPU device's does); and the memory
/// spaces they share (ids from `next_space`). A device's default memory comes
/// first among its spaces. `failed_precondition` for a device with no memory
/// of a kind this runtime models.
pub(super) fn plugin_devices(
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
