//! A controller and a worker (in this process) talking through the test
//! suite's fault-injecting proxy on loopback: what a slow link, a partition
//! and a reset do to calls, loads and transfers. Timings are asserted only
//! as the bounds docs/failures.md states.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{
    Array, Buffer, Client, ClientOptions, ClusterOptions, DType, ErrorCode, Event, ExecuteOptions,
    HostEventKind, LoadedExecutable,
};
use colocated_faultproxy::{Direction, FaultProxy};
use common::{
    client_with_threads, compile_native, compile_nullary, i32_array, i32_bytes, i32_values,
    register_add_one, register_gate, spec_on, PATIENCE,
};

/// Within this of losing its link, a call in flight on a worker fails: the
/// bound docs/failures.md states for a worker killed in the middle of a
/// long call, and for a hung one at a 0.25 s heartbeat interval (lost after
/// its first unanswered heartbeat, 0.75 s).
const LOST_WITHIN: Duration = Duration::from_secs(2);

/// A worker of one device with `add_one_i32`, `counted` (`add_one_i32`
/// that counts its runs in `counted`), `ask` (which calls the controller's
/// host callback 0 with "ping" and wants "pong") and `gate` (which returns
/// once `gate` is set), the token it takes, and a proxy in front of it.
struct Linked {
    worker: Worker,
    token: Token,
    gate: Event,
    counted: Arc<AtomicUsize>,
    proxy: FaultProxy,
}

impl Linked {
    /// A worker with the default options as `options` changes them.
    fn start(options: impl FnOnce(&mut WorkerOptions)) -> Linked {
        let client = client_with_threads(1, 2);
        register_add_one(&client);
        let counted = Arc::new(AtomicUsize::new(0));
        common::register_counted(&client, &counted);
        common::register_ask(&client);
        let gate = Event::new();
        register_gate(&client, "gate", &gate);
        let token = Token::generate().unwrap();
        let worker = common::start_worker(client, &token, options);
        let proxy = FaultProxy::start(worker.local_addr()).unwrap();
        Linked {
            worker,
            token,
            gate,
            counted,
            proxy,
        }
    }

    /// A controller of the worker alone, connected through the proxy.
    fn controller(&self) -> Client {
        self.controller_on(true)
    }

    /// [`controller`](Self::controller), whose control stream travels on a
    /// lane, or on gRPC (`lane` false, as with a worker that serves TLS).
    fn controller_on(&self, lane: bool) -> Client {
        let mut worker =
            ConnectOptions::new(self.proxy.addr().to_string(), Some(self.token.clone()));
        worker.timeout = Duration::from_secs(5);
        worker.lane = lane;
        Client::connect(&ClusterOptions {
            workers: vec![worker],
            include_local: false,
            local: ClientOptions::default(),
        })
        .expect("a controller of the worker through the proxy")
    }
}

/// `gate` on the controller's one device, running (and held) on the worker.
fn run_gate(client: &Client) -> (LoadedExecutable, Event) {
    let exe = compile_nullary(client, "gate", &client.devices()[0]);
    let status = exe.execute(&[], &ExecuteOptions::default()).unwrap().status;
    std::thread::sleep(Duration::from_millis(100));
    assert!(!status.is_ready(), "the gate returned before it was opened");
    (exe, status)
}

#[test]
fn calls_through_a_link_with_20_ms_each_way_complete_with_right_results() {
    let linked = Linked::start(|_| {});
    linked
        .proxy
        .set_latency(Direction::Both, Duration::from_millis(20));
    let client = linked.controller();
    let device = client.devices()[0].clone();
    let spec = spec_on(&[4], DType::I32, &device);
    let add_one = compile_native(
        &client,
        "add_one_i32",
        vec![spec.clone()],
        vec![spec.clone()],
        std::slice::from_ref(&device),
    );
    let began = Instant::now();
    let mut x = i32_array(&client, &[1, 2, 3, 4], &spec);
    for _ in 0..5 {
        let run = add_one
            .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
            .unwrap();
        x = run.outputs.into_iter().next().unwrap();
    }
    assert_eq!(i32_values(&x.to_host_bytes().unwrap()), vec![6, 7, 8, 9]);
    // At least one round trip went through the delay.
    assert!(
        began.elapsed() >= Duration::from_millis(40),
        "{:?}",
        began.elapsed()
    );
    // A buffer of several transfer chunks goes there and back whole.
    let values: Vec<i32> = (0..(3 << 20)).collect();
    let bytes = i32_bytes(&values);
    let big = Buffer::from_bytes(&client, &bytes, DType::I32, &[3 << 20], &device).unwrap();
    assert!(
        big.to_host_vec().unwrap() == bytes,
        "the buffer came back changed"
    );
    let stats = linked.proxy.stats();
    assert!(stats.bytes_up > bytes.len() as u64, "{stats:?}");
    assert!(stats.bytes_down > bytes.len() as u64, "{stats:?}");
}

#[test]
fn a_partition_longer_than_the_session_timeout_fails_the_call_in_flight_within_the_heartbeat_bound()
{
    let session_timeout = Duration::from_secs(1);
    let linked = Linked::start(|o| {
        o.heartbeat_interval = Duration::from_millis(250);
        o.session_timeout = session_timeout;
    });
    let client = linked.controller();
    let device = client.devices()[0].clone();
    let kept = i32_array(&client, &[7], &spec_on(&[1], DType::I32, &device));
    kept.ready_event().wait_timeout(PATIENCE).unwrap();
    assert_eq!(linked.worker.buffer_count(), 1);
    let before = counted(&client);
    let (_gate, status) = run_gate(&client);
    linked.proxy.partition(true);
    let began = Instant::now();
    let err = status.wait_timeout(PATIENCE).unwrap_err();
    let lost_after = began.elapsed();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(lost_after < LOST_WITHIN, "lost after {lost_after:?}");
    assert!(client.host_lost(0).unwrap().is_ready());
    // The program finishes on the worker, which then ends the silent
    // session and frees what it held, within the session timeout + 2 s.
    linked.gate.set(Ok(())).unwrap();
    let deadline = began + session_timeout + Duration::from_secs(2);
    while linked.worker.session_count() > 0 || linked.worker.buffer_count() > 0 {
        assert!(
            Instant::now() < deadline,
            "the worker kept the session of a partitioned controller"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    linked.proxy.partition(false);
    // After the heal, the same client works with the worker again: new work
    // opens a new session, and what the lost one held says it is gone.
    let err = kept.to_host_bytes().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_new_work_runs(&client, &before);
}

/// New arrays and executables on `client`'s first device work, and so
/// does `before`, an executable compiled before: a new session replaced a
/// lost one, and `before` loads there again.
fn assert_new_work_runs(client: &Client, before: &LoadedExecutable) {
    let device = client.devices()[0].clone();
    let x = i32_array(client, &[1, 2, 3, 4], &spec_on(&[4], DType::I32, &device));
    let out = chained_calls(&counted(client), &x, 2);
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), vec![3, 4, 5, 6]);
    let out = chained_calls(before, &out, 2);
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), vec![5, 6, 7, 8]);
    assert!(!client.host_lost(0).unwrap().is_ready());
}

/// `counted` (`add_one_i32` that the worker counts) for int32[4] on the
/// client's first device.
fn counted(client: &Client) -> LoadedExecutable {
    let device = client.devices()[0].clone();
    let spec = spec_on(&[4], DType::I32, &device);
    compile_native(
        client,
        "counted",
        vec![spec.clone()],
        vec![spec.clone()],
        std::slice::from_ref(&device),
    )
}

/// `count` executions of `add_one` (see [`counted`]) chained from `x`, sent
/// without waiting: the last output.
fn chained_calls(add_one: &LoadedExecutable, x: &Array, count: usize) -> Array {
    let mut x = x.clone();
    for _ in 0..count {
        let run = add_one
            .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
            .unwrap();
        x = run.outputs.into_iter().next().unwrap();
    }
    x
}

#[test]
fn a_reset_mid_call_resumes_the_session_and_the_call_completes() {
    for lane in [true, false] {
        a_reset_mid_call_resumes_the_session(lane);
    }
}

/// The kinds of host events `client` tells from now on, as they come.
fn heard_events(client: &Client) -> Arc<std::sync::Mutex<Vec<HostEventKind>>> {
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let into = heard.clone();
    client
        .on_host_event(move |event| {
            assert_eq!(event.host, 0);
            assert_eq!(
                event.error.is_some(),
                matches!(
                    event.kind,
                    HostEventKind::Disconnected | HostEventKind::Lost
                )
            );
            into.lock().unwrap().push(event.kind);
        })
        .unwrap();
    heard
}

/// Waits (boundedly) until `heard` holds `expected`.
fn expect_events(heard: &std::sync::Mutex<Vec<HostEventKind>>, expected: &[HostEventKind]) {
    let began = Instant::now();
    while heard.lock().unwrap().as_slice() != expected {
        assert!(
            began.elapsed() < PATIENCE,
            "heard {:?}, expected {expected:?}",
            heard.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A reset mid-call, with the control stream on a lane or on gRPC.
fn a_reset_mid_call_resumes_the_session(lane: bool) {
    let linked = Linked::start(|_| {});
    let client = linked.controller_on(lane);
    let heard = heard_events(&client);
    let device = client.devices()[0].clone();
    let kept = i32_array(&client, &[1, 2, 3, 4], &spec_on(&[4], DType::I32, &device));
    let (_gate, status) = run_gate(&client);
    linked.proxy.reset();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!status.is_ready(), "the call ended with its connection");
    linked.gate.set(Ok(())).unwrap();
    status.wait_timeout(PATIENCE).unwrap();
    assert!(!client.host_lost(0).unwrap().is_ready());
    // What the session held before is still there, and new calls run.
    assert_eq!(i32_values(&kept.to_host_bytes().unwrap()), vec![1, 2, 3, 4]);
    let out = chained_calls(&counted(&client), &kept, 3);
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), vec![4, 5, 6, 7]);
    // The listener heard the link break and come back, and so say the
    // counters.
    use HostEventKind::{Disconnected, Reconnected};
    expect_events(&heard, &[Disconnected, Reconnected]);
    let stats = client.host_stats(0).unwrap();
    assert_eq!((stats.disconnects, stats.reconnects), (1, 1), "{stats:?}");
    assert_eq!((stats.sessions_lost, stats.sessions_reopened), (0, 0));
}

#[test]
fn resets_among_pipelined_calls_run_every_call_once() {
    let linked = Linked::start(|_| {});
    let client = linked.controller();
    let device = client.devices()[0].clone();
    let x = i32_array(&client, &[0, 0, 0, 0], &spec_on(&[4], DType::I32, &device));
    x.ready_event().wait_timeout(PATIENCE).unwrap();
    let add_one = counted(&client);
    let (calls, resets) = (300, 3);
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            for _ in 0..resets {
                std::thread::sleep(Duration::from_millis(15));
                linked.proxy.reset();
            }
        });
        let mut out = x;
        for _ in 0..resets + 1 {
            out = chained_calls(&add_one, &out, calls / (resets + 1));
            out.ready_event().wait_timeout(PATIENCE).unwrap();
        }
        out
    });
    assert_eq!(
        i32_values(&out.to_host_bytes().unwrap()),
        vec![calls as i32; 4]
    );
    assert_eq!(
        linked.counted.load(Ordering::SeqCst),
        calls,
        "each call ran once"
    );
    assert!(!client.host_lost(0).unwrap().is_ready());
}

#[test]
fn a_partition_shorter_than_the_session_timeout_heals_and_the_call_completes() {
    let linked = Linked::start(|o| {
        o.heartbeat_interval = Duration::from_millis(250);
        o.session_timeout = Duration::from_secs(5);
    });
    let client = linked.controller();
    let device = client.devices()[0].clone();
    let kept = i32_array(&client, &[1, 2, 3, 4], &spec_on(&[4], DType::I32, &device));
    kept.ready_event().wait_timeout(PATIENCE).unwrap();
    let (_gate, status) = run_gate(&client);
    linked.proxy.partition(true);
    // Longer than the heartbeat bound, shorter than the session timeout.
    std::thread::sleep(Duration::from_millis(1500));
    linked.gate.set(Ok(())).unwrap();
    linked.proxy.partition(false);
    status.wait_timeout(PATIENCE).unwrap();
    assert!(!client.host_lost(0).unwrap().is_ready());
    assert_eq!(i32_values(&kept.to_host_bytes().unwrap()), vec![1, 2, 3, 4]);
    let out = chained_calls(&counted(&client), &kept, 2);
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), vec![3, 4, 5, 6]);
}

#[test]
fn connecting_through_a_link_that_refuses_connections_fails_with_unavailable() {
    let linked = Linked::start(|_| {});
    linked.proxy.refuse(true);
    let mut worker =
        ConnectOptions::new(linked.proxy.addr().to_string(), Some(linked.token.clone()));
    worker.timeout = Duration::from_secs(5);
    let err = Client::connect(&ClusterOptions {
        workers: vec![worker],
        include_local: false,
        local: ClientOptions::default(),
    })
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(linked.proxy.stats().refused >= 1);
    assert_eq!(linked.worker.session_count(), 0);
}

/// `mib` MiB of bytes that differ from their neighbours.
fn patterned(mib: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; mib << 20];
    for (i, chunk) in bytes.chunks_mut(4).enumerate() {
        chunk.copy_from_slice(&(i as u32).to_le_bytes());
    }
    bytes
}

/// A buffer of `bytes` (int32) on `client`'s first device, uploaded.
fn uploaded(client: &Client, bytes: &[u8]) -> Buffer {
    let device = client.devices()[0].clone();
    let dims = [(bytes.len() / 4) as i64];
    let buffer = Buffer::from_bytes(client, bytes, DType::I32, &dims, &device).unwrap();
    buffer.ready_event().wait_timeout(PATIENCE).unwrap();
    buffer
}

#[test]
fn a_reset_mid_upload_and_mid_download_starts_them_again_and_both_complete() {
    let linked = Linked::start(|_| {});
    let client = linked.controller();
    let bytes = patterned(32);
    // 32 MiB at 32 MiB/s: the reset comes once a quarter of a transfer has
    // gone, while it is in flight.
    linked.proxy.set_bandwidth(Direction::Both, Some(32 << 20));
    let reset_midway = |up: bool| {
        let sent = |stats: colocated_faultproxy::Stats| match up {
            true => stats.bytes_up,
            false => stats.bytes_down,
        };
        let before = sent(linked.proxy.stats());
        let began = Instant::now();
        while sent(linked.proxy.stats()) < before + (8 << 20) {
            assert!(began.elapsed() < PATIENCE, "the transfer never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        linked.proxy.reset();
    };
    let buffer = std::thread::scope(|scope| {
        scope.spawn(|| reset_midway(true));
        uploaded(&client, &bytes)
    });
    let up = linked.proxy.stats().bytes_up;
    assert!(
        up > bytes.len() as u64 + (1 << 20),
        "the upload did not start again: {up} bytes went up"
    );
    assert_eq!(linked.worker.buffer_count(), 1, "one buffer, stored once");
    let back = std::thread::scope(|scope| {
        scope.spawn(|| reset_midway(false));
        buffer.to_host_vec().unwrap()
    });
    assert!(back == bytes, "the buffer came back changed");
    let stats = linked.proxy.stats();
    assert!(stats.accepted >= 3, "{stats:?}");
    assert!(!client.host_lost(0).unwrap().is_ready());
}

#[test]
fn a_partition_shorter_than_the_session_timeout_loses_no_call_load_or_upload_in_flight() {
    let linked = Linked::start(|o| {
        o.heartbeat_interval = Duration::from_millis(250);
        o.session_timeout = Duration::from_secs(5);
    });
    let client = linked.controller();
    let device = client.devices()[0].clone();
    let x = i32_array(&client, &[0, 0, 0, 0], &spec_on(&[4], DType::I32, &device));
    let add_one = counted(&client);
    let bytes = patterned(256);
    let (out, buffer, loaded) = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            linked.proxy.partition(true);
            // Longer than the heartbeat bound, shorter than the session
            // timeout.
            std::thread::sleep(Duration::from_millis(1500));
            linked.proxy.partition(false);
        });
        // Loaded while the link is partitioned: it waits, then completes.
        let loading = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(600));
            let exe = counted(&client);
            let run = exe
                .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
                .unwrap();
            run.outputs.into_iter().next().unwrap()
        });
        let out = chained_calls(&add_one, &x, 10);
        let buffer = uploaded(&client, &bytes);
        (out, buffer, loading.join().unwrap())
    });
    assert_eq!(i32_values(&out.to_host_bytes().unwrap()), vec![10; 4]);
    assert_eq!(i32_values(&loaded.to_host_bytes().unwrap()), vec![1; 4]);
    assert!(buffer.to_host_vec().unwrap() == bytes, "the upload changed");
    assert_eq!(
        linked.counted.load(Ordering::SeqCst),
        11,
        "each call ran once"
    );
    assert!(!client.host_lost(0).unwrap().is_ready());
}

#[test]
fn a_host_callback_call_in_flight_survives_a_reset_and_runs_once() {
    let linked = Linked::start(|_| {});
    let client = linked.controller();
    let (calls, answer) = (Arc::new(AtomicUsize::new(0)), Event::new());
    let (counter, gate) = (calls.clone(), answer.clone());
    let callback = colocated_core::LoadedHostCallback::new("pong", move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        gate.wait()?;
        Ok(b"pong".to_vec())
    });
    let program = colocated_core::Program::native("ask", vec![], vec![], client.devices().to_vec());
    let options = colocated_core::CompileOptions {
        host_callbacks: vec![callback],
    };
    let exe = client.compile(program, options).unwrap();
    let run = exe.execute(&[], &ExecuteOptions::default()).unwrap();
    let began = Instant::now();
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(began.elapsed() < PATIENCE, "the callback was never called");
        std::thread::sleep(Duration::from_millis(2));
    }
    // The call is running here: the link breaks, the stream resumes, and
    // the worker sends the call again on the new connection.
    linked.proxy.reset();
    std::thread::sleep(Duration::from_millis(300));
    answer.set(Ok(())).unwrap();
    run.status.wait_timeout(PATIENCE).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the callback ran once");
    // The next run calls it again, once.
    let run = exe.execute(&[], &ExecuteOptions::default()).unwrap();
    run.status.wait_timeout(PATIENCE).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(!client.host_lost(0).unwrap().is_ready());
}

#[test]
fn a_worker_restarted_on_the_same_address_serves_the_same_client_again() {
    let token = Token::generate().unwrap();
    let start = |listen: Option<std::net::SocketAddr>| {
        let client = client_with_threads(1, 2);
        register_add_one(&client);
        client
            .register_native_function("counted", common::add_one_shards)
            .unwrap();
        let mut options = colocated_core::worker::WorkerOptions::new(Some(token.clone()));
        if let Some(listen) = listen {
            options.listen = listen;
        }
        Worker::start(client, options)
    };
    let first = start(None).unwrap();
    let address = first.local_addr();
    let proxy = FaultProxy::start(address).unwrap();
    let mut worker = ConnectOptions::new(proxy.addr().to_string(), Some(token.clone()));
    worker.timeout = Duration::from_secs(5);
    let client = Client::connect(&ClusterOptions {
        workers: vec![worker],
        include_local: false,
        local: ClientOptions::default(),
    })
    .unwrap();
    let heard = heard_events(&client);
    let device = client.devices()[0].clone();
    let kept = i32_array(&client, &[1, 2, 3, 4], &spec_on(&[4], DType::I32, &device));
    kept.ready_event().wait_timeout(PATIENCE).unwrap();
    let before = counted(&client);
    // The worker crashes: its connections break, and nothing answers.
    proxy.refuse(true);
    proxy.reset();
    drop(first);
    // A new worker process on the same address (once the port is free).
    let began = Instant::now();
    let _second = loop {
        match start(Some(address)) {
            Ok(worker) => break worker,
            Err(err) => {
                assert!(began.elapsed() < PATIENCE, "the port stayed taken: {err}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    proxy.refuse(false);
    // The controller's next attempt to resume reaches the new worker, which
    // does not know the session: lost at once, typed.
    let lost = client.host_lost(0).unwrap();
    let err = lost.wait_timeout(PATIENCE).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(
        err.message().contains("no longer has this session"),
        "{err}"
    );
    let err = kept.to_host_bytes().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_new_work_runs(&client, &before);
    // An array of the lost session, given to the executable loaded again,
    // fails with the loss (it said `internal`: "not on worker").
    let err = match before.execute(std::slice::from_ref(&kept), &ExecuteOptions::default()) {
        Err(err) => err,
        Ok(run) => run.status.wait_timeout(PATIENCE).unwrap_err(),
    };
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    use HostEventKind::{Disconnected, Lost, Reopened};
    expect_events(&heard, &[Disconnected, Lost, Reopened]);
    let stats = client.host_stats(0).unwrap();
    assert_eq!(
        (
            stats.disconnects,
            stats.sessions_lost,
            stats.sessions_reopened
        ),
        (1, 1, 1)
    );
}

/// A worker whose process is gone (nothing listens at its address any
/// more) is lost at once, whether the control stream travels on a lane or
/// on gRPC: the attempt to resume learns that the connection was refused.
/// On gRPC it used to wait out the session timeout.
#[test]
fn a_worker_that_no_longer_listens_is_lost_at_once_on_a_lane_and_on_grpc() {
    for lane in [true, false] {
        let linked = Linked::start(|o| o.session_timeout = Duration::from_secs(20));
        let client = linked.controller_on(lane);
        let (_gate, status) = run_gate(&client);
        let began = Instant::now();
        // The proxy stands for the worker's process: its port closes.
        linked.proxy.stop();
        let err = status.wait_timeout(PATIENCE).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
        assert!(err.message().contains("nothing listens"), "{err}");
        let lost_after = began.elapsed();
        assert!(
            lost_after < LOST_WITHIN,
            "lane {lane}: lost after {lost_after:?}"
        );
        linked.gate.set(Ok(())).unwrap();
    }
}

/// On a slow link (8 MiB/s each way, no other fault), an upload and then a
/// download of 8 MiB complete, each sent once. Found by the soak
/// (soak.rs): heartbeats travelled on the connection that carried the
/// transfers and waited behind their bytes for longer than their deadline,
/// so the session took the link for broken about every 0.8 s and started
/// the transfer again; the download never completed. Bulk data now has a
/// connection of its own.
#[test]
fn an_upload_and_a_download_through_a_link_of_8_mib_per_s_complete() {
    let linked = Linked::start(|o| {
        o.heartbeat_interval = Duration::from_millis(250);
        o.session_timeout = Duration::from_secs(5);
    });
    let client = linked.controller();
    let heard = heard_events(&client);
    let bytes = patterned(8);
    linked.proxy.set_bandwidth(Direction::Both, Some(8 << 20));
    let buffer = uploaded(&client, &bytes);
    assert!(
        buffer.to_host_vec().unwrap() == bytes,
        "the buffer came back changed"
    );
    assert!(!client.host_lost(0).unwrap().is_ready());
    assert_eq!(linked.worker.buffer_count(), 1);
    assert!(
        heard.lock().unwrap().is_empty(),
        "{:?}",
        heard.lock().unwrap()
    );
    let stats = linked.proxy.stats();
    assert!(
        stats.bytes_up < 2 * bytes.len() as u64 && stats.bytes_down < 2 * bytes.len() as u64,
        "a transfer went twice: {stats:?}"
    );
}

/// An upload slower than the request timeout goes once, and the link does
/// not look broken: bulk data has no deadline (heartbeats on the session's
/// other connection find a broken link). It was sent again, the control
/// stream reconnected, and the upload failed with `deadline_exceeded`.
#[test]
fn an_upload_slower_than_the_request_timeout_goes_once() {
    let linked = Linked::start(|o| {
        o.heartbeat_interval = Duration::from_millis(250);
        o.session_timeout = Duration::from_secs(5);
    });
    let client = linked.controller(); // a request timeout of 5 s
    let heard = heard_events(&client);
    let bytes = patterned(24); // 24 MiB at 4 MiB/s: 6 s
    linked.proxy.set_bandwidth(Direction::Both, Some(4 << 20));
    let buffer = uploaded(&client, &bytes);
    let stats = linked.proxy.stats();
    assert!(stats.bytes_up < 2 * bytes.len() as u64, "{stats:?}");
    assert!(
        heard.lock().unwrap().is_empty(),
        "{:?}",
        heard.lock().unwrap()
    );
    assert_eq!(linked.worker.buffer_count(), 1);
    drop(buffer);
}

/// A download that outlasts the session timeout meets two resets far
/// apart, each healed in time: it completes. The second failed it for good
/// (its first failure was longer ago than the session timeout).
#[test]
fn a_long_download_survives_two_resets_far_apart() {
    let linked = Linked::start(|o| {
        o.heartbeat_interval = Duration::from_millis(250);
        o.session_timeout = Duration::from_secs(1);
    });
    let client = linked.controller();
    let bytes = patterned(16);
    let buffer = uploaded(&client, &bytes);
    linked.proxy.set_bandwidth(Direction::Down, Some(4 << 20)); // 4 s down
    let back = std::thread::scope(|scope| {
        scope.spawn(|| {
            for _ in 0..2 {
                std::thread::sleep(Duration::from_millis(1500));
                linked.proxy.reset();
            }
        });
        buffer.to_host_vec()
    });
    assert!(back.unwrap() == bytes, "the buffer came back changed");
    assert!(!client.host_lost(0).unwrap().is_ready());
}

/// Asking about an array of a lost session (is it in this process?) opens
/// no session with the worker: it took the connect timeout while the link
/// was down.
#[test]
fn asking_about_an_array_of_a_lost_session_does_not_connect() {
    let linked = Linked::start(|o| {
        o.heartbeat_interval = Duration::from_millis(250);
        o.session_timeout = Duration::from_secs(1);
    });
    let client = linked.controller();
    let heard = heard_events(&client);
    let device = client.devices()[0].clone();
    let kept = i32_array(&client, &[7], &spec_on(&[1], DType::I32, &device));
    kept.ready_event().wait_timeout(PATIENCE).unwrap();
    let buffer = kept.buffers()[0].clone();
    linked.proxy.partition(true);
    client
        .host_lost(0)
        .unwrap()
        .wait_timeout(PATIENCE)
        .unwrap_err();
    let began = Instant::now();
    assert!(!buffer.is_in_process());
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "took {:?}",
        began.elapsed()
    );
    use HostEventKind::{Disconnected, Lost};
    expect_events(&heard, &[Disconnected, Lost]);
    linked.proxy.partition(false);
}

/// A session lost while a download is in flight tells `lost` last: the
/// download's failure told `disconnected` after it.
#[test]
fn no_disconnected_event_follows_a_loss_with_a_transfer_in_flight() {
    let linked = Linked::start(|_| {});
    let client = linked.controller();
    let heard = heard_events(&client);
    let bytes = patterned(32);
    let buffer = uploaded(&client, &bytes);
    linked.proxy.set_bandwidth(Direction::Down, Some(8 << 20));
    let Linked { worker, proxy, .. } = linked;
    std::thread::scope(|scope| {
        let read = scope.spawn(|| buffer.to_host_vec().map(|_| ()));
        std::thread::sleep(Duration::from_millis(500));
        drop(worker);
        let _ = read.join().unwrap();
    });
    client
        .host_lost(0)
        .unwrap()
        .wait_timeout(PATIENCE)
        .unwrap_err();
    std::thread::sleep(Duration::from_millis(500));
    let after = heard.lock().unwrap().clone();
    drop(proxy);
    let lost_at = after.iter().position(|k| *k == HostEventKind::Lost);
    let lost_at = lost_at.unwrap_or_else(|| panic!("no loss told: {after:?}"));
    assert!(
        !after[lost_at..].contains(&HostEventKind::Disconnected),
        "{after:?}"
    );
}
