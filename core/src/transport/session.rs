//! The controller side: a session on one worker host.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Request;

use super::buffers::chunks;
use super::bulk::{put_call, PutBody};
use super::host_calls::result_of;
use super::proto::worker_client::WorkerClient;
use super::proto::{
    control_request, BufferSpec, CloseSessionRequest, ControlRequest, ControlResponse,
    DeleteBuffersRequest, ExecuteRequest, GetBufferRequest, HeartbeatRequest, HostCallbackCall,
    HostInfo, LoadExecutableRequest, OpenSessionRequest, OpenSessionResponse, ReadBufferRequest,
    UnloadExecutableRequest,
};
use super::{
    from_status, runtime, SessionId, Token, AUTHORIZATION, MAX_MESSAGE_BYTES, PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN, SESSION,
};
use crate::error::{Error, ErrorCode, Result};
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;

/// `HOST` of `HOST:PORT` (without the brackets of an IPv6 address).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// How long a heartbeat may take before the worker counts as lost: twice the
/// interval the worker asked for, at least half a second.
fn heartbeat_timeout(interval_ms: u32) -> Duration {
    Duration::from_millis(u64::from(interval_ms).saturating_mul(2).max(500))
}

/// The controller's end of a session's ordered control stream.
struct Control {
    /// Operations go out under this lock, so `seq` order is stream order.
    sender: std::sync::Mutex<ControlSender>,
    state: Arc<ControlState>,
}

struct ControlSender {
    tx: tokio::sync::mpsc::UnboundedSender<ControlRequest>,
    /// The `seq` of the last operation sent.
    sent: u64,
}

/// What the worker has answered on the control stream.
#[derive(Default)]
struct ControlState {
    /// The `seq` of the last answered operation.
    acked: AtomicU64,
    /// The first failure not yet reported by `flush`.
    failed: std::sync::Mutex<Option<Error>>,
    /// Set when the stream ended or broke before answering everything.
    broken: std::sync::Mutex<Option<Error>>,
    changed: tokio::sync::Notify,
    /// What to run when an execution finishes, by `seq`.
    pending: std::sync::Mutex<HashMap<u64, Finish>>,
}

/// Runs once with the outcome of an operation: on a network thread, so it must
/// not block.
pub type Completion = Box<dyn FnOnce(Result<()>) + Send>;

/// What runs when an operation finishes, with the data of a read.
type Finish = Box<dyn FnOnce(Result<Bytes>) + Send>;

/// A completion that ignores the data of the answer.
fn finish_of(completion: Completion) -> Finish {
    Box::new(move |result: Result<Bytes>| completion(result.map(|_| ())))
}

impl Control {
    /// Sends `op` with the next `seq`; see `RemoteSession::send_control`.
    fn send(
        &self,
        op: control_request::Op,
        completion: Option<Finish>,
        lost: &Event,
    ) -> Result<()> {
        let mut sender = lock(&self.sender);
        if let Some(err) = self.state.broken() {
            drop(sender);
            if let Some(completion) = completion {
                completion(Err(err.clone()));
            }
            return Err(err);
        }
        let seq = sender.sent + 1;
        let has_completion = completion.is_some();
        if let Some(completion) = completion {
            lock(&self.state.pending).insert(seq, completion);
        }
        let request = ControlRequest { seq, op: Some(op) };
        if sender.tx.send(request).is_err() {
            drop(sender);
            let err = Error::unavailable("the control stream is closed");
            self.state.complete(seq, Err(err.clone()));
            return Err(err);
        }
        sender.sent = seq;
        drop(sender);
        if has_completion {
            // The stream may have broken (or the worker been lost) between the
            // check above and the insertion: then nobody else will run it.
            if let Some(err) = self.state.broken().or_else(|| lost.error()) {
                self.state.complete(seq, Err(err));
            }
        }
        Ok(())
    }
}

impl ControlState {
    /// Waits until the worker answered operation `seq`; the stream's error if it
    /// broke first.
    async fn settled(&self, seq: u64) -> Result<()> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.acked.load(Ordering::SeqCst) >= seq {
                return Ok(());
            }
            if let Some(err) = lock(&self.broken).clone() {
                return Err(err);
            }
            changed.await;
        }
    }

    /// Runs the completion of operation `seq`, if it is still waiting.
    fn complete(&self, seq: u64, result: Result<Bytes>) {
        let completion = lock(&self.pending).remove(&seq);
        if let Some(completion) = completion {
            completion(result);
        }
    }

    /// Fails every waiting completion with `err` (the stream broke, the worker
    /// is lost).
    fn fail_all(&self, err: &Error) {
        let drained: Vec<Finish> = lock(&self.pending).drain().map(|(_, c)| c).collect();
        for completion in drained {
            completion(Err(err.clone()));
        }
    }

    /// The error that ended the stream, if it ended.
    fn broken(&self) -> Option<Error> {
        lock(&self.broken).clone()
    }
}

/// The outcome a control answer reports.
fn answer_result(answer: &ControlResponse) -> Result<()> {
    if answer.code == 0 {
        return Ok(());
    }
    let code = ErrorCode::from_u32(answer.code).unwrap_or(ErrorCode::Internal);
    let err = Error::new(code, answer.message.clone());
    Err(if answer.remote_traceback.is_empty() {
        err
    } else {
        err.with_remote_traceback(answer.remote_traceback.clone())
    })
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads the worker's answers of a control stream.
async fn read_answers(
    mut answers: tonic::Streaming<ControlResponse>,
    state: Arc<ControlState>,
    inner: Weak<Inner>,
) {
    let ended = loop {
        match answers.message().await {
            Ok(Some(mut answer)) => {
                if let Some(call) = answer.host_callback.take() {
                    run_host_callback(&inner, call);
                    continue;
                }
                let result = answer_result(&answer);
                if answer.finished {
                    let data = std::mem::take(&mut answer.data);
                    state.complete(answer.seq, result.map(|()| data));
                    continue;
                }
                if let Err(err) = result {
                    tracing::debug!(seq = answer.seq, error = %err, "control operation failed");
                    lock(&state.failed).get_or_insert(err.clone());
                    state.complete(answer.seq, Err(err));
                }
                state.acked.fetch_max(answer.seq, Ordering::SeqCst);
                state.changed.notify_waiters();
            }
            Ok(None) => break Error::unavailable("the control stream ended"),
            // The worker never fails an open stream itself: the link broke.
            Err(status) => {
                break Error::unavailable(format!(
                    "the control stream broke: {}",
                    from_status(&status).message()
                ))
            }
        }
    };
    if let Some(inner) = inner.upgrade() {
        let ended = ended.clone().context(format!("worker {}", inner.address));
        if !inner.closed.load(Ordering::SeqCst) {
            // Ordered work can no longer reach the worker.
            inner.lose(ended);
        }
    }
    lock(&state.broken).get_or_insert(ended.clone());
    state.changed.notify_waiters();
    state.fail_all(&ended);
}

/// Runs a worker program's call of a host callback on the blocking pool and
/// sends its result back on the control stream.
fn run_host_callback(inner: &Weak<Inner>, call: HostCallbackCall) {
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let callback = lock(&inner.host_callbacks)
        .get(&call.executable)
        .and_then(|callbacks| callbacks.get(call.index as usize))
        .cloned();
    let Ok(runtime) = runtime() else {
        return;
    };
    runtime.spawn_blocking(move || {
        let outcome = match callback {
            Some(callback) => callback.call(&call.input),
            None => Err(Error::not_found(format!(
                "executable {} has no host callback {}",
                call.executable, call.index
            ))),
        };
        let op = control_request::Op::HostCallbackResult(result_of(call.call, outcome));
        let control = lock(&inner.control).clone();
        let sent = match control {
            Some(control) => control.send(op, None, &inner.lost),
            None => Err(Error::unavailable("the control stream is closed")),
        };
        if let Err(err) = sent {
            tracing::debug!(worker = %inner.address, error = %err, "a host callback result was not sent");
        }
    });
}

/// A progress report of a bulk transfer: `(bytes done, bytes in all)`.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

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
        }
    }
}

/// An open session on a worker host. Heartbeats keep it open while the value
/// lives; dropping it (or [`RemoteSession::disconnect`]) closes it on the worker.
pub struct RemoteSession {
    inner: Arc<Inner>,
}

struct Inner {
    rpc: WorkerClient<Channel>,
    /// The connection under `rpc`, for `PutBuffer`, which bypasses the
    /// generated client (see [`bulk`](super::bulk)).
    channel: Channel,
    id: SessionId,
    version: u32,
    host: HostInfo,
    address: String,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    session: MetadataValue<tonic::metadata::Ascii>,
    timeout: Duration,
    closed: AtomicBool,
    next_handle: AtomicU64,
    /// Set (with `unavailable`) once the worker is lost.
    lost: Event,
    /// Becomes `true` when `lost` is set: transfers in flight wait on it, as
    /// their connection may hang for a while after the worker is lost.
    lost_signal: tokio::sync::watch::Sender<bool>,
    /// The control stream, opened on first use.
    control: std::sync::Mutex<Option<Arc<Control>>>,
    /// Bound of a heartbeat: a worker silent for this long is lost.
    heartbeat_timeout: Duration,
    /// Host callbacks of the session's executables, by executable handle.
    host_callbacks: std::sync::Mutex<HashMap<u64, Vec<LoadedHostCallback>>>,
}

/// Runs `future` on the transport runtime and waits for it; a caller already
/// on a tokio runtime gets `failed_precondition` instead of a deadlock.
fn block_on<F: std::future::Future>(future: F) -> Result<F::Output> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::failed_precondition(
            "blocking colocated call made from inside an async runtime; call it from a plain thread",
        ));
    }
    Ok(runtime()?.block_on(future))
}

/// A connection with an opened session, before it is checked.
struct Opened {
    rpc: WorkerClient<Channel>,
    channel: Channel,
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

/// Connects to `address` with `token` (and the rest of `options`) and sends
/// `OpenSession`.
fn open_session(
    options: &ConnectOptions,
    address: &str,
    token: &Option<Token>,
) -> Result<(Opened, OpenSessionResponse)> {
    let scheme = if options.tls_ca.is_some() {
        "https"
    } else {
        "http"
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", address))
        .map_err(|e| Error::invalid_argument(format!("bad worker address {:?}: {e}", address)))?
        .connect_timeout(options.timeout)
        .timeout(options.timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(super::STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(super::CONNECTION_WINDOW_BYTES))
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2))
        .keep_alive_while_idle(true);
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
    let authorization = token
        .as_ref()
        .map(|t| {
            MetadataValue::try_from(format!("Bearer {}", t.expose()))
                .map_err(|_| Error::invalid_argument("the token cannot travel in a header"))
        })
        .transpose()?;
    let address = address.to_string();
    let timeout = options.timeout;
    let request = OpenSessionRequest {
        min_version: PROTOCOL_VERSION_MIN,
        max_version: PROTOCOL_VERSION_MAX,
        client_name: options.client_name.clone(),
    };
    let connect_authorization = authorization.clone();
    let (rpc, channel, response) = block_on(async move {
        let channel = tokio::time::timeout(timeout, endpoint.connect())
            .await
            .map_err(|_| Error::unavailable(format!("connecting to {address} timed out")))?
            .map_err(|e| Error::unavailable(format!("cannot connect to {address}: {e}")))?;
        let mut rpc = WorkerClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let mut request = Request::new(request);
        if let Some(value) = connect_authorization {
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
        Ok::<_, Error>((rpc, channel, response.into_inner()))
    })??;
    Ok((
        Opened {
            rpc,
            channel,
            authorization,
        },
        response,
    ))
}

impl RemoteSession {
    /// Connects to the worker, negotiates the protocol version and opens a
    /// session. Blocks for at most `options.timeout`. A worker that cannot be
    /// reached is `unavailable`; a refused token is `unauthenticated`; no common
    /// protocol version is `failed_precondition`.
    pub fn connect(options: &ConnectOptions) -> Result<RemoteSession> {
        let (mut opened, mut response) = open_session(options, &options.address, &options.token)?;
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
            (opened, response) = open_session(&redirected, &address, &Some(token))
                .map_err(|e| e.context(format!("worker {}'s session worker", options.address)))?;
            if !response.redirect_address.is_empty() {
                return Err(Error::failed_precondition(format!(
                    "worker {}'s session worker at {address} redirected again",
                    options.address
                )));
            }
        }
        let Opened {
            rpc,
            channel,
            authorization,
        } = opened;
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
            channel,
            id,
            version: response.version,
            host,
            address: options.address.clone(),
            authorization,
            session,
            timeout: options.timeout,
            closed: AtomicBool::new(false),
            next_handle: AtomicU64::new(1),
            lost: Event::new(),
            lost_signal: tokio::sync::watch::Sender::new(false),
            control: std::sync::Mutex::new(None),
            heartbeat_timeout: heartbeat_timeout(response.heartbeat_interval_ms),
            host_callbacks: std::sync::Mutex::new(HashMap::new()),
        });
        let interval = Duration::from_millis(u64::from(response.heartbeat_interval_ms.max(100)));
        runtime()?.spawn(send_heartbeats(Arc::downgrade(&inner), interval));
        Ok(RemoteSession { inner })
    }

    /// The session id the worker gave.
    pub fn id(&self) -> SessionId {
        self.inner.id
    }

    /// The negotiated protocol version.
    pub fn version(&self) -> u32 {
        self.inner.version
    }

    /// What the worker said about itself: platform, devices, languages.
    pub fn host(&self) -> &HostInfo {
        &self.inner.host
    }

    /// The worker's address.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// One heartbeat, now: `Ok` while the worker holds the session.
    pub fn heartbeat(&self) -> Result<()> {
        let inner = self.inner.clone();
        block_on(async move { inner.heartbeat().await })?
    }

    /// Ready, with `unavailable`, once the worker is lost: a heartbeat or a
    /// request failed to reach it (it died, or the link dropped). Every later
    /// call of this session fails at once with that error; a new session
    /// (`connect` again) is the way back once the worker is up.
    pub fn lost(&self) -> &Event {
        &self.inner.lost
    }

    /// A handle no buffer of this session has used yet.
    pub fn new_handle(&self) -> u64 {
        self.inner.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// Uploads `data` as buffer `handle` of this session, shaped by `spec` (the
    /// bytes, row-major, must be exactly the spec's size; a string buffer's
    /// are its `StringElements`, and need protocol version
    /// [`STRINGS_VERSION`](super::STRINGS_VERSION)). Streams in chunks of
    /// [`CHUNK_BYTES`](super::CHUNK_BYTES); the request has no deadline (bulk
    /// data takes what it takes; a dead link fails through keepalive).
    pub fn put_buffer(&self, handle: u64, spec: BufferSpec, data: Bytes) -> Result<()> {
        self.put_buffer_with_progress(handle, spec, data, None)
    }

    /// [`put_buffer`](Self::put_buffer), calling `progress(sent, total)` (bytes)
    /// as each chunk goes to the network, and `(total, total)` once the worker
    /// has the buffer. Called on a network thread: keep it quick.
    pub fn put_buffer_with_progress(
        &self,
        handle: u64,
        spec: BufferSpec,
        data: Bytes,
        progress: Option<Progress>,
    ) -> Result<()> {
        let total = data.len() as u64;
        let data = tokio_stream::iter(chunks(data));
        block_on(put_future(
            self.inner.clone(),
            handle,
            spec,
            total,
            data,
            progress,
        ))?
    }

    /// [`put_buffer_with_progress`](Self::put_buffer_with_progress) without
    /// blocking: `done` runs with the outcome on a network thread.
    pub fn put_buffer_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        data: Bytes,
        progress: Option<Progress>,
        done: Completion,
    ) {
        let total = data.len() as u64;
        let data = tokio_stream::iter(chunks(data));
        self.put_stream_then(handle, spec, total, data, progress, done);
    }

    /// Uploads buffer `handle` of `total` bytes from chunks that arrive on
    /// `chunks` (at least one; each at most
    /// [`CHUNK_BYTES`](super::CHUNK_BYTES)), sending each as soon as
    /// it comes, so that whoever produces them overlaps with the network.
    /// `done` runs with the outcome on a network thread; fewer or more bytes
    /// than `total` fail the upload on the worker.
    pub fn put_buffer_chunks_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        total: u64,
        chunks: tokio::sync::mpsc::Receiver<Bytes>,
        progress: Option<Progress>,
        done: Completion,
    ) {
        let data = tokio_stream::wrappers::ReceiverStream::new(chunks);
        self.put_stream_then(handle, spec, total, data, progress, done);
    }

    fn put_stream_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        total: u64,
        data: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
        progress: Option<Progress>,
        done: Completion,
    ) {
        // On a thread of the blocking pool: the compiler cannot prove tonic's
        // client-streaming future `Send`, so it cannot be spawned as a task.
        let inner = self.inner.clone();
        match runtime() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || {
                    let upload = put_future(inner, handle, spec, total, data, progress);
                    done(tokio::runtime::Handle::current().block_on(upload));
                });
            }
            Err(err) => done(Err(err)),
        }
    }

    /// Downloads buffer `handle` of this session (waits until it is ready): the
    /// bytes it travels as (see [`put_buffer`](Self::put_buffer)).
    pub fn get_buffer(&self, handle: u64) -> Result<Vec<u8>> {
        self.get_buffer_with_progress(handle, None)
    }

    /// [`get_buffer`](Self::get_buffer), calling `progress(received, total)`
    /// (bytes) after each chunk arrives. Called on a network thread.
    pub fn get_buffer_with_progress(
        &self,
        handle: u64,
        progress: Option<Progress>,
    ) -> Result<Vec<u8>> {
        self.settle()?;
        let mut data = Vec::new();
        let sink = |total: u64, chunk: &[u8]| {
            if data.is_empty() && total > 0 {
                // A hint from the peer: reserve no more than one message ahead
                // of the bytes that really arrive.
                data.reserve(usize::try_from(total).unwrap_or(0).min(MAX_MESSAGE_BYTES));
            }
            data.extend_from_slice(chunk);
            if let Some(progress) = &progress {
                progress(data.len() as u64, total.max(data.len() as u64));
            }
            Ok(())
        };
        block_on(get_future(self.inner.clone(), handle, sink))??;
        Ok(data)
    }

    /// Downloads buffer `handle` without blocking: `sink(total, chunk)` gets
    /// each chunk in order (`total` as the worker announced it), then `done`
    /// the outcome; both run on a network thread. A sink error ends the
    /// download with that error.
    pub fn get_buffer_then(
        &self,
        handle: u64,
        sink: impl FnMut(u64, &[u8]) -> Result<()> + Send + 'static,
        done: Completion,
    ) {
        match runtime() {
            Ok(runtime) => {
                let download = get_future(self.inner.clone(), handle, sink);
                runtime.spawn(async move { done(download.await) });
            }
            Err(err) => done(Err(err)),
        }
    }

    /// Deletes buffers of this session; `not_found` (and nothing deleted) if any
    /// handle names no buffer.
    pub fn delete_buffers(&self, handles: &[u64]) -> Result<()> {
        self.settle()?;
        let inner = self.inner.clone();
        let request = DeleteBuffersRequest {
            handles: handles.to_vec(),
        };
        block_on(async move {
            inner.alive()?;
            let mut rpc = inner.rpc.clone();
            rpc.delete_buffers(inner.request(request))
                .await
                .map(|_| ())
                .map_err(|s| inner.fail(&s))
        })?
    }

    /// Loads `executable` (bytes of [`LoadedExecutable::serialize`](crate::LoadedExecutable::serialize),
    /// for the worker's devices) as `handle` of this session; returns how many
    /// input buffers an execution takes and how many it makes.
    pub fn load_executable(&self, handle: u64, executable: Vec<u8>) -> Result<(u32, u32)> {
        let inner = self.inner.clone();
        let request = LoadExecutableRequest {
            handle,
            executable: Bytes::from(executable),
        };
        block_on(async move {
            inner.alive()?;
            let mut rpc = inner.rpc.clone();
            rpc.load_executable(inner.bulk_request(request))
                .await
                .map(|r| {
                    let r = r.into_inner();
                    (r.num_input_buffers, r.num_output_buffers)
                })
                .map_err(|s| inner.fail(&s))
        })?
    }

    /// Queues executable `executable` on buffers `inputs` (argument-major),
    /// naming its output buffers `outputs`, on the controller's `stream`
    /// (executions on one stream run in order). Returns once queued.
    pub fn execute(
        &self,
        executable: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
    ) -> Result<()> {
        self.settle()?;
        let inner = self.inner.clone();
        let request = ExecuteRequest {
            executable,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            stream,
        };
        block_on(async move {
            inner.alive()?;
            let mut rpc = inner.rpc.clone();
            rpc.execute(inner.request(request))
                .await
                .map(|_| ())
                .map_err(|s| inner.fail(&s))
        })?
    }

    /// Queues an execution like [`execute`](Self::execute), without waiting
    /// for the worker: it goes on the session's ordered control stream, so
    /// many can be in flight. An execution the worker refuses still makes its
    /// outputs, failed with the reason (reading one raises it); [`flush`](Self::flush)
    /// also reports the first refusal.
    pub fn execute_async(
        &self,
        executable: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
    ) -> Result<()> {
        self.send_control(
            control_request::Op::Execute(ExecuteRequest {
                executable,
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
                stream,
            }),
            None,
        )
    }

    /// [`execute_async`](Self::execute_async), then `done` with the outcome
    /// once the execution has run on the worker (or was refused, or the
    /// worker was lost). `done` always runs exactly once, on a network thread
    /// or (when the session is already lost) on this one.
    pub fn execute_then(
        &self,
        executable: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
        done: Completion,
    ) {
        let op = control_request::Op::Execute(ExecuteRequest {
            executable,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            stream,
        });
        // A failure to send has run `done` already.
        let _ = self.send_control(op, Some(done));
    }

    /// Deletes buffers of this session after every operation sent before
    /// (on the control stream), without waiting. Best effort: a lost worker
    /// has freed them already.
    pub fn delete_buffers_later(&self, handles: &[u64]) {
        if self.inner.closed.load(Ordering::SeqCst) || self.inner.lost.is_ready() {
            return;
        }
        let op = control_request::Op::DeleteBuffers(DeleteBuffersRequest {
            handles: handles.to_vec(),
        });
        if let Err(err) = self.send_control(op, None) {
            tracing::debug!(worker = %self.inner.address, error = %err, "buffers not deleted");
        }
    }

    /// Unloads executable `handle` of this session after every operation sent
    /// before (on the control stream), without waiting, and forgets its host
    /// callbacks. Best effort: a lost worker has freed it already.
    pub fn unload_executable_later(&self, handle: u64) {
        lock(&self.inner.host_callbacks).remove(&handle);
        if self.inner.closed.load(Ordering::SeqCst) || self.inner.lost.is_ready() {
            return;
        }
        let op = control_request::Op::UnloadExecutable(UnloadExecutableRequest { handle });
        if let Err(err) = self.send_control(op, None) {
            tracing::debug!(worker = %self.inner.address, error = %err, "executable not unloaded");
        }
    }

    /// Sends one operation on the control stream; `completion` runs when it
    /// has finished (executions), or at once with the error if it cannot be
    /// sent (which is also returned).
    fn send_control(&self, op: control_request::Op, completion: Option<Completion>) -> Result<()> {
        self.send_control_then(op, completion.map(finish_of))
    }

    /// `send_control` with a completion that gets the answer's data.
    fn send_control_then(&self, op: control_request::Op, completion: Option<Finish>) -> Result<()> {
        match self.inner.alive().and_then(|()| self.control()) {
            Ok(control) => control.send(op, completion, &self.inner.lost),
            Err(err) => {
                if let Some(completion) = completion {
                    completion(Err(err.clone()));
                }
                Err(err)
            }
        }
    }

    /// Reads buffer `handle` (at most
    /// [`MAX_INLINE_READ_BYTES`](super::MAX_INLINE_READ_BYTES)) on the
    /// control stream, after every operation sent before, without blocking:
    /// `done` gets its bytes once it is ready on the worker (on a network
    /// thread, or on this one when the session is already lost).
    pub fn read_small_buffer_then(&self, handle: u64, done: Box<dyn FnOnce(Result<Bytes>) + Send>) {
        let op = control_request::Op::ReadBuffer(ReadBufferRequest { handle });
        // A failure to send has run `done` already.
        let _ = self.send_control_then(op, Some(done));
    }

    /// Host callbacks of executable `executable` (a handle of this session):
    /// programs of it that run on the worker call them, and each call runs
    /// here, on a thread of the transport's blocking pool. Kept until the
    /// session ends.
    pub fn set_host_callbacks(&self, executable: u64, callbacks: Vec<LoadedHostCallback>) {
        lock(&self.inner.host_callbacks).insert(executable, callbacks);
    }

    /// Waits until the worker has taken every operation sent on the control
    /// stream; returns the first refusal since the last `flush`, if any.
    pub fn flush(&self) -> Result<()> {
        self.settle()?;
        let control = lock(&self.inner.control).clone();
        match control.and_then(|c| lock(&c.state.failed).take()) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Waits until the worker has taken every control operation sent so far
    /// (requests that read or delete buffers come after them).
    fn settle(&self) -> Result<()> {
        let Some(control) = lock(&self.inner.control).clone() else {
            return Ok(());
        };
        let sent = lock(&control.sender).sent;
        if control.state.acked.load(Ordering::SeqCst) >= sent {
            return Ok(());
        }
        block_on(async move { control.state.settled(sent).await })?
    }

    /// The control stream, opened on first use (without blocking: operations
    /// queue until the worker answers).
    fn control(&self) -> Result<Arc<Control>> {
        let mut slot = lock(&self.inner.control);
        if let Some(control) = &*slot {
            return Ok(control.clone());
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let state = Arc::new(ControlState::default());
        let inner = self.inner.clone();
        let reader_state = state.clone();
        runtime()?.spawn(async move {
            let mut rpc = inner.rpc.clone();
            let request =
                inner.bulk_request(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
            match rpc.control(request).await {
                Ok(answers) => {
                    // The reader must not keep the session alive.
                    let weak = Arc::downgrade(&inner);
                    drop(inner);
                    read_answers(answers.into_inner(), reader_state, weak).await;
                }
                Err(status) => {
                    // Without its control stream the session cannot go on.
                    let err = Error::unavailable(format!(
                        "worker {}: cannot open the control stream: {}",
                        inner.address,
                        from_status(&status).message()
                    ));
                    inner.lose(err.clone());
                    lock(&reader_state.broken).get_or_insert(err.clone());
                    reader_state.changed.notify_waiters();
                    reader_state.fail_all(&err);
                }
            }
        });
        let control = Arc::new(Control {
            sender: std::sync::Mutex::new(ControlSender { tx, sent: 0 }),
            state,
        });
        *slot = Some(control.clone());
        Ok(control)
    }

    /// Closes the session on the worker (idempotent).
    pub fn disconnect(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let inner = self.inner.clone();
        block_on(async move {
            let mut rpc = inner.rpc.clone();
            rpc.close_session(inner.request(CloseSessionRequest {}))
                .await
                .map(|_| ())
                .map_err(|s| inner.fail(&s))
        })?
    }
}

impl Drop for RemoteSession {
    fn drop(&mut self) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Best effort, never blocking: the worker also frees the session once
        // heartbeats stop.
        let inner = self.inner.clone();
        if let Ok(runtime) = runtime() {
            runtime.spawn(async move {
                let mut rpc = inner.rpc.clone();
                let _ = tokio::time::timeout(
                    inner.timeout,
                    rpc.close_session(inner.request(CloseSessionRequest {})),
                )
                .await;
            });
        }
    }
}

impl Inner {
    /// A request carrying the token and the session id.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = self.bulk_request(message);
        request.set_timeout(self.timeout);
        request
    }

    /// Like `request`, without a deadline (for bulk transfers).
    fn bulk_request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        request.metadata_mut().insert(SESSION, self.session.clone());
        request
    }

    /// Fails at once when the worker is lost.
    fn alive(&self) -> Result<()> {
        match self.lost.error() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// `transfer`'s outcome, or the worker's loss if that comes first (a
    /// transfer on a hung connection would wait for its keepalive).
    async fn unless_lost<T>(
        &self,
        transfer: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut lost = self.lost_signal.subscribe();
        tokio::select! {
            outcome = transfer => outcome,
            _ = lost.wait_for(|lost| *lost) => Err(self
                .lost
                .error()
                .unwrap_or_else(|| Error::unavailable(format!("worker {} lost", self.address)))),
        }
    }

    /// The error of a failed request; a worker that cannot be reached is lost.
    fn fail(&self, status: &tonic::Status) -> Error {
        let err = from_status(status).context(format!("worker {}", self.address));
        if err.code() == ErrorCode::Unavailable {
            self.lose(err.clone());
        }
        err
    }

    fn lose(&self, err: Error) {
        if self.lost.error().is_none() {
            tracing::warn!(worker = %self.address, error = %err, "worker lost");
        }
        self.lost.set_if_pending(Err(err.clone()));
        self.lost_signal.send_replace(true);
        // Executions in flight there will never finish.
        let control = lock(&self.control).clone();
        if let Some(control) = control {
            control.state.fail_all(&err);
        }
    }

    async fn heartbeat(&self) -> Result<()> {
        self.alive()?;
        let mut rpc = self.rpc.clone();
        let mut request = self.bulk_request(HeartbeatRequest {});
        request.set_timeout(self.heartbeat_timeout);
        let silent = || {
            let err = Error::unavailable(format!(
                "worker {} did not answer a heartbeat within {:?}",
                self.address, self.heartbeat_timeout
            ));
            self.lose(err.clone());
            Err(err)
        };
        // A hung worker answers nothing: the deadline ends the call here
        // (tonic's client-side timeout, whose status is not always
        // `DEADLINE_EXCEEDED` itself, or this one).
        match tokio::time::timeout(self.heartbeat_timeout, rpc.heartbeat(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) if from_status(&status).code() != ErrorCode::DeadlineExceeded => {
                Err(self.fail(&status))
            }
            _ => silent(),
        }
    }
}

/// Uploads buffer `handle` (`total` bytes, arriving as `data` chunks: at least
/// one, each under the message limit), reporting progress.
async fn put_future(
    inner: Arc<Inner>,
    handle: u64,
    spec: BufferSpec,
    total: u64,
    data: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
    progress: Option<Progress>,
) -> Result<()> {
    let mut sent = 0u64;
    let report = progress.clone();
    let data = Box::pin(tokio_stream::StreamExt::map(data, move |data: Bytes| {
        sent += data.len() as u64;
        if let Some(report) = &report {
            // Reported when the chunk is handed over; the last report waits
            // for the worker's answer.
            report(sent.min(total.saturating_sub(1)), total);
        }
        data
    }));
    inner.alive()?;
    let (metadata, _, ()) = inner.bulk_request(()).into_parts();
    let call = put_call(
        inner.channel.clone(),
        metadata,
        PutBody::new(handle, spec, data),
    );
    inner
        .unless_lost(async { call.await.map_err(|s| inner.fail(&s)) })
        .await?;
    if let Some(progress) = progress {
        progress(total, total);
    }
    Ok(())
}

/// Streams buffer `handle` into `sink(total, chunk)`.
async fn get_future(
    inner: Arc<Inner>,
    handle: u64,
    mut sink: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    inner.alive()?;
    let mut rpc = inner.rpc.clone();
    let download = async {
        let mut stream = rpc
            .get_buffer(inner.bulk_request(GetBufferRequest { handle }))
            .await
            .map_err(|s| inner.fail(&s))?
            .into_inner();
        let mut total = 0u64;
        while let Some(chunk) = stream.message().await.map_err(|s| inner.fail(&s))? {
            if chunk.total_bytes > 0 {
                total = chunk.total_bytes;
            }
            sink(total, &chunk.data)?;
        }
        Ok(())
    };
    inner.unless_lost(download).await
}

/// Keeps a session open while its `RemoteSession` lives.
async fn send_heartbeats(inner: Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = inner.heartbeat().await {
            if inner.lost.is_ready() {
                return;
            }
            tracing::warn!(worker = %inner.address, error = %e, "heartbeat failed");
        }
    }
}
