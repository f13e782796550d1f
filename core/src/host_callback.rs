//! Loaded host callbacks: functions of the controller process that programs call
//! while they run.

use std::sync::Arc;

use crate::error::Result;

/// The callable behind a host callback: bytes in, bytes out.
pub type HostCallbackFn = dyn Fn(&[u8]) -> Result<Vec<u8>> + Send + Sync;

struct Inner {
    name: String,
    func: Box<HostCallbackFn>,
}

/// A reference-counted host callback. The callable (and whatever it owns, such as a
/// C destructor guard) is dropped exactly once, after the last reference: held by
/// the caller, every executable compiled with it, and every execution in flight.
#[derive(Clone)]
pub struct LoadedHostCallback(Arc<Inner>);

impl std::fmt::Debug for LoadedHostCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoadedHostCallback({})", self.0.name)
    }
}

impl LoadedHostCallback {
    /// Wraps `func`. `name` is for messages and traces.
    pub fn new(
        name: impl Into<String>,
        func: impl Fn(&[u8]) -> Result<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        LoadedHostCallback(Arc::new(Inner {
            name: name.into(),
            func: Box::new(func),
        }))
    }

    /// The callback's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Calls the function in this process. (Programs on remote hosts reach it
    /// through the transport, which ends in this same call.)
    pub fn call(&self, input: &[u8]) -> Result<Vec<u8>> {
        let _span = tracing::debug_span!("host_callback", name = %self.0.name, bytes = input.len())
            .entered();
        (self.0.func)(input)
    }
}
