//! A client of several worker hosts (in this process, over real loopback
//! sockets): global devices, arrays sharded across hosts, executions once per
//! host, copies between hosts, deletion and lost workers.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    assert_error, client_with_threads, compile_native, connect_options, eventually, i32_array,
    i32_bytes, i32_values, plain_client, progress_log, register_add_one, register_counter, spec_on,
    ProgressLog,
};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{
    Array, ArraySpec, Buffer, Client, ClientOptions, ClusterOptions, CompileOptions, DType,
    ErrorCode, Event, ExecuteOptions, ExecutionContext, LanguageExecutor, LoadedProgram, Program,
    SessionKey, Sharding,
};

/// A worker with `devices` CPU devices whose native `add_one_i32` also
/// counts its runs, and `gate` (and `gated_add_one_i32`) that blocks until
/// its event is set.
struct TestWorker {
    worker: Worker,
    runs: Arc<AtomicU64>,
    gate: Arc<Mutex<Event>>,
}

fn start_worker(token: &Token, devices: usize) -> TestWorker {
    let client = client_with_threads(devices, 2);
    register_add_one(&client);
    let runs = Arc::new(AtomicU64::new(0));
    register_counter(&client, "count", &runs);
    client
        .register_native_function("ask", |ctx| {
            // Asks the controller, and fails with its answer unless it is "pong".
            let answer = ctx.call_host_callback(0, b"ping")?;
            if answer != b"pong" {
                return Err(colocated_core::Error::invalid_argument(format!(
                    "the controller answered {:?}",
                    String::from_utf8_lossy(&answer)
                )));
            }
            Ok(())
        })
        .unwrap();
    client
        .register_native_function("upper", |ctx| {
            // Output shard i: input shard i in upper case.
            for (i, shard) in ctx.output_shards().iter().enumerate() {
                let input = ctx.inputs().get(i).ok_or_else(|| {
                    colocated_core::Error::invalid_argument(format!("no input shard {i}"))
                })?;
                let upper: Vec<String> = input
                    .to_strings()?
                    .iter()
                    .map(|s| s.to_uppercase())
                    .collect();
                let out =
                    Buffer::from_strings(ctx.client(), &upper, &shard.dims, &shard.device, None)?;
                ctx.set_output(i, out)?;
            }
            Ok(())
        })
        .unwrap();
    let gate = Arc::new(Mutex::new(Event::new()));
    let held = gate.clone();
    client
        .register_native_function("gate", move |_ctx| {
            let event = held.lock().unwrap().clone();
            event.wait()
        })
        .unwrap();
    let held_add = gate.clone();
    client
        .register_native_function("gated_add_one_i32", move |ctx| {
            // add_one_i32 once the gate opens.
            let event = held_add.lock().unwrap().clone();
            event.wait()?;
            common::add_one_shards(ctx)
        })
        .unwrap();
    let worker = common::start_worker(client, token, |_| {});
    TestWorker { worker, runs, gate }
}

fn options(workers: &[&TestWorker], token: &Token, include_local: bool) -> ClusterOptions {
    ClusterOptions {
        workers: workers
            .iter()
            .map(|w| connect_options(&w.worker, token))
            .collect(),
        include_local,
        local: ClientOptions {
            num_cpu_devices: Some(1),
            executor_threads: Some(2),
            ..Default::default()
        },
    }
}

/// Two workers that accept `token` (a fresh one) with `a_devices` and
/// `b_devices` devices, and a controller of both (and of one local device
/// first, when `include_local`).
fn two_workers(
    a_devices: usize,
    b_devices: usize,
    include_local: bool,
) -> (Token, TestWorker, TestWorker, Client) {
    let token = Token::generate().unwrap();
    let (a, b) = (
        start_worker(&token, a_devices),
        start_worker(&token, b_devices),
    );
    let client = Client::connect(&options(&[&a, &b], &token, include_local)).unwrap();
    (token, a, b, client)
}

/// Asserts that an int32[1] of `value` put on `device` comes back.
#[track_caller]
fn assert_round_trips(client: &Client, value: i32, device: &colocated_core::Device) {
    let y = Buffer::from_bytes(client, &i32_bytes(&[value]), DType::I32, &[1], device).unwrap();
    assert_eq!(i32_values(&y.to_host_vec().unwrap()), vec![value]);
}

/// Asserts that putting an int32[1] of `value` on `device` and reading it
/// back fails with `code` and a message containing `fragment`.
#[track_caller]
fn assert_round_trip_fails(
    client: &Client,
    value: i32,
    device: &colocated_core::Device,
    code: ErrorCode,
    fragment: &str,
) {
    assert_error(
        Buffer::from_bytes(client, &i32_bytes(&[value]), DType::I32, &[1], device)
            .and_then(|b| b.to_host_vec()),
        code,
        fragment,
    );
}

/// A worker with `devices` devices, and a controller of `devices` local
/// devices first and then the worker's.
fn local_and_worker(devices: usize) -> (TestWorker, Client) {
    let token = Token::generate().unwrap();
    let a = start_worker(&token, devices);
    let mut opts = options(&[&a], &token, true);
    opts.local.num_cpu_devices = Some(devices);
    let client = Client::connect(&opts).unwrap();
    (a, client)
}

/// An int32 buffer of several transfer chunks (3 Mi elements, element `i`
/// being `value(i)`) on `device`, and its bytes.
fn several_chunks(
    client: &Client,
    device: &colocated_core::Device,
    value: impl Fn(i32) -> i32,
) -> (Vec<u8>, Buffer) {
    let n = 3 << 20;
    let values: Vec<i32> = (0..n as i32).map(value).collect();
    let bytes = i32_bytes(&values);
    let x = Buffer::from_bytes(client, &bytes, DType::I32, &[n], device).unwrap();
    (bytes, x)
}

/// Copies `x` to `first` (reporting progress), that copy to `second`, and
/// that one to `back`: the three copies, and the first copy's progress
/// reports.
fn copy_around(
    x: &Buffer,
    first: &colocated_core::Device,
    second: &colocated_core::Device,
    back: &colocated_core::Device,
) -> (Buffer, Buffer, Buffer, ProgressLog) {
    let (reports, progress) = progress_log();
    let on_first = x
        .copy_to_device_with_progress(first, Some(progress))
        .unwrap();
    let on_second = on_first.copy_to_device(second).unwrap();
    let returned = on_second.copy_to_device(back).unwrap();
    (on_first, on_second, returned, reports)
}

/// A worker with one device, a controller of it alone, and the device.
fn one_worker() -> (TestWorker, Client, colocated_core::Device) {
    let token = Token::generate().unwrap();
    let worker = start_worker(&token, 1);
    let client = Client::connect(&options(&[&worker], &token, false)).unwrap();
    let device = client.devices()[0].clone();
    (worker, client, device)
}

/// The options of a controller of `worker` alone (no local devices).
fn controller_options(worker: &Worker, token: &Token) -> ClusterOptions {
    ClusterOptions {
        workers: vec![connect_options(worker, token)],
        include_local: false,
        local: ClientOptions::default(),
    }
}

/// A raw gRPC call to the worker at `address`, for requests the controller
/// never sends (its own runtime: the test thread is not in one).
fn raw_rpc<T>(
    address: std::net::SocketAddr,
    call: impl AsyncFnOnce(
        colocated_core::transport::proto::worker_client::WorkerClient<tonic::transport::Channel>,
    ) -> T,
) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let rpc = colocated_core::transport::proto::worker_client::WorkerClient::connect(format!(
            "http://{address}"
        ))
        .await
        .unwrap();
        call(rpc).await
    })
}

/// `message` with the bearer `token` and, if given, the `session` id.
fn signed<T>(message: T, token: &str, session: Option<&str>) -> tonic::Request<T> {
    use colocated_core::transport::{AUTHORIZATION, SESSION};
    let mut request = tonic::Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert(AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
    if let Some(session) = session {
        metadata.insert(SESSION, session.parse().unwrap());
    }
    request
}

fn sharded_over(client: &Client, n: i64) -> ArraySpec {
    let devices = client.devices().to_vec();
    let mesh = vec![devices.len()];
    let sharding = Sharding::named(devices, mesh, vec!["x".into()], vec![vec![0]]).unwrap();
    ArraySpec::new(vec![n], DType::I32, sharding).unwrap()
}

#[test]
fn devices_get_global_ids_and_their_hosts_process_index() {
    let (_, a, _b, client) = two_workers(2, 3, true);
    let ids: Vec<u32> = client.devices().iter().map(|d| d.id()).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4, 5]);
    let processes: Vec<u32> = client.devices().iter().map(|d| d.process_index()).collect();
    assert_eq!(processes, vec![0, 1, 1, 2, 2, 2]);
    let hosts = client.hosts();
    assert_eq!(hosts.len(), 3);
    assert!(!hosts[0].is_remote());
    assert_eq!(hosts[1].name(), a.worker.local_addr().to_string());
    assert_eq!(hosts[2].device_ids(), &[3, 4, 5]);
    // Memory spaces are unique across hosts.
    let mut spaces: Vec<u32> = client.memory_spaces().iter().map(|m| m.id()).collect();
    spaces.sort();
    spaces.dedup();
    assert_eq!(spaces.len(), client.memory_spaces().len());
}

#[test]
fn an_array_over_three_hosts_runs_once_per_host_and_gathers() {
    let token = Token::generate().unwrap();
    let workers: Vec<TestWorker> = (0..3).map(|_| start_worker(&token, 2)).collect();
    let refs: Vec<&TestWorker> = workers.iter().collect();
    let client = Client::connect(&options(&refs, &token, false)).unwrap();
    assert_eq!(client.devices().len(), 6);
    let spec = sharded_over(&client, 12);
    let values: Vec<i32> = (0..12).collect();
    let x = i32_array(&client, &values, &spec);
    // Each shard really is on its worker.
    for w in &workers {
        eventually("the shards arrive", || w.worker.buffer_count() == 2);
    }
    let program = Program::native(
        "add_one_i32",
        vec![spec.clone()],
        vec![spec.clone()],
        client.devices().to_vec(),
    );
    let exe = client.compile(program, CompileOptions::default()).unwrap();
    let run = exe
        .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
        .unwrap();
    run.status.wait().unwrap();
    let y = i32_values(&run.outputs[0].to_host_bytes().unwrap());
    assert_eq!(y, (1..13).collect::<Vec<i32>>());
    // Once per host: a program that counts its runs.
    let count = compile_native(
        &client,
        "count",
        vec![spec.clone()],
        vec![],
        client.devices(),
    );
    count
        .execute(&[x], &ExecuteOptions::default())
        .unwrap()
        .status
        .wait()
        .unwrap();
    for w in &workers {
        assert_eq!(w.runs.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn a_host_sees_its_block_of_a_two_dimensional_mesh() {
    // A 2x2 mesh over two hosts of two devices: each host has one row of the
    // mesh, so its block is rows [2h, 2h+2) of a 4x2 array split on both axes.
    let (_, _a, _b, client) = two_workers(2, 2, false);
    let sharding = Sharding::named(
        client.devices().to_vec(),
        vec![2, 2],
        vec!["h".into(), "d".into()],
        vec![vec![0], vec![1]],
    )
    .unwrap();
    let spec = ArraySpec::new(vec![4, 2], DType::I32, sharding).unwrap();
    let values: Vec<i32> = (0..8).collect();
    let x = i32_array(&client, &values, &spec);
    let exe = compile_same(&client, "add_one_i32", &spec);
    let run = exe.execute(&[x], &ExecuteOptions::default()).unwrap();
    let y = i32_values(&run.outputs[0].to_host_bytes().unwrap());
    assert_eq!(y, (1..9).collect::<Vec<i32>>());
}

#[test]
fn buffers_copy_between_hosts_with_progress() {
    let (_, _a, _b, client) = two_workers(1, 1, true);
    let [local, on_a, on_b] = [0, 1, 2].map(|i| client.devices()[i].clone());
    let (bytes, x) = several_chunks(&client, &local, |v| v);
    let (on_a_copy, _on_b_copy, back, reports) = copy_around(&x, &on_a, &on_b, &local);
    assert_eq!(back.to_host_vec().unwrap(), bytes);
    assert_eq!(on_a_copy.to_host_vec().unwrap(), bytes);
    let reports = reports.lock().unwrap();
    let total = bytes.len() as u64;
    assert!(reports.len() > 1, "{reports:?}");
    assert_eq!(reports.last(), Some(&(total, total)));
    assert!(reports.windows(2).all(|w| w[0].0 <= w[1].0));
}

#[test]
fn a_copy_between_workers_arrives_whole_with_progress_and_outlives_its_source() {
    let (_, _a, _b, client) = two_workers(1, 1, false);
    let [on_a, on_b] = [0, 1].map(|i| client.devices()[i].clone());
    let (bytes, x) = several_chunks(&client, &on_a, |v| v.wrapping_mul(7));
    let (reports, progress) = progress_log();
    let copy = x
        .copy_to_device_with_progress(&on_b, Some(progress))
        .unwrap();
    // The source may go at once: the copy keeps what it reads.
    x.delete();
    copy.ready_event().wait().unwrap();
    assert_eq!(copy.to_host_vec().unwrap(), bytes);
    let reports = reports.lock().unwrap().clone();
    let total = bytes.len() as u64;
    assert!(reports.len() > 1, "{reports:?}");
    assert!(reports.iter().all(|&(_, t)| t == total), "{reports:?}");
    assert!(reports.windows(2).all(|w| w[0].0 <= w[1].0));
    assert_eq!(reports.last().map(|r| r.0), Some(total));
}

/// A chain of calls on one worker pipelines: an execution whose input is the
/// pending output of one sent to the same worker goes at once (the worker
/// waits for the input itself), not a round trip later; the first one's
/// failure fails the next.
#[test]
fn chained_executions_on_a_worker_are_sent_before_their_inputs_are_ready() {
    let (a, client, device) = one_worker();
    let spec = spec_on(&[2], DType::I32, &device);
    let gated = compile_same(&client, "gated_add_one_i32", &spec);
    let add_one = compile_same(&client, "add_one_i32", &spec);
    let x = i32_array(&client, &[1, 2], &spec);
    x.ready_event().wait().unwrap();
    let options = ExecuteOptions::default();
    let call = |exe: &colocated_core::LoadedExecutable, arg: &Array| {
        exe.execute(std::slice::from_ref(arg), &options)
            .unwrap()
            .outputs
            .remove(0)
    };
    for fails in [false, true] {
        *a.gate.lock().unwrap() = Event::new();
        // The previous round's buffers are gone: the worker holds `x`.
        eventually("the last round's buffers go", || {
            a.worker.buffer_count() == 1
        });
        let before = a.worker.buffer_count();
        let y = call(&gated, &x);
        let z = call(&add_one, &y);
        // While `y` waits for the gate, the worker already holds `z`.
        eventually("the chained execution reaches the worker", || {
            a.worker.buffer_count() == before + 2
        });
        assert!(!y.ready_event().is_ready());
        let outcome = if fails {
            Err(colocated_core::Error::internal("the gate broke"))
        } else {
            Ok(())
        };
        a.gate.lock().unwrap().set(outcome).unwrap();
        if fails {
            assert_error(z.to_host_bytes(), ErrorCode::Internal, "the gate broke");
        } else {
            assert_eq!(i32_values(&z.to_host_bytes().unwrap()), vec![3, 4]);
        }
    }
}

/// Reads on the control stream whose answers add up to more than a reader
/// takes from a lane at a time (1 MiB), from several threads at once: the
/// threads that wait read the lane, each answer is taken once and whole,
/// and none is left unread (a lane whose bytes arrived while another
/// thread read it is read again).
#[test]
fn many_threads_reading_large_buffers_of_one_worker_get_every_byte() {
    let (a, client, device) = one_worker();
    const N: usize = 64 << 10; // 256 KiB of int32
    let spec = spec_on(&[N as i64], DType::I32, &device);
    let values: Vec<i32> = (0..N as i32).collect();
    let x = i32_array(&client, &values, &spec);
    let exe = compile_same(&client, "add_one_i32", &spec);
    let expected = i32_bytes(&values.iter().map(|v| v + 1).collect::<Vec<_>>()).to_vec();
    // Eight buffers on the worker, each read by every thread in every round:
    // 2 MiB of answers per thread and round.
    let outputs: Vec<Array> = (0..8)
        .map(|_| {
            let run = exe
                .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
                .unwrap();
            run.status.wait().unwrap();
            run.outputs.into_iter().next().unwrap()
        })
        .collect();
    const THREADS: usize = 4;
    const ROUNDS: usize = 20;
    let before = a.worker.control_operations();
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    let mut bytes = vec![vec![0u8; N * 4]; outputs.len()];
                    let reads: Vec<_> = outputs
                        .iter()
                        .zip(&mut bytes)
                        .map(|(y, out)| {
                            // SAFETY: `out` is the buffer's size and outlives
                            // the wait below.
                            unsafe { y.buffers()[0].to_host_raw(out.as_mut_ptr(), out.len()) }
                                .unwrap()
                        })
                        .collect();
                    for read in reads {
                        read.wait_timeout(Duration::from_secs(30)).unwrap();
                    }
                    for out in &bytes {
                        assert!(out == &expected, "a read brought other bytes");
                    }
                }
            });
        }
    });
    // Every read was an operation of the control stream.
    let reads = (THREADS * ROUNDS * outputs.len()) as u64;
    assert!(a.worker.control_operations() - before >= reads);
}

/// A small output of a finished execution travels with the worker's answer
/// (protocol 6): reading it costs the worker no operation. A larger one is
/// read with one (a read on the control stream). Reads of a lost worker's
/// buffers fail, small or not.
#[test]
fn small_outputs_are_read_without_another_round_trip() {
    let (a, client, device) = one_worker();
    let run_add_one = |n: usize| {
        let spec = spec_on(&[n as i64], DType::I32, &device);
        let values: Vec<i32> = (0..n as i32).collect();
        let x = i32_array(&client, &values, &spec);
        let exe = compile_same(&client, "add_one_i32", &spec);
        let run = exe
            .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
            .unwrap();
        run.status.wait().unwrap();
        // The input and the executable stay: freeing them sends operations.
        (run.outputs.into_iter().next().unwrap(), x, exe)
    };
    let (small, _x, _exe) = run_add_one(4); // 16 bytes
    let (larger, _y, _exe2) = run_add_one(1024); // 4 KiB: more than an answer carries
    let before = a.worker.control_operations();
    assert_eq!(
        i32_values(&small.to_host_bytes().unwrap()),
        vec![1, 2, 3, 4]
    );
    assert_eq!(
        a.worker.control_operations(),
        before,
        "the small read asked the worker"
    );
    let read = i32_values(&larger.to_host_bytes().unwrap());
    assert_eq!(read, (1..=1024).collect::<Vec<i32>>());
    assert_eq!(a.worker.control_operations(), before + 1);
    a.worker.shutdown().unwrap();
    eventually("the client sees the worker go", || {
        client.host_lost(0).unwrap().is_ready()
    });
    assert_error(small.to_host_bytes(), ErrorCode::Unavailable, "");
}

/// A small upload is an operation of the control stream (protocol 7): an
/// execution right behind it uses it, and this process keeps its bytes, so
/// reading it costs the worker no operation.
#[test]
fn small_uploads_travel_on_the_control_stream_and_read_here() {
    let (a, client, device) = one_worker();
    let spec_of = |n: i64| spec_on(&[n], DType::I32, &device);
    let exe = compile_same(&client, "add_one_i32", &spec_of(3));
    let before = a.worker.control_operations();
    let x = Array::from_host_bytes(&client, &i32_bytes(&[1, 2, 3]), spec_of(3)).unwrap();
    eventually("the upload arrives as a control operation", || {
        a.worker.control_operations() == before + 1
    });
    let y = exe
        .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
        .unwrap()
        .outputs
        .remove(0);
    assert_eq!(i32_values(&y.to_host_bytes().unwrap()), vec![2, 3, 4]);
    assert_eq!(i32_values(&x.to_host_bytes().unwrap()), vec![1, 2, 3]);
    // The upload and the execution: two operations, the reads none.
    assert_eq!(a.worker.control_operations(), before + 2);
}

/// `device_put` of an array in every SDK: an array on workers goes to
/// another sharding host to host when its shards keep their index (a grant on
/// the source, a fetch on the destination: no bytes through here), and is
/// gathered and put again when they do not; either way at once, before the
/// source is even computed. An array laid out that way already is returned
/// as it is.
/// A copy between workers asks the destination to read only once the source
/// holds the read grant: a source busy with earlier operations never sees
/// the read before its grant (it would refuse it, log a warning about a
/// stranger, and the reader would retry).
#[test]
fn a_copy_between_workers_reads_only_once_the_source_holds_its_grant() {
    let (_, a, _b, client) = two_workers(1, 1, false);
    let [on_a, on_b] = [0, 1].map(|i| client.devices()[i].clone());
    let on = |device: &colocated_core::Device, n: i64| spec_on(&[n], DType::I32, device);
    let values: Vec<i32> = (0..1 << 14).collect();
    let mut kept = Vec::new();
    for _ in 0..5 {
        let x = Array::from_host_bytes(&client, &i32_bytes(&values), on(&on_a, 1 << 14)).unwrap();
        x.ready_event().wait().unwrap();
        // Small uploads queue on the source's control stream ahead of the grant.
        for i in 0..20_000 {
            kept.push(Array::from_host_bytes(&client, &i32_bytes(&[i]), on(&on_a, 1)).unwrap());
        }
        let copied = x
            .put_to(&client, Sharding::single_device(on_b.clone()), None, None)
            .unwrap();
        assert_eq!(
            i32_values(&copied.buffers()[0].to_host_vec().unwrap()),
            values
        );
    }
    assert_eq!(
        a.worker.refused_requests(),
        0,
        "the source refused a read of its own copy"
    );
}

/// Copies from one worker to another share one connection between them:
/// the first copy connects, later ones reuse it (a connection costs round
/// trips and, on the source, an admission).
#[test]
fn copies_between_two_workers_reuse_one_connection() {
    let (_, a, _b, client) = two_workers(1, 1, false);
    let [on_a, on_b] = [0, 1].map(|i| client.devices()[i].clone());
    let spec = ArraySpec::new(vec![4], DType::I32, Sharding::single_device(on_a)).unwrap();
    let x = Array::from_host_bytes(&client, &i32_bytes(&[1, 2, 3, 4]), spec).unwrap();
    let copy = || {
        let copied = x
            .put_to(&client, Sharding::single_device(on_b.clone()), None, None)
            .unwrap();
        assert_eq!(
            i32_values(&copied.buffers()[0].to_host_vec().unwrap()),
            [1, 2, 3, 4]
        );
    };
    copy();
    let accepted = a.worker.connections_accepted();
    for _ in 0..10 {
        copy();
    }
    assert_eq!(
        a.worker.connections_accepted(),
        accepted,
        "a copy opened a connection"
    );
}

/// A kept connection to a source that went away does not fail the next copy
/// from a new worker at the same address: the copy connects anew.
#[test]
fn a_copy_from_a_restarted_worker_at_the_same_address_connects_anew() {
    let token = Token::generate().unwrap();
    let worker_at = |listen: Option<std::net::SocketAddr>| {
        let client = plain_client(1);
        let mut options = WorkerOptions::new(Some(token.clone()));
        if let Some(listen) = listen {
            options.listen = listen;
        }
        Worker::start(client, options).unwrap()
    };
    let b = worker_at(None);
    let copy_from = |a: &Worker| {
        let mut cluster = controller_options(a, &token);
        cluster
            .workers
            .extend(controller_options(&b, &token).workers);
        let client = Client::connect(&cluster).unwrap();
        let [on_a, on_b] = [0, 1].map(|i| client.devices()[i].clone());
        let spec = ArraySpec::new(vec![2], DType::I32, Sharding::single_device(on_a)).unwrap();
        let x = Array::from_host_bytes(&client, &i32_bytes(&[5, 6]), spec).unwrap();
        let copied = x
            .put_to(&client, Sharding::single_device(on_b), None, None)
            .unwrap();
        assert_eq!(
            i32_values(&copied.buffers()[0].to_host_vec().unwrap()),
            [5, 6]
        );
    };
    let a = worker_at(None);
    let address = a.local_addr();
    copy_from(&a);
    a.shutdown().unwrap();
    let again = worker_at(Some(address));
    copy_from(&again);
}

#[test]
fn put_to_copies_host_to_host_when_the_layout_stays_and_gathers_otherwise() {
    let (_, a, b, client) = two_workers(1, 1, false);
    let [on_a, on_b] = [0, 1].map(|i| client.devices()[i].clone());
    // 2 MiB: read and put in streams of their own, not control operations.
    let n = 1 << 19;
    let spec_on = |device: &colocated_core::Device| spec_on(&[n], DType::I32, device);
    let values: Vec<i32> = (0..n as i32).collect();
    let plus_one: Vec<i32> = (1..=n as i32).collect();
    let x = Array::from_host_bytes(&client, &i32_bytes(&values), spec_on(&on_a)).unwrap();
    let gated = compile_same(&client, "gated_add_one_i32", &spec_on(&on_a));
    let ops = || (a.worker.control_operations(), b.worker.control_operations());
    // Kept: freeing them would send deletions.
    let mut kept = Vec::new();
    for host_to_host in [true, false] {
        *a.gate.lock().unwrap() = Event::new();
        let before = ops();
        let y = gated
            .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
            .unwrap()
            .outputs
            .remove(0);
        let target = if host_to_host {
            Sharding::single_device(on_b.clone())
        } else {
            Sharding::replicated(vec![on_a.clone(), on_b.clone()]).unwrap()
        };
        let placed = y.put_to(&client, target, None, None).unwrap();
        assert!(!y.ready_event().is_ready(), "put_to waited for its source");
        a.gate.lock().unwrap().set(Ok(())).unwrap();
        for buffer in placed.buffers() {
            assert_eq!(i32_values(&buffer.to_host_vec().unwrap()), plus_one);
        }
        let devices: Vec<u32> = placed.buffers().iter().map(|b| b.device().id()).collect();
        let (grants, fetches) = if host_to_host {
            assert_eq!(devices, vec![on_b.id()]);
            (1, 1)
        } else {
            assert_eq!(devices, vec![on_a.id(), on_b.id()]);
            (0, 0)
        };
        // The execution, and for a copy between hosts its grant and fetch.
        assert_eq!(ops(), (before.0 + 1 + grants, before.1 + fetches));
        kept.push((y, placed));
    }
    // Laid out that way already: the same array.
    let same = x.put_to(&client, x.sharding().clone(), None, None).unwrap();
    assert!(same.buffers()[0].same_as(&x.buffers()[0]));
    // A source deleted at once is kept for the gather.
    let both = Sharding::replicated(vec![on_a.clone(), on_b.clone()]).unwrap();
    let source = Array::from_host_bytes(&client, &i32_bytes(&values), spec_on(&on_b)).unwrap();
    let replicated = source.put_to(&client, both, None, None).unwrap();
    source.delete();
    for buffer in replicated.buffers() {
        assert_eq!(i32_values(&buffer.to_host_vec().unwrap()), values);
    }
}

/// The worker-to-worker read itself: a grant lets another worker's
/// `GetBuffer` read one buffer once, within its time to live; nothing else
/// gets in with it.
#[test]
fn a_read_grant_admits_one_read_of_one_buffer() {
    use bytes::Bytes;
    use colocated_core::session::RemoteSession;
    use colocated_core::transport::proto::{BufferSpec, GetBufferRequest};
    use colocated_core::transport::GRANT;

    let token = Token::generate().unwrap();
    let (a, b) = (start_worker(&token, 1), start_worker(&token, 1));
    let session = |w: &TestWorker| {
        RemoteSession::connect(&ConnectOptions::new(
            w.worker.local_addr().to_string(),
            Some(token.clone()),
        ))
        .unwrap()
    };
    let (on_a, on_b) = (session(&a), session(&b));
    let spec = BufferSpec {
        device: 0,
        dtype: DType::U8 as u32,
        dims: vec![5],
        memory_kind: 0,
    };
    let source = on_a.new_handle();
    on_a.put_buffer(source, spec.clone(), Bytes::from_static(b"hello"))
        .unwrap();
    let grant = [7u8; 32];
    grant_read(&on_a, source, &grant, Duration::from_secs(60));
    let copied = on_b.new_handle();
    let done = Event::new();
    let set = done.clone();
    on_b.fetch_buffer_then(
        copied,
        spec.clone(),
        &on_a,
        &grant,
        None,
        Box::new(move |r| {
            let _ = set.set(r);
        }),
    );
    done.wait().unwrap();
    assert_eq!(on_b.get_buffer(copied).unwrap(), b"hello");
    // Used once: the same grant is refused now, like a wrong token.
    let hex: String = grant.iter().map(|b| format!("{b:02x}")).collect();
    let read_with = |grant: &str| {
        let mut request = tonic::Request::new(GetBufferRequest {
            handle: source,
            offset: 0,
        });
        request.metadata_mut().insert(GRANT, grant.parse().unwrap());
        // The refusal's code (or none, when the read went through).
        raw_rpc(a.worker.local_addr(), async |mut rpc| {
            match rpc.get_buffer(request).await {
                Ok(mut stream) => stream.get_mut().message().await.err().map(|s| s.code()),
                Err(status) => Some(status.code()),
            }
        })
    };
    assert_eq!(read_with(&hex), Some(tonic::Code::Unauthenticated));
    // Malformed grants: empty, short, not hex, upper case, a sign, long.
    for bad in [
        "",
        "00",
        &"zz".repeat(32),
        &"AB".repeat(32),
        &format!("+f{}", "0".repeat(62)),
        &"ab".repeat(33),
    ] {
        assert_eq!(
            read_with(bad),
            Some(tonic::Code::Unauthenticated),
            "{bad:?}"
        );
    }
    // An expired grant is refused too; a fetch with it fails.
    grant_read(&on_a, source, &[9u8; 32], Duration::from_millis(1));
    on_a.heartbeat().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let late = Event::new();
    let set = late.clone();
    on_b.fetch_buffer_then(
        on_b.new_handle(),
        spec.clone(),
        &on_a,
        &[9u8; 32],
        None,
        Box::new(move |r| {
            let _ = set.set(r);
        }),
    );
    let err = late.wait().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");
}

#[test]
fn deleting_an_array_frees_its_shards_on_the_workers() {
    let (_, a, b, client) = two_workers(2, 2, false);
    let spec = sharded_over(&client, 8);
    let x = Array::from_host_bytes(&client, &i32_bytes(&[0; 8]), spec).unwrap();
    x.ready_event().wait().unwrap();
    assert_eq!(a.worker.buffer_count() + b.worker.buffer_count(), 4);
    x.delete();
    eventually("the workers free the shards", || {
        a.worker.buffer_count() + b.worker.buffer_count() == 0
    });
    assert_error(x.to_host_bytes(), ErrorCode::FailedPrecondition, "deleted");
}

#[test]
fn a_put_of_host_bytes_reports_the_bytes_that_go_to_workers() {
    // One local device and one on each worker: 3 shards of 4 int32.
    let (_, _a, _b, client) = two_workers(1, 1, true);
    let spec = sharded_over(&client, 12);
    let values: Vec<i32> = (0..12).collect();
    let (seen, progress) = progress_log();
    let x = Array::from_host_bytes_with_progress(
        &client,
        &i32_bytes(&values),
        spec,
        None,
        Some(progress),
    )
    .unwrap();
    assert_eq!(i32_values(&x.to_host_bytes().unwrap()), values);
    let seen = seen.lock().unwrap();
    // The two workers' shards (16 bytes each); the local one reports nothing.
    assert!(seen.iter().all(|&(_, total)| total == 32), "{seen:?}");
    assert_eq!(
        seen.iter().map(|&(done, _)| done).max(),
        Some(32),
        "{seen:?}"
    );
}

#[test]
fn deleting_an_array_while_it_uploads_stops_the_upload_on_the_wire() {
    let token = Token::generate().unwrap();
    let a = start_worker(&token, 1);
    let client = Client::connect(&options(&[&a], &token, false)).unwrap();
    let spec = spec_on(&[16 << 20], DType::I32, &client.devices()[0]);
    let bytes = vec![7u8; 64 << 20]; // 32 chunks
                                     // The first chunk's report holds the network until the test has deleted
                                     // the array, so the upload cannot have ended first.
    let (started, on_start) = std::sync::mpsc::channel::<()>();
    let (deleted, on_delete) = std::sync::mpsc::channel::<()>();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let seen = reports.clone();
    let gate = Mutex::new(Some((started, on_delete)));
    let progress: colocated_core::Progress = Arc::new(move |done: u64, total: u64| {
        seen.lock().unwrap().push((done, total));
        if let Some((started, on_delete)) = gate.lock().unwrap().take() {
            started.send(()).unwrap();
            on_delete.recv_timeout(Duration::from_secs(30)).unwrap();
        }
    });
    let x = colocated_core::without_waiting(|| {
        Array::from_host_bytes_with_progress(&client, &bytes, spec, None, Some(progress))
    })
    .unwrap();
    on_start.recv_timeout(Duration::from_secs(30)).unwrap();
    x.delete();
    deleted.send(()).unwrap();
    let err = x.ready_event().wait().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Cancelled, "{err}");
    assert!(err.message().contains("stopped"), "{err}");
    let total = bytes.len() as u64;
    let sent = reports.lock().unwrap().iter().map(|r| r.0).max();
    assert!(sent < Some(total), "the whole upload went: {sent:?}");
    // The worker keeps nothing of it, and the session still works.
    eventually("the worker drops the partial upload", || {
        a.worker.buffer_count() == 0
    });
    let y = Array::from_host_bytes(&client, &i32_bytes(&[1, 2]), sharded_over(&client, 2)).unwrap();
    assert_eq!(i32_values(&y.to_host_bytes().unwrap()), [1, 2]);
}

#[test]
fn deleting_an_array_that_work_waits_for_lets_its_upload_finish() {
    let (_a, client, on_a) = one_worker();
    let values: Vec<i32> = (0..(1 << 20)).collect();
    let x = colocated_core::without_waiting(|| {
        Buffer::from_bytes(&client, &i32_bytes(&values), DType::I32, &[1 << 20], &on_a)
    })
    .unwrap();
    // A copy back waits for the upload; deleting meanwhile frees the buffer
    // only after it.
    let back = x.copy_to_device(&on_a).unwrap();
    x.delete();
    assert_eq!(i32_values(&back.to_host_vec().unwrap()), values);
}

#[test]
fn closing_a_client_ends_its_sessions_now_and_fails_its_work_with_cancelled() {
    let (a, client) = local_and_worker(1);
    let on_a = client.devices()[1].clone();
    let local = client.devices()[0].clone();
    let x = Buffer::from_bytes(&client, &i32_bytes(&[1]), DType::I32, &[1], &on_a).unwrap();
    x.ready_event().wait().unwrap();
    let gate = compile_on(&client, "gate", &on_a);
    let pending = gate
        .execute(&[], &ExecuteOptions::default())
        .unwrap()
        .status;
    assert_eq!(a.worker.session_count(), 1);
    client.close();
    // While objects of the client live, its session is gone from the worker.
    eventually("the worker ends the session", || {
        a.worker.session_count() == 0 && a.worker.buffer_count() == 0
    });
    let err = pending.wait_timeout(Duration::from_secs(2)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Cancelled, "{err}");
    assert!(err.message().contains("closed"), "{err}");
    assert_error(x.to_host_vec(), ErrorCode::Cancelled, "closed");
    assert_round_trip_fails(&client, 2, &on_a, ErrorCode::Cancelled, "closed");
    // The local host stays usable; closing again does nothing.
    assert_round_trips(&client, 7, &local);
    client.close();
    a.gate.lock().unwrap().set(Ok(())).unwrap();
}

#[test]
fn a_failing_program_on_a_worker_fails_the_outputs_with_its_error() {
    let (_worker, client, device) = one_worker();
    let spec = spec_on(&[2], DType::I32, &device);
    let program = Program::native("missing", vec![spec.clone()], vec![spec], vec![device]);
    // The worker resolves native functions when it loads the program.
    assert_error(
        client.compile(program, CompileOptions::default()),
        ErrorCode::NotFound,
        "missing",
    );
}

#[test]
fn a_lost_worker_fails_pending_work_and_the_others_keep_working() {
    let (_, a, _b, client) = two_workers(1, 1, false);
    let [on_a, on_b] = [0, 1].map(|i| client.devices()[i].clone());
    let gate = compile_on(&client, "gate", &on_a);
    let pending = gate
        .execute(&[], &ExecuteOptions::default())
        .unwrap()
        .status;
    std::thread::sleep(Duration::from_millis(100));
    assert!(!pending.is_ready());
    let TestWorker {
        worker, gate: held, ..
    } = a;
    worker.shutdown().unwrap();
    // Nothing would ever finish it now: it fails, promptly.
    let err = pending.wait_timeout(Duration::from_secs(2)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    held.lock().unwrap().set(Ok(())).unwrap();
    assert!(client.host_lost(0).unwrap().is_ready());
    assert!(!client.host_lost(1).unwrap().is_ready());
    // Later work on the lost host fails at once; the other host works.
    assert_round_trip_fails(&client, 1, &on_a, ErrorCode::Unavailable, "");
    assert_round_trips(&client, 7, &on_b);
}

#[test]
fn connecting_needs_a_host_and_a_valid_token() {
    let token = Token::generate().unwrap();
    let a = start_worker(&token, 1);
    assert_error(
        Client::connect(&options(&[], &token, false)),
        ErrorCode::InvalidArgument,
        "at least one host",
    );
    let wrong = Token::generate().unwrap();
    assert_error(
        Client::connect(&options(&[&a], &wrong, false)),
        ErrorCode::Unauthenticated,
        "",
    );
    assert_eq!(a.worker.session_count(), 0);
}

/// Native function `name` compiled to map `spec` to `spec`, on its devices.
/// Grants one read of `handle` on `session`, and waits until the worker
/// applied the grant.
fn grant_read(
    session: &colocated_core::session::RemoteSession,
    handle: u64,
    grant: &[u8; 32],
    ttl: Duration,
) {
    let granted = Event::new();
    let set = granted.clone();
    session.grant_read_then(
        handle,
        grant,
        ttl,
        Box::new(move |r| {
            let _ = set.set(r);
        }),
    );
    granted.wait().unwrap();
}

fn compile_same(client: &Client, name: &str, spec: &ArraySpec) -> colocated_core::LoadedExecutable {
    let devices = spec.sharding.devices().to_vec();
    compile_native(
        client,
        name,
        vec![spec.clone()],
        vec![spec.clone()],
        &devices,
    )
}

fn compile_on(
    client: &Client,
    name: &str,
    device: &colocated_core::Device,
) -> colocated_core::LoadedExecutable {
    compile_native(client, name, vec![], vec![], std::slice::from_ref(device))
}

#[test]
fn programs_on_workers_call_host_callbacks_of_the_controller() {
    let (_, a, b, client) = two_workers(1, 1, false);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let callback = colocated_core::LoadedHostCallback::new("pong", move |input| {
        seen.lock().unwrap().push(input.to_vec());
        Ok(b"pong".to_vec())
    });
    let program = Program::native("ask", vec![], vec![], client.devices().to_vec());
    let options = CompileOptions {
        host_callbacks: vec![callback],
    };
    let exe = client.compile(program.clone(), options).unwrap();
    for _ in 0..3 {
        let run = exe.execute(&[], &ExecuteOptions::default()).unwrap();
        run.status.wait().unwrap();
    }
    // Once per host and run, with the worker's input.
    assert_eq!(*calls.lock().unwrap(), vec![b"ping".to_vec(); 6]);

    // The callback's error reaches the execution's status, with its code.
    let failing = colocated_core::LoadedHostCallback::new("refuses", |_| {
        Err(colocated_core::Error::permission_denied("not today"))
    });
    let exe = client
        .compile(
            program,
            CompileOptions {
                host_callbacks: vec![failing],
            },
        )
        .unwrap();
    let run = exe.execute(&[], &ExecuteOptions::default()).unwrap();
    let err = run.status.wait().unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    assert!(err.message().contains("not today"), "{err}");
    // Both workers still serve.
    assert_eq!(a.worker.session_count() + b.worker.session_count(), 2);
}

/// A compile that fails on one worker leaves nothing behind: the workers
/// that loaded their part unload it, and no session keeps the program's
/// host callbacks (nor what they hold: a Python function, for one).
#[test]
fn a_compile_that_fails_on_a_worker_keeps_neither_its_parts_nor_its_host_callbacks() {
    let token = Token::generate().unwrap();
    let a = start_worker(&token, 1);
    // A worker that lacks the program's native function: its load fails.
    let lacking = plain_client(1);
    let b = common::start_worker(lacking, &token, |_| {});
    let mut cluster = controller_options(&a.worker, &token);
    cluster
        .workers
        .extend(controller_options(&b, &token).workers);
    let client = Client::connect(&cluster).unwrap();
    let held = Arc::new(());
    let kept = held.clone();
    let callback = colocated_core::LoadedHostCallback::new("pong", move |_| {
        let _ = &kept;
        Ok(b"pong".to_vec())
    });
    let program = Program::native("ask", vec![], vec![], client.devices().to_vec());
    let err = client
        .compile(
            program,
            CompileOptions {
                host_callbacks: vec![callback],
            },
        )
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(err.message().contains("ask"), "{err}");
    eventually("the part loaded on the first worker is unloaded", || {
        a.worker.executable_count() == 0
    });
    assert_eq!(b.executable_count(), 0);
    assert_eq!(
        Arc::strong_count(&held),
        1,
        "a session still holds the host callback"
    );
    // The session goes on.
    let exe = compile_on(&client, "count", &client.devices()[0]);
    let run = exe.execute(&[], &ExecuteOptions::default()).unwrap();
    run.status.wait().unwrap();
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
}

#[test]
fn dropping_an_executable_unloads_it_on_the_workers_after_its_runs() {
    let (_, a, b, client) = two_workers(1, 1, false);
    let gate = compile_native(&client, "gate", vec![], vec![], client.devices());
    assert_eq!(a.worker.executable_count() + b.worker.executable_count(), 2);
    let held = a.gate.lock().unwrap().clone();
    let other = b.gate.lock().unwrap().clone();
    let run = gate.execute(&[], &ExecuteOptions::default()).unwrap();
    drop(gate);
    std::thread::sleep(Duration::from_millis(100));
    // Still loaded while its execution runs.
    assert_eq!(a.worker.executable_count() + b.worker.executable_count(), 2);
    held.set(Ok(())).unwrap();
    other.set(Ok(())).unwrap();
    run.status.wait().unwrap();
    eventually("the workers unload it", || {
        a.worker.executable_count() + b.worker.executable_count() == 0
    });
}

#[test]
fn the_local_host_of_a_program_over_several_hosts_sees_its_block() {
    let (a, client) = local_and_worker(2);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    client
        .register_native_function("count", move |ctx| {
            let specs = ctx.host_input_specs();
            log.lock().unwrap().push((
                specs[0].shape.clone(),
                specs[0].sharding.devices().len(),
                ctx.input_shard_counts().to_vec(),
            ));
            Ok(())
        })
        .unwrap();
    let spec = sharded_over(&client, 8);
    let x = i32_array(&client, &[0; 8], &spec);
    let exe = compile_native(&client, "count", vec![spec], vec![], client.devices());
    exe.execute(&[x], &ExecuteOptions::default())
        .unwrap()
        .status
        .wait()
        .unwrap();
    // The local host holds half: i32[4] over its 2 devices; the worker ran too.
    assert_eq!(*seen.lock().unwrap(), vec![(vec![4], 2, vec![2])]);
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_programs_parts_on_workers_go_out_before_its_local_part_runs() {
    let (a, client) = local_and_worker(1);
    // The local part waits for the worker's part to have run: it can only if
    // the worker's part was sent before the local one started.
    let runs = a.runs.clone();
    client
        .register_native_function("count", move |_ctx| {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while runs.load(Ordering::SeqCst) == 0 {
                if std::time::Instant::now() > deadline {
                    return Err(colocated_core::Error::deadline_exceeded(
                        "the worker's part never ran while the local part waited",
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        })
        .unwrap();
    let exe = compile_native(&client, "count", vec![], vec![], client.devices());
    exe.execute(&[], &ExecuteOptions::default())
        .unwrap()
        .status
        .wait()
        .unwrap();
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
}

/// Strings of every kind a string buffer must carry: empty ones, non-ASCII,
/// and long ones that span the chunks of a transfer.
fn sample_strings(n: usize) -> Vec<String> {
    let kinds = [
        "",
        "a",
        "héllo",
        "naïve 🙂",
        "日本語",
        "",
        "tab\tand\nnewline",
        "z",
    ];
    (0..n)
        .map(|i| match i {
            // Larger than a chunk: split across messages on the wire.
            5 => "ü".repeat(colocated_core::transport::CHUNK_BYTES / 2 + 3),
            _ => format!(
                "{}{}",
                kinds[i % kinds.len()],
                if i < kinds.len() { "" } else { "!" }
            ),
        })
        .collect()
}

fn string_spec(sharding: Sharding, n: i64) -> ArraySpec {
    ArraySpec::new(vec![n], DType::String, sharding).unwrap()
}

#[test]
fn string_arrays_sharded_over_workers_round_trip() {
    let (_, a, b, client) = two_workers(2, 2, true);
    let workers = client.devices()[1..].to_vec();
    let sharding =
        Sharding::named(workers.clone(), vec![4], vec!["x".into()], vec![vec![0]]).unwrap();
    let strings = sample_strings(12);
    let x = Array::from_host_strings(&client, &strings, string_spec(sharding.clone(), 12)).unwrap();
    x.ready_event().wait().unwrap();
    assert_eq!(a.worker.buffer_count() + b.worker.buffer_count(), 4);
    assert_eq!(x.to_host_strings().unwrap(), strings);
    // Each shard, and its on-host form (offsets and bytes) as a local
    // buffer of the same strings gives it.
    let local = client.devices()[0].clone();
    for (i, shard) in x.buffers().iter().enumerate() {
        let expected = &strings[3 * i..3 * i + 3];
        assert_eq!(shard.to_strings().unwrap(), expected, "shard {i}");
        let here = Buffer::from_strings(&client, expected, &[3], &local, None).unwrap();
        let form = here.to_host_vec().unwrap();
        assert_eq!(shard.on_host_size().unwrap(), form.len());
        assert_eq!(shard.to_host_vec().unwrap(), form);
        let mut out = vec![0u8; form.len()];
        // SAFETY: `out` is that long and outlives the wait.
        unsafe { shard.to_host_raw(out.as_mut_ptr(), out.len()) }
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(out, form);
        let mut short = vec![0u8; form.len() - 1];
        // SAFETY: as above.
        let wrong = unsafe { shard.to_host_raw(short.as_mut_ptr(), short.len()) }.unwrap();
        assert_error(wrong.wait(), ErrorCode::InvalidArgument, "needs");
    }
    // A replicated array reads one copy; one shard of one element.
    let replicated = Sharding::replicated(workers.clone()).unwrap();
    let y = Array::from_host_strings(&client, &strings[..2], string_spec(replicated, 2)).unwrap();
    assert_eq!(y.to_host_strings().unwrap(), &strings[..2]);
    for shard in y.buffers() {
        assert_eq!(shard.to_strings().unwrap(), &strings[..2]);
    }
    // Empty: an array of no strings, and a buffer of one empty string.
    let empty = Array::from_host_strings::<&str>(&client, &[], string_spec(sharding, 0)).unwrap();
    assert!(empty.to_host_strings().unwrap().is_empty());
    assert!(empty
        .buffers()
        .iter()
        .all(|b| b.to_host_vec().unwrap() == [0; 8]));
    let blank = Buffer::from_strings(&client, &[""], &[], &workers[3], None).unwrap();
    assert_eq!(blank.to_strings().unwrap(), [""]);
    // Strings read as bytes, or bytes as strings: refused.
    assert_error(
        x.to_host_bytes(),
        ErrorCode::InvalidArgument,
        "to_host_strings",
    );
    let ints =
        Buffer::from_bytes(&client, &i32_bytes(&[1]), DType::I32, &[1], &workers[0]).unwrap();
    assert_error(
        ints.to_strings(),
        ErrorCode::InvalidArgument,
        "not a string",
    );
}

#[test]
fn string_buffers_copy_between_hosts_and_are_deleted_on_their_workers() {
    let (_, a, b, client) = two_workers(1, 1, true);
    let [local, on_a, on_b] = [0, 1, 2].map(|i| client.devices()[i].clone());
    let strings = sample_strings(8);
    let here = Buffer::from_strings(&client, &strings, &[2, 4], &local, None).unwrap();
    // Local to a worker, worker to worker, and back.
    let (there, further, back, reports) = copy_around(&here, &on_a, &on_b, &local);
    assert_eq!(back.dims(), &[2, 4]);
    assert_eq!(back.to_strings().unwrap(), strings);
    assert_eq!(further.to_strings().unwrap(), strings);
    let reports = reports.lock().unwrap().clone();
    let (done, total) = *reports.last().unwrap();
    assert_eq!(done, total);
    assert!(total as usize > strings.iter().map(String::len).sum::<usize>());
    assert_eq!(a.worker.buffer_count(), 1);
    assert_eq!(b.worker.buffer_count(), 1);
    // Deleting frees the worker's copy; work queued before keeps its data.
    let copy = further.copy_to_device(&on_a).unwrap();
    further.delete();
    assert_eq!(copy.to_strings().unwrap(), strings);
    eventually("worker b frees its copy", || b.worker.buffer_count() == 0);
    assert_error(
        further.to_strings(),
        ErrorCode::FailedPrecondition,
        "deleted",
    );
    assert_error(
        further.copy_to_device(&local),
        ErrorCode::FailedPrecondition,
        "deleted",
    );
    drop((there, copy));
    eventually("worker a frees its copies", || a.worker.buffer_count() == 0);
}

#[test]
fn programs_on_workers_take_and_return_string_arrays() {
    let (_, _a, _b, client) = two_workers(2, 2, false);
    let sharding = Sharding::named(
        client.devices().to_vec(),
        vec![4],
        vec!["x".into()],
        vec![vec![0]],
    )
    .unwrap();
    let spec = string_spec(sharding, 8);
    let strings = sample_strings(8);
    let x = Array::from_host_strings(&client, &strings, spec.clone()).unwrap();
    let exe = compile_same(&client, "upper", &spec);
    // The output of one run feeds the next, on the workers.
    let once = exe.execute(&[x], &ExecuteOptions::default()).unwrap();
    let twice = exe
        .execute(&once.outputs, &ExecuteOptions::default())
        .unwrap();
    let upper: Vec<String> = strings.iter().map(|s| s.to_uppercase()).collect();
    assert_eq!(twice.outputs[0].to_host_strings().unwrap(), upper);
    assert_eq!(once.outputs[0].to_host_strings().unwrap(), upper);
    twice.status.wait().unwrap();
}

#[test]
fn a_malformed_string_upload_is_refused_and_the_worker_serves_on() {
    use colocated_core::transport::proto::BufferSpec;
    let token = Token::generate().unwrap();
    let a = start_worker(&token, 1);
    let session = common::connect_session(&a.worker, &token);
    assert!(session.version() >= colocated_core::transport::STRINGS_VERSION);
    let spec = |n: i64| BufferSpec {
        device: 0,
        dtype: DType::String as u32,
        dims: vec![n],
        memory_kind: 0,
    };
    let invalid = ErrorCode::InvalidArgument;
    let cases: [(&str, i64, Vec<u8>, ErrorCode, &str); 7] = [
        (
            "invalid UTF-8",
            1,
            vec![0x0a, 0x02, 0xc3, 0x28],
            invalid,
            "UTF-8",
        ),
        ("a raw byte string", 1, b"abc".to_vec(), invalid, "key"),
        (
            "one element short",
            2,
            vec![0x0a, 0x01, b'a'],
            invalid,
            "1 elements where",
        ),
        (
            "one element over",
            0,
            vec![0x0a, 0x00],
            invalid,
            "more than",
        ),
        (
            "cut in an element",
            1,
            vec![0x0a, 0x05, b'a'],
            invalid,
            "inside",
        ),
        (
            "a padded length",
            1,
            vec![0x0a, 0x80, 0x00],
            invalid,
            "longer",
        ),
        (
            "a length over the limit",
            1,
            vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
            ErrorCode::ResourceExhausted,
            "limit",
        ),
    ];
    for (what, n, bytes, code, text) in cases {
        let handle = session.new_handle();
        let err = session
            .put_buffer(handle, spec(n), bytes.into())
            .unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err}");
        assert!(err.message().contains(text), "{what}: {err}");
        assert_error(session.get_buffer(handle), ErrorCode::NotFound, "");
    }
    assert_eq!(a.worker.buffer_count(), 0);
    // The session and the worker serve on: a good upload reads back as its
    // bytes, and a client of the worker moves strings.
    let good = vec![0x0a, 0x00, 0x0a, 0x03, b'a', 0xc3, 0xa9];
    let handle = session.new_handle();
    session
        .put_buffer(handle, spec(2), good.clone().into())
        .unwrap();
    assert_eq!(session.get_buffer(handle).unwrap(), good);
    let client = Client::connect(&options(&[&a], &token, false)).unwrap();
    let device = client.devices()[0].clone();
    let y = Buffer::from_strings(&client, &["", "aé"], &[2], &device, None).unwrap();
    assert_eq!(y.to_strings().unwrap(), ["", "aé"]);
    assert_eq!(a.worker.session_count(), 2);
}

// -- sessions own what their programs leave behind ----------------------------------

/// The `probe` language: its programs record the session they ran for (and
/// wait for the gate when their payload is `gate`); it records the sessions
/// it was told ended.
#[derive(Clone, Default)]
struct SessionProbe {
    ran: Arc<Mutex<Vec<SessionKey>>>,
    ended: Arc<Mutex<Vec<SessionKey>>>,
    gate: Arc<Mutex<Event>>,
}

impl LanguageExecutor for SessionProbe {
    fn load(&self, program: &Program) -> colocated_core::Result<Arc<dyn LoadedProgram>> {
        let (ran, gate) = (self.ran.clone(), self.gate.clone());
        let gated = program.payload == b"gate";
        Ok(Arc::new(move |ctx: &mut ExecutionContext<'_>| {
            ran.lock().unwrap().push(ctx.session());
            if gated {
                let event = gate.lock().unwrap().clone();
                event.wait()?;
            }
            Ok(())
        }))
    }

    fn session_ended(&self, session: SessionKey) {
        self.ended.lock().unwrap().push(session);
    }
}

/// A worker (one device) whose host runs `probe` programs, and its client.
fn probe_worker(
    token: &Token,
    options: impl FnOnce(&mut WorkerOptions),
) -> (Worker, Client, SessionProbe) {
    let client = client_with_threads(1, 2);
    let probe = SessionProbe::default();
    client.register_executor("probe", probe.clone()).unwrap();
    let mut opts = WorkerOptions::new(Some(token.clone()));
    options(&mut opts);
    (Worker::start(client.clone(), opts).unwrap(), client, probe)
}

fn probe_program(payload: &[u8], device: &colocated_core::Device) -> Program {
    Program {
        name: "probe".into(),
        language: "probe".into(),
        payload: payload.to_vec(),
        input_specs: vec![],
        output_specs: vec![],
        devices: vec![device.clone()],
        output_structure: vec![],
    }
}

#[test]
fn a_closed_session_is_ended_for_every_executor_and_so_are_those_open_at_shutdown() {
    let token = Token::generate().unwrap();
    let (worker, worker_client, probe) = probe_worker(&token, |_| {});
    // The worker's own client runs its programs in the local session.
    let local = worker_client
        .compile(
            probe_program(b"", &worker_client.devices()[0]),
            CompileOptions::default(),
        )
        .unwrap();
    local
        .execute(&[], &ExecuteOptions::default())
        .unwrap()
        .status
        .wait()
        .unwrap();
    assert_eq!(*probe.ran.lock().unwrap(), vec![SessionKey::LOCAL]);
    probe.ran.lock().unwrap().clear();

    // A controller that runs a program twice; its session's key.
    let controller = || {
        let client = Client::connect(&controller_options(&worker, &token)).unwrap();
        let program = client
            .compile(
                probe_program(b"", &client.devices()[0]),
                CompileOptions::default(),
            )
            .unwrap();
        for _ in 0..2 {
            let run = program.execute(&[], &ExecuteOptions::default()).unwrap();
            run.status.wait().unwrap();
        }
        let key = *probe.ran.lock().unwrap().last().unwrap();
        (client, program, key)
    };
    let mut keys = Vec::new();
    for n in 1..=2 {
        let (client, program, key) = controller();
        keys.push(key);
        assert!(probe.ended.lock().unwrap().len() < n);
        // Dropping the client closes its session (well before it would time
        // out, after 10 s).
        drop(program);
        drop(client);
        eventually("the worker closes the session", || {
            worker.session_count() == 0
        });
        eventually("the executor hears that the session ended", || {
            probe.ended.lock().unwrap().len() == n
        });
    }
    assert!(keys.iter().all(|k| !k.is_local()), "{keys:?}");
    assert_ne!(keys[0], keys[1], "each session has its own key");
    assert_eq!(*probe.ended.lock().unwrap(), keys);
    assert_eq!(
        *probe.ran.lock().unwrap(),
        vec![keys[0], keys[0], keys[1], keys[1]],
        "every program ran for its session"
    );
    // A worker that stops ends the sessions still open (and waits for that);
    // the local session never ends.
    let (_client, _program, open) = controller();
    keys.push(open);
    drop(local);
    worker.shutdown().unwrap();
    assert_eq!(*probe.ended.lock().unwrap(), keys);
}

#[test]
fn a_timed_out_session_is_ended_for_every_executor_once_its_programs_ran() {
    use colocated_core::transport::proto::worker_client::WorkerClient;
    use colocated_core::transport::proto::{
        ExecuteRequest, LoadExecutableRequest, OpenSessionRequest,
    };
    use colocated_core::transport::{SessionId, AUTHORIZATION, SESSION};

    let token = Token::generate().unwrap();
    let (worker, worker_client, probe) = probe_worker(&token, |o| {
        o.heartbeat_interval = Duration::from_millis(50);
        o.session_timeout = Duration::from_millis(300);
    });
    let serialized = |payload: &[u8]| {
        worker_client
            .compile(
                probe_program(payload, &worker_client.devices()[0]),
                CompileOptions::default(),
            )
            .unwrap()
            .serialize()
    };
    let executables = [serialized(b""), serialized(b"gate")];
    let held = probe.gate.lock().unwrap().clone();
    fn request<T>(token: &Token, message: T, session: Option<&str>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let metadata = request.metadata_mut();
        let bearer = format!("Bearer {}", token.expose());
        metadata.insert(AUTHORIZATION, bearer.parse().unwrap());
        if let Some(session) = session {
            metadata.insert(SESSION, session.parse().unwrap());
        }
        request
    }
    // A controller that opens a session, runs a quick program and one that
    // waits, and goes silent without closing the session (as if killed).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut rpc = WorkerClient::connect(format!("http://{}", worker.local_addr()))
            .await
            .unwrap();
        let opened = rpc
            .open_session(request(
                &token,
                OpenSessionRequest {
                    min_version: 1,
                    max_version: 2,
                    client_name: "silent".into(),
                    software_version: String::new(),
                },
                None,
            ))
            .await
            .unwrap()
            .into_inner();
        let id = SessionId::from_bytes(&opened.session_id)
            .unwrap()
            .to_string();
        for (handle, executable) in (1..).zip(executables) {
            rpc.load_executable(request(
                &token,
                LoadExecutableRequest {
                    handle,
                    executable: executable.into(),
                    controller_device_ids: Default::default(),
                },
                Some(&id),
            ))
            .await
            .unwrap();
            rpc.execute(request(
                &token,
                ExecuteRequest {
                    executable: handle,
                    inputs: vec![],
                    outputs: vec![],
                    stream: 1,
                },
                Some(&id),
            ))
            .await
            .unwrap();
        }
    });
    drop(runtime);
    eventually("both programs run", || probe.ran.lock().unwrap().len() == 2);
    let key = probe.ran.lock().unwrap()[0];
    assert!(!key.is_local());
    assert_eq!(*probe.ran.lock().unwrap(), vec![key, key]);
    eventually("the silent session times out", || {
        worker.session_count() == 0
    });
    // Not while a program of the session runs.
    std::thread::sleep(Duration::from_millis(200));
    assert!(probe.ended.lock().unwrap().is_empty());
    held.set(Ok(())).unwrap();
    eventually("the executor hears that the session ended", || {
        !probe.ended.lock().unwrap().is_empty()
    });
    assert_eq!(*probe.ended.lock().unwrap(), vec![key]);
}

#[test]
fn a_supervisor_refuses_old_controllers_and_reports_a_child_that_fails() {
    use colocated_core::transport::isolate::IsolateCommand;
    use colocated_core::transport::proto::worker_client::WorkerClient;
    use colocated_core::transport::proto::OpenSessionRequest;
    use colocated_core::transport::{AUTHORIZATION, REDIRECT_VERSION};

    let token = Token::generate().unwrap();
    let marks = std::env::temp_dir().join(format!("colocated-isolate-{}", std::process::id()));
    let _ = std::fs::remove_file(&marks);
    // A "session worker" that records its arguments and the mode of its token
    // file, then says something other than `listening on`.
    let script = format!(
        "echo \"$@\" > {0}; stat -c %a \"$4\" >> {0}; echo not a worker",
        marks.display()
    );
    let client = plain_client(1);
    let mut options = WorkerOptions::new(Some(token.clone()));
    options.isolate = Some(IsolateCommand {
        program: "sh".into(),
        args: vec!["-c".into(), script, "sh".into()],
    });
    let worker = Worker::start(client, options).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = runtime.block_on(async {
        let mut rpc = WorkerClient::connect(format!("http://{}", worker.local_addr()))
            .await
            .unwrap();
        let mut request = tonic::Request::new(OpenSessionRequest {
            min_version: 1,
            max_version: REDIRECT_VERSION - 1,
            client_name: "old".into(),
            software_version: String::new(),
        });
        let bearer = format!("Bearer {}", token.expose());
        request
            .metadata_mut()
            .insert(AUTHORIZATION, bearer.parse().unwrap());
        rpc.open_session(request).await.unwrap_err()
    });
    drop(runtime);
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("--isolate-sessions")
            && refused.message().contains("upgrade the controller"),
        "{}",
        refused.message()
    );
    assert!(!marks.exists(), "nothing starts for an old controller");

    let err = match colocated_core::session::RemoteSession::connect(&ConnectOptions::new(
        worker.local_addr().to_string(),
        Some(token.clone()),
    )) {
        Ok(_) => panic!("a session on a child that did not start"),
        Err(err) => err,
    };
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(err.message().contains("did not start"), "{err}");
    let recorded = std::fs::read_to_string(&marks).unwrap();
    let mut lines = recorded.lines();
    let args = lines.next().unwrap();
    assert!(
        args.starts_with("--listen 127.0.0.1:0 --token-file ")
            && args.ends_with(" --single-session"),
        "{args}"
    );
    assert_eq!(lines.next(), Some("600"), "the token file is private");
    let token_file = args.split(' ').nth(3).unwrap();
    assert!(
        !std::path::Path::new(token_file).exists(),
        "the token file is gone"
    );
    assert_eq!(worker.session_count(), 0);
    let _ = std::fs::remove_file(&marks);
    worker.shutdown().unwrap();
}

#[test]
fn closing_a_session_that_is_gone_succeeds_but_needs_the_token() {
    use colocated_core::transport::proto::CloseSessionRequest;

    let token = Token::generate().unwrap();
    let a = start_worker(&token, 1);
    // A session the worker no longer has: closed twice, or closed while the
    // worker stopped and ended it.
    let close = |token: &str| {
        let gone = Some("0123456789abcdef0123456789abcdef");
        raw_rpc(a.worker.local_addr(), async |mut rpc| {
            rpc.close_session(signed(CloseSessionRequest {}, token, gone))
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        })
    };
    close(token.expose()).unwrap();
    assert_eq!(
        close("not-the-token").unwrap_err(),
        tonic::Code::Unauthenticated
    );
}

#[test]
fn a_workers_health_says_its_version_devices_sessions_and_uptime_and_needs_the_token() {
    use colocated_core::session::{health, status_report};
    use colocated_core::transport::VERSION;

    let token = Token::generate().unwrap();
    let a = start_worker(&token, 2);
    let address = a.worker.local_addr().to_string();
    let mut ask = ConnectOptions::new(address.clone(), Some(token.clone()));
    ask.timeout = Duration::from_secs(5);
    let idle = health(&ask).unwrap();
    assert_eq!(idle.version, VERSION);
    assert_eq!(idle.devices, ["cpu", "cpu"]);
    assert_eq!(idle.sessions, 0);
    assert!(idle.protocol.0 <= idle.protocol.1);
    let client = Client::connect(&options(&[&a], &token, false)).unwrap();
    let busy = health(&ask).unwrap();
    assert_eq!(busy.sessions, 1);
    assert!(busy.uptime >= idle.uptime);
    let line = busy.to_string();
    for part in [
        address.as_str(),
        &format!("colocated {VERSION}"),
        "2 cpu devices",
        "native",
        "1 session ",
        "up ",
    ] {
        assert!(line.contains(part), "{part:?} in {line:?}");
    }
    // A wrong token learns nothing.
    let stranger = ConnectOptions::new(address.clone(), Some(Token::new("wrong").unwrap()));
    assert_eq!(
        health(&stranger).unwrap_err().code(),
        ErrorCode::Unauthenticated
    );
    // `colocated status`: a line per worker, in order; one that does not
    // answer says why, and the report says not all did.
    let nobody = "127.0.0.1:1".to_string();
    let (report, all) = status_report(&[address.clone(), nobody.clone()], &ask);
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), 2, "{report}");
    assert!(lines[0].starts_with(&address), "{report}");
    assert!(
        lines[1].starts_with(&format!("{nobody}  unavailable")),
        "{report}"
    );
    assert!(!all);
    assert!(status_report(std::slice::from_ref(&address), &ask).1);
    drop(client);
}

#[test]
fn a_controller_and_a_worker_of_different_releases_refuse_each_other_naming_both() {
    use colocated_core::transport::proto::OpenSessionRequest;
    use colocated_core::transport::{versions_compatible, VERSION};

    assert!(versions_compatible("0.1.0", "0.1.7"));
    assert!(versions_compatible("1.2.3", "1.2.0-rc1"));
    assert!(!versions_compatible("0.1.0", "0.2.0"));
    assert!(!versions_compatible("1.0.0", "2.0.0"));
    assert!(!versions_compatible("dev", "0.1.0"));
    assert!(versions_compatible("dev", "dev"));

    let token = Token::generate().unwrap();
    let client = plain_client(1);
    let mut worker_options = WorkerOptions::new(Some(token.clone()));
    worker_options.software_version = "0.99.0".into();
    let worker = Worker::start(client, worker_options).unwrap();
    // This controller refuses the worker.
    let err = Client::connect(&controller_options(&worker, &token)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{err}");
    for part in ["0.99.0", VERSION, "version mismatch"] {
        assert!(err.message().contains(part), "{part:?} in {err}");
    }
    // ... and closes the session it opened there.
    eventually("the refused session is closed", || {
        worker.session_count() == 0
    });
    // The worker refuses a controller of another release.
    let future = OpenSessionRequest {
        min_version: 1,
        max_version: 3,
        client_name: "future".into(),
        software_version: "7.0.0".into(),
    };
    let refused = raw_rpc(worker.local_addr(), async |mut rpc| {
        rpc.open_session(signed(future, token.expose(), None))
            .await
            .map(|_| ())
            .map_err(|s| (s.code(), s.message().to_string()))
    });
    let (code, message) = refused.unwrap_err();
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert!(
        message.contains("7.0.0") && message.contains("0.99.0"),
        "{message}"
    );
    assert_eq!(worker.session_count(), 0);
}

#[test]
fn compiling_for_workers_loads_on_all_at_once_and_a_refusal_unloads_the_others() {
    let token = Token::generate().unwrap();
    // Workers 0 and 2 have `only_some`; worker 1 does not.
    let workers: Vec<Worker> = (0..3)
        .map(|i| {
            let client = client_with_threads(1, 1);
            if i != 1 {
                client
                    .register_native_function("only_some", |_ctx| Ok(()))
                    .unwrap();
            }
            common::start_worker(client, &token, |_| {})
        })
        .collect();
    let mut connect = ConnectOptions::new(String::new(), Some(token.clone()));
    connect.timeout = Duration::from_secs(5);
    let client = Client::connect(&ClusterOptions::uniform(
        workers.iter().map(|w| w.local_addr().to_string()),
        &connect,
        false,
        ClientOptions::default(),
    ))
    .unwrap();
    let program = Program::native("only_some", vec![], vec![], client.devices().to_vec());
    let err = client
        .compile(program, CompileOptions::default())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(
        err.message().contains(&workers[1].local_addr().to_string()),
        "{err}"
    );
    // The workers that loaded it unload it again.
    eventually("the loaded parts are unloaded", || {
        workers.iter().all(|w| w.executable_count() == 0)
    });
    drop(client);
}

/// A deletion waits for the next operation to ride with, but not for long:
/// with nothing else sent, the worker frees the buffer within milliseconds.
#[test]
fn a_deleted_buffer_leaves_the_worker_without_a_further_operation() {
    let (a, client, device) = one_worker();
    let buffer =
        Buffer::from_bytes(&client, &i32_bytes(&[1, 2, 3]), DType::I32, &[3], &device).unwrap();
    buffer.ready_event().wait().unwrap();
    assert_eq!(a.worker.buffer_count(), 1);
    drop(buffer);
    eventually("the worker freed the buffer", || {
        a.worker.buffer_count() == 0
    });
}

/// Streams of a session run concurrently on a worker, even when a program
/// that was quick before now waits for a program of another stream: the
/// thread that reads the session's operations (a lane's) runs programs
/// itself, and another takes over the reading when one runs long (else the
/// other stream's program could not arrive).
#[test]
fn a_program_waiting_for_another_streams_program_on_a_worker_finishes() {
    let token = Token::generate().unwrap();
    let client = client_with_threads(1, 2);
    let flag = Arc::new((Mutex::new(true), std::sync::Condvar::new()));
    let waits = flag.clone();
    client
        .register_native_function("wait_for_flag", move |_ctx| {
            let (set, changed) = &*waits;
            let mut set = set.lock().unwrap();
            while !*set {
                set = changed.wait(set).unwrap();
            }
            Ok(())
        })
        .unwrap();
    let sets = flag.clone();
    client
        .register_native_function("set_flag", move |_ctx| {
            let (set, changed) = &*sets;
            *set.lock().unwrap() = true;
            changed.notify_all();
            Ok(())
        })
        .unwrap();
    let worker = common::start_worker(client, &token, |_| {});
    let controller = Client::connect(&controller_options(&worker, &token)).unwrap();
    let device = controller.devices()[0].clone();
    let compile = |name: &str| {
        compile_native(
            &controller,
            name,
            vec![],
            vec![],
            std::slice::from_ref(&device),
        )
    };
    let (wait, set) = (compile("wait_for_flag"), compile("set_flag"));
    // Runs that finish at once while the flag is up (a worker must not
    // take the program for one it can run on the thread that reads the
    // session's operations, nor, after a streak of them, for one it may
    // run under its longer alarm alone).
    for _ in 0..20 {
        let run = wait.execute(&[], &ExecuteOptions::default()).unwrap();
        run.status.wait_timeout(Duration::from_secs(20)).unwrap();
    }
    *flag.0.lock().unwrap() = false;
    let (first, second) = (controller.create_stream(), controller.create_stream());
    let waiting = wait
        .execute(
            &[],
            &ExecuteOptions {
                stream: Some(first),
            },
        )
        .unwrap();
    let setting = set
        .execute(
            &[],
            &ExecuteOptions {
                stream: Some(second),
            },
        )
        .unwrap();
    setting
        .status
        .wait_timeout(Duration::from_secs(20))
        .unwrap();
    waiting
        .status
        .wait_timeout(Duration::from_secs(20))
        .unwrap();
}

/// What an answer runs may wait for another worker's answer: the thread
/// that reads the lanes hands the reading over, and the other answer still
/// arrives.
#[test]
fn a_completion_that_waits_for_another_workers_answer_does_not_hold_it_up() {
    let (_, a, b, client) = two_workers(1, 1, false);
    let on_a = compile_on(&client, "gate", &client.devices()[0]);
    let on_b = compile_on(&client, "gate", &client.devices()[1]);
    let (gate_a, gate_b) = (
        a.gate.lock().unwrap().clone(),
        b.gate.lock().unwrap().clone(),
    );
    let run_a = on_a.execute(&[], &ExecuteOptions::default()).unwrap();
    let run_b = on_b.execute(&[], &ExecuteOptions::default()).unwrap();
    let (entered, waits) = std::sync::mpsc::channel();
    let (done, finished) = std::sync::mpsc::channel();
    let b_status = run_b.status.clone();
    run_a.status.on_ready(move |_| {
        entered.send(()).unwrap();
        done.send(b_status.wait_timeout(Duration::from_secs(20)))
            .unwrap();
    });
    gate_a.set(Ok(())).unwrap();
    waits.recv_timeout(Duration::from_secs(20)).unwrap();
    // Worker A's answer is being taken; worker B's comes now.
    gate_b.set(Ok(())).unwrap();
    finished
        .recv_timeout(Duration::from_secs(30))
        .unwrap()
        .unwrap();
}

/// A thread of a controller that waits for an event reads the lanes' answers
/// itself; whatever sets the event wakes it, answers or not, and a deadline
/// still ends the wait.
#[test]
fn a_thread_waiting_while_it_reads_lanes_wakes_for_any_event_and_its_deadline() {
    let (a, client, device) = one_worker();
    // The controller reads lanes from now on.
    let count = compile_on(&client, "count", &device);
    let run = count.execute(&[], &ExecuteOptions::default()).unwrap();
    run.status.wait_timeout(common::PATIENCE).unwrap();
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
    // An event no answer sets: another thread does.
    let plain = Event::new();
    let setter = plain.clone();
    let set_later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        setter.set(Ok(())).unwrap();
    });
    // Without a deadline: only the setter can end the wait.
    let (waited, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || waited.send(plain.wait()).unwrap());
    done.recv_timeout(common::PATIENCE).unwrap().unwrap();
    set_later.join().unwrap();
    // Nothing sets this one.
    let never = Event::new();
    let start = std::time::Instant::now();
    let err = never.wait_timeout(Duration::from_millis(100)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded, "{err}");
    assert!(start.elapsed() >= Duration::from_millis(100));
    // And answers still arrive.
    let run = count.execute(&[], &ExecuteOptions::default()).unwrap();
    run.status.wait_timeout(common::PATIENCE).unwrap();
    assert_eq!(a.runs.load(Ordering::SeqCst), 2);
}

/// A callback of the user's never runs on a thread that waits for an event
/// (which may hold what the callback needs), even when that thread takes the
/// answer that completes the callback's event.
#[test]
fn a_user_callback_does_not_run_on_the_thread_that_waits() {
    let (a, client, device) = one_worker();
    let gated = compile_on(&client, "gate", &device);
    let here = std::thread::current().id();
    for _ in 0..20 {
        let gate = Event::new();
        *a.gate.lock().unwrap() = gate.clone();
        let run = gated.execute(&[], &ExecuteOptions::default()).unwrap();
        let (ran_on, on) = std::sync::mpsc::channel();
        // Pending until the gate opens.
        run.status.on_ready(move |_| {
            ran_on.send(std::thread::current().id()).unwrap();
        });
        // Opened once this thread waits (and reads).
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            gate.set(Ok(())).unwrap();
        });
        run.status.wait_timeout(common::PATIENCE).unwrap();
        opener.join().unwrap();
        let thread = on.recv_timeout(common::PATIENCE).unwrap();
        assert_ne!(thread, here, "the callback ran on the waiting thread");
    }
}

/// A worker that starts late does not cost the others their sessions: each
/// session starts its heartbeats as soon as its worker is reached, though
/// the client waits for the late one longer than the others' session
/// timeout.
#[test]
fn a_worker_that_starts_late_leaves_the_others_sessions_alive() {
    let token = Token::generate().unwrap();
    let early = common::start_worker(client_with_threads(1, 1), &token, |o| {
        o.heartbeat_interval = Duration::from_millis(100);
        o.session_timeout = Duration::from_millis(500);
    });
    // The late worker's address: a free port, listened on later.
    let late_address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let late_token = token.clone();
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        common::start_worker(client_with_threads(1, 1), &late_token, |o| {
            o.listen = late_address;
        })
    });
    let mut connect = ConnectOptions::new(String::new(), Some(token.clone()));
    connect.timeout = Duration::from_secs(20);
    let client = Client::connect(&ClusterOptions::uniform(
        [early.local_addr().to_string(), late_address.to_string()],
        &connect,
        false,
        ClientOptions::default(),
    ))
    .unwrap();
    let late = starter.join().unwrap();
    let early_host = client
        .hosts()
        .iter()
        .find(|h| h.name() == early.local_addr().to_string())
        .map(|h| h.index())
        .expect("the early worker's host");
    // Past the early worker's session timeout again: its session lives.
    std::thread::sleep(Duration::from_millis(700));
    assert_round_trips(&client, 7, &client.devices()[0]);
    assert_eq!(
        client.host_stats(early_host).unwrap().sessions_lost,
        0,
        "the early worker's session was lost while the client waited for the late one"
    );
    drop(client);
    drop(late);
}
