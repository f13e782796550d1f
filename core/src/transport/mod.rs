//! Remote hosts: the protocol between a controller and its worker hosts (SPEC §6).
//!
//! A worker (`worker::Worker`) serves gRPC (tonic, HTTP/2) on a socket; a
//! controller opens a session on it with `session::RemoteSession::connect`.
//! Messages are protobuf (`proto/remote.proto`), the protocol is versioned and
//! negotiated at connect.
//!
//! Security: a worker runs code it is sent, so every request carries a bearer
//! token that the worker compares in constant time ([`Token`]), and every request
//! after `OpenSession` names its session by a 128-bit random id ([`SessionId`]) that
//! only the token's holder learned. A worker without a token must be started
//! explicitly as insecure.

use std::fmt;
use std::path::Path;

use subtle::ConstantTimeEq;

use crate::error::{bound_text, Error, ErrorCode, Result};

pub(crate) mod admission;
pub(crate) mod alarm;
pub(crate) mod buffers;
pub(crate) mod bulk;
pub(crate) mod host_calls;
pub(crate) mod idle;
pub mod isolate;
pub(crate) mod lane;
pub(crate) mod lane_reader;
pub(crate) mod refusals;
pub(crate) mod strings;

pub(crate) use buffers::reports_progress;
pub use buffers::CHUNK_BYTES;
pub(crate) use buffers::{copy_chunk, copy_whole, INFLIGHT_CHUNKS};
pub use lane::{LANE_MAGIC, LANE_VERSION};
pub(crate) use strings::{encode_strings, StringDecoder};
pub use strings::{MAX_STRING_BUFFER_BYTES, STRINGS_VERSION};

/// The generated protobuf messages and gRPC stubs of `proto/remote.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("colocated.remote.v1");
}

/// This build's colocated version, which controllers and workers exchange
/// when a session opens (see [`versions_compatible`]).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Whether a controller and a worker of colocated versions `a` and `b` may
/// work together: the same release line, major.minor (`0.1.0` and `0.1.3`
/// do, `0.1.0` and `0.2.0` do not). A version that is not `X.Y.Z` is
/// compatible only with itself.
pub fn versions_compatible(a: &str, b: &str) -> bool {
    fn line(version: &str) -> Option<(u64, u64)> {
        let mut parts = version.split(['.', '-', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((major, minor))
    }
    match (line(a), line(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The error of a controller and a worker (`which`: "this worker", "worker
/// HOST:PORT") of incompatible versions.
pub(crate) fn version_mismatch(controller: &str, worker: &str, which: &str) -> Error {
    Error::failed_precondition(format!(
        "version mismatch: the controller runs colocated {controller} and {which} \
         colocated {worker}; install one release (major.minor) on every host"
    ))
}

/// The oldest protocol version this build speaks.
pub const PROTOCOL_VERSION_MIN: u32 = 1;
/// The newest protocol version this build speaks: 2 adds string buffers
/// ([`STRINGS_VERSION`]), 3 redirects ([`REDIRECT_VERSION`]), 4 copies
/// between workers ([`COPY_VERSION`]), 5 cumulative answers
/// ([`CUMULATIVE_VERSION`]), 6 small outputs in execution answers
/// ([`INLINE_OUTPUTS_VERSION`]), 7 small uploads on the control stream
/// ([`SMALL_PUT_VERSION`]), 8 read grants answered at once
/// ([`GRANT_ANSWER_VERSION`]), 9 the control stream on a lane of its own
/// ([`LANE_VERSION`]), 10 the worker's spans for the controller's trace
/// ([`SPANS_VERSION`]), 11 control streams that resume after their
/// connection broke ([`RESUME_VERSION`]).
pub const PROTOCOL_VERSION_MAX: u32 = 11;
/// The protocol version from which a session's control stream survives its
/// connection: the worker keeps each final answer until the controller says
/// it received it (`ControlRequest.received`), and a connection that
/// resumes the stream (`LaneHello.resume`, or the `colocated-resume` header
/// of a gRPC `Control` stream) learns the last operation taken and gets the
/// kept answers again; operations are taken once, in order.
pub const RESUME_VERSION: u32 = 11;
/// The header of a gRPC `Control` stream that resumes its session's
/// stream ([`RESUME_VERSION`]).
pub const RESUME: &str = "colocated-resume";
/// The protocol version that adds `CollectSpans`: a controller that writes a
/// trace (`COLOCATED_TRACE`) fetches each worker's spans into it, placed on
/// its own clock (see [`crate::trace`]).
pub const SPANS_VERSION: u32 = 10;
/// The protocol version from which a worker answers a `GrantReadRequest` as
/// soon as it holds the grant, whatever follows it on the control stream
/// (under [`CUMULATIVE_VERSION`] alone, an execution right behind it could
/// hold its answer until that execution finished). The controller asks the
/// destination of a copy to read only then: a read that came before its
/// grant would be refused like a stranger's, and retried.
pub const GRANT_ANSWER_VERSION: u32 = 8;
/// The protocol version that adds `PutSmallBufferRequest`: an upload of at
/// most [`MAX_SMALL_PUT_BYTES`] (fixed-size elements) as one operation of
/// the control stream, ordered with the executions that use it (a
/// `PutBuffer` stream is not: the controller waits for its answer first).
pub const SMALL_PUT_VERSION: u32 = 7;
/// The most bytes a `PutSmallBufferRequest` carries.
pub const MAX_SMALL_PUT_BYTES: usize = 64 << 10;
/// The protocol version from which a worker answers the control stream
/// cumulatively: any answer for operation `seq` (taken, progress or
/// finished) also says that every operation up to `seq` was taken, so a
/// successful operation that finishes later (an execution, a read, a fetch)
/// is answered once, when it finished, and successful operations that
/// finish at once are answered together, by one answer for the last of them
/// once no further operation has arrived. Failures are answered at once.
pub const CUMULATIVE_VERSION: u32 = 5;
/// The protocol version from which a worker's answer that an execution
/// finished carries its outputs' bytes (in `data`, one after another) when
/// every output is of fixed-size elements and all of them take at most
/// [`MAX_INLINE_OUTPUT_BYTES`]: the controller reads such outputs without
/// another round trip.
pub const INLINE_OUTPUTS_VERSION: u32 = 6;
/// The most bytes of outputs an execution's answer carries (see
/// [`INLINE_OUTPUTS_VERSION`]): a scalar or a small vector, the values a
/// controller reads right after a call. The controller keeps them while
/// their buffers live.
pub const MAX_INLINE_OUTPUT_BYTES: usize = 1 << 10;
/// The protocol version that adds copies between workers: a worker grants
/// one read of a buffer (`GrantReadRequest`), and another fetches it from
/// there (`FetchBufferRequest`), without the data passing the controller.
pub const COPY_VERSION: u32 = 4;
/// The protocol version that adds redirects: a worker that isolates sessions
/// answers `OpenSession` with the address and one-time token of a worker
/// process of the session's own, and refuses controllers older than this.
pub const REDIRECT_VERSION: u32 = 3;

/// Metadata key of the bearer token (`Bearer <token>`).
pub const AUTHORIZATION: &str = "authorization";
/// Metadata key of the session id (32 lower-case hex digits).
pub const SESSION: &str = "colocated-session";
/// Metadata key of a read grant (64 lower-case hex digits): a `GetBuffer`
/// request of another worker presents it instead of the token and a session.
pub const GRANT: &str = "colocated-grant";
/// The environment variable a worker or controller reads its token from when no
/// token file is given.
pub const TOKEN_ENV: &str = "COLOCATED_TOKEN";

/// Largest protobuf message either side decodes; bulk data moves in chunks
/// below this size.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The most bytes of an error message that cross the wire inside a protocol
/// message (control answers, host callback results); a longer one keeps its
/// head and tail around a note of what was cut ([`bound_text`]).
pub const MAX_ERROR_MESSAGE_BYTES: usize = 64 << 10;
/// The most bytes of a remote traceback that cross the wire (cut like
/// messages).
pub const MAX_REMOTE_TRACEBACK_BYTES: usize = 64 << 10;
/// The most bytes of a gRPC status message: it travels in an HTTP/2 trailer,
/// percent-encoded (up to three bytes for one), and peers limit a header
/// list's size (hyper's clients to 16 KiB).
pub const MAX_STATUS_MESSAGE_BYTES: usize = 4 << 10;

/// `err`'s message as it crosses the wire in a protocol message.
pub(crate) fn wire_message(err: &Error) -> String {
    bound_text(err.message(), MAX_ERROR_MESSAGE_BYTES).into_owned()
}

/// `err`'s remote traceback (empty for none) as it crosses the wire.
pub(crate) fn wire_traceback(err: &Error) -> String {
    bound_text(
        err.remote_traceback().unwrap_or_default(),
        MAX_REMOTE_TRACEBACK_BYTES,
    )
    .into_owned()
}

/// HTTP/2 flow-control windows, sized for bulk transfers (the defaults of 64 KiB
/// stall a fast link).
pub(crate) const STREAM_WINDOW_BYTES: u32 = 8 << 20;
pub(crate) const CONNECTION_WINDOW_BYTES: u32 = 32 << 20;
/// Largest HTTP/2 frame either end accepts: a worker, for uploads, and a
/// controller (or a worker fetching from another), for downloads. The
/// default, 16 KiB, cuts a 1 MiB chunk into 64 frames, each read and handed
/// over on its own.
pub(crate) const MAX_FRAME_BYTES: u32 = 1 << 20;

/// A shared secret that authenticates a controller to a worker. Its `Debug`
/// output never shows the secret; comparisons take constant time.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// A token from its text; `invalid_argument` if empty or not visible ASCII
    /// (it travels in an HTTP header).
    pub fn new(text: impl Into<String>) -> Result<Token> {
        let text = text.into();
        if text.is_empty() {
            return Err(Error::invalid_argument("the token is empty"));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::invalid_argument(
                "the token must be printable ASCII without spaces",
            ));
        }
        Ok(Token(text))
    }

    /// The token in a file (surrounding whitespace, such as a final newline, is
    /// ignored).
    pub fn from_file(path: &Path) -> Result<Token> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid_argument(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
        })?;
        Token::new(text.trim()).map_err(|e| e.context(format!("token file {}", path.display())))
    }

    /// The token in `COLOCATED_TOKEN`, if set.
    pub fn from_env() -> Result<Option<Token>> {
        match std::env::var(TOKEN_ENV) {
            Ok(text) => Token::new(text.trim()).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(Error::invalid_argument(format!("{TOKEN_ENV}: {e}"))),
        }
    }

    /// 32 random bytes as 64 hex digits (for demos and tests that start workers).
    pub fn generate() -> Result<Token> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| Error::internal(format!("no randomness for a token: {e}")))?;
        Ok(Token(hex(&bytes)))
    }

    /// True when `presented` is this token; takes the same time wherever they
    /// differ.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }

    /// The secret itself (to write it where a worker reads it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// A 128-bit random session id.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId([u8; 16]);

impl SessionId {
    /// A fresh random id.
    pub fn random() -> Result<SessionId> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| Error::internal(format!("no randomness for a session id: {e}")))?;
        Ok(SessionId(bytes))
    }

    /// The id of its 16 bytes; `invalid_argument` for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Result<SessionId> {
        <[u8; 16]>::try_from(bytes)
            .map(SessionId)
            .map_err(|_| Error::invalid_argument("a session id has 16 bytes"))
    }

    /// The id of its 32 hex digits; `invalid_argument` for anything else.
    pub fn parse(text: &str) -> Result<SessionId> {
        let bad = || Error::invalid_argument("a session id is 32 hex digits");
        if text.len() != 32 {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let pair = text.get(2 * i..2 * i + 2).ok_or_else(bad)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(SessionId(bytes))
    }

    /// The 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({self})")
    }
}

/// `m`'s guard, also after a thread panicked holding it (what the transport
/// guards stays consistent at every unlock).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The gRPC status of a core error (the codes are the same canonical set); a
/// message over [`MAX_STATUS_MESSAGE_BYTES`] keeps its head and tail.
pub fn to_status(err: &Error) -> tonic::Status {
    let code = match err.code() {
        ErrorCode::Cancelled => tonic::Code::Cancelled,
        ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        ErrorCode::NotFound => tonic::Code::NotFound,
        ErrorCode::AlreadyExists => tonic::Code::AlreadyExists,
        ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
        ErrorCode::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorCode::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorCode::Unimplemented => tonic::Code::Unimplemented,
        ErrorCode::Internal => tonic::Code::Internal,
        ErrorCode::Unavailable => tonic::Code::Unavailable,
        ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
    };
    tonic::Status::new(code, bound_text(err.message(), MAX_STATUS_MESSAGE_BYTES))
}

/// The core error of a gRPC status. `out_of_range` (tonic's refusal of an
/// oversized message) is `resource_exhausted`; other codes without a core
/// counterpart (`unknown`, `aborted`, `data_loss`, ...) become `internal`,
/// except `ok`, which is no error and becomes `internal` too (a broken peer).
/// A request that ran out of time (tonic reports it as cancelled) is
/// `deadline_exceeded`; a failure of the connection itself is `unavailable`.
pub fn from_status(status: &tonic::Status) -> Error {
    use std::error::Error as _;
    let code = match status.code() {
        // Made here from a failure of the connection (a peer's answer carries
        // no local source): the peer cannot be reached.
        tonic::Code::Unknown | tonic::Code::Internal if status.source().is_some() => {
            ErrorCode::Unavailable
        }
        tonic::Code::Cancelled if status.message() == TIMEOUT_EXPIRED => {
            ErrorCode::DeadlineExceeded
        }
        // Hyper's "operation was canceled": the connection went away under
        // the request (a peer's own cancellation carries no local source).
        tonic::Code::Cancelled if status.source().is_some() => ErrorCode::Unavailable,
        tonic::Code::Cancelled => ErrorCode::Cancelled,
        tonic::Code::InvalidArgument => ErrorCode::InvalidArgument,
        tonic::Code::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        tonic::Code::NotFound => ErrorCode::NotFound,
        tonic::Code::AlreadyExists => ErrorCode::AlreadyExists,
        tonic::Code::PermissionDenied => ErrorCode::PermissionDenied,
        tonic::Code::ResourceExhausted => ErrorCode::ResourceExhausted,
        tonic::Code::FailedPrecondition => ErrorCode::FailedPrecondition,
        tonic::Code::Unimplemented => ErrorCode::Unimplemented,
        tonic::Code::Unavailable => ErrorCode::Unavailable,
        tonic::Code::Unauthenticated => ErrorCode::Unauthenticated,
        // tonic's refusal of a message over the size limit.
        tonic::Code::OutOfRange => ErrorCode::ResourceExhausted,
        _ => ErrorCode::Internal,
    };
    Error::new(code, status.message())
}

/// The message of tonic's status for a request that timed out
/// (`tonic::TimeoutExpired`).
const TIMEOUT_EXPIRED: &str = "Timeout expired";

/// The largest buffer read on the control stream (`ReadBufferRequest`); larger
/// ones stream in chunks (`GetBuffer`).
pub const MAX_INLINE_READ_BYTES: usize = 1 << 20;

/// The environment variable that sets how many threads the network runtime
/// of a process has (1 to 64).
pub const NETWORK_THREADS_ENV: &str = "COLOCATED_NETWORK_THREADS";

/// Threads of the network runtime: [`NETWORK_THREADS_ENV`] if it is set (and
/// valid), else one on a machine of at most two cores and two on others. Two
/// threads of tokio's scheduler wake each other for every task one of them
/// wakes; on two cores the second one costs more in those wake-ups than it
/// gives, and takes a core the callers and executors need.
fn network_threads() -> usize {
    if let Ok(text) = std::env::var(NETWORK_THREADS_ENV) {
        match text.trim().parse::<usize>() {
            Ok(n @ 1..=64) => return n,
            _ => tracing::warn!(
                value = %text,
                "{NETWORK_THREADS_ENV} must be a number from 1 to 64; ignored"
            ),
        }
    }
    match std::thread::available_parallelism().map(usize::from) {
        Ok(cores) if cores <= 2 => 1,
        _ => 2,
    }
}

/// The process-wide tokio runtime of the transport (`network_threads()`
/// threads; built on first use).
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    // Per process: a forked child starts its own (it has none of the
    // parent's threads).
    static RUNTIME: crate::process::PerProcess<
        std::result::Result<tokio::runtime::Runtime, String>,
    > = crate::process::PerProcess::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(network_threads())
                .thread_name("colocated-net")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::resource_exhausted(format!("cannot start the network runtime: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly_and_never_print() {
        let token = Token::new("s3cret-token").unwrap();
        assert!(token.matches("s3cret-token"));
        assert!(!token.matches("s3cret-tokeN"));
        assert!(!token.matches("s3cret"));
        assert!(!token.matches(""));
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
        assert_eq!(
            Token::new("").unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            Token::new("two words").unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
        let generated = Token::generate().unwrap();
        assert_eq!(generated.expose().len(), 64);
    }

    #[test]
    fn session_ids_round_trip_through_text_and_reject_junk() {
        let id = SessionId::random().unwrap();
        assert_ne!(id, SessionId::random().unwrap());
        assert_eq!(SessionId::parse(&id.to_string()).unwrap(), id);
        assert_eq!(SessionId::from_bytes(id.as_bytes()).unwrap(), id);
        for junk in [
            "",
            "00",
            &"g".repeat(32),
            &"0".repeat(33),
            "é".repeat(16).as_str(),
        ] {
            assert_eq!(
                SessionId::parse(junk).unwrap_err().code(),
                ErrorCode::InvalidArgument,
                "{junk:?}"
            );
        }
        assert!(SessionId::from_bytes(&[0; 15]).is_err());
    }

    #[test]
    fn status_codes_map_one_to_one() {
        for code in ErrorCode::ALL {
            let back = from_status(&to_status(&Error::new(code, "m")));
            assert_eq!((back.code(), back.message()), (code, "m"));
        }
        assert_eq!(
            from_status(&tonic::Status::data_loss("x")).code(),
            ErrorCode::Internal
        );
    }

    /// A request that its connection's end cancelled (hyper's "operation
    /// was canceled", with a local source) could not reach the peer:
    /// `unavailable`, as a refused connection is; a peer's `cancelled`
    /// stays `cancelled`. Connecting through a link that resets every
    /// connection sometimes failed with `cancelled`.
    #[test]
    fn a_request_cancelled_by_its_connection_is_unavailable() {
        let mut local = tonic::Status::cancelled("operation was canceled");
        local.set_source(std::sync::Arc::new(std::io::Error::other(
            "connection reset",
        )));
        assert_eq!(from_status(&local).code(), ErrorCode::Unavailable);
        let peer = tonic::Status::cancelled("the peer cancelled");
        assert_eq!(from_status(&peer).code(), ErrorCode::Cancelled);
    }

    #[test]
    fn errors_crossing_the_wire_are_bounded() {
        let huge = format!("HEAD{}TAIL", "é".repeat(2 << 20));
        let err = Error::internal(huge.clone()).with_remote_traceback(huge.clone());
        let status = to_status(&err);
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(status.message().len() <= MAX_STATUS_MESSAGE_BYTES);
        for (text, limit) in [
            (status.message().to_string(), MAX_STATUS_MESSAGE_BYTES),
            (wire_message(&err), MAX_ERROR_MESSAGE_BYTES),
            (wire_traceback(&err), MAX_REMOTE_TRACEBACK_BYTES),
        ] {
            let len = text.len();
            assert!(len <= limit && len > limit - 64, "{len}");
            assert!(text.starts_with("HEADé") && text.ends_with("éTAIL"));
            assert!(text.contains(" bytes cut] … "));
        }
        // A host callback's error, going from the controller to the worker.
        let result = host_calls::result_of(7, Err(err.clone()));
        assert_eq!(result.code, ErrorCode::Internal as u32);
        assert!(result.message.len() <= MAX_ERROR_MESSAGE_BYTES);
        assert!(result.message.starts_with("HEADé") && result.message.ends_with("éTAIL"));
        let small = Error::not_found("small");
        assert_eq!(to_status(&small).message(), "small");
        assert_eq!(wire_message(&small), "small");
        assert_eq!(wire_traceback(&small), "");
    }
}
