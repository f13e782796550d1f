//! Errors: a canonical code (absl's numbering, as PJRT's) and a message.

use std::fmt;

use crate::plugin::Api;
use crate::sys;

/// Canonical error codes, numbered as absl's and PJRT's (`PJRT_Error_Code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// `CANCELLED` (1).
    Cancelled,
    /// `UNKNOWN` (2).
    Unknown,
    /// `INVALID_ARGUMENT` (3).
    InvalidArgument,
    /// `DEADLINE_EXCEEDED` (4).
    DeadlineExceeded,
    /// `NOT_FOUND` (5).
    NotFound,
    /// `ALREADY_EXISTS` (6).
    AlreadyExists,
    /// `PERMISSION_DENIED` (7).
    PermissionDenied,
    /// `RESOURCE_EXHAUSTED` (8).
    ResourceExhausted,
    /// `FAILED_PRECONDITION` (9).
    FailedPrecondition,
    /// `ABORTED` (10).
    Aborted,
    /// `OUT_OF_RANGE` (11).
    OutOfRange,
    /// `UNIMPLEMENTED` (12).
    Unimplemented,
    /// `INTERNAL` (13).
    Internal,
    /// `UNAVAILABLE` (14).
    Unavailable,
    /// `DATA_LOSS` (15).
    DataLoss,
    /// `UNAUTHENTICATED` (16).
    Unauthenticated,
}

impl Code {
    /// The code of PJRT's number `value` (`Unknown` for a number absl does not
    /// define).
    pub fn from_pjrt(value: sys::PJRT_Error_Code) -> Code {
        match value {
            1 => Code::Cancelled,
            3 => Code::InvalidArgument,
            4 => Code::DeadlineExceeded,
            5 => Code::NotFound,
            6 => Code::AlreadyExists,
            7 => Code::PermissionDenied,
            8 => Code::ResourceExhausted,
            9 => Code::FailedPrecondition,
            10 => Code::Aborted,
            11 => Code::OutOfRange,
            12 => Code::Unimplemented,
            13 => Code::Internal,
            14 => Code::Unavailable,
            15 => Code::DataLoss,
            16 => Code::Unauthenticated,
            _ => Code::Unknown,
        }
    }
}

/// A failed PJRT call, or a call refused before it reached the plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: Code,
    message: String,
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }
    /// The canonical code.
    pub fn code(&self) -> Code {
        self.code
    }
    /// The message (the plugin's, for an error the plugin returned).
    pub fn message(&self) -> &str {
        &self.message
    }
    pub(crate) fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(Code::InvalidArgument, message)
    }
    pub(crate) fn unimplemented(message: impl Into<String>) -> Error {
        Error::new(Code::Unimplemented, message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Error {
        Error::new(Code::Internal, message)
    }

    /// Takes ownership of the plugin's `raw` error (destroying it) and says
    /// which call returned it.
    ///
    /// # Safety
    /// `raw` is a non-null error that `api` returned and nobody else owns.
    pub(crate) unsafe fn from_raw(api: &Api, raw: *mut sys::PJRT_Error, call: &str) -> Error {
        let mut message: sys::PJRT_Error_Message_Args = crate::plugin::args();
        message.struct_size = sys::PJRT_Error_Message_Args_STRUCT_SIZE as usize;
        message.error = raw;
        let text = match api.table().PJRT_Error_Message {
            Some(f) => {
                f(&mut message);
                crate::types::string_of(message.message, message.message_size)
            }
            None => String::from("(the plugin gives no message)"),
        };
        let mut get_code: sys::PJRT_Error_GetCode_Args = crate::plugin::args();
        get_code.struct_size = sys::PJRT_Error_GetCode_Args_STRUCT_SIZE as usize;
        get_code.error = raw;
        let code = match api.table().PJRT_Error_GetCode {
            Some(f) => {
                let failed = f(&mut get_code);
                if failed.is_null() {
                    Code::from_pjrt(get_code.code)
                } else {
                    api.destroy_error(failed);
                    Code::Unknown
                }
            }
            None => Code::Unknown,
        };
        api.destroy_error(raw);
        Error::new(code, format!("{call}: {text}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}
