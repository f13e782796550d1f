//! `colocated worker --port auto` and `colocated status` in a Slurm job, with
//! a faked Slurm environment whose nodes are loopback addresses
//! (127.0.0.1-3, one worker bound on each at the job's port): real worker
//! processes and sockets.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

use colocated_core::cluster::{slurm_port, SLURM_PORT_BASE};
use colocated_core::transport::{Token, VERSION};

mod common;
use common::{Spawned, TempDir};

const NODES: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];

/// A Slurm job id whose port is free on every node address.
fn job_with_a_free_port() -> u64 {
    for offset in 0..4096u64 {
        let port = slurm_port(offset);
        if NODES
            .iter()
            .all(|node| TcpListener::bind((*node, port)).is_ok())
        {
            // A job id past 4096 shows the port wraps around the job id.
            return offset + 3 * 4096;
        }
    }
    panic!("no port of the Slurm range is free");
}

/// `colocated` with `args`, a token file, and the environment of Slurm job
/// `job` on `NODES` (nothing from this process's Slurm or token settings).
fn colocated(args: &[&str], job: Option<u64>, token_file: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_colocated"));
    for name in [
        "COLOCATED_TOKEN",
        "COLOCATED_WORKERS",
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
        "COLOCATED_KUBERNETES_SERVICE",
    ] {
        command.env_remove(name);
    }
    if let Some(job) = job {
        command
            .env("SLURM_JOB_ID", job.to_string())
            .env("SLURM_JOB_NODELIST", "127.0.0.[1-3]");
    }
    command.args(args).arg("--token-file").arg(token_file);
    command
}

/// Starts a worker on `node` at the job's port (`--port auto`).
fn worker_on(node: &str, job: u64, token_file: &std::path::Path) -> Spawned {
    let listen = format!("{node}:0");
    let mut child = colocated(
        &[
            "worker",
            "--listen",
            &listen,
            "--port",
            "auto",
            "--cpu-devices",
            "2",
        ],
        Some(job),
        token_file,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let address = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .trim()
        .to_string();
    Spawned {
        child,
        address,
        stdout,
        dir: TempDir::new(),
    }
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_slurm_jobs_workers_listen_on_the_jobs_port_and_status_finds_them() {
    let dir = TempDir::new();
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, Token::generate().unwrap().expose()).unwrap();
    let job = job_with_a_free_port();
    let port = SLURM_PORT_BASE + (job % 4096) as u16;
    let mut workers: Vec<Spawned> = NODES
        .iter()
        .map(|node| worker_on(node, job, &token_file))
        .collect();
    let addresses: Vec<String> = NODES.iter().map(|n| format!("{n}:{port}")).collect();
    assert_eq!(
        workers
            .iter()
            .map(|w| w.address.clone())
            .collect::<Vec<_>>(),
        addresses
    );
    // No address given: the job's node list and port.
    let output = colocated(&["status"], Some(job), &token_file)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (line, address) in lines.iter().zip(&addresses) {
        assert!(line.starts_with(address.as_str()), "{line}");
        assert!(line.contains(&format!("colocated {VERSION}")), "{line}");
        assert!(
            line.contains("2 cpu devices") && line.contains("0 sessions"),
            "{line}"
        );
    }
    // A worker that is gone: its line says so, and the status is 1.
    let gone = workers.remove(1);
    drop(gone);
    let output = colocated(&["status"], Some(job), &token_file)
        .output()
        .unwrap();
    let (stdout, _) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[1].starts_with(&format!("{}  unavailable", addresses[1])),
        "{stdout}"
    );
    // Addresses given win over the job's.
    let output = colocated(&["status", &addresses[2]], Some(job), &token_file)
        .output()
        .unwrap();
    let (stdout, _) = text(&output);
    assert!(output.status.success(), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
}

#[test]
fn port_auto_outside_a_job_and_status_without_workers_are_usage_errors() {
    let dir = TempDir::new();
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, "s3cret").unwrap();
    let output = colocated(&["worker", "--port", "auto"], None, &token_file)
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("SLURM_JOB_ID"), "{stderr}");
    let output = colocated(&["status"], None, &token_file).output().unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for place in [
        "COLOCATED_WORKERS",
        "SLURM_JOB_NODELIST",
        "COLOCATED_KUBERNETES_SERVICE",
    ] {
        assert!(stderr.contains(place), "{place}: {stderr}");
    }
}
