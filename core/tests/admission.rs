//! A worker's admission control, from a stranger's side: connections that do
//! not authenticate are closed (past the handshake deadline, or displaced by
//! newer ones), and a controller always gets in.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use colocated_core::session::RemoteSession;
use colocated_core::transport::Token;
use colocated_core::worker::Worker;

mod common;

use common::{client_with_threads, start_worker};

/// A worker of one CPU device (one executor thread) that closes
/// connections which do not authenticate within `handshake_timeout`, and its
/// token.
fn worker(handshake_timeout: Duration) -> (Worker, Token) {
    let token = Token::generate().unwrap();
    let worker = start_worker(client_with_threads(1, 1), &token, |options| {
        options.handshake_timeout = handshake_timeout
    });
    (worker, token)
}

/// A session of `worker` (5 s timeout).
fn connect(worker: &Worker, token: &Token) -> RemoteSession {
    common::connect_session(worker, token)
}

/// True once the worker closed `socket` (a read gives end of file or an
/// error), waiting at most `within`.
fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    socket
        .set_read_timeout(Some(within.max(Duration::from_millis(1))))
        .unwrap();
    let mut byte = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        match socket.read(&mut byte) {
            Ok(0) => return true,
            // The server's HTTP/2 preface and settings: keep reading.
            Ok(_) if Instant::now() < deadline => {}
            Ok(_) => return false,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// True when the worker has closed `socket` (reads give end of file or an
/// error rather than blocking).
fn closed_now(mut socket: &TcpStream) -> bool {
    socket.set_nonblocking(true).unwrap();
    let mut bytes = [0u8; 1024];
    loop {
        match socket.read(&mut bytes) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn a_silent_connection_is_closed_after_the_handshake_deadline() {
    let (worker, token) = worker(Duration::from_millis(300));
    let mut silent = TcpStream::connect(worker.local_addr()).unwrap();
    // HTTP/2's preface alone does not authenticate either.
    let mut preface_only = TcpStream::connect(worker.local_addr()).unwrap();
    preface_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)));
    assert!(closed_within(&mut preface_only, Duration::from_secs(5)));
    assert_eq!(worker.connection_counts().1 .1, 2, "both timed out");
    // An authenticated controller is not subject to the deadline.
    let session = connect(&worker, &token);
    std::thread::sleep(Duration::from_millis(800));
    session.heartbeat().unwrap();
    let ((pending, authenticated), _) = worker.connection_counts();
    // The session's connection and its lane.
    assert_eq!((pending, authenticated), (0, 2));
}

#[test]
fn silent_connections_beyond_the_bound_displace_the_oldest_and_a_controller_gets_in() {
    let (worker, token) = worker(Duration::from_secs(60));
    let silent: Vec<TcpStream> = (0..1100)
        .map(|_| TcpStream::connect(worker.local_addr()).unwrap())
        .collect();
    // Once the worker accepted them all, it keeps at most 64 pending
    // connections from one address.
    let accepted = |w: &Worker| {
        let ((pending, _), (evicted, _)) = w.connection_counts();
        pending as u64 + evicted
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while accepted(&worker) < 1100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let ((pending, _), (evicted, _)) = worker.connection_counts();
    assert!(pending <= 64, "{pending} pending connections");
    assert!(evicted >= 1100 - 64, "{evicted} displaced");
    // They were closed for real (their descriptors are free): at most the 64
    // newest are open.
    let deadline = Instant::now() + Duration::from_secs(5);
    let open = loop {
        let open = silent.iter().filter(|s| !closed_now(s)).count();
        if open <= 64 || Instant::now() > deadline {
            break open;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        open <= 64,
        "{open} of the silent connections are still open"
    );
    let session = connect(&worker, &token);
    session.heartbeat().unwrap();
    // The session's connection and its lane.
    assert_eq!(worker.connection_counts().0 .1, 2);
}

#[test]
fn a_request_without_the_token_is_refused_and_leaves_its_connection_pending() {
    let (worker, token) = worker(Duration::from_millis(500));
    let options = common::connect_options(&worker, &Token::generate().unwrap());
    let err = RemoteSession::connect(&options)
        .err()
        .expect("a wrong token");
    assert_eq!(
        err.code(),
        colocated_core::ErrorCode::Unauthenticated,
        "{err}"
    );
    assert_eq!(worker.connection_counts().0 .1, 0, "nothing authenticated");
    let session = connect(&worker, &token);
    session.heartbeat().unwrap();
}
