//! Unit tests of the dispatcher.

use super::*;
use crate::error::Error;

fn task(completion: &Event, f: impl FnOnce() + Send + 'static) -> Task {
    let done = completion.clone();
    Task {
        deps: vec![],
        completion: completion.clone(),
        run: Box::new(move |status: Result<()>| {
            f();
            done.set_if_pending(status);
        }),
        waiter_first: false,
        hands_off: false,
    }
}

#[test]
fn claimed_tasks_run_on_the_claiming_thread_later_and_the_stream_keeps_order() {
    let d = Dispatcher::new(1, 1, 9013, "t").unwrap();
    let (s, busy) = (Stream::new(9013), Stream::new(9013));
    let here = std::thread::current().id();
    let ran_on = Arc::new(Mutex::new(Vec::new()));
    let record = |ev: &Event, i: u32| {
        let ran_on = ran_on.clone();
        task(ev, move || {
            ran_on
                .lock()
                .unwrap()
                .push((i, std::thread::current().id()))
        })
    };
    // A stream with a task waiting on a gate is not idle: nothing there
    // is claimed.
    let gate = Event::new();
    let blocked = Event::new();
    let mut waits = record(&blocked, 9);
    waits.deps = vec![gate.clone()];
    d.submit(&busy, waits);
    let (first, second, behind_gate) = (Event::new(), Event::new(), Event::new());
    let ((), claims) = claim_idle_tasks(|| {
        d.submit(&s, record(&first, 0));
        // Queued behind the claimed one, on the same stream.
        d.submit(&s, record(&second, 1));
        d.submit(&busy, record(&behind_gate, 2));
    });
    assert_eq!(claims.len(), 1, "one idle stream claimed");
    assert!(!first.is_ready() && !second.is_ready(), "nothing ran yet");
    for claim in claims {
        claim.run();
    }
    second.wait().unwrap();
    let ran = ran_on.lock().unwrap().clone();
    assert_eq!(ran[0], (0, here), "the claimed task ran here, first");
    assert_eq!(ran[1].0, 1, "then the one behind it");
    assert!(!behind_gate.is_ready());
    gate.set_if_pending(Ok(()));
    behind_gate.wait().unwrap();
    assert!(!claiming(), "claiming ends with `claim_idle_tasks`");
}

#[test]
fn a_send_runs_on_the_submitting_thread_when_its_stream_is_idle_and_keeps_order() {
    let d = Dispatcher::new(1, 1, 9011, "t").unwrap();
    let s = Stream::new(9011);
    let here = std::thread::current().id();
    let ran_on = Arc::new(Mutex::new(Vec::new()));
    let send = |ev: &Event, ran_on: &Arc<Mutex<Vec<(u32, std::thread::ThreadId)>>>, i| {
        let ran_on = ran_on.clone();
        let mut t = task(ev, move || {
            ran_on
                .lock()
                .unwrap()
                .push((i, std::thread::current().id()))
        });
        t.hands_off = true;
        t
    };
    // Idle stream: the send ran before `submit` returned, on this thread.
    let first = Event::new();
    d.submit(&s, send(&first, &ran_on, 0));
    assert!(first.is_ready());
    assert_eq!(*ran_on.lock().unwrap(), vec![(0, here)]);
    // Behind a task that has not run: queued after it, not run at once.
    let gate = Event::new();
    let (blocked, second) = (Event::new(), Event::new());
    let mut waits = task(&blocked, || {});
    waits.deps = vec![gate.clone()];
    d.submit(&s, waits);
    d.submit(&s, send(&second, &ran_on, 1));
    assert!(!second.is_ready());
    gate.set(Ok(())).unwrap();
    second.wait().unwrap();
    assert!(blocked.is_ready(), "in order");
    let order: Vec<u32> = ran_on.lock().unwrap().iter().map(|r| r.0).collect();
    assert_eq!(order, [0, 1]);
    // A send waiting for a dependency is queued too.
    let (dep, third) = (Event::new(), Event::new());
    let mut t = send(&third, &ran_on, 2);
    t.deps = vec![dep.clone()];
    d.submit(&s, t);
    assert!(!third.is_ready());
    dep.set(Ok(())).unwrap();
    third.wait().unwrap();
}

#[test]
fn work_submitted_in_a_slot_before_its_place_is_reached_runs_there() {
    let d = Dispatcher::new(2, 2, 9014, "t").unwrap();
    let s = Stream::new(9014);
    let log = Arc::new(Mutex::new(Vec::new()));
    let record = |ev: &Event, i: u32| {
        let log = log.clone();
        task(ev, move || log.lock().unwrap().push(i))
    };
    let (gate, first, held, after) = (Event::new(), Event::new(), Event::new(), Event::new());
    let mut waits = record(&first, 1);
    waits.deps.push(gate.clone());
    d.submit(&s, waits);
    let slot = d.reserve(&s);
    d.submit(&s, record(&after, 3));
    // Submitted on the slot's stream while the place is not reached.
    slot.run_in(|| d.submit(&thread_stream(9014), record(&held, 2)));
    slot.release_after(&held);
    std::thread::sleep(Duration::from_millis(20));
    assert!(log.lock().unwrap().is_empty());
    gate.set(Ok(())).unwrap();
    after.wait().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![1, 2, 3]);
}

#[test]
fn tasks_of_one_stream_run_in_submission_order() {
    let d = Dispatcher::new(2, 2, 9001, "t").unwrap();
    let s = Stream::new(9001);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut last = Event::new();
    for i in 0..1000 {
        let ev = Event::new();
        let log = log.clone();
        d.submit(&s, task(&ev, move || log.lock().unwrap().push(i)));
        last = ev;
    }
    last.wait().unwrap();
    assert_eq!(*log.lock().unwrap(), (0..1000).collect::<Vec<_>>());
}

#[test]
fn a_blocked_task_waits_for_its_dependency_and_keeps_order() {
    let d = Dispatcher::new(2, 2, 9002, "t").unwrap();
    let s = Stream::new(9002);
    let gate = Event::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let first = Event::new();
    let l = log.clone();
    let mut t = task(&first, move || l.lock().unwrap().push(1));
    t.deps.push(gate.clone());
    d.submit(&s, t);
    let second = Event::new();
    let l = log.clone();
    d.submit(&s, task(&second, move || l.lock().unwrap().push(2)));
    std::thread::sleep(Duration::from_millis(20));
    assert!(log.lock().unwrap().is_empty());
    gate.set(Ok(())).unwrap();
    second.wait().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![1, 2]);
}

#[test]
fn a_failed_dependency_reaches_the_task_status() {
    let d = Dispatcher::new(1, 1, 9003, "t").unwrap();
    let s = Stream::new(9003);
    let ev = Event::new();
    let mut t = task(&ev, || {});
    t.deps.push(Event::ready(Err(Error::not_found("upstream"))));
    d.submit(&s, t);
    assert_eq!(ev.wait().unwrap_err().message(), "upstream");
}

#[test]
fn a_task_may_wait_for_work_its_stream_dispatched_before_it() {
    // A hand-off (a send, a device's queue) leaves its stream with its
    // completion pending; work queued after it on the stream may wait
    // for that completion (it is not queued behind the waiter).
    let d = Dispatcher::new(1, 1, 9041, "t").unwrap();
    let s = Stream::new(9041);
    let sent = Event::new();
    let later = sent.clone();
    let send = Task {
        deps: vec![],
        completion: sent.clone(),
        run: Box::new(move |_: Result<()>| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                later.set_if_pending(Ok(()));
            });
        }),
        waiter_first: false,
        hands_off: true,
    };
    d.submit(&s, send);
    let waited = Event::new();
    let outcome = Arc::new(Mutex::new(None));
    let seen = outcome.clone();
    d.submit(
        &s,
        task(&waited, move || {
            *seen.lock().unwrap() = Some(sent.wait());
        }),
    );
    waited.wait().unwrap();
    let outcome = outcome.lock().unwrap().take();
    assert!(matches!(outcome, Some(Ok(()))), "{outcome:?}");
}

/// Streams whose tasks block until every one of them runs (a barrier)
/// all run at once, though they outnumber the pool's threads.
#[test]
fn blocking_streams_do_not_starve_each_other_beyond_the_pool_size() {
    let d = Dispatcher::new(2, 64, 9005, "t").unwrap();
    let parties = 12;
    let barrier = Arc::new(std::sync::Barrier::new(parties));
    let events: Vec<Event> = (0..parties)
        .map(|_| {
            let ev = Event::new();
            let barrier = barrier.clone();
            d.submit(
                &Stream::new(9005),
                task(&ev, move || {
                    barrier.wait();
                }),
            );
            ev
        })
        .collect();
    for ev in &events {
        ev.wait_timeout(Duration::from_secs(20)).unwrap();
    }
    assert!(d.live_threads() >= parties);
}

#[test]
fn the_pool_never_grows_beyond_its_maximum() {
    let d = Dispatcher::new(1, 3, 9006, "t").unwrap();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let running = Arc::new(AtomicUsize::new(0));
    let events: Vec<Event> = (0..6)
        .map(|_| {
            let ev = Event::new();
            let (gate, running) = (gate.clone(), running.clone());
            d.submit(
                &Stream::new(9006),
                task(&ev, move || {
                    running.fetch_add(1, Ordering::SeqCst);
                    let (open, cv) = &*gate;
                    let mut open = open.lock().unwrap();
                    while !*open {
                        open = cv.wait(open).unwrap();
                    }
                }),
            );
            ev
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while running.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(running.load(Ordering::SeqCst), 3);
    assert_eq!(d.live_threads(), 3);
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    for ev in &events {
        ev.wait_timeout(Duration::from_secs(10)).unwrap();
    }
    assert_eq!(running.load(Ordering::SeqCst), 6);
}

#[test]
fn threads_beyond_the_minimum_exit_when_idle() {
    let d = Dispatcher::with_keep_alive(1, 8, 9007, "t", Duration::from_millis(50)).unwrap();
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let events: Vec<Event> = (0..4)
        .map(|_| {
            let ev = Event::new();
            let barrier = barrier.clone();
            d.submit(
                &Stream::new(9007),
                task(&ev, move || {
                    barrier.wait();
                }),
            );
            ev
        })
        .collect();
    for ev in &events {
        ev.wait_timeout(Duration::from_secs(10)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.live_threads() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(d.live_threads(), 1);
    // The pool grows again after shrinking.
    let ev = Event::new();
    d.submit(&Stream::new(9007), task(&ev, || {}));
    ev.wait_timeout(Duration::from_secs(10)).unwrap();
}

#[test]
fn stream_scopes_give_a_thread_independent_default_streams() {
    let outer = thread_stream(9008);
    assert_eq!(thread_stream(9008).id(), outer.id());
    let previous = set_stream_scope(77);
    assert_eq!(previous, 0);
    let scoped = thread_stream(9008);
    assert_ne!(scoped.id(), outer.id());
    assert_eq!(thread_stream(9008).id(), scoped.id());
    set_stream_scope(78);
    assert_ne!(thread_stream(9008).id(), scoped.id());
    set_stream_scope(77);
    assert_eq!(thread_stream(9008).id(), scoped.id());
    forget_stream_scope(77);
    assert_ne!(thread_stream(9008).id(), scoped.id());
    set_stream_scope(0);
    assert_eq!(thread_stream(9008).id(), outer.id());
}

#[test]
fn a_panicking_task_fails_its_completion_with_internal() {
    let d = Dispatcher::new(1, 1, 9004, "t").unwrap();
    let s = Stream::new(9004);
    let ev = Event::new();
    d.submit(&s, task(&ev, || panic!("boom")));
    assert_eq!(
        ev.wait().unwrap_err().code(),
        crate::error::ErrorCode::Internal
    );
}
