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

use std::collections::{HashSet, VecDeque};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio_stream::StreamExt;
use tonic::codec::Codec;
use tonic::codegen::http;
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::buffer::Buffer;
use crate::client::{Client, ClientOptions};
use crate::compiler::CompileOptions;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::executor::ExecutionContext;
use crate::program::Program;
use crate::sharding::Sharding;
use crate::spec::ArraySpec;
use crate::transport::proto::worker_server::Worker as WorkerRpc;
use crate::transport::proto::{
    BufferSpec, CloseSessionRequest, ControlRequest, HeartbeatRequest, LoadExecutableRequest,
    OpenSessionRequest, PutBufferChunk,
};
use crate::transport::{
    SessionId, Token, AUTHORIZATION, MAX_MESSAGE_BYTES, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN,
    SESSION,
};
use crate::worker::{Service, Worker, WorkerOptions};

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

/// The gRPC framing of `messages`: an uncompressed flag and a big-endian length
/// before each.
fn grpc_body<M: Message>(messages: &[M]) -> Vec<u8> {
    let mut body = Vec::new();
    for message in messages {
        let bytes = message.encode_to_vec();
        body.push(0);
        body.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        body.extend_from_slice(&bytes);
    }
    body
}

/// The messages of a gRPC body, if it is whole uncompressed messages within
/// the size limit only.
///
/// tonic takes a body that ends right after a message's header, before any of
/// its bytes, as a clean end (it reports a body cut anywhere else): that last
/// header is no message.
fn split_messages(mut body: &[u8]) -> Option<Vec<&[u8]>> {
    let mut messages = Vec::new();
    while !body.is_empty() {
        let (&[0, a, b, c, d], rest) = body.split_first_chunk::<5>()? else {
            return None;
        };
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return None;
        }
        if rest.is_empty() && len > 0 {
            break;
        }
        messages.push(rest.get(..len)?);
        body = &rest[len..];
    }
    Some(messages)
}

/// How a request body arrives.
struct Wire {
    frames: VecDeque<Bytes>,
    reset: bool,
    body: Bytes,
}

impl Wire {
    fn new(flags: u8, body: &[u8]) -> Wire {
        let body = Bytes::copy_from_slice(body);
        let frame_bytes = match flags & 0x0f {
            0 => body.len().max(1),
            k => 1 << k,
        };
        let frames = (0..body.len())
            .step_by(frame_bytes)
            .map(|at| body.slice(at..body.len().min(at + frame_bytes)))
            .collect();
        Wire {
            frames,
            reset: flags & 0x80 != 0,
            body,
        }
    }

    fn clean(body: Vec<u8>) -> Wire {
        Wire::new(0, &body)
    }

    /// The body decoded as the worker's server decodes a request stream.
    fn decode<T: Message + Default + Send + 'static>(self) -> Streaming<T> {
        let decoder = ProstCodec::<T, T>::default().decoder();
        Streaming::new_request(decoder, self, None, Some(MAX_MESSAGE_BYTES))
    }
}

impl http_body::Body for Wire {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(match self.frames.pop_front() {
            Some(data) => Some(Ok(http_body::Frame::data(data))),
            None if std::mem::take(&mut self.reset) => Some(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the stream was reset",
            ))),
            None => None,
        })
    }
}

/// An in-process worker with a bystander session, started once per process.
struct Harness {
    peer: Peer,
    executable: Vec<u8>,
    bystander: SessionId,
}

/// A worker and what calls it as its controllers would.
struct Peer {
    worker: Worker,
    token: Token,
}

/// What the bystander session's buffer 1 holds (`f32[2]` on device 0).
const BYSTANDER_DATA: [u8; 8] = *b"bystandr";

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(Harness::start)
}

/// The result of a request the worker must serve.
fn check<T>(what: &str, result: std::result::Result<T, Status>) -> T {
    result.unwrap_or_else(|status| panic!("{what} failed: {status:?}"))
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    crate::transport::runtime()
        .expect("the network runtime")
        .block_on(future)
}

impl Peer {
    fn service(&self) -> Service {
        Service(self.worker.shared.clone())
    }

    /// `message` with the worker's token and, if given, a session id.
    fn request<T>(&self, message: T, session: Option<SessionId>) -> Request<T> {
        let mut request = Request::new(message);
        let bearer = MetadataValue::try_from(format!("Bearer {}", self.token.expose()))
            .expect("the token is valid metadata");
        request.metadata_mut().insert(AUTHORIZATION, bearer);
        if let Some(id) = session {
            let id =
                MetadataValue::try_from(id.to_string()).expect("a session id is valid metadata");
            request.metadata_mut().insert(SESSION, id);
        }
        request
    }

    async fn open(&self) -> SessionId {
        let request = OpenSessionRequest {
            min_version: PROTOCOL_VERSION_MIN,
            max_version: PROTOCOL_VERSION_MAX,
            client_name: "fuzzing".into(),
            software_version: crate::transport::VERSION.into(),
        };
        let response = check(
            "opening a session",
            self.service()
                .open_session(self.request(request, None))
                .await,
        );
        SessionId::from_bytes(&response.get_ref().session_id).expect("a 16-byte session id")
    }

    /// Puts buffer `handle`, `f32[2]` of `data` on `device`.
    async fn put(&self, id: SessionId, handle: u64, device: u32, data: &[u8]) {
        let chunk = PutBufferChunk {
            handle,
            spec: Some(BufferSpec {
                device,
                dtype: DType::F32 as u32,
                dims: vec![2],
                memory_kind: 0,
            }),
            data: Bytes::copy_from_slice(data),
        };
        let put = self
            .service()
            .put_body(id, Wire::clean(grpc_body(&[chunk])))
            .await;
        check(
            "putting a buffer",
            put.map_err(|e| crate::transport::to_status(&e)),
        );
    }

    async fn get(&self, id: SessionId, handle: u64) -> std::result::Result<Vec<u8>, Status> {
        let data = self.service().download(id, handle).await;
        data.map(|data| data.to_vec())
            .map_err(|e| crate::transport::to_status(&e))
    }

    async fn close(&self, id: SessionId) {
        check(
            "closing a session",
            self.service()
                .close_session(self.request(CloseSessionRequest {}, Some(id)))
                .await,
        );
    }
}

impl Harness {
    fn start() -> Harness {
        let client = local_client();
        let devices = client.devices()[..2].to_vec();
        let sharding = Sharding::named(devices.clone(), vec![2], vec!["x".into()], vec![vec![0]])
            .expect("a sharding over two devices");
        let spec = ArraySpec::new(vec![4], DType::F32, sharding).expect("an f32[4] spec");
        let program = Program::native(COPY_FUNCTION, vec![spec.clone()], vec![spec], devices);
        let executable = client
            .compile(program, CompileOptions::default())
            .expect("the copy program compiles")
            .serialize();
        let token = Token::generate().expect("a token");
        let mut options = WorkerOptions::new(Some(token.clone()));
        // Sessions end when an input is done, never by timing out mid-run.
        options.session_timeout = Duration::from_secs(24 * 3600);
        let worker = Worker::start(client, options).expect("the worker starts");
        let peer = Peer { worker, token };
        let bystander = block_on(async {
            let id = peer.open().await;
            peer.put(id, 1, 0, &BYSTANDER_DATA).await;
            id
        });
        Harness {
            peer,
            executable,
            bystander,
        }
    }

    /// A session with buffers 1 and 2 and executable 1.
    async fn throwaway_session(&self) -> SessionId {
        let peer = &self.peer;
        let id = peer.open().await;
        peer.put(id, 1, 0, &[1; 8]).await;
        peer.put(id, 2, 1, &[2; 8]).await;
        let load = LoadExecutableRequest {
            handle: 1,
            executable: self.executable.clone().into(),
            controller_device_ids: Default::default(),
        };
        check(
            "loading the sample executable",
            peer.service()
                .load_executable(peer.request(load, Some(id)))
                .await,
        );
        id
    }

    fn run(&self, rpc: Rpc, wire: Wire) {
        block_on(async {
            let id = self.throwaway_session().await;
            match rpc {
                Rpc::Control => self.control(id, wire).await,
                Rpc::LoadExecutable => self.load_executable(id, wire).await,
                Rpc::OpenSession => self.open_session(wire).await,
                Rpc::PutBuffer => self.put_buffer(id, wire).await,
            }
            self.peer.close(id).await;
            self.check_bystander().await;
        });
    }

    /// The worker still serves its other sessions, and holds no other.
    async fn check_bystander(&self) {
        {
            check(
                "the bystander's heartbeat",
                self.peer
                    .service()
                    .heartbeat(self.peer.request(HeartbeatRequest {}, Some(self.bystander)))
                    .await,
            );
            let data = check(
                "reading the bystander's buffer",
                self.peer.get(self.bystander, 1).await,
            );
            assert_eq!(data, BYSTANDER_DATA, "the bystander's buffer changed");
            assert_eq!(
                self.peer.worker.session_count(),
                1,
                "a session was left open"
            );
        }
    }

    /// Sends `body` on a connection to the worker's port (after a valid
    /// lane opening for a throwaway session when `opened`), closes its
    /// writing side, and reads until the worker closes it.
    fn run_lane(&self, opened: bool, body: &[u8]) {
        use std::io::{Read, Write};
        let id = block_on(self.throwaway_session());
        let mut bytes = if opened {
            crate::transport::lane::hello_bytes(self.peer.token.expose(), id.as_bytes())
        } else {
            Vec::new()
        };
        bytes.extend_from_slice(body);
        let mut socket = std::net::TcpStream::connect(self.peer.worker.local_addr())
            .expect("connecting to the worker");
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a read timeout");
        // The worker may close first: the rest is not sent.
        let _ = socket.write_all(&bytes);
        let _ = socket.shutdown(std::net::Shutdown::Write);
        let mut answers = Vec::new();
        if let Err(e) = socket.read_to_end(&mut answers) {
            assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "the worker left the connection open: {e}"
            );
        }
        block_on(async {
            self.peer.close(id).await;
            self.check_bystander().await;
        });
    }

    /// Runs the stream to its end and reads every answer, by the rules of
    /// cumulative answers (protocol version 5): successful operations are
    /// answered as taken in `seq` order, each at most once, and never if they
    /// finish later; an execution, a read or a fetch finishes at most once (a
    /// fetch's progress before); a broken request stream ends the answers
    /// with its error.
    async fn control(&self, id: SessionId, wire: Wire) {
        let request = self.peer.request(wire.decode::<ControlRequest>(), Some(id));
        let Ok(answers) = self.peer.service().control(request).await else {
            return;
        };
        let mut answers = answers.into_inner();
        let (mut taken, mut finished) = (HashSet::new(), HashSet::new());
        let mut last_taken = 0;
        while let Some(answer) = answers.next().await {
            let answer = match answer {
                Ok(answer) => answer,
                // The request stream broke (cut, reset, undecodable): the
                // worker says why, and a controller stops reading there.
                Err(_) => break,
            };
            assert!(answer.host_callback.is_none(), "no program calls back");
            let seq = answer.seq;
            if answer.finished {
                assert!(finished.insert(seq), "operation {seq} finished twice");
                assert!(
                    !taken.contains(&seq),
                    "operation {seq} was answered as taken and as finished"
                );
            } else if answer.total_bytes > 0 {
                // A fetch's progress.
                assert!(!finished.contains(&seq), "progress of a finished fetch");
            } else if answer.code == 0 {
                assert!(
                    seq > last_taken,
                    "operation {seq} answered as taken after operation {last_taken}"
                );
                last_taken = seq;
                assert!(
                    !finished.contains(&seq),
                    "operation {seq} was answered as taken after it finished"
                );
                taken.insert(seq);
            }
        }
    }

    /// The first message of the body, as the server takes a unary request's;
    /// `None` (the request fails) if there is none or the body is broken.
    async fn unary<T: Message + Default + Send + 'static>(wire: Wire) -> Option<T> {
        let mut messages = wire.decode::<T>();
        let message = messages.message().await.ok().flatten()?;
        // The server reads the body to its end for the trailers.
        messages.trailers().await.ok()?;
        Some(message)
    }

    /// A loaded executable takes its handle: the same request again fails.
    async fn load_executable(&self, id: SessionId, wire: Wire) {
        let Some(load) = Self::unary::<LoadExecutableRequest>(wire).await else {
            return;
        };
        let service = self.peer.service();
        if service
            .load_executable(self.peer.request(load.clone(), Some(id)))
            .await
            .is_ok()
        {
            let again = service
                .load_executable(self.peer.request(load, Some(id)))
                .await;
            assert_eq!(again.map_err(|s| s.code()).err(), Some(Code::AlreadyExists));
        }
    }

    /// A session opens only on a version both sides speak, and closes.
    async fn open_session(&self, wire: Wire) {
        let Some(open) = Self::unary::<OpenSessionRequest>(wire).await else {
            return;
        };
        let Ok(response) = self
            .peer
            .service()
            .open_session(self.peer.request(open.clone(), None))
            .await
        else {
            return;
        };
        let response = response.into_inner();
        let version = response.version;
        assert!(
            (open.min_version.max(PROTOCOL_VERSION_MIN)
                ..=open.max_version.min(PROTOCOL_VERSION_MAX))
                .contains(&version),
            "version {version} was negotiated for {open:?}"
        );
        let id = SessionId::from_bytes(&response.session_id).expect("a 16-byte session id");
        self.peer.close(id).await;
    }

    /// A buffer is made only of a whole, well-formed stream, and reads back as
    /// the bytes of its chunks (a string buffer too: the worker takes its
    /// elements only in the one encoding it sends back).
    async fn put_buffer(&self, id: SessionId, wire: Wire) {
        let (body, reset) = (wire.body.clone(), wire.reset);
        // As the worker's route serves it: parsed as it arrives.
        if self.peer.service().put_body(id, wire).await.is_err() {
            return;
        }
        assert!(!reset, "a reset stream made a buffer");
        let chunks: Vec<PutBufferChunk> = split_messages(&body)
            .expect("an accepted stream is whole messages within the limit")
            .into_iter()
            .map(|m| PutBufferChunk::decode(m).expect("an accepted chunk decodes"))
            .collect();
        let expected: Vec<u8> = chunks.iter().flat_map(|c| c.data.to_vec()).collect();
        let data = check(
            "reading a put buffer",
            self.peer.get(id, chunks[0].handle).await,
        );
        assert_eq!(data, expected, "a buffer does not read back as its chunks");
    }
}
