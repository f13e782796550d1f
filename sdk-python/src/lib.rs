//! `colocated._colocated`: the native half of the Python SDK.
//!
//! A translation layer over `colocated-core`: it converts types, errors, ownership
//! and futures, and decides nothing itself. The public API (`colocated`) is the
//! Python package around it; this module is private to that package.
//!
//! Threading: every blocking wait releases the GIL; runtime threads take it only to
//! run Python callbacks (`Event.on_ready`, `Client.on_host_event`).

mod array;
mod client;
mod dlpack;
mod errors;
mod event;
mod executable;
mod executor;
mod fork;
mod function;
mod hooks;
mod host_events;
mod interpreter;
mod remote;
mod scalar_math;
#[cfg(feature = "testing")]
mod session;
mod sharding;
mod streams;

use pyo3::prelude::*;

/// The allocator of this module's Rust allocations (see `Cargo.toml`); the
/// interpreter keeps its own.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _colocated(m: &Bound<'_, PyModule>) -> PyResult<()> {
    interpreter::register(m)?;
    m.add_function(wrap_pyfunction!(hooks::register_hooks, m)?)?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::Device>()?;
    m.add_class::<client::Host>()?;
    m.add_class::<host_events::HostEvent>()?;
    m.add_class::<host_events::HostStats>()?;
    m.add_function(wrap_pyfunction!(client::colocated_cpu_devices, m)?)?;
    m.add_function(wrap_pyfunction!(client::configure_default, m)?)?;
    m.add_function(wrap_pyfunction!(client::configure_worker_client, m)?)?;
    m.add_function(wrap_pyfunction!(client::default_client, m)?)?;
    m.add_function(wrap_pyfunction!(client::set_default_client, m)?)?;
    m.add_class::<sharding::Sharding>()?;
    m.add_class::<array::ArrayImpl>()?;
    m.add_class::<array::HostView>()?;
    m.add_class::<array::CopyProgress>()?;
    m.add_class::<event::Event>()?;
    m.add_class::<function::FunctionState>()?;
    m.add_class::<function::FunctionBase>()?;
    m.add_function(wrap_pyfunction!(function::flat_tree_key, m)?)?;
    m.add_function(wrap_pyfunction!(function::new_tree_key, m)?)?;
    m.add_class::<executable::Executable>()?;
    m.add_class::<function::ColocatedObject>()?;
    m.add_class::<executable::ProgramCache>()?;
    m.add_function(wrap_pyfunction!(fork::after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(executor::call_host_callback, m)?)?;
    m.add_function(wrap_pyfunction!(executor::current_session, m)?)?;
    m.add_function(wrap_pyfunction!(executor::host_object, m)?)?;
    m.add_function(wrap_pyfunction!(executor::controller_device_id, m)?)?;
    m.add_function(wrap_pyfunction!(executor::host_objects, m)?)?;
    m.add_function(wrap_pyfunction!(executor::parked_results, m)?)?;
    m.add_function(wrap_pyfunction!(executor::local_values, m)?)?;
    m.add_class::<executor::LocalProgram>()?;
    m.add_class::<remote::WorkerHandle>()?;
    #[cfg(feature = "testing")]
    m.add_class::<session::RemoteSession>()?;
    #[cfg(feature = "testing")]
    m.add_function(wrap_pyfunction!(scalar_math::native_scalar_ops, m)?)?;
    m.add_function(wrap_pyfunction!(remote::start_worker, m)?)?;
    m.add_function(wrap_pyfunction!(remote::worker_flags, m)?)?;
    m.add_function(wrap_pyfunction!(remote::status_flags, m)?)?;
    m.add_function(wrap_pyfunction!(remote::status, m)?)?;
    m.add_class::<remote::WorkerConfig>()?;
    m.add_function(wrap_pyfunction!(remote::load_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(remote::init_worker_logging, m)?)?;
    m.add("PLATFORM_NAME", colocated_core::PLATFORM_NAME)?;
    m.add("TOKEN_ENV", colocated_core::transport::TOKEN_ENV)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
