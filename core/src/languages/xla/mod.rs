//! XLA programs: the `xla` language, whose payload is a StableHLO module
//! that a host's PJRT plugin compiles and runs on its devices.
//!
//! A program runs once on each host that owns its devices, with that host's
//! shards (SPEC §4); an SPMD module (`mhlo.num_partitions` > 1, Shardy
//! shardings) runs over several devices of one host. The program's specs come
//! from the module's `@main` signature: its shapes, element types and
//! `sdy.sharding`s over the `sdy.mesh`, laid over the program's devices in
//! order (partition `p` runs on device `p`).

mod signature;

use std::sync::Arc;

use colocated_pjrt as pjrt;
use smallvec::SmallVec;

use crate::backend::pjrt::{dtype_of, to_error};
use crate::backend::{DeviceData, PjrtBackend};
use crate::buffer::{Buffer, Storage};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::executor::{ExecutionContext, LanguageExecutor, LoadedProgram};
use crate::format::pb;
use crate::program::{Program, LANGUAGE_XLA};
use crate::sharding::Sharding;
use crate::spec::ArraySpec;

/// The program of `module` on `devices`, its specs read from the module.
pub(crate) fn xla_program(module: &[u8], devices: &[Device]) -> Result<Program> {
    let signature = signature::parse(module)?;
    let first = devices
        .first()
        .ok_or_else(|| Error::invalid_argument("an XLA program needs at least one device"))?;
    if devices.iter().any(|d| d.host_index() != first.host_index()) {
        return Err(Error::unimplemented(
            "an XLA program runs on one host's devices: cross-host programs (collectives \
             between hosts) are not supported",
        ));
    }
    if let Some(d) = devices.iter().find(|d| d.is_host_cpu()) {
        return Err(Error::invalid_argument(format!(
            "{d} is one of this runtime's CPU devices; XLA programs run on a PJRT plugin's \
             devices (configure one, or use client.devices() of its backend)"
        )));
    }
    if devices.iter().any(|d| d.backend() != first.backend()) {
        return Err(Error::invalid_argument(
            "an XLA program's devices must all be of one PJRT plugin",
        ));
    }
    if signature.num_replicas != 1 {
        return Err(Error::unimplemented(format!(
            "the module has {} replicas; only partitioned (SPMD) modules with one replica run",
            signature.num_replicas
        )));
    }
    if devices.len() != signature.num_partitions {
        return Err(Error::invalid_argument(format!(
            "the module runs on {} device(s) (mhlo.num_partitions) but {} were given",
            signature.num_partitions,
            devices.len()
        )));
    }
    let spec = |t: &signature::Tensor| -> Result<ArraySpec> {
        let sharding = if devices.len() == 1 {
            Sharding::single_device(devices[0].clone())
        } else {
            match &t.sharding {
                None => Sharding::replicated(devices.to_vec())?,
                Some(dims) => mesh_sharding(&signature, devices, dims)?,
            }
        };
        ArraySpec::new(t.shape.clone(), t.dtype, sharding)
    };
    let input_specs = signature
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| spec(t).map_err(|e| e.context(format!("argument {i} of @main"))))
        .collect::<Result<Vec<_>>>()?;
    let output_specs = signature
        .outputs
        .iter()
        .enumerate()
        .map(|(i, t)| spec(t).map_err(|e| e.context(format!("result {i} of @main"))))
        .collect::<Result<Vec<_>>>()?;
    Ok(Program {
        name: "xla".to_string(),
        language: LANGUAGE_XLA.to_string(),
        payload: module.to_vec(),
        input_specs,
        output_specs,
        devices: devices.to_vec(),
        output_structure: Vec::new(),
    })
}

/// A sharding over the module's mesh, its devices the program's in order.
fn mesh_sharding(
    signature: &signature::Signature,
    devices: &[Device],
    dims: &[Vec<String>],
) -> Result<Sharding> {
    let names: Vec<String> = signature.mesh.iter().map(|(n, _)| n.clone()).collect();
    let shape: Vec<usize> = signature.mesh.iter().map(|(_, s)| *s).collect();
    if shape.iter().product::<usize>() != devices.len() {
        return Err(Error::invalid_argument(format!(
            "the module's mesh {:?} does not have the {} devices given",
            signature.mesh,
            devices.len()
        )));
    }
    let partition = dims
        .iter()
        .map(|axes| {
            axes.iter()
                .map(|a| {
                    names.iter().position(|n| n == a).ok_or_else(|| {
                        Error::invalid_argument(format!("mesh axis \"{a}\" is not in sdy.mesh"))
                    })
                })
                .collect::<Result<Vec<usize>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    Sharding::named(devices.to_vec(), shape, names, partition)
}

/// The `xla` language of a host with a PJRT plugin.
pub(crate) struct XlaExecutor;

struct XlaProgram {
    /// For each of the executable's devices (the order of its argument and
    /// output lists), the position of that device in the program's devices
    /// (the order of the shards).
    order: Vec<usize>,
    executable: pjrt::LoadedExecutable,
    backend: Arc<PjrtBackend>,
    /// The StableHLO module it was compiled from.
    module: Vec<u8>,
    num_inputs: usize,
}

/// What starts the payload of a serialized XLA program that carries the
/// plugin's executable (a `pb::XlaArtifact` follows).
const ARTIFACT_MAGIC: &[u8] = b"colocated-xla-artifact\0";

/// The plugin's executable in `payload`, when it is an artifact: `Ok(None)`
/// for a module; `invalid_argument` saying why for an artifact that is
/// corrupted or of another plugin or version than `backend`.
fn artifact_of(payload: &[u8], identity: &str) -> Result<Option<pb::XlaArtifact>> {
    let Some(bytes) = payload.strip_prefix(ARTIFACT_MAGIC) else {
        return Ok(None);
    };
    let artifact = <pb::XlaArtifact as prost::Message>::decode(bytes).map_err(|e| {
        Error::invalid_argument(format!("a serialized XLA program is corrupted: {e}"))
    })?;
    if artifact.plugin != identity {
        return Err(Error::invalid_argument(format!(
            "the XLA program was compiled by the {}, and loads only there; this host has the {identity}",
            artifact.plugin,
        )));
    }
    Ok(Some(artifact))
}

/// Where each device of `executable` stands among `devices` (the program's);
/// `invalid_argument` when the executable runs on other devices.
fn device_order(
    executable: &pjrt::LoadedExecutable,
    devices: &[Arc<crate::backend::PjrtDevice>],
) -> Result<Vec<usize>> {
    let order: Vec<usize> = executable
        .devices()
        .iter()
        .filter_map(|e| devices.iter().position(|d| d.device().id() == e.id()))
        .collect();
    let mut seen = order.clone();
    seen.sort_unstable();
    seen.dedup();
    if order.len() != devices.len() || seen.len() != devices.len() {
        return Err(Error::invalid_argument(
            "the XLA program runs on other devices of its plugin than the program's",
        ));
    }
    Ok(order)
}

impl LanguageExecutor for XlaExecutor {
    fn load(&self, program: &Program) -> Result<Arc<dyn LoadedProgram>> {
        let mut plugin_devices = Vec::with_capacity(program.devices.len());
        for d in &program.devices {
            let pjrt = d.0.pjrt.as_ref().ok_or_else(|| {
                Error::invalid_argument(format!("{d} is not a PJRT plugin's device"))
            })?;
            plugin_devices.push(pjrt.clone());
        }
        let backend = plugin_devices[0].backend().clone();
        if let Some(artifact) = artifact_of(&program.payload, backend.identity())? {
            let executable = backend
                .client()
                .deserialize_and_load(&artifact.executable)
                .map_err(to_error)?;
            let order = device_order(&executable, &plugin_devices)?;
            return Ok(Arc::new(XlaProgram {
                order,
                executable,
                backend,
                module: artifact.module,
                num_inputs: program.input_specs.len(),
            }));
        }
        let signature = signature::parse(&program.payload)?;
        let n = plugin_devices.len() as i64;
        let options = pjrt::CompileOptions {
            num_replicas: 1,
            num_partitions: n,
            use_spmd_partitioning: n > 1,
            use_shardy_partitioner: !signature.mesh.is_empty(),
            device_assignment: Some(vec![plugin_devices
                .iter()
                .map(|d| i64::from(d.device().id()))
                .collect()]),
        };
        let executable = backend
            .client()
            .compile(&program.payload, pjrt::ProgramFormat::Mlir, &options)
            .map_err(to_error)?;
        let order = device_order(&executable, &plugin_devices)?;
        // The compiled program's outputs must be the shards the specs say.
        for (o, spec) in program.output_specs.iter().enumerate() {
            let shard = spec.sharding.shard_shape(&spec.shape)?;
            let (ty, dims) = (
                executable.output_types().get(o),
                executable.output_dims().get(o),
            );
            let matches =
                ty.is_some_and(|t| dtype_of(*t) == spec.dtype) && dims.is_some_and(|d| *d == shard);
            if !matches {
                return Err(Error::invalid_argument(format!(
                    "result {o} of @main compiles to {ty:?}{dims:?} per device, not the {}{shard:?} \
                     its type and sharding give",
                    spec.dtype.name()
                )));
            }
        }
        Ok(Arc::new(XlaProgram {
            order,
            executable,
            backend,
            module: program.payload.clone(),
            num_inputs: program.input_specs.len(),
        }))
    }
}

/// What the plugin said of one device's part of an execution.
enum Made {
    /// Its outputs are made.
    Done,
    /// They are made when the event is ready.
    When(pjrt::Event),
    /// It gave no event: each output's own ready event says.
    Unknown,
}

impl LoadedProgram for XlaProgram {
    /// `PJRT_LoadedExecutable_Execute` queues the program on the plugin's
    /// devices and returns (XLA's CPU plugin runs a small program before it
    /// returns): the submitting thread runs it, as `jax.jit` dispatches, and
    /// the outputs are ready when the plugin's events say so.
    fn enqueues(&self) -> bool {
        true
    }

    /// The plugin's executable, with the plugin's identity and the module.
    fn artifact(&self) -> Option<Vec<u8>> {
        let executable = self.executable.serialize().ok()?;
        let artifact = pb::XlaArtifact {
            module: self.module.clone(),
            plugin: self.backend.identity().to_string(),
            executable,
        };
        let mut out = ARTIFACT_MAGIC.to_vec();
        out.extend(prost::Message::encode_to_vec(&artifact));
        Some(out)
    }

    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()> {
        type PerDevice<T> = SmallVec<[T; 2]>;
        let devices = self.executable.devices().len();
        let inputs = ctx.inputs();
        if inputs.len() != self.num_inputs * devices {
            return Err(Error::internal(format!(
                "{} input shards for {} inputs on {devices} devices",
                inputs.len(),
                self.num_inputs
            )));
        }
        // Input i's shard on device p is at i * devices + p.
        let storages = inputs
            .iter()
            .map(Buffer::storage)
            .collect::<Result<SmallVec<[_; 8]>>>()?;
        let mut plugin_buffers: SmallVec<[&pjrt::Buffer; 8]> = SmallVec::new();
        for (i, (s, input)) in storages.iter().zip(inputs).enumerate() {
            // The module's arguments are in their devices' default memory
            // (memory kinds of arguments are not read from it): a buffer in
            // another memory is refused here, not handed to the plugin.
            let memory = input.memory_space();
            if memory != input.device().default_memory_space() {
                return Err(Error::invalid_argument(format!(
                    "input shard {i} is in {} memory; XLA programs take arrays in their devices' \
                     default memory ({}): copy it there first",
                    memory.kind().name(),
                    input.device().default_memory_space().kind().name()
                )));
            }
            match &**s {
                Storage::Device(d) if d.is_of(&self.backend) => plugin_buffers.push(&d.buffer),
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "input shard {i} is not on the program's PJRT devices"
                    )))
                }
            }
        }
        // The executable's k-th argument list is the shards of the program's
        // device `order[k]`.
        let arguments: PerDevice<SmallVec<[&pjrt::Buffer; 8]>> = self
            .order
            .iter()
            .map(|&p| {
                (0..self.num_inputs)
                    .map(|i| plugin_buffers[i * devices + p])
                    .collect()
            })
            .collect();
        let (outputs, events) = self.executable.execute(&arguments).map_err(to_error)?;
        drop(arguments);
        // The plugin's k-th event completes device `order[k]`'s outputs.
        let mut done_on: PerDevice<Made> = (0..devices).map(|_| Made::Unknown).collect();
        for (event, &p) in events.into_iter().zip(&self.order) {
            let Some(event) = event else {
                continue; // none: the outputs' own readiness (below)
            };
            done_on[p] = match event.is_ready() {
                // Done already: its error, if any, now.
                Ok(true) => {
                    event.wait().map_err(to_error)?;
                    Made::Done
                }
                _ => Made::When(event),
            };
        }
        // Output o's shard on the program's device p is shard o * devices + p.
        let shards = ctx.output_shards();
        for (device_outputs, &p) in outputs.into_iter().zip(&self.order) {
            for (o, buffer) in device_outputs.into_iter().enumerate() {
                let index = o * devices + p;
                let shard = shards.get(index).ok_or_else(|| {
                    Error::internal(format!("no output shard {index} for the plugin's buffer"))
                })?;
                // What the runtime reads of it follows the shard's spec.
                if buffer.dims() != shard.dims.as_slice()
                    || crate::backend::pjrt::dtype_of(buffer.element_type()) != shard.dtype
                {
                    return Err(Error::internal(format!(
                        "the plugin made output shard {index} {:?}{:?}, not {}{:?}",
                        buffer.element_type(),
                        buffer.dims(),
                        shard.dtype.name(),
                        shard.dims
                    )));
                }
                // Without the device's event, the buffer's own says when it is made.
                let own = match done_on[p] {
                    Made::Done | Made::When(..) => None,
                    Made::Unknown => match buffer.ready_event() {
                        Ok(e) if !matches!(e.is_ready(), Ok(true)) => Some(e),
                        Ok(e) => {
                            e.wait().map_err(to_error)?;
                            None
                        }
                        Err(e) if e.code() == pjrt::Code::Unimplemented => None,
                        Err(e) => return Err(to_error(e)),
                    },
                };
                // The plugin's callbacks hold events only: never the last
                // reference to a buffer, whose client could then be
                // destroyed on the plugin's own thread.
                let made = own.map(|event| {
                    let made = crate::future::Event::new();
                    let set = made.clone();
                    event.on_ready(move |r| set.set_if_pending(r.map_err(to_error)));
                    made
                });
                // The data are the plugin's, placed in the output itself.
                let data = Arc::new(Storage::Device(DeviceData::new(buffer, &self.backend)));
                ctx.place_output(index, data, made)?;
            }
        }
        for made in done_on {
            match made {
                // Without outputs, the execution's status is the event's.
                Made::When(event) if shards.is_empty() => event.wait().map_err(to_error)?,
                Made::When(event) => {
                    let made = crate::future::Event::new();
                    let set = made.clone();
                    event.on_ready(move |r| set.set_if_pending(r.map_err(to_error)));
                    ctx.placed_made_when(made);
                }
                Made::Done | Made::Unknown => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(plugin: &str) -> Vec<u8> {
        let mut out = ARTIFACT_MAGIC.to_vec();
        out.extend(prost::Message::encode_to_vec(&pb::XlaArtifact {
            module: b"module".to_vec(),
            plugin: plugin.to_string(),
            executable: vec![1, 2, 3],
        }));
        out
    }

    #[test]
    fn an_artifact_loads_only_on_the_plugin_that_made_it() {
        let here = "cpu plugin 0.11.2 (PJRT API 0.115, XLA 1)";
        let found = artifact_of(&artifact(here), here).unwrap().unwrap();
        assert_eq!(found.executable, vec![1, 2, 3]);
        let e = artifact_of(&artifact("cuda plugin 13 (PJRT API 0.120, XLA 2)"), here).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::InvalidArgument);
        assert!(
            e.message().contains("compiled by the cuda plugin 13"),
            "{e}"
        );
        assert!(e.message().contains(here), "{e}");
        let mut corrupted = artifact(here);
        corrupted.truncate(ARTIFACT_MAGIC.len() + 3);
        let e = artifact_of(&corrupted, here).unwrap_err();
        assert!(e.message().contains("corrupted"), "{e}");
        // A module's text is not an artifact.
        assert!(artifact_of(b"module @m {}", here).unwrap().is_none());
    }
}
