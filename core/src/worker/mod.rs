//! The worker side: a gRPC server that opens authenticated sessions for
//! controllers and serves them with this process's local host.
//!
//! This file holds the worker itself: its options, starting and stopping it,
//! and the state its sessions share. The rest, by concern: `service.rs` (the
//! gRPC service: authentication, session lookup, the RPCs), `routes.rs` (what
//! a request goes through first), `control.rs` (loading, executing and the
//! control stream), `bulk.rs` (buffer uploads and downloads), `sessions.rs`
//! (ending sessions, reaping silent ones).

use crate::transport::lock;
use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::buffer::Buffer;
use crate::client::Client;
use crate::dispatch::Stream;
use crate::error::{Error, Result};
use crate::executable::LoadedExecutable;
use crate::executor::SessionScope;
use crate::transport::admission::{
    Admission, Incoming, DEFAULT_HANDSHAKE_TIMEOUT, MAX_STREAMS_PER_CONNECTION,
};
use crate::transport::host_calls::PendingCalls;
use crate::transport::idle::{expire_when_idle, IdleWatch};
use crate::transport::isolate::{expire_when_stdin_closes, Children, IsolateCommand};
use crate::transport::proto::worker_server::WorkerServer;
use crate::transport::refusals::RefusalLog;
use crate::transport::{runtime, SessionId, Token, MAX_MESSAGE_BYTES};

mod buffers;
mod bulk;
mod control;
mod copies;
mod flags;
mod isolation;
mod lane;
mod loads;
mod resume;
mod routes;
mod service;
mod sessions;
mod spans;
mod status;

pub use flags::{parse_pjrt_option, seconds, FlagKind, WorkerFlag, WorkerFlags, WORKER_FLAGS};
pub use isolation::WorkerKind;
pub use status::{StatusFlags, STATUS_FLAGS};

use routes::Routes;
pub(super) use service::Service;
use sessions::{end_session, end_single_session, reap_sessions, wait_ended};

/// How long a stopping worker waits for open connections to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The most header bytes a request may carry (its token and session id need
/// a few hundred).
const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

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
    /// there (see [`isolate`](crate::transport::isolate)). `None`: sessions are served
    /// in this process.
    pub isolate: Option<IsolateCommand>,
    /// Serve exactly one session: a second `OpenSession` is refused, and
    /// [`Worker::idle_expired`] becomes true once that session ended, if
    /// none opened within `handshake_timeout`, or once this process's stdin
    /// closes (a supervisor's child: the supervisor holds the other end, so
    /// the child never outlives it). A thread reads stdin to its end.
    pub single_session: bool,
    /// The colocated version the worker reports and checks controllers
    /// against (default: this build's, [`VERSION`](crate::transport::VERSION)).
    /// Tests set another to stand for a worker of another release.
    pub software_version: String,
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
            software_version: crate::transport::VERSION.to_string(),
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
    /// Looked up on every operation: a fast hash (the keys are random, or
    /// come from authenticated controllers).
    sessions: Mutex<FxHashMap<SessionId, Session>>,
    heartbeat_interval: Duration,
    session_timeout: Duration,
    admission: Arc<Admission>,
    refusals: RefusalLog,
    idle: Arc<IdleWatch>,
    /// `WorkerOptions::software_version`.
    software_version: String,
    /// When the worker started (its uptime in `Health`).
    started: std::time::Instant,
    /// A supervisor's session workers (`WorkerOptions::isolate`).
    children: Option<Arc<Children>>,
    /// `WorkerOptions::single_session`, and whether its session was taken.
    single_session: Option<std::sync::atomic::AtomicBool>,
    /// Reads of buffers granted to other workers.
    grants: copies::Grants,
    /// Connections to the workers this one fetched from.
    peers: copies::Peers,
    /// Control operations received, over all sessions.
    operations: std::sync::atomic::AtomicU64,
    /// Whether sessions may open lanes (not when the worker serves TLS).
    lane: bool,
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
    /// The protocol version negotiated for the session.
    version: u32,
    client_name: String,
    /// The session's buffers, by the handles its controller gave them
    /// (a fast hash: the controller that chooses them is authenticated).
    buffers: FxHashMap<u64, Buffer>,
    /// The session's loaded executables, by handle.
    executables: FxHashMap<u64, Loaded>,
    /// The worker's stream for each stream of the controller.
    streams: FxHashMap<u64, Stream>,
    /// Dropped with the session: its control stream ends then.
    ended: tokio::sync::watch::Sender<()>,
    /// Calls of the controller's host callbacks by programs of the session.
    calls: PendingCalls,
    /// The session's control stream, across the connections it travels on.
    stream: Arc<resume::SessionStream>,
    /// The session as its programs see it (`ExecutionContext::session`).
    scope: Arc<SessionScope>,
    /// The spans kept for the controller, once it asked (`CollectSpans`).
    spans: Option<Arc<crate::trace::SpanCollector>>,
}

/// An executable a session loaded, with what its load was answered.
struct Loaded {
    exe: LoadedExecutable,
    /// The digest of the request that loaded it: the same request again is
    /// a retry after a broken link (a controller never reuses a handle),
    /// answered as the first was.
    request: u64,
    answer: crate::transport::proto::LoadExecutableResponse,
}

impl Worker {
    /// Binds `options.listen` and starts serving `client`'s devices (on the
    /// transport's threads); returns once the socket accepts connections.
    /// From then on `client`'s idle executor threads sleep at once rather
    /// than spin (its work comes from the network, a round trip apart).
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
        // Work comes from the network: idle executors sleep at once.
        client.0.local.dispatcher.stop_spinning();
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
            sessions: Mutex::new(FxHashMap::default()),
            heartbeat_interval: options.heartbeat_interval,
            session_timeout: options.session_timeout,
            admission: Admission::new(options.handshake_timeout),
            refusals: RefusalLog::default(),
            idle: Arc::default(),
            software_version: options.software_version.clone(),
            started: std::time::Instant::now(),
            children: options
                .isolate
                .clone()
                .map(|command| Arc::new(Children::new(command, local_addr.ip()))),
            single_session: options
                .single_session
                .then(|| std::sync::atomic::AtomicBool::new(false)),
            grants: copies::Grants::default(),
            peers: copies::Peers::default(),
            operations: std::sync::atomic::AtomicU64::new(0),
            lane: options.tls.is_none(),
        });
        let service = Routes {
            grpc: WorkerServer::new(Service(shared.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            shared: shared.clone(),
        };
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let incoming = Incoming::new(listener, shared.admission.clone());
        let incoming = lane::route(runtime, incoming, &shared);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &options.tls {
            let identity = tonic::transport::Identity::from_pem(&tls.cert_pem, &tls.key_pem);
            builder = builder
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(|e| Error::invalid_argument(format!("bad TLS certificate or key: {e}")))?;
        }
        let server = builder
            .initial_stream_window_size(Some(crate::transport::STREAM_WINDOW_BYTES))
            .initial_connection_window_size(Some(crate::transport::CONNECTION_WINDOW_BYTES))
            .max_frame_size(Some(crate::transport::MAX_FRAME_BYTES))
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
            // Finds dead peers. A live controller's heartbeats (every third of
            // the session timeout when idle) come before a ping is due.
            .http2_keepalive_interval(Some(
                (options.session_timeout / 2).max(options.heartbeat_interval),
            ))
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
            expire_when_stdin_closes(shared.idle.clone())?;
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

    /// Connections this worker accepted so far, closed since or not.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.admission.accepted()
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

    /// Control operations this worker received so far, over all sessions
    /// (executions, reads, small uploads, deletions, ...): what a
    /// controller's work cost it in messages.
    pub fn control_operations(&self) -> u64 {
        self.shared
            .operations
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Requests this worker refused so far (a wrong or missing token, an
    /// unknown session, an unknown or expired read grant), the ones its
    /// rate-limited log left out included: strangers at the port, or a
    /// controller and its workers that disagree.
    pub fn refused_requests(&self) -> u64 {
        self.shared.refusals.total()
    }

    /// Final answers of control operations the open sessions keep for
    /// their controllers, which have not said yet that they received them
    /// (a connection that resumes a session's control stream gets them
    /// again; see [`RESUME_VERSION`](crate::transport::RESUME_VERSION)).
    pub fn kept_answers(&self) -> usize {
        lock(&self.shared.sessions)
            .values()
            .map(|s| s.stream.kept())
            .sum()
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
