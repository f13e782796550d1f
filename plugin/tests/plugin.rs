//! Plugin libraries loaded into a local client in this process: the functions a
//! plugin registers run over every shard, their errors reach the execution's
//! status, and libraries that are missing, not plugins, or whose init fails are
//! refused with a message naming them. The plugins are C, compiled at test time
//! against the checked-in header.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, CompileOptions, DType, ErrorCode, ExecuteOptions,
    Program, Result, Sharding,
};
use colocated_plugin::load_plugin;

#[path = "../../tests/plugin/compile.rs"]
mod compile;
use compile::{compile_plugin, workspace};

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "colocated-plugin-test-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles C `code` (which may include colocated.h) into `dir/lib{name}.so`.
fn compile_code(dir: &Path, name: &str, code: &str) -> PathBuf {
    let source = dir.join(format!("{name}.c"));
    std::fs::write(&source, code).unwrap();
    compile_plugin(dir, name, &source)
}

fn add_one_plugin(dir: &Path) -> PathBuf {
    compile_plugin(
        dir,
        "add_one_plugin",
        &workspace().join("tests/plugin/add_one_plugin.c"),
    )
}

fn client(devices: usize) -> Client {
    Client::new_local(ClientOptions {
        num_cpu_devices: Some(devices),
        executor_threads: Some(4),
        ..Default::default()
    })
    .unwrap()
}

fn sharded(client: &Client, n: i64, dtype: DType) -> ArraySpec {
    let devices = client.devices().to_vec();
    let mesh = vec![devices.len()];
    let sharding = Sharding::named(devices, mesh, vec!["x".into()], vec![vec![0]]).unwrap();
    ArraySpec::new(vec![n], dtype, sharding).unwrap()
}

fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i32_values(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs native `function` from `x` to an array of `out`, waiting for the status.
fn run(client: &Client, function: &str, x: &Array, out: &ArraySpec) -> Result<Array> {
    let program = Program::native(
        function,
        vec![x.spec().clone()],
        vec![out.clone()],
        client.devices().to_vec(),
    );
    let exe = client.compile(program, CompileOptions::default())?;
    let run = exe.execute(std::slice::from_ref(x), &ExecuteOptions::default())?;
    run.status.wait()?;
    Ok(run.outputs.into_iter().next().unwrap())
}

#[track_caller]
fn assert_error<T>(result: Result<T>, code: ErrorCode, fragments: &[&str]) {
    let Err(e) = result else {
        panic!("expected {code}, got a success")
    };
    assert_eq!(e.code(), code, "{e}");
    for fragment in fragments {
        assert!(e.message().contains(fragment), "{fragment:?} not in {e}");
    }
}

#[test]
fn a_plugins_functions_run_over_every_shard_of_the_host() {
    let dir = TempDir::new("runs");
    let client = client(3);
    let names = load_plugin(&client, &add_one_plugin(&dir.0)).unwrap();
    assert_eq!(names, ["plugin_add_one_i32", "plugin_fail"]);
    let spec = sharded(&client, 12, DType::I32);
    let values: Vec<i32> = (0..12).map(|v| v * 10 - 40).collect();
    let x = Array::from_host_bytes(&client, &i32_bytes(&values), spec.clone()).unwrap();
    let y = run(&client, "plugin_add_one_i32", &x, &spec).unwrap();
    let expected: Vec<i32> = values.iter().map(|v| v + 1).collect();
    assert_eq!(i32_values(&y.to_host_bytes().unwrap()), expected);
    // The output owns its memory: it outlives its input and feeds the next call.
    x.delete();
    let z = run(&client, "plugin_add_one_i32", &y, &spec).unwrap();
    y.delete();
    let expected: Vec<i32> = values.iter().map(|v| v + 2).collect();
    assert_eq!(i32_values(&z.to_host_bytes().unwrap()), expected);
}

#[test]
fn plugin_functions_run_concurrently_on_many_threads() {
    let dir = TempDir::new("threads");
    let client = Arc::new(client(2));
    load_plugin(&client, &add_one_plugin(&dir.0)).unwrap();
    let spec = sharded(&client, 1024, DType::I32);
    let program = Program::native(
        "plugin_add_one_i32",
        vec![spec.clone()],
        vec![spec.clone()],
        client.devices().to_vec(),
    );
    let exe = Arc::new(client.compile(program, CompileOptions::default()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (client, exe, spec) = (client.clone(), exe.clone(), spec.clone());
            std::thread::spawn(move || {
                let values: Vec<i32> = (0..1024).map(|v| v + t * 10_000).collect();
                let mut x = Array::from_host_bytes(&client, &i32_bytes(&values), spec).unwrap();
                for _ in 0..25 {
                    let run = exe.execute(&[x], &ExecuteOptions::default()).unwrap();
                    x = run.outputs.into_iter().next().unwrap();
                }
                let expected: Vec<i32> = values.iter().map(|v| v + 25).collect();
                assert_eq!(i32_values(&x.to_host_bytes().unwrap()), expected);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_plugin_functions_code_and_message_reach_the_status() {
    let dir = TempDir::new("errors");
    let client = client(2);
    load_plugin(&client, &add_one_plugin(&dir.0)).unwrap();
    let spec = sharded(&client, 4, DType::I32);
    let x = Array::from_host_bytes(&client, &i32_bytes(&[1, 2, 3, 4]), spec.clone()).unwrap();
    assert_error(
        run(&client, "plugin_fail", &x, &spec),
        ErrorCode::FailedPrecondition,
        &["plugin function 'plugin_fail': plugin_fail failed on purpose (2 input shards)"],
    );
    // The plugin's own checks: float32 is not what it takes.
    let f32_spec = sharded(&client, 4, DType::F32);
    let f = Array::from_host_bytes(&client, &[0u8; 16], f32_spec.clone()).unwrap();
    assert_error(
        run(&client, "plugin_add_one_i32", &f, &f32_spec),
        ErrorCode::InvalidArgument,
        &["plugin_add_one_i32 takes and returns int32 arrays, got dtypes 12 and 12"],
    );
}

#[test]
fn string_arrays_are_refused_before_the_plugin_runs() {
    let dir = TempDir::new("strings");
    let client = client(2);
    load_plugin(&client, &add_one_plugin(&dir.0)).unwrap();
    let strings = sharded(&client, 2, DType::String);
    let s = Array::from_host_strings(&client, &["a", "b"], strings.clone()).unwrap();
    let ints = sharded(&client, 2, DType::I32);
    assert_error(
        run(&client, "plugin_add_one_i32", &s, &ints),
        ErrorCode::InvalidArgument,
        &["plugin function 'plugin_add_one_i32': input 0 is a string array"],
    );
    let x = Array::from_host_bytes(&client, &i32_bytes(&[1, 2]), ints).unwrap();
    assert_error(
        run(&client, "plugin_add_one_i32", &x, &strings),
        ErrorCode::InvalidArgument,
        &["output shard 0 is a string array"],
    );
}

#[test]
fn a_name_the_registry_holds_already_fails_the_load() {
    let dir = TempDir::new("twice");
    let client = client(1);
    let plugin = add_one_plugin(&dir.0);
    load_plugin(&client, &plugin).unwrap();
    assert_error(
        load_plugin(&client, &plugin),
        ErrorCode::AlreadyExists,
        &[
            &plugin.display().to_string(),
            "native function 'plugin_add_one_i32' is already registered",
        ],
    );
    // Another client of the same process loads the same library again.
    let other = self::client(1);
    assert_eq!(load_plugin(&other, &plugin).unwrap().len(), 2);
}

#[test]
fn missing_files_and_libraries_that_are_not_plugins_are_refused() {
    let dir = TempDir::new("refused");
    let client = client(1);
    let missing = dir.0.join("libmissing.so");
    assert_error(
        load_plugin(&client, &missing),
        ErrorCode::NotFound,
        &[&format!(
            "plugin library {} does not exist",
            missing.display()
        )],
    );
    assert_error(
        load_plugin(&client, Path::new("")),
        ErrorCode::InvalidArgument,
        &["path is empty"],
    );
    assert_error(
        load_plugin(&client, &dir.0),
        ErrorCode::InvalidArgument,
        &["is a directory"],
    );
    let text = dir.0.join("notes.txt");
    std::fs::write(&text, "not a library").unwrap();
    assert_error(
        load_plugin(&client, &text),
        ErrorCode::InvalidArgument,
        &[&format!("cannot load plugin library {}", text.display())],
    );
    let no_init = compile_code(&dir.0, "no_init", "int not_a_plugin(void) { return 0; }\n");
    assert_error(
        load_plugin(&client, &no_init),
        ErrorCode::InvalidArgument,
        &[&format!(
            "plugin library {} does not export colocated_plugin_init",
            no_init.display()
        )],
    );
}

#[test]
fn a_failing_init_fails_the_load_with_its_code_and_registers_nothing() {
    let dir = TempDir::new("init");
    let client = client(1);
    let failing = compile_code(
        &dir.0,
        "failing_init",
        r#"#include <string.h>
#include "colocated.h"
static uint32_t noop(void *user_data, const colocated_plugin_call *call) {
  (void)user_data;
  (void)call;
  return 0;
}
COLOCATED_PLUGIN_EXPORT uint32_t colocated_plugin_init(const colocated_plugin_registrar *r) {
  if (r->register_function(r->context, (const uint8_t *)"half_done", 9, noop, NULL) != 0) return COLOCATED_INTERNAL;
  r->register_function(r->context, (const uint8_t *)"", 0, noop, NULL);
  return COLOCATED_UNAVAILABLE;
}
"#,
    );
    assert_error(
        load_plugin(&client, &failing),
        ErrorCode::Unavailable,
        &[
            &format!(
                "colocated_plugin_init of plugin library {} failed",
                failing.display()
            ),
            "refused: a function name must not be empty",
        ],
    );
    // What it registered before failing was not added.
    let spec = sharded(&client, 1, DType::I32);
    let x = Array::from_host_bytes(&client, &i32_bytes(&[1]), spec.clone()).unwrap();
    assert_error(
        run(&client, "half_done", &x, &spec),
        ErrorCode::NotFound,
        &["no native function 'half_done'"],
    );
    let odd = compile_code(
        &dir.0,
        "odd_code",
        r#"#include "colocated.h"
COLOCATED_PLUGIN_EXPORT uint32_t colocated_plugin_init(const colocated_plugin_registrar *r) {
  (void)r;
  return 77;
}
"#,
    );
    assert_error(
        load_plugin(&client, &odd),
        ErrorCode::Internal,
        &["with 77, which is not a colocated_error_code"],
    );
}
