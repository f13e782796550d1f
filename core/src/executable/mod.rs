//! Loaded executables and their execution: once per host, with that host's shards,
//! in program order on the caller's stream.

use std::sync::Arc;

use crate::array::Array;
use crate::client::Client;
use crate::device::Device;
use crate::dispatch::Stream;
use crate::executor::{OutputShard, SessionScope};
use crate::format;
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;
use crate::program::Program;
use crate::spec::ArraySpec;

mod execute;
mod host;
mod load;
mod local;
mod on_worker;

pub(crate) use host::HostRun;
pub(crate) use load::{start_remote, LoadTask, Started};
pub(crate) use local::LocalRun;
pub(crate) use on_worker::WorkerRun;

/// Whether `plans` run on both the local host and workers.
pub(crate) fn mixed(plans: &[HostPlan]) -> bool {
    plans.iter().any(|p| p.run.in_process()) && plans.iter().any(|p| !p.run.in_process())
}

/// Each input's shard dims if `plans` is one host that holds every shard of
/// every input and output, in the order of their shardings: then
/// [`LoadedExecutable::execute_shards`] runs it with no arrays assembled.
pub(crate) fn one_host_dims(plans: &[HostPlan], program: &Program) -> Option<Vec<Vec<i64>>> {
    let whole = |positions: &[Vec<usize>], specs: &[ArraySpec]| {
        positions.len() == specs.len()
            && positions.iter().zip(specs).all(|(positions, spec)| {
                positions.len() == spec.sharding.devices().len()
                    && positions.iter().enumerate().all(|(k, &p)| k == p)
            })
    };
    let [plan] = plans else { return None };
    if plan.host_specs.is_some()
        || !whole(&plan.input_positions, &program.input_specs)
        || !whole(&plan.output_positions, &program.output_specs)
    {
        return None;
    }
    program
        .input_specs
        .iter()
        .map(|spec| spec.sharding.shard_shape(&spec.shape).ok())
        .collect()
}

/// Input shard counts and output shards of a single-device run.
type Layout = (Vec<usize>, Vec<OutputShard>);

/// The part of an executable that runs on one host.
pub(crate) struct HostPlan {
    pub host: usize,
    pub run: Box<dyn HostRun>,
    /// Per input: positions (in the input's sharding) of the shards on this host.
    pub input_positions: Vec<Vec<usize>>,
    pub input_counts: Vec<usize>,
    /// Per output: positions of the shards this host produces.
    pub output_positions: Vec<Vec<usize>>,
    pub output_shards: Vec<OutputShard>,
    /// The input and output specs restricted to this host's shards, when it
    /// lacks some (a local host of a program over several hosts).
    pub host_specs: Option<Box<HostSpecs>>,
}

/// Input and output specs as one host sees them.
pub(crate) struct HostSpecs {
    pub inputs: Vec<ArraySpec>,
    pub outputs: Vec<ArraySpec>,
}

pub(crate) struct ExecutableInner {
    pub client: Client,
    pub program: Program,
    pub hosts: Vec<HostPlan>,
    /// Whether `hosts` has both the local host and workers (its executions
    /// then send the workers' parts first).
    pub mixed: bool,
    /// Each input's shard dims when one host holds every shard, in the
    /// order of the shardings (what a worker loads; see
    /// [`one_host_dims`]).
    pub one_host_dims: Option<Vec<Vec<i64>>>,
    pub callbacks: Vec<LoadedHostCallback>,
    pub fingerprint: String,
    /// The worker session the executable was loaded in (`None`: the
    /// process's own, [`SessionKey::LOCAL`]).
    pub session: Option<Arc<SessionScope>>,
}

/// A compiled program, ready to execute on its devices. Cheap to clone; it keeps
/// its host callbacks alive, and so does every execution in flight.
///
/// Thread-safety: every method may be called from any thread.
#[derive(Clone)]
pub struct LoadedExecutable(pub(crate) Arc<ExecutableInner>);

/// Options of an execution.
#[derive(Clone, Default)]
pub struct ExecuteOptions {
    /// The stream that orders this execution (default: the calling thread's).
    pub stream: Option<Stream>,
}

/// The result of [`LoadedExecutable::execute`]: outputs, returned at once and ready
/// later, and the status of the whole execution.
pub struct Execution {
    /// One array per output spec.
    pub outputs: Vec<Array>,
    /// Ready when every host finished; carries the first failure.
    pub status: Event,
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LoadedExecutable({}, {})",
            self.0.program.name, self.0.program.language
        )
    }
}

impl LoadedExecutable {
    /// The client it runs on.
    pub fn client(&self) -> &Client {
        &self.0.client
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        &self.0.program.name
    }
    /// The devices it runs on.
    pub fn devices(&self) -> &[Device] {
        &self.0.program.devices
    }
    /// A stable hash of the serialized program (16 hex digits).
    pub fn fingerprint(&self) -> &str {
        &self.0.fingerprint
    }
    /// The program it was compiled from.
    pub fn program(&self) -> &Program {
        &self.0.program
    }
    /// The host callbacks it was compiled with.
    pub fn host_callbacks(&self) -> &[LoadedHostCallback] {
        &self.0.callbacks
    }
    /// Versioned bytes for [`Client::deserialize_and_load`]. A program that
    /// runs on this process only and whose language keeps a compiled form
    /// (an XLA program: the plugin's executable) carries that form, which
    /// loads again without compiling on the same plugin and version only.
    pub fn serialize(&self) -> Vec<u8> {
        let mut proto = self.0.program.to_proto(self.0.callbacks.len());
        if let [only] = self.0.hosts.as_slice() {
            if let Some(artifact) = only.run.artifact() {
                proto.payload = artifact;
            }
        }
        format::encode(&proto)
    }
}
