//! Code that runs inside the runtime and calls back into it: nested executions,
//! waits from inside a task, callbacks that use what completed them.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use colocated_core::*;
use common::*;

/// Runs `f` on a thread and fails (instead of hanging) if it does not finish.
fn within_patience(what: &str, f: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    finished
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("{what}: hung"));
}

#[test]
fn a_native_function_can_run_and_await_a_nested_execution_on_its_default_stream() {
    within_patience("nested execution", || {
        let client = client(1);
        let device = client.devices()[0].clone();
        let inner_ran = Arc::new(AtomicUsize::new(0));
        let counter = inner_ran.clone();
        client
            .register_native_function("inner", move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        let inner: Arc<OnceLock<LoadedExecutable>> = Arc::default();
        let nested = inner.clone();
        client
            .register_native_function("outer", move |_| {
                let exe = nested.get().expect("inner compiled");
                exe.execute(&[], &ExecuteOptions::default())?.status.wait()
            })
            .unwrap();
        inner
            .set(compile_nullary(&client, "inner", &device))
            .unwrap();
        let outer = compile_nullary(&client, "outer", &device);
        // Awaited at once, the outer call runs inline on this thread; its nested
        // call must not queue behind it on this thread's stream.
        for _ in 0..50 {
            outer
                .execute(&[], &ExecuteOptions::default())
                .unwrap()
                .status
                .wait()
                .unwrap();
        }
        assert_eq!(inner_ran.load(Ordering::SeqCst), 50);
    });
}

#[test]
fn code_that_runs_for_a_program_on_another_thread_calls_on_the_programs_nested_stream() {
    // As a language whose host code runs on another thread while the
    // program's thread waits for its answer (Node's event loop): its nested
    // call runs on the stream core gives it, never behind the program.
    within_patience("nested call from another thread", || {
        let client = client_with_threads(1, 1);
        let device = client.devices()[0].clone();
        let inner_ran = Arc::new(AtomicUsize::new(0));
        let counter = inner_ran.clone();
        client
            .register_native_function("inner", move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        let inner: Arc<OnceLock<LoadedExecutable>> = Arc::default();
        let stream = client.create_stream();
        let (nested, outer_stream) = (inner.clone(), stream.clone());
        client
            .register_native_function("outer", move |ctx| {
                let on = ctx.nested_stream();
                assert_ne!(on.id(), outer_stream.id(), "not the program's own stream");
                let exe = nested.get().expect("inner compiled").clone();
                std::thread::spawn(move || {
                    let options = ExecuteOptions { stream: Some(on) };
                    exe.execute(&[], &options)?.status.wait()
                })
                .join()
                .map_err(|_| Error::internal("the host code's thread panicked"))?
            })
            .unwrap();
        inner
            .set(compile_nullary(&client, "inner", &device))
            .unwrap();
        let outer = compile_nullary(&client, "outer", &device);
        for _ in 0..20 {
            let options = ExecuteOptions {
                stream: Some(stream.clone()),
            };
            outer.execute(&[], &options).unwrap().status.wait().unwrap();
        }
        assert_eq!(inner_ran.load(Ordering::SeqCst), 20);
    });
}

#[test]
fn waiting_inside_a_task_for_later_work_of_its_own_stream_is_a_failed_precondition() {
    within_patience("self wait", || {
        let client = client(1);
        let device = client.devices()[0].clone();
        let stream = client.create_stream();
        client.register_native_function("noop", |_| Ok(())).unwrap();
        let noop: Arc<OnceLock<LoadedExecutable>> = Arc::default();
        let (nested, on) = (noop.clone(), stream.clone());
        client
            .register_native_function("waits_on_itself", move |_| {
                let exe = nested.get().expect("noop compiled");
                let later = exe.execute(
                    &[],
                    &ExecuteOptions {
                        stream: Some(on.clone()),
                    },
                )?;
                later.status.wait()
            })
            .unwrap();
        noop.set(compile_nullary(&client, "noop", &device)).unwrap();
        let exe = compile_nullary(&client, "waits_on_itself", &device);
        let run = exe
            .execute(
                &[],
                &ExecuteOptions {
                    stream: Some(stream),
                },
            )
            .unwrap();
        assert_error(
            run.status.wait(),
            ErrorCode::FailedPrecondition,
            "would never end",
        );
    });
}

#[test]
fn a_panicking_on_ready_callback_does_not_strand_the_others() {
    let event = Event::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let before = ran.clone();
    event.on_ready(move |_| {
        before.fetch_add(1, Ordering::SeqCst);
    });
    event.on_ready(|_| panic!("a buggy callback"));
    let after = ran.clone();
    event.on_ready(move |_| {
        after.fetch_add(1, Ordering::SeqCst);
    });
    event.set(Ok(())).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert!(event.wait().is_ok());
}

struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn polling_an_event_again_replaces_the_waker_instead_of_adding_one() {
    let event = Event::new();
    let (first, last) = (
        Arc::new(CountingWaker(AtomicUsize::new(0))),
        Arc::new(CountingWaker(AtomicUsize::new(0))),
    );
    let mut pinned = std::pin::pin!(event.clone());
    for _ in 0..1000 {
        let waker = Waker::from(first.clone());
        assert!(pinned
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    let waker = Waker::from(last.clone());
    assert!(pinned
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    event.set(Ok(())).unwrap();
    assert_eq!(
        first.0.load(Ordering::SeqCst),
        0,
        "stale wakers are not woken"
    );
    assert_eq!(last.0.load(Ordering::SeqCst), 1);
    assert!(matches!(
        pinned.as_mut().poll(&mut Context::from_waker(&waker)),
        Poll::Ready(Ok(()))
    ));
}

#[test]
fn a_done_with_host_buffer_callback_may_use_the_buffer_that_released_it() {
    within_patience("release callback", || {
        let client = client(1);
        let device = client.devices()[0].clone();
        let data: &'static [u8] = Box::leak(vec![1u8; 64].into_boxed_slice());
        // SAFETY: `data` is leaked, so valid for the whole test.
        let (buffer, done) = unsafe {
            Buffer::from_host_raw(
                &client,
                data.as_ptr(),
                data.len(),
                DType::U8,
                &[64],
                &device,
                None,
                HostBufferSemantics::ImmutableZeroCopy,
            )
        }
        .unwrap();
        let again = buffer.clone();
        let called = Arc::new(AtomicUsize::new(0));
        let seen = called.clone();
        done.on_ready(move |_| {
            // Runs when the data is released by `delete` below, and uses the buffer.
            again.delete();
            assert!(again.check_live().is_err());
            seen.fetch_add(1, Ordering::SeqCst);
        });
        buffer.delete();
        assert_eq!(called.load(Ordering::SeqCst), 1);
        std::thread::sleep(Duration::from_millis(1));
    });
}

/// The threads a [`RecordsThread`] program ran on, in order.
type ThreadLog = Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>;

/// A language whose programs record the thread they run on in `ran`: one
/// that runs best on its waiter (`waiter_first`, as Python's, which needs
/// the GIL), or one that hands its work to a device's queue (`enqueues`, as
/// an XLA program), recording the thread that dispatched it.
#[derive(Clone)]
struct RecordsThread {
    ran: ThreadLog,
    waiter_first: bool,
    enqueues: bool,
}

impl LanguageExecutor for RecordsThread {
    fn load(&self, _: &Program) -> Result<Arc<dyn LoadedProgram>> {
        Ok(Arc::new(self.clone()))
    }
}

impl LoadedProgram for RecordsThread {
    fn run(&self, _: &mut ExecutionContext<'_>) -> Result<()> {
        self.ran.lock().unwrap().push(std::thread::current().id());
        Ok(())
    }

    fn waiter_first(&self) -> bool {
        self.waiter_first
    }

    fn enqueues(&self) -> bool {
        self.enqueues
    }
}

/// Registers `language` as a [`RecordsThread`] language (`waiter_first` or
/// `enqueues`) and compiles its program `name` on the first device: the
/// executable and the log of the threads it runs on.
fn thread_recording_executable(
    client: &Client,
    language: &str,
    name: &str,
    waiter_first: bool,
    enqueues: bool,
) -> (LoadedExecutable, ThreadLog) {
    let ran = ThreadLog::default();
    let executor = RecordsThread {
        ran: ran.clone(),
        waiter_first,
        enqueues,
    };
    client.register_executor(language, executor).unwrap();
    let program = Program {
        name: name.into(),
        language: language.into(),
        payload: vec![],
        input_specs: vec![],
        output_specs: vec![],
        devices: vec![client.devices()[0].clone()],
        output_structure: vec![],
    };
    (
        client.compile(program, CompileOptions::default()).unwrap(),
        ran,
    )
}

/// A waiter-first program (`record`) on the first device: the executable
/// and the log of the threads it runs on.
fn waiter_first_executable(client: &Client) -> (LoadedExecutable, ThreadLog) {
    thread_recording_executable(client, "waiter-first", "record", true, false)
}

#[test]
fn a_waiter_first_call_that_is_awaited_runs_on_the_waiting_thread() {
    let client = client(1);
    let (exe, ran) = waiter_first_executable(&client);
    for _ in 0..20 {
        exe.execute(&[], &ExecuteOptions::default())
            .unwrap()
            .status
            .wait()
            .unwrap();
    }
    let me = std::thread::current().id();
    assert!(
        ran.lock().unwrap().iter().all(|t| *t == me),
        "every awaited call ran on the caller"
    );
}

#[test]
fn a_waiter_first_call_nobody_waits_on_still_runs_on_an_executor() {
    let client = client(1);
    let (exe, ran) = waiter_first_executable(&client);
    let status = exe.execute(&[], &ExecuteOptions::default()).unwrap().status;
    let done = Arc::new(AtomicUsize::new(0));
    let seen = done.clone();
    status.on_ready(move |r| {
        assert!(r.is_ok());
        seen.fetch_add(1, Ordering::SeqCst);
    });
    eventually("the deferred call runs", || {
        done.load(Ordering::SeqCst) == 1
    });
    assert_ne!(ran.lock().unwrap()[0], std::thread::current().id());
}

#[test]
fn a_thread_that_pipelines_waiter_first_calls_runs_its_backlog_itself() {
    // Caller runs: nobody waits on these calls, but the submitting thread keeps
    // feeding the stream, so it runs the backlog itself (no hand-off to another
    // thread, a bounded queue) and program order holds.
    //
    // An executor that looks at the stream holds it for a moment before it
    // leaves it to the feeding thread; descheduled in that moment (a busy
    // machine), it keeps the caller from the backlog for a whole time slice.
    // So a round may fall short; three in a row would not.
    let me = std::thread::current().id();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        // A client per round: a language's executor registers once per client.
        let client = client(1);
        let (exe, ran) = waiter_first_executable(&client);
        let mut last = None;
        for _ in 0..2000 {
            last = Some(exe.execute(&[], &ExecuteOptions::default()).unwrap().status);
        }
        let pending = 2000 - ran.lock().unwrap().len();
        last.unwrap().wait().unwrap();
        let ran = ran.lock().unwrap();
        assert_eq!(ran.len(), 2000, "every call ran once, the last one last");
        let on_caller = ran.iter().filter(|t| **t == me).count();
        if pending <= 128 && on_caller >= 1000 {
            return;
        }
        rounds.push((pending, on_caller));
    }
    panic!(
        "the backlog is bounded and the submitting thread runs most calls; \
         (calls still queued after 2000, calls run by the submitting thread) \
         in three rounds: {rounds:?}"
    );
}

#[test]
fn an_enqueuing_program_is_dispatched_by_its_caller_but_never_on_an_event_loop() {
    let client = client(1);
    let (exe, ran) = thread_recording_executable(&client, "enqueues", "enqueue", false, true);
    let me = std::thread::current().id();
    // Dispatched during the call, before anyone waits.
    let run = exe.execute(&[], &ExecuteOptions::default()).unwrap();
    assert_eq!(*ran.lock().unwrap(), vec![me]);
    run.status.wait().unwrap();
    // From an event loop's call, an executor dispatches it (an event loop
    // never waits: it learns of completion by a callback).
    let run = as_event_loop(|| exe.execute(&[], &ExecuteOptions::default())).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let seen = done.clone();
    run.status.on_ready(move |r| {
        assert!(r.is_ok());
        seen.fetch_add(1, Ordering::SeqCst);
    });
    eventually("the event loop's call runs", || {
        done.load(Ordering::SeqCst) == 1
    });
    let ran = ran.lock().unwrap();
    assert_eq!(ran.len(), 2);
    assert_ne!(ran[1], me, "an event loop's call must not run the program");
}
