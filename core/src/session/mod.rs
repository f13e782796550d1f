//! The controller side: a session on one worker host.
//!
//! This file holds the session ([`RemoteSession`]) and its requests that
//! wait for an answer. The rest, by concern: `connect.rs` (reaching a worker
//! and opening the session), `control.rs` (the ordered control stream),
//! `bulk.rs` (buffer uploads and downloads), `host_calls.rs` (the controller's
//! host callbacks that programs on the worker call), `liveness.rs`
//! (heartbeats, and losing the worker).

use crate::transport::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::Request;

use crate::error::{Error, Result};
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;
use crate::transport::proto::worker_client::WorkerClient;
use crate::transport::proto::{CloseSessionRequest, HostInfo, LoadExecutableRequest};
use crate::transport::{runtime, SessionId, AUTHORIZATION, SESSION};

#[cfg(any(test, feature = "testing"))]
mod blocking;
mod bulk;
mod bulk_link;
mod connect;
mod control;
mod health;
mod host_calls;
mod liveness;
mod retry;
mod spans;

pub use crate::future::{Completion, Progress};
pub use bulk::UploadStop;
pub(crate) use connect::endpoint;
pub use connect::ConnectOptions;
use control::Control;
pub use health::{health, status_report, WorkerHealth};

/// An open session on a worker host. Heartbeats keep it open while the value
/// lives; dropping it (or `RemoteSession::disconnect`) closes it on the worker.
pub struct RemoteSession {
    inner: Arc<Inner>,
}

struct Inner {
    rpc: WorkerClient<Channel>,
    /// The connection of bulk data (`PutBuffer`, `GetBuffer`, which bypass
    /// the generated client: see [`bulk`](crate::transport::bulk)) and
    /// loads: one of its own, so that heartbeats and requests on `rpc`'s
    /// never wait behind a transfer's bytes (on a slow link they would
    /// outlast their deadline, and the link would look broken). Made at its
    /// first use, closed once idle (see [`bulk_link`]).
    bulk: bulk_link::BulkLink,
    id: SessionId,
    version: u32,
    host: HostInfo,
    address: String,
    /// Where the session lives: `address`, or for a supervisor, the worker
    /// process it redirected the session to.
    session_address: String,
    /// The token of the worker where the session lives (a lane's hello
    /// carries it).
    session_token: Option<crate::transport::Token>,
    /// How long the worker keeps the session without hearing from this
    /// process: a broken link that heals within it resumes the session.
    session_timeout: Duration,
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
    /// The control stream, opened with the session.
    control: std::sync::Mutex<Option<Arc<Control>>>,
    /// Whether the link is up, as the control stream sees it: requests of
    /// their own wait for it after a broken link (see [`retry`]).
    link: tokio::sync::watch::Sender<retry::Link>,
    /// When to send heartbeats, and when the worker was last heard.
    beat: liveness::Beat,
    /// Host callbacks of the session's executables, by executable handle.
    host_callbacks: std::sync::Mutex<HashMap<u64, Vec<LoadedHostCallback>>>,
    /// The host callback calls running here or whose result the worker
    /// has not taken yet, by call id (see `host_calls`).
    host_calls: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// The CA certificates and name the connection's TLS checks, if it has
    /// TLS (another worker that reads from this one connects the same way).
    tls: Option<(Vec<u8>, Option<String>)>,
    /// The import of the worker's spans, when this process writes a trace.
    spans: std::sync::OnceLock<spans::Import>,
    /// Told what happens to the link and the session (see
    /// [`RemoteSession::watch`]).
    watcher: std::sync::OnceLock<Watcher>,
}

/// What happens to a session's link and life (see [`RemoteSession::watch`]).
#[derive(Clone, Debug)]
pub enum SessionEvent {
    /// The link broke (why): the control stream connects again, and work
    /// waits.
    Disconnected(Error),
    /// The control stream resumed on a new connection: work goes on.
    Reconnected,
    /// The session ended for good (why): its work fails with the error.
    Lost(Error),
}

/// Whoever a session tells its events.
type Watcher = Box<dyn Fn(SessionEvent) + Send + Sync>;

/// Runs `future` on the transport runtime and waits for it; a caller already
/// on a tokio runtime gets `failed_precondition` instead of a deadlock.
fn block_on<F: std::future::Future>(future: F) -> Result<F::Output> {
    outside_runtime()?;
    Ok(runtime()?.block_on(future))
}

/// `failed_precondition` on a thread of an async runtime, which a blocking
/// call would deadlock.
fn outside_runtime() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::failed_precondition(
            "blocking colocated call made from inside an async runtime; call it from a plain thread",
        ));
    }
    Ok(())
}

/// Waits (blocking the calling thread, which must not be one of an async
/// runtime) for every request of `tasks` at once: their outcomes, in order
/// (`None`, a request that never went out: `internal`).
pub fn wait_all<T: Send + 'static>(
    tasks: Vec<Option<tokio::task::JoinHandle<Result<T>>>>,
) -> Vec<Result<T>> {
    let count = tasks.len();
    let waited = block_on(async move {
        let mut outcomes = Vec::with_capacity(count);
        for task in tasks {
            outcomes.push(match task {
                Some(task) => task.await.unwrap_or_else(|e| {
                    Err(Error::internal(format!("a request's task failed: {e}")))
                }),
                None => Err(Error::internal("a request that was never sent")),
            });
        }
        outcomes
    });
    match waited {
        Ok(outcomes) => outcomes,
        Err(e) => (0..count).map(|_| Err(e.clone())).collect(),
    }
}

impl RemoteSession {
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

    /// The address of the process the session lives in: the worker's
    /// [`address`](Self::address), or, for a supervisor that runs each
    /// session in a worker process of its own, that process's. Another
    /// worker that reads this session's buffers (a copy between workers)
    /// connects there.
    pub fn session_address(&self) -> &str {
        &self.inner.session_address
    }

    /// Ready, with `unavailable`, once the worker is lost for good: the
    /// link stayed down longer than the worker keeps a session, or the
    /// worker no longer has the session (it restarted). Every later call of
    /// this session fails at once with that error; a new session is the way
    /// back once the worker is up (a client opens one by itself for new
    /// work).
    pub fn lost(&self) -> &Event {
        &self.inner.lost
    }

    /// Tells `watcher` every [`SessionEvent`] from now on, on the thread
    /// where it happens (a network thread: it must return at once). A
    /// session has one watcher: false, and nothing changes, when it has one.
    pub fn watch(&self, watcher: impl Fn(SessionEvent) + Send + Sync + 'static) -> bool {
        let set = self.inner.watcher.set(Box::new(watcher)).is_ok();
        // Lost before it was watched: it is told at once.
        if let (true, Some(err)) = (set, self.inner.lost.error()) {
            self.inner.tell(SessionEvent::Lost(err));
        }
        set
    }

    /// Whether this process closed the session (`close`, or the client
    /// closing its workers), rather than lost it.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// A handle no buffer of this session has used yet.
    pub fn new_handle(&self) -> u64 {
        self.inner.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// Loads `executable` (bytes of `LoadedExecutable::serialize`,
    /// for the worker's devices) as `handle` of this session; returns how many
    /// input buffers an execution takes and how many it makes.
    pub fn load_executable(&self, handle: u64, executable: Vec<u8>) -> Result<(u32, u32)> {
        self.load_executable_for(handle, executable, std::collections::HashMap::new())
    }

    /// [`load_executable`](Self::load_executable), telling the worker the
    /// controller's id of each of its devices (worker id -> controller id):
    /// while it loads the program, devices named by the controller's ids
    /// resolve to its own (`controller_device_id`).
    pub fn load_executable_for(
        &self,
        handle: u64,
        executable: Vec<u8>,
        controller_device_ids: std::collections::HashMap<u32, u32>,
    ) -> Result<(u32, u32)> {
        let load = self.load_executable_started(handle, executable, controller_device_ids)?;
        wait_all(vec![Some(load)])
            .pop()
            .unwrap_or_else(|| Err(Error::internal("a load without an answer")))
    }

    /// [`load_executable_for`](Self::load_executable_for) without waiting:
    /// the request goes out on a network thread now; [`wait_all`] waits for
    /// its answer (and for others' at the same time).
    pub fn load_executable_started(
        &self,
        handle: u64,
        executable: Vec<u8>,
        controller_device_ids: std::collections::HashMap<u32, u32>,
    ) -> Result<tokio::task::JoinHandle<Result<(u32, u32)>>> {
        let inner = self.inner.clone();
        let request = LoadExecutableRequest {
            handle,
            executable: Bytes::from(executable),
            controller_device_ids,
        };
        Ok(runtime()?.spawn(async move {
            // A load that reached the worker before its link broke is
            // answered as the first when it goes out again.
            let mut attempts = inner.attempts();
            loop {
                // On the bulk connection: a compile takes as long as it takes.
                let bulk = inner.bulk.take()?;
                let mut rpc = WorkerClient::new(bulk.channel.clone())
                    .max_decoding_message_size(crate::transport::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(crate::transport::MAX_MESSAGE_BYTES);
                let load = async {
                    let answer = rpc
                        .load_executable(inner.bulk_request(request.clone()))
                        .await
                        .map_err(|s| retry::Failed::of(&inner, &s));
                    drop(bulk);
                    answer
                };
                match attempts.run(load).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        return Ok((r.num_input_buffers, r.num_output_buffers));
                    }
                    Err(failed) => attempts.again(failed).await?,
                }
            }
        }))
    }
}

impl RemoteSession {
    /// Ends the session now: work in flight there and every later request
    /// fail with `cancelled`, and the worker frees what the session holds
    /// (best effort, never blocking: the worker also frees it once
    /// heartbeats stop). Closing twice does nothing.
    pub fn close(&self) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let err = Error::cancelled(format!(
            "the session with worker {} was closed",
            self.inner.address
        ));
        self.inner.end(err);
        self.send_close();
    }

    fn send_close(&self) {
        let inner = self.inner.clone();
        if let Ok(runtime) = runtime() {
            runtime.spawn(async move {
                // What the worker recorded goes before the session does.
                inner.fetch_spans().await;
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

impl Drop for RemoteSession {
    fn drop(&mut self) {
        if !self.inner.closed.swap(true, Ordering::SeqCst) {
            self.send_close();
        }
    }
}

impl Inner {
    /// Tells the session's watcher, if any, `event`.
    fn tell(&self, event: SessionEvent) {
        if let Some(watcher) = self.watcher.get() {
            watcher(event);
        }
    }

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
}
