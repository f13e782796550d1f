//! Unit tests of the bulk paths.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;
use tonic::codegen::http;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::error::{Error, ErrorCode, Result};
use crate::transport::proto::{BufferSpec, PutBufferChunk};
use crate::transport::{CHUNK_BYTES, MAX_MESSAGE_BYTES};

use super::calls::Frames;
use super::*;

const DATA_FIELD: u32 = PutBufferChunk::DATA_FIELD;

/// What a sink saw: every chunk's fields, and its data.
#[derive(Default)]
struct Seen {
    chunks: Vec<PutBufferChunk>,
}

impl ChunkSink<PutBufferChunk> for Seen {
    fn fields(&mut self, chunk: PutBufferChunk) -> Result<()> {
        self.chunks.push(chunk);
        Ok(())
    }
    fn data(&mut self, bytes: &[u8]) -> Result<()> {
        let last = self.chunks.last_mut().expect("fields come first");
        let mut data = last.data.to_vec();
        data.extend_from_slice(bytes);
        last.data = data.into();
        Ok(())
    }
}

fn spec() -> BufferSpec {
    BufferSpec {
        device: 1,
        dtype: 11,
        dims: vec![2, 3],
        memory_kind: 0,
    }
}

/// The body [`PutBody`] sends for `chunks`, as one byte string.
fn body(chunks: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, data) in chunks.iter().enumerate() {
        let spec = (i == 0).then(spec);
        out.extend_from_slice(&chunk_prefix(7, spec, data.len()));
        out.extend_from_slice(data);
    }
    out
}

/// `body` parsed in frames of `frame` bytes.
fn parse(body: &[u8], frame: usize) -> Result<Seen> {
    let mut parser = ChunkParser::<PutBufferChunk>::default();
    let mut seen = Seen::default();
    for piece in body.chunks(frame.max(1)) {
        parser.push(Bytes::copy_from_slice(piece), &mut seen)?;
    }
    parser.finish()?;
    Ok(seen)
}

/// A gRPC message of `chunk` as prost encodes it.
fn grpc(chunk: &PutBufferChunk) -> Vec<u8> {
    let encoded = chunk.encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    out.extend_from_slice(&encoded);
    out
}

#[test]
fn what_the_controller_sends_is_what_prost_encodes() {
    let data = b"some bytes of a buffer";
    let chunk = PutBufferChunk {
        handle: 7,
        spec: Some(spec()),
        data: Bytes::from_static(data),
    };
    assert_eq!(body(&[data]), grpc(&chunk));
}

#[test]
fn chunks_arrive_whole_in_frames_of_any_size() {
    let a: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let b: Vec<u8> = (0..333u32).map(|i| (i * 7) as u8).collect();
    let wire = body(&[&a, &b, &[]]);
    for frame in [1, 2, 3, 5, 7, 64, 999, wire.len()] {
        let seen = parse(&wire, frame).unwrap();
        assert_eq!(seen.chunks.len(), 3, "frames of {frame}");
        assert_eq!(seen.chunks[0].handle, 7);
        assert_eq!(seen.chunks[0].spec, Some(spec()));
        assert_eq!(seen.chunks[1].spec, None);
        assert_eq!(&seen.chunks[0].data[..], &a[..]);
        assert_eq!(&seen.chunks[1].data[..], &b[..]);
        assert!(seen.chunks[2].data.is_empty());
    }
}

#[test]
fn messages_of_any_protobuf_encoder_parse_if_data_comes_last() {
    // An empty message, and one with only fields: prost's own encoding.
    let wire = [
        grpc(&PutBufferChunk::default()),
        grpc(&PutBufferChunk {
            handle: 3,
            spec: Some(spec()),
            data: Bytes::new(),
        }),
    ]
    .concat();
    let seen = parse(&wire, 3).unwrap();
    assert_eq!(seen.chunks.len(), 2);
    assert_eq!(seen.chunks[1].handle, 3);
    // Unknown fields of every wire type are skipped, as prost skips them.
    let mut message = Vec::new();
    encode_key(9, WireType::Varint, &mut message);
    encode_varint(300, &mut message);
    encode_key(10, WireType::SixtyFourBit, &mut message);
    message.extend_from_slice(&[1; 8]);
    encode_key(11, WireType::ThirtyTwoBit, &mut message);
    message.extend_from_slice(&[2; 4]);
    encode_key(12, WireType::LengthDelimited, &mut message);
    encode_varint(2, &mut message);
    message.extend_from_slice(b"xy");
    encode_key(DATA_FIELD, WireType::LengthDelimited, &mut message);
    encode_varint(3, &mut message);
    message.extend_from_slice(b"abc");
    let mut wire = vec![0];
    wire.extend_from_slice(&(message.len() as u32).to_be_bytes());
    wire.extend_from_slice(&message);
    for frame in [1, 4, wire.len()] {
        let seen = parse(&wire, frame).unwrap();
        assert_eq!(&seen.chunks[0].data[..], b"abc");
    }
}

/// `message` as one gRPC message (uncompressed).
fn framed(message: &[u8]) -> Vec<u8> {
    let mut wire = vec![0];
    wire.extend_from_slice(&(message.len() as u32).to_be_bytes());
    wire.extend_from_slice(message);
    wire
}

#[test]
fn malformed_streams_get_typed_errors() {
    let good = body(&[b"abcdef"]);
    let mut data_then_spec = Vec::new();
    encode_key(DATA_FIELD, WireType::LengthDelimited, &mut data_then_spec);
    encode_varint(1, &mut data_then_spec);
    data_then_spec.push(9);
    encode_key(1, WireType::Varint, &mut data_then_spec);
    encode_varint(7, &mut data_then_spec);
    let mut data_twice = Vec::new();
    for _ in 0..2 {
        encode_key(DATA_FIELD, WireType::LengthDelimited, &mut data_twice);
        encode_varint(1, &mut data_twice);
        data_twice.push(9);
    }
    let mut compressed = good.clone();
    compressed[0] = 1;
    let mut flag = good.clone();
    flag[0] = 2;
    let mut oversized = good.clone();
    oversized[1..5].copy_from_slice(&((MAX_MESSAGE_BYTES + 1) as u32).to_be_bytes());
    let mut data_varint = Vec::new();
    encode_key(DATA_FIELD, WireType::Varint, &mut data_varint);
    encode_varint(1, &mut data_varint);
    let mut too_long = Vec::new();
    encode_key(DATA_FIELD, WireType::LengthDelimited, &mut too_long);
    encode_varint(100, &mut too_long);
    too_long.push(1);
    let mut big_fields = Vec::new();
    encode_key(12, WireType::LengthDelimited, &mut big_fields);
    encode_varint(MAX_FIELDS_BYTES as u64 + 1, &mut big_fields);
    big_fields.resize(big_fields.len() + MAX_FIELDS_BYTES + 1, 0);
    let invalid = ErrorCode::InvalidArgument;
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        ("empty", vec![], invalid),
        ("cut in a header", good[..3].to_vec(), invalid),
        ("cut in the data", good[..good.len() - 1].to_vec(), invalid),
        ("compressed", compressed, invalid),
        ("bad flag", flag, invalid),
        ("oversized", oversized, ErrorCode::ResourceExhausted),
        ("field 0", framed(&[0x00, 0x01]), invalid),
        ("group", framed(&[0x0b]), invalid),
        ("cut in a key", framed(&[0x80]), invalid),
        ("cut in a varint field", framed(&[0x08, 0x80]), invalid),
        ("cut in a fixed field", framed(&[0x09, 1, 2]), invalid),
        (
            "overlong varint",
            framed(&[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ]),
            invalid,
        ),
        ("data as a varint", framed(&data_varint), invalid),
        ("data past the message", framed(&too_long), invalid),
        ("data twice", framed(&data_twice), invalid),
        ("spec after data", framed(&data_then_spec), invalid),
        ("a bad spec", framed(&[0x12, 0x02, 0x18, 0x80]), invalid),
        (
            "huge fields",
            framed(&big_fields),
            ErrorCode::ResourceExhausted,
        ),
    ];
    for (name, wire, code) in cases {
        for frame in [1, 3, wire.len()] {
            let err = parse(&wire, frame)
                .err()
                .unwrap_or_else(|| panic!("{name} parsed"));
            assert_eq!(err.code(), code, "{name} in frames of {frame}: {err}");
        }
    }
}

#[test]
fn an_empty_chunk_decodes_as_prost_decodes_it() {
    let wire = body(&[b""]);
    let decoded = PutBufferChunk::decode(&wire[GRPC_HEADER_BYTES..]).unwrap();
    assert_eq!(decoded.handle, 7);
    assert!(decoded.data.is_empty());
    let seen = parse(&wire, 1).unwrap();
    assert_eq!(seen.chunks.len(), 1);
    assert_eq!(seen.chunks[0].spec, Some(spec()));
}

#[test]
fn a_message_of_exactly_the_limit_parses() {
    let mut message = Vec::new();
    encode_key(DATA_FIELD, WireType::LengthDelimited, &mut message);
    let header = message.len() + encoded_len_varint(MAX_MESSAGE_BYTES as u64);
    encode_varint((MAX_MESSAGE_BYTES - header) as u64, &mut message);
    message.resize(MAX_MESSAGE_BYTES, 5);
    // Data needs a spec first: the sink here takes any.
    let seen = parse(&framed(&message), 1 << 20).unwrap();
    assert_eq!(seen.chunks[0].data.len(), MAX_MESSAGE_BYTES - header);
}

/// The sink's errors stop the parse.
#[test]
fn a_sink_error_ends_the_parse() {
    struct Refuse;
    impl ChunkSink<PutBufferChunk> for Refuse {
        fn fields(&mut self, _: PutBufferChunk) -> Result<()> {
            Ok(())
        }
        fn data(&mut self, _: &[u8]) -> Result<()> {
            Err(Error::failed_precondition("too much"))
        }
    }
    let mut parser = ChunkParser::<PutBufferChunk>::default();
    let err = parser
        .push(Bytes::from(body(&[b"abc"])), &mut Refuse)
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
}

#[test]
fn the_body_sends_each_chunk_as_its_prefix_then_its_bytes() {
    let a = Bytes::from_static(b"first chunk");
    let b = Bytes::from_static(b"second");
    let frames = frames_of(vec![a.clone(), b.clone()]);
    assert_eq!(frames.len(), 4);
    // The data frames are the chunks themselves, not copies.
    assert_eq!(frames[1].as_ptr(), a.as_ptr());
    assert_eq!(frames[3].as_ptr(), b.as_ptr());
    assert_eq!(frames.concat(), body(&[&a, &b]));
}

/// Every frame `PutBody` sends for `chunks`.
fn frames_of(chunks: Vec<Bytes>) -> Vec<Bytes> {
    let mut put = PutBody::new(7, spec(), tokio_stream::iter(chunks));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut frames = Vec::new();
    while let Poll::Ready(Some(frame)) = http_body::Body::poll_frame(Pin::new(&mut put), &mut cx) {
        frames.push(frame.unwrap().into_data().unwrap());
    }
    frames
}

#[test]
fn an_empty_chunk_is_its_prefix_alone_and_a_large_one_is_split() {
    assert_eq!(
        frames_of(vec![Bytes::new()]),
        vec![chunk_prefix(7, Some(spec()), 0)]
    );
    let large = Bytes::from(vec![3u8; 2 * CHUNK_BYTES + 1]);
    let frames = frames_of(vec![large.clone()]);
    assert_eq!(frames.len(), 6);
    assert_eq!(
        frames
            .iter()
            .skip(1)
            .step_by(2)
            .map(Bytes::len)
            .collect::<Vec<_>>(),
        [CHUNK_BYTES, CHUNK_BYTES, 1]
    );
    assert_eq!(frames[3].as_ptr(), large[CHUNK_BYTES..].as_ptr());
    let seen = parse(&frames.concat(), 1 << 20).unwrap();
    assert_eq!(seen.chunks.len(), 3);
    assert_eq!(
        seen.chunks.iter().map(|c| c.data.len()).sum::<usize>(),
        large.len()
    );
}

/// A stand-in for the connection: answers every request with `answer()`.
#[derive(Clone)]
struct Answers(fn() -> http::Response<tonic::body::Body>);

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Answers {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        assert_eq!(request.uri().path(), PUT_BUFFER_PATH);
        assert_eq!(request.headers()["content-type"], "application/grpc");
        assert_eq!(request.headers()["te"], "trailers");
        assert_eq!(request.headers()["colocated-session"], "s");
        std::future::ready(Ok((self.0)()))
    }
}

/// The outcome of an upload answered by `answer`.
#[allow(clippy::result_large_err)] // tonic's Status, large by design
fn call_answered(
    answer: fn() -> http::Response<tonic::body::Body>,
) -> std::result::Result<(), Status> {
    let mut metadata = MetadataMap::new();
    metadata.insert("colocated-session", "s".parse().unwrap());
    let body = PutBody::new(
        7,
        spec(),
        tokio_stream::iter(vec![Bytes::from_static(b"x")]),
    );
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(put_call(Answers(answer), metadata, body))
}

#[test]
fn an_upload_is_stored_only_when_the_worker_answers_a_message_and_ok() {
    assert!(call_answered(empty_answer).is_ok());
    // An error status alone is that error.
    let err = call_answered(|| Status::not_found("no such session").into_http()).unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::NotFound, "no such session")
    );
    // OK without the message is not a stored upload.
    let err = call_answered(|| Status::ok("").into_http()).unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    // The message, then an error in the trailers: the error.
    let err = call_answered(|| {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("8"));
        let frames = [
            Frame::data(Bytes::from_static(&[0; 5])),
            Frame::trailers(trailers),
        ];
        let mut answer = http::Response::new(tonic::body::Body::new(Frames(frames.into())));
        answer.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        answer
    })
    .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    // No gRPC status at all (an HTTP error): an error.
    let err = call_answered(|| {
        let mut answer = http::Response::new(tonic::body::Body::default());
        *answer.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        answer
    })
    .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
}
