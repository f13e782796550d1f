//! What a buffer asks of the host that holds its data. The local host keeps
//! the bytes in this process ([`Local`](super::local::Local)); a worker host
//! keeps them under a handle of the client's session there (`RemoteHost`, in
//! [`on_worker`](super::on_worker)). Buffers (and arrays, made of buffers)
//! put data and read it through this one trait; a copy across hosts reads on
//! one host and puts on the other.

use std::sync::Arc;

use super::{Buffer, HostDst, Storage, UsageHold};
use crate::client::Client;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::future::{Event, Progress};

/// Gets the data of this process that a read produced (on whichever thread
/// finished the read).
pub(crate) type Fetched = Box<dyn FnOnce(Result<Arc<Storage>>) + Send>;

/// A host's side of buffer data. Every method that takes a pending buffer
/// `dst` finishes it: fills it and makes it ready, or fails it.
pub(crate) trait HostData: Sync {
    /// True when the data stays in this process: the host can alias the
    /// caller's memory, pin its bytes for an external reference and read
    /// them during the call.
    fn in_process(&self) -> bool;

    /// `unimplemented` for an element type the host cannot hold.
    fn check_dtype(&self, dtype: DType) -> Result<()>;

    /// Fills `dst` with a copy of `src`, finished copying before this returns
    /// (the host may still be receiving it).
    fn put_copy(&self, dst: &Buffer, src: &[u8], progress: Option<Progress>);

    /// Fills `dst` with `data` (data of this process: dense bytes or
    /// strings), without a copy where the host can.
    fn put(&self, dst: &Buffer, data: Arc<Storage>, progress: Option<Progress>);

    /// True when [`put`](Self::put) takes `held` (data of another buffer)
    /// as it is, without a read into this process first: a plugin's buffer
    /// put on another device of the same plugin, which the plugin copies.
    fn takes_directly(&self, held: &Storage) -> bool {
        let _ = held;
        false
    }

    /// Calls `done` with `src`'s data `held` (as this host holds it) as data
    /// of this process. `keep` lives until then.
    fn fetch(
        &self,
        src: &Buffer,
        held: Arc<Storage>,
        keep: UsageHold,
        progress: Option<Progress>,
        done: Fetched,
    );

    /// Writes the on-host form of `src`'s data `held` into `dst`, which must
    /// be exactly that long, and completes `done`. `keep` lives until then.
    fn read_into(
        &self,
        src: &Buffer,
        held: Arc<Storage>,
        dst: HostDst,
        keep: UsageHold,
        done: Event,
    );
}

/// What holds the data of buffers on `device` of `client`: its PJRT
/// plugin, its worker (in the session for new work), or this process.
pub(crate) fn of<'a>(client: &'a Client, device: &'a Device) -> Holder<'a> {
    if let Some(pjrt) = &device.0.pjrt {
        return Holder::Here(&**pjrt);
    }
    match client.remote(device.host_index()) {
        Some(remote) => Holder::Worker(remote),
        None => Holder::Here(&super::local::Local),
    }
}

/// What holds the data of `device`'s buffers that exist already: as [`of`],
/// with a worker in its session now (never opening a new one).
pub(crate) fn holding<'a>(client: &'a Client, device: &'a Device) -> Holder<'a> {
    if let Some(pjrt) = &device.0.pjrt {
        return Holder::Here(&**pjrt);
    }
    match client.remote_now(device.host_index()) {
        Some(remote) => Holder::Worker(remote),
        None => Holder::Here(&super::local::Local),
    }
}

/// What [`of`] names: a holder in this process, or a worker host.
pub(crate) enum Holder<'a> {
    Here(&'a dyn HostData),
    Worker(Arc<crate::remote::RemoteHost>),
}

impl<'a> std::ops::Deref for Holder<'a> {
    type Target = dyn HostData + 'a;

    fn deref(&self) -> &Self::Target {
        match self {
            Holder::Here(here) => *here,
            Holder::Worker(worker) => worker,
        }
    }
}
