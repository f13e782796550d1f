//! JavaScript values that core keeps for a JavaScript thread: the
//! controller's own functions and classes (core's registry of local values,
//! which its own host runs by reference) and objects of colocated classes
//! (core's host-object store). A JavaScript value cannot leave its thread:
//! core keeps a `Send` token ([`JsValue`]), and the thread keeps the value in
//! its table (`colocated.js`) under the token's id. Dropping the token, on
//! whatever thread core drops it, tells that thread to release the value
//! (an object's `[Symbol.dispose]()` runs then).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use colocated_core as core;
use napi::bindgen_prelude::{Function, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;

/// What a thread's forgetter is told: to release the value it keeps under
/// `value`, or (`program` set) to forget the function it loaded for a
/// program that was unloaded.
#[napi(object)]
pub struct Forget {
    pub value: Option<i64>,
    pub program: Option<i64>,
}

type Forgetter = ThreadsafeFunction<Forget, Unknown<'static>, Forget, Status, false, true>;

/// The forgetters of this process's JavaScript threads, by `threadId`.
static FORGETTERS: Mutex<Vec<(u32, Arc<Forgetter>)>> = Mutex::new(Vec::new());

/// Called once per JavaScript thread by `colocated.js`: the function that
/// releases what that thread keeps for core. It does not keep the thread
/// alive.
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

/// Tells the forgetter of `thread` (every thread's: `None`).
pub(crate) fn forget(thread: Option<u32>, job: Forget) {
    let forgetters: Vec<(u32, Arc<Forgetter>)> = FORGETTERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(t, _)| thread.is_none_or(|thread| *t == thread))
        .cloned()
        .collect();
    for (thread, forgetter) in forgetters {
        let job = Forget {
            value: job.value,
            program: job.program,
        };
        if forgetter.call(job, ThreadsafeFunctionCallMode::NonBlocking) == Status::Closing {
            // That thread's environment is gone, and what it kept with it.
            FORGETTERS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(t, _)| *t != thread);
        }
    }
}

/// Core's token of a JavaScript value that thread `thread` keeps under `id`:
/// `Send`, and dropping it (on any thread) releases the value on its own.
pub(crate) struct JsValue {
    pub(crate) thread: u32,
    pub(crate) id: u64,
}

impl JsValue {
    /// A token with a new id (unique in the process) for a value of `thread`.
    pub(crate) fn new(thread: u32) -> JsValue {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        JsValue {
            thread,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The id as JavaScript sees it (a safe integer: ids count up from 1).
    pub(crate) fn js_id(&self) -> i64 {
        self.id as i64
    }
}

impl Drop for JsValue {
    fn drop(&mut self) {
        forget(
            Some(self.thread),
            Forget {
                value: Some(self.js_id()),
                program: None,
            },
        );
    }
}

/// A function or class of this process in core's registry of local values,
/// which its own host runs by reference: the thread that made it keeps it
/// under `id` while this handle, or a program loaded from its `reference`,
/// lives.
#[napi]
pub struct LocalFunction {
    inner: core::LocalValue,
    id: i64,
}

#[napi]
impl LocalFunction {
    /// Registers a value that JavaScript thread `thread` keeps (under `id`).
    #[napi(constructor)]
    pub fn new(thread: u32) -> LocalFunction {
        let token = JsValue::new(thread);
        let id = token.js_id();
        LocalFunction {
            inner: core::LocalValue::register(Arc::new(token)),
            id,
        }
    }

    /// The id its thread keeps the value under.
    #[napi(getter)]
    pub fn id(&self) -> i64 {
        self.id
    }

    /// What names it in a program's payload (on this process only).
    #[napi(getter)]
    pub fn reference(&self) -> String {
        self.inner.reference()
    }
}

/// How many values (functions and classes of this process run by
/// reference, of every thread) core's registry holds now.
#[napi(js_name = "_localValues")]
pub fn local_values() -> u32 {
    u32::try_from(core::local_values()).unwrap_or(u32::MAX)
}

/// The token of the value a program's payload refers to (JSON with a
/// `local` reference, at the top or, for a method, in `object.class`), when
/// it is one of this process's; `None` otherwise (the payload is another
/// process's, which runs it by its source or module).
pub(crate) fn local_of(payload: &str) -> Option<core::LocalValue> {
    let value = serde_json::from_str::<serde_json::Value>(payload).ok()?;
    let reference = value
        .get("local")
        .or_else(|| value.get("object")?.get("class")?.get("local"))?
        .as_str()?;
    let local = core::LocalValue::resolve(reference.as_bytes()).ok()?;
    local.downcast_ref::<JsValue>()?;
    Some(local)
}

/// How many objects of colocated classes (of every session and language)
/// core's host-object store holds on this process now.
#[napi(js_name = "_hostObjects")]
pub fn host_objects() -> u32 {
    u32::try_from(core::host_objects(None)).unwrap_or(u32::MAX)
}
