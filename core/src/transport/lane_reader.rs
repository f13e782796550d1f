//! The controller's reading of its lanes' answers (see
//! [`crate::transport::lane`]): one thread for every lane of the process.
//!
//! A thread per lane, asleep in `recv`, costs a wake-up (and a context
//! switch) per answer; a call fanned out to N workers paid N of them before
//! the waiting caller was woken. Here one thread (the *leader*) sleeps in
//! `epoll` on every lane at once and takes the answers of all lanes that are
//! ready when it wakes: a fan-out's answers wake it a few times, not N.
//!
//! Each lane is in the `epoll` set edge-triggered: a lane is reported once
//! each time bytes arrive, and stays in the set without a system call per
//! answer to arm it again. One thread at a time reads a lane (its lock, taken
//! without waiting), so one lane's answers are taken in order; a thread that
//! finds the lane being read marks it readable and leaves it to the reader,
//! which looks again before it lets go. What an answer runs (a completion)
//! may last (a callback of the user's): when the leader has run answers for
//! [`TAKEOVER_AFTER`] (its [`Alarm`] goes off), a new thread leads, and the
//! old one ends once its answer is done; the lanes it has not come to yet
//! wait for the new leader, not for it.
//!
//! A thread about to sleep until an event is ready (a *waiter*) reads too:
//! it sleeps in `epoll` on the same set, and the kernel wakes the thread
//! that began waiting last, so the answer it waits for wakes it alone and
//! it takes that answer itself, with no thread woken to hand it over (see
//! `Pump` below and [`crate::future::WaitHook`]).
//!
//! Without `epoll` and alarms (not Linux), or if they cannot be had, each
//! lane gets a thread of its own, as before.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::transport::lane::{FrameReader, MAX_FRAME_BYTES};
use crate::transport::proto::ControlResponse;
use crate::transport::runtime;

/// What reads a lane's answers calls: for each answer, in order, and once,
/// with why the lane ended.
pub(crate) struct Handlers {
    /// Takes one answer.
    pub(crate) answer: Box<dyn FnMut(ControlResponse) + Send>,
    /// The lane ended (the worker closed it, it broke, or a message was
    /// bad); nothing is read from it after.
    pub(crate) ended: Box<dyn FnOnce(Error) + Send>,
}

/// How long the leader may run what answers call before another thread
/// takes over the reading.
const TAKEOVER_AFTER: Duration = Duration::from_millis(2);

/// How long the leader stays asleep once a waiter stopped reading, for the
/// next waiter to come (a caller that waits for one call after another,
/// the next wait beginning once a call to hundreds of hosts has gone out):
/// the most an answer that nothing waits for (no thread, no callback of the
/// user's) may wait for a reader then.
const LINGER: Duration = Duration::from_millis(5);

/// Reads `socket`'s answers from now on, calling `handlers`: with the
/// process's other lanes, or on a thread of its own.
pub(crate) fn read_lane_answers(socket: std::net::TcpStream, handlers: Handlers) -> Result<()> {
    #[cfg(target_os = "linux")]
    let (socket, handlers) = match pump::add(socket, handlers) {
        Ok(()) => return Ok(()),
        Err(given_back) => given_back,
    };
    std::thread::Builder::new()
        .name("colocated-lane".into())
        .spawn(move || read_on_this_thread(socket, handlers))
        .map(|_| ())
        .map_err(|e| Error::resource_exhausted(format!("cannot start a lane's thread: {e}")))
}

/// Reads `socket`'s answers on this thread until the lane ends.
fn read_on_this_thread(socket: std::net::TcpStream, mut handlers: Handlers) {
    // What answers complete may start work on the network runtime.
    let runtime = runtime().map(|runtime| runtime.enter());
    let mut reader = FrameReader::new(&socket, MAX_FRAME_BYTES);
    let ended = loop {
        match reader.next::<ControlResponse>() {
            Ok(Some(answer)) => (handlers.answer)(answer),
            Ok(None) => break Error::unavailable("the control stream ended"),
            Err(err) => break broke(&err),
        }
    };
    (handlers.ended)(ended);
    drop(runtime);
}

/// Why a lane whose reading failed with `err` ended.
fn broke(err: &Error) -> Error {
    Error::unavailable(format!("the control stream broke: {}", err.message()))
}

#[cfg(target_os = "linux")]
mod pump {
    use std::cell::RefCell;
    use std::collections::{HashMap, VecDeque};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Condvar, Mutex, OnceLock};
    use std::time::Instant;

    use super::{broke, Handlers, LINGER, TAKEOVER_AFTER};
    use crate::error::{Error, Result};
    use crate::future::{install_wait_hook, waited_for_elsewhere, Event, WaitHook};
    use crate::transport::alarm::Alarm;
    use crate::transport::lane::{Available, FrameReader, MAX_FRAME_BYTES};
    use crate::transport::proto::ControlResponse;
    use crate::transport::{lock, runtime};

    /// Reads without waiting: `WouldBlock` when nothing has arrived. (The
    /// socket itself stays blocking: the lane's writer shares it.)
    struct DontWait(std::net::TcpStream);

    impl std::io::Read for DontWait {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            // SAFETY: the socket is open; `buf` has room for its length.
            let n = unsafe {
                libc::recv(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
        }
    }

    /// A lane in the set.
    struct Lane {
        frames: FrameReader<DontWait>,
        handlers: Handlers,
    }

    /// A lane, and whether it became readable since its reader last
    /// looked (see [`Pump::take`]).
    struct LaneSlot {
        readable: AtomicBool,
        lane: Mutex<Lane>,
    }

    /// The key of the kick in the `epoll` set (lanes count up from 0).
    const KICK: u64 = u64::MAX;

    /// The process's reader of lanes.
    ///
    /// Two kinds of thread read: the pump's own (the *leader*), and a
    /// thread about to sleep until an event is ready (a *waiter*, through
    /// the [`WaitHook`]), at most one at a time. Both sleep in `epoll_wait`
    /// on the same set; the kernel wakes the thread that began waiting
    /// last, which is the waiter: the answer it waits for wakes it alone,
    /// and it takes that answer itself. The leader stays asleep unless an
    /// answer comes while the waiter is busy; then it hands what it got
    /// to the waiter (`due`, and the kick) and sleeps until the waiter is
    /// done, and [`LINGER`] more unless something waits for it: a caller
    /// that waits for one call after another keeps the leader asleep.
    struct Pump {
        epoll: OwnedFd,
        lanes: Mutex<HashMap<u64, Arc<LaneSlot>>>,
        next_key: AtomicU64,
        /// Lanes that became readable and wait for a reader (filled by
        /// `epoll_wait`, emptied one by one, so that another reader takes
        /// the rest).
        due: Mutex<VecDeque<u64>>,
        /// An `eventfd` in the set (edge-triggered): wakes the reader that
        /// sleeps there (to take `due`, or see its event ready).
        kick: OwnedFd,
        /// When the leader began running answers (see [`Runner`]).
        leader: Runner,
        /// A waiter reads (the leader sleeps on `parked` once it sees it).
        waiter_reads: AtomicBool,
        /// Only one waiter reads at a time.
        waiter_role: Mutex<()>,
        parked: Mutex<bool>,
        unpark: Condvar,
        /// Wakes the leader [`LINGER`] after the last waiter stopped
        /// reading, unless another reads by then.
        linger: OnceLock<Alarm>,
        /// The leader sleeps for [`LINGER`] (until something else waits).
        lingering: AtomicBool,
    }

    /// When a reader began running answers (nanoseconds, never 0); 0 while
    /// it waits; [`TAKEN`] once another took over from it.
    struct Runner(AtomicU64);

    /// `Runner`'s value once another thread took over.
    const TAKEN: u64 = u64::MAX;

    /// Nanoseconds on a clock of the process (never 0, never [`TAKEN`]).
    fn now_nanos() -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        let nanos = EPOCH.get_or_init(Instant::now).elapsed().as_nanos();
        u64::try_from(nanos)
            .unwrap_or(TAKEN - 1)
            .clamp(1, TAKEN - 1)
    }

    impl Runner {
        /// Takes over from a runner that has run answers for
        /// [`TAKEOVER_AFTER`]: when this call did, since when it ran.
        fn take_over_if_long(&self) -> Option<u64> {
            let since = self.0.load(Ordering::SeqCst);
            let after = u64::try_from(TAKEOVER_AFTER.as_nanos()).unwrap_or(u64::MAX);
            let long = since != 0 && since != TAKEN && now_nanos().saturating_sub(since) >= after;
            (long
                && self
                    .0
                    .compare_exchange(since, TAKEN, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok())
            .then_some(since)
        }
    }

    /// The process's pump, its leader started on first use; `None` if
    /// `epoll`, an alarm or a thread cannot be had.
    fn pump() -> Option<&'static Pump> {
        // Per process: a forked child starts its own.
        static PUMP: crate::process::PerProcess<Option<&'static Pump>> =
            crate::process::PerProcess::new();
        *PUMP.get_or_init(|| {
            let owned = |fd: i32| {
                // SAFETY: a new descriptor nobody else owns.
                (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
            };
            // SAFETY: plain system calls.
            let epoll = owned(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
            let kick = owned(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
            let pump: &'static Pump = Box::leak(Box::new(Pump {
                epoll,
                kick,
                lanes: Mutex::new(HashMap::new()),
                next_key: AtomicU64::new(0),
                due: Mutex::new(VecDeque::new()),
                leader: Runner(AtomicU64::new(0)),
                waiter_reads: AtomicBool::new(false),
                waiter_role: Mutex::new(()),
                parked: Mutex::new(false),
                unpark: Condvar::new(),
                linger: OnceLock::new(),
                lingering: AtomicBool::new(false),
            }));
            let _ = pump
                .linger
                .set(Alarm::new(LINGER, Arc::new(move || pump.wake_leader()))?);
            let kick_events = (libc::EPOLLIN | libc::EPOLLET) as u32;
            pump.ctl_events(
                libc::EPOLL_CTL_ADD,
                pump.kick.as_raw_fd(),
                KICK,
                kick_events,
            )
            .ok()?;
            if !pump.spawn_leader() {
                return None;
            }
            install_wait_hook(WaitHook {
                wait: wait_reading,
                wake: wake_reader,
                awaited: reader_needed,
                defer: run_elsewhere,
            });
            Some(pump)
        })
    }

    /// Adds `socket` to the process's lanes; gives it back when there is no
    /// pump, or it cannot be added.
    pub(super) fn add(
        socket: std::net::TcpStream,
        handlers: Handlers,
    ) -> std::result::Result<(), (std::net::TcpStream, Handlers)> {
        let Some(pump) = pump() else {
            return Err((socket, handlers));
        };
        let Ok(reading) = socket.try_clone() else {
            return Err((socket, handlers));
        };
        let fd = reading.as_raw_fd();
        let key = pump.next_key.fetch_add(1, Ordering::Relaxed);
        let lane = Lane {
            frames: FrameReader::new(DontWait(reading), MAX_FRAME_BYTES),
            handlers,
        };
        let slot = LaneSlot {
            readable: AtomicBool::new(false),
            lane: Mutex::new(lane),
        };
        lock(&pump.lanes).insert(key, Arc::new(slot));
        if pump.ctl(libc::EPOLL_CTL_ADD, fd, key).is_err() {
            let slot = lock(&pump.lanes).remove(&key);
            if let Some(slot) = slot.and_then(|slot| Arc::try_unwrap(slot).ok()) {
                let lane = slot.lane.into_inner().unwrap_or_else(|e| e.into_inner());
                return Err((socket, lane.handlers));
            }
            // Unreachable: nobody else saw the lane.
            return Ok(());
        }
        Ok(())
    }

    thread_local! {
        /// This thread's runner and alarm, for when it reads as a waiter.
        static WAITER: RefCell<Option<(Arc<Runner>, Alarm)>> = const { RefCell::new(None) };
        /// This thread reads as the waiter now.
        static READING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// [`WaitHook::wake`]: the event a waiter waits for is ready. The
    /// waiter itself looks after each answer it runs: only another thread
    /// kicks.
    fn wake_reader() {
        if !READING.with(std::cell::Cell::get) {
            if let Some(pump) = pump() {
                pump.kick();
            }
        }
    }

    /// [`WaitHook::awaited`]: the leader no longer lingers.
    fn reader_needed() {
        if let Some(pump) = pump() {
            if pump.lingering.swap(false, Ordering::SeqCst) {
                pump.wake_leader();
            }
        }
    }

    /// [`WaitHook::defer`]: on a thread of the transport's blocking pool.
    fn run_elsewhere(callback: Box<dyn FnOnce() + Send>) {
        match runtime() {
            Ok(runtime) => drop(runtime.spawn_blocking(callback)),
            Err(_) => callback(),
        }
    }

    /// [`WaitHook::wait`]: waits for `event` by reading lanes, unless
    /// another waiter does, or this is a thread of the runtime (an executor
    /// or a worker's lane running a program, which what it would run may
    /// wait for).
    fn wait_reading(event: &Event, deadline: Option<Instant>) -> Option<Result<()>> {
        if std::thread::current()
            .name()
            .is_some_and(|name| name.starts_with("colocated-"))
        {
            return None;
        }
        let pump = pump()?;
        let _role = pump.waiter_role.try_lock().ok()?;
        let runner = WAITER.with(|waiter| {
            let mut waiter = waiter.borrow_mut();
            if waiter.is_none() {
                let runner = Arc::new(Runner(AtomicU64::new(0)));
                let taken = runner.clone();
                let alarm = Alarm::new(
                    TAKEOVER_AFTER,
                    Arc::new(move || {
                        // The waiter ran answers too long: the leader reads.
                        if taken.take_over_if_long().is_some() {
                            pump.waiter_done(true);
                        }
                    }),
                );
                *waiter = alarm.map(|alarm| (runner, alarm));
            }
            waiter.as_ref().map(|(runner, _)| runner.clone())
        })?;
        runner.0.store(0, Ordering::SeqCst);
        pump.waiter_reads.store(true, Ordering::SeqCst);
        READING.with(|reading| reading.set(true));
        event.set_hooked(true);
        // What answers complete may start work on the network runtime.
        let entered = runtime().map(|runtime| runtime.enter());
        let result = loop {
            if let Some(status) = event.status() {
                break Some(status);
            }
            if runner.0.load(Ordering::SeqCst) == TAKEN {
                // Taken over: this thread sleeps as usual.
                break None;
            }
            if !lock(&pump.due).is_empty() {
                let ran = WAITER.with(|waiter| {
                    waiter
                        .borrow()
                        .as_ref()
                        .map(|(runner, alarm)| pump.run_due(runner, alarm))
                });
                if ran == Some(false) {
                    break None;
                }
                continue;
            }
            let timeout = match deadline {
                None => -1,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Some(Err(Error::deadline_exceeded(
                            "the event was not ready before the deadline",
                        )));
                    }
                    i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
                }
            };
            if pump.wait_events(timeout).is_err() {
                break None;
            }
        };
        drop(entered);
        event.set_hooked(false);
        READING.with(|reading| reading.set(false));
        if runner.0.load(Ordering::SeqCst) != TAKEN {
            pump.waiter_done(false);
        }
        result
    }

    impl Pump {
        /// Adds or removes `fd` (lane `key`).
        fn ctl(&self, op: i32, fd: i32, key: u64) -> std::io::Result<()> {
            let events = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
            self.ctl_events(op, fd, key, events)
        }

        fn ctl_events(&self, op: i32, fd: i32, key: u64, events: u32) -> std::io::Result<()> {
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
        fn kick(&self) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from an 8-byte buffer to an open
            // eventfd. Cannot fail short of its counter's overflow (2^64).
            unsafe {
                libc::write(self.kick.as_raw_fd(), one.as_ptr().cast(), 8);
            }
        }

        /// Sleeps until lanes are readable, a kick, or `timeout_ms` (-1:
        /// none); the lanes go to `due`.
        fn wait_events(&self, timeout_ms: i32) -> std::io::Result<()> {
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
        fn spawn_leader(&'static self) -> bool {
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
                let _ = self.leader.0.compare_exchange(
                    TAKEN,
                    since,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }

        /// The waiter stopped reading: the leader reads again, and takes
        /// what the waiter left; at once if something is left, if it must
        /// (`now`: the waiter was taken over), or if something else waits
        /// for an answer (a thread asleep, a callback of the user's);
        /// otherwise [`LINGER`] from now, unless another waiter reads by
        /// then.
        fn waiter_done(&self, now: bool) {
            self.waiter_reads.store(false, Ordering::SeqCst);
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

        /// [`LINGER`] has passed since the last waiter stopped reading, or
        /// something else waits: the leader reads, unless a waiter does.
        fn wake_leader(&self) {
            self.lingering.store(false, Ordering::SeqCst);
            let parked = lock(&self.parked);
            if *parked && !self.waiter_reads.load(Ordering::SeqCst) {
                self.unpark.notify_one();
            }
        }

        /// Runs `due` lanes' answers as `runner` until none is left; false
        /// if another thread took over meanwhile.
        fn run_due(&self, runner: &Runner, alarm: &Alarm) -> bool {
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
                if self.waiter_reads.load(Ordering::SeqCst) {
                    let mut parked = lock(&self.parked);
                    while self.waiter_reads.load(Ordering::SeqCst) {
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
                    if self.waiter_reads.load(Ordering::SeqCst) {
                        // The waiter was busy: it takes these.
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
                    let ended_handler =
                        std::mem::replace(&mut lane.handlers.ended, Box::new(|_| {}));
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

    /// What a reading of a lane left.
    enum Read {
        /// Nothing: what arrives next makes the lane readable again.
        Drained,
        /// Bytes, unread so that one busy lane does not keep the others
        /// waiting.
        Left,
        /// The lane ended, for this reason.
        Ended(Error),
    }

    /// Reads what `lane` has and runs every answer that arrived whole.
    fn read_lane(lane: &mut Lane) -> Read {
        // Bounded, so that one busy lane does not keep the others waiting.
        let (mut reads, mut drained) = (0, false);
        loop {
            match lane.frames.buffered::<ControlResponse>() {
                Ok(Some(answer)) => {
                    (lane.handlers.answer)(answer);
                    continue;
                }
                Ok(None) => {}
                Err(err) => return Read::Ended(broke(&err)),
            }
            if drained {
                return Read::Drained;
            }
            if reads == 16 {
                return Read::Left;
            }
            reads += 1;
            match lane.frames.read_available() {
                Ok(Available::Some) => {}
                // Once these are taken, nothing is left to read: what comes
                // later makes the lane readable again (edge-triggered).
                Ok(Available::All) => drained = true,
                Ok(Available::End) if lane.frames.is_empty() => {
                    return Read::Ended(Error::unavailable("the control stream ended"))
                }
                Ok(Available::End) => {
                    return Read::Ended(Error::unavailable(
                        "the control stream broke: it ended in the middle of a message",
                    ))
                }
                Ok(Available::None) => return Read::Drained,
                Err(err) => return Read::Ended(broke(&err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::{read_lane_answers, Handlers};
    use crate::transport::lane::encode_frame;
    use crate::transport::proto::ControlResponse;

    /// Bytes that have arrived on `socket` and wait to be read.
    fn queued(socket: &std::net::TcpStream) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut n) };
        usize::try_from(n).unwrap_or(0)
    }

    /// An answer that arrives while another thread reads its lane (held
    /// up by the answer before, whose completion runs long): the thread
    /// that was told of it leaves it to the reader, which reads it once it
    /// is done, though no byte comes after it.
    #[test]
    fn an_answer_that_arrives_while_its_lane_is_read_is_read_too() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut worker = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (controller, _) = listener.accept().unwrap();
        let answer = |seq: u64| {
            let mut bytes = Vec::new();
            encode_frame(
                &ControlResponse {
                    seq,
                    finished: true,
                    ..Default::default()
                },
                &mut bytes,
            );
            bytes
        };
        let (entered, in_first) = std::sync::mpsc::channel::<()>();
        let (go, wait_for_go) = std::sync::mpsc::channel::<()>();
        let wait_for_go = Mutex::new(wait_for_go);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers = seen.clone();
        read_lane_answers(
            controller,
            Handlers {
                answer: Box::new(move |answer| {
                    answers.lock().unwrap().push(answer.seq);
                    if answer.seq == 1 {
                        entered.send(()).unwrap();
                        let go = wait_for_go.lock().unwrap();
                        go.recv_timeout(Duration::from_secs(10)).unwrap();
                    }
                }),
                ended: Box::new(|_| {}),
            },
        )
        .unwrap();
        worker.write_all(&answer(1)).unwrap();
        in_first.recv_timeout(Duration::from_secs(10)).unwrap();
        // The reader runs the first answer's completion: it is taken over
        // (after 2 ms), and the new reader is told of the second answer.
        worker.write_all(&answer(2)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        go.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "the second answer was not read");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    }

    /// Answers that had all arrived before their lane was read, more than a
    /// reader takes from one lane at a time (16 reads of 64 KiB): the rest
    /// is read too, though no byte arrives after them to report the lane
    /// again.
    #[test]
    fn answers_beyond_one_reading_turn_are_all_read() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut worker = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut controller, _) = listener.accept().unwrap();
        // The receiving side's buffer grows with use: 16 MiB through it
        // first, so that the answers below fit in it at once.
        let warm = std::thread::spawn(move || {
            let chunk = vec![0u8; 1 << 20];
            for _ in 0..16 {
                worker.write_all(&chunk).unwrap();
            }
            worker
        });
        let mut chunk = vec![0u8; 64 << 10];
        let mut read = 0;
        while read < 16 << 20 {
            read += controller.read(&mut chunk).unwrap();
        }
        let mut worker = warm.join().unwrap();
        const ANSWERS: u64 = 5; // 1.25 MiB
        let mut bytes = Vec::new();
        for seq in 1..=ANSWERS {
            let answer = ControlResponse {
                seq,
                finished: true,
                data: vec![seq as u8; 256 << 10].into(),
                ..Default::default()
            };
            encode_frame(&answer, &mut bytes);
        }
        let total = bytes.len();
        let writer = std::thread::spawn(move || {
            worker.write_all(&bytes).unwrap();
            worker
        });
        // All of it waits on the socket before the lane is read (if the
        // machine's buffers take it; the answers are checked either way).
        let deadline = Instant::now() + Duration::from_secs(2);
        while queued(&controller) < total && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers = seen.clone();
        read_lane_answers(
            controller,
            Handlers {
                answer: Box::new(move |answer| {
                    assert!(answer.data.iter().all(|&b| b == answer.seq as u8));
                    answers.lock().unwrap().push(answer.seq);
                }),
                ended: Box::new(|_| {}),
            },
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < ANSWERS as usize {
            assert!(
                Instant::now() < deadline,
                "{} of {ANSWERS} answers were read",
                seen.lock().unwrap().len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*seen.lock().unwrap(), (1..=ANSWERS).collect::<Vec<_>>());
        drop(writer.join().unwrap());
    }
}
