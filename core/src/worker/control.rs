//! Running programs for a session: queuing executions, and the operations
//! of the ordered control stream and their answers (loads: `loads.rs`).

use std::sync::Arc;

use bytes::Bytes;

use super::buffers::{buffer_owning, check_fixed_size_spec};
use super::copies::Answers;
use super::service::Service;
use super::{lock, Session, Shared};
use crate::buffer::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::transport::host_calls::ControlSink;
use crate::transport::proto::{
    control_request, ControlRequest, ControlResponse, ExecuteRequest, PutSmallBufferRequest,
};
use crate::transport::{
    wire_message, wire_traceback, SessionId, CUMULATIVE_VERSION, GRANT_ANSWER_VERSION,
    INLINE_OUTPUTS_VERSION, MAX_INLINE_OUTPUT_BYTES, MAX_INLINE_READ_BYTES, MAX_SMALL_PUT_BYTES,
};

impl Service {
    /// Queues an execution; returns its status (ready when it has run).
    /// Runs `request`: its status, and its output buffers (in the order of
    /// `request.outputs`).
    pub(super) fn execute(
        &self,
        id: SessionId,
        request: &ExecuteRequest,
    ) -> Result<(Event, Vec<Buffer>)> {
        let (exe, inputs, stream) = self.with_session(id, |session| {
            let exe = session
                .executables
                .get(&request.executable)
                .map(|loaded| loaded.exe.clone())
                .ok_or_else(|| {
                    Error::not_found(format!(
                        "no executable {} in this session",
                        request.executable
                    ))
                })?;
            let inputs =
                request
                    .inputs
                    .iter()
                    .map(|h| {
                        session.buffers.get(h).cloned().ok_or_else(|| {
                            Error::not_found(format!("no buffer {h} in this session"))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
            check_new_handles(session, &request.outputs)?;
            let stream = session
                .streams
                .entry(request.stream)
                .or_insert_with(|| self.0.client.create_stream())
                .clone();
            Ok((exe, inputs, stream))
        })?;
        let made: usize = exe
            .program()
            .output_specs
            .iter()
            .map(|s| s.sharding.devices().len())
            .sum();
        if made != request.outputs.len() {
            return Err(Error::invalid_argument(format!(
                "{} output handles given but the executable makes {made} buffers",
                request.outputs.len()
            )));
        }
        // Nobody waits here: the executors take it at once.
        let (buffers, status) = exe.execute_shards(inputs, stream)?;
        self.with_session(id, |session| {
            check_new_handles(session, &request.outputs)?;
            session
                .buffers
                .extend(request.outputs.iter().copied().zip(buffers.iter().cloned()));
            Ok(())
        })?;
        Ok((status, buffers))
    }

    /// Makes a buffer of the session from the bytes of a
    /// `PutSmallBufferRequest`.
    fn put_small(&self, id: SessionId, request: PutSmallBufferRequest) -> Result<()> {
        let handle = request.handle;
        let spec = check_fixed_size_spec(
            &self.0.client,
            request.spec.as_ref(),
            "PutSmallBufferRequest",
            "are uploaded with PutBuffer",
        )?;
        if request.data.len() > MAX_SMALL_PUT_BYTES || request.data.len() != spec.size {
            return Err(Error::invalid_argument(format!(
                "buffer {handle} needs {} bytes, and a PutSmallBufferRequest carries at most \
                 {MAX_SMALL_PUT_BYTES}; it has {}",
                spec.size,
                request.data.len()
            )));
        }
        self.with_session(id, |session| check_new_handles(session, &[handle]))?;
        let buffer = buffer_owning(&self.0.client, &spec, request.data.to_vec())
            .map_err(|e| e.context(format!("buffer {handle}")))?;
        self.with_session(id, |session| {
            check_new_handles(session, &[handle])?;
            session.buffers.insert(handle, buffer);
            Ok(())
        })
    }

    /// One operation of a control stream. A failed execution still makes its
    /// output buffers, failed with its error, so that whoever reads them learns
    /// why.
    /// Returns what finishes later: a queued execution, or a read.
    pub(super) fn apply(
        &self,
        id: SessionId,
        seq: u64,
        op: Option<control_request::Op>,
        answers: &Answers,
    ) -> Result<Option<Later>> {
        match op {
            Some(control_request::Op::GrantRead(request)) => {
                self.grant_read(id, &request).map(|()| None)
            }
            // Finishes like an execution: when its buffer is ready.
            Some(control_request::Op::FetchBuffer(request)) => self
                .fetch(id, seq, request, answers.clone())
                .map(|ready| Some(Later::Execution(ready, Vec::new()))),
            Some(control_request::Op::Execute(request)) => self
                .execute(id, &request)
                .map(|(status, outputs)| Some(Later::Execution(status, outputs)))
                .inspect_err(|e| self.fail_outputs(id, &request.outputs, e)),
            Some(control_request::Op::ReadBuffer(request)) => {
                let buffer = self.with_session(id, |session| {
                    session
                        .buffers
                        .get(&request.handle)
                        .cloned()
                        .ok_or_else(|| {
                            Error::not_found(format!(
                                "no buffer {} in this session",
                                request.handle
                            ))
                        })
                })?;
                // Fixed-size elements only: the size must be known without
                // waiting for the buffer (this runs on a network thread).
                let size = match buffer.dtype().byte_size() {
                    Some(_) => buffer.on_host_size()?,
                    None => {
                        return Err(Error::invalid_argument(format!(
                            "buffer {} holds strings, which are not read on the control stream",
                            request.handle
                        )))
                    }
                };
                if size > MAX_INLINE_READ_BYTES {
                    return Err(Error::invalid_argument(format!(
                        "buffer {} has {size} bytes; reads on the control stream take at most \
                         {MAX_INLINE_READ_BYTES} (use GetBuffer)",
                        request.handle
                    )));
                }
                Ok(Some(Later::Read(buffer)))
            }
            Some(control_request::Op::PutSmallBuffer(request)) => {
                self.put_small(id, request).map(|()| None)
            }
            Some(control_request::Op::DeleteBuffers(request)) => self.with_session(id, |session| {
                for handle in &request.handles {
                    if let Some(buffer) = session.buffers.remove(handle) {
                        buffer.delete();
                    }
                }
                Ok(None)
            }),
            Some(control_request::Op::UnloadExecutable(request)) => {
                self.with_session(id, |session| {
                    session
                        .executables
                        .remove(&request.handle)
                        .map(|_| None)
                        .ok_or_else(|| {
                            Error::not_found(format!(
                                "no executable {} in this session",
                                request.handle
                            ))
                        })
                })
            }
            Some(control_request::Op::HostCallbackResult(result)) => {
                self.with_session(id, |session| session.calls.finish(result))?;
                Ok(None)
            }
            None => Err(Error::invalid_argument(
                "a control request without an operation",
            )),
        }
    }

    /// Makes `handles` (those not in use) buffers failed with `err`.
    fn fail_outputs(&self, id: SessionId, handles: &[u64], err: &Error) {
        let Some(device) = self.0.client.devices().first().cloned() else {
            return;
        };
        let _ = self.with_session(id, |session| {
            for &handle in handles {
                session.buffers.entry(handle).or_insert_with(|| {
                    Buffer::new(
                        &self.0.client,
                        device.clone(),
                        device.default_memory_space().clone(),
                        DType::U8,
                        &[0],
                        crate::future::Event::ready(Err(err.clone())),
                    )
                });
            }
            Ok(())
        });
    }
}

/// Refuses output handles that repeat or that a buffer of the session has.
pub(super) fn check_new_handles(session: &Session, handles: &[u64]) -> Result<()> {
    // A few handles (the common case) are compared with each other; many
    // go through a set.
    let mut seen = std::collections::HashSet::new();
    for (i, &h) in handles.iter().enumerate() {
        let repeated = if handles.len() <= 16 {
            handles[..i].contains(&h)
        } else {
            !seen.insert(h)
        };
        if repeated {
            return Err(Error::invalid_argument(format!(
                "output handle {h} is given twice"
            )));
        }
        if session.buffers.contains_key(&h) {
            return Err(Error::already_exists(format!(
                "buffer {h} exists in this session"
            )));
        }
    }
    Ok(())
}

/// The answer to control operation `seq`: applied (`finished` false) or run.
pub(super) fn control_answer(seq: u64, result: &Result<()>, finished: bool) -> ControlResponse {
    let (code, message, remote_traceback) = match result {
        Ok(()) => (0, String::new(), String::new()),
        // Bounded: one huge user error must not break the stream.
        Err(e) => (e.code() as u32, wire_message(e), wire_traceback(e)),
    };
    ControlResponse {
        seq,
        code,
        message,
        finished,
        host_callback: None,
        remote_traceback,
        data: Bytes::new(),
        progress_bytes: 0,
        total_bytes: 0,
        resumed: false,
        session_ended: false,
    }
}

/// What a control operation leaves to finish later, answered a second time.
pub(super) enum Later {
    /// A queued execution (or fetch): its status, and its outputs.
    Execution(Event, Vec<Buffer>),
    /// A read of a small buffer: its bytes once it is ready.
    Read(Buffer),
}

/// Fails the host callback calls of a session when the connection of its
/// control stream (`generation`) ends, unless another took over.
pub(super) struct DetachCalls(pub(super) Arc<Shared>, pub(super) SessionId, pub(super) u64);

impl Drop for DetachCalls {
    fn drop(&mut self) {
        if let Some(session) = lock(&self.0.sessions).get_mut(&self.1) {
            if session.stream.is_current(self.2) {
                session.calls.detach();
                session.stream.detach(self.2);
            }
        }
    }
}

/// The bytes of an execution's `outputs`, one after another, for its answer
/// (see [`INLINE_OUTPUTS_VERSION`](crate::transport::INLINE_OUTPUTS_VERSION)):
/// empty unless every output is ready, of fixed-size elements, and all of
/// them take at most [`MAX_INLINE_OUTPUT_BYTES`] (and at least one byte).
pub(super) fn inline_outputs(outputs: &[Buffer]) -> Bytes {
    let mut total = 0usize;
    for buffer in outputs {
        let ready = matches!(buffer.ready_event().status(), Some(Ok(())));
        let size = match (ready, buffer.dtype().byte_size()) {
            (true, Some(_)) => buffer.on_host_size().ok(),
            _ => None,
        };
        match size.and_then(|s| total.checked_add(s)) {
            Some(t) if t <= MAX_INLINE_OUTPUT_BYTES => total = t,
            _ => return Bytes::new(),
        }
    }
    if total == 0 {
        return Bytes::new();
    }
    // The bytes as they are, copied once (into the answer). A buffer
    // deleted meanwhile gives none: the controller reads it, and learns why.
    let mut data = Vec::with_capacity(total);
    for buffer in outputs {
        let Ok(storage) = buffer.storage() else {
            return Bytes::new();
        };
        let Storage::Dense(bytes) = &*storage else {
            return Bytes::new();
        };
        data.extend_from_slice(bytes.as_slice());
    }
    if data.len() != total {
        return Bytes::new();
    }
    Bytes::from(data)
}

/// How often an operation of a control stream marks its session as alive.
const TOUCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A session's control stream on the worker, however it travels (a gRPC
/// `Control` stream or a lane): takes operations in order and answers them
/// on `answers`.
pub(super) struct ControlLoop {
    service: Service,
    id: SessionId,
    /// The session's stream, where its answers go.
    answers: Answers,
    /// This connection's generation of the session's stream.
    generation: u64,
    touched: std::time::Instant,
    /// Answering cumulatively: the last operation taken that no answer sent
    /// or to come covers yet.
    unanswered: Option<u64>,
    cumulative: bool,
    inline: bool,
    grants_at_once: bool,
    /// Operations taken whose answer is still to come (executions, reads):
    /// while there are some, an answer is not the last the controller
    /// waits for, and a lane may write several at once.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// However the stream ends, host callbacks waiting on it fail.
    _detach: DetachCalls,
}

impl ControlLoop {
    /// A connection of session `id`'s control stream, answering on `sink`
    /// (host callback calls travel there too): the stream's first, or one
    /// that `resume`s it (see [`SessionStream`](super::resume::SessionStream));
    /// also what tells that the session ended.
    pub(super) fn open(
        service: &Service,
        id: SessionId,
        sink: ControlSink,
        resume: bool,
    ) -> Result<(ControlLoop, tokio::sync::watch::Receiver<()>)> {
        let (ended, cumulative, inline, grants_at_once, answers, generation) = service
            .with_session(id, |session| {
                let generation = session.stream.attach(sink.clone(), resume)?;
                session.calls.attach(sink);
                Ok((
                    session.ended.subscribe(),
                    session.version >= CUMULATIVE_VERSION,
                    session.version >= INLINE_OUTPUTS_VERSION,
                    session.version >= GRANT_ANSWER_VERSION,
                    session.stream.clone(),
                    generation,
                ))
            })?;
        let control = ControlLoop {
            service: Service(service.0.clone()),
            id,
            answers,
            generation,
            touched: std::time::Instant::now(),
            unanswered: None,
            cumulative,
            inline,
            grants_at_once,
            in_flight: Arc::default(),
            _detach: DetachCalls(service.0.clone(), id, generation),
        };
        Ok((control, ended))
    }

    /// What tells the controller that the session ended, when the
    /// session's stream resumes (see `SessionStream::goodbye`).
    pub(super) fn goodbye(&self) -> Option<ControlResponse> {
        self.answers.goodbye()
    }

    /// Whether operations taken wait for an answer (see [`idle`](Self::idle)).
    pub(super) fn unanswered(&self) -> bool {
        self.unanswered.is_some()
    }

    /// No further operation has arrived: one answer for those taken. False
    /// once the controller is gone.
    pub(super) fn idle(&mut self) -> bool {
        match self.unanswered.take() {
            Some(seq) => self
                .answers
                .send_with_more(Ok(control_answer(seq, &Ok(()), false)), self.more())
                .is_ok(),
            None => true,
        }
    }

    /// Takes operation `op`, answering it now or when it finishes. False
    /// once the controller is gone.
    pub(super) fn take(&mut self, op: ControlRequest) -> bool {
        // An operation counts as the session's heartbeat (at most one lock
        // of the sessions per tenth of a second for it).
        if self.touched.elapsed() >= TOUCH_EVERY {
            self.touched = std::time::Instant::now();
            let touched = self.touched;
            let _ = self.service.with_session(self.id, |session| {
                session.last_seen = touched;
                Ok(())
            });
        }
        self.service
            .0
            .operations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seq = op.seq;
        // A copy's destination reads once its grant is answered.
        let answer_now =
            self.grants_at_once && matches!(op.op, Some(control_request::Op::GrantRead(_)));
        self.answers.received(&op.received);
        let result = match self.answers.take(self.generation, seq) {
            Ok(true) => self.service.apply(self.id, seq, op.op, &self.answers),
            // Another connection resumed the stream: this one is done.
            Ok(false) => return false,
            Err(e) => Err(e),
        };
        let (later, applied) = match result {
            Ok(later) => (later, Ok(())),
            Err(e) => (None, Err(e)),
        };
        if self.cumulative && applied.is_ok() && !answer_now {
            // What finishes later is answered then, and that answer covers
            // this one and those before.
            self.unanswered = later.is_none().then_some(seq);
        } else {
            self.unanswered = None;
            if self
                .answers
                .send_with_more(Ok(control_answer(seq, &applied, false)), self.more())
                .is_err()
            {
                return false;
            }
        }
        // The controller may be gone by the time these finish: then nobody
        // is told.
        let answers = self.answers.clone();
        let inline = self.inline;
        if later.is_some() {
            self.in_flight
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let in_flight = self.in_flight.clone();
        // Whether other answers are still to come after this one.
        let more = move || in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) > 1;
        match later {
            None => {}
            Some(Later::Execution(status, outputs)) => status.when_ready(move |result| {
                let mut answer = control_answer(seq, &result, true);
                if inline && result.is_ok() {
                    answer.data = inline_outputs(&outputs);
                }
                let _ = answers.send_with_more(Ok(answer), more());
            }),
            Some(Later::Read(buffer)) => {
                let ready = buffer.ready_event().clone();
                ready.when_ready(move |status| {
                    let read = status.and_then(|()| buffer.to_host_vec());
                    let mut answer =
                        control_answer(seq, &read.as_ref().map(|_| ()).map_err(Clone::clone), true);
                    if let Ok(data) = read {
                        answer.data = data.into();
                    }
                    let _ = answers.send_with_more(Ok(answer), more());
                });
            }
        }
        true
    }

    /// Whether answers are still to come for operations taken.
    fn more(&self) -> bool {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Tells the controller why the stream broke, if it still listens.
    pub(super) fn broke(&self, status: tonic::Status) {
        let _ = self.answers.send(Err(status));
    }
}
