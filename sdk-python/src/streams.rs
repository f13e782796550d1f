//! Which stream a Python call runs on: program order per thread, as in JAX,
//! and per work item on the threads of a `concurrent.futures`
//! `ThreadPoolExecutor` (also behind asyncio's `to_thread` and
//! `run_in_executor`), whose work items are independent calls that merely
//! share threads. Core keeps one default stream per thread and scope
//! (`colocated_core::set_stream_scope`); this module picks the scope.

use colocated_core as core;
use pyo3::prelude::*;

thread_local! {
    /// Whether this thread is a thread pool's worker (`None`: not asked yet).
    static POOL_THREAD: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Puts the calling thread in the stream scope of the work item it runs, when
/// it is a thread pool's worker (one check per thread otherwise). A new work
/// item's scope replaces the previous one's, whose executions keep running.
pub(crate) fn enter_call_scope(py: Python<'_>) -> PyResult<()> {
    let pool = match POOL_THREAD.with(|p| p.get()) {
        Some(pool) => pool,
        None => {
            let pool = crate::hooks::hooks(py)?
                .is_pool_thread
                .call0(py)?
                .bind(py)
                .is_truthy()?;
            POOL_THREAD.with(|p| p.set(Some(pool)));
            pool
        }
    };
    if !pool {
        return Ok(());
    }
    let scope: u64 = crate::hooks::hooks(py)?
        .work_item_scope
        .call0(py)?
        .extract(py)?;
    let previous = core::set_stream_scope(scope);
    if previous != scope && previous != 0 {
        core::forget_stream_scope(previous);
    }
    Ok(())
}
