//! Resuming a session's control stream after its connection broke
//! (protocol [`RESUME_VERSION`](crate::transport::RESUME_VERSION)): the worker keeps the session for its
//! session timeout, so the controller connects again, with backoff, until
//! that time is up. A connection that resumes the stream learns from the
//! worker's `resumed` answer the last operation the worker took, sends the
//! operations after it again (the log kept them), and gets again every
//! final answer it had not said it received: an operation that reached the
//! worker runs once, one that did not is sent again, and every answer
//! reaches its completion. Operations sent meanwhile wait in the log.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::ops::{lane_sink, open_control_stream};
use super::{Control, Outgoing, Sink};
use crate::error::{Error, ErrorCode, Result};
use crate::session::connect::{open_lane, NOBODY_LISTENS};
use crate::session::{lock, Inner};

/// The first wait between attempts to connect again; it doubles up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// The longest wait between attempts to connect again.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest an attempt waits to connect, and then for the worker's
/// `resumed` answer.
const ATTEMPT: Duration = Duration::from_secs(2);

impl Control {
    /// Whether the stream resumes after its connection broke.
    pub(in crate::session) fn resumes(&self) -> bool {
        self.state.acks
    }

    /// Whether connection `generation` is the one the stream travels on.
    pub(in crate::session) fn is_current(&self, generation: u64) -> bool {
        self.current.load(Ordering::SeqCst) == generation
    }

    /// Whether the stream waits for a connection that resumes it.
    pub(in crate::session) fn is_down(&self) -> bool {
        matches!(lock(&self.sender).tx, Sink::Down)
    }

    /// Connection `generation` broke: operations wait in the log from now
    /// on. True for the first to say so (which connects again).
    fn disconnect(&self, generation: u64) -> bool {
        let mut sender = lock(&self.sender);
        if !self.is_current(generation)
            || self.broken.swap(generation, Ordering::SeqCst) == generation
        {
            return false;
        }
        std::mem::replace(&mut sender.tx, Sink::Down).close();
        true
    }

    /// Ends the connection the stream travels on now (the worker looks lost:
    /// a heartbeat went unanswered, a request could not reach it): its
    /// reader sees it end, and the stream connects again.
    pub(in crate::session) fn interrupt(&self) {
        let mut sender = lock(&self.sender);
        std::mem::replace(&mut sender.tx, Sink::Down).close();
    }

    /// The worker's `resumed` answer on connection `generation`: it took
    /// every operation up to `taken`. The connection takes over the stream
    /// (now, or once it is offered, when the answer came first).
    pub(in crate::session) fn on_resumed(&self, generation: u64, taken: u64) {
        let sink = {
            let mut resuming = lock(&self.resuming);
            match resuming.as_mut() {
                Some(r) if r.generation == generation => match r.sink.take() {
                    Some(sink) => {
                        *resuming = None;
                        sink
                    }
                    None => {
                        r.taken = Some(taken);
                        return;
                    }
                },
                _ => return,
            }
        };
        self.take_over(generation, sink, taken);
    }

    /// Connection `generation`, `sink`, takes over the stream: the
    /// operations after `taken` (the last the worker took) go out on it
    /// again, then new ones.
    fn take_over(&self, generation: u64, sink: Sink, taken: u64) {
        let mut sender = lock(&self.sender);
        self.state.acked.fetch_max(taken, Ordering::SeqCst);
        let again: Vec<_> = match sender.log.as_mut() {
            Some(log) => {
                while log.front().is_some_and(|request| request.seq <= taken) {
                    log.pop_front();
                }
                log.iter().cloned().collect()
            }
            None => Vec::new(),
        };
        let resent = again
            .into_iter()
            .all(|request| sink.send(Outgoing::One(request), true));
        self.current.store(generation, Ordering::SeqCst);
        sender.tx = sink;
        drop(sender);
        if !resent {
            // Broke again at once: its reader's end connects again.
            tracing::debug!(
                generation,
                "a resumed control stream broke while catching up"
            );
        }
        self.state
            .applied_up_to(self.state.acked.load(Ordering::SeqCst));
        self.state.changed.notify_waiters();
        // Under the lock the waiter checks under: it cannot miss this.
        let _resuming = lock(&self.resuming);
        self.resumed.notify_all();
    }

    /// Connection `generation` is about to be made: its `resumed` answer,
    /// should it come before the connection is offered, waits for it.
    fn expect_resume(&self, generation: u64) {
        *lock(&self.resuming) = Some(Resuming {
            generation,
            sink: None,
            taken: None,
            failed: None,
        });
    }

    /// Connection `generation`, which was to resume the stream, failed
    /// (`err`) before the worker answered: the attempt waiting for it
    /// learns why now.
    pub(in crate::session) fn resume_failed(&self, generation: u64, err: Error) {
        let mut resuming = lock(&self.resuming);
        if let Some(r) = resuming.as_mut().filter(|r| r.generation == generation) {
            r.failed = Some(err);
            self.resumed.notify_all();
        }
    }

    /// Offers `sink`, connection `generation`, to take over the stream once
    /// the worker answers that it resumed; waits at most `within` for that.
    /// The connection's failure before the answer is the error.
    fn resume_on(&self, generation: u64, sink: Sink, within: Duration) -> Result<bool> {
        let answered = {
            let mut resuming = lock(&self.resuming);
            match resuming.as_mut() {
                Some(r) if r.generation == generation => match r.taken {
                    Some(taken) => {
                        *resuming = None;
                        Some((sink, taken))
                    }
                    None => {
                        r.sink = Some(sink);
                        None
                    }
                },
                _ => {
                    sink.close();
                    return Ok(false);
                }
            }
        };
        if let Some((sink, taken)) = answered {
            self.take_over(generation, sink, taken);
            return Ok(true);
        }
        let deadline = Instant::now() + within;
        let mut resuming = lock(&self.resuming);
        while !self.is_current(generation) {
            let failed = resuming
                .as_mut()
                .filter(|r| r.generation == generation)
                .and_then(|r| r.failed.take());
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || failed.is_some() {
                // Never took over: it goes.
                if let Some(r) = resuming.take_if(|r| r.generation == generation) {
                    if let Some(sink) = r.sink {
                        sink.close();
                    }
                }
                return match failed {
                    Some(err) => Err(err),
                    None => Ok(self.is_current(generation)),
                };
            }
            resuming = self
                .resumed
                .wait_timeout(resuming, left)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        Ok(true)
    }
}

/// A connection that resumes the stream, from before it is made until the
/// worker's `resumed` answer and the connection both came.
pub(super) struct Resuming {
    generation: u64,
    /// The connection, once made.
    sink: Option<Sink>,
    /// The last operation the worker took, once it answered.
    taken: Option<u64>,
    /// Why the connection failed, if it did before the worker answered.
    failed: Option<Error>,
}

impl Inner {
    /// Connection `generation` of the control stream broke with `why`: for
    /// a session that resumes its stream, connects again on a thread of its
    /// own until the stream resumed or the worker's session timeout is up
    /// (then the worker is lost).
    pub(in crate::session) fn reconnect(self: &Arc<Self>, generation: u64, why: Error) {
        let Some(control) = lock(&self.control).clone() else {
            return;
        };
        if !control.disconnect(generation) || self.lost.is_ready() {
            return;
        }
        self.link_down(&why);
        tracing::warn!(worker = %self.address, error = %why, "the control stream broke: connecting again");
        let inner = Arc::downgrade(self);
        let deadline = self.beat.heard_at() + self.session_timeout;
        let spawned = std::thread::Builder::new()
            .name("colocated-reconnect".into())
            .spawn(move || reconnect(inner, control, deadline, why));
        if let Err(e) = spawned {
            self.end(Error::unavailable(format!(
                "worker {}: the control stream broke and no thread could connect again: {e}",
                self.address
            )));
        }
    }

    /// One attempt to resume the stream on a new connection, `generation`,
    /// taking at most `within`.
    fn resume_control(
        self: &Arc<Self>,
        control: &Control,
        generation: u64,
        within: Duration,
    ) -> Result<bool> {
        let began = Instant::now();
        control.expect_resume(generation);
        let sink = match control.lane {
            Some(write_timeout) => {
                let socket = open_lane(
                    &self.session_address,
                    self.session_token.as_ref(),
                    &self.id,
                    within,
                    true,
                )?;
                lane_sink(self, &control.state, socket, write_timeout, generation)?
            }
            None => Sink::Stream(open_control_stream(
                self,
                control.state.clone(),
                generation,
                true,
            )?),
        };
        let left = within.saturating_sub(began.elapsed());
        control.resume_on(generation, sink, left)
    }
}

/// Whether `err`, from an attempt to resume, says the session is gone for
/// good: the worker no longer has it, refuses to resume it, or no process
/// listens at its address any more (the one that held the session is gone;
/// a partition makes connections time out, and a proxy in between accepts
/// them).
fn final_refusal(err: &Error) -> bool {
    matches!(
        err.code(),
        ErrorCode::Unauthenticated | ErrorCode::FailedPrecondition | ErrorCode::PermissionDenied
    ) || err.message().contains(NOBODY_LISTENS)
}

/// Connects `control`'s stream again until it resumed, the session ended,
/// or `deadline` (the worker's session timeout since it was last heard)
/// passed.
fn reconnect(inner: Weak<Inner>, control: Arc<Control>, deadline: Instant, why: Error) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) || inner.lost.is_ready() {
            return;
        }
        if Instant::now() >= deadline {
            inner.end(Error::unavailable(format!(
                "worker {}: the link broke ({}) and did not come back within the session \
                 timeout ({:?}): the worker has ended the session",
                inner.address,
                why.message(),
                inner.session_timeout
            )));
            return;
        }
        let generation = control.made.fetch_add(1, Ordering::SeqCst) + 1;
        let within = ATTEMPT.min(deadline.saturating_duration_since(Instant::now()));
        match inner.resume_control(&control, generation, within) {
            Ok(true) => {
                inner.beat.heard();
                inner.link_up();
                tracing::info!(worker = %inner.address, "the control stream resumed");
                return;
            }
            Ok(false) => {}
            Err(err) if final_refusal(&err) => {
                inner.end(inner.gone(err.message()));
                return;
            }
            Err(err) => {
                tracing::debug!(worker = %inner.address, error = %err, "connecting again failed");
            }
        }
        drop(inner);
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
