//! XLA programs on a PJRT plugin (XLA's CPU plugin from PyPI), each figure
//! beside its floor measured in the same run:
//!
//! - execute + await of `x + 1` on `f32[8]` and of a 1024x1024 f32 matmul
//!   through `colocated` (an `Array` in, an `Array` out, program order) against
//!   the same compiled program through the raw PJRT C API (`colocated-pjrt`:
//!   one `PJRT_LoadedExecutable_Execute` and a wait on its event);
//! - 256 MiB host -> plugin device -> host against `memcpy` of the same bytes
//!   twice (into a fresh allocation, as the round trip's read is), and against
//!   the raw PJRT calls (`BufferFromHostBuffer`, `ToHostBuffer`).
//!
//! - execute + await of `x + 1` on a worker (in this process, on loopback)
//!   that serves the plugin, against a 1-byte TCP ping-pong.
//!
//! Goals (issue 34): small program <= 1.2x raw PJRT; matmul within 5%; the
//! worker's call <= 3x the TCP ping-pong.
//! The plugin: `COLOCATED_TEST_PJRT_PLUGIN` (make bench sets it), else
//! build/venv's.

use std::time::{Duration, Instant};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, ClusterOptions, DType, ExecuteOptions, PjrtOptions,
    PjrtValue, Sharding,
};
use colocated_pjrt as pjrt;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ADD_ONE: &str = include_str!("../../tests/xla/add_one.mlir");

const MATMUL: &str = include_str!("../../tests/xla/matmul.mlir");

fn plugin_path() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("COLOCATED_TEST_PJRT_PLUGIN") {
        return Some(p.into());
    }
    let lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/venv/lib");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|e| {
        let p = e
            .path()
            .join("site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so");
        p.exists().then_some(p)
    })
}

/// Timings of `fs` taken in turns (one call of each per round, after `warm`
/// untimed rounds), so that a noisy machine's drift weighs on each alike: per
/// function, the median and the 10th-90th percentile range of `runs` calls,
/// in microseconds.
fn time_in_turns<const N: usize>(
    warm: usize,
    runs: usize,
    mut fs: [&mut dyn FnMut(); N],
) -> [(f64, f64, f64); N] {
    for _ in 0..warm {
        fs.iter_mut().for_each(|f| f());
    }
    let mut t: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::with_capacity(runs));
    for _ in 0..runs {
        for (f, t) in fs.iter_mut().zip(&mut t) {
            let start = Instant::now();
            f();
            t.push(start.elapsed());
        }
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    t.map(|mut t| {
        t.sort();
        (us(t[runs / 2]), us(t[runs / 10]), us(t[runs * 9 / 10]))
    })
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i % 97) as f32).to_le_bytes())
        .collect()
}

fn raw_put(client: &pjrt::Client, bytes: &[u8], dims: &[i64]) -> pjrt::Buffer {
    let memory = client.devices()[0].default_memory().unwrap().clone();
    // SAFETY: copied during the call.
    unsafe {
        client.buffer_from_host(
            bytes.as_ptr(),
            bytes.len(),
            pjrt::ElementType::F32,
            dims,
            pjrt::HostBufferSemantics::ImmutableOnlyDuringCall,
            &memory,
        )
    }
    .unwrap()
    .0
}

fn report(name: &str, ours: (f64, f64, f64), floor_name: &str, floor: (f64, f64, f64)) {
    println!(
        "{name:<34} colocated {:>9.1} us [{:.1}-{:.1}]   {floor_name} {:>9.1} us [{:.1}-{:.1}]   ratio {:.2}x",
        ours.0,
        ours.1,
        ours.2,
        floor.0,
        floor.1,
        floor.2,
        ours.0 / floor.0
    );
}

fn main() {
    // `cargo bench` passes --bench; any other argument is a filter we ignore.
    let Some(path) = plugin_path() else {
        println!("pjrt bench skipped: XLA's CPU PJRT plugin is not installed (make venv)");
        return;
    };
    let plugin = pjrt::Plugin::load(&path).unwrap();
    // The plugin's create options: `COLOCATED_BENCH_PJRT_OPTIONS`
    // (`KEY=VALUE,...`, as `--pjrt-option` takes them; the GPU script gives
    // the CUDA plugin's allocator options), else one device of XLA's CPU plugin.
    let options = match std::env::var("COLOCATED_BENCH_PJRT_OPTIONS") {
        Ok(list) => list
            .split(',')
            .filter(|o| !o.is_empty())
            .map(|o| colocated_core::worker::parse_pjrt_option(o).unwrap())
            .collect(),
        Err(_) => vec![("cpu_device_count".to_string(), PjrtValue::Int64(1))],
    };
    let raw = pjrt::Client::create(&plugin, &options).unwrap();
    let local_options = ClientOptions {
        num_cpu_devices: Some(1),
        executor_threads: Some(2),
        pjrt: Some(PjrtOptions {
            plugin: path,
            options,
        }),
        ..Default::default()
    };
    let client = Client::new_local(local_options.clone()).unwrap();
    let device = client.backend_devices(None).unwrap()[0].clone();
    let spec = |dims: Vec<i64>| {
        ArraySpec::new(dims, DType::F32, Sharding::single_device(device.clone())).unwrap()
    };

    for (name, module, shapes, warm, runs) in [
        ("x + 1, f32[8]", ADD_ONE, vec![vec![8i64]], 200, 3000),
        (
            "matmul 1024x1024 f32",
            MATMUL,
            vec![vec![1024i64, 1024], vec![1024, 1024]],
            3,
            25,
        ),
    ] {
        let raw_exe = raw
            .compile(
                module.as_bytes(),
                pjrt::ProgramFormat::Mlir,
                &pjrt::CompileOptions::default(),
            )
            .unwrap();
        let raw_inputs: Vec<pjrt::Buffer> = shapes
            .iter()
            .map(|d| raw_put(&raw, &f32_bytes(d.iter().product::<i64>() as usize), d))
            .collect();
        let exe = client
            .compile_stablehlo(module.as_bytes(), std::slice::from_ref(&device))
            .unwrap();
        let inputs: Vec<Array> = shapes
            .iter()
            .map(|d| {
                let bytes = f32_bytes(d.iter().product::<i64>() as usize);
                Array::from_host_bytes(&client, &bytes, spec(d.clone())).unwrap()
            })
            .collect();
        let options = ExecuteOptions::default();
        let [floor, ours] = time_in_turns(
            warm,
            runs,
            [
                &mut || {
                    let args: Vec<&pjrt::Buffer> = raw_inputs.iter().collect();
                    let (outputs, events) = raw_exe.execute(&[args]).unwrap();
                    for e in events.into_iter().flatten() {
                        e.wait().unwrap();
                    }
                    drop(outputs);
                },
                &mut || {
                    let run = exe.execute(&inputs, &options).unwrap();
                    run.outputs[0].ready_event().wait().unwrap();
                },
            ],
        );
        report(name, ours, "raw PJRT", floor);
    }

    let n = 64 << 20;
    let data = f32_bytes(n);
    // The three take turns with one destination.
    let out = std::cell::RefCell::new(vec![0u8; n * 4]);
    let [memcpy, round_trip, raw_round_trip] = time_in_turns(
        1,
        5,
        [
            &mut || {
                let copy = data.clone();
                let mut out = out.borrow_mut();
                out.copy_from_slice(&copy);
                std::hint::black_box(&*out);
            },
            &mut || {
                let x = Array::from_host_bytes(&client, &data, spec(vec![n as i64])).unwrap();
                x.to_host_into(&mut out.borrow_mut()).unwrap();
            },
            &mut || {
                let b = raw_put(&raw, &data, &[n as i64]);
                let mut out = out.borrow_mut();
                // SAFETY: `out` outlives the wait.
                if let Some(e) = unsafe { b.to_host(out.as_mut_ptr(), out.len()) }.unwrap() {
                    e.wait().unwrap();
                }
            },
        ],
    );
    report(
        "256 MiB host -> plugin -> host",
        round_trip,
        "memcpy x2",
        memcpy,
    );
    report(
        "256 MiB host -> plugin -> host",
        round_trip,
        "raw PJRT",
        raw_round_trip,
    );
    worker_call(local_options);
}

/// `x + 1` on a worker of this process that serves the plugin, through a
/// controller on loopback, beside a 1-byte TCP ping-pong.
fn worker_call(options: ClientOptions) {
    let token = Token::generate().unwrap();
    let served = Client::new_local(options).unwrap();
    let worker = Worker::start(served, WorkerOptions::new(Some(token.clone()))).unwrap();
    let controller = Client::connect(&ClusterOptions {
        workers: vec![ConnectOptions::new(
            worker.local_addr().to_string(),
            Some(token),
        )],
        include_local: false,
        local: ClientOptions::default(),
    })
    .unwrap();
    let device = controller.backend_devices(None).unwrap()[0].clone();
    let exe = controller
        .compile_stablehlo(ADD_ONE.as_bytes(), std::slice::from_ref(&device))
        .unwrap();
    let spec = ArraySpec::new(vec![8], DType::F32, Sharding::single_device(device)).unwrap();
    let x = Array::from_host_bytes(&controller, &f32_bytes(8), spec).unwrap();
    let options = ExecuteOptions::default();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut peer, _)) = listener.accept() {
            let _ = peer.set_nodelay(true);
            let mut byte = [0u8; 1];
            while peer.read_exact(&mut byte).is_ok() && peer.write_all(&byte).is_ok() {}
        }
    });
    let mut ping = TcpStream::connect(address).unwrap();
    ping.set_nodelay(true).unwrap();
    let [ours, tcp] = time_in_turns(
        100,
        2000,
        [
            &mut || {
                let run = exe.execute(std::slice::from_ref(&x), &options).unwrap();
                run.outputs[0].ready_event().wait().unwrap();
            },
            &mut || {
                let mut byte = [1u8; 1];
                ping.write_all(&byte).unwrap();
                ping.read_exact(&mut byte).unwrap();
            },
        ],
    );
    report(
        "x + 1 on a worker with the plugin",
        ours,
        "TCP ping-pong",
        tcp,
    );
    drop(worker);
}
