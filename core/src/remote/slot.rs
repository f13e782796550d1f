//! A client's place for one worker host: its session now, and a new one
//! when that session is lost for good (the worker restarted, or the link
//! stayed down longer than the worker keeps a session). What was made in
//! the lost session stays with it and fails with its error; new work opens
//! a new session with the worker, so the same client works with it again
//! without connecting anew.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::events::{HostEvent, HostEventKind, HostEvents};
use super::RemoteHost;
use crate::error::{Error, Result};
use crate::session::{ConnectOptions, RemoteSession};

/// The least time between two attempts to open a new session with a
/// worker whose session was lost: work meanwhile fails with the loss.
const REOPEN_PAUSE: Duration = Duration::from_secs(1);

/// One worker host of a client, across its sessions.
pub(crate) struct RemoteSlot {
    current: RwLock<Arc<RemoteHost>>,
    /// The host's index in the client, and the client's host events.
    index: usize,
    events: Arc<HostEvents>,
    /// How the client reached the worker (a supervisor's address, for a
    /// worker that runs each session in a process of its own).
    options: ConnectOptions,
    /// When the last attempt to open a new session failed; held while one
    /// is made, so that one thread makes it.
    reopening: Mutex<Option<Instant>>,
    /// The client closed its workers: no new session opens.
    closed: std::sync::atomic::AtomicBool,
}

impl RemoteSlot {
    /// The place of `host`, host `index` of a client whose host events are
    /// `events`, reached with `options`.
    pub fn new(
        host: RemoteHost,
        index: usize,
        events: Arc<HostEvents>,
        options: ConnectOptions,
    ) -> RemoteSlot {
        host.session.watch(events.watcher(index));
        RemoteSlot {
            current: RwLock::new(Arc::new(host)),
            index,
            events,
            options,
            reopening: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Closes the session now, and keeps any new one from opening (one
    /// being opened now is closed as it opens).
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.current().session.close();
    }

    /// The host as it is now, whatever its session's state.
    pub fn current(&self) -> Arc<RemoteHost> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The host for new work: the current one, or, when its session was
    /// lost (not closed), a new session with the worker if one opens (at
    /// most one attempt each [`REOPEN_PAUSE`]; the lost host otherwise,
    /// whose work fails with the loss). Only a thread that may block
    /// attempts it, and never waits for another's attempt: a thread of the
    /// network runtime (a callback of finished work) gets the lost host, as
    /// does any thread while another attempts.
    pub fn for_work(&self) -> Arc<RemoteHost> {
        let host = self.current();
        let session = &host.session;
        if !session.lost().is_ready() || session.is_closed() {
            return host;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            return host;
        }
        self.reopen(host)
    }

    /// Replaces `lost` with a host of a new session, if one opens.
    fn reopen(&self, lost: Arc<RemoteHost>) -> Arc<RemoteHost> {
        let mut failed_at = match self.reopening.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            // Another thread is opening one: this work fails with the loss.
            Err(std::sync::TryLockError::WouldBlock) => return self.current(),
        };
        let host = self.current();
        if !Arc::ptr_eq(&host, &lost) {
            // Another thread opened one meanwhile.
            return host;
        }
        if failed_at.is_some_and(|at| at.elapsed() < REOPEN_PAUSE) {
            return lost;
        }
        match RemoteSession::connect(&self.options).and_then(|session| lost.renewed(session)) {
            Ok(host) => {
                let host = Arc::new(host);
                {
                    // Checked under the lock `close` reads under: a close
                    // either sees this host, or this sees the close.
                    let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
                    if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                        drop(current);
                        host.session.close();
                        return lost;
                    }
                    host.session.watch(self.events.watcher(self.index));
                    *current = host.clone();
                }
                tracing::info!(worker = %self.options.address, "a new session replaces the lost one");
                *failed_at = None;
                self.events.emit(HostEvent {
                    host: self.index,
                    kind: HostEventKind::Reopened,
                    error: None,
                });
                host
            }
            Err(err) => {
                tracing::debug!(worker = %self.options.address, error = %err, "no new session yet");
                *failed_at = Some(Instant::now());
                lost
            }
        }
    }
}

impl RemoteHost {
    /// This host with `session`, a new session with the same worker, which
    /// must have the devices the client knows it by.
    fn renewed(&self, session: RemoteSession) -> Result<RemoteHost> {
        let had = devices_of(&self.session);
        let has = devices_of(&session);
        if had != has {
            session.close();
            return Err(Error::failed_precondition(format!(
                "worker {} came back with other devices ({} now, {} before): connect a new client",
                self.session.address(),
                has.len(),
                had.len()
            )));
        }
        Ok(RemoteHost {
            session,
            local_ids: self.local_ids.clone(),
            first_device: self.first_device,
        })
    }
}

/// What a client knows a worker's devices by: each one's id there, kind
/// and platform.
fn devices_of(session: &RemoteSession) -> Vec<(u32, &str, &str)> {
    session
        .host()
        .devices
        .iter()
        .map(|d| (d.local_id, d.kind.as_str(), d.platform.as_str()))
        .collect()
}
