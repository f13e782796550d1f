//! An executable's part on the local host: the program its language
//! executor loaded, run on the thread the stream's work runs on.

use std::sync::Arc;

use super::host::{HostRun, Part};
use super::LoadedExecutable;
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::executor::{ExecutionContext, LoadedProgram, SessionKey};
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

    fn run(&self, exe: &LoadedExecutable, part: Part<'_>, _done: &Event) -> Option<Result<()>> {
        Some(run_here(&self.0, exe, part))
    }
}

/// Runs `part` of `exe` with `program` on this thread.
fn run_here(
    program: &Arc<dyn LoadedProgram>,
    exe: &LoadedExecutable,
    part: Part<'_>,
) -> Result<()> {
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
    // after submission does not take it away from the running program.
    let views = inputs
        .iter()
        .enumerate()
        .map(|(i, b)| b.view().map_err(|e| e.context(format!("input shard {i}"))))
        .collect::<Result<smallvec::SmallVec<[Buffer; 4]>>>()?;
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
        host,
        host_input_specs: host_inputs,
        host_output_specs: host_outputs,
        inputs: &views,
        input_counts,
        output_shards: shards,
        outputs: smallvec::smallvec![None; shards.len()],
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
    for (i, (produced, out)) in ctx.outputs.into_iter().zip(outputs).enumerate() {
        let produced = produced.ok_or_else(|| {
            Error::internal(format!(
                "{} program '{}' did not set output shard {i}",
                exe.0.program.language,
                exe.name()
            ))
        })?;
        produced.ready_event().wait()?;
        out.fill_shared(produced.storage()?);
    }
    Ok(())
}
