//! The controller against N simulated workers (see [`sim`](super::sim)), N
//! up to thousands: connect time, memory per host (idle, and active: after
//! calls, with one in flight), CPU per host and call of an execute + await
//! over all N beside a raw TCP client's per peer, and the wall time of one
//! fan-out beside the raw TCP one, all from the same run.
//!
//! - Memory per host is what N more connected hosts cost: a client of four
//!   hosts connects first and runs a call (it pays the process's one-time
//!   costs: the network runtime, the lane reader, thread-local buffers), then
//!   the client of N connects. `heap` counts the bytes the allocator handed
//!   out and holds; `RSS` is the resident memory's growth.
//! - The raw TCP client writes a 64-byte request to each of N echo peers (in
//!   the simulator processes) and then reads each answer; its CPU is its
//!   thread's (`getrusage(RUSAGE_THREAD)`), the controller's is the whole
//!   process's (every thread that sends, reads and completes the call). The
//!   two take turns, a tenth of the runs at a time. What the controller's
//!   threads do while the raw client runs counts as the calls' too (`of it
//!   late`: the deletions of a turn's last outputs, which go out after the
//!   pause).
//!
//! `COLOCATED_SCALE_SIM_N` (comma-separated) picks the sizes; default 16,
//! 256, 1024, 4096. `COLOCATED_SCALE_RUNS` sets the fan-outs per size
//! (default 20,000 / N, 20 to 500); `COLOCATED_SCALE_FLOORS=0` leaves the
//! raw TCP client out (to profile the fan-out alone). A simulator process serves at most
//! 1,024 hosts.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    LoadedExecutable, Program, Sharding,
};

use super::{
    allocations, cpu_seconds, heap_bytes, median, resident_bytes, rusage_seconds, ROLE, TOKEN,
};

/// Hosts one simulator process serves at most.
const PER_PROCESS: usize = 1024;

const MIB: f64 = 1024.0 * 1024.0;

/// The simulator processes of one size.
struct Sims {
    children: Vec<(Child, ChildStdin, BufReader<ChildStdout>)>,
    workers: Vec<String>,
    echoes: Vec<String>,
}

impl Sims {
    fn start(n: usize, token: &Token) -> Sims {
        let exe = std::env::current_exe().expect("exe");
        let processes = n.div_ceil(PER_PROCESS);
        let mut sims = Sims {
            children: Vec::new(),
            workers: Vec::new(),
            echoes: Vec::new(),
        };
        for p in 0..processes {
            let hosts = n / processes + usize::from(p < n % processes);
            let mut child = Command::new(&exe)
                .env(ROLE, "sim")
                .env(TOKEN, token.expose())
                .env("COLOCATED_SCALE_SIM_WORKERS", hosts.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a simulator");
            let stdin = child.stdin.take().expect("stdin");
            let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
            for (prefix, into) in [
                ("workers ", &mut sims.workers),
                ("echoes ", &mut sims.echoes),
            ] {
                let mut line = String::new();
                stdout.read_line(&mut line).expect("addresses");
                let addresses = line
                    .trim()
                    .strip_prefix(prefix)
                    .expect("a line of addresses");
                into.extend(addresses.split(' ').map(str::to_string));
            }
            sims.children.push((child, stdin, stdout));
        }
        sims
    }

    /// Tells every simulator `command` and waits until each `said` it.
    fn tell(&mut self, command: &str, said: &str) {
        for (_, stdin, _) in &mut self.children {
            writeln!(stdin, "{command}").expect("a simulator's stdin");
            stdin.flush().expect("a simulator's stdin");
        }
        for (_, _, stdout) in &mut self.children {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("a simulator's answer");
            assert_eq!(line.trim(), said);
        }
    }

    fn stop(self) {
        for (mut child, stdin, _) in self.children {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// The calling thread's CPU time (user + system), in seconds.
fn thread_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_THREAD)
}

/// Raises this process's limit of open files to its hard limit; the limit.
fn raise_file_limit() -> u64 {
    // SAFETY: `getrlimit` and `setrlimit` read and write the struct given.
    unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur
    }
}

/// A client of `workers`, an executable of a native program over an array
/// sharded across all their devices, and that array.
fn connected(workers: &[String], token: &Token) -> (Client, LoadedExecutable, Array) {
    let mut connect = ConnectOptions::new(String::new(), Some(token.clone()));
    connect.timeout = Duration::from_secs(120);
    let options =
        ClusterOptions::uniform(workers.to_vec(), &connect, false, ClientOptions::default());
    let client = Client::connect(&options).expect("connect");
    let (exe, x) = program(&client);
    (client, exe, x)
}

fn program(client: &Client) -> (LoadedExecutable, Array) {
    let devices = client.devices().to_vec();
    let n = devices.len();
    let sharding = Sharding::named(devices.clone(), vec![n], vec!["x".into()], vec![vec![0]])
        .expect("sharding");
    let spec = ArraySpec::new(vec![n as i64], DType::I32, sharding).expect("spec");
    let exe = client
        .compile(
            Program::native("touch", vec![spec.clone()], vec![spec.clone()], devices),
            CompileOptions::default(),
        )
        .expect("compile");
    let x = Array::from_host_bytes(client, &vec![0u8; 4 * n], spec).expect("put");
    x.ready_event().wait().expect("ready");
    (exe, x)
}

fn run(exe: &LoadedExecutable, x: &Array) {
    let out = exe
        .execute(std::slice::from_ref(x), &ExecuteOptions::default())
        .expect("execute");
    out.status.wait().expect("run");
}

/// Seconds of each raw TCP fan-out: a 64-byte request to every peer, then
/// every answer read.
fn tcp_fan_out(streams: &mut [TcpStream], runs: usize) -> Vec<f64> {
    let mut message = [7u8; 64];
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            for s in streams.iter_mut() {
                s.write_all(&message).expect("request");
            }
            for s in streams.iter_mut() {
                s.read_exact(&mut message).expect("answer");
            }
            start.elapsed().as_secs_f64()
        })
        .collect()
}

fn sizes() -> Vec<usize> {
    std::env::var("COLOCATED_SCALE_SIM_N")
        .ok()
        .map(|s| {
            s.split(',')
                .map(|n| n.trim().parse().expect("COLOCATED_SCALE_SIM_N: numbers"))
                .collect()
        })
        .unwrap_or_else(|| vec![16, 256, 1024, 4096])
}

/// Prints the table.
pub fn table(token: &Token) {
    let files = raise_file_limit();
    println!("scale: a controller and N simulated workers on loopback (1 CPU device each)");
    println!(
        "{:>5}  {:>9}  {:>20}  {:>20}  {:>9}  {:>11}  {:>6}  {:>10}  {:>10}  {:>11}  {:>9}",
        "N",
        "connect",
        "idle/host heap, RSS",
        "active/host heap,RSS",
        "CPU/host",
        "raw TCP/peer",
        "ratio",
        "fan-out",
        "raw TCP",
        "allocs/host",
        "of it late"
    );
    for n in sizes() {
        // The controller: 3 sockets per host at most (control, lane, bulk),
        // one per echo peer, and the warm client's.
        let needed = 4 * n as u64 + 256;
        if needed > files {
            println!("{n:>5}  skipped: needs {needed} open files, the limit is {files}");
            continue;
        }
        let mut sims = Sims::start(n, token);
        // Pays the process's one-time costs before anything is measured.
        let warm = connected(&sims.workers[..n.min(4)], token);
        run(&warm.1, &warm.2);
        let (heap0, rss0) = (heap_bytes(), resident_bytes());
        let start = Instant::now();
        let mut connect = ConnectOptions::new(String::new(), Some(token.clone()));
        connect.timeout = Duration::from_secs(120);
        let options = ClusterOptions::uniform(
            sims.workers.clone(),
            &connect,
            false,
            ClientOptions::default(),
        );
        let client = Client::connect(&options).expect("connect");
        let connect_secs = start.elapsed().as_secs_f64();
        let idle = (
            (heap_bytes() - heap0) / n as f64,
            (resident_bytes() - rss0) / n as f64,
        );
        let (exe, x) = program(&client);
        for _ in 0..3 {
            run(&exe, &x);
        }
        // One call in flight on every host.
        sims.tell("hold", "held");
        let held = exe
            .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
            .expect("execute");
        std::thread::sleep(Duration::from_millis(100));
        let active = (
            (heap_bytes() - heap0) / n as f64,
            (resident_bytes() - rss0) / n as f64,
        );
        sims.tell("release", "released");
        held.status.wait().expect("run");
        drop(held);

        let mut streams: Vec<TcpStream> = sims
            .echoes
            .iter()
            .map(|a| {
                let s = TcpStream::connect(a).expect("connect to an echo peer");
                s.set_nodelay(true).ok();
                s
            })
            .collect();
        tcp_fan_out(&mut streams, 1);
        let runs = std::env::var("COLOCATED_SCALE_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or((20_000 / n).clamp(20, 500));
        let rounds = 10;
        let floors = std::env::var("COLOCATED_SCALE_FLOORS").as_deref() != Ok("0");
        let (mut fan_outs, mut tcps) = (Vec::new(), Vec::new());
        let (mut cpu, mut tcp_cpu, mut background_cpu, mut allocated) = (0.0, 0.0, 0.0, 0);
        for _ in 0..rounds {
            let (before, allocated_before) = (cpu_seconds(), allocations());
            fan_outs.extend((0..runs.div_ceil(rounds)).map(|_| {
                let start = Instant::now();
                run(&exe, &x);
                start.elapsed().as_secs_f64()
            }));
            cpu += cpu_seconds() - before;
            allocated += allocations() - allocated_before;
            if !floors {
                continue;
            }
            let (before, process_before) = (thread_cpu_seconds(), cpu_seconds());
            tcps.extend(tcp_fan_out(&mut streams, runs.div_ceil(rounds)));
            let raw = thread_cpu_seconds() - before;
            tcp_cpu += raw;
            // What the controller's threads did meanwhile is the calls':
            // the last call's deletions, which go out after a pause.
            // (Never below 0 from the clocks' rounding.)
            let background = (cpu_seconds() - process_before - raw).max(0.0);
            cpu += background;
            background_cpu += background;
        }
        let cpu_per_host = cpu / (fan_outs.len() * n) as f64;
        let allocations_per_host = allocated as f64 / (fan_outs.len() * n) as f64;
        let tcp_per_peer = tcp_cpu / (tcps.len().max(1) * n) as f64;
        let late_per_host = background_cpu / (fan_outs.len() * n) as f64;
        println!(
            "{n:>5}  {:>6.0} ms  {:>7.3} {:>7.3} MiB  {:>7.3} {:>7.3} MiB  {:>6.1} µs  {:>8.1} µs  {:>5.2}x  {:>7.2} ms  {:>7.2} ms  {:>11.1}  {:>6.1} µs",
            connect_secs * 1e3,
            idle.0 / MIB,
            idle.1 / MIB,
            active.0 / MIB,
            active.1 / MIB,
            cpu_per_host * 1e6,
            tcp_per_peer * 1e6,
            cpu_per_host / tcp_per_peer,
            median(fan_outs) * 1e3,
            median(tcps) * 1e3,
            allocations_per_host,
            late_per_host * 1e6,
        );
        drop((exe, x, client, warm, streams));
        sims.stop();
    }
}
