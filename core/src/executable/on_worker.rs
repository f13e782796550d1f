//! An executable's part on a worker host: the host-local program the worker
//! loaded, run there on the caller's stream (see `remote`).

use std::sync::Arc;

use super::host::{HostRun, Part};
use super::LoadedExecutable;
use crate::buffer::{Buffer, Storage};
use crate::error::{Error, Result};
use crate::future::Event;
use crate::remote::{RemoteBuffer, RemoteExecutable};

/// A worker host's part: the executable it loaded.
pub(crate) struct WorkerRun(pub RemoteExecutable);

impl HostRun for WorkerRun {
    fn in_process(&self) -> bool {
        false
    }

    fn waiter_first(&self) -> bool {
        false
    }

    fn run(&self, exe: &LoadedExecutable, part: Part<'_>, done: &Event) -> Option<Result<()>> {
        // Completes `done` when the worker reports; the worker keeps the
        // inputs it needs.
        let sent = send(
            &self.0,
            exe,
            part.inputs,
            part.outputs,
            part.stream_id,
            done,
        );
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
        .map(|(i, b)| match &*b.storage()? {
            Storage::Remote(r) if Arc::ptr_eq(&r.host, host) => Ok(r.handle),
            _ => Err(Error::internal(format!(
                "input shard {i} is not on worker {}",
                host.session.address()
            ))),
        })
        .collect::<Result<Vec<u64>>>()?;
    let made: Vec<u64> = outputs.iter().map(|_| host.session.new_handle()).collect();
    let (host_out, outs, done) = (host.clone(), outputs.to_vec(), done.clone());
    let handles_out = made.clone();
    // Held until the worker reports: the executable (and its host callbacks)
    // stays loaded while this execution runs.
    let running = exe.clone();
    host.session.execute_then(
        executable.handle,
        &handles,
        &made,
        stream_id,
        Box::new(move |result| {
            // Whatever happened, the worker's output buffers (failed ones
            // too) are freed when these go.
            let storages = handles_out.into_iter().map(|handle| RemoteBuffer {
                host: host_out.clone(),
                handle,
            });
            if result.is_ok() {
                for (out, storage) in outs.iter().zip(storages) {
                    out.fill(Storage::Remote(storage));
                }
            }
            drop(running);
            done.set_if_pending(result);
        }),
    );
    Ok(())
}
