//! Transfer benchmarks: buffer from host and to host at 4 KiB, 1 MiB and 256 MiB,
//! beside memcpy of the same size in the same run.
//!
//! Targets (issue: core runtime): copies ≥ 80% of memcpy; zero-copy copies nothing.
//! `from_host` must allocate, so besides a memcpy into warm memory it is also shown
//! beside "allocate + memcpy" (what a caller doing it by hand pays).

use std::hint::black_box;
use std::time::{Duration, Instant};

use colocated_core::{Buffer, Client, ClientOptions, DType, HostBufferSemantics};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};

// Measured with the allocator libcolocated ships with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [(usize, &str); 3] = [(4 << 10, "4KiB"), (1 << 20, "1MiB"), (256 << 20, "256MiB")];

fn client() -> Client {
    Client::new_local(ClientOptions {
        num_cpu_devices: Some(1),
        executor_threads: Some(2),
        ..Default::default()
    })
    .expect("client")
}

fn from_host(client: &Client, src: &[u8], semantics: HostBufferSemantics) -> Buffer {
    let device = &client.devices()[0];
    let dims = [src.len() as i64];
    // SAFETY: `src` outlives the buffer in every use below (the buffer is dropped
    // before `src`).
    unsafe {
        Buffer::from_host_raw(
            client,
            src.as_ptr(),
            src.len(),
            DType::U8,
            &dims,
            device,
            None,
            semantics,
        )
    }
    .expect("from_host")
    .0
}

fn to_host(buffer: &Buffer, dst: &mut [u8]) {
    // SAFETY: `dst` is exactly the buffer's size and outlives the wait.
    unsafe { buffer.to_host_raw(dst.as_mut_ptr(), dst.len()) }
        .expect("to_host")
        .wait()
        .expect("copy");
}

fn bench_transfer(c: &mut Criterion) {
    let client = client();
    let mut group = c.benchmark_group("transfer");
    for (size, label) in SIZES {
        let src = vec![7u8; size];
        let mut dst = vec![0u8; size];
        if size > (1 << 20) {
            group.sample_size(10);
        }
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new("memcpy (warm dst)", label), |b| {
            b.iter(|| dst.copy_from_slice(black_box(&src)))
        });
        group.bench_function(BenchmarkId::new("allocate + memcpy", label), |b| {
            b.iter(|| black_box(src.to_vec()))
        });
        group.bench_function(BenchmarkId::new("buffer_from_host (copy)", label), |b| {
            b.iter(|| from_host(&client, &src, HostBufferSemantics::ImmutableOnlyDuringCall))
        });
        group.bench_function(
            BenchmarkId::new("buffer_from_host (zero-copy)", label),
            |b| b.iter(|| from_host(&client, &src, HostBufferSemantics::ImmutableZeroCopy)),
        );
        let buffer = from_host(&client, &src, HostBufferSemantics::ImmutableOnlyDuringCall);
        group.bench_function(BenchmarkId::new("buffer_to_host", label), |b| {
            b.iter(|| to_host(&buffer, &mut dst))
        });
    }
    group.finish();
}

fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn summary() {
    let client = client();
    println!("\n== transfer summary (best of runs, GB/s) ==");
    println!(
        "{:<8} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8} {:>14}",
        "size", "memcpy", "alloc+cpy", "from_host", "ratio*", "to_host", "ratio", "zero-copy µs"
    );
    for (size, label) in SIZES {
        let runs = if size > (1 << 20) { 5 } else { 2000 };
        let src = vec![7u8; size];
        let mut dst = vec![0u8; size];
        let gbs = |secs: f64| size as f64 / secs / 1e9;
        let memcpy = gbs(best_of(runs, || dst.copy_from_slice(black_box(&src))));
        let alloc = gbs(best_of(runs, || drop(black_box(src.to_vec()))));
        let from = gbs(best_of(runs, || {
            drop(from_host(
                &client,
                &src,
                HostBufferSemantics::ImmutableOnlyDuringCall,
            ))
        }));
        let buffer = from_host(&client, &src, HostBufferSemantics::ImmutableOnlyDuringCall);
        let to = gbs(best_of(runs, || to_host(&buffer, &mut dst)));
        let zero = best_of(runs, || {
            drop(from_host(
                &client,
                &src,
                HostBufferSemantics::ImmutableZeroCopy,
            ))
        });
        let zc = from_host(&client, &src, HostBufferSemantics::ImmutableZeroCopy);
        let aliased = std::ptr::eq(
            zc.acquire_external_reference()
                .expect("pin")
                .data_ptr()
                .cast_const(),
            src.as_ptr(),
        );
        println!(
            "{label:<8} {memcpy:>10.2} {alloc:>10.2} {from:>10.2} {:>7.0}% {to:>10.2} {:>7.0}% {:>9.2}{}",
            100.0 * from / alloc,
            100.0 * to / memcpy,
            zero * 1e6,
            if aliased { " (aliased)" } else { " (COPIED)" }
        );
    }
    println!("ratio*: from_host against allocate + memcpy; to_host against memcpy into the same warm memory. Target: ≥ 80%.");
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    targets = bench_transfer
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
