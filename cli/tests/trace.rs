//! One trace for the whole job: a controller that traces (`COLOCATED_TRACE`)
//! writes its workers' spans into its file, one process per worker named by
//! its address, while the workers, started with the same `COLOCATED_TRACE`
//! in their environment, write nothing there. Real worker processes and
//! sockets on 127.0.0.1. The trace's environment variable and subscriber are
//! per process, so this file holds a single test.

use colocated_core::transport::Token;
use serde_json::Value;

mod common;
#[path = "common/traced.rs"]
mod traced;
use common::{spawn_worker, TempDir};
use traced::{client_of, events, plugin, process_names, run_on_two_streams};

/// Generous bound of how far before the controller sent it a worker's
/// execution may seem to start: the clock offset's error is half a round
/// trip on loopback, far below this even on a loaded machine.
const CLOCK_SLACK_US: f64 = 100_000.0;

#[test]
fn a_traced_controller_writes_every_workers_spans_and_the_workers_write_none() {
    let dir = TempDir::new();
    let path = dir.0.join("trace.json");
    // Set before anything starts: the workers inherit it, as from a shell.
    std::env::set_var("COLOCATED_TRACE", &path);
    std::env::remove_var("COLOCATED_LOG");
    let token = Token::generate().unwrap();
    let plugin = plugin(&dir.0);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            spawn_worker(
                Some(&token),
                &["--cpu-devices", "1", "--plugin", &plugin],
                None,
            )
        })
        .collect();
    let addresses: Vec<String> = workers.iter().map(|w| w.address.clone()).collect();

    let client = client_of(&addresses, &token);
    let streams = run_on_two_streams(&client);
    colocated_core::trace::flush();
    let events = events(&path);

    let names = process_names(&events);
    assert!(
        names
            .iter()
            .all(|(_, name)| !name.starts_with("worker") && name != "host 0"),
        "a worker named a process of the controller's file: {names:?}"
    );
    // The controller's side of each host: its sends, on its own clock.
    let sent = |host: u64, stream: u64| -> f64 {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == "execute")
            .filter(|e| e["pid"] == host && e["tid"] == stream)
            .map(|e| e["ts"].as_f64().expect("a timestamp"))
            .fold(f64::INFINITY, f64::min)
    };
    for (host, address) in addresses.iter().enumerate() {
        let pids: Vec<u64> = names
            .iter()
            .filter(|(_, name)| name == address)
            .map(|(pid, _)| *pid)
            .collect();
        assert_eq!(pids.len(), 1, "one process named {address}: {names:?}");
        let pid = pids[0];
        let executions: Vec<&Value> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == "execute" && e["pid"] == pid)
            .collect();
        let mut tids: Vec<u64> = executions
            .iter()
            .map(|e| e["tid"].as_u64().expect("a tid"))
            .collect();
        tids.sort_unstable();
        assert_eq!(
            tids, streams,
            "worker {address}'s executions: {executions:?}"
        );
        for execution in &executions {
            assert_eq!(execution["args"]["program"], "plugin_add_one_i32");
            let stream = execution["tid"].as_u64().unwrap();
            let ts = execution["ts"].as_f64().expect("a timestamp");
            let sent = sent(host as u64, stream);
            assert!(
                ts >= sent - CLOCK_SLACK_US && ts <= sent + 10e6,
                "worker {address} ran stream {stream} at {ts} us; the controller sent it at {sent} us"
            );
            let named = events.iter().any(|e| {
                e["ph"] == "M"
                    && e["name"] == "thread_name"
                    && e["pid"] == pid
                    && e["tid"] == stream
                    && e["args"]["name"] == format!("stream {stream}").as_str()
            });
            assert!(named, "no track named for stream {stream} of {address}");
        }
    }
    drop(client);
    // The file stays valid JSON after the client and the workers are gone.
    drop(workers);
    let _ = traced::events(&path);
}
