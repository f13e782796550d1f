//! Entry points for fuzzing what a worker receives (the `fuzz/` crate at the top
//! of the repository drives them; built only with the `fuzzing` feature).
//!
//! Each takes arbitrary bytes and hands them to an in-process worker as the body
//! of one request on a throwaway session: through the gRPC decoding the worker's
//! server applies (with its message size limit), then the worker's own handlers
//! and checks. Junk must get an error, never a panic, and the worker must go on
//! serving everyone else: after every input a bystander session still reads back
//! its buffer, and no session is left behind. A panic here is a bug.
//!
//! The worker starts on first use, on a loopback port that no connection ever
//! reaches: requests go straight to its service, on the transport's runtime.
//!
//! An input is one byte that says how the body arrives, then the body:
//! - bit 7: the stream breaks (a reset) after the body instead of ending;
//! - bits 4–6: which request a [`control_messages`] input is ([`Rpc`]);
//! - bits 0–3: `k`; the body comes in data frames of `2^k` bytes (`k = 0`: one
//!   frame);
//! - the body: gRPC messages, each after a compression flag byte and its length
//!   (4 bytes, big endian).
//!
//! Every throwaway session starts with buffers 1 and 2 (`f32[2]` on devices 0
//! and 1) and executable 1 ([`sample_executable`]), so that operations naming
//! them get past the lookups.

use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use bytes::Bytes;
use prost::Message;
use tonic::codegen::http;
use tonic::Code;

use crate::buffer::Buffer;
use crate::client::{Client, ClientOptions};
use crate::error::{Error, Result};
use crate::executor::ExecutionContext;
use crate::transport::proto::ControlRequest;
use crate::transport::{SessionId, AUTHORIZATION, SESSION};

mod harness;
mod wire;

use harness::{block_on, harness};
use wire::{grpc_body, Wire};
/// The native function of [`sample_executable`]: copies input shard `i` to
/// output shard `i`.
pub const COPY_FUNCTION: &str = "fuzz_copy";

/// The request an input is: bits 4–6 of its first byte for
/// [`control_messages`] (0 and 3 to 7 are `Control`); [`buffer_chunks`] inputs
/// are always `PutBuffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    /// A `Control` stream of `ControlRequest`s.
    Control,
    /// A `LoadExecutable` request (`LoadExecutableRequest`).
    LoadExecutable,
    /// An `OpenSession` request (`OpenSessionRequest`).
    OpenSession,
    /// A `PutBuffer` stream of `PutBufferChunk`s.
    PutBuffer,
}

impl Rpc {
    fn from_bits(bits: u8) -> Rpc {
        match bits {
            1 => Rpc::LoadExecutable,
            2 => Rpc::OpenSession,
            _ => Rpc::Control,
        }
    }

    fn bits(self) -> u8 {
        match self {
            Rpc::Control | Rpc::PutBuffer => 0,
            Rpc::LoadExecutable => 1,
            Rpc::OpenSession => 2,
        }
    }
}

/// Runs `data` as a `Control` stream, a `LoadExecutable` or an `OpenSession`
/// request on a throwaway session, and blocks until the worker has answered
/// all of it. Panics where the worker breaks a rule of this module.
pub fn control_messages(data: &[u8]) {
    if let Some((flags, body)) = data.split_first() {
        harness().run(Rpc::from_bits((flags >> 4) & 7), Wire::new(*flags, body));
    }
}

/// Runs `data` as a `PutBuffer` stream on a throwaway session, and blocks until
/// the worker has answered. Panics where the worker breaks a rule of this
/// module, or makes a buffer that does not read back as the chunks' bytes.
pub fn buffer_chunks(data: &[u8]) {
    if let Some((flags, body)) = data.split_first() {
        harness().run(Rpc::PutBuffer, Wire::new(*flags, body));
    }
}

/// Runs `data` through the colocated protocol's decoders on a local client:
/// first byte even, the rest is the payload of a `colocated` program to load;
/// odd, length-delimited discovery reports from which the controller derives
/// a call's global outputs. Panics only where they break (a bug).
pub fn colocated_protocol(data: &[u8]) {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    let Some((choice, body)) = data.split_first() else {
        return;
    };
    let client = CLIENT.get_or_init(local_client);
    if choice % 2 == 0 {
        crate::colocated::fuzzing::load(client, body);
    } else {
        crate::colocated::fuzzing::reports(client, body);
    }
}

/// Seed inputs of [`colocated_protocol`]: `(name, input)`.
pub fn colocated_seeds() -> Vec<(&'static str, Vec<u8>)> {
    crate::colocated::fuzzing::seeds(COPY_FUNCTION)
}

/// The RPC paths a [`router_requests`] input picks from (bits 0–2 of its first
/// byte; 7 takes the path from the input).
const ROUTER_PATHS: [&str; 7] = [
    "/colocated.remote.v1.Worker/OpenSession",
    "/colocated.remote.v1.Worker/Control",
    "/colocated.remote.v1.Worker/PutBuffer",
    "/colocated.remote.v1.Worker/LoadExecutable",
    "/colocated.remote.v1.Worker/Heartbeat",
    "/colocated.remote.v1.Worker/GetBuffer",
    "/colocated.remote.v1.Worker/CloseSession",
];

/// Runs `data` as one request through the worker's router, as a stranger (or
/// a controller with a bad session) sends it: every request that lacks the
/// token, or names no open session where one is needed (every RPC but
/// `OpenSession` and `Health`; `CloseSession` needs a well-formed id only),
/// must be refused with a gRPC error before a byte of its body is read.
/// Panics otherwise.
///
/// The input: one byte (bits 0–2: the path, [`ROUTER_PATHS`] or 7 for the
/// input's own; bits 3–4: the authorization — none, the token, a wrong token,
/// or the input's bytes; bits 5–6: the session — none, the bystander's, an
/// unknown id, or the input's bytes), one byte `n`, `n` bytes for whatever the
/// first byte takes from the input, then the body.
pub fn router_requests(data: &[u8]) {
    let Some((&[choice, n], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let (raw, body) = rest.split_at(rest.len().min(n as usize));
    let harness = harness();
    let token = &harness.peer.token;
    let path = match ROUTER_PATHS.get((choice & 7) as usize) {
        Some(path) => (*path).to_string(),
        None => String::from_utf8_lossy(raw).into_owned(),
    };
    let authorization: Option<Vec<u8>> = match (choice >> 3) & 3 {
        0 => None,
        1 => Some(format!("Bearer {}", token.expose()).into_bytes()),
        2 => Some(b"Bearer not-the-token".to_vec()),
        _ => Some(raw.to_vec()),
    };
    let session: Option<Vec<u8>> = match (choice >> 5) & 3 {
        0 => None,
        1 => Some(harness.bystander.to_string().into_bytes()),
        2 => Some(b"00000000000000000000000000000000".to_vec()),
        _ => Some(raw.to_vec()),
    };
    let authorized = authorization
        .as_deref()
        .is_some_and(|a| a == format!("Bearer {}", token.expose()).as_bytes());
    let Ok(uri) = http::Uri::builder()
        .scheme("http")
        .authority("worker")
        .path_and_query(path.as_str())
        .build()
    else {
        return;
    };
    // The router sees the path without its query.
    let open_session = uri.path() == ROUTER_PATHS[0];
    // As the worker reads a session id (hex digits of either case).
    let bystander = session
        .as_deref()
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| SessionId::parse(s).ok())
        .is_some_and(|id| id == harness.bystander);
    // Needs the token only: the worker's health.
    let sessionless = uri.path() == "/colocated.remote.v1.Worker/Health";
    // Closing a session that is gone is not refused: it needs the token and
    // a well-formed session id only.
    let closing = uri.path() == ROUTER_PATHS[6]
        && session
            .as_deref()
            .and_then(|s| std::str::from_utf8(s).ok())
            .is_some_and(|s| SessionId::parse(s).is_ok());
    if authorized && (open_session || bystander || sessionless || closing) {
        // Admitted: what follows is the other targets' business (and must not
        // open sessions or touch the bystander's here).
        return;
    }
    let read = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut request = http::Request::new(tonic::body::Body::new(Watched {
        wire: Wire::clean(body.to_vec()),
        read: read.clone(),
    }));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    for (name, value) in [(AUTHORIZATION, authorization), (SESSION, session)] {
        if let Some(value) = value.and_then(|v| http::HeaderValue::from_bytes(&v).ok()) {
            headers.insert(name, value);
        }
    }
    let mut router = harness.peer.worker.router();
    let response = block_on(tonic::codegen::Service::call(&mut router, request))
        .unwrap_or_else(|never| match never {});
    let status = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok());
    assert!(
        status.is_some_and(|s| s != Code::Ok as i32),
        "{path}: an unadmitted request was not refused at its headers: {response:?}"
    );
    assert!(
        !read.load(std::sync::atomic::Ordering::SeqCst),
        "{path}: the body of an unadmitted request was read"
    );
}

/// A body that records whether anything polled it.
struct Watched {
    wire: Wire,
    read: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.read.store(true, std::sync::atomic::Ordering::SeqCst);
        Pin::new(&mut self.wire).poll_frame(cx)
    }
}

/// Bytes on a connection to the worker's port, as a lane's (see
/// [`lane`](crate::transport::lane)): the first byte's bit 0 says whether a valid lane
/// opening (magic bytes and hello) for a throwaway session comes first (the
/// rest then are frames of `ControlRequest`s); else the rest is all that is
/// sent (a lane when it begins with a zero byte, gRPC otherwise). The worker
/// answers or closes the connection once the input ends, and goes on
/// serving.
pub fn lane_bytes(data: &[u8]) {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    harness().run_lane(flags & 1 == 1, body);
}

/// A lane fuzz input: a valid opening, then `requests` framed.
pub fn encode_lane_input(requests: &[ControlRequest]) -> Vec<u8> {
    let mut out = vec![1u8];
    for request in requests {
        crate::transport::lane::encode_frame(request, &mut out);
    }
    out
}

/// An input of `messages` as request `rpc`, in one data frame that ends
/// cleanly (to write seeds).
pub fn encode_input<M: Message>(rpc: Rpc, messages: &[M]) -> Vec<u8> {
    let mut input = vec![rpc.bits() << 4];
    input.extend(grpc_body(messages));
    input
}

/// A serialized executable of [`COPY_FUNCTION`]: one `f32[4]` input and output,
/// each split over devices 0 and 1, for a local client with 4 CPU devices
/// that registered [`COPY_FUNCTION`].
pub fn sample_executable() -> Vec<u8> {
    harness().executable.clone()
}

/// A local client with 4 CPU devices and one executor thread, whose registry
/// has [`COPY_FUNCTION`]: what the targets load and run programs on.
pub fn local_client() -> Client {
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(4),
        executor_threads: Some(1),
        ..Default::default()
    })
    .expect("a local client");
    client
        .register_native_function(COPY_FUNCTION, copy_shards)
        .expect("the copy function registers");
    client
}

/// The native function [`COPY_FUNCTION`] names: copies input shard `i` to
/// output shard `i` (an error where they differ in size).
pub fn copy_shards(ctx: &mut ExecutionContext<'_>) -> Result<()> {
    for (i, shard) in ctx.output_shards().iter().enumerate() {
        let input = ctx
            .inputs()
            .get(i)
            .ok_or_else(|| Error::invalid_argument(format!("no input shard {i} to copy")))?;
        let data = input.to_host_vec()?;
        let out = Buffer::from_bytes(ctx.client(), &data, shard.dtype, &shard.dims, &shard.device)?;
        ctx.set_output(i, out)?;
    }
    Ok(())
}
