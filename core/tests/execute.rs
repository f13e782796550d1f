//! Compiling and executing native programs: per-host execution over sharded
//! inputs, host callbacks, error propagation, dependency tracking, argument
//! validation, serialization, execute_sharded / execute_portable and streams.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use colocated_core::*;
use common::*;

fn on(stream: &Stream) -> ExecuteOptions {
    ExecuteOptions {
        stream: Some(stream.clone()),
    }
}

/// The int32 values of `array`, once it is ready (panics if it failed).
fn ints(array: &Array) -> Vec<i32> {
    i32_values(&array.to_host_bytes().unwrap())
}

/// `add_one_i32` (registered already) compiled from and to int32 `dims` on
/// `device` alone.
fn add_one_on(client: &Client, dims: &[i64], device: &Device) -> LoadedExecutable {
    let spec = spec_on(dims, DType::I32, device);
    compile_native(
        client,
        "add_one_i32",
        vec![spec.clone()],
        vec![spec],
        std::slice::from_ref(device),
    )
}

/// Registers `add_one_i32` and `late_source` (which waits for `gate`) on
/// `client`, and compiles both over [`x_spec`]: the source (no inputs), the
/// consumer and the spec.
fn late_source_and_add_one(
    client: &Client,
    gate: &Event,
) -> (LoadedExecutable, LoadedExecutable, ArraySpec) {
    let (add_one, spec) = add_one_over_x(client);
    register_gated_source(client, "late_source", gate);
    let source = compile_native(
        client,
        "late_source",
        vec![],
        vec![spec.clone()],
        &client.devices()[..4],
    );
    (source, add_one, spec)
}

/// A stream held at a gate: a nullary program, registered under `name`, that
/// waits for `gate` and was queued first on `stream`, so that everything
/// queued behind it there waits until the gate is set.
struct HeldStream {
    /// Opens the gate when set.
    gate: Event,
    /// The stream the gate holds.
    stream: Stream,
    /// The gate's executable.
    blocker: LoadedExecutable,
    /// The gate's execution.
    blocked: Execution,
}

/// Registers the gate `name` on `client`, compiles it on `device` and queues
/// it on a new stream (see [`HeldStream`]).
fn held_stream(client: &Client, name: &str, device: &Device) -> HeldStream {
    let gate = Event::new();
    register_gate(client, name, &gate);
    let stream = client.create_stream();
    let blocker = compile_nullary(client, name, device);
    let blocked = blocker.execute(&[], &on(&stream)).unwrap();
    HeldStream {
        gate,
        stream,
        blocker,
        blocked,
    }
}

impl HeldStream {
    /// Opens the gate and waits for the gate's own execution.
    fn release(&self) {
        self.gate.set(Ok(())).unwrap();
        self.blocked.status.wait_timeout(PATIENCE).unwrap();
    }
}

/// Asserts that `exe` refuses to execute on `args` (at the call) with `code`
/// and a message containing `fragment`.
#[track_caller]
fn assert_refused(exe: &LoadedExecutable, args: &[Array], code: ErrorCode, fragment: &str) {
    assert_error(
        exe.execute(args, &ExecuteOptions::default()).map(|_| ()),
        code,
        fragment,
    );
}

/// Compiles `function` from and to `spec` on `device` with `callback` as its
/// one host callback.
fn compile_with_callback(
    client: &Client,
    function: &str,
    spec: &ArraySpec,
    device: &Device,
    callback: LoadedHostCallback,
) -> LoadedExecutable {
    client
        .compile(
            Program::native(
                function,
                vec![spec.clone()],
                vec![spec.clone()],
                vec![device.clone()],
            ),
            CompileOptions {
                host_callbacks: vec![callback],
            },
        )
        .unwrap()
}

/// One device's part of an executable, run on its own:
/// [`LoadedExecutable::execute_sharded`] or
/// [`LoadedExecutable::execute_portable`].
type RunPart = fn(
    &LoadedExecutable,
    &[Buffer],
    &Device,
    &ExecuteOptions,
) -> colocated_core::Result<(Vec<Buffer>, Event)>;

/// Runs `run` on `args` on `device` and waits until it finished: the outputs.
fn run_part(run: RunPart, exe: &LoadedExecutable, args: &[Buffer], device: &Device) -> Vec<Buffer> {
    let (outputs, status) = run(exe, args, device, &ExecuteOptions::default()).unwrap();
    status.wait_timeout(PATIENCE).unwrap();
    outputs
}

/// Asserts that `run` refuses `args` on `device` (at the call) with `code`
/// and a message containing `fragment`.
#[track_caller]
fn assert_part_refused(
    run: RunPart,
    exe: &LoadedExecutable,
    args: &[Buffer],
    device: &Device,
    code: ErrorCode,
    fragment: &str,
) {
    assert_error(
        run(exe, args, device, &ExecuteOptions::default()).map(|_| ()),
        code,
        fragment,
    );
}

/// Registers `name` on `client`: a native function that does nothing.
fn register_noop(client: &Client, name: &str) {
    client
        .register_native_function(name, |_ctx| Ok(()))
        .unwrap();
}

/// Registers `name`: waits for `gate`, then sets every output shard (int32) to
/// `100 * device id + k` for its k-th element.
fn register_gated_source(client: &Client, name: &str, gate: &Event) {
    let gate = gate.clone();
    client
        .register_native_function(name, move |ctx| {
            gate.wait()?;
            set_i32_outputs(ctx, |_ctx, _i, shard| {
                let n: i64 = shard.dims.iter().product();
                Ok((0..n as i32)
                    .map(|k| 100 * shard.device.id() as i32 + k)
                    .collect())
            })
        })
        .unwrap();
}

#[test]
fn add_one_runs_on_int32_shards_over_four_devices_sharded_along_x() {
    let client = client(4);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    client
        .register_native_function("add_one_traced", move |ctx| {
            let shards = ctx.output_shards().to_vec();
            record.lock().unwrap().push((
                ctx.input_shard_counts().to_vec(),
                ctx.inputs()
                    .iter()
                    .map(|b| b.device().id())
                    .collect::<Vec<_>>(),
                shards
                    .iter()
                    .map(|s| (s.output, s.device.id()))
                    .collect::<Vec<_>>(),
            ));
            for shard in &shards {
                assert_eq!(shard.dims, vec![2]);
                assert_eq!(shard.dtype, DType::I32);
            }
            common::add_one_shards(ctx)
        })
        .unwrap();
    let (exe, spec) = compile_over_x(&client, "add_one_traced");
    assert_eq!(exe.name(), "add_one_traced");
    assert_eq!(exe.devices(), &client.devices()[..4]);
    assert_eq!(exe.fingerprint().len(), 16);
    let x = i32_array(&client, &[0, 10, 20, 30, 40, 50, 60, 70], &spec);
    let run = exe.execute(&[x], &ExecuteOptions::default()).unwrap();
    assert_eq!(run.outputs.len(), 1);
    let out = &run.outputs[0];
    assert!(out.spec().matches(&spec));
    for (buffer, device) in out.buffers().iter().zip(client.devices()) {
        assert_eq!(buffer.device(), device);
        assert_eq!(buffer.dims(), &[2]);
    }
    assert_eq!(ints(out), vec![1, 11, 21, 31, 41, 51, 61, 71]);
    run.status.wait_timeout(PATIENCE).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "one host runs the program once");
    assert_eq!(seen[0].0, vec![4]);
    assert_eq!(seen[0].1, vec![0, 1, 2, 3]);
    assert_eq!(seen[0].2, vec![(0, 0), (0, 1), (0, 2), (0, 3)]);
}

#[test]
fn a_host_sees_its_input_shard_counts_argument_major() {
    let client = client(4);
    let seen = Arc::new(Mutex::new(None));
    let record = seen.clone();
    client
        .register_native_function("count_inputs", move |ctx| {
            *record.lock().unwrap() = Some((
                ctx.input_shard_counts().to_vec(),
                ctx.inputs()
                    .iter()
                    .map(|b| (b.dims().to_vec(), b.device().id()))
                    .collect::<Vec<_>>(),
                ctx.output_shards().len(),
            ));
            for i in 0..ctx.output_shards().len() {
                set_output_bytes(ctx, i, &[7])?;
            }
            Ok(())
        })
        .unwrap();
    let devices = &client.devices()[..4];
    let split = x_spec(&client);
    let replicated = Sharding::replicated(devices.to_vec()).unwrap();
    let vector = ArraySpec::new(vec![3], DType::I32, replicated.clone()).unwrap();
    let scalar = ArraySpec::new(vec![], DType::U8, replicated).unwrap();
    let exe = compile_native(
        &client,
        "count_inputs",
        vec![split.clone(), vector.clone(), scalar.clone()],
        vec![scalar.clone()],
        devices,
    );
    let args = [
        i32_array(&client, &[0; 8], &split),
        i32_array(&client, &[1, 2, 3], &vector),
        Array::from_host_bytes(&client, &[9], scalar).unwrap(),
    ];
    let run = exe.execute(&args, &ExecuteOptions::default()).unwrap();
    assert_eq!(run.outputs[0].to_host_bytes().unwrap(), vec![7]);
    let (counts, inputs, outputs) = seen.lock().unwrap().take().unwrap();
    assert_eq!(counts, vec![4, 4, 4]);
    let expected: Vec<(Vec<i64>, u32)> = (0..4)
        .map(|d| (vec![2], d))
        .chain((0..4).map(|d| (vec![3], d)))
        .chain((0..4).map(|d| (vec![], d)))
        .collect();
    assert_eq!(inputs, expected);
    assert_eq!(outputs, 4, "one replicated output shard per device");
}

#[test]
fn outputs_feed_the_next_execution_before_they_are_ready() {
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let mut x = i32_array(&client, &[0, 1, 2, 3, 4, 5, 6, 7], &spec);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let run = exe.execute(&[x], &ExecuteOptions::default()).unwrap();
        statuses.push(run.status);
        x = run.outputs[0].clone();
    }
    assert_eq!(ints(&x), (5..13).collect::<Vec<_>>());
    for status in statuses {
        status.wait_timeout(PATIENCE).unwrap();
    }
}

#[test]
fn host_callback_captured_state_is_dropped_once_after_the_executable_and_its_executions() {
    let client = client(2);
    let device = client.devices()[0].clone();
    let dropped = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let guard = DropCounter(dropped.clone());
    let counted = calls.clone();
    let callback = LoadedHostCallback::new("double", move |input: &[u8]| {
        let _keep = &guard;
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(input.iter().map(|b| b * 2).collect())
    });
    assert_eq!(callback.name(), "double");
    assert_eq!(callback.call(&[1, 2]).unwrap(), vec![2, 4]);
    client
        .register_native_function("via_callback", |ctx| {
            assert_eq!(ctx.num_host_callbacks(), 1);
            let input = ctx.inputs()[0].to_host_vec()?;
            let answer = ctx.call_host_callback(0, &input)?;
            set_output_bytes(ctx, 0, &answer)
        })
        .unwrap();
    let spec = spec_on(&[3], DType::U8, &device);
    let exe = compile_with_callback(&client, "via_callback", &spec, &device, callback.clone());
    assert_eq!(exe.host_callbacks().len(), 1);
    drop(callback);
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "the executable holds it");

    let x = Array::from_host_bytes(&client, &[1, 2, 3], spec.clone()).unwrap();
    let first = exe
        .execute(std::slice::from_ref(&x), &ExecuteOptions::default())
        .unwrap();
    assert_eq!(first.outputs[0].to_host_bytes().unwrap(), vec![2, 4, 6]);

    // Queue an execution behind a blocked one, then drop every handle to the
    // executable: the execution in flight still holds the callback.
    let held = held_stream(&client, "gate", &device);
    let in_flight = exe.execute(&[x], &on(&held.stream)).unwrap();
    drop(exe);
    drop(held.blocker);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        0,
        "an execution in flight holds the callback"
    );
    held.gate.set(Ok(())).unwrap();
    held.blocked.status.wait_timeout(PATIENCE).unwrap();
    assert_eq!(in_flight.outputs[0].to_host_bytes().unwrap(), vec![2, 4, 6]);
    in_flight.status.wait_timeout(PATIENCE).unwrap();
    eventually("the callback is dropped", || {
        dropped.load(Ordering::SeqCst) == 1
    });
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "dropped exactly once");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn host_callback_errors_and_bad_indices_fail_the_execution() {
    let client = client(1);
    let device = client.devices()[0].clone();
    client
        .register_native_function("call_cb", |ctx| {
            let which = ctx.inputs()[0].to_host_vec()?[0] as usize;
            ctx.call_host_callback(which, b"ping")?;
            set_output_bytes(ctx, 0, &[0])
        })
        .unwrap();
    let failing = LoadedHostCallback::new("refuse", |_input: &[u8]| {
        Err(Error::permission_denied("the controller refused"))
    });
    let spec = spec_on(&[1], DType::U8, &device);
    let exe = compile_with_callback(&client, "call_cb", &spec, &device, failing);
    let run = |index: u8| {
        let x = Array::from_host_bytes(&client, &[index], spec.clone()).unwrap();
        exe.execute(&[x], &ExecuteOptions::default()).unwrap()
    };
    let refused = run(0);
    assert_error(
        refused.status.wait_timeout(PATIENCE),
        ErrorCode::PermissionDenied,
        "the controller refused",
    );
    assert_error(
        refused.outputs[0].to_host_bytes(),
        ErrorCode::PermissionDenied,
        "the controller refused",
    );
    assert_error(
        run(1).status.wait_timeout(PATIENCE),
        ErrorCode::InvalidArgument,
        "host callback 1 is out of range (the executable has 1)",
    );
}

#[test]
fn a_failing_native_function_fails_the_status_outputs_and_every_consumer() {
    let client = client(4);
    client
        .register_native_function("fail", |_ctx| {
            Err(Error::resource_exhausted("out of widgets"))
        })
        .unwrap();
    let (add_one, spec) = add_one_over_x(&client);
    let (fail, _) = compile_over_x(&client, "fail");
    let held = held_stream(&client, "gate", &client.devices()[0]);
    let x = i32_array(&client, &[0; 8], &spec);
    let failed = fail.execute(&[x], &on(&held.stream)).unwrap();
    // Consumers submitted before and after the failure is known.
    let early = add_one
        .execute(&failed.outputs, &ExecuteOptions::default())
        .unwrap();
    held.release();
    let error = assert_error(
        failed.status.wait_timeout(PATIENCE),
        ErrorCode::ResourceExhausted,
        "out of widgets",
    );
    assert!(
        error.message().contains("fail"),
        "names the program: {error}"
    );
    for buffer in failed.outputs[0].buffers() {
        let e = buffer.ready_event().wait_timeout(PATIENCE).unwrap_err();
        assert_eq!(e, error, "every output carries the execution's error");
    }
    assert_error(
        failed.outputs[0].to_host_bytes(),
        ErrorCode::ResourceExhausted,
        "out of widgets",
    );
    let copy = failed.outputs[0].buffers()[1]
        .copy_to_device(&client.devices()[0])
        .unwrap();
    assert_eq!(
        copy.ready_event().wait_timeout(PATIENCE).unwrap_err(),
        error
    );
    let late = add_one
        .execute(&failed.outputs, &ExecuteOptions::default())
        .unwrap();
    let chained = add_one
        .execute(&late.outputs, &ExecuteOptions::default())
        .unwrap();
    for consumer in [&early, &late, &chained] {
        let e = assert_error(
            consumer.status.wait_timeout(PATIENCE),
            ErrorCode::ResourceExhausted,
            error.message(),
        );
        let out = consumer.outputs[0].ready_event().wait_timeout(PATIENCE);
        assert_eq!(out.unwrap_err().code(), e.code());
    }
    assert_eq!(
        early.status.wait().unwrap_err(),
        error,
        "a consumer queued before the failure gets the producer's error as is"
    );
}

#[test]
fn a_native_function_that_misbehaves_fails_its_execution() {
    let client = client(1);
    let device = client.devices()[0].clone();
    let spec = spec_on(&[2], DType::I32, &device);
    client
        .register_native_function("panics", |_ctx| panic!("deliberate panic in a test"))
        .unwrap();
    register_noop(&client, "sets_nothing");
    client
        .register_native_function("wrong_shape", |ctx| {
            let s = ctx.output_shards()[0].clone();
            let out = Buffer::from_bytes(ctx.client(), &[0; 12], DType::I32, &[3], &s.device)?;
            ctx.set_output(0, out)
        })
        .unwrap();
    client
        .register_native_function("sets_twice", |ctx| {
            let s = ctx.output_shards()[0].clone();
            let out = Buffer::from_bytes(ctx.client(), &[0; 8], s.dtype, &s.dims, &s.device)?;
            ctx.set_output(0, out.clone())?;
            ctx.set_output(0, out)
        })
        .unwrap();
    client
        .register_native_function("sets_out_of_range", |ctx| {
            let s = ctx.output_shards()[0].clone();
            let out = Buffer::from_bytes(ctx.client(), &[0; 8], s.dtype, &s.dims, &s.device)?;
            ctx.set_output(1, out)
        })
        .unwrap();
    let cases = [
        ("panics", ErrorCode::Internal, "panicked"),
        (
            "sets_nothing",
            ErrorCode::Internal,
            "did not set output shard 0",
        ),
        (
            "wrong_shape",
            ErrorCode::InvalidArgument,
            "output shard 0 must be int32[2] on CpuDevice(id=0), got int32[3]",
        ),
        (
            "sets_twice",
            ErrorCode::InvalidArgument,
            "output shard 0 was already set",
        ),
        (
            "sets_out_of_range",
            ErrorCode::InvalidArgument,
            "output shard 1 is out of range (1 shards)",
        ),
    ];
    for (name, code, fragment) in cases {
        let exe = compile_native(
            &client,
            name,
            vec![],
            vec![spec.clone()],
            std::slice::from_ref(&device),
        );
        let run = exe.execute(&[], &ExecuteOptions::default()).unwrap();
        assert_error(run.status.wait_timeout(PATIENCE), code, fragment);
        assert_error(run.outputs[0].to_host_bytes(), code, fragment);
    }
}

#[test]
fn an_execution_waits_for_an_input_gated_by_a_user_event_on_another_stream() {
    let client = client(4);
    let gate = Event::new();
    let (source, add_one, spec) = late_source_and_add_one(&client, &gate);
    let (producer_stream, consumer_stream, other_stream) = (
        client.create_stream(),
        client.create_stream(),
        client.create_stream(),
    );
    assert_ne!(producer_stream.id(), consumer_stream.id());
    let produced = source.execute(&[], &on(&producer_stream)).unwrap();
    let consumed = add_one
        .execute(&produced.outputs, &on(&consumer_stream))
        .unwrap();
    let ready_input = i32_array(&client, &[0; 8], &spec);
    let behind = add_one
        .execute(std::slice::from_ref(&ready_input), &on(&consumer_stream))
        .unwrap();
    let elsewhere = add_one.execute(&[ready_input], &on(&other_stream)).unwrap();
    elsewhere.status.wait_timeout(PATIENCE).unwrap();
    assert_eq!(ints(&elsewhere.outputs[0]), vec![1; 8]);
    std::thread::sleep(Duration::from_millis(30));
    assert!(!produced.status.is_ready());
    assert!(
        !consumed.status.is_ready(),
        "the consumer waits for its input"
    );
    assert!(
        !consumed.outputs[0].ready_event().is_ready(),
        "the consumer's outputs are pending"
    );
    assert!(
        !behind.status.is_ready(),
        "later executions of the consumer's stream keep program order"
    );
    gate.set(Ok(())).unwrap();
    consumed.status.wait_timeout(PATIENCE).unwrap();
    let expected: Vec<i32> = (0..4).flat_map(|d| [100 * d + 1, 100 * d + 2]).collect();
    assert_eq!(ints(&consumed.outputs[0]), expected);
    behind.status.wait_timeout(PATIENCE).unwrap();
}

#[test]
fn a_producer_failing_behind_a_user_event_fails_its_pending_consumer_with_its_error() {
    let client = client(4);
    let gate = Event::new();
    let (source, add_one, _) = late_source_and_add_one(&client, &gate);
    let produced = source.execute(&[], &on(&client.create_stream())).unwrap();
    let consumed = add_one
        .execute(&produced.outputs, &on(&client.create_stream()))
        .unwrap();
    gate.set(Err(Error::cancelled("upstream gave up"))).unwrap();
    let error = assert_error(
        produced.status.wait_timeout(PATIENCE),
        ErrorCode::Cancelled,
        "upstream gave up",
    );
    assert_eq!(consumed.status.wait_timeout(PATIENCE).unwrap_err(), error);
    assert_error(
        consumed.outputs[0].to_host_bytes(),
        ErrorCode::Cancelled,
        "upstream gave up",
    );
}

#[test]
fn execute_rejects_the_wrong_number_of_arguments() {
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let x = i32_array(&client, &[0; 8], &spec);
    assert_refused(
        &exe,
        &[],
        ErrorCode::InvalidArgument,
        "add_one_i32 takes 1 arguments, 0 were given",
    );
    assert_refused(
        &exe,
        &[x.clone(), x],
        ErrorCode::InvalidArgument,
        "takes 1 arguments, 2 were given",
    );
}

#[test]
fn execute_rejects_an_argument_whose_spec_differs_and_accepts_an_equivalent_one() {
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let devices = client.devices()[..4].to_vec();
    let longer = ArraySpec::new(vec![12], DType::I32, spec.sharding.clone()).unwrap();
    let floats = ArraySpec::new(vec![8], DType::F32, spec.sharding.clone()).unwrap();
    let replicated = ArraySpec::new(
        vec![8],
        DType::I32,
        Sharding::replicated(devices.clone()).unwrap(),
    )
    .unwrap();
    let reversed: Vec<Device> = devices.iter().rev().cloned().collect();
    let reordered = ArraySpec::new(
        vec![8],
        DType::I32,
        Sharding::named(reversed, vec![4], names(&["x"]), vec![vec![0]]).unwrap(),
    )
    .unwrap();
    for (bad, fragment) in [
        (longer, "argument 0 is int32[12]"),
        (floats, "argument 0 is float32[8]"),
        (replicated, "but the program expects int32[8]"),
        (reordered, "but the program expects int32[8]"),
    ] {
        let n: i64 = bad.shape.iter().product();
        let arg = Array::from_host_bytes(&client, &vec![0; n as usize * 4], bad).unwrap();
        assert_refused(&exe, &[arg], ErrorCode::InvalidArgument, fragment);
    }
    // The same layout described through another mesh is accepted.
    let nested = ArraySpec::new(
        vec![8],
        DType::I32,
        Sharding::named(devices, vec![2, 2], names(&["a", "b"]), vec![vec![0, 1]]).unwrap(),
    )
    .unwrap();
    let arg = i32_array(&client, &[3; 8], &nested);
    let run = exe.execute(&[arg], &ExecuteOptions::default()).unwrap();
    assert_eq!(ints(&run.outputs[0]), vec![4; 8]);
}

#[test]
fn execute_rejects_a_deleted_argument_with_failed_precondition() {
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let x = i32_array(&client, &[0; 8], &spec);
    x.buffers()[2].delete();
    assert_refused(&exe, &[x], ErrorCode::FailedPrecondition, "argument 0");
    let y = i32_array(&client, &[0; 8], &spec);
    y.delete();
    assert_refused(&exe, &[y], ErrorCode::FailedPrecondition, "was deleted");
}

#[test]
fn deleting_an_argument_after_execute_waits_for_the_execution_that_uses_it() {
    // PJRT: delete frees the data once the executions already using it are done.
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let held = held_stream(&client, "gate", &client.devices()[0]);
    let x = i32_array(&client, &[1, 2, 3, 4, 5, 6, 7, 8], &spec);
    let run = exe
        .execute(std::slice::from_ref(&x), &on(&held.stream))
        .unwrap();
    x.delete();
    assert!(x.is_deleted());
    held.release();
    run.status.wait_timeout(PATIENCE).unwrap();
    assert_eq!(ints(&run.outputs[0]), (2..10).collect::<Vec<_>>());
}

#[test]
fn compile_fails_with_not_found_for_an_unknown_native_function() {
    let client = client(1);
    register_add_one(&client);
    let device = client.devices()[0].clone();
    let err = assert_error(
        client.compile(
            Program::native("nope", vec![], vec![], vec![device]),
            CompileOptions::default(),
        ),
        ErrorCode::NotFound,
        "no native function 'nope' on this host",
    );
    assert!(err.message().contains("add_one_i32"), "lists known: {err}");
}

#[test]
fn compile_fails_with_unimplemented_for_a_language_the_host_lacks() {
    let client = client(1);
    let device = client.devices()[0].clone();
    // The colocated protocol's own language is built into every host.
    assert_eq!(
        client.languages(0).unwrap(),
        vec![LANGUAGE_COLOCATED.to_string(), LANGUAGE_NATIVE.to_string()]
    );
    for language in [LANGUAGE_PYTHON, LANGUAGE_NODE] {
        let program = Program {
            name: "f".to_string(),
            language: language.to_string(),
            payload: b"payload".to_vec(),
            input_specs: vec![],
            output_specs: vec![],
            devices: vec![device.clone()],
            output_structure: vec![],
        };
        assert_error(
            client.compile(program, CompileOptions::default()),
            ErrorCode::Unimplemented,
            &format!("cannot run '{language}' programs"),
        );
    }
}

#[test]
fn compile_rejects_malformed_programs_with_invalid_argument() {
    let client = client(4);
    let other = common::client(1);
    register_add_one(&client);
    let spec = x_spec(&client);
    let ia = ErrorCode::InvalidArgument;
    assert_error(
        client.compile(
            Program::native("add_one_i32", vec![], vec![], vec![]),
            CompileOptions::default(),
        ),
        ia,
        "at least one device",
    );
    assert_error(
        client.compile(
            Program::native(
                "add_one_i32",
                vec![],
                vec![],
                vec![other.devices()[0].clone()],
            ),
            CompileOptions::default(),
        ),
        ia,
        "belongs to another client",
    );
    let d0 = client.devices()[0].clone();
    assert_error(
        client.compile(
            Program::native("add_one_i32", vec![], vec![], vec![d0.clone(), d0.clone()]),
            CompileOptions::default(),
        ),
        ia,
        "appears twice in the program's devices",
    );
    assert_error(
        client.compile(
            Program::native("add_one_i32", vec![spec.clone()], vec![spec], vec![d0]),
            CompileOptions::default(),
        ),
        ia,
        "inputs and outputs must use the program's device set",
    );
}

#[test]
fn registering_a_native_function_twice_is_already_exists() {
    let client = client(1);
    client
        .register_native_function("twice", |_ctx| Ok(()))
        .unwrap();
    assert_error(
        client.register_native_function("twice", |_ctx| Ok(())),
        ErrorCode::AlreadyExists,
        "native function 'twice' is already registered",
    );
    assert_error(
        client.register_native_function("", |_ctx| Ok(())),
        ErrorCode::InvalidArgument,
        "needs a name",
    );
    // Registries are per client.
    common::client(1)
        .register_native_function("twice", |_ctx| Ok(()))
        .unwrap();
}

#[test]
fn a_serialized_executable_loads_and_runs() {
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let bytes = exe.serialize();
    assert_eq!(&bytes[..8], MAGIC);
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        FORMAT_VERSION
    );
    check_compatible(&bytes).unwrap();
    let loaded = client
        .deserialize_and_load(&bytes, CompileOptions::default())
        .unwrap();
    assert_eq!(loaded.name(), exe.name());
    assert_eq!(loaded.fingerprint(), exe.fingerprint());
    assert_eq!(loaded.devices(), exe.devices());
    assert_eq!(loaded.serialize(), bytes);
    let x = i32_array(&client, &[5; 8], &spec);
    let run = loaded.execute(&[x], &ExecuteOptions::default()).unwrap();
    assert_eq!(ints(&run.outputs[0]), vec![6; 8]);

    // Another client with the same devices and function loads it too.
    let twin = common::client(4);
    register_add_one(&twin);
    let loaded = twin
        .deserialize_and_load(&bytes, CompileOptions::default())
        .unwrap();
    let spec = x_spec(&twin);
    let x = i32_array(&twin, &[-1; 8], &spec);
    let run = loaded.execute(&[x], &ExecuteOptions::default()).unwrap();
    assert_eq!(ints(&run.outputs[0]), vec![0; 8]);
}

#[test]
fn a_serialized_executable_keeps_its_host_callback_count() {
    let client = client(1);
    register_noop(&client, "noop");
    let device = client.devices()[0].clone();
    let callback = LoadedHostCallback::new("echo", |x: &[u8]| Ok(x.to_vec()));
    let exe = client
        .compile(
            Program::native("noop", vec![], vec![], vec![device]),
            CompileOptions {
                host_callbacks: vec![callback.clone()],
            },
        )
        .unwrap();
    let bytes = exe.serialize();
    assert_error(
        client.deserialize_and_load(&bytes, CompileOptions::default()),
        ErrorCode::InvalidArgument,
        "compiled with 1 host callbacks but 0 were given",
    );
    let loaded = client
        .deserialize_and_load(
            &bytes,
            CompileOptions {
                host_callbacks: vec![callback],
            },
        )
        .unwrap();
    assert_eq!(loaded.host_callbacks()[0].name(), "echo");
}

#[test]
fn truncated_or_corrupted_executables_are_invalid_argument() {
    let client = client(4);
    let bytes = add_one_over_x(&client).0.serialize();
    let mut corrupted = bytes.clone();
    let last = corrupted.len() - 3;
    corrupted[last] ^= 0x5a;
    let mut magic = bytes.clone();
    magic[0] = b'X';
    let mut version = bytes.clone();
    version[8] = 9;
    let mut extra = bytes.clone();
    extra.push(0);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "truncated"),
        (bytes[..10].to_vec(), "truncated"),
        (bytes[..bytes.len() - 1].to_vec(), "truncated"),
        (extra, "followed by extra bytes"),
        (corrupted, "checksum mismatch"),
        (magic, "bad magic"),
        (version, "format version 9"),
    ];
    for (bad, fragment) in cases {
        assert_error(check_compatible(&bad), ErrorCode::InvalidArgument, fragment);
        assert_error(
            client.deserialize_and_load(&bad, CompileOptions::default()),
            ErrorCode::InvalidArgument,
            fragment,
        );
    }
}

#[test]
fn loading_an_executable_on_a_client_that_lacks_its_devices_or_function_fails() {
    let client = client(4);
    let bytes = add_one_over_x(&client).0.serialize();
    let small = common::client(2);
    register_add_one(&small);
    assert_error(
        small.deserialize_and_load(&bytes, CompileOptions::default()),
        ErrorCode::InvalidArgument,
        "no device with id 2",
    );
    let bare = common::client(4);
    assert_error(
        bare.deserialize_and_load(&bytes, CompileOptions::default()),
        ErrorCode::NotFound,
        "no native function 'add_one_i32'",
    );
}

#[test]
fn execute_sharded_runs_the_part_of_one_device() {
    let client = client(4);
    let (exe, _) = add_one_over_x(&client);
    let device = client.devices()[2].clone();
    let shard =
        Buffer::from_bytes(&client, &i32_bytes(&[40, 50]), DType::I32, &[2], &device).unwrap();
    let outputs = run_part(
        LoadedExecutable::execute_sharded,
        &exe,
        std::slice::from_ref(&shard),
        &device,
    );
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].device(), &device);
    assert_eq!(outputs[0].dims(), &[2]);
    assert_eq!(i32_values(&outputs[0].to_host_vec().unwrap()), vec![41, 51]);

    let ia = ErrorCode::InvalidArgument;
    let wrong_dims = Buffer::from_bytes(&client, &[0; 32], DType::I32, &[8], &device).unwrap();
    assert_part_refused(
        LoadedExecutable::execute_sharded,
        &exe,
        &[wrong_dims],
        &device,
        ia,
        "argument 0 must be int32[2] on CpuDevice(id=2), got int32[8]",
    );
    assert_part_refused(
        LoadedExecutable::execute_sharded,
        &exe,
        std::slice::from_ref(&shard),
        &client.devices()[1],
        ia,
        "argument 0 must be int32[2] on CpuDevice(id=1)",
    );
    assert_part_refused(
        LoadedExecutable::execute_sharded,
        &exe,
        &[],
        &device,
        ia,
        "takes 1 arguments, 0 were given",
    );
    let narrow = compile_native(
        &client,
        "add_one_i32",
        vec![],
        vec![],
        &client.devices()[..2],
    );
    assert_part_refused(
        LoadedExecutable::execute_sharded,
        &narrow,
        &[],
        &device,
        ia,
        "does not run on CpuDevice(id=2)",
    );
    shard.delete();
    assert_part_refused(
        LoadedExecutable::execute_sharded,
        &exe,
        &[shard],
        &device,
        ErrorCode::FailedPrecondition,
        "was deleted",
    );
}

#[test]
fn execute_portable_runs_a_single_device_executable_on_another_device() {
    let client = client(4);
    let (wide, _) = add_one_over_x(&client);
    let d0 = client.devices()[0].clone();
    let exe = add_one_on(&client, &[3], &d0);
    let d3 = client.devices()[3].clone();
    let x = Buffer::from_bytes(&client, &i32_bytes(&[7, 8, 9]), DType::I32, &[3], &d3).unwrap();
    let outputs = run_part(
        LoadedExecutable::execute_portable,
        &exe,
        std::slice::from_ref(&x),
        &d3,
    );
    assert_eq!(outputs[0].device(), &d3);
    assert_eq!(
        i32_values(&outputs[0].to_host_vec().unwrap()),
        vec![8, 9, 10]
    );

    let ia = ErrorCode::InvalidArgument;
    assert_part_refused(
        LoadedExecutable::execute_portable,
        &exe,
        std::slice::from_ref(&x),
        &d0,
        ia,
        "argument 0 must be int32[3] on CpuDevice(id=0), got int32[3] on CpuDevice(id=3)",
    );
    let other = common::client(1);
    assert_part_refused(
        LoadedExecutable::execute_portable,
        &exe,
        &[x],
        &other.devices()[0],
        ia,
        "belongs to another client",
    );
    let y = Buffer::from_bytes(&client, &[0; 32], DType::I32, &[8], &d3).unwrap();
    assert_part_refused(
        LoadedExecutable::execute_portable,
        &wide,
        &[y],
        &d3,
        ia,
        "execute_portable needs a single-device executable",
    );
}

/// Registers `record` (one u64 scalar input on `device`, no outputs): appends the
/// input to `log`. Returns the executable and the input spec.
fn recorder(client: &Client, log: &Arc<Mutex<Vec<u64>>>) -> (LoadedExecutable, ArraySpec) {
    let sink = log.clone();
    client
        .register_native_function("record", move |ctx| {
            let v = ctx.inputs()[0].to_host_vec()?;
            sink.lock()
                .unwrap()
                .push(u64::from_le_bytes(v[..8].try_into().unwrap()));
            Ok(())
        })
        .unwrap();
    let device = client.devices()[0].clone();
    let spec = spec_on(&[], DType::U64, &device);
    (
        compile_native(client, "record", vec![spec.clone()], vec![], &[device]),
        spec,
    )
}

#[test]
fn program_order_holds_on_an_explicit_stream() {
    let client = client(2);
    let log = Arc::new(Mutex::new(Vec::new()));
    let (exe, spec) = recorder(&client, &log);
    let stream = client.create_stream();
    assert_ne!(stream.id(), client.create_stream().id());
    let mut last = None;
    for i in 0..500u64 {
        let x = Array::from_host_bytes(&client, &i.to_le_bytes(), spec.clone()).unwrap();
        last = Some(exe.execute(&[x], &on(&stream)).unwrap().status);
    }
    last.unwrap().wait_timeout(PATIENCE).unwrap();
    assert_eq!(*log.lock().unwrap(), (0..500).collect::<Vec<_>>());
}

#[test]
fn program_order_holds_on_the_default_stream_of_each_thread() {
    let client = client(4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let (exe, spec) = recorder(&client, &log);
    assert_eq!(client.current_stream().id(), client.current_stream().id());
    let here = client.current_stream().id();
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (client, exe, spec) = (client.clone(), exe.clone(), spec.clone());
            std::thread::spawn(move || {
                let stream = client.current_stream().id();
                let mut last = None;
                for i in 0..300u64 {
                    let v = (t << 32) | i;
                    let x =
                        Array::from_host_bytes(&client, &v.to_le_bytes(), spec.clone()).unwrap();
                    last = Some(
                        exe.execute(&[x], &ExecuteOptions::default())
                            .unwrap()
                            .status,
                    );
                }
                last.unwrap().wait_timeout(PATIENCE).unwrap();
                stream
            })
        })
        .collect();
    let streams: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(!streams.contains(&here));
    assert!(streams[0] != streams[1] && streams[1] != streams[2] && streams[0] != streams[2]);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 900);
    for t in 0..3u64 {
        let mine: Vec<u64> = log
            .iter()
            .filter(|v| *v >> 32 == t)
            .map(|v| v & 0xffff_ffff)
            .collect();
        assert_eq!(mine, (0..300).collect::<Vec<_>>(), "thread {t}");
    }
}

#[test]
fn events_of_an_execution_can_be_awaited_and_observed_with_on_ready() {
    let client = client(2);
    register_add_one(&client);
    let d = client.devices()[1].clone();
    let exe = add_one_on(&client, &[2], &d);
    let spec = spec_on(&[2], DType::I32, &d);
    let run = exe
        .execute(
            &[i32_array(&client, &[1, 2], &spec)],
            &ExecuteOptions::default(),
        )
        .unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let counter = fired.clone();
    run.status.on_ready(move |status| {
        status.unwrap();
        counter.fetch_add(1, Ordering::SeqCst);
    });
    run.outputs[0].ready_event().wait_timeout(PATIENCE).unwrap();
    run.status.wait_timeout(PATIENCE).unwrap();
    eventually("on_ready ran", || fired.load(Ordering::SeqCst) == 1);
    assert_eq!(ints(&run.outputs[0]), vec![2, 3]);
}

#[test]
fn wait_timeout_returns_by_its_deadline_even_when_the_awaited_work_has_not_started() {
    // One executor thread, kept busy, so the awaited execution stays queued.
    let client = client_with_threads(1, 1);
    let device = client.devices()[0].clone();
    let running = Event::new();
    let release_hold = Event::new();
    let (started, release) = (running.clone(), release_hold.clone());
    client
        .register_native_function("hold", move |_ctx| {
            let _ = started.set(Ok(()));
            release.wait()
        })
        .unwrap();
    let gate = Event::new();
    register_gate(&client, "gate", &gate);
    let held = compile_nullary(&client, "hold", &device)
        .execute(&[], &on(&client.create_stream()))
        .unwrap();
    running.wait_timeout(PATIENCE).unwrap();
    let queued = compile_nullary(&client, "gate", &device)
        .execute(&[], &on(&client.create_stream()))
        .unwrap();
    // Opens the gates once the wait below returned, or after a while if it hangs.
    let (returned, on_return) = std::sync::mpsc::channel::<()>();
    let opener = {
        let (gate, release_hold) = (gate.clone(), release_hold.clone());
        std::thread::spawn(move || {
            let _ = on_return.recv_timeout(Duration::from_millis(1500));
            gate.set(Ok(())).unwrap();
            release_hold.set(Ok(())).unwrap();
        })
    };
    let start = std::time::Instant::now();
    let result = queued.status.wait_timeout(Duration::from_millis(100));
    let elapsed = start.elapsed();
    let _ = returned.send(());
    opener.join().unwrap();
    assert_error(result, ErrorCode::DeadlineExceeded, "deadline");
    assert!(
        elapsed < Duration::from_millis(1000),
        "wait_timeout(100ms) took {elapsed:?}"
    );
    held.status.wait_timeout(PATIENCE).unwrap();
    queued.status.wait_timeout(PATIENCE).unwrap();
}

#[test]
fn a_stream_still_works_with_another_client_after_the_first_client_is_gone() {
    let stream = {
        let first = client(1);
        register_noop(&first, "noop");
        let stream = first.create_stream();
        let exe = compile_nullary(&first, "noop", &first.devices()[0]);
        let run = exe.execute(&[], &on(&stream)).unwrap();
        run.status.wait_timeout(PATIENCE).unwrap();
        stream
    };
    std::thread::sleep(Duration::from_millis(50));
    let second = client(1);
    register_noop(&second, "noop");
    let exe = compile_nullary(&second, "noop", &second.devices()[0]);
    match exe.execute(&[], &on(&stream)) {
        // Refusing a stream of another client is acceptable, hanging is not.
        Err(e) => assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}"),
        Ok(run) => {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !run.status.is_ready() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the execution never ran (nobody waited on it)"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            run.status.wait().unwrap();
        }
    }
}

#[test]
fn client_options_out_of_range_are_invalid_argument() {
    let err = |options| Client::new_local(options).map(|c| c.id());
    assert_error(
        err(ClientOptions {
            num_cpu_devices: Some(0),
            ..Default::default()
        }),
        ErrorCode::InvalidArgument,
        "num_cpu_devices must be between 1 and 4096, got 0",
    );
    assert_error(
        err(ClientOptions {
            num_cpu_devices: Some(1),
            executor_threads: Some(0),
            ..Default::default()
        }),
        ErrorCode::InvalidArgument,
        "executor_threads must be between 1 and 1024, got 0",
    );
}

/// A language executor as an SDK registers one: here, programs whose payload is
/// a byte to add to every element.
struct AddPayloadByte;

impl LanguageExecutor for AddPayloadByte {
    fn load(&self, program: &Program) -> Result<std::sync::Arc<dyn LoadedProgram>> {
        let [delta] = program.payload[..] else {
            return Err(Error::invalid_argument("the payload must be one byte"));
        };
        Ok(std::sync::Arc::new(
            move |ctx: &mut ExecutionContext<'_>| {
                for i in 0..ctx.inputs().len() {
                    let bytes: Vec<u8> = ctx.inputs()[i]
                        .to_host_vec()?
                        .iter()
                        .map(|b| b + delta)
                        .collect();
                    set_output_bytes(ctx, i, &bytes)?;
                }
                Ok(())
            },
        ))
    }
}

#[test]
fn a_registered_language_executor_loads_at_compile_and_runs_per_host() {
    let client = client(2);
    assert_error(
        client.register_executor("native", AddPayloadByte),
        ErrorCode::AlreadyExists,
        "'native' programs",
    );
    assert_error(
        client.register_executor(LANGUAGE_COLOCATED, AddPayloadByte),
        ErrorCode::AlreadyExists,
        "built in",
    );
    client.register_executor("bytes", AddPayloadByte).unwrap();
    assert_eq!(
        client.languages(0).unwrap(),
        vec![
            "bytes".to_string(),
            LANGUAGE_COLOCATED.to_string(),
            LANGUAGE_NATIVE.to_string()
        ]
    );
    let devices = client.devices().to_vec();
    let sharding =
        Sharding::named(devices.clone(), vec![2], vec!["x".into()], vec![vec![0]]).unwrap();
    let spec = ArraySpec::new(vec![4], DType::U8, sharding).unwrap();
    let program = |payload: Vec<u8>| Program {
        name: "add".into(),
        language: "bytes".into(),
        payload,
        input_specs: vec![spec.clone()],
        output_specs: vec![spec.clone()],
        devices: devices.clone(),
        output_structure: vec![],
    };
    assert_error(
        client.compile(program(vec![1, 2]), CompileOptions::default()),
        ErrorCode::InvalidArgument,
        "one byte",
    );
    let exe = client
        .compile(program(vec![10]), CompileOptions::default())
        .unwrap();
    let x = Array::from_host_bytes(&client, &[1, 2, 3, 4], spec.clone()).unwrap();
    let run = exe.execute(&[x], &ExecuteOptions::default()).unwrap();
    assert_eq!(
        run.outputs[0].to_host_bytes().unwrap(),
        vec![11, 12, 13, 14]
    );
}

#[test]
fn a_native_program_reads_the_data_after_its_name_and_bad_names_are_refused() {
    let client = client(4);
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let log = seen.clone();
    client
        .register_native_function("with_data", move |ctx| {
            log.lock().unwrap().push(ctx.native_data().to_vec());
            Ok(())
        })
        .unwrap();
    let devices = client.devices()[..1].to_vec();
    for data in [&b""[..], b"\x00object 7\x00"] {
        let payload = native_payload("with_data", data).unwrap();
        let program = Program {
            payload,
            ..Program::native("with_data", vec![], vec![], devices.clone())
        };
        let exe = client.compile(program, CompileOptions::default()).unwrap();
        exe.execute(&[], &ExecuteOptions::default())
            .unwrap()
            .status
            .wait()
            .unwrap();
    }
    assert_eq!(
        *seen.lock().unwrap(),
        vec![vec![], b"\x00object 7\x00".to_vec()]
    );
    for bad in ["", "a\0b"] {
        let err = native_payload(bad, b"x").unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        let err = client
            .register_native_function(bad, |_| Ok(()))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    }
}

#[test]
fn with_stream_queues_another_threads_work_in_program_order_on_that_stream() {
    let client = client(1);
    let device = client.devices()[0].clone();
    let gate = Event::new();
    register_gate(&client, "with_stream_gate", &gate);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = order.clone();
    client
        .register_native_function("with_stream_mark", move |_ctx| {
            seen.lock().unwrap().push("mark");
            Ok(())
        })
        .unwrap();
    let gated = compile_nullary(&client, "with_stream_gate", &device);
    let mark = compile_nullary(&client, "with_stream_mark", &device);
    // This thread's stream: the gate holds it.
    let stream = client.current_stream();
    let held = gated
        .execute(&[], &ExecuteOptions::default())
        .unwrap()
        .status;
    // Another thread queues with this thread's stream, without naming it.
    let (s, m) = (stream.clone(), mark.clone());
    let queued = std::thread::spawn(move || {
        with_stream(&s, || m.execute(&[], &ExecuteOptions::default()))
            .unwrap()
            .status
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        order.lock().unwrap().is_empty(),
        "ran before the gate opened"
    );
    assert!(!queued.is_ready());
    gate.set(Ok(())).unwrap();
    held.wait().unwrap();
    queued.wait().unwrap();
    assert_eq!(*order.lock().unwrap(), ["mark"]);
    // Without it, the other thread's work runs on a stream of its own, at once.
    let free = std::thread::spawn(move || {
        mark.execute(&[], &ExecuteOptions::default())
            .unwrap()
            .status
            .wait_timeout(Duration::from_secs(2))
    });
    free.join().unwrap().unwrap();
}

/// Registers `name`: appends `name` to `log`.
fn register_mark(client: &Client, name: &'static str, log: &Arc<Mutex<Vec<&'static str>>>) {
    let log = log.clone();
    client
        .register_native_function(name, move |_ctx| {
            log.lock().unwrap().push(name);
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_reserved_slot_holds_its_place_in_the_stream_until_released() {
    let client = client(1);
    let device = client.devices()[0].clone();
    let log = Arc::new(Mutex::new(Vec::new()));
    register_mark(&client, "slot_held", &log);
    register_mark(&client, "slot_after", &log);
    let gate = Event::new();
    register_gate(&client, "slot_gate", &gate);
    let held = compile_nullary(&client, "slot_held", &device);
    let after = compile_nullary(&client, "slot_after", &device);
    let gated = compile_nullary(&client, "slot_gate", &device);
    let stream = client.create_stream();
    // Earlier work holds the stream: the slot is not reached yet.
    let first = gated.execute(&[], &on(&stream)).unwrap().status;
    let slot = client.reserve(&stream).unwrap();
    // Queued after the slot: it waits for the slot's work.
    let later = after.execute(&[], &on(&stream)).unwrap().status;
    std::thread::sleep(Duration::from_millis(50));
    assert!(!slot.reached().is_ready());
    gate.set(Ok(())).unwrap();
    first.wait().unwrap();
    slot.reached().wait_timeout(PATIENCE).unwrap();
    // The held work runs on a stream of its own, while `later` still waits.
    let own = client.create_stream();
    let work = held.execute(&[], &on(&own)).unwrap().status;
    work.wait_timeout(PATIENCE).unwrap();
    assert_eq!(
        later
            .wait_timeout(Duration::from_millis(100))
            .unwrap_err()
            .code(),
        ErrorCode::DeadlineExceeded
    );
    slot.release_after(&work);
    later.wait_timeout(PATIENCE).unwrap();
    assert_eq!(*log.lock().unwrap(), ["slot_held", "slot_after"]);
}

#[test]
fn a_dropped_slot_lets_its_stream_go_on_and_another_clients_stream_is_refused() {
    let client = client(1);
    let device = client.devices()[0].clone();
    let log = Arc::new(Mutex::new(Vec::new()));
    register_mark(&client, "dropped_slot_after", &log);
    let after = compile_nullary(&client, "dropped_slot_after", &device);
    let stream = client.create_stream();
    let slot = client.reserve(&stream).unwrap();
    let later = after.execute(&[], &on(&stream)).unwrap().status;
    assert!(later.wait_timeout(Duration::from_millis(50)).is_err());
    drop(slot);
    later.wait_timeout(PATIENCE).unwrap();
    assert_eq!(*log.lock().unwrap(), ["dropped_slot_after"]);
    let other = common::client(1);
    assert_error(
        other.reserve(&stream).map(|_| ()),
        ErrorCode::InvalidArgument,
        "another client",
    );
}

#[test]
fn kept_arrays_stay_usable_by_the_work_they_were_kept_for_after_a_delete() {
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let x = i32_array(&client, &[1, 2, 3, 4, 5, 6, 7, 8], &spec);
    let kept = Array::keep(std::slice::from_ref(&x)).unwrap();
    x.delete();
    assert!(x.is_deleted());
    // Outside the kept work, the array is deleted.
    assert_refused(
        &exe,
        std::slice::from_ref(&x),
        ErrorCode::FailedPrecondition,
        "deleted",
    );
    // The work it was kept for still runs with it.
    let run = kept
        .use_in(|| exe.execute(std::slice::from_ref(&x), &ExecuteOptions::default()))
        .unwrap();
    drop(kept);
    assert_eq!(ints(&run.outputs[0]), [2, 3, 4, 5, 6, 7, 8, 9]);
    // Keeping a deleted array is refused.
    assert_error(
        Array::keep(&[x]).map(|_| ()),
        ErrorCode::FailedPrecondition,
        "deleted",
    );
}
