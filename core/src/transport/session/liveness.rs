//! Whether the worker is still there: heartbeats that keep the session open,
//! and losing the worker (a heartbeat or request that cannot reach it), which
//! fails everything in flight.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use super::{lock, Inner};
use crate::error::{Error, ErrorCode, Result};
use crate::transport::from_status;
use crate::transport::proto::HeartbeatRequest;

/// How long a heartbeat may take before the worker counts as lost: twice the
/// interval the worker asked for, at least half a second.
pub(super) fn heartbeat_timeout(interval_ms: u32) -> Duration {
    Duration::from_millis(u64::from(interval_ms).saturating_mul(2).max(500))
}

impl Inner {
    /// Fails at once when the worker is lost.
    pub(super) fn alive(&self) -> Result<()> {
        match self.lost.error() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// `transfer`'s outcome, or the worker's loss if that comes first (a
    /// transfer on a hung connection would wait for its keepalive).
    pub(super) async fn unless_lost<T>(
        &self,
        transfer: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut lost = self.lost_signal.subscribe();
        tokio::select! {
            outcome = transfer => outcome,
            _ = lost.wait_for(|lost| *lost) => Err(self
                .lost
                .error()
                .unwrap_or_else(|| Error::unavailable(format!("worker {} lost", self.address)))),
        }
    }

    /// The error of a failed request; a worker that cannot be reached is lost.
    pub(super) fn fail(&self, status: &tonic::Status) -> Error {
        let err = from_status(status).context(format!("worker {}", self.address));
        if err.code() == ErrorCode::Unavailable {
            self.lose(err.clone());
        }
        err
    }

    pub(super) fn lose(&self, err: Error) {
        if self.lost.error().is_none() {
            tracing::warn!(worker = %self.address, error = %err, "worker lost");
        }
        self.end(err);
    }

    /// Ends the session with `err`: the lost event carries it, and
    /// everything in flight fails with it.
    pub(super) fn end(&self, err: Error) {
        self.lost.set_if_pending(Err(err.clone()));
        self.lost_signal.send_replace(true);
        // Executions in flight there will never finish.
        let control = lock(&self.control).clone();
        if let Some(control) = control {
            control.state.fail_all(&err);
        }
    }

    pub(super) async fn heartbeat(&self) -> Result<()> {
        self.alive()?;
        let mut rpc = self.rpc.clone();
        let mut request = self.bulk_request(HeartbeatRequest {});
        request.set_timeout(self.heartbeat_timeout);
        let silent = || {
            let err = Error::unavailable(format!(
                "worker {} did not answer a heartbeat within {:?}",
                self.address, self.heartbeat_timeout
            ));
            self.lose(err.clone());
            Err(err)
        };
        // A hung worker answers nothing: the deadline ends the call here
        // (tonic's client-side timeout, whose status is not always
        // `DEADLINE_EXCEEDED` itself, or this one).
        match tokio::time::timeout(self.heartbeat_timeout, rpc.heartbeat(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) if from_status(&status).code() != ErrorCode::DeadlineExceeded => {
                Err(self.fail(&status))
            }
            _ => silent(),
        }
    }
}

/// Keeps a session open while its `RemoteSession` lives.
pub(super) async fn send_heartbeats(inner: Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = inner.heartbeat().await {
            if inner.lost.is_ready() {
                return;
            }
            tracing::warn!(worker = %inner.address, error = %e, "heartbeat failed");
        }
    }
}
