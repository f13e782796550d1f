//! Loaded host callbacks (functions of this process that programs call while
//! they run) and the byte blobs the library hands over.

use std::ffi::c_void;

use colocated_core::{Error, LoadedHostCallback};

use crate::client::colocated_client;
use crate::error::colocated_error;
use crate::handle::{
    colocated_string_view, handle, put, put_box, read_versioned, slice, tagged, take, versioned,
};
use crate::native::{colocated_destructor, UserData};
use crate::{boundary, boundary_void};
/// Bytes the library hands over (a serialized executable, a host callback's
/// answer). Owned by the caller; destroy with `colocated_bytes_destroy`.
#[repr(C)]
pub struct colocated_bytes {
    tag: u64,
    bytes: Vec<u8>,
}

/// Where a host callback writes its answer; valid only during the callback.
#[repr(C)]
pub struct colocated_callback_result {
    tag: u64,
    bytes: Option<Vec<u8>>,
}

/// A host callback: a function of this process that programs call while they run.
/// Owned by the caller; the executables compiled with it (and their executions in
/// flight) hold their own references, and the destructor runs after the last.
#[repr(C)]
pub struct colocated_loaded_host_callback {
    tag: u64,
    pub(crate) callback: LoadedHostCallback,
}

impl colocated_bytes {
    pub(crate) fn make(bytes: Vec<u8>) -> colocated_bytes {
        colocated_bytes {
            tag: <colocated_bytes as crate::handle::Tagged>::TAG,
            bytes,
        }
    }
}

/// The bytes: `*data` is borrowed (valid until destroyed), `*size` long.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_bytes_data(
    bytes: *const colocated_bytes,
    data: *mut *const u8,
    size: *mut usize,
) -> *mut colocated_error {
    boundary(|| {
        let b = handle(bytes, "bytes")?;
        put(data, b.bytes.as_ptr(), "data")?;
        put(size, b.bytes.len(), "size")
    })
}

/// Frees bytes. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_bytes_destroy(bytes: *mut colocated_bytes) {
    boundary_void(|| drop(take(bytes)));
}

/// A host callback function: reads `input` (`input_size` bytes, borrowed for the
/// call), writes its answer with `colocated_callback_result_set`, and returns NULL or
/// an error it hands over. It may run on any thread, several at once.
pub type colocated_host_callback_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        input: *const u8,
        input_size: usize,
        result: *mut colocated_callback_result,
    ) -> *mut colocated_error,
>;

/// Sets a host callback's answer (copies `size` bytes). Setting again replaces it.
/// Thread-safety: the callback's thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_callback_result_set(
    result: *mut colocated_callback_result,
    data: *const u8,
    size: usize,
) -> *mut colocated_error {
    boundary(|| {
        handle(result.cast_const(), "result")?;
        let bytes = slice(data, size, "data")?.to_vec();
        // SAFETY: checked non-NULL and of this type above; the callback's caller
        // owns it exclusively for the duration of the call.
        (*result).bytes = Some(bytes);
        Ok(())
    })
}

/// Arguments of `colocated_client_make_loaded_host_callback`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_host_callback_args {
    /// Size of the caller's struct.
    pub struct_size: usize,
    /// The function (required).
    pub function: colocated_host_callback_fn,
    /// Passed to every call; must be usable from any thread.
    pub user_data: *mut c_void,
    /// Called exactly once with `user_data` after the last reference is gone (NULL:
    /// none).
    pub destructor: colocated_destructor,
    /// A name for messages and traces (may be empty).
    pub name: colocated_string_view,
}
versioned!(colocated_host_callback_args, required: function, fields: [struct_size, function, user_data, destructor, name]);

/// Makes a loaded host callback. `*out` is caller owned. On success the library
/// owns `user_data` (see `destructor`); on error the caller keeps it and the
/// destructor is not called. Errors: `invalid_argument` (NULL function, bad
/// struct or name, NULL `out`).
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_client_make_loaded_host_callback(
    client: *const colocated_client,
    args: *const colocated_host_callback_args,
    out: *mut *mut colocated_loaded_host_callback,
) -> *mut colocated_error {
    boundary(|| {
        handle(client, "client")?;
        let a = read_versioned(args, false)?;
        let name = a.name.to_str("name")?.to_string();
        let Some(function) = a.function else {
            return Err(Error::invalid_argument(
                "colocated_host_callback_args.function is NULL",
            ));
        };
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        // Every check is done: from here the library owns `user_data`.
        let data = UserData::new(a.user_data, a.destructor);
        let callback = LoadedHostCallback::new(name, move |input: &[u8]| {
            let data = &data;
            let tag = <colocated_callback_result as crate::handle::Tagged>::TAG;
            let mut result = colocated_callback_result { tag, bytes: None };
            // SAFETY: the caller's function contract; pointers valid for the call.
            let err = unsafe { function(data.ptr, input.as_ptr(), input.len(), &mut result) };
            // SAFETY: NULL or an error handed over.
            if let Some(e) = unsafe { colocated_error::take(err) } {
                return Err(e);
            }
            Ok(result.bytes.unwrap_or_default())
        });
        let tag = <colocated_loaded_host_callback as crate::handle::Tagged>::TAG;
        put_box(out, colocated_loaded_host_callback { tag, callback }, "out")
    })
}

/// Releases the caller's reference. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_loaded_host_callback_destroy(
    callback: *mut colocated_loaded_host_callback,
) {
    boundary_void(|| drop(take(callback)));
}

tagged! {
    colocated_bytes => 0xC010_CA7E_0000_0040,
    colocated_callback_result => 0xC010_CA7E_0000_0041,
    colocated_loaded_host_callback => 0xC010_CA7E_0000_0042,
}
