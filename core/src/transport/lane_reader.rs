//! The controller's reading of its lanes' answers (see
//! [`crate::transport::lane`]): one thread for every lane of the process.
//!
//! A thread per lane, asleep in `recv`, costs a wake-up (and a context
//! switch) per answer; a call fanned out to N workers paid N of them before
//! the waiting caller was woken. Here one thread (the *leader*) sleeps in
//! `epoll` on every lane at once and takes the answers of all lanes that are
//! ready when it wakes: a fan-out's answers wake it a few times, not N.
//!
//! Each lane is in the `epoll` set with `EPOLLONESHOT`: a lane that became
//! readable is the leader's alone until it has read what arrived and armed
//! the lane again, so one lane's answers are taken in order, by one thread at
//! a time. What an answer runs (a completion) may last (a callback of the
//! user's): when the leader has run answers for [`TAKEOVER_AFTER`] (its
//! [`Alarm`] goes off), a new thread leads, and the old one ends once its
//! answer is done; the lanes it has not come to yet wait for the new leader,
//! not for it.
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
    use std::collections::{HashMap, VecDeque};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, OnceLock};

    use super::{broke, Handlers, TAKEOVER_AFTER};
    use crate::error::Error;
    use crate::transport::alarm::Alarm;
    use crate::transport::lane::{FrameReader, MAX_FRAME_BYTES};
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

    /// The process's reader of lanes.
    struct Pump {
        epoll: OwnedFd,
        lanes: Mutex<HashMap<u64, Arc<Mutex<Lane>>>>,
        next_key: AtomicU64,
        /// Lanes that became readable and wait for the leader (filled by
        /// `epoll_wait`, emptied one by one, so that a new leader takes the
        /// rest).
        due: Mutex<VecDeque<u64>>,
        /// When the leader began running answers (nanoseconds, never 0); 0
        /// while it waits; [`TAKEN`] once a new leader was started.
        running_since: AtomicU64,
        alarm: OnceLock<Alarm>,
    }

    /// `Pump::running_since` once a new leader was started.
    const TAKEN: u64 = u64::MAX;

    /// Nanoseconds on a clock of the process (never 0, never [`TAKEN`]).
    fn now_nanos() -> u64 {
        static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
        let nanos = EPOCH
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos();
        u64::try_from(nanos)
            .unwrap_or(TAKEN - 1)
            .clamp(1, TAKEN - 1)
    }

    /// The process's pump, its leader started on first use; `None` if
    /// `epoll`, an alarm or a thread cannot be had.
    fn pump() -> Option<&'static Pump> {
        static PUMP: OnceLock<Option<&'static Pump>> = OnceLock::new();
        *PUMP.get_or_init(|| {
            // SAFETY: plain system call; the descriptor is owned below.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return None;
            }
            let pump: &'static Pump = Box::leak(Box::new(Pump {
                // SAFETY: `fd` is a new descriptor nobody else owns.
                epoll: unsafe { OwnedFd::from_raw_fd(fd) },
                lanes: Mutex::new(HashMap::new()),
                next_key: AtomicU64::new(0),
                due: Mutex::new(VecDeque::new()),
                running_since: AtomicU64::new(0),
                alarm: OnceLock::new(),
            }));
            let alarm = Alarm::new(Arc::new(move || pump.ran_long()))?;
            let _ = pump.alarm.set(alarm);
            std::thread::Builder::new()
                .name("colocated-lanes".into())
                .spawn(move || pump.lead())
                .ok()?;
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
        lock(&pump.lanes).insert(key, Arc::new(Mutex::new(lane)));
        if pump.ctl(libc::EPOLL_CTL_ADD, fd, key).is_err() {
            let lane = lock(&pump.lanes).remove(&key);
            if let Some(lane) = lane.and_then(|lane| Arc::try_unwrap(lane).ok()) {
                let lane = lane.into_inner().unwrap_or_else(|e| e.into_inner());
                return Err((socket, lane.handlers));
            }
            // Unreachable: nobody else saw the lane.
            return Ok(());
        }
        Ok(())
    }

    impl Pump {
        /// Adds, arms again or removes `fd` (lane `key`).
        fn ctl(&self, op: i32, fd: i32, key: u64) -> std::io::Result<()> {
            let mut event = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32,
                u64: key,
            };
            // SAFETY: both descriptors are open; `event` outlives the call.
            let done = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut event) };
            if done < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        }

        /// Waits for lanes and takes their answers, until another thread
        /// took over.
        fn lead(&'static self) {
            // What answers complete may start work on the network runtime.
            let runtime = runtime().map(|runtime| runtime.enter());
            // SAFETY: `epoll_event` is plain data.
            let mut events = [unsafe { std::mem::zeroed::<libc::epoll_event>() }; 64];
            loop {
                if lock(&self.due).is_empty() {
                    // SAFETY: `events` has room for the count given.
                    let n = unsafe {
                        libc::epoll_wait(
                            self.epoll.as_raw_fd(),
                            events.as_mut_ptr(),
                            events.len() as i32,
                            -1,
                        )
                    };
                    if n < 0 {
                        let err = std::io::Error::last_os_error();
                        if err.kind() == std::io::ErrorKind::Interrupted {
                            continue;
                        }
                        tracing::error!("the controller stopped reading lanes: {err}");
                        return;
                    }
                    lock(&self.due).extend(events[..n as usize].iter().map(|e| e.u64));
                }
                let started = now_nanos();
                // Only the leader stores a time: a thread that was taken
                // over has returned or is running its last answer.
                self.running_since.store(started, Ordering::SeqCst);
                if let Some(alarm) = self.alarm.get() {
                    alarm.arm(TAKEOVER_AFTER);
                }
                loop {
                    let key = lock(&self.due).pop_front();
                    let Some(key) = key else { break };
                    self.take(key);
                    if self.running_since.load(Ordering::SeqCst) != started {
                        // Taken over: the new leader takes the rest.
                        drop(runtime);
                        return;
                    }
                }
                if let Some(alarm) = self.alarm.get() {
                    alarm.disarm();
                }
                if self
                    .running_since
                    .compare_exchange(started, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    drop(runtime);
                    return;
                }
            }
        }

        /// The alarm went off: the leader has run answers for
        /// [`TAKEOVER_AFTER`] (unless it finished just now).
        fn ran_long(&'static self) {
            let since = self.running_since.load(Ordering::SeqCst);
            let after = u64::try_from(TAKEOVER_AFTER.as_nanos()).unwrap_or(u64::MAX);
            if since == 0 || since == TAKEN || now_nanos().saturating_sub(since) < after {
                return;
            }
            if self
                .running_since
                .compare_exchange(since, TAKEN, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return;
            }
            let spawned = std::thread::Builder::new()
                .name("colocated-lanes".into())
                .spawn(move || self.lead());
            if let Err(err) = spawned {
                tracing::warn!("cannot start a thread to read lanes: {err}");
                // The leader reads on once its answer is done.
                self.running_since.store(since, Ordering::SeqCst);
            }
        }

        /// Takes what lane `key` has: every answer that arrived whole, then
        /// arms it again, or ends it.
        fn take(&self, key: u64) {
            let Some(lane) = lock(&self.lanes).get(&key).cloned() else {
                return;
            };
            let mut lane = lock(&lane);
            let lane = &mut *lane;
            // Bounded, so that one busy lane does not keep the others
            // waiting: what is left comes round again once armed.
            let mut reads = 0;
            let ended = loop {
                match lane.frames.buffered::<ControlResponse>() {
                    Ok(Some(answer)) => {
                        (lane.handlers.answer)(answer);
                        continue;
                    }
                    Ok(None) => {}
                    Err(err) => break Some(broke(&err)),
                }
                if reads == 16 {
                    break None;
                }
                reads += 1;
                match lane.frames.read_available() {
                    Ok(Some(true)) => {}
                    Ok(Some(false)) if lane.frames.is_empty() => {
                        break Some(Error::unavailable("the control stream ended"))
                    }
                    Ok(Some(false)) => {
                        break Some(Error::unavailable(
                            "the control stream broke: it ended in the middle of a message",
                        ))
                    }
                    Ok(None) => break None,
                    Err(err) => break Some(broke(&err)),
                }
            };
            let fd = lane.frames.source().0.as_raw_fd();
            let ended = match ended {
                None => match self.ctl(libc::EPOLL_CTL_MOD, fd, key) {
                    Ok(()) => return,
                    Err(err) => Error::unavailable(format!("the control stream broke: {err}")),
                },
                Some(ended) => ended,
            };
            let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, key);
            lock(&self.lanes).remove(&key);
            let ended_handler = std::mem::replace(&mut lane.handlers.ended, Box::new(|_| {}));
            ended_handler(ended);
        }
    }
}
