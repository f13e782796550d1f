//! Events: futures of the C API.

use std::ffi::c_void;
use std::time::Duration;

use colocated_core::{Error, Event};

use crate::error::{colocated_error, colocated_error_code};
use crate::handle::{get, handle, put, put_box, tagged, take};
use crate::{boundary, boundary_void};

/// An event handle: ready once, with success or an error. Owned by the caller;
/// destroy with `colocated_event_destroy` (the event itself lives on while the
/// runtime needs it).
///
/// Thread-safety: every event function may be called from any thread.
#[repr(C)]
pub struct colocated_event {
    tag: u64,
    pub(crate) event: Event,
}

tagged! { colocated_event => 0xC010_CA7E_0000_0020 }

impl colocated_event {
    pub(crate) fn make(event: Event) -> colocated_event {
        colocated_event {
            tag: <colocated_event as crate::handle::Tagged>::TAG,
            event,
        }
    }

    pub(crate) fn new_raw(event: Event) -> *mut colocated_event {
        Box::into_raw(Box::new(colocated_event::make(event)))
    }
}

/// Called once when an event is ready. `error` is NULL on success, else an error
/// the callback owns (destroy it). Runs on the thread that completes the event
/// (or on another thread of the runtime when that one is itself waiting for an
/// event), or at once on the registering thread if it is already ready; it must
/// not block for long.
pub type colocated_event_callback =
    Option<unsafe extern "C" fn(error: *mut colocated_error, user_data: *mut c_void)>;

/// Creates an event that the caller fulfils with `colocated_event_set`.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_event_create(
    out: *mut *mut colocated_event,
) -> *mut colocated_error {
    boundary(|| put_box(out, colocated_event::make(Event::new()), "out"))
}

/// Fulfils an event: success when `code` is `COLOCATED_OK`, else an error with
/// `code` and `message` (`message_size` bytes, copied). Errors: `invalid_argument`
/// for an unknown code, `failed_precondition` if the event was already set.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_event_set(
    event: *const colocated_event,
    code: u32,
    message: *const u8,
    message_size: usize,
) -> *mut colocated_error {
    boundary(|| {
        let e = handle(event, "event")?;
        let result = if code == colocated_error_code::COLOCATED_OK as u32 {
            Ok(())
        } else {
            let code = colocated_error_code::to_core(code)
                .ok_or_else(|| Error::invalid_argument(format!("{code} is not an error code")))?;
            let text = crate::handle::slice(message, message_size, "message")?;
            Err(Error::new(code, String::from_utf8_lossy(text)))
        };
        e.event.set(result)
    })
}

/// Whether the event is ready.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_event_is_ready(
    handle_: *const colocated_event,
    out: *mut bool,
) -> *mut colocated_error {
    get(handle_, out, |e| e.event.is_ready())
}

/// Blocks until the event is ready; returns NULL on success or a new error (the
/// event's).
/// Thread-safety: any thread; blocks (it may run the not-yet-started work that
/// fulfils the event on this thread, in program order).
#[no_mangle]
pub unsafe extern "C" fn colocated_event_await(
    event: *const colocated_event,
) -> *mut colocated_error {
    boundary(|| handle(event, "event")?.event.wait())
}

/// Like `colocated_event_await` but gives up after `timeout_ns` nanoseconds with
/// `deadline_exceeded` (the event is unaffected).
/// Thread-safety: any thread; blocks at most `timeout_ns`.
#[no_mangle]
pub unsafe extern "C" fn colocated_event_await_timeout(
    event: *const colocated_event,
    timeout_ns: u64,
) -> *mut colocated_error {
    boundary(|| {
        handle(event, "event")?
            .event
            .wait_timeout(Duration::from_nanos(timeout_ns))
    })
}

/// The outcome of a ready event: `*out` is NULL on success or a new error. Errors:
/// `failed_precondition` if the event is not ready yet.
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_event_error(
    event: *const colocated_event,
    out: *mut *mut colocated_error,
) -> *mut colocated_error {
    boundary(|| {
        let e = handle(event, "event")?;
        if out.is_null() {
            return Err(Error::invalid_argument("out-parameter out is NULL"));
        }
        let status = e
            .event
            .status()
            .ok_or_else(|| Error::failed_precondition("the event is not ready"))?;
        put(
            out,
            status
                .err()
                .map_or(std::ptr::null_mut(), colocated_error::into_raw),
            "out",
        )
    })
}

struct CallbackData(*mut c_void);
// SAFETY: the contract of `colocated_event_on_ready` says the callback and its user
// data may be used from whichever thread completes the event.
unsafe impl Send for CallbackData {}

/// Registers `callback(error, user_data)` to run exactly once when the event is
/// ready (at once, on this thread, if it already is). Errors: `invalid_argument`
/// for a NULL callback.
/// Thread-safety: any thread; the callback may run on any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_event_on_ready(
    event: *const colocated_event,
    callback: colocated_event_callback,
    user_data: *mut c_void,
) -> *mut colocated_error {
    boundary(|| {
        let e = handle(event, "event")?;
        let callback = callback.ok_or_else(|| Error::invalid_argument("callback is NULL"))?;
        let data = CallbackData(user_data);
        e.event.on_ready(move |status| {
            let data = data;
            let error = status
                .err()
                .map_or(std::ptr::null_mut(), colocated_error::into_raw);
            // SAFETY: the caller's callback contract.
            unsafe { callback(error, data.0) };
        });
        Ok(())
    })
}

/// Releases the handle. Accepts NULL.
/// Thread-safety: any thread, once per handle.
#[no_mangle]
pub unsafe extern "C" fn colocated_event_destroy(event: *mut colocated_event) {
    boundary_void(|| drop(take(event)));
}
