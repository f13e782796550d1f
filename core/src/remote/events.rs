//! What happens to a client's worker hosts, for its listeners and counters:
//! a link that broke and came back, a session lost for good, and a new
//! session that replaced it. Sessions tell their events on network threads;
//! listeners hear them, in order, on a thread of the client's own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};

use crate::error::Error;
use crate::session::SessionEvent;
use crate::transport::lock;

/// What happened to a worker host (see [`HostEvent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostEventKind {
    /// The link to the worker broke: the client connects again, for as long
    /// as the worker keeps the session, and work on the host waits.
    Disconnected,
    /// The link came back and the session resumed: nothing was lost.
    Reconnected,
    /// The session is lost for good (the worker restarted, or the link
    /// stayed down past the worker's session timeout; or the client closed
    /// it): what it held fails with the event's error.
    Lost,
    /// New work opened a new session with the worker after one was lost.
    Reopened,
}

impl HostEventKind {
    /// Its name in every SDK: `disconnected`, `reconnected`, `lost` or
    /// `reopened`.
    pub fn name(self) -> &'static str {
        match self {
            HostEventKind::Disconnected => "disconnected",
            HostEventKind::Reconnected => "reconnected",
            HostEventKind::Lost => "lost",
            HostEventKind::Reopened => "reopened",
        }
    }
}

/// An event of worker host `host` of a client.
#[derive(Clone, Debug)]
pub struct HostEvent {
    /// The host's index in the client.
    pub host: usize,
    /// What happened.
    pub kind: HostEventKind,
    /// Why, for `Disconnected` and `Lost`.
    pub error: Option<Error>,
}

/// How often each event happened to a host, since the client started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Links that broke.
    pub disconnects: u64,
    /// Links that came back, their session resumed.
    pub reconnects: u64,
    /// Sessions lost for good.
    pub sessions_lost: u64,
    /// Sessions opened to replace a lost one.
    pub sessions_reopened: u64,
}

/// A listener of host events.
type Listener = Arc<dyn Fn(&HostEvent) + Send + Sync>;

/// A client's host events: counters, listeners, and the thread that tells
/// the listeners.
pub(crate) struct HostEvents {
    /// Per host: disconnects, reconnects, sessions lost, sessions reopened.
    counts: Vec<[AtomicU64; 4]>,
    listeners: Mutex<Vec<(u64, Listener)>>,
    next_id: AtomicU64,
    /// Where events go to the listeners' thread, once one listens.
    queue: Mutex<Option<mpsc::Sender<HostEvent>>>,
}

impl HostEvents {
    /// The events of a client of `hosts` hosts.
    pub fn new(hosts: usize) -> Arc<HostEvents> {
        Arc::new(HostEvents {
            counts: (0..hosts).map(|_| Default::default()).collect(),
            listeners: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            queue: Mutex::new(None),
        })
    }

    /// Counts `event`, and hands it to the listeners' thread if any listens.
    pub fn emit(&self, event: HostEvent) {
        let index = match event.kind {
            HostEventKind::Disconnected => 0,
            HostEventKind::Reconnected => 1,
            HostEventKind::Lost => 2,
            HostEventKind::Reopened => 3,
        };
        if let Some(counts) = self.counts.get(event.host) {
            counts[index].fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(host = event.host, kind = event.kind.name(), error = ?event.error, "host event");
        if let Some(queue) = lock(&self.queue).as_ref() {
            // The thread ends only with the client.
            let _ = queue.send(event);
        }
    }

    /// The counters of host `host` (zeros for an index out of range).
    pub fn stats(&self, host: usize) -> HostStats {
        let Some(counts) = self.counts.get(host) else {
            return HostStats::default();
        };
        let count = |i: usize| counts[i].load(Ordering::Relaxed);
        HostStats {
            disconnects: count(0),
            reconnects: count(1),
            sessions_lost: count(2),
            sessions_reopened: count(3),
        }
    }

    /// Tells `listener` every event from now on; returns its id for
    /// [`unlisten`](Self::unlisten). The first listener starts the thread
    /// that tells them (`resource_exhausted` if it cannot start).
    pub fn listen(
        self: &Arc<Self>,
        listener: impl Fn(&HostEvent) + Send + Sync + 'static,
    ) -> crate::error::Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.listeners).push((id, Arc::new(listener)));
        let mut queue = lock(&self.queue);
        if queue.is_none() {
            let (tx, rx) = mpsc::channel();
            let events = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("colocated-events".into())
                .spawn(move || tell_listeners(events, rx));
            if let Err(e) = spawned {
                drop(queue);
                self.unlisten(id);
                return Err(crate::error::Error::resource_exhausted(format!(
                    "cannot start the thread of host events: {e}"
                )));
            }
            *queue = Some(tx);
        }
        Ok(id)
    }

    /// Stops telling listener `id`; false if it was not listening.
    pub fn unlisten(&self, id: u64) -> bool {
        let mut listeners = lock(&self.listeners);
        let before = listeners.len();
        listeners.retain(|(each, _)| *each != id);
        listeners.len() != before
    }

    /// What tells these events of host `host` when its session `event`s.
    pub fn watcher(self: &Arc<Self>, host: usize) -> impl Fn(SessionEvent) + Send + Sync {
        let events = Arc::downgrade(self);
        move |event| {
            let Some(events) = events.upgrade() else {
                return;
            };
            let (kind, error) = match event {
                SessionEvent::Disconnected(why) => (HostEventKind::Disconnected, Some(why)),
                SessionEvent::Reconnected => (HostEventKind::Reconnected, None),
                SessionEvent::Lost(why) => (HostEventKind::Lost, Some(why)),
            };
            events.emit(HostEvent { host, kind, error });
        }
    }
}

/// The listeners' thread: tells each event to every listener, in order,
/// until the client's events are gone. A listener that panics is logged
/// and kept.
fn tell_listeners(events: Weak<HostEvents>, rx: mpsc::Receiver<HostEvent>) {
    while let Ok(event) = rx.recv() {
        let Some(events) = events.upgrade() else {
            return;
        };
        let listeners: Vec<Listener> = lock(&events.listeners)
            .iter()
            .map(|(_, listener)| listener.clone())
            .collect();
        drop(events);
        for listener in listeners {
            let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener(&event)));
            if told.is_err() {
                tracing::error!(host = event.host, "a host event listener panicked");
            }
        }
    }
}
