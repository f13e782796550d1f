//! The worker side: a gRPC server that opens authenticated sessions for
//! controllers and serves them with this process's local host.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tonic::codegen::http;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::admission::{
    Admission, Incoming, DEFAULT_HANDSHAKE_TIMEOUT, MAX_STREAMS_PER_CONNECTION,
};
use super::buffers::{buffer_owning, check_spec, chunks, receive_buffer, wire_bytes, CheckedSpec};
use super::bulk::{empty_answer, ChunkParser, ChunkSink, PUT_BUFFER_PATH};
use super::host_calls::{PendingCalls, MAX_HOST_CALLBACKS};
use super::idle::{expire_when_idle, IdleWatch};
use super::isolate::{Children, IsolateCommand};
use super::proto::worker_server::{Worker as WorkerRpc, WorkerServer};
use super::proto::{
    control_request, BufferChunk, CloseSessionRequest, CloseSessionResponse, ControlRequest,
    ControlResponse, DeleteBuffersRequest, DeleteBuffersResponse, DeviceInfo, ExecuteRequest,
    ExecuteResponse, GetBufferRequest, HeartbeatRequest, HeartbeatResponse, HostInfo,
    LoadExecutableRequest, LoadExecutableResponse, OpenSessionRequest, OpenSessionResponse,
    PutBufferChunk, PutBufferResponse,
};
use super::refusals::RefusalLog;
use super::{
    runtime, to_status, wire_message, wire_traceback, SessionId, StringDecoder, Token,
    AUTHORIZATION, MAX_INLINE_READ_BYTES, MAX_MESSAGE_BYTES, PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN, REDIRECT_VERSION, SESSION,
};
use crate::array::Array;
use crate::buffer::Buffer;
use crate::client::Client;
use crate::compiler::CompileOptions;
use crate::dispatch::{Job, Stream, Task};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::executable::{ExecuteOptions, LoadedExecutable};
use crate::executor::SessionScope;
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;

/// How long a stopping worker waits for open connections to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The most header bytes a request may carry (its token and session id need
/// a few hundred).
const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

/// The path of the one RPC that needs no session.
const OPEN_SESSION_PATH: &str = "/colocated.remote.v1.Worker/OpenSession";

/// How a worker serves.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The token every request must carry. `None` serves anyone: only for a
    /// worker started explicitly as insecure.
    pub token: Option<Token>,
    /// How often controllers are asked to send heartbeats.
    pub heartbeat_interval: Duration,
    /// A session without a heartbeat for this long is closed and its resources
    /// freed (its controller is gone).
    pub session_timeout: Duration,
    /// Serve TLS (rustls) with this certificate and key instead of plain TCP.
    pub tls: Option<TlsIdentity>,
    /// Once the worker has had no session for this long (since it started,
    /// or since its last session ended), [`Worker::idle_expired`] becomes
    /// true, and its entry point stops it. `None`: never.
    pub exit_after_idle: Option<Duration>,
    /// How long a new connection has to authenticate — TLS handshake, HTTP/2
    /// preface and a first request with the token — before it is closed.
    pub handshake_timeout: Duration,
    /// Isolate sessions: the worker becomes a supervisor that runs each
    /// session in a child worker of this command, and redirects controllers
    /// there (see [`isolate`](super::isolate)). `None`: sessions are served
    /// in this process.
    pub isolate: Option<IsolateCommand>,
    /// Serve exactly one session: a second `OpenSession` is refused, and
    /// [`Worker::idle_expired`] becomes true once that session ended, or if
    /// none opened within `handshake_timeout` (a supervisor's child).
    pub single_session: bool,
}

/// A worker's TLS certificate chain and private key, PEM-encoded.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate chain (leaf first).
    pub cert_pem: Vec<u8>,
    /// The private key of the leaf certificate.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity(<redacted>)")
    }
}

impl WorkerOptions {
    /// Loopback, port 0, the given token, a heartbeat every second and sessions
    /// closed after 10 s of silence.
    pub fn new(token: Option<Token>) -> WorkerOptions {
        WorkerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token,
            heartbeat_interval: Duration::from_secs(1),
            session_timeout: Duration::from_secs(10),
            tls: None,
            exit_after_idle: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            isolate: None,
            single_session: false,
        }
    }
}

/// A running worker. Dropping it (or [`Worker::shutdown`]) stops serving and
/// closes every session.
pub struct Worker {
    local_addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>>>,
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    token: Option<Token>,
    client: Client,
    sessions: Mutex<HashMap<SessionId, Session>>,
    heartbeat_interval: Duration,
    session_timeout: Duration,
    admission: Arc<Admission>,
    refusals: RefusalLog,
    idle: Arc<IdleWatch>,
    /// A supervisor's session workers (`WorkerOptions::isolate`).
    children: Option<Arc<Children>>,
    /// `WorkerOptions::single_session`, and whether its session was taken.
    single_session: Option<std::sync::atomic::AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Sessions still open when the last of the server goes (a worker
        // dropped inside the runtime) end too.
        let sessions = self.sessions.get_mut().unwrap_or_else(|e| e.into_inner());
        for (id, session) in sessions.drain() {
            let _ = end_session(&self.client, id, session);
        }
    }
}

/// What the worker keeps per session: everything in it is freed when the
/// session closes.
struct Session {
    last_seen: Instant,
    client_name: String,
    /// The session's buffers, by the handles its controller gave them.
    buffers: HashMap<u64, Buffer>,
    /// The session's loaded executables, by handle.
    executables: HashMap<u64, LoadedExecutable>,
    /// The worker's stream for each stream of the controller.
    streams: HashMap<u64, Stream>,
    /// Dropped with the session: its control stream ends then.
    ended: tokio::sync::watch::Sender<()>,
    /// Calls of the controller's host callbacks by programs of the session.
    calls: PendingCalls,
    /// The session as its programs see it (`ExecutionContext::session`).
    scope: Arc<SessionScope>,
}

impl Worker {
    /// Binds `options.listen` and starts serving `client`'s devices (on the
    /// transport's threads); returns once the socket accepts connections.
    pub fn start(client: Client, options: WorkerOptions) -> Result<Worker> {
        if options.token.is_none() {
            tracing::warn!(
                "this worker accepts requests without a token: anyone who can reach {} can run code here",
                options.listen
            );
        }
        if options.tls.is_none() && !options.listen.ip().to_canonical().is_loopback() {
            tracing::warn!(
                "listening on {} without TLS: requests, their data and the token travel in \
                 plain text on the network (serve TLS with a certificate and key)",
                options.listen
            );
        }
        let runtime = runtime()?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(options.listen))
            .map_err(|e| Error::unavailable(format!("cannot listen on {}: {e}", options.listen)))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::internal(format!("no local address: {e}")))?;
        let shared = Arc::new(Shared {
            token: options.token,
            client,
            sessions: Mutex::new(HashMap::new()),
            heartbeat_interval: options.heartbeat_interval,
            session_timeout: options.session_timeout,
            admission: Admission::new(options.handshake_timeout),
            refusals: RefusalLog::default(),
            idle: Arc::default(),
            children: options
                .isolate
                .clone()
                .map(|command| Arc::new(Children::new(command, local_addr.ip()))),
            single_session: options
                .single_session
                .then(|| std::sync::atomic::AtomicBool::new(false)),
        });
        let service = Routes {
            grpc: WorkerServer::new(Service(shared.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            shared: shared.clone(),
        };
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let incoming = Incoming::new(listener, shared.admission.clone());
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &options.tls {
            let identity = tonic::transport::Identity::from_pem(&tls.cert_pem, &tls.key_pem);
            builder = builder
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(|e| Error::invalid_argument(format!("bad TLS certificate or key: {e}")))?;
        }
        let server = builder
            .initial_stream_window_size(Some(super::STREAM_WINDOW_BYTES))
            .initial_connection_window_size(Some(super::CONNECTION_WINDOW_BYTES))
            .max_frame_size(Some(super::MAX_FRAME_BYTES))
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
            .http2_keepalive_interval(Some(options.heartbeat_interval))
            .http2_keepalive_timeout(Some(options.heartbeat_interval * 2))
            .add_service(service);
        let served = runtime.spawn(server.serve_with_incoming_shutdown(incoming, async {
            let _ = stop.await;
        }));
        runtime.spawn(reap_sessions(Arc::downgrade(&shared)));
        if let Some(limit) = options.exit_after_idle {
            let weak = Arc::downgrade(&shared);
            let has_session = move || {
                weak.upgrade().map(|s| {
                    !lock(&s.sessions).is_empty()
                        || s.children.as_ref().is_some_and(|c| c.live() > 0)
                })
            };
            runtime.spawn(expire_when_idle(shared.idle.clone(), limit, has_session));
        }
        if options.single_session {
            runtime.spawn(end_single_session(
                Arc::downgrade(&shared),
                options.handshake_timeout,
            ));
        }
        tracing::info!(%local_addr, tls = options.tls.is_some(), "worker serving");
        Ok(Worker {
            local_addr,
            shutdown: Some(shutdown),
            served: Some(served),
            shared,
        })
    }

    /// The address the worker listens on (with the port it picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// True once the worker has had no session for
    /// [`WorkerOptions::exit_after_idle`] (and for good): its entry point
    /// should stop it. Never true without that option.
    pub fn idle_expired(&self) -> bool {
        self.shared.idle.expired()
    }

    /// Resolves once [`Worker::idle_expired`] is true (never without
    /// [`WorkerOptions::exit_after_idle`]). Needs no timer: it may be awaited
    /// on any runtime or executor, e.g. alongside a wait for signals.
    pub fn wait_idle_expired(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.shared.idle.wait()
    }

    /// Number of open sessions.
    pub fn session_count(&self) -> usize {
        lock(&self.shared.sessions).len()
    }

    /// Number of executables the open sessions have loaded.
    pub fn executable_count(&self) -> usize {
        lock(&self.shared.sessions)
            .values()
            .map(|s| s.executables.len())
            .sum()
    }

    /// Connections now (pending authentication, authenticated), and the pending
    /// ones closed so far (displaced by newer ones, past the handshake
    /// deadline).
    pub fn connection_counts(&self) -> ((usize, usize), (u64, u64)) {
        (
            self.shared.admission.counts(),
            self.shared.admission.closed_counts(),
        )
    }

    /// The worker's router (what a connection's requests go through first),
    /// for the fuzz targets.
    #[cfg(feature = "fuzzing")]
    pub(super) fn router(&self) -> Routes {
        Routes {
            grpc: WorkerServer::new(Service(self.shared.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            shared: self.shared.clone(),
        }
    }

    /// Number of buffers the open sessions hold.
    pub fn buffer_count(&self) -> usize {
        lock(&self.shared.sessions)
            .values()
            .map(|s| s.buffers.len())
            .sum()
    }

    /// Stops serving, closes every session, and waits for the server to
    /// finish and (at most 2 s) for the sessions to be freed, language
    /// executors' `session_ended` included.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop(true)
    }

    fn stop(&mut self, wait_for_sessions: bool) -> Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let sessions: Vec<_> = lock(&self.shared.sessions).drain().collect();
        let ending: Vec<_> = sessions
            .into_iter()
            .filter_map(|(id, session)| end_session(&self.shared.client, id, session))
            .collect();
        if wait_for_sessions {
            wait_ended(ending, Instant::now() + SHUTDOWN_GRACE);
        }
        if let Some(children) = &self.shared.children {
            children.shutdown();
        }
        let Some(served) = self.served.take() else {
            return Ok(());
        };
        // Open streams end with their sessions; a connection that still does
        // not finish in time is cut.
        let abort = served.abort_handle();
        let served = runtime()?.block_on(async move {
            match tokio::time::timeout(SHUTDOWN_GRACE, served).await {
                Ok(joined) => joined,
                Err(_) => {
                    abort.abort();
                    Ok(Ok(()))
                }
            }
        });
        match served {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::unavailable(format!(
                "the worker's server failed: {e}"
            ))),
            Err(e) => Err(Error::internal(format!(
                "the worker's server task failed: {e}"
            ))),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Inside the runtime (a task dropping it) blocking is not allowed: just
        // signal; the server stops by itself.
        if tokio::runtime::Handle::try_current().is_ok() {
            if let Some(shutdown) = self.shutdown.take() {
                let _ = shutdown.send(());
            }
            return;
        }
        // Not waiting for the sessions to be freed: the dropping thread may
        // hold what freeing them needs (Python's GIL).
        let _ = self.stop(false);
    }
}

/// The session id a request names.
fn session_id(metadata: &MetadataMap) -> Result<SessionId> {
    metadata
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Error::unauthenticated("the request names no session"))
        .and_then(|text| {
            SessionId::parse(text).map_err(|e| Error::unauthenticated(e.message().to_string()))
        })
}

fn unknown_session() -> Error {
    Error::unauthenticated("unknown session (it was closed, timed out, or the worker restarted)")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Frees a session taken out of the worker's table — closed, timed out, or
/// the worker stopping — on a thread of its own (never a network thread, nor
/// under the table's lock): its programs that have not started fail, its
/// buffers, executables, streams and host callback calls go, and once the
/// executions already running finished, every language executor frees what
/// the session's programs left behind (`LanguageExecutor::session_ended`:
/// objects, parked results) and the allocator gives the memory back. Returns
/// the thread (`None` if none could start: then the session is dropped
/// without telling the executors).
fn end_session(
    client: &Client,
    id: SessionId,
    session: Session,
) -> Option<std::thread::JoinHandle<()>> {
    session.scope.end();
    let client = client.clone();
    let free = move || {
        let key = session.scope.key();
        // One marker per stream, behind the session's executions.
        let drained: Vec<Event> = session
            .streams
            .values()
            .map(|stream| {
                let done = Event::new();
                let marked = done.clone();
                let task = Task {
                    deps: Vec::new(),
                    completion: done.clone(),
                    run: Job::Call(Box::new(move |_| marked.set_if_pending(Ok(())))),
                    waiter_first: false,
                };
                client.0.local.dispatcher.submit(stream, task);
                done
            })
            .collect();
        // Waiting host callback calls fail now, so their executions finish.
        drop(session);
        for event in drained {
            // Failed only when the client is gone: nothing runs then either.
            let _ = event.wait();
        }
        for executor in client.0.local.executors.all() {
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                executor.session_ended(key)
            }));
            if ended.is_err() {
                tracing::error!(session = %id, "a language executor panicked freeing the session");
            }
        }
        crate::executor::release_freed_memory();
        tracing::debug!(session = %id, "session freed");
    };
    match std::thread::Builder::new()
        .name("colocated-session-end".into())
        .spawn(free)
    {
        Ok(thread) => Some(thread),
        Err(e) => {
            tracing::error!(session = %id, "no thread to free the session: {e}");
            None
        }
    }
}

/// Waits until the threads of `end_session` finished, or `deadline`.
fn wait_ended(ending: Vec<std::thread::JoinHandle<()>>, deadline: Instant) {
    for thread in ending {
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Expires a single-session worker once its session ended, or when none
/// opened within `deadline`.
async fn end_single_session(shared: std::sync::Weak<Shared>, deadline: Duration) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let opened = shared.idle.opened() > 0;
        let open = !lock(&shared.sessions).is_empty();
        if opened && !open {
            tracing::info!("the session ended: this single-session worker should stop");
        } else if !opened && started.elapsed() >= deadline {
            tracing::info!(
                ?deadline,
                "no session opened: this single-session worker should stop"
            );
        } else {
            continue;
        }
        shared.idle.expire();
        return;
    }
}

/// Closes sessions whose controller stopped sending heartbeats.
async fn reap_sessions(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(period) = shared.upgrade().map(|s| s.heartbeat_interval) else {
            return;
        };
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Some(children) = &shared.children {
            // Reaps the session workers that exited.
            children.live();
        }
        let timed_out: Vec<(SessionId, Session)> = {
            let mut sessions = lock(&shared.sessions);
            let expired: Vec<SessionId> = sessions
                .iter()
                .filter(|(_, session)| session.last_seen.elapsed() > shared.session_timeout)
                .map(|(id, _)| *id)
                .collect();
            expired
                .iter()
                .filter_map(|id| sessions.remove_entry(id))
                .collect()
        };
        // Taken out under the lock, freed outside it.
        for (id, session) in timed_out {
            tracing::info!(session = %id, client = %session.client_name, "session timed out; freeing it");
            let _ = end_session(&shared.client, id, session);
        }
    }
}

pub(super) struct Service(pub(super) Arc<Shared>);

impl Service {
    /// A supervisor's answer to `OpenSession`: a new child worker for this
    /// controller, where it opens its session (protocol version
    /// [`REDIRECT_VERSION`]; older controllers are refused, as they would
    /// not follow the redirect).
    async fn redirect(
        &self,
        children: Arc<Children>,
        version: u32,
        client_name: String,
    ) -> std::result::Result<Response<OpenSessionResponse>, Status> {
        if version < REDIRECT_VERSION {
            return Err(Status::failed_precondition(format!(
                "this worker runs each session in a process of its own (--isolate-sessions),                  which needs protocol version {REDIRECT_VERSION}; the controller speaks at most                  {version}: upgrade the controller"
            )));
        }
        let spawned = tokio::task::spawn_blocking(move || children.spawn())
            .await
            .map_err(|e| Status::internal(format!("the spawning task failed: {e}")))?;
        let (address, token) = spawned.map_err(|e| to_status(&e))?;
        tracing::info!(client = %client_name, %address, "session redirected to its own worker");
        self.0.idle.session_opened();
        Ok(Response::new(OpenSessionResponse {
            version,
            session_id: Bytes::new(),
            host: Some(self.host_info()),
            heartbeat_interval_ms: millis(self.0.heartbeat_interval),
            session_timeout_ms: millis(self.0.session_timeout),
            redirect_address: address.to_string(),
            redirect_token: token.expose().to_string(),
        }))
    }

    /// Refuses a request without the worker's token.
    fn authenticate(&self, metadata: &MetadataMap, remote: Option<SocketAddr>) -> Result<()> {
        let Some(token) = &self.0.token else {
            return Ok(());
        };
        let presented = metadata
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(presented) if token.matches(presented) => Ok(()),
            Some(_) => {
                self.0.refusals.refused(remote, "a wrong token");
                Err(Error::unauthenticated("the token is wrong"))
            }
            None => {
                self.0.refusals.refused(remote, "no token");
                Err(Error::unauthenticated(
                    "this worker requires a token (authorization: Bearer <token>)",
                ))
            }
        }
    }

    /// The checks of every request, made by the router before any of its body
    /// is read: the token, then (for every RPC but `OpenSession`) a session
    /// that is open. A request with the token authenticates its connection
    /// (see [`admission`](super::admission)).
    fn admit<B>(&self, request: &http::Request<B>) -> Result<()> {
        let extensions = request.extensions();
        let peer = extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|i| i.remote_addr())
            .or_else(|| {
                extensions
                    .get::<tonic::transport::server::TlsConnectInfo<
                        tonic::transport::server::TcpConnectInfo,
                    >>()
                    .and_then(|i| i.get_ref().remote_addr())
            });
        let metadata = MetadataMap::from_headers(request.headers().clone());
        self.authenticate(&metadata, peer)?;
        self.0.admission.authenticated(peer)?;
        if request.uri().path() != OPEN_SESSION_PATH {
            let id = session_id(&metadata).map_err(|e| self.refused(peer, e))?;
            if !lock(&self.0.sessions).contains_key(&id) {
                return Err(self.refused(peer, unknown_session()));
            }
        }
        Ok(())
    }

    /// `err`, a refusal of a request from `peer`, logged (rate-limited).
    fn refused(&self, peer: Option<SocketAddr>, err: Error) -> Error {
        self.0.refusals.refused(peer, err.message());
        err
    }

    /// The authenticated session a request belongs to, marked as alive.
    fn session<T>(&self, request: &Request<T>) -> Result<SessionId> {
        self.authenticate(request.metadata(), request.remote_addr())?;
        let id = session_id(request.metadata())?;
        match lock(&self.0.sessions).get_mut(&id) {
            Some(session) => {
                session.last_seen = Instant::now();
                Ok(id)
            }
            None => Err(unknown_session()),
        }
    }

    /// Runs `f` on the session `id` (which may have closed since the request
    /// was checked: then `unauthenticated`).
    fn with_session<T>(
        &self,
        id: SessionId,
        f: impl FnOnce(&mut Session) -> Result<T>,
    ) -> Result<T> {
        match lock(&self.0.sessions).get_mut(&id) {
            Some(session) => f(session),
            None => Err(Error::unauthenticated("the session closed")),
        }
    }

    /// Receives buffer uploads of a `PutBuffer` body as its frames arrive
    /// (see [`bulk`](super::bulk)): each chunk's data goes from the received
    /// frame straight into the buffer's memory.
    pub(super) async fn put_body<B>(&self, id: SessionId, body: B) -> Result<()>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<tonic::codegen::StdError>,
    {
        let mut body = std::pin::pin!(body);
        let mut parser = ChunkParser::default();
        let mut upload = Upload::new(self, id);
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            let frame = frame.map_err(|e| super::from_status(&Status::from_error(e.into())))?;
            // Trailers carry nothing for an upload.
            if let Ok(data) = frame.into_data() {
                parser.push(data, &mut upload)?;
            }
        }
        parser.finish()?;
        upload.finish()
    }

    /// Serves a `PutBuffer` request that arrives as HTTP/2 (the worker's route
    /// for it): the session's uploads, answered as gRPC answers.
    async fn put_http(
        self,
        request: http::Request<tonic::body::Body>,
    ) -> http::Response<tonic::body::Body> {
        let (parts, body) = request.into_parts();
        let request = Request::from_http(http::Request::from_parts(parts, ()));
        let result = match self.session(&request) {
            Ok(id) => self.put_body(id, body).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => empty_answer(),
            Err(e) => to_status(&e).into_http(),
        }
    }

    fn load(
        &self,
        id: SessionId,
        request: &LoadExecutableRequest,
    ) -> Result<LoadExecutableResponse> {
        let decoded = crate::format::decode(&request.executable)?;
        if decoded.num_host_callbacks > MAX_HOST_CALLBACKS {
            return Err(Error::invalid_argument(format!(
                "an executable may name at most {MAX_HOST_CALLBACKS} host callbacks, not {}",
                decoded.num_host_callbacks
            )));
        }
        let host_callbacks = (0..decoded.num_host_callbacks)
            .map(|index| self.host_callback_proxy(id, request.handle, index))
            .collect();
        let scope = self.with_session(id, |session| Ok(session.scope.clone()))?;
        let exe =
            self.0
                .client
                .load_decoded(decoded, CompileOptions { host_callbacks }, Some(scope))?;
        let count = |specs: &[crate::array::ArraySpec]| -> Result<u32> {
            let n: usize = specs.iter().map(|s| s.sharding.devices().len()).sum();
            u32::try_from(n).map_err(|_| Error::invalid_argument("too many shards"))
        };
        let response = LoadExecutableResponse {
            num_input_buffers: count(&exe.program().input_specs)?,
            num_output_buffers: count(&exe.program().output_specs)?,
        };
        self.with_session(id, |session| {
            if session.executables.contains_key(&request.handle) {
                return Err(Error::already_exists(format!(
                    "executable {} exists in this session",
                    request.handle
                )));
            }
            session.executables.insert(request.handle, exe);
            Ok(response)
        })
    }

    /// Host callback `index` of executable `executable` as a program of the
    /// session sees it: a call that runs on the controller.
    fn host_callback_proxy(
        &self,
        id: SessionId,
        executable: u64,
        index: u32,
    ) -> LoadedHostCallback {
        let shared = Arc::downgrade(&self.0);
        LoadedHostCallback::new(format!("controller host callback {index}"), move |input| {
            let shared = shared
                .upgrade()
                .ok_or_else(|| Error::unavailable("the worker is stopping"))?;
            let waiter = Service(shared)
                .with_session(id, |session| session.calls.start(executable, index, input))?;
            // Blocks this executor thread only: the result arrives on the
            // control stream, or the session's end fails it.
            waiter.wait()
        })
    }

    /// Queues an execution; returns its status (ready when it has run).
    fn execute(&self, id: SessionId, request: &ExecuteRequest) -> Result<Event> {
        let (exe, inputs, stream) = self.with_session(id, |session| {
            let exe = session
                .executables
                .get(&request.executable)
                .cloned()
                .ok_or_else(|| {
                    Error::not_found(format!(
                        "no executable {} in this session",
                        request.executable
                    ))
                })?;
            let inputs =
                request
                    .inputs
                    .iter()
                    .map(|h| {
                        session.buffers.get(h).cloned().ok_or_else(|| {
                            Error::not_found(format!("no buffer {h} in this session"))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
            check_new_handles(session, &request.outputs)?;
            let stream = session
                .streams
                .entry(request.stream)
                .or_insert_with(|| self.0.client.create_stream())
                .clone();
            Ok((exe, inputs, stream))
        })?;
        let program = exe.program();
        let mut args = Vec::with_capacity(program.input_specs.len());
        let mut at = 0;
        for spec in &program.input_specs {
            let n = spec.sharding.devices().len();
            let shards = inputs.get(at..at + n).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{} input buffers given but the executable takes more",
                    inputs.len()
                ))
            })?;
            args.push(Array::assemble(spec.clone(), shards.to_vec())?);
            at += n;
        }
        if at != inputs.len() {
            return Err(Error::invalid_argument(format!(
                "{} input buffers given but the executable takes {at}",
                inputs.len()
            )));
        }
        let made: usize = program
            .output_specs
            .iter()
            .map(|s| s.sharding.devices().len())
            .sum();
        if made != request.outputs.len() {
            return Err(Error::invalid_argument(format!(
                "{} output handles given but the executable makes {made} buffers",
                request.outputs.len()
            )));
        }
        // Nobody waits here: the executors take it at once.
        let run = exe.execute_detached(
            &args,
            &ExecuteOptions {
                stream: Some(stream),
            },
        )?;
        let buffers = run.outputs.iter().flat_map(|a| a.buffers().iter().cloned());
        self.with_session(id, |session| {
            check_new_handles(session, &request.outputs)?;
            session
                .buffers
                .extend(request.outputs.iter().copied().zip(buffers));
            Ok(())
        })?;
        Ok(run.status)
    }

    /// One operation of a control stream. A failed execution still makes its
    /// output buffers, failed with its error, so that whoever reads them learns
    /// why.
    /// Returns what finishes later: a queued execution, or a read.
    fn apply(&self, id: SessionId, op: Option<control_request::Op>) -> Result<Option<Later>> {
        match op {
            Some(control_request::Op::Execute(request)) => self
                .execute(id, &request)
                .map(|status| Some(Later::Execution(status)))
                .inspect_err(|e| self.fail_outputs(id, &request.outputs, e)),
            Some(control_request::Op::ReadBuffer(request)) => {
                let buffer = self.with_session(id, |session| {
                    session
                        .buffers
                        .get(&request.handle)
                        .cloned()
                        .ok_or_else(|| {
                            Error::not_found(format!(
                                "no buffer {} in this session",
                                request.handle
                            ))
                        })
                })?;
                // Fixed-size elements only: the size must be known without
                // waiting for the buffer (this runs on a network thread).
                let size = match buffer.dtype().byte_size() {
                    Some(_) => buffer.on_host_size()?,
                    None => {
                        return Err(Error::invalid_argument(format!(
                            "buffer {} holds strings, which are not read on the control stream",
                            request.handle
                        )))
                    }
                };
                if size > MAX_INLINE_READ_BYTES {
                    return Err(Error::invalid_argument(format!(
                        "buffer {} has {size} bytes; reads on the control stream take at most \
                         {MAX_INLINE_READ_BYTES} (use GetBuffer)",
                        request.handle
                    )));
                }
                Ok(Some(Later::Read(buffer)))
            }
            Some(control_request::Op::DeleteBuffers(request)) => self.with_session(id, |session| {
                for handle in &request.handles {
                    if let Some(buffer) = session.buffers.remove(handle) {
                        buffer.delete();
                    }
                }
                Ok(None)
            }),
            Some(control_request::Op::UnloadExecutable(request)) => {
                self.with_session(id, |session| {
                    session
                        .executables
                        .remove(&request.handle)
                        .map(|_| None)
                        .ok_or_else(|| {
                            Error::not_found(format!(
                                "no executable {} in this session",
                                request.handle
                            ))
                        })
                })
            }
            Some(control_request::Op::HostCallbackResult(result)) => {
                self.with_session(id, |session| session.calls.finish(result))?;
                Ok(None)
            }
            None => Err(Error::invalid_argument(
                "a control request without an operation",
            )),
        }
    }

    /// Makes `handles` (those not in use) buffers failed with `err`.
    fn fail_outputs(&self, id: SessionId, handles: &[u64], err: &Error) {
        let Some(device) = self.0.client.devices().first().cloned() else {
            return;
        };
        let _ = self.with_session(id, |session| {
            for &handle in handles {
                session.buffers.entry(handle).or_insert_with(|| {
                    Buffer::new(
                        &self.0.client,
                        device.clone(),
                        device.default_memory_space().clone(),
                        DType::U8,
                        &[0],
                        crate::future::Event::ready(Err(err.clone())),
                    )
                });
            }
            Ok(())
        });
    }

    fn host_info(&self) -> HostInfo {
        let client = &self.0.client;
        HostInfo {
            platform_name: crate::client::PLATFORM_NAME.to_string(),
            platform_version: client.platform_version().to_string(),
            devices: client
                .devices()
                .iter()
                .map(|d| DeviceInfo {
                    local_id: d.id(),
                    kind: d.kind().to_string(),
                    local_hardware_id: i32::try_from(d.local_hardware_id()).unwrap_or(-1),
                })
                .collect(),
            languages: client.languages(0).unwrap_or_default(),
        }
    }
}

/// Refuses output handles that repeat or that a buffer of the session has.
fn check_new_handles(session: &Session, handles: &[u64]) -> Result<()> {
    let mut seen = std::collections::HashSet::with_capacity(handles.len());
    for &h in handles {
        if !seen.insert(h) {
            return Err(Error::invalid_argument(format!(
                "output handle {h} is given twice"
            )));
        }
        if session.buffers.contains_key(&h) {
            return Err(Error::already_exists(format!(
                "buffer {h} exists in this session"
            )));
        }
    }
    Ok(())
}

/// The answer to control operation `seq`: applied (`finished` false) or run.
fn control_answer(seq: u64, result: &Result<()>, finished: bool) -> ControlResponse {
    let (code, message, remote_traceback) = match result {
        Ok(()) => (0, String::new(), String::new()),
        // Bounded: one huge user error must not break the stream.
        Err(e) => (e.code() as u32, wire_message(e), wire_traceback(e)),
    };
    ControlResponse {
        seq,
        code,
        message,
        finished,
        host_callback: None,
        remote_traceback,
        data: Bytes::new(),
    }
}

/// An upload in progress: the buffer a `PutBuffer` stream fills, made by its
/// first chunk and kept by the session once the stream ends whole.
struct Upload<'a> {
    service: &'a Service,
    id: SessionId,
    /// The handle, spec and what arrived so far, once the first chunk came.
    target: Option<(u64, CheckedSpec, Received)>,
}

/// What an upload received so far.
enum Received {
    /// A dense buffer's bytes.
    Dense(Vec<u8>),
    /// A string buffer's elements, decoded as they arrive.
    Strings(StringDecoder),
}

impl<'a> Upload<'a> {
    fn new(service: &'a Service, id: SessionId) -> Upload<'a> {
        Upload {
            service,
            id,
            target: None,
        }
    }

    /// The stream ended: the buffer, if whole, joins the session.
    fn finish(self) -> Result<()> {
        let Some((handle, spec, received)) = self.target else {
            return Err(Error::invalid_argument("an empty PutBuffer stream"));
        };
        let client = &self.service.0.client;
        let buffer = match received {
            Received::Dense(data) => buffer_owning(client, &spec, data),
            Received::Strings(decoder) => decoder.finish().map(|elements| {
                let memory = spec.device.default_memory_space().clone();
                Buffer::of_strings(client, elements, &spec.dims, &spec.device, memory)
            }),
        }
        .map_err(|e| e.context(format!("buffer {handle}")))?;
        self.service.with_session(self.id, |session| {
            check_new_handles(session, &[handle])?;
            session.buffers.insert(handle, buffer);
            Ok(())
        })
    }
}

impl ChunkSink for Upload<'_> {
    fn fields(&mut self, chunk: PutBufferChunk) -> Result<()> {
        if let Some((handle, _, _)) = &self.target {
            if chunk.spec.is_some() || (chunk.handle != 0 && chunk.handle != *handle) {
                return Err(Error::invalid_argument(
                    "only the first chunk of a PutBuffer stream names the buffer",
                ));
            }
            return Ok(());
        }
        let handle = chunk.handle;
        let spec = chunk.spec.as_ref().ok_or_else(|| {
            Error::invalid_argument("the first chunk must carry the buffer's spec")
        })?;
        let spec = check_spec(&self.service.0.client, spec)?;
        self.service
            .with_session(self.id, |session| check_new_handles(session, &[handle]))?;
        let received = if spec.dtype == DType::String {
            Received::Strings(StringDecoder::new(spec.size))
        } else {
            let mut data = receive_buffer(spec.size)?;
            prefer_huge_pages(&mut data);
            Received::Dense(data)
        };
        self.target = Some((handle, spec, received));
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((handle, spec, received)) = &mut self.target else {
            // The parser delivers a chunk's fields before its data.
            return Err(Error::invalid_argument("data before the buffer's spec"));
        };
        match received {
            Received::Strings(decoder) => decoder
                .push(bytes)
                .map_err(|e| e.context(format!("buffer {handle}"))),
            Received::Dense(data) => {
                if data.len() + bytes.len() > spec.size {
                    return Err(Error::invalid_argument(format!(
                        "buffer {handle} got more than the {} bytes its spec needs",
                        spec.size
                    )));
                }
                data.extend_from_slice(bytes);
                Ok(())
            }
        }
    }
}

/// The worker's gRPC service: `PutBuffer` goes to [`Service::put_http`]
/// (copy-free, see [`bulk`](super::bulk)), every other RPC to the generated
/// server.
#[derive(Clone)]
pub(super) struct Routes {
    grpc: WorkerServer<Service>,
    shared: Arc<Shared>,
}

impl tonic::server::NamedService for Routes {
    const NAME: &'static str = <WorkerServer<Service> as tonic::server::NamedService>::NAME;
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Routes {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        tonic::codegen::Service::<http::Request<tonic::body::Body>>::poll_ready(&mut self.grpc, cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        // Refused before any of the body is read (or buffered by a decoder):
        // a stranger's request holds nothing but its headers.
        if let Err(e) = Service(self.shared.clone()).admit(&request) {
            return Box::pin(async move { Ok(to_status(&e).into_http()) });
        }
        if request.uri().path() == PUT_BUFFER_PATH {
            let service = Service(self.shared.clone());
            Box::pin(async move { Ok(service.put_http(request).await) })
        } else {
            self.grpc.call(request)
        }
    }
}

/// Asks the kernel to back the (fresh, untouched) capacity of a large receive
/// buffer with huge pages: writing into a fresh buffer page-faults on every
/// page, and with 2 MiB pages there are 512 times fewer faults. Only advice:
/// where the kernel declines, nothing changes.
fn prefer_huge_pages(data: &mut Vec<u8>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = data.as_mut_ptr() as usize;
        let end = start + data.capacity();
        let first = start.next_multiple_of(HUGE);
        let last = end - end % HUGE;
        if last > first {
            // SAFETY: [first, last) lies inside the vector's own allocation,
            // which nothing else uses; the advice does not change its contents.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = data;
}

/// What a control operation leaves to finish later, answered a second time.
enum Later {
    /// A queued execution: its status.
    Execution(Event),
    /// A read of a small buffer: its bytes once it is ready.
    Read(Buffer),
}

/// Fails the host callback calls of a session when its control stream ends.
struct DetachCalls(Arc<Shared>, SessionId);

impl Drop for DetachCalls {
    fn drop(&mut self) {
        if let Some(session) = lock(&self.0.sessions).get_mut(&self.1) {
            session.calls.detach();
        }
    }
}

/// Clamps a duration to the protocol's u32 milliseconds.
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

type ChunkStream = tokio_stream::Iter<std::vec::IntoIter<std::result::Result<BufferChunk, Status>>>;

/// A download's messages: `data` in chunks (views, no copies).
// tonic's streaming item type is `Result<_, Status>`, large by design.
#[allow(clippy::result_large_err)]
fn chunk_stream(data: Bytes) -> ChunkStream {
    let mut total_bytes = data.len() as u64;
    let messages: Vec<_> = chunks(data)
        .into_iter()
        .map(|data| {
            let total_bytes = std::mem::take(&mut total_bytes);
            Ok(BufferChunk { data, total_bytes })
        })
        .collect();
    tokio_stream::iter(messages)
}

#[tonic::async_trait]
impl WorkerRpc for Service {
    type GetBufferStream = ChunkStream;
    type ControlStream = tokio_stream::wrappers::UnboundedReceiverStream<
        std::result::Result<ControlResponse, Status>,
    >;

    async fn control(
        &self,
        request: Request<Streaming<ControlRequest>>,
    ) -> std::result::Result<Response<Self::ControlStream>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        let mut ops = request.into_inner();
        // Unbounded: the second answer of an execution is sent from the thread
        // that finishes it, which must not block. The controller bounds what is
        // in flight by what it sends.
        let (answers, stream) = tokio::sync::mpsc::unbounded_channel();
        let mut ended = self
            .with_session(id, |session| {
                session.calls.attach(answers.clone());
                Ok(session.ended.subscribe())
            })
            .map_err(|e| to_status(&e))?;
        let service = Service(self.0.clone());
        tokio::spawn(async move {
            // However the stream ends, host callbacks waiting on it fail.
            let _detach = DetachCalls(service.0.clone(), id);
            let mut expected = 1u64;
            loop {
                let message = tokio::select! {
                    message = ops.message() => message,
                    // The session closed (or the worker stops): end the stream.
                    _ = ended.changed() => return,
                };
                let op = match message {
                    Ok(Some(op)) => op,
                    Ok(None) => return,
                    Err(status) => {
                        tracing::warn!(session = %id, %status, "control stream broke");
                        // Tell the controller why, if it still listens.
                        let _ = answers.send(Err(status));
                        return;
                    }
                };
                let seq = op.seq;
                let result = if seq == expected {
                    expected += 1;
                    service.apply(id, op.op)
                } else {
                    Err(Error::invalid_argument(format!(
                        "control operation {seq} out of order (expected {expected})"
                    )))
                };
                let (later, applied) = match result {
                    Ok(later) => (later, Ok(())),
                    Err(e) => (None, Err(e)),
                };
                if answers
                    .send(Ok(control_answer(seq, &applied, false)))
                    .is_err()
                {
                    return;
                }
                // The controller may be gone by the time these finish: then
                // nobody is told.
                let answers = answers.clone();
                match later {
                    None => {}
                    Some(Later::Execution(status)) => status.on_ready(move |result| {
                        let _ = answers.send(Ok(control_answer(seq, &result, true)));
                    }),
                    Some(Later::Read(buffer)) => {
                        let ready = buffer.ready_event().clone();
                        ready.on_ready(move |status| {
                            let read = status.and_then(|()| buffer.to_host_vec());
                            let mut answer = control_answer(
                                seq,
                                &read.as_ref().map(|_| ()).map_err(Clone::clone),
                                true,
                            );
                            if let Ok(data) = read {
                                answer.data = data.into();
                            }
                            let _ = answers.send(Ok(answer));
                        });
                    }
                }
            }
        });
        Ok(Response::new(
            tokio_stream::wrappers::UnboundedReceiverStream::new(stream),
        ))
    }

    async fn put_buffer(
        &self,
        request: Request<Streaming<PutBufferChunk>>,
    ) -> std::result::Result<Response<PutBufferResponse>, Status> {
        // Never called: `Routes` serves PutBuffer itself, from the HTTP/2
        // body (`put_http`).
        let _ = request;
        Err(Status::internal(
            "PutBuffer is served by the worker's route, not the generated service",
        ))
    }

    async fn get_buffer(
        &self,
        request: Request<GetBufferRequest>,
    ) -> std::result::Result<Response<Self::GetBufferStream>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        let handle = request.get_ref().handle;
        let buffer = self
            .with_session(id, |session| {
                session
                    .buffers
                    .get(&handle)
                    .cloned()
                    .ok_or_else(|| Error::not_found(format!("no buffer {handle} in this session")))
            })
            .map_err(|e| to_status(&e))?;
        // Waiting for the data blocks: not on the network threads.
        let data = tokio::task::spawn_blocking(move || wire_bytes(&buffer))
            .await
            .map_err(|e| Status::internal(format!("the copy task failed: {e}")))?
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(chunk_stream(Bytes::from(data))))
    }

    async fn load_executable(
        &self,
        request: Request<LoadExecutableRequest>,
    ) -> std::result::Result<Response<LoadExecutableResponse>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        self.load(id, request.get_ref())
            .map(Response::new)
            .map_err(|e| to_status(&e))
    }

    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> std::result::Result<Response<ExecuteResponse>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        self.execute(id, request.get_ref())
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(ExecuteResponse {}))
    }

    async fn delete_buffers(
        &self,
        request: Request<DeleteBuffersRequest>,
    ) -> std::result::Result<Response<DeleteBuffersResponse>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        let handles = &request.get_ref().handles;
        self.with_session(id, |session| {
            if let Some(missing) = handles.iter().find(|h| !session.buffers.contains_key(h)) {
                return Err(Error::not_found(format!(
                    "no buffer {missing} in this session"
                )));
            }
            for handle in handles {
                if let Some(buffer) = session.buffers.remove(handle) {
                    buffer.delete();
                }
            }
            Ok(())
        })
        .map_err(|e| to_status(&e))?;
        Ok(Response::new(DeleteBuffersResponse {}))
    }

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> std::result::Result<Response<OpenSessionResponse>, Status> {
        self.authenticate(request.metadata(), request.remote_addr())
            .map_err(|e| to_status(&e))?;
        let req = request.into_inner();
        let version = req.max_version.min(PROTOCOL_VERSION_MAX);
        if req.min_version > req.max_version || version < req.min_version.max(PROTOCOL_VERSION_MIN)
        {
            return Err(Status::failed_precondition(format!(
                "no common protocol version: the controller speaks {}..={}, this worker {}..={}",
                req.min_version, req.max_version, PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX
            )));
        }
        let client_name: String = req.client_name.chars().take(256).collect();
        if let Some(children) = &self.0.children {
            return self.redirect(children.clone(), version, client_name).await;
        }
        if let Some(taken) = &self.0.single_session {
            if taken.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Err(Status::failed_precondition(
                    "this worker serves one session, which was already opened",
                ));
            }
        }
        let id = SessionId::random().map_err(|e| to_status(&e))?;
        tracing::info!(session = %id, client = %client_name, version, "session opened");
        lock(&self.0.sessions).insert(
            id,
            Session {
                last_seen: Instant::now(),
                client_name,
                buffers: HashMap::new(),
                executables: HashMap::new(),
                streams: HashMap::new(),
                ended: tokio::sync::watch::channel(()).0,
                calls: PendingCalls::default(),
                scope: Arc::new(SessionScope::new()),
            },
        );
        self.0.idle.session_opened();
        Ok(Response::new(OpenSessionResponse {
            version,
            session_id: Bytes::copy_from_slice(id.as_bytes()),
            host: Some(self.host_info()),
            heartbeat_interval_ms: millis(self.0.heartbeat_interval),
            session_timeout_ms: millis(self.0.session_timeout),
            redirect_address: String::new(),
            redirect_token: String::new(),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> std::result::Result<Response<HeartbeatResponse>, Status> {
        self.session(&request).map_err(|e| to_status(&e))?;
        Ok(Response::new(HeartbeatResponse {}))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> std::result::Result<Response<CloseSessionResponse>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        let removed = lock(&self.0.sessions).remove(&id);
        if let Some(session) = removed {
            tracing::info!(session = %id, client = %session.client_name, "session closed");
            let _ = end_session(&self.0.client, id, session);
        }
        Ok(Response::new(CloseSessionResponse {}))
    }
}
