//! A worker writes a trace of its own only when its command line says so
//! (`--trace FILE`), never the file of `COLOCATED_TRACE`, which names the
//! controller's. Real worker processes and sockets on 127.0.0.1; this process
//! does not trace.

use std::time::Duration;

use colocated_core::transport::Token;

mod common;
#[path = "common/traced.rs"]
mod traced;
use common::{start, worker_command, TempDir};
use traced::{client_of, events, plugin, process_names, run_on_two_streams};

#[test]
fn a_worker_told_to_trace_writes_its_own_file_and_never_the_controllers() {
    let dir = TempDir::new();
    let own = dir.0.join("worker.json");
    let controllers = dir.0.join("controller.json");
    let token = Token::generate().unwrap();
    let plugin = plugin(&dir.0);
    let mut command = worker_command(None);
    command
        .env("COLOCATED_TRACE", &controllers)
        .args(["--cpu-devices", "1", "--plugin", &plugin, "--trace"])
        .arg(&own);
    let (mut worker, _) = start(command, Some(&token), false);

    let client = client_of(std::slice::from_ref(&worker.address), &token);
    run_on_two_streams(&client);
    drop(client);
    // A clean stop: SIGTERM, then the worker writes what it still holds.
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(worker.child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while worker.child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    assert!(
        !controllers.exists(),
        "the worker opened COLOCATED_TRACE's file"
    );
    let events = events(&own);
    let names = process_names(&events);
    assert_eq!(names, vec![(0, "worker (this process)".to_owned())]);
    let executions = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "execute" && e["pid"] == 0)
        .count();
    assert_eq!(executions, 2, "{events:?}");
}
