//! Writes the seed inputs of the fuzz targets into `seeds/<target>/`: a few
//! valid requests and executables, from which the fuzzer mutates.
//!
//! `cargo run --example write_seeds` in this directory.

use std::path::Path;

use bytes::Bytes;
use colocated_core::fuzzing::{
    colocated_seeds, copy_shards, encode_input, encode_lane_input, sample_executable, Rpc,
    COPY_FUNCTION,
};
use colocated_core::transport::proto::{
    control_request, BufferSpec, ControlRequest, DeleteBuffersRequest, ExecuteRequest,
    HostCallbackResult, LaneHello, LoadExecutableRequest, OpenSessionRequest, PutBufferChunk,
    PutSmallBufferRequest, ReadBufferRequest, StringElements,
};
use colocated_core::transport::{LANE_MAGIC, MAX_MESSAGE_BYTES, PROTOCOL_VERSION_MAX};
use colocated_core::{
    ArraySpec, Client, ClientOptions, CompileOptions, DType, Program, Result, Sharding,
};
use prost::Message;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    std::fs::create_dir_all(&dir).expect("the seeds directory");
    std::fs::write(dir.join(name), bytes).expect("a seed file");
}

fn op(seq: u64, op: control_request::Op) -> ControlRequest {
    ControlRequest {
        seq,
        op: Some(op),
        ..Default::default()
    }
}

fn execute(inputs: Vec<u64>, outputs: Vec<u64>, stream: u64) -> control_request::Op {
    control_request::Op::Execute(ExecuteRequest {
        executable: 1,
        inputs,
        outputs,
        stream,
    })
}

fn control_seeds() {
    let target = "control_messages";
    let ops = [
        op(1, execute(vec![1, 2], vec![10, 11], 0)),
        op(2, execute(vec![10, 11], vec![12, 13], 1)),
        op(
            3,
            control_request::Op::ReadBuffer(ReadBufferRequest { handle: 12 }),
        ),
        op(
            4,
            control_request::Op::DeleteBuffers(DeleteBuffersRequest {
                handles: vec![1, 10],
            }),
        ),
        op(
            5,
            control_request::Op::HostCallbackResult(HostCallbackResult {
                call: 1,
                code: 0,
                message: String::new(),
                output: Bytes::from_static(b"out"),
            }),
        ),
    ];
    let control = encode_input(Rpc::Control, &ops);
    write(target, "control-ops", &control);
    broken_streams(target, &control);
    // A small upload on the control stream, and an execution that uses it.
    let small_put = [
        op(
            1,
            control_request::Op::PutSmallBuffer(PutSmallBufferRequest {
                handle: 20,
                spec: Some(BufferSpec {
                    device: 0,
                    dtype: DType::I32 as u32,
                    dims: vec![2],
                    memory_kind: 0,
                }),
                data: Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0]),
            }),
        ),
        op(2, execute(vec![20, 2], vec![21, 22], 0)),
    ];
    write(
        target,
        "control-small-put",
        &encode_input(Rpc::Control, &small_put),
    );
    let out_of_order = [ops[1].clone(), ops[0].clone()];
    write(
        target,
        "control-out-of-order",
        &encode_input(Rpc::Control, &out_of_order),
    );
    for (name, handle) in [("load-new", 2), ("load-taken", 1)] {
        let load = LoadExecutableRequest {
            handle,
            executable: sample_executable().into(),
            controller_device_ids: Default::default(),
        };
        write(target, name, &encode_input(Rpc::LoadExecutable, &[load]));
    }
    for (name, min_version, max_version) in [
        ("open-v1", 1, 1),
        ("open-v2", 1, 2),
        ("open-future", PROTOCOL_VERSION_MAX + 1, PROTOCOL_VERSION_MAX + 1),
    ] {
        let open = OpenSessionRequest {
            min_version,
            max_version,
            client_name: "seed".into(),
            software_version: String::new(),
        };
        write(target, name, &encode_input(Rpc::OpenSession, &[open]));
    }
}

fn chunk(handle: u64, spec: Option<(u32, DType, Vec<i64>)>, data: &[u8]) -> PutBufferChunk {
    PutBufferChunk {
        handle,
        spec: spec.map(|(device, dtype, dims)| BufferSpec {
            device,
            dtype: dtype as u32,
            dims,
            memory_kind: 0,
        }),
        data: Bytes::copy_from_slice(data),
    }
}

fn buffer_seeds() {
    let target = "buffer_chunks";
    let strings = StringElements {
        elements: ["", "héllo", "naïve 🙂"].map(String::from).to_vec(),
    }
    .encode_to_vec();
    // Cut inside an element: the worker decodes across chunks.
    let (first, rest) = strings.split_at(5);
    let seeds = [
        (
            "two-chunks",
            vec![
                chunk(7, Some((0, DType::F32, vec![2])), &[1; 4]),
                chunk(0, None, &[2; 4]),
            ],
        ),
        ("empty", vec![chunk(8, Some((1, DType::U8, vec![0])), &[])]),
        (
            "matrix",
            vec![chunk(9, Some((3, DType::I32, vec![2, 2])), &[3; 16])],
        ),
        (
            "spec-twice",
            vec![
                chunk(7, Some((0, DType::U8, vec![2])), &[1]),
                chunk(7, Some((0, DType::U8, vec![2])), &[1]),
            ],
        ),
        (
            "strings",
            vec![
                chunk(10, Some((0, DType::String, vec![3])), first),
                chunk(0, None, rest),
            ],
        ),
    ];
    for (name, chunks) in &seeds {
        write(target, name, &encode_input(Rpc::PutBuffer, chunks));
    }
    broken_streams(target, &encode_input(Rpc::PutBuffer, &seeds[0].1));
}

/// Variants of the valid `input` as it may arrive broken: in small frames,
/// reset, cut in the middle of a message, with a compressed or oversized
/// message.
fn broken_streams(target: &str, input: &[u8]) {
    let with_flags = |flags: u8| [&[input[0] | flags], &input[1..]].concat();
    write(target, "small-frames", &with_flags(3));
    write(target, "reset", &with_flags(0x80));
    write(target, "cut", &input[..input.len() - 3]);
    let mut compressed = input.to_vec();
    compressed[1] = 1;
    write(target, "compressed", &compressed);
    let mut oversized = input.to_vec();
    oversized[2..6].copy_from_slice(&(MAX_MESSAGE_BYTES as u32 + 1).to_be_bytes());
    write(target, "oversized", &oversized);
}

fn executable_seeds() -> Result<()> {
    let target = "executable_format";
    let client = Client::new_local(ClientOptions {
        num_cpu_devices: Some(4),
        executor_threads: Some(1),
        ..Default::default()
    })?;
    client.register_native_function(COPY_FUNCTION, copy_shards)?;
    let devices = client.devices().to_vec();
    let mesh = Sharding::named(
        devices.clone(),
        vec![2, 2],
        vec!["x".into(), "y".into()],
        vec![vec![0], vec![1]],
    )?;
    let programs = [
        (
            "single-device",
            ArraySpec::new(
                vec![4],
                DType::F32,
                Sharding::single_device(devices[0].clone()),
            )?,
            vec![devices[0].clone()],
        ),
        (
            "replicated",
            ArraySpec::new(
                vec![2, 3],
                DType::I32,
                Sharding::replicated(devices.clone())?,
            )?,
            devices.clone(),
        ),
        (
            "mesh",
            ArraySpec::new(vec![4, 6], DType::F32, mesh)?,
            devices.clone(),
        ),
    ];
    for (name, spec, devices) in programs {
        let program = Program::native(COPY_FUNCTION, vec![spec.clone()], vec![spec], devices);
        let bytes = client
            .compile(program, CompileOptions::default())?
            .serialize();
        write(target, name, &bytes);
        // The payload alone: the target puts a valid header before it.
        write(target, &format!("{name}-payload"), &bytes[32..]);
    }
    Ok(())
}

fn lane_seeds() {
    let target = "lane_bytes";
    let small = control_request::Op::PutSmallBuffer(PutSmallBufferRequest {
        handle: 20,
        spec: Some(BufferSpec {
            device: 0,
            dtype: DType::F32 as u32,
            dims: vec![2],
            memory_kind: 0,
        }),
        data: Bytes::from_static(&[0; 8]),
    });
    let ops = [
        op(1, small),
        op(2, execute(vec![1, 2], vec![10, 11], 0)),
        op(
            3,
            control_request::Op::ReadBuffer(ReadBufferRequest { handle: 10 }),
        ),
        op(
            4,
            control_request::Op::DeleteBuffers(DeleteBuffersRequest {
                handles: vec![10, 11, 20],
            }),
        ),
    ];
    write(target, "lane-ops", &encode_lane_input(&ops));
    write(target, "lane-out-of-order", &encode_lane_input(&ops[1..]));
    // An opening alone (a wrong token, an unknown session): the input's
    // first byte 0 sends the rest as is.
    let mut opening = vec![0u8];
    opening.extend_from_slice(LANE_MAGIC);
    let hello = LaneHello {
        token: "wrong".into(),
        session_id: Bytes::from_static(&[7; 16]),
        ..Default::default()
    }
    .encode_to_vec();
    opening.extend_from_slice(&(hello.len() as u32).to_le_bytes());
    opening.extend_from_slice(&hello);
    write(target, "lane-refused-opening", &opening);
}

fn main() -> Result<()> {
    lane_seeds();
    control_seeds();
    buffer_seeds();
    for (name, input) in colocated_seeds() {
        write("colocated_protocol", name, &input);
    }
    executable_seeds()
}
