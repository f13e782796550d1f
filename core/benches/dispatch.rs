//! Dispatcher benchmarks: a no-op native program's execute + await round trip, and
//! asynchronous submissions per second from 1 and 4 threads.
//!
//! Targets (issue: core runtime): round trip ≤ 2 µs median; ≥ 1M submissions/s
//! from one thread. After criterion's figures, a summary prints each figure beside
//! its target.

use std::time::{Duration, Instant};

use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, CompileOptions, DType, Event, ExecuteOptions,
    LoadedExecutable, Program, Sharding,
};
use criterion::{criterion_group, Criterion, Throughput};

// Measured with the allocator libcolocated ships with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn noop_executable() -> LoadedExecutable {
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(1),
        executor_threads: Some(2),
        ..Default::default()
    })
    .expect("client");
    client
        .register_native_function("noop", |_| Ok(()))
        .expect("register");
    let device = client.devices()[0].clone();
    client
        .compile(
            Program::native("noop", vec![], vec![], vec![device]),
            CompileOptions::default(),
        )
        .expect("compile")
}

/// An identity program over one f32 scalar on device 0, and an input for it.
fn identity_executable() -> (LoadedExecutable, Array) {
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(1),
        executor_threads: Some(2),
        ..Default::default()
    })
    .expect("client");
    client
        .register_native_function("identity", |ctx| {
            let x = ctx.inputs()[0].clone();
            ctx.set_output(0, x)
        })
        .expect("register");
    let device = client.devices()[0].clone();
    let spec =
        ArraySpec::new(vec![], DType::F32, Sharding::single_device(device.clone())).expect("spec");
    let program = Program::native(
        "identity",
        vec![spec.clone()],
        vec![spec.clone()],
        vec![device],
    );
    let exe = client
        .compile(program, CompileOptions::default())
        .expect("compile");
    let x = Array::from_host_bytes(&client, &1.0f32.to_le_bytes(), spec).expect("x");
    (exe, x)
}

fn round_trip_with_array(exe: &LoadedExecutable, x: &Array) {
    let run = exe
        .execute(std::slice::from_ref(x), &ExecuteOptions::default())
        .expect("execute");
    run.outputs[0].ready_event().wait().expect("output");
}

fn round_trip(exe: &LoadedExecutable) {
    let run = exe
        .execute(&[], &ExecuteOptions::default())
        .expect("execute");
    run.status.wait().expect("status");
}

/// Submits `n` executions from this thread and returns the time the submissions
/// took (the last status is awaited afterwards, outside the timing).
fn submit_burst(exe: &LoadedExecutable, n: u64) -> Duration {
    let options = ExecuteOptions::default();
    let start = Instant::now();
    let mut last: Option<Event> = None;
    for _ in 0..n {
        last = Some(exe.execute(&[], &options).expect("execute").status);
    }
    let elapsed = start.elapsed();
    if let Some(last) = last {
        last.wait().expect("status");
    }
    elapsed
}

/// `threads` threads (each its own stream) submit `per_thread` executions each;
/// returns the wall time until every submission was made.
fn submit_parallel(exe: &LoadedExecutable, threads: usize, per_thread: u64) -> Duration {
    let start = Instant::now();
    let lasts: Vec<Event> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let options = ExecuteOptions::default();
                    let mut last = None;
                    for _ in 0..per_thread {
                        last = Some(exe.execute(&[], &options).expect("execute").status);
                    }
                    last.expect("at least one")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let elapsed = start.elapsed();
    for e in lasts {
        e.wait().expect("status");
    }
    elapsed
}

fn bench_dispatch(c: &mut Criterion) {
    let exe = noop_executable();
    let mut group = c.benchmark_group("dispatch");
    group.throughput(Throughput::Elements(1));
    group.bench_function("noop execute+await round trip", |b| {
        b.iter(|| round_trip(&exe))
    });
    let (identity, x) = identity_executable();
    group.bench_function("identity(f32 scalar) execute+await round trip", |b| {
        b.iter(|| round_trip_with_array(&identity, &x))
    });
    group.bench_function("noop async submit, 1 thread", |b| {
        b.iter_custom(|iters| submit_burst(&exe, iters))
    });
    group.bench_function("noop async submit, 4 threads", |b| {
        b.iter_custom(|iters| submit_parallel(&exe, 4, iters.div_ceil(4)))
    });
    group.finish();
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn summary() {
    let exe = noop_executable();
    for _ in 0..10_000 {
        round_trip(&exe);
    }
    let rt = median(
        (0..20_001)
            .map(|_| {
                let t = Instant::now();
                round_trip(&exe);
                t.elapsed().as_nanos() as f64
            })
            .collect(),
    );
    let (identity, x) = identity_executable();
    let rt_array = median(
        (0..20_001)
            .map(|_| {
                let t = Instant::now();
                round_trip_with_array(&identity, &x);
                t.elapsed().as_nanos() as f64
            })
            .collect(),
    );
    let n = 200_000u64;
    let one = median(
        (0..5)
            .map(|_| n as f64 / submit_burst(&exe, n).as_secs_f64())
            .collect(),
    );
    let four = median(
        (0..5)
            .map(|_| n as f64 / submit_parallel(&exe, 4, n / 4).as_secs_f64())
            .collect(),
    );
    println!("\n== dispatch summary (median) ==");
    println!(
        "{:<40} {:>14} {:>16} {:>6}",
        "measure", "figure", "target", "met"
    );
    let met = |ok: bool| if ok { "yes" } else { "NO" };
    println!(
        "{:<40} {:>11.2} µs {:>13} µs {:>6}",
        "no-op execute+await round trip",
        rt / 1e3,
        "≤ 2.00",
        met(rt <= 2000.0)
    );
    println!(
        "{:<40} {:>11.2} µs {:>16} {:>6}",
        "identity(f32 scalar) round trip",
        rt_array / 1e3,
        "(no target)",
        "-"
    );
    println!(
        "{:<40} {:>12.2} M/s {:>12} M/s {:>6}",
        "async submissions, 1 thread",
        one / 1e6,
        "≥ 1.00",
        met(one >= 1e6)
    );
    println!(
        "{:<40} {:>12.2} M/s {:>16} {:>6}",
        "async submissions, 4 threads",
        four / 1e6,
        "(no target)",
        "-"
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench_dispatch
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
