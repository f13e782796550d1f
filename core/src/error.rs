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

    /// The code named `name` (as [`name`](Self::name) gives it); `None`
    /// for any other text.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.name() == name)
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

/// `text` if it has at most `limit` bytes; otherwise its head and its tail,
/// cut on character boundaries, around a note of how much was cut
/// (`"… [1,234,567 bytes cut] …"`), in at most `limit` bytes in all.
///
/// For error messages and tracebacks that cross the wire: one enormous
/// message must not exceed a protocol limit, while its start and end (where
/// the exception's type and its last frames are) stay readable. A `limit`
/// too small for the note itself keeps only the head.
pub fn bound_text(text: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= limit {
        return std::borrow::Cow::Borrowed(text);
    }
    // The note is longest for the largest possible cut: budget for that.
    let longest_note = cut_note(text.len()).len();
    let Some(kept) = limit.checked_sub(longest_note) else {
        return std::borrow::Cow::Borrowed(&text[..floor_boundary(text, limit)]);
    };
    let head_end = floor_boundary(text, kept / 2);
    let tail_start = ceil_boundary(text, text.len() - (kept - kept / 2));
    let (head, tail) = (&text[..head_end], &text[tail_start..]);
    let note = cut_note(tail_start - head_end);
    let mut bounded = String::with_capacity(head.len() + note.len() + tail.len());
    bounded.push_str(head);
    bounded.push_str(&note);
    bounded.push_str(tail);
    std::borrow::Cow::Owned(bounded)
}

/// `"… [N bytes cut] …"`, with N's digits in groups of three.
fn cut_note(cut: usize) -> String {
    let digits = cut.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!(" … [{grouped} bytes cut] … ")
}

/// The largest character boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The smallest character boundary of `text` at or above `at`.
fn ceil_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

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
    fn bound_text_keeps_short_text_and_cuts_long_text_in_the_middle() {
        // Short (and exactly-at-the-limit) text is untouched, not copied.
        for text in ["", "short", "é", &"x".repeat(100)] {
            let bounded = bound_text(text, 100);
            assert!(matches!(bounded, std::borrow::Cow::Borrowed(_)), "{text:?}");
            assert_eq!(bounded, text);
        }
        let text = format!("HEAD{}TAIL", "x".repeat(1_234_567));
        let bounded = bound_text(&text, 1000);
        assert!(bounded.len() <= 1000, "{}", bounded.len());
        assert!(bounded.starts_with("HEADxxx"), "{bounded}");
        assert!(bounded.ends_with("xxxTAIL"), "{bounded}");
        // The note says exactly how much is missing between head and tail.
        let (head, rest) = bounded.split_once(" … [").unwrap();
        let (count, tail) = rest.split_once(" bytes cut] … ").unwrap();
        let cut: usize = count.replace(',', "").parse().unwrap();
        assert_eq!(count, group(cut));
        assert_eq!(head.len() + cut + tail.len(), text.len());
        assert!(text.starts_with(head) && text.ends_with(tail));
        // The budget is used: head and tail share nearly all of it.
        assert!(head.len() + tail.len() > 1000 - 40, "{bounded}");
    }

    fn group(n: usize) -> String {
        cut_note(n)
            .trim_start_matches(" … [")
            .trim_end_matches(" bytes cut] … ")
            .to_string()
    }

    #[test]
    fn bound_text_cuts_on_character_boundaries_at_every_limit() {
        // Two-, three- and four-byte characters, at every alignment.
        let text: String = "aé€😀".repeat(200);
        for limit in 0..=text.len() + 1 {
            let bounded = bound_text(&text, limit);
            assert!(bounded.len() <= limit, "limit {limit}: {}", bounded.len());
            // Valid UTF-8 by construction (a `str`); the kept parts are a
            // prefix and a suffix of the original.
            if let Some((head, rest)) = bounded.split_once(" … [") {
                let (_, tail) = rest.split_once(" bytes cut] … ").unwrap();
                assert!(
                    text.starts_with(head) && text.ends_with(tail),
                    "limit {limit}"
                );
            } else {
                assert!(text.starts_with(&*bounded), "limit {limit}");
            }
        }
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
    }

    #[test]
    fn every_code_is_found_by_its_name_and_nothing_else_is() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_name(code.name()), Some(code));
        }
        assert_eq!(ErrorCode::from_name("Invalid_Argument"), None);
        assert_eq!(ErrorCode::from_name(""), None);
    }

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
