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
use crate::dispatch::{claim_idle_tasks, Claims};
use crate::error::{Error, Result};
use crate::transport::admission::{AdmissionGuard, AdmittedStream, Incoming};
use crate::transport::alarm::Alarm;
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
    fn accept_lane(&self, hello: &LaneHello, peer: SocketAddr) -> Result<(SessionId, bool)> {
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
        Ok((id, hello.resume))
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
    let Ok((id, resume)) = accepted else { return };
    let (socket, admitted) = match admitted.into_blocking() {
        Ok(blocking) => blocking,
        Err(err) => {
            tracing::warn!(%peer, "cannot serve a lane: {err}");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("colocated-lane".into())
        .spawn(move || run_lane(&service, id, resume, socket, admitted));
    if let Err(err) = spawned {
        tracing::warn!(%peer, "cannot start a lane's thread: {err}");
    }
}

/// How long a lane's thread may run programs it took before another thread
/// takes over reading the lane.
const TAKEOVER_AFTER: std::time::Duration = std::time::Duration::from_millis(2);
/// Programs that ran for less than this are quick.
const QUICK: std::time::Duration = std::time::Duration::from_micros(500);
/// After this many quick runs in a row, a lane's leader runs the next under
/// its [`BACKSTOP`] alarm.
const QUICK_STREAK: u32 = 8;
/// When a leader whose programs have been quick runs one that is not,
/// another thread takes over this long after it began (see [`Lane`]).
const BACKSTOP: std::time::Duration = std::time::Duration::from_millis(50);
/// `Lane::running_since` once another thread took over.
const TAKEN: u64 = u64::MAX;

/// An accepted lane: what reads it, and what its threads share.
///
/// One thread at a time reads the lane and takes its operations (the
/// *leader*). An execution on a stream that is idle, with no operation
/// behind it yet, is claimed by the leader, which runs it itself once it let
/// go of the reading, and answers from there: no hand-off to an executor.
/// A program may run long, or wait for another that a later operation of
/// the lane starts: when the leader has run programs for [`TAKEOVER_AFTER`]
/// (its [`Alarm`] goes off), or at once when a program calls the
/// controller's host callback, a new thread takes over the reading, and the
/// old one ends with its programs. Without alarms (not Linux) the leader
/// runs nothing: executions go to the executors.
///
/// Setting and stopping a timer for every program cost a worker as much
/// as its reads and writes: once the leader's last [`QUICK_STREAK`]
/// programs were all [`QUICK`], it runs the next under a second alarm, of
/// [`BACKSTOP`], which it leaves set when the program ends (a timer that
/// goes off for nothing once per [`BACKSTOP`] while programs keep coming).
/// A program that then runs long is taken over from after [`BACKSTOP`],
/// and the leader's next programs run under the first alarm again.
struct Lane {
    id: SessionId,
    alarms: Option<Alarms>,
    reading: std::sync::Mutex<Reading>,
    /// When the leader began running the programs it took (nanoseconds of
    /// [`now_nanos`], never 0); 0 while it reads; [`TAKEN`] once another
    /// thread took over.
    running_since: std::sync::atomic::AtomicU64,
    writer: Arc<LaneSender>,
    /// Dropped with the lane: the watch of the session's end stops.
    _done: tokio::sync::oneshot::Sender<()>,
    /// Keeps the connection counted by admission while the lane lives.
    _admitted: AdmissionGuard,
}

/// A lane's alarms: both go off when the leader has run programs for long
/// (see [`Lane`]).
struct Alarms {
    /// Goes off [`TAKEOVER_AFTER`] after the leader began running programs.
    takeover: Alarm,
    /// Goes off [`BACKSTOP`] after it began running programs that are
    /// likely quick.
    backstop: Alarm,
}

/// What the leader holds while it reads.
struct Reading {
    frames: FrameReader<std::net::TcpStream>,
    control: ControlLoop,
    ended: bool,
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.writer.close();
    }
}

/// Nanoseconds on a clock of the process (never 0).
fn now_nanos() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let nanos = EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos();
    u64::try_from(nanos).unwrap_or(TAKEN - 1).max(1)
}

thread_local! {
    /// The lane whose programs this thread runs now, and since when.
    static RUNNING: std::cell::RefCell<Option<(std::sync::Weak<Lane>, u64)>> =
        const { std::cell::RefCell::new(None) };
}

impl Reading {
    /// Reads and takes operations until one leaves programs for this thread
    /// to run; `None` once the lane ended.
    fn next_claims(&mut self, id: SessionId, claim: bool) -> Option<Claims> {
        if self.ended {
            return None;
        }
        loop {
            // Operations that arrived together are taken together; once
            // none is left, one answer for those taken, then wait for more.
            let op = match self.frames.buffered::<ControlRequest>() {
                Ok(Some(op)) => op,
                Ok(None) => {
                    if !self.control.idle() {
                        break;
                    }
                    match self.frames.next::<ControlRequest>() {
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
            // A program is run here only when no operation follows it yet:
            // operations that arrive together (on several streams) go to
            // the executors, which run them side by side.
            let (alive, claims) = if !claim || self.frames.has_message() {
                (self.control.take(op), Claims::new())
            } else {
                claim_idle_tasks(|| self.control.take(op))
            };
            if !alive {
                break;
            }
            if !claims.is_empty() {
                return Some(claims);
            }
        }
        self.ended = true;
        None
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

impl Lane {
    /// Reads and takes the lane's operations on this thread, running the
    /// programs it claims, until the lane ends or another thread took over.
    fn lead(self: Arc<Lane>) {
        let Ok(runtime) = runtime() else { return };
        let _runtime = runtime.enter();
        // Quick runs of this leader in a row.
        let mut quick = 0u32;
        let quick_nanos = u64::try_from(QUICK.as_nanos()).unwrap_or(u64::MAX);
        loop {
            let claims = {
                let mut reading = lock(&self.reading);
                match reading.next_claims(self.id, self.alarms.is_some()) {
                    Some(claims) => claims,
                    None => return,
                }
            };
            let started = now_nanos();
            self.running_since
                .store(started, std::sync::atomic::Ordering::SeqCst);
            let likely_quick = quick >= QUICK_STREAK;
            if let Some(alarms) = &self.alarms {
                if likely_quick {
                    alarms.backstop.arm();
                } else {
                    alarms.takeover.arm();
                }
            }
            RUNNING.with(|r| *r.borrow_mut() = Some((Arc::downgrade(&self), started)));
            for claim in claims {
                claim.run();
            }
            RUNNING.with(|r| *r.borrow_mut() = None);
            if let Some(alarms) = &self.alarms {
                if likely_quick {
                    alarms.backstop.disarm_lazily();
                } else {
                    alarms.takeover.disarm();
                }
            }
            quick = if now_nanos().saturating_sub(started) < quick_nanos {
                quick.saturating_add(1)
            } else {
                0
            };
            if self
                .running_since
                .compare_exchange(
                    started,
                    0,
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                )
                .is_err()
            {
                // Another thread reads the lane now.
                return;
            }
        }
    }

    /// An alarm went off: the leader has run programs for at least
    /// [`TAKEOVER_AFTER`] (unless it finished just now, and runs others).
    fn ran_long(self: &Arc<Lane>) {
        let since = self.running_since.load(std::sync::atomic::Ordering::SeqCst);
        let after = u64::try_from(TAKEOVER_AFTER.as_nanos()).unwrap_or(u64::MAX);
        if since != 0 && since != TAKEN && now_nanos().saturating_sub(since) >= after {
            self.take_over(since);
        }
    }

    /// Hands the reading to a new thread if the leader has run programs
    /// since `started` (and nobody took over yet).
    fn take_over(self: &Arc<Lane>, started: u64) {
        if self
            .running_since
            .compare_exchange(
                started,
                TAKEN,
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
            )
            .is_err()
        {
            return;
        }
        let lane = self.clone();
        let spawned = std::thread::Builder::new()
            .name("colocated-lane".into())
            .spawn(move || lane.lead());
        if let Err(err) = spawned {
            tracing::warn!(session = %self.id, "cannot start a thread to read a lane: {err}");
            // The leader reads on once its programs finish.
            self.running_since
                .store(started, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Before this thread blocks on the controller (a host callback), another
/// thread takes over reading the lane whose programs it runs, if any: the
/// answer comes on that lane.
pub(super) fn before_waiting_on_the_controller() {
    let running = RUNNING.with(|r| r.borrow().clone());
    if let Some((lane, started)) = running {
        if let Some(lane) = lane.upgrade() {
            lane.take_over(started);
        }
    }
}

/// Serves session `id`'s lane on `socket` from this thread on (see
/// [`Lane`]). `admitted` keeps the connection counted until it ends.
fn run_lane(
    service: &Service,
    id: SessionId,
    resume: bool,
    socket: std::net::TcpStream,
    admitted: AdmissionGuard,
) {
    let Ok(runtime) = runtime() else { return };
    let _runtime = runtime.enter();
    let (Ok(write), Ok(closer)) = (socket.try_clone(), socket.try_clone()) else {
        return;
    };
    let writer = LaneSender::new(LaneWriter::new(write, service.0.session_timeout));
    let (control, mut ended) =
        match ControlLoop::open(service, id, ControlSink::Lane(writer.clone()), resume) {
            Ok(opened) => opened,
            Err(err) => {
                tracing::debug!(session = %id, error = %err, "a lane refused");
                return;
            }
        };
    // The session's end (or the worker's) closes the lane, saying so first.
    let (done, lane_done) = tokio::sync::oneshot::channel::<()>();
    let (goodbye, farewell) = (control.goodbye(), writer.clone());
    runtime.spawn(async move {
        tokio::select! {
            _ = ended.changed() => {
                if let Some(goodbye) = goodbye {
                    farewell.send_message(&goodbye, false);
                }
                let _ = closer.shutdown(std::net::Shutdown::Both);
            }
            _ = lane_done => {}
        }
    });
    let lane = Arc::new_cyclic(|lane: &std::sync::Weak<Lane>| Lane {
        id,
        alarms: {
            let ran_long: crate::transport::alarm::Action = {
                let lane = lane.clone();
                Arc::new(move || {
                    if let Some(lane) = lane.upgrade() {
                        lane.ran_long();
                    }
                })
            };
            Alarm::new(TAKEOVER_AFTER, ran_long.clone())
                .zip(Alarm::new(BACKSTOP, ran_long))
                .map(|(takeover, backstop)| Alarms { takeover, backstop })
        },
        reading: std::sync::Mutex::new(Reading {
            frames: FrameReader::new(socket, MAX_FRAME_BYTES),
            control,
            ended: false,
        }),
        running_since: std::sync::atomic::AtomicU64::new(0),
        writer,
        _done: done,
        _admitted: admitted,
    });
    lane.lead();
}
