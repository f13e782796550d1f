//! The controller's end of bulk data: uploading buffers (from memory or from
//! chunks as they are made) and downloading them, blocking or not, with
//! progress reports.

use std::sync::Arc;

use bytes::Bytes;

use super::{Completion, Inner, Progress, RemoteSession};
use crate::error::{Error, Result};
use crate::transport::buffers::chunks;
use crate::transport::bulk::{get_call, put_call, ChunkSink, PutBody};
use crate::transport::proto::{BufferChunk, BufferSpec};
use crate::transport::runtime;

impl RemoteSession {
    /// `put_buffer_with_progress` (tests only) without
    /// blocking: `done` runs with the outcome on a network thread.
    /// [`UploadStop::stop`] ends it early: `done` gets `cancelled`, and the
    /// worker drops what it received.
    pub fn put_buffer_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        data: Bytes,
        progress: Option<Progress>,
        done: Completion,
    ) -> UploadStop {
        let total = data.len() as u64;
        let data = tokio_stream::iter(chunks(data));
        self.put_stream_then(handle, spec, total, data, progress, done)
    }

    /// Uploads buffer `handle` of `total` bytes from chunks that arrive on
    /// `chunks` (at least one; each at most
    /// [`CHUNK_BYTES`](crate::transport::CHUNK_BYTES)), sending each as soon as
    /// it comes, so that whoever produces them overlaps with the network.
    /// `done` runs with the outcome on a network thread; fewer or more bytes
    /// than `total` fail the upload on the worker. [`UploadStop::stop`] ends
    /// it early, as for [`put_buffer_then`](Self::put_buffer_then).
    pub fn put_buffer_chunks_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        total: u64,
        chunks: tokio::sync::mpsc::Receiver<Bytes>,
        progress: Option<Progress>,
        done: Completion,
    ) -> UploadStop {
        let data = tokio_stream::wrappers::ReceiverStream::new(chunks);
        self.put_stream_then(handle, spec, total, data, progress, done)
    }

    fn put_stream_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        total: u64,
        data: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
        progress: Option<Progress>,
        done: Completion,
    ) -> UploadStop {
        // On a thread of the blocking pool: the compiler cannot prove tonic's
        // client-streaming future `Send`, so it cannot be spawned as a task.
        let inner = self.inner.clone();
        let stopped_error = format!("the upload to worker {} was stopped", inner.address);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        match runtime() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || {
                    let upload = put_future(inner, handle, spec, total, data, progress);
                    let upload = async {
                        tokio::select! {
                            outcome = upload => outcome,
                            Ok(()) = stopped => Err(Error::cancelled(stopped_error)),
                        }
                    };
                    done(tokio::runtime::Handle::current().block_on(upload));
                });
            }
            Err(err) => done(Err(err)),
        }
        UploadStop(stop)
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

/// Stops an upload that runs without blocking. Dropping it lets the upload
/// run to its end.
#[must_use = "dropping an UploadStop lets the upload run to its end"]
pub struct UploadStop(tokio::sync::oneshot::Sender<()>);

impl UploadStop {
    /// Ends the upload now, if it has not ended: its request is reset (the
    /// worker drops what it received, and keeps no handle), and its
    /// completion gets `cancelled`.
    pub fn stop(self) {
        // An upload that already ended no longer listens.
        let _ = self.0.send(());
    }
}

/// Uploads buffer `handle` (`total` bytes, arriving as `data` chunks: at least
/// one, each under the message limit), reporting progress.
pub(super) async fn put_future(
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

/// Streams buffer `handle` into `sink(total, chunk)`: each piece of data as
/// it arrives, a view of the received frame (see
/// [`get_call`](crate::transport::bulk::get_call)).
pub(super) async fn get_future(
    inner: Arc<Inner>,
    handle: u64,
    sink: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    inner.alive()?;
    let (metadata, _, ()) = inner.bulk_request(()).into_parts();
    let mut sink = Download { total: 0, sink };
    let download = get_call(
        inner.channel.clone(),
        metadata,
        handle,
        &mut sink,
        |status| inner.fail(status),
    );
    inner.unless_lost(download).await
}

/// A download's sink, with the total the worker announced.
struct Download<F> {
    total: u64,
    sink: F,
}

impl<F: FnMut(u64, &[u8]) -> Result<()>> ChunkSink<BufferChunk> for Download<F> {
    fn fields(&mut self, chunk: BufferChunk) -> Result<()> {
        if chunk.total_bytes > 0 {
            self.total = chunk.total_bytes;
        }
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> Result<()> {
        (self.sink)(self.total, bytes)
    }
}
