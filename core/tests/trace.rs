//! `COLOCATED_TRACE` writes a Chrome trace with one track per stream. Env vars and
//! the global subscriber are process-wide, so this file holds a single test.

use std::time::{Duration, Instant};

use colocated_core::{
    Array, ArraySpec, Buffer, Client, ClientOptions, CompileOptions, DType, ExecuteOptions,
    Program, Sharding,
};
use serde_json::Value;

#[test]
fn executions_appear_on_one_track_per_stream() -> colocated_core::Result<()> {
    let path = std::env::temp_dir().join(format!("colocated-trace-{}.json", std::process::id()));
    std::env::set_var("COLOCATED_TRACE", &path);
    std::env::remove_var("COLOCATED_LOG");

    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(2),
        ..Default::default()
    })?;
    client.register_native_function("add_one", |ctx| {
        let x = ctx.inputs()[0].to_host_vec()?;
        let y: Vec<u8> = x.iter().map(|b| b + 1).collect();
        let shard = ctx.output_shards()[0].clone();
        let out = Buffer::from_bytes(ctx.client(), &y, shard.dtype, &shard.dims, &shard.device)?;
        ctx.set_output(0, out)
    })?;
    let device = client.devices()[0].clone();
    let spec = ArraySpec::new(vec![4], DType::U8, Sharding::single_device(device.clone()))?;
    let program = Program::native(
        "add_one",
        vec![spec.clone()],
        vec![spec.clone()],
        vec![device],
    );
    let exe = client.compile(program, CompileOptions::default())?;
    let x = Array::from_host_bytes(&client, &[1, 2, 3, 4], spec)?;

    let streams = [client.create_stream(), client.create_stream()];
    for stream in &streams {
        let options = ExecuteOptions {
            stream: Some(stream.clone()),
        };
        exe.execute(std::slice::from_ref(&x), &options)?
            .status
            .wait()?;
    }
    let stream_ids: Vec<u64> = streams.iter().map(|s| s.id()).collect();

    // An execution's span closes just after its status is set: poll until both landed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (events, execute_tids) = loop {
        colocated_core::trace::flush();
        let text = std::fs::read_to_string(&path).expect("trace file exists");
        let events: Vec<Value> = serde_json::from_str(&text).expect("trace is a JSON array");
        let mut tids: Vec<u64> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == "execute")
            .inspect(|e| assert_eq!(e["pid"], 0, "{e}"))
            .map(|e| e["tid"].as_u64().expect("tid is an integer"))
            .collect();
        tids.sort_unstable();
        if tids.len() >= 2 || Instant::now() > deadline {
            break (events, tids);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = std::fs::remove_file(&path);

    assert_eq!(execute_tids, stream_ids);
    let execute = events
        .iter()
        .find(|e| e["name"] == "execute")
        .expect("execute event");
    assert_eq!(execute["args"]["program"], "add_one");
    assert!(
        execute["ts"].is_number() && execute["dur"].is_number(),
        "{execute}"
    );
    for id in &stream_ids {
        let named = events.iter().any(|e| {
            e["ph"] == "M"
                && e["name"] == "thread_name"
                && e["pid"] == 0
                && e["tid"] == *id
                && e["args"]["name"] == format!("stream {id}").as_str()
        });
        assert!(named, "no thread_name for stream {id}");
    }
    assert!(events.iter().any(|e| e["ph"] == "M"
        && e["name"] == "process_name"
        && e["args"]["name"] == "controller (this process)"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "X" && e["name"] == "compile"));
    Ok(())
}
