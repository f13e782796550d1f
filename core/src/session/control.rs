//! The session's ordered control stream: operations sent without waiting
//! (executions, reads of small buffers, deletions), the worker's answers, and
//! waiting until the worker has taken them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

#[cfg(any(test, feature = "testing"))]
use super::block_on;
use super::host_calls::run_host_callback;
use super::{lock, Completion, Inner, Progress, RemoteSession};
use crate::error::{Error, ErrorCode, Result};
use crate::future::Event;
use crate::transport::lane::{encode_frame, with_frame_buffer, LaneSender, LaneWriter};
use crate::transport::lane_reader::{read_lane_answers, Handlers};
use crate::transport::proto::{
    control_request, BufferSpec, ControlRequest, ControlResponse, DeleteBuffersRequest,
    ExecuteRequest, FetchBufferRequest, GrantReadRequest, PutSmallBufferRequest, ReadBufferRequest,
    UnloadExecutableRequest,
};
use crate::transport::{from_status, runtime};

/// The controller's end of a session's ordered control stream.
pub(super) struct Control {
    /// Operations go out under this lock, so `seq` order is stream order.
    sender: std::sync::Mutex<ControlSender>,
    pub(super) state: Arc<ControlState>,
}

struct ControlSender {
    tx: Sink,
    /// The `seq` of the last operation sent.
    sent: u64,
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
/// further apart, it goes out alone after this.
const MAX_DEFER: Duration = Duration::from_millis(50);
/// Handles a deletion that waits may gather before it goes out alone.
const MAX_DEFERRED: usize = 4096;

/// Operations that go out together, in one write when the stream is idle.
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
}

impl Sink {
    /// Sends `outgoing`; false once the stream is closed. `pipelining`: the
    /// worker has not answered the operations before it yet.
    fn send(&self, outgoing: Outgoing, pipelining: bool) -> bool {
        match self {
            Sink::Stream(tx) => tx.send(outgoing).is_ok(),
            Sink::Lane(lane) => with_frame_buffer(|bytes| {
                match &outgoing {
                    Outgoing::One(request) => encode_frame(request, bytes),
                    Outgoing::Two(first, second) => {
                        encode_frame(first, bytes);
                        encode_frame(second, bytes);
                    }
                }
                lane.send(bytes, pipelining)
            }),
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
    changed: tokio::sync::Notify,
    /// What to run when an execution finishes, by `seq`.
    pending: std::sync::Mutex<HashMap<u64, Finish>>,
    /// What to run when an operation that finishes once applied (a small
    /// upload) is answered: by any answer for it or a later one.
    applied: std::sync::Mutex<std::collections::BTreeMap<u64, Finish>>,
    /// Where the progress answers of an operation go, by `seq`.
    progress: std::sync::Mutex<HashMap<u64, Progress>>,
}

/// What runs when an operation finishes, with the data of a read.
type Finish = Box<dyn FnOnce(Result<Bytes>) + Send>;

/// A completion that ignores the data of the answer.
fn finish_of(completion: Completion) -> Finish {
    Box::new(move |result: Result<Bytes>| completion(result.map(|_| ())))
}

impl Control {
    fn new(tx: Sink, state: Arc<ControlState>) -> Control {
        Control {
            sender: std::sync::Mutex::new(ControlSender {
                tx,
                sent: 0,
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
        if let Some(completion) = completion {
            if when_applied {
                lock(&self.state.applied).insert(seq, completion);
            } else {
                lock(&self.state.pending).insert(seq, completion);
            }
        }
        if let Some(progress) = progress {
            lock(&self.state.progress).insert(seq, progress);
        }
        let request = ControlRequest { seq, op: Some(op) };
        let outgoing = match deletion {
            Some(op) => Outgoing::Two(
                ControlRequest {
                    seq: seq - 1,
                    op: Some(op),
                },
                request,
            ),
            None => Outgoing::One(request),
        };
        let pipelining = sender.sent >= self.state.acked.load(Ordering::SeqCst) + PIPELINED_AFTER;
        if !sender.tx.send(outgoing, pipelining) {
            drop(sender);
            let err = Error::unavailable("the control stream is closed");
            self.state.complete(seq, Err(err.clone()));
            return Err(err);
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
            drop(sender);
            flush_later(Arc::downgrade(self));
        }
    }

    /// Sends the deferred deletion if it waited long enough (see
    /// [`ControlSender::defer_for`]): whether one still waits (younger), for
    /// the timer to look again.
    fn flush_deferred_if_due(&self) -> bool {
        let mut sender = lock(&self.sender);
        let wait = sender.defer_for();
        if sender
            .deferred_since
            .is_some_and(|since| since.elapsed() >= wait)
        {
            sender.flush_deferred();
        }
        sender.timed = !sender.deferred.is_empty();
        sender.timed
    }

    /// Whether an operation waits for the worker: not yet taken, or taken
    /// and not finished.
    pub(super) fn waiting(&self) -> bool {
        let sent = lock(&self.sender).sent;
        self.state.acked.load(Ordering::SeqCst) < sent
            || !lock(&self.state.pending).is_empty()
            || !lock(&self.state.applied).is_empty()
    }
}

impl ControlSender {
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
            // A closed stream has nothing left to delete on. Written by
            // this thread (after what is queued): nothing waits for more.
            if self
                .tx
                .send(Outgoing::One(ControlRequest { seq, op: Some(op) }), false)
            {
                self.sent = seq;
            }
        }
    }
}

/// Control streams with deletions waiting, looked at every [`DEFER`] by one
/// timer for the process while any has some: a deletion goes out alone
/// only when no operation took it along in time (a steady stream of calls
/// takes every deletion along, with no write of its own). Per process: a
/// forked child runs its own timer.
fn waiting_deletions() -> &'static std::sync::Mutex<Option<Vec<Weak<Control>>>> {
    static WAITING: crate::process::PerProcess<std::sync::Mutex<Option<Vec<Weak<Control>>>>> =
        crate::process::PerProcess::new();
    WAITING.get_or_init(|| std::sync::Mutex::new(None))
}

/// Sends `control`'s deferred deletion once it waited long enough, unless
/// an operation takes it first.
fn flush_later(control: Weak<Control>) {
    let mut waiting = lock(waiting_deletions());
    if let Some(waiting) = waiting.as_mut() {
        waiting.push(control);
        return;
    }
    let spawned = runtime().map(|runtime| {
        runtime.spawn(async {
            loop {
                tokio::time::sleep(DEFER).await;
                // The list stays (empty): streams that defer meanwhile join
                // it rather than start a second timer.
                let due = match lock(waiting_deletions()).as_mut() {
                    Some(due) => std::mem::take(due),
                    None => return,
                };
                // Writes may block: off the runtime's threads.
                let waiting = tokio::task::spawn_blocking(move || {
                    due.into_iter()
                        .filter(|control| {
                            control
                                .upgrade()
                                .is_some_and(|control| control.flush_deferred_if_due())
                        })
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap_or_default();
                let mut slot = lock(waiting_deletions());
                let all = slot.get_or_insert_with(Vec::new);
                all.extend(waiting);
                if all.is_empty() {
                    *slot = None;
                    return;
                }
            }
        })
    });
    match spawned {
        Ok(_) => *waiting = Some(vec![control]),
        Err(_) => {
            drop(waiting);
            if let Some(control) = control.upgrade() {
                let mut sender = lock(&control.sender);
                sender.timed = false;
                sender.flush_deferred();
            }
        }
    }
}

impl ControlState {
    /// Waits until the worker answered operation `seq`; the stream's error if it
    /// broke first.
    #[cfg(any(test, feature = "testing"))]
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
        lock(&self.progress).remove(&seq);
        let completion = lock(&self.pending).remove(&seq);
        let completion = completion.or_else(|| lock(&self.applied).remove(&seq));
        if let Some(completion) = completion {
            completion(result);
        }
    }

    /// Runs the completions of the operations that finish once applied, up
    /// to `acked` (their failures were answered, and run, before).
    fn applied_up_to(&self, acked: u64) {
        let done: Vec<Finish> = {
            let mut applied = lock(&self.applied);
            // Most answers find none waiting.
            if applied
                .first_key_value()
                .is_none_or(|(&seq, _)| seq > acked)
            {
                return;
            }
            let later = applied.split_off(&(acked + 1));
            std::mem::replace(&mut *applied, later)
                .into_values()
                .collect()
        };
        for completion in done {
            completion(Ok(Bytes::new()));
        }
    }

    /// Fails every waiting completion with `err` (the stream broke, the worker
    /// is lost).
    pub(super) fn fail_all(&self, err: &Error) {
        lock(&self.progress).clear();
        let mut drained: Vec<Finish> = lock(&self.pending).drain().map(|(_, c)| c).collect();
        drained.extend(std::mem::take(&mut *lock(&self.applied)).into_values());
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

/// Reads the worker's answers of a control stream.
async fn read_answers(
    mut answers: tonic::Streaming<ControlResponse>,
    state: Arc<ControlState>,
    inner: Weak<Inner>,
) {
    let ended = loop {
        match answers.message().await {
            Ok(Some(answer)) => answered(&state, &inner, answer),
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
    stream_ended(&state, &inner, ended);
}

/// Takes one answer of the worker on a control stream.
fn answered(state: &ControlState, inner: &Weak<Inner>, mut answer: ControlResponse) {
    if let Some(call) = answer.host_callback.take() {
        run_host_callback(inner, call);
        return;
    }
    let result = answer_result(&answer);
    if answer.total_bytes > 0 && !answer.finished {
        let progress = lock(&state.progress).get(&answer.seq).cloned();
        if let Some(progress) = progress {
            progress(answer.progress_bytes, answer.total_bytes);
        }
    }
    // The worker answered just now (and counted the operation as the
    // session's heartbeat).
    if let Some(inner) = inner.upgrade() {
        inner.beat.heard();
    }
    if answer.finished {
        let data = std::mem::take(&mut answer.data);
        state.complete(answer.seq, result.map(|()| data));
    } else if let Err(err) = result {
        tracing::debug!(seq = answer.seq, error = %err, "control operation failed");
        lock(&state.failed).get_or_insert(err.clone());
        state.complete(answer.seq, Err(err));
    }
    // Operations are taken in order: any answer for `seq` (taken, progress
    // or finished) says every one up to it was taken. Workers of protocol
    // version 5 leave the rest unsaid.
    state.acked.fetch_max(answer.seq, Ordering::SeqCst);
    state.applied_up_to(state.acked.load(Ordering::SeqCst));
    state.changed.notify_waiters();
}

/// The control stream ended with `ended`: the session is lost (unless it
/// was closed), and what waits on the stream fails.
fn stream_ended(state: &ControlState, inner: &Weak<Inner>, ended: Error) {
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

impl RemoteSession {
    /// `execute_async` (tests only), then `done` with the outcome
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
        self.execute_reading_then(executable, inputs, outputs, stream, finish_of(done));
    }

    /// [`execute_then`](Self::execute_then), where `done` also gets the
    /// outputs' bytes, one after another, when the worker sent them with its
    /// answer (protocol version
    /// [`INLINE_OUTPUTS_VERSION`](crate::transport::INLINE_OUTPUTS_VERSION):
    /// small outputs of fixed-size elements), else no bytes.
    pub fn execute_reading_then(
        &self,
        executable: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
        done: Box<dyn FnOnce(Result<Bytes>) + Send>,
    ) {
        let op = control_request::Op::Execute(ExecuteRequest {
            executable,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            stream,
        });
        // A failure to send has run `done` already.
        let _ = self.send_control_then(op, Some(done), None);
    }

    /// Deletes buffers of this session after every operation sent before
    /// (on the control stream), without waiting: with the next operation, or
    /// a few milliseconds later when none follows. Best effort: a lost
    /// worker has freed them already.
    pub fn delete_buffers_later(&self, handles: &[u64]) {
        if self.inner.closed.load(Ordering::SeqCst) || self.inner.lost.is_ready() {
            return;
        }
        match self.inner.alive().and_then(|()| self.control()) {
            Ok(control) => control.delete_later(handles),
            Err(err) => {
                tracing::debug!(worker = %self.inner.address, error = %err, "buffers not deleted");
            }
        }
    }

    /// Unloads executable `handle` of this session after every operation sent
    /// before (on the control stream), without waiting, and forgets its host
    /// callbacks. Best effort: a lost worker has freed it already.
    pub fn unload_executable_later(&self, handle: u64) {
        self.forget_host_callbacks(handle);
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
    pub(super) fn send_control(
        &self,
        op: control_request::Op,
        completion: Option<Completion>,
    ) -> Result<()> {
        self.send_control_then(op, completion.map(finish_of), None)
    }

    /// `send_control` with a completion that gets the answer's data, and
    /// where progress answers go.
    fn send_control_then(
        &self,
        op: control_request::Op,
        completion: Option<Finish>,
        progress: Option<Progress>,
    ) -> Result<()> {
        match self.inner.alive().and_then(|()| self.control()) {
            Ok(control) => control.send(op, completion, progress, &self.inner.lost, false),
            Err(err) => {
                if let Some(completion) = completion {
                    completion(Err(err.clone()));
                }
                Err(err)
            }
        }
    }

    /// Sends `op`; `done` runs once an answer says the worker applied it (on
    /// a network thread, or on this one when the session is already lost).
    fn send_control_when_applied(&self, op: control_request::Op, done: Completion) {
        let completion = finish_of(done);
        match self.inner.alive().and_then(|()| self.control()) {
            Ok(control) => {
                // A failure to send has run the completion already.
                let _ = control.send(op, Some(completion), None, &self.inner.lost, true);
            }
            Err(err) => completion(Err(err)),
        }
    }

    /// Reads buffer `handle` (at most
    /// [`MAX_INLINE_READ_BYTES`](crate::transport::MAX_INLINE_READ_BYTES)) on the
    /// control stream, after every operation sent before, without blocking:
    /// `done` gets its bytes once it is ready on the worker (on a network
    /// thread, or on this one when the session is already lost).
    pub fn read_small_buffer_then(&self, handle: u64, done: Box<dyn FnOnce(Result<Bytes>) + Send>) {
        let op = control_request::Op::ReadBuffer(ReadBufferRequest { handle });
        // A failure to send has run `done` already.
        let _ = self.send_control_then(op, Some(done), None);
    }

    /// Uploads buffer `handle` (`data`: its bytes, at most
    /// [`MAX_SMALL_PUT_BYTES`](crate::transport::MAX_SMALL_PUT_BYTES), of
    /// fixed-size elements) as one operation of the control stream (protocol
    /// version [`SMALL_PUT_VERSION`](crate::transport::SMALL_PUT_VERSION)),
    /// without blocking: executions sent after it may use the buffer at once.
    /// `done` gets the outcome once the worker applied it (on a network
    /// thread, or on this one when the session is already lost).
    pub fn put_small_buffer_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        data: Bytes,
        done: Completion,
    ) {
        let op = control_request::Op::PutSmallBuffer(PutSmallBufferRequest {
            handle,
            spec: Some(spec),
            data,
        });
        self.send_control_when_applied(op, done);
    }

    /// Lets one `GetBuffer` of another worker that presents `grant` read
    /// buffer `handle` of this session, within `ttl` (protocol version
    /// [`COPY_VERSION`](crate::transport::COPY_VERSION); on the control
    /// stream, after every operation sent before, without waiting).
    /// `done` runs once the worker applied the grant (on a network thread, or
    /// on this one when the session is already lost): a read that presents
    /// it before then would be refused as a stranger's.
    pub fn grant_read_then(&self, handle: u64, grant: &[u8; 32], ttl: Duration, done: Completion) {
        let op = control_request::Op::GrantRead(GrantReadRequest {
            handle,
            grant: Bytes::copy_from_slice(grant),
            ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
        });
        self.send_control_when_applied(op, done);
    }

    /// Makes buffer `handle` of this session (`spec`) from a buffer of the
    /// worker at `source`, which granted this read with `grant` (see
    /// [`grant_read_then`](Self::grant_read_then)); this worker reads it from there,
    /// over TLS as this session's connection when it has TLS. `progress`
    /// gets the bytes that arrived there, `done` the outcome (on a network
    /// thread, or on this one when the session is already lost).
    pub fn fetch_buffer_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        source: &RemoteSession,
        grant: &[u8; 32],
        progress: Option<Progress>,
        done: Completion,
    ) {
        let (tls_ca_pem, tls_domain) = match &source.inner.tls {
            Some((ca, domain)) => (Bytes::from(ca.clone()), domain.clone().unwrap_or_default()),
            None => (Bytes::new(), String::new()),
        };
        let op = control_request::Op::FetchBuffer(FetchBufferRequest {
            handle,
            spec: Some(spec),
            address: source.session_address().to_string(),
            grant: Bytes::copy_from_slice(grant),
            tls_ca_pem,
            tls_domain,
        });
        // A failure to send has run `done` already.
        let _ = self.send_control_then(op, Some(finish_of(done)), progress);
    }

    /// Sends the deferred deletions, and waits until the worker has taken
    /// every control operation sent so far (requests that read or delete
    /// buffers come after them).
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn settle(&self) -> Result<()> {
        let Some(control) = lock(&self.inner.control).clone() else {
            return Ok(());
        };
        let sent = {
            let mut sender = lock(&control.sender);
            sender.flush_deferred();
            sender.sent
        };
        if control.state.acked.load(Ordering::SeqCst) >= sent {
            return Ok(());
        }
        block_on(async move { control.state.settled(sent).await })?
    }

    /// Opens the control stream (see `control`): on `lane`, a connection
    /// whose hello the worker accepted (and how long a write on it may
    /// wait), else on gRPC.
    pub(super) fn open_control(&self, lane: Option<(std::net::TcpStream, Duration)>) -> Result<()> {
        let mut slot = lock(&self.inner.control);
        if slot.is_some() {
            return Ok(());
        }
        let state = Arc::new(ControlState::default());
        let tx = match lane {
            Some((socket, write_timeout)) => {
                let read = socket
                    .try_clone()
                    .map_err(|e| Error::unavailable(format!("a lane: {e}")))?;
                let (answer_state, answer_inner) = (state.clone(), Arc::downgrade(&self.inner));
                let (end_state, end_inner) = (state.clone(), Arc::downgrade(&self.inner));
                read_lane_answers(
                    read,
                    Handlers {
                        answer: Box::new(move |answer| {
                            answered(&answer_state, &answer_inner, answer)
                        }),
                        ended: Box::new(move |ended| stream_ended(&end_state, &end_inner, ended)),
                    },
                )?;
                Sink::Lane(LaneSender::new(LaneWriter::new(socket, write_timeout)))
            }
            None => Sink::Stream(self.open_control_stream(state.clone())?),
        };
        *slot = Some(Arc::new(Control::new(tx, state)));
        Ok(())
    }

    /// The control stream, opened with the session.
    fn control(&self) -> Result<Arc<Control>> {
        lock(&self.inner.control)
            .clone()
            .ok_or_else(|| Error::unavailable("the session has no control stream"))
    }

    /// Opens the gRPC `Control` stream (without blocking: operations queue
    /// until the worker answers); its answers go to `state`.
    fn open_control_stream(
        &self,
        state: Arc<ControlState>,
    ) -> Result<tokio::sync::mpsc::UnboundedSender<Outgoing>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let inner = self.inner.clone();
        let reader_state = state;
        runtime()?.spawn(async move {
            let mut rpc = inner.rpc.clone();
            let request = inner.bulk_request(Requests { rx, next: None });
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
        Ok(tx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        (Arc::new(Control::new(Sink::Stream(tx), state)), rx)
    }

    /// Operations that come further apart than [`DEFER`] (a call to
    /// hundreds of workers, which reaches the last of them milliseconds
    /// after the first) still take the deletions along: a deletion waits
    /// for half again the time between the last two operations. It went
    /// out alone, a second message to every worker, when it waited
    /// [`DEFER`] whatever the pace of operations.
    #[test]
    fn deletions_ride_with_operations_that_come_further_apart_than_the_delay() {
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
            std::thread::sleep(DEFER * 4);
        }
        drain(&mut rx, &deferred_at, &mut along, &mut alone);
        assert!(
            along > alone.len(),
            "{along} deletions rode with an operation, {} went out alone",
            alone.len()
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
