//! Deletions that wait for an operation to ride with (see
//! `Control::delete_later`): one timer for the process sends a stream's
//! deletion alone once it is due and no operation took it along. The timer
//! looks at a stream when its deletion is due, not at every waiting stream
//! every tick: a call to thousands of hosts leaves thousands of deletions
//! waiting, each for several milliseconds. Per process: a forked child runs
//! its own timer.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Mutex, Weak};
use std::time::Instant;

use super::{Control, DEFER};
use crate::transport::{lock, runtime};

/// A stream whose deletion is due at `due` (`order` breaks ties).
struct Due {
    due: Instant,
    order: u64,
    control: Weak<Control>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Due) -> bool {
        (self.due, self.order) == (other.due, other.order)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Due) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Due) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(other.due, other.order))
    }
}

/// The streams with a deletion waiting, earliest due first.
#[derive(Default)]
struct Waiting {
    due: BinaryHeap<Reverse<Due>>,
    next_order: u64,
    /// The timer's task runs (it stops when no deletion waits).
    running: bool,
}

impl Waiting {
    fn push(&mut self, control: Weak<Control>, due: Instant) {
        self.next_order += 1;
        self.due.push(Reverse(Due {
            due,
            order: self.next_order,
            control,
        }));
    }
}

fn waiting() -> &'static Mutex<Waiting> {
    static WAITING: crate::process::PerProcess<Mutex<Waiting>> = crate::process::PerProcess::new();
    WAITING.get_or_init(Mutex::default)
}

/// Sends `control`'s deferred deletion at `due`, unless an operation takes
/// it first.
pub(super) fn flush_at(control: Weak<Control>, due: Instant) {
    let mut waiting = lock(waiting());
    waiting.push(control.clone(), due);
    if waiting.running {
        return;
    }
    match runtime() {
        Ok(runtime) => {
            waiting.running = true;
            runtime.spawn(run());
        }
        Err(_) => {
            // No timer: it goes now.
            waiting.due.clear();
            drop(waiting);
            if let Some(control) = control.upgrade() {
                let mut sender = lock(&control.sender);
                sender.timed = false;
                sender.flush_deferred();
            }
        }
    }
}

/// The timer: wakes for the earliest due deletion (at least every
/// [`DEFER`], for one that came due sooner meanwhile), sends those due.
async fn run() {
    loop {
        let next = {
            let mut waiting = lock(waiting());
            match waiting.due.peek() {
                Some(Reverse(first)) => first.due,
                None => {
                    waiting.running = false;
                    return;
                }
            }
        };
        let now = Instant::now();
        if next > now {
            tokio::time::sleep((next - now).min(DEFER)).await;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut waiting = lock(waiting());
            while waiting
                .due
                .peek()
                .is_some_and(|Reverse(first)| first.due <= now)
            {
                if let Some(Reverse(first)) = waiting.due.pop() {
                    due.push(first.control);
                }
            }
        }
        if due.is_empty() {
            continue;
        }
        // Writes may block: off the runtime's threads.
        let again = tokio::task::spawn_blocking(move || {
            due.into_iter()
                .filter_map(|weak| {
                    let next = weak.upgrade()?.flush_deferred_if_due()?;
                    Some((weak, next))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut waiting = lock(waiting());
        for (control, next) in again {
            waiting.push(control, next);
        }
    }
}
