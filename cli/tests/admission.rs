//! A worker process against strangers on 127.0.0.1: what they send before
//! authenticating holds no memory, and silent sockets beyond the descriptor
//! limit do not lock an authenticated controller out.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use colocated_core::session::RemoteSession;
use colocated_core::transport::proto::BufferSpec;
use colocated_core::transport::Token;
use colocated_core::DType;
use common::{allow_open_files, connect, spawn_worker};

/// A controller's round of work: a heartbeat and a buffer put and read back.
fn controller_works(session: &RemoteSession, round: u8) {
    session.heartbeat().unwrap();
    let data = Bytes::from(vec![round; 4096]);
    let handle = session.new_handle();
    let spec = BufferSpec {
        device: 0,
        dtype: DType::U8 as u32,
        dims: vec![4096],
        memory_kind: 0,
    };
    session.put_buffer(handle, spec, data.clone()).unwrap();
    assert_eq!(session.get_buffer(handle).unwrap(), data.to_vec());
}

#[test]
fn silent_sockets_beyond_the_descriptor_limit_do_not_lock_a_controller_out() {
    allow_open_files(4096);
    let token = Token::generate().unwrap();
    let worker = spawn_worker(Some(&token), &["--cpu-devices", "1"], Some(1024));
    let silent: Vec<TcpStream> = (0..1100)
        .map(|_| TcpStream::connect(&worker.address).unwrap())
        .collect();
    // A controller connects while they are all open, and works.
    let session = connect(&worker, Some(&token)).unwrap();
    for round in 0..20 {
        controller_works(&session, round);
    }
    // A second controller can still connect.
    let second = connect(&worker, Some(&token)).unwrap();
    controller_works(&second, 99);
    drop(silent);
}

/// What a stranger does: `connections` x `streams` unary requests without a
/// token, each announcing a 4 MiB message and sending `body_bytes` of it as
/// fast as flow control lets it, never finishing. Returns how many streams the
/// worker answered (it must refuse them all at their headers).
fn hold_unauthenticated_streams(
    address: &str,
    connections: usize,
    streams: usize,
    body_bytes: usize,
    duration: Duration,
) -> usize {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
            let (client, connection) = h2::client::handshake(tcp).await.unwrap();
            tokio::spawn(connection);
            for _ in 0..streams {
                let client = client.clone();
                tasks.push(tokio::spawn(async move {
                    let request = http::Request::post(format!(
                        "http://{}/colocated.remote.v1.Worker/LoadExecutable",
                        "worker"
                    ))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(())
                    .unwrap();
                    let Ok(mut client) = client.clone().ready().await else {
                        return false;
                    };
                    let Ok((response, mut body)) = client.send_request(request, false) else {
                        return false;
                    };
                    // A gRPC frame header announcing 4 MiB, then most of it.
                    let mut header = vec![0u8];
                    header.extend_from_slice(&(4u32 << 20).to_be_bytes());
                    let _ = body.send_data(Bytes::from(header), false);
                    let chunk = Bytes::from(vec![7u8; 64 << 10]);
                    let mut sent = 0;
                    let answered = tokio::spawn(response);
                    while sent < body_bytes {
                        body.reserve_capacity(chunk.len());
                        match tokio::time::timeout(
                            Duration::from_millis(200),
                            std::future::poll_fn(|cx| body.poll_capacity(cx)),
                        )
                        .await
                        {
                            Ok(Some(Ok(n))) if n > 0 => {
                                if body.send_data(chunk.slice(..n), false).is_err() {
                                    break;
                                }
                                sent += n;
                            }
                            _ => break,
                        }
                    }
                    let answer = tokio::time::timeout(Duration::from_secs(5), answered).await;
                    matches!(answer, Ok(Ok(Ok(_))))
                }));
            }
        }
        tokio::time::sleep(duration).await;
        let mut answered = 0;
        for task in tasks {
            if task.await.unwrap_or(false) {
                answered += 1;
            }
        }
        answered
    })
}

#[test]
fn unauthenticated_requests_hold_no_memory_while_a_controller_works() {
    let token = Token::generate().unwrap();
    let worker = spawn_worker(Some(&token), &["--cpu-devices", "1"], None);
    let session = connect(&worker, Some(&token)).unwrap();
    controller_works(&session, 1);
    let before = worker.rss_bytes();
    let address = worker.address.clone();
    let stranger = std::thread::spawn(move || {
        hold_unauthenticated_streams(
            &address,
            8,
            32,
            (4 << 20) - (256 << 10),
            Duration::from_secs(3),
        )
    });
    let mut peak = before;
    let until = Instant::now() + Duration::from_secs(3);
    let mut round = 0u8;
    while Instant::now() < until {
        controller_works(&session, round);
        round = round.wrapping_add(1);
        peak = peak.max(worker.rss_bytes());
        std::thread::sleep(Duration::from_millis(50));
    }
    let answered = stranger.join().unwrap();
    peak = peak.max(worker.rss_bytes());
    let growth = peak.saturating_sub(before);
    assert!(
        growth < 64 << 20,
        "the worker grew by {} MiB for strangers' requests",
        growth >> 20
    );
    assert_eq!(
        answered,
        8 * 32,
        "every stranger's stream was refused at once"
    );
    controller_works(&session, 200);
}
