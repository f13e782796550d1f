//! The built-in `native` language: payloads that name a function of the
//! host's registry of native functions, and that registry.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::{ExecutionContext, LanguageExecutor, LoadedProgram, NativeFn};
use crate::error::{Error, Result};

/// The built-in `native` executor: the payload names a function of the host's
/// registry.
pub(super) struct NativeExecutor(pub(super) Arc<NativeRegistry>);

struct NativeProgram {
    function: Arc<NativeFn>,
    /// What follows the name in the payload (see [`native_payload`]).
    data: Option<Arc<[u8]>>,
}

impl LoadedProgram for NativeProgram {
    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()> {
        ctx.native_data = self.data.clone();
        let ran = (self.function)(ctx);
        ctx.native_data = None;
        ran
    }
}

impl LanguageExecutor for NativeExecutor {
    fn load(&self, program: &crate::program::Program) -> Result<Arc<dyn LoadedProgram>> {
        let (name, data) = split_native_payload(&program.payload);
        let name = std::str::from_utf8(name).map_err(|_| {
            Error::invalid_argument("a native program's payload must be a UTF-8 function name")
        })?;
        Ok(Arc::new(NativeProgram {
            function: self.0.resolve(name)?,
            data: (!data.is_empty()).then(|| data.into()),
        }))
    }
}

/// The payload of a `native` program: the function's name, and the data the
/// function reads with [`ExecutionContext::native_data`] (e.g. the id of the
/// colocated object it is a method of), after a NUL byte when not empty.
/// `invalid_argument` for an empty name or one with a NUL byte (no native
/// function has such a name).
pub fn native_payload(name: &str, data: &[u8]) -> Result<Vec<u8>> {
    check_native_name(name)?;
    let mut payload = name.as_bytes().to_vec();
    if !data.is_empty() {
        payload.push(0);
        payload.extend_from_slice(data);
    }
    Ok(payload)
}

/// A native function's name is not empty and has no NUL byte (which ends the
/// name in a program's payload).
fn check_native_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid_argument("a native function needs a name"));
    }
    if name.contains('\0') {
        return Err(Error::invalid_argument(
            "a native function's name cannot contain a NUL byte (it ends the name in a program's payload)",
        ));
    }
    Ok(())
}

/// A `native` payload's (name, data): split at the first NUL byte.
fn split_native_payload(payload: &[u8]) -> (&[u8], &[u8]) {
    match payload.iter().position(|b| *b == 0) {
        Some(at) => (&payload[..at], &payload[at + 1..]),
        None => (payload, &[]),
    }
}

/// A host's registry of native functions, resolved by name at compile time.
#[derive(Default)]
pub(crate) struct NativeRegistry {
    functions: RwLock<HashMap<String, Arc<NativeFn>>>,
}

impl NativeRegistry {
    pub fn register(&self, name: &str, func: Arc<NativeFn>) -> Result<()> {
        check_native_name(name)?;
        let mut map = self.functions.write().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(name) {
            return Err(Error::already_exists(format!(
                "native function '{name}' is already registered"
            )));
        }
        map.insert(name.to_string(), func);
        Ok(())
    }

    pub fn resolve(&self, name: &str) -> Result<Arc<NativeFn>> {
        let map = self.functions.read().unwrap_or_else(|e| e.into_inner());
        map.get(name).cloned().ok_or_else(|| {
            let mut known: Vec<&String> = map.keys().collect();
            known.sort();
            Error::not_found(format!(
                "no native function '{name}' on this host (registered: {known:?})"
            ))
        })
    }
}
