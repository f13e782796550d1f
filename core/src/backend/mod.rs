//! Device backends. A client's devices are this runtime's CPU devices (where
//! colocated Python, Node and native functions run, their memory the
//! process's own) and, when a PJRT plugin is configured for a host, the
//! plugin's devices ([`pjrt`]). Buffers reach a device's data through the
//! host data of its backend (`buffer::host::of`); nothing else asks which
//! backend a buffer lives in.

pub(crate) mod pjrt;

pub use pjrt::{
    find_plugin, plugin_from_env, PjrtOptions, PjrtValue, PJRT_NAMES_ENV, PJRT_PLUGIN_ENV,
};
pub(crate) use pjrt::{DeviceData, PjrtBackend, PjrtDevice};
