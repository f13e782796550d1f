//! What runs programs on a host: language executors (one per program language;
//! `native` is built in, SDKs add `python` and `node`), the registry of native
//! functions, and the context a running program sees.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

mod context;
mod languages;
mod native;

pub(crate) use context::{DiscoverySink, Produced};
pub use context::{ExecutionContext, OutputShard};
pub(crate) use languages::Languages;
pub use native::native_payload;
/// A native function: reads its inputs from the context and sets every output.
pub type NativeFn = dyn Fn(&mut ExecutionContext<'_>) -> Result<()> + Send + Sync;

/// Runs the programs of one language on a host.
///
/// `load` runs once per host at compile (and load) time: it validates the payload
/// and prepares what runs (resolves a native name, deserializes code). Errors there
/// are the caller's misuse (`invalid_argument`, `not_found`, …).
pub trait LanguageExecutor: Send + Sync + 'static {
    /// Prepares `program` for this host.
    fn load(&self, program: &crate::program::Program) -> Result<Arc<dyn LoadedProgram>>;

    /// A session of a worker this process serves ended: its controller closed
    /// it, it timed out (the controller is gone), or the worker stopped. Free
    /// everything the session's programs left behind — what they keyed by
    /// [`ExecutionContext::session`] (objects, parked results, caches).
    ///
    /// Called once per ended session for every registered executor, after
    /// every execution of the session has finished (and none starts any
    /// more), on a thread of its own: never on a network thread nor under the
    /// worker's locks, so it may block (to take Python's GIL, say) and run
    /// user code such as destructors. Never called for
    /// [`SessionKey::LOCAL`]. The default does nothing.
    fn session_ended(&self, session: SessionKey) {
        let _ = session;
    }
}

/// The session a program runs for: on a worker, each controller's session
/// has its own key, never reused in the process; programs that a process runs
/// for its own client run in [`SessionKey::LOCAL`]. Language executors key
/// what programs leave behind by it and free it in
/// [`LanguageExecutor::session_ended`]. Opaque: it says nothing about the
/// session's id on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(u64);

impl SessionKey {
    /// The implicit session of programs a process runs for its own client
    /// (the controller's own host); it never ends.
    pub const LOCAL: SessionKey = SessionKey(0);

    /// A key no other session of this process has had.
    pub(crate) fn fresh() -> SessionKey {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SessionKey(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The key as a number (0 for [`SessionKey::LOCAL`]), e.g. for an SDK to
    /// key its stores by.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// True for [`SessionKey::LOCAL`].
    pub fn is_local(self) -> bool {
        self == SessionKey::LOCAL
    }
}

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "session {}", self.0)
    }
}

thread_local! {
    /// While a worker loads a program a controller sent: the controller's id
    /// of each of the host's devices -> the host's own id.
    static CONTROLLER_IDS: std::cell::RefCell<Option<HashMap<u32, u32>>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes a controller's device ids current on this thread while a worker
/// loads its program; restores the outer ones when dropped.
pub(crate) struct ControllerIds(Option<HashMap<u32, u32>>);

impl ControllerIds {
    /// `ids`: controller id -> this host's id.
    pub(crate) fn enter(ids: HashMap<u32, u32>) -> ControllerIds {
        ControllerIds(CONTROLLER_IDS.with(|c| c.replace(Some(ids))))
    }
}

impl Drop for ControllerIds {
    fn drop(&mut self) {
        let outer = self.0.take();
        CONTROLLER_IDS.with(|c| *c.borrow_mut() = outer);
    }
}

/// This host's id of the device the controller calls `id`, for a language
/// executor that meets device ids while it loads a program (Python's
/// unpickling of captured devices): `Ok(None)` when this thread is not
/// loading a program a controller sent with its ids (ids are this process's
/// own), `not_found` for a device of the controller that is not on this host.
pub fn controller_device_id(id: u32) -> Result<Option<u32>> {
    CONTROLLER_IDS.with(|c| match &*c.borrow() {
        None => Ok(None),
        Some(ids) if ids.is_empty() => Ok(None),
        Some(ids) => ids.get(&id).copied().map(Some).ok_or_else(|| {
            let mut known: Vec<u32> = ids.keys().copied().collect();
            known.sort_unstable();
            Error::not_found(format!(
                "device {id} of the controller is not on this host (its devices are {known:?} there)"
            ))
        }),
    })
}

/// Gives the memory that the C allocator (glibc's `malloc`) holds free back
/// to the system (`malloc_trim(0)`); elsewhere a no-op. A worker calls it
/// after freeing a session; a language executor whose runtime frees through
/// `malloc` may call it after freeing much at once.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointers and is thread-safe; it only
    // returns free pages of the heap to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A worker session as the executables loaded in it see it: its key, and
/// whether it ended (then its programs that have not started yet fail
/// instead of running).
pub(crate) struct SessionScope {
    key: SessionKey,
    ended: AtomicBool,
}

impl SessionScope {
    /// A new session's scope, with a fresh key.
    pub(crate) fn new() -> SessionScope {
        SessionScope {
            key: SessionKey::fresh(),
            ended: AtomicBool::new(false),
        }
    }

    pub(crate) fn key(&self) -> SessionKey {
        self.key
    }

    /// Marks the session ended: its programs that have not started fail.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }
}

/// A program prepared by a [`LanguageExecutor`], run once per execution on the
/// host's executor threads (several at once, for different streams).
pub trait LoadedProgram: Send + Sync + 'static {
    /// Runs the program: reads the context's inputs and sets every output shard.
    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()>;

    /// True when the program runs best on the thread that waits for it (it needs
    /// something that thread holds, such as Python's GIL): executor threads then
    /// leave a stream's executions to its waiter while the stream is being fed,
    /// and take them only after a short pause in submissions.
    fn waiter_first(&self) -> bool {
        false
    }

    /// True when `run` only hands the work to a device that orders it (a PJRT
    /// plugin's queue) and never blocks: the submitting thread runs it at
    /// once when its stream is idle and its inputs are there (as JAX
    /// dispatches), an input still being computed on that device does not
    /// hold it back, and the outputs `run` sets may still be pending: the
    /// execution completes when they are ready.
    fn enqueues(&self) -> bool {
        false
    }

    /// The program in a form its language loads again without compiling it
    /// (an XLA program's plugin executable), which
    /// [`LoadedExecutable::serialize`](crate::LoadedExecutable::serialize)
    /// stores as the payload; `None` (the default): the payload as given.
    fn artifact(&self) -> Option<Vec<u8>> {
        None
    }

    /// Whether two structures of results in this program's language are the
    /// same (see [`Program::output_structure`](crate::Program::output_structure)):
    /// by default, the same bytes; a language whose encoding is not canonical
    /// (an object's key order, say) compares them its own way.
    fn same_structure(&self, a: &[u8], b: &[u8]) -> bool {
        a == b
    }
}

impl<F> LoadedProgram for F
where
    F: Fn(&mut ExecutionContext<'_>) -> Result<()> + Send + Sync + 'static,
{
    fn run(&self, ctx: &mut ExecutionContext<'_>) -> Result<()> {
        self(ctx)
    }
}
