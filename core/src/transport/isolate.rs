//! Sessions in processes of their own (`--isolate-sessions`): a worker started
//! with an [`IsolateCommand`] is a *supervisor*. For each authenticated
//! `OpenSession` it starts a child worker — the command, plus `--listen
//! HOST:0 --token-file F --single-session` — that serves exactly that one
//! session, and redirects the controller there (protocol version
//! [`REDIRECT_VERSION`](super::REDIRECT_VERSION)). The supervisor keeps no
//! session: everything after the redirect goes straight to the child.
//!
//! A child gets a fresh random one-time token in a private file (mode 0600)
//! that it reads and deletes. It exits 0 when its session ends (closed, timed
//! out) or when nobody opens it within the handshake deadline, and when its
//! stdin closes: the supervisor holds the other end, so a child never outlives
//! its supervisor, however that ends (even `kill -9`). A stopping supervisor
//! also asks every child to stop (SIGTERM), and kills one that has not within
//! a grace period.

use crate::transport::lock;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::idle::IdleWatch;
use super::Token;
use crate::error::{Error, Result};

/// How long a child has to print its `listening on HOST:PORT` line.
pub const CHILD_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stopping supervisor waits for its children to exit once asked.
const CHILD_STOP_GRACE: Duration = Duration::from_secs(3);

/// The most session processes a supervisor runs at once: beyond it, a new
/// session is `resource_exhausted` (a controller retrying in a loop cannot
/// fork without bound).
pub const MAX_CHILDREN: usize = 256;

/// The command line of a worker that serves one session (without the flags
/// the supervisor adds: `--listen HOST:0 --token-file F --single-session`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolateCommand {
    /// The program to run (e.g. the Python interpreter).
    pub program: PathBuf,
    /// Its arguments (e.g. `-m colocated.worker --cpu-devices 4 ...`).
    pub args: Vec<String>,
}

/// The children of a supervisor.
pub(crate) struct Children {
    command: IsolateCommand,
    /// The host children listen on (the supervisor's).
    host: IpAddr,
    running: Mutex<Vec<Child>>,
}

/// A token file that is removed when dropped (if the child has not already).
struct TokenFile(PathBuf);

impl TokenFile {
    /// Writes `token` to a new file only this user may read (0600), under a
    /// random name in the temporary directory.
    fn create(token: &Token) -> Result<TokenFile> {
        let mut name = [0u8; 16];
        getrandom::fill(&mut name)
            .map_err(|e| Error::internal(format!("no randomness for a token file: {e}")))?;
        let name = super::hex(&name);
        let path = std::env::temp_dir().join(format!("colocated-session-{name}.token"));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(&path).map_err(|e| {
            Error::internal(format!(
                "cannot create a token file {}: {e}",
                path.display()
            ))
        })?;
        let file_guard = TokenFile(path);
        file.write_all(token.expose().as_bytes()).map_err(|e| {
            Error::internal(format!(
                "cannot write the token file {}: {e}",
                file_guard.0.display()
            ))
        })?;
        Ok(file_guard)
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Children {
    /// Children of `command`, listening on `host`.
    pub(crate) fn new(command: IsolateCommand, host: IpAddr) -> Children {
        Children {
            command,
            host,
            running: Mutex::new(Vec::new()),
        }
    }

    /// Number of children still running.
    pub(crate) fn live(&self) -> usize {
        let mut running = lock(&self.running);
        running.retain_mut(|child| matches!(child.try_wait(), Ok(None)));
        running.len()
    }

    /// Starts a child for one session and waits (at most
    /// [`CHILD_START_TIMEOUT`]) for it to listen; returns its address and
    /// one-time token. Blocks: call it off the network threads. A child that
    /// does not start is killed, and the error is `unavailable`.
    pub(crate) fn spawn(&self) -> Result<(SocketAddr, Token)> {
        if self.live() >= MAX_CHILDREN {
            return Err(Error::resource_exhausted(format!(
                "this worker runs {MAX_CHILDREN} sessions already, each in a process of its own"
            )));
        }
        let token = Token::generate()?;
        let token_file = TokenFile::create(&token)?;
        let listen = SocketAddr::new(self.host, 0);
        let mut child = Command::new(&self.command.program)
            .args(&self.command.args)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--token-file")
            .arg(&token_file.0)
            .arg("--single-session")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                Error::unavailable(format!(
                    "cannot start a session worker ({}): {e}",
                    self.command.program.display()
                ))
            })?;
        let started = child
            .stdout
            .take()
            .ok_or_else(|| Error::internal("a session worker without stdout"))
            .and_then(|stdout| first_line(stdout, child.id()));
        let address = started.and_then(|line| {
            line.trim()
                .strip_prefix("listening on ")
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .ok_or_else(|| {
                    Error::unavailable(format!(
                        "a session worker did not start (it said {:?})",
                        line.trim()
                    ))
                })
        });
        // The child deleted it once it read it; if it did not, nobody else
        // needs it now.
        drop(token_file);
        match address {
            Ok(address) => {
                let mut running = lock(&self.running);
                running.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
                running.push(child);
                Ok((address, token))
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Asks every child to stop (its stdin closes and it gets SIGTERM), waits
    /// up to a grace period, and kills those still running.
    pub(crate) fn shutdown(&self) {
        stop_children(lock(&self.running).drain(..).collect());
    }
}

/// Closes each child's stdin and sends it SIGTERM, waits up to
/// [`CHILD_STOP_GRACE`], and kills those still running.
fn stop_children(mut children: Vec<Child>) {
    for child in &mut children {
        drop(child.stdin.take());
        terminate(child);
    }
    let deadline = Instant::now() + CHILD_STOP_GRACE;
    for child in &mut children {
        while matches!(child.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Children {
    /// Never blocks (the last reference may go on a network thread): the
    /// children are stopped on a thread of their own.
    fn drop(&mut self) {
        let children: Vec<Child> = lock(&self.running).drain(..).collect();
        if children.is_empty() {
            return;
        }
        let stopper = std::thread::Builder::new()
            .name("colocated-stop-children".into())
            .spawn(move || stop_children(children));
        if let Err(e) = stopper {
            tracing::error!("no thread to stop the session processes: {e}");
        }
    }
}

/// Expires `idle` once this process's stdin reaches its end (or fails): a
/// child's supervisor holds the other end, so the child stops when the
/// supervisor goes, however it ends. Reads on a thread of its own, which
/// lives as long as stdin stays open. `unavailable` without a thread.
pub(crate) fn expire_when_stdin_closes(idle: std::sync::Arc<IdleWatch>) -> Result<()> {
    std::thread::Builder::new()
        .name("colocated-supervisor-watch".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut chunk = [0u8; 4096];
            loop {
                match stdin.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // Something in the process (a runtime's event loop, say)
                    // made stdin non-blocking: not a closed stdin.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(200));
                    }
                    Err(_) => break,
                }
            }
            tracing::info!(
                "stdin closed (the supervisor is gone): this session worker should stop"
            );
            idle.expire();
        })
        .map(drop)
        .map_err(|e| Error::unavailable(format!("no thread to watch the supervisor: {e}")))
}

/// Sends SIGTERM to `child` (on other systems, kills it).
fn terminate(child: &mut Child) {
    #[cfg(unix)]
    {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with a pid of our own child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            return;
        }
    }
    let _ = child.kill();
}

/// The first line a child prints, read within [`CHILD_START_TIMEOUT`]; the
/// rest of its stdout (what its programs print) goes on to this process's
/// stderr, so the child never blocks on a full pipe.
fn first_line(stdout: std::process::ChildStdout, pid: u32) -> Result<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("colocated-child-{pid}"))
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let read = reader.read_line(&mut line).map(|_| line);
            let _ = tx.send(read);
            let _ = std::io::copy(&mut reader, &mut std::io::stderr());
        })
        .map_err(|e| Error::unavailable(format!("no thread to watch a session worker: {e}")))?;
    match rx.recv_timeout(CHILD_START_TIMEOUT) {
        Ok(Ok(line)) => Ok(line),
        Ok(Err(e)) => Err(Error::unavailable(format!(
            "cannot read a session worker's output: {e}"
        ))),
        Err(_) => Err(Error::unavailable(format!(
            "a session worker did not start within {CHILD_START_TIMEOUT:?}"
        ))),
    }
}
