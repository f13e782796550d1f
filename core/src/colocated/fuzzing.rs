//! Entry points for fuzzing the colocated protocol's decoders (built only with
//! the `fuzzing` feature; `fuzzing::colocated_protocol` drives
//! them): a host loading a `colocated` program of arbitrary payload, and a
//! controller deriving global outputs from arbitrary discovery reports.
//! Junk must get an error, never a panic.

use prost::Message;

use super::discovery::global_outputs;
use super::pb;
use super::spec::CallSpec;
use crate::client::Client;
use crate::compiler::CompileOptions;
use crate::dtype::DType;
use crate::program::{Program, LANGUAGE_COLOCATED, LANGUAGE_NATIVE};
use crate::sharding::Sharding;
use crate::spec::ArraySpec;

/// At most this many reports are read from one input.
const MAX_REPORTS: usize = 8;

/// Loads `payload` as a `colocated` program on `client`'s first device.
pub fn load(client: &Client, payload: &[u8]) {
    let program = Program {
        name: "fuzz".into(),
        language: LANGUAGE_COLOCATED.into(),
        payload: payload.to_vec(),
        input_specs: Vec::new(),
        output_specs: Vec::new(),
        devices: client.devices()[..1].to_vec(),
        output_structure: Vec::new(),
    };
    // Loading refuses junk with an error; a good op loads.
    let _ = client.compile(program, CompileOptions::default());
}

/// Derives the global outputs of a call (one `f32[4]` input split over the
/// client's 4 devices, which count as two hosts of two) from the
/// length-delimited reports in `data`.
pub fn reports(client: &Client, mut data: &[u8]) {
    let mut reports = Vec::new();
    while !data.is_empty() && reports.len() < MAX_REPORTS {
        match pb::Report::decode_length_delimited(&mut data) {
            Ok(report) => reports.push(report),
            Err(_) => return,
        }
    }
    let devices = client.devices()[..4].to_vec();
    let Ok(sharding) = Sharding::named(devices.clone(), vec![4], vec!["x".into()], vec![vec![0]])
    else {
        return;
    };
    let Ok(x) = ArraySpec::new(vec![4], DType::F32, sharding) else {
        return;
    };
    let call = CallSpec {
        tree: 0,
        leaves: vec![x],
    };
    let hosts = [devices[..2].to_vec(), devices[2..].to_vec()];
    let _ = global_outputs(&reports, &call, &hosts, &|a, b| a == b);
}

/// Seed inputs: `(name, input)` with the first byte as
/// `fuzzing::colocated_protocol` reads it; the discovery run's
/// program calls the native function `native`.
pub fn seeds(native: &str) -> Vec<(&'static str, Vec<u8>)> {
    let op = |op: pb::op::Op| pb::Op { op: Some(op) }.encode_to_vec();
    let with = |choice: u8, body: Vec<u8>| {
        let mut input = vec![choice];
        input.extend(body);
        input
    };
    let discover = op(pb::op::Op::Discover(pb::Discover {
        key: 7,
        language: LANGUAGE_NATIVE.into(),
        payload: native.as_bytes().to_vec(),
        report_callback: 0,
    }));
    let layout = pb::HostLayout {
        positions: vec![1, 0],
        mesh_shape: vec![2],
        axis_names: vec!["y".into()],
        partition: vec![pb::Axes { mesh_axes: vec![0] }],
        ..Default::default()
    };
    let report = |same: Option<u32>| pb::Report {
        structure: vec![1],
        outputs: vec![pb::OutputReport {
            shape: vec![2],
            dtype: DType::F32 as u32,
            layout: Some(layout.clone()),
            same_as_input: same,
            input_shape: if same.is_some() { vec![2] } else { vec![] },
            ..Default::default()
        }],
    };
    let two = |r: pb::Report| {
        let mut body = r.encode_length_delimited_to_vec();
        body.extend(r.encode_length_delimited_to_vec());
        body
    };
    vec![
        ("op-discover", with(0, discover)),
        ("op-pop", with(0, op(pb::op::Op::Pop(7)))),
        ("op-forget", with(0, op(pb::op::Op::ForgetObject(9)))),
        ("reports-input", with(1, two(report(Some(0))))),
        ("reports-stacked", with(1, two(report(None)))),
    ]
}
