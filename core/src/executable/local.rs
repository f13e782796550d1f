//! An executable's part on the local host: the program its language
//! executor loaded, run on the thread the stream's work runs on.

use std::sync::Arc;

use super::host::{HostRun, Part};
use super::LoadedExecutable;
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::executor::{ExecutionContext, LoadedProgram, Produced, SessionKey};
use crate::future::Event;

/// The local host's part: the loaded program.
pub(crate) struct LocalRun(pub Arc<dyn LoadedProgram>);

impl HostRun for LocalRun {
    fn in_process(&self) -> bool {
        true
    }

    fn waiter_first(&self) -> bool {
        self.0.waiter_first()
    }

    fn artifact(&self) -> Option<Vec<u8>> {
        self.0.artifact()
    }

    fn enqueues(&self) -> bool {
        self.0.enqueues()
    }

    /// An enqueuing program takes an input whose data are already on its
    /// device, ready or not: the device orders the work on them.
    fn takes_pending(&self, input: &Buffer, _stream: u64) -> bool {
        self.0.enqueues() && input.is_defined_on_device()
    }

    fn run(&self, exe: &LoadedExecutable, part: Part<'_>, done: &Event) -> Option<Result<()>> {
        match run_here(&self.0, exe, part) {
            Ok(pending) if pending.is_empty() => Some(Ok(())),
            Ok(pending) => {
                // Complete when the device has made every output.
                let done = done.clone();
                Event::join(&pending).when_ready(move |r| done.set_if_pending(r));
                None
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// Runs `part` of `exe` with `program` on this thread; the readiness of the
/// outputs an enqueuing program left pending (their data are set already).
fn run_here(
    program: &Arc<dyn LoadedProgram>,
    exe: &LoadedExecutable,
    part: Part<'_>,
) -> Result<Vec<Event>> {
    let Part {
        host,
        inputs,
        input_counts,
        output_shards: shards,
        host_specs,
        outputs,
        stream_id: _,
    } = part;
    // The program sees views that share the data: a caller deleting an input
    // after submission does not take it away from the running program. An
    // enqueuing program reads them only during `run` (the job holds them
    // until then) and its device keeps what it still reads: it gets the
    // inputs themselves.
    let views = match program.enqueues() {
        true => smallvec::SmallVec::new(),
        false => inputs
            .iter()
            .enumerate()
            .map(|(i, b)| b.view().map_err(|e| e.context(format!("input shard {i}"))))
            .collect::<Result<smallvec::SmallVec<[Buffer; 4]>>>()?,
    };
    let inputs = match program.enqueues() {
        true => inputs,
        false => &views[..],
    };
    let program_specs = &exe.0.program;
    let (host_inputs, host_outputs) = match host_specs {
        Some(specs) => (&specs.inputs[..], &specs.outputs[..]),
        None => (
            &program_specs.input_specs[..],
            &program_specs.output_specs[..],
        ),
    };
    let session = match &exe.0.session {
        // Its session ended: what would run now would outlive it.
        Some(scope) if scope.has_ended() => {
            return Err(Error::cancelled(format!(
                "{} program '{}': its session ended",
                exe.0.program.language,
                exe.name()
            )))
        }
        Some(scope) => scope.key(),
        None => SessionKey::LOCAL,
    };
    let mut ctx = ExecutionContext {
        client: &exe.0.client,
        program: &exe.0.program,
        loaded: program.as_ref(),
        host,
        host_input_specs: host_inputs,
        host_output_specs: host_outputs,
        inputs,
        input_counts,
        output_shards: shards,
        outputs: (0..shards.len()).map(|_| Produced::Unset).collect(),
        placed: smallvec::SmallVec::new(),
        placed_pending: smallvec::SmallVec::new(),
        callbacks: &exe.0.callbacks,
        session,
        discovery: None,
        native_data: None,
        host_outputs_set: false,
    };
    program.run(&mut ctx).map_err(|e| {
        e.context(format!(
            "{} program '{}'",
            exe.0.program.language,
            exe.name()
        ))
    })?;
    // Run without an error: what the program placed goes into the outputs.
    for (index, data) in ctx.placed.drain(..) {
        let out = outputs
            .get(index)
            .ok_or_else(|| Error::internal(format!("output shard {index} is out of range")))?;
        out.fill_shared(data);
    }
    let mut pending: Vec<Event> = ctx.placed_pending.into_iter().collect();
    for (i, (produced, out)) in ctx.outputs.into_iter().zip(outputs).enumerate() {
        let produced = match produced {
            Produced::Placed => continue,
            Produced::Buffer(b) => b,
            Produced::Unset => {
                return Err(Error::internal(format!(
                    "{} program '{}' did not set output shard {i}",
                    exe.0.program.language,
                    exe.name()
                )))
            }
        };
        if program.enqueues() && !produced.ready_event().is_ready() {
            out.fill_shared(produced.storage()?);
            pending.push(produced.ready_event().clone());
            continue;
        }
        produced.ready_event().wait()?;
        out.fill_shared(produced.storage()?);
    }
    Ok(pending)
}
