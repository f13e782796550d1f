//! Events: one-shot completion signals that carry `Ok` or an [`Error`].
//!
//! An [`Event`] is what PJRT calls a future: `is_ready`, a blocking `wait` (with or
//! without a deadline), `on_ready` callbacks that run exactly once, and `.await` from
//! Rust async code. Events made by the runtime are fulfilled by it; [`Event::new`]
//! gives one the caller fulfils with [`Event::set`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::error::{Error, Result};

const PENDING: u8 = 0;
const SETTING: u8 = 1;
const OK: u8 = 2;
const FAILED: u8 = 3;

type Callback = Box<dyn FnOnce(Result<()>) + Send>;

/// A callback, and whether it came from outside the crate (see
/// [`Event::on_ready`]).
type Registered = (Callback, bool);
/// An event's callbacks.
type Callbacks = smallvec::SmallVec<[Registered; 1]>;

/// Something that can make progress on the work that fulfils an event, on the
/// waiting thread (the dispatcher runs a not-yet-started call inline, in order).
pub(crate) trait Helper: Send + Sync {
    /// True when the work behind this helper waits for a task the calling thread
    /// is running (waiting would never end).
    fn blocks_on_caller(&self) -> bool;
    fn help(self: Arc<Self>, target: &Event);
}

struct Inner {
    state: AtomicU8,
    /// Callbacks or sleeping threads wait (set under `callbacks`' lock).
    has_waiters: AtomicBool,
    /// A thread sleeps on `cond` (set under `callbacks`' lock): only then
    /// does `set` pay the system call that wakes it.
    sleeping: AtomicBool,
    error: OnceLock<Error>,
    /// One inline: most events get at most one callback, and it costs no
    /// allocation then.
    callbacks: Mutex<Callbacks>,
    cond: Condvar,
    helper: OnceLock<Weak<dyn Helper>>,
    /// The waker of the task polling this event (`.await`), registered once.
    waker: OnceLock<Arc<Mutex<Option<Waker>>>>,
    /// A thread waits for this event through the [`WaitHook`]: `set` wakes
    /// it there.
    hooked: AtomicBool,
    /// The work that sets it has left its stream (sent to a worker, queued on
    /// a device): nothing queued there holds it back any more.
    dispatched: AtomicBool,
}

/// What a thread that is about to sleep until an event is ready may do
/// instead, installed once by the transport when the process has lanes to
/// read: wait by reading the connections whose answers complete events
/// (then the answer it waits for needs no other thread woken). `set` calls
/// `wake` for an event a thread waits for that way.
pub(crate) struct WaitHook {
    /// Waits for the event (at most until the deadline); `None` when this
    /// thread cannot (another does it): then it sleeps as usual.
    pub(crate) wait: fn(&Event, Option<Instant>) -> Option<Result<()>>,
    /// Wakes the thread that waits through the hook.
    pub(crate) wake: fn(),
    /// Something other than a thread waiting through the hook began to
    /// wait (a thread asleep, a callback of the user's): whoever reads
    /// lanes should, soon.
    pub(crate) awaited: fn(),
    /// Runs a callback of the user's on another thread: one that an event
    /// set by a thread waiting through the hook would have run there (the
    /// waiting thread may hold what the callback needs).
    pub(crate) defer: fn(Box<dyn FnOnce() + Send>),
}

thread_local! {
    /// This thread waits through the [`WaitHook`] now.
    static IN_HOOK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static WAIT_HOOK: OnceLock<WaitHook> = OnceLock::new();

/// How many rounds of spinning a wait makes before it uses the hook (the
/// spins double: 15 `pause`s in all, under a microsecond where a `pause`
/// takes 140 cycles). An answer from a worker takes tens of microseconds,
/// so a longer spin only kept a CPU from the worker (on one CPU, 10% of a
/// call's time went to seven rounds).
const HOOKED_SPINS: u32 = 4;

/// Installs `hook` for the process (the first one stays).
pub(crate) fn install_wait_hook(hook: WaitHook) {
    let _ = WAIT_HOOK.set(hook);
}

/// Threads asleep until an event is ready, not through the [`WaitHook`]
/// (counted only once a hook is installed).
static ASLEEP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Callbacks of the user's ([`Event::on_ready`]) that wait for their event.
static CALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether something waits for an event other than through the
/// [`WaitHook`]: a thread asleep (another thread held the hook, or it is
/// one that may not read lanes), or a callback of the user's. Whoever
/// reads lanes completes its event.
pub(crate) fn waited_for_elsewhere() -> bool {
    ASLEEP.load(Ordering::SeqCst) > 0 || CALLBACKS.load(Ordering::SeqCst) > 0
}

/// How many of `callbacks` are the user's (counted in [`CALLBACKS`]).
fn foreign(callbacks: &[Registered]) -> usize {
    callbacks.iter().filter(|(_, foreign)| *foreign).count()
}

/// Counts a thread in [`ASLEEP`] while it lives.
struct Asleep;

impl Asleep {
    fn new() -> Asleep {
        ASLEEP.fetch_add(1, Ordering::SeqCst);
        Asleep
    }
}

impl Drop for Asleep {
    fn drop(&mut self) {
        ASLEEP.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A one-shot completion signal. Cloning gives another handle to the same event.
///
/// Thread-safety: every method may be called from any thread.
#[derive(Clone)]
pub struct Event(Arc<Inner>);

impl Default for Event {
    fn default() -> Self {
        Event::new()
    }
}

impl Drop for Inner {
    /// Callbacks of an event dropped before it was set never run: they no
    /// longer wait.
    fn drop(&mut self) {
        let callbacks = self.callbacks.get_mut().unwrap_or_else(|e| e.into_inner());
        if !callbacks.is_empty() {
            CALLBACKS.fetch_sub(foreign(callbacks), Ordering::SeqCst);
        }
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status() {
            None => f.write_str("Event(pending)"),
            Some(Ok(())) => f.write_str("Event(ok)"),
            Some(Err(e)) => write!(f, "Event({e})"),
        }
    }
}

impl Event {
    /// A pending event, to be fulfilled with [`Event::set`].
    pub fn new() -> Event {
        Event(Arc::new(Inner {
            state: AtomicU8::new(PENDING),
            has_waiters: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            error: OnceLock::new(),
            callbacks: Mutex::new(Callbacks::new()),
            cond: Condvar::new(),
            helper: OnceLock::new(),
            waker: OnceLock::new(),
            hooked: AtomicBool::new(false),
            dispatched: AtomicBool::new(false),
        }))
    }

    /// An event that is already complete with `result`.
    pub fn ready(result: Result<()>) -> Event {
        let event = Event::new();
        // A fresh event cannot have been set before.
        let _ = event.set(result);
        event
    }

    /// An event that is already complete with success. Shared: costs no
    /// allocation (for the many operations that finish during the call).
    pub fn ready_ok() -> Event {
        static READY: OnceLock<Event> = OnceLock::new();
        READY.get_or_init(|| Event::ready(Ok(()))).clone()
    }

    /// True once the event carries a result.
    pub fn is_ready(&self) -> bool {
        self.0.state.load(Ordering::Acquire) >= OK
    }

    /// The result, if ready.
    pub fn status(&self) -> Option<Result<()>> {
        match self.0.state.load(Ordering::Acquire) {
            OK => Some(Ok(())),
            FAILED => {
                Some(Err(self.0.error.get().cloned().unwrap_or_else(|| {
                    Error::internal("event failed without an error")
                })))
            }
            _ => None,
        }
    }

    /// The error, if the event is ready and failed.
    pub fn error(&self) -> Option<Error> {
        self.status().and_then(|r| r.err())
    }

    /// True when both handles refer to the same event.
    pub fn same_as(&self, other: &Event) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Fulfils the event. Fails with `failed_precondition` if it was already set.
    /// Callbacks registered with [`Event::on_ready`] run on this thread
    /// (unless this thread is itself waiting for an event: then on
    /// another).
    pub fn set(&self, result: Result<()>) -> Result<()> {
        if self
            .0
            .state
            .compare_exchange(PENDING, SETTING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::failed_precondition("the event was already set"));
        }
        let state = match result {
            Ok(()) => OK,
            Err(e) => {
                let _ = self.0.error.set(e);
                FAILED
            }
        };
        self.0.state.store(state, Ordering::SeqCst);
        if self.0.hooked.load(Ordering::SeqCst) {
            if let Some(hook) = WAIT_HOOK.get() {
                (hook.wake)();
            }
        }
        if self.0.has_waiters.load(Ordering::SeqCst) {
            let (callbacks, sleeping) = {
                let mut callbacks = self.lock();
                (
                    std::mem::take(&mut *callbacks),
                    self.0.sleeping.load(Ordering::SeqCst),
                )
            };
            if sleeping {
                self.0.cond.notify_all();
            }
            if !callbacks.is_empty() {
                CALLBACKS.fetch_sub(foreign(&callbacks), Ordering::SeqCst);
                let status = self.status().unwrap_or(Ok(()));
                let defer = IN_HOOK
                    .with(std::cell::Cell::get)
                    .then(|| WAIT_HOOK.get().map(|hook| hook.defer))
                    .flatten();
                for (cb, foreign) in callbacks {
                    if let (true, Some(defer)) = (foreign, defer) {
                        let status = status.clone();
                        defer(Box::new(move || cb(status)));
                        continue;
                    }
                    // One callback's panic must not strand the others (a
                    // dependent stream's wake-up among them).
                    let status = status.clone();
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cb(status)))
                        .is_err()
                    {
                        tracing::error!(
                            "an on_ready callback panicked; the other callbacks still ran"
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Marks the work that sets the event as gone from its stream (sent to a
    /// worker, queued on a device): a wait no longer runs the stream's queue
    /// for it, nor takes it for work queued behind the waiting task.
    pub(crate) fn set_dispatched(&self) {
        self.0.dispatched.store(true, Ordering::Release);
    }

    /// Sets the event unless it is already set (used where several paths may
    /// complete the same work, e.g. a failure after a partial success).
    pub(crate) fn set_if_pending(&self, result: Result<()>) {
        let _ = self.set(result);
    }

    /// Runs `callback` exactly once with the result: now, on this thread, if the
    /// event is ready, else on a thread of the runtime: the one that fulfils
    /// it, or, when that thread is one waiting for an event (which may hold
    /// what the callback needs), another.
    pub fn on_ready(&self, callback: impl FnOnce(Result<()>) + Send + 'static) {
        self.register(Box::new(callback), true);
    }

    /// [`on_ready`](Self::on_ready) for the crate's own callbacks: short,
    /// and run on the thread that fulfils the event, whichever it is.
    pub(crate) fn when_ready(&self, callback: impl FnOnce(Result<()>) + Send + 'static) {
        self.register(Box::new(callback), false);
    }

    fn register(&self, callback: Callback, foreign: bool) {
        if let Some(status) = self.status() {
            callback(status);
            return;
        }
        let mut callbacks = self.lock();
        self.0.has_waiters.store(true, Ordering::SeqCst);
        if self.0.state.load(Ordering::SeqCst) < OK {
            if foreign {
                CALLBACKS.fetch_add(1, Ordering::SeqCst);
            }
            callbacks.push((callback, foreign));
            drop(callbacks);
            if let (true, Some(hook)) = (foreign, WAIT_HOOK.get()) {
                (hook.awaited)();
            }
            return;
        }
        drop(callbacks);
        callback(self.status().unwrap_or(Ok(())));
    }

    /// Blocks until the event is ready and returns its result.
    pub fn wait(&self) -> Result<()> {
        self.wait_until(None)
    }

    /// Blocks at most `timeout`; fails with `deadline_exceeded` if the event is still
    /// pending then (the event itself is unaffected).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        self.wait_until(Some(Instant::now() + timeout))
    }

    fn wait_until(&self, deadline: Option<Instant>) -> Result<()> {
        if let Some(status) = self.status() {
            return status;
        }
        // Once its work has left the stream (a worker, a device completes
        // it), neither the stream's order nor running it inline applies.
        let helper = match self.0.dispatched.load(Ordering::Acquire) {
            true => None,
            false => self.0.helper.get().and_then(Weak::upgrade),
        };
        if let Some(helper) = &helper {
            if helper.blocks_on_caller() {
                return Err(Error::failed_precondition(
                    "waiting for work queued behind the task this thread is running, on the same stream, would never end",
                ));
            }
        }
        // Running queued work inline has no deadline, so only unbounded waits help.
        if let Some(helper) = deadline.is_none().then_some(helper).flatten() {
            helper.help(self);
            if let Some(status) = self.status() {
                return status;
            }
        }
        // The producer is running on another thread: spin briefly, since most
        // programs finish in microseconds and parking costs more than that.
        // With lanes to read (the hook), only a few microseconds, without
        // yielding: the answer of a remote host takes longer, and the
        // thread that waits should be reading when it arrives.
        let backoff = Backoff::new();
        let hook = WAIT_HOOK.get();
        let mut spins = 0;
        while !backoff.is_completed() && (hook.is_none() || spins < HOOKED_SPINS) {
            if let Some(status) = self.status() {
                return status;
            }
            match hook {
                Some(_) => backoff.spin(),
                None => backoff.snooze(),
            }
            spins += 1;
        }
        if let Some(hook) = hook {
            // Restored after: a wait may nest in what a waiting thread runs.
            let outer = IN_HOOK.with(|in_hook| in_hook.replace(true));
            let waited = (hook.wait)(self, deadline);
            IN_HOOK.with(|in_hook| in_hook.set(outer));
            if let Some(result) = waited {
                return result;
            }
        }
        let _asleep = hook.map(|hook| {
            let asleep = Asleep::new();
            (hook.awaited)();
            asleep
        });
        let mut guard = self.lock();
        self.0.has_waiters.store(true, Ordering::SeqCst);
        self.0.sleeping.store(true, Ordering::SeqCst);
        while self.0.state.load(Ordering::SeqCst) < OK {
            match deadline {
                None => guard = self.0.cond.wait(guard).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::deadline_exceeded(
                            "the event was not ready before the deadline",
                        ));
                    }
                    guard = self
                        .0
                        .cond
                        .wait_timeout(guard, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        drop(guard);
        self.status().unwrap_or(Ok(()))
    }

    /// An event that is ready when all `events` are; it fails with the first error
    /// (in argument order) among them.
    pub fn join(events: &[Event]) -> Event {
        match events {
            [] => Event::ready_ok(),
            [one] => one.clone(),
            many => {
                let joined = Event::new();
                let all: Arc<[Event]> = many.into();
                let remaining = Arc::new(std::sync::atomic::AtomicUsize::new(many.len()));
                for e in many {
                    let (joined, all, remaining) = (joined.clone(), all.clone(), remaining.clone());
                    e.when_ready(move |_| {
                        if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                            let first_error = all.iter().find_map(Event::error);
                            joined.set_if_pending(first_error.map_or(Ok(()), Err));
                        }
                    });
                }
                joined
            }
        }
    }

    /// Marks a thread as waiting for this event through the [`WaitHook`]
    /// (`set` wakes it there), or no longer. Set before the last look at
    /// the event's state: `set` stores the state, then looks at this.
    pub(crate) fn set_hooked(&self, hooked: bool) {
        self.0.hooked.store(hooked, Ordering::SeqCst);
    }

    pub(crate) fn set_helper(&self, helper: Weak<dyn Helper>) {
        let _ = self.0.helper.set(helper);
    }

    fn lock(&self) -> MutexGuard<'_, Callbacks> {
        self.0.callbacks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `.await` support: resolves to the event's result.
impl Future for Event {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some(status) = self.status() {
            return Poll::Ready(status);
        }
        // One callback per event, whatever the number of polls; each poll only
        // replaces the waker it will wake.
        let slot = self.0.waker.get_or_init(|| {
            let slot: Arc<Mutex<Option<Waker>>> = Arc::default();
            let on_ready = slot.clone();
            self.when_ready(move |_| {
                let waker = on_ready.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(waker) = waker {
                    waker.wake();
                }
            });
            slot
        });
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        match self.status() {
            Some(status) => Poll::Ready(status),
            None => Poll::Pending,
        }
    }
}

/// Runs once with the outcome of an operation: on a network thread, so it must
/// not block.
pub type Completion = Box<dyn FnOnce(Result<()>) + Send>;

/// A progress report of a bulk transfer: `(bytes done, bytes in all)`.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

#[cfg(test)]
mod tests;
