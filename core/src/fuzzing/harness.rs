//! The in-process worker the fuzz targets run against: a peer with a
//! bystander session whose data must stay intact, and each RPC's run.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use super::wire::{grpc_body, split_messages, Wire};
use super::{local_client, Rpc, COPY_FUNCTION};
use crate::compiler::CompileOptions;
use crate::dtype::DType;
use crate::program::Program;
use crate::sharding::Sharding;
use crate::spec::ArraySpec;
use crate::transport::proto::worker_server::Worker as WorkerRpc;
use crate::transport::proto::{
    BufferSpec, CloseSessionRequest, ControlRequest, HeartbeatRequest, LoadExecutableRequest,
    OpenSessionRequest, PutBufferChunk,
};
use crate::transport::{
    SessionId, Token, AUTHORIZATION, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN, SESSION,
};
use crate::worker::{Service, Worker, WorkerOptions};

/// An in-process worker with a bystander session, started once per process.
pub(super) struct Harness {
    pub(super) peer: Peer,
    pub(super) executable: Vec<u8>,
    pub(super) bystander: SessionId,
}

/// A worker and what calls it as its controllers would.
pub(super) struct Peer {
    pub(super) worker: Worker,
    pub(super) token: Token,
}

/// What the bystander session's buffer 1 holds (`f32[2]` on device 0).
const BYSTANDER_DATA: [u8; 8] = *b"bystandr";

pub(super) fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(Harness::start)
}

/// The result of a request the worker must serve.
fn check<T>(what: &str, result: std::result::Result<T, Status>) -> T {
    result.unwrap_or_else(|status| panic!("{what} failed: {status:?}"))
}

pub(super) fn block_on<F: std::future::Future>(future: F) -> F::Output {
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

    pub(super) fn run(&self, rpc: Rpc, wire: Wire) {
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
                    .heartbeat(
                        self.peer
                            .request(HeartbeatRequest::default(), Some(self.bystander)),
                    )
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
    pub(super) fn run_lane(&self, opened: bool, body: &[u8]) {
        use std::io::{Read, Write};
        let id = block_on(self.throwaway_session());
        let mut bytes = if opened {
            crate::transport::lane::hello_bytes(self.peer.token.expose(), id.as_bytes(), false)
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

    /// A loaded executable takes its handle: the same request again (a
    /// retry after a broken link) is answered as the first, and another
    /// request for the handle never loads.
    async fn load_executable(&self, id: SessionId, wire: Wire) {
        let Some(load) = Self::unary::<LoadExecutableRequest>(wire).await else {
            return;
        };
        let service = self.peer.service();
        let Ok(first) = service
            .load_executable(self.peer.request(load.clone(), Some(id)))
            .await
        else {
            return;
        };
        let again = service
            .load_executable(self.peer.request(load.clone(), Some(id)))
            .await;
        assert_eq!(
            again.map(|r| r.into_inner()).map_err(|s| s.code()),
            Ok(first.into_inner())
        );
        let mut other = load;
        other.executable = other.executable.iter().chain(&[0u8]).copied().collect();
        let other = service
            .load_executable(self.peer.request(other, Some(id)))
            .await;
        assert!(
            other.is_err(),
            "another request loaded under a taken handle"
        );
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
