//! The Node binding of `colocated` (the npm package `colocated`): core's object
//! model for JavaScript. Every semantic lives in `colocated-core`; this crate
//! only converts values, errors, ownership and futures:
//! - core errors become `ColocatedError` subclasses (`errors`);
//! - core events become Promises, settled from whichever thread finishes the
//!   work, so nothing ever blocks the event loop (`promise`);
//! - a client's host events reach the event loop through a threadsafe
//!   function that core's events thread never waits on (`host_events`);
//! - calls that wait in core (connecting, gathering an array) run on libuv's
//!   thread pool (`AsyncTask`).

#![deny(clippy::unwrap_used)]
// napi-derive registers the exports only outside `cfg(test)`, which
// `cargo clippy --all-targets` also checks: there they look unused.
#![cfg_attr(test, allow(dead_code))]

// As libcolocated and the Python module: transfers allocate on one thread and
// free on another, where glibc's arenas hand large blocks back to the kernel.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod array;
mod callback;
mod client;
mod convert;
mod errors;
mod executable;
mod function;
mod host_events;
mod kept;
mod program;
mod promise;
mod sharding;
mod worker;
