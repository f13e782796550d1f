//! The controller's side of a colocated function: the call rules, the cache
//! of compiled programs per input spec, declared outputs, and discovery.

use std::sync::Arc;

use prost::Message;

use super::discovery::{by_host, Outputs, Reports};
use super::objects::{compile_op, ColocatedObject};
use super::pb;
use super::spec::{CacheInfo, CallSpec, SpecCache};
use crate::array::Array;
use crate::client::Client;
use crate::compiler::CompileOptions;
use crate::device::Device;
use crate::dispatch::StreamSlot;
use crate::error::{Error, Result};
use crate::executable::{ExecuteOptions, Execution, LoadedExecutable};
use crate::executor::SessionKey;
use crate::future::Event;
use crate::host_callback::LoadedHostCallback;
use crate::languages::colocated::take_parked;
use crate::program::{Program, LANGUAGE_COLOCATED};

/// What a language ships to the hosts for one compiled program: the payload
/// its executor loads, and the host callbacks the program may call, by index.
#[derive(Clone, Debug, Default)]
pub struct Payload {
    /// The language's bytes (Python: a cloudpickled host callable).
    pub bytes: Vec<u8>,
    /// The host callbacks the payload calls.
    pub host_callbacks: Vec<LoadedHostCallback>,
}

/// What an SDK supplies for one call that has no compiled program yet.
pub trait CallSite {
    /// What the SDK keeps with each compiled program (e.g. its own form of
    /// the output tree, the caller's sharding objects of the outputs).
    type Entry: Send + Sync + 'static;

    /// The payload of the program for this call's input spec, running on
    /// `devices`. One payload serves a discovery run (see
    /// [`ExecutionContext::discovering`](crate::ExecutionContext::discovering))
    /// and the program compiled after it: the outputs' structure travels
    /// apart from it ([`Program::output_structure`]), and each host checks
    /// every run's result against it.
    fn payload(&self, devices: &[Device]) -> Result<Payload>;

    /// The outputs declared for this call (JAX's `out_specs_fn`), or `None`
    /// to discover them by running the function once.
    fn declared_outputs(&self) -> Result<Option<Outputs>>;

    /// What the SDK keeps with the program compiled for `outputs`.
    fn entry(&self, outputs: &Outputs) -> Result<Self::Entry>;

    /// Whether two hosts' output structures (from a discovery run) are the
    /// same: by default, the same bytes; a language whose encoding is not
    /// canonical (a dict's insertion order, say) compares them its own way.
    fn same_structure(&self, a: &[u8], b: &[u8]) -> bool {
        a == b
    }
}

/// A program compiled for one input spec.
pub struct Entry<E> {
    executable: LoadedExecutable,
    outputs: Outputs,
    devices: Vec<Device>,
    /// The SDK's part (see [`CallSite::Entry`]).
    pub data: E,
}

impl<E> Entry<E> {
    /// Runs the program with `inputs` on the calling thread's stream.
    pub fn execute(&self, inputs: &[Array]) -> Result<Execution> {
        self.executable.execute(inputs, &ExecuteOptions::default())
    }

    /// The program.
    pub fn executable(&self) -> &LoadedExecutable {
        &self.executable
    }

    /// The outputs it produces.
    pub fn outputs(&self) -> &Outputs {
        &self.outputs
    }

    /// The devices it runs on.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

/// The result of [`ColocatedFunction::call`].
pub struct Call<E> {
    /// The compiled program the call took (or the one its discovery made).
    pub entry: Arc<Entry<E>>,
    /// One array per output leaf, returned at once and ready later.
    pub outputs: Vec<Array>,
    /// The call's status; `None` when it already finished (a discovery run).
    pub status: Option<Event>,
}

/// A colocated function as every SDK's decorator shares it: its
/// specialization (`devices`, `in_specs`), the rules of its calls and its
/// cache of compiled programs per input spec.
///
/// A call with a cached program runs asynchronously. Otherwise, with outputs
/// the SDK declares ([`CallSite::declared_outputs`]), the program is compiled
/// and run asynchronously; without, the first call runs synchronously to
/// discover them: every host of the call runs the function once and parks
/// its outputs, reporting their structure and specs to the controller; the
/// controller derives the global specs, and a second program pops the parked
/// outputs as the call's result. A host's output with the sharding of one of
/// its inputs becomes an array with that input's global sharding; any other
/// output is the host's array on one host, and on several hosts (where each
/// made a block with the same layout over all its devices of the call) the
/// hosts' blocks stacked along the first mesh axis. Anything else needs
/// declared outputs.
pub struct ColocatedFunction<E> {
    name: String,
    language: String,
    devices: Option<Vec<Device>>,
    in_specs: Option<CallSpec>,
    cache: SpecCache<Arc<Entry<E>>>,
}

impl<E: Send + Sync + 'static> ColocatedFunction<E> {
    /// A function named `name` (for traces) whose programs are of
    /// `language`, specialized with `devices` (lets argument-less calls run)
    /// and/or `in_specs` (every call must match).
    pub fn new(
        name: impl Into<String>,
        language: impl Into<String>,
        devices: Option<Vec<Device>>,
        in_specs: Option<CallSpec>,
    ) -> Result<Self> {
        let language = language.into();
        if language == LANGUAGE_COLOCATED || language.is_empty() {
            return Err(Error::invalid_argument(format!(
                "a colocated function cannot be of language '{language}'"
            )));
        }
        if devices.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::invalid_argument(
                "a colocated function specialized with devices needs at least one",
            ));
        }
        Ok(ColocatedFunction {
            name: name.into(),
            language,
            devices,
            in_specs,
            cache: SpecCache::default(),
        })
    }

    /// The specialized devices.
    pub fn devices(&self) -> Option<&[Device]> {
        self.devices.as_deref()
    }

    /// Applies the call rules to `spec` (one device set; the specialized
    /// devices, which argument-less calls need; the specialized in_specs) and
    /// returns the call's devices.
    pub fn check(&self, spec: &CallSpec) -> Result<Vec<Device>> {
        let devices = spec.devices(self.devices.as_deref())?;
        if let Some(expected) = &self.in_specs {
            spec.check_matches(expected)?;
        }
        Ok(devices)
    }

    /// The fast path: the rules, then the compiled program for `spec` if
    /// there is one (counting a hit; a miss is left to [`call`](Self::call),
    /// which counts it).
    pub fn cached(&self, spec: &CallSpec) -> Result<Option<Arc<Entry<E>>>> {
        self.check(spec)?;
        Ok(self.cache.get_hit(spec))
    }

    /// The call if a program is compiled for `spec` (counting a hit): run at
    /// once on the calling thread's stream, never blocking, with `objects`
    /// told as [`call`](Self::call) tells them. `None` on a miss, which is
    /// left uncounted for the [`call`](Self::call) the SDK makes next.
    pub fn call_cached(
        &self,
        client: &Client,
        spec: &CallSpec,
        inputs: &[Array],
        objects: &[&ColocatedObject],
    ) -> Result<Option<Call<E>>> {
        let devices = self.check(spec)?;
        let Some(entry) = self.cache.get_hit(spec) else {
            return Ok(None);
        };
        for object in objects {
            object.will_run(client, &devices);
        }
        let run = entry.execute(inputs)?;
        for object in objects {
            object.running(Some(&run.status));
        }
        Ok(Some(Call {
            entry,
            outputs: run.outputs,
            status: Some(run.status),
        }))
    }

    /// Calls the function with `inputs` (whose specs, with the SDK's tree
    /// key, are `spec`) on the calling thread's stream; `client` compiles
    /// what the call lacks (the inputs' client, or the specialized devices').
    /// `objects`: the colocated objects the call uses (the one it is a
    /// method of, objects among its arguments), which learn the hosts it runs
    /// on and wait for it before they are destroyed. Blocks only for a
    /// discovery run.
    pub fn call<S: CallSite<Entry = E>>(
        &self,
        client: &Client,
        spec: &CallSpec,
        inputs: &[Array],
        site: &S,
        objects: &[&ColocatedObject],
    ) -> Result<Call<E>> {
        let devices = self.check(spec)?;
        for object in objects {
            // Before it runs: a call that fails after building the object on a
            // host must still be able to destroy it there.
            object.will_run(client, &devices);
        }
        let call = match self.cache.get(spec) {
            Some(entry) => {
                let run = entry.execute(inputs)?;
                Call {
                    entry,
                    outputs: run.outputs,
                    status: Some(run.status),
                }
            }
            None => match site.declared_outputs()? {
                Some(outputs) => {
                    let entry = self.compile(client, spec, devices, site, outputs, None)?;
                    let run = entry.execute(inputs)?;
                    Call {
                        entry,
                        outputs: run.outputs,
                        status: Some(run.status),
                    }
                }
                None => self.discover(client, spec, inputs, devices, site)?,
            },
        };
        for object in objects {
            object.running(call.status.as_ref());
        }
        Ok(call)
    }

    /// [`call`](Self::call) in `slot`, a place held earlier in a stream's
    /// program order (see [`StreamSlot`]), from any thread: the call's
    /// executions run at that place, after the work queued before it, and
    /// the slot's stream goes on once the call completed (or at once when it
    /// fails here). Returns once the call is compiled, without waiting for
    /// its place: its outputs are ready once it ran. A call that discovers
    /// its outputs (see [`discovers`](Self::discovers)) blocks until its
    /// place is reached and the function ran there.
    pub fn call_at<S: CallSite<Entry = E>>(
        &self,
        slot: StreamSlot,
        client: &Client,
        spec: &CallSpec,
        inputs: &[Array],
        site: &S,
        objects: &[&ColocatedObject],
    ) -> Result<Call<E>> {
        let called = slot.run_in(|| self.call(client, spec, inputs, site, objects));
        if let Ok(Call {
            status: Some(status),
            ..
        }) = &called
        {
            slot.release_after(status);
        }
        called
    }

    /// Whether a call of `spec` would discover its outputs (no program is
    /// compiled for it, and `site` declares none): it then runs the function
    /// before it returns, in its place in its stream. An asynchronous SDK
    /// waits for that place (see [`StreamSlot::reached`]) before it gives
    /// such a call a thread; any other call returns without waiting.
    pub fn discovers<S: CallSite<Entry = E>>(&self, spec: &CallSpec, site: &S) -> Result<bool> {
        Ok(!self.cache.contains(spec) && site.declared_outputs()?.is_none())
    }

    /// Compiles the program for input spec `spec` ahead of any call (or
    /// returns the one a call compiled), with the outputs `site` declares:
    /// what a caller serializes to load elsewhere (another process, another
    /// SDK's client of the same hosts). Its calls then take the cache.
    /// `invalid_argument` under the call rules, and when `site` declares no
    /// outputs (discovering them means running the function).
    pub fn compile_ahead<S: CallSite<Entry = E>>(
        &self,
        client: &Client,
        spec: &CallSpec,
        site: &S,
    ) -> Result<Arc<Entry<E>>> {
        let devices = self.check(spec)?;
        if let Some(entry) = self.cache.get(spec) {
            return Ok(entry);
        }
        let outputs = site.declared_outputs()?.ok_or_else(|| {
            Error::invalid_argument(format!(
                "compiling {} ahead of a call needs its output specs declared \
                 (out_specs_fn): discovering them runs the function",
                self.name
            ))
        })?;
        self.compile(client, spec, devices, site, outputs, None)
    }

    fn compile<S: CallSite<Entry = E>>(
        &self,
        client: &Client,
        spec: &CallSpec,
        devices: Vec<Device>,
        site: &S,
        outputs: Outputs,
        payload: Option<Payload>,
    ) -> Result<Arc<Entry<E>>> {
        for s in &outputs.specs {
            if !crate::sharding::same_device_set(s.sharding.devices(), &devices) {
                return Err(Error::invalid_argument(format!(
                    "an output spec is on devices {:?} but the call runs on {:?} (outputs must use the inputs' devices)",
                    s.sharding.devices().iter().map(Device::id).collect::<Vec<_>>(),
                    devices.iter().map(Device::id).collect::<Vec<_>>()
                )));
            }
        }
        let payload = match payload {
            Some(payload) => payload,
            None => site.payload(&devices)?,
        };
        let program = Program {
            name: self.name.clone(),
            language: self.language.clone(),
            payload: payload.bytes,
            input_specs: spec.leaves.clone(),
            output_specs: outputs.specs.clone(),
            devices: devices.clone(),
            output_structure: outputs.structure.clone(),
        };
        let executable = client.compile(
            program,
            CompileOptions {
                host_callbacks: payload.host_callbacks,
            },
        )?;
        let entry = Arc::new(Entry {
            data: site.entry(&outputs)?,
            executable,
            outputs,
            devices,
        });
        self.cache.insert(spec, entry.clone());
        Ok(entry)
    }

    fn discover<S: CallSite<Entry = E>>(
        &self,
        client: &Client,
        spec: &CallSpec,
        inputs: &[Array],
        devices: Vec<Device>,
        site: &S,
    ) -> Result<Call<E>> {
        let key = super::random_key();
        let reports = Reports::default();
        // The program compiled once the outputs are known runs this payload
        // too (the language makes it once).
        let payload = site.payload(&devices)?;
        let mut callbacks = payload.host_callbacks.clone();
        let report_callback = callbacks.len() as u32;
        callbacks.push(reports.callback());
        let probe = Program {
            name: self.name.clone(),
            language: LANGUAGE_COLOCATED.to_string(),
            payload: pb::Op {
                op: Some(pb::op::Op::Discover(pb::Discover {
                    key,
                    language: self.language.clone(),
                    payload: payload.bytes.clone(),
                    report_callback,
                })),
            }
            .encode_to_vec(),
            input_specs: spec.leaves.clone(),
            output_specs: Vec::new(),
            devices: devices.clone(),
            output_structure: Vec::new(),
        };
        let probe = client.compile(
            probe,
            CompileOptions {
                host_callbacks: callbacks,
            },
        )?;
        let same = |a: &[u8], b: &[u8]| site.same_structure(a, b);
        let all_local = devices.iter().all(|d| !client.is_remote(d.host_index()));
        let popped = (|| {
            probe
                .execute(inputs, &ExecuteOptions::default())?
                .status
                .wait()?;
            let outputs = reports.outputs(spec, &devices, &same)?;
            if all_local {
                // The controller's own host parked them: its arrays as they
                // are (their memory, their buffers), no program to pop them.
                let arrays = take_parked(SessionKey::LOCAL, key).ok_or_else(|| {
                    Error::internal("the discovery run parked nothing on the local host")
                })?;
                return Ok::<_, Error>((outputs, arrays));
            }
            let pop = Program {
                name: format!("{} (results)", self.name),
                language: LANGUAGE_COLOCATED.to_string(),
                payload: pb::Op {
                    op: Some(pb::op::Op::Pop(key)),
                }
                .encode_to_vec(),
                input_specs: Vec::new(),
                output_specs: outputs.specs.clone(),
                devices: devices.clone(),
                output_structure: Vec::new(),
            };
            let run = client
                .compile(pop, CompileOptions::default())?
                .execute(&[], &ExecuteOptions::default())?;
            run.status.wait()?;
            Ok::<_, Error>((outputs, run.outputs))
        })();
        let (outputs, arrays) = match popped {
            Ok(popped) => popped,
            Err(e) => {
                // Hosts where the probe ran keep its outputs until told
                // otherwise: each host on its own (a lost worker has freed
                // everything already and must not keep the others' parked).
                for host in by_host(&devices) {
                    if !client.is_remote(host[0].host_index()) {
                        drop(take_parked(SessionKey::LOCAL, key));
                        continue;
                    }
                    let dropped = compile_op(
                        client,
                        "drop discovery results",
                        pb::op::Op::Drop(key),
                        host,
                    )
                    .and_then(|drop| drop.execute(&[], &ExecuteOptions::default()))
                    .and_then(|run| run.status.wait());
                    if let Err(d) = dropped {
                        tracing::debug!("cannot drop a failed discovery run's results: {d}");
                    }
                }
                return Err(e);
            }
        };
        let entry = self.compile(client, spec, devices, site, outputs, Some(payload))?;
        Ok(Call {
            entry,
            outputs: arrays,
            status: None,
        })
    }

    /// Hits, misses and size of the cache of compiled programs.
    pub fn cache_info(&self) -> CacheInfo {
        self.cache.info()
    }

    /// Drops every compiled program (later calls compile, or discover, again).
    pub fn clear(&self) {
        self.cache.clear();
    }
}
