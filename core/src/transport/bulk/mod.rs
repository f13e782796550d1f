//! `PutBuffer` and `GetBuffer` without tonic's codec: the bulk paths, copy-free
//! on both ends.
//!
//! The wire format is the protocol's own, gRPC streams of `PutBufferChunk`
//! and `BufferChunk` messages, so any gRPC client can still upload and
//! download. Both ends handle the bytes of these two RPCs themselves, because
//! tonic's codec copies every byte once more on each side (into its encode
//! buffer on the way out, into its decode buffer on the way in), and at 256
//! MiB those copies cost about a fifth of the throughput:
//! - the controller ([`PutBody`]) sends each chunk as two HTTP/2 data frames:
//!   a few bytes of framing (gRPC's message header, the chunk's fields but
//!   `data`, and the key and length of `data`), then the chunk's bytes as they
//!   are, straight from its buffer;
//! - the worker ([`ChunkParser`]) parses the stream as it arrives and hands
//!   each piece of `data` to its sink as a view of the received frame, which
//!   copies it into the buffer's memory (or, for a string buffer, decodes its
//!   elements from it: see [`strings`](super::strings)).
//!
//! Downloads are the mirror image: the worker answers with
//! [`download_answer`] (each chunk's prefix, then the buffer's own memory as
//! it is), and the controller's [`get_call`] parses the answer as it arrives
//! and writes each piece of data straight to its destination.
//!
//! The parser checks what tonic's decoder and prost would, and is stricter in
//! three ways: a chunk's `data` must come after its other fields (the order in
//! which protobuf encoders write them; the worker needs the buffer's spec
//! before its bytes), its other fields take at most 64 KiB, and it has no
//! fields of the deprecated group wire types.

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use super::proto::{BufferChunk, BufferSpec, PutBufferChunk};

mod calls;
mod parser;

pub(crate) use calls::{download_answer, empty_answer, get_call, put_call, PutBody};
pub(crate) use parser::{ChunkParser, ChunkSink};

/// The HTTP/2 path of the `PutBuffer` RPC.
pub(crate) const PUT_BUFFER_PATH: &str = "/colocated.remote.v1.Worker/PutBuffer";

/// The HTTP/2 path of the `GetBuffer` RPC.
pub(crate) const GET_BUFFER_PATH: &str = "/colocated.remote.v1.Worker/GetBuffer";

/// A message of a bulk stream: fields, then a run of bytes (`data`).
pub(crate) trait Chunk: Message + Default {
    /// The field number of `data`.
    const DATA_FIELD: u32;
    /// The RPC whose stream it is, for errors.
    const RPC: &'static str;
}

impl Chunk for PutBufferChunk {
    const DATA_FIELD: u32 = 3;
    const RPC: &'static str = "PutBuffer";
}

impl Chunk for BufferChunk {
    const DATA_FIELD: u32 = 1;
    const RPC: &'static str = "GetBuffer";
}

/// gRPC's message header: a compression flag and the length (big endian).
const GRPC_HEADER_BYTES: usize = 5;

/// Most bytes of a chunk's fields other than `data` (a handle and a spec: a
/// few dozen bytes for any real shape).
const MAX_FIELDS_BYTES: usize = 64 << 10;

/// The bytes before a chunk's data on the wire: gRPC's message header, the
/// chunk's fields (`handle`, and `spec` on the first), and the key and length
/// of `data`. The data follows as it is.
pub(crate) fn chunk_prefix(handle: u64, spec: Option<BufferSpec>, data_len: usize) -> Bytes {
    let fields = PutBufferChunk {
        handle,
        spec,
        data: Bytes::new(),
    };
    prefix(&fields, data_len)
}

/// The bytes before a chunk's data on the wire: gRPC's message header,
/// `fields` (whose `data` is empty), and the key and length of `data`.
pub(crate) fn prefix<M: Chunk>(fields: &M, data_len: usize) -> Bytes {
    let data_header = key_len(M::DATA_FIELD) + encoded_len_varint(data_len as u64);
    let prefix = fields.encoded_len() + data_header;
    let mut out = BytesMut::with_capacity(GRPC_HEADER_BYTES + prefix);
    out.put_u8(0);
    // Chunks are at most CHUNK_BYTES (`PutBody` splits larger ones), far
    // below u32::MAX.
    out.put_u32((prefix + data_len) as u32);
    // Cannot fail: `out` has room for the encoded length.
    let _ = fields.encode(&mut out);
    encode_key(M::DATA_FIELD, WireType::LengthDelimited, &mut out);
    encode_varint(data_len as u64, &mut out);
    out.freeze()
}

#[cfg(test)]
mod tests;
