//! Core events as Promises: settled on the JavaScript thread, from whichever
//! thread finishes the work (a network thread, an executor), never waited for.

use colocated_core::Event;
use napi::bindgen_prelude::{Object, ToNapiValue};
use napi::Env;

use crate::errors::to_js;

/// A Promise of `value(env)` once `event` is ready, or of the event's error.
pub fn settle<'e, T, F>(env: &'e Env, event: &Event, value: F) -> napi::Result<Object<'e>>
where
    T: ToNapiValue + 'static,
    F: FnOnce(Env) -> napi::Result<T> + Send + 'static,
{
    let (deferred, promise) = env.create_deferred()?;
    event.on_ready(move |status| {
        deferred.resolve(move |env| match status {
            Ok(()) => value(env),
            Err(e) => Err(to_js(&env, &e)),
        })
    });
    Ok(promise)
}
