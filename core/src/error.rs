//! The one error type of the runtime: a canonical code, a message, and — when user
//! code failed on a host — the traceback text it left there.

use std::fmt;

/// Canonical error codes (the gRPC/absl set). The numeric values are part of the C
/// ABI (`colocated_error_code`) and never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// The operation was cancelled.
    Cancelled = 1,
    /// An argument is invalid, whatever the state of the system.
    InvalidArgument = 3,
    /// A deadline passed before the operation completed.
    DeadlineExceeded = 4,
    /// A named entity (device, native function, …) does not exist.
    NotFound = 5,
    /// The entity to create already exists.
    AlreadyExists = 6,
    /// The caller may not perform the operation.
    PermissionDenied = 7,
    /// A resource (memory, quota) is exhausted.
    ResourceExhausted = 8,
    /// The system is not in a state the operation requires (e.g. a deleted buffer).
    FailedPrecondition = 9,
    /// The operation is not implemented or not supported.
    Unimplemented = 12,
    /// An invariant broke inside the runtime.
    Internal = 13,
    /// A host or link is unavailable.
    Unavailable = 14,
    /// The request carries no valid credentials.
    Unauthenticated = 16,
}

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::Cancelled,
        ErrorCode::InvalidArgument,
        ErrorCode::DeadlineExceeded,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::PermissionDenied,
        ErrorCode::ResourceExhausted,
        ErrorCode::FailedPrecondition,
        ErrorCode::Unimplemented,
        ErrorCode::Internal,
        ErrorCode::Unavailable,
        ErrorCode::Unauthenticated,
    ];

    /// The code with this number; `None` for 0 (no error) and unknown numbers.
    pub fn from_u32(value: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| *c as u32 == value)
    }

    /// The canonical lower-case name (`"invalid_argument"`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::ResourceExhausted => "resource_exhausted",
            ErrorCode::FailedPrecondition => "failed_precondition",
            ErrorCode::Unimplemented => "unimplemented",
            ErrorCode::Internal => "internal",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Unauthenticated => "unauthenticated",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error with a code and a message. Cheap to clone (futures hand the same error
/// to every consumer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
    remote_traceback: Option<String>,
}

impl Error {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            remote_traceback: None,
        }
    }

    /// Attaches the traceback text that user code left on a host.
    pub fn with_remote_traceback(mut self, traceback: impl Into<String>) -> Self {
        self.remote_traceback = Some(traceback.into());
        self
    }

    /// The canonical code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The traceback of user code that failed on a host, if any.
    pub fn remote_traceback(&self) -> Option<&str> {
        self.remote_traceback.as_deref()
    }

    /// Prefixes the message with context, keeping the code.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

/// The result type of every fallible core call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

macro_rules! constructors {
    ($($fn_name:ident => $code:ident),* $(,)?) => {
        impl Error {
            $(
                #[doc = concat!("An error with code `", stringify!($code), "`.")]
                pub fn $fn_name(message: impl Into<String>) -> Self {
                    Error::new(ErrorCode::$code, message)
                }
            )*
        }
    };
}

constructors! {
    cancelled => Cancelled,
    invalid_argument => InvalidArgument,
    deadline_exceeded => DeadlineExceeded,
    not_found => NotFound,
    already_exists => AlreadyExists,
    permission_denied => PermissionDenied,
    resource_exhausted => ResourceExhausted,
    failed_precondition => FailedPrecondition,
    unimplemented => Unimplemented,
    internal => Internal,
    unavailable => Unavailable,
    unauthenticated => Unauthenticated,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_code_and_message() {
        let e = Error::invalid_argument("bad dims").context("buffer_from_host");
        assert_eq!(
            e.to_string(),
            "invalid_argument: buffer_from_host: bad dims"
        );
        assert_eq!(e.code() as u32, 3);
    }
}
