//! The device memory behind a DLPack capsule (`__dlpack__()` of another
//! library's array, JAX's among them), checked against the array it is to
//! become before any plugin sees its address.
//!
//! The structures are DLPack's stable C ABI (`dlpack.h`, the unversioned
//! `DLManagedTensor` of a capsule named `"dltensor"`). The capsule is read,
//! not consumed: its producer keeps the memory alive until the capsule is
//! destroyed, so whoever holds the capsule holds the memory.

use std::ffi::{c_void, CStr};

use colocated_core as core;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack's device types of the memory a PJRT plugin of this process can
/// view: CUDA and ROCm device memory.
const DEVICE_TYPES: [(i32, &str); 2] = [(2, "cuda"), (10, "rocm")];

/// DLPack's type code and width of `dtype`.
fn dl_type(dtype: core::DType) -> Option<(u8, u8)> {
    use core::DType as D;
    Some(match dtype {
        D::Bool => (6, 8),
        D::I8 => (0, 8),
        D::I16 => (0, 16),
        D::I32 => (0, 32),
        D::I64 => (0, 64),
        D::U8 => (1, 8),
        D::U16 => (1, 16),
        D::U32 => (1, 32),
        D::U64 => (1, 64),
        D::F16 => (2, 16),
        D::BF16 => (4, 16),
        D::F32 => (2, 32),
        D::F64 => (2, 64),
        D::String => return None,
    })
}

/// The device address of the data in `capsule`, checked to be a dense,
/// row-major `dtype` array of `dims` in device memory of `platform`'s
/// device with local hardware id `device_id`. The address stays valid while
/// `capsule` lives.
pub(crate) fn device_data(
    capsule: &Bound<'_, PyAny>,
    dtype: core::DType,
    dims: &[i64],
    platform: &str,
    device_id: i32,
) -> PyResult<*mut u8> {
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyValueError::new_err("expected a DLPack capsule"))?;
    let name: &CStr = c"dltensor";
    let ptr = capsule.pointer_checked(Some(name)).map_err(|_| {
        PyValueError::new_err("expected an unused DLPack capsule named \"dltensor\"")
    })?;
    // SAFETY: a live capsule named "dltensor" holds a DLManagedTensor (the
    // DLPack protocol), which lives as long as the capsule.
    let tensor = unsafe { &(*ptr.as_ptr().cast::<DLManagedTensor>()).dl_tensor };
    let bad = |what: String| PyValueError::new_err(format!("the DLPack tensor {what}"));
    match DEVICE_TYPES
        .iter()
        .find(|(t, _)| *t == tensor.device.device_type)
    {
        Some((_, p)) if *p == platform && tensor.device.device_id == device_id => {}
        _ => {
            return Err(bad(format!(
                "is in memory of DLPack device ({}, {}), not of {platform} device {device_id}",
                tensor.device.device_type, tensor.device.device_id
            )))
        }
    }
    if dl_type(dtype) != Some((tensor.dtype.code, tensor.dtype.bits)) || tensor.dtype.lanes != 1 {
        return Err(bad(format!(
            "has DLPack type (code {}, {} bits, {} lanes), not {}",
            tensor.dtype.code,
            tensor.dtype.bits,
            tensor.dtype.lanes,
            dtype.name()
        )));
    }
    let ndim =
        usize::try_from(tensor.ndim).map_err(|_| bad(format!("has rank {}", tensor.ndim)))?;
    if ndim != dims.len() || (ndim > 0 && tensor.shape.is_null()) {
        return Err(bad(format!("has rank {ndim}, not {}", dims.len())));
    }
    // SAFETY: `shape` (and `strides`, when not NULL) hold `ndim` values.
    let shape = if ndim == 0 {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }
    };
    if shape != dims {
        return Err(bad(format!("has shape {shape:?}, not {dims:?}")));
    }
    if !tensor.strides.is_null() && ndim > 0 {
        // SAFETY: as above.
        let strides = unsafe { std::slice::from_raw_parts(tensor.strides, ndim) };
        let mut expected = 1i64;
        for (&stride, &n) in strides.iter().zip(shape).rev() {
            if n > 1 && stride != expected {
                return Err(bad(format!("is not dense row-major (strides {strides:?})")));
            }
            expected = expected.saturating_mul(n);
        }
    }
    let offset = usize::try_from(tensor.byte_offset)
        .map_err(|_| bad("has an offset past the address space".into()))?;
    Ok(tensor.data.cast::<u8>().wrapping_add(offset))
}

/// What a capsule made by [`export`] owns: the tensor its consumer reads,
/// the shape it points to, and the pin that keeps the memory.
#[repr(C)]
struct Exported {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    pin: core::ExternalReference,
}

unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: `managed` is the first field of an `Exported` that
        // `export` leaked, handed back once (by the consumer, or by the
        // capsule's destructor when nobody consumed it). Releasing the pin
        // takes no Python object.
        drop(unsafe { Box::from_raw(managed.cast::<Exported>()) });
    }
}

unsafe extern "C" fn destroy_capsule(capsule: *mut pyo3::ffi::PyObject) {
    let name: &CStr = c"dltensor";
    // SAFETY: called by Python with the capsule, the GIL held. A capsule
    // still named "dltensor" was never consumed: its tensor is still ours.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, name.as_ptr()) == 1 {
            let managed = pyo3::ffi::PyCapsule_GetPointer(capsule, name.as_ptr());
            delete_exported(managed.cast());
        }
    }
}

/// A DLPack capsule (`"dltensor"`) of the device memory that `pin` pins: a
/// dense row-major `dtype` array of `dims` on `platform`'s device with
/// local hardware id `device_id`. The memory stays pinned until the
/// consumer deletes the tensor (or the capsule goes unconsumed).
pub(crate) fn export<'py>(
    py: Python<'py>,
    pin: core::ExternalReference,
    dtype: core::DType,
    dims: &[i64],
    platform: &str,
    device_id: i32,
) -> PyResult<Bound<'py, PyAny>> {
    let Some(&(device_type, _)) = DEVICE_TYPES.iter().find(|(_, p)| *p == platform) else {
        return Err(PyValueError::new_err(format!(
            "DLPack has no device type for {platform}"
        )));
    };
    let Some((code, bits)) = dl_type(dtype) else {
        return Err(PyValueError::new_err(format!(
            "DLPack has no type for {}",
            dtype.name()
        )));
    };
    let ndim = i32::try_from(dims.len()).map_err(|_| PyValueError::new_err("rank out of range"))?;
    let mut exported = Box::new(Exported {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: pin.data_ptr().cast(),
                device: DLDevice {
                    device_type,
                    device_id,
                },
                ndim,
                dtype: DLDataType {
                    code,
                    bits,
                    lanes: 1,
                },
                shape: std::ptr::null(),
                strides: std::ptr::null(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
        },
        shape: dims.to_vec(),
        pin,
    });
    exported.managed.dl_tensor.shape = exported.shape.as_ptr();
    let managed = Box::into_raw(exported).cast::<c_void>();
    let name: &'static CStr = c"dltensor";
    // SAFETY: `managed` points to a live `Exported` (a DLManagedTensor
    // first); `destroy_capsule` frees it unless a consumer took it.
    let raw = unsafe { pyo3::ffi::PyCapsule_New(managed, name.as_ptr(), Some(destroy_capsule)) };
    if raw.is_null() {
        // SAFETY: not handed to anyone.
        unsafe { delete_exported(managed.cast()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference, owned from here.
    Ok(unsafe { Bound::from_owned_ptr(py, raw) })
}
