//! A controller and N worker processes on loopback (one CPU device each): how
//! connecting, compiling, the controller's memory and idle CPU, and a fan-out
//! execution grow with N, each beside the same-run floor of raw TCP: a 1-byte
//! ping-pong to N echo processes at once.
//!
//! The workers and echo servers are this benchmark's own executable started
//! again in another role (`COLOCATED_SCALE_ROLE`), so every figure is of real
//! processes and sockets: a worker is core's `Worker`, as `colocated worker`
//! runs it, with the native function the fan-out calls registered.
//!
//! The fan-out and its two floors take turns, a tenth of the runs at a
//! time, so that each sees the same drift of the machine's load.
//!
//! `CPU/host` is the controller's CPU time per host per fan-out call: what
//! sizing thousands of hosts on paper starts from. `all CPU/host` adds the
//! workers' (every thread of their processes), and `TCP all/host` is the
//! same for the raw TCP fan-out (the controller's and the echo processes'):
//! at large N a small machine is busy all the time, and the fan-out takes
//! about the CPU time of all processes over the number of cores.
//!
//! A second floor, `TCP, hand-offs`, runs the same ping-pong through the
//! thread structure a call takes: the caller hands the fan-out to a network
//! thread, which sends, reads the answers and wakes the caller; each echo
//! process reads on one thread, hands the byte to an executor thread, which
//! hands it back to a writer thread. It is what the hand-offs cost on this
//! machine without HTTP/2, tokio or protobuf: the rest of the fan-out's time
//! is the per-message cost of the stack.
//!
//! `COLOCATED_SCALE_N` (comma-separated) picks the sizes; the default is
//! 1, 2, 4, 8, 16, 64, 256. `COLOCATED_SCALE_IDLE_SECS` is how long idle CPU is
//! measured (default 7: two idle heartbeat periods).
//! `COLOCATED_SCALE_FLOORS=0` leaves the TCP floors out (to profile the
//! fan-out alone).
//!
//! Targets (issue: remote speed): connect and compile in parallel (about one
//! round trip, not N); fan-out execute + await <= 2x the raw TCP fan-out;
//! idle controller CPU at 256 hosts <= 1% of a core. The machine, not the
//! design, bounds absolute figures at large N on a small VM: compare with the
//! floor of the same run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{
    ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    Program, Sharding,
};

mod sim;
mod simulated;

/// mimalloc (as `libcolocated` and the SDKs use), counting the bytes it
/// holds for this process: the heap figures of the simulated table.
struct Counting;

static LIVE_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: every call goes to mimalloc as it came; the counter only adds.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = mimalloc::MiMalloc.alloc(layout);
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = mimalloc::MiMalloc.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: std::alloc::Layout) {
        mimalloc::MiMalloc.dealloc(p, layout);
        LIVE_BYTES.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        let q = mimalloc::MiMalloc.realloc(p, layout, size);
        if !q.is_null() {
            LIVE_BYTES.fetch_add(
                size as isize - layout.size() as isize,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        q
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations this process made so far.
fn allocations() -> u64 {
    ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Bytes of heap this process holds now.
fn heap_bytes() -> f64 {
    LIVE_BYTES.load(std::sync::atomic::Ordering::Relaxed) as f64
}

const ROLE: &str = "COLOCATED_SCALE_ROLE";
const TOKEN: &str = "COLOCATED_SCALE_TOKEN";

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Role `worker`: a worker with one CPU device and the native function every
/// program here runs; prints its address, and stops when stdin closes (when
/// the benchmark ends, however it ends).
fn serve_worker() {
    let token = Token::new(std::env::var(TOKEN).expect("token")).expect("token");
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(1),
        executor_threads: Some(1),
        ..Default::default()
    })
    .expect("client");
    client
        .register_native_function("touch", |ctx| {
            // Output shard i: input shard i (no copy).
            for i in 0..ctx.output_shards().len() {
                let input = ctx.inputs()[i].clone();
                ctx.set_output(i, input)?;
            }
            Ok(())
        })
        .expect("register");
    let worker = Worker::start(client, WorkerOptions::new(Some(token))).expect("worker");
    println!("listening on {}", worker.local_addr());
    std::io::stdout().flush().ok();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let _ = worker.shutdown();
}

/// Role `echo`: echoes single bytes on one connection; prints its address.
/// With `relay`, each byte crosses two thread hand-offs first, as a call does
/// on a worker (reader -> executor -> writer).
fn serve_echo(relay: bool) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    println!("listening on {}", listener.local_addr().expect("addr"));
    std::io::stdout().flush().ok();
    // Ends with the benchmark: its stdin closes.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let (mut s, _) = listener.accept().expect("accept");
    s.set_nodelay(true).ok();
    let mut b = [0u8; 1];
    if relay {
        let (to_executor, executor) = std::sync::mpsc::channel::<u8>();
        let (to_writer, writer) = std::sync::mpsc::channel::<u8>();
        std::thread::spawn(move || {
            for byte in executor {
                if to_writer.send(byte).is_err() {
                    break;
                }
            }
        });
        let mut out = s.try_clone().expect("clone");
        std::thread::spawn(move || {
            for byte in writer {
                if out.write_all(&[byte]).is_err() {
                    break;
                }
            }
        });
        while s.read_exact(&mut b).is_ok() {
            if to_executor.send(b[0]).is_err() {
                break;
            }
        }
        return;
    }
    while s.read_exact(&mut b).is_ok() {
        if s.write_all(&b).is_err() {
            break;
        }
    }
}

/// `n` processes of this executable in `role`, and the address each prints.
fn spawn(role: &str, n: usize, token: &Token) -> (Vec<Child>, Vec<String>) {
    let exe = std::env::current_exe().expect("exe");
    let mut children: Vec<Child> = (0..n)
        .map(|_| {
            Command::new(&exe)
                .env(ROLE, role)
                .env(TOKEN, token.expose())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let addresses = children
        .iter_mut()
        .map(|child| {
            let mut line = String::new();
            BufReader::new(child.stdout.take().expect("stdout"))
                .read_line(&mut line)
                .expect("address");
            line.trim()
                .strip_prefix("listening on ")
                .expect("a `listening on` line")
                .to_string()
        })
        .collect();
    (children, addresses)
}

fn stop(children: Vec<Child>) {
    for mut child in children {
        drop(child.stdin.take());
        let _ = child.wait();
    }
}

/// Seconds of `runs` pings to every echo server and every pong back, one
/// by one.
fn tcp_fan_out(streams: &mut [TcpStream], runs: usize) -> Vec<f64> {
    let mut b = [1u8; 1];
    let mut one = |streams: &mut [TcpStream]| {
        for s in streams.iter_mut() {
            s.write_all(&b).expect("ping");
        }
        for s in streams.iter_mut() {
            s.read_exact(&mut b).expect("pong");
        }
    };
    one(streams);
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            one(streams);
            start.elapsed().as_secs_f64()
        })
        .collect()
}

/// `tcp_fan_out` run by a network thread that the calling thread hands each
/// fan-out to and that wakes it when every pong is back; the streams come
/// back with the seconds of each.
fn tcp_fan_out_handed_off(mut streams: Vec<TcpStream>, runs: usize) -> (Vec<f64>, Vec<TcpStream>) {
    let (go, network) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let mut b = [1u8; 1];
        for () in network {
            for s in streams.iter_mut() {
                s.write_all(&b).expect("ping");
            }
            for s in streams.iter_mut() {
                s.read_exact(&mut b).expect("pong");
            }
            done.send(()).expect("caller");
        }
        streams
    });
    let one = || {
        go.send(()).expect("network thread");
        finished.recv().expect("network thread");
    };
    one();
    let secs = (0..runs)
        .map(|_| {
            let start = Instant::now();
            one();
            start.elapsed().as_secs_f64()
        })
        .collect();
    drop(go);
    (secs, thread.join().expect("network thread"))
}

/// This process's resident memory, in bytes.
fn resident_bytes() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0
}

/// This process's CPU time (user + system), in seconds.
fn cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

/// The CPU time (user + system) `getrusage(who)` reports, in seconds.
fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: `getrusage` fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(who, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Seconds `children` (every thread of each) have run on a CPU so far.
fn children_cpu_seconds(children: &[Child]) -> f64 {
    let nanos: u64 = children
        .iter()
        .filter_map(|child| std::fs::read_dir(format!("/proc/{}/task", child.id())).ok())
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    nanos as f64 * 1e-9
}

fn sizes() -> Vec<usize> {
    std::env::var("COLOCATED_SCALE_N")
        .ok()
        .map(|s| {
            s.split(',')
                .map(|n| n.trim().parse().expect("COLOCATED_SCALE_N: numbers"))
                .collect()
        })
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 64, 256])
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("worker") => return serve_worker(),
        Ok("sim") => {
            let workers = std::env::var("COLOCATED_SCALE_SIM_WORKERS")
                .ok()
                .and_then(|n| n.parse().ok())
                .expect("COLOCATED_SCALE_SIM_WORKERS");
            return sim::serve(workers, std::env::var(TOKEN).expect("token"));
        }
        Ok("echo") => return serve_echo(false),
        Ok("relay") => return serve_echo(true),
        _ => {}
    }
    let idle_secs: f64 = std::env::var("COLOCATED_SCALE_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7.0);
    let token = Token::generate().expect("token");
    let which = std::env::var("COLOCATED_SCALE_WORKERS").unwrap_or_default();
    if which != "real" {
        simulated::table(&token);
    }
    if which == "simulated" {
        return;
    }
    println!();
    println!("scale: a controller and N worker processes on loopback (1 CPU device each)");
    println!(
        "{:>4}  {:>9}  {:>9}  {:>11}  {:>9}  {:>13}  {:>10}  {:>15}  {:>6}  {:>15}  {:>6}  {:>13}  {:>13}",
        "N",
        "connect",
        "compile",
        "mem/worker",
        "idle CPU",
        "fan-out exec",
        "CPU/host",
        "raw TCP fan-out",
        "ratio",
        "TCP, hand-offs",
        "ratio",
        "all CPU/host",
        "TCP all/host"
    );
    for n in sizes() {
        let (workers, addresses) = spawn("worker", n, &token);
        let memory_before = resident_bytes();
        let mut connect = ConnectOptions::new(String::new(), Some(token.clone()));
        connect.timeout = Duration::from_secs(60);
        let options = ClusterOptions::uniform(addresses, &connect, false, ClientOptions::default());
        let start = Instant::now();
        let client = Client::connect(&options).expect("connect");
        let connected = start.elapsed().as_secs_f64();
        let devices = client.devices().to_vec();
        let sharding = Sharding::named(devices.clone(), vec![n], vec!["x".into()], vec![vec![0]])
            .expect("sharding");
        let spec = ArraySpec::new(vec![n as i64], DType::I32, sharding).expect("spec");
        let compile = || {
            client
                .compile(
                    Program::native(
                        "touch",
                        vec![spec.clone()],
                        vec![spec.clone()],
                        devices.clone(),
                    ),
                    CompileOptions::default(),
                )
                .expect("compile")
        };
        let compiled = median(
            (0..5)
                .map(|_| {
                    let start = Instant::now();
                    drop(compile());
                    start.elapsed().as_secs_f64()
                })
                .collect(),
        );
        let exe = compile();
        let x = colocated_core::Array::from_host_bytes(&client, &vec![0u8; 4 * n], spec.clone())
            .expect("put");
        x.ready_event().wait().expect("ready");
        let run = || {
            let out = exe
                .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
                .expect("execute");
            out.status.wait().expect("run");
        };
        run();
        let memory = (resident_bytes() - memory_before).max(0.0) / n as f64;
        // Idle: sessions open, nothing asked of them.
        std::thread::sleep(Duration::from_millis(500));
        let (cpu, wall) = (cpu_seconds(), Instant::now());
        std::thread::sleep(Duration::from_secs_f64(idle_secs));
        let idle = (cpu_seconds() - cpu) / wall.elapsed().as_secs_f64();
        let runs: usize = std::env::var("COLOCATED_SCALE_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(if n >= 64 { 50 } else { 200 });
        let (echoes, echo_addresses) = spawn("echo", n, &token);
        let (relays, relay_addresses) = spawn("relay", n, &token);
        let connect_all = |addresses: &[String]| -> Vec<TcpStream> {
            addresses
                .iter()
                .map(|a| {
                    let s = TcpStream::connect(a).expect("connect");
                    s.set_nodelay(true).ok();
                    s
                })
                .collect()
        };
        let mut streams = connect_all(&echo_addresses);
        let mut relayed = connect_all(&relay_addresses);
        // The three take turns, a tenth of the runs at a time: the machine's
        // load drifts, and each figure sees the same drift.
        let (mut fan_outs, mut tcps, mut handed_offs) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cpu, mut all_cpu, mut tcp_cpu) = (0.0, 0.0, 0.0);
        let rounds = 10;
        let floors = std::env::var("COLOCATED_SCALE_FLOORS").as_deref() != Ok("0");
        for _ in 0..rounds {
            let (before, workers_before) = (cpu_seconds(), children_cpu_seconds(&workers));
            fan_outs.extend((0..runs.div_ceil(rounds)).map(|_| {
                let start = Instant::now();
                run();
                start.elapsed().as_secs_f64()
            }));
            cpu += cpu_seconds() - before;
            all_cpu += cpu_seconds() - before + children_cpu_seconds(&workers) - workers_before;
            if !floors {
                continue;
            }
            let (before, echoes_before) = (cpu_seconds(), children_cpu_seconds(&echoes));
            tcps.extend(tcp_fan_out(&mut streams, runs.div_ceil(rounds)));
            tcp_cpu += cpu_seconds() - before + children_cpu_seconds(&echoes) - echoes_before;
            let (secs, back) = tcp_fan_out_handed_off(relayed, runs.div_ceil(rounds));
            handed_offs.extend(secs);
            relayed = back;
        }
        let cpu_per_host = cpu / (fan_outs.len() * n) as f64;
        let all_per_host = all_cpu / (fan_outs.len() * n) as f64;
        let tcp_per_host = tcp_cpu / (tcps.len().max(1) * n) as f64;
        if !floors {
            (tcps, handed_offs) = (vec![f64::NAN], vec![f64::NAN]);
        }
        let (fan_out, tcp, handed_off) = (median(fan_outs), median(tcps), median(handed_offs));
        println!(
            "{n:>4}  {:>6.1} ms  {:>6.2} ms  {:>7.2} MiB  {:>8.2}%  {:>10.0} µs  {:>7.1} µs  {:>12.0} µs  {:>5.1}x  {:>12.0} µs  {:>5.1}x  {:>10.1} µs  {:>10.1} µs",
            connected * 1e3,
            compiled * 1e3,
            memory / (1024.0 * 1024.0),
            idle * 100.0,
            fan_out * 1e6,
            cpu_per_host * 1e6,
            tcp * 1e6,
            fan_out / tcp,
            handed_off * 1e6,
            fan_out / handed_off,
            all_per_host * 1e6,
            tcp_per_host * 1e6
        );
        drop(exe);
        drop(x);
        drop(client);
        drop(streams);
        drop(relayed);
        stop(echoes);
        stop(relays);
        stop(workers);
    }
}
