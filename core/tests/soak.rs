//! A soak: a controller and a worker (in this process) talking through the
//! test suite's fault-injecting proxy for a while, with a random fault every
//! few seconds (a reset, a partition shorter than the session timeout, added
//! latency, a bandwidth limit), while threads keep calling, loading,
//! uploading, downloading and calling back. Nothing may hang, no result may
//! be lost, wrong or run twice, and neither side's memory may grow: the
//! worker's count of buffers, executables and kept answers comes back to
//! what the test holds, and the process's live heap (counted by this test's
//! allocator) and resident memory at the end are those of a quiet point
//! after the warm-up, within bounds. Controller, worker and proxy share
//! this process, so the memory measured is theirs together.
//!
//! `COLOCATED_SOAK_SECONDS` sets how long it runs (25 s by default, so that
//! `cargo test` stays short; the several-minute soak sets e.g. 300), and
//! `COLOCATED_SOAK_SEED` the seed of its faults and work (printed by every
//! run, so that a failure can be replayed: the sequences of faults and of
//! work replay, their interleaving only roughly). Timings are asserted only
//! as bounds.

mod common;

use std::alloc::{GlobalAlloc, Layout};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::worker::Worker;
use colocated_core::{
    Array, Buffer, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    LoadedExecutable, LoadedHostCallback, Program,
};
use colocated_faultproxy::{Direction, FaultProxy};
use common::{client_with_threads, i32_bytes, i32_values, spec_on, PATIENCE};

/// The process's allocator: mimalloc (as the Node SDK's), counting the bytes
/// allocated and not yet freed in [`LIVE_HEAP`].
struct CountingAllocator;

/// Bytes allocated and not yet freed, by everything in this process: the
/// controller, the worker and the proxy.
static LIVE_HEAP: AtomicIsize = AtomicIsize::new(0);

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

// SAFETY: every call is passed on to mimalloc as it came; the counter only
// watches.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller keeps `alloc`'s contract.
        let ptr = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !ptr.is_null() {
            LIVE_HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller keeps `alloc_zeroed`'s contract.
        let ptr = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller keeps `dealloc`'s contract.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) };
        LIVE_HEAP.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller keeps `realloc`'s contract.
        let moved = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            LIVE_HEAP.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        moved
    }
}

/// How long the soak runs unless `COLOCATED_SOAK_SECONDS` says otherwise.
const DEFAULT_SECONDS: u64 = 25;
/// The worker's session timeout: how long it keeps a silent session.
const SESSION_TIMEOUT: Duration = Duration::from_secs(5);
/// The worker's heartbeat interval.
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(250);
/// The longest partition. The worker last heard from the controller at
/// most a heartbeat interval before it began (the soak always has work in
/// flight), and after the heal the controller connects again within its
/// longest backoff (1 s): the worker's silence stays under this + about
/// 1.25 s, well within the session timeout, with the rest as margin for a
/// slow, loaded machine.
const LONGEST_PARTITION: Duration = Duration::from_secs(2);
const _: () = assert!(LONGEST_PARTITION.as_millis() + 2500 < SESSION_TIMEOUT.as_millis());
/// The slowest link the soak makes, in MiB/s (with the 0.25 s heartbeat
/// interval; see faults.rs's
/// `an_upload_and_a_download_through_a_link_of_8_mib_per_s_complete`).
const SLOWEST_LINK: u64 = 8;
/// The most the live heap may grow from the quiet point after the warm-up
/// to the end (see [`check_memory_is_flat`]).
const HEAP_GROWTH_BOUND: isize = 16 << 20;
/// The most the process's resident memory may grow from the quiet point
/// after the warm-up to the end (see [`check_memory_is_flat`]).
const RSS_GROWTH_BOUND: u64 = 64 << 20;
/// How many of the latest faults and failures a failure report shows.
const LOG_LINES: usize = 40;

/// A small xorshift64* generator: reproducible from its seed, and enough
/// for picking faults, sizes and values.
struct Rng(u64);

impl Rng {
    /// A generator for `seed` and the purpose `stream` (each thread its own).
    fn new(seed: u64, stream: u64) -> Rng {
        // One splitmix64 step, so that near seeds give unrelated sequences.
        let mut z = seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `low..high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low)
    }

    /// A duration of `low..high` milliseconds.
    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.range(low, high))
    }
}

/// `len` bytes that the seed `seed` gives (`len` a multiple of 8).
fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed, 0);
    let mut bytes = Vec::with_capacity(len);
    for _ in 0..len / 8 {
        bytes.extend_from_slice(&rng.next().to_le_bytes());
    }
    bytes
}

/// What the soak's threads share: when it began, whether it stops, what
/// went wrong, and what each thread did.
struct Soak {
    seed: u64,
    began: Instant,
    stop: AtomicBool,
    /// The watcher asks every thread to rest, holding nothing of its work,
    /// so that it can measure memory at a quiet point.
    quiet: AtomicBool,
    /// Threads resting now.
    resting: AtomicUsize,
    /// The latest faults and failures, each with its time: what a failure
    /// report shows.
    log: Mutex<VecDeque<String>>,
    failures: Mutex<Vec<String>>,
    tally: Tally,
}

/// What the soak did, counted as it goes.
#[derive(Default)]
struct Tally {
    /// Executions of `counted` sent (by chains and by freshly loaded
    /// executables), each of whose results was then checked.
    counted_calls: AtomicUsize,
    chains: AtomicUsize,
    loads: AtomicUsize,
    uploads: AtomicUsize,
    downloads: AtomicUsize,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    /// Executions of `ask`, each of which calls the host callback once.
    ask_calls: AtomicUsize,
    resets: AtomicUsize,
    partitions: AtomicUsize,
    latencies: AtomicUsize,
    bandwidths: AtomicUsize,
}

impl Soak {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Seconds since the soak began, for the log.
    fn at(&self) -> String {
        format!("{:8.3} s", self.began.elapsed().as_secs_f64())
    }

    /// Notes `what` in the log.
    fn note(&self, what: String) {
        let mut log = self.log.lock().unwrap();
        if log.len() == LOG_LINES {
            log.pop_front();
        }
        log.push_back(format!("{}: {what}", self.at()));
    }

    /// Records a failure, and stops the soak.
    fn fail(&self, what: String) {
        self.note(format!("FAILED: {what}"));
        self.failures
            .lock()
            .unwrap()
            .push(format!("{}: {what}", self.at()));
        self.stop.store(true, Ordering::SeqCst);
    }

    fn quiet_asked(&self) -> bool {
        self.quiet.load(Ordering::SeqCst)
    }

    /// Rests while the watcher asks for quiet (the caller holds nothing of
    /// its work), then beats `beat`.
    fn rest(&self, beat: Option<&Beat>) {
        self.resting.fetch_add(1, Ordering::SeqCst);
        while self.quiet_asked() && !self.stopped() {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.resting.fetch_sub(1, Ordering::SeqCst);
        if let Some(beat) = beat {
            beat.now(self);
        }
    }

    /// Sleeps for `duration`, or until the soak stops or asks for quiet:
    /// whether it slept the whole time.
    fn sleep(&self, duration: Duration) -> bool {
        let until = Instant::now() + duration;
        while !self.stopped() && !self.quiet_asked() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
        false
    }

    /// What a failure report shows: the seed and the latest log lines.
    fn report(&self) -> String {
        let log = self.log.lock().unwrap();
        format!(
            "seed {} (COLOCATED_SOAK_SEED={} replays it); latest events:\n{}",
            self.seed,
            self.seed,
            log.iter().cloned().collect::<Vec<_>>().join("\n")
        )
    }
}

/// When a work thread last finished a piece of work.
struct Beat {
    name: &'static str,
    /// Milliseconds since the soak began.
    last: AtomicU64,
}

impl Beat {
    fn now(&self, soak: &Soak) {
        self.last
            .store(soak.began.elapsed().as_millis() as u64, Ordering::SeqCst);
    }

    /// How long it has been since the last piece of work.
    fn silent_for(&self, soak: &Soak) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::SeqCst));
        soak.began.elapsed().saturating_sub(last)
    }
}

/// A work thread: what it does, how it shows it is alive, and its handle.
struct WorkThread {
    beat: Arc<Beat>,
    handle: JoinHandle<()>,
}

/// Starts `work` on a thread named `name`, which it calls with its beat.
fn spawn_work(
    soak: &Arc<Soak>,
    name: &'static str,
    work: impl FnOnce(&Soak, &Beat) + Send + 'static,
) -> WorkThread {
    let beat = Arc::new(Beat {
        name,
        last: AtomicU64::new(0),
    });
    let (soak, mine) = (soak.clone(), beat.clone());
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || work(&soak, &mine))
        .expect("a work thread");
    WorkThread { beat, handle }
}

/// The resident memory of this process in bytes (`None` where the system
/// does not say): `VmRSS` of `/proc/self/status`, the resident size that
/// `/proc/self/statm` gives in pages, here in bytes whatever the page size.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// `counted` for int32[4] on `client`'s first device: a load on the worker.
fn load_counted(client: &Client) -> colocated_core::Result<LoadedExecutable> {
    let device = client.devices()[0].clone();
    let spec = spec_on(&[4], DType::I32, &device);
    client.compile(
        Program::native("counted", vec![spec.clone()], vec![spec], vec![device]),
        CompileOptions::default(),
    )
}

/// An int32[4] array of `values` on `client`'s first device.
fn four(client: &Client, values: [i32; 4]) -> colocated_core::Result<Array> {
    let spec = spec_on(&[4], DType::I32, &client.devices()[0]);
    Array::from_host_bytes(client, &i32_bytes(&values), spec)
}

/// The values of `array` once it is ready.
fn values_of(array: &Array) -> colocated_core::Result<Vec<i32>> {
    array.ready_event().wait_timeout(PATIENCE)?;
    Ok(i32_values(&array.to_host_bytes()?))
}

/// `v`, `v + 1`, `v + 2`, `v + 3`, plus `n`.
fn from(v: i32, n: i32) -> [i32; 4] {
    [v + n, v + 1 + n, v + 2 + n, v + 3 + n]
}

/// Chains of `counted` executions, sent without waiting, from arrays of
/// random values: every output is read and checked (so a call lost, run
/// twice on the value, or answered with another's result shows).
fn chains(client: Client, exe: LoadedExecutable) -> impl FnOnce(&Soak, &Beat) + Send {
    move |soak, beat| {
        let mut rng = Rng::new(soak.seed, 1);
        let mut chain = 0;
        while !soak.stopped() {
            if soak.quiet_asked() {
                soak.rest(Some(beat));
                continue;
            }
            chain += 1;
            let (n, v) = (rng.range(1, 33) as i32, rng.range(0, 1 << 20) as i32);
            if let Err(e) = one_chain(soak, &client, &exe, n, v) {
                soak.fail(format!("chain {chain} of {n} calls from {v}: {e}"));
                return;
            }
            soak.tally.chains.fetch_add(1, Ordering::SeqCst);
            beat.now(soak);
        }
    }
}

fn one_chain(
    soak: &Soak,
    client: &Client,
    exe: &LoadedExecutable,
    n: i32,
    v: i32,
) -> colocated_core::Result<()> {
    let mut outputs = Vec::with_capacity(n as usize);
    let mut x = four(client, from(v, 0))?;
    for _ in 0..n {
        let run = exe.execute(std::slice::from_ref(&x), &ExecuteOptions::default())?;
        soak.tally.counted_calls.fetch_add(1, Ordering::SeqCst);
        x = run.outputs.into_iter().next().expect("one output");
        outputs.push(x.clone());
    }
    for (i, out) in outputs.iter().enumerate() {
        let (got, want) = (values_of(out)?, from(v, i as i32 + 1));
        if got != want {
            return Err(colocated_core::Error::internal(format!(
                "call {} gave {got:?}, not {want:?}",
                i + 1
            )));
        }
    }
    Ok(())
}

/// Now and then loads `counted` again and runs the new executable once;
/// keeps the latest two loaded (an older one is unloaded).
fn loads(client: Client) -> impl FnOnce(&Soak, &Beat) + Send {
    move |soak, beat| {
        let mut rng = Rng::new(soak.seed, 2);
        let mut loaded = VecDeque::new();
        let mut load = 0;
        while !soak.stopped() {
            if !soak.sleep(rng.millis(200, 2000)) {
                if soak.quiet_asked() {
                    loaded.clear();
                    soak.rest(Some(beat));
                }
                continue;
            }
            load += 1;
            let v = rng.range(0, 1 << 20) as i32;
            let ran = load_counted(&client).and_then(|exe| {
                soak.tally.loads.fetch_add(1, Ordering::SeqCst);
                let x = four(&client, from(v, 0))?;
                let run = exe.execute(&[x], &ExecuteOptions::default())?;
                soak.tally.counted_calls.fetch_add(1, Ordering::SeqCst);
                let got = values_of(&run.outputs[0])?;
                loaded.push_back(exe);
                Ok(got)
            });
            match ran {
                Ok(got) if got == from(v, 1) => {}
                Ok(got) => {
                    soak.fail(format!(
                        "load {load}: the new executable gave {got:?} from {v}"
                    ));
                    return;
                }
                Err(e) => {
                    soak.fail(format!("load {load}: {e}"));
                    return;
                }
            }
            if loaded.len() > 2 {
                loaded.pop_front();
            }
            beat.now(soak);
        }
    }
}

/// A buffer on the worker and the seed of its contents.
struct Held {
    buffer: Buffer,
    seed: u64,
    len: usize,
}

/// Uploads buffers of 1 to 8 MiB (whole MiB) of pseudo-random bytes,
/// downloads each and checks it; keeps the latest few (so that at most
/// [`HELD_AT_ONCE`] live at once), and downloads and checks an older one
/// again before it lets it go.
fn transfers(client: Client) -> impl FnOnce(&Soak, &Beat) + Send {
    move |soak, beat| {
        let mut rng = Rng::new(soak.seed, 3);
        let mut held: VecDeque<Held> = VecDeque::new();
        let mut transfer = 0;
        while !soak.stopped() {
            if soak.quiet_asked() {
                // Reads back what it keeps, and lets it go.
                for old in held.drain(..) {
                    if let Err(e) = download_and_check(soak, &old) {
                        soak.fail(format!("reading a kept buffer of {} bytes: {e}", old.len));
                        return;
                    }
                }
                soak.rest(Some(beat));
                continue;
            }
            transfer += 1;
            let len = (rng.range(1, 9) as usize) << 20;
            let seed = rng.next();
            match upload_and_check(soak, &client, seed, len) {
                Ok(buffer) => held.push_back(Held { buffer, seed, len }),
                Err(e) => {
                    soak.fail(format!("transfer {transfer} of {len} bytes: {e}"));
                    return;
                }
            }
            if held.len() == HELD_AT_ONCE {
                let i = rng.range(0, held.len() as u64) as usize;
                let old = held.remove(i).expect("an index in range");
                if let Err(e) = download_and_check(soak, &old) {
                    soak.fail(format!("reading a kept buffer of {} bytes: {e}", old.len));
                    return;
                }
            }
            beat.now(soak);
        }
    }
}

fn upload_and_check(
    soak: &Soak,
    client: &Client,
    seed: u64,
    len: usize,
) -> colocated_core::Result<Buffer> {
    let bytes = pseudo_random_bytes(seed, len);
    let device = &client.devices()[0];
    let buffer = Buffer::from_bytes(client, &bytes, DType::I32, &[len as i64 / 4], device)?;
    buffer.ready_event().wait_timeout(PATIENCE)?;
    soak.tally.uploads.fetch_add(1, Ordering::SeqCst);
    soak.tally.bytes_up.fetch_add(len as u64, Ordering::SeqCst);
    drop(bytes);
    let held = Held { buffer, seed, len };
    download_and_check(soak, &held)?;
    Ok(held.buffer)
}

fn download_and_check(soak: &Soak, held: &Held) -> colocated_core::Result<()> {
    let back = held.buffer.to_host_vec()?;
    soak.tally.downloads.fetch_add(1, Ordering::SeqCst);
    soak.tally
        .bytes_down
        .fetch_add(held.len as u64, Ordering::SeqCst);
    if back != pseudo_random_bytes(held.seed, held.len) {
        return Err(colocated_core::Error::internal(
            "the buffer came back changed",
        ));
    }
    Ok(())
}

/// The most buffers the transfers thread holds on the worker at once.
const HELD_AT_ONCE: usize = 4;

/// Holds [`HELD_AT_ONCE`] buffers of each size the transfers make at once,
/// then lets them go: the most of each size the soak ever holds. Whatever
/// the process keeps of freed transfer buffers for reuse (it keeps large
/// ones, by size) then has what the soak's transfers will ever leave there,
/// and memory measured later does not grow with it.
fn warm_transfers(client: &Client) {
    let device = &client.devices()[0];
    let held: Vec<Buffer> = (1..=8)
        .flat_map(|mib| std::iter::repeat_n(mib << 20, HELD_AT_ONCE))
        .map(|len| {
            let bytes = pseudo_random_bytes(len as u64, len);
            let dims = [len as i64 / 4];
            let buffer = Buffer::from_bytes(client, &bytes, DType::I32, &dims, device).unwrap();
            buffer.ready_event().wait_timeout(PATIENCE).unwrap();
            buffer
        })
        .collect();
    drop(held);
}

/// Runs `ask` (which calls the controller's host callback once) one to
/// four at a time, and waits for each run.
fn asks(exe: LoadedExecutable) -> impl FnOnce(&Soak, &Beat) + Send {
    move |soak, beat| {
        let mut rng = Rng::new(soak.seed, 4);
        while !soak.stopped() {
            if soak.quiet_asked() {
                soak.rest(Some(beat));
                continue;
            }
            let runs = rng.range(1, 5);
            let ran = (0..runs)
                .map(|_| {
                    let run = exe.execute(&[], &ExecuteOptions::default())?;
                    soak.tally.ask_calls.fetch_add(1, Ordering::SeqCst);
                    Ok(run.status)
                })
                .collect::<colocated_core::Result<Vec<_>>>()
                .and_then(|statuses| {
                    statuses
                        .iter()
                        .try_for_each(|status| status.wait_timeout(PATIENCE))
                });
            if let Err(e) = ran {
                soak.fail(format!("a run of ask: {e}"));
                return;
            }
            beat.now(soak);
        }
    }
}

/// Every 0.5 to 3 s, one fault: a reset; a partition of 0.2 to 2 s; 0 to
/// 30 ms of latency each way for 1 to 5 s; or a limit of
/// [`SLOWEST_LINK`] to 64 MiB/s each way for 1 to 5 s (latency and limit
/// may overlap other faults). Heals everything while the watcher asks for
/// quiet, and once the soak stops.
fn faults(soak: &Soak, proxy: &FaultProxy) {
    let mut rng = Rng::new(soak.seed, 5);
    let (mut latency_until, mut bandwidth_until): (Option<Instant>, Option<Instant>) = (None, None);
    let heal = || {
        proxy.partition(false);
        proxy.set_latency(Direction::Both, Duration::ZERO);
        proxy.set_bandwidth(Direction::Both, None);
    };
    while !soak.stopped() {
        if !soak.sleep(rng.millis(500, 3000)) {
            if soak.quiet_asked() {
                heal();
                (latency_until, bandwidth_until) = (None, None);
                soak.note("quiet".into());
                soak.rest(None);
            }
            continue;
        }
        let now = Instant::now();
        if latency_until.is_some_and(|t| now >= t) {
            latency_until = None;
            proxy.set_latency(Direction::Both, Duration::ZERO);
        }
        if bandwidth_until.is_some_and(|t| now >= t) {
            bandwidth_until = None;
            proxy.set_bandwidth(Direction::Both, None);
        }
        let tally = &soak.tally;
        match rng.range(0, 4) {
            0 => {
                soak.note("reset".into());
                proxy.reset();
                tally.resets.fetch_add(1, Ordering::SeqCst);
            }
            1 => {
                let lasts = rng.millis(200, LONGEST_PARTITION.as_millis() as u64 + 1);
                soak.note(format!("partition for {lasts:?}"));
                proxy.partition(true);
                soak.sleep(lasts);
                proxy.partition(false);
                soak.note("healed".into());
                tally.partitions.fetch_add(1, Ordering::SeqCst);
            }
            2 => {
                let (latency, lasts) = (rng.millis(0, 31), rng.millis(1000, 5000));
                soak.note(format!("latency {latency:?} each way for {lasts:?}"));
                proxy.set_latency(Direction::Both, latency);
                latency_until = Some(Instant::now() + lasts);
                tally.latencies.fetch_add(1, Ordering::SeqCst);
            }
            _ => {
                let mib = rng.range(SLOWEST_LINK, 65);
                let lasts = rng.millis(1000, 5000);
                soak.note(format!("{mib} MiB/s each way for {lasts:?}"));
                proxy.set_bandwidth(Direction::Both, Some(mib << 20));
                bandwidth_until = Some(Instant::now() + lasts);
                tally.bandwidths.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    heal();
}

/// The seed: `COLOCATED_SOAK_SEED` (decimal), else one from the clock.
fn seed() -> u64 {
    match std::env::var("COLOCATED_SOAK_SEED") {
        Ok(s) => s.trim().parse().expect("COLOCATED_SOAK_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// How long the soak runs: `COLOCATED_SOAK_SECONDS`, else [`DEFAULT_SECONDS`].
fn soak_duration() -> Duration {
    let seconds = std::env::var("COLOCATED_SOAK_SECONDS")
        .map(|s| {
            s.trim()
                .parse()
                .expect("COLOCATED_SOAK_SECONDS is a number")
        })
        .unwrap_or(DEFAULT_SECONDS);
    Duration::from_secs(seconds)
}

/// A worker of one device with `counted` (`add_one_i32` that counts its
/// runs) and `ask` (which calls the controller's host callback 0 with
/// "ping" and wants "pong"), its token, and a proxy in front of it.
fn start_worker(counted: &Arc<AtomicUsize>) -> (Worker, Token, FaultProxy) {
    let client = client_with_threads(1, 4);
    common::register_counted(&client, counted);
    common::register_ask(&client);
    let token = Token::generate().unwrap();
    let worker = common::start_worker(client, &token, |o| {
        o.heartbeat_interval = HEARTBEAT_INTERVAL;
        o.session_timeout = SESSION_TIMEOUT;
    });
    let proxy = FaultProxy::start(worker.local_addr()).unwrap();
    (worker, token, proxy)
}

/// A controller of the worker alone, connected through `proxy`.
fn controller(proxy: &FaultProxy, token: &Token) -> Client {
    let mut worker = ConnectOptions::new(proxy.addr().to_string(), Some(token.clone()));
    worker.timeout = Duration::from_secs(5);
    Client::connect(&ClusterOptions {
        workers: vec![worker],
        include_local: false,
        local: ClientOptions::default(),
    })
    .expect("a controller of the worker through the proxy")
}

/// `ask` on `client`'s device with a host callback that counts its calls
/// in `calls` and answers "pong".
fn load_ask(client: &Client, calls: &Arc<AtomicUsize>) -> LoadedExecutable {
    let counter = calls.clone();
    let callback = LoadedHostCallback::new("pong", move |_| {
        // Now and then a slower answer, so that faults find calls in flight.
        if counter.fetch_add(1, Ordering::SeqCst) % 4 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(b"pong".to_vec())
    });
    let program = Program::native("ask", vec![], vec![], client.devices().to_vec());
    let options = CompileOptions {
        host_callbacks: vec![callback],
    };
    client.compile(program, options).expect("ask loaded")
}

/// Polls until `holds` or `PATIENCE` passes: whether it held.
fn within_patience(holds: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while !holds() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The memory of this process (controller, worker and proxy together).
#[derive(Clone, Copy, Debug, Default)]
struct Memory {
    /// Bytes allocated and not freed ([`LIVE_HEAP`]).
    live_heap: isize,
    /// Resident bytes, where the system says.
    resident: Option<u64>,
}

impl Memory {
    fn now() -> Memory {
        Memory {
            live_heap: LIVE_HEAP.load(Ordering::Relaxed),
            resident: resident_bytes(),
        }
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "heap {:.1} MiB, resident {} MiB",
            self.live_heap as f64 / (1 << 20) as f64,
            self.resident.unwrap_or(0) >> 20
        )
    }
}

/// Asks every thread (`threads` of them, the fault thread included) to
/// rest, waits until all do and the worker holds only what the test holds
/// at rest (the `kept` buffer, the executables of the chains and of the
/// asks, no answer the controller has not acknowledged), measures the
/// memory, and lets the threads go on. `None` if the soak stopped or failed
/// meanwhile.
fn quiet_point(soak: &Soak, worker: &Worker, threads: usize) -> Option<Memory> {
    soak.quiet.store(true, Ordering::SeqCst);
    let all_rest =
        within_patience(|| soak.stopped() || soak.resting.load(Ordering::SeqCst) == threads);
    let settled = all_rest
        && within_patience(|| {
            soak.stopped()
                || (worker.buffer_count() == 1
                    && worker.executable_count() == 2
                    && worker.kept_answers() == 0)
        });
    // What the worker let go is freed by tasks that may still run a moment.
    std::thread::sleep(Duration::from_millis(200));
    let memory = Memory::now();
    if !all_rest {
        soak.fail(format!(
            "{} of {threads} threads came to rest within {PATIENCE:?}: a hang",
            soak.resting.load(Ordering::SeqCst)
        ));
    } else if !settled {
        soak.fail(format!(
            "at rest, the worker holds {} buffers, {} executables and {} answers, not 1, 2 and 0",
            worker.buffer_count(),
            worker.executable_count(),
            worker.kept_answers()
        ));
    }
    soak.quiet.store(false, Ordering::SeqCst);
    (!soak.stopped()).then_some(memory)
}

/// Memory must not grow from the quiet point after the warm-up (`warm`)
/// to the end (`end`), once the work has stopped: the live heap by no more
/// than [`HEAP_GROWTH_BOUND`], the resident memory by no more than
/// [`RSS_GROWTH_BOUND`].
///
/// At both points no work is in flight, the worker holds one small buffer,
/// and the warm-up has filled what the process keeps for reuse (see
/// [`warm_transfers`]); at the end the test no longer holds the two
/// executables it held at the quiet point. So the live heap should not grow
/// at all; the bound (16 MiB) allows for a buffer kept for reuse that a
/// transfer started again left one more of, and for tables that grow once
/// to a new high-water mark. It is less than a leak of 1 KiB a call would
/// add in the default run (some 20,000 calls after the quiet point), or a
/// leak of one transfer buffer in ten. The resident memory also holds what
/// the allocator has freed but not yet given back (mimalloc keeps freed
/// pages a while, per thread); its bound allows for a few of the largest
/// buffers (8 MiB) of that.
fn check_memory_is_flat(soak: &Soak, warm: Memory, end: Memory) {
    assert!(
        end.live_heap <= warm.live_heap + HEAP_GROWTH_BOUND,
        "the live heap grew from {warm} after the warm-up to {end} at the end; {}",
        soak.report()
    );
    let (Some(warm_rss), Some(end_rss)) = (warm.resident, end.resident) else {
        eprintln!("soak: this system does not say a process's resident memory: not checked");
        return;
    };
    assert!(
        end_rss <= warm_rss + RSS_GROWTH_BOUND,
        "resident memory grew from {warm} after the warm-up to {end} at the end; {}",
        soak.report()
    );
}

#[test]
fn random_faults_for_a_while_lose_nothing_run_nothing_twice_and_keep_memory_flat() {
    let duration = soak_duration();
    let seed = seed();
    eprintln!(
        "soak: seed {seed} (COLOCATED_SOAK_SEED={seed} replays it), {} s",
        duration.as_secs()
    );
    let counted = Arc::new(AtomicUsize::new(0));
    let (worker, token, proxy) = start_worker(&counted);
    let client = controller(&proxy, &token);
    // Made before any fault, held throughout, read at the end.
    let kept = four(&client, [1, 2, 3, 4]).unwrap();
    kept.ready_event().wait_timeout(PATIENCE).unwrap();
    let callback_calls = Arc::new(AtomicUsize::new(0));
    let ask = load_ask(&client, &callback_calls);
    let chained = load_counted(&client).expect("counted loaded");
    warm_transfers(&client);

    let soak = Arc::new(Soak {
        seed,
        began: Instant::now(),
        stop: AtomicBool::new(false),
        quiet: AtomicBool::new(false),
        resting: AtomicUsize::new(0),
        log: Mutex::new(VecDeque::new()),
        failures: Mutex::new(Vec::new()),
        tally: Tally::default(),
    });
    let proxy = Arc::new(proxy);
    let fault_thread = {
        let (soak, proxy) = (soak.clone(), proxy.clone());
        std::thread::Builder::new()
            .name("faults".into())
            .spawn(move || faults(&soak, &proxy))
            .expect("the fault thread")
    };
    let work = vec![
        spawn_work(&soak, "chains", chains(client.clone(), chained)),
        spawn_work(&soak, "loads", loads(client.clone())),
        spawn_work(&soak, "transfers", transfers(client.clone())),
        spawn_work(&soak, "asks", asks(ask)),
    ];

    // Watch: every thread keeps finishing work (a unit takes at most a few
    // seconds, a partition and a reconnect included: PATIENCE is far more),
    // and measure the memory at a quiet point once warm.
    let warm_up = duration / 4;
    let (mut warm, mut max_rss, mut timeline, mut samples) = (None, 0, Vec::new(), 0);
    while !soak.stopped() && soak.began.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(100));
        let now = Memory::now();
        max_rss = max_rss.max(now.resident.unwrap_or(0));
        if soak.began.elapsed() >= duration / 10 * samples {
            samples += 1;
            timeline.push(format!(
                "{:.0} s: {}",
                soak.began.elapsed().as_secs_f64(),
                now
            ));
        }
        if warm.is_none() && soak.began.elapsed() >= warm_up {
            warm = quiet_point(&soak, &worker, work.len() + 1);
            timeline.push(format!(
                "{:.0} s, quiet: {}",
                soak.began.elapsed().as_secs_f64(),
                warm.unwrap_or_default()
            ));
        }
        for thread in &work {
            let silent = thread.beat.silent_for(&soak);
            if silent > PATIENCE {
                soak.fail(format!(
                    "the {} thread finished nothing for {silent:?}: a hang",
                    thread.beat.name
                ));
            }
        }
    }
    soak.stop.store(true, Ordering::SeqCst);
    let ended = Instant::now();
    let all_finished = within_patience(|| {
        fault_thread.is_finished() && work.iter().all(|t| t.handle.is_finished())
    });
    assert!(
        all_finished,
        "work still in flight {:?} after the soak stopped: a hang; {}",
        ended.elapsed(),
        soak.report()
    );
    fault_thread.join().unwrap();
    for thread in work {
        thread.handle.join().unwrap();
    }
    // What the worker holds once the work is done: the test holds one
    // buffer (`kept`) and no executable, and the controller acknowledges
    // every answer (with its heartbeats).
    let flat = within_patience(|| {
        worker.buffer_count() == 1 && worker.executable_count() == 0 && worker.kept_answers() == 0
    });
    let end = Memory::now();
    let (tally, stats) = (&soak.tally, proxy.stats());
    eprintln!(
        "soak: {:.1} s, seed {seed}; faults: {} resets, {} partitions, {} latencies, {} \
         bandwidth limits; {} connections; {} calls of counted ({} chains, {} loads), {} \
         calls of the host callback; {} uploads ({} MiB), {} downloads ({} MiB); the worker \
         holds {} buffers, {} executables, {} answers; memory at the quiet point after the \
         warm-up: {}; at the end: {}; resident at most {} MiB",
        ended.duration_since(soak.began).as_secs_f64(),
        tally.resets.load(Ordering::SeqCst),
        tally.partitions.load(Ordering::SeqCst),
        tally.latencies.load(Ordering::SeqCst),
        tally.bandwidths.load(Ordering::SeqCst),
        stats.accepted,
        tally.counted_calls.load(Ordering::SeqCst),
        tally.chains.load(Ordering::SeqCst),
        tally.loads.load(Ordering::SeqCst),
        tally.ask_calls.load(Ordering::SeqCst),
        tally.uploads.load(Ordering::SeqCst),
        tally.bytes_up.load(Ordering::SeqCst) >> 20,
        tally.downloads.load(Ordering::SeqCst),
        tally.bytes_down.load(Ordering::SeqCst) >> 20,
        worker.buffer_count(),
        worker.executable_count(),
        worker.kept_answers(),
        warm.unwrap_or_default(),
        end,
        max_rss >> 20,
    );
    eprintln!("soak: memory over time: {}", timeline.join("; "));

    let failures = soak.failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{}; {}",
        failures.join("; "),
        soak.report()
    );
    // Every call ran once, every callback call too, and the session lives.
    assert_eq!(
        counted.load(Ordering::SeqCst),
        tally.counted_calls.load(Ordering::SeqCst),
        "runs of counted vs calls made; {}",
        soak.report()
    );
    assert_eq!(
        callback_calls.load(Ordering::SeqCst),
        tally.ask_calls.load(Ordering::SeqCst),
        "host callback calls vs runs of ask; {}",
        soak.report()
    );
    assert!(
        !client.host_lost(0).unwrap().is_ready(),
        "the worker's host was lost; {}",
        soak.report()
    );
    assert_eq!(values_of(&kept).unwrap(), vec![1, 2, 3, 4]);
    assert!(
        flat,
        "the worker holds {} buffers, {} executables and {} answers, not 1, 0 and 0; {}",
        worker.buffer_count(),
        worker.executable_count(),
        worker.kept_answers(),
        soak.report()
    );
    let warm = warm.expect("a quiet point after the warm-up");
    check_memory_is_flat(&soak, warm, end);
}
