//! Colocated functions and objects: the protocol every SDK's decorator
//! (`colocated_python`, Node's) shares, language-neutral.
//!
//! A language supplies an executor that loads its payload and runs it with a
//! host's input arrays ([`ExecutionContext::host_input_arrays`] in,
//! [`ExecutionContext::set_host_outputs`] out), and, on the controller, a
//! [`CallSite`] per call that lacks a compiled program. Core owns the rest:
//! the call rules and the cache of compiled programs per input spec
//! ([`ColocatedFunction`]), keyed by tree keys every SDK takes from here
//! ([`flat_tree_key`], [`tree_key`]); discovery of a function's outputs on the local
//! host and on workers (the built-in `colocated` language parks each host's
//! outputs per session and pops them as global arrays); and the lifecycle of
//! objects of colocated classes (built lazily per host and session with
//! [`host_object`], destroyed on every host when their [`ColocatedObject`]
//! handle goes, and with their session on a worker).
//!
//! [`ExecutionContext::host_input_arrays`]: crate::ExecutionContext::host_input_arrays
//! [`ExecutionContext::set_host_outputs`]: crate::ExecutionContext::set_host_outputs

mod discovery;
mod function;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod objects;
mod spec;
mod tree;

use crate::languages::colocated::pb;

pub use discovery::{OutputOrigin, Outputs};
pub use function::{Call, CallSite, ColocatedFunction, Entry, Payload};
pub use objects::ColocatedObject;
pub use spec::{CacheInfo, CallSpec, SpecCache};
pub use tree::{flat_tree_key, new_tree_key, tree_key};

/// A key no other controller of a shared worker picks (63 random bits).
fn random_key() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // Without the system's randomness: a counter mixed with the clock.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes = (n ^ t.rotate_left(17) ^ u64::from(std::process::id())).to_le_bytes();
    }
    u64::from_le_bytes(bytes) >> 1
}
