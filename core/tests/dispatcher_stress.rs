//! Dispatcher stress: many streams submitting many small executions from their own
//! threads. Program order must hold per stream, every execution must complete
//! exactly once, and different streams must run concurrently.

mod common;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use colocated_core::*;
use common::*;

const STREAMS: usize = 8;
const PER_STREAM: usize = 10_000;
/// How long each execution keeps its executor busy, so that overlap is observable.
const SPIN: Duration = Duration::from_micros(3);

struct Observed {
    /// Per stream, the sequence numbers in the order the executions ran.
    logs: Vec<Mutex<Vec<u32>>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
    /// The same, counting only the executor pool's threads (waiting threads may
    /// also run queued work inline).
    pool_running: AtomicUsize,
    max_pool_running: AtomicUsize,
}

#[test]
fn streams_keep_program_order_complete_each_execution_once_and_overlap() {
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(1),
        executor_threads: Some(4),
        max_executor_threads: Some(4),
        pjrt: None,
    })
    .unwrap();
    let observed = Arc::new(Observed {
        logs: (0..STREAMS)
            .map(|_| Mutex::new(Vec::with_capacity(PER_STREAM)))
            .collect(),
        running: AtomicUsize::new(0),
        max_running: AtomicUsize::new(0),
        pool_running: AtomicUsize::new(0),
        max_pool_running: AtomicUsize::new(0),
    });
    let seen = observed.clone();
    client
        .register_native_function("log_step", move |ctx| {
            let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
            seen.max_running.fetch_max(now, Ordering::SeqCst);
            let on_pool = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("colocated-exec-"));
            if on_pool {
                let now = seen.pool_running.fetch_add(1, Ordering::SeqCst) + 1;
                seen.max_pool_running.fetch_max(now, Ordering::SeqCst);
            }
            let input = ctx.inputs()[0].to_host_vec()?;
            let tag = u64::from_le_bytes(input[..8].try_into().unwrap());
            let (stream, seq) = ((tag >> 32) as usize, tag as u32);
            let until = Instant::now() + SPIN;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            seen.logs[stream].lock().unwrap().push(seq);
            if on_pool {
                seen.pool_running.fetch_sub(1, Ordering::SeqCst);
            }
            seen.running.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    let device = client.devices()[0].clone();
    let spec = spec_on(&[], DType::U64, &device);
    let exe = compile_native(&client, "log_step", vec![spec.clone()], vec![], &[device]);

    let completions: Arc<Vec<AtomicU8>> = Arc::new(
        (0..STREAMS * PER_STREAM)
            .map(|_| AtomicU8::new(0))
            .collect(),
    );
    let completed = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let submitters: Vec<_> = (0..STREAMS)
        .map(|s| {
            let (client, exe, spec) = (client.clone(), exe.clone(), spec.clone());
            let (completions, completed, failures) =
                (completions.clone(), completed.clone(), failures.clone());
            std::thread::spawn(move || {
                let stream = client.create_stream();
                let options = ExecuteOptions {
                    stream: Some(stream),
                };
                let mut last = None;
                for seq in 0..PER_STREAM {
                    let tag = ((s as u64) << 32) | seq as u64;
                    let x =
                        Array::from_host_bytes(&client, &tag.to_le_bytes(), spec.clone()).unwrap();
                    let run = exe.execute(&[x], &options).unwrap();
                    let (completions, completed, failures) =
                        (completions.clone(), completed.clone(), failures.clone());
                    let index = s * PER_STREAM + seq;
                    run.status.on_ready(move |status| {
                        if let Err(e) = status {
                            failures.lock().unwrap().push(format!("{s}/{seq}: {e}"));
                        }
                        completions[index].fetch_add(1, Ordering::SeqCst);
                        completed.fetch_add(1, Ordering::SeqCst);
                    });
                    last = Some(run.status);
                }
                last.unwrap().wait_timeout(PATIENCE).unwrap();
            })
        })
        .collect();
    for t in submitters {
        t.join().unwrap();
    }
    let total = STREAMS * PER_STREAM;
    eventually("every execution completed", || {
        completed.load(Ordering::SeqCst) >= total
    });
    let elapsed = started.elapsed();
    // Late duplicates would show up here.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(completed.load(Ordering::SeqCst), total);
    assert_eq!(*failures.lock().unwrap(), Vec::<String>::new());
    let wrong: Vec<(usize, u8)> = completions
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .enumerate()
        .filter(|(_, n)| *n != 1)
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "status events completing other than once: {wrong:?}"
    );

    let expected: Vec<u32> = (0..PER_STREAM as u32).collect();
    for (s, log) in observed.logs.iter().enumerate() {
        let log = log.lock().unwrap();
        assert_eq!(
            log.len(),
            PER_STREAM,
            "stream {s} ran a wrong number of executions"
        );
        if *log != expected {
            let at = log.iter().zip(&expected).position(|(a, b)| a != b);
            panic!("stream {s} broke program order at position {at:?}");
        }
    }
    assert_eq!(observed.running.load(Ordering::SeqCst), 0);
    let max = observed.max_running.load(Ordering::SeqCst);
    assert!(
        max >= 2,
        "executions of different streams never overlapped (max {max})"
    );
    let pool_max = observed.max_pool_running.load(Ordering::SeqCst);
    assert!(
        (2..=4).contains(&pool_max),
        "the executor pool (at most 4 threads) ran at most {pool_max} executions at once"
    );
    eprintln!(
        "{total} executions on {STREAMS} streams in {elapsed:?} ({:.1} µs each), \
         max concurrency {max} ({pool_max} on the executor pool)",
        elapsed.as_secs_f64() * 1e6 / total as f64
    );
}
