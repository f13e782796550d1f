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

/// What goes to the listeners' thread.
enum Telling {
    /// An event, for the listeners whose id is below `below` (those
    /// listening when it happened).
    All { event: HostEvent, below: u64 },
    /// An event for listener `id` alone: a loss that came before it.
    One { event: HostEvent, id: u64 },
}

/// What the listeners' thread is handed, and what a new listener catches up
/// on, under one lock: an event told after a listener came is queued after
/// what it caught up on.
struct Queue {
    /// Where events go to the listeners' thread, once one listens.
    tx: Option<mpsc::Sender<Telling>>,
    /// Per host: why its current session is lost, if it is.
    lost: Vec<Option<Error>>,
}

/// A client's host events: counters, listeners, and the thread that tells
/// the listeners.
pub(crate) struct HostEvents {
    /// Per host: disconnects, reconnects, sessions lost, sessions reopened.
    counts: Vec<[AtomicU64; 4]>,
    listeners: Mutex<Vec<(u64, Listener)>>,
    next_id: AtomicU64,
    queue: Mutex<Queue>,
}

impl HostEvents {
    /// The events of a client of `hosts` hosts.
    pub fn new(hosts: usize) -> Arc<HostEvents> {
        Arc::new(HostEvents {
            counts: (0..hosts).map(|_| Default::default()).collect(),
            listeners: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            queue: Mutex::new(Queue {
                tx: None,
                lost: vec![None; hosts],
            }),
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
        let mut queue = lock(&self.queue);
        if let Some(lost) = queue.lost.get_mut(event.host) {
            match event.kind {
                HostEventKind::Lost => *lost = event.error.clone(),
                HostEventKind::Reopened => *lost = None,
                HostEventKind::Disconnected | HostEventKind::Reconnected => {}
            }
        }
        if let Some(tx) = queue.tx.as_ref() {
            // Ids are handed out under this lock: `below` is every listener
            // there now.
            let below = self.next_id.load(Ordering::Relaxed);
            // The thread ends only with the client.
            let _ = tx.send(Telling::All { event, below });
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

    /// Tells `listener` every event from now on, after the loss of each
    /// host whose current session is lost already; returns its id for
    /// [`unlisten`](Self::unlisten). The first listener starts the thread
    /// that tells them (`resource_exhausted` if it cannot start).
    pub fn listen(
        self: &Arc<Self>,
        listener: impl Fn(&HostEvent) + Send + Sync + 'static,
    ) -> crate::error::Result<u64> {
        let mut queue = lock(&self.queue);
        if queue.tx.is_none() {
            let (tx, rx) = mpsc::channel();
            let events = Arc::downgrade(self);
            std::thread::Builder::new()
                .name("colocated-events".into())
                .spawn(move || tell_listeners(events, rx))
                .map_err(|e| {
                    crate::error::Error::resource_exhausted(format!(
                        "cannot start the thread of host events: {e}"
                    ))
                })?;
            queue.tx = Some(tx);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.listeners).push((id, Arc::new(listener)));
        if let Some(tx) = queue.tx.as_ref() {
            for (host, lost) in queue.lost.iter().enumerate() {
                if let Some(error) = lost {
                    let event = HostEvent {
                        host,
                        kind: HostEventKind::Lost,
                        error: Some(error.clone()),
                    };
                    let _ = tx.send(Telling::One { event, id });
                }
            }
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

/// The listeners' thread: tells each event to its listeners, in order,
/// until the client's events are gone. A listener that panics is logged
/// and kept.
fn tell_listeners(events: Weak<HostEvents>, rx: mpsc::Receiver<Telling>) {
    while let Ok(telling) = rx.recv() {
        let Some(events) = events.upgrade() else {
            return;
        };
        let (event, to): (HostEvent, Box<dyn Fn(u64) -> bool>) = match telling {
            Telling::All { event, below } => (event, Box::new(move |id| id < below)),
            Telling::One { event, id } => (event, Box::new(move |each| each == id)),
        };
        let listeners: Vec<Listener> = lock(&events.listeners)
            .iter()
            .filter(|(id, _)| to(*id))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn event(host: usize, kind: HostEventKind) -> HostEvent {
        let error = matches!(kind, HostEventKind::Lost | HostEventKind::Disconnected)
            .then(|| Error::unavailable(format!("host {host} went")));
        HostEvent { host, kind, error }
    }

    /// A listener that sends what it hears.
    fn heard(events: &Arc<HostEvents>) -> mpsc::Receiver<(usize, HostEventKind)> {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        events
            .listen(move |e| {
                let _ = lock(&tx).send((e.host, e.kind));
            })
            .unwrap();
        rx
    }

    fn next(rx: &mpsc::Receiver<(usize, HostEventKind)>) -> (usize, HostEventKind) {
        rx.recv_timeout(Duration::from_secs(10)).expect("an event")
    }

    /// A listener that comes after a host's session was lost hears that loss
    /// first (once), then what happens from then on; a host whose session
    /// was replaced since is not told; events before it came are not told.
    #[test]
    fn a_new_listener_hears_the_losses_that_came_before_it() {
        let events = HostEvents::new(3);
        let first = heard(&events);
        events.emit(event(0, HostEventKind::Lost));
        events.emit(event(1, HostEventKind::Lost));
        events.emit(event(1, HostEventKind::Reopened));
        events.emit(event(2, HostEventKind::Disconnected));
        for expected in [
            (0, HostEventKind::Lost),
            (1, HostEventKind::Lost),
            (1, HostEventKind::Reopened),
            (2, HostEventKind::Disconnected),
        ] {
            assert_eq!(next(&first), expected);
        }
        let second = heard(&events);
        events.emit(event(2, HostEventKind::Reconnected));
        assert_eq!(next(&second), (0, HostEventKind::Lost));
        assert_eq!(next(&second), (2, HostEventKind::Reconnected));
        assert_eq!(next(&first), (2, HostEventKind::Reconnected));
        assert!(second.recv_timeout(Duration::from_millis(200)).is_err());
        assert!(first.recv_timeout(Duration::from_millis(10)).is_err());
    }
}
