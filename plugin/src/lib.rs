//! `colocated-plugin`: plugin libraries, shared libraries that add native
//! functions to a host's registry when the host loads them (`colocated worker
//! --plugin LIB`, `colocated.worker --plugin LIB`, or
//! `colocated_client_load_plugin`).
//!
//! The plugin ABI is self-contained: a plugin uses the types and constants of
//! `colocated.h` (defined once, in [`abi`] and here) but calls no function of
//! libcolocated, so it links against nothing and works in any process that
//! loads it — the worker executable and the Python extension, which do not
//! export the C ABI's symbols, as well as an application that embeds the
//! library. Everything a plugin needs arrives through the registrar and the call
//! structs, and the data it reads and writes is plain memory: inputs pinned in
//! place, outputs in core's aligned [`colocated_core::HostMemory`].
//!
//! [`load_plugin`] is the loader every skin calls; the C ABI crate's
//! `colocated_client_load_plugin` only translates its arguments.

#![allow(non_camel_case_types)]
#![warn(missing_docs)]

pub mod abi;
mod loader;

pub use abi::{
    colocated_plugin_array, colocated_plugin_call, colocated_plugin_function,
    colocated_plugin_init_fn, colocated_plugin_registrar,
};
pub use loader::load_plugin;

// The version of the whole C API (libcolocated re-exports these and returns
// `COLOCATED_API_VERSION` from `colocated_api_version`), defined here because a
// plugin's registrar carries it to every host, including those without the C ABI.
/// Major version of the C API. Bumped only for incompatible changes (never so far).
pub const COLOCATED_API_VERSION_MAJOR: u32 = 1;
/// Minor version of the C API. Bumped for every additive change.
pub const COLOCATED_API_VERSION_MINOR: u32 = 5;
/// `(major << 16) | minor`, as [`colocated_api_version`] returns it.
pub const COLOCATED_API_VERSION: u32 =
    (COLOCATED_API_VERSION_MAJOR << 16) | COLOCATED_API_VERSION_MINOR;
