//! The worker's answers on the control stream: completing operations in
//! order, waiting until they are settled, and failing what is left when the
//! stream ends.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::Bytes;

use super::{ControlState, Finish};
use crate::error::{Error, ErrorCode, Result};
use crate::session::host_calls::run_host_callback;
use crate::session::{lock, Inner};
use crate::transport::from_status;
use crate::transport::proto::ControlResponse;

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

    /// Runs the completion of operation `seq`, if it is still waiting.
    pub(super) fn complete(&self, seq: u64, result: Result<Bytes>) {
        lock(&self.progress).remove(&seq);
        let completion = lock(&self.pending).remove(&seq);
        let completion = completion.or_else(|| lock(&self.applied).remove(&seq));
        if let Some(completion) = completion {
            completion(result);
        }
    }

    /// Runs the completions of the operations that finish once applied, up
    /// to `acked` (their failures were answered, and run, before).
    pub(super) fn applied_up_to(&self, acked: u64) {
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
    pub(in crate::session) fn fail_all(&self, err: &Error) {
        lock(&self.progress).clear();
        let mut drained: Vec<Finish> = lock(&self.pending).drain().map(|(_, c)| c).collect();
        drained.extend(std::mem::take(&mut *lock(&self.applied)).into_values());
        for completion in drained {
            completion(Err(err.clone()));
        }
    }

    /// The error that ended the stream, if it ended.
    pub(super) fn broken(&self) -> Option<Error> {
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
        state.note_received(answer.seq);
        let data = std::mem::take(&mut answer.data);
        state.complete(answer.seq, result.map(|()| data));
    } else if let Err(err) = result {
        state.note_received(answer.seq);
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
    lock(&state.broken).get_or_insert(ended.clone());
    state.changed.notify_waiters();
    state.fail_all(&ended);
}
