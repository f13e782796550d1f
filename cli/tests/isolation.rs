//! `colocated worker --isolate-sessions`: each session in a worker process of
//! its own, as core's rules start it (the same as the Python and Node
//! workers'). A plugin function reports the id of the process that runs it.
//! Real processes and sockets on 127.0.0.1.

use std::time::{Duration, Instant};

use colocated_core::session::ConnectOptions;
use colocated_core::transport::Token;
use colocated_core::{
    Array, ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType, ExecuteOptions,
    Program, Sharding,
};

mod common;
#[path = "../../tests/plugin/compile.rs"]
mod compile;
use common::{spawn_worker, Spawned, TempDir};
use compile::{compile_plugin, workspace};

/// A worker with one CPU device, the pid plugin and `extra` flags.
fn spawn(token: &Token, dir: &TempDir, extra: &[&str]) -> Spawned {
    let plugin = compile_plugin(
        &dir.0,
        "pid_plugin",
        &workspace().join("tests/plugin/pid_plugin.c"),
    );
    let plugin = plugin.to_str().unwrap();
    let args = [&["--cpu-devices", "1", "--plugin", plugin], extra].concat();
    spawn_worker(Some(token), &args, None)
}

/// A controller's client of `worker` alone.
fn controller(worker: &Spawned, token: &Token) -> Client {
    let mut connect = ConnectOptions::new(worker.address.clone(), Some(token.clone()));
    connect.timeout = Duration::from_secs(10);
    Client::connect(&ClusterOptions {
        workers: vec![connect],
        include_local: false,
        local: ClientOptions {
            num_cpu_devices: None,
            executor_threads: Some(1),
            ..Default::default()
        },
    })
    .unwrap()
}

/// The id of the process that runs `client`'s session's programs.
fn session_pid(client: &Client) -> u32 {
    let devices = client.devices().to_vec();
    let spec = ArraySpec::new(
        vec![1],
        DType::I32,
        Sharding::single_device(devices[0].clone()),
    )
    .unwrap();
    let x = Array::from_host_bytes(client, &0i32.to_le_bytes(), spec.clone()).unwrap();
    let program = Program::native("plugin_pid", vec![spec.clone()], vec![spec], devices);
    let pid = client.compile(program, CompileOptions::default()).unwrap();
    let run = pid
        .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
        .unwrap();
    run.status.wait().unwrap();
    let bytes = run.outputs[0].to_host_bytes().unwrap();
    u32::try_from(i32::from_le_bytes(bytes[..4].try_into().unwrap())).unwrap()
}

/// True once process `pid` has exited (a zombie not yet reaped counts).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("Z")
        }
        Err(_) => true,
    }
}

/// The parent of live process `pid`.
fn parent(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn eventually(what: &str, patience: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + patience;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {patience:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_controllers_sessions_run_in_processes_of_their_own_that_end_with_them() {
    let token = Token::generate().unwrap();
    let dir = TempDir::new();
    let mut worker = spawn(&token, &dir, &["--isolate-sessions"]);
    let supervisor = worker.child.id();
    let (a, b) = (controller(&worker, &token), controller(&worker, &token));
    let (pid_a, pid_b) = (session_pid(&a), session_pid(&b));
    assert_ne!(pid_a, pid_b);
    for pid in [pid_a, pid_b] {
        assert!(pid != supervisor && pid != std::process::id());
        assert_eq!(
            parent(pid),
            supervisor,
            "a session worker of the supervisor"
        );
    }
    // A session's programs keep running in its own process.
    assert_eq!(session_pid(&a), pid_a);

    // A closed session's worker exits; the other serves on.
    a.close();
    eventually(
        "the closed session's worker exits",
        Duration::from_secs(5),
        || gone(pid_a),
    );
    assert!(!gone(pid_b));
    assert_eq!(session_pid(&b), pid_b);

    // A supervisor killed outright takes its session workers along: their
    // stdin, which it held, closes.
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    eventually(
        "the session worker of a killed supervisor exits",
        Duration::from_secs(5),
        || gone(pid_b),
    );
}

#[test]
fn colocated_worker_serves_every_session_in_its_own_process_by_default() {
    let token = Token::generate().unwrap();
    let dir = TempDir::new();
    let worker = spawn(&token, &dir, &[]);
    let (a, b) = (controller(&worker, &token), controller(&worker, &token));
    assert_eq!(session_pid(&a), worker.child.id());
    assert_eq!(session_pid(&b), worker.child.id());
}

#[test]
fn isolating_and_sharing_sessions_exclude_each_other() {
    let dir = TempDir::new();
    let token = dir.0.join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let output = common::worker_command(None)
        .args(["--isolate-sessions", "--shared-interpreter", "--token-file"])
        .arg(&token)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--isolate-sessions and --shared-sessions exclude each other"),
        "{stderr}"
    );
}
