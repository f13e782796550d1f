//! Buffers from the wire, on a worker: specs checked against the worker's
//! client, buffers that own the bytes a transfer received, and the bytes a
//! buffer travels as.

use crate::buffer::{Buffer, HostBufferSemantics};
use crate::client::Client;
use crate::device::{Device, MemoryKind, MemorySpace};
use crate::dtype::{checked_byte_size, DType};
use crate::error::{Error, Result};
use crate::transport::buffers::recycle;
use crate::transport::encode_strings;
use crate::transport::proto::BufferSpec;

/// A buffer spec checked against a worker's client: its device, element type,
/// dimensions and size.
pub(crate) struct CheckedSpec {
    pub device: Device,
    /// The device's memory the buffer goes to.
    pub memory: MemorySpace,
    pub dtype: DType,
    pub dims: Vec<i64>,
    /// The byte size of a dense buffer; the number of elements of a string
    /// buffer (whose size on the wire shows only as its bytes arrive).
    pub size: usize,
}

/// Checks a spec from the wire: a device of this host, a known element type,
/// valid dimensions whose byte size (dense) fits in memory, a memory kind
/// the device addresses. Strings live in CPU memory only.
pub(crate) fn check_spec(client: &Client, spec: &BufferSpec) -> Result<CheckedSpec> {
    let device = client
        .devices()
        .iter()
        .find(|d| d.id() == spec.device)
        .cloned()
        .ok_or_else(|| {
            Error::invalid_argument(format!("this host has no device {}", spec.device))
        })?;
    let dtype = DType::from_u32(spec.dtype)?;
    if dtype == DType::String && !device.is_host_cpu() {
        return Err(Error::invalid_argument(
            "string buffers live in CPU memory only",
        ));
    }
    let memory = match spec.memory_kind {
        0 => device.default_memory_space().clone(),
        kind => {
            let kind = MemoryKind::from_u32(kind).ok_or_else(|| {
                Error::invalid_argument(format!("memory kind {kind} is none of 1, 2, 3"))
            })?;
            device.memory_space_by_kind(kind.name())?.clone()
        }
    };
    let size = checked_byte_size(dtype, &spec.dims)?;
    Ok(CheckedSpec {
        memory,
        device,
        dtype,
        dims: spec.dims.clone(),
        size,
    })
}

/// The checked spec of a request that carries bytes of fixed-size elements
/// only (`request`: its name, for the errors; `strings`: where string
/// buffers go instead): `invalid_argument` when it has no spec or a string
/// one.
pub(crate) fn check_fixed_size_spec(
    client: &Client,
    spec: Option<&BufferSpec>,
    request: &str,
    strings: &str,
) -> Result<CheckedSpec> {
    let spec =
        spec.ok_or_else(|| Error::invalid_argument(format!("a {request} without its spec")))?;
    let spec = check_spec(client, spec)?;
    if spec.dtype == DType::String {
        return Err(Error::invalid_argument(format!("string buffers {strings}")));
    }
    Ok(spec)
}

/// The bytes `buffer` travels as (GetBuffer, and what PutBuffer takes): its
/// row-major bytes, or a string buffer's elements as `StringElements`. Waits
/// until the buffer is ready.
pub(crate) fn wire_bytes(buffer: &Buffer) -> Result<Vec<u8>> {
    if buffer.dtype() != DType::String {
        return buffer.to_host_vec();
    }
    let storage = buffer.read_strings()?.wait()?;
    encode_strings(storage.strings()?)
}

/// A buffer on `spec.device` that owns `data` (no copy): the bytes are freed
/// (or kept for the next transfer of that size) when the buffer's last user
/// lets go of them.
pub(crate) fn buffer_owning(client: &Client, spec: &CheckedSpec, data: Vec<u8>) -> Result<Buffer> {
    if data.len() != spec.size {
        return Err(Error::invalid_argument(format!(
            "got {} bytes but the spec needs {}",
            data.len(),
            spec.size
        )));
    }
    let data = data.into_boxed_slice();
    // SAFETY: the boxed bytes do not move when the box does; the box is kept by
    // the "done with host buffer" callback, which runs once nothing reads them.
    let (buffer, done) = unsafe {
        Buffer::from_host_raw(
            client,
            data.as_ptr(),
            data.len(),
            spec.dtype,
            &spec.dims,
            &spec.device,
            Some(&spec.memory),
            HostBufferSemantics::ImmutableZeroCopy,
        )
    }?;
    done.when_ready(move |_| recycle(data));
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientOptions;
    use crate::error::ErrorCode;

    #[test]
    fn a_string_buffer_for_a_plugin_device_is_refused_from_the_wire() {
        // XLA's CPU plugin's devices are of kind "cpu" too, but not the
        // host's CPU devices: strings do not go there.
        let Some(plugin) = std::env::var_os("COLOCATED_TEST_PJRT_PLUGIN") else {
            return;
        };
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: Some(1),
            executor_threads: Some(1),
            pjrt: Some(crate::PjrtOptions {
                plugin: plugin.into(),
                options: vec![("cpu_device_count".into(), crate::PjrtValue::Int64(1))],
            }),
            ..Default::default()
        })
        .unwrap();
        let device = client.backend_devices(None).unwrap()[0].clone();
        assert_eq!(device.kind(), "cpu");
        let spec = BufferSpec {
            device: device.id(),
            dtype: DType::String as u32,
            dims: vec![2],
            memory_kind: 0,
        };
        let e = check_spec(&client, &spec).err().unwrap();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains("CPU memory only"), "{e}");
        // A spec's memory kind places the buffer in the plugin's memory of
        // that kind.
        let pinned = BufferSpec {
            dtype: DType::F32 as u32,
            memory_kind: MemoryKind::PinnedHost as u32,
            ..spec
        };
        let checked = check_spec(&client, &pinned).unwrap();
        let buffer = buffer_owning(&client, &checked, vec![1u8; 8]).unwrap();
        assert_eq!(buffer.memory_space().kind(), MemoryKind::PinnedHost);
        assert_eq!(
            buffer.memory_space(),
            device.memory_space_by_kind("pinned_host").unwrap()
        );
        assert_eq!(buffer.to_host_vec().unwrap(), vec![1u8; 8]);
    }

    #[test]
    fn specs_from_the_wire_are_checked() {
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: Some(2),
            executor_threads: Some(1),
            ..Default::default()
        })
        .unwrap();
        let spec = |device, dtype, dims: Vec<i64>| BufferSpec {
            device,
            dtype,
            dims,
            memory_kind: 0,
        };
        let ok = check_spec(&client, &spec(1, DType::F32 as u32, vec![2, 3])).unwrap();
        assert_eq!((ok.device.id(), ok.size), (1, 24));
        let strings = check_spec(&client, &spec(0, DType::String as u32, vec![2, 3])).unwrap();
        assert_eq!((strings.dtype, strings.size), (DType::String, 6));
        for (bad, code) in [
            (
                spec(2, DType::F32 as u32, vec![2]),
                ErrorCode::InvalidArgument,
            ),
            (spec(0, 99, vec![2]), ErrorCode::InvalidArgument),
            (
                spec(0, DType::F32 as u32, vec![-1]),
                ErrorCode::InvalidArgument,
            ),
            (
                spec(0, DType::F64 as u32, vec![i64::MAX, i64::MAX]),
                ErrorCode::InvalidArgument,
            ),
            (
                spec(0, DType::String as u32, vec![-1]),
                ErrorCode::InvalidArgument,
            ),
            // A memory kind the protocol does not name.
            (
                BufferSpec {
                    memory_kind: 4,
                    ..spec(0, DType::F32 as u32, vec![2])
                },
                ErrorCode::InvalidArgument,
            ),
        ] {
            assert_eq!(
                check_spec(&client, &bad).err().map(|e| e.code()),
                Some(code),
                "{bad:?}"
            );
        }
        let buffer = buffer_owning(&client, &ok, vec![7u8; 24]).unwrap();
        assert_eq!(buffer.to_host_vec().unwrap(), vec![7u8; 24]);
        assert_eq!(buffer.memory_space().kind(), MemoryKind::Device);
        assert!(buffer_owning(&client, &ok, vec![0u8; 23]).is_err());
        // Each kind a CPU device addresses.
        for kind in [MemoryKind::PinnedHost, MemoryKind::UnpinnedHost] {
            let spec = BufferSpec {
                memory_kind: kind as u32,
                ..spec(1, DType::F32 as u32, vec![2, 3])
            };
            let checked = check_spec(&client, &spec).unwrap();
            let buffer = buffer_owning(&client, &checked, vec![7u8; 24]).unwrap();
            assert_eq!(buffer.memory_space().kind(), kind);
        }
    }
}
