//! The controller's host callbacks that programs of the session call on the
//! worker: kept per executable, each call run here and its result sent back
//! on the control stream.

use std::sync::{Arc, Weak};

use bytes::Bytes;

use super::{lock, Inner, RemoteSession};
use crate::error::{Error, Result};
use crate::host_callback::LoadedHostCallback;
use crate::transport::host_calls::result_of;
use crate::transport::proto::{control_request, HostCallbackCall};
use crate::transport::runtime;

/// Runs a worker program's call of a host callback on the blocking pool and
/// sends its result back on the control stream. A call the worker sends
/// again (on a connection that resumed the stream) while it runs here, or
/// before the worker took its result, runs once: its result reaches the
/// worker with the operations the stream sends again.
pub(super) fn run_host_callback(inner: &Weak<Inner>, call: HostCallbackCall) {
    let Some(inner) = inner.upgrade() else {
        return;
    };
    if !lock(&inner.host_calls).insert(call.call) {
        tracing::debug!(worker = %inner.address, call = call.call, "a host callback call came again");
        return;
    }
    let callback = lock(&inner.host_callbacks)
        .get(&call.executable)
        .and_then(|callbacks| callbacks.get(call.index as usize))
        .cloned();
    let Ok(runtime) = runtime() else {
        return;
    };
    runtime.spawn_blocking(move || {
        let outcome = match callback {
            Some(callback) => callback.call(&call.input),
            None => Err(Error::not_found(format!(
                "executable {} has no host callback {}",
                call.executable, call.index
            ))),
        };
        let id = call.call;
        let op = control_request::Op::HostCallbackResult(result_of(id, outcome));
        // Once the worker took the result, it sends the call no more.
        let weak = Arc::downgrade(&inner);
        let taken = Box::new(move |_: Result<Bytes>| {
            if let Some(inner) = weak.upgrade() {
                lock(&inner.host_calls).remove(&id);
            }
        });
        let control = lock(&inner.control).clone();
        let sent = match control {
            Some(control) => control.send(op, Some(taken), None, &inner.lost, true),
            None => Err(Error::unavailable("the control stream is closed")),
        };
        if let Err(err) = sent {
            tracing::debug!(worker = %inner.address, error = %err, "a host callback result was not sent");
        }
    });
}

impl RemoteSession {
    /// Host callbacks of executable `executable` (a handle of this session):
    /// programs of it that run on the worker call them, and each call runs
    /// here, on a thread of the transport's blocking pool. Kept until the
    /// session ends.
    pub fn set_host_callbacks(&self, executable: u64, callbacks: Vec<LoadedHostCallback>) {
        lock(&self.inner.host_callbacks).insert(executable, callbacks);
    }

    /// Forgets the host callbacks of `executable` (a load that failed: the
    /// worker has nothing to unload).
    pub fn forget_host_callbacks(&self, executable: u64) {
        lock(&self.inner.host_callbacks).remove(&executable);
    }
}
