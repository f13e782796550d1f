//! The worker's gRPC service: authenticating requests, finding their
//! session, opening sessions (or redirecting them to a session worker), and
//! the generated service's RPCs, which call the other parts of the worker.

use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tonic::codegen::http;
use tonic::{Request, Response, Status, Streaming};

use super::control::ControlLoop;
use super::sessions::{end_session, session_id, unknown_session};
use super::{lock, Session, Shared};
use crate::error::{Error, Result};
use crate::executor::SessionScope;
use crate::transport::host_calls::{ControlSink, PendingCalls};
use crate::transport::isolate::Children;
use crate::transport::proto::worker_server::Worker as WorkerRpc;
use crate::transport::proto::{
    CloseSessionRequest, CloseSessionResponse, CollectSpansRequest, CollectSpansResponse,
    ControlRequest, ControlResponse, DeleteBuffersRequest, DeleteBuffersResponse, DeviceInfo,
    ExecuteRequest, ExecuteResponse, GetBufferRequest, HealthRequest, HealthResponse,
    HeartbeatRequest, HeartbeatResponse, HostInfo, LoadExecutableRequest, LoadExecutableResponse,
    MemoryInfo, OpenSessionRequest, OpenSessionResponse, PutBufferChunk, PutBufferResponse,
};
use crate::transport::{
    to_status, version_mismatch, SessionId, AUTHORIZATION, LANE_VERSION, PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN, REDIRECT_VERSION,
};

pub(crate) struct Service(pub(crate) Arc<Shared>);

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
                "this worker runs each session in a process of its own (--isolate-sessions), \
                 which needs protocol version {REDIRECT_VERSION}; the controller speaks at most \
                 {version}: upgrade the controller"
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
            software_version: self.0.software_version.clone(),
            lane: false,
        }))
    }

    /// Refuses a request without the worker's token (read from its headers:
    /// the router checks them before anything decodes the request).
    pub(super) fn authenticate(
        &self,
        headers: &http::HeaderMap,
        remote: Option<SocketAddr>,
    ) -> Result<()> {
        let Some(token) = &self.0.token else {
            return Ok(());
        };
        let presented = headers
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

    /// The authenticated session a request belongs to, marked as alive.
    pub(super) fn session<T>(&self, request: &Request<T>) -> Result<SessionId> {
        self.authenticate(request.metadata().as_ref(), request.remote_addr())?;
        let id = session_id(request.metadata().as_ref())?;
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
    pub(super) fn with_session<T>(
        &self,
        id: SessionId,
        f: impl FnOnce(&mut Session) -> Result<T>,
    ) -> Result<T> {
        match lock(&self.0.sessions).get_mut(&id) {
            Some(session) => f(session),
            None => Err(Error::unauthenticated("the session closed")),
        }
    }

    fn host_info(&self) -> HostInfo {
        let client = &self.0.client;
        HostInfo {
            platform_name: crate::device::PLATFORM_NAME.to_string(),
            platform_version: client.platform_version().to_string(),
            devices: client
                .devices()
                .iter()
                .map(|d| DeviceInfo {
                    local_id: d.id(),
                    kind: d.kind().to_string(),
                    local_hardware_id: i32::try_from(d.local_hardware_id()).unwrap_or(-1),
                    platform: d.platform().to_string(),
                    backend: d.backend().to_string(),
                    memories: d
                        .memory_spaces()
                        .iter()
                        .map(|m| MemoryInfo {
                            id: m.id(),
                            kind: m.kind() as u32,
                        })
                        .collect(),
                })
                .collect(),
            languages: client.languages(0).unwrap_or_default(),
        }
    }
}

/// Clamps a duration to the protocol's u32 milliseconds.
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

#[tonic::async_trait]
impl WorkerRpc for Service {
    type GetBufferStream =
        tokio_stream::Empty<std::result::Result<crate::transport::proto::BufferChunk, Status>>;
    type ControlStream = tokio_stream::wrappers::UnboundedReceiverStream<
        std::result::Result<ControlResponse, Status>,
    >;

    async fn control(
        &self,
        request: Request<Streaming<ControlRequest>>,
    ) -> std::result::Result<Response<Self::ControlStream>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        let resume = request.metadata().contains_key(crate::transport::RESUME);
        let mut ops = request.into_inner();
        // Unbounded: the second answer of an execution is sent from the thread
        // that finishes it, which must not block. The controller bounds what is
        // in flight by what it sends.
        let (answers, stream) = tokio::sync::mpsc::unbounded_channel();
        let farewell = answers.clone();
        let (mut control, mut ended) =
            ControlLoop::open(self, id, ControlSink::Stream(answers), resume)
                .map_err(|e| to_status(&e))?;
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    biased;
                    message = ops.message() => message,
                    // The session closed (or the worker stops): end the
                    // stream, saying so first.
                    _ = ended.changed() => {
                        if let Some(goodbye) = control.goodbye() {
                            let _ = farewell.send(Ok(goodbye));
                        }
                        return;
                    }
                    // No further operation has arrived: one answer for those
                    // taken.
                    () = std::future::ready(()), if control.unanswered() => {
                        if !control.idle() {
                            return;
                        }
                        continue;
                    }
                };
                let op = match message {
                    Ok(Some(op)) => op,
                    Ok(None) => return,
                    Err(status) => {
                        tracing::warn!(session = %id, %status, "control stream broke");
                        control.broke(status);
                        return;
                    }
                };
                if !control.take(op) {
                    return;
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
        // Never called: `Routes` serves GetBuffer itself (`get_http`), from
        // the buffer's memory.
        let _ = request;
        Err(Status::internal(
            "GetBuffer is served by the worker's route, not the generated service",
        ))
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
        self.authenticate(request.metadata().as_ref(), request.remote_addr())
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
        let controller = &req.software_version;
        if !controller.is_empty()
            && !crate::transport::versions_compatible(controller, &self.0.software_version)
        {
            let controller: String = controller.chars().take(64).collect();
            let err = version_mismatch(&controller, &self.0.software_version, "this worker");
            return Err(to_status(&err));
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
                version,
                client_name,
                buffers: FxHashMap::default(),
                executables: FxHashMap::default(),
                streams: FxHashMap::default(),
                ended: tokio::sync::watch::channel(()).0,
                calls: PendingCalls::new(version >= crate::transport::RESUME_VERSION),
                stream: super::resume::SessionStream::new(version),
                scope: Arc::new(SessionScope::new()),
                spans: None,
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
            software_version: self.0.software_version.clone(),
            lane: self.0.lane && version >= LANE_VERSION,
        }))
    }

    async fn health(
        &self,
        request: Request<HealthRequest>,
    ) -> std::result::Result<Response<HealthResponse>, Status> {
        self.authenticate(request.metadata().as_ref(), request.remote_addr())
            .map_err(|e| to_status(&e))?;
        let sessions = match &self.0.children {
            Some(children) => children.live(),
            None => lock(&self.0.sessions).len(),
        };
        Ok(Response::new(HealthResponse {
            software_version: self.0.software_version.clone(),
            protocol_min: PROTOCOL_VERSION_MIN,
            protocol_max: PROTOCOL_VERSION_MAX,
            host: Some(self.host_info()),
            sessions: u32::try_from(sessions).unwrap_or(u32::MAX),
            uptime_ms: u64::try_from(self.0.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> std::result::Result<Response<HeartbeatResponse>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        let received = &request.get_ref().received;
        if !received.is_empty() {
            let stream = self.with_session(id, |session| Ok(session.stream.clone()));
            if let Ok(stream) = stream {
                stream.received(received);
            }
        }
        Ok(Response::new(HeartbeatResponse {}))
    }

    async fn collect_spans(
        &self,
        request: Request<CollectSpansRequest>,
    ) -> std::result::Result<Response<CollectSpansResponse>, Status> {
        let id = self.session(&request).map_err(|e| to_status(&e))?;
        self.spans_for(id, request.get_ref().max_spans)
            .map(Response::new)
            .map_err(|e| to_status(&e))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> std::result::Result<Response<CloseSessionResponse>, Status> {
        // A session that is gone already is closed: nothing to refuse.
        self.authenticate(request.metadata().as_ref(), request.remote_addr())
            .map_err(|e| to_status(&e))?;
        let id = session_id(request.metadata().as_ref()).map_err(|e| to_status(&e))?;
        let removed = lock(&self.0.sessions).remove(&id);
        if let Some(session) = removed {
            tracing::info!(session = %id, client = %session.client_name, "session closed");
            let _ = end_session(&self.0.client, id, session);
        }
        Ok(Response::new(CloseSessionResponse {}))
    }
}
