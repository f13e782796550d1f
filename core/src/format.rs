//! The serialized executable format: a fixed, versioned header, then a protobuf
//! payload (`proto/executable.proto`).
//!
//! Format version 2, which this library writes:
//!
//! ```text
//! offset size field
//!      0    8 magic "COLOCEXE"
//!      8    4 format version (u32, little endian): 2
//!     12    6 producer version major, minor, patch (u16 each, little endian)
//!     18    2 reserved: zero
//!     20    8 payload length (u64, little endian)
//!     28    4 CRC-32 (IEEE, little endian) of header bytes 0..28, then the payload
//!     32    … payload
//! ```
//!
//! Format version 1, which this library still reads, has the same layout except
//! that its CRC-32 covers the payload only (so a change to its producer version
//! goes unnoticed).
//!
//! Every version's reserved bytes must be zero. A reader checks, in this order:
//! length of the header, magic, format version, reserved bytes, payload length,
//! checksum, then decodes the payload; the first check that fails is the
//! `invalid_argument` error it returns, and its message names that check.

use prost::Message;

use crate::error::{Error, Result};

pub(crate) mod pb {
    include!(concat!(env!("OUT_DIR"), "/colocated.executable.v1.rs"));
}

/// The magic bytes that open every serialized executable.
pub const MAGIC: &[u8; 8] = b"COLOCEXE";
/// The format version this library writes: 2, whose checksum covers the header
/// and the payload.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this library reads: 1, whose checksum covers the
/// payload only.
pub const MIN_FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 32;
/// Offset of the two reserved bytes.
const RESERVED_AT: usize = 18;
/// Offset of the checksum; format version 2's covers the header bytes before it.
const CHECKSUM_AT: usize = 28;

fn producer_version() -> [u16; 3] {
    let mut parts = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse::<u16>().unwrap_or(0));
    [
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    ]
}

/// The checksum a header of format `version` carries: version 1's covers the
/// payload, later versions' cover `header` (the bytes before the checksum) and
/// the payload.
fn checksum(version: u32, header: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    if version >= 2 {
        hasher.update(header);
    }
    hasher.update(payload);
    hasher.finalize()
}

pub(crate) fn encode(executable: &pb::Executable) -> Vec<u8> {
    let payload = executable.encode_to_vec();
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    for part in producer_version() {
        out.extend_from_slice(&part.to_le_bytes());
    }
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let crc = checksum(FORMAT_VERSION, &out, &payload);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

fn read<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// Checks that `bytes` is an executable this library can load; the error says
/// precisely why not (`invalid_argument`).
pub fn check_compatible(bytes: &[u8]) -> Result<()> {
    decode(bytes).map(|_| ())
}

pub(crate) fn decode(bytes: &[u8]) -> Result<pb::Executable> {
    if bytes.len() < HEADER_LEN {
        return Err(Error::invalid_argument(format!(
            "serialized executable is truncated: {} bytes, the header alone is {HEADER_LEN}",
            bytes.len()
        )));
    }
    if &bytes[..8] != MAGIC {
        return Err(Error::invalid_argument(
            "not a serialized colocated executable (bad magic)",
        ));
    }
    let version = u32::from_le_bytes(read(bytes, 8));
    let producer = [
        u16::from_le_bytes(read(bytes, 12)),
        u16::from_le_bytes(read(bytes, 14)),
        u16::from_le_bytes(read(bytes, 16)),
    ];
    // Before anything whose meaning depends on the version.
    if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(Error::invalid_argument(format!(
            "serialized by colocated {}.{}.{} in format version {version}; this library ({}) reads format versions {MIN_FORMAT_VERSION} to {FORMAT_VERSION}",
            producer[0],
            producer[1],
            producer[2],
            env!("CARGO_PKG_VERSION")
        )));
    }
    // Before the checksum, so that the error names the reserved field.
    let reserved: [u8; 2] = read(bytes, RESERVED_AT);
    if reserved != [0, 0] {
        return Err(Error::invalid_argument(format!(
            "serialized executable has a non-zero reserved header field (bytes {RESERVED_AT}..{}: {:02x} {:02x}); it must be zero",
            RESERVED_AT + 2,
            reserved[0],
            reserved[1]
        )));
    }
    let len = u64::from_le_bytes(read(bytes, 20));
    let available = (bytes.len() - HEADER_LEN) as u64;
    if len != available {
        return Err(Error::invalid_argument(format!(
            "serialized executable is {} : the header announces {len} payload bytes, {available} are present",
            if len > available { "truncated" } else { "followed by extra bytes" }
        )));
    }
    let payload = &bytes[HEADER_LEN..];
    let crc = u32::from_le_bytes(read(bytes, CHECKSUM_AT));
    if checksum(version, &bytes[..CHECKSUM_AT], payload) != crc {
        return Err(Error::invalid_argument(format!(
            "serialized executable is corrupted (checksum mismatch over {}, format version {version})",
            if version >= 2 {
                "the header and the payload"
            } else {
                "the payload"
            }
        )));
    }
    pb::Executable::decode(payload).map_err(|e| {
        Error::invalid_argument(format!("serialized executable payload is malformed: {e}"))
    })
}

/// FNV-1a 64 of `bytes`, as 16 hex digits: stable across versions and platforms.
pub(crate) fn fingerprint(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn sample() -> Vec<u8> {
        encode(&pb::Executable {
            name: "f".into(),
            language: "native".into(),
            ..Default::default()
        })
    }

    #[test]
    fn round_trip_and_precise_rejections() {
        let bytes = sample();
        assert_eq!(decode(&bytes).unwrap().name, "f");
        let err = decode(&bytes[..10]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.message().contains("truncated"), "{err}");
        let err = decode(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(err.message().contains("truncated"), "{err}");
        let mut bad = bytes.clone();
        *bad.last_mut().unwrap() ^= 0xff;
        assert!(decode(&bad).unwrap_err().message().contains("checksum"));
        let mut future = bytes.clone();
        future[8] = 9;
        assert!(decode(&future)
            .unwrap_err()
            .message()
            .contains("format version 9"));
        let mut magic = bytes;
        magic[0] = b'X';
        assert!(decode(&magic).unwrap_err().message().contains("magic"));
    }

    /// `sample()` in format version 1, as the library wrote it before version 2.
    fn sample_v1(reserved: [u8; 2]) -> Vec<u8> {
        let payload = sample()[HEADER_LEN..].to_vec();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&[0, 0, 1, 0, 0, 0]);
        bytes.extend_from_slice(&reserved);
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        bytes
    }

    #[test]
    fn version_2_checksums_the_header_before_the_checksum_and_the_payload() {
        let bytes = sample();
        assert_eq!(u32::from_le_bytes(read(&bytes, 8)), 2);
        assert_eq!(&bytes[18..20], &[0, 0]);
        let covered = [&bytes[..28], &bytes[32..]].concat();
        assert_eq!(
            u32::from_le_bytes(read(&bytes, 28)),
            crc32fast::hash(&covered)
        );
    }

    #[test]
    fn a_changed_producer_version_or_reserved_byte_is_refused_in_version_2() {
        let bytes = sample();
        for at in 12..20 {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                let err = decode(&bad).unwrap_err();
                assert_eq!(err.code(), ErrorCode::InvalidArgument, "byte {at}: {err}");
                let expected = if at < 18 {
                    "checksum mismatch over the header and the payload"
                } else {
                    "non-zero reserved header field (bytes 18..20"
                };
                assert!(err.message().contains(expected), "byte {at}: {err}");
            }
        }
        let mut checksum = bytes;
        checksum[28] ^= 1;
        assert!(decode(&checksum)
            .unwrap_err()
            .message()
            .contains("checksum mismatch"));
    }

    #[test]
    fn version_1_is_read_with_its_payload_only_checksum_and_zero_reserved_bytes() {
        let v1 = sample_v1([0, 0]);
        assert_eq!(decode(&v1).unwrap().name, "f");
        // Version 1's checksum never covered the producer version.
        let mut producer = v1.clone();
        producer[12] ^= 0xff;
        assert_eq!(decode(&producer).unwrap().name, "f");
        let mut payload = v1;
        *payload.last_mut().unwrap() ^= 0xff;
        let err = decode(&payload).unwrap_err();
        assert!(
            err.message().contains("checksum mismatch over the payload"),
            "{err}"
        );
        for reserved in [[1, 0], [0, 1], [0xff, 0xff]] {
            let err = decode(&sample_v1(reserved)).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArgument);
            assert!(err.message().contains("reserved"), "{err}");
        }
    }
}
