//! The host side of the colocated protocol: the built-in `colocated` language,
//! whose programs discover another program's outputs, pop or drop what a
//! discovery run parked, and destroy objects; and the host's store of parked
//! outputs, kept per session.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use prost::Message;

use crate::array::Array;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::executor::{DiscoverySink, ExecutionContext, Languages, LoadedProgram, SessionKey};
use crate::host_callback::LoadedHostCallback;
use crate::program::{Program, LANGUAGE_COLOCATED};

mod objects;

pub(crate) use objects::forget;

pub use objects::{host_object, host_objects, Built, HostValue};

/// The protocol's messages (`proto/colocated.proto`).
pub(crate) mod pb {
    include!(concat!(env!("OUT_DIR"), "/colocated.colocated.v1.rs"));
}

/// Outputs of discovery runs, parked until the controller pops them: by
/// session (a worker serves several controllers, and frees what a session
/// parked when it ends) and random key.
static PARKED: LazyLock<Mutex<Parked>> = LazyLock::new(Default::default);

type Parked = HashMap<(SessionKey, u64), Vec<Array>>;

fn parked() -> std::sync::MutexGuard<'static, Parked> {
    PARKED.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn take_parked(session: SessionKey, key: u64) -> Option<Vec<Array>> {
    parked().remove(&(session, key))
}

/// How many discovery results `session` (`None`: every session) has parked
/// on this host, waiting for its controller to take them.
pub fn parked_results(session: Option<SessionKey>) -> usize {
    parked()
        .keys()
        .filter(|(s, _)| session.is_none_or(|session| *s == session))
        .count()
}

/// Frees what `session` left on this host: its parked outputs and its objects
/// (their destructors run on this thread). A worker calls it when the session
/// ended, before the language executors' `session_ended`.
pub(crate) fn end_session(session: SessionKey) {
    let dropped: Vec<Vec<Array>> = {
        let mut parked = parked();
        let keys: Vec<_> = parked
            .keys()
            .filter(|(s, _)| *s == session)
            .copied()
            .collect();
        keys.iter().filter_map(|k| parked.remove(k)).collect()
    };
    drop(dropped);
    objects::end_session(session);
}

/// Loads a `colocated` program; a discovery run loads the program it runs
/// with the host's executor of that language.
pub(crate) fn load(program: &Program, executors: &Languages) -> Result<Arc<dyn LoadedProgram>> {
    let op = pb::Op::decode(program.payload.as_slice())
        .map_err(|e| Error::invalid_argument(format!("malformed colocated program: {e}")))?;
    Ok(match op.op {
        Some(pb::op::Op::Discover(d)) => {
            if d.language == LANGUAGE_COLOCATED {
                return Err(Error::invalid_argument(
                    "a discovery run cannot run a colocated program",
                ));
            }
            let inner = Program {
                name: program.name.clone(),
                language: d.language,
                payload: d.payload,
                input_specs: program.input_specs.clone(),
                output_specs: program.output_specs.clone(),
                devices: program.devices.clone(),
                output_structure: Vec::new(),
            };
            let executor = executors.get(&inner.language).ok_or_else(|| {
                Error::unimplemented(format!(
                    "this host cannot run '{}' programs (it runs {:?})",
                    inner.language,
                    executors.languages()
                ))
            })?;
            Arc::new(Discover {
                inner: executor.load(&inner)?,
                sink: Arc::new(Sink {
                    key: d.key,
                    report_callback: d.report_callback as usize,
                    report: None,
                }),
            })
        }
        Some(pb::op::Op::Pop(key)) => Arc::new(move |ctx: &mut ExecutionContext<'_>| {
            let arrays = take_parked(ctx.session(), key).ok_or_else(|| {
                Error::failed_precondition(
                    "no parked result on this host (the discovery run did not finish here)",
                )
            })?;
            ctx.set_host_outputs(arrays, None)
        }),
        Some(pb::op::Op::Drop(key)) => Arc::new(move |ctx: &mut ExecutionContext<'_>| {
            drop(take_parked(ctx.session(), key));
            Ok(())
        }),
        Some(pb::op::Op::ForgetObject(id)) => Arc::new(move |ctx: &mut ExecutionContext<'_>| {
            objects::forget(ctx.session(), id);
            Ok(())
        }),
        None => {
            return Err(Error::invalid_argument(
                "a colocated program without an operation",
            ))
        }
    })
}

/// A discovery run: the language's program, whose outputs go to the sink.
struct Discover {
    inner: Arc<dyn LoadedProgram>,
    sink: Arc<Sink>,
}

impl LoadedProgram for Discover {
    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()> {
        // The function sees its own host callbacks only: the report callback
        // (the last) is the protocol's, which user code must not reach.
        let all = ctx.callbacks;
        let report = all.get(self.sink.report_callback).cloned().ok_or_else(|| {
            Error::invalid_argument(format!(
                "a discovery run's report callback {} is out of range (it has {})",
                self.sink.report_callback,
                all.len()
            ))
        })?;
        ctx.callbacks = &all[..self.sink.report_callback];
        ctx.discovery = Some(Arc::new(Sink {
            key: self.sink.key,
            report_callback: self.sink.report_callback,
            report: Some(report),
        }));
        let ran = self.inner.run(ctx);
        ctx.discovery = None;
        ctx.callbacks = all;
        ran?;
        if parked().contains_key(&(ctx.session(), self.sink.key)) {
            Ok(())
        } else {
            Err(Error::invalid_argument(
                "the colocated function produced no result",
            ))
        }
    }

    fn waiter_first(&self) -> bool {
        self.inner.waiter_first()
    }
}

/// Parks a discovery run's outputs and reports them to the controller.
struct Sink {
    key: u64,
    report_callback: usize,
    /// The controller's report callback, for one run.
    report: Option<LoadedHostCallback>,
}

impl DiscoverySink for Sink {
    fn discovered(
        &self,
        ctx: &ExecutionContext<'_>,
        outputs: Vec<Array>,
        structure: Vec<u8>,
    ) -> Result<()> {
        let report = describe(ctx, &outputs, structure)?;
        parked().insert((ctx.session(), self.key), outputs);
        let callback = self
            .report
            .as_ref()
            .ok_or_else(|| Error::internal("a discovery sink without its report callback"))?;
        callback.call(&report.encode_to_vec())?;
        Ok(())
    }
}

/// This host's devices of the call, in the program's order.
fn host_devices<'a>(ctx: &ExecutionContext<'a>) -> Vec<&'a Device> {
    let client = ctx.client();
    ctx.program()
        .devices
        .iter()
        .filter(|d| !client.is_remote(d.host_index()))
        .collect()
}

/// How this host's outputs relate to its inputs and devices (see
/// `colocated.proto`).
fn describe(
    ctx: &ExecutionContext<'_>,
    outputs: &[Array],
    structure: Vec<u8>,
) -> Result<pb::Report> {
    let devices = host_devices(ctx);
    let inputs = ctx.host_input_specs();
    let mut reports = Vec::with_capacity(outputs.len());
    for (k, out) in outputs.iter().enumerate() {
        let sharding = out.sharding();
        let positions = sharding
            .devices()
            .iter()
            .map(|d| {
                devices
                    .iter()
                    .position(|h| *h == d)
                    .map(|p| p as u32)
                    .ok_or_else(|| {
                        Error::invalid_argument(format!(
                        "output {k} is on {d}, which is not one of the call's devices on this host"
                    ))
                    })
            })
            .collect::<Result<Vec<u32>>>()?;
        let rank = out.shape().len();
        // The same sharding in every respect (mesh names and axis types too,
        // and the same memory kind: a sharding names its memory), not only
        // the same layout: the caller gets the sharding the function made.
        let same = inputs
            .iter()
            .position(|x| x.shape.len() == rank && x.sharding == *sharding);
        let like = match same {
            Some(_) => None,
            None => inputs
                .iter()
                .position(|x| x.shape.len() == rank && x.sharding.equivalent(sharding, rank)),
        };
        let input_shape = same
            .or(like)
            .map(|j| inputs[j].shape.clone())
            .unwrap_or_default();
        reports.push(pb::OutputReport {
            shape: out.shape().to_vec(),
            dtype: out.dtype() as u32,
            layout: Some(pb::HostLayout {
                positions,
                mesh_shape: sharding.mesh_shape().iter().map(|&n| n as u64).collect(),
                axis_names: sharding.axis_names().to_vec(),
                partition: sharding
                    .partition()
                    .iter()
                    .map(|axes| pb::Axes {
                        mesh_axes: axes.iter().map(|&a| a as u32).collect(),
                    })
                    .collect(),
                axis_types: sharding.wire_axis_types(),
                mesh: !sharding.is_single_device(),
            }),
            same_as_input: same.map(|j| j as u32),
            input_shape,
            memory_kind: out.memory_kind() as u32,
            layout_of_input: like.map(|j| j as u32),
        });
    }
    Ok(pb::Report {
        structure,
        outputs: reports,
    })
}
