//! The `node` language: JavaScript functions that hosts run. A program's
//! payload is the function (its source, or a module and export name, as
//! JSON: JavaScript's own form of it, as cloudpickle is Python's; on the
//! process that made it, also a reference to the function or class in core's
//! registry of local values, see `kept.rs`); a host runs it on a JavaScript
//! thread (an event loop of this process) with its input arrays, and hands
//! core the arrays it returns.
//!
//! An executor thread that runs a `node` program hands a [`HostCall`] to the
//! JavaScript runner (`colocated.js`, through a threadsafe function) of the
//! thread the program belongs to (the one that defined its function or
//! class, a `worker_threads` thread too, as the registry's entry says; else
//! the main thread) and waits for its answer; the event loop never waits for
//! it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use colocated_core as core;
use napi::bindgen_prelude::{Buffer, ClassInstance, Function, Object, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Status};
use napi_derive::napi;

use crate::array::ColocatedArray;
use crate::client::Device;
use crate::kept::{forget, local_of, Forget, JsValue};
use crate::promise::settle;

/// The language tag of JavaScript programs.
pub const LANGUAGE: &str = core::LANGUAGE_NODE;

/// A JavaScript thread's runner: `colocated.js`'s `run(call)`, which runs a
/// host call on that thread's event loop and answers it.
type Runner = ThreadsafeFunction<HostCall, Unknown<'static>, HostCall, Status, false, true>;

/// The runners of this process's JavaScript threads, by `threadId` (the
/// main thread's is 0).
static RUNNERS: Mutex<Vec<(u32, Arc<Runner>)>> = Mutex::new(Vec::new());

/// Called once per JavaScript thread by `colocated.js`: the function that
/// runs host calls there. It does not keep the thread alive.
#[napi(js_name = "_setRunner")]
pub fn set_runner(run: Function<HostCall, Unknown<'static>>, thread: u32) -> napi::Result<()> {
    let tsfn = run
        .build_threadsafe_function::<HostCall>()
        .callee_handled::<false>()
        .weak::<true>()
        .build()?;
    let mut runners = RUNNERS.lock().unwrap_or_else(|e| e.into_inner());
    runners.retain(|(t, _)| *t != thread);
    runners.push((thread, Arc::new(tsfn)));
    Ok(())
}

/// The runner of thread `home`, else the main thread's, else any.
fn runner_for(home: u32) -> Option<(u32, Arc<Runner>)> {
    let runners = RUNNERS.lock().unwrap_or_else(|e| e.into_inner());
    [home, 0]
        .iter()
        .find_map(|want| runners.iter().find(|(t, _)| t == want))
        .or(runners.first())
        .cloned()
}

/// Forgets the runner of `thread` (its environment is gone).
fn drop_runner(thread: u32) {
    RUNNERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(t, _)| *t != thread);
}

/// What a host's run of a `node` program gets back: its output arrays and
/// the description of their tree.
type Answer = core::Result<(Vec<core::Array>, String)>;

/// What the JavaScript side sends the executor thread that waits for it.
enum Message {
    /// The call's answer (the last message).
    Answer(Answer),
    /// A call of the program's host callback `index`: the executor thread
    /// runs it and completes `done`, with the answer in `result`.
    HostCallback {
        index: usize,
        input: Vec<u8>,
        done: core::Event,
        result: Arc<Mutex<Option<Vec<u8>>>>,
    },
}

/// The error of user code (a function, a callback): its own code when it
/// threw a `ColocatedError`, else `internal`; its stack as the remote
/// traceback.
pub(crate) fn user_error(
    message: String,
    stack: Option<String>,
    code: Option<String>,
) -> core::Error {
    let code = code
        .and_then(|c| core::ErrorCode::from_name(&c))
        .unwrap_or(core::ErrorCode::Internal);
    let err = core::Error::new(code, message);
    match stack {
        Some(stack) => err.with_remote_traceback(stack),
        None => err,
    }
}

/// One run of a `node` program on this host, handed to the JavaScript runner,
/// which answers it once with `resolve` or `reject`.
#[napi]
pub struct HostCall {
    session: core::SessionKey,
    program: u64,
    /// The JavaScript thread it runs on.
    thread: u32,
    /// The id its thread keeps the program's own function or class under,
    /// when it runs by reference (see [`crate::kept`]).
    local: Option<i64>,
    payload: String,
    client: core::Client,
    inputs: Vec<core::Array>,
    devices: Vec<core::Device>,
    discovering: bool,
    /// The stream of the calls the function makes (core's nested stream).
    stream: core::Stream,
    answer: Mutex<Option<mpsc::Sender<Message>>>,
}

#[napi]
impl HostCall {
    /// The loaded program's id (the runner caches the function by it).
    #[napi(getter)]
    pub fn program(&self) -> i64 {
        self.program as i64
    }

    /// The function: `{"source": …}` or `{"module": …, "export": …}`.
    #[napi(getter)]
    pub fn payload(&self) -> String {
        self.payload.clone()
    }

    /// The id this thread keeps the program's function (a method's class)
    /// under when this process made the program, which then runs it as it
    /// is; null for a program of another process.
    #[napi(getter)]
    pub fn local(&self) -> Option<i64> {
        self.local
    }

    /// This host's part of each argument.
    #[napi(getter)]
    pub fn inputs(&self) -> Vec<ColocatedArray> {
        self.inputs
            .iter()
            .map(|a| ColocatedArray {
                client: self.client.clone(),
                inner: a.clone(),
            })
            .collect()
    }

    /// The program's devices on this host (where outputs of a call without
    /// arguments go).
    #[napi(getter)]
    pub fn devices(&self) -> Vec<Device> {
        self.devices
            .iter()
            .map(|d| Device::of(&self.client, d))
            .collect()
    }

    /// The session the call runs for (`"0"`: this process's own client):
    /// what it keeps on this host is the session's.
    #[napi(getter)]
    pub fn session(&self) -> String {
        self.session.as_u64().to_string()
    }

    /// Object `id` of the call's session on this host, in core's store:
    /// `value`, the id this thread keeps it under, and `built`, true when
    /// this call made the entry (the runner builds the object now and keeps
    /// it under `value`, until core drops the entry: when the object's
    /// handle went or its session ended).
    #[napi]
    pub fn host_object(&self, id: String) -> napi::Result<HostObject> {
        let id: u64 = id
            .parse()
            .map_err(|_| napi::Error::from_reason(format!("bad object id {id:?}")))?;
        let made = std::cell::Cell::new(false);
        let thread = self.thread;
        let (Ok(value) | Err(value)) = core::host_object(self.session, id, || {
            made.set(true);
            Ok(Arc::new(JsValue::new(thread)) as core::HostValue)
        });
        let value: &(dyn std::any::Any + Send + Sync) = &*value;
        match value.downcast_ref::<JsValue>() {
            Some(token) if token.thread == thread => Ok(HostObject {
                value: token.js_id(),
                built: made.get(),
            }),
            Some(token) => Err(napi::Error::from_reason(format!(
                "object {id} lives on JavaScript thread {}, not on {thread}",
                token.thread
            ))),
            None => Err(napi::Error::from_reason(format!(
                "object {id} is another language's"
            ))),
        }
    }

    /// The stream of the calls the function makes while it runs (colocated
    /// functions, executables): core's stream for nested calls, never the
    /// one its program runs on, so that they never wait for that program.
    #[napi(getter)]
    pub fn stream(&self) -> crate::client::Stream {
        crate::client::Stream {
            inner: self.stream.clone(),
        }
    }

    /// True in the first call of an input spec, whose outputs are discovered.
    #[napi(getter)]
    pub fn discovering(&self) -> bool {
        self.discovering
    }

    /// Answers with the output arrays (the leaves of the result, in order)
    /// and the description of the result's tree.
    #[napi]
    pub fn resolve(&self, outputs: Vec<ClassInstance<ColocatedArray>>, structure: String) {
        let outputs = outputs.iter().map(|a| a.inner.clone()).collect();
        self.answer(Ok((outputs, structure)));
    }

    /// Answers with the error the function threw: its code when it is a
    /// `ColocatedError` (else `internal`, as user code that failed), and its
    /// stack, which reaches the caller as `remoteStack`.
    #[napi]
    pub fn reject(&self, message: String, stack: Option<String>, code: Option<String>) {
        self.answer(Err(user_error(message, stack, code)));
    }

    /// Calls host callback `index` of the program with `input` (through the
    /// executor thread that runs this call, which holds the program's
    /// callbacks); resolves with its answer.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn call_host<'e>(
        &self,
        env: &'e Env,
        index: u32,
        input: Buffer,
    ) -> napi::Result<Object<'e>> {
        let done = core::Event::new();
        let result = Arc::new(Mutex::new(None));
        let request = Message::HostCallback {
            index: index as usize,
            input: input.to_vec(),
            done: done.clone(),
            result: result.clone(),
        };
        let sent = self
            .answer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|sender| sender.send(request).is_ok())
            .unwrap_or(false);
        if !sent {
            let _ = done.set(Err(core::Error::failed_precondition(
                "a host callback was called after its program's call had answered",
            )));
        }
        settle(env, &done, move |_| {
            let bytes: Vec<u8> = result
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .unwrap_or_default();
            Ok(Buffer::from(bytes))
        })
    }
}

impl HostCall {
    fn answer(&self, answer: Answer) {
        let sender = self.answer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sender) = sender {
            // The executor thread may have given up (its run ended): nothing to do.
            let _ = sender.send(Message::Answer(answer));
        }
    }
}

/// Where a host call's object lives on its JavaScript thread (see
/// `HostCall.hostObject`).
#[napi(object)]
pub struct HostObject {
    pub value: i64,
    pub built: bool,
}

/// Runs `node` programs on this process's JavaScript thread.
pub struct NodeExecutor;

impl core::LanguageExecutor for NodeExecutor {
    fn load(&self, program: &core::Program) -> core::Result<Arc<dyn core::LoadedProgram>> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let payload = String::from_utf8(program.payload.clone()).map_err(|_| {
            core::Error::invalid_argument("a node program's payload is not UTF-8 text")
        })?;
        Ok(Arc::new(NodeProgram {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            local: local_of(&payload),
            payload,
        }))
    }
}

struct NodeProgram {
    id: u64,
    /// The function or class of this process the program runs by reference
    /// (kept registered while the program is loaded): it runs on the
    /// JavaScript thread that made it, which may be the only one that can.
    /// Other programs run on the main thread.
    local: Option<core::LocalValue>,
    payload: String,
}

impl NodeProgram {
    /// The token of its own function or class, when it runs by reference.
    fn token(&self) -> Option<&JsValue> {
        self.local.as_ref()?.downcast_ref::<JsValue>()
    }
}

/// An unloaded program's function goes from the runners' caches.
impl Drop for NodeProgram {
    fn drop(&mut self) {
        forget(
            None,
            Forget {
                value: None,
                program: Some(self.id as i64),
            },
        );
    }
}

impl core::LoadedProgram for NodeProgram {
    fn run(&self, ctx: &mut core::ExecutionContext<'_>) -> core::Result<()> {
        let token = self.token();
        let (thread, runner) = runner_for(token.map_or(0, |t| t.thread)).ok_or_else(|| {
            core::Error::unimplemented(
                "this process runs no JavaScript: the colocated package was not loaded",
            )
        })?;
        let (sender, receiver) = mpsc::channel();
        let discovering = ctx.discovering();
        let call = HostCall {
            session: ctx.session(),
            program: self.id,
            thread,
            local: token.filter(|t| t.thread == thread).map(JsValue::js_id),
            payload: self.payload.clone(),
            client: ctx.client().clone(),
            inputs: ctx.host_input_arrays()?,
            devices: ctx.devices(),
            discovering,
            stream: ctx.nested_stream(),
            answer: Mutex::new(Some(sender)),
        };
        if runner.call(call, ThreadsafeFunctionCallMode::NonBlocking) != Status::Ok {
            drop_runner(thread);
            return Err(core::Error::unavailable(format!(
                "the JavaScript thread {thread} of this process is gone"
            )));
        }
        // An executor thread may wait; the event loop runs the function, and
        // the function's host callbacks run here (this thread holds them).
        loop {
            let message = receiver.recv().map_err(|_| {
                core::Error::cancelled("the JavaScript thread dropped the call without answering")
            })?;
            match message {
                Message::Answer(answer) => {
                    let (outputs, structure) = answer?;
                    // Core checks it against the program's (see `same_structure`).
                    return ctx.set_host_outputs(outputs, Some(structure.into_bytes()));
                }
                Message::HostCallback {
                    index,
                    input,
                    done,
                    result,
                } => {
                    let status = ctx.call_host_callback(index, &input).map(|bytes| {
                        *result.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
                    });
                    let _ = done.set(status);
                }
            }
        }
    }

    fn same_structure(&self, a: &[u8], b: &[u8]) -> bool {
        same_skeleton(a, b)
    }
}

/// Whether two result skeletons (JSON) are one structure whatever the order
/// of an object's keys (core's rule: a dict's keys are sorted; the leaves
/// come in sorted key order on every host).
pub(crate) fn same_skeleton(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    let parse = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).ok();
    match (parse(a), parse(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}
