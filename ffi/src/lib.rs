//! `libcolocated`: the stable C ABI of colocated (`include/colocated.h`).
//!
//! Every function validates its arguments, calls `colocated-core`, and converts the
//! result; semantics live in core. Fallible functions return `colocated_error*`
//! (NULL on success) and write results through out-parameters. No panic crosses the
//! boundary: each export runs inside [`boundary`], which turns a panic into an
//! `internal` error.

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod array;
mod buffer;
// cbindgen writes the header in the order of these modules: making a client,
// then the client, then its streams, as when they were one file.
mod connect;

mod client;
mod stream;

mod colocated;
mod device;
mod error;
mod event;
mod executable;
mod handle;
mod host_callback;
mod native;
mod plugin;

pub use array::*;
pub use buffer::*;
pub use client::*;
pub use colocated::*;
pub use connect::*;
pub use device::*;
pub use error::*;
pub use event::*;
pub use executable::*;
pub use handle::colocated_string_view;
pub use host_callback::*;
pub use native::*;
pub use plugin::*;
pub use stream::*;
// The plugin ABI and the API version are defined once, in `colocated-plugin`
// (cbindgen reads them there for `colocated.h`).
pub use colocated_plugin::{
    colocated_plugin_array, colocated_plugin_call, colocated_plugin_function,
    colocated_plugin_init_fn, colocated_plugin_registrar, COLOCATED_API_VERSION,
    COLOCATED_API_VERSION_MAJOR, COLOCATED_API_VERSION_MINOR,
};

/// The version of the library that is loaded, as `(major << 16) | minor`. A caller
/// built against header version `H` works with any library whose major equals
/// `H`'s and whose minor is at least `H`'s.
///
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn colocated_api_version() -> u32 {
    COLOCATED_API_VERSION
}

/// The release of the library that is loaded (`"0.2.0"`): a NUL-terminated
/// string the library owns, valid for the life of the process. The same
/// release a worker and a controller exchange when a session opens (they
/// refuse another major.minor). Needs no client. API 1.4.
///
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn colocated_version() -> *const std::ffi::c_char {
    const RELEASE: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    RELEASE.as_ptr().cast()
}

use colocated_core::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs an export's body, converting its `Result` and any panic into the C error
/// convention.
pub(crate) fn boundary(body: impl FnOnce() -> Result<()>) -> *mut colocated_error {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => colocated_error::into_raw(e),
        Err(payload) => colocated_error::into_raw(Error::internal(format!(
            "colocated panicked: {}",
            panic_message(&payload)
        ))),
    }
}

/// Like [`boundary`] for functions that return nothing (destroy functions): a
/// panic is logged and swallowed.
pub(crate) fn boundary_void(body: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(body)) {
        eprintln!(
            "colocated: a panic was stopped at the C boundary: {}",
            panic_message(&payload)
        );
    }
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
