//! Requests of their own (loads, uploads, downloads) across a broken link.
//!
//! The control stream resumes by itself after its connection broke (see
//! `control::resume`); a request that travels on a connection of its own
//! starts again instead: when its connection fails, or the session finds
//! the link broken (a heartbeat went unanswered) while it waits, it waits
//! until the control stream resumed, and then goes out again. A worker
//! takes each of them twice safely: a load of a handle it has loaded from
//! the same request answers as the first did, an upload is stored only
//! whole (a retry of one that was stored finds its handle taken), and a
//! download asks for the bytes it has not received. A request waits out
//! every outage the session outlives; one whose own connection keeps
//! failing while the session's link is up fails after a few attempts.

use std::time::Duration;

use super::Inner;
use crate::error::{Error, ErrorCode, Result};
use crate::transport::from_status;

/// The first pause before a request goes out again; it doubles up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause before a request goes out again.
const MAX_PAUSE: Duration = Duration::from_millis(500);
/// How many times in a row a request may fail while the session's link is
/// up (its own connection failing) before it fails for good: with the
/// pauses between them, about 2.5 s.
const MAX_FAILURES_WHILE_UP: u32 = 8;

/// A session's link to its worker, as its control stream sees it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Link {
    /// How many times it broke.
    breaks: u64,
    /// Whether it is down now (the control stream connects again).
    down: bool,
}

/// An attempt of a request that failed.
pub(super) struct Failed {
    err: Error,
    /// Its connection failed (rather than the worker refusing it).
    link: bool,
}

impl Failed {
    /// The failure of a request whose call ended with `status` (made here,
    /// with a local source, when the connection failed).
    pub(super) fn of(inner: &Inner, status: &tonic::Status) -> Failed {
        use std::error::Error as _;
        let err = from_status(status).context(format!("worker {}", inner.address));
        // A request that ran out of time is not a broken link (heartbeats
        // find those): going out again would only repeat it.
        let link = status.source().is_some() && err.code() != ErrorCode::DeadlineExceeded;
        Failed { err, link }
    }

    /// A failure that is not the connection's (a malformed answer, a sink
    /// that refused data).
    pub(super) fn answer(err: Error) -> Failed {
        Failed { err, link: false }
    }

    /// A failure of the connection, `err`.
    pub(super) fn link(err: Error) -> Failed {
        Failed { err, link: true }
    }

    /// Whether the connection failed.
    pub(super) fn is_link(&self) -> bool {
        self.link
    }

    /// Its error's code.
    pub(super) fn code(&self) -> ErrorCode {
        self.err.code()
    }

    /// Its error.
    pub(super) fn into_error(self) -> Error {
        self.err
    }
}

/// The attempts of one request: what ends them early, and when to stop.
pub(super) struct Attempts<'a> {
    inner: &'a Inner,
    link: tokio::sync::watch::Receiver<Link>,
    lost: tokio::sync::watch::Receiver<bool>,
    pause: Duration,
    /// Failures in a row while the session's link was up.
    failed_while_up: u32,
    /// Attempts made so far.
    made: u32,
}

impl Inner {
    /// The link broke (`why`): requests in flight end and wait for it.
    pub(super) fn link_down(&self, why: &Error) {
        if self.lost.is_ready() {
            return;
        }
        let broke = self.link.send_if_modified(|link| {
            if link.down {
                return false;
            }
            link.down = true;
            link.breaks += 1;
            true
        });
        if broke {
            self.tell(super::SessionEvent::Disconnected(why.clone()));
        }
    }

    /// The control stream resumed: requests that wait go out again.
    pub(super) fn link_up(&self) {
        let resumed = self
            .link
            .send_if_modified(|link| std::mem::replace(&mut link.down, false));
        if resumed {
            self.tell(super::SessionEvent::Reconnected);
        }
    }

    /// The attempts of a new request.
    pub(super) fn attempts(&self) -> Attempts<'_> {
        Attempts {
            inner: self,
            link: self.link.subscribe(),
            lost: self.lost_signal.subscribe(),
            pause: FIRST_PAUSE,
            failed_while_up: 0,
            made: 0,
        }
    }

    /// The error of a session the worker no longer has, because `why`.
    pub(super) fn gone(&self, why: &str) -> Error {
        Error::unavailable(format!(
            "worker {} no longer has this session (it restarted, or the session timed out): {why}",
            self.address
        ))
    }

    /// The error of a request made while (or because) the session ended.
    fn lost_error(&self) -> Error {
        self.lost
            .error()
            .unwrap_or_else(|| Error::unavailable(format!("worker {} lost", self.address)))
    }

    /// Whether requests start again after a broken link: the session
    /// resumes its control stream.
    fn retries(&self) -> bool {
        crate::transport::lock(&self.control)
            .as_ref()
            .is_some_and(|control| control.resumes())
    }
}

impl Attempts<'_> {
    /// How many attempts came before this one.
    pub(super) fn made(&self) -> u32 {
        self.made
    }

    /// Runs one attempt, `attempt`: its outcome, or a failure of the link
    /// if the session finds it broken first (the attempt's connection may
    /// hang), or the session's end.
    pub(super) async fn run<T>(
        &mut self,
        attempt: impl std::future::Future<Output = std::result::Result<T, Failed>>,
    ) -> std::result::Result<T, Failed> {
        self.inner.alive().map_err(Failed::answer)?;
        let breaks = self.link.borrow_and_update().breaks;
        let outcome = tokio::select! {
            outcome = attempt => outcome,
            _ = self.link.wait_for(|link| link.breaks != breaks) => Err(Failed::link(
                Error::unavailable(format!("worker {}: the link broke", self.inner.address)),
            )),
            _ = self.lost.wait_for(|lost| *lost) => Err(Failed::answer(self.inner.lost_error())),
        };
        self.made += 1;
        outcome
    }

    /// After `failed`: `Ok` once the request may go out again (the link is
    /// up, after a pause), or the error it fails with for good: a failure
    /// that is not the link's, or of a session that does not resume, ends
    /// it as before (a worker that cannot be reached is lost), and so does
    /// the session's end, or [`MAX_FAILURES_WHILE_UP`] failures in a row
    /// while the session's link stayed up. An outage of the session's link
    /// lasts at most the worker's session timeout (then the session is
    /// lost), and requests wait it out.
    pub(super) async fn again(&mut self, failed: Failed) -> Result<()> {
        let inner = self.inner;
        if failed.code() == ErrorCode::Unauthenticated && inner.retries() {
            // The worker no longer knows the session (it restarted): the
            // session is lost for good, as its control stream finds too.
            let err = inner.gone(failed.err.message());
            inner.end(err.clone());
            return Err(err);
        }
        if !failed.link || !inner.retries() {
            if failed.err.code() == ErrorCode::Unavailable {
                inner.lose(failed.err.clone());
            }
            return Err(failed.err);
        }
        let down = self.link.borrow().down;
        if !down {
            // The session's link is up: this request's own connection
            // failed (or the session has not found the break yet).
            self.failed_while_up += 1;
            if self.failed_while_up > MAX_FAILURES_WHILE_UP {
                return Err(failed.err);
            }
        }
        tracing::debug!(worker = %inner.address, error = %failed.err, "a request goes out again");
        tokio::select! {
            _ = self.link.wait_for(|link| !link.down) => {}
            _ = self.lost.wait_for(|lost| *lost) => return Err(inner.lost_error()),
        }
        if down {
            // The link came back (an outage the session outlived): later
            // failures count afresh, as a long transfer may meet several.
            self.failed_while_up = 0;
            self.pause = FIRST_PAUSE;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        inner.alive()
    }
}
