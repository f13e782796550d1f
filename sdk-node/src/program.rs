//! The `node` language: JavaScript functions that hosts run. A program's
//! payload is the function (its source, or a module and export name, as
//! JSON: JavaScript's own form of it, as cloudpickle is Python's); a host
//! runs it on a JavaScript thread (an event loop of this process) with its
//! input arrays, and hands core the arrays it returns.
//!
//! An executor thread that runs a `node` program hands a [`HostCall`] to the
//! JavaScript runner (`colocated.js`, through a threadsafe function) of the
//! thread the program belongs to (the one that defined its function, a
//! `worker_threads` thread too; else the main thread) and waits for its
//! answer; the event loop never waits for it.

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

/// The thread a program made by this process belongs to (its payload says
/// `pid` and `thread`): the one that defined the function, which may be
/// the only one that can run it. Others' programs run on the main thread.
fn home_thread(payload: &str) -> u32 {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(payload) else {
        return 0;
    };
    let ours =
        value.get("pid").and_then(serde_json::Value::as_u64) == Some(u64::from(std::process::id()));
    match value.get("thread").and_then(serde_json::Value::as_u64) {
        Some(thread) if ours => u32::try_from(thread).unwrap_or(0),
        _ => 0,
    }
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

    /// Marks object `id` of the call's session as kept on this host: when
    /// core destroys it (its handle went, or its session ended), the runner's
    /// forgetter hears of it.
    #[napi]
    pub fn hold_object(&self, id: String) -> napi::Result<()> {
        let id: u64 = id
            .parse()
            .map_err(|_| napi::Error::from_reason(format!("bad object id {id:?}")))?;
        let session = self.session;
        // Built once per session and id; the JavaScript object lives in the
        // runner's table, which this marker's drop clears.
        let _ = core::host_object(session, id, || {
            Ok(Arc::new(Kept { session, id }) as core::HostValue)
        });
        Ok(())
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

/// What the runner is told to forget: object `object` of `session`, every
/// object of a session that ended (`object` null), or (`program` set) the
/// function of a program that was unloaded.
#[napi(object)]
pub struct Forget {
    pub session: String,
    pub object: Option<String>,
    pub program: Option<i64>,
}

type Forgetter = ThreadsafeFunction<Forget, Unknown<'static>, Forget, Status, false, true>;

/// The forgetters of this process's JavaScript threads, by `threadId`.
static FORGETTERS: Mutex<Vec<(u32, Arc<Forgetter>)>> = Mutex::new(Vec::new());

/// Called once per JavaScript thread by `colocated.js`: the function that
/// drops objects of colocated classes from that thread's runner's table.
#[napi(js_name = "_setForgetter")]
pub fn set_forgetter(forget: Function<Forget, Unknown<'static>>, thread: u32) -> napi::Result<()> {
    let tsfn = forget
        .build_threadsafe_function::<Forget>()
        .callee_handled::<false>()
        .weak::<true>()
        .build()?;
    let mut forgetters = FORGETTERS.lock().unwrap_or_else(|e| e.into_inner());
    forgetters.retain(|(t, _)| *t != thread);
    forgetters.push((thread, Arc::new(tsfn)));
    Ok(())
}

/// Tells every thread's runner (each keeps only its own objects).
fn forget(job: Forget) {
    let forgetters: Vec<(u32, Arc<Forgetter>)> =
        FORGETTERS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (thread, forgetter) in forgetters {
        let job = Forget {
            session: job.session.clone(),
            object: job.object.clone(),
            program: job.program,
        };
        if forgetter.call(job, ThreadsafeFunctionCallMode::NonBlocking) == Status::Closing {
            // That thread's environment is gone, and its objects with it.
            FORGETTERS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(t, _)| *t != thread);
        }
    }
}

/// Core's record of an object the runner keeps: dropped when core destroys
/// the object, which tells the runner.
struct Kept {
    session: core::SessionKey,
    id: u64,
}

impl Drop for Kept {
    fn drop(&mut self) {
        forget(Forget {
            session: self.session.as_u64().to_string(),
            object: Some(self.id.to_string()),
            program: None,
        });
    }
}

/// Runs `node` programs on this process's JavaScript thread.
pub struct NodeExecutor;

impl core::LanguageExecutor for NodeExecutor {
    /// Everything the session's programs kept here goes (core destroyed its
    /// objects already; this clears the rest of the runner's table).
    fn session_ended(&self, session: core::SessionKey) {
        forget(Forget {
            session: session.as_u64().to_string(),
            object: None,
            program: None,
        });
    }

    fn load(&self, program: &core::Program) -> core::Result<Arc<dyn core::LoadedProgram>> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let payload = String::from_utf8(program.payload.clone()).map_err(|_| {
            core::Error::invalid_argument("a node program's payload is not UTF-8 text")
        })?;
        Ok(Arc::new(NodeProgram {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            home: home_thread(&payload),
            payload,
        }))
    }
}

struct NodeProgram {
    id: u64,
    /// The JavaScript thread that runs it (see [`home_thread`]).
    home: u32,
    payload: String,
}

/// An unloaded program's function goes from the runner's cache.
impl Drop for NodeProgram {
    fn drop(&mut self) {
        forget(Forget {
            session: String::new(),
            object: None,
            program: Some(self.id as i64),
        });
    }
}

impl core::LoadedProgram for NodeProgram {
    fn run(&self, ctx: &mut core::ExecutionContext<'_>) -> core::Result<()> {
        let (thread, runner) = runner_for(self.home).ok_or_else(|| {
            core::Error::unimplemented(
                "this process runs no JavaScript: the colocated package was not loaded",
            )
        })?;
        let (sender, receiver) = mpsc::channel();
        let discovering = ctx.discovering();
        let call = HostCall {
            session: ctx.session(),
            program: self.id,
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
                    return ctx
                        .set_host_outputs(outputs, discovering.then(|| structure.into_bytes()));
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
}
