//! Hosting a PJRT plugin: a safe layer over the PJRT C API.
//!
//! A PJRT plugin is a shared library that exports `GetPjrtApi` (XLA's CPU
//! plugin, `xla_cuda_plugin.so`, libtpu, ...). [`Plugin::load`] opens one,
//! checks its API version and initialises it; [`Client::create`] makes a client
//! on it, whose [`Device`]s and [`Memory`]s hold [`Buffer`]s, and whose
//! [`Client::compile`] turns a StableHLO module into a [`LoadedExecutable`].
//! Asynchronous work reports through [`Event`]s, which call back when ready
//! (`PJRT_Event_OnReady`) instead of holding a thread per wait.
//!
//! Plugins abort the process on some misuse, so this layer checks what it can
//! before calling: sizes against element types and dimensions, that a table
//! entry exists in the plugin's API before calling it, and handles by
//! ownership. Errors carry the canonical code the plugin gave (or the one that
//! fits what was refused here) and its message.
//!
//! Accepted plugins: PJRT API major version 0, minor version
//! [`MIN_API_MINOR`] or newer. The bindings are generated from the header in
//! `third_party/pjrt` (API 0.[`HEADER_API_MINOR`]); a newer plugin accepts the
//! argument structs of this header (plugins take any struct at least as large
//! as the one they were built with, and this header's structs have every field
//! an older plugin knows).

#![warn(missing_docs)]

#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    clippy::all,
    clippy::pedantic,
    missing_docs
)]
pub mod sys;

mod buffer;
mod client;
mod error;
mod event;
mod executable;
mod plugin;
mod types;

/// XLA's compile options: the fields this crate sets, with XLA's numbers.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/xla.rs"));
}

pub use buffer::{Buffer, HostBufferSemantics};
pub use client::{Client, Device, Memory};
pub use error::{Code, Error, Result};
pub use event::Event;
pub use executable::{CompileOptions, Executed, LoadedExecutable, ProgramFormat};
pub use plugin::{Plugin, HEADER_API_MINOR, MIN_API_MINOR};
pub use types::{ElementType, Value};
