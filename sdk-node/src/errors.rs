//! Core errors as JavaScript errors. The classes (`ColocatedError` and one
//! subclass per code) are defined once, in `errors.js`, which hands this
//! module a factory when the package loads; this module only builds instances.

use std::cell::RefCell;

use colocated_core as core;
use napi::bindgen_prelude::{Function, FunctionRef, Unknown};
use napi::{Env, Status};

type Factory = FunctionRef<(String, String, Option<String>), Unknown<'static>>;

thread_local! {
    // One per JavaScript thread (each has its own environment).
    static FACTORY: RefCell<Option<Factory>> = const { RefCell::new(None) };
}

/// Called once by `errors.js`: `make(code, message, remoteStack)` returns the
/// error object of that code.
#[napi_derive::napi(js_name = "_setErrorFactory")]
pub fn set_error_factory(
    make: Function<(String, String, Option<String>), Unknown<'static>>,
) -> napi::Result<()> {
    let factory = make.create_ref()?;
    FACTORY.with(|f| *f.borrow_mut() = Some(factory));
    Ok(())
}

/// The JavaScript error of `err`: an instance of its code's class, with
/// `.code` and, for user code that failed on a host, `.remoteStack`.
pub fn to_js(env: &Env, err: &core::Error) -> napi::Error {
    let built = FACTORY.with(|f| -> napi::Result<Option<napi::Error>> {
        let factory = f.borrow();
        let Some(factory) = factory.as_ref() else {
            return Ok(None);
        };
        let make = factory.borrow_back(env)?;
        let value = make.call((
            err.code().name().to_string(),
            err.message().to_string(),
            err.remote_traceback().map(str::to_string),
        ))?;
        Ok(Some(napi::Error::from(value)))
    });
    match built {
        Ok(Some(e)) => e,
        // Before `errors.js` ran (or if it failed): a plain Error with the code.
        _ => plain(err),
    }
}

/// A plain `Error` with the code as its `.code` (without the classes).
pub fn plain(err: &core::Error) -> napi::Error {
    napi::Error::new(Status::GenericFailure, err.to_string())
}

/// `invalid_argument` with `message`, as a core error.
pub fn invalid(message: impl Into<String>) -> core::Error {
    core::Error::invalid_argument(message)
}

/// Converts core results for JavaScript: `core_call().js(env)?`.
pub trait OrThrow<T> {
    /// The value, or the JavaScript error of the core error.
    fn js(self, env: &Env) -> napi::Result<T>;
}

impl<T> OrThrow<T> for core::Result<T> {
    fn js(self, env: &Env) -> napi::Result<T> {
        self.map_err(|e| to_js(env, &e))
    }
}
