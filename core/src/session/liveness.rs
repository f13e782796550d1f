//! Whether the worker is still there, and keeping the session open: one timer
//! for every session of the process sends a heartbeat to a worker it has not
//! heard from for a while, and losing the worker (a heartbeat or request that
//! cannot reach it) fails everything in flight.
//!
//! Traffic counts as liveness: a session whose control stream was answered
//! recently sends no heartbeat. An idle session (nothing in flight) beats
//! every third of the worker's session timeout, a busy one every heartbeat
//! interval the worker asked for, so a hung worker fails work within about
//! three intervals while an idle controller of hundreds of hosts stays quiet.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::{lock, Inner};
use crate::error::{Error, ErrorCode, Result};
use crate::transport::proto::HeartbeatRequest;
use crate::transport::{from_status, runtime};

/// Every session's heartbeat schedule, and when its worker was last heard.
pub(super) struct Beat {
    /// Between heartbeats while work is in flight: the worker's interval.
    busy: Duration,
    /// Between heartbeats of an idle session.
    idle: Duration,
    /// Bound of a heartbeat: a worker silent for this long is lost.
    pub(super) timeout: Duration,
    /// When the worker was last heard from, in milliseconds since `epoch()`.
    heard: AtomicU64,
    /// A heartbeat is on its way.
    beating: AtomicBool,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

pub(super) fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Beat {
    /// The schedule for a worker that asked for a heartbeat every
    /// `interval_ms` and closes sessions silent for `session_timeout_ms` (0:
    /// not said, as older workers do).
    pub(super) fn new(interval_ms: u32, session_timeout_ms: u32) -> Beat {
        let busy = Duration::from_millis(u64::from(interval_ms.max(100)));
        let idle = Duration::from_millis(u64::from(session_timeout_ms) / 3).max(busy);
        Beat {
            busy,
            idle,
            // Twice the interval, at least half a second.
            timeout: (busy * 2).max(Duration::from_millis(500)),
            heard: AtomicU64::new(now_ms()),
            beating: AtomicBool::new(false),
        }
    }

    /// The worker answered something just now.
    pub(super) fn heard(&self) {
        self.heard.fetch_max(now_ms(), Ordering::Relaxed);
    }

    /// When the worker was last heard from.
    pub(super) fn heard_at(&self) -> Instant {
        epoch() + Duration::from_millis(self.heard.load(Ordering::Relaxed))
    }

    /// Whether a heartbeat is due: none on its way, and the worker silent
    /// for longer than the schedule of a session that is `busy` or not.
    fn due(&self, busy: bool, now: u64) -> bool {
        let period = if busy { self.busy } else { self.idle };
        let silent = now.saturating_sub(self.heard.load(Ordering::Relaxed));
        !self.beating.load(Ordering::Relaxed) && u128::from(silent) >= period.as_millis()
    }
}

/// The sessions the timer watches.
struct Watched {
    sessions: Vec<Weak<Inner>>,
    /// The timer's task runs (it stops when no session is left).
    running: bool,
}

fn watched() -> &'static std::sync::Mutex<Watched> {
    // Per process: a forked child runs its own timer for its sessions.
    static WATCHED: crate::process::PerProcess<std::sync::Mutex<Watched>> =
        crate::process::PerProcess::new();
    WATCHED.get_or_init(|| {
        std::sync::Mutex::new(Watched {
            sessions: Vec::new(),
            running: false,
        })
    })
}

/// Keeps `inner`'s session open while it lives: the shared timer watches it.
pub(super) fn watch(inner: &Arc<Inner>) -> Result<()> {
    let mut watched = lock(watched());
    watched.sessions.push(Arc::downgrade(inner));
    if !watched.running {
        runtime()?.spawn(beat_all());
        watched.running = true;
    }
    Ok(())
}

/// The timer: a tick of half the shortest schedule (50 to 500 ms), a
/// heartbeat to each session that is due, all at once.
async fn beat_all() {
    loop {
        let (due, fetch, tick) = {
            let mut watched = lock(watched());
            let now = now_ms();
            let mut tick = Duration::from_millis(500);
            let mut due = Vec::new();
            let mut fetch = Vec::new();
            watched.sessions.retain(|weak| {
                let Some(inner) = weak.upgrade() else {
                    return false;
                };
                if inner.closed.load(Ordering::SeqCst) || inner.lost.is_ready() {
                    // Nothing more goes out: its bulk connection closes.
                    inner.bulk.close_if_idle(u64::MAX);
                    return false;
                }
                tick = tick.min(inner.beat.busy / 2);
                inner.bulk.close_if_idle(now);
                if inner.spans.get().is_some_and(|spans| spans.due(now)) {
                    fetch.push(inner.clone());
                }
                // A stream connecting again is its own watch of the worker.
                let down = lock(&inner.control).as_ref().is_some_and(|c| c.is_down());
                if !down && inner.beat.due(inner.busy(), now) {
                    inner.beat.beating.store(true, Ordering::Relaxed);
                    due.push(inner);
                }
                true
            });
            if watched.sessions.is_empty() {
                watched.running = false;
                return;
            }
            (due, fetch, tick.max(Duration::from_millis(50)))
        };
        for inner in fetch {
            tokio::spawn(async move { inner.fetch_spans().await });
        }
        for inner in due {
            tokio::spawn(async move {
                if let Err(e) = inner.heartbeat().await {
                    if !inner.lost.is_ready() {
                        tracing::warn!(worker = %inner.address, error = %e, "heartbeat failed");
                    }
                }
                inner.beat.beating.store(false, Ordering::Relaxed);
            });
        }
        tokio::time::sleep(tick).await;
    }
}

impl Inner {
    /// Fails at once when the worker is lost.
    pub(super) fn alive(&self) -> Result<()> {
        match self.lost.error() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Whether work waits on the worker: operations of the control stream
    /// not finished, or transfers in flight (they watch `lost_signal`).
    fn busy(&self) -> bool {
        self.lost_signal.receiver_count() > 0
            || lock(&self.control)
                .as_ref()
                .is_some_and(|control| control.waiting())
    }

    /// The error of a failed request; a worker that cannot be reached is lost.
    pub(super) fn fail(&self, status: &tonic::Status) -> Error {
        let err = from_status(status).context(format!("worker {}", self.address));
        if err.code() == ErrorCode::Unavailable {
            self.lose(err.clone());
        }
        err
    }

    /// The worker looks lost (`err`): a session that resumes its control
    /// stream ends the stream's connection and connects again (see
    /// `control::resume`), any other ends.
    pub(super) fn lose(&self, err: Error) {
        if self.lost.is_ready() {
            // Lost already: nothing to reconnect, nothing more to tell.
            return;
        }
        let control = lock(&self.control).clone();
        if let Some(control) = control {
            if control.resumes() && !self.closed.load(Ordering::SeqCst) {
                tracing::debug!(worker = %self.address, error = %err, "the worker looks lost");
                control.interrupt();
                self.link_down(&err);
                return;
            }
        }
        if self.lost.error().is_none() {
            tracing::warn!(worker = %self.address, error = %err, "worker lost");
        }
        self.end(err);
    }

    /// Ends the session with `err`: the lost event carries it, and
    /// everything in flight fails with it.
    pub(super) fn end(&self, err: Error) {
        if self.lost.set(Err(err.clone())).is_ok() {
            self.tell(super::SessionEvent::Lost(err.clone()));
        }
        self.lost_signal.send_replace(true);
        // Executions in flight there will never finish.
        let control = lock(&self.control).clone();
        if let Some(control) = control {
            control.state.fail_all(&err);
        }
    }

    pub(super) async fn heartbeat(&self) -> Result<()> {
        self.alive()?;
        let timeout = self.beat.timeout;
        let mut rpc = self.rpc.clone();
        // The final answers that came since the last operation: the worker
        // keeps them no longer (told again with the next message if this
        // heartbeat does not arrive).
        let control = lock(&self.control).clone();
        let received = control
            .as_ref()
            .map(|c| c.state.take_received())
            .unwrap_or_default();
        let told = received.clone();
        let mut request = self.bulk_request(HeartbeatRequest { received });
        request.set_timeout(timeout);
        let untold = || {
            if let Some(control) = &control {
                for seq in told {
                    control.state.note_received(seq);
                }
            }
        };
        let silent = || {
            let err = Error::unavailable(format!(
                "worker {} did not answer a heartbeat within {:?}",
                self.address, timeout
            ));
            self.lose(err.clone());
            Err(err)
        };
        // A hung worker answers nothing: the deadline ends the call here
        // (tonic's client-side timeout, whose status is not always
        // `DEADLINE_EXCEEDED` itself, or this one).
        match tokio::time::timeout(timeout, rpc.heartbeat(request)).await {
            Ok(Ok(_)) => {
                self.beat.heard();
                Ok(())
            }
            Ok(Err(status)) if from_status(&status).code() != ErrorCode::DeadlineExceeded => {
                untold();
                Err(self.fail(&status))
            }
            _ => {
                untold();
                silent()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_session_beats_every_third_of_the_session_timeout() {
        let beat = Beat::new(1000, 10_000);
        assert_eq!(beat.busy, Duration::from_secs(1));
        assert_eq!(beat.idle, Duration::from_millis(3333));
        assert_eq!(beat.timeout, Duration::from_secs(2));
        let heard = beat.heard.load(Ordering::Relaxed);
        assert!(!beat.due(true, heard + 999));
        assert!(beat.due(true, heard + 1000));
        assert!(!beat.due(false, heard + 3332));
        assert!(beat.due(false, heard + 3333));
        beat.beating.store(true, Ordering::Relaxed);
        assert!(!beat.due(false, heard + 10_000), "one heartbeat at a time");
    }

    #[test]
    fn an_older_worker_without_a_session_timeout_gets_its_interval() {
        let beat = Beat::new(200, 0);
        assert_eq!(beat.idle, beat.busy);
        assert_eq!(beat.timeout, Duration::from_millis(500));
        // A worker asking for nothing gets a heartbeat every 100 ms at most.
        assert_eq!(Beat::new(0, 0).busy, Duration::from_millis(100));
    }
}
