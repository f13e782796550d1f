//! Fork safety. A forked child has none of the parent's runtime threads, so every
//! core object made before the fork is unusable there: using one fails with
//! `failed_precondition`, and dropping one leaks it rather than touching the
//! parent's locks and threads (which could hang).

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};

use colocated_core::Error;
use pyo3::prelude::*;

/// Bumped in the child after each `os.fork()` (the Python package registers the
/// hook with `os.register_at_fork`).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Marks every core object made so far as belonging to the parent process.
#[pyfunction]
pub fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    // The parent's default client is leaked, not dropped; the next use
    // creates a fresh one.
    colocated_core::reset_default_client();
}

/// A core object tagged with the fork generation it was made in.
pub struct ForkSafe<T> {
    value: ManuallyDrop<T>,
    generation: u64,
}

impl<T> ForkSafe<T> {
    /// Tags `value` with the current generation.
    pub fn new(value: T) -> Self {
        ForkSafe {
            value: ManuallyDrop::new(value),
            generation: GENERATION.load(Ordering::Relaxed),
        }
    }

    /// The value, or `failed_precondition` in a child forked after it was made.
    pub fn get(&self) -> Result<&T, Error> {
        if self.generation != GENERATION.load(Ordering::Relaxed) {
            return Err(Error::failed_precondition(
                "this object belongs to the colocated runtime of the parent process \
                 (it was created before os.fork()); the child has its own runtime: \
                 create new arrays there",
            ));
        }
        Ok(&self.value)
    }

    /// The value without the check, for immutable metadata (shape, dtype, ids) that
    /// touches no lock or thread of the runtime.
    pub fn metadata(&self) -> &T {
        &self.value
    }
}

impl<T> Drop for ForkSafe<T> {
    fn drop(&mut self) {
        if self.generation == GENERATION.load(Ordering::Relaxed) {
            // SAFETY: dropped once, here; the value is never used again.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
    }
}
