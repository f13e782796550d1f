//! Core events as Promises: settled on the JavaScript thread, from whichever
//! thread finishes the work (a network thread, an executor), never waited for.
//!
//! One threadsafe function per JavaScript thread carries every settlement
//! back (napi-rs's deferred makes one per Promise, which costs more than a
//! local call itself). It keeps the event loop alive only while Promises are
//! pending, as a pending operation does.

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;
use std::sync::{Arc, RwLock};

use colocated_core::{self as core, Event};
use napi::bindgen_prelude::{Object, ToNapiValue};
use napi::{sys, Env, JsValue};

use crate::errors::to_js;

/// Makes the resolution value on the JavaScript thread.
type Make = Box<dyn FnOnce(Env) -> napi::Result<sys::napi_value> + Send>;

/// One settlement on its way to the JavaScript thread.
struct Settle {
    deferred: sys::napi_deferred,
    outcome: core::Result<Make>,
}

// SAFETY: the deferred is only used on the JavaScript thread that made it
// (in `call_js`); other threads only carry it there.
unsafe impl Send for Settle {}

/// The JavaScript thread's settler: its threadsafe function (as an address)
/// and the number of Promises pending on it.
struct Settler {
    tsfn: sys::napi_threadsafe_function,
    pending: Cell<usize>,
    /// Set (under the write lock) when the environment finalizes the
    /// function; callers hold the read lock while they call it, so none
    /// calls a freed function.
    closed: Arc<RwLock<bool>>,
}

/// The function's finalizer (the environment is going away): no more calls.
unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` is the `Arc` leaked for this function in `settler`,
    // finalized once.
    let closed = unsafe { Arc::from_raw(data.cast::<RwLock<bool>>()) };
    *closed.write().unwrap_or_else(|e| e.into_inner()) = true;
}

thread_local! {
    static SETTLER: Cell<Option<&'static Settler>> = const { Cell::new(None) };
}

/// The calling JavaScript thread's settler, made on first use (and kept for
/// the thread's life: its environment may outlive any one Promise).
fn settler(env: &Env) -> napi::Result<&'static Settler> {
    if let Some(s) = SETTLER.with(Cell::get) {
        return Ok(s);
    }
    let mut name = ptr::null_mut();
    let mut tsfn = ptr::null_mut();
    let text = "colocated promise";
    let closed = Arc::new(RwLock::new(false));
    let finalize_data = Arc::into_raw(closed.clone()).cast_mut().cast::<c_void>();
    // SAFETY: plain napi calls on the JavaScript thread with valid out-pointers.
    unsafe {
        napi::check_status!(sys::napi_create_string_utf8(
            env.raw(),
            text.as_ptr().cast(),
            text.len() as isize,
            &mut name
        ))?;
        napi::check_status!(sys::napi_create_threadsafe_function(
            env.raw(),
            ptr::null_mut(),
            ptr::null_mut(),
            name,
            0,
            1,
            finalize_data,
            Some(finalize),
            ptr::null_mut(),
            Some(call_js),
            &mut tsfn,
        ))?;
        // Nothing pending yet: it must not keep the process alive.
        napi::check_status!(sys::napi_unref_threadsafe_function(env.raw(), tsfn))?;
    }
    let settler: &'static Settler = Box::leak(Box::new(Settler {
        tsfn,
        pending: Cell::new(0),
        closed,
    }));
    SETTLER.with(|s| s.set(Some(settler)));
    Ok(settler)
}

/// Runs on the JavaScript thread for each settlement.
unsafe extern "C" fn call_js(
    env: sys::napi_env,
    _: sys::napi_value,
    _: *mut c_void,
    data: *mut c_void,
) {
    // SAFETY: `data` is a `Settle` boxed by `settle`, handed over once.
    let job = unsafe { Box::from_raw(data.cast::<Settle>()) };
    if env.is_null() {
        // The environment is going away: nothing is waiting any more.
        return;
    }
    let env = Env::from_raw(env);
    let value = match job.outcome {
        Ok(make) => make(env),
        Err(e) => Err(to_js(&env, &e)),
    };
    // SAFETY: on the JavaScript thread of `deferred`, settled once.
    unsafe {
        match value {
            Ok(v) => sys::napi_resolve_deferred(env.raw(), job.deferred, v),
            Err(e) => {
                let error = napi::JsError::from(e).into_unknown(env);
                sys::napi_reject_deferred(env.raw(), job.deferred, error.raw())
            }
        };
    }
    let settler = SETTLER.with(Cell::get);
    if let Some(s) = settler {
        let left = s.pending.get().saturating_sub(1);
        s.pending.set(left);
        if left == 0 {
            // SAFETY: on the JavaScript thread that owns the function.
            unsafe { sys::napi_unref_threadsafe_function(env.raw(), s.tsfn) };
        }
    }
}

/// A Promise of `value(env)` once `event` is ready, or of the event's error.
/// While it is pending, the event loop stays alive (as for any pending
/// operation).
pub fn settle<'e, T, F>(env: &'e Env, event: &Event, value: F) -> napi::Result<Object<'e>>
where
    T: ToNapiValue + 'static,
    F: FnOnce(Env) -> napi::Result<T> + Send + 'static,
{
    let settler = settler(env)?;
    let mut deferred = ptr::null_mut();
    let mut promise = ptr::null_mut();
    // SAFETY: on the JavaScript thread, valid out-pointers.
    unsafe {
        napi::check_status!(sys::napi_create_promise(
            env.raw(),
            &mut deferred,
            &mut promise
        ))?;
    }
    if settler.pending.get() == 0 {
        // SAFETY: on the JavaScript thread that owns the function.
        unsafe { napi::check_status!(sys::napi_ref_threadsafe_function(env.raw(), settler.tsfn))? };
    }
    settler.pending.set(settler.pending.get() + 1);
    let tsfn = settler.tsfn as usize;
    let closed = settler.closed.clone();
    // Carried as an address: the closure runs on another thread, which only
    // hands it back.
    let deferred = deferred as usize;
    event.on_ready(move |status| {
        let make: Make = Box::new(move |env: Env| {
            let v = value(env)?;
            // SAFETY: on the JavaScript thread, with its environment.
            unsafe { T::to_napi_value(env.raw(), v) }
        });
        let job = Box::new(Settle {
            deferred: deferred as sys::napi_deferred,
            outcome: status.map(|()| make),
        });
        // The function lives until its environment finalizes it; the read
        // lock keeps that from happening during the call.
        let closed = closed.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return;
        }
        let data = Box::into_raw(job);
        // SAFETY: the function is alive (not finalized, see above); a closing
        // environment refuses the call, and the job is then freed here.
        let status = unsafe {
            sys::napi_call_threadsafe_function(
                tsfn as sys::napi_threadsafe_function,
                data.cast(),
                sys::ThreadsafeFunctionCallMode::nonblocking,
            )
        };
        if status != sys::Status::napi_ok {
            // SAFETY: not handed over: ours to free.
            drop(unsafe { Box::from_raw(data) });
        }
    });
    Ok(Object::from_raw(env.raw(), promise))
}
