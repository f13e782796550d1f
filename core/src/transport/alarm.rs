//! One-shot alarms that cost nothing unless they go off: what tells that
//! the thread reading lanes has run something for too long, and another
//! must take over the reading (a worker's lane, and the controller's
//! reader of answers).
//!
//! Each alarm is a kernel timer (`timerfd`); one thread of the process
//! sleeps in `epoll` on all of them and runs an alarm's action when it goes
//! off. Arming and disarming are one system call each, with no thread woken:
//! a program that finishes in time costs two system calls, and a process
//! whose programs all do has a watch that never wakes (a watch that looked
//! every few milliseconds instead cost hundreds of workers on one machine
//! more than their calls did).
//!
//! Linux only: elsewhere [`Alarm::new`] gives none, and the readers of
//! lanes run nothing that may last (see where they are used).

use std::sync::Arc;
use std::time::Duration;

/// What an alarm runs when it goes off (on the watch's thread: briefly).
pub(crate) type Action = Arc<dyn Fn() + Send + Sync>;

/// A one-shot alarm: [`arm`](Alarm::arm)ed, it runs its action once the
/// time has passed, unless [`disarm`](Alarm::disarm)ed first.
pub(crate) struct Alarm {
    #[cfg(target_os = "linux")]
    timer: linux::Timer,
}

impl Alarm {
    /// An alarm that runs `action` when it goes off; `None` where the
    /// platform has no such alarms, or the watch cannot start.
    pub(crate) fn new(action: Action) -> Option<Alarm> {
        #[cfg(target_os = "linux")]
        {
            linux::Timer::new(action).map(|timer| Alarm { timer })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = action;
            None
        }
    }

    /// Goes off `after` from now (again, if it went off before).
    pub(crate) fn arm(&self, after: Duration) {
        #[cfg(target_os = "linux")]
        self.timer.set(after);
        #[cfg(not(target_os = "linux"))]
        let _ = after;
    }

    /// Does not go off (unless it went off already).
    pub(crate) fn disarm(&self) {
        #[cfg(target_os = "linux")]
        self.timer.set(Duration::ZERO);
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::HashMap;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use super::Action;
    use crate::transport::lock;

    /// The process's watch: an `epoll` set of every alarm's timer, and each
    /// timer's descriptor and action, by key.
    struct Watch {
        epoll: OwnedFd,
        timers: Mutex<HashMap<u64, (RawFd, Action)>>,
        next_key: AtomicU64,
    }

    /// The watch, its thread started on first use; `None` if it cannot be.
    fn watch() -> Option<&'static Watch> {
        static WATCH: OnceLock<Option<&'static Watch>> = OnceLock::new();
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
    }

    impl Watch {
        /// The action of timer `key` if it went off (reading it, so that
        /// it stops being ready): under the lock that `Drop` takes, so the
        /// descriptor read is the timer's, open. The action runs after,
        /// without the lock (it may drop a timer).
        fn went_off(&self, key: u64) -> Option<Action> {
            let timers = lock(&self.timers);
            let (fd, action) = timers.get(&key)?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads 8 bytes into an 8-byte buffer from an open
            // descriptor (see above).
            let read = unsafe { libc::read(*fd, expirations.as_mut_ptr().cast(), 8) };
            (read == 8).then(|| action.clone())
        }
    }

    /// A `timerfd` in the watch's set.
    pub(crate) struct Timer {
        fd: OwnedFd,
        key: u64,
        watch: &'static Watch,
    }

    impl Timer {
        pub(crate) fn new(action: Action) -> Option<Timer> {
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
            lock(&watch.timers).insert(key, (fd.as_raw_fd(), action));
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
            Some(Timer { fd, key, watch })
        }

        /// Goes off once, `after` from now; never with zero.
        pub(crate) fn set(&self, after: Duration) {
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
            // SAFETY: the timer is open; `spec` outlives the call. Cannot
            // fail with these arguments.
            unsafe {
                libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut());
            }
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

    #[test]
    fn an_alarm_goes_off_once_armed_and_never_when_disarmed_in_time() {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let alarm = Alarm::new(Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }))
        .expect("an alarm");
        alarm.arm(Duration::from_millis(50));
        alarm.disarm();
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(count.load(Ordering::SeqCst), 0, "disarmed in time");
        alarm.arm(Duration::from_millis(1));
        let start = std::time::Instant::now();
        while count.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(count.load(Ordering::SeqCst), 1, "went off once");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(count.load(Ordering::SeqCst), 1, "one-shot");
        // Dropped: nothing runs any more, and the next alarm still works.
        alarm.arm(Duration::from_millis(1));
        drop(alarm);
        let other = Arc::new(AtomicUsize::new(0));
        let counted = other.clone();
        let next = Alarm::new(Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }))
        .expect("an alarm");
        next.arm(Duration::from_millis(1));
        let start = std::time::Instant::now();
        while other.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(other.load(Ordering::SeqCst), 1);
        assert_eq!(count.load(Ordering::SeqCst), 1, "a dropped alarm is silent");
    }
}
