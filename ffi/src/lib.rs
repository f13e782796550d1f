//! `libcolocated`: the stable C ABI of colocated (`include/colocated.h`).
//!
//! Every function validates its arguments, calls `colocated-core`, and converts the
//! result; semantics live in core. Fallible functions return `colocated_error*`
//! (NULL on success) and write results through out-parameters. No panic crosses the
//! boundary: each export runs inside [`guard`], which turns a panic into an
//! `internal` error, or into the documented value of an export that returns no
//! error (`ffi/tests/boundary.rs` checks that every export does).

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod array;
mod buffer;
// cbindgen writes the header in the order of these modules: making a client,
// then the client, its host events, then its streams.
mod connect;

mod client;
mod host_events;
mod stream;

mod colocated;
mod hosted;

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
pub use host_events::*;
pub use hosted::*;
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
    guard(|| COLOCATED_API_VERSION)
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
    guard(|| RELEASE.as_ptr().cast())
}

use colocated_core::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The one panic boundary of the C ABI: runs an export's body and, when it
/// panics, returns [`OnPanic::on_panic`] instead of unwinding into C (which
/// would abort the caller's process).
pub(crate) fn guard<R: OnPanic>(body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => R::on_panic(&panic_message(&payload)),
    }
}

/// What an export returns when its body panicked: an `internal` error that
/// carries the panic's message, for the exports that return errors. The
/// others cannot say it, so the panic is printed to stderr and they return a
/// neutral value: nothing, zero, an empty NUL-terminated string (a string
/// view or a C string), or `COLOCATED_INTERNAL` for a code.
pub(crate) trait OnPanic {
    /// The value for a panic with `message`.
    fn on_panic(message: &str) -> Self;
}

/// Prints a panic that an export cannot return as an error.
fn print_panic(message: &str) {
    eprintln!("colocated: a panic was stopped at the C boundary: {message}");
}

impl OnPanic for *mut colocated_error {
    fn on_panic(message: &str) -> Self {
        colocated_error::into_raw(Error::internal(format!("colocated panicked: {message}")))
    }
}

impl OnPanic for () {
    fn on_panic(message: &str) -> Self {
        print_panic(message);
    }
}

impl OnPanic for u32 {
    fn on_panic(message: &str) -> Self {
        print_panic(message);
        0
    }
}

impl OnPanic for *const std::ffi::c_char {
    fn on_panic(message: &str) -> Self {
        print_panic(message);
        c"".as_ptr()
    }
}

impl OnPanic for colocated_string_view {
    fn on_panic(message: &str) -> Self {
        print_panic(message);
        colocated_string_view::empty()
    }
}

impl OnPanic for colocated_error_code {
    fn on_panic(message: &str) -> Self {
        print_panic(message);
        colocated_error_code::COLOCATED_INTERNAL
    }
}

/// Runs a fallible export's body: its `Result` in the C error convention (NULL
/// on success), a panic as an `internal` error.
pub(crate) fn boundary(body: impl FnOnce() -> Result<()>) -> *mut colocated_error {
    guard(|| match body() {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => colocated_error::into_raw(e),
    })
}

/// Runs an export that returns nothing (a destroy function): a panic is
/// logged and stops here.
pub(crate) fn boundary_void(body: impl FnOnce()) {
    guard(body)
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_each_return_types_documented_value() {
        let error = guard(|| -> *mut colocated_error { panic!("boom {}", 1) });
        // SAFETY: `guard` gave a fresh error, used once here.
        let error = unsafe { colocated_error::take(error) }.expect("an error");
        assert_eq!(error.code(), colocated_core::ErrorCode::Internal);
        assert_eq!(error.message(), "colocated panicked: boom 1");

        assert_eq!(guard(|| -> u32 { panic!("boom") }), 0);
        let text = guard(|| -> *const std::ffi::c_char { panic!("boom") });
        // SAFETY: `guard` gave a static NUL-terminated string.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(text) }, c"");
        let view = guard(|| -> colocated_string_view { panic!("boom") });
        assert_eq!(view.size, 0);
        assert_eq!(
            guard(|| -> colocated_error_code { panic!("boom") }),
            colocated_error_code::COLOCATED_INTERNAL
        );
        guard::<()>(|| panic!("boom"));
    }

    #[test]
    fn a_body_that_returns_gives_its_value() {
        assert_eq!(guard(|| 7u32), 7);
        assert!(boundary(|| Ok(())).is_null());
        let error = boundary(|| Err(Error::invalid_argument("bad")));
        // SAFETY: `boundary` gave a fresh error, used once here.
        let error = unsafe { colocated_error::take(error) }.expect("an error");
        assert_eq!(error.message(), "bad");
    }
}
