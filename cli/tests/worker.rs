//! The worker binary, as a controller sees it: real processes, real sockets on
//! 127.0.0.1.

// The tests handle tonic::Status values, which are large by design.
#![allow(clippy::result_large_err)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use colocated_core::session::{ConnectOptions, RemoteSession};
use colocated_core::transport::proto::worker_client::WorkerClient;
use colocated_core::transport::proto::{HeartbeatRequest, OpenSessionRequest};
use colocated_core::transport::{SessionId, Token, AUTHORIZATION, SESSION};
use colocated_core::ErrorCode;

mod common;
#[path = "../../tests/plugin/compile.rs"]
mod compile;
use common::{connect, spawn_worker, start, worker_command, Spawned, TempDir};
use compile::{compile_plugin, workspace};

/// Starts a worker with 3 CPU devices, `token` (None: `--insecure`) and
/// `extra` flags; waits for its `listening on` line.
fn spawn(token: Option<&Token>, extra: &[&str]) -> Spawned {
    spawn_worker(token, &[&["--cpu-devices", "3"], extra].concat(), None)
}

/// A raw gRPC call against the worker, for requests the controller never sends.
fn raw<T>(
    worker: &Spawned,
    call: impl AsyncFnOnce(WorkerClient<tonic::transport::Channel>) -> Result<T, tonic::Status>,
) -> Result<T, tonic::Status> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = WorkerClient::connect(format!("http://{}", worker.address))
            .await
            .unwrap();
        call(client).await
    })
}

fn with_metadata<T>(message: T, token: Option<&str>, session: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert(AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
    }
    if let Some(session) = session {
        request
            .metadata_mut()
            .insert(SESSION, session.parse().unwrap());
    }
    request
}

fn open_request(min: u32, max: u32) -> OpenSessionRequest {
    OpenSessionRequest {
        min_version: min,
        max_version: max,
        client_name: "test".into(),
        software_version: String::new(),
    }
}

#[test]
fn a_worker_announces_its_address_and_serves_its_devices() {
    let token = Token::generate().unwrap();
    let worker = spawn(Some(&token), &[]);
    let session = connect(&worker, Some(&token)).unwrap();
    assert_eq!(
        session.version(),
        colocated_core::transport::PROTOCOL_VERSION_MAX
    );
    let host = session.host();
    assert_eq!(host.devices.len(), 3);
    assert!(host.devices.iter().all(|d| d.kind == "cpu"));
    assert!(
        host.languages.iter().any(|l| l == "native"),
        "{:?}",
        host.languages
    );
    session.heartbeat().unwrap();
    session.disconnect().unwrap();
    let err = session.heartbeat().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");
    assert!(err.message().contains("unknown session"), "{err}");
}

#[test]
fn a_missing_or_wrong_token_is_refused_with_unauthenticated() {
    let token = Token::generate().unwrap();
    let worker = spawn(Some(&token), &[]);
    let err = connect(&worker, None).err().unwrap();
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");
    assert!(err.message().contains("requires a token"), "{err}");
    let wrong = Token::new(format!("{}x", token.expose())).unwrap();
    let err = connect(&worker, Some(&wrong)).err().unwrap();
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");
    assert!(err.message().contains("token is wrong"), "{err}");
    // The worker keeps serving the rightful controller.
    connect(&worker, Some(&token)).unwrap();
}

/// `PutBuffer` is served by the worker's own route (not tonic's codec), so a
/// stock gRPC client's upload must work through it exactly, and be refused
/// without the token and session like every other request.
#[test]
fn a_stock_grpc_client_uploads_through_the_workers_put_buffer_route() {
    use bytes::Bytes;
    use colocated_core::transport::proto::{BufferSpec, PutBufferChunk};
    let token = Token::generate().unwrap();
    let worker = spawn(Some(&token), &[]);
    let session = connect(&worker, Some(&token)).unwrap();
    let id = session.id().to_string();
    let chunks = |handle: u64, data: [&'static [u8]; 2]| {
        let spec = BufferSpec {
            device: 1,
            dtype: colocated_core::DType::U8 as u32,
            dims: vec![5],
            memory_kind: 0,
        };
        let first = PutBufferChunk {
            handle,
            spec: Some(spec),
            data: Bytes::from_static(data[0]),
        };
        let second = PutBufferChunk {
            handle: 0,
            spec: None,
            data: Bytes::from_static(data[1]),
        };
        tokio_stream::iter([first, second])
    };
    let put = |handle: u64, data, token: Option<&str>, session: Option<&str>| {
        raw(&worker, async |mut rpc| {
            rpc.put_buffer(with_metadata(chunks(handle, data), token, session))
                .await
        })
    };

    let handle = session.new_handle();
    put(handle, [b"abc", b"de"], Some(token.expose()), Some(&id)).unwrap();
    assert_eq!(session.get_buffer(handle).unwrap(), b"abcde");

    let refused = session.new_handle();
    let made_up = SessionId::random().unwrap().to_string();
    for (what, token_text, session_text) in [
        ("no token", None, Some(id.as_str())),
        ("a wrong token", Some("wrong"), Some(id.as_str())),
        ("no session", Some(token.expose()), None),
        (
            "a made-up session",
            Some(token.expose()),
            Some(made_up.as_str()),
        ),
    ] {
        let status = put(refused, [b"abc", b"de"], token_text, session_text).unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::Unauthenticated,
            "{what}: {status:?}"
        );
    }
    for (what, data) in [
        ("too many bytes", [b"abc" as &[u8], b"def"]),
        ("too few bytes", [b"abc", b"d"]),
    ] {
        let status = put(refused, data, Some(token.expose()), Some(&id)).unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
    }
    let status = put(handle, [b"abc", b"de"], Some(token.expose()), Some(&id)).unwrap_err();
    assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
    // Nothing refused was stored.
    let err = session.get_buffer(refused).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert_eq!(session.get_buffer(handle).unwrap(), b"abcde");
}

#[test]
fn requests_are_bound_to_an_authenticated_session() {
    let token = Token::generate().unwrap();
    let worker = spawn(Some(&token), &[]);
    let session = connect(&worker, Some(&token)).unwrap();
    let id = session.id().to_string();
    let made_up = SessionId::random().unwrap().to_string();
    for (what, token_text, session_text) in [
        (
            "a made-up session",
            Some(token.expose()),
            Some(made_up.as_str()),
        ),
        ("no session", Some(token.expose()), None),
        ("a malformed session", Some(token.expose()), Some("zz")),
        ("a real session without the token", None, Some(id.as_str())),
        (
            "a real session with a wrong token",
            Some("wrong"),
            Some(id.as_str()),
        ),
    ] {
        let status = raw(&worker, async |mut rpc| {
            rpc.heartbeat(with_metadata(
                HeartbeatRequest::default(),
                token_text,
                session_text,
            ))
            .await
        })
        .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::Unauthenticated,
            "{what}: {status:?}"
        );
    }
    session.heartbeat().unwrap();
}

#[test]
fn versions_without_overlap_are_refused() {
    let token = Token::generate().unwrap();
    let worker = spawn(Some(&token), &[]);
    let newest = colocated_core::transport::PROTOCOL_VERSION_MAX;
    for (min, max) in [(newest + 1, newest + 8), (0, 0), (3, 1)] {
        let status = raw(&worker, async |mut rpc| {
            rpc.open_session(with_metadata(
                open_request(min, max),
                Some(token.expose()),
                None,
            ))
            .await
        })
        .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::FailedPrecondition,
            "{min}..={max}: {status:?}"
        );
        assert!(
            status.message().contains("no common protocol version"),
            "{status:?}"
        );
    }
    let opened = raw(&worker, async |mut rpc| {
        rpc.open_session(with_metadata(
            open_request(0, newest + 3),
            Some(token.expose()),
            None,
        ))
        .await
    })
    .unwrap()
    .into_inner();
    assert_eq!(opened.version, newest, "the highest common version");
    assert_eq!(opened.session_id.len(), 16);
}

#[test]
fn a_silent_controllers_session_is_freed_and_a_live_one_kept() {
    let token = Token::generate().unwrap();
    let worker = spawn(
        Some(&token),
        &["--heartbeat-interval", "0.1", "--session-timeout", "0.5"],
    );
    // A controller that opens a session and then goes silent.
    let silent = raw(&worker, async |mut rpc| {
        rpc.open_session(with_metadata(
            open_request(1, 1),
            Some(token.expose()),
            None,
        ))
        .await
    })
    .unwrap()
    .into_inner();
    let silent = SessionId::from_bytes(&silent.session_id)
        .unwrap()
        .to_string();
    // A live controller sends heartbeats by itself.
    let live = connect(&worker, Some(&token)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let status = raw(&worker, async |mut rpc| {
        rpc.heartbeat(with_metadata(
            HeartbeatRequest::default(),
            Some(token.expose()),
            Some(&silent),
        ))
        .await
    })
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    live.heartbeat().unwrap();
}

#[test]
fn a_worker_without_a_token_refuses_to_start_unless_insecure() {
    let output = worker_command(None).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("requires a token"), "{stderr}");
    assert!(output.stdout.is_empty());

    let dir = TempDir::new();
    let empty = dir.0.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let output = worker_command(None)
        .arg("--token-file")
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("empty"));

    let worker = spawn(None, &[]);
    let session = connect(&worker, None).unwrap();
    session.heartbeat().unwrap();
}

#[test]
fn a_worker_stops_cleanly_on_sigterm() {
    let token = Token::generate().unwrap();
    let mut worker = spawn(Some(&token), &[]);
    let _session = connect(&worker, Some(&token)).unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &worker.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = worker.child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the worker did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut rest = String::new();
    worker.stdout.read_to_string(&mut rest).unwrap();
    assert!(rest.is_empty(), "only one line on stdout, then {rest:?}");
}

/// Waits up to `patience` for `child` to exit; kills it (SIGKILL) if it does not.
fn wait_bounded(child: &mut Child, patience: Duration) -> Result<std::process::ExitStatus, String> {
    let deadline = Instant::now() + patience;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not exit within {patience:?}, killed"));
            }
            Err(e) => return Err(format!("cannot wait: {e}")),
        }
    }
}

/// A launcher may stop a worker as soon as it has announced itself: its
/// SIGTERM handler is in place before the `listening on` line, so it stops
/// cleanly (status 0) instead of dying of the signal. Twenty workers start at
/// once, each signalled the moment its line is read.
#[test]
fn a_worker_signalled_right_after_its_listening_line_exits_zero() {
    use std::os::unix::process::ExitStatusExt;
    let token = Token::generate().unwrap();
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..20)
            .map(|_| {
                scope.spawn(|| {
                    let mut worker = spawn(Some(&token), &["--listen", "127.0.0.1:0"]);
                    let pid = worker.child.id().to_string();
                    let killed = Command::new("kill")
                        .args(["-TERM", &pid])
                        .status()
                        .map_err(|e| format!("cannot run kill: {e}"))?;
                    if !killed.success() {
                        return Err(format!("kill -TERM {pid}: {killed}"));
                    }
                    let status = wait_bounded(&mut worker.child, Duration::from_secs(10))?;
                    match (status.code(), status.signal()) {
                        (Some(0), _) => Ok(()),
                        (_, Some(signal)) => Err(format!("died of signal {signal}")),
                        (code, None) => Err(format!("exited with {code:?}")),
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let failures: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.as_ref().err().map(|e| format!("worker {i}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn malformed_oversized_and_truncated_input_gets_an_error_and_the_worker_serves_on() {
    use std::io::Write;
    use std::net::TcpStream;
    let token = Token::generate().unwrap();
    let worker = spawn(Some(&token), &[]);
    let session = connect(&worker, Some(&token)).unwrap();
    let write_and_drop = |bytes: &[u8]| {
        let mut socket = TcpStream::connect(&worker.address).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _ = socket.write_all(bytes);
        let mut reply = Vec::new();
        let _ = socket.read_to_end(&mut reply);
    };
    // Not HTTP/2 at all.
    write_and_drop(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\xfe garbage");
    // The HTTP/2 preface, then a frame header that promises more than follows.
    write_and_drop(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x10\x00\x01\x05\x00\x00\x00\x01abc");
    // A gRPC message above the worker's limit.
    let status = raw(&worker, async |mut rpc| {
        let mut request = open_request(1, 1);
        request.client_name = "x".repeat(5 << 20);
        rpc.open_session(with_metadata(request, Some(token.expose()), None))
            .await
    })
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    // The worker still serves the session it had, and new ones.
    session.heartbeat().unwrap();
    connect(&worker, Some(&token)).unwrap().heartbeat().unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_killed_worker_is_lost_within_two_seconds_and_a_restarted_one_serves_again() {
    use bytes::Bytes;
    use colocated_core::transport::proto::BufferSpec;
    let token = Token::generate().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut worker = spawn(
        Some(&token),
        &["--listen", &listen, "--heartbeat-interval", "0.2"],
    );
    let session = connect(&worker, Some(&token)).unwrap();
    let spec = BufferSpec {
        device: 0,
        dtype: colocated_core::DType::U8 as u32,
        dims: vec![3],
        memory_kind: 0,
    };
    let handle = session.new_handle();
    session
        .put_buffer(handle, spec.clone(), Bytes::from_static(b"abc"))
        .unwrap();

    worker.child.kill().unwrap(); // SIGKILL: no goodbye
    worker.child.wait().unwrap();
    let killed = Instant::now();
    let lost = session.lost().wait_timeout(Duration::from_secs(2));
    let err = lost.expect_err("the session notices within 2 s");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(killed.elapsed() < Duration::from_secs(2));
    // Every later call fails at once with that error.
    let started = Instant::now();
    let err = session.get_buffer(handle).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(started.elapsed() < Duration::from_millis(100));

    // The worker comes back on the same address: a new session works.
    let worker = spawn(Some(&token), &["--listen", &listen]);
    assert_eq!(worker.address, listen);
    let again = connect(&worker, Some(&token)).unwrap();
    again
        .put_buffer(again.new_handle(), spec, Bytes::from_static(b"xyz"))
        .unwrap();
    assert_eq!(
        session.heartbeat().unwrap_err().code(),
        ErrorCode::Unavailable
    );
}

/// A self-signed certificate for 127.0.0.1 and localhost: (cert PEM, key PEM).
fn self_signed() -> (String, String) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    (certified.cert.pem(), certified.key_pair.serialize_pem())
}

#[test]
fn a_tls_worker_serves_controllers_that_trust_its_certificate_only() {
    let token = Token::generate().unwrap();
    let dir = TempDir::new();
    let (cert, key) = self_signed();
    let (cert_file, key_file) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let worker = spawn(
        Some(&token),
        &[
            "--tls-cert",
            cert_file.to_str().unwrap(),
            "--tls-key",
            key_file.to_str().unwrap(),
        ],
    );
    let with_ca = |ca: Option<&str>| {
        let mut options = ConnectOptions::new(worker.address.clone(), Some(token.clone()));
        options.timeout = Duration::from_secs(5);
        options.tls_ca = ca.map(|c| c.as_bytes().to_vec());
        RemoteSession::connect(&options)
    };
    let session = with_ca(Some(&cert)).unwrap();
    assert_eq!(session.host().devices.len(), 3);
    session.heartbeat().unwrap();
    // Plain TCP to a TLS worker, or TLS trusting another certificate: refused.
    assert!(with_ca(None).is_err());
    let (other, _) = self_signed();
    let err = with_ca(Some(&other))
        .err()
        .expect("an untrusted certificate is refused");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    // A certificate without its key is a usage error.
    let output = worker_command(None)
        .arg("--insecure")
        .arg("--tls-cert")
        .arg(&cert_file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn a_worker_runs_the_native_functions_of_the_plugins_it_was_told_to_load() {
    use colocated_core::{
        Array, ArraySpec, Client, ClientOptions, ClusterOptions, CompileOptions, DType,
        ExecuteOptions, Program, Sharding,
    };
    let token = Token::generate().unwrap();
    let dir = TempDir::new();
    let plugin = compile_plugin(
        &dir.0,
        "add_one_plugin",
        &workspace().join("tests/plugin/add_one_plugin.c"),
    );
    let worker = spawn(Some(&token), &["--plugin", plugin.to_str().unwrap()]);
    let mut connect = ConnectOptions::new(worker.address.clone(), Some(token.clone()));
    connect.timeout = Duration::from_secs(5);
    let client = Client::connect(&ClusterOptions {
        workers: vec![connect],
        include_local: false,
        local: ClientOptions {
            num_cpu_devices: None,
            executor_threads: Some(2),
            ..Default::default()
        },
    })
    .unwrap();
    let devices = client.devices().to_vec();
    assert_eq!(devices.len(), 3);
    let sharding =
        Sharding::named(devices.clone(), vec![3], vec!["x".into()], vec![vec![0]]).unwrap();
    let spec = ArraySpec::new(vec![12], DType::I32, sharding).unwrap();
    let values: Vec<i32> = (0..12).map(|v| v * 7 - 30).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let x = Array::from_host_bytes(&client, &bytes, spec.clone()).unwrap();
    let program = |function: &str| {
        Program::native(
            function,
            vec![spec.clone()],
            vec![spec.clone()],
            devices.clone(),
        )
    };

    let add_one = client
        .compile(program("plugin_add_one_i32"), CompileOptions::default())
        .unwrap();
    let run = add_one
        .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
        .unwrap();
    run.status.wait().unwrap();
    let got: Vec<i32> = run.outputs[0]
        .to_host_bytes()
        .unwrap()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got, values.iter().map(|v| v + 1).collect::<Vec<i32>>());

    // A plugin function's error code and message reach the execution's status.
    let fail = client
        .compile(program("plugin_fail"), CompileOptions::default())
        .unwrap();
    let run = fail
        .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
        .unwrap();
    let err = run.status.wait().unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{err}");
    assert!(
        err.message().contains(
            "plugin function 'plugin_fail': plugin_fail failed on purpose (3 input shards)"
        ),
        "{err}"
    );

    // A name no plugin registered is unknown on the worker.
    let Err(err) = client.compile(program("plugin_unknown"), CompileOptions::default()) else {
        panic!("an unknown native function compiled");
    };
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(
        err.message()
            .contains("no native function 'plugin_unknown'"),
        "{err}"
    );
}

#[test]
fn a_worker_whose_plugin_cannot_be_loaded_exits_with_a_message() {
    let dir = TempDir::new();
    let token = dir.0.join("token");
    std::fs::write(&token, format!("{}\n", Token::generate().unwrap().expose())).unwrap();
    let fails_to_start = |plugin: &std::path::Path, expected: &str| {
        let output = worker_command(None)
            .arg("--token-file")
            .arg(&token)
            .arg("--plugin")
            .arg(plugin)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        assert!(
            output.stdout.is_empty(),
            "no `listening on` line: {output:?}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{expected:?} not in {stderr:?}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    };
    let missing = dir.0.join("libmissing.so");
    fails_to_start(
        &missing,
        &format!(
            "not_found: plugin library {} does not exist",
            missing.display()
        ),
    );
    let source = dir.0.join("not_a_plugin.c");
    std::fs::write(&source, "int not_a_plugin(void) { return 0; }\n").unwrap();
    let not_a_plugin = compile_plugin(&dir.0, "not_a_plugin", &source);
    fails_to_start(
        &not_a_plugin,
        &format!(
            "invalid_argument: plugin library {} does not export colocated_plugin_init",
            not_a_plugin.display()
        ),
    );
}

/// A worker's stderr, collected line by line as it comes.
struct Stderr(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Stderr {
    fn collect(stderr: std::process::ChildStderr) -> Stderr {
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                sink.lock().unwrap().push(line);
            }
        });
        Stderr(lines)
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// The lines containing `text`.
    fn matching(&self, text: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.contains(text))
            .collect()
    }

    /// Waits up to 10 s until `count` lines contain `text`; returns them all.
    fn wait_for(&self, text: &str, count: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.matching(text);
            if found.len() >= count || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts a worker (`--insecure` without a token) with `extra` flags and
/// `COLOCATED_LOG` as given (unset: `None`), its stderr collected.
fn spawn_logged(token: Option<&Token>, extra: &[&str], log: Option<&str>) -> (Spawned, Stderr) {
    let mut command = worker_command(None);
    command
        .env_remove("COLOCATED_LOG")
        .args(["--cpu-devices", "2"])
        .args(extra);
    if let Some(log) = log {
        command.env("COLOCATED_LOG", log);
    }
    let (worker, stderr) = start(command, token, true);
    let stderr = Stderr::collect(stderr.expect("stderr is captured"));
    (worker, stderr)
}

/// Operators see warnings without setting COLOCATED_LOG: an insecure worker
/// says so, and one listening beyond loopback without TLS too;
/// COLOCATED_LOG still decides when set.
#[test]
fn an_insecure_or_exposed_worker_warns_on_stderr_by_default() {
    let (worker, stderr) = spawn_logged(None, &[], None);
    let warned = stderr.wait_for("without a token", 1);
    assert_eq!(warned.len(), 1, "{:?}", stderr.lines());
    assert!(warned[0].contains("WARN"), "{warned:?}");
    assert!(
        stderr.matching("without TLS").is_empty(),
        "loopback is not exposed"
    );
    connect(&worker, None).unwrap().heartbeat().unwrap();
    drop(worker);

    let token = Token::generate().unwrap();
    let (worker, stderr) = spawn_logged(Some(&token), &["--listen", "0.0.0.0:0"], None);
    let warned = stderr.wait_for("without TLS", 1);
    assert_eq!(warned.len(), 1, "{:?}", stderr.lines());
    assert!(warned[0].contains("plain text"), "{warned:?}");
    assert!(stderr.matching("without a token").is_empty());
    connect(&worker, Some(&token)).unwrap().heartbeat().unwrap();
    drop(worker);

    // COLOCATED_LOG overrides the default: the warning is logged in
    // Worker::start, before the listening line, so it would be there by now.
    let (mut worker, stderr) = spawn_logged(None, &[], Some("error"));
    connect(&worker, None).unwrap().heartbeat().unwrap();
    let pid = worker.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    assert!(wait_bounded(&mut worker.child, Duration::from_secs(10))
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(100));
    assert!(stderr.lines().is_empty(), "{:?}", stderr.lines());
}

/// The `suppressed=N` field of a refusal line (0 without it).
fn suppressed(line: &str) -> u64 {
    line.split_once("suppressed=")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Every refused request is logged with its peer's address, or counted: a
/// peer gets at most a line a second, and the next line tells how many were
/// left out. 200 refusals in a burst make a handful of lines, not 200.
#[test]
fn refused_requests_are_logged_with_their_peer_and_rate_limited() {
    let token = Token::generate().unwrap();
    let (worker, stderr) = spawn_logged(Some(&token), &[], None);
    let refused = "refused a request";
    let heartbeat = |token_text: Option<&str>, session: Option<&str>| {
        raw(&worker, async |mut rpc| {
            rpc.heartbeat(with_metadata(
                HeartbeatRequest::default(),
                token_text,
                session,
            ))
            .await
        })
    };
    let status = heartbeat(Some("wrong"), None).unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let lines = stderr.wait_for(refused, 1);
    assert_eq!(lines.len(), 1, "{:?}", stderr.lines());
    assert!(lines[0].contains("wrong token"), "{lines:?}");
    assert!(lines[0].contains("peer=127.0.0.1:"), "{lines:?}");

    // 200 more on one connection, as fast as they go: wrong tokens, none,
    // and made-up sessions.
    let made_up = SessionId::random().unwrap().to_string();
    let refusals = raw(&worker, async |mut rpc| {
        let mut refusals = 0;
        for i in 0..200 {
            let (token_text, session) = match i % 3 {
                0 => (Some("wrong"), None),
                1 => (None, None),
                _ => (Some(token.expose()), Some(made_up.as_str())),
            };
            let status = rpc
                .heartbeat(with_metadata(
                    HeartbeatRequest::default(),
                    token_text,
                    session,
                ))
                .await
                .unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
            refusals += 1;
        }
        Ok(refusals)
    })
    .unwrap();
    assert_eq!(refusals, 200);
    // A second later, one more: its line tells how many were left out.
    std::thread::sleep(Duration::from_millis(1100));
    let before = stderr.matching(refused).len();
    heartbeat(None, None).unwrap_err();
    let lines = stderr.wait_for(refused, before + 1);
    assert!(lines.len() <= 10, "{} lines: {lines:#?}", lines.len());
    let last = lines.last().unwrap();
    assert!(
        last.contains("no token") && last.contains("not shown"),
        "{last}"
    );
    assert!(
        lines.iter().all(|l| l.contains("peer=127.0.0.1:")),
        "{lines:#?}"
    );
    // Every refusal was either logged or counted.
    let told: u64 = lines.iter().map(|l| suppressed(l)).sum();
    assert_eq!(lines.len() as u64 + told, 202, "{lines:#?}");
    // The worker serves its controller all along.
    connect(&worker, Some(&token)).unwrap().heartbeat().unwrap();
}

/// Waits for `worker` to exit by itself within `patience`; its status and how
/// long it took.
fn exits_within(worker: &mut Spawned, patience: Duration) -> (std::process::ExitStatus, Duration) {
    let started = Instant::now();
    let status = wait_bounded(&mut worker.child, patience).unwrap();
    (status, started.elapsed())
}

#[test]
fn a_worker_with_exit_after_idle_and_no_controller_exits_zero() {
    let token = Token::generate().unwrap();
    let started = Instant::now();
    let (mut worker, stderr) = spawn_logged(Some(&token), &["--exit-after-idle", "1"], None);
    let (status, _) = exits_within(&mut worker, Duration::from_secs(10));
    assert!(status.success(), "{status:?} {:?}", stderr.lines());
    assert!(started.elapsed() >= Duration::from_millis(900));
    let why = stderr.wait_for("--exit-after-idle", 1);
    assert_eq!(why.len(), 1, "{:?}", stderr.lines());
    assert!(why[0].contains("no session for 1 s"), "{why:?}");
}

/// A session keeps the worker; once it ends (closed, or timed out because its
/// controller went silent), the idle time counts from there.
#[test]
fn a_worker_with_exit_after_idle_stays_while_a_session_lives() {
    let token = Token::generate().unwrap();
    let (mut worker, stderr) = spawn_logged(Some(&token), &["--exit-after-idle", "1"], None);
    let session = connect(&worker, Some(&token)).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        worker.child.try_wait().unwrap().is_none(),
        "exited with a live session: {:?}",
        stderr.lines()
    );
    session.heartbeat().unwrap();
    session.disconnect().unwrap();
    let (status, after) = exits_within(&mut worker, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(after >= Duration::from_millis(850), "{after:?}");
    assert_eq!(stderr.wait_for("--exit-after-idle", 1).len(), 1);

    // A controller that goes silent: its session times out (0.5 s), then the
    // idle time runs.
    let flags = [
        "--exit-after-idle",
        "1",
        "--heartbeat-interval",
        "0.1",
        "--session-timeout",
        "0.5",
    ];
    let (mut worker, _stderr) = spawn_logged(Some(&token), &flags, None);
    raw(&worker, async |mut rpc| {
        rpc.open_session(with_metadata(
            open_request(1, 2),
            Some(token.expose()),
            None,
        ))
        .await
    })
    .unwrap();
    let (status, after) = exits_within(&mut worker, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(after >= Duration::from_millis(1300), "{after:?}");
}

#[test]
fn a_bad_exit_after_idle_is_a_usage_error() {
    for value in ["0", "-1", "nan", "inf", "1e300", "soon"] {
        let output = worker_command(None)
            .arg("--insecure")
            .arg(format!("--exit-after-idle={value}"))
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{value}: {output:?}");
        assert!(output.stdout.is_empty(), "{value}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("exit-after-idle"), "{value}: {stderr}");
    }
}
