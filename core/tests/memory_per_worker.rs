//! What a connected worker costs the controller in memory: at most 100 KiB
//! of heap while idle, at most 256 KiB while active (its control stream
//! used, one call in flight). It guards the heap a session holds: a read
//! buffer per lane (64 KiB each, once), the connections' buffers, the
//! state of the session and of its calls. (What the allocator keeps for
//! threads that exited, which a count of live bytes does not see, is in the
//! resident memory that `cargo bench --bench scale` reports.)
//!
//! The workers are real (core's `Worker`, as `colocated worker` runs it), in
//! a process of their own: this test's executable started again in the
//! `workers` role, so that only the controller's heap is counted here. It
//! counts the bytes the allocator hands out and holds (no timing, no
//! resident memory, which depends on the allocator's whims).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    Program, Sharding,
};

/// The system allocator, counting the bytes it holds for this process.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to the system allocator as it came.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = std::alloc::System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: std::alloc::Layout) {
        std::alloc::System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        let q = std::alloc::System.realloc(p, layout, size);
        if !q.is_null() {
            LIVE.fetch_add(size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ROLE: &str = "COLOCATED_MEMORY_TEST_ROLE";
const TOKEN: &str = "COLOCATED_MEMORY_TEST_TOKEN";
/// Workers measured.
const WORKERS: usize = 32;
/// The bounds, per connected worker.
const IDLE_BYTES: f64 = 100.0 * 1024.0;
const ACTIVE_BYTES: f64 = 256.0 * 1024.0;

/// Role `workers`: `WORKERS` + 2 workers with one CPU device each, whose
/// native function `touch` passes its input through and `wait` sleeps 2 s
/// first; prints their addresses, and stops when stdin closes.
fn serve_workers() {
    let token = Token::new(std::env::var(TOKEN).expect("token")).expect("token");
    let mut workers = Vec::new();
    for _ in 0..WORKERS + 2 {
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: Some(1),
            executor_threads: Some(1),
            ..Default::default()
        })
        .expect("client");
        for (name, pause) in [("touch", 0), ("wait", 2000)] {
            client
                .register_native_function(name, move |ctx| {
                    std::thread::sleep(Duration::from_millis(pause));
                    for i in 0..ctx.output_shards().len() {
                        let input = ctx.inputs()[i].clone();
                        ctx.set_output(i, input)?;
                    }
                    Ok(())
                })
                .expect("register");
        }
        workers
            .push(Worker::start(client, WorkerOptions::new(Some(token.clone()))).expect("worker"));
    }
    let addresses: Vec<String> = workers.iter().map(|w| w.local_addr().to_string()).collect();
    println!("{}", addresses.join(" "));
    std::io::stdout().flush().ok();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

fn connect(addresses: &[String], token: &Token) -> Client {
    let mut options = ConnectOptions::new(String::new(), Some(token.clone()));
    options.timeout = Duration::from_secs(60);
    Client::connect(&ClusterOptions::uniform(
        addresses.to_vec(),
        &options,
        false,
        ClientOptions::default(),
    ))
    .expect("connect")
}

/// A program named `name` over an array sharded across `client`'s devices.
fn program(client: &Client, name: &str) -> (colocated_core::LoadedExecutable, Array) {
    let devices = client.devices().to_vec();
    let n = devices.len();
    let sharding = Sharding::named(devices.clone(), vec![n], vec!["x".into()], vec![vec![0]])
        .expect("sharding");
    let spec = ArraySpec::new(vec![n as i64], DType::I32, sharding).expect("spec");
    let exe = client
        .compile(
            Program::native(name, vec![spec.clone()], vec![spec.clone()], devices),
            CompileOptions::default(),
        )
        .expect("compile");
    let x = Array::from_host_bytes(client, &vec![0u8; 4 * n], spec).expect("put");
    x.ready_event().wait().expect("ready");
    (exe, x)
}

fn run(exe: &colocated_core::LoadedExecutable, x: &Array) {
    exe.execute(std::slice::from_ref(x), &ExecuteOptions::default())
        .expect("execute")
        .status
        .wait()
        .expect("run");
}

fn heap() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("workers") {
        return serve_workers();
    }
    let token = Token::generate().expect("token");
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .env(ROLE, "workers")
        .env(TOKEN, token.expose())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the workers");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("addresses");
    let addresses: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    assert_eq!(addresses.len(), WORKERS + 2, "{line}");

    // A client of two workers pays the process's one-time costs first.
    let warm = connect(&addresses[WORKERS..], &token);
    let (warm_exe, warm_x) = program(&warm, "touch");
    run(&warm_exe, &warm_x);

    let before = heap();
    let client = connect(&addresses[..WORKERS], &token);
    std::thread::sleep(Duration::from_millis(200));
    let idle = (heap() - before) / WORKERS as f64;

    let (exe, x) = program(&client, "touch");
    for _ in 0..3 {
        run(&exe, &x);
    }
    let (wait, y) = program(&client, "wait");
    let in_flight = wait
        .execute(std::slice::from_ref(&y), &ExecuteOptions::default())
        .expect("execute");
    std::thread::sleep(Duration::from_millis(200));
    let active = (heap() - before) / WORKERS as f64;
    in_flight.status.wait().expect("run");

    println!(
        "memory per connected worker: {:.1} KiB idle (at most {:.0}), {:.1} KiB active (at most {:.0})",
        idle / 1024.0,
        IDLE_BYTES / 1024.0,
        active / 1024.0,
        ACTIVE_BYTES / 1024.0
    );
    drop((exe, x, wait, y, client, warm_exe, warm_x, warm));
    drop(child.stdin.take());
    let _ = child.wait();
    assert!(
        idle <= IDLE_BYTES,
        "an idle connected worker costs {:.1} KiB of the controller's heap; at most {:.0} KiB",
        idle / 1024.0,
        IDLE_BYTES / 1024.0
    );
    assert!(
        active <= ACTIVE_BYTES,
        "an active connected worker costs {:.1} KiB of the controller's heap; at most {:.0} KiB",
        active / 1024.0,
        ACTIVE_BYTES / 1024.0
    );
}
