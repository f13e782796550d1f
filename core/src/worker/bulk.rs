//! The worker's end of bulk data: `PutBuffer` uploads received frame by
//! frame straight into the buffer's memory, and `GetBuffer` downloads sent
//! from the buffer's own memory (see [`bulk`](crate::transport::bulk)).

use bytes::Bytes;
use tonic::codegen::http;
use tonic::{Request, Status};

use super::buffers::{buffer_owning, check_spec, wire_bytes, CheckedSpec};
use super::control::check_new_handles;
use super::service::Service;
use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::prefault::Prefault;
use crate::transport::buffers::{prefer_huge_pages, receive_buffer};
use crate::transport::bulk::{download_answer, empty_answer, ChunkParser, ChunkSink};
use crate::transport::proto::{GetBufferRequest, PutBufferChunk};
use crate::transport::{from_status, to_status, SessionId, StringDecoder};

/// Most bytes of a `GetBuffer` request's message (a handle: a few bytes).
const MAX_GET_REQUEST_BYTES: usize = 1 << 10;

impl Service {
    /// Receives buffer uploads of a `PutBuffer` body as its frames arrive
    /// (see [`bulk`](crate::transport::bulk)): each chunk's data goes from the received
    /// frame straight into the buffer's memory.
    pub(crate) async fn put_body<B>(&self, id: SessionId, body: B) -> Result<()>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<tonic::codegen::StdError>,
    {
        let mut body = std::pin::pin!(body);
        let mut parser = ChunkParser::default();
        let mut upload = Upload::new(self, id);
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            let frame =
                frame.map_err(|e| crate::transport::from_status(&Status::from_error(e.into())))?;
            // Trailers carry nothing for an upload.
            if let Ok(data) = frame.into_data() {
                parser.push(data, &mut upload)?;
            }
        }
        parser.finish()?;
        upload.finish()
    }

    /// Serves a `PutBuffer` request that arrives as HTTP/2 (the worker's route
    /// for it): the session's uploads, answered as gRPC answers.
    pub(super) async fn put_http(
        self,
        request: http::Request<tonic::body::Body>,
    ) -> http::Response<tonic::body::Body> {
        let (parts, body) = request.into_parts();
        let request = Request::from_http(http::Request::from_parts(parts, ()));
        let result = match self.session(&request) {
            Ok(id) => self.put_body(id, body).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => empty_answer(),
            Err(e) => to_status(&e).into_http(),
        }
    }
}

impl Service {
    /// Serves a `GetBuffer` request that arrives as HTTP/2 (the worker's route
    /// for it): the buffer's bytes, sent from its memory without copies.
    pub(super) async fn get_http(
        self,
        request: http::Request<tonic::body::Body>,
    ) -> http::Response<tonic::body::Body> {
        let (parts, body) = request.into_parts();
        let request = Request::from_http(http::Request::from_parts(parts, ()));
        let mut offset = 0;
        let result = async {
            let handle = async {
                let request = read_get_request(body).await?;
                offset = request.offset;
                Ok(request.handle)
            };
            let (id, handle) = self.source_of(&request, handle).await?;
            self.download(id, handle).await
        };
        let data = result.await.and_then(|data| {
            // A download that starts again asks for the rest (a grant's
            // copy, whose message is not read, always starts at 0).
            match usize::try_from(offset).ok().filter(|&o| o <= data.len()) {
                Some(offset) => Ok((data, offset)),
                None => Err(Error::invalid_argument(format!(
                    "a download from byte {offset} of a {}-byte buffer",
                    data.len()
                ))),
            }
        });
        match data {
            Ok((data, offset)) => download_answer(data, offset),
            Err(e) => to_status(&e).into_http(),
        }
    }

    /// Buffer `handle` of session `id` as it travels, once it is ready: a
    /// dense buffer's own memory (kept alive, and held, until the last of it
    /// is sent), a string buffer's encoding.
    pub(crate) async fn download(&self, id: SessionId, handle: u64) -> Result<Bytes> {
        let buffer = self.with_session(id, |session| {
            session
                .buffers
                .get(&handle)
                .cloned()
                .ok_or_else(|| Error::not_found(format!("no buffer {handle} in this session")))
        })?;
        let (ready, readied) = tokio::sync::oneshot::channel();
        buffer.ready_event().when_ready(move |status| {
            let _ = ready.send(status);
        });
        readied
            .await
            .map_err(|_| Error::internal("a buffer's readiness was dropped"))??;
        if let Some(bytes) = buffer.shared_bytes()? {
            return Ok(bytes);
        }
        // Strings: encoded on the blocking pool, not on a network thread.
        let data = tokio::task::spawn_blocking(move || wire_bytes(&buffer))
            .await
            .map_err(|e| Error::internal(format!("the encoding task failed: {e}")))??;
        Ok(Bytes::from(data))
    }
}

/// The one message of a `GetBuffer` request body.
async fn read_get_request(body: tonic::body::Body) -> Result<GetBufferRequest> {
    use tonic::codec::Codec;
    let decoder =
        tonic_prost::ProstCodec::<GetBufferRequest, GetBufferRequest>::default().decoder();
    let mut messages =
        tonic::codec::Streaming::new_request(decoder, body, None, Some(MAX_GET_REQUEST_BYTES));
    messages
        .message()
        .await
        .map_err(|s| from_status(&s))?
        .ok_or_else(|| Error::invalid_argument("a GetBuffer request without its message"))
}

/// An upload in progress: the buffer a `PutBuffer` stream fills, made by its
/// first chunk and kept by the session once the stream ends whole.
struct Upload<'a> {
    service: &'a Service,
    id: SessionId,
    /// The handle, spec and what arrived so far, once the first chunk came.
    target: Option<(u64, CheckedSpec, Received)>,
}

/// What an upload received so far.
enum Received {
    /// A dense buffer's bytes, and the helper that faults its fresh memory in
    /// ahead of them (first: dropped, and stopped, before the bytes).
    Dense(Option<Prefault>, Vec<u8>),
    /// A string buffer's elements, decoded as they arrive.
    Strings(StringDecoder),
}

impl<'a> Upload<'a> {
    fn new(service: &'a Service, id: SessionId) -> Upload<'a> {
        Upload {
            service,
            id,
            target: None,
        }
    }

    /// The stream ended: the buffer, if whole, joins the session.
    fn finish(self) -> Result<()> {
        let Some((handle, spec, received)) = self.target else {
            return Err(Error::invalid_argument("an empty PutBuffer stream"));
        };
        let client = &self.service.0.client;
        let buffer = match received {
            Received::Dense(prefault, data) => {
                drop(prefault);
                buffer_owning(client, &spec, data)
            }
            Received::Strings(decoder) => decoder.finish().map(|elements| {
                let memory = spec.memory.clone();
                Buffer::of_strings(client, elements, &spec.dims, &spec.device, memory)
            }),
        }
        .map_err(|e| e.context(format!("buffer {handle}")))?;
        self.service.with_session(self.id, |session| {
            check_new_handles(session, &[handle])?;
            session.buffers.insert(handle, buffer);
            Ok(())
        })
    }
}

impl ChunkSink<PutBufferChunk> for Upload<'_> {
    fn fields(&mut self, chunk: PutBufferChunk) -> Result<()> {
        if let Some((handle, _, _)) = &self.target {
            if chunk.spec.is_some() || (chunk.handle != 0 && chunk.handle != *handle) {
                return Err(Error::invalid_argument(
                    "only the first chunk of a PutBuffer stream names the buffer",
                ));
            }
            return Ok(());
        }
        let handle = chunk.handle;
        let spec = chunk.spec.as_ref().ok_or_else(|| {
            Error::invalid_argument("the first chunk must carry the buffer's spec")
        })?;
        let spec = check_spec(&self.service.0.client, spec)?;
        self.service
            .with_session(self.id, |session| check_new_handles(session, &[handle]))?;
        let received = if spec.dtype == DType::String {
            Received::Strings(StringDecoder::new(spec.size))
        } else {
            let mut data = receive_buffer(spec.size)?;
            prefer_huge_pages(&mut data);
            let prefault = Prefault::start(data.as_mut_ptr(), data.capacity());
            Received::Dense(prefault, data)
        };
        self.target = Some((handle, spec, received));
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((handle, spec, received)) = &mut self.target else {
            // The parser delivers a chunk's fields before its data.
            return Err(Error::invalid_argument("data before the buffer's spec"));
        };
        match received {
            Received::Strings(decoder) => decoder
                .push(bytes)
                .map_err(|e| e.context(format!("buffer {handle}"))),
            Received::Dense(prefault, data) => {
                if data.len() + bytes.len() > spec.size {
                    return Err(Error::invalid_argument(format!(
                        "buffer {handle} got more than the {} bytes its spec needs",
                        spec.size
                    )));
                }
                data.extend_from_slice(bytes);
                if let Some(prefault) = prefault {
                    prefault.written(data.len());
                }
                Ok(())
            }
        }
    }
}
