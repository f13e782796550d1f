//! The serialized executable header (`core/src/format.rs`) through the public
//! API: format version 2 checks its whole header, format version 1 still loads
//! and runs, and every corruption is `invalid_argument` with the failed check.

mod common;

use colocated_core::*;
use common::*;

/// The serialized header's fields (the layout `core/src/format.rs` documents).
const VERSION: std::ops::Range<usize> = 8..12;
const PRODUCER: std::ops::Range<usize> = 12..18;
const RESERVED: std::ops::Range<usize> = 18..20;
const CHECKSUM: std::ops::Range<usize> = 28..32;
const HEADER_LEN: usize = 32;

/// A client with four devices that knows `add_one_i32`, and the bytes of an
/// executable adding one to an int32[8] split over its four devices.
fn serialized_add_one() -> (Client, ArraySpec, Vec<u8>) {
    let client = client(4);
    let (exe, spec) = add_one_over_x(&client);
    let bytes = exe.serialize();
    (client, spec, bytes)
}

/// `payload` behind a format version 1 header, as libraries before format
/// version 2 wrote it: the CRC-32 covers the payload only.
fn version_1(producer: [u16; 3], reserved: [u8; 2], payload: &[u8]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    for part in producer {
        bytes.extend_from_slice(&part.to_le_bytes());
    }
    bytes.extend_from_slice(&reserved);
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn version_of(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[VERSION].try_into().unwrap())
}

/// Both entry points refuse `bad` with `invalid_argument` naming `check`.
#[track_caller]
fn assert_refused(client: &Client, bad: &[u8], check: &str) {
    assert_error(check_compatible(bad), ErrorCode::InvalidArgument, check);
    assert_error(
        client.deserialize_and_load(bad, CompileOptions::default()),
        ErrorCode::InvalidArgument,
        check,
    );
}

fn run_add_one(exe: &LoadedExecutable, client: &Client, spec: &ArraySpec) -> Vec<i32> {
    let x = Array::from_host_bytes(client, &i32_bytes(&[41; 8]), spec.clone()).unwrap();
    let run = exe.execute(&[x], &ExecuteOptions::default()).unwrap();
    i32_values(&run.outputs[0].to_host_bytes().unwrap())
}

#[test]
fn the_library_writes_format_version_2_with_a_checksum_over_header_and_payload() {
    let (_client, _spec, bytes) = serialized_add_one();
    assert_eq!(FORMAT_VERSION, 2);
    assert_eq!(MIN_FORMAT_VERSION, 1);
    assert_eq!(&bytes[..8], MAGIC);
    assert_eq!(version_of(&bytes), 2);
    assert_eq!(&bytes[RESERVED], &[0, 0]);
    let covered = [&bytes[..CHECKSUM.start], &bytes[HEADER_LEN..]].concat();
    assert_eq!(
        u32::from_le_bytes(bytes[CHECKSUM].try_into().unwrap()),
        crc32fast::hash(&covered)
    );
    check_compatible(&bytes).unwrap();
}

#[test]
fn a_changed_producer_version_or_reserved_byte_of_a_version_2_executable_is_refused() {
    let (client, _spec, bytes) = serialized_add_one();
    for at in PRODUCER.chain(RESERVED) {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = bytes.clone();
            bad[at] ^= flip;
            let check = if RESERVED.contains(&at) {
                "non-zero reserved header field"
            } else {
                "checksum mismatch over the header and the payload"
            };
            assert_refused(&client, &bad, check);
        }
    }
    // Reserved bytes that are wrong are refused as such even with a checksum
    // that matches them.
    let mut reserved = bytes.clone();
    reserved[RESERVED.start] = 1;
    let covered = [&reserved[..CHECKSUM.start], &reserved[HEADER_LEN..]].concat();
    reserved[CHECKSUM].copy_from_slice(&crc32fast::hash(&covered).to_le_bytes());
    assert_refused(&client, &reserved, "reserved");
    client
        .deserialize_and_load(&bytes, CompileOptions::default())
        .unwrap();
}

#[test]
fn a_corrupted_payload_or_checksum_is_refused() {
    let (client, _spec, bytes) = serialized_add_one();
    let middle = HEADER_LEN + (bytes.len() - HEADER_LEN) / 2;
    for at in [HEADER_LEN, middle, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x5a;
        assert_refused(&client, &bad, "checksum mismatch");
    }
    for at in CHECKSUM {
        let mut bad = bytes.clone();
        bad[at] ^= 0x01;
        assert_refused(&client, &bad, "checksum mismatch");
    }
}

#[test]
fn a_version_1_executable_still_loads_and_runs() {
    let (client, spec, bytes) = serialized_add_one();
    let original = client
        .deserialize_and_load(&bytes, CompileOptions::default())
        .unwrap();
    // The payload did not change between format versions 1 and 2.
    let v1 = version_1([0, 1, 0], [0, 0], &bytes[HEADER_LEN..]);
    check_compatible(&v1).unwrap();
    let loaded = client
        .deserialize_and_load(&v1, CompileOptions::default())
        .unwrap();
    assert_eq!(loaded.name(), "add_one_i32");
    assert_eq!(loaded.fingerprint(), original.fingerprint());
    assert_eq!(run_add_one(&loaded, &client, &spec), vec![42; 8]);
    // It is written back in the current version.
    assert_eq!(loaded.serialize(), bytes);

    // Version 1's rules: its checksum covers the payload only…
    let other_producer = version_1([7, 8, 9], [0, 0], &bytes[HEADER_LEN..]);
    check_compatible(&other_producer).unwrap();
    let mut payload = v1.clone();
    let last = payload.len() - 1;
    payload[last] ^= 0x5a;
    assert_refused(&client, &payload, "checksum mismatch over the payload");
    // …and its reserved bytes are zero too.
    for reserved in [[1, 0], [0, 1], [0xff, 0xff]] {
        let bad = version_1([0, 1, 0], reserved, &bytes[HEADER_LEN..]);
        assert_refused(&client, &bad, "non-zero reserved header field");
    }
}

#[test]
fn format_versions_outside_1_to_2_are_refused_before_any_other_check() {
    let (client, _spec, bytes) = serialized_add_one();
    for version in [0u32, 3, 9, u32::MAX] {
        let mut bad = bytes.clone();
        bad[VERSION].copy_from_slice(&version.to_le_bytes());
        // A future version may give the reserved bytes a meaning.
        bad[RESERVED.start] = 1;
        assert_refused(
            &client,
            &bad,
            &format!(
                "format version {version}; this library ({}) reads format versions 1 to 2",
                env!("CARGO_PKG_VERSION")
            ),
        );
    }
}
