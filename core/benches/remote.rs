//! Remote-host benchmarks on loopback, each beside its raw-socket baseline in the
//! same run:
//! - a unary request round trip (`Heartbeat`: token and session checks
//!   included) against a 1-byte TCP ping-pong;
//! - an execution of a native no-op on the worker through a connected client
//!   (`Client::connect`, execute, wait): one control-stream round trip, and
//!   pipelined executions from one thread;
//! - a 256 MiB buffer upload (`put_buffer`), a download of a 256 MiB array
//!   (`Array::to_host_into`, into warm and into fresh memory), and a copy of
//!   a 256 MiB buffer from one worker to another (directly, with a grant),
//!   against raw TCP throughput of the same bytes into warm memory.
//!
//! Targets (issues: remote hosts, remote speed): uploads ≥ 70% of raw TCP,
//! downloads ≥ 90%.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use colocated_core::session::{ConnectOptions, RemoteSession};
use colocated_core::transport::proto::BufferSpec;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    Program, Sharding,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BULK: usize = 256 << 20;

/// Runs of each throughput measure (and as many of its baseline).
const RUNS: usize = 5;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Median seconds per call of `f`, over `runs` batches of `n` calls.
fn time_per_call(runs: usize, n: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..n {
                    f();
                }
                start.elapsed().as_secs_f64() / n as f64
            })
            .collect(),
    )
}

/// The most bytes one read of the raw TCP baseline asks for: on loopback,
/// reads of 64 to 256 KiB move bytes faster than reads of 1 MiB and more
/// (the receiver copies the data while the sender's copy of it is still in
/// cache), so the baseline is the fast case.
const RAW_READ_BYTES: usize = 128 << 10;

/// Throughput runs beside their raw TCP baseline: each run of the measure
/// follows a run of the baseline, so both see the machine in the same state.
struct Paired {
    /// Median seconds of the measure.
    secs: f64,
    /// Median seconds of the baseline.
    tcp: f64,
    /// Median of the runs' throughput ratios (baseline seconds / seconds).
    ratio: f64,
}

/// `runs` turns of `tcp` then `measure` (each returns its seconds).
fn paired(runs: usize, tcp: &mut impl FnMut() -> f64, mut measure: impl FnMut() -> f64) -> Paired {
    let (mut secs, mut tcps, mut ratios) = (vec![], vec![], vec![]);
    for _ in 0..runs {
        let t = tcp();
        let m = measure();
        secs.push(m);
        tcps.push(t);
        ratios.push(t / m);
    }
    Paired {
        secs: median(secs),
        tcp: median(tcps),
        ratio: median(ratios),
    }
}

/// A TCP server on loopback that echoes single bytes, or swallows `BULK` bytes
/// and answers one byte, per connection.
fn raw_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let mut mode = [0u8; 1];
                if stream.read_exact(&mut mode).is_err() {
                    return;
                }
                if mode[0] == b'p' {
                    let mut byte = [0u8; 1];
                    while stream.read_exact(&mut byte).is_ok() {
                        if stream.write_all(&byte).is_err() {
                            return;
                        }
                    }
                } else {
                    // Into warm memory of the whole size, as a download into
                    // warm memory lands, in reads of RAW_READ_BYTES.
                    let mut sink = vec![0u8; BULK];
                    loop {
                        let mut at = 0;
                        while at < BULK {
                            let end = BULK.min(at + RAW_READ_BYTES);
                            match stream.read(&mut sink[at..end]) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => at += n,
                            }
                        }
                        if stream.write_all(b"k").is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Anonymous memory mapped for one use: never touched before.
struct FreshMemory(*mut u8, usize);

impl FreshMemory {
    fn new(len: usize) -> FreshMemory {
        // SAFETY: a private anonymous mapping of `len` bytes, unmapped on drop.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED, "mmap");
        FreshMemory(at.cast(), len)
    }
}

impl std::ops::Deref for FreshMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is `self.1` bytes, readable, alive with `self`.
        unsafe { std::slice::from_raw_parts(self.0, self.1) }
    }
}

impl std::ops::DerefMut for FreshMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and writable.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }
}

impl Drop for FreshMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unused from here.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

fn main() {
    // The workers and the controller share this process's network runtime;
    // in processes of their own each would have its threads. Two, unless the
    // caller says otherwise (a 2-core machine would get one).
    if std::env::var_os(colocated_core::transport::NETWORK_THREADS_ENV).is_none() {
        // No other thread runs yet.
        std::env::set_var(colocated_core::transport::NETWORK_THREADS_ENV, "2");
    }
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(1),
        executor_threads: Some(2),
        ..Default::default()
    })
    .expect("client");
    client
        .register_native_function("noop", |_ctx| Ok(()))
        .expect("register");
    let token = Token::generate().expect("token");
    let worker = Worker::start(client, WorkerOptions::new(Some(token.clone()))).expect("worker");
    let session = RemoteSession::connect(&ConnectOptions::new(
        worker.local_addr().to_string(),
        Some(token.clone()),
    ))
    .expect("session");
    let raw = raw_server();

    // Round trips.
    let rpc = time_per_call(5, 2000, || session.heartbeat().expect("heartbeat"));
    let mut ping = TcpStream::connect(raw).expect("connect");
    ping.set_nodelay(true).expect("nodelay");
    ping.write_all(b"p").expect("mode");
    let tcp = time_per_call(5, 2000, || {
        let mut byte = [1u8; 1];
        ping.write_all(&byte).expect("ping");
        ping.read_exact(&mut byte).expect("pong");
    });

    // Executions through a connected client.
    let cluster = Client::connect(&ClusterOptions {
        workers: vec![ConnectOptions::new(
            worker.local_addr().to_string(),
            Some(token.clone()),
        )],
        include_local: false,
        local: ClientOptions::default(),
    })
    .expect("connect");
    let noop = cluster
        .compile(
            Program::native("noop", vec![], vec![], cluster.devices().to_vec()),
            CompileOptions::default(),
        )
        .expect("compile");
    let options = ExecuteOptions::default();
    let execute = time_per_call(5, 2000, || {
        let run = noop.execute(&[], &options).expect("execute");
        run.status.wait().expect("run");
    });
    // 20k executions, then a wait for the last (which waits for all: one stream).
    let pipelined = median(
        (0..3)
            .map(|_| {
                let n = 20_000;
                let start = Instant::now();
                let mut last = None;
                for _ in 0..n {
                    last = Some(noop.execute(&[], &options).expect("execute").status);
                }
                last.expect("ran").wait().expect("run");
                start.elapsed().as_secs_f64() / n as f64
            })
            .collect(),
    );

    // Bulk: 256 MiB, each run beside a run of raw TCP (the machine's load
    // moves both).
    let data = Bytes::from(vec![7u8; BULK]);
    let mut bulk = TcpStream::connect(raw).expect("connect");
    bulk.write_all(b"b").expect("mode");
    let mut tcp_bulk = || {
        let start = Instant::now();
        bulk.write_all(&data).expect("send");
        let mut ack = [0u8; 1];
        bulk.read_exact(&mut ack).expect("ack");
        start.elapsed().as_secs_f64()
    };
    tcp_bulk();
    let spec = BufferSpec {
        device: 0,
        dtype: DType::U8 as u32,
        dims: vec![BULK as i64],
        memory_kind: 0,
    };
    let put_once = |handle: u64| {
        let start = Instant::now();
        session
            .put_buffer(handle, spec.clone(), data.clone())
            .expect("put");
        start.elapsed().as_secs_f64()
    };
    // The first put of a size writes into fresh memory (the kernel zeroes each
    // page on first touch); a deleted buffer's memory is kept by the worker
    // for the next transfer of its size, as in a loop of same-size uploads.
    let first = session.new_handle();
    let put_fresh = paired(1, &mut tcp_bulk, || put_once(first));
    session.delete_buffers(&[first]).expect("delete");
    let put = paired(RUNS, &mut tcp_bulk, || {
        let handle = session.new_handle();
        let secs = put_once(handle);
        session.delete_buffers(&[handle]).expect("delete");
        secs
    });
    // Downloads as users make them (`np.asarray`, `toTypedArray`): an array
    // on the worker read into this process's memory, warm (written before, as
    // in a loop over same-size reads) or fresh (the first read of a size).
    let on_worker = Array::from_host_bytes(
        &cluster,
        &data,
        ArraySpec::new(
            vec![BULK as i64],
            DType::U8,
            Sharding::single_device(cluster.devices()[0].clone()),
        )
        .expect("spec"),
    )
    .expect("put");
    on_worker.ready_event().wait().expect("put");
    let mut warm = vec![1u8; BULK];
    let read_into = |out: &mut [u8]| {
        let start = Instant::now();
        on_worker.to_host_into(out).expect("read");
        start.elapsed().as_secs_f64()
    };
    read_into(&mut warm);
    let get = paired(RUNS, &mut tcp_bulk, || read_into(&mut warm));
    assert_eq!(warm[BULK - 1], 7);
    // Fresh: memory mapped for the read, as a new NumPy array of this size
    // gets (an allocator would hand back memory it has used).
    let get_fresh = paired(RUNS, &mut tcp_bulk, || {
        read_into(&mut FreshMemory::new(BULK))
    });
    drop(warm);
    // Worker to worker: a second worker reads the array's buffer from the
    // first (a one-time grant from the controller), not through here.
    let second = Worker::start(
        Client::new_local(ClientOptions {
            num_cpu_devices: Some(1),
            ..Default::default()
        })
        .expect("client"),
        WorkerOptions::new(Some(token.clone())),
    )
    .expect("worker");
    let pair = Client::connect(&ClusterOptions {
        workers: [worker.local_addr(), second.local_addr()]
            .map(|a| ConnectOptions::new(a.to_string(), Some(token.clone())))
            .to_vec(),
        include_local: false,
        local: ClientOptions::default(),
    })
    .expect("connect");
    let [from, to] = [0, 1].map(|i| pair.devices()[i].clone());
    let source = colocated_core::Buffer::from_bytes(&pair, &data, DType::U8, &[BULK as i64], &from)
        .expect("put");
    source.ready_event().wait().expect("put");
    let copy_once = || {
        let start = Instant::now();
        let copy = source.copy_to_device(&to).expect("copy");
        copy.ready_event().wait().expect("copy");
        start.elapsed().as_secs_f64()
    };
    copy_once();
    let copy = paired(RUNS, &mut tcp_bulk, copy_once);
    // The same copy through this process, as before: a read, then a put.
    let through = paired(RUNS, &mut tcp_bulk, || {
        let start = Instant::now();
        let bytes = source.to_host_vec().expect("read");
        let copy =
            colocated_core::Buffer::from_bytes(&pair, &bytes, DType::U8, &[BULK as i64], &to)
                .expect("put");
        copy.ready_event().wait().expect("put");
        start.elapsed().as_secs_f64()
    });
    drop(source);
    drop(pair);
    let _ = second.shutdown();
    drop(on_worker);
    let gbps = |secs: f64| BULK as f64 / secs / 1e9;

    println!("\n== remote host on loopback (median) ==");
    println!(
        "{:<44} {:>12} {:>16} {:>8} {:>10}",
        "measure", "figure", "raw TCP", "ratio", "target"
    );
    println!(
        "{:<44} {:>9.1} µs {:>13.1} µs {:>7.2}x {:>10}",
        "unary request round trip (Heartbeat)",
        rpc * 1e6,
        tcp * 1e6,
        rpc / tcp,
        "-"
    );
    println!(
        "{:<44} {:>9.1} µs {:>13.1} µs {:>7.2}x {:>10}",
        "execute + wait, native no-op on the worker",
        execute * 1e6,
        tcp * 1e6,
        execute / tcp,
        "-"
    );
    println!(
        "{:<44} {:>8.1} k/s {:>16} {:>8} {:>10}",
        "pipelined executions, 1 thread",
        1e-3 / pipelined,
        "",
        "",
        ">= 20k/s"
    );
    println!(
        "{:<44} {:>7.2} GB/s {:>11.2} GB/s {:>7.0}% {:>10}",
        "put_buffer, 256 MiB",
        gbps(put.secs),
        gbps(put.tcp),
        100.0 * put.ratio,
        ">= 70%"
    );
    println!(
        "{:<44} {:>7.2} GB/s {:>11.2} GB/s {:>7.0}% {:>10}",
        "put_buffer, 256 MiB, first of its size",
        gbps(put_fresh.secs),
        gbps(put_fresh.tcp),
        100.0 * put_fresh.ratio,
        "-"
    );
    println!(
        "{:<44} {:>7.2} GB/s {:>11.2} GB/s {:>7.0}% {:>10}",
        "download 256 MiB, into warm memory",
        gbps(get.secs),
        gbps(get.tcp),
        100.0 * get.ratio,
        ">= 90%"
    );
    println!(
        "{:<44} {:>7.2} GB/s {:>11.2} GB/s {:>7.0}% {:>10}",
        "download 256 MiB, into fresh memory",
        gbps(get_fresh.secs),
        gbps(get_fresh.tcp),
        100.0 * get_fresh.ratio,
        "-"
    );
    println!(
        "{:<44} {:>7.2} GB/s {:>11.2} GB/s {:>7.0}% {:>10}",
        "copy 256 MiB, worker to worker",
        gbps(copy.secs),
        gbps(copy.tcp),
        100.0 * copy.ratio,
        ">= 70%"
    );
    println!(
        "{:<44} {:>7.2} GB/s {:>11.2} GB/s {:>7.0}% {:>10}",
        "  the same through this process (read + put)",
        gbps(through.secs),
        gbps(through.tcp),
        100.0 * through.ratio,
        "-"
    );
    drop(session);
    let _ = worker.shutdown();
    std::thread::sleep(Duration::from_millis(10));
}
