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
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use crate::error::{Error, Result};
use crate::future::{Event, Helper};

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

impl Shared {
    fn defer(&self, queue: Arc<StreamQueue>) {
        self.deferred.push(queue);
        fence(Ordering::SeqCst);
        if self.deferrer_idle.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.defer_wake.notify_all();
        }
    }

    fn schedule(self: &Arc<Self>, queue: Arc<StreamQueue>) {
        self.run_queue.push(queue);
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_one();
        } else if self.idle.load(Ordering::SeqCst) == 0 {
            self.grow();
        }
    }

    /// Starts one more executor thread when every thread is busy (running a
    /// stream, perhaps blocked in it: sleeping, waiting on I/O or on a barrier
    /// with other streams) and the pool is below `max_threads`, as a blocking
    /// pool does: runnable streams never wait for a busy thread to come back.
    fn grow(self: &Arc<Self>) {
        if self.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let mut live = self.live.load(Ordering::SeqCst);
        loop {
            if live >= self.max_threads {
                return;
            }
            match self
                .live
                .compare_exchange(live, live + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(now) => live = now,
            }
        }
        // Idle from birth, so that submissions racing with its start do not
        // start more threads than there is work.
        self.idle.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.spawn_executor() {
            self.idle.fetch_sub(1, Ordering::SeqCst);
            self.live.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(dispatcher = self.id, "cannot start an executor thread: {e}");
        }
    }

    /// Spawns an executor thread already counted in `live` and `idle`.
    fn spawn_executor(self: &Arc<Self>) -> std::io::Result<()> {
        let index = self.next_index.fetch_add(1, Ordering::Relaxed);
        let shared = self.clone();
        std::thread::Builder::new()
            .name(format!("colocated-exec-{}-{index}", self.label))
            .spawn(move || executor_loop(&shared))
            .map(drop)
    }
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

impl StreamQueue {
    fn push(self: &Arc<Self>, task: Task) {
        let waiter_first = task.waiter_first;
        if waiter_first {
            self.defer_until.store(
                now_nanos() + WAITER_HEAD_START.as_nanos() as u64,
                Ordering::Relaxed,
            );
        }
        self.tasks.push(task);
        fence(Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) == IDLE
            && self
                .state
                .compare_exchange(IDLE, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            if waiter_first {
                self.shared.defer(self.clone());
            } else {
                self.shared.schedule(self.clone());
            }
        }
    }

    /// Claims the stream for `task` if it is idle (nobody runs it, nothing
    /// waits in it) and the task's dependencies are ready, and queues it:
    /// `Ok(true)` when it is first in line, for this thread to run;
    /// `Ok(false)` when tasks another thread queued just before come first
    /// (then the executors run them all, in order). The task back when the
    /// stream is not idle.
    fn claim_idle(self: &Arc<Self>, task: Task) -> std::result::Result<bool, Task> {
        if running_here(Arc::as_ptr(self))
            || task.deps.iter().any(|d| !d.is_ready())
            || self.state.load(Ordering::SeqCst) != IDLE
            || self
                .state
                .compare_exchange(IDLE, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return Err(task);
        }
        let queued = self.has_head.load(Ordering::Relaxed) || !self.tasks.is_empty();
        self.tasks.push(task);
        if queued {
            self.release();
            return Ok(false);
        }
        Ok(true)
    }

    /// Runs `task` on this thread now if the stream is idle (see
    /// [`claim_idle`](Self::claim_idle)); gives the task back otherwise.
    fn run_now(self: &Arc<Self>, task: Task) -> Option<Task> {
        match self.claim_idle(task) {
            Err(task) => Some(task),
            Ok(first) => {
                if first {
                    self.run_claimed(Until::Budget(1));
                }
                None
            }
        }
    }

    /// Claims the stream for `task`, to run later on this thread (see
    /// [`claim_idle_tasks`]), if it is idle and the task may run now; gives
    /// the task back otherwise.
    fn claim_for_later(self: &Arc<Self>, task: Task) -> Option<Task> {
        if task.waiter_first {
            return Some(task);
        }
        match self.claim_idle(task) {
            Err(task) => return Some(task),
            Ok(false) => return None,
            Ok(true) => {}
        }
        let claim = Claimed(Some(self.clone()));
        CLAIMS.with(|c| {
            if let Some(claims) = c.borrow_mut().as_mut() {
                claims.push(claim);
            }
        });
        None
    }

    /// Called by an executor that popped this stream off the run queue.
    fn run_from_queue(self: &Arc<Self>) {
        if self
            .state
            .compare_exchange(QUEUED, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.run_claimed(Until::Yielding(BUDGET));
        }
    }

    /// Caller runs: the submitting thread runs the backlog of a stream nobody
    /// has claimed yet (see `CALLER_RUNS_DEPTH`).
    fn run_backlog(self: &Arc<Self>) {
        let backlog = self.tasks.len();
        if backlog >= CALLER_RUNS_DEPTH
            && !running_here(Arc::as_ptr(self))
            && self
                .state
                .compare_exchange(QUEUED, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.run_claimed(Until::Budget(backlog + 1));
        }
    }

    /// Runs tasks in order while this thread holds the stream; stops when `until` is
    /// ready (inline help), after `BUDGET` tasks, when blocked, or when empty.
    fn run_claimed(self: &Arc<Self>, until: Until<'_>) {
        let mut ran = 0usize;
        loop {
            let stop = match until {
                Until::Ready(target) => target.is_ready(),
                Until::Budget(budget) | Until::Yielding(budget) => ran >= budget,
            };
            if stop {
                self.release();
                return;
            }
            let next = self.take_head().or_else(|| self.tasks.pop());
            let Some(task) = next else {
                self.state.store(IDLE, Ordering::SeqCst);
                if !self.tasks.is_empty()
                    && self
                        .state
                        .compare_exchange(IDLE, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    continue;
                }
                return;
            };
            if let Some(dep) = task.deps.iter().find(|d| !d.is_ready()).cloned() {
                self.set_head(task);
                self.state.store(BLOCKED, Ordering::SeqCst);
                let me = self.clone();
                dep.when_ready(move |_| me.unblock());
                return;
            }
            if matches!(until, Until::Yielding(_))
                && task.waiter_first
                && self.defer_until.load(Ordering::Relaxed) > now_nanos()
            {
                // Its thread is still feeding the stream: leave the task to that
                // thread (caller runs, or its wait) until the feeding pauses.
                self.set_head(task);
                self.state.store(QUEUED, Ordering::SeqCst);
                self.shared.defer(self.clone());
                return;
            }
            let me: *const StreamQueue = Arc::as_ptr(self);
            RUNNING_HERE.with(|r| r.borrow_mut().push(me));
            run_task(task, self.stream_id);
            RUNNING_HERE.with(|r| r.borrow_mut().pop());
            ran += 1;
        }
    }

    fn take_head(&self) -> Option<Task> {
        if !self.has_head.load(Ordering::Relaxed) {
            return None;
        }
        self.has_head.store(false, Ordering::Relaxed);
        self.head.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn set_head(&self, task: Task) {
        *self.head.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        self.has_head.store(true, Ordering::Relaxed);
    }

    fn unblock(self: Arc<Self>) {
        if self
            .state
            .compare_exchange(BLOCKED, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let shared = self.shared.clone();
            shared.schedule(self);
        }
    }

    /// Gives the stream back: to the run queue if work remains, else idle.
    fn release(self: &Arc<Self>) {
        if self.has_head.load(Ordering::Relaxed) || !self.tasks.is_empty() {
            self.state.store(QUEUED, Ordering::SeqCst);
            self.shared.schedule(self.clone());
            return;
        }
        self.state.store(IDLE, Ordering::SeqCst);
        if !self.tasks.is_empty()
            && self
                .state
                .compare_exchange(IDLE, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.shared.schedule(self.clone());
        }
    }
}

impl Helper for StreamQueue {
    fn blocks_on_caller(&self) -> bool {
        running_here(self)
    }

    fn help(self: Arc<Self>, target: &Event) {
        if self
            .state
            .compare_exchange(QUEUED, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.run_claimed(Until::Ready(target));
        }
    }
}

fn run_task(task: Task, stream_id: u64) {
    let Task {
        deps,
        completion,
        run,
        ..
    } = task;
    let status = deps.iter().find_map(Event::error).map_or(Ok(()), Err);
    drop(deps);
    let done = &completion;
    let outcome = catch_unwind(AssertUnwindSafe(move || run.run(status, done)));
    if outcome.is_ok() && !completion.is_ready() {
        // Its work left the stream (a worker or a device completes it).
        completion.set_dispatched();
    }
    if outcome.is_err() {
        tracing::error!(
            stream = stream_id,
            "a task panicked; its outputs fail with `internal`"
        );
        completion.set_if_pending(Err(Error::internal("the execution panicked")));
    }
}

/// When a thread that holds a stream gives it back.
#[derive(Clone, Copy)]
enum Until<'a> {
    /// When the event is ready (a waiter's inline help).
    Ready(&'a Event),
    /// After this many tasks (caller runs).
    Budget(usize),
    /// After this many tasks, or earlier at a `waiter_first` task whose thread
    /// is still feeding the stream (an executor's turn).
    Yielding(usize),
}

/// A pool of executor threads serving per-stream queues (one per host).
pub(crate) struct Dispatcher {
    shared: Arc<Shared>,
    deferrer: Option<JoinHandle<()>>,
    id: u64,
}

thread_local! {
    static EXECUTOR_OF: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How long an executor thread beyond the pool's minimum stays idle before it
/// exits.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

impl Dispatcher {
    /// Starts `min_threads` executor threads named `colocated-exec-{host}-{i}`,
    /// kept for the dispatcher's life. When every thread is busy and a stream
    /// becomes runnable, another starts, up to `max_threads`; those beyond
    /// `min_threads` exit after `KEEP_ALIVE` without work.
    pub fn new(
        min_threads: usize,
        max_threads: usize,
        id: u64,
        host_label: &str,
    ) -> Result<Dispatcher> {
        Dispatcher::with_keep_alive(min_threads, max_threads, id, host_label, KEEP_ALIVE)
    }

    fn with_keep_alive(
        min_threads: usize,
        max_threads: usize,
        id: u64,
        host_label: &str,
        keep_alive: Duration,
    ) -> Result<Dispatcher> {
        let min_threads = min_threads.max(1);
        let shared = Arc::new(Shared {
            run_queue: SegQueue::new(),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            deferred: SegQueue::new(),
            deferrer_idle: AtomicBool::new(false),
            defer_wake: Condvar::new(),
            live: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            min_threads,
            max_threads: max_threads.max(min_threads),
            keep_alive,
            spins: AtomicBool::new(true),
            exited: Condvar::new(),
            next_index: AtomicUsize::new(0),
            id,
            label: host_label.to_string(),
        });
        let deferrer = shared.clone();
        let deferrer = std::thread::Builder::new()
            .name(format!("colocated-defer-{host_label}"))
            .spawn(move || deferrer_loop(&deferrer, id))
            .map_err(|e| {
                Error::resource_exhausted(format!("cannot start the deferrer thread: {e}"))
            })?;
        let dispatcher = Dispatcher {
            shared,
            deferrer: Some(deferrer),
            id,
        };
        for _ in 0..min_threads {
            dispatcher.shared.live.fetch_add(1, Ordering::SeqCst);
            dispatcher.shared.idle.fetch_add(1, Ordering::SeqCst);
            if let Err(e) = dispatcher.shared.spawn_executor() {
                dispatcher.shared.live.fetch_sub(1, Ordering::SeqCst);
                dispatcher.shared.idle.fetch_sub(1, Ordering::SeqCst);
                // Dropping the dispatcher stops the threads already started.
                return Err(Error::resource_exhausted(format!(
                    "cannot start an executor thread: {e}"
                )));
            }
        }
        Ok(dispatcher)
    }

    /// Idle executors sleep at once instead of looking for work a while:
    /// for a worker host, whose work arrives from the network (a round trip
    /// apart at the least), where spinning would only take a core from the
    /// network thread that sends the answer.
    pub(crate) fn stop_spinning(&self) {
        self.shared.spins.store(false, Ordering::Relaxed);
    }

    /// Submits `task` on `stream`. A thread waiting on the task's completion may
    /// run it inline.
    pub fn submit(&self, stream: &Stream, task: Task) {
        if stream.owner() != self.id {
            // Callers check this first (`Client::check_stream`); never queue work
            // where no executor of this stream's client would run it.
            task.completion.set_if_pending(Err(Error::invalid_argument(
                "the stream belongs to another client",
            )));
            return;
        }
        let queue = stream.local_queue(self);
        let helper: Weak<dyn Helper> = Arc::downgrade(queue) as Weak<dyn Helper>;
        task.completion.set_helper(helper);
        let task = match task.hands_off {
            true => match queue.run_now(task) {
                None => return,
                Some(task) => task,
            },
            false => task,
        };
        let task = match claiming() {
            true => match queue.claim_for_later(task) {
                None => return,
                Some(task) => task,
            },
            false => task,
        };
        let waiter_first = task.waiter_first;
        queue.push(task);
        if waiter_first {
            queue.run_backlog();
        }
    }

    /// Holds the next place of `stream` (see [`StreamSlot`]): a task that
    /// marks the place reached, and one that waits for the release; on the
    /// held work's stream, a first task that waits for the place.
    pub(crate) fn reserve(&self, stream: &Stream) -> StreamSlot {
        let (reached, release) = (Event::new(), Event::new());
        let mark = reached.clone();
        self.submit(
            stream,
            Task {
                deps: Vec::new(),
                completion: reached.clone(),
                run: Box::new(move |_: Result<()>| mark.set_if_pending(Ok(()))),
                waiter_first: false,
                hands_off: false,
            },
        );
        let held = Event::new();
        let done = held.clone();
        self.submit(
            stream,
            Task {
                deps: vec![release.clone()],
                completion: held,
                run: Box::new(move |_: Result<()>| done.set_if_pending(Ok(()))),
                waiter_first: false,
                hands_off: false,
            },
        );
        // The held work's own stream starts at the place.
        let own = Stream::new(self.id);
        let passed = Event::new();
        let pass = passed.clone();
        self.submit(
            &own,
            Task {
                deps: vec![reached.clone()],
                completion: passed,
                run: Box::new(move |status: Result<()>| pass.set_if_pending(status)),
                waiter_first: false,
                hands_off: false,
            },
        );
        StreamSlot {
            reached,
            release: Some(release),
            held: own,
        }
    }

    /// The dispatcher id that keys the default per-thread streams.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Executor threads alive now.
    #[cfg(test)]
    fn live_threads(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
            self.shared.defer_wake.notify_all();
        }
        // The last reference may be dropped by a task on one of our own threads:
        // the threads then finish by themselves once they see the shutdown flag.
        let on_executor = EXECUTOR_OF.with(|c| c.get()) == self.id;
        if let Some(handle) = self.deferrer.take() {
            if !on_executor {
                let _ = handle.join();
            }
        }
        if !on_executor {
            let mut guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            while self.shared.live.load(Ordering::SeqCst) > 0 {
                guard = self
                    .shared
                    .exited
                    .wait(guard)
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
        forget_thread_stream(self.id);
    }
}

fn executor_loop(shared: &Arc<Shared>) {
    EXECUTOR_OF.with(|c| c.set(shared.id));
    // Counted in `idle` by whoever started the thread.
    let mut idle = true;
    let mut idle_since = Instant::now();
    loop {
        if let Some(queue) = shared.run_queue.pop() {
            if idle {
                idle = false;
                shared.idle.fetch_sub(1, Ordering::SeqCst);
            }
            // This thread is about to be busy: if more streams wait and no
            // other thread is free, start one for them.
            fence(Ordering::SeqCst);
            if !shared.run_queue.is_empty() && shared.idle.load(Ordering::SeqCst) == 0 {
                shared.grow();
            }
            queue.run_from_queue();
            continue;
        }
        if !idle {
            // Counted as idle before looking at the queue again, so that a
            // submission either sees this thread idle or is seen by it.
            idle = true;
            idle_since = Instant::now();
            shared.idle.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            drain_after_shutdown(shared);
            shared.idle.fetch_sub(1, Ordering::SeqCst);
            exit_executor(shared, true);
            return;
        }
        let spin_until = match shared.spins.load(Ordering::Relaxed) {
            true => Instant::now() + SPIN,
            false => Instant::now(),
        };
        let mut found = false;
        while Instant::now() < spin_until {
            if !shared.run_queue.is_empty() || shared.shutdown.load(Ordering::Relaxed) {
                found = true;
                break;
            }
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        if found {
            continue;
        }
        let extra = shared.live.load(Ordering::SeqCst) > shared.min_threads;
        if extra && idle_since.elapsed() >= shared.keep_alive {
            shared.idle.fetch_sub(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !shared.run_queue.is_empty() || !retire(shared) {
                // Work arrived (or the pool is at its minimum): stay.
                shared.idle.fetch_add(1, Ordering::SeqCst);
                idle_since = Instant::now();
                continue;
            }
            exit_executor(shared, false);
            return;
        }
        let guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        shared.sleepers.fetch_add(1, Ordering::SeqCst);
        if shared.run_queue.is_empty() && !shared.shutdown.load(Ordering::SeqCst) {
            if extra {
                let left = shared.keep_alive.saturating_sub(idle_since.elapsed());
                let _unused = shared
                    .wake
                    .wait_timeout(guard, left)
                    .unwrap_or_else(|e| e.into_inner());
            } else {
                let _unused = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
        }
        shared.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Takes this thread out of `live` unless that would leave fewer than
/// `min_threads`; true when it did.
fn retire(shared: &Shared) -> bool {
    let mut live = shared.live.load(Ordering::SeqCst);
    loop {
        if live <= shared.min_threads {
            return false;
        }
        match shared
            .live
            .compare_exchange(live, live - 1, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => return true,
            Err(now) => live = now,
        }
    }
}

/// The last act of an executor thread, already out of `idle` (and out of
/// `live` unless `counted`): tells a dropping dispatcher that it is gone.
fn exit_executor(shared: &Shared, counted: bool) {
    let _guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
    if counted {
        shared.live.fetch_sub(1, Ordering::SeqCst);
    }
    shared.exited.notify_all();
}

/// How often the deferrer looks at its streams, and how long it keeps doing so
/// without any before it sleeps until the next one arrives.
const DEFER_TICK: Duration = Duration::from_micros(50);
const DEFER_LINGER: Duration = Duration::from_millis(20);

/// Hands deferred streams to the executors once their submissions pause (or
/// drops them when a waiter ran them). Ticks while streams come and go, so that a
/// busy caller never pays a wake-up; sleeps when there has been nothing for a while.
fn deferrer_loop(shared: &Arc<Shared>, id: u64) {
    EXECUTOR_OF.with(|c| c.set(id));
    let mut pending: Vec<Arc<StreamQueue>> = Vec::new();
    let mut last_seen = Instant::now();
    loop {
        while let Some(queue) = shared.deferred.pop() {
            pending.push(queue);
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            for queue in pending.drain(..) {
                shared.run_queue.push(queue);
            }
            return;
        }
        if !pending.is_empty() {
            last_seen = Instant::now();
        }
        let now = now_nanos();
        pending.retain(|queue| {
            if queue.state.load(Ordering::SeqCst) != QUEUED {
                return false; // a waiter took it
            }
            if queue.defer_until.load(Ordering::Relaxed) > now {
                return true; // still being fed
            }
            shared.schedule(queue.clone());
            false
        });
        if pending.is_empty() && last_seen.elapsed() > DEFER_LINGER {
            let guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.deferrer_idle.store(true, Ordering::SeqCst);
            if shared.deferred.is_empty() && !shared.shutdown.load(Ordering::SeqCst) {
                let _unused = shared
                    .defer_wake
                    .wait(guard)
                    .unwrap_or_else(|e| e.into_inner());
            }
            shared.deferrer_idle.store(false, Ordering::SeqCst);
            last_seen = Instant::now();
            continue;
        }
        std::thread::sleep(DEFER_TICK);
    }
}

/// After shutdown, queued work is failed rather than dropped silently.
fn drain_after_shutdown(shared: &Shared) {
    while let Some(queue) = shared.run_queue.pop() {
        let head = queue.take_head();
        for task in head
            .into_iter()
            .chain(std::iter::from_fn(|| queue.tasks.pop()))
        {
            task.completion.set_if_pending(Err(Error::cancelled(
                "the client was destroyed before the execution ran",
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(completion: &Event, f: impl FnOnce() + Send + 'static) -> Task {
        let done = completion.clone();
        Task {
            deps: vec![],
            completion: completion.clone(),
            run: Box::new(move |status: Result<()>| {
                f();
                done.set_if_pending(status);
            }),
            waiter_first: false,
            hands_off: false,
        }
    }

    #[test]
    fn claimed_tasks_run_on_the_claiming_thread_later_and_the_stream_keeps_order() {
        let d = Dispatcher::new(1, 1, 9013, "t").unwrap();
        let (s, busy) = (Stream::new(9013), Stream::new(9013));
        let here = std::thread::current().id();
        let ran_on = Arc::new(Mutex::new(Vec::new()));
        let record = |ev: &Event, i: u32| {
            let ran_on = ran_on.clone();
            task(ev, move || {
                ran_on
                    .lock()
                    .unwrap()
                    .push((i, std::thread::current().id()))
            })
        };
        // A stream with a task waiting on a gate is not idle: nothing there
        // is claimed.
        let gate = Event::new();
        let blocked = Event::new();
        let mut waits = record(&blocked, 9);
        waits.deps = vec![gate.clone()];
        d.submit(&busy, waits);
        let (first, second, behind_gate) = (Event::new(), Event::new(), Event::new());
        let ((), claims) = claim_idle_tasks(|| {
            d.submit(&s, record(&first, 0));
            // Queued behind the claimed one, on the same stream.
            d.submit(&s, record(&second, 1));
            d.submit(&busy, record(&behind_gate, 2));
        });
        assert_eq!(claims.len(), 1, "one idle stream claimed");
        assert!(!first.is_ready() && !second.is_ready(), "nothing ran yet");
        for claim in claims {
            claim.run();
        }
        second.wait().unwrap();
        let ran = ran_on.lock().unwrap().clone();
        assert_eq!(ran[0], (0, here), "the claimed task ran here, first");
        assert_eq!(ran[1].0, 1, "then the one behind it");
        assert!(!behind_gate.is_ready());
        gate.set_if_pending(Ok(()));
        behind_gate.wait().unwrap();
        assert!(!claiming(), "claiming ends with `claim_idle_tasks`");
    }

    #[test]
    fn a_send_runs_on_the_submitting_thread_when_its_stream_is_idle_and_keeps_order() {
        let d = Dispatcher::new(1, 1, 9011, "t").unwrap();
        let s = Stream::new(9011);
        let here = std::thread::current().id();
        let ran_on = Arc::new(Mutex::new(Vec::new()));
        let send = |ev: &Event, ran_on: &Arc<Mutex<Vec<(u32, std::thread::ThreadId)>>>, i| {
            let ran_on = ran_on.clone();
            let mut t = task(ev, move || {
                ran_on
                    .lock()
                    .unwrap()
                    .push((i, std::thread::current().id()))
            });
            t.hands_off = true;
            t
        };
        // Idle stream: the send ran before `submit` returned, on this thread.
        let first = Event::new();
        d.submit(&s, send(&first, &ran_on, 0));
        assert!(first.is_ready());
        assert_eq!(*ran_on.lock().unwrap(), vec![(0, here)]);
        // Behind a task that has not run: queued after it, not run at once.
        let gate = Event::new();
        let (blocked, second) = (Event::new(), Event::new());
        let mut waits = task(&blocked, || {});
        waits.deps = vec![gate.clone()];
        d.submit(&s, waits);
        d.submit(&s, send(&second, &ran_on, 1));
        assert!(!second.is_ready());
        gate.set(Ok(())).unwrap();
        second.wait().unwrap();
        assert!(blocked.is_ready(), "in order");
        let order: Vec<u32> = ran_on.lock().unwrap().iter().map(|r| r.0).collect();
        assert_eq!(order, [0, 1]);
        // A send waiting for a dependency is queued too.
        let (dep, third) = (Event::new(), Event::new());
        let mut t = send(&third, &ran_on, 2);
        t.deps = vec![dep.clone()];
        d.submit(&s, t);
        assert!(!third.is_ready());
        dep.set(Ok(())).unwrap();
        third.wait().unwrap();
    }

    #[test]
    fn work_submitted_in_a_slot_before_its_place_is_reached_runs_there() {
        let d = Dispatcher::new(2, 2, 9014, "t").unwrap();
        let s = Stream::new(9014);
        let log = Arc::new(Mutex::new(Vec::new()));
        let record = |ev: &Event, i: u32| {
            let log = log.clone();
            task(ev, move || log.lock().unwrap().push(i))
        };
        let (gate, first, held, after) = (Event::new(), Event::new(), Event::new(), Event::new());
        let mut waits = record(&first, 1);
        waits.deps.push(gate.clone());
        d.submit(&s, waits);
        let slot = d.reserve(&s);
        d.submit(&s, record(&after, 3));
        // Submitted on the slot's stream while the place is not reached.
        slot.run_in(|| d.submit(&thread_stream(9014), record(&held, 2)));
        slot.release_after(&held);
        std::thread::sleep(Duration::from_millis(20));
        assert!(log.lock().unwrap().is_empty());
        gate.set(Ok(())).unwrap();
        after.wait().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn tasks_of_one_stream_run_in_submission_order() {
        let d = Dispatcher::new(2, 2, 9001, "t").unwrap();
        let s = Stream::new(9001);
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut last = Event::new();
        for i in 0..1000 {
            let ev = Event::new();
            let log = log.clone();
            d.submit(&s, task(&ev, move || log.lock().unwrap().push(i)));
            last = ev;
        }
        last.wait().unwrap();
        assert_eq!(*log.lock().unwrap(), (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn a_blocked_task_waits_for_its_dependency_and_keeps_order() {
        let d = Dispatcher::new(2, 2, 9002, "t").unwrap();
        let s = Stream::new(9002);
        let gate = Event::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let first = Event::new();
        let l = log.clone();
        let mut t = task(&first, move || l.lock().unwrap().push(1));
        t.deps.push(gate.clone());
        d.submit(&s, t);
        let second = Event::new();
        let l = log.clone();
        d.submit(&s, task(&second, move || l.lock().unwrap().push(2)));
        std::thread::sleep(Duration::from_millis(20));
        assert!(log.lock().unwrap().is_empty());
        gate.set(Ok(())).unwrap();
        second.wait().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn a_failed_dependency_reaches_the_task_status() {
        let d = Dispatcher::new(1, 1, 9003, "t").unwrap();
        let s = Stream::new(9003);
        let ev = Event::new();
        let mut t = task(&ev, || {});
        t.deps.push(Event::ready(Err(Error::not_found("upstream"))));
        d.submit(&s, t);
        assert_eq!(ev.wait().unwrap_err().message(), "upstream");
    }

    #[test]
    fn a_task_may_wait_for_work_its_stream_dispatched_before_it() {
        // A hand-off (a send, a device's queue) leaves its stream with its
        // completion pending; work queued after it on the stream may wait
        // for that completion (it is not queued behind the waiter).
        let d = Dispatcher::new(1, 1, 9041, "t").unwrap();
        let s = Stream::new(9041);
        let sent = Event::new();
        let later = sent.clone();
        let send = Task {
            deps: vec![],
            completion: sent.clone(),
            run: Box::new(move |_: Result<()>| {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    later.set_if_pending(Ok(()));
                });
            }),
            waiter_first: false,
            hands_off: true,
        };
        d.submit(&s, send);
        let waited = Event::new();
        let outcome = Arc::new(Mutex::new(None));
        let seen = outcome.clone();
        d.submit(
            &s,
            task(&waited, move || {
                *seen.lock().unwrap() = Some(sent.wait());
            }),
        );
        waited.wait().unwrap();
        let outcome = outcome.lock().unwrap().take();
        assert!(matches!(outcome, Some(Ok(()))), "{outcome:?}");
    }

    /// Streams whose tasks block until every one of them runs (a barrier)
    /// all run at once, though they outnumber the pool's threads.
    #[test]
    fn blocking_streams_do_not_starve_each_other_beyond_the_pool_size() {
        let d = Dispatcher::new(2, 64, 9005, "t").unwrap();
        let parties = 12;
        let barrier = Arc::new(std::sync::Barrier::new(parties));
        let events: Vec<Event> = (0..parties)
            .map(|_| {
                let ev = Event::new();
                let barrier = barrier.clone();
                d.submit(
                    &Stream::new(9005),
                    task(&ev, move || {
                        barrier.wait();
                    }),
                );
                ev
            })
            .collect();
        for ev in &events {
            ev.wait_timeout(Duration::from_secs(20)).unwrap();
        }
        assert!(d.live_threads() >= parties);
    }

    #[test]
    fn the_pool_never_grows_beyond_its_maximum() {
        let d = Dispatcher::new(1, 3, 9006, "t").unwrap();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let events: Vec<Event> = (0..6)
            .map(|_| {
                let ev = Event::new();
                let (gate, running) = (gate.clone(), running.clone());
                d.submit(
                    &Stream::new(9006),
                    task(&ev, move || {
                        running.fetch_add(1, Ordering::SeqCst);
                        let (open, cv) = &*gate;
                        let mut open = open.lock().unwrap();
                        while !*open {
                            open = cv.wait(open).unwrap();
                        }
                    }),
                );
                ev
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while running.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(running.load(Ordering::SeqCst), 3);
        assert_eq!(d.live_threads(), 3);
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        for ev in &events {
            ev.wait_timeout(Duration::from_secs(10)).unwrap();
        }
        assert_eq!(running.load(Ordering::SeqCst), 6);
    }

    #[test]
    fn threads_beyond_the_minimum_exit_when_idle() {
        let d = Dispatcher::with_keep_alive(1, 8, 9007, "t", Duration::from_millis(50)).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let events: Vec<Event> = (0..4)
            .map(|_| {
                let ev = Event::new();
                let barrier = barrier.clone();
                d.submit(
                    &Stream::new(9007),
                    task(&ev, move || {
                        barrier.wait();
                    }),
                );
                ev
            })
            .collect();
        for ev in &events {
            ev.wait_timeout(Duration::from_secs(10)).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.live_threads() > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(d.live_threads(), 1);
        // The pool grows again after shrinking.
        let ev = Event::new();
        d.submit(&Stream::new(9007), task(&ev, || {}));
        ev.wait_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn stream_scopes_give_a_thread_independent_default_streams() {
        let outer = thread_stream(9008);
        assert_eq!(thread_stream(9008).id(), outer.id());
        let previous = set_stream_scope(77);
        assert_eq!(previous, 0);
        let scoped = thread_stream(9008);
        assert_ne!(scoped.id(), outer.id());
        assert_eq!(thread_stream(9008).id(), scoped.id());
        set_stream_scope(78);
        assert_ne!(thread_stream(9008).id(), scoped.id());
        set_stream_scope(77);
        assert_eq!(thread_stream(9008).id(), scoped.id());
        forget_stream_scope(77);
        assert_ne!(thread_stream(9008).id(), scoped.id());
        set_stream_scope(0);
        assert_eq!(thread_stream(9008).id(), outer.id());
    }

    #[test]
    fn a_panicking_task_fails_its_completion_with_internal() {
        let d = Dispatcher::new(1, 1, 9004, "t").unwrap();
        let s = Stream::new(9004);
        let ev = Event::new();
        d.submit(&s, task(&ev, || panic!("boom")));
        assert_eq!(
            ev.wait().unwrap_err().code(),
            crate::error::ErrorCode::Internal
        );
    }
}
