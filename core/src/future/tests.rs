//! Unit tests of events.

use super::*;
use crate::error::ErrorCode;
use std::sync::atomic::AtomicUsize;

/// `set` wakes sleeping threads only when one sleeps (a callback alone
/// costs no wake-up call): threads asleep beside callbacks, and those
/// asleep with a deadline, still wake.
#[test]
fn sleeping_waiters_wake_beside_callbacks() {
    let event = Event::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = ran.clone();
    event.on_ready(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let event = event.clone();
            std::thread::spawn(move || match i {
                0 => event.wait(),
                _ => event.wait_timeout(Duration::from_secs(60)),
            })
        })
        .collect();
    // Long enough for both to be past spinning, asleep.
    std::thread::sleep(Duration::from_millis(50));
    event.set(Ok(())).unwrap();
    for waiter in waiters {
        waiter.join().unwrap().unwrap();
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn on_ready_runs_exactly_once_before_and_after_completion() {
    let e = Event::new();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    e.on_ready(move |r| {
        assert!(r.is_ok());
        c.fetch_add(1, Ordering::SeqCst);
    });
    e.set(Ok(())).unwrap();
    let c = count.clone();
    e.on_ready(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[test]
fn setting_twice_is_a_failed_precondition() {
    let e = Event::new();
    e.set(Err(Error::cancelled("stop"))).unwrap();
    assert_eq!(
        e.set(Ok(())).unwrap_err().code(),
        ErrorCode::FailedPrecondition
    );
    assert_eq!(e.wait().unwrap_err().code(), ErrorCode::Cancelled);
}

#[test]
fn wait_timeout_reports_deadline_exceeded_and_then_completes() {
    let e = Event::new();
    let err = e.wait_timeout(Duration::from_millis(5)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    let e2 = e.clone();
    let t = std::thread::spawn(move || e2.set(Ok(())).unwrap());
    e.wait_timeout(Duration::from_secs(10)).unwrap();
    t.join().unwrap();
}

#[test]
fn join_fails_with_the_first_error_in_order() {
    let (a, b, c) = (Event::new(), Event::new(), Event::new());
    let j = Event::join(&[a.clone(), b.clone(), c.clone()]);
    c.set(Err(Error::internal("c"))).unwrap();
    a.set(Ok(())).unwrap();
    assert!(!j.is_ready());
    b.set(Err(Error::not_found("b"))).unwrap();
    assert_eq!(j.wait().unwrap_err().code(), ErrorCode::NotFound);
}

#[test]
fn many_threads_racing_on_ready_and_set_each_run_once() {
    for _ in 0..200 {
        let e = Event::new();
        let count = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (e, count) = (e.clone(), count.clone());
                std::thread::spawn(move || {
                    e.on_ready(move |_| {
                        count.fetch_add(1, Ordering::SeqCst);
                    })
                })
            })
            .collect();
        e.set(Ok(())).unwrap();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(count.load(Ordering::SeqCst), 4);
    }
}
