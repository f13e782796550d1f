//! Worker processes for the CLI's tests: spawned, read up to their
//! `listening on` line, killed when dropped.

#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::time::Duration;

use colocated_core::session::{ConnectOptions, RemoteSession};
use colocated_core::transport::{SessionId, Token};

/// A worker process, killed when dropped.
pub struct Spawned {
    pub child: Child,
    pub address: String,
    pub stdout: BufReader<ChildStdout>,
    pub dir: TempDir,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Spawned {
    /// The worker's resident memory in bytes (Linux: `VmRSS`).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .expect("VmRSS");
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("a number of kB");
        kib * 1024
    }
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "colocated-worker-test-{}-{}",
            std::process::id(),
            SessionId::random().unwrap()
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `colocated worker` command (without `COLOCATED_TOKEN` from the
/// environment), run with at most `max_files` open descriptors when given (as
/// under the common `ulimit -n 1024`).
pub fn worker_command(max_files: Option<u32>) -> Command {
    let binary = env!("CARGO_BIN_EXE_colocated");
    let mut command = match max_files {
        Some(n) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(binary);
            c
        }
        None => Command::new(binary),
    };
    command.env_remove("COLOCATED_TOKEN").arg("worker");
    command
}

/// Starts `command` with `token` (written to a file in a new directory;
/// None: `--insecure`) and waits for its `listening on` line (an address on
/// 0.0.0.0 is given as 127.0.0.1). With `capture_stderr`, its stderr is
/// returned for the caller to read, else discarded.
pub fn start(
    mut command: Command,
    token: Option<&Token>,
    capture_stderr: bool,
) -> (Spawned, Option<ChildStderr>) {
    let dir = TempDir::new();
    match token {
        Some(token) => {
            let file = dir.0.join("token");
            std::fs::write(&file, format!("{}\n", token.expose())).unwrap();
            command.arg("--token-file").arg(file);
        }
        None => {
            command.arg("--insecure");
        }
    }
    let stderr = if capture_stderr {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let Some(address) = line.strip_prefix("listening on ") else {
        let _ = child.kill();
        let mut errors = String::new();
        if let Some(stderr) = stderr.as_mut() {
            let _ = stderr.read_to_string(&mut errors);
        }
        panic!("unexpected first line {line:?}; stderr: {errors}");
    };
    let address = address.trim().replace("0.0.0.0:", "127.0.0.1:");
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let worker = Spawned {
        child,
        address,
        stdout,
        dir,
    };
    (worker, stderr)
}

/// `colocated worker` with `args` and `token` (None: `--insecure`), at most
/// `max_files` open descriptors when given; waits for its `listening on` line.
pub fn spawn_worker(token: Option<&Token>, args: &[&str], max_files: Option<u32>) -> Spawned {
    let mut command = worker_command(max_files);
    command.args(args);
    start(command, token, false).0
}

/// A session with the worker, as a controller opens it.
pub fn connect(worker: &Spawned, token: Option<&Token>) -> colocated_core::Result<RemoteSession> {
    let mut options = ConnectOptions::new(worker.address.clone(), token.cloned());
    options.timeout = Duration::from_secs(5);
    RemoteSession::connect(&options)
}

/// Raises this process's soft limit of open descriptors to at least `n` (up
/// to the hard limit), for tests that open many sockets.
pub fn allow_open_files(n: u64) {
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < n {
            limit.rlim_cur = n.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
