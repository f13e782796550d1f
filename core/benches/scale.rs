//! A controller and N workers (in this process, on loopback, one CPU device
//! each), for N = 1, 4, 16, 64: how connecting, compiling and a fan-out
//! execution grow with N, each beside the same-run floor of raw TCP: a 1-byte
//! ping-pong to N echo servers at once (one thread each, as the workers have
//! their own connections).
//!
//! Targets (issue: remote speed): connect and compile in parallel (about one
//! round trip, not N); fan-out execute + await <= 2x the raw TCP fan-out.
//! The machine, not the design, bounds absolute figures at large N on a small
//! VM: compare with the floor of the same run.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use colocated_core::transport::session::ConnectOptions;
use colocated_core::transport::worker::{Worker, WorkerOptions};
use colocated_core::transport::Token;
use colocated_core::{
    ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    Program, Sharding,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// A worker with one CPU device and the native no-op every program here runs.
fn worker(token: &Token) -> Worker {
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
    Worker::start(client, WorkerOptions::new(Some(token.clone()))).expect("worker")
}

/// `n` echo servers of single bytes, and a client connection to each.
fn echo_fan(n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = listener.local_addr().expect("addr");
            std::thread::spawn(move || {
                let (mut s, _) = listener.accept().expect("accept");
                s.set_nodelay(true).ok();
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).is_ok() {
                    if s.write_all(&b).is_err() {
                        break;
                    }
                }
            });
            let s = TcpStream::connect(addr).expect("connect");
            s.set_nodelay(true).ok();
            s
        })
        .collect()
}

/// Median seconds of one ping to every echo server and every pong back.
fn tcp_fan_out(streams: &mut [TcpStream]) -> f64 {
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
    median(
        (0..200)
            .map(|_| {
                let start = Instant::now();
                one(streams);
                start.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() {
    let token = Token::generate().expect("token");
    println!("scale: a controller and N in-process workers on loopback (1 CPU device each)");
    println!(
        "{:>4}  {:>10}  {:>10}  {:>18}  {:>20}  {:>6}",
        "N", "connect", "compile", "fan-out exec+wait", "raw TCP fan-out", "ratio"
    );
    for n in [1usize, 4, 16, 64] {
        let workers: Vec<Worker> = (0..n).map(|_| worker(&token)).collect();
        let mut connect = ConnectOptions::new(String::new(), Some(token.clone()));
        connect.timeout = std::time::Duration::from_secs(30);
        let options = ClusterOptions::uniform(
            workers.iter().map(|w| w.local_addr().to_string()),
            &connect,
            false,
            ClientOptions::default(),
        );
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
        let runs = if n >= 64 { 50 } else { 200 };
        let fan_out = median(
            (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    run();
                    start.elapsed().as_secs_f64()
                })
                .collect(),
        );
        let mut streams = echo_fan(n);
        let tcp = tcp_fan_out(&mut streams);
        println!(
            "{n:>4}  {:>7.1} ms  {:>7.2} ms  {:>15.0} µs  {:>17.0} µs  {:>5.1}x",
            connected * 1e3,
            compiled * 1e3,
            fan_out * 1e6,
            tcp * 1e6,
            fan_out / tcp
        );
        drop(exe);
        drop(x);
        drop(client);
        drop(streams);
        for w in workers {
            let _ = w.shutdown();
        }
    }
}
