//! The bulk RPCs over HTTP/2: the controller's upload body and its put and
//! get calls, and the worker's answers (a download as each chunk's prefix
//! and then the buffer's own bytes).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use prost::Message;
use tokio_stream::Stream;
use tonic::client::GrpcService;
use tonic::codec::{Codec, Streaming};
use tonic::codegen::http;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use super::{
    chunk_prefix, prefix, ChunkParser, ChunkSink, GET_BUFFER_PATH, GRPC_HEADER_BYTES,
    PUT_BUFFER_PATH,
};
use crate::error::{Error, ErrorCode, Result};
use crate::transport::buffers::chunks;
use crate::transport::proto::{BufferChunk, BufferSpec, GetBufferRequest, PutBufferResponse};
use crate::transport::{CHUNK_BYTES, MAX_MESSAGE_BYTES};

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

/// The answer to a download of `data` from byte `offset` on: `BufferChunk`
/// messages of at most [`CHUNK_BYTES`] of data, each sent as its prefix
/// ([`prefix`]) and then its bytes as they are (views of `data`, no
/// copies); the first announces the whole size. Then status OK.
pub(crate) fn download_answer(data: Bytes, offset: usize) -> http::Response<tonic::body::Body> {
    let mut total_bytes = data.len() as u64;
    let data = data.slice(offset.min(data.len())..);
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

/// Calls `GetBuffer` with `request` (a buffer, from an offset) on `channel` (a tonic `Channel`)
/// with `metadata` (the token and the session), as tonic's generated client
/// calls it, and parses the answer as it arrives: each chunk's fields, then
/// its data as views of the received frames, go to `sink`. A status that is
/// not OK becomes `fail(status)`; a malformed answer or the sink's error ends
/// the call with that error.
pub(crate) async fn get_call<C>(
    mut channel: C,
    metadata: MetadataMap,
    request: GetBufferRequest,
    sink: &mut impl ChunkSink<BufferChunk>,
    fail: impl Fn(&Status) -> Error,
) -> Result<()>
where
    C: GrpcService<tonic::body::Body>,
    C::ResponseBody: http_body::Body<Data = Bytes>,
    <C::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError>,
{
    let body = unary_body(&request);
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
pub(super) struct Frames(pub(super) VecDeque<Frame<Bytes>>);

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
