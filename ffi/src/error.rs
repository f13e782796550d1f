//! `colocated_error`: codes, messages, remote tracebacks.

use std::ffi::CString;

use colocated_core::{Error, ErrorCode};

use crate::handle::colocated_string_view;

/// Canonical error codes (the gRPC/absl set; values never change).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum colocated_error_code {
    /// Not an error (used by `colocated_event_set` to mean success).
    COLOCATED_OK = 0,
    /// The operation was cancelled.
    COLOCATED_CANCELLED = 1,
    /// An argument is invalid.
    COLOCATED_INVALID_ARGUMENT = 3,
    /// A deadline passed.
    COLOCATED_DEADLINE_EXCEEDED = 4,
    /// Something named does not exist.
    COLOCATED_NOT_FOUND = 5,
    /// Something to create already exists.
    COLOCATED_ALREADY_EXISTS = 6,
    /// The caller may not do this.
    COLOCATED_PERMISSION_DENIED = 7,
    /// Out of memory or quota.
    COLOCATED_RESOURCE_EXHAUSTED = 8,
    /// The object is not in the required state (e.g. a deleted buffer).
    COLOCATED_FAILED_PRECONDITION = 9,
    /// Not supported.
    COLOCATED_UNIMPLEMENTED = 12,
    /// A bug in the runtime.
    COLOCATED_INTERNAL = 13,
    /// A host or link is unavailable.
    COLOCATED_UNAVAILABLE = 14,
    /// Missing or wrong credentials.
    COLOCATED_UNAUTHENTICATED = 16,
}

impl colocated_error_code {
    pub(crate) fn from_core(code: ErrorCode) -> Self {
        use colocated_error_code::*;
        match code {
            ErrorCode::Cancelled => COLOCATED_CANCELLED,
            ErrorCode::InvalidArgument => COLOCATED_INVALID_ARGUMENT,
            ErrorCode::DeadlineExceeded => COLOCATED_DEADLINE_EXCEEDED,
            ErrorCode::NotFound => COLOCATED_NOT_FOUND,
            ErrorCode::AlreadyExists => COLOCATED_ALREADY_EXISTS,
            ErrorCode::PermissionDenied => COLOCATED_PERMISSION_DENIED,
            ErrorCode::ResourceExhausted => COLOCATED_RESOURCE_EXHAUSTED,
            ErrorCode::FailedPrecondition => COLOCATED_FAILED_PRECONDITION,
            ErrorCode::Unimplemented => COLOCATED_UNIMPLEMENTED,
            ErrorCode::Internal => COLOCATED_INTERNAL,
            ErrorCode::Unavailable => COLOCATED_UNAVAILABLE,
            ErrorCode::Unauthenticated => COLOCATED_UNAUTHENTICATED,
        }
    }

    /// The core code of a raw value from C; `None` for OK and for unknown values.
    pub(crate) fn to_core(raw: u32) -> Option<ErrorCode> {
        Some(match raw {
            1 => ErrorCode::Cancelled,
            3 => ErrorCode::InvalidArgument,
            4 => ErrorCode::DeadlineExceeded,
            5 => ErrorCode::NotFound,
            6 => ErrorCode::AlreadyExists,
            7 => ErrorCode::PermissionDenied,
            8 => ErrorCode::ResourceExhausted,
            9 => ErrorCode::FailedPrecondition,
            12 => ErrorCode::Unimplemented,
            13 => ErrorCode::Internal,
            14 => ErrorCode::Unavailable,
            16 => ErrorCode::Unauthenticated,
            _ => return None,
        })
    }
}

/// An error: a code, a message, and (for user code that failed on a host) the
/// traceback it left. Owned by whoever received it; free with
/// `colocated_error_destroy`.
pub struct colocated_error {
    pub(crate) error: Error,
    message: CString,
    traceback: Option<CString>,
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

impl colocated_error {
    /// The C view of `error`, for a caller that lends it (a callback's
    /// argument) rather than handing it over.
    pub(crate) fn new(error: Error) -> colocated_error {
        let message = c_string(error.message());
        let traceback = error.remote_traceback().map(c_string);
        colocated_error {
            error,
            message,
            traceback,
        }
    }

    pub(crate) fn into_raw(error: Error) -> *mut colocated_error {
        Box::into_raw(Box::new(colocated_error::new(error)))
    }

    /// Takes back an error returned by C code (e.g. a native function).
    ///
    /// # Safety
    /// `raw` is NULL or came from `into_raw` and is not used again.
    pub(crate) unsafe fn take(raw: *mut colocated_error) -> Option<Error> {
        if raw.is_null() {
            return None;
        }
        Some(Box::from_raw(raw).error)
    }
}

/// The error's code. Returns `COLOCATED_INVALID_ARGUMENT` for NULL.
///
/// Thread-safety: any thread; the error is not modified.
#[no_mangle]
pub unsafe extern "C" fn colocated_error_get_code(
    error: *const colocated_error,
) -> colocated_error_code {
    crate::guard(|| match error.as_ref() {
        Some(e) => colocated_error_code::from_core(e.error.code()),
        None => colocated_error_code::COLOCATED_INVALID_ARGUMENT,
    })
}

/// The error's message: UTF-8, NUL-terminated, borrowed from the error (valid until
/// it is destroyed). Empty for NULL.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_error_message(
    error: *const colocated_error,
) -> colocated_string_view {
    crate::guard(|| match error.as_ref() {
        Some(e) => colocated_string_view::of_cstr(&e.message),
        None => colocated_string_view::empty(),
    })
}

/// The traceback text of user code that failed on a host; empty when there is none.
/// Borrowed from the error.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_error_remote_traceback(
    error: *const colocated_error,
) -> colocated_string_view {
    crate::guard(|| match error.as_ref().and_then(|e| e.traceback.as_ref()) {
        Some(t) => colocated_string_view::of_cstr(t),
        None => colocated_string_view::empty(),
    })
}

/// The lower-case name of a code (`"invalid_argument"`), static and NUL-terminated;
/// `"unknown"` for values that are not codes.
///
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn colocated_error_code_name(code: u32) -> colocated_string_view {
    crate::guard(|| code_name(code))
}

fn code_name(code: u32) -> colocated_string_view {
    let name: &'static str = match code {
        0 => "ok\0",
        _ => match colocated_error_code::to_core(code) {
            Some(c) => match c {
                ErrorCode::Cancelled => "cancelled\0",
                ErrorCode::InvalidArgument => "invalid_argument\0",
                ErrorCode::DeadlineExceeded => "deadline_exceeded\0",
                ErrorCode::NotFound => "not_found\0",
                ErrorCode::AlreadyExists => "already_exists\0",
                ErrorCode::PermissionDenied => "permission_denied\0",
                ErrorCode::ResourceExhausted => "resource_exhausted\0",
                ErrorCode::FailedPrecondition => "failed_precondition\0",
                ErrorCode::Unimplemented => "unimplemented\0",
                ErrorCode::Internal => "internal\0",
                ErrorCode::Unavailable => "unavailable\0",
                ErrorCode::Unauthenticated => "unauthenticated\0",
            },
            None => "unknown\0",
        },
    };
    colocated_string_view {
        data: name.as_ptr().cast(),
        size: name.len() - 1,
    }
}

/// Creates an error (for native functions and host callbacks to return). Copies
/// `message` (`message_size` bytes of UTF-8; invalid bytes are replaced). A `code`
/// that is OK or unknown gives an `internal` error saying so. The caller owns the
/// result.
///
/// Thread-safety: any thread.
#[no_mangle]
pub unsafe extern "C" fn colocated_error_create(
    code: u32,
    message: *const u8,
    message_size: usize,
) -> *mut colocated_error {
    crate::guard(|| {
        let text = if message.is_null() || message_size == 0 {
            String::new()
        } else {
            String::from_utf8_lossy(std::slice::from_raw_parts(message, message_size)).into_owned()
        };
        let error = match colocated_error_code::to_core(code) {
            Some(c) => Error::new(c, text),
            None => Error::internal(format!("error created with invalid code {code}: {text}")),
        };
        colocated_error::into_raw(error)
    })
}

/// Frees an error. Accepts NULL.
///
/// Thread-safety: any thread, once per error.
#[no_mangle]
pub unsafe extern "C" fn colocated_error_destroy(error: *mut colocated_error) {
    crate::boundary_void(|| drop(colocated_error::take(error)));
}
