//! Reaching a worker: connecting (TCP or TLS), authenticating, negotiating
//! the protocol version and opening the session, following a supervisor's
//! redirect to the session's own worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Request;

use super::liveness::{watch, Beat};
use super::{block_on, outside_runtime, Inner, RemoteSession};
use crate::error::{Error, ErrorCode, Result};
use crate::future::Event;
use crate::transport::lane::{hello_bytes, welcome_result, MAX_HELLO_BYTES};
use crate::transport::proto::worker_client::WorkerClient;
use crate::transport::proto::{
    CloseSessionRequest, LaneWelcome, OpenSessionRequest, OpenSessionResponse,
};
use crate::transport::{
    from_status, runtime, version_mismatch, versions_compatible, SessionId, Token, AUTHORIZATION,
    LANE_VERSION, MAX_MESSAGE_BYTES, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN, SESSION, VERSION,
};

/// `HOST` of `HOST:PORT` (without the brackets of an IPv6 address).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// How to reach a worker.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// `HOST:PORT` of the worker.
    pub address: String,
    /// The worker's token (`None` only for an insecure worker).
    pub token: Option<Token>,
    /// Bound of connecting and of each request.
    pub timeout: Duration,
    /// Shown in the worker's logs.
    pub client_name: String,
    /// Connect with TLS, trusting the CA certificate(s) in this PEM (the worker
    /// must serve TLS). `None`: plain TCP.
    pub tls_ca: Option<Vec<u8>>,
    /// The name the worker's certificate must carry (default: the host part of
    /// `address`).
    pub tls_domain: Option<String>,
    /// Carry the control stream on a lane of its own when the worker offers
    /// one (protocol version [`LANE_VERSION`]; plain TCP only), else on
    /// gRPC. Default: true, unless the environment sets
    /// `COLOCATED_LANE=0`.
    pub lane: bool,
}

impl ConnectOptions {
    /// Options for `address` with `token`, a 10 s timeout.
    pub fn new(address: impl Into<String>, token: Option<Token>) -> ConnectOptions {
        ConnectOptions {
            address: address.into(),
            token,
            timeout: Duration::from_secs(10),
            client_name: format!("controller pid {}", std::process::id()),
            tls_ca: None,
            tls_domain: None,
            lane: std::env::var("COLOCATED_LANE").map_or(true, |v| v != "0"),
        }
    }
}

/// What the error of a lane that nothing accepts says: no process listens
/// at the address (the one that held a session is gone).
pub(in crate::session) const NOBODY_LISTENS: &str = "nothing listens there";

/// Opens a lane to session `id` at `address` (see
/// [`lane`](crate::transport::lane)): connects, sends the hello with
/// `token`, and waits (at most `timeout`) for the worker to accept it.
/// `resume`: the lane resumes the session's control stream. Blocks the
/// calling thread (not one of an async runtime); see [`open_lane_async`].
pub(super) fn open_lane(
    address: &str,
    token: Option<&Token>,
    id: &SessionId,
    timeout: Duration,
    resume: bool,
) -> Result<std::net::TcpStream> {
    block_on(open_lane_async(address, token, id, timeout, resume))?
}

/// A connection with an opened session, before it is checked.
struct Opened {
    rpc: WorkerClient<Channel>,
    /// A connection of its own for bulk data (made at its first use), so
    /// that heartbeats and requests never wait behind a transfer's bytes.
    bulk: Endpoint,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
}

/// Where a redirect sends a controller that reached the supervisor at
/// `dialed`: `redirect`, with `dialed`'s host if its own is unspecified.
fn redirect_address(dialed: &str, redirect: &str) -> Result<String> {
    let address: std::net::SocketAddr = redirect.parse().map_err(|e| {
        Error::internal(format!(
            "worker {dialed} redirected to a bad address {redirect:?}: {e}"
        ))
    })?;
    if !address.ip().is_unspecified() {
        return Ok(address.to_string());
    }
    let host = host_of(dialed);
    Ok(if host.contains(':') {
        format!("[{host}]:{}", address.port())
    } else {
        format!("{host}:{}", address.port())
    })
}

/// The endpoint of `address` with `options`' TLS and timeouts.
pub(crate) fn endpoint(options: &ConnectOptions, address: &str) -> Result<Endpoint> {
    Ok(endpoint_without_deadline(options, address)?.timeout(options.timeout))
}

/// How long a bulk connection may stay silent while it carries a transfer
/// before a ping checks it, and how long the ping's answer may take.
const BULK_KEEPALIVE: Duration = Duration::from_secs(10);

/// The endpoint of a session's bulk data at `address`: as [`endpoint`], but
/// a request has no deadline (a transfer, or a compile, takes as long as it
/// takes: heartbeats on the session's other connection find a broken link),
/// and a connection that stops answering while it carries one is found by
/// HTTP/2 pings.
fn bulk_endpoint(options: &ConnectOptions, address: &str) -> Result<Endpoint> {
    Ok(endpoint_without_deadline(options, address)?
        .http2_keep_alive_interval(BULK_KEEPALIVE)
        .keep_alive_timeout(BULK_KEEPALIVE)
        .keep_alive_while_idle(false))
}

/// The endpoint of `address` with `options`' TLS and connect timeout.
fn endpoint_without_deadline(options: &ConnectOptions, address: &str) -> Result<Endpoint> {
    let scheme = if options.tls_ca.is_some() {
        "https"
    } else {
        "http"
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", address))
        .map_err(|e| Error::invalid_argument(format!("bad worker address {:?}: {e}", address)))?
        .connect_timeout(options.timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(crate::transport::STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(crate::transport::CONNECTION_WINDOW_BYTES))
        .max_frame_size(Some(crate::transport::MAX_FRAME_BYTES));
    if let Some(ca) = &options.tls_ca {
        let domain = match &options.tls_domain {
            Some(domain) => domain.clone(),
            None => host_of(address).to_string(),
        };
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
            .domain_name(domain);
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Error::invalid_argument(format!("bad TLS configuration: {e}")))?;
    }
    Ok(endpoint)
}

/// The `authorization` header value of `token`.
pub(super) fn authorization(
    token: &Option<Token>,
) -> Result<Option<MetadataValue<tonic::metadata::Ascii>>> {
    token
        .as_ref()
        .map(|t| {
            MetadataValue::try_from(format!("Bearer {}", t.expose()))
                .map_err(|_| Error::invalid_argument("the token cannot travel in a header"))
        })
        .transpose()
}

/// Connects to `address` with `token` (and the rest of `options`) and sends
/// `OpenSession` (on the network runtime).
async fn open_session(
    options: &ConnectOptions,
    address: &str,
    token: &Option<Token>,
) -> Result<(Opened, OpenSessionResponse)> {
    let endpoint = endpoint(options, address)?;
    let bulk = bulk_endpoint(options, address)?;
    let authorization = authorization(token)?;
    let timeout = options.timeout;
    let request = OpenSessionRequest {
        min_version: PROTOCOL_VERSION_MIN,
        max_version: PROTOCOL_VERSION_MAX,
        client_name: options.client_name.clone(),
        software_version: VERSION.to_string(),
    };
    let channel = tokio::time::timeout(timeout, endpoint.connect())
        .await
        .map_err(|_| Error::unavailable(format!("connecting to {address} timed out")))?
        .map_err(|e| Error::unavailable(format!("cannot connect to {address}: {e}")))?;
    let mut rpc = WorkerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut request = Request::new(request);
    if let Some(value) = authorization.clone() {
        request.metadata_mut().insert(AUTHORIZATION, value);
    }
    let response = rpc.open_session(request).await.map_err(|s| {
        let err = from_status(&s);
        if err.code() == ErrorCode::DeadlineExceeded {
            // Connected, but it never answered: as good as unreachable.
            return Error::unavailable(format!(
                "worker {address} did not answer within {timeout:?}"
            ));
        }
        err.context(format!("worker {address}"))
    })?;
    Ok((
        Opened {
            rpc,
            bulk,
            authorization,
        },
        response.into_inner(),
    ))
}

/// Opens a lane to session `id` at `address`: connects, sends the hello with
/// `token`, and waits (at most `timeout`) for the worker to accept it; the
/// socket comes back blocking. `resume`: the lane resumes the session's
/// control stream. A worker that nothing listens for is `unavailable`,
/// saying [`NOBODY_LISTENS`].
async fn open_lane_async(
    address: &str,
    token: Option<&Token>,
    id: &SessionId,
    timeout: Duration,
    resume: bool,
) -> Result<std::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let failed = |e: std::io::Error| Error::unavailable(format!("a lane to {address}: {e}"));
    let opening = async {
        let mut socket =
            tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => {
                        Error::unavailable(format!("a lane to {address}: {NOBODY_LISTENS} ({e})"))
                    }
                    _ => failed(e),
                })?;
        // Small operations must not wait for Nagle.
        socket.set_nodelay(true).map_err(failed)?;
        let token = token.map_or("", |t| t.expose());
        socket
            .write_all(&hello_bytes(token, id.as_bytes(), resume))
            .await
            .map_err(failed)?;
        let len = socket.read_u32_le().await.map_err(failed)? as usize;
        if len > MAX_HELLO_BYTES {
            return Err(Error::internal(format!(
                "worker {address} answered a lane's hello with {len} bytes"
            )));
        }
        let mut welcome = vec![0u8; len];
        socket.read_exact(&mut welcome).await.map_err(failed)?;
        let welcome = <LaneWelcome as prost::Message>::decode(&welcome[..])
            .map_err(|e| Error::internal(format!("worker {address}: a bad lane welcome: {e}")))?;
        welcome_result(&welcome)
            .map_err(|e| e.context(format!("worker {address} refused a lane")))?;
        let socket = socket.into_std().map_err(failed)?;
        socket.set_nonblocking(false).map_err(failed)?;
        Ok(socket)
    };
    tokio::time::timeout(timeout, opening)
        .await
        .map_err(|_| Error::unavailable(format!("a lane to {address}: timed out")))?
}

/// A worker reached: its session opened, not yet set up here.
struct Reached {
    opened: Opened,
    response: OpenSessionResponse,
    /// The token of the worker where the session lives.
    session_token: Option<Token>,
    /// Where the session lives, and the name its TLS checks.
    reached: (String, Option<String>),
    /// The session's lane, if the worker offers one and it could be opened
    /// (else the control stream goes on gRPC).
    lane: Option<std::net::TcpStream>,
}

/// Reaches the worker of `options` (on the network runtime): connects,
/// opens the session (following a supervisor's redirect) and its lane.
async fn reach(options: &ConnectOptions) -> Result<Reached> {
    let (mut opened, mut response) =
        open_session(options, &options.address, &options.token).await?;
    // The token of the worker where the session lives.
    let mut session_token = options.token.clone();
    // Where the session lives, and the name its TLS checks: another
    // worker that reads from it goes there.
    let mut reached = (options.address.clone(), options.tls_domain.clone());
    if !response.redirect_address.is_empty() {
        // A supervisor: the session lives in a worker process of its own.
        let address = redirect_address(&options.address, &response.redirect_address)?;
        let token = Token::new(std::mem::take(&mut response.redirect_token))
            .map_err(|e| e.context(format!("worker {}'s redirect", options.address)))?;
        let mut redirected = options.clone();
        redirected.tls_domain = Some(match &options.tls_domain {
            Some(domain) => domain.clone(),
            None => host_of(&options.address).to_string(),
        });
        session_token = Some(token.clone());
        (opened, response) = open_session(&redirected, &address, &Some(token))
            .await
            .map_err(|e| e.context(format!("worker {}'s session worker", options.address)))?;
        if !response.redirect_address.is_empty() {
            return Err(Error::failed_precondition(format!(
                "worker {}'s session worker at {address} redirected again",
                options.address
            )));
        }
        reached = (address, redirected.tls_domain);
    }
    let mut lane = None;
    if response.lane
        && response.version >= LANE_VERSION
        && options.lane
        && options.tls_ca.is_none()
        && (response.software_version.is_empty()
            || versions_compatible(VERSION, &response.software_version))
    {
        if let Ok(id) = SessionId::from_bytes(&response.session_id) {
            // A lane refused or cut on the way (a proxy that speaks HTTP/2
            // only) leaves the control stream on gRPC.
            let token = session_token.as_ref();
            match open_lane_async(&reached.0, token, &id, options.timeout, false).await {
                Ok(socket) => lane = Some(socket),
                Err(err) => {
                    tracing::warn!(worker = %options.address, error = %err, "no lane: the control stream goes on gRPC");
                }
            }
        }
    }
    Ok(Reached {
        opened,
        response,
        session_token,
        reached,
        lane,
    })
}

/// [`reach`], again while the worker refuses connections or cannot be
/// reached (it has not started listening yet), until `options.timeout` has
/// passed since `started`.
async fn reach_when_up(options: &ConnectOptions, started: Instant) -> Result<Reached> {
    let deadline = started + options.timeout;
    loop {
        match reach(options).await {
            Err(e) if e.code() == ErrorCode::Unavailable => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::unavailable(format!(
                        "{} (waited {:?} for it)",
                        e.message(),
                        options.timeout
                    )));
                }
                tokio::time::sleep(left.min(Duration::from_millis(100))).await;
            }
            outcome => return outcome,
        }
    }
}

impl RemoteSession {
    /// Connects to the worker, negotiates the protocol version and opens a
    /// session. Blocks for at most `options.timeout`. A worker that cannot be
    /// reached is `unavailable`; a refused token is `unauthenticated`; no common
    /// protocol version is `failed_precondition`.
    pub fn connect(options: &ConnectOptions) -> Result<RemoteSession> {
        let owned = options.clone();
        // On the network runtime's threads, which live as long as the
        // connection: what connecting allocates for good (the connection's
        // state and buffers) stays in their heaps, not in the heap of a
        // thread that connects and exits.
        let reaching = runtime()?.spawn(async move { reach(&owned).await });
        let reached = block_on(reaching)?
            .map_err(|e| Error::internal(format!("connecting to a worker failed: {e}")))??;
        RemoteSession::set_up(options, reached)
    }

    /// A session with each of `workers`, in order, reached all at once on
    /// the network runtime (no thread per worker); a worker that refuses
    /// connections or cannot be reached yet (still starting, as when a
    /// cluster manager starts it with the controller) is tried again until
    /// its `timeout` has passed. Each session is set up (its heartbeats
    /// start) as soon as its worker is reached, not once all are: a worker
    /// slow to start never leaves the others' sessions silent past their
    /// timeout.
    pub fn connect_all(workers: &[ConnectOptions]) -> Vec<Result<RemoteSession>> {
        let runtime = match runtime() {
            Ok(runtime) => runtime,
            Err(err) => return workers.iter().map(|_| Err(err.clone())).collect(),
        };
        if let Err(err) = outside_runtime() {
            return workers.iter().map(|_| Err(err.clone())).collect();
        }
        let started = Instant::now();
        let (reached_tx, reached) = std::sync::mpsc::channel();
        for (i, worker) in workers.iter().enumerate() {
            let (worker, reached_tx) = (worker.clone(), reached_tx.clone());
            runtime.spawn(async move {
                let _ = reached_tx.send((i, reach_when_up(&worker, started).await));
            });
        }
        drop(reached_tx);
        let mut sessions: Vec<Option<Result<RemoteSession>>> =
            workers.iter().map(|_| None).collect();
        // In the order the workers are reached; ends once every task ended.
        for (i, outcome) in reached.iter() {
            if let (Some(slot), Some(worker)) = (sessions.get_mut(i), workers.get(i)) {
                *slot = Some(outcome.and_then(|reached| RemoteSession::set_up(worker, reached)));
            }
        }
        sessions
            .into_iter()
            .map(|session| {
                session.unwrap_or_else(|| Err(Error::internal("connecting to a worker panicked")))
            })
            .collect()
    }

    /// Sets up the session of a worker reached with `options`: checks what
    /// it answered, and starts the session's heartbeats and control stream.
    fn set_up(options: &ConnectOptions, reached: Reached) -> Result<RemoteSession> {
        let Reached {
            opened,
            response,
            session_token,
            reached,
            lane,
        } = reached;
        let Opened {
            rpc,
            bulk,
            authorization,
        } = opened;
        let worker = &response.software_version;
        if !worker.is_empty() && !versions_compatible(VERSION, worker) {
            let worker: String = worker.chars().take(64).collect();
            let which = format!("worker {}", options.address);
            // Nothing will use the session it opened.
            let (mut rpc, id) = (rpc.clone(), response.session_id.clone());
            if let (Ok(runtime), Ok(id)) = (runtime(), SessionId::from_bytes(&id)) {
                let mut request = Request::new(CloseSessionRequest {});
                if let Some(value) = authorization.clone() {
                    request.metadata_mut().insert(AUTHORIZATION, value);
                }
                if let Ok(value) = MetadataValue::try_from(id.to_string()) {
                    request.metadata_mut().insert(SESSION, value);
                }
                runtime.spawn(async move {
                    let _ = rpc.close_session(request).await;
                });
            }
            return Err(version_mismatch(VERSION, &worker, &which));
        }
        if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION_MAX).contains(&response.version) {
            return Err(Error::failed_precondition(format!(
                "worker {} chose protocol version {}, outside {}..={}",
                options.address, response.version, PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX
            )));
        }
        let id = SessionId::from_bytes(&response.session_id)
            .map_err(|e| e.context(format!("worker {}", options.address)))?;
        let host = response.host.ok_or_else(|| {
            Error::internal(format!(
                "worker {} did not describe itself",
                options.address
            ))
        })?;
        let session = MetadataValue::try_from(id.to_string())
            .map_err(|_| Error::internal("a session id is not a header value"))?;
        let inner = Arc::new(Inner {
            rpc,
            bulk: super::bulk_link::BulkLink::new(bulk),
            id,
            version: response.version,
            host,
            address: options.address.clone(),
            session_address: reached.0,
            session_token: session_token.clone(),
            session_timeout: Duration::from_millis(u64::from(response.session_timeout_ms)),
            authorization,
            session,
            timeout: options.timeout,
            closed: AtomicBool::new(false),
            next_handle: AtomicU64::new(1),
            lost: Event::new(),
            lost_signal: tokio::sync::watch::Sender::new(false),
            control: std::sync::Mutex::new(None),
            link: tokio::sync::watch::Sender::new(Default::default()),
            beat: Beat::new(response.heartbeat_interval_ms, response.session_timeout_ms),
            host_callbacks: std::sync::Mutex::new(HashMap::new()),
            host_calls: std::sync::Mutex::default(),
            tls: options.tls_ca.clone().map(|ca| (ca, reached.1)),
            spans: std::sync::OnceLock::new(),
            watcher: std::sync::OnceLock::new(),
        });
        super::spans::start(&inner);
        watch(&inner)?;
        let lane = lane.map(|socket| {
            // A worker that stops reading for a session timeout is lost.
            let timeout =
                Duration::from_millis(u64::from(response.session_timeout_ms)).max(options.timeout);
            (socket, timeout)
        });
        let session = RemoteSession { inner };
        // Open from the start: a worker that dies ends it at once, so an idle
        // session learns of it without waiting for a heartbeat.
        session.open_control(lane)?;
        Ok(session)
    }
}
