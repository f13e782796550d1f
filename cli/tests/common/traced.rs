//! What the trace tests share: workers that run the test plugin, a client of
//! them, executions on streams, and reading a trace file.

use std::path::Path;
use std::time::Duration;

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    Program, Sharding,
};
use serde_json::Value;

#[path = "../../../tests/plugin/compile.rs"]
mod compile;

/// The test plugin, built into `dir`.
pub fn plugin(dir: &Path) -> String {
    let source = compile::workspace().join("tests/plugin/add_one_plugin.c");
    let library = compile::compile_plugin(dir, "add_one_plugin", &source);
    library.to_str().expect("a UTF-8 path").to_owned()
}

/// A client of the workers at `addresses` (one device each), not of this
/// process.
pub fn client_of(addresses: &[String], token: &Token) -> Client {
    let workers = addresses
        .iter()
        .map(|address| {
            let mut connect = ConnectOptions::new(address.clone(), Some(token.clone()));
            connect.timeout = Duration::from_secs(10);
            connect
        })
        .collect();
    Client::connect(&ClusterOptions {
        workers,
        include_local: false,
        local: ClientOptions {
            executor_threads: Some(2),
            ..Default::default()
        },
    })
    .expect("the workers accept a session")
}

/// Runs the plugin's `plugin_add_one_i32` over every device of `client` once
/// on each of two new streams; returns the streams' ids.
pub fn run_on_two_streams(client: &Client) -> Vec<u64> {
    let devices = client.devices().to_vec();
    let n = devices.len();
    let sharding =
        Sharding::named(devices.clone(), vec![n], vec!["x".into()], vec![vec![0]]).unwrap();
    let spec = ArraySpec::new(vec![n as i64], DType::I32, sharding).unwrap();
    let bytes: Vec<u8> = (0..n as i32).flat_map(|v| v.to_le_bytes()).collect();
    let x = Array::from_host_bytes(client, &bytes, spec.clone()).unwrap();
    let program = Program::native(
        "plugin_add_one_i32",
        vec![spec.clone()],
        vec![spec],
        devices,
    );
    let add_one = client.compile(program, CompileOptions::default()).unwrap();
    let streams = [client.create_stream(), client.create_stream()];
    for stream in &streams {
        let options = ExecuteOptions {
            stream: Some(stream.clone()),
        };
        let run = add_one.execute(std::slice::from_ref(&x), &options).unwrap();
        run.status.wait().unwrap();
    }
    streams.iter().map(|s| s.id()).collect()
}

/// The events of the trace file at `path`, which must be a JSON array.
pub fn events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the trace {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the trace {} is not valid JSON: {e}", path.display()))
}

/// The names of the trace's processes (`process_name` metadata), by pid.
pub fn process_names(events: &[Value]) -> Vec<(u64, String)> {
    events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| {
            (
                e["pid"].as_u64().expect("a pid"),
                e["args"]["name"].as_str().expect("a name").to_owned(),
            )
        })
        .collect()
}
