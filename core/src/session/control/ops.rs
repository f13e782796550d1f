//! The operations a session sends on its control stream (executions, reads
//! and puts of small buffers, deletions, grants, fetches), and opening the
//! stream.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::answers::{answered, read_answers, stream_ended};
use super::{finish_of, Control, ControlState, Finish, Outgoing, Requests, Sink};
use crate::error::{Error, Result};
#[cfg(any(test, feature = "testing"))]
use crate::session::block_on;
use crate::session::connect::NOBODY_LISTENS;
use crate::session::{lock, Completion, Inner, Progress, RemoteSession};
use crate::transport::lane::{LaneSender, LaneWriter};
use crate::transport::lane_reader::{read_lane_answers, Handlers};
use crate::transport::proto::{
    control_request, BufferSpec, ExecuteRequest, FetchBufferRequest, GrantReadRequest,
    PutSmallBufferRequest, ReadBufferRequest, UnloadExecutableRequest,
};
use crate::transport::{from_status, runtime};

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
    pub(in crate::session) fn send_control(
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
    pub(in crate::session) fn settle(&self) -> Result<()> {
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
    pub(in crate::session) fn open_control(
        &self,
        lane: Option<(std::net::TcpStream, Duration)>,
    ) -> Result<()> {
        let mut slot = lock(&self.inner.control);
        if slot.is_some() {
            return Ok(());
        }
        let state = Arc::new(ControlState::for_version(self.inner.version));
        let (tx, write_timeout) = match lane {
            Some((socket, write_timeout)) => (
                lane_sink(&self.inner, &state, socket, write_timeout, 1)?,
                Some(write_timeout),
            ),
            None => (
                Sink::Stream(open_control_stream(&self.inner, state.clone(), 1, false)?),
                None,
            ),
        };
        *slot = Some(Arc::new(Control::new(tx, state, write_timeout)));
        Ok(())
    }

    /// The control stream, opened with the session.
    fn control(&self) -> Result<Arc<Control>> {
        lock(&self.inner.control)
            .clone()
            .ok_or_else(|| Error::unavailable("the session has no control stream"))
    }
}

/// The sink of a lane on `socket` (its writes bounded by `write_timeout`),
/// connection `generation` of the session's control stream, whose answers
/// go to `state`.
pub(super) fn lane_sink(
    inner: &Arc<Inner>,
    state: &Arc<ControlState>,
    socket: std::net::TcpStream,
    write_timeout: Duration,
    generation: u64,
) -> Result<Sink> {
    // One descriptor, shared by the reader and the writer.
    let socket = Arc::new(socket);
    let read = socket.clone();
    let (answer_state, answer_inner) = (state.clone(), Arc::downgrade(inner));
    let (end_state, end_inner) = (state.clone(), Arc::downgrade(inner));
    read_lane_answers(
        read,
        Handlers {
            answer: Box::new(move |answer| {
                answered(&answer_state, &answer_inner, generation, answer)
            }),
            ended: Box::new(move |ended| stream_ended(&end_state, &end_inner, generation, ended)),
        },
    )?;
    Ok(Sink::Lane(LaneSender::new(LaneWriter::new(
        socket,
        write_timeout,
    ))))
}

/// Opens a gRPC `Control` stream, connection `generation` of the session's
/// control stream (`resume`: one that resumes it), without blocking:
/// operations queue until the worker answers; its answers go to `state`.
pub(super) fn open_control_stream(
    inner: &Arc<Inner>,
    state: Arc<ControlState>,
    generation: u64,
    resume: bool,
) -> Result<tokio::sync::mpsc::UnboundedSender<Outgoing>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let inner = inner.clone();
    let reader_state = state;
    runtime()?.spawn(async move {
        let mut rpc = inner.rpc.clone();
        let mut request = inner.bulk_request(Requests { rx, next: None });
        if resume {
            request.metadata_mut().insert(
                crate::transport::RESUME,
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        match rpc.control(request).await {
            Ok(answers) => {
                // The reader must not keep the session alive.
                let weak = Arc::downgrade(&inner);
                drop(inner);
                read_answers(answers.into_inner(), reader_state, weak, generation).await;
            }
            Err(status) => {
                let err = Error::unavailable(format!(
                    "worker {}: cannot open the control stream: {}",
                    inner.address,
                    from_status(&status).message()
                ));
                if resume {
                    // The attempt to resume learns why at once: a final
                    // refusal ends it, and the session.
                    let control = lock(&inner.control).clone();
                    if let Some(control) = control {
                        control.resume_failed(generation, refusal_of(&inner, &status));
                    }
                }
                stream_ended(&reader_state, &Arc::downgrade(&inner), generation, err);
            }
        }
    });
    Ok(tx)
}

/// The error of a `Control` stream that could not open, as an attempt to
/// resume weighs it: the worker's refusal keeps its code, and a connection
/// that nothing accepted says nobody listens (the worker's process is gone).
fn refusal_of(inner: &Inner, status: &tonic::Status) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return Error::unavailable(format!(
                    "worker {}: {NOBODY_LISTENS} ({io})",
                    inner.address
                ));
            }
        }
        source = cause.source();
    }
    from_status(status).context(format!("worker {}", inner.address))
}
