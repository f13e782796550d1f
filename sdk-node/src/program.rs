//! The `node` language: JavaScript functions that hosts run. A program's
//! payload is the function (its source, or a module and export name, as
//! JSON: JavaScript's own form of it, as cloudpickle is Python's); a host
//! runs it on its JavaScript thread (the event loop of this process) with its
//! input arrays, and hands core the arrays it returns.
//!
//! An executor thread that runs a `node` program hands a [`HostCall`] to the
//! JavaScript runner (`colocated.js`, through a threadsafe function) and
//! waits for its answer; the event loop never waits for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use colocated_core as core;
use napi::bindgen_prelude::{ClassInstance, Function, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;

use crate::array::ColocatedArray;
use crate::client::Device;

/// The language tag of JavaScript programs.
pub const LANGUAGE: &str = core::LANGUAGE_NODE;

/// The runner of this process: `colocated.js`'s `run(call)`, which runs a
/// host call on the event loop and answers it.
type Runner = ThreadsafeFunction<HostCall, Unknown<'static>, HostCall, Status, false, true>;

static RUNNER: Mutex<Option<Arc<Runner>>> = Mutex::new(None);

/// Called once by `colocated.js` on the main thread: the function that runs
/// host calls. It does not keep the process alive.
#[napi(js_name = "_setRunner")]
pub fn set_runner(run: Function<HostCall, Unknown<'static>>) -> napi::Result<()> {
    let tsfn = run
        .build_threadsafe_function::<HostCall>()
        .callee_handled::<false>()
        .weak::<true>()
        .build()?;
    *RUNNER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(tsfn));
    Ok(())
}

/// What a host's run of a `node` program gets back: its output arrays and
/// the description of their tree.
type Answer = core::Result<(Vec<core::Array>, String)>;

/// One run of a `node` program on this host, handed to the JavaScript runner,
/// which answers it once with `resolve` or `reject`.
#[napi]
pub struct HostCall {
    program: u64,
    payload: String,
    client: core::Client,
    inputs: Vec<core::Array>,
    devices: Vec<core::Device>,
    discovering: bool,
    answer: Mutex<Option<mpsc::Sender<Answer>>>,
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
        let code = code
            .and_then(|c| core::ErrorCode::ALL.into_iter().find(|k| k.name() == c))
            .unwrap_or(core::ErrorCode::Internal);
        let mut err = core::Error::new(code, message);
        if let Some(stack) = stack {
            err = err.with_remote_traceback(stack);
        }
        self.answer(Err(err));
    }
}

impl HostCall {
    fn answer(&self, answer: Answer) {
        let sender = self.answer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sender) = sender {
            // The executor thread may have given up (its run ended): nothing to do.
            let _ = sender.send(answer);
        }
    }
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
            payload,
        }))
    }
}

struct NodeProgram {
    id: u64,
    payload: String,
}

impl core::LoadedProgram for NodeProgram {
    fn run(&self, ctx: &mut core::ExecutionContext<'_>) -> core::Result<()> {
        let runner = RUNNER.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let runner = runner.ok_or_else(|| {
            core::Error::unimplemented(
                "this process runs no JavaScript: the colocated package was not loaded",
            )
        })?;
        let (sender, receiver) = mpsc::channel();
        let discovering = ctx.discovering();
        let call = HostCall {
            program: self.id,
            payload: self.payload.clone(),
            client: ctx.client().clone(),
            inputs: ctx.host_input_arrays()?,
            devices: ctx.devices(),
            discovering,
            answer: Mutex::new(Some(sender)),
        };
        if runner.call(call, ThreadsafeFunctionCallMode::NonBlocking) != Status::Ok {
            return Err(core::Error::unavailable(
                "the JavaScript thread of this process is gone",
            ));
        }
        // An executor thread may wait; the event loop runs the function.
        let (outputs, structure) = receiver.recv().map_err(|_| {
            core::Error::cancelled("the JavaScript thread dropped the call without answering")
        })??;
        ctx.set_host_outputs(outputs, discovering.then(|| structure.into_bytes()))
    }
}
