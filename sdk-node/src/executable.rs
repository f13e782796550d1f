//! Programs: compiled (loaded on every host they run on), executed in program
//! order, serialized and loaded again.

use colocated_core as core;
use napi::bindgen_prelude::{AsyncTask, Buffer, ClassInstance, Either, Object};
use napi::{Env, Task};
use napi_derive::napi;

use crate::array::ColocatedArray;
use crate::callback::HostCallback;
use crate::client::{Client, Device, Stream};
use crate::errors::{invalid, to_js, OrThrow};
use crate::promise::settle;
use crate::sharding::ShapeDtypeStruct;

/// What `compile` takes.
#[napi(object)]
pub struct ProgramOptions<'a> {
    /// A name for people and traces (default: a native function's name).
    pub name: Option<String>,
    /// The language tag: `'native'` (a function registered on every host),
    /// or a language an SDK made the payload for (`'python'`, `'node'`).
    pub language: String,
    /// For `native`: the function's name; else the language's payload.
    pub payload: Either<String, Buffer>,
    /// The inputs' specs, in argument order.
    pub in_specs: Vec<ClassInstance<'a, ShapeDtypeStruct>>,
    /// The outputs' specs, in result order.
    pub out_specs: Vec<ClassInstance<'a, ShapeDtypeStruct>>,
    /// The devices it runs on (default: those of its specs' shardings).
    pub devices: Option<Vec<ClassInstance<'a, Device>>>,
    /// Host callbacks the program may call, by index (`hostCallback(fn)`).
    pub host_callbacks: Option<Vec<ClassInstance<'a, HostCallback>>>,
}

/// Compiles a program for the hosts of its devices (loading it on their
/// workers) and resolves with the executable. Rejects with
/// `InvalidArgumentError` for specs that do not fit the devices,
/// `UnimplementedError` for a language a host lacks, `NotFoundError` for a
/// native function a host does not know.
#[napi(ts_return_type = "Promise<LoadedExecutable>")]
pub fn compile(env: Env, program: ProgramOptions) -> napi::Result<AsyncTask<Compile>> {
    let callbacks = program
        .host_callbacks
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| c.inner.clone())
        .collect();
    let (client, program) = to_program(program).js(&env)?;
    Ok(AsyncTask::new(Compile {
        client,
        callbacks,
        work: Some(Work::Compile(program)),
    }))
}

fn to_program(p: ProgramOptions) -> core::Result<(core::Client, core::Program)> {
    let specs = |list: &[ClassInstance<ShapeDtypeStruct>]| -> Vec<core::ArraySpec> {
        list.iter().map(|s| s.inner.clone()).collect()
    };
    let (input_specs, output_specs) = (specs(&p.in_specs), specs(&p.out_specs));
    let client = p
        .in_specs
        .iter()
        .chain(&p.out_specs)
        .map(|s| s.client.clone())
        .next()
        .or_else(|| {
            let devices = p.devices.as_ref()?;
            devices.first().map(|d| d.client.clone())
        })
        .ok_or_else(|| invalid("a program needs specs or devices"))?;
    let devices = match &p.devices {
        Some(devices) => devices.iter().map(|d| d.inner.clone()).collect(),
        None => {
            let first = input_specs
                .iter()
                .chain(&output_specs)
                .next()
                .ok_or_else(|| invalid("a program without specs needs devices"))?;
            first.sharding.devices().to_vec()
        }
    };
    let payload = match p.payload {
        Either::A(text) => text.into_bytes(),
        Either::B(bytes) => bytes.to_vec(),
    };
    let name = match (&p.name, p.language.as_str()) {
        (Some(name), _) => name.clone(),
        (None, core::LANGUAGE_NATIVE) => String::from_utf8_lossy(&payload).into_owned(),
        (None, language) => format!("{language} program"),
    };
    Ok((
        client,
        core::Program {
            name,
            language: p.language,
            payload,
            input_specs,
            output_specs,
            devices,
            output_structure: Vec::new(),
        },
    ))
}

enum Work {
    Compile(core::Program),
    Load(Vec<u8>),
    Stablehlo(Vec<u8>, Vec<core::Device>),
}

/// Compiling or loading, on libuv's thread pool (loading on workers waits
/// for them).
pub struct Compile {
    client: core::Client,
    callbacks: Vec<core::LoadedHostCallback>,
    work: Option<Work>,
}

impl Task for Compile {
    type Output = core::Result<core::LoadedExecutable>;
    type JsValue = LoadedExecutable;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let options = core::CompileOptions {
            host_callbacks: self.callbacks.clone(),
        };
        Ok(match self.work.take() {
            Some(Work::Compile(program)) => self.client.compile(program, options),
            Some(Work::Load(bytes)) => self.client.deserialize_and_load(&bytes, options),
            Some(Work::Stablehlo(module, devices)) => {
                self.client.compile_stablehlo(&module, &devices)
            }
            None => Err(core::Error::internal("a compile ran twice")),
        })
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<LoadedExecutable> {
        let inner = output.map_err(|e| to_js(&env, &e))?;
        Ok(LoadedExecutable {
            client: self.client.clone(),
            inner,
        })
    }
}

/// Compiles a StableHLO module (MLIR text, as JAX's
/// `jax.jit(f).lower(...).as_text()` gives) for `devices` of a PJRT plugin
/// (default: the default backend's first device; an SPMD module with
/// `mhlo.num_partitions = n` takes `n`) and resolves with the executable,
/// whose inputs and outputs are the module's `@main`'s. Rejects with
/// `InvalidArgumentError` for a module the compiler refuses (its message)
/// or devices that do not fit it, `UnimplementedError` for bytecode.
#[napi(ts_return_type = "Promise<LoadedExecutable>")]
pub fn compile_stablehlo(
    env: Env,
    module: Either<String, Buffer>,
    devices: Option<Vec<ClassInstance<Device>>>,
) -> napi::Result<AsyncTask<Compile>> {
    let module = match module {
        Either::A(text) => text.into_bytes(),
        Either::B(bytes) => bytes.to_vec(),
    };
    let (client, devices) = match devices.as_deref() {
        Some([first, ..]) => (
            first.client.clone(),
            devices.iter().flatten().map(|d| d.inner.clone()).collect(),
        ),
        Some([]) => return Err(to_js(&env, &invalid("compileStablehlo: devices is empty"))),
        None => {
            let client = crate::client::default_client().js(&env)?;
            let first = client.backend_devices(None).js(&env)?.swap_remove(0);
            (client, vec![first])
        }
    };
    Ok(AsyncTask::new(Compile {
        client,
        callbacks: Vec::new(),
        work: Some(Work::Stablehlo(module, devices)),
    }))
}

/// Loads bytes of `LoadedExecutable.serialize()` (from this SDK or another:
/// a Python program serialized by the Python SDK runs on Python workers) on
/// `client` (default: the default client).
#[napi(ts_return_type = "Promise<LoadedExecutable>")]
pub fn deserialize_and_load(
    env: Env,
    bytes: Buffer,
    client: Option<ClassInstance<Client>>,
) -> napi::Result<AsyncTask<Compile>> {
    let client = match client {
        Some(c) => c.inner.clone(),
        None => crate::client::default_client().js(&env)?,
    };
    Ok(AsyncTask::new(Compile {
        client,
        callbacks: Vec::new(),
        work: Some(Work::Load(bytes.to_vec())),
    }))
}

/// A compiled program, ready to run on its devices.
#[napi]
pub struct LoadedExecutable {
    client: core::Client,
    inner: core::LoadedExecutable,
}

/// What `execute` returns at once.
#[napi(object, object_from_js = false)]
pub struct Execution<'e> {
    /// One array per output spec, ready when the program has run.
    pub outputs: Vec<ColocatedArray>,
    /// Resolves when every host has run its part; rejects with the first
    /// failure.
    #[napi(ts_type = "Promise<void>")]
    pub done: Object<'e>,
}

#[napi]
impl LoadedExecutable {
    /// The program's name.
    #[napi(getter)]
    pub fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// Its devices.
    #[napi(getter)]
    pub fn devices(&self) -> Vec<Device> {
        let devices = self.inner.devices();
        devices
            .iter()
            .map(|d| Device::of(&self.client, d))
            .collect()
    }

    /// A stable fingerprint of the program.
    #[napi(getter)]
    pub fn fingerprint(&self) -> String {
        self.inner.fingerprint().to_string()
    }

    /// Runs the program once per host on `args` (arrays of the input
    /// specs), after the work this thread queued before it. Returns the
    /// outputs at once. Throws `InvalidArgumentError` for arguments that do
    /// not match the specs, `FailedPreconditionError` for a deleted one.
    #[napi]
    pub fn execute<'e>(
        &self,
        env: &'e Env,
        args: Vec<ClassInstance<ColocatedArray>>,
        stream: Option<ClassInstance<Stream>>,
    ) -> napi::Result<Execution<'e>> {
        let args: Vec<core::Array> = args.iter().map(|a| a.inner.clone()).collect();
        let options = core::ExecuteOptions {
            stream: stream.map(|s| s.inner.clone()),
        };
        // Never a plugin's whole program on the event loop.
        let run = core::as_event_loop(|| self.inner.execute(&args, &options)).js(env)?;
        let done = settle(env, &run.status, |_| Ok(()))?;
        let outputs = run
            .outputs
            .into_iter()
            .map(|inner| ColocatedArray {
                client: self.client.clone(),
                inner,
            })
            .collect();
        Ok(Execution { outputs, done })
    }

    /// The program as bytes, for `deserializeAndLoad`.
    #[napi]
    pub fn serialize(&self) -> Buffer {
        self.inner.serialize().into()
    }
}
