//! Simulated workers: many worker hosts in one process that answer the real
//! protocol (gRPC for the session, a lane for the control stream) without
//! running anything, so that a controller of thousands of hosts can be
//! measured on one machine without thousands of processes' cost swamping
//! it. Beside them, as many echo servers for the raw TCP floor.
//!
//! Each simulated worker listens on a port of its own and has one CPU
//! device. It checks the token, opens sessions, answers heartbeats, loads
//! (any program: one input buffer, one output buffer), and on its lane
//! answers every operation at once: an execution finished, an upload or
//! deletion applied, anything else refused. While the bench holds it (a
//! `hold` line on stdin, until `release`), executions stay unanswered: the
//! controller's calls are in flight (it says `held` and `released` once
//! they apply). It ends when stdin closes.
//!
//! Where it differs from a real worker (none of which the bench's calls
//! rely on): it answers each operation on its own where a worker answers
//! cumulatively (so it sends a few more answers), sends no outputs' bytes
//! with an execution's answer, keeps no answers for a stream that resumes
//! (a lane that resumes is not answered `resumed`), and while held it holds
//! every answer of the operations read with an execution, and reads no
//! further.

use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::{Request, Response, Status, Streaming};

use colocated_core::transport::proto::worker_server::{Worker as WorkerRpc, WorkerServer};
use colocated_core::transport::proto::{
    control_request::Op, BufferChunk, CloseSessionRequest, CloseSessionResponse,
    CollectSpansRequest, CollectSpansResponse, ControlRequest, ControlResponse,
    DeleteBuffersRequest, DeleteBuffersResponse, DeviceInfo, ExecuteRequest, ExecuteResponse,
    GetBufferRequest, HealthRequest, HealthResponse, HeartbeatRequest, HeartbeatResponse, HostInfo,
    LaneHello, LaneWelcome, LoadExecutableRequest, LoadExecutableResponse, OpenSessionRequest,
    OpenSessionResponse, PutBufferChunk, PutBufferResponse,
};
use colocated_core::transport::{
    AUTHORIZATION, LANE_MAGIC, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN, VERSION,
};

/// Where the simulators listen: a loopback address of their own, so that
/// their listening ports (thousands of them) are not taken from the ports
/// that the controller's and the raw TCP client's connections hold on
/// 127.0.0.1, some still in `TIME_WAIT` from the run before (binding failed
/// with `EADDRINUSE` when runs followed each other).
const LISTEN: &str = "127.0.1.1:0";

/// `ErrorCode`s as the wire carries them.
const UNAUTHENTICATED: u32 = 16;
const UNIMPLEMENTED: u32 = 12;

/// What every simulated worker of the process shares.
struct Sim {
    bearer: String,
    token: String,
    next_session: AtomicU64,
    /// While true, executions are not answered.
    hold: tokio::sync::watch::Receiver<bool>,
}

impl Sim {
    fn authenticate<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match request.metadata().get(AUTHORIZATION) {
            Some(value) if value.as_bytes() == self.bearer.as_bytes() => Ok(()),
            _ => Err(Status::unauthenticated("a bad token")),
        }
    }

    fn host() -> HostInfo {
        HostInfo {
            platform_name: "colocated".into(),
            platform_version: "simulated".into(),
            devices: vec![DeviceInfo {
                local_id: 0,
                kind: "cpu".into(),
                local_hardware_id: 0,
                platform: "cpu".into(),
                backend: "cpu".into(),
                memories: Vec::new(),
            }],
            languages: vec!["native".into()],
        }
    }
}

struct Service(Arc<Sim>);

#[tonic::async_trait]
impl WorkerRpc for Service {
    type GetBufferStream = tokio_stream::Empty<Result<BufferChunk, Status>>;
    type ControlStream = tokio_stream::Empty<Result<ControlResponse, Status>>;

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        self.0.authenticate(&request)?;
        let request = request.into_inner();
        if request.max_version < PROTOCOL_VERSION_MIN {
            return Err(Status::failed_precondition("no common protocol version"));
        }
        let id = self.0.next_session.fetch_add(1, Ordering::Relaxed);
        let mut session_id = [0u8; 16];
        session_id[..8].copy_from_slice(&id.to_le_bytes());
        session_id[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        Ok(Response::new(OpenSessionResponse {
            version: request.max_version.min(PROTOCOL_VERSION_MAX),
            session_id: session_id.to_vec().into(),
            host: Some(Sim::host()),
            heartbeat_interval_ms: 1000,
            session_timeout_ms: 10_000,
            software_version: VERSION.into(),
            lane: true,
            ..Default::default()
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        self.0.authenticate(&request)?;
        Ok(Response::new(HeartbeatResponse {}))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        self.0.authenticate(&request)?;
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn health(
        &self,
        request: Request<HealthRequest>,
    ) -> Result<Response<HealthResponse>, Status> {
        self.0.authenticate(&request)?;
        Ok(Response::new(HealthResponse {
            software_version: VERSION.into(),
            protocol_min: PROTOCOL_VERSION_MIN,
            protocol_max: PROTOCOL_VERSION_MAX,
            host: Some(Sim::host()),
            ..Default::default()
        }))
    }

    async fn load_executable(
        &self,
        request: Request<LoadExecutableRequest>,
    ) -> Result<Response<LoadExecutableResponse>, Status> {
        self.0.authenticate(&request)?;
        Ok(Response::new(LoadExecutableResponse {
            num_input_buffers: 1,
            num_output_buffers: 1,
        }))
    }

    async fn put_buffer(
        &self,
        _: Request<Streaming<PutBufferChunk>>,
    ) -> Result<Response<PutBufferResponse>, Status> {
        Err(Status::unimplemented("a simulated worker holds no data"))
    }

    async fn get_buffer(
        &self,
        _: Request<GetBufferRequest>,
    ) -> Result<Response<Self::GetBufferStream>, Status> {
        Err(Status::unimplemented("a simulated worker holds no data"))
    }

    async fn delete_buffers(
        &self,
        request: Request<DeleteBuffersRequest>,
    ) -> Result<Response<DeleteBuffersResponse>, Status> {
        self.0.authenticate(&request)?;
        Ok(Response::new(DeleteBuffersResponse {}))
    }

    async fn execute(
        &self,
        _: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteResponse>, Status> {
        Err(Status::unimplemented("a simulated worker runs on its lane"))
    }

    async fn control(
        &self,
        _: Request<Streaming<ControlRequest>>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        Err(Status::unimplemented("a simulated worker runs on its lane"))
    }

    async fn collect_spans(
        &self,
        _: Request<CollectSpansRequest>,
    ) -> Result<Response<CollectSpansResponse>, Status> {
        Err(Status::unimplemented("a simulated worker keeps no spans"))
    }
}

/// Appends `message`, framed as on a lane.
fn frame(message: &impl Message, out: &mut Vec<u8>) {
    out.extend_from_slice(&(message.encoded_len() as u32).to_le_bytes());
    message.encode(out).expect("a Vec grows");
}

/// The answer of one operation.
fn answer(request: ControlRequest) -> (ControlResponse, bool) {
    let seq = request.seq;
    match request.op {
        Some(Op::Execute(_)) => (
            ControlResponse {
                seq,
                finished: true,
                ..Default::default()
            },
            true,
        ),
        Some(
            Op::PutSmallBuffer(_)
            | Op::DeleteBuffers(_)
            | Op::UnloadExecutable(_)
            | Op::HostCallbackResult(_),
        )
        | None => (
            ControlResponse {
                seq,
                ..Default::default()
            },
            false,
        ),
        Some(_) => (
            ControlResponse {
                seq,
                code: UNIMPLEMENTED,
                message: "a simulated worker holds no data".into(),
                finished: true,
                ..Default::default()
            },
            false,
        ),
    }
}

/// Serves a lane: the hello, then an answer to every operation.
async fn serve_lane(mut socket: TcpStream, sim: Arc<Sim>) -> std::io::Result<()> {
    let mut magic = [0u8; 16];
    socket.read_exact(&mut magic).await?;
    if &magic != LANE_MAGIC {
        return Ok(());
    }
    let len = socket.read_u32_le().await? as usize;
    if len > 4096 {
        return Ok(());
    }
    let mut hello = vec![0u8; len];
    socket.read_exact(&mut hello).await?;
    let hello = LaneHello::decode(&hello[..]).map_err(std::io::Error::other)?;
    let accepted = hello.token == sim.token;
    let mut out = Vec::new();
    frame(
        &LaneWelcome {
            code: if accepted { 0 } else { UNAUTHENTICATED },
            message: String::new(),
        },
        &mut out,
    );
    socket.write_all(&out).await?;
    if !accepted {
        return Ok(());
    }
    let mut hold = sim.hold.clone();
    let mut buf = BytesMut::new();
    loop {
        if socket.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
        out.clear();
        let mut executions = false;
        while buf.len() >= 4 {
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 4 + len {
                buf.reserve(4 + len - buf.len());
                break;
            }
            buf.advance(4);
            let request = ControlRequest::decode(buf.split_to(len).freeze())
                .map_err(std::io::Error::other)?;
            let (response, execution) = answer(request);
            executions |= execution;
            frame(&response, &mut out);
        }
        if executions {
            // Held: the executions stay in flight until released.
            let _ = hold.wait_for(|held| !held).await;
        }
        socket.write_all(&out).await?;
    }
}

/// Echoes 64-byte messages (the raw TCP floor's peer).
async fn echo(mut socket: TcpStream) -> std::io::Result<()> {
    let mut message = [0u8; 64];
    loop {
        socket.read_exact(&mut message).await?;
        socket.write_all(&message).await?;
    }
}

/// Role `sim`: `workers` simulated workers and as many echo servers, on one
/// thread; prints `workers A B ...` and `echoes A B ...`.
pub fn serve(workers: usize, token: String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (held, hold) = tokio::sync::watch::channel(false);
    let sim = Arc::new(Sim {
        bearer: format!("Bearer {token}"),
        token,
        next_session: AtomicU64::new(1),
        hold,
    });
    runtime.block_on(async move {
        let (to_grpc, incoming) =
            tokio::sync::mpsc::unbounded_channel::<std::io::Result<TcpStream>>();
        let server = tonic::transport::Server::builder()
            .add_service(WorkerServer::new(Service(sim.clone())))
            .serve_with_incoming(tokio_stream::wrappers::UnboundedReceiverStream::new(
                incoming,
            ));
        tokio::spawn(server);
        let mut addresses = Vec::new();
        for _ in 0..workers {
            let listener = TcpListener::bind(LISTEN).await.expect("bind");
            addresses.push(listener.local_addr().expect("address").to_string());
            let (sim, to_grpc) = (sim.clone(), to_grpc.clone());
            tokio::spawn(async move {
                while let Ok((socket, _)) = listener.accept().await {
                    let _ = socket.set_nodelay(true);
                    let (sim, to_grpc) = (sim.clone(), to_grpc.clone());
                    tokio::spawn(async move {
                        let mut first = [0u8; 1];
                        match socket.peek(&mut first).await {
                            Ok(1) if first[0] == 0 => {
                                let _ = serve_lane(socket, sim).await;
                            }
                            Ok(1) => {
                                let _ = to_grpc.send(Ok(socket));
                            }
                            _ => {}
                        }
                    });
                }
            });
        }
        let mut echoes = Vec::new();
        for _ in 0..workers {
            let listener = TcpListener::bind(LISTEN).await.expect("bind");
            echoes.push(listener.local_addr().expect("address").to_string());
            tokio::spawn(async move {
                while let Ok((socket, _)) = listener.accept().await {
                    let _ = socket.set_nodelay(true);
                    tokio::spawn(echo(socket));
                }
            });
        }
        println!("workers {}", addresses.join(" "));
        println!("echoes {}", echoes.join(" "));
        use std::io::Write;
        std::io::stdout().flush().ok();
        // Commands on stdin, on a thread of their own; its end ends all.
        let (ended, end) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let (value, said) = match line.as_deref().map(str::trim) {
                    Ok("hold") => (true, "held"),
                    Ok("release") => (false, "released"),
                    _ => break,
                };
                held.send_replace(value);
                println!("{said}");
                std::io::stdout().flush().ok();
            }
            let _ = ended.send(());
        });
        let _ = end.await;
    });
    std::process::exit(0);
}
