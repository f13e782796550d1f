//! The compiler: validates a program against the client's hosts and resolves it
//! into a loaded executable; also loads serialized executables.

use std::sync::Arc;

use crate::client::Client;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::executable::{
    start_remote, ExecutableInner, HostPlan, HostRun, HostSpecs, LoadTask, LoadedExecutable,
    LocalRun, Started, WorkerRun,
};
use crate::executor::{OutputShard, SessionScope};
use crate::format::{self, pb};
use crate::host_callback::LoadedHostCallback;
use crate::program::{Program, LANGUAGE_COLOCATED};
use crate::remote::{local_spec, RemoteExecutable};
use crate::sharding::{same_device_set, Sharding};
use crate::spec::ArraySpec;

/// Options of [`Client::compile`] and [`Client::deserialize_and_load`].
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    /// Host callbacks the program may call, by index. The executable keeps them
    /// alive.
    pub host_callbacks: Vec<LoadedHostCallback>,
}

impl Client {
    /// Compiles `program` for this client's hosts.
    ///
    /// Errors (`invalid_argument` unless noted): no devices; a device of another
    /// client; a spec whose sharding uses other devices than the program; a shape
    /// that does not split evenly; a language some host lacks (`unimplemented`); a
    /// native function some host does not know (`not_found`).
    pub fn compile(&self, program: Program, options: CompileOptions) -> Result<LoadedExecutable> {
        self.compile_in(program, options, None)
    }

    /// Compiles a StableHLO module (MLIR text, as `jax.jit(f).lower(...)
    /// .as_text()` gives) for `devices`, which must be devices of one host's
    /// PJRT plugin: one device for a module without partitions, as many as
    /// its `mhlo.num_partitions` for an SPMD module. The executable takes and
    /// gives arrays with the shapes, dtypes and shardings of the module's
    /// `@main` (an argument or result without `sdy.sharding` is replicated).
    ///
    /// Errors: `invalid_argument` for a module the compiler refuses (with its
    /// message), devices that are not one plugin's on one host, or a device
    /// count the module does not take; `unimplemented` for what a per-host
    /// program cannot be (replicas, cross-host devices) or this runtime does
    /// not read (bytecode, dynamic shapes, complex types).
    pub fn compile_stablehlo(&self, module: &[u8], devices: &[Device]) -> Result<LoadedExecutable> {
        let program = crate::languages::xla::xla_program(module, devices)?;
        self.compile(program, CompileOptions::default())
    }

    /// [`compile`](Self::compile) for the worker session `session` (`None`:
    /// the process's own): its programs run for that session.
    fn compile_in(
        &self,
        program: Program,
        options: CompileOptions,
        session: Option<Arc<SessionScope>>,
    ) -> Result<LoadedExecutable> {
        let _span =
            tracing::debug_span!("compile", program = %program.name, language = %program.language)
                .entered();
        if program.devices.is_empty() {
            return Err(Error::invalid_argument(
                "a program needs at least one device",
            ));
        }
        for d in &program.devices {
            self.check_device(d)?;
        }
        for (i, d) in program.devices.iter().enumerate() {
            if program.devices[..i].contains(d) {
                return Err(Error::invalid_argument(format!(
                    "{d} appears twice in the program's devices"
                )));
            }
        }
        let check_specs = |kind: &str, specs: &[ArraySpec]| -> Result<()> {
            for (i, spec) in specs.iter().enumerate() {
                spec.sharding
                    .shard_shape(&spec.shape)
                    .map_err(|e| e.context(format!("{kind} {i}")))?;
                if !same_device_set(spec.sharding.devices(), &program.devices) {
                    return Err(Error::invalid_argument(format!(
                        "{kind} {i} is sharded over devices {:?} but the program runs on {:?}; inputs and outputs must use the program's device set",
                        ids(spec.sharding.devices()),
                        ids(&program.devices)
                    )));
                }
            }
            Ok(())
        };
        check_specs("input", &program.input_specs)?;
        check_specs("output", &program.output_specs)?;

        let mut host_indices: Vec<usize> = Vec::new();
        for d in &program.devices {
            if !host_indices.contains(&d.host_index()) {
                host_indices.push(d.host_index());
            }
        }
        // Workers load their parts at once (a round trip each, not one after
        // another).
        let remote_plans = load_on_workers(self, &host_indices, &program, &options);
        let mut remote_plans = remote_plans.into_iter();
        let mut hosts = Vec::with_capacity(host_indices.len());
        for &h in &host_indices {
            let host = &self.hosts()[h];
            if self.is_remote(h) {
                let plan = remote_plans.next().unwrap_or_else(|| {
                    Err(Error::internal(format!("no plan for worker host {h}")))
                });
                hosts.push(plan?);
                continue;
            }
            let executors = languages(self, &program.language);
            let loaded = if program.language == LANGUAGE_COLOCATED {
                crate::languages::colocated::load(&program, executors)?
            } else {
                let executor = executors.get(&program.language).ok_or_else(|| {
                    Error::unimplemented(format!(
                        "host {} cannot run '{}' programs (it runs {:?})",
                        host.name(),
                        program.language,
                        executors.languages()
                    ))
                })?;
                executor.load(&program)?
            };
            hosts.push(plan_host(self, h, Box::new(LocalRun(loaded)), &program)?);
        }
        let fingerprint = format::fingerprint(&format::encode(
            &program.to_proto(options.host_callbacks.len()),
        ));
        let one_host_dims = crate::executable::one_host_dims(&hosts, &program);
        Ok(LoadedExecutable(Arc::new(ExecutableInner {
            client: self.clone(),
            program,
            mixed: crate::executable::mixed(&hosts),
            one_host_dims,
            hosts,
            callbacks: options.host_callbacks,
            fingerprint,
            session,
        })))
    }

    /// Loads bytes from [`LoadedExecutable::serialize`]. Fails with
    /// `invalid_argument` (and the precise reason) if they are truncated,
    /// corrupted, of an unsupported format version, with non-zero reserved header
    /// bytes, name devices this client lacks,
    /// or expect another number of host callbacks than `options` gives.
    pub fn deserialize_and_load(
        &self,
        bytes: &[u8],
        options: CompileOptions,
    ) -> Result<LoadedExecutable> {
        self.load_decoded(format::decode(bytes)?, options, None)
    }

    /// [`deserialize_and_load`](Self::deserialize_and_load) of a decoded
    /// executable, loaded for the worker session `session` (`None`: the
    /// process's own).
    pub(crate) fn load_decoded(
        &self,
        exe: pb::Executable,
        options: CompileOptions,
        session: Option<Arc<SessionScope>>,
    ) -> Result<LoadedExecutable> {
        if exe.num_host_callbacks as usize != options.host_callbacks.len() {
            return Err(Error::invalid_argument(format!(
                "the executable was compiled with {} host callbacks but {} were given",
                exe.num_host_callbacks,
                options.host_callbacks.len()
            )));
        }
        let devices = self.devices_by_id(&exe.device_ids)?;
        let specs = |specs: &[pb::ArraySpec]| -> Result<Vec<ArraySpec>> {
            specs.iter().map(|s| self.spec_from_proto(s)).collect()
        };
        let program = Program {
            name: exe.name.clone(),
            language: exe.language.clone(),
            payload: exe.payload.clone(),
            input_specs: specs(&exe.input_specs)?,
            output_specs: specs(&exe.output_specs)?,
            devices,
            output_structure: exe.output_structure.clone(),
        };
        self.compile_in(program, options, session)
    }

    fn devices_by_id(&self, ids: &[u32]) -> Result<Vec<Device>> {
        ids.iter()
            .map(|id| {
                self.lookup_device(*id)
                    .map_err(|e| Error::invalid_argument(e.message()))
            })
            .collect()
    }

    pub(crate) fn spec_from_proto(&self, spec: &pb::ArraySpec) -> Result<ArraySpec> {
        let s = spec
            .sharding
            .as_ref()
            .ok_or_else(|| Error::invalid_argument("an array spec has no sharding"))?;
        let mesh_shape = s
            .mesh_shape
            .iter()
            .map(|n| {
                usize::try_from(*n).map_err(|_| Error::invalid_argument("mesh dimension overflows"))
            })
            .collect::<Result<Vec<_>>>()?;
        let partition = s
            .partition
            .iter()
            .map(|p| p.mesh_axes.iter().map(|a| *a as usize).collect())
            .collect();
        let sharding = Sharding::from_wire(
            self.devices_by_id(&s.device_ids)?,
            mesh_shape,
            s.axis_names.clone(),
            &s.axis_types,
            s.mesh,
            partition,
            s.memory_kind,
        )?;
        ArraySpec::new(spec.shape.clone(), DType::from_u32(spec.dtype)?, sharding)
    }
}

fn ids(devices: &[Device]) -> Vec<u32> {
    devices.iter().map(Device::id).collect()
}

/// The plans of the worker hosts among `hosts` (in their order): every load
/// request goes out first ([`start_remote`]), then the answers are awaited
/// together ([`finish_remote`]), so compiling for N workers costs about one
/// round trip, not N.
fn load_on_workers(
    client: &Client,
    hosts: &[usize],
    program: &Program,
    options: &CompileOptions,
) -> Vec<Result<HostPlan>> {
    let mut started: Vec<Result<Started>> = hosts
        .iter()
        .filter_map(|&h| {
            client
                .remote(h)
                .map(|r| start_remote(h, &r, program, &options.host_callbacks))
        })
        .collect();
    if started.is_empty() {
        // No worker: nothing may start the network runtime.
        return Vec::new();
    }
    let loads: Vec<Option<LoadTask>> = started
        .iter_mut()
        .map(|s| s.as_mut().ok().and_then(|s| s.load.take()))
        .collect();
    let answers = crate::session::wait_all(loads);
    started
        .into_iter()
        .zip(answers)
        .map(|(started, loaded)| {
            let started = started?;
            if let Err(err) = loaded {
                // Nothing was loaded there, but the host callbacks went in first.
                started.remote.session.forget_host_callbacks(started.handle);
                return Err(err);
            }
            finish_remote(started, program)
        })
        .collect()
}

/// The plan of a worker's part once the worker loaded it (unloaded again,
/// host callbacks and all, if no plan comes of it).
fn finish_remote(started: Started, program: &Program) -> Result<HostPlan> {
    let Started {
        host,
        remote,
        local,
        handle,
        ..
    } = started;
    let loaded = RemoteExecutable {
        host: remote,
        handle,
    };
    let mut output_shards = Vec::new();
    for (o, (spec, positions)) in program
        .output_specs
        .iter()
        .zip(&local.output_positions)
        .enumerate()
    {
        let dims = spec.sharding.shard_shape(&spec.shape)?;
        for &p in positions {
            output_shards.push(OutputShard::of(
                o,
                spec.dtype,
                dims.clone(),
                &spec.sharding,
                p,
            )?);
        }
    }
    Ok(HostPlan {
        host,
        run: Box::new(WorkerRun::new(loaded, host)),
        input_counts: local.input_positions.iter().map(Vec::len).collect(),
        input_positions: local.input_positions,
        output_positions: local.output_positions,
        output_shards,
        // The worker's program is host-local already.
        host_specs: None,
    })
}

/// Which shards of each input and output live on host `host` (of this
/// process), and the specs it sees when it lacks some.
fn plan_host(
    client: &Client,
    host: usize,
    run: Box<dyn HostRun>,
    program: &Program,
) -> Result<HostPlan> {
    let positions = |spec: &ArraySpec| -> Vec<usize> {
        spec.sharding
            .devices()
            .iter()
            .enumerate()
            .filter(|(_, d)| d.host_index() == host)
            .map(|(i, _)| i)
            .collect()
    };
    let input_positions: Vec<Vec<usize>> = program.input_specs.iter().map(positions).collect();
    let mut output_shards = Vec::new();
    let mut output_positions = Vec::new();
    for (o, spec) in program.output_specs.iter().enumerate() {
        let shard = spec.sharding.shard_shape(&spec.shape)?;
        let pos = positions(spec);
        for &p in &pos {
            output_shards.push(OutputShard::of(
                o,
                spec.dtype,
                shard.clone(),
                &spec.sharding,
                p,
            )?);
        }
        output_positions.push(pos);
    }
    let partial = program
        .input_specs
        .iter()
        .chain(&program.output_specs)
        .any(|s| s.sharding.devices().iter().any(|d| d.host_index() != host));
    let host_specs = if partial {
        let local = |specs: &[ArraySpec]| -> Result<Vec<ArraySpec>> {
            specs
                .iter()
                .map(|spec| {
                    let (local, _) = local_spec(spec, host, &|d| Ok(d.id()))?;
                    client.spec_from_proto(&local)
                })
                .collect()
        };
        // Shards that are not one block of the array have no host-local
        // spec: programs that need one (colocated Python) refuse to run then,
        // native programs take the shards as they are.
        match (local(&program.input_specs), local(&program.output_specs)) {
            (Ok(inputs), Ok(outputs)) => Some(Box::new(HostSpecs { inputs, outputs })),
            _ => None,
        }
    } else {
        None
    };
    Ok(HostPlan {
        host,
        run,
        input_counts: input_positions.iter().map(Vec::len).collect(),
        input_positions,
        output_positions,
        output_shards,
        host_specs,
    })
}

/// The local host's languages, with `xla` among them when `language` is
/// `xla` and the host has a PJRT plugin's devices (the built-in language of
/// such hosts, registered on first use).
fn languages<'a>(client: &'a Client, language: &str) -> &'a crate::executor::Languages {
    let executors = crate::executor::Languages::of(client);
    if language == crate::program::LANGUAGE_XLA
        && executors.get(language).is_none()
        && client.devices().iter().any(|d| !d.is_host_cpu())
    {
        // Another thread may have registered it meanwhile: either is the same.
        let _ = executors.register(language, Arc::new(crate::languages::xla::XlaExecutor));
    }
    executors
}
