//! Executing a loaded executable: checking the arguments, planning each
//! host's part, and queueing it on the caller's stream as boxed work.

use smallvec::SmallVec;

use super::{host, ExecuteOptions, Execution, Layout, LoadedExecutable};
use crate::array::Array;
use crate::buffer::{Buffer, UsageHold};
use crate::device::Device;
use crate::dispatch::{Stream, Task, Work};
use crate::error::{Error, Result};
use crate::executor::OutputShard;
use crate::future::Event;
use crate::spec::ArraySpec;

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
        let mut to_workers = false;
        for (h, plan) in self.0.hosts.iter().enumerate() {
            to_workers |= !plan.run.in_process();
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
        // The caller most likely waits for the workers' answers: it reads
        // them then, once every part went out (not detached: a worker's).
        let sending = (to_workers && !detached).then(crate::transport::lane_reader::Sending::start);
        for mut task in remote_tasks.into_iter().chain(tasks.0).chain(tasks.1) {
            task.waiter_first &= !detached;
            self.enqueue(&stream, task);
        }
        drop(sending);
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
                let pos = position(spec)
                    .ok_or_else(|| Error::internal("output sharding lacks the device"))?;
                OutputShard::of(o, spec.dtype, dims, &spec.sharding, pos)
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
            .map(|(o, spec)| {
                OutputShard::on(
                    o,
                    spec.dtype,
                    spec.shape.clone(),
                    device.clone(),
                    spec.sharding.memory_kind(),
                )
            })
            .collect::<Result<_>>()?;
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
                    s.memory.clone(),
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
    let (have, takes) = (
        got.sharding.memory_kind_or_default(),
        want.sharding.memory_kind_or_default(),
    );
    if have != takes {
        return Err(Error::invalid_argument(format!(
            "argument {i} is in {} memory but the program takes it in {} memory: copy it there first",
            have.name(),
            takes.name()
        )));
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
