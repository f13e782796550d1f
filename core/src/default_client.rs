//! The process's default client, as an SDK shows it (JAX's `jax.devices()`):
//! configured before its first use, created on first use with the local host's
//! CPU devices, and replaced by a connect that asks to be the default.

use std::sync::Mutex;

use crate::client::{Client, ClientOptions};
use crate::error::{Error, Result};

/// The environment variable that gives the default client's number of CPU
/// devices when [`configure`] did not.
pub const NUM_CPU_DEVICES_ENV: &str = "COLOCATED_NUM_CPU_DEVICES";

struct State {
    options: ClientOptions,
    client: Option<Client>,
}

static STATE: Mutex<State> = Mutex::new(State {
    options: ClientOptions {
        num_cpu_devices: None,
        executor_threads: None,
        max_executor_threads: None,
        pjrt: None,
    },
    client: None,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets the options of the default client, before its first use.
///
/// Errors: `failed_precondition` once the default client exists (its device
/// count is in the message); `invalid_argument` for a count below 1.
pub fn configure(options: ClientOptions) -> Result<()> {
    for (name, value) in [
        ("num_cpu_devices", options.num_cpu_devices),
        ("executor_threads", options.executor_threads),
        ("max_executor_threads", options.max_executor_threads),
    ] {
        if value == Some(0) {
            return Err(Error::invalid_argument(format!(
                "{name} must be a positive integer, got 0"
            )));
        }
    }
    let mut state = state();
    if let Some(client) = &state.client {
        return Err(Error::failed_precondition(format!(
            "configure() must be called before the first use of colocated; \
             the default client already exists with {} devices",
            client.devices().len()
        )));
    }
    state.options = options;
    Ok(())
}

/// The default client: the one made default by [`set_default_client`], else
/// a client of this process created now with the configured options (the
/// number of CPU devices from [`NUM_CPU_DEVICES_ENV`] and the PJRT plugin
/// from [`PJRT_PLUGIN_ENV`](crate::PJRT_PLUGIN_ENV) unless configured).
///
/// Errors: `invalid_argument` for a malformed environment variable, and
/// whatever creating the client reports.
pub fn default_client() -> Result<Client> {
    let mut state = state();
    if let Some(client) = &state.client {
        return Ok(client.clone());
    }
    let mut options = state.options.clone();
    if options.num_cpu_devices.is_none() {
        options.num_cpu_devices = num_cpu_devices_from_env()?;
    }
    if options.pjrt.is_none() {
        options.pjrt = crate::backend::plugin_from_env()?;
    }
    let client = Client::new_local(options)?;
    state.client = Some(client.clone());
    Ok(client)
}

/// The default client if there is one now (made default, or created by a
/// use), without creating one.
pub fn current_default_client() -> Option<Client> {
    state().client.clone()
}

/// Makes `client` the default one (a connect that asks to be the default);
/// `None` lets the default client go (the next use creates one from the
/// configured options).
pub fn set_default_client(client: Option<Client>) {
    let old = std::mem::replace(&mut state().client, client);
    // Dropped after the lock: a client's drop may take a while.
    drop(old);
}

/// Forgets the default client and the configured options: for a child
/// process after `fork`, where the parent's client cannot be used. The client
/// is leaked, not dropped: dropping it would touch threads that do not exist
/// in the child.
pub fn reset_default_client() {
    let mut state = state();
    std::mem::forget(state.client.take());
    state.options = ClientOptions::default();
}

/// The number of CPU devices [`NUM_CPU_DEVICES_ENV`] asks for, if it is set
/// and not blank. `invalid_argument` when it is not a positive integer.
pub fn num_cpu_devices_from_env() -> Result<Option<usize>> {
    let Ok(text) = std::env::var(NUM_CPU_DEVICES_ENV) else {
        return Ok(None);
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => Err(Error::invalid_argument(format!(
            "{NUM_CPU_DEVICES_ENV} must be a positive integer, got '{text}'"
        ))),
    }
}
