//! The controller's end of bulk data: uploading buffers (from memory or from
//! chunks as they are made) and downloading them, blocking or not, with
//! progress reports.

use std::sync::Arc;

use bytes::Bytes;

use super::{block_on, Completion, Inner, Progress, RemoteSession};
use crate::error::Result;
use crate::transport::buffers::chunks;
use crate::transport::bulk::{put_call, PutBody};
use crate::transport::proto::{BufferSpec, GetBufferRequest};
use crate::transport::{runtime, MAX_MESSAGE_BYTES};

impl RemoteSession {
    /// Uploads `data` as buffer `handle` of this session, shaped by `spec` (the
    /// bytes, row-major, must be exactly the spec's size; a string buffer's
    /// are its `StringElements`, and need protocol version
    /// [`STRINGS_VERSION`](crate::transport::STRINGS_VERSION)). Streams in chunks of
    /// [`CHUNK_BYTES`](crate::transport::CHUNK_BYTES); the request has no deadline (bulk
    /// data takes what it takes; a dead link fails through keepalive).
    pub fn put_buffer(&self, handle: u64, spec: BufferSpec, data: Bytes) -> Result<()> {
        self.put_buffer_with_progress(handle, spec, data, None)
    }

    /// [`put_buffer`](Self::put_buffer), calling `progress(sent, total)` (bytes)
    /// as each chunk goes to the network, and `(total, total)` once the worker
    /// has the buffer. Called on a network thread: keep it quick.
    pub fn put_buffer_with_progress(
        &self,
        handle: u64,
        spec: BufferSpec,
        data: Bytes,
        progress: Option<Progress>,
    ) -> Result<()> {
        let total = data.len() as u64;
        let data = tokio_stream::iter(chunks(data));
        block_on(put_future(
            self.inner.clone(),
            handle,
            spec,
            total,
            data,
            progress,
        ))?
    }

    /// [`put_buffer_with_progress`](Self::put_buffer_with_progress) without
    /// blocking: `done` runs with the outcome on a network thread.
    pub fn put_buffer_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        data: Bytes,
        progress: Option<Progress>,
        done: Completion,
    ) {
        let total = data.len() as u64;
        let data = tokio_stream::iter(chunks(data));
        self.put_stream_then(handle, spec, total, data, progress, done);
    }

    /// Uploads buffer `handle` of `total` bytes from chunks that arrive on
    /// `chunks` (at least one; each at most
    /// [`CHUNK_BYTES`](crate::transport::CHUNK_BYTES)), sending each as soon as
    /// it comes, so that whoever produces them overlaps with the network.
    /// `done` runs with the outcome on a network thread; fewer or more bytes
    /// than `total` fail the upload on the worker.
    pub fn put_buffer_chunks_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        total: u64,
        chunks: tokio::sync::mpsc::Receiver<Bytes>,
        progress: Option<Progress>,
        done: Completion,
    ) {
        let data = tokio_stream::wrappers::ReceiverStream::new(chunks);
        self.put_stream_then(handle, spec, total, data, progress, done);
    }

    fn put_stream_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        total: u64,
        data: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
        progress: Option<Progress>,
        done: Completion,
    ) {
        // On a thread of the blocking pool: the compiler cannot prove tonic's
        // client-streaming future `Send`, so it cannot be spawned as a task.
        let inner = self.inner.clone();
        match runtime() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || {
                    let upload = put_future(inner, handle, spec, total, data, progress);
                    done(tokio::runtime::Handle::current().block_on(upload));
                });
            }
            Err(err) => done(Err(err)),
        }
    }

    /// Downloads buffer `handle` of this session (waits until it is ready): the
    /// bytes it travels as (see [`put_buffer`](Self::put_buffer)).
    pub fn get_buffer(&self, handle: u64) -> Result<Vec<u8>> {
        self.get_buffer_with_progress(handle, None)
    }

    /// [`get_buffer`](Self::get_buffer), calling `progress(received, total)`
    /// (bytes) after each chunk arrives. Called on a network thread.
    pub fn get_buffer_with_progress(
        &self,
        handle: u64,
        progress: Option<Progress>,
    ) -> Result<Vec<u8>> {
        self.settle()?;
        let mut data = Vec::new();
        let sink = |total: u64, chunk: &[u8]| {
            if data.is_empty() && total > 0 {
                // A hint from the peer: reserve no more than one message ahead
                // of the bytes that really arrive.
                data.reserve(usize::try_from(total).unwrap_or(0).min(MAX_MESSAGE_BYTES));
            }
            data.extend_from_slice(chunk);
            if let Some(progress) = &progress {
                progress(data.len() as u64, total.max(data.len() as u64));
            }
            Ok(())
        };
        block_on(get_future(self.inner.clone(), handle, sink))??;
        Ok(data)
    }

    /// Downloads buffer `handle` without blocking: `sink(total, chunk)` gets
    /// each chunk in order (`total` as the worker announced it), then `done`
    /// the outcome; both run on a network thread. A sink error ends the
    /// download with that error.
    pub fn get_buffer_then(
        &self,
        handle: u64,
        sink: impl FnMut(u64, &[u8]) -> Result<()> + Send + 'static,
        done: Completion,
    ) {
        match runtime() {
            Ok(runtime) => {
                let download = get_future(self.inner.clone(), handle, sink);
                runtime.spawn(async move { done(download.await) });
            }
            Err(err) => done(Err(err)),
        }
    }
}

/// Uploads buffer `handle` (`total` bytes, arriving as `data` chunks: at least
/// one, each under the message limit), reporting progress.
async fn put_future(
    inner: Arc<Inner>,
    handle: u64,
    spec: BufferSpec,
    total: u64,
    data: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
    progress: Option<Progress>,
) -> Result<()> {
    let mut sent = 0u64;
    let report = progress.clone();
    let data = Box::pin(tokio_stream::StreamExt::map(data, move |data: Bytes| {
        sent += data.len() as u64;
        if let Some(report) = &report {
            // Reported when the chunk is handed over; the last report waits
            // for the worker's answer.
            report(sent.min(total.saturating_sub(1)), total);
        }
        data
    }));
    inner.alive()?;
    let (metadata, _, ()) = inner.bulk_request(()).into_parts();
    let call = put_call(
        inner.channel.clone(),
        metadata,
        PutBody::new(handle, spec, data),
    );
    inner
        .unless_lost(async { call.await.map_err(|s| inner.fail(&s)) })
        .await?;
    if let Some(progress) = progress {
        progress(total, total);
    }
    Ok(())
}

/// Streams buffer `handle` into `sink(total, chunk)`.
async fn get_future(
    inner: Arc<Inner>,
    handle: u64,
    mut sink: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    inner.alive()?;
    let mut rpc = inner.rpc.clone();
    let download = async {
        let mut stream = rpc
            .get_buffer(inner.bulk_request(GetBufferRequest { handle }))
            .await
            .map_err(|s| inner.fail(&s))?
            .into_inner();
        let mut total = 0u64;
        while let Some(chunk) = stream.message().await.map_err(|s| inner.fail(&s))? {
            if chunk.total_bytes > 0 {
                total = chunk.total_bytes;
            }
            sink(total, &chunk.data)?;
        }
        Ok(())
    };
    inner.unless_lost(download).await
}
