//! The session's ordered control stream: operations sent without waiting
//! (executions, reads of small buffers, deletions), the worker's answers, and
//! waiting until the worker has taken them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{lock, Completion, Progress};
use crate::error::{Error, Result};
use crate::future::Event;
use crate::transport::lane::{encode_frame, with_frame_buffer, LaneSender};
use crate::transport::proto::{control_request, ControlRequest, DeleteBuffersRequest};
use crate::transport::RESUME_VERSION;

mod answers;
mod deletions;
mod ops;
mod resume;

/// The controller's end of a session's ordered control stream.
pub(super) struct Control {
    /// Operations go out under this lock, so `seq` order is stream order.
    sender: std::sync::Mutex<ControlSender>,
    pub(super) state: Arc<ControlState>,
    /// The connection the stream travels on now (see [`resume`]): answers
    /// and ends of an earlier one are not this one's.
    current: AtomicU64,
    /// The last connection made for the stream.
    made: AtomicU64,
    /// The last connection that broke.
    broken: AtomicU64,
    /// A connection that resumes the stream, until the worker's `resumed`
    /// answer installs it (see `resume`).
    resuming: std::sync::Mutex<Option<resume::Resuming>>,
    /// Told when a connection resumed the stream.
    resumed: std::sync::Condvar,
    /// How the stream travels: on a lane (with this write timeout), or on
    /// a gRPC `Control` stream.
    lane: Option<Duration>,
}

struct ControlSender {
    tx: Sink,
    /// The `seq` of the last operation sent.
    sent: u64,
    /// The operations sent that the worker has not said it took, to send
    /// again on a connection that resumes the stream (protocol
    /// [`RESUME_VERSION`]; `None` before).
    log: Option<std::collections::VecDeque<ControlRequest>>,
    /// Buffers to delete: the deletion goes out with the next operation, or
    /// alone when none follows in time (see [`ControlSender::defer_for`]).
    deferred: Vec<u64>,
    /// When the first of `deferred` was deferred.
    deferred_since: Option<Instant>,
    /// Whether the process's deletion timer looks at this stream.
    timed: bool,
    /// When the last operation went out, and how long after the one before.
    last_sent: Option<Instant>,
    gap: Duration,
}

/// How long a deletion waits at least for an operation to go out with.
const DEFER: Duration = Duration::from_millis(5);
/// How long a deletion waits at most: on a stream whose operations come
/// further apart, it goes out alone after this. A call to thousands of hosts
/// reaches the last of them tens of milliseconds after the first (and the
/// next call as long after the last): its deletions still ride with the
/// next call, while a worker holds a buffer the controller let go a second
/// at most.
const MAX_DEFER: Duration = Duration::from_secs(1);
/// Handles a deletion that waits may gather before it goes out alone.
const MAX_DEFERRED: usize = 4096;

/// Operations that go out together, in one write when the stream is idle.
#[derive(Clone)]
enum Outgoing {
    One(ControlRequest),
    /// A deferred deletion and the operation it rides with.
    Two(ControlRequest, ControlRequest),
}

/// Where a session's control operations go.
enum Sink {
    /// The requests of a gRPC `Control` stream (sent by the network runtime).
    Stream(tokio::sync::mpsc::UnboundedSender<Outgoing>),
    /// A lane: an operation the worker waits for (nothing unanswered
    /// before it) is written by the sending thread, pipelined ones are
    /// queued and written together (see [`LaneSender`]).
    Lane(Arc<LaneSender>),
    /// None: the connection broke, and operations wait in the log for the
    /// connection that resumes the stream.
    Down,
}

impl Sink {
    /// Sends `outgoing`; false once the stream is closed. `pipelining`: the
    /// worker has not answered the operations before it yet.
    fn send(&self, outgoing: Outgoing, pipelining: bool) -> bool {
        match self {
            Sink::Stream(tx) => tx.send(outgoing).is_ok(),
            Sink::Lane(lane) => Sink::send_on_lane(lane, &outgoing, pipelining),
            Sink::Down => true,
        }
    }

    /// Writes `outgoing` on `lane`, in one write.
    fn send_on_lane(lane: &Arc<LaneSender>, outgoing: &Outgoing, pipelining: bool) -> bool {
        with_frame_buffer(|bytes| {
            match outgoing {
                Outgoing::One(request) => encode_frame(request, bytes),
                Outgoing::Two(first, second) => {
                    encode_frame(first, bytes);
                    encode_frame(second, bytes);
                }
            }
            lane.send(bytes, pipelining)
        })
    }

    /// Ends the connection (a lane's socket is shut down; a gRPC stream's
    /// requests end), so that its reader and the worker see it end.
    fn close(self) {
        if let Sink::Lane(lane) = self {
            lane.close();
        }
    }
}

/// Operations that unanswered ones before them make this one go through
/// the lane's queue (see [`LaneSender`]).
const PIPELINED_AFTER: u64 = 2;

/// The control stream's requests, one by one.
struct Requests {
    rx: tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
    next: Option<ControlRequest>,
}

impl tokio_stream::Stream for Requests {
    type Item = ControlRequest;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<ControlRequest>> {
        if let Some(request) = self.next.take() {
            return std::task::Poll::Ready(Some(request));
        }
        self.rx.poll_recv(cx).map(|outgoing| {
            outgoing.map(|outgoing| match outgoing {
                Outgoing::One(request) => request,
                Outgoing::Two(first, second) => {
                    self.next = Some(second);
                    first
                }
            })
        })
    }
}

/// What the worker has answered on the control stream.
#[derive(Default)]
pub(super) struct ControlState {
    /// The `seq` of the last answered operation.
    acked: AtomicU64,
    /// The first failure not yet reported by `flush`.
    pub(super) failed: std::sync::Mutex<Option<Error>>,
    /// Set when the stream ended or broke before answering everything.
    broken: std::sync::Mutex<Option<Error>>,
    /// Whether `broken` is set: read by every operation sent, without the
    /// lock.
    is_broken: AtomicBool,
    changed: tokio::sync::Notify,
    /// What waits for the worker's answers (see [`answers::Waiting`]).
    waiting: std::sync::Mutex<answers::Waiting>,
    /// Whether the worker keeps final answers until told (see
    /// `Waiting::received`).
    acks: bool,
}

impl ControlState {
    /// The state of a session of protocol `version`.
    pub(super) fn for_version(version: u32) -> ControlState {
        ControlState {
            acks: version >= RESUME_VERSION,
            ..ControlState::default()
        }
    }

    /// The final answer of operation `seq` came: the next message says so.
    pub(super) fn note_received(&self, seq: u64) {
        if self.acks {
            lock(&self.waiting).received.push(seq);
        }
    }

    /// The operations to tell the worker of (see `Waiting::received`),
    /// taking them.
    pub(super) fn take_received(&self) -> Vec<u64> {
        if !self.acks {
            return Vec::new();
        }
        std::mem::take(&mut lock(&self.waiting).received)
    }
}

/// What runs when an operation finishes, with the data of a read.
type Finish = Box<dyn FnOnce(Result<Bytes>) + Send>;

/// A completion that ignores the data of the answer.
fn finish_of(completion: Completion) -> Finish {
    Box::new(move |result: Result<Bytes>| completion(result.map(|_| ())))
}

impl Control {
    /// The stream of `state`'s session on its first connection, `tx`;
    /// `lane`: its write timeout when it travels on a lane.
    fn new(tx: Sink, state: Arc<ControlState>, lane: Option<Duration>) -> Control {
        let log = state.acks.then(std::collections::VecDeque::new);
        Control {
            current: AtomicU64::new(1),
            made: AtomicU64::new(1),
            broken: AtomicU64::new(0),
            resuming: std::sync::Mutex::new(None),
            resumed: std::sync::Condvar::new(),
            lane,
            sender: std::sync::Mutex::new(ControlSender {
                tx,
                sent: 0,
                log,
                deferred: Vec::new(),
                deferred_since: None,
                timed: false,
                last_sent: None,
                gap: Duration::ZERO,
            }),
            state,
        }
    }

    /// Sends `op` with the next `seq`; see `RemoteSession::send_control`.
    /// `completion` runs when the operation finished, or with
    /// `when_applied`, once any answer says it was applied (cumulatively).
    pub(super) fn send(
        &self,
        op: control_request::Op,
        completion: Option<Finish>,
        progress: Option<Progress>,
        lost: &Event,
        when_applied: bool,
    ) -> Result<()> {
        let mut sender = lock(&self.sender);
        if let Some(err) = self.state.broken() {
            drop(sender);
            if let Some(completion) = completion {
                completion(Err(err.clone()));
            }
            return Err(err);
        }
        // Deferred deletions go first, in the same write.
        let deletion = sender.take_deferred();
        let seq = sender.sent + 1 + u64::from(deletion.is_some());
        let has_completion = completion.is_some();
        let received = self.state.expect(seq, completion, when_applied, progress);
        let request = ControlRequest {
            seq,
            op: Some(op),
            received,
        };
        let outgoing = match deletion {
            Some(op) => Outgoing::Two(
                ControlRequest {
                    seq: seq - 1,
                    op: Some(op),
                    received: Vec::new(),
                },
                request,
            ),
            None => Outgoing::One(request),
        };
        let acked = self.state.acked.load(Ordering::SeqCst);
        let pipelining = sender.sent >= acked + PIPELINED_AFTER;
        if !sender.send_kept(outgoing, acked, pipelining) {
            if sender.log.is_some() {
                // The connection broke: the operation waits in the log for
                // the one that resumes the stream (its reader sees the end).
                std::mem::replace(&mut sender.tx, Sink::Down).close();
            } else {
                drop(sender);
                let err = Error::unavailable("the control stream is closed");
                self.state.complete(seq, Err(err.clone()));
                return Err(err);
            }
        }
        sender.sent = seq;
        sender.sent_now();
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

    /// Deletes `handles` with the next operation, or alone if none follows
    /// in time (see [`ControlSender::defer_for`]; best effort: nothing is
    /// said if the stream broke).
    fn delete_later(self: &Arc<Self>, handles: &[u64]) {
        let mut sender = lock(&self.sender);
        if self.state.broken().is_some() {
            return;
        }
        if sender.deferred.is_empty() {
            sender.deferred_since = Some(Instant::now());
        }
        sender.deferred.extend_from_slice(handles);
        if sender.deferred.len() >= MAX_DEFERRED {
            sender.flush_deferred();
        } else if !sender.timed {
            sender.timed = true;
            let due = sender.deferred_since.unwrap_or_else(Instant::now) + sender.defer_for();
            drop(sender);
            deletions::flush_at(Arc::downgrade(self), due);
        }
    }

    /// Sends the deferred deletion if it waited long enough (see
    /// [`ControlSender::defer_for`]): when the one that still waits (younger)
    /// is due, for the timer to look again.
    fn flush_deferred_if_due(&self) -> Option<Instant> {
        let mut sender = lock(&self.sender);
        let wait = sender.defer_for();
        if sender
            .deferred_since
            .is_some_and(|since| since.elapsed() >= wait)
        {
            sender.flush_deferred();
        }
        sender.timed = !sender.deferred.is_empty();
        sender.timed.then(|| {
            sender
                .deferred_since
                .map_or_else(|| Instant::now() + DEFER, |since| since + wait)
        })
    }

    /// Whether an operation waits for the worker: not yet taken, or taken
    /// and not finished.
    pub(super) fn waiting(&self) -> bool {
        let sent = lock(&self.sender).sent;
        self.state.acked.load(Ordering::SeqCst) < sent || lock(&self.state.waiting).any()
    }
}

impl ControlSender {
    /// Sends `outgoing` (see [`Sink::send`]) and keeps it for a connection
    /// that resumes the stream (see `log`), letting go of what the worker
    /// took (`acked`). A lane's bytes are encoded from the operations, which
    /// then move into the log: no copy of them.
    fn send_kept(&mut self, outgoing: Outgoing, acked: u64, pipelining: bool) -> bool {
        if self.log.is_none() {
            return self.tx.send(outgoing, pipelining);
        }
        let sent = match &self.tx {
            Sink::Stream(_) => self.tx.send(outgoing.clone(), pipelining),
            Sink::Lane(lane) => Sink::send_on_lane(lane, &outgoing, pipelining),
            Sink::Down => true,
        };
        self.keep(outgoing, acked);
        sent
    }

    /// Keeps `outgoing` in the log, letting go of what the worker took.
    fn keep(&mut self, outgoing: Outgoing, acked: u64) {
        let Some(log) = self.log.as_mut() else {
            return;
        };
        while log.front().is_some_and(|request| request.seq <= acked) {
            log.pop_front();
        }
        match outgoing {
            Outgoing::One(request) => log.push_back(request),
            Outgoing::Two(first, second) => {
                log.push_back(first);
                log.push_back(second);
            }
        }
    }

    /// How long a deferred deletion waits for the next operation: [`DEFER`],
    /// or half again the time between the last two operations when they
    /// came further apart (a call to hundreds of workers reaches the last of
    /// them several milliseconds after the first, and each one's deletion
    /// rides with its next call rather than going out alone, a second
    /// message to every worker), at most [`MAX_DEFER`].
    fn defer_for(&self) -> Duration {
        (self.gap + self.gap / 2).clamp(DEFER, MAX_DEFER)
    }

    /// Notes that an operation went out now.
    fn sent_now(&mut self) {
        let now = Instant::now();
        if let Some(last) = self.last_sent {
            self.gap = now.saturating_duration_since(last);
        }
        self.last_sent = Some(now);
    }

    /// The deletion of the deferred buffers, if any, taking them.
    fn take_deferred(&mut self) -> Option<control_request::Op> {
        self.deferred_since = None;
        (!self.deferred.is_empty()).then(|| {
            control_request::Op::DeleteBuffers(DeleteBuffersRequest {
                handles: std::mem::take(&mut self.deferred),
            })
        })
    }

    /// Sends the deferred deletion alone, if there is one.
    fn flush_deferred(&mut self) {
        if let Some(op) = self.take_deferred() {
            let seq = self.sent + 1;
            let outgoing = Outgoing::One(ControlRequest {
                seq,
                op: Some(op),
                received: Vec::new(),
            });
            // The log's front goes with the next operation's `keep`. A
            // closed stream has nothing left to delete on. Written by this
            // thread (after what is queued): nothing waits for more.
            if self.send_kept(outgoing, 0, false) {
                self.sent = seq;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::transport::proto::UnloadExecutableRequest;

    /// Counts what went out: deletions that rode with an operation, and how
    /// long those that went out alone had waited (at least).
    fn drain(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
        deferred_at: &HashMap<u64, Instant>,
        along: &mut usize,
        alone: &mut Vec<Duration>,
    ) {
        while let Ok(outgoing) = rx.try_recv() {
            match outgoing {
                Outgoing::Two(..) => *along += 1,
                Outgoing::One(ControlRequest {
                    op: Some(control_request::Op::DeleteBuffers(deletion)),
                    ..
                }) => {
                    let first = deletion.handles.iter().map(|h| deferred_at[h]).min();
                    alone.push(first.expect("a deletion names buffers").elapsed());
                }
                Outgoing::One(_) => {}
            }
        }
    }

    /// A control stream whose operations go to the returned receiver.
    fn control_on_a_stream() -> (Arc<Control>, tokio::sync::mpsc::UnboundedReceiver<Outgoing>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let state = Arc::new(ControlState::default());
        (Arc::new(Control::new(Sink::Stream(tx), state, None)), rx)
    }

    /// How many deletions rode with an operation, and how many went out
    /// alone, when a deletion follows each of ten operations `gap` apart.
    fn deletions_at_a_pace(gap: Duration) -> (usize, usize) {
        let (control, mut rx) = control_on_a_stream();
        let lost = Event::new();
        let mut deferred_at = HashMap::new();
        let (mut along, mut alone) = (0, Vec::new());
        for handle in 0..10u64 {
            let op = control_request::Op::UnloadExecutable(UnloadExecutableRequest { handle });
            control.send(op, None, None, &lost, false).unwrap();
            drain(&mut rx, &deferred_at, &mut along, &mut alone);
            deferred_at.insert(handle, Instant::now());
            control.delete_later(&[handle]);
            std::thread::sleep(gap);
        }
        drain(&mut rx, &deferred_at, &mut along, &mut alone);
        (along, alone.len())
    }

    /// Operations that come further apart than [`DEFER`] (a call to
    /// hundreds of workers, which reaches the last of them milliseconds
    /// after the first) still take the deletions along: a deletion waits
    /// for half again the time between the last two operations. It went
    /// out alone, a second message to every worker, when it waited
    /// [`DEFER`] whatever the pace of operations.
    #[test]
    fn deletions_ride_with_operations_that_come_further_apart_than_the_delay() {
        let (along, alone) = deletions_at_a_pace(DEFER * 4);
        assert!(
            along > alone,
            "{along} deletions rode with an operation, {alone} went out alone"
        );
    }

    /// A call to thousands of workers reaches the last of them tens of
    /// milliseconds after the first (70 ms for 4,096 on one core): their
    /// deletions still ride with the next call. They went out alone, a
    /// second message to most workers, when a deletion waited 50 ms at
    /// most.
    #[test]
    fn deletions_ride_with_the_calls_of_a_fan_out_to_thousands_of_hosts() {
        let (along, alone) = deletions_at_a_pace(Duration::from_millis(80));
        assert!(
            along > alone,
            "{along} deletions rode with an operation, {alone} went out alone"
        );
    }

    /// Deletions ride with the next operation; one goes out alone only
    /// after it waited [`DEFER`] for one. Calls that keep coming, each
    /// sooner than that, take every deletion along (the process's timer
    /// used to send whatever waited when it fired, however young).
    #[test]
    fn a_deletion_goes_out_alone_only_when_no_operation_took_it_within_the_delay() {
        let (control, mut rx) = control_on_a_stream();
        let lost = Event::new();
        let mut deferred_at = HashMap::new();
        let (mut along, mut alone) = (0, Vec::new());
        for handle in 0..40u64 {
            deferred_at.insert(handle, Instant::now());
            control.delete_later(&[handle]);
            std::thread::sleep(Duration::from_millis(1));
            let op = control_request::Op::UnloadExecutable(UnloadExecutableRequest { handle });
            control.send(op, None, None, &lost, false).unwrap();
            drain(&mut rx, &deferred_at, &mut along, &mut alone);
        }
        assert!(along > 0, "deletions ride with the next operation");
        for waited in &alone {
            assert!(
                *waited >= DEFER,
                "a deletion went out alone after {waited:?}"
            );
        }
        // With nothing sent after it, the last one goes out alone.
        deferred_at.insert(99, Instant::now());
        control.delete_later(&[99]);
        let (start, sent_alone) = (Instant::now(), alone.len());
        while alone.len() == sent_alone && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
            drain(&mut rx, &deferred_at, &mut along, &mut alone);
        }
        let waited = alone
            .last()
            .copied()
            .expect("the last deletion went out alone");
        assert!(waited >= DEFER, "it went out after {waited:?}");
        assert!(lock(&control.sender).deferred.is_empty());
    }
}
