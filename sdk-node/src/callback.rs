//! Host callbacks: JavaScript functions of the controller that programs on
//! any host call (bytes in, bytes out). A call arrives on a thread of core's
//! (an executor thread, or the transport's blocking pool for a worker's
//! program), is handed to the event loop, and that thread waits for the
//! answer; the event loop never waits.

use std::sync::{mpsc, Arc, Mutex};

use colocated_core as core;
use napi::bindgen_prelude::{Buffer, Function, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;

type Runner = ThreadsafeFunction<CallbackCall, Unknown<'static>, CallbackCall, Status, false, true>;

/// A JavaScript function that programs call (made by `hostCallback(fn)`).
#[napi]
pub struct HostCallback {
    pub(crate) inner: core::LoadedHostCallback,
}

#[napi]
impl HostCallback {
    /// `run(call)` answers each call with `call.resolve(bytes)` or
    /// `call.reject(message, stack)`; `name` is for messages.
    #[napi(constructor)]
    pub fn new(name: String, run: Function<CallbackCall, Unknown<'static>>) -> napi::Result<Self> {
        let runner: Arc<Runner> = Arc::new(
            run.build_threadsafe_function::<CallbackCall>()
                .callee_handled::<false>()
                .weak::<true>()
                .build()?,
        );
        let label = name.clone();
        let inner = core::LoadedHostCallback::new(name, move |input: &[u8]| {
            let (sender, receiver) = mpsc::channel();
            let call = CallbackCall {
                input: input.to_vec(),
                answer: Mutex::new(Some(sender)),
            };
            if runner.call(call, ThreadsafeFunctionCallMode::NonBlocking) != Status::Ok {
                return Err(core::Error::unavailable(format!(
                    "host callback {label}: the controller's JavaScript thread is gone"
                )));
            }
            receiver.recv().map_err(|_| {
                core::Error::cancelled(format!("host callback {label} was dropped unanswered"))
            })?
        });
        Ok(HostCallback { inner })
    }

    /// Its name.
    #[napi(getter)]
    pub fn name(&self) -> String {
        self.inner.name().to_string()
    }
}

/// One call of a host callback, answered once.
#[napi]
pub struct CallbackCall {
    input: Vec<u8>,
    answer: Mutex<Option<mpsc::Sender<core::Result<Vec<u8>>>>>,
}

#[napi]
impl CallbackCall {
    /// The bytes the program sent.
    #[napi(getter)]
    pub fn input(&self) -> Buffer {
        self.input.clone().into()
    }

    /// Answers with `output`.
    #[napi]
    pub fn resolve(&self, output: Buffer) {
        self.answer(Ok(output.to_vec()));
    }

    /// Answers with the callback's error (its stack reaches the program's
    /// caller as `remoteStack`).
    #[napi]
    pub fn reject(&self, message: String, stack: Option<String>, code: Option<String>) {
        self.answer(Err(crate::program::user_error(message, stack, code)));
    }
}

impl CallbackCall {
    fn answer(&self, answer: core::Result<Vec<u8>>) {
        let sender = self.answer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sender) = sender {
            let _ = sender.send(answer);
        }
    }
}
