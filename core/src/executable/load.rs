//! Loading an executable's part on a worker host: the request that sends
//! the host-local program (the compiler sends one per worker, then awaits
//! them together), and loading it again in a session that replaced a lost
//! one.

use std::sync::Arc;

use super::LoadedExecutable;
use crate::error::{Error, Result};
use crate::format;
use crate::host_callback::LoadedHostCallback;
use crate::program::Program;
use crate::remote::{host_local, RemoteExecutable, RemoteHost};

/// A load request sent to a worker: its answer comes later.
pub(crate) type LoadTask = tokio::task::JoinHandle<Result<(u32, u32)>>;

/// A worker's part of a program whose load request is out.
pub(crate) struct Started {
    pub host: usize,
    pub remote: Arc<RemoteHost>,
    pub local: crate::remote::HostLocal,
    pub handle: u64,
    pub load: Option<LoadTask>,
}

/// Sends the host-local form of `program` to worker `remote` (host `host`).
pub(crate) fn start_remote(
    host: usize,
    remote: &Arc<RemoteHost>,
    program: &Program,
    callbacks: &[LoadedHostCallback],
) -> Result<Started> {
    let address = remote.session.address();
    if !remote.session.host().languages.contains(&program.language) {
        return Err(Error::unimplemented(format!(
            "worker {address} cannot run '{}' programs (it runs {:?})",
            program.language,
            remote.session.host().languages
        )));
    }
    let local = host_local(program, remote, host, callbacks.len())?;
    let handle = remote.session.new_handle();
    // Before the load: the worker's program may call them as soon as it runs.
    remote
        .session
        .set_host_callbacks(handle, callbacks.to_vec());
    let controller_ids = remote
        .local_ids
        .iter()
        .enumerate()
        .map(|(i, &local)| (local, remote.first_device + i as u32))
        .collect();
    let load = remote
        .session
        .load_executable_started(handle, format::encode(&local.executable), controller_ids)
        .inspect_err(|_| remote.session.forget_host_callbacks(handle))?;
    Ok(Started {
        host,
        remote: remote.clone(),
        local,
        handle,
        load: Some(load),
    })
}

/// Loads `exe`'s part on worker `remote` (host `host`) again: in a new
/// session that replaced the one it was loaded in (see
/// [`RemoteSlot`](crate::remote::RemoteSlot)).
pub(crate) fn load_again(
    host: usize,
    remote: &Arc<RemoteHost>,
    exe: &LoadedExecutable,
) -> Result<RemoteExecutable> {
    let mut started = start_remote(host, remote, exe.program(), exe.host_callbacks())?;
    let load = started.load.take();
    let loaded = crate::session::wait_all(vec![load]).pop();
    match loaded.unwrap_or_else(|| Err(Error::internal("a load without an answer"))) {
        Ok(_) => Ok(RemoteExecutable {
            host: started.remote,
            handle: started.handle,
        }),
        Err(err) => {
            started.remote.session.forget_host_callbacks(started.handle);
            Err(err)
        }
    }
}
