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

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;
use tokio_stream::Stream;
use tonic::client::GrpcService;
use tonic::codec::{Codec, Streaming};
use tonic::codegen::http;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use super::buffers::chunks;
use super::proto::{BufferChunk, BufferSpec, GetBufferRequest, PutBufferChunk, PutBufferResponse};
use super::{CHUNK_BYTES, MAX_MESSAGE_BYTES};
use crate::error::{Error, ErrorCode, Result};

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

/// The request body of a `PutBuffer` call: each chunk of `chunks` as its
/// prefix ([`chunk_prefix`]) and then its bytes, without copying them. The
/// first chunk carries `spec`.
pub(crate) struct PutBody<S> {
    chunks: S,
    handle: u64,
    spec: Option<BufferSpec>,
    /// The data of the chunk whose prefix went last.
    data: Option<Bytes>,
    /// The rest of a chunk larger than [`CHUNK_BYTES`], sent as the next.
    rest: Option<Bytes>,
}

impl<S> PutBody<S> {
    pub(crate) fn new(handle: u64, spec: BufferSpec, chunks: S) -> PutBody<S> {
        PutBody {
            chunks,
            handle,
            spec: Some(spec),
            data: None,
            rest: None,
        }
    }
}

impl<S: Stream<Item = Bytes> + Unpin> http_body::Body for PutBody<S> {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        let next = match self.rest.take() {
            Some(rest) => Poll::Ready(Some(rest)),
            None => Pin::new(&mut self.chunks).poll_next(cx),
        };
        match next {
            Poll::Ready(Some(mut data)) => {
                // Messages stay within the worker's limit (views, no copies).
                if data.len() > CHUNK_BYTES {
                    self.rest = Some(data.split_off(CHUNK_BYTES));
                }
                let spec = self.spec.take();
                let prefix = chunk_prefix(self.handle, spec, data.len());
                if !data.is_empty() {
                    self.data = Some(data);
                }
                Poll::Ready(Some(Ok(Frame::data(prefix))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Calls `PutBuffer` on `channel` (a tonic `Channel`) with `body` and
/// `metadata` (the token and the session), as tonic's generated client calls
/// it (headers, errors, the answer's message and trailers), but with a body
/// that does not go through tonic's codec.
pub(crate) async fn put_call<S, C>(
    mut channel: C,
    metadata: MetadataMap,
    body: PutBody<S>,
) -> std::result::Result<(), Status>
where
    S: Stream<Item = Bytes> + Unpin + Send + 'static,
    C: GrpcService<tonic::body::Body>,
    C::ResponseBody: Send + 'static,
    <C::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError>,
{
    let request = grpc_request(PUT_BUFFER_PATH, metadata, tonic::body::Body::new(body));
    let answer = call(&mut channel, request).await?;
    // A status in the headers is the whole answer ("trailers-only"): an
    // error, since a stored upload is answered with a message.
    if let Some(status) = Status::from_header_map(answer.headers()) {
        return match status.code() {
            Code::Ok => Err(no_message()),
            _ => Err(status),
        };
    }
    let decoder = ProstCodec::<PutBufferResponse, PutBufferResponse>::default().decoder();
    let status = answer.status();
    let mut answer = Streaming::new_response(
        decoder,
        answer.into_body(),
        status,
        None,
        Some(MAX_MESSAGE_BYTES),
    );
    answer.message().await?.ok_or_else(no_message)?;
    answer.trailers().await?;
    Ok(())
}

/// A gRPC request to `path` with `metadata` and `body`, as tonic's generated
/// client makes it.
fn grpc_request(
    path: &'static str,
    metadata: MetadataMap,
    body: tonic::body::Body,
) -> http::Request<tonic::body::Body> {
    let mut request = http::Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.version_mut() = http::Version::HTTP_2;
    *request.uri_mut() = http::Uri::from_static(path);
    let headers = request.headers_mut();
    *headers = metadata.into_headers();
    headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    request
}

/// Sends `request` on `channel` once it is ready: the answer's head.
async fn call<C>(
    channel: &mut C,
    request: http::Request<tonic::body::Body>,
) -> std::result::Result<http::Response<C::ResponseBody>, Status>
where
    C: GrpcService<tonic::body::Body>,
{
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    channel
        .call(request)
        .await
        .map_err(|e| Status::from_error(e.into()))
}

/// An upload's answer without its message: not a stored upload.
fn no_message() -> Status {
    Status::internal("the worker answered an upload with no message")
}

/// The answer to a whole upload: gRPC's answer of one empty message
/// (`PutBufferResponse {}`: no compression, length 0), then status OK.
pub(crate) fn empty_answer() -> http::Response<tonic::body::Body> {
    grpc_answer(
        [
            Frame::data(Bytes::from_static(&[0; GRPC_HEADER_BYTES])),
            Frame::trailers(ok_trailers()),
        ]
        .into(),
    )
}

/// gRPC's trailers of a call that succeeded.
fn ok_trailers() -> http::HeaderMap {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    trailers
}

/// A gRPC answer whose body is `frames`.
fn grpc_answer(frames: VecDeque<Frame<Bytes>>) -> http::Response<tonic::body::Body> {
    let mut answer = http::Response::new(tonic::body::Body::new(Frames(frames)));
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    answer
}

/// The answer to a download of `data`: `BufferChunk` messages of at most
/// [`CHUNK_BYTES`] of data, each sent as its prefix ([`prefix`]) and then
/// its bytes as they are (views of `data`, no copies); the first announces
/// the total. Then status OK.
pub(crate) fn download_answer(data: Bytes) -> http::Response<tonic::body::Body> {
    let mut total_bytes = data.len() as u64;
    let mut frames = VecDeque::new();
    for chunk in chunks(data) {
        let fields = BufferChunk {
            data: Bytes::new(),
            total_bytes: std::mem::take(&mut total_bytes),
        };
        frames.push_back(Frame::data(prefix(&fields, chunk.len())));
        if !chunk.is_empty() {
            frames.push_back(Frame::data(chunk));
        }
    }
    frames.push_back(Frame::trailers(ok_trailers()));
    grpc_answer(frames)
}

/// The body of a unary request: `message` as one gRPC message.
fn unary_body(message: &impl Message) -> tonic::body::Body {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(GRPC_HEADER_BYTES + len);
    out.put_u8(0);
    // A request message of the protocol: a few bytes.
    out.put_u32(len as u32);
    // Cannot fail: `out` has room for the message.
    let _ = message.encode(&mut out);
    tonic::body::Body::new(Frames([Frame::data(out.freeze())].into()))
}

/// The gRPC status of an answer that has none: from its HTTP status, as
/// gRPC's clients map it.
fn status_of_http(status: http::StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(
        code,
        format!("the worker answered HTTP {status} without a gRPC status"),
    )
}

/// A download the worker sent malformed (or that does not fit its
/// destination): the worker's fault, not the caller's argument.
fn broken_answer(err: Error) -> Error {
    match err.code() {
        ErrorCode::InvalidArgument | ErrorCode::ResourceExhausted => Error::internal(format!(
            "the worker sent a broken download: {}",
            err.message()
        )),
        _ => err,
    }
}

/// Calls `GetBuffer` for buffer `handle` on `channel` (a tonic `Channel`)
/// with `metadata` (the token and the session), as tonic's generated client
/// calls it, and parses the answer as it arrives: each chunk's fields, then
/// its data as views of the received frames, go to `sink`. A status that is
/// not OK becomes `fail(status)`; a malformed answer or the sink's error ends
/// the call with that error.
pub(crate) async fn get_call<C>(
    mut channel: C,
    metadata: MetadataMap,
    handle: u64,
    sink: &mut impl ChunkSink<BufferChunk>,
    fail: impl Fn(&Status) -> Error,
) -> Result<()>
where
    C: GrpcService<tonic::body::Body>,
    C::ResponseBody: http_body::Body<Data = Bytes>,
    <C::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError>,
{
    let body = unary_body(&GetBufferRequest { handle });
    let request = grpc_request(GET_BUFFER_PATH, metadata, body);
    let answer = call(&mut channel, request).await.map_err(|s| fail(&s))?;
    // A status in the headers is the whole answer ("trailers-only").
    if let Some(status) = Status::from_header_map(answer.headers()) {
        return Err(fail(&match status.code() {
            Code::Ok => Status::internal("the worker answered a download with no data"),
            _ => status,
        }));
    }
    if answer.status() != http::StatusCode::OK {
        return Err(fail(&status_of_http(answer.status())));
    }
    let mut body = std::pin::pin!(answer.into_body());
    let mut parser = ChunkParser::<BufferChunk>::default();
    loop {
        let frame = std::future::poll_fn(|cx| http_body::Body::poll_frame(body.as_mut(), cx)).await;
        let frame = match frame {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Err(fail(&Status::from_error(e.into()))),
            None => {
                return Err(fail(&Status::internal(
                    "a download ended without its status",
                )))
            }
        };
        let trailers = match frame.into_data() {
            Ok(data) => {
                parser.push(data, sink).map_err(broken_answer)?;
                continue;
            }
            Err(frame) => frame.into_trailers(),
        };
        let Ok(trailers) = trailers else { continue };
        return match Status::from_header_map(&trailers) {
            Some(status) if status.code() == Code::Ok => parser.finish().map_err(broken_answer),
            Some(status) => Err(fail(&status)),
            None => Err(fail(&Status::internal(
                "a download's trailers carry no status",
            ))),
        };
    }
}

/// A body of the given frames, in order.
struct Frames(VecDeque<Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// Where [`ChunkParser`] delivers a stream's chunks, in order.
pub(crate) trait ChunkSink<M> {
    /// A chunk's fields other than `data` (left empty), before its data.
    fn fields(&mut self, chunk: M) -> Result<()>;
    /// The next bytes of the current chunk's data.
    fn data(&mut self, bytes: &[u8]) -> Result<()>;
}

/// Where the parser is in the stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Between messages: the next bytes are a gRPC message header.
    #[default]
    Header,
    /// Inside a message, before a field's key.
    Field,
    /// Inside a message's `data` field, with this many bytes of it to come.
    Data(usize),
}

/// Parses a bulk stream (gRPC messages of a [`Chunk`]: a `PutBuffer` request
/// body, a `GetBuffer` answer body) as its frames arrive, with the checks of
/// tonic's decoder and prost's: no
/// compression, messages within [`MAX_MESSAGE_BYTES`], well-formed fields.
/// It holds back only the bytes of a field it has not seen whole (at most
/// [`MAX_FIELDS_BYTES`]); data goes to the sink as it comes.
pub(crate) struct ChunkParser<M> {
    /// Received bytes not parsed yet, in order.
    queue: VecDeque<Bytes>,
    queued: usize,
    state: State,
    /// Bytes of the current message not parsed yet.
    message_left: usize,
    /// The current message's fields other than `data`, encoded.
    fields: Vec<u8>,
    /// Whether the current message's `data` has started (its fields went to
    /// the sink).
    data_seen: bool,
    messages: u64,
    chunk: std::marker::PhantomData<fn(M)>,
}

impl<M> Default for ChunkParser<M> {
    fn default() -> Self {
        ChunkParser {
            queue: VecDeque::new(),
            queued: 0,
            state: State::Header,
            message_left: 0,
            fields: Vec::new(),
            data_seen: false,
            messages: 0,
            chunk: std::marker::PhantomData,
        }
    }
}

/// A varint at the start of `bytes`: its value and length, `None` if `bytes`
/// ends inside it, an error if it is longer than ten bytes or overflows.
fn varint<M: Chunk>(bytes: &[u8]) -> Result<Option<(u64, usize)>> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        if i == 9 && b > 1 {
            return Err(malformed::<M>("a varint overflows 64 bits"));
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 10 {
        return Err(malformed::<M>("a varint is longer than ten bytes"));
    }
    Ok(None)
}

/// The error of a stream that is not well-formed.
fn malformed<M: Chunk>(what: &str) -> Error {
    Error::invalid_argument(format!("malformed {} stream: {what}", M::RPC))
}

impl<M: Chunk> ChunkParser<M> {
    /// Parses the next frame of the body, delivering what it completes.
    pub(crate) fn push(&mut self, frame: Bytes, sink: &mut impl ChunkSink<M>) -> Result<()> {
        if !frame.is_empty() {
            self.queued += frame.len();
            self.queue.push_back(frame);
        }
        while self.step(sink)? {}
        Ok(())
    }

    /// The body ended: it must end between messages, after at least one.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.state != State::Header || self.queued > 0 {
            return Err(malformed::<M>("the stream ended inside a message"));
        }
        if self.messages == 0 {
            return Err(Error::invalid_argument(format!(
                "an empty {} stream",
                M::RPC
            )));
        }
        Ok(())
    }

    /// Parses one thing (a header, a field, a run of data, a message's end);
    /// `false` when it needs more bytes.
    fn step(&mut self, sink: &mut impl ChunkSink<M>) -> Result<bool> {
        match self.state {
            State::Header => {
                if self.queued < GRPC_HEADER_BYTES {
                    return Ok(false);
                }
                let mut header = [0u8; GRPC_HEADER_BYTES];
                self.take_into(&mut header);
                match header[0] {
                    0 => {}
                    1 => {
                        return Err(Error::invalid_argument(format!(
                            "compressed {} messages are not accepted",
                            M::RPC
                        )))
                    }
                    flag => return Err(malformed::<M>(&format!("compression flag {flag}"))),
                }
                let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
                if len > MAX_MESSAGE_BYTES {
                    return Err(Error::resource_exhausted(format!(
                        "a {} message of {len} bytes is over the limit of {MAX_MESSAGE_BYTES}",
                        M::RPC
                    )));
                }
                self.messages += 1;
                self.message_left = len;
                self.fields.clear();
                self.data_seen = false;
                self.state = State::Field;
                Ok(true)
            }
            State::Field if self.message_left == 0 => {
                if !self.data_seen {
                    self.deliver_fields(sink)?;
                }
                self.state = State::Header;
                Ok(true)
            }
            State::Field => self.field(sink),
            State::Data(left) => {
                let mut left = left;
                while left > 0 {
                    let Some(front) = self.queue.front_mut() else {
                        break;
                    };
                    let n = front.len().min(left);
                    sink.data(&front[..n])?;
                    front.advance(n);
                    if front.is_empty() {
                        self.queue.pop_front();
                    }
                    self.queued -= n;
                    self.message_left -= n;
                    left -= n;
                }
                self.state = if left == 0 {
                    State::Field
                } else {
                    State::Data(left)
                };
                Ok(left == 0)
            }
        }
    }

    /// Parses the field that starts here: `data` starts streaming, any other
    /// field is kept (once whole) for the message's fields.
    fn field(&mut self, sink: &mut impl ChunkSink<M>) -> Result<bool> {
        // A key and a length take at most 20 bytes.
        let mut head = [0u8; 20];
        let seen = self.peek(&mut head[..self.message_left.min(20)]);
        let whole = seen == self.message_left.min(20);
        let head = &head[..seen];
        let truncated = || malformed::<M>("a message ends inside a field");
        let Some((key, key_bytes)) = varint::<M>(head)? else {
            return if whole { Err(truncated()) } else { Ok(false) };
        };
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(malformed::<M>(&format!("field number {number}")));
        }
        let length = |at: usize| -> Result<Option<(usize, usize)>> {
            match varint::<M>(&head[at..])? {
                Some((len, n)) => Ok(Some((usize::try_from(len).unwrap_or(usize::MAX), n))),
                None if whole => Err(truncated()),
                None => Ok(None),
            }
        };
        if number == u64::from(M::DATA_FIELD) {
            if key & 7 != WireType::LengthDelimited as u64 {
                return Err(malformed::<M>("`data` is not length-delimited"));
            }
            if self.data_seen {
                return Err(malformed::<M>("a chunk has `data` twice"));
            }
            let Some((len, len_bytes)) = length(key_bytes)? else {
                return Ok(false);
            };
            let header = key_bytes + len_bytes;
            if len > self.message_left - header {
                return Err(truncated());
            }
            self.deliver_fields(sink)?;
            self.data_seen = true;
            self.skip(header);
            self.state = State::Data(len);
            return Ok(true);
        }
        if self.data_seen {
            return Err(malformed::<M>(
                "a chunk has fields after `data` (the spec must come first)",
            ));
        }
        let size = match key & 7 {
            0 => match varint::<M>(&head[key_bytes..])? {
                Some((_, n)) => key_bytes + n,
                None if whole => return Err(truncated()),
                None => return Ok(false),
            },
            1 => key_bytes + 8,
            5 => key_bytes + 4,
            2 => match length(key_bytes)? {
                Some((len, n)) => (key_bytes + n).saturating_add(len),
                None => return Ok(false),
            },
            wire => return Err(malformed::<M>(&format!("wire type {wire}"))),
        };
        if size > self.message_left {
            return Err(truncated());
        }
        if self.fields.len() + size > MAX_FIELDS_BYTES {
            return Err(Error::resource_exhausted(format!(
                "a {} chunk's fields take over {MAX_FIELDS_BYTES} bytes",
                M::RPC
            )));
        }
        if self.queued < size {
            return Ok(false);
        }
        let start = self.fields.len();
        self.fields.resize(start + size, 0);
        let mut kept = std::mem::take(&mut self.fields);
        self.take_into(&mut kept[start..]);
        self.fields = kept;
        Ok(true)
    }

    /// Decodes the current message's fields (checked by prost) for the sink.
    fn deliver_fields(&mut self, sink: &mut impl ChunkSink<M>) -> Result<()> {
        let chunk = M::decode(&self.fields[..])
            .map_err(|e| malformed::<M>(&format!("a chunk does not decode: {e}")))?;
        sink.fields(chunk)
    }

    /// Copies the first `out.len()` queued bytes (or fewer, if fewer are
    /// queued) into `out`; returns how many.
    fn peek(&self, out: &mut [u8]) -> usize {
        let mut n = 0;
        for piece in &self.queue {
            if n == out.len() {
                break;
            }
            let k = piece.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&piece[..k]);
            n += k;
        }
        n
    }

    /// Moves the first `out.len()` queued bytes (all there) into `out`.
    fn take_into(&mut self, out: &mut [u8]) {
        let n = self.peek(out);
        debug_assert_eq!(n, out.len());
        self.skip(n);
    }

    /// Drops the first `n` queued bytes (all there), which belong to the
    /// current message unless they are a header.
    fn skip(&mut self, mut n: usize) {
        if self.state != State::Header {
            self.message_left -= n;
        }
        self.queued -= n;
        while n > 0 {
            let Some(front) = self.queue.front_mut() else {
                return;
            };
            let k = front.len().min(n);
            front.advance(k);
            if front.is_empty() {
                self.queue.pop_front();
            }
            n -= k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

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
        while let Poll::Ready(Some(frame)) =
            http_body::Body::poll_frame(Pin::new(&mut put), &mut cx)
        {
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

        fn poll_ready(
            &mut self,
            _: &mut Context<'_>,
        ) -> Poll<std::result::Result<(), Self::Error>> {
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
}
