//! The dispatcher: per-stream FIFO queues served by a pool of executor threads.
//!
//! Submission is lock-free: a task goes into its stream's `SegQueue`, and a stream
//! that was idle is pushed onto the shared run queue with one CAS. A stream is run by
//! one thread at a time, so its tasks run in submission order; different streams run
//! concurrently. A task whose dependencies are not ready parks its stream (later
//! tasks of that stream wait behind it) until they are.
//!
//! A thread that waits on an event produced by a task that has not started yet runs
//! the head of that stream itself, in order, instead of waiting for a handoff to an
//! executor thread (which costs a context switch per call).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use crate::error::Result;
use crate::future::Event;

mod pool;
mod queue;

pub(crate) use pool::Dispatcher;
use queue::Until;

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const BLOCKED: u8 = 3;

/// Tasks one turn of a stream may run before other streams get the executor.
const BUDGET: usize = 256;
/// How long an idle executor keeps looking for work before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// A unit of work: runs after its dependencies are ready, with their combined status
/// (the first error among them, if any). `completion` is failed with `internal` if
/// `run` panics, so nothing waits forever on a task that died.
pub(crate) struct Task {
    pub deps: Vec<Event>,
    pub completion: Event,
    pub run: Job,
    /// Leave the task to a waiting thread while its stream is being fed (see
    /// `LoadedProgram::waiter_first`).
    pub waiter_first: bool,
    /// The task only hands work to another host or to a device's queue (a
    /// send, an enqueue: it never blocks): the submitting thread runs it at
    /// once when its stream is idle, rather than waking an executor to do it.
    pub hands_off: bool,
}

/// How long executor threads leave a stream to its waiter after the last
/// `waiter_first` submission.
const WAITER_HEAD_START: Duration = Duration::from_micros(100);

/// A thread that has this many `waiter_first` tasks queued on a stream nobody
/// runs yet runs them itself when it submits the next one ("caller runs"): a
/// thread that pipelines calls without waiting keeps them on its own thread (no
/// GIL handoff), and its backlog stays bounded.
const CALLER_RUNS_DEPTH: usize = 64;

/// Nanoseconds since the first call (a process-wide monotonic clock).
fn now_nanos() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What a task runs: called once, on the thread that runs the task, with the
/// combined status of its dependencies and the task's completion. Closures
/// over the status are jobs; executions implement it on their own state. The
/// dispatcher knows nothing of what it runs, so it sits below the object model.
pub(crate) trait Work: Send {
    fn run(self: Box<Self>, status: Result<()>, done: &Event);
}

impl<F: FnOnce(Result<()>) + Send> Work for F {
    fn run(self: Box<Self>, status: Result<()>, _done: &Event) {
        (*self)(status)
    }
}

/// A task's work, boxed.
pub(crate) type Job = Box<dyn Work>;

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// An ordering domain: executions submitted on one stream run in submission order on
/// each host. By default every OS thread has its own stream per client.
///
/// Thread-safety: a stream may be shared and used from any thread; submissions made
/// concurrently from several threads are ordered by the queue, not by the caller.
#[derive(Clone)]
pub struct Stream(Arc<StreamInner>);

struct StreamInner {
    id: u64,
    /// The dispatcher (client) the stream belongs to.
    owner: u64,
    local: std::sync::OnceLock<Arc<StreamQueue>>,
}

impl Stream {
    /// A new stream with a fresh id, for the dispatcher `owner`.
    pub(crate) fn new(owner: u64) -> Stream {
        Stream(Arc::new(StreamInner {
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            owner,
            local: std::sync::OnceLock::new(),
        }))
    }

    /// True once the stream's dispatcher has shut down (its client is gone).
    fn is_defunct(&self) -> bool {
        self.0
            .local
            .get()
            .is_some_and(|q| q.shared.shutdown.load(Ordering::Relaxed))
    }

    /// The id of the dispatcher (client) the stream belongs to.
    pub(crate) fn owner(&self) -> u64 {
        self.0.owner
    }

    /// The stream's process-unique id (also the track id in traces).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    pub(crate) fn local_queue(&self, dispatcher: &Dispatcher) -> &Arc<StreamQueue> {
        self.0.local.get_or_init(|| {
            Arc::new(StreamQueue {
                tasks: SegQueue::new(),
                state: AtomicU8::new(IDLE),
                head: Mutex::new(None),
                has_head: AtomicBool::new(false),
                defer_until: AtomicU64::new(0),
                shared: dispatcher.shared.clone(),
                stream_id: self.0.id,
            })
        })
    }
}

thread_local! {
    /// Default streams of this thread, keyed by (dispatcher, task depth, scope).
    static THREAD_STREAMS: RefCell<Vec<StreamKey>> = const { RefCell::new(Vec::new()) };
    /// The stream scope this thread runs in now (see [`set_stream_scope`]).
    static STREAM_SCOPE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The streams whose tasks this thread is running now, innermost last.
    static RUNNING_HERE: RefCell<Vec<*const StreamQueue>> = const { RefCell::new(Vec::new()) };
    /// Streams this thread uses instead of its own (see [`with_stream`]),
    /// innermost last.
    static STREAM_OVERRIDES: RefCell<Vec<Stream>> = const { RefCell::new(Vec::new()) };
    /// Streams this thread claimed for tasks it submitted, to run them later
    /// (see [`claim_idle_tasks`]); `None` when it claims none.
    static CLAIMS: RefCell<Option<Claims>> = const { RefCell::new(None) };
}

/// A stream that this thread claimed for one task it submitted (see
/// [`claim_idle_tasks`]): tasks submitted after it queue behind it. Runs the
/// task when run, or when dropped.
pub(crate) struct Claimed(Option<Arc<StreamQueue>>);

impl Claimed {
    /// Runs the task on this thread; the stream's later tasks go to the
    /// executors.
    pub(crate) fn run(mut self) {
        if let Some(queue) = self.0.take() {
            queue.run_claimed(Until::Budget(1));
        }
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if let Some(queue) = self.0.take() {
            queue.run_claimed(Until::Budget(1));
        }
    }
}

/// Tasks a thread claimed: mostly one, kept inline.
pub(crate) type Claims = smallvec::SmallVec<[Claimed; 1]>;

/// Runs `f`. Tasks it submits on idle streams (nothing queued or running
/// there, dependencies ready, not left to a waiter) are claimed for this
/// thread instead of woken executors: they are returned, to run on this
/// thread once it is done with what it holds (a thread that reads a worker's
/// operations from a connection runs a quick program itself, and answers
/// from there, with no hand-off to an executor).
pub(crate) fn claim_idle_tasks<R>(f: impl FnOnce() -> R) -> (R, Claims) {
    let outer = CLAIMS.with(|c| c.borrow_mut().replace(Claims::new()));
    let result = f();
    let claimed = CLAIMS.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer));
    (result, claimed.unwrap_or_default())
}

/// Whether this thread claims the tasks it submits (see [`claim_idle_tasks`]).
fn claiming() -> bool {
    CLAIMS.with(|c| c.borrow().is_some())
}

/// Runs `f` with `stream` as the calling thread's stream of its client: what
/// `f` submits without naming a stream queues on `stream`, in program order
/// with what other threads queued there. For an SDK whose one logical thread
/// of calls runs on several OS threads (Node's event loop, and libuv's pool
/// for the calls that wait). Code inside a task still gets streams of its own.
pub fn with_stream<R>(stream: &Stream, f: impl FnOnce() -> R) -> R {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            STREAM_OVERRIDES.with(|o| o.borrow_mut().pop());
        }
    }
    STREAM_OVERRIDES.with(|o| o.borrow_mut().push(stream.clone()));
    let _pop = Pop;
    f()
}

thread_local! {
    static ON_EVENT_LOOP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` as an event loop's call (Node's): a program that enqueues on a
/// device (see `LoadedProgram::enqueues`) and that `f` submits is handed to
/// an executor thread instead of being dispatched on this thread, since a
/// plugin may run the whole program before it returns (XLA's CPU plugin
/// does), and an event loop must not block.
pub fn as_event_loop<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            ON_EVENT_LOOP.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(ON_EVENT_LOOP.with(|c| c.replace(true)));
    f()
}

/// Whether this thread runs an event loop's call (see [`as_event_loop`]).
pub(crate) fn on_event_loop() -> bool {
    ON_EVENT_LOOP.with(std::cell::Cell::get)
}

/// A place held in a stream's program order for work that is not known yet:
/// an asynchronous SDK's call that must first compile or discover off the
/// caller's thread holds its place, so that what the caller queues after it
/// runs after it. [`reached`](Self::reached) is ready once everything queued
/// before has run; the stream then waits (later work stays queued) until the
/// slot is released: by [`release_after`](Self::release_after) the held
/// work's completion, or when the slot is dropped.
///
/// The held work runs on a stream of its own (the slot's stream waits for
/// it), whose work starts once `reached` is ready: work submitted inside
/// [`run_in`](Self::run_in) may be submitted at any time before that, from
/// any thread, and keeps its place.
pub struct StreamSlot {
    reached: Event,
    release: Option<Event>,
    /// The held work's stream: its first task waits for `reached`.
    held: Stream,
}

impl StreamSlot {
    /// Ready when the work queued before the slot has run; failed if the
    /// stream's client shut down first.
    pub fn reached(&self) -> &Event {
        &self.reached
    }

    /// Runs `f` on the calling thread with the held work's stream as the
    /// thread's stream of the slot's client (see [`with_stream`]): what `f`
    /// submits runs in the slot's place, in the order submitted, without `f`
    /// waiting for the place (a wait inside `f` for that work waits for
    /// everything queued before the slot too).
    pub fn run_in<R>(&self, f: impl FnOnce() -> R) -> R {
        with_stream(&self.held, f)
    }

    /// Lets the stream go on once `done` is ready (whatever its status): the
    /// held work's completion.
    pub fn release_after(mut self, done: &Event) {
        if let Some(release) = self.release.take() {
            done.when_ready(move |_| release.set_if_pending(Ok(())));
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release.set_if_pending(Ok(()));
        }
    }
}

/// A default stream of a thread: (dispatcher, task depth, scope, stream).
type StreamKey = (u64, usize, u64, Stream);

/// The calling thread's default stream for the dispatcher `owner_id`, in the
/// thread's current scope (see [`set_stream_scope`]).
///
/// Code running inside a task (a native function, on an executor thread or inline
/// in a waiter) gets a stream of its own per nesting depth: its nested calls must
/// not queue behind the very task that makes them.
pub(crate) fn thread_stream(owner_id: u64) -> Stream {
    let depth = RUNNING_HERE.with(|r| r.borrow().len());
    if depth == 0 {
        let chosen = STREAM_OVERRIDES.with(|o| {
            let o = o.borrow();
            o.iter().rev().find(|s| s.owner() == owner_id).cloned()
        });
        if let Some(stream) = chosen {
            return stream;
        }
    }
    let scope = STREAM_SCOPE.with(|s| s.get());
    THREAD_STREAMS.with(|streams| {
        let mut streams = streams.borrow_mut();
        if let Some((_, _, _, s)) = streams
            .iter()
            .find(|(id, d, sc, _)| *id == owner_id && *d == depth && *sc == scope)
        {
            return s.clone();
        }
        // A miss is rare (first use per client, depth and scope): drop the
        // streams of clients that are gone, so long-lived threads do not
        // accumulate them.
        streams.retain(|(_, _, _, s)| !s.is_defunct());
        let s = Stream::new(owner_id);
        streams.push((owner_id, depth, scope, s.clone()));
        s
    })
}

/// The stream of the calls that code running for the calling thread's task
/// makes, from this thread or another (see `ExecutionContext::nested_stream`):
/// this thread's default stream at its nesting depth, which is never the
/// task's own; outside a task, a new stream.
pub(crate) fn nested_stream(owner_id: u64) -> Stream {
    if RUNNING_HERE.with(|r| r.borrow().is_empty()) {
        return Stream::new(owner_id);
    }
    thread_stream(owner_id)
}

/// Sets the calling thread's stream scope and returns the previous one.
///
/// A thread's default streams (one per client) belong to its current scope:
/// executions submitted in different scopes run concurrently, like those of
/// different threads, while those of one scope keep program order. Scope 0,
/// where every thread starts, is the thread itself. An SDK gives each logical
/// thread of control that shares OS threads with others its own scope: one
/// work item of a thread pool, one asynchronous context.
pub fn set_stream_scope(scope: u64) -> u64 {
    STREAM_SCOPE.with(|s| s.replace(scope))
}

/// Forgets the calling thread's default streams of `scope` (a scope that has
/// ended: a finished work item). Executions already submitted in it still run;
/// a later use of the scope starts new streams, unordered with the old ones.
pub fn forget_stream_scope(scope: u64) {
    let _ = THREAD_STREAMS.try_with(|streams| {
        if let Ok(mut streams) = streams.try_borrow_mut() {
            streams.retain(|(_, _, sc, _)| *sc != scope);
        }
    });
}

/// True when this thread is running a task of `queue` right now.
fn running_here(queue: *const StreamQueue) -> bool {
    RUNNING_HERE.with(|r| r.borrow().contains(&queue))
}

/// Forgets this thread's default stream for `owner_id` (when a client goes away).
pub(crate) fn forget_thread_stream(owner_id: u64) {
    let _ = THREAD_STREAMS.try_with(|streams| {
        if let Ok(mut streams) = streams.try_borrow_mut() {
            streams.retain(|(id, _, _, _)| *id != owner_id);
        }
    });
}

struct Shared {
    run_queue: SegQueue<Arc<StreamQueue>>,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Streams whose executions wait for their waiter first (`Task::waiter_first`):
    /// the deferrer thread hands them to the executors after a pause in
    /// submissions, unless a waiter took them before.
    deferred: SegQueue<Arc<StreamQueue>>,
    deferrer_idle: AtomicBool,
    defer_wake: Condvar,
    /// Executor threads alive, and those of them looking for work (spinning or
    /// asleep) rather than running a stream.
    live: AtomicUsize,
    idle: AtomicUsize,
    /// Threads kept while idle, and the most there may be (see `Dispatcher::new`).
    min_threads: usize,
    max_threads: usize,
    /// How long a thread beyond `min_threads` stays idle before it exits.
    keep_alive: Duration,
    /// Whether an idle executor looks for work for [`SPIN`] before it sleeps
    /// (see [`Dispatcher::stop_spinning`]).
    spins: AtomicBool,
    /// Signalled (under `lock`) when an executor thread exits.
    exited: Condvar,
    next_index: AtomicUsize,
    id: u64,
    label: String,
}

/// One stream's queue on one host's dispatcher.
pub(crate) struct StreamQueue {
    tasks: SegQueue<Task>,
    state: AtomicU8,
    /// A task whose dependencies were not ready; touched only by the thread that
    /// holds the stream (state RUNNING).
    head: Mutex<Option<Task>>,
    has_head: AtomicBool,
    /// Executors leave the stream alone until then (see `Task::waiter_first`).
    defer_until: AtomicU64,
    shared: Arc<Shared>,
    stream_id: u64,
}

#[cfg(test)]
mod tests;
