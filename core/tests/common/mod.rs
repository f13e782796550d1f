//! Helpers shared by the integration tests (each test file uses a subset).
#![allow(dead_code)]

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use colocated_core::*;

/// How long a test waits for something that should happen promptly.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A local client with `devices` CPU devices and four executor threads.
pub fn client(devices: usize) -> Client {
    client_with_threads(devices, 4)
}

/// A local client with `devices` CPU devices and `threads` executor threads.
pub fn client_with_threads(devices: usize, threads: usize) -> Client {
    Client::new_local(ClientOptions {
        num_cpu_devices: Some(devices),
        executor_threads: Some(threads),
        ..Default::default()
    })
    .expect("a local client")
}

/// A local client with `devices` CPU devices and the default number of
/// executor threads.
pub fn plain_client(devices: usize) -> Client {
    Client::new_local(ClientOptions {
        num_cpu_devices: Some(devices),
        ..Default::default()
    })
    .expect("a local client")
}

/// Starts a worker serving `client` to controllers that hold `token`, with
/// the default worker options as `options` changes them.
pub fn start_worker(
    client: Client,
    token: &colocated_core::transport::Token,
    options: impl FnOnce(&mut colocated_core::worker::WorkerOptions),
) -> colocated_core::worker::Worker {
    let mut opts = colocated_core::worker::WorkerOptions::new(Some(token.clone()));
    options(&mut opts);
    colocated_core::worker::Worker::start(client, opts).expect("a worker")
}

/// The options that connect to `worker` with `token` and a 5 s timeout.
pub fn connect_options(
    worker: &colocated_core::worker::Worker,
    token: &colocated_core::transport::Token,
) -> colocated_core::session::ConnectOptions {
    let mut options = colocated_core::session::ConnectOptions::new(
        worker.local_addr().to_string(),
        Some(token.clone()),
    );
    options.timeout = Duration::from_secs(5);
    options
}

/// A session of `worker`, connected with `token` and a 5 s timeout.
pub fn connect_session(
    worker: &colocated_core::worker::Worker,
    token: &colocated_core::transport::Token,
) -> colocated_core::session::RemoteSession {
    colocated_core::session::RemoteSession::connect(&connect_options(worker, token))
        .expect("a session of the worker")
}

/// Registers the native function `name`, which counts its runs in `runs`.
pub fn register_counter(client: &Client, name: &str, runs: &Arc<std::sync::atomic::AtomicU64>) {
    let counter = runs.clone();
    client
        .register_native_function(name, move |_ctx| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .expect("register a counter");
}

/// Asserts that `result` failed with `code` and a message containing `fragment`.
#[track_caller]
pub fn assert_error<T: Debug>(result: Result<T>, code: ErrorCode, fragment: &str) -> Error {
    match result {
        Ok(v) => panic!("expected {code} containing {fragment:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.code(), code, "unexpected code in {e}");
            assert!(
                e.message().contains(fragment),
                "message of {e} lacks {fragment:?}"
            );
            e
        }
    }
}

/// Little-endian bytes of `values`.
pub fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `values` decoded from little-endian bytes.
pub fn i32_values(bytes: &[u8]) -> Vec<i32> {
    assert_eq!(bytes.len() % 4, 0, "not a whole number of int32");
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Little-endian bytes of `values`.
pub fn u64_bytes(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Names as owned strings.
pub fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A spec of `dims` and `dtype` on `device` alone.
pub fn spec_on(dims: &[i64], dtype: DType, device: &Device) -> ArraySpec {
    ArraySpec::new(
        dims.to_vec(),
        dtype,
        Sharding::single_device(device.clone()),
    )
    .expect("a single-device spec")
}

/// An int32 array of `values` in `spec`.
pub fn i32_array(client: &Client, values: &[i32], spec: &ArraySpec) -> Array {
    Array::from_host_bytes(client, &i32_bytes(values), spec.clone()).expect("an int32 array")
}

/// A sharding over a mesh of the first `prod(mesh)` devices of `client`.
pub fn mesh_sharding(
    client: &Client,
    mesh: &[usize],
    axis_names: &[&str],
    partition: Vec<Vec<usize>>,
) -> Sharding {
    let n: usize = mesh.iter().product();
    Sharding::named(
        client.devices()[..n].to_vec(),
        mesh.to_vec(),
        names(axis_names),
        partition,
    )
    .expect("a valid named sharding")
}

/// The `(done, total)` reports a progress callback was given, in order.
pub type ProgressLog = Arc<std::sync::Mutex<Vec<(u64, u64)>>>;

/// A progress callback that records every report, and its record.
pub fn progress_log() -> (ProgressLog, Progress) {
    let log = ProgressLog::default();
    let sink = log.clone();
    let progress: Progress = Arc::new(move |done, total| sink.lock().unwrap().push((done, total)));
    (log, progress)
}

/// Polls `condition` until it holds or `PATIENCE` passes.
#[track_caller]
pub fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Something that counts how many times it was dropped.
pub struct DropCounter(pub Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Registers `counted`: `add_one_i32` (see [`add_one_shards`]) that counts
/// its runs in `runs`.
pub fn register_counted(client: &Client, runs: &std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let runs = runs.clone();
    client
        .register_native_function("counted", move |ctx| {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            add_one_shards(ctx)
        })
        .expect("register counted");
}

/// Registers `ask`: calls the controller's host callback 0 with "ping",
/// and fails unless it answers "pong".
pub fn register_ask(client: &Client) {
    client
        .register_native_function("ask", |ctx| {
            let answer = ctx.call_host_callback(0, b"ping")?;
            match answer.as_slice() {
                b"pong" => Ok(()),
                _ => Err(colocated_core::Error::internal("not a pong")),
            }
        })
        .expect("register ask");
}

/// Registers the native function `name`: it produces nothing and returns only when
/// `gate` is set (with the gate's result). Executions queued behind it on the same
/// stream stay in flight until then.
///
/// Never wait on an event of work queued behind the gate before setting it: the
/// waiting thread may run the gate inline and block.
pub fn register_gate(client: &Client, name: &str, gate: &Event) {
    let gate = gate.clone();
    client
        .register_native_function(name, move |_ctx| gate.wait())
        .expect("register the gate");
}

/// Compiles the native `function` from `inputs` to `outputs` over
/// `devices` (panics, naming the function, if that fails).
pub fn compile_native(
    client: &Client,
    function: &str,
    inputs: Vec<ArraySpec>,
    outputs: Vec<ArraySpec>,
    devices: &[Device],
) -> LoadedExecutable {
    client
        .compile(
            Program::native(function, inputs, outputs, devices.to_vec()),
            CompileOptions::default(),
        )
        .unwrap_or_else(|e| panic!("compile {function}: {e}"))
}

/// int32[8] split along 'x' over the client's first four devices.
pub fn x_spec(client: &Client) -> ArraySpec {
    let sharding = mesh_sharding(client, &[4], &["x"], vec![vec![0]]);
    ArraySpec::new(vec![8], DType::I32, sharding).expect("a spec split along x")
}

/// Compiles the native `function` over the first four devices of `client`,
/// from and to [`x_spec`]: the executable and that spec.
pub fn compile_over_x(client: &Client, function: &str) -> (LoadedExecutable, ArraySpec) {
    let spec = x_spec(client);
    let exe = compile_native(
        client,
        function,
        vec![spec.clone()],
        vec![spec.clone()],
        &client.devices()[..4],
    );
    (exe, spec)
}

/// Registers `add_one_i32` on `client` and compiles it over the first four
/// devices, from and to [`x_spec`]: the executable and that spec.
pub fn add_one_over_x(client: &Client) -> (LoadedExecutable, ArraySpec) {
    register_add_one(client);
    compile_over_x(client, "add_one_i32")
}

/// Compiles a program with no inputs or outputs calling `name` on `device`.
pub fn compile_nullary(client: &Client, name: &str, device: &Device) -> LoadedExecutable {
    compile_native(client, name, vec![], vec![], std::slice::from_ref(device))
}

/// Registers `add_one_i32`: every output shard is its input shard plus one (int32),
/// with one input and one output of the same sharding.
pub fn register_add_one(client: &Client) {
    client
        .register_native_function("add_one_i32", add_one_shards)
        .expect("register add_one_i32");
}

/// The body of `add_one_i32`: output shard i is input shard i plus one.
pub fn add_one_shards(ctx: &mut colocated_core::ExecutionContext) -> colocated_core::Result<()> {
    set_i32_outputs(ctx, |ctx, i, _shard| {
        let x = i32_values(&ctx.inputs()[i].to_host_vec()?);
        Ok(x.iter().map(|v| v + 1).collect())
    })
}

/// Sets every output shard `i` of `ctx` to the int32 values `values` gives
/// for it (from the context, `i` and the shard's place and shape).
pub fn set_i32_outputs(
    ctx: &mut colocated_core::ExecutionContext,
    values: impl Fn(&colocated_core::ExecutionContext, usize, &OutputShard) -> Result<Vec<i32>>,
) -> Result<()> {
    let shards = ctx.output_shards().to_vec();
    for (i, shard) in shards.iter().enumerate() {
        let y = values(ctx, i, shard)?;
        set_output_bytes(ctx, i, &i32_bytes(&y))?;
    }
    Ok(())
}

/// Sets output shard `i` of `ctx` to a buffer of `bytes` with the shard's
/// dtype, dims and device.
pub fn set_output_bytes(
    ctx: &mut colocated_core::ExecutionContext,
    i: usize,
    bytes: &[u8],
) -> Result<()> {
    let shard = ctx.output_shards()[i].clone();
    let out = Buffer::from_bytes(ctx.client(), bytes, shard.dtype, &shard.dims, &shard.device)?;
    ctx.set_output(i, out)
}

/// A controller of `workers` alone (no local devices), each connected with
/// `token` and a 5 s timeout.
pub fn connect_workers(
    workers: &[&colocated_core::worker::Worker],
    token: &colocated_core::transport::Token,
) -> Client {
    let options = ClusterOptions {
        workers: workers.iter().map(|w| connect_options(w, token)).collect(),
        include_local: false,
        local: ClientOptions::default(),
    };
    Client::connect(&options).expect("a controller of the workers")
}

/// XLA's CPU PJRT plugin: `COLOCATED_TEST_PJRT_PLUGIN` (set by `make test`),
/// else the one `make` installs into `build/venv`. `None` outside CI when
/// neither exists; in CI (`CI` set) a missing plugin fails the test.
pub fn pjrt_plugin() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("COLOCATED_TEST_PJRT_PLUGIN") {
        return Some(p.into());
    }
    let venv_lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/venv/lib");
    let found = std::fs::read_dir(venv_lib).ok().and_then(|entries| {
        entries.flatten().find_map(|e| {
            let p = e
                .path()
                .join("site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so");
            p.exists().then_some(p)
        })
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "XLA's CPU PJRT plugin is missing: run `make venv`"
        );
        eprintln!("skipped: XLA's CPU PJRT plugin is not installed (run `make venv`)");
    }
    found
}

/// A local client with `cpu` CPU devices and `plugin` devices of XLA's CPU
/// PJRT plugin (`None` when the plugin is not installed; see [`pjrt_plugin`]).
pub fn pjrt_client(cpu: usize, plugin: i64) -> Option<Client> {
    let path = pjrt_plugin()?;
    Some(
        Client::new_local(ClientOptions {
            num_cpu_devices: Some(cpu),
            executor_threads: Some(4),
            pjrt: Some(PjrtOptions {
                plugin: path,
                options: vec![("cpu_device_count".into(), PjrtValue::Int64(plugin))],
            }),
            ..Default::default()
        })
        .expect("a client with XLA's CPU plugin"),
    )
}
