//! What the runtime keeps once per process (the network runtime, the reader
//! of lanes, the alarms' watch, the timers that sessions share), made anew
//! in a child forked after it was made: the child has none of its parent's
//! threads, so the parent's copy is left there (leaked, never touched) and
//! the child's first use makes its own. Without that, a forked child that
//! connected to workers waited forever for threads that were not there.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// How many forks this process is from the one that loaded the library:
/// bumped in the child by a `pthread_atfork` handler, before anything of the
/// child's runs.
static GENERATION: AtomicU64 = AtomicU64::new(0);

#[cfg(unix)]
extern "C" fn forked() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// This process's generation (the fork handler registered on first use: a
/// process that made nothing per process before a fork needs none).
fn generation() -> u64 {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registers a handler that only bumps an atomic, which is
        // safe to run in a forked child.
        #[cfg(unix)]
        unsafe {
            libc::pthread_atfork(None, None, Some(forked));
        }
    });
    GENERATION.load(Ordering::Acquire)
}

/// One value per process (see the module): made by the first use, and by
/// the first use in each forked child.
pub(crate) struct PerProcess<T: 'static> {
    /// The latest value and the generation it was made in (leaked: a
    /// reference handed out stays valid).
    current: AtomicPtr<(u64, T)>,
    /// One more than the generation of a thread making the value; 0 when
    /// none is. A child forked while its parent made one takes over.
    making: AtomicU64,
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    pub(crate) const fn new() -> PerProcess<T> {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            making: AtomicU64::new(0),
        }
    }

    /// This process's value, made with `init` if it has none yet (other
    /// threads that want it meanwhile wait for it).
    pub(crate) fn get_or_init(&'static self, init: impl FnOnce() -> T) -> &'static T {
        let generation = generation();
        loop {
            if let Some(value) = self.made_in(generation) {
                return value;
            }
            let making = self.making.load(Ordering::Acquire);
            if making == generation + 1 {
                // Another thread of this process makes it.
                std::thread::yield_now();
                continue;
            }
            // Nobody makes it, or the maker was in the parent (gone here).
            if self
                .making
                .compare_exchange(making, generation + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // Whatever happens in `init`, the next thread may try again.
            struct Done<'a>(&'a AtomicU64);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(0, Ordering::Release);
                }
            }
            let _done = Done(&self.making);
            if let Some(value) = self.made_in(generation) {
                return value;
            }
            let made: &'static (u64, T) = Box::leak(Box::new((generation, init())));
            self.current
                .store(std::ptr::from_ref(made).cast_mut(), Ordering::Release);
            return &made.1;
        }
    }

    /// This process's value, if it has one already (made in this process,
    /// not inherited from the parent of a fork).
    pub(crate) fn get(&'static self) -> Option<&'static T> {
        self.made_in(generation())
    }

    /// The value, if it was made in `generation`.
    fn made_in(&'static self, generation: u64) -> Option<&'static T> {
        let current = self.current.load(Ordering::Acquire);
        // SAFETY: `current` is null or a leaked value, never freed.
        let (made, value) = unsafe { current.as_ref() }?;
        (*made == generation).then_some(value)
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static MADE: AtomicUsize = AtomicUsize::new(0);
    static VALUE: PerProcess<usize> = PerProcess::new();

    fn value() -> usize {
        *VALUE.get_or_init(|| MADE.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[test]
    fn a_forked_child_makes_its_own_value_and_the_parent_keeps_its() {
        let threads: Vec<_> = (0..4).map(|_| std::thread::spawn(value)).collect();
        let parent: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(parent.iter().all(|&v| v == parent[0]), "{parent:?}");
        assert_eq!(MADE.load(Ordering::SeqCst), 1);
        // SAFETY: the child only reads atomics and makes a value, then
        // leaves with `_exit` (no destructor, no test harness).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let ok = value() != parent[0] && value() == value();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child: {status}"
        );
        assert_eq!(value(), parent[0]);
    }
}
