//! The serialized executable format: a fixed, versioned header, then a protobuf
//! payload (`proto/executable.proto`).
//!
//! ```text
//! offset size field
//!      0    8 magic "COLOCEXE"
//!      8    4 format version (u32, little endian)
//!     12    6 producer version major, minor, patch (u16 each)
//!     18    2 reserved, zero
//!     20    8 payload length (u64)
//!     28    4 CRC-32 of the payload
//!     32    … payload
//! ```

use prost::Message;

use crate::error::{Error, Result};

pub(crate) mod pb {
    include!(concat!(env!("OUT_DIR"), "/colocated.executable.v1.rs"));
}

/// The magic bytes that open every serialized executable.
pub const MAGIC: &[u8; 8] = b"COLOCEXE";
/// The format version this library writes.
pub const FORMAT_VERSION: u32 = 1;
/// The oldest format version this library reads.
pub const MIN_FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 32;

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
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
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
    if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(Error::invalid_argument(format!(
            "serialized by colocated {}.{}.{} in format version {version}; this library ({}) reads format versions {MIN_FORMAT_VERSION} to {FORMAT_VERSION}",
            producer[0],
            producer[1],
            producer[2],
            env!("CARGO_PKG_VERSION")
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
    let crc = u32::from_le_bytes(read(bytes, 28));
    if crc32fast::hash(payload) != crc {
        return Err(Error::invalid_argument(
            "serialized executable is corrupted (checksum mismatch)",
        ));
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
}
