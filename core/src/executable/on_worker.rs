//! An executable's part on a worker host: the host-local program the worker
//! loaded, run there on the caller's stream (see `remote`).

use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;

use super::host::{HostRun, Part};
use super::LoadedExecutable;
use crate::buffer::{Buffer, Storage};
use crate::dtype::checked_byte_size;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::remote::{RemoteBuffer, RemoteExecutable};
use crate::transport::lock;

/// A worker host's part: the executable it loaded, in the client's
/// session there. When that session was lost and the client opened a new
/// one (see [`RemoteSlot`](crate::remote::RemoteSlot)), the next run loads
/// the part there again first.
pub(crate) struct WorkerRun {
    loaded: RwLock<Arc<RemoteExecutable>>,
    /// The host's index in the client.
    host: usize,
    /// Held while the part loads in a new session: one load for all.
    reloading: Mutex<()>,
}

impl WorkerRun {
    /// The part `loaded` on host `host`.
    pub fn new(loaded: RemoteExecutable, host: usize) -> WorkerRun {
        WorkerRun {
            loaded: RwLock::new(Arc::new(loaded)),
            host,
            reloading: Mutex::new(()),
        }
    }

    /// The part as loaded now.
    fn loaded(&self) -> Arc<RemoteExecutable> {
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The part to run `exe` with: as loaded, or, when its session was lost
    /// and the client has a new one with the worker, loaded there first.
    fn for_run(&self, exe: &LoadedExecutable) -> Result<Arc<RemoteExecutable>> {
        let loaded = self.loaded();
        if !loaded.host.session.lost().is_ready() {
            return Ok(loaded);
        }
        let _one = lock(&self.reloading);
        let loaded = self.loaded();
        let Some(host) = exe.client().remote(self.host) else {
            return Ok(loaded);
        };
        if Arc::ptr_eq(&host, &loaded.host) || host.session.lost().is_ready() {
            // No new session (yet): the run fails with the loss.
            return Ok(loaded);
        }
        let again = super::load::load_again(self.host, &host, exe)?;
        let again = Arc::new(again);
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = again.clone();
        Ok(again)
    }
}

impl HostRun for WorkerRun {
    fn in_process(&self) -> bool {
        false
    }

    fn waiter_first(&self) -> bool {
        false
    }

    fn takes_pending(&self, input: &Buffer, stream: u64) -> bool {
        input.promised_on(&self.loaded().host, stream)
    }

    fn queued(&self, outputs: &[Buffer], stream: u64) {
        let host = &self.loaded().host;
        for out in outputs {
            out.promise_on_worker(host, host.session.new_handle(), Some(stream));
        }
    }

    fn run(&self, exe: &LoadedExecutable, part: Part<'_>, done: &Event) -> Option<Result<()>> {
        // Completes `done` when the worker reports; the worker keeps the
        // inputs it needs.
        let sent = self.for_run(exe).and_then(|loaded| {
            send(
                &loaded,
                exe,
                part.inputs,
                part.outputs,
                part.stream_id,
                done,
            )
        });
        sent.err().map(Err)
    }
}

/// Sends one host's part of an execution to its worker; `done` completes, and
/// `outputs` fill, when the worker reports it ran.
fn send(
    executable: &RemoteExecutable,
    exe: &LoadedExecutable,
    inputs: &[Buffer],
    outputs: &[Buffer],
    stream_id: u64,
    done: &Event,
) -> Result<()> {
    let host = &executable.host;
    let handles = inputs
        .iter()
        .enumerate()
        .map(|(i, b)| match b.handle_on(host) {
            // Ready there, or the output of work sent there before.
            Some(handle) => Ok(handle),
            None => {
                // Why not: deleted, failed, in a session that was lost (the
                // loss says so), or on another host.
                if let Storage::Remote(remote) = &*b.storage()? {
                    if let Some(err) = remote.host.session.lost().error() {
                        return Err(err);
                    }
                }
                Err(Error::internal(format!(
                    "input shard {i} is not on worker {}",
                    host.session.address()
                )))
            }
        })
        .collect::<Result<Vec<u64>>>()?;
    // The handles named when the part was queued.
    let made: Vec<u64> = outputs
        .iter()
        .map(|out| {
            out.handle_on(host)
                .unwrap_or_else(|| host.session.new_handle())
        })
        .collect();
    let (host_out, outs, finished) = (host.clone(), outputs.to_vec(), done.clone());
    let handles_out = made.clone();
    // Held until the worker reports: the executable (and its host callbacks)
    // stays loaded while this execution runs.
    let running = exe.clone();
    host.session.execute_reading_then(
        executable.handle,
        &handles,
        &made,
        stream_id,
        Box::new(move |result| {
            let (result, inline) = match result {
                Ok(data) => (Ok(()), split_outputs(&outs, data)),
                Err(e) => (Err(e), Vec::new()),
            };
            let mut inline = inline.into_iter();
            // Whatever happened, the worker's output buffers (failed ones
            // too) are freed when these go.
            let storages = handles_out.into_iter().map(|handle| RemoteBuffer {
                host: host_out.clone(),
                handle,
                inline: inline.next(),
            });
            if result.is_ok() {
                for (out, storage) in outs.iter().zip(storages) {
                    out.fill(Storage::Remote(storage));
                }
            }
            drop(running);
            finished.set_if_pending(result);
        }),
    );
    // Sent (unless the session is lost): work sent to the worker after this
    // may name the outputs before they are ready.
    if !matches!(done.status(), Some(Err(_))) {
        for (out, handle) in outputs.iter().zip(made) {
            out.promise_on_worker(host, handle, None);
        }
    }
    Ok(())
}

/// The bytes of each of `outputs` in `data`, the outputs' bytes one after
/// another as a worker sends them with an execution's answer; none when the
/// worker sent none (or, from a broken worker, not exactly those bytes: the
/// outputs are then read from the worker).
fn split_outputs(outputs: &[Buffer], data: Bytes) -> Vec<Bytes> {
    if data.is_empty() {
        return Vec::new();
    }
    let sizes: Option<Vec<usize>> = outputs
        .iter()
        .map(|b| {
            b.dtype()
                .byte_size()
                .and_then(|_| checked_byte_size(b.dtype(), b.dims()).ok())
        })
        .collect();
    let Some(sizes) = sizes.filter(|s| s.iter().sum::<usize>() == data.len()) else {
        tracing::debug!(
            bytes = data.len(),
            "an execution's answer sent outputs of other sizes"
        );
        return Vec::new();
    };
    let mut at = 0;
    sizes
        .into_iter()
        .map(|size| {
            let part = data.slice(at..at + size);
            at += size;
            part
        })
        .collect()
}
