//! The controller's side of `colocated(fn)`: core's colocated function (call
//! rules, cache per input spec, discovery) over a call site that supplies the
//! function's payload and the outputs `outSpecsFn` declares. The JavaScript
//! side (`colocated.js`) flattens arguments and results. A call that compiles
//! or discovers holds its place in its stream (core's `StreamSlot`), so the
//! event loop's calls keep program order while it runs on libuv's pool.

use std::sync::Arc;

use colocated_core as core;
use napi::bindgen_prelude::{AsyncTask, ClassInstance, Null, Object, ToNapiValue, TypeName};
use napi::{sys, Env, JsValue, Task, ValueType};
use napi_derive::napi;

use crate::array::ColocatedArray;
use crate::callback::HostCallback;
use crate::client::{on_stream, Device, Stream};
use crate::errors::{invalid, to_js, OrThrow};
use crate::program::LANGUAGE;
use crate::promise::settle;
use crate::sharding::ShapeDtypeStruct;

/// What a compiled program keeps for the SDK: the description of its result
/// tree.
struct NodeEntry {
    structure: String,
}

/// The call site of one call: the payload, and the declared outputs.
struct Site {
    payload: Vec<u8>,
    declared: Option<(Vec<core::ArraySpec>, String)>,
    callbacks: Vec<core::LoadedHostCallback>,
}

impl core::CallSite for Site {
    type Entry = NodeEntry;

    fn payload(&self, _devices: &[core::Device]) -> core::Result<core::Payload> {
        Ok(core::Payload {
            bytes: self.payload.clone(),
            host_callbacks: self.callbacks.clone(),
        })
    }

    fn declared_outputs(&self) -> core::Result<Option<core::Outputs>> {
        Ok(self
            .declared
            .as_ref()
            .map(|(specs, structure)| core::Outputs {
                structure: structure.clone().into_bytes(),
                origins: vec![core::OutputOrigin::New; specs.len()],
                specs: specs.clone(),
            }))
    }

    fn entry(&self, outputs: &core::Outputs) -> core::Result<NodeEntry> {
        let structure = String::from_utf8(outputs.structure.clone())
            .map_err(|_| invalid("a host described its result with bytes that are not text"))?;
        Ok(NodeEntry { structure })
    }

    /// Two hosts' result skeletons (JSON) are one structure whatever the
    /// order of an object's keys.
    fn same_structure(&self, a: &[u8], b: &[u8]) -> bool {
        crate::program::same_skeleton(a, b)
    }
}

/// Controller-side state of a colocated JavaScript function (used by
/// `colocated.js`).
#[napi]
pub struct FunctionState {
    inner: Arc<core::ColocatedFunction<NodeEntry>>,
    devices_client: Option<core::Client>,
}

/// A call's result: the output leaves, the description of their tree, and
/// the call's completion (null when the call already ran: a discovery).
#[napi(object, object_from_js = false)]
pub struct CallResult<'e> {
    pub outputs: Vec<ColocatedArray>,
    pub structure: String,
    #[napi(ts_type = "Promise<void> | null")]
    pub done: Option<Object<'e>>,
}

/// The arguments every call must match: their structure (null for
/// positional specs, else its canonical text, as `callCached` takes it) and
/// specs.
#[napi(object, object_to_js = false)]
pub struct InSpecs<'a> {
    pub tree: Option<String>,
    pub specs: Vec<ClassInstance<'a, ShapeDtypeStruct>>,
}

/// What a call that may compile needs besides its arguments.
#[napi(object, object_to_js = false)]
pub struct CallOptions<'a> {
    /// The outputs `outSpecsFn` declares (else discovery).
    pub declared: Option<Declared<'a>>,
    /// The program's payload: the function and the arguments' structure.
    pub payload: String,
    /// The colocated objects the call uses.
    pub objects: Option<Vec<ClassInstance<'a, ObjectHandle>>>,
    /// The host callbacks the program may call, by index.
    pub callbacks: Option<Vec<ClassInstance<'a, HostCallback>>>,
    /// The stream the call queues on (default: the event loop's).
    pub stream: Option<ClassInstance<'a, Stream>>,
}

/// The outputs `outSpecsFn` declares: the leaves' specs and the tree.
#[napi(object, object_to_js = false)]
pub struct Declared<'a> {
    pub specs: Vec<ClassInstance<'a, ShapeDtypeStruct>>,
    pub structure: String,
}

#[napi]
impl FunctionState {
    /// `devices`: the specialized devices (let calls without arguments run);
    /// `in_specs`: the arguments every call must match (the key of their
    /// structure, and their leaves' specs).
    #[napi(constructor)]
    pub fn new(
        env: Env,
        name: String,
        devices: Option<Vec<ClassInstance<Device>>>,
        in_specs: Option<InSpecs>,
    ) -> napi::Result<Self> {
        let devices_client = devices
            .as_ref()
            .and_then(|d| d.first())
            .map(|d| d.client.clone());
        let devices = devices.map(|ds| ds.iter().map(|d| d.inner.clone()).collect());
        let in_specs = in_specs.map(|s| core::CallSpec {
            tree: tree_key(s.tree.as_deref(), s.specs.len()),
            leaves: s.specs.iter().map(|l| l.inner.clone()).collect(),
        });
        let inner = core::ColocatedFunction::new(name, LANGUAGE, devices, in_specs).js(&env)?;
        Ok(FunctionState {
            inner: Arc::new(inner),
            devices_client,
        })
    }

    /// The call if a program is compiled for its spec (`tree`: null for
    /// positional arrays, else the canonical text of the arguments'
    /// structure, which core keys): run at once, on this thread's stream. Null
    /// otherwise (then `call`). `objects`: the colocated objects the call uses.
    #[napi]
    pub fn call_cached<'e>(
        &self,
        env: &'e Env,
        tree: Option<String>,
        inputs: Vec<ClassInstance<ColocatedArray>>,
        objects: Option<Vec<ClassInstance<ObjectHandle>>>,
        stream: Option<ClassInstance<Stream>>,
    ) -> napi::Result<Option<CallResult<'e>>> {
        let (client, arrays) = self.arguments(&inputs).js(env)?;
        let spec = call_spec(tree.as_deref(), &arrays);
        let objects = live_objects(objects.as_deref()).js(env)?;
        let refs: Vec<&core::ColocatedObject> = objects.iter().map(|o| o.as_ref()).collect();
        let stream = stream.map(|s| Stream {
            inner: s.inner.clone(),
        });
        let called = on_stream(stream.as_ref(), || {
            self.inner.call_cached(&client, &spec, &arrays, &refs)
        });
        let Some(call) = called.js(env)? else {
            return Ok(None);
        };
        let done = match &call.status {
            Some(status) => Some(settle(env, status, |_| Ok(()))?),
            None => None,
        };
        Ok(Some(CallResult {
            outputs: wrap(&client, call.outputs),
            structure: call.entry.data.structure.clone(),
            done,
        }))
    }

    /// Any call: compiles a program for the declared outputs, or discovers
    /// them by running the function once on every host of the call. Holds
    /// the call's place in its stream now (what the event loop queues later
    /// runs after it) and keeps its arguments (deleting them meanwhile frees
    /// them after the call); `run()` it once `reached()`.
    #[napi]
    pub fn prepare(
        &self,
        env: Env,
        tree: Option<String>,
        inputs: Vec<ClassInstance<ColocatedArray>>,
        options: CallOptions,
    ) -> napi::Result<PendingCall> {
        let (client, arrays) = self.arguments(&inputs).js(&env)?;
        let objects = live_objects(options.objects.as_deref()).js(&env)?;
        let callbacks = options
            .callbacks
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|c| c.inner.clone())
            .collect();
        let declared = options.declared.map(|d| {
            let specs = d.specs.iter().map(|s| s.inner.clone()).collect();
            (specs, d.structure)
        });
        let stream = match &options.stream {
            Some(s) => s.inner.clone(),
            None => client.current_stream(),
        };
        let kept = core::Array::keep(&arrays).js(&env)?;
        let spec = call_spec(tree.as_deref(), &arrays);
        let site = Site {
            payload: options.payload.into_bytes(),
            declared,
            callbacks,
        };
        let discovers = self.inner.discovers(&spec, &site).js(&env)?;
        let slot = client.reserve(&stream).js(&env)?;
        let reached = slot.reached().clone();
        Ok(PendingCall {
            reached,
            discovers,
            call: std::sync::Mutex::new(Some(Call {
                function: self.inner.clone(),
                slot: Some(slot),
                kept,
                spec,
                inputs: arrays,
                site,
                client,
                objects,
            })),
        })
    }

    /// Hits, misses and size of the cache of compiled programs.
    #[napi]
    pub fn cache_info(&self) -> Vec<i64> {
        let info = self.inner.cache_info();
        vec![info.hits as i64, info.misses as i64, info.currsize as i64]
    }

    /// Drops every compiled program.
    #[napi]
    pub fn clear(&self) {
        self.inner.clear();
    }
}

impl FunctionState {
    /// The call's client (its arguments', else the specialized devices')
    /// and its arguments.
    fn arguments(
        &self,
        inputs: &[ClassInstance<ColocatedArray>],
    ) -> core::Result<(core::Client, Vec<core::Array>)> {
        let client = match (inputs.first(), &self.devices_client) {
            (Some(a), _) => a.client.clone(),
            (None, Some(c)) => c.clone(),
            (None, None) => {
                // Core's rule and error, as in every SDK (no devices to run
                // on), without making the default client to ask it.
                let no_inputs = core::CallSpec {
                    tree: core::flat_tree_key(0),
                    leaves: Vec::new(),
                };
                return Err(no_inputs.devices(None).err().unwrap_or_else(|| {
                    core::Error::internal("a call without inputs found devices")
                }));
            }
        };
        Ok((client, inputs.iter().map(|a| a.inner.clone()).collect()))
    }
}

/// The handle of a colocated object: dropping it (when JavaScript collects
/// it, or at `dispose()`) destroys the object on every host it ran on, after
/// the calls made on it.
#[napi]
pub struct ObjectHandle {
    inner: std::sync::Mutex<Option<Arc<core::ColocatedObject>>>,
    id: u64,
}

#[napi]
impl ObjectHandle {
    /// A new object (built on each host by its first call there).
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let object = core::ColocatedObject::new();
        ObjectHandle {
            id: object.id(),
            inner: std::sync::Mutex::new(Some(Arc::new(object))),
        }
    }

    /// The object's id (as hosts key it).
    #[napi(getter)]
    pub fn id(&self) -> String {
        self.id.to_string()
    }

    /// Destroys the object on every host now (after the calls made on it);
    /// later calls on it fail with `FailedPreconditionError`.
    #[napi]
    pub fn dispose(&self) {
        let taken = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(taken);
    }
}

/// The live objects of a call; `failed_precondition` for a disposed one.
fn live_objects(
    objects: Option<&[ClassInstance<ObjectHandle>]>,
) -> core::Result<Vec<Arc<core::ColocatedObject>>> {
    objects
        .unwrap_or_default()
        .iter()
        .map(|o| {
            let inner = o.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.clone().ok_or_else(|| {
                core::Error::failed_precondition(format!("object {} was disposed", o.id))
            })
        })
        .collect()
}

/// Core's key of a call's structure: `None` for `n` positional arrays,
/// else the canonical text of the arguments' skeleton (`colocated.js`'s
/// `flatten`, object keys sorted).
fn tree_key(tree: Option<&str>, n: usize) -> u64 {
    match tree {
        None => core::flat_tree_key(n),
        Some(canonical) => core::tree_key(canonical.as_bytes()),
    }
}

/// The spec of a call with `arrays` (see [`tree_key`]).
fn call_spec(tree: Option<&str>, arrays: &[core::Array]) -> core::CallSpec {
    core::CallSpec {
        tree: tree_key(tree, arrays.len()),
        leaves: arrays.iter().map(|a| a.spec().clone()).collect(),
    }
}

fn wrap(client: &core::Client, arrays: Vec<core::Array>) -> Vec<ColocatedArray> {
    arrays
        .into_iter()
        .map(|inner| ColocatedArray {
            client: client.clone(),
            inner,
        })
        .collect()
}

/// A call that may compile or discover, prepared on the event loop (its
/// place in the stream held, its arguments and objects kept) and run on
/// libuv's thread pool: at once, or, for a discovery, once its place is
/// reached.
#[napi]
pub struct PendingCall {
    reached: core::Event,
    discovers: bool,
    call: std::sync::Mutex<Option<Call>>,
}

#[napi]
impl PendingCall {
    /// Resolves once everything queued before the call on its stream ran.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn reached<'e>(&self, env: &'e Env) -> napi::Result<Object<'e>> {
        settle(env, &self.reached, |_| Ok(()))
    }

    /// True when the call discovers its outputs: `run()` then holds a thread
    /// of the pool until the function ran in the call's place, so it waits
    /// for `reached()` first. Any other call runs at once: it compiles and
    /// queues its execution in its place.
    #[napi(getter)]
    pub fn discovers(&self) -> bool {
        self.discovers
    }

    /// Runs the call (once) on libuv's thread pool.
    #[napi(ts_return_type = "Promise<CallResult>")]
    pub fn run(&self, env: Env) -> napi::Result<AsyncTask<Call>> {
        let call = self.call.lock().unwrap_or_else(|e| e.into_inner()).take();
        match call {
            Some(call) => Ok(AsyncTask::new(call)),
            None => Err(to_js(
                &env,
                &core::Error::failed_precondition("this call already ran"),
            )),
        }
    }
}

/// A call that may compile or discover (see [`PendingCall`]).
pub struct Call {
    function: Arc<core::ColocatedFunction<NodeEntry>>,
    objects: Vec<Arc<core::ColocatedObject>>,
    client: core::Client,
    /// Its place in the stream, released when the call completes.
    slot: Option<core::StreamSlot>,
    kept: core::Kept,
    spec: core::CallSpec,
    inputs: Vec<core::Array>,
    site: Site,
}

/// What the pool thread hands back: the call's outputs and tree, and its
/// completion when it still runs.
pub struct Called {
    client: core::Client,
    outputs: Vec<core::Array>,
    structure: String,
    status: Option<core::Event>,
}

impl Task for Call {
    type Output = core::Result<Called>;
    type JsValue = Called;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let (function, client, spec, inputs, site) = (
            &self.function,
            &self.client,
            &self.spec,
            &self.inputs,
            &self.site,
        );
        let Some(slot) = self.slot.take() else {
            return Ok(Err(core::Error::failed_precondition(
                "this call already ran",
            )));
        };
        let objects: Vec<&core::ColocatedObject> =
            self.objects.iter().map(|o| o.as_ref()).collect();
        let called = self
            .kept
            .use_in(|| function.call_at(slot, client, spec, inputs, site, &objects));
        Ok(called.map(|call| Called {
            client: client.clone(),
            outputs: call.outputs,
            structure: call.entry.data.structure.clone(),
            status: call.status,
        }))
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<Called> {
        output.map_err(|e| to_js(&env, &e))
    }
}

impl TypeName for Called {
    fn type_name() -> &'static str {
        "CallResult"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

/// A `CallResult` object, its `done` a Promise of the call's completion.
impl ToNapiValue for Called {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let env = Env::from_raw(env);
        let mut result = Object::new(&env)?;
        result.set("outputs", wrap(&val.client, val.outputs))?;
        result.set("structure", val.structure)?;
        match &val.status {
            Some(status) => result.set("done", settle(&env, status, |_| Ok(()))?)?,
            None => result.set("done", Null)?,
        }
        Ok(result.raw())
    }
}
