//! What an execution asks of the host that runs one part of an executable:
//! the local host runs it in this process with the program its language
//! executor loaded ([`LocalRun`](super::LocalRun)); a worker host runs the
//! host-local program it loaded ([`WorkerRun`](super::WorkerRun)).

use super::{HostSpecs, LoadedExecutable};
use crate::buffer::Buffer;
use crate::error::Result;
use crate::executor::OutputShard;
use crate::future::Event;

/// One host's part of one execution: its input shards (ready), its output
/// shards (pending, to fill), and the layout the program sees.
pub(crate) struct Part<'a> {
    pub host: usize,
    pub inputs: &'a [Buffer],
    /// Per input: how many of its shards are in `inputs`.
    pub input_counts: &'a [usize],
    pub output_shards: &'a [OutputShard],
    /// The specs as this host sees them, when it lacks some shards.
    pub host_specs: Option<&'a HostSpecs>,
    pub outputs: &'a [Buffer],
    /// The caller's stream, which orders the part on a worker too.
    pub stream_id: u64,
}

/// How a host runs its part of an executable.
pub(crate) trait HostRun: Send + Sync {
    /// True when the part runs in this process.
    fn in_process(&self) -> bool;

    /// Whether the caller's wait runs the part (see `Task::waiter_first`).
    fn waiter_first(&self) -> bool;

    /// Whether the part only hands its work to a device that orders it (see
    /// `LoadedProgram::enqueues`).
    fn enqueues(&self) -> bool {
        false
    }

    /// The loaded program's artifact (see `LoadedProgram::artifact`), for a
    /// part that runs in this process.
    fn artifact(&self) -> Option<Vec<u8>> {
        None
    }

    /// Whether the part, queued on stream `stream`, may be sent while
    /// `input` is still pending: the host will have it by then (a worker, for
    /// an output of work sent to it before, or first on the stream). The part
    /// then does not wait for it here.
    fn takes_pending(&self, input: &Buffer, stream: u64) -> bool {
        let _ = (input, stream);
        false
    }

    /// Called when the part is queued on stream `stream`, with the buffers
    /// it will make (a worker names them now, so that work queued after it
    /// can name them too).
    fn queued(&self, outputs: &[Buffer], stream: u64) {
        let _ = (outputs, stream);
    }

    /// Runs `part` of `exe`: its outcome when it ran during the call, or
    /// `None` when the host completes `done` later (a worker, when it
    /// reports).
    fn run(&self, exe: &LoadedExecutable, part: Part<'_>, done: &Event) -> Option<Result<()>>;
}
