//! The plugin the tests run on: XLA's CPU plugin, from the PyPI package
//! `lammps-jax-pjrt-cpu` that `make` installs into `build/venv`.

use std::path::PathBuf;
use std::sync::Arc;

use colocated_pjrt::{Client, Plugin, Value};

/// The CPU plugin's path: `COLOCATED_TEST_PJRT_PLUGIN` (set by `make test`),
/// else the one in `build/venv`. `None` outside CI when neither exists; in CI
/// (`CI` set) a missing plugin fails the test.
pub fn plugin_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COLOCATED_TEST_PJRT_PLUGIN") {
        return Some(PathBuf::from(p));
    }
    let venv_lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build/venv/lib");
    let found = std::fs::read_dir(&venv_lib).ok().and_then(|entries| {
        entries.flatten().find_map(|e| {
            let p = e
                .path()
                .join("site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so");
            p.exists().then_some(p)
        })
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "XLA's CPU PJRT plugin is missing: run `make venv`"
        );
        eprintln!("skipped: XLA's CPU PJRT plugin is not installed (run `make venv`)");
    }
    found
}

/// The CPU plugin, loaded.
pub fn plugin() -> Option<Arc<Plugin>> {
    plugin_path().map(|p| Plugin::load(&p).expect("the CPU plugin loads"))
}

/// A client with `n` CPU devices.
pub fn client(n: i64) -> Option<Client> {
    let plugin = plugin()?;
    Some(
        Client::create(&plugin, &[("cpu_device_count".into(), Value::Int64(n))])
            .expect("a CPU client"),
    )
}

/// `x + 1` over `f32[8]`.
pub const ADD_ONE: &str = include_str!("../../tests/xla/add_one.mlir");

/// `x + 1` over `f32[8]` split 4 ways (Shardy, as JAX 0.10 lowers it).
pub const ADD_ONE_SHARDED: &str = include_str!("../../tests/xla/add_one_sharded.mlir");

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
