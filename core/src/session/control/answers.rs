//! The worker's answers on the control stream: completing operations in
//! order, waiting until they are settled, and failing what is left when the
//! stream ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::Bytes;

use super::{ControlState, Finish};
use crate::error::{Error, ErrorCode, Result};
use crate::session::host_calls::run_host_callback;
use crate::session::Progress;
use crate::session::{lock, Inner};
use crate::transport::from_status;
use crate::transport::proto::ControlResponse;

/// What waits for the worker's answers on a session's control stream, under
/// one lock: an operation sent takes it once (to be waited for, and to take
/// what to tell the worker), and so does an answer.
#[derive(Default)]
pub(super) struct Waiting {
    /// What to run when an execution finishes, by `seq`.
    pending: HashMap<u64, Finish>,
    /// What to run when an operation that finishes once applied (a small
    /// upload) is answered: by any answer for it or a later one.
    applied: BTreeMap<u64, Finish>,
    /// Where the progress answers of an operation go, by `seq`.
    progress: HashMap<u64, Progress>,
    /// The operations whose final answer came since the last message told
    /// the worker (protocol [`RESUME_VERSION`](crate::transport::RESUME_VERSION):
    /// it keeps each until then).
    pub(super) received: Vec<u64>,
}

impl Waiting {
    /// Whether an operation waits to finish.
    pub(super) fn any(&self) -> bool {
        !self.pending.is_empty() || !self.applied.is_empty()
    }

    /// Takes the completion of operation `seq`, and its progress.
    fn take(&mut self, seq: u64) -> Option<Finish> {
        self.progress.remove(&seq);
        self.pending
            .remove(&seq)
            .or_else(|| self.applied.remove(&seq))
    }

    /// Takes the completions of the operations that finish once applied, up
    /// to `acked`.
    fn take_applied(&mut self, acked: u64) -> Vec<Finish> {
        // Most answers find none waiting.
        if self
            .applied
            .first_key_value()
            .is_none_or(|(&seq, _)| seq > acked)
        {
            return Vec::new();
        }
        let later = self.applied.split_off(&(acked + 1));
        std::mem::replace(&mut self.applied, later)
            .into_values()
            .collect()
    }
}

impl ControlState {
    /// Waits until the worker answered operation `seq`; the stream's error if it
    /// broke first.
    #[cfg(any(test, feature = "testing"))]
    pub(super) async fn settled(&self, seq: u64) -> Result<()> {
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

    /// Operation `seq` goes out: `completion` runs when it finished (or,
    /// `when_applied`, once any answer says it was applied), `progress`
    /// gets its progress answers. The final answers to tell the worker of
    /// with it (see [`Waiting::received`]), taken.
    pub(super) fn expect(
        &self,
        seq: u64,
        completion: Option<Finish>,
        when_applied: bool,
        progress: Option<Progress>,
    ) -> Vec<u64> {
        let mut waiting = lock(&self.waiting);
        if let Some(completion) = completion {
            if when_applied {
                waiting.applied.insert(seq, completion);
            } else {
                waiting.pending.insert(seq, completion);
            }
        }
        if let Some(progress) = progress {
            waiting.progress.insert(seq, progress);
        }
        if self.acks {
            std::mem::take(&mut waiting.received)
        } else {
            Vec::new()
        }
    }

    /// Runs the completion of operation `seq`, if it is still waiting.
    pub(super) fn complete(&self, seq: u64, result: Result<Bytes>) {
        let completion = lock(&self.waiting).take(seq);
        if let Some(completion) = completion {
            completion(result);
        }
    }

    /// An answer for operation `seq` came: the worker took every operation
    /// up to it. With its `result` when it is the operation's final answer
    /// (the next message says it came): its completion runs. Then the
    /// completions of the operations that finish once applied, up to it.
    fn answered_up_to(&self, seq: u64, result: Option<Result<Bytes>>) {
        let acked = self.acked.load(Ordering::SeqCst).max(seq);
        let (completion, applied) = {
            let mut waiting = lock(&self.waiting);
            let completion = match result.is_some() {
                true => {
                    if self.acks {
                        waiting.received.push(seq);
                    }
                    waiting.take(seq)
                }
                false => None,
            };
            (completion, waiting.take_applied(acked))
        };
        if let (Some(completion), Some(result)) = (completion, result) {
            completion(result);
        }
        self.acked.fetch_max(seq, Ordering::SeqCst);
        for completion in applied {
            completion(Ok(Bytes::new()));
        }
    }

    /// Runs the completions of the operations that finish once applied, up
    /// to `acked` (their failures were answered, and run, before).
    pub(super) fn applied_up_to(&self, acked: u64) {
        let done = lock(&self.waiting).take_applied(acked);
        for completion in done {
            completion(Ok(Bytes::new()));
        }
    }

    /// Fails every waiting completion with `err` (the stream broke, the worker
    /// is lost).
    pub(in crate::session) fn fail_all(&self, err: &Error) {
        let drained: Vec<Finish> = {
            let mut waiting = lock(&self.waiting);
            waiting.progress.clear();
            let mut drained: Vec<Finish> = waiting.pending.drain().map(|(_, c)| c).collect();
            drained.extend(std::mem::take(&mut waiting.applied).into_values());
            drained
        };
        for completion in drained {
            completion(Err(err.clone()));
        }
    }

    /// The error that ended the stream, if it ended.
    pub(super) fn broken(&self) -> Option<Error> {
        if !self.is_broken.load(Ordering::SeqCst) {
            return None;
        }
        lock(&self.broken).clone()
    }

    /// The stream ended or broke with `err` (the first error stays).
    fn break_with(&self, err: &Error) {
        let mut broken = lock(&self.broken);
        broken.get_or_insert_with(|| err.clone());
        self.is_broken.store(true, Ordering::SeqCst);
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

/// Reads the worker's answers of connection `generation` of a control
/// stream.
pub(super) async fn read_answers(
    mut answers: tonic::Streaming<ControlResponse>,
    state: Arc<ControlState>,
    inner: Weak<Inner>,
    generation: u64,
) {
    let ended = loop {
        match answers.message().await {
            Ok(Some(answer)) => answered(&state, &inner, generation, answer),
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
    stream_ended(&state, &inner, generation, ended);
}

/// Takes one answer of the worker on connection `generation` of a control
/// stream.
pub(super) fn answered(
    state: &ControlState,
    inner: &Weak<Inner>,
    generation: u64,
    mut answer: ControlResponse,
) {
    if answer.session_ended {
        // Final: the worker has no session to resume.
        if let Some(inner) = inner.upgrade() {
            if !inner.closed.load(Ordering::SeqCst) {
                inner.end(Error::unavailable(format!(
                    "worker {}: {}",
                    inner.address, answer.message
                )));
            }
        }
        return;
    }
    if answer.resumed {
        // The connection resumes the stream: the worker took every
        // operation up to `seq`.
        if let Some(control) = inner
            .upgrade()
            .and_then(|inner| lock(&inner.control).clone())
        {
            control.on_resumed(generation, answer.seq);
        }
        return;
    }
    if let Some(call) = answer.host_callback.take() {
        run_host_callback(inner, call);
        return;
    }
    let result = answer_result(&answer);
    if answer.total_bytes > 0 && !answer.finished {
        let progress = lock(&state.waiting).progress.get(&answer.seq).cloned();
        if let Some(progress) = progress {
            progress(answer.progress_bytes, answer.total_bytes);
        }
    }
    // The worker answered just now (and counted the operation as the
    // session's heartbeat).
    if let Some(inner) = inner.upgrade() {
        inner.beat.heard();
    }
    // Operations are taken in order: any answer for `seq` (taken, progress
    // or finished) says every one up to it was taken. Workers of protocol
    // version 5 leave the rest unsaid.
    let result = if answer.finished {
        let data = std::mem::take(&mut answer.data);
        Some(result.map(|()| data))
    } else if let Err(err) = result {
        tracing::debug!(seq = answer.seq, error = %err, "control operation failed");
        lock(&state.failed).get_or_insert(err.clone());
        Some(Err(err))
    } else {
        None
    };
    state.answered_up_to(answer.seq, result);
    state.changed.notify_waiters();
}

/// Connection `generation` of the control stream ended with `ended`: a
/// session that resumes its stream reconnects (see [`super::resume`]);
/// another is lost (unless it was closed), and what waits on the stream
/// fails. The end of a connection that another replaced changes nothing.
pub(super) fn stream_ended(
    state: &ControlState,
    inner: &Weak<Inner>,
    generation: u64,
    ended: Error,
) {
    if let Some(inner) = inner.upgrade() {
        let control = lock(&inner.control).clone();
        if let Some(control) = control {
            if !control.is_current(generation) {
                return;
            }
            if control.resumes() && !inner.closed.load(Ordering::SeqCst) {
                inner.reconnect(generation, ended);
                return;
            }
        }
        let ended = ended.clone().context(format!("worker {}", inner.address));
        if !inner.closed.load(Ordering::SeqCst) {
            // Ordered work can no longer reach the worker.
            inner.lose(ended);
        }
    }
    state.break_with(&ended);
    state.changed.notify_waiters();
    state.fail_all(&ended);
}
