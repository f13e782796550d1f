//! The process's reader of lanes on Linux: one `epoll` set for every lane,
//! read by a leader thread and by a thread about to wait (see the parent
//! module), and the wait hook that lets that thread read.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use super::{broke, Handlers, LINGER, MAX_HOLD, TAKEOVER_AFTER};
use crate::error::{Error, Result};
use crate::future::{install_wait_hook, Event, WaitHook};
use crate::transport::alarm::Alarm;
use crate::transport::lane::{Available, FrameReader, MAX_FRAME_BYTES};
use crate::transport::proto::ControlResponse;
use crate::transport::{lock, runtime};

mod leader;

/// Reads without waiting: `WouldBlock` when nothing has arrived. (The
/// socket itself stays blocking: the lane's writer shares it.)
struct DontWait(Arc<std::net::TcpStream>);

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

/// [`MAX_HOLD`] in nanoseconds.
const MAX_HOLD_NANOS: u64 = MAX_HOLD.as_nanos() as u64;

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
    /// Threads that send the parts of a call (see [`Sending`]).
    sending: AtomicUsize,
    /// Since when senders keep the leader asleep (see [`Pump::held`]),
    /// nanoseconds; 0 while none does, or once a reader read since.
    held_since: AtomicU64,
}

/// See [`super::Sending`].
pub(super) struct Sending(&'static Pump);

impl Sending {
    /// `None` when the process reads no lanes yet, or this thread will not
    /// read them when it waits.
    pub(super) fn start() -> Option<Sending> {
        if !may_read_here() {
            return None;
        }
        let pump = (*PUMP.get()?)?;
        pump.sending.fetch_add(1, Ordering::SeqCst);
        if pump
            .held_since
            .compare_exchange(0, now_nanos(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            // Looks at the hold every [`LINGER`] (see `Pump::wake_leader`).
            if let Some(linger) = pump.linger.get() {
                linger.arm();
            }
        }
        Some(Sending(pump))
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if self.0.sending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.senders_done();
        }
    }
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

/// The process's pump (per process: a forked child starts its own).
static PUMP: crate::process::PerProcess<Option<&'static Pump>> = crate::process::PerProcess::new();

/// The process's pump, its leader started on first use; `None` if
/// `epoll`, an alarm or a thread cannot be had.
fn pump() -> Option<&'static Pump> {
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
            sending: AtomicUsize::new(0),
            held_since: AtomicU64::new(0),
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
    socket: Arc<std::net::TcpStream>,
    handlers: Handlers,
) -> std::result::Result<(), (Arc<std::net::TcpStream>, Handlers)> {
    let Some(pump) = pump() else {
        return Err((socket, handlers));
    };
    let fd = socket.as_raw_fd();
    let reading = socket.clone();
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

/// [`WaitHook::awaited`]: the leader no longer lingers, nor is it kept
/// asleep for a sender.
fn reader_needed() {
    if let Some(pump) = pump() {
        let lingering = pump.lingering.swap(false, Ordering::SeqCst);
        if lingering || pump.held_since.load(Ordering::SeqCst) != 0 {
            pump.wake_leader();
        }
    }
}

/// Whether this thread may read lanes when it waits: not a thread of the
/// runtime (an executor or a worker's lane running a program, which what
/// it would run may wait for).
fn may_read_here() -> bool {
    !std::thread::current()
        .name()
        .is_some_and(|name| name.starts_with("colocated-"))
}

/// [`WaitHook::defer`]: on a thread of the transport's blocking pool.
fn run_elsewhere(callback: Box<dyn FnOnce() + Send>) {
    match runtime() {
        Ok(runtime) => drop(runtime.spawn_blocking(callback)),
        Err(_) => callback(),
    }
}

/// [`WaitHook::wait`]: waits for `event` by reading lanes, unless
/// another waiter does, or this thread may not (see [`may_read_here`]).
fn wait_reading(event: &Event, deadline: Option<Instant>) -> Option<Result<()>> {
    if !may_read_here() {
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
