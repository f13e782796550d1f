//! Loaded executables and their execution: once per host, with that host's shards,
//! in program order on the caller's stream.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::array::Array;
use crate::buffer::{Buffer, UsageHold};
use crate::client::Client;
use crate::device::Device;
use crate::dispatch::{Stream, Task, Work};
use crate::error::{Error, Result};
use crate::executor::{OutputShard, SessionScope};
use crate::format;
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;
use crate::program::Program;
use crate::spec::ArraySpec;

mod host;
mod local;
mod on_worker;

pub(crate) use host::HostRun;
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

/// One host's part of an execution, queued on its stream as boxed work (one
/// allocation per submission; the queue's slots stay small).
struct ExecJob {
    exe: LoadedExecutable,
    plan_index: usize,
    inputs: Vec<Buffer>,
    /// Keep the inputs' data alive even if the caller deletes them meanwhile.
    holds: SmallVec<[UsageHold; 4]>,
    layout: Option<Box<Layout>>,
    outputs: SmallVec<[Buffer; 4]>,
    stream_id: u64,
}

impl Work for ExecJob {
    /// Runs the program (unless a dependency failed) and completes `done`.
    fn run(self: Box<Self>, status: Result<()>, done: &Event) {
        let ExecJob {
            exe,
            plan_index,
            inputs,
            holds,
            layout,
            outputs,
            stream_id,
        } = *self;
        let plan = &exe.0.hosts[plan_index];
        let span = tracing::debug_span!(
            "execute",
            program = %exe.0.program.name,
            host = plan.host as u64,
            stream = stream_id
        )
        .entered();
        let (counts, shards, specs) = match &layout {
            Some(l) => (&l.0[..], &l.1[..], None),
            None => (
                &plan.input_counts[..],
                &plan.output_shards[..],
                plan.host_specs.as_deref(),
            ),
        };
        let part = host::Part {
            host: plan.host,
            inputs: &inputs,
            input_counts: counts,
            output_shards: shards,
            host_specs: specs,
            outputs: &outputs,
            stream_id,
        };
        let result = match status {
            Err(e) => Some(Err(e)),
            Ok(()) => plan.run.run(&exe, part, done),
        };
        drop(holds);
        // Close the span before waking waiters: a finished wait implies a recorded
        // span. Everything the job held goes first too: a caller whose wait
        // returns may destroy the client, and expects the program (and the
        // native function it runs) gone with it.
        drop(span);
        drop((inputs, outputs, layout, exe));
        if let Some(result) = result {
            done.set_if_pending(result);
        }
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

    /// Runs the program once per host with that host's shards of `args`.
    ///
    /// Returns at once. Misuse fails here (`invalid_argument`: argument count or
    /// specs; `failed_precondition`: a deleted argument); a failure while running —
    /// including a failed input producer — is delivered on the outputs' ready events
    /// and on `status`.
    pub fn execute(&self, args: &[Array], options: &ExecuteOptions) -> Result<Execution> {
        self.execute_with(args, options, false)
    }

    /// Runs the program with its inputs given shard by shard (`shards`:
    /// each input's shards in the order of its sharding's devices, one input
    /// after another), for a caller that will not wait on the execution in
    /// this process (a worker serving a controller): executor threads take
    /// it at once, instead of a waiting thread getting the first chance to
    /// run it. Returns the output shards, in the same order, and the status.
    ///
    /// A program whose one host holds every shard (what a worker loads) runs
    /// with no arrays assembled for its inputs or made for its outputs; any
    /// other goes through [`execute`](Self::execute)'s path.
    pub(crate) fn execute_shards(
        &self,
        shards: Vec<Buffer>,
        stream: Stream,
    ) -> Result<(Vec<Buffer>, Event)> {
        let program = &self.0.program;
        let expected: usize = program
            .input_specs
            .iter()
            .map(|s| s.sharding.devices().len())
            .sum();
        if shards.len() != expected {
            return Err(Error::invalid_argument(format!(
                "{} takes {expected} input shards, {} were given",
                self.name(),
                shards.len()
            )));
        }
        let Some(dims) = &self.0.one_host_dims else {
            return self.execute_shards_as_arrays(shards, stream);
        };
        let mut at = 0;
        for (i, (spec, dims)) in program.input_specs.iter().zip(dims).enumerate() {
            let devices = spec.sharding.devices();
            for (k, (b, device)) in shards[at..at + devices.len()]
                .iter()
                .zip(devices)
                .enumerate()
            {
                check_shard(b, device, spec, dims, || {
                    format!("shard {k} of argument {i}")
                })?;
            }
            at += devices.len();
        }
        self.0.client.check_stream(&stream)?;
        let (outputs, status, task) = self.prepare(0, shards, None, &stream);
        if let Some(mut task) = task {
            task.waiter_first = false;
            self.enqueue(&stream, task);
        }
        Ok((outputs, status))
    }

    /// [`execute_shards`](Self::execute_shards) through arrays.
    fn execute_shards_as_arrays(
        &self,
        shards: Vec<Buffer>,
        stream: Stream,
    ) -> Result<(Vec<Buffer>, Event)> {
        let mut args = Vec::with_capacity(self.0.program.input_specs.len());
        let mut at = 0;
        for spec in &self.0.program.input_specs {
            let n = spec.sharding.devices().len();
            args.push(Array::assemble(spec.clone(), shards[at..at + n].to_vec())?);
            at += n;
        }
        let run = self.execute_with(
            &args,
            &ExecuteOptions {
                stream: Some(stream),
            },
            true,
        )?;
        let outputs = run
            .outputs
            .iter()
            .flat_map(|a| a.buffers().iter().cloned())
            .collect();
        Ok((outputs, run.status))
    }

    fn execute_with(
        &self,
        args: &[Array],
        options: &ExecuteOptions,
        detached: bool,
    ) -> Result<Execution> {
        let specs = &self.0.program.input_specs;
        if args.len() != specs.len() {
            return Err(Error::invalid_argument(format!(
                "{} takes {} arguments, {} were given",
                self.name(),
                specs.len(),
                args.len()
            )));
        }
        for (i, (arg, spec)) in args.iter().zip(specs).enumerate() {
            check_arg(i, arg.spec(), spec)?;
            for b in arg.buffers() {
                b.check_live()
                    .map_err(|e| e.context(format!("argument {i}")))?;
            }
        }
        let client = &self.0.client;
        let stream = options
            .stream
            .clone()
            .unwrap_or_else(|| client.current_stream());
        client.check_stream(&stream)?;
        let outputs_spec = &self.0.program.output_specs;
        let mut out_buffers: SmallVec<[SmallVec<[Option<Buffer>; 4]>; 4]> = outputs_spec
            .iter()
            .map(|s| smallvec::smallvec![None; s.sharding.devices().len()])
            .collect();
        // One status and task per host; no allocation for the common single-host
        // case. Tasks are queued last, after the bookkeeping: the caller then
        // reaches its wait (and runs the task inline) before an executor takes it.
        let mut statuses: (Option<Event>, Vec<Event>) = (None, Vec::new());
        let mut tasks: (Option<Task>, Vec<Task>) = (None, Vec::new());
        // Parts for workers go first: sending one is quick, and a local part
        // that runs long (or waits for the workers' parts) must not hold them
        // back. Each host still sees its parts in the stream's order.
        // (Only a program over both kinds of host needs it: the others keep
        // their one task unallocated.)
        let mut remote_tasks: Vec<Task> = Vec::new();
        let mixed = self.0.mixed;
        for (h, plan) in self.0.hosts.iter().enumerate() {
            let inputs: Vec<Buffer> = plan
                .input_positions
                .iter()
                .zip(args)
                .flat_map(|(positions, arg)| positions.iter().map(|&p| arg.buffers()[p].clone()))
                .collect();
            let (outs, status, task) = self.prepare(h, inputs, None, &stream);
            match (&tasks.0, task) {
                (_, None) => {}
                (_, Some(task)) if mixed && !plan.run.in_process() => remote_tasks.push(task),
                (None, Some(task)) => tasks.0 = Some(task),
                (Some(_), Some(task)) => tasks.1.push(task),
            }
            let mut outs = outs.into_iter();
            for (o, positions) in plan.output_positions.iter().enumerate() {
                for &p in positions {
                    out_buffers[o][p] = outs.next();
                }
            }
            match statuses.0 {
                None => statuses.0 = Some(status),
                Some(_) => statuses.1.push(status),
            }
        }
        let outputs = outputs_spec
            .iter()
            .zip(out_buffers)
            .map(|(spec, buffers)| {
                let buffers = buffers
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Error::internal("an output shard has no host that produces it")
                    })?;
                Ok(Array::from_parts(spec.clone(), buffers))
            })
            .collect::<Result<Vec<_>>>()?;
        for mut task in remote_tasks.into_iter().chain(tasks.0).chain(tasks.1) {
            task.waiter_first &= !detached;
            self.enqueue(&stream, task);
        }
        let status = match statuses {
            (Some(only), rest) if rest.is_empty() => only,
            (first, mut rest) => {
                rest.splice(0..0, first);
                Event::join(&rest)
            }
        };
        Ok(Execution { outputs, status })
    }

    /// Runs the part of the program that `device` owns, with that device's shard of
    /// each input (`args`, one buffer per input); returns that device's shard of
    /// each output and the status.
    pub fn execute_sharded(
        &self,
        args: &[Buffer],
        device: &Device,
        options: &ExecuteOptions,
    ) -> Result<(Vec<Buffer>, Event)> {
        let program = &self.0.program;
        let position = |spec: &ArraySpec| spec.sharding.devices().iter().position(|d| d == device);
        if !program.devices.contains(device) {
            return Err(Error::invalid_argument(format!(
                "{} does not run on {device}",
                self.name()
            )));
        }
        self.check_buffer_args(args, device, |spec| {
            let shape = spec.sharding.shard_shape(&spec.shape)?;
            Ok(shape)
        })?;
        let shards: Vec<OutputShard> = program
            .output_specs
            .iter()
            .enumerate()
            .map(|(o, spec)| {
                let dims = spec.sharding.shard_shape(&spec.shape)?;
                position(spec)
                    .ok_or_else(|| Error::internal("output sharding lacks the device"))?;
                Ok(OutputShard {
                    output: o,
                    dtype: spec.dtype,
                    dims,
                    device: device.clone(),
                })
            })
            .collect::<Result<_>>()?;
        let h = self.host_plan_index(device.host_index())?;
        self.run_single(h, args, shards, options)
    }

    /// Runs a single-device executable on any `device` of the client, with whole
    /// arrays as buffers on that device.
    pub fn execute_portable(
        &self,
        args: &[Buffer],
        device: &Device,
        options: &ExecuteOptions,
    ) -> Result<(Vec<Buffer>, Event)> {
        let program = &self.0.program;
        self.0.client.check_device(device)?;
        if program.devices.len() != 1 {
            return Err(Error::invalid_argument(format!(
                "execute_portable needs a single-device executable; {} runs on {} devices",
                self.name(),
                program.devices.len()
            )));
        }
        self.check_buffer_args(args, device, |spec| Ok(spec.shape.clone()))?;
        let shards: Vec<OutputShard> = program
            .output_specs
            .iter()
            .enumerate()
            .map(|(o, spec)| OutputShard {
                output: o,
                dtype: spec.dtype,
                dims: spec.shape.clone(),
                device: device.clone(),
            })
            .collect();
        let h = self.host_plan_index(program.devices[0].host_index())?;
        self.run_single(h, args, shards, options)
    }

    /// Queues a single-device run of plan `h` on `args` (one buffer per
    /// input) producing `shards`, on the options' stream.
    fn run_single(
        &self,
        h: usize,
        args: &[Buffer],
        shards: Vec<OutputShard>,
        options: &ExecuteOptions,
    ) -> Result<(Vec<Buffer>, Event)> {
        let stream = options
            .stream
            .clone()
            .unwrap_or_else(|| self.0.client.current_stream());
        self.0.client.check_stream(&stream)?;
        let layout = Box::new((vec![1; args.len()], shards));
        let (outputs, status, task) = self.prepare(h, args.to_vec(), Some(layout), &stream);
        if let Some(task) = task {
            self.enqueue(&stream, task);
        }
        Ok((outputs, status))
    }

    /// The plan of a single-device run on `host` (local hosts only).
    fn host_plan_index(&self, host: usize) -> Result<usize> {
        let index = self
            .0
            .hosts
            .iter()
            .position(|p| p.host == host)
            .ok_or_else(|| {
                Error::invalid_argument(format!("{} has no part on host {host}", self.name()))
            })?;
        if !self.0.hosts[index].run.in_process() {
            return Err(Error::unimplemented(format!(
                "single-device runs on worker {} are not supported yet; use execute",
                self.0.client.hosts()[host].name()
            )));
        }
        Ok(index)
    }

    fn check_buffer_args(
        &self,
        args: &[Buffer],
        device: &Device,
        expected_dims: impl Fn(&ArraySpec) -> Result<Vec<i64>>,
    ) -> Result<()> {
        let specs = &self.0.program.input_specs;
        if args.len() != specs.len() {
            return Err(Error::invalid_argument(format!(
                "{} takes {} arguments, {} were given",
                self.name(),
                specs.len(),
                args.len()
            )));
        }
        for (i, (b, spec)) in args.iter().zip(specs).enumerate() {
            let dims = expected_dims(spec)?;
            check_shard(b, device, spec, &dims, || format!("argument {i}"))?;
        }
        Ok(())
    }

    /// Prepares one host's part: its pending output buffers, its completion, and
    /// the task that fills them (`None` when it failed already, e.g. a deleted
    /// input). `layout` overrides the plan's input counts and output shards
    /// (single-device runs); the common path shares the plan's, so submitting
    /// touches no reference count the executor threads also touch.
    fn prepare(
        &self,
        plan_index: usize,
        inputs: Vec<Buffer>,
        layout: Option<Box<Layout>>,
        stream: &Stream,
    ) -> (Vec<Buffer>, Event, Option<Task>) {
        let client = &self.0.client;
        let completion = Event::new();
        let plan = &self.0.hosts[plan_index];
        let shards = layout
            .as_ref()
            .map_or(&plan.output_shards[..], |l| &l.1[..]);
        let outputs: Vec<Buffer> = shards
            .iter()
            .map(|s| {
                Buffer::new(
                    client,
                    s.device.clone(),
                    s.device.default_memory_space().clone(),
                    s.dtype,
                    &s.dims,
                    completion.clone(),
                )
            })
            .collect();
        let deps: Vec<Event> = inputs
            .iter()
            .filter(|b| !b.ready_event().is_ready() && !plan.run.takes_pending(b, stream.id()))
            .map(|b| b.ready_event().clone())
            .collect();
        let holds = match inputs.iter().map(Buffer::hold).collect::<Result<_>>() {
            Ok(holds) => holds,
            Err(e) => {
                completion.set_if_pending(Err(e));
                return (outputs, completion, None);
            }
        };
        plan.run.queued(&outputs, stream.id());
        let job = ExecJob {
            exe: self.clone(),
            plan_index,
            inputs,
            holds,
            layout,
            outputs: outputs.iter().cloned().collect(),
            stream_id: stream.id(),
        };
        let task = Task {
            deps,
            completion: completion.clone(),
            run: Box::new(job),
            waiter_first: plan.run.waiter_first(),
            hands_off: !plan.run.in_process()
                || (plan.run.enqueues() && !crate::dispatch::on_event_loop()),
        };
        (outputs, completion, Some(task))
    }

    /// Queues a prepared task on `stream`.
    fn enqueue(&self, stream: &Stream, task: Task) {
        self.0.client.0.local.dispatcher.submit(stream, task);
    }
}

/// Refuses buffer `b` (`what` names it) unless it is live, on `device`, of
/// `spec`'s element type and of `dims`.
fn check_shard(
    b: &Buffer,
    device: &Device,
    spec: &ArraySpec,
    dims: &[i64],
    what: impl Fn() -> String,
) -> Result<()> {
    b.check_live().map_err(|e| e.context(what()))?;
    if b.device() != device || b.dtype() != spec.dtype || b.dims() != dims {
        return Err(Error::invalid_argument(format!(
            "{} must be {}{dims:?} on {device}, got {}{:?} on {}",
            what(),
            spec.dtype.name(),
            b.dtype().name(),
            b.dims(),
            b.device()
        )));
    }
    Ok(())
}

fn check_arg(i: usize, got: &ArraySpec, want: &ArraySpec) -> Result<()> {
    if got.sharding.same_as(&want.sharding) && got.dtype == want.dtype && got.shape == want.shape {
        return Ok(());
    }
    if !got.matches(want) {
        return Err(Error::invalid_argument(format!(
            "argument {i} is {} with {:?} but the program expects {} with {:?}",
            got.describe(),
            got.sharding,
            want.describe(),
            want.sharding
        )));
    }
    Ok(())
}
