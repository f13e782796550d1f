//! Idle expiry of a worker (`--exit-after-idle`): a worker that has had no
//! session for a while (since it started, or since its last session ended:
//! closed, timed out or dropped) says so, and its entry point stops it. This
//! ends workers orphaned by a controller or launcher that died.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker's idle state, shared by its sessions' code and the watcher task.
#[derive(Default)]
pub(crate) struct IdleWatch {
    /// Sessions opened so far: a session that opens and ends between two
    /// looks of the watcher still counts as activity.
    opened: AtomicU64,
    /// Becomes `true` (for good) once the worker has been idle long enough.
    expired: tokio::sync::watch::Sender<bool>,
}

impl IdleWatch {
    /// A session opened.
    pub(crate) fn session_opened(&self) {
        self.opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Sessions opened so far.
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Expires the worker now (a single-session worker whose session ended).
    pub(crate) fn expire(&self) {
        self.expired.send_replace(true);
    }

    /// True once the idle time ran out.
    pub(crate) fn expired(&self) -> bool {
        *self.expired.borrow()
    }

    /// Resolves once the idle time runs out (never, if it does not); on any
    /// runtime or executor, as it needs no timer.
    pub(crate) fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut expired = self.expired.subscribe();
        async move {
            if expired.wait_for(|expired| *expired).await.is_err() {
                // The worker is gone without expiring: never.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// How often the watcher looks: often enough for the deadline to be met
/// within a tenth of it (10 ms to 1 s).
fn poll_period(limit: Duration) -> Duration {
    (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The time since the worker last had (or opened) a session.
struct IdleClock {
    busy_at: Instant,
    opened: u64,
}

impl IdleClock {
    /// How long the worker has been idle at `now`, given whether it has a
    /// session and how many it has opened so far.
    fn idle_for(&mut self, now: Instant, has_session: bool, opened: u64) -> Duration {
        if has_session || opened != self.opened {
            self.busy_at = now;
            self.opened = opened;
        }
        now.saturating_duration_since(self.busy_at)
    }
}

/// Sets `watch` expired once the worker has had no session for `limit`.
/// `has_session` tells whether the worker has one now (`None`: the worker is
/// gone, and the task ends).
pub(crate) async fn expire_when_idle(
    watch: Arc<IdleWatch>,
    limit: Duration,
    has_session: impl Fn() -> Option<bool> + Send + 'static,
) {
    let mut clock = IdleClock {
        busy_at: Instant::now(),
        opened: watch.opened.load(Ordering::Relaxed),
    };
    loop {
        tokio::time::sleep(poll_period(limit)).await;
        let Some(has_session) = has_session() else {
            return;
        };
        let opened = watch.opened.load(Ordering::Relaxed);
        if clock.idle_for(Instant::now(), has_session, opened) >= limit {
            tracing::info!(
                ?limit,
                "no session for the idle limit: the worker should stop"
            );
            watch.expired.send_replace(true);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idleness_counts_from_the_last_session_or_opening() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut clock = IdleClock {
            busy_at: start,
            opened: 0,
        };
        assert_eq!(
            clock.idle_for(at(500), false, 0),
            Duration::from_millis(500)
        );
        // A session lives: not idle.
        assert_eq!(clock.idle_for(at(700), true, 1), Duration::ZERO);
        assert_eq!(clock.idle_for(at(5000), true, 1), Duration::ZERO);
        // It ended: idle from the last look that saw it.
        assert_eq!(
            clock.idle_for(at(5400), false, 1),
            Duration::from_millis(400)
        );
        // One opened and ended between two looks still counts.
        assert_eq!(clock.idle_for(at(6000), false, 2), Duration::ZERO);
        assert_eq!(
            clock.idle_for(at(6100), false, 2),
            Duration::from_millis(100)
        );
        assert_eq!(
            poll_period(Duration::from_secs(1)),
            Duration::from_millis(100)
        );
        assert_eq!(
            poll_period(Duration::from_millis(1)),
            Duration::from_millis(10)
        );
        assert_eq!(
            poll_period(Duration::from_secs(3600)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn the_watcher_expires_an_idle_worker_and_spares_a_busy_one() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let limit = Duration::from_millis(100);
            let idle = Arc::new(IdleWatch::default());
            let started = Instant::now();
            expire_when_idle(idle.clone(), limit, || Some(false)).await;
            assert!(idle.expired());
            assert!(started.elapsed() >= limit);
            idle.wait().await;

            let busy = Arc::new(IdleWatch::default());
            let watcher = tokio::spawn(expire_when_idle(busy.clone(), limit, || Some(true)));
            tokio::time::sleep(limit * 3).await;
            assert!(!busy.expired());
            watcher.abort();
            // A worker gone ends the watcher without expiring.
            expire_when_idle(busy.clone(), limit, || None).await;
            assert!(!busy.expired());
        });
    }
}
