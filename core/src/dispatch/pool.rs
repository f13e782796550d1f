//! The pool of executor threads: starting, growing and retiring them, the
//! deferrer that hands waiter-first streams over, and shutdown.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use super::{
    claiming, forget_thread_stream, now_nanos, Shared, Stream, StreamQueue, StreamSlot, Task,
    QUEUED, SPIN,
};
use crate::error::{Error, Result};
use crate::future::{Event, Helper};

impl Shared {
    pub(super) fn defer(&self, queue: Arc<StreamQueue>) {
        self.deferred.push(queue);
        fence(Ordering::SeqCst);
        if self.deferrer_idle.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.defer_wake.notify_all();
        }
    }

    pub(super) fn schedule(self: &Arc<Self>, queue: Arc<StreamQueue>) {
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
/// A pool of executor threads serving per-stream queues (one per host).
pub(crate) struct Dispatcher {
    pub(super) shared: Arc<Shared>,
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

    pub(super) fn with_keep_alive(
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
    pub(super) fn live_threads(&self) -> usize {
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
