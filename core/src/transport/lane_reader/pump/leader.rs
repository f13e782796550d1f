//! The pump's mechanics: its `epoll` set and kick, the leader thread's
//! turns and take-overs, hand-offs between the leader and a waiter, and
//! taking a lane's answers.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{now_nanos, read_lane, Pump, Read, Runner, KICK, TAKEN};
use super::{MAX_HOLD_NANOS, TAKEOVER_AFTER};
use crate::future::waited_for_elsewhere;
use crate::transport::alarm::Alarm;
use crate::transport::{lock, runtime};

impl Pump {
    /// Adds or removes `fd` (lane `key`).
    pub(super) fn ctl(&self, op: i32, fd: i32, key: u64) -> std::io::Result<()> {
        let events = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
        self.ctl_events(op, fd, key, events)
    }

    pub(super) fn ctl_events(
        &self,
        op: i32,
        fd: i32,
        key: u64,
        events: u32,
    ) -> std::io::Result<()> {
        let mut event = libc::epoll_event { events, u64: key };
        // SAFETY: both descriptors are open; `event` outlives the call.
        let done = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut event) };
        if done < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wakes the reader asleep in `epoll_wait` (the last one to begin
    /// waiting), or the next one to wait.
    pub(super) fn kick(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from an 8-byte buffer to an open
        // eventfd. Cannot fail short of its counter's overflow (2^64).
        unsafe {
            libc::write(self.kick.as_raw_fd(), one.as_ptr().cast(), 8);
        }
    }

    /// Sleeps until lanes are readable, a kick, or `timeout_ms` (-1:
    /// none); the lanes go to `due`.
    pub(super) fn wait_events(&self, timeout_ms: i32) -> std::io::Result<()> {
        // SAFETY: `epoll_event` is plain data.
        let mut events = [unsafe { std::mem::zeroed::<libc::epoll_event>() }; 64];
        // SAFETY: `events` has room for the count given.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(err);
        }
        let mut due = lock(&self.due);
        due.extend(
            events[..n as usize]
                .iter()
                .map(|e| e.u64)
                .filter(|&key| key != KICK),
        );
        Ok(())
    }

    /// Starts a leader thread, with its alarm; false if it cannot.
    pub(super) fn spawn_leader(&'static self) -> bool {
        let Some(alarm) = Alarm::new(TAKEOVER_AFTER, Arc::new(move || self.leader_ran_long()))
        else {
            return false;
        };
        std::thread::Builder::new()
            .name("colocated-lanes".into())
            .spawn(move || self.lead(alarm))
            .is_ok()
    }

    /// The leader's alarm went off: a new leader takes over if the
    /// leader has run answers for [`TAKEOVER_AFTER`].
    fn leader_ran_long(&'static self) {
        let Some(since) = self.leader.take_over_if_long() else {
            return;
        };
        if !self.spawn_leader() {
            tracing::warn!("cannot start a thread to read lanes");
            // The leader reads on once its answer is done (unless it
            // saw the takeover in the meantime).
            let _ =
                self.leader
                    .0
                    .compare_exchange(TAKEN, since, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// The waiter stopped reading: the leader reads again, and takes
    /// what the waiter left; at once if something is left, if it must
    /// (`now`: the waiter was taken over), or if something else waits
    /// for an answer (a thread asleep, a callback of the user's);
    /// otherwise [`LINGER`] from now, unless another waiter reads by
    /// then, or longer while a thread sends a call's parts (see
    /// [`Pump::held`]).
    pub(super) fn waiter_done(&self, now: bool) {
        self.waiter_reads.store(false, Ordering::SeqCst);
        // The waiter read what had come: a sender's hold starts again.
        let since = match self.sending.load(Ordering::SeqCst) {
            0 => 0,
            _ => now_nanos(),
        };
        self.held_since.store(since, Ordering::SeqCst);
        self.settle(now);
    }

    /// The last thread that sent a call's parts is done: the leader reads
    /// again, as when a waiter stops reading (unless one reads now: it
    /// looks after the leader once done).
    pub(super) fn senders_done(&self) {
        if !self.waiter_reads.load(Ordering::SeqCst) {
            self.settle(false);
        }
    }

    /// No waiter reads: the leader reads what is left at once, and the
    /// rest [`LINGER`] from now unless `now` or something else waits.
    fn settle(&self, now: bool) {
        let parked = lock(&self.parked);
        let left = !lock(&self.due).is_empty();
        if !*parked {
            if left {
                self.kick();
            }
            return;
        }
        match self.linger.get() {
            Some(linger) if !now && !left && !waited_for_elsewhere() => {
                self.lingering.store(true, Ordering::SeqCst);
                linger.arm();
                // Something began to wait meanwhile (and saw no
                // lingering): the leader reads now.
                if waited_for_elsewhere() && self.lingering.swap(false, Ordering::SeqCst) {
                    self.unpark.notify_one();
                }
            }
            _ => self.unpark.notify_one(),
        }
    }

    /// Whether a thread that sends the parts of a call keeps the leader
    /// asleep now: while the caller still writes, the answers that come
    /// wait in their sockets, and it reads them itself once it waits, as
    /// a raw client would, rather than a second thread taking them one
    /// by one while it writes. Never while something else waits (a
    /// thread asleep, a callback of the user's), and for [`MAX_HOLD`] at
    /// most since a reader last read: answers nobody reads fill their
    /// worker's buffers, and then a write to that worker would block.
    pub(super) fn held(&self) -> bool {
        let since = self.held_since.load(Ordering::SeqCst);
        since != 0
            && self.sending.load(Ordering::SeqCst) > 0
            && !waited_for_elsewhere()
            && now_nanos().saturating_sub(since) < MAX_HOLD_NANOS
    }

    /// [`LINGER`] has passed since the last waiter or sender stopped, a
    /// sender's hold is due to be looked at again, or something else
    /// waits: the leader reads, unless a waiter does or a sender holds
    /// it (then this runs again in [`LINGER`]).
    pub(super) fn wake_leader(&self) {
        if self.held_since.load(Ordering::SeqCst) != 0 {
            if let Some(linger) = self.linger.get().filter(|_| self.held()) {
                linger.arm();
                return;
            }
            self.held_since.store(0, Ordering::SeqCst);
        }
        self.lingering.store(false, Ordering::SeqCst);
        let parked = lock(&self.parked);
        if *parked && !self.waiter_reads.load(Ordering::SeqCst) {
            self.unpark.notify_one();
        }
    }

    /// Whether the leader leaves the reading to another thread now: a
    /// waiter reads, or a sender holds it (see [`Pump::held`]).
    fn stands_aside(&self) -> bool {
        self.waiter_reads.load(Ordering::SeqCst) || self.held()
    }

    /// Runs `due` lanes' answers as `runner` until none is left; false
    /// if another thread took over meanwhile.
    pub(super) fn run_due(&self, runner: &Runner, alarm: &Alarm) -> bool {
        let started = now_nanos();
        runner.0.store(started, Ordering::SeqCst);
        alarm.arm();
        loop {
            let key = lock(&self.due).pop_front();
            let Some(key) = key else { break };
            self.take(key);
            if runner.0.load(Ordering::SeqCst) != started {
                return false;
            }
        }
        alarm.disarm();
        runner
            .0
            .compare_exchange(started, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Waits for lanes and takes their answers while no waiter does,
    /// until another thread took over.
    fn lead(&'static self, alarm: Alarm) {
        // What answers complete may start work on the network runtime.
        let _runtime = runtime().map(|runtime| runtime.enter());
        loop {
            if self.stands_aside() {
                let mut parked = lock(&self.parked);
                while self.stands_aside() {
                    if !self.waiter_reads.load(Ordering::SeqCst) {
                        // Asleep for a sender: the hold is looked at again
                        // in [`LINGER`] (see `wake_leader`), however it began.
                        if let Some(linger) = self.linger.get() {
                            linger.arm();
                        }
                    }
                    *parked = true;
                    parked = self.unpark.wait(parked).unwrap_or_else(|e| e.into_inner());
                }
                *parked = false;
                continue;
            }
            if lock(&self.due).is_empty() {
                if let Err(err) = self.wait_events(-1) {
                    tracing::error!("the controller stopped reading lanes: {err}");
                    return;
                }
                if self.stands_aside() {
                    // The waiter was busy, or will read once it waits:
                    // it takes these.
                    self.kick();
                    continue;
                }
            }
            if !self.run_due(&self.leader, &alarm) {
                return;
            }
        }
    }

    /// Takes what lane `key` has: every answer that arrived whole, or
    /// ends it. A thread that finds another reading the lane leaves it
    /// to that one, which sees the lane became readable meanwhile.
    fn take(&self, key: u64) {
        let Some(slot) = lock(&self.lanes).get(&key).cloned() else {
            return;
        };
        slot.readable.store(true, Ordering::SeqCst);
        let mut lane = match slot.lane.try_lock() {
            Ok(lane) => lane,
            Err(std::sync::TryLockError::Poisoned(lane)) => lane.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if !slot.readable.swap(false, Ordering::SeqCst) {
            return;
        }
        let left = match read_lane(&mut lane) {
            Read::Drained => false,
            Read::Left => true,
            Read::Ended(ended) => {
                let fd = lane.frames.source().0.as_raw_fd();
                let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, key);
                lock(&self.lanes).remove(&key);
                let ended_handler = std::mem::replace(&mut lane.handlers.ended, Box::new(|_| {}));
                ended_handler(ended);
                return;
            }
        };
        drop(lane);
        // Bytes left unread (so that one busy lane does not keep the
        // others waiting), or bytes that arrived while this thread read
        // and that another thread left to it: the lane's turn comes
        // round again, after the others', whoever reads then.
        if left || slot.readable.load(Ordering::SeqCst) {
            lock(&self.due).push_back(key);
            self.kick();
        }
    }
}
