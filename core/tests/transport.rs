//! A worker and its controllers in one process, over a real loopback socket:
//! buffers in sessions.

use std::time::Duration;

use bytes::Bytes;
use colocated_core::transport::proto::BufferSpec;
use colocated_core::transport::session::{ConnectOptions, RemoteSession};
use colocated_core::transport::worker::{Worker, WorkerOptions};
use colocated_core::transport::{Token, CHUNK_BYTES};
use colocated_core::{Client, ClientOptions, DType, ErrorCode};

fn worker(options: impl FnOnce(&mut WorkerOptions)) -> (Worker, Token) {
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(2),
        executor_threads: Some(2),
    })
    .unwrap();
    let token = Token::generate().unwrap();
    let mut opts = WorkerOptions::new(Some(token.clone()));
    options(&mut opts);
    (Worker::start(client, opts).unwrap(), token)
}

fn connect(worker: &Worker, token: &Token) -> RemoteSession {
    let mut options = ConnectOptions::new(worker.local_addr().to_string(), Some(token.clone()));
    options.timeout = Duration::from_secs(5);
    RemoteSession::connect(&options).unwrap()
}

fn spec(device: u32, dtype: DType, dims: &[i64]) -> BufferSpec {
    BufferSpec {
        device,
        dtype: dtype as u32,
        dims: dims.to_vec(),
    }
}

fn pattern(len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>())
}

#[test]
fn buffers_round_trip_through_a_worker_in_chunks() {
    let (worker, token) = worker(|_| {});
    let session = connect(&worker, &token);
    // Several chunks and a partial last one; an empty buffer; a scalar.
    let n = (3 * CHUNK_BYTES + 12) / 4;
    for (dtype, dims, bytes) in [
        (DType::F32, vec![n as i64], n * 4),
        (DType::I64, vec![0, 3], 0),
        (DType::U8, vec![], 1),
    ] {
        let data = pattern(bytes);
        let handle = session.new_handle();
        session
            .put_buffer(handle, spec(1, dtype, &dims), data.clone())
            .unwrap();
        assert_eq!(
            session.get_buffer(handle).unwrap(),
            data.to_vec(),
            "{dtype:?}{dims:?}"
        );
    }
    assert_eq!(worker.buffer_count(), 3);
}

#[test]
fn bad_uploads_are_refused_and_store_nothing() {
    let (worker, token) = worker(|_| {});
    let session = connect(&worker, &token);
    let cases = [
        (
            "too few bytes",
            spec(0, DType::F32, &[4]),
            15,
            ErrorCode::InvalidArgument,
            "spec needs 16",
        ),
        (
            "too many bytes",
            spec(0, DType::F32, &[4]),
            17,
            ErrorCode::InvalidArgument,
            "more than the 16 bytes",
        ),
        (
            "a device the worker lacks",
            spec(9, DType::F32, &[4]),
            16,
            ErrorCode::InvalidArgument,
            "no device 9",
        ),
        (
            "an unknown dtype",
            BufferSpec {
                device: 0,
                dtype: 77,
                dims: vec![1],
            },
            1,
            ErrorCode::InvalidArgument,
            "unknown dtype",
        ),
        (
            "negative dims",
            spec(0, DType::F32, &[-4]),
            16,
            ErrorCode::InvalidArgument,
            "",
        ),
        (
            "strings",
            spec(0, DType::String, &[1]),
            1,
            ErrorCode::Unimplemented,
            "string",
        ),
    ];
    for (what, spec, bytes, code, text) in cases {
        let handle = session.new_handle();
        let err = session
            .put_buffer(handle, spec, pattern(bytes))
            .unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err}");
        assert!(err.message().contains(text), "{what}: {err}");
        let missing = session.get_buffer(handle).unwrap_err();
        assert_eq!(missing.code(), ErrorCode::NotFound, "{what}: {missing}");
    }
    assert_eq!(worker.buffer_count(), 0);
    let handle = session.new_handle();
    session
        .put_buffer(handle, spec(0, DType::U8, &[2]), pattern(2))
        .unwrap();
    let err = session
        .put_buffer(handle, spec(0, DType::U8, &[2]), pattern(2))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists, "{err}");
}

#[test]
fn a_session_cannot_read_or_delete_another_sessions_buffers() {
    let (worker, token) = worker(|_| {});
    let first = connect(&worker, &token);
    let second = connect(&worker, &token);
    let handle = first.new_handle();
    first
        .put_buffer(handle, spec(0, DType::U8, &[3]), pattern(3))
        .unwrap();
    let err = second.get_buffer(handle).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    let err = second.delete_buffers(&[handle]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert_eq!(first.get_buffer(handle).unwrap(), pattern(3).to_vec());
}

#[test]
fn deleting_is_all_or_nothing_and_frees_the_buffers() {
    let (worker, token) = worker(|_| {});
    let session = connect(&worker, &token);
    let a = session.new_handle();
    let b = session.new_handle();
    for h in [a, b] {
        session
            .put_buffer(h, spec(0, DType::U8, &[1]), pattern(1))
            .unwrap();
    }
    let err = session.delete_buffers(&[a, 999]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(err.message().contains("999"), "{err}");
    assert_eq!(worker.buffer_count(), 2, "nothing deleted");
    session.delete_buffers(&[a, b]).unwrap();
    assert_eq!(worker.buffer_count(), 0);
    assert_eq!(
        session.get_buffer(a).unwrap_err().code(),
        ErrorCode::NotFound
    );
}

#[test]
fn closing_or_abandoning_a_session_frees_its_buffers() {
    let (worker, token) = worker(|o| {
        o.heartbeat_interval = Duration::from_millis(50);
        o.session_timeout = Duration::from_millis(300);
    });
    let closed = connect(&worker, &token);
    closed
        .put_buffer(closed.new_handle(), spec(0, DType::U8, &[4]), pattern(4))
        .unwrap();
    closed.disconnect().unwrap();
    assert_eq!((worker.session_count(), worker.buffer_count()), (0, 0));

    let kept = connect(&worker, &token);
    kept.put_buffer(kept.new_handle(), spec(0, DType::U8, &[4]), pattern(4))
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(worker.buffer_count(), 1, "heartbeats keep a live session");
    // Dropping the session closes it on the worker (or, failing that, the
    // missing heartbeats do).
    drop(kept);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while worker.session_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the session was not freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(worker.buffer_count(), 0);
}
