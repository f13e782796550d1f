//! Serialized executables: arbitrary bytes into `Client::deserialize_and_load`.
//!
//! An input that starts with the format's magic is loaded as it is (the header
//! checks); any other input is loaded as it is and then as the payload behind
//! a valid header, so that the payload's decoding and the loader's checks of
//! devices, shardings and specs see arbitrary data past the checksum. What
//! loads must reload from its own serialized bytes, and run.
#![no_main]

use std::sync::OnceLock;

use colocated_core::fuzzing::local_client;
use colocated_core::{
    Array, Client, CompileOptions, ExecuteOptions, LoadedExecutable, FORMAT_VERSION, MAGIC,
};
use libfuzzer_sys::fuzz_target;

/// The most bytes of inputs and outputs an executable that loaded is run with.
const MAX_RUN_BYTES: usize = 1 << 20;

fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(local_client)
}

/// `payload` behind a valid header (the layout `core/src/format.rs` documents).
fn with_header(payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32 + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    // Format version 2's checksum covers the header before it and the payload.
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes);
    crc.update(payload);
    bytes.extend_from_slice(&crc.finalize().to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn load(bytes: &[u8]) {
    let client = client();
    let Ok(exe) = client.deserialize_and_load(bytes, CompileOptions::default()) else {
        return;
    };
    let again = client
        .deserialize_and_load(&exe.serialize(), CompileOptions::default())
        .expect("a loaded executable reloads from its own bytes");
    assert_eq!(again.fingerprint(), exe.fingerprint());
    run(&exe);
}

/// Runs `exe` on zeros, if its arrays are small: whatever reads back is zeros.
fn run(exe: &LoadedExecutable) {
    let program = exe.program();
    let sizes = |specs: &[colocated_core::ArraySpec]| -> Option<Vec<usize>> {
        specs
            .iter()
            .map(|spec| {
                let elements = spec
                    .shape
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))?;
                elements.checked_mul(spec.dtype.byte_size()?)
            })
            .collect()
    };
    let (Some(inputs), Some(outputs)) = (sizes(&program.input_specs), sizes(&program.output_specs))
    else {
        return;
    };
    let total = inputs
        .iter()
        .chain(&outputs)
        .try_fold(0usize, |a, b| a.checked_add(*b));
    if total.is_none_or(|total| total > MAX_RUN_BYTES) {
        return;
    }
    let args: Vec<Array> = program
        .input_specs
        .iter()
        .zip(&inputs)
        .map(|(spec, &bytes)| {
            Array::from_host_bytes(exe.client(), &vec![0; bytes], spec.clone())
                .expect("zeros make an array of a loaded spec")
        })
        .collect();
    let Ok(execution) = exe.execute(&args, &ExecuteOptions::default()) else {
        return;
    };
    for output in &execution.outputs {
        if let Ok(bytes) = output.to_host_bytes() {
            assert!(
                bytes.iter().all(|b| *b == 0),
                "a copy of zeros is not zeros"
            );
        }
    }
    let _ = execution.status.wait();
}

fuzz_target!(|data: &[u8]| {
    load(data);
    if !data.starts_with(MAGIC) {
        load(&with_header(data));
    }
});
