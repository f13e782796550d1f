//! One-shot alarms that cost little unless they go off: what tells that
//! the thread reading lanes has run something for too long, and another
//! must take over the reading (a worker's lane, and the controller's
//! reader of answers), and when the controller's reader of lanes wakes
//! after a caller stopped waiting.
//!
//! Each alarm is a kernel timer (`timerfd`); one thread of the process
//! sleeps in `epoll` on all of them and runs an alarm's action when it goes
//! off. An alarm always goes off the same time after it was armed, so a
//! timer set already goes off no later than the alarm is due: arming then
//! needs no system call, and the timer that goes off early sees when the
//! alarm is due and is set again for the rest. Disarming only marks the
//! alarm; its timer is stopped as well (a system call) unless the alarm was
//! disarmed last within a [`DENSE`] part of its time, that is, unless it is
//! armed many times over its time: then the timer goes off once in a while
//! for nothing (a thread woken), which costs less than two system calls for
//! each of those armings. A program that finishes in time costs
//! at most two system calls, and a process whose programs all do, once
//! they stop coming, has a watch that does not wake (a watch that looked
//! every few milliseconds instead cost hundreds of workers on one machine
//! more than their calls did).
//!
//! Linux only: elsewhere [`Alarm::new`] gives none, and the readers of
//! lanes run nothing that may last (see where they are used).

use std::sync::Arc;
use std::time::Duration;

/// The part of an alarm's time within which it must have been disarmed last
/// for its timer to be left set when it is disarmed again: armed fewer than
/// about this many times over its time, stopping the timer each time costs
/// less than the watch waking for nothing.
const DENSE: u64 = 16;

/// What an alarm runs when it goes off (on the watch's thread: briefly).
pub(crate) type Action = Arc<dyn Fn() + Send + Sync>;

/// A one-shot alarm: [`arm`](Alarm::arm)ed, it runs its action once its
/// time has passed, unless [`disarm`](Alarm::disarm)ed or armed again
/// first.
pub(crate) struct Alarm {
    #[cfg(target_os = "linux")]
    timer: linux::Timer,
}

impl Alarm {
    /// An alarm that runs `action` when it goes off, `after` it was last
    /// armed; `None` where the platform has no such alarms, or the watch
    /// cannot start.
    pub(crate) fn new(after: Duration, action: Action) -> Option<Alarm> {
        #[cfg(target_os = "linux")]
        {
            linux::Timer::new(after, action).map(|timer| Alarm { timer })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (after, action);
            None
        }
    }

    /// Goes off its time from now (again, if it went off before).
    pub(crate) fn arm(&self) {
        #[cfg(target_os = "linux")]
        self.timer.arm();
    }

    /// Does not go off (unless it went off already).
    pub(crate) fn disarm(&self) {
        #[cfg(target_os = "linux")]
        self.timer.disarm();
    }

    /// Does not go off (unless it went off already), and leaves its timer
    /// set, with no system call: for an alarm armed again and again, whose
    /// timer then goes off once per its time (a thread woken for nothing)
    /// rather than being stopped and set for each arming. Its time must be
    /// long for that to cost less.
    pub(crate) fn disarm_lazily(&self) {
        #[cfg(target_os = "linux")]
        self.timer.disarm_lazily();
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::HashMap;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use super::Action;
    use crate::transport::lock;

    /// Nanoseconds on a clock of the process (never 0).
    fn now_nanos() -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        let nanos = EPOCH.get_or_init(Instant::now).elapsed().as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX).max(1)
    }

    /// What an alarm and the watch share.
    struct Shared {
        action: Action,
        /// When the alarm goes off ([`now_nanos`]); 0 when it does not.
        due: AtomicU64,
        /// When its timer is set to go off; 0 when it is not set (or may
        /// not be: arming then sets it).
        set_for: AtomicU64,
    }

    /// The process's watch: an `epoll` set of every alarm's timer, and each
    /// timer's descriptor and what it shares, by key.
    struct Watch {
        epoll: OwnedFd,
        timers: Mutex<HashMap<u64, (RawFd, Arc<Shared>)>>,
        next_key: AtomicU64,
    }

    /// The watch, its thread started on first use; `None` if it cannot be.
    fn watch() -> Option<&'static Watch> {
        // Per process: a forked child starts its own.
        static WATCH: crate::process::PerProcess<Option<&'static Watch>> =
            crate::process::PerProcess::new();
        *WATCH.get_or_init(|| {
            // SAFETY: plain system call; the descriptor is owned below.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                tracing::warn!(
                    "no alarms for lanes (epoll: {})",
                    std::io::Error::last_os_error()
                );
                return None;
            }
            let watch: &'static Watch = Box::leak(Box::new(Watch {
                // SAFETY: `fd` is a new descriptor nobody else owns.
                epoll: unsafe { OwnedFd::from_raw_fd(fd) },
                timers: Mutex::new(HashMap::new()),
                next_key: AtomicU64::new(0),
            }));
            match std::thread::Builder::new()
                .name("colocated-alarms".into())
                .spawn(move || watch.run())
            {
                Ok(_) => Some(watch),
                Err(err) => {
                    tracing::warn!("no alarms for lanes (a thread: {err})");
                    None
                }
            }
        })
    }

    impl Watch {
        fn run(&self) {
            // SAFETY: `epoll_event` is plain data.
            let mut events = [unsafe { std::mem::zeroed::<libc::epoll_event>() }; 16];
            loop {
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
                    tracing::warn!("the lanes' alarms stopped: {err}");
                    return;
                }
                for event in &events[..n as usize] {
                    if let Some(action) = self.went_off(event.u64) {
                        action();
                    }
                }
            }
        }

        /// The action of timer `key` if it went off and its alarm is due
        /// (reading the timer, so that it stops being ready); a timer that
        /// went off before its alarm is due (put off meanwhile) is set again
        /// for the rest. Under the lock that `Drop` takes, so the descriptor
        /// used is the timer's, open. The action runs after, without the
        /// lock (it may drop a timer).
        fn went_off(&self, key: u64) -> Option<Action> {
            let timers = lock(&self.timers);
            let (fd, shared) = timers.get(&key)?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads 8 bytes into an 8-byte buffer from an open
            // descriptor (see above).
            let read = unsafe { libc::read(*fd, expirations.as_mut_ptr().cast(), 8) };
            if read != 8 {
                return None;
            }
            shared.set_for.store(0, Ordering::SeqCst);
            loop {
                let due = shared.due.load(Ordering::SeqCst);
                if due == 0 {
                    return None;
                }
                let now = now_nanos();
                if now < due {
                    if shared
                        .set_for
                        .compare_exchange(0, due, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        set(*fd, Duration::from_nanos(due - now));
                    }
                    return None;
                }
                if shared
                    .due
                    .compare_exchange(due, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Some(shared.action.clone());
                }
            }
        }
    }

    /// Sets timer `fd` to go off once, `after` from now; with zero, stops
    /// it.
    fn set(fd: RawFd, after: Duration) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs().try_into().unwrap_or(libc::time_t::MAX),
                tv_nsec: after.subsec_nanos().into(),
            },
        };
        // SAFETY: the timer is open (its owner's, or under the watch's
        // lock); `spec` outlives the call. Cannot fail with these arguments.
        unsafe {
            libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut());
        }
    }

    /// A `timerfd` in the watch's set.
    pub(crate) struct Timer {
        fd: OwnedFd,
        key: u64,
        after: u64,
        /// When the alarm was last disarmed ([`now_nanos`]).
        disarmed: AtomicU64,
        shared: Arc<Shared>,
        watch: &'static Watch,
    }

    impl Timer {
        pub(crate) fn new(after: Duration, action: Action) -> Option<Timer> {
            let watch = watch()?;
            // SAFETY: plain system call; the descriptor is owned below.
            let fd = unsafe {
                libc::timerfd_create(
                    libc::CLOCK_MONOTONIC,
                    libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
                )
            };
            if fd < 0 {
                tracing::warn!("no alarm: {}", std::io::Error::last_os_error());
                return None;
            }
            // SAFETY: `fd` is a new descriptor nobody else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let key = watch.next_key.fetch_add(1, Ordering::Relaxed);
            let shared = Arc::new(Shared {
                action,
                due: AtomicU64::new(0),
                set_for: AtomicU64::new(0),
            });
            lock(&watch.timers).insert(key, (fd.as_raw_fd(), shared.clone()));
            let mut event = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: key,
            };
            // SAFETY: both descriptors are open; `event` outlives the call.
            let added = unsafe {
                libc::epoll_ctl(
                    watch.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    fd.as_raw_fd(),
                    &mut event,
                )
            };
            if added < 0 {
                tracing::warn!("no alarm: {}", std::io::Error::last_os_error());
                lock(&watch.timers).remove(&key);
                return None;
            }
            Some(Timer {
                fd,
                key,
                after: u64::try_from(after.as_nanos()).unwrap_or(u64::MAX).max(1),
                disarmed: AtomicU64::new(0),
                shared,
                watch,
            })
        }

        /// Due `after` from now; sets the timer only if it is not set (set,
        /// it goes off no later: every arming adds the same time).
        pub(crate) fn arm(&self) {
            let due = now_nanos().saturating_add(self.after);
            self.shared.due.store(due, Ordering::SeqCst);
            if self
                .shared
                .set_for
                .compare_exchange(0, due, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                set(self.fd.as_raw_fd(), Duration::from_nanos(self.after));
            }
        }

        /// Not due; the timer stops too, unless the alarm was disarmed
        /// last within a [`DENSE`](super::DENSE) part of its time (then it
        /// is armed often, and the timer going off once for nothing costs
        /// less).
        pub(crate) fn disarm(&self) {
            self.shared.due.store(0, Ordering::SeqCst);
            let now = now_nanos();
            let last = self.disarmed.swap(now, Ordering::Relaxed);
            if now.saturating_sub(last) >= self.after / super::DENSE {
                self.shared.set_for.store(0, Ordering::SeqCst);
                set(self.fd.as_raw_fd(), Duration::ZERO);
            }
        }

        /// Not due; the timer goes off for nothing when it is set (and
        /// is not set again then).
        pub(crate) fn disarm_lazily(&self) {
            self.shared.due.store(0, Ordering::SeqCst);
        }
    }

    impl Drop for Timer {
        fn drop(&mut self) {
            // Under the lock, so that the watch never reads a closed (or
            // reused) descriptor; closing it leaves the set.
            let mut timers = lock(&self.watch.timers);
            timers.remove(&self.key);
            // SAFETY: both descriptors are open.
            unsafe {
                libc::epoll_ctl(
                    self.watch.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                );
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Instant;

    /// Waits (at most ten seconds) until `count` reaches `n`.
    fn until(count: &AtomicUsize, n: usize) {
        let start = Instant::now();
        while count.load(Ordering::SeqCst) < n && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn counting(after: Duration) -> (Alarm, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let alarm = Alarm::new(
            after,
            Arc::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .expect("an alarm");
        (alarm, count)
    }

    #[test]
    fn an_alarm_goes_off_once_armed_and_never_when_disarmed_in_time() {
        let (alarm, count) = counting(Duration::from_millis(50));
        alarm.arm();
        alarm.disarm();
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(count.load(Ordering::SeqCst), 0, "disarmed in time");
        // Disarmed often (the timer left set): still silent.
        for _ in 0..10 {
            alarm.arm();
            alarm.disarm();
        }
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(count.load(Ordering::SeqCst), 0, "disarmed in time, often");
        alarm.arm();
        until(&count, 1);
        assert_eq!(count.load(Ordering::SeqCst), 1, "went off once");
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(count.load(Ordering::SeqCst), 1, "one-shot");
        // Dropped: nothing runs any more, and the next alarm still works.
        alarm.arm();
        drop(alarm);
        let (next, other) = counting(Duration::from_millis(1));
        next.arm();
        until(&other, 1);
        assert_eq!(other.load(Ordering::SeqCst), 1);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(count.load(Ordering::SeqCst), 1, "a dropped alarm is silent");
    }

    #[test]
    fn an_alarm_disarmed_lazily_stays_silent_and_goes_off_when_armed_again() {
        let (alarm, count) = counting(Duration::from_millis(30));
        // Its timer is left set and goes off, for nothing.
        for _ in 0..5 {
            alarm.arm();
            alarm.disarm_lazily();
        }
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(count.load(Ordering::SeqCst), 0, "disarmed lazily");
        // Armed again after its timer went off: the timer is set again.
        alarm.arm();
        until(&count, 1);
        assert_eq!(count.load(Ordering::SeqCst), 1, "went off once armed");
        // Armed, then disarmed lazily before the timer set earlier goes off.
        alarm.arm();
        std::thread::sleep(Duration::from_millis(5));
        alarm.disarm_lazily();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(count.load(Ordering::SeqCst), 1, "silent once disarmed");
    }

    #[test]
    fn an_alarm_armed_again_goes_off_its_time_after_the_last_arming() {
        let after = Duration::from_millis(40);
        let went_off = Arc::new(Mutex::new(Vec::new()));
        let noted = went_off.clone();
        let alarm = Alarm::new(
            after,
            Arc::new(move || noted.lock().expect("lock").push(Instant::now())),
        )
        .expect("an alarm");
        // Armed again every 5 ms for 200 ms: the timer set by the first
        // arming goes off early, again and again, and must not run the
        // action before the alarm is due.
        let mut armed = Vec::new();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            armed.push(Instant::now());
            alarm.arm();
            std::thread::sleep(Duration::from_millis(5));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while went_off.lock().expect("lock").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(100));
        let went_off = went_off.lock().expect("lock").clone();
        assert!(!went_off.is_empty(), "it went off");
        for at in &went_off {
            // The arming just before it went off was at least `after` ago.
            let last = armed
                .iter()
                .filter(|a| *a < at)
                .max()
                .expect("armed before");
            assert!(
                at.duration_since(*last) >= after,
                "went off {:?} after the last arming",
                at.duration_since(*last)
            );
        }
        let last_armed = armed.last().expect("armed");
        assert!(
            went_off.iter().any(|at| at > last_armed),
            "it goes off after the last arming"
        );
    }
}
