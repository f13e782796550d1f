//! The host's store of objects of colocated classes: built lazily per
//! session on first use, destroyed when their controller's handle goes or
//! their session ends.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use crate::executor::SessionKey;

/// A language's value kept on a host: a real object, or the error its
/// constructor raised (re-raised to every later call).
pub type HostValue = Arc<dyn Any + Send + Sync>;

/// What building an object gave: the object, or its constructor's error.
pub type Built = std::result::Result<HostValue, HostValue>;

type Slot = Arc<OnceLock<Built>>;
type Store = HashMap<SessionKey, HashMap<u64, Slot>>;

static OBJECTS: LazyLock<Mutex<Store>> = LazyLock::new(Default::default);

fn store() -> std::sync::MutexGuard<'static, Store> {
    OBJECTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The object `id` of `session` on this host: built by `build` on first use
/// (once, even when calls on several streams ask at once: the others wait for
/// it), then the same object, or the constructor's error, every time.
///
/// `build` runs without any lock of core held; a language whose runtime has a
/// global lock (Python's GIL) must call this without holding it and take it
/// inside `build`, or two threads could wait on each other.
pub fn host_object(session: SessionKey, id: u64, build: impl FnOnce() -> Built) -> Built {
    let slot: Slot = store()
        .entry(session)
        .or_default()
        .entry(id)
        .or_default()
        .clone();
    slot.get_or_init(build).clone()
}

/// How many objects `session` (`None`: every session) holds on this host.
pub fn host_objects(session: Option<SessionKey>) -> usize {
    let store = store();
    match session {
        Some(session) => store.get(&session).map_or(0, HashMap::len),
        None => store.values().map(HashMap::len).sum(),
    }
}

/// Destroys object `id` of `session` on this host (when this was its last
/// reference, its destructor runs now, on this thread, with no lock of core
/// held).
pub(crate) fn forget(session: SessionKey, id: u64) {
    let slot = {
        let mut store = store();
        let Some(objects) = store.get_mut(&session) else {
            return;
        };
        let slot = objects.remove(&id);
        if objects.is_empty() {
            store.remove(&session);
        }
        slot
    };
    drop(slot);
}

/// Destroys every object of `session` on this host (it ended).
pub(crate) fn end_session(session: SessionKey) {
    let objects = store().remove(&session);
    if let Some(objects) = &objects {
        if !objects.is_empty() {
            tracing::debug!(%session, count = objects.len(), "destroying the objects of an ended session");
        }
    }
    drop(objects);
}
