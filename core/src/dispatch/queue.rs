//! One stream's queue: submission, claiming and running its tasks in order,
//! and a waiter's help with the head of the stream.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::{
    now_nanos, running_here, Claimed, StreamQueue, Task, BLOCKED, BUDGET, CALLER_RUNS_DEPTH,
    CLAIMS, IDLE, QUEUED, RUNNING, RUNNING_HERE, WAITER_HEAD_START,
};
use crate::error::Error;
use crate::future::{Event, Helper};

impl StreamQueue {
    pub(super) fn push(self: &Arc<Self>, task: Task) {
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
    pub(super) fn run_now(self: &Arc<Self>, task: Task) -> Option<Task> {
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
    pub(super) fn claim_for_later(self: &Arc<Self>, task: Task) -> Option<Task> {
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
    pub(super) fn run_from_queue(self: &Arc<Self>) {
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
    pub(super) fn run_backlog(self: &Arc<Self>) {
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
    pub(super) fn run_claimed(self: &Arc<Self>, until: Until<'_>) {
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

    pub(super) fn take_head(&self) -> Option<Task> {
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
pub(super) enum Until<'a> {
    /// When the event is ready (a waiter's inline help).
    Ready(&'a Event),
    /// After this many tasks (caller runs).
    Budget(usize),
    /// After this many tasks, or earlier at a `waiter_first` task whose thread
    /// is still feeding the stream (an executor's turn).
    Yielding(usize),
}
