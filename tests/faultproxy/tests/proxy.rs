//! The fault proxy against a tiny echo server on loopback: forwarding and
//! counters, each fault (latency, partition, reset, refusal, bandwidth) and
//! stopping, and the binary's command protocol. Timings are asserted as
//! lower bounds only.

use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use colocated_faultproxy::{Direction, FaultProxy};

/// How long a test waits for what should happen promptly.
const PATIENCE: Duration = Duration::from_secs(20);

/// An echo server on 127.0.0.1: every connection gets back what it sends,
/// and the end of its stream after its own.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            thread::spawn(move || {
                let Ok(mut reader) = stream.try_clone() else {
                    return;
                };
                if io::copy(&mut reader, &mut stream).is_ok() {
                    let _ = stream.shutdown(Shutdown::Write);
                }
            });
        }
    });
    addr
}

/// A proxy to a fresh echo server.
fn proxy() -> FaultProxy {
    FaultProxy::start(echo_server()).unwrap()
}

/// A client connection to `proxy`, with reads bounded by `PATIENCE`.
fn connect(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// `len` bytes of a pattern that shows reordering.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// Sends `data` and reads its echo back.
fn round_trip(stream: &mut TcpStream, data: &[u8]) -> Vec<u8> {
    stream.write_all(data).unwrap();
    let mut back = vec![0; data.len()];
    stream.read_exact(&mut back).unwrap();
    back
}

/// True when `stream` is reset or ended: a read fails with a reset or gives
/// the end of the stream.
fn is_closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Err(e) => matches!(
            e.kind(),
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
        ),
        Ok(_) => false,
    }
}

/// Polls `condition` until it holds, or fails the test after `PATIENCE`.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn connections_are_forwarded_both_ways_and_counted() {
    let proxy = proxy();
    let data = pattern(300_000);
    let mut a = connect(&proxy);
    let mut b = connect(&proxy);
    assert_eq!(round_trip(&mut a, &data), data);
    assert_eq!(round_trip(&mut b, b"hello"), b"hello");
    let stats = proxy.stats();
    assert_eq!(stats.accepted, 2);
    assert_eq!(stats.open, 2);
    assert_eq!(stats.refused, 0);
    assert_eq!(stats.bytes_up, data.len() as u64 + 5);
    assert_eq!(stats.bytes_down, data.len() as u64 + 5);
    // The end of a stream travels too, and the connection then closes.
    a.shutdown(Shutdown::Write).unwrap();
    assert!(is_closed(&mut a));
    eventually("one connection is left", || proxy.stats().open == 1);
}

#[test]
fn latency_delays_each_direction_by_at_least_the_set_delay() {
    let proxy = proxy();
    let mut stream = connect(&proxy);
    assert_eq!(round_trip(&mut stream, b"warm"), b"warm");
    proxy.set_latency(Direction::Up, Duration::from_millis(120));
    proxy.set_latency(Direction::Down, Duration::from_millis(80));
    let began = Instant::now();
    assert_eq!(round_trip(&mut stream, b"late"), b"late");
    assert!(
        began.elapsed() >= Duration::from_millis(200),
        "{:?}",
        began.elapsed()
    );
    // Many chunks in flight at once keep their order.
    let data = pattern(1 << 20);
    let mut writer = stream.try_clone().unwrap();
    let sent = data.clone();
    let sending = thread::spawn(move || {
        for piece in sent.chunks(1000) {
            writer.write_all(piece).unwrap();
        }
    });
    let mut back = vec![0; data.len()];
    stream.read_exact(&mut back).unwrap();
    sending.join().unwrap();
    assert!(back == data, "the echo differs from what was sent");
    // Both directions at once, then off again.
    proxy.set_latency(Direction::Both, Duration::from_millis(50));
    let began = Instant::now();
    assert_eq!(round_trip(&mut stream, b"both"), b"both");
    assert!(
        began.elapsed() >= Duration::from_millis(100),
        "{:?}",
        began.elapsed()
    );
    proxy.set_latency(Direction::Both, Duration::ZERO);
    assert_eq!(round_trip(&mut stream, b"none"), b"none");
}

#[test]
fn a_partition_holds_the_data_and_stalls_the_sender_then_delivers_all_in_order() {
    let proxy = proxy();
    let mut stream = connect(&proxy);
    assert_eq!(round_trip(&mut stream, b"before"), b"before");
    proxy.partition(true);
    let before = proxy.stats();
    // Far more than the proxy's queues and the sockets' buffers hold.
    let data = pattern(64 << 20);
    let mut writer = stream.try_clone().unwrap();
    let sent = data.clone();
    let sending = thread::spawn(move || writer.write_all(&sent).unwrap());
    thread::sleep(Duration::from_millis(500));
    // Nothing arrives, nothing is forwarded, the sender is held back, and
    // the connection stays open.
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut byte = [0];
    let err = stream.read(&mut byte).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err}"
    );
    assert!(!sending.is_finished(), "the sender was not held back");
    let during = proxy.stats();
    assert_eq!(
        (during.bytes_up, during.bytes_down),
        (before.bytes_up, before.bytes_down)
    );
    assert_eq!(during.open, 1);
    // A connection made meanwhile waits for the heal too.
    let mut late = connect(&proxy);
    late.write_all(b"late").unwrap();
    proxy.partition(false);
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut back = vec![0; data.len()];
    stream.read_exact(&mut back).unwrap();
    sending.join().unwrap();
    assert!(back == data, "the echo differs from what was sent");
    let mut late_back = [0; 4];
    late.read_exact(&mut late_back).unwrap();
    assert_eq!(&late_back, b"late");
}

#[test]
fn a_reset_fails_open_connections_and_new_ones_work() {
    let proxy = proxy();
    let mut first = connect(&proxy);
    let mut second = connect(&proxy);
    assert_eq!(round_trip(&mut first, b"one"), b"one");
    assert_eq!(round_trip(&mut second, b"two"), b"two");
    proxy.reset();
    assert_eq!(proxy.stats().open, 0);
    let mut byte = [0];
    let err = first.read(&mut byte).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    assert!(is_closed(&mut second));
    let mut third = connect(&proxy);
    assert_eq!(round_trip(&mut third, b"three"), b"three");
    // A reset during a partition drops what was held.
    proxy.partition(true);
    third.write_all(b"held").unwrap();
    proxy.reset();
    proxy.partition(false);
    assert!(is_closed(&mut third));
    let mut fourth = connect(&proxy);
    assert_eq!(round_trip(&mut fourth, b"four"), b"four");
}

#[test]
fn refused_connections_are_reset_at_once_until_refusal_ends() {
    let proxy = proxy();
    let mut open = connect(&proxy);
    assert_eq!(round_trip(&mut open, b"open"), b"open");
    proxy.refuse(true);
    let mut refused = connect(&proxy);
    let mut byte = [0];
    let err = refused.read(&mut byte).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    // Connections already open are left alone.
    assert_eq!(round_trip(&mut open, b"still"), b"still");
    proxy.refuse(false);
    let mut welcome = connect(&proxy);
    assert_eq!(round_trip(&mut welcome, b"back"), b"back");
    let stats = proxy.stats();
    assert_eq!((stats.accepted, stats.refused), (3, 1));
}

#[test]
fn a_connection_the_upstream_refuses_is_reset() {
    // A port nobody listens on (bound, then closed).
    let gone = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = FaultProxy::start(gone).unwrap();
    let mut stream = connect(&proxy);
    assert!(is_closed(&mut stream));
}

#[test]
fn a_bandwidth_limit_slows_each_direction_to_at_most_the_rate() {
    let proxy = proxy();
    let mut stream = connect(&proxy);
    assert_eq!(round_trip(&mut stream, b"warm"), b"warm");
    let data = pattern(100_000);
    proxy.set_bandwidth(Direction::Up, Some(200_000));
    let began = Instant::now();
    assert_eq!(round_trip(&mut stream, &data), data);
    assert!(
        began.elapsed() >= Duration::from_millis(500),
        "{:?}",
        began.elapsed()
    );
    proxy.set_bandwidth(Direction::Up, None);
    proxy.set_bandwidth(Direction::Down, Some(400_000));
    let began = Instant::now();
    assert_eq!(round_trip(&mut stream, &data), data);
    assert!(
        began.elapsed() >= Duration::from_millis(250),
        "{:?}",
        began.elapsed()
    );
    proxy.set_bandwidth(Direction::Both, None);
    assert_eq!(round_trip(&mut stream, &data), data);
}

#[test]
fn stopping_closes_every_connection_and_the_listener() {
    let proxy = proxy();
    let addr = proxy.addr();
    let mut stream = connect(&proxy);
    assert_eq!(round_trip(&mut stream, b"up"), b"up");
    proxy.stop();
    assert!(is_closed(&mut stream));
    let err = TcpStream::connect(addr).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
}

/// The binary, its stdin and the reader of its stdout.
struct Process {
    child: std::process::Child,
    stdout: BufReader<std::process::ChildStdout>,
    addr: SocketAddr,
}

impl Process {
    fn start(upstream: SocketAddr) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_colocated-faultproxy"))
            .arg("--upstream")
            .arg(upstream.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("first line: {line:?}"))
            .trim()
            .parse()
            .unwrap();
        Process {
            child,
            stdout,
            addr,
        }
    }

    /// Sends `command` and returns the answer line.
    fn ask(&mut self, command: &str) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }
}

#[test]
fn the_binary_takes_one_command_per_line_and_exits_when_stdin_closes() {
    let mut process = Process::start(echo_server());
    let mut stream = TcpStream::connect(process.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    assert_eq!(round_trip(&mut stream, b"hi"), b"hi");
    assert_eq!(process.ask("latency both 60"), "ok");
    let began = Instant::now();
    assert_eq!(round_trip(&mut stream, b"slow"), b"slow");
    assert!(
        began.elapsed() >= Duration::from_millis(120),
        "{:?}",
        began.elapsed()
    );
    for command in [
        "latency up 0",
        "latency down 0",
        "bandwidth up 1000000",
        "bandwidth both off",
        "partition on",
        "partition off",
        "refuse on",
        "refuse off",
    ] {
        assert_eq!(process.ask(command), "ok", "{command}");
    }
    assert_eq!(
        process.ask("stats"),
        r#"{"accepted":1,"refused":0,"open":1,"bytes_up":6,"bytes_down":6}"#
    );
    assert_eq!(process.ask("reset"), "ok");
    assert!(is_closed(&mut stream));
    for (command, fragment) in [
        ("latency sideways 5", "up, down or both"),
        ("latency up soon", "whole milliseconds"),
        ("bandwidth up 0", "above 0"),
        ("partition maybe", "on or off"),
        ("", "empty command"),
        ("explode", "unknown command"),
    ] {
        let answer = process.ask(command);
        assert!(
            answer.starts_with("error: ") && answer.contains(fragment),
            "{command:?}: {answer}"
        );
    }
    drop(process.child.stdin.take());
    let status = process.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let err = TcpStream::connect(process.addr).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
}

#[test]
fn the_binary_answers_quit_and_exits() {
    let mut process = Process::start(echo_server());
    assert_eq!(process.ask("quit"), "ok");
    assert!(process.child.wait().unwrap().success());
}

/// An upstream that greets each connection with `hello` and then reads
/// nothing.
fn greeting_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(b"hello");
            held.push(stream);
        }
    });
    upstream
}

/// A proxy to [`greeting_upstream`], and a client connection whose writes have filled every buffer
/// up to the upstream (so the proxy's writer waits), with the greeting
/// unread: dropping it makes the kernel reset it.
fn stalled_connection() -> (FaultProxy, TcpStream) {
    let proxy = FaultProxy::start(greeting_upstream()).unwrap();
    let client = connect(&proxy);
    client.set_nonblocking(true).unwrap();
    let data = pattern(1 << 20);
    let mut stalled_since = Instant::now();
    while stalled_since.elapsed() < Duration::from_millis(300) {
        match (&client).write(&data) {
            Ok(_) => stalled_since = Instant::now(),
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{e}"),
        }
    }
    eventually("the greeting reaches the client", || {
        proxy.stats().bytes_down == 5
    });
    thread::sleep(Duration::from_millis(50));
    (proxy, client)
}

#[test]
fn a_sender_that_resets_ends_its_connection_even_while_the_receiver_reads_nothing() {
    let (proxy, client) = stalled_connection();
    drop(client);
    eventually("the proxy closes the connection", || {
        proxy.stats().open == 0
    });
}

#[test]
fn a_senders_reset_during_a_partition_ends_its_connection_after_the_heal() {
    // Whether the proxy was waiting to read from the sender (idle) or to
    // queue what it read (stalled).
    let idle = || {
        let proxy = FaultProxy::start(greeting_upstream()).unwrap();
        let client = connect(&proxy);
        eventually("the greeting reaches the client", || {
            proxy.stats().bytes_down == 5
        });
        thread::sleep(Duration::from_millis(50));
        (proxy, client)
    };
    for (what, (proxy, client)) in [("idle", idle()), ("stalled", stalled_connection())] {
        proxy.partition(true);
        drop(client);
        thread::sleep(Duration::from_millis(300));
        assert_eq!(
            proxy.stats().open,
            1,
            "{what}: the reset crossed the partition"
        );
        proxy.partition(false);
        eventually("the proxy closes the connection", || {
            proxy.stats().open == 0
        });
    }
}

#[test]
fn a_proxy_dropped_on_an_async_runtime_closes_without_blocking_it() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let proxy = proxy();
    let addr = proxy.addr();
    let mut stream = connect(&proxy);
    assert_eq!(round_trip(&mut stream, b"up"), b"up");
    runtime.block_on(async move { drop(proxy) });
    assert!(is_closed(&mut stream));
    eventually("the listener closes", || TcpStream::connect(addr).is_err());
}
