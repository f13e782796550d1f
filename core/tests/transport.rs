//! A worker and its controllers in one process, over a real loopback socket:
//! buffers in sessions.

mod common;

use std::time::Duration;

use common::{
    assert_error, client_with_threads, compile_native, connect_options, eventually, i32_values,
    progress_log, spec_on, start_worker,
};

use bytes::Bytes;
use colocated_core::session::RemoteSession;
use colocated_core::transport::proto::BufferSpec;
use colocated_core::transport::{Token, CHUNK_BYTES};
use colocated_core::worker::{Worker, WorkerOptions};
use colocated_core::{Client, DType, ErrorCode};

/// A worker of two CPU devices (two executor threads), with the default
/// options as `options` changes them, and its token.
fn worker(options: impl FnOnce(&mut WorkerOptions)) -> (Worker, Token) {
    let token = Token::generate().unwrap();
    let worker = start_worker(client_with_threads(2, 2), &token, options);
    (worker, token)
}

/// A session of `worker` (5 s timeout).
fn connect(worker: &Worker, token: &Token) -> RemoteSession {
    common::connect_session(worker, token)
}

fn spec(device: u32, dtype: DType, dims: &[i64]) -> BufferSpec {
    BufferSpec {
        device,
        dtype: dtype as u32,
        dims: dims.to_vec(),
        memory_kind: 0,
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
                memory_kind: 0,
            },
            1,
            ErrorCode::InvalidArgument,
            "unknown dtype",
        ),
        (
            "a memory kind the protocol lacks",
            BufferSpec {
                memory_kind: 9,
                ..spec(0, DType::F32, &[4])
            },
            16,
            ErrorCode::InvalidArgument,
            "memory kind 9",
        ),
        (
            "negative dims",
            spec(0, DType::F32, &[-4]),
            16,
            ErrorCode::InvalidArgument,
            "",
        ),
        (
            "a byte as strings",
            spec(0, DType::String, &[1]),
            1,
            ErrorCode::InvalidArgument,
            "malformed string elements",
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
    assert_error(
        session.delete_buffers(&[a, 999]),
        ErrorCode::NotFound,
        "999",
    );
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
        // Short, but long enough that a loaded machine (a build beside the
        // tests) does not delay a heartbeat past it.
        o.heartbeat_interval = Duration::from_millis(100);
        o.session_timeout = Duration::from_millis(1000);
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
    // Over two session timeouts.
    std::thread::sleep(Duration::from_millis(2500));
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

// -- executions -------------------------------------------------------------------

use std::sync::{Arc, Mutex};

fn i32_bytes(values: &[i32]) -> Bytes {
    Bytes::from(common::i32_bytes(values))
}

/// Adds one to every int32 shard; records the order of its runs in `log`.
fn register_add_one(client: &Client, log: Arc<Mutex<Vec<i32>>>) {
    client
        .register_native_function("add_one", move |ctx| {
            for input in ctx.inputs() {
                log.lock()
                    .unwrap()
                    .push(i32_values(&input.to_host_vec()?)[0]);
            }
            common::add_one_shards(ctx)
        })
        .unwrap();
    client
        .register_native_function("fail", |_ctx| {
            Err(colocated_core::Error::failed_precondition(
                "refusing on purpose",
            ))
        })
        .unwrap();
    client
        .register_native_function("gated", |ctx| {
            // Waits until the test opens the gate (no gate: at once), and
            // gives its input back.
            let gate = GATE.lock().unwrap().clone();
            if let Some(gate) = gate {
                gate.wait()?;
            }
            let input = ctx.inputs()[0].clone();
            ctx.set_output(0, input)
        })
        .unwrap();
}

/// What the native `gated` waits for (one test sets it).
static GATE: Mutex<Option<colocated_core::Event>> = Mutex::new(None);

/// The serialized `function` over an int32[4] on device `device` of a client
/// shaped like the worker's (the controller compiles for the worker's devices).
fn executable_for_worker(function: &str, device: usize) -> Vec<u8> {
    let mirror = client_with_threads(2, 1);
    register_add_one(&mirror, Arc::default());
    let d = mirror.devices()[device].clone();
    let spec = spec_on(&[4], DType::I32, &d);
    compile_native(&mirror, function, vec![spec.clone()], vec![spec], &[d]).serialize()
}

/// A worker of two CPU devices with `add_one`, `fail` and `gated` (see
/// [`register_add_one`]), its token, and the log of `add_one`'s inputs.
fn worker_with_add_one() -> (Worker, Token, Arc<Mutex<Vec<i32>>>) {
    let client = client_with_threads(2, 2);
    let log = Arc::new(Mutex::new(Vec::new()));
    register_add_one(&client, log.clone());
    let token = Token::generate().unwrap();
    let worker = start_worker(client, &token, |_| {});
    (worker, token, log)
}

/// Loads the serialized `function` for the worker's device `device` (see
/// [`executable_for_worker`]) into `session`: its handle.
fn load(session: &RemoteSession, function: &str, device: usize) -> u64 {
    let exe = session.new_handle();
    session
        .load_executable(exe, executable_for_worker(function, device))
        .unwrap();
    exe
}

/// A worker with `add_one` (see [`worker_with_add_one`]), a session of it
/// with `function` loaded for device 0, the executable's handle, and
/// `add_one`'s log.
fn session_with(function: &str) -> (Worker, RemoteSession, u64, Arc<Mutex<Vec<i32>>>) {
    let (worker, token, log) = worker_with_add_one();
    let session = connect(&worker, &token);
    let exe = load(&session, function, 0);
    (worker, session, exe, log)
}

/// Uploads int32[4] `values` to the worker's device `device`: the handle.
fn put_i32(session: &RemoteSession, device: u32, values: [i32; 4]) -> u64 {
    let x = session.new_handle();
    session
        .put_buffer(x, spec(device, DType::I32, &[4]), i32_bytes(&values))
        .unwrap();
    x
}

#[test]
fn executions_run_on_the_worker_in_stream_order() {
    let (worker, token, log) = worker_with_add_one();
    let session = connect(&worker, &token);
    let exe = session.new_handle();
    assert_eq!(
        session
            .load_executable(exe, executable_for_worker("add_one", 1))
            .unwrap(),
        (1, 1)
    );
    let mut last = 0;
    for k in 0..20 {
        let x = put_i32(&session, 1, [k, k, k, k]);
        let y = session.new_handle();
        session.execute(exe, &[x], &[y], 7).unwrap();
        last = y;
    }
    let back = i32_values(&session.get_buffer(last).unwrap());
    assert_eq!(back, vec![20; 4]);
    assert_eq!(
        *log.lock().unwrap(),
        (0..20).collect::<Vec<_>>(),
        "one stream, program order"
    );
}

#[test]
fn a_failed_execution_shows_when_its_outputs_are_read() {
    let (_worker, session, exe, _log) = session_with("fail");
    let x = put_i32(&session, 0, [1; 4]);
    let y = session.new_handle();
    session.execute(exe, &[x], &[y], 1).unwrap();
    assert_error(
        session.get_buffer(y),
        ErrorCode::FailedPrecondition,
        "refusing on purpose",
    );
}

/// A controller whose link broke after its load reached the worker sends
/// the load again: the worker answers it as the first, and runs nothing
/// twice. The same handle with other bytes or device ids is refused.
#[test]
fn a_load_sent_again_is_answered_as_the_first() {
    let (_worker, session, exe, log) = session_with("add_one");
    let again = session.load_executable(exe, executable_for_worker("add_one", 0));
    assert_eq!(again.unwrap(), (1, 1));
    let other_ids = session.load_executable_for(
        exe,
        executable_for_worker("add_one", 0),
        [(0, 7)].into_iter().collect(),
    );
    assert_eq!(other_ids.unwrap_err().code(), ErrorCode::AlreadyExists);
    // The executable still runs, once per execution.
    let x = put_i32(&session, 0, [1; 4]);
    let y = session.new_handle();
    session.execute(exe, &[x], &[y], 1).unwrap();
    assert_eq!(i32_values(&session.get_buffer(y).unwrap()), vec![2; 4]);
    assert_eq!(log.lock().unwrap().len(), 1);
}

#[test]
fn bad_executions_are_refused_before_anything_runs() {
    let (_worker, session, exe, log) = session_with("add_one");
    let x = put_i32(&session, 0, [1; 4]);
    let on_device_1 = put_i32(&session, 1, [1; 4]);
    let cases = [
        (
            "unknown executable",
            999,
            vec![x],
            vec![500],
            ErrorCode::NotFound,
        ),
        (
            "unknown input",
            exe,
            vec![998],
            vec![501],
            ErrorCode::NotFound,
        ),
        (
            "too many inputs",
            exe,
            vec![x, x],
            vec![502],
            ErrorCode::InvalidArgument,
        ),
        (
            "too few outputs",
            exe,
            vec![x],
            vec![],
            ErrorCode::InvalidArgument,
        ),
        (
            "an output handle in use",
            exe,
            vec![x],
            vec![x],
            ErrorCode::AlreadyExists,
        ),
        (
            "an input on the wrong device",
            exe,
            vec![on_device_1],
            vec![503],
            ErrorCode::InvalidArgument,
        ),
    ];
    for (what, exe, inputs, outputs, code) in cases {
        let err = session.execute(exe, &inputs, &outputs, 1).unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err}");
    }
    assert!(log.lock().unwrap().is_empty(), "nothing ran");
    let err = session
        .load_executable(session.new_handle(), b"not an executable".to_vec())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    // Another executable under a handle in use is refused (the same
    // request again is a retry: see the test of retried loads).
    let err = session
        .load_executable(exe, executable_for_worker("add_one", 1))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists, "{err}");
    // The controller's ids of the worker's devices must name devices it has,
    // each controller id once.
    for (ids, text) in [
        (vec![(99, 0)], "which this host lacks"),
        (vec![(0, 5), (1, 5)], "twice"),
    ] {
        assert_error(
            session.load_executable_for(
                session.new_handle(),
                executable_for_worker("add_one", 0),
                ids.into_iter().collect(),
            ),
            ErrorCode::InvalidArgument,
            text,
        );
    }
    session
        .load_executable_for(
            session.new_handle(),
            executable_for_worker("add_one", 0),
            [(0, 4), (1, 5)].into_iter().collect(),
        )
        .unwrap();
}

#[test]
fn bulk_transfers_report_progress_up_to_the_total() {
    let (worker, token) = worker(|_| {});
    let session = connect(&worker, &token);
    let bytes = 5 * CHUNK_BYTES / 2;
    let data = pattern(bytes);
    let (reports, progress) = progress_log();
    let handle = session.new_handle();
    session
        .put_buffer_with_progress(
            handle,
            spec(0, DType::U8, &[bytes as i64]),
            data.clone(),
            Some(progress.clone()),
        )
        .unwrap();
    let put: Vec<(u64, u64)> = std::mem::take(&mut *reports.lock().unwrap());
    assert!(put.len() >= 3, "{put:?}");
    assert!(
        put.windows(2).all(|w| w[0].0 <= w[1].0),
        "monotonic: {put:?}"
    );
    assert!(put.iter().all(|&(_, total)| total == bytes as u64));
    assert_eq!(
        put.last(),
        Some(&(bytes as u64, bytes as u64)),
        "ends at the total"
    );

    let back = session
        .get_buffer_with_progress(handle, Some(progress))
        .unwrap();
    assert_eq!(back, data.to_vec());
    let got = reports.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "one report per chunk: {got:?}");
    assert_eq!(got.last(), Some(&(bytes as u64, bytes as u64)));
}

#[test]
fn pipelined_executions_on_the_control_stream_run_in_order() {
    let (_worker, session, exe, log) = session_with("add_one");
    let inputs: Vec<u64> = (0..200).map(|k| put_i32(&session, 0, [k; 4])).collect();
    let mut last = 0;
    for &x in &inputs {
        last = session.new_handle();
        session.execute_async(exe, &[x], &[last], 3).unwrap();
    }
    // Reading an output waits for the control operations sent before it.
    assert_eq!(i32_values(&session.get_buffer(last).unwrap()), vec![200; 4]);
    session.flush().unwrap();
    assert_eq!(*log.lock().unwrap(), (0..200).collect::<Vec<_>>());
}

/// The worker keeps each final answer for a connection that resumes the
/// session's control stream, and lets go of it once the controller says it
/// received it: with its next operation, or with a heartbeat when none comes.
#[test]
fn a_worker_keeps_final_answers_only_until_the_controller_says_it_received_them() {
    let (worker, session, exe, _log) = session_with("add_one");
    let inputs: Vec<u64> = (0..200).map(|k| put_i32(&session, 0, [k; 4])).collect();
    let mut last = 0;
    for &x in &inputs {
        last = session.new_handle();
        session.execute_async(exe, &[x], &[last], 3).unwrap();
    }
    session.flush().unwrap();
    assert_eq!(i32_values(&session.get_buffer(last).unwrap()), vec![200; 4]);
    // The next operation tells the worker of every answer before it.
    let y = session.new_handle();
    session.execute(exe, &[inputs[0]], &[y], 3).unwrap();
    eventually("the worker keeps the last answer alone", || {
        worker.kept_answers() <= 1
    });
    // A heartbeat tells it of the last one.
    eventually("the worker keeps no answer", || worker.kept_answers() == 0);
}

#[test]
fn a_refused_control_operation_fails_its_outputs_and_flush_reports_it() {
    let (_worker, session, exe, log) = session_with("add_one");
    let x = put_i32(&session, 0, [1; 4]);
    let refused = session.new_handle();
    session.execute_async(999, &[x], &[refused], 1).unwrap();
    let fine = session.new_handle();
    session.execute_async(exe, &[x], &[fine], 1).unwrap();
    assert_error(session.flush(), ErrorCode::NotFound, "no executable 999");
    session.flush().unwrap();
    assert_error(
        session.get_buffer(refused),
        ErrorCode::NotFound,
        "no executable 999",
    );
    assert_eq!(i32_values(&session.get_buffer(fine).unwrap()), vec![2; 4]);
    assert_eq!(log.lock().unwrap().len(), 1, "only the valid execution ran");
}

#[test]
fn small_reads_on_the_control_stream_follow_earlier_operations_and_check_their_size() {
    let (worker, token) = worker(|_| {});
    let session = connect(&worker, &token);
    let read = |handle: u64| {
        let (tx, rx) = std::sync::mpsc::channel();
        session.read_small_buffer_then(handle, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap()
    };
    let small = session.new_handle();
    session
        .put_buffer(small, spec(0, DType::U8, &[1000]), pattern(1000))
        .unwrap();
    assert_eq!(read(small).unwrap(), pattern(1000));
    // Another session's handle, or none at all: not found.
    let other = connect(&worker, &token);
    let (tx, rx) = std::sync::mpsc::channel();
    other.read_small_buffer_then(small, Box::new(move |r| tx.send(r).unwrap()));
    let err = rx.recv().unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    // Over the limit: the chunked GetBuffer is the way.
    let big = session.new_handle();
    let len = colocated_core::transport::MAX_INLINE_READ_BYTES + 1;
    session
        .put_buffer(big, spec(0, DType::U8, &[len as i64]), pattern(len))
        .unwrap();
    assert_error(read(big), ErrorCode::InvalidArgument, "GetBuffer");
    assert_eq!(session.get_buffer(big).unwrap().len(), len);
}

/// Downloads leave the worker from the buffer's memory, framed by hand: any
/// gRPC client still reads them as `BufferChunk` messages (the first with the
/// total), and a missing buffer is its gRPC error.
#[test]
fn any_grpc_client_downloads_a_buffer() {
    use colocated_core::transport::proto::worker_client::WorkerClient;
    use colocated_core::transport::proto::GetBufferRequest;
    use colocated_core::transport::{AUTHORIZATION, SESSION};

    let (worker, token) = worker(|_| {});
    let session = connect(&worker, &token);
    let bytes = 5 * CHUNK_BYTES / 2 + 3;
    let data = pattern(bytes);
    let handle = session.new_handle();
    session
        .put_buffer(handle, spec(0, DType::U8, &[bytes as i64]), data.clone())
        .unwrap();
    let request = |handle: u64| {
        let mut request = tonic::Request::new(GetBufferRequest { handle, offset: 0 });
        let metadata = request.metadata_mut();
        let bearer = format!("Bearer {}", token.expose());
        metadata.insert(AUTHORIZATION, bearer.parse().unwrap());
        metadata.insert(SESSION, session.id().to_string().parse().unwrap());
        request
    };
    let (chunks, missing) = block_on(async {
        let mut rpc = WorkerClient::connect(format!("http://{}", worker.local_addr()))
            .await
            .unwrap();
        let mut stream = rpc.get_buffer(request(handle)).await.unwrap().into_inner();
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            chunks.push(chunk);
        }
        let missing = match rpc.get_buffer(request(handle + 100)).await {
            Ok(mut stream) => stream.get_mut().message().await.unwrap_err(),
            Err(status) => status,
        };
        (chunks, missing)
    });
    assert_eq!(chunks.len(), 3, "chunks of CHUNK_BYTES");
    assert_eq!(chunks[0].total_bytes, bytes as u64);
    assert!(chunks[1..].iter().all(|c| c.total_bytes == 0));
    let got: Vec<u8> = chunks.iter().flat_map(|c| c.data.iter().copied()).collect();
    assert_eq!(got, data.to_vec());
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
}

/// What a worker answers on the control stream, by protocol version: up to
/// 4, every operation is answered when taken, and an execution a second time
/// when it finished; from 5 (cumulative), a successful execution is answered
/// once, when it finished, and a run of operations that finish at once ends
/// with one answer for its last (which says the ones before were taken).
/// Failures are answered at once either way.
#[test]
fn a_worker_answers_the_control_stream_cumulatively_from_protocol_5_with_outputs_from_6() {
    use colocated_core::transport::proto::{
        control_request::Op, ControlRequest, ControlResponse, DeleteBuffersRequest, PutBufferChunk,
    };
    use colocated_core::transport::{CUMULATIVE_VERSION, INLINE_OUTPUTS_VERSION};

    let (worker, token, _log) = worker_with_add_one();
    let answers_at = |version: u32| -> Vec<ControlResponse> {
        block_on(async {
            let session = RawSession::open(&worker, &token, version).await;
            let mut rpc = session.rpc.clone();
            let chunk = PutBufferChunk {
                handle: 10,
                spec: Some(spec(0, DType::I32, &[4])),
                data: i32_bytes(&[1; 4]),
            };
            rpc.put_buffer(session.authed(tokio_stream::iter([chunk])))
                .await
                .unwrap();
            let (ops, rx) = tokio::sync::mpsc::unbounded_channel();
            let mut answers = rpc
                .control(session.authed(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)))
                .await
                .unwrap()
                .into_inner();
            let send = |seq, op| {
                ops.send(ControlRequest {
                    seq,
                    op: Some(op),
                    ..Default::default()
                })
                .unwrap()
            };
            let mut got = Vec::new();
            let mut until = async |last: &dyn Fn(&ControlResponse) -> bool| loop {
                let answer = tokio::time::timeout(Duration::from_secs(10), answers.message())
                    .await
                    .expect("an answer")
                    .unwrap()
                    .unwrap();
                let done = last(&answer);
                got.push(answer);
                if done {
                    break;
                }
            };
            let execute = |executable, output| execute_op(executable, vec![10], vec![output]);
            send(1, execute(1, 11));
            until(&|a| a.finished).await;
            // Two deletions (one of a buffer the session lacks: not an error).
            send(
                2,
                Op::DeleteBuffers(DeleteBuffersRequest { handles: vec![11] }),
            );
            send(
                3,
                Op::DeleteBuffers(DeleteBuffersRequest { handles: vec![99] }),
            );
            until(&|a| a.seq == 3).await;
            // An execution of an executable the session lacks: refused.
            send(4, execute(999, 12));
            until(&|a| a.seq == 4).await;
            got
        })
    };
    let brief = |answers: &[ControlResponse]| -> Vec<(u64, bool, u32)> {
        answers
            .iter()
            .map(|a| (a.seq, a.finished, a.code))
            .collect()
    };
    let not_found = ErrorCode::NotFound as u32;

    let old = answers_at(CUMULATIVE_VERSION - 1);
    assert_eq!(
        brief(&old),
        [
            (1, false, 0),
            (1, true, 0),
            (2, false, 0),
            (3, false, 0),
            (4, false, not_found)
        ]
    );

    let finished_data = |answers: &[ControlResponse]| -> Vec<u8> {
        let finished = answers.iter().find(|a| a.finished).expect("finished");
        finished.data.to_vec()
    };
    assert_eq!(finished_data(&old), Vec::<u8>::new());

    let new = answers_at(CUMULATIVE_VERSION);
    assert_eq!(finished_data(&new), Vec::<u8>::new());
    let new = brief(&new);
    assert_eq!(new[0], (1, true, 0), "the execution, once: {new:?}");
    // The deletions: one answer for the last, unless the worker took the
    // first before the second arrived.
    let deletions = &new[1..new.len() - 1];
    assert!(
        deletions == [(3, false, 0)] || deletions == [(2, false, 0), (3, false, 0)],
        "{new:?}"
    );
    assert_eq!(new.last(), Some(&(4, false, not_found)), "{new:?}");

    // From version 6 the execution's answer carries its small output: add
    // one to [1, 1, 1, 1].
    let inline = answers_at(INLINE_OUTPUTS_VERSION);
    assert_eq!(brief(&inline)[0], (1, true, 0));
    assert_eq!(finished_data(&inline), i32_bytes(&[2; 4]).to_vec());
}

/// Protocol 8: a worker answers a read grant as soon as it holds it, even
/// when an execution that has not finished yet came right behind it (the
/// destination of a copy reads once the grant is answered).
#[test]
fn a_read_grant_is_answered_at_once_whatever_follows_it() {
    use colocated_core::transport::proto::{
        control_request::Op, ControlRequest, GrantReadRequest, LoadExecutableRequest,
        PutSmallBufferRequest,
    };
    use colocated_core::transport::GRANT_ANSWER_VERSION;

    let (worker, token, _log) = worker_with_add_one();
    let gate = colocated_core::Event::new();
    *GATE.lock().unwrap() = Some(gate.clone());
    block_on(async {
        let session = RawSession::open(&worker, &token, GRANT_ANSWER_VERSION).await;
        let mut rpc = session.rpc.clone();
        let load = LoadExecutableRequest {
            handle: 2,
            executable: executable_for_worker("gated", 0).into(),
            controller_device_ids: Default::default(),
        };
        rpc.load_executable(session.authed(load)).await.unwrap();
        // All three queued before the stream opens, so the worker takes them
        // together: an upload, its grant, and an execution that waits.
        let (ops, rx) = tokio::sync::mpsc::unbounded_channel();
        let send = |seq, op| {
            ops.send(ControlRequest {
                seq,
                op: Some(op),
                ..Default::default()
            })
            .unwrap()
        };
        send(
            1,
            Op::PutSmallBuffer(PutSmallBufferRequest {
                handle: 10,
                spec: Some(spec(0, DType::I32, &[4])),
                data: i32_bytes(&[1, 2, 3, 4]).to_vec().into(),
            }),
        );
        send(
            2,
            Op::GrantRead(GrantReadRequest {
                handle: 10,
                grant: vec![5u8; 32].into(),
                ttl_ms: 60_000,
            }),
        );
        send(3, execute_op(2, vec![10], vec![11]));
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut answers = rpc
            .control(session.authed(stream))
            .await
            .unwrap()
            .into_inner();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(10), answers.message())
                .await
                .expect("an answer")
                .unwrap()
                .unwrap()
        };
        // The grant's answer (cumulative: the upload's too), with the
        // execution still waiting at the gate.
        let granted = next().await;
        assert_eq!(
            (granted.seq, granted.code, granted.finished),
            (2, 0, false),
            "{granted:?}"
        );
        assert!(!gate.is_ready());
        gate.set(Ok(())).unwrap();
        let finished = next().await;
        assert_eq!(
            (finished.seq, finished.code, finished.finished),
            (3, 0, true),
            "{finished:?}"
        );
    });
    *GATE.lock().unwrap() = None;
}

/// Protocol 7: a small upload is an operation of the control stream, so an
/// execution sent right behind it uses it; a bad one is refused, typed.
#[test]
fn a_small_upload_on_the_control_stream_is_ordered_with_executions() {
    use colocated_core::transport::{MAX_SMALL_PUT_BYTES, SMALL_PUT_VERSION};

    on_raw_control(SMALL_PUT_VERSION, async |worker, control| {
        let put = put_small;
        // The upload and the execution that uses it, back to back.
        control.send(1, put_i32_op(10, &[1, 2, 3, 4]));
        control.send(2, execute_op(1, vec![10], vec![11]));
        let finished = loop {
            let answer = control.next().await;
            assert_eq!(answer.code, 0, "{}", answer.message);
            if answer.finished {
                break answer;
            }
        };
        assert_eq!(finished.seq, 2);
        assert_eq!(finished.data.to_vec(), i32_bytes(&[2, 3, 4, 5]).to_vec());
        // Refused: bytes that do not fit the spec, more than an operation
        // carries, strings, a handle in use.
        let big = MAX_SMALL_PUT_BYTES + 4;
        let refusals = [
            (put(12, DType::I32, &[4], vec![0; 15]), "needs 16 bytes"),
            (put(13, DType::U8, &[big as i64], vec![0; big]), "at most"),
            (put(14, DType::String, &[1], vec![0; 1]), "PutBuffer"),
            (put(10, DType::I32, &[4], vec![0; 16]), "10"),
        ];
        for (i, (op, says)) in refusals.into_iter().enumerate() {
            let seq = 3 + i as u64;
            let answer = control.ask(seq, op).await;
            assert_ne!(answer.code, 0, "operation {seq} was refused");
            assert!(answer.message.contains(says), "{}", answer.message);
        }
        assert_eq!(worker.buffer_count(), 2, "nothing refused was kept");
    });
}

/// An execution whose inputs do not fit its executable (a shard of another
/// shape or type, too few or too many, an output handle twice) is refused,
/// typed; a good one after it still runs.
#[test]
fn an_execution_with_inputs_that_do_not_fit_is_refused() {
    use colocated_core::transport::SMALL_PUT_VERSION;

    on_raw_control(SMALL_PUT_VERSION, async |_worker, control| {
        let put = put_small;
        let execute = |inputs, outputs| execute_op(1, inputs, outputs);
        control.send(1, put_i32_op(10, &[1, 2, 3, 4]));
        control.send(2, put_i32_op(11, &[1, 2]));
        control.send(3, put(12, DType::F32, &[4], vec![0; 16]));
        let refusals = [
            (execute(vec![11], vec![20]), "must be int32[4]"),
            (execute(vec![12], vec![21]), "got float32[4]"),
            (
                execute(vec![], vec![22]),
                "takes 1 input shards, 0 were given",
            ),
            (
                execute(vec![10, 10], vec![23]),
                "takes 1 input shards, 2 were given",
            ),
            (execute(vec![10], vec![24, 24]), "given twice"),
        ];
        let count = refusals.len() as u64;
        for (i, (op, says)) in refusals.into_iter().enumerate() {
            let seq = 4 + i as u64;
            let answer = control.ask(seq, op).await;
            assert_eq!(
                answer.code,
                ErrorCode::InvalidArgument as u32,
                "operation {seq}: {}",
                answer.message
            );
            assert!(answer.message.contains(says), "{}", answer.message);
        }
        let seq = 4 + count;
        control.send(seq, execute(vec![10], vec![25]));
        let finished = loop {
            let answer = control.next().await;
            if answer.seq == seq && answer.finished {
                break answer;
            }
        };
        assert_eq!(finished.code, 0, "{}", finished.message);
        assert_eq!(finished.data.to_vec(), i32_bytes(&[2, 3, 4, 5]).to_vec());
    });
}

/// A session opened with a raw gRPC client at protocol `version` (which the
/// worker must choose), with the `add_one` executable loaded as handle 1:
/// for requests as a controller of that version sends them.
/// Runs `future` to its end on a runtime of its own (raw gRPC clients need
/// one; the test thread is not in one).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

struct RawSession {
    rpc: colocated_core::transport::proto::worker_client::WorkerClient<tonic::transport::Channel>,
    bearer: String,
    id: String,
    id_bytes: Vec<u8>,
}

impl RawSession {
    async fn open(worker: &Worker, token: &Token, version: u32) -> RawSession {
        use colocated_core::transport::proto::worker_client::WorkerClient;
        use colocated_core::transport::proto::{LoadExecutableRequest, OpenSessionRequest};
        use colocated_core::transport::AUTHORIZATION;

        let mut rpc = WorkerClient::connect(format!("http://{}", worker.local_addr()))
            .await
            .unwrap();
        let bearer = format!("Bearer {}", token.expose());
        let mut open = tonic::Request::new(OpenSessionRequest {
            min_version: 1,
            max_version: version,
            client_name: "test".into(),
            software_version: String::new(),
        });
        open.metadata_mut()
            .insert(AUTHORIZATION, bearer.parse().unwrap());
        let opened = rpc.open_session(open).await.unwrap().into_inner();
        assert_eq!(opened.version, version);
        let id = opened
            .session_id
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let session = RawSession {
            rpc,
            bearer,
            id,
            id_bytes: opened.session_id.to_vec(),
        };
        let load = LoadExecutableRequest {
            handle: 1,
            executable: executable_for_worker("add_one", 0).into(),
            controller_device_ids: Default::default(),
        };
        session
            .rpc
            .clone()
            .load_executable(session.authed(load))
            .await
            .unwrap();
        session
    }

    /// `message` with the token and the session.
    fn authed<T>(&self, message: T) -> tonic::Request<T> {
        use colocated_core::transport::{AUTHORIZATION, SESSION};

        let mut request = tonic::Request::new(message);
        let metadata = request.metadata_mut();
        metadata.insert(AUTHORIZATION, self.bearer.parse().unwrap());
        metadata.insert(SESSION, self.id.parse().unwrap());
        request
    }

    /// The session's control stream.
    async fn control(&self) -> RawControl {
        let (ops, rx) = tokio::sync::mpsc::unbounded_channel();
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let answers = self
            .rpc
            .clone()
            .control(self.authed(stream))
            .await
            .unwrap()
            .into_inner();
        RawControl { ops, answers }
    }
}

/// A control stream opened by hand.
struct RawControl {
    ops: tokio::sync::mpsc::UnboundedSender<colocated_core::transport::proto::ControlRequest>,
    answers: tonic::Streaming<colocated_core::transport::proto::ControlResponse>,
}

impl RawControl {
    /// Sends operation `seq`.
    fn send(&self, seq: u64, op: colocated_core::transport::proto::control_request::Op) {
        let request = colocated_core::transport::proto::ControlRequest {
            seq,
            op: Some(op),
            ..Default::default()
        };
        self.ops.send(request).unwrap();
    }

    /// The next answer (within ten seconds).
    async fn next(&mut self) -> colocated_core::transport::proto::ControlResponse {
        tokio::time::timeout(Duration::from_secs(10), self.answers.message())
            .await
            .expect("an answer")
            .unwrap()
            .unwrap()
    }

    /// Sends operation `seq`: its answer (answers to others before it are
    /// skipped).
    async fn ask(
        &mut self,
        seq: u64,
        op: colocated_core::transport::proto::control_request::Op,
    ) -> colocated_core::transport::proto::ControlResponse {
        self.send(seq, op);
        self.answer_to(seq).await
    }

    /// The next answer to operation `seq` (answers to others before it are
    /// skipped).
    async fn answer_to(&mut self, seq: u64) -> colocated_core::transport::proto::ControlResponse {
        loop {
            let answer = self.next().await;
            if answer.seq == seq {
                return answer;
            }
        }
    }
}

/// An execution on the control stream: `executable` from `inputs` to
/// `outputs`, on the session's stream 1.
fn execute_op(
    executable: u64,
    inputs: Vec<u64>,
    outputs: Vec<u64>,
) -> colocated_core::transport::proto::control_request::Op {
    use colocated_core::transport::proto::{control_request::Op, ExecuteRequest};
    Op::Execute(ExecuteRequest {
        executable,
        inputs,
        outputs,
        stream: 1,
    })
}

/// Runs `test` with a worker that has `add_one` (see [`worker_with_add_one`])
/// and the control stream of a raw session of it at protocol `version`
/// (with `add_one` loaded as executable 1).
fn on_raw_control(version: u32, test: impl AsyncFnOnce(&Worker, &mut RawControl)) {
    let (worker, token, _log) = worker_with_add_one();
    block_on(async {
        let session = RawSession::open(&worker, &token, version).await;
        let mut control = session.control().await;
        test(&worker, &mut control).await;
    });
}

/// A small upload on the control stream: buffer `handle` of `data`.
fn put_small(
    handle: u64,
    dtype: DType,
    dims: &[i64],
    data: Vec<u8>,
) -> colocated_core::transport::proto::control_request::Op {
    use colocated_core::transport::proto::{control_request::Op, PutSmallBufferRequest};
    Op::PutSmallBuffer(PutSmallBufferRequest {
        handle,
        spec: Some(spec(0, dtype, dims)),
        data: data.into(),
    })
}

/// A small upload on the control stream: buffer `handle` of int32 `values`
/// (a vector of them) on device 0.
fn put_i32_op(
    handle: u64,
    values: &[i32],
) -> colocated_core::transport::proto::control_request::Op {
    put_small(
        handle,
        DType::I32,
        &[values.len() as i64],
        i32_bytes(values).to_vec(),
    )
}

/// Opens a lane by hand: sends `opening` (the magic bytes and a hello, or
/// not), and reads the worker's welcome, if it sends one before closing.
fn raw_lane(
    worker: &Worker,
    opening: &[u8],
) -> (
    std::net::TcpStream,
    Option<colocated_core::transport::proto::LaneWelcome>,
) {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(worker.local_addr()).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    socket.write_all(opening).unwrap();
    let mut len = [0u8; 4];
    if socket.read_exact(&mut len).is_err() {
        return (socket, None);
    }
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    socket.read_exact(&mut body).unwrap();
    let welcome =
        <colocated_core::transport::proto::LaneWelcome as prost::Message>::decode(&body[..])
            .unwrap();
    (socket, Some(welcome))
}

/// The bytes that open a lane: the magic, then `hello` framed.
fn lane_opening(hello: &colocated_core::transport::proto::LaneHello) -> Vec<u8> {
    let mut out = colocated_core::transport::LANE_MAGIC.to_vec();
    out.extend(frame(hello));
    out
}

/// `message` framed as on a lane.
fn frame(message: &impl prost::Message) -> Vec<u8> {
    let body = message.encode_to_vec();
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend(body);
    out
}

/// Waits (a few seconds at most) until `worker` holds `n` authenticated
/// connections.
fn wait_authenticated(worker: &Worker, n: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = worker.connection_counts().0 .1;
        if now == n || std::time::Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_session_runs_the_same_on_its_lane_and_on_grpc_and_closing_it_closes_the_lane() {
    let (worker, token, _log) = worker_with_add_one();
    for lane in [true, false] {
        let mut options = connect_options(&worker, &token);
        options.lane = lane;
        let session = RemoteSession::connect(&options).unwrap();
        // The session's connection, and its lane when it has one.
        assert_eq!(
            wait_authenticated(&worker, 1 + usize::from(lane)),
            1 + usize::from(lane)
        );
        let operations = worker.control_operations();
        let exe = load(&session, "add_one", 1);
        let x = put_i32(&session, 1, [1, 2, 3, 4]);
        // Pipelined executions, then a read on the control stream.
        let mut last = x;
        for _ in 0..50 {
            let y = session.new_handle();
            session.execute_then(exe, &[last], &[y], 3, Box::new(|_| {}));
            last = y;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        session.read_small_buffer_then(last, Box::new(move |read| tx.send(read).unwrap()));
        let read = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        assert_eq!(i32_values(&read), vec![51, 52, 53, 54], "lane: {lane}");
        // A refused operation is reported as on gRPC.
        let z = session.new_handle();
        let (tx, rx) = std::sync::mpsc::channel();
        session.execute_then(
            999,
            &[x],
            &[z],
            3,
            Box::new(move |done| tx.send(done).unwrap()),
        );
        let err = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
        assert_eq!(session.flush().unwrap_err().code(), ErrorCode::NotFound);
        assert!(worker.control_operations() >= operations + 52);
        session.close();
        // The worker closes the lane with the session; the connections (the
        // session's, and its bulk data's, which the load opened) go with the
        // session's last handle.
        assert_eq!(wait_authenticated(&worker, 2), 2, "lane: {lane}");
        let ended = session.lost().status().unwrap().unwrap_err();
        assert_eq!(
            ended.code(),
            ErrorCode::Cancelled,
            "closed, not lost: {ended}"
        );
        drop(session);
        assert_eq!(wait_authenticated(&worker, 0), 0, "lane: {lane}");
    }
}

#[test]
fn a_lane_needs_the_token_and_a_live_session_and_a_stranger_holds_nothing() {
    use colocated_core::transport::proto::LaneHello;
    use std::io::Read;

    let (worker, token, _log) = worker_with_add_one();
    let raw = block_on(RawSession::open(&worker, &token, 9));
    let refused_before = worker.refused_requests();
    let hello = |token: &str, session: &[u8]| LaneHello {
        token: token.to_string(),
        session_id: session.to_vec().into(),
        ..Default::default()
    };
    let closed = |mut socket: std::net::TcpStream| {
        let mut byte = [0u8; 1];
        matches!(socket.read(&mut byte), Ok(0) | Err(_))
    };
    // A wrong token, an unknown session: refused, and closed.
    let (socket, welcome) = raw_lane(&worker, &lane_opening(&hello("wrong", &raw.id_bytes)));
    let welcome = welcome.expect("a welcome that refuses");
    assert_eq!(
        welcome.code,
        ErrorCode::Unauthenticated as u32,
        "{welcome:?}"
    );
    assert!(closed(socket));
    assert_eq!(worker.refused_requests(), refused_before + 1);
    let (socket, welcome) = raw_lane(&worker, &lane_opening(&hello(token.expose(), &[7; 16])));
    let welcome = welcome.unwrap();
    assert_eq!(welcome.code, ErrorCode::Unauthenticated as u32);
    assert!(
        welcome.message.contains("unknown session"),
        "{}",
        welcome.message
    );
    assert!(closed(socket));
    assert_eq!(
        worker.refused_requests(),
        refused_before + 2,
        "counted like the router's"
    );
    // Wrong magic bytes, a hello longer than allowed: closed with a refusal
    // (before any hello is read past its length).
    let mut wrong_magic = lane_opening(&hello(token.expose(), &raw.id_bytes));
    wrong_magic[1] = b'X';
    let (socket, welcome) = raw_lane(&worker, &wrong_magic);
    assert_eq!(welcome.unwrap().code, ErrorCode::InvalidArgument as u32);
    assert!(closed(socket));
    let mut huge = colocated_core::transport::LANE_MAGIC.to_vec();
    huge.extend((64u32 << 20).to_le_bytes());
    let (socket, welcome) = raw_lane(&worker, &huge);
    let welcome = welcome.unwrap();
    assert_eq!(welcome.code, ErrorCode::InvalidArgument as u32);
    assert!(welcome.message.contains("at most"), "{}", welcome.message);
    assert!(closed(socket));
    // (The raw session's connection closed with the runtime that opened it.)
    assert_eq!(wait_authenticated(&worker, 0), 0, "no lane was accepted");
    // The right token and session: accepted, and counted.
    let (socket, welcome) = raw_lane(
        &worker,
        &lane_opening(&hello(token.expose(), &raw.id_bytes)),
    );
    assert_eq!(welcome.unwrap().code, 0);
    assert_eq!(wait_authenticated(&worker, 1), 1);
    drop(socket);
    assert_eq!(wait_authenticated(&worker, 0), 0, "a lane's end frees it");
    assert_eq!(worker.session_count(), 1, "the session outlives its lane");
}

#[test]
fn a_silent_lane_is_closed_at_the_handshake_deadline() {
    let (worker, _token) = worker(|options| options.handshake_timeout = Duration::from_millis(300));
    // The zero byte that marks a lane, then nothing.
    let (socket, welcome) = raw_lane(&worker, &[0u8]);
    assert!(welcome.is_none(), "closed without a welcome");
    drop(socket);
    assert_eq!(worker.connection_counts().1 .1, 1, "timed out");
}

#[test]
fn a_lane_answers_its_operations_and_a_bad_frame_ends_only_that_lane() {
    use colocated_core::transport::proto::{
        control_request::Op, ControlRequest, ControlResponse, LaneHello, PutSmallBufferRequest,
    };
    use std::io::{Read, Write};

    let (worker, token, _log) = worker_with_add_one();
    let raw = block_on(RawSession::open(&worker, &token, 9));
    let (mut socket, welcome) = raw_lane(
        &worker,
        &lane_opening(&LaneHello {
            token: token.expose().to_string(),
            session_id: raw.id_bytes.clone().into(),
            ..Default::default()
        }),
    );
    assert_eq!(welcome.unwrap().code, 0);
    let mut ops = Vec::new();
    ops.extend(frame(&ControlRequest {
        seq: 1,
        op: Some(Op::PutSmallBuffer(PutSmallBufferRequest {
            handle: 10,
            spec: Some(spec(0, DType::I32, &[4])),
            data: i32_bytes(&[5; 4]),
        })),
        ..Default::default()
    }));
    let execute = |seq, executable, output| ControlRequest {
        seq,
        op: Some(execute_op(executable, vec![10], vec![output])),
        ..Default::default()
    };
    ops.extend(frame(&execute(2, 1, 11)));
    // An executable the session lacks.
    ops.extend(frame(&execute(3, 999, 12)));
    socket.write_all(&ops).unwrap();
    let mut answer = || {
        let mut len = [0u8; 4];
        socket.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        socket.read_exact(&mut body).unwrap();
        <ControlResponse as prost::Message>::decode(&body[..]).unwrap()
    };
    let mut answers = Vec::new();
    while !answers
        .iter()
        .any(|a: &ControlResponse| a.seq == 2 && a.finished)
        || !answers.iter().any(|a: &ControlResponse| a.seq == 3)
    {
        answers.push(answer());
    }
    let finished = answers.iter().find(|a| a.seq == 2 && a.finished).unwrap();
    assert_eq!(finished.code, 0);
    assert_eq!(
        i32_values(&finished.data),
        vec![6; 4],
        "the output rides with the answer"
    );
    let refused = answers.iter().find(|a| a.seq == 3).unwrap();
    assert_eq!(refused.code, ErrorCode::NotFound as u32, "{refused:?}");
    // A frame longer than any message: the worker ends the lane, not itself.
    socket.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut rest = Vec::new();
    let _ = socket.read_to_end(&mut rest);
    assert_eq!(wait_authenticated(&worker, 0), 0);
    // The session and the worker go on.
    assert_eq!(worker.session_count(), 1);
    let session = connect(&worker, &token);
    session.heartbeat().unwrap();
}

#[test]
fn a_worker_that_stops_is_lost_by_a_session_on_its_lane() {
    let (worker, token) = worker(|_| {});
    let session = connect(&worker, &token);
    assert_eq!(wait_authenticated(&worker, 2), 2);
    worker.shutdown().unwrap();
    let lost = session
        .lost()
        .wait_timeout(Duration::from_secs(5))
        .unwrap_err();
    // Not the wait's own deadline: the lane's end says the worker is gone.
    assert_eq!(lost.code(), ErrorCode::Unavailable, "{lost}");
}
