//! A session's connection for bulk data and loads: made at its first use,
//! and given back once nothing used it for a while, so that a controller of
//! thousands of mostly idle hosts holds one HTTP/2 connection per host, not
//! two (each costs tens of KiB of buffers and a task).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::liveness::now_ms;
use crate::error::Result;
use crate::transport::{lock, runtime};

/// How long a bulk connection that nothing uses stays open: long enough
/// that a loop of transfers keeps its connection (and its grown windows).
pub(super) const BULK_IDLE: Duration = Duration::from_secs(30);

/// The bulk connection of one session.
pub(super) struct BulkLink {
    endpoint: Endpoint,
    /// The connection, while one is open, and its users' count (its strong
    /// count less one).
    open: Mutex<Option<(Channel, Arc<()>)>>,
    /// When a request last took it or ended (milliseconds of [`now_ms`]).
    used: Arc<AtomicU64>,
}

/// The bulk connection for one request: keep it until the request ended.
pub(super) struct BulkUse {
    pub(super) channel: Channel,
    _user: Arc<()>,
    used: Arc<AtomicU64>,
}

impl Drop for BulkUse {
    fn drop(&mut self) {
        // Idle from the end of the request, not its start.
        self.used.store(now_ms(), Ordering::Relaxed);
    }
}

impl BulkLink {
    /// A link to `endpoint`, not connected yet.
    pub(super) fn new(endpoint: Endpoint) -> BulkLink {
        BulkLink {
            endpoint,
            open: Mutex::new(None),
            used: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The connection (made now if none is open; it connects on its first
    /// request).
    pub(super) fn take(&self) -> Result<BulkUse> {
        self.used.store(now_ms(), Ordering::Relaxed);
        let mut open = lock(&self.open);
        let (channel, users) = match &mut *open {
            Some(open) => open,
            none @ None => {
                // The connection's task runs on the network runtime.
                let _runtime = runtime()?.enter();
                none.insert((self.endpoint.connect_lazy(), Arc::new(())))
            }
        };
        Ok(BulkUse {
            channel: channel.clone(),
            _user: users.clone(),
            used: self.used.clone(),
        })
    }

    /// Closes the connection when no request holds it and none took it or
    /// ended for [`BULK_IDLE`] (`now` in milliseconds of [`now_ms`];
    /// `u64::MAX`: now, if no request holds it).
    pub(super) fn close_if_idle(&self, now: u64) {
        let idle = u128::from(now.saturating_sub(self.used.load(Ordering::Relaxed)));
        if idle < BULK_IDLE.as_millis() {
            return;
        }
        let mut open = lock(&self.open);
        if open
            .as_ref()
            .is_some_and(|(_, users)| Arc::strong_count(users) == 1)
        {
            // The last handle of the channel: its connection ends.
            *open = None;
        }
    }

    /// Whether a connection is open (for tests).
    #[cfg(test)]
    pub(super) fn is_open(&self) -> bool {
        lock(&self.open).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_is_made_at_first_use_and_closed_once_idle() {
        let link = BulkLink::new(Endpoint::from_static("http://127.0.0.1:9"));
        assert!(!link.is_open(), "made before its first use");
        let using = link.take().unwrap();
        assert!(link.is_open());
        let later = now_ms() + BULK_IDLE.as_millis() as u64 + 1;
        // A request holds it: it stays, however long ago it was taken.
        link.close_if_idle(later);
        assert!(link.is_open(), "closed under a request");
        // A long request: idle counts from its end.
        link.used.store(0, Ordering::Relaxed);
        drop(using);
        link.close_if_idle(now_ms());
        assert!(link.is_open(), "closed right after a long request ended");
        link.close_if_idle(later);
        assert!(!link.is_open(), "kept while idle");
        // A session that ends closes it at once.
        drop(link.take().unwrap());
        link.close_if_idle(u64::MAX);
        assert!(!link.is_open(), "kept by an ended session");
        // The next use makes it again.
        drop(link.take().unwrap());
        assert!(link.is_open());
    }
}
