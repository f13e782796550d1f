//! The worker's end of lanes (see [`crate::transport::lane`]): telling a
//! lane from gRPC on an accepted connection, checking its hello, and the
//! thread that takes its operations and answers on it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

use super::control::ControlLoop;
use super::service::Service;
use super::sessions::unknown_session;
use super::{lock, Shared};
use crate::error::{Error, Result};
use crate::transport::admission::{AdmissionGuard, AdmittedStream, Incoming};
use crate::transport::host_calls::ControlSink;
use crate::transport::lane::{
    encode_frame, FrameReader, LaneSender, LaneWriter, LANE_MAGIC, MAX_FRAME_BYTES, MAX_HELLO_BYTES,
};
use crate::transport::proto::{ControlRequest, LaneHello, LaneWelcome};
use crate::transport::{runtime, SessionId};

/// The connections gRPC serves.
pub(super) type GrpcIncoming =
    tokio_stream::wrappers::UnboundedReceiverStream<io::Result<AdmittedStream>>;

/// Accepts `incoming` connections (on the runtime): lanes are served here
/// (unless the worker serves TLS), every other connection goes to gRPC
/// through the returned stream. Stops
/// accepting once gRPC drops that stream.
pub(super) fn route(
    runtime: &tokio::runtime::Runtime,
    mut incoming: Incoming,
    shared: &Arc<Shared>,
) -> GrpcIncoming {
    let (grpc, stream) = tokio::sync::mpsc::unbounded_channel();
    let lanes = shared.lane;
    let shared = Arc::downgrade(shared);
    runtime.spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = incoming.next() => accepted,
                () = grpc.closed() => return,
            };
            let Some(accepted) = accepted else { return };
            let Ok(mut admitted) = accepted else { continue };
            // Lanes have no TLS: a worker that serves TLS serves gRPC alone.
            if !lanes {
                let _ = grpc.send(Ok(admitted));
                continue;
            }
            let grpc = grpc.clone();
            let shared = shared.clone();
            // Each connection on its own: a silent one holds up no other.
            tokio::spawn(async move {
                match admitted.first_byte().await {
                    // HTTP/2 and TLS never begin with a zero byte.
                    Ok(Some(0)) => {
                        if let Some(shared) = shared.upgrade() {
                            serve_lane(admitted, shared).await;
                        }
                    }
                    Ok(Some(_)) => {
                        let _ = grpc.send(Ok(admitted));
                    }
                    Ok(None) | Err(_) => {}
                }
            });
        }
    });
    GrpcIncoming::new(stream)
}

/// Reads a lane's opening (magic bytes and hello), within the handshake
/// deadline the connection carries.
async fn read_hello(admitted: &mut AdmittedStream) -> Result<LaneHello> {
    let bad = |e: io::Error| Error::invalid_argument(format!("a lane's opening: {e}"));
    let mut magic = [0u8; LANE_MAGIC.len()];
    admitted.read_exact(&mut magic).await.map_err(bad)?;
    if &magic != LANE_MAGIC {
        return Err(Error::invalid_argument(
            "not a lane of this protocol (wrong magic bytes)",
        ));
    }
    let mut len = [0u8; 4];
    admitted.read_exact(&mut len).await.map_err(bad)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_HELLO_BYTES {
        return Err(Error::invalid_argument(format!(
            "a lane hello of {len} bytes; at most {MAX_HELLO_BYTES} are allowed"
        )));
    }
    let mut hello = vec![0u8; len];
    admitted.read_exact(&mut hello).await.map_err(bad)?;
    <LaneHello as prost::Message>::decode(&hello[..])
        .map_err(|e| Error::invalid_argument(format!("a bad lane hello: {e}")))
}

impl Service {
    /// The session a lane's `hello` opens, once its token and session are
    /// checked and admission counts the connection as authenticated.
    fn accept_lane(&self, hello: &LaneHello, peer: SocketAddr) -> Result<SessionId> {
        if let Some(token) = &self.0.token {
            if !token.matches(&hello.token) {
                self.0
                    .refusals
                    .refused(Some(peer), "a wrong token on a lane");
                return Err(Error::unauthenticated("the token is wrong"));
            }
        }
        // Like the router's refusals of requests: counted and logged.
        let refused = |err: Error| {
            self.0.refusals.refused(Some(peer), err.message());
            err
        };
        let id = SessionId::from_bytes(&hello.session_id).map_err(refused)?;
        if !lock(&self.0.sessions).contains_key(&id) {
            return Err(refused(unknown_session()));
        }
        self.0.admission.authenticated(Some(peer))?;
        Ok(id)
    }
}

/// Serves the lane on `admitted` (whose first byte was zero): checks its
/// hello, answers it, and hands an accepted lane to a thread of its own.
async fn serve_lane(mut admitted: AdmittedStream, shared: Arc<Shared>) {
    let peer = admitted.peer();
    let service = Service(shared);
    let accepted = match read_hello(&mut admitted).await {
        Ok(hello) => service.accept_lane(&hello, peer),
        Err(err) => Err(err),
    };
    let welcome = match &accepted {
        Ok(_) => LaneWelcome::default(),
        Err(err) => {
            tracing::debug!(%peer, error = %err, "refused a lane");
            LaneWelcome {
                code: err.code() as u32,
                message: err.message().to_string(),
            }
        }
    };
    let mut bytes = Vec::new();
    encode_frame(&welcome, &mut bytes);
    if admitted.write_all(&bytes).await.is_err() {
        return;
    }
    let Ok(id) = accepted else { return };
    let (socket, admitted) = match admitted.into_blocking() {
        Ok(blocking) => blocking,
        Err(err) => {
            tracing::warn!(%peer, "cannot serve a lane: {err}");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("colocated-lane".into())
        .spawn(move || run_lane(&service, id, socket, admitted));
    if let Err(err) = spawned {
        tracing::warn!(%peer, "cannot start a lane's thread: {err}");
    }
}

/// Logs why session `id`'s lane ended early: a controller that went away
/// (the connection reset) is routine, bytes that are not the protocol are
/// not.
fn broke(id: SessionId, err: &Error) {
    if err.code() == crate::error::ErrorCode::Unavailable {
        tracing::debug!(session = %id, error = %err, "a lane ended");
    } else {
        tracing::warn!(session = %id, error = %err, "a lane broke");
    }
}

/// Takes session `id`'s operations from `socket` on this thread until the
/// lane or the session ends; executions go to the executors, as from gRPC,
/// and answers leave from the thread that has them. `admitted` keeps the
/// connection counted by admission control until then.
fn run_lane(
    service: &Service,
    id: SessionId,
    socket: std::net::TcpStream,
    admitted: AdmissionGuard,
) {
    // What the operations start on the network runtime (copies) starts
    // from here too.
    let Ok(runtime) = runtime() else { return };
    let _runtime = runtime.enter();
    let (Ok(write), Ok(closer)) = (socket.try_clone(), socket.try_clone()) else {
        return;
    };
    let writer = LaneSender::new(LaneWriter::new(write, service.0.session_timeout));
    let (mut control, mut ended) =
        match ControlLoop::open(service, id, ControlSink::Lane(writer.clone())) {
            Ok(opened) => opened,
            Err(_) => return,
        };
    // The session's end (or the worker's) closes the lane.
    let (done, lane_done) = tokio::sync::oneshot::channel::<()>();
    runtime.spawn(async move {
        tokio::select! {
            _ = ended.changed() => {
                let _ = closer.shutdown(std::net::Shutdown::Both);
            }
            _ = lane_done => {}
        }
    });
    let mut frames = FrameReader::new(socket, MAX_FRAME_BYTES);
    loop {
        // Operations that arrived together are taken together; once none
        // is left, one answer for those taken, then wait for more.
        let op = match frames.buffered::<ControlRequest>() {
            Ok(Some(op)) => op,
            Ok(None) => {
                if !control.idle() {
                    break;
                }
                match frames.next::<ControlRequest>() {
                    Ok(Some(op)) => op,
                    Ok(None) => break,
                    Err(err) => {
                        broke(id, &err);
                        break;
                    }
                }
            }
            Err(err) => {
                broke(id, &err);
                break;
            }
        };
        if !control.take(op) {
            break;
        }
    }
    writer.close();
    drop(done);
    drop(control);
    drop(admitted);
}
