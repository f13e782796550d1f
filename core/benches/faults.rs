//! How fast a session notices a broken link and resumes after it, on
//! loopback through the test suite's fault proxy, beside the baseline of
//! the same run: a raw TCP connect to the worker's port (what a reconnect
//! costs at least).
//!
//! For each fault, the time from the fault (a reset of every connection; a
//! partition, and its heal) to the client's host events: `disconnected`
//! (the link found broken) and `reconnected` (the session resumed). The
//! worker asks for a heartbeat every 0.25 s and keeps a silent session 5 s:
//! a partition is found by a heartbeat that goes unanswered for twice the
//! interval (at least 0.5 s), sent every interval while work is in flight
//! (a call held on the worker here) and every third of the session timeout
//! when the session is idle.

use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{
    Client, ClientOptions, ClusterOptions, CompileOptions, Event, ExecuteOptions, HostEventKind,
    Program,
};
use colocated_faultproxy::FaultProxy;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Faults of each kind measured.
const RUNS: usize = 7;
/// The longest wait for an event before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(20);

/// Minimum, median and maximum of `xs`, in milliseconds.
fn spread(mut xs: Vec<f64>) -> String {
    xs.sort_by(f64::total_cmp);
    format!(
        "{:8.2} ms (min {:.2}, max {:.2})",
        xs[xs.len() / 2] * 1e3,
        xs[0] * 1e3,
        xs[xs.len() - 1] * 1e3
    )
}

/// Waits for the next event of `kind` on `events`: when it came.
fn next(events: &mpsc::Receiver<(HostEventKind, Instant)>, kind: HostEventKind) -> Instant {
    loop {
        let (got, at) = events
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("no {kind:?} event within {PATIENCE:?}"));
        if got == kind {
            return at;
        }
    }
}

fn main() {
    let token = Token::generate().expect("a token");
    let mut options = WorkerOptions::new(Some(token.clone()));
    options.heartbeat_interval = Duration::from_millis(250);
    options.session_timeout = Duration::from_secs(5);
    let served = Client::new_local(ClientOptions::default()).expect("the worker's client");
    let gate = std::sync::Arc::new(std::sync::Mutex::new(Event::new()));
    let held = gate.clone();
    served
        .register_native_function("hold", move |_| {
            let gate = held.lock().unwrap_or_else(|e| e.into_inner()).clone();
            gate.wait()
        })
        .expect("register hold");
    let worker = Worker::start(served, options).expect("a worker");
    let proxy = FaultProxy::start(worker.local_addr()).expect("a proxy");
    let mut connect = ConnectOptions::new(proxy.addr().to_string(), Some(token));
    connect.timeout = Duration::from_secs(5);
    let client = Client::connect(&ClusterOptions {
        workers: vec![connect],
        include_local: false,
        local: ClientOptions::default(),
    })
    .expect("a controller");
    let (tx, events) = mpsc::channel();
    client
        .on_host_event(move |event| {
            let _ = tx.send((event.kind, Instant::now()));
        })
        .expect("a listener");

    let (mut tcp, mut found_reset, mut resumed_reset) = (Vec::new(), Vec::new(), Vec::new());
    let (mut found_partition, mut resumed_heal) = (Vec::new(), Vec::new());
    let mut found_busy = Vec::new();
    let hold = client
        .compile(
            Program::native("hold", vec![], vec![], vec![client.devices()[0].clone()]),
            CompileOptions::default(),
        )
        .expect("compile hold");
    for _ in 0..RUNS {
        let start = Instant::now();
        drop(TcpStream::connect(worker.local_addr()).expect("a raw connection"));
        tcp.push(start.elapsed().as_secs_f64());

        let reset = Instant::now();
        proxy.reset();
        found_reset.push((next(&events, HostEventKind::Disconnected) - reset).as_secs_f64());
        resumed_reset.push((next(&events, HostEventKind::Reconnected) - reset).as_secs_f64());

        let partitioned = Instant::now();
        proxy.partition(true);
        let found = next(&events, HostEventKind::Disconnected);
        found_partition.push((found - partitioned).as_secs_f64());
        let healed = Instant::now();
        proxy.partition(false);
        resumed_heal.push((next(&events, HostEventKind::Reconnected) - healed).as_secs_f64());

        // The same with a call in flight (held on the worker).
        let release = Event::new();
        *gate.lock().unwrap_or_else(|e| e.into_inner()) = release.clone();
        let run = hold
            .execute(&[], &ExecuteOptions::default())
            .expect("run hold");
        std::thread::sleep(Duration::from_millis(300));
        let partitioned = Instant::now();
        proxy.partition(true);
        found_busy.push((next(&events, HostEventKind::Disconnected) - partitioned).as_secs_f64());
        proxy.partition(false);
        next(&events, HostEventKind::Reconnected);
        release.set(Ok(())).expect("release hold");
        run.status.wait_timeout(PATIENCE).expect("hold ran");
    }
    let stats = client.host_stats(0).expect("the host's counters");
    assert_eq!(stats.sessions_lost, 0, "a session was lost: {stats:?}");
    println!("faults on loopback (heartbeat 0.25 s, session timeout 5 s), {RUNS} of each:");
    println!("  raw TCP connect (baseline)       {}", spread(tcp));
    println!("  reset: link found broken         {}", spread(found_reset));
    println!(
        "  reset: session resumed           {}",
        spread(resumed_reset)
    );
    println!(
        "  partition, idle: found broken    {}",
        spread(found_partition)
    );
    println!("  partition, busy: found broken    {}", spread(found_busy));
    println!(
        "  heal: session resumed            {}",
        spread(resumed_heal)
    );
}
