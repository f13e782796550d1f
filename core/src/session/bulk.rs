//! The controller's end of bulk data: uploading buffers (from memory or from
//! chunks as they are made) and downloading them, blocking or not, with
//! progress reports.

use std::sync::Arc;

use bytes::Bytes;

use std::sync::atomic::Ordering;

use super::retry::Failed;
use super::{lock, Completion, Inner, Progress, RemoteSession};
use crate::error::{Error, ErrorCode, Result};
use crate::transport::buffers::chunks;
use crate::transport::bulk::{get_call, put_call, ChunkSink, PutBody};
use crate::transport::proto::{BufferChunk, BufferSpec, GetBufferRequest};
use crate::transport::{runtime, RESUME_VERSION};

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
        // Views of `data`: keeping them for a retry costs nothing.
        self.put_stream_then(handle, spec, total, data, usize::MAX, progress, done)
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
        self.put_stream_then(handle, spec, total, data, MAX_KEPT_COPIES, progress, done)
    }

    /// Uploads `data`, keeping at most `kept_at_most` bytes of it to send
    /// again after a broken link (see [`put_future`]).
    #[allow(clippy::too_many_arguments)]
    fn put_stream_then(
        &self,
        handle: u64,
        spec: BufferSpec,
        total: u64,
        data: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
        kept_at_most: usize,
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
                    let upload =
                        put_future(inner, handle, spec, total, data, kept_at_most, progress);
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

/// The most bytes of an upload of chunks copied for it (from memory the
/// caller keeps) that the controller keeps to send again after a broken
/// link: a larger one that breaks fails instead of holding a second copy of
/// itself.
const MAX_KEPT_COPIES: usize = 256 << 20;

/// Uploads buffer `handle` (`total` bytes, arriving as `data` chunks: at least
/// one, each under the message limit), reporting progress. After a broken
/// link the upload starts again from its first chunk: a session that
/// resumes keeps the chunks sent, up to `kept_at_most` bytes, until the
/// worker has the buffer whole (an upload that sent more fails).
pub(super) async fn put_future(
    inner: Arc<Inner>,
    handle: u64,
    spec: BufferSpec,
    total: u64,
    data: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
    kept_at_most: usize,
    progress: Option<Progress>,
) -> Result<()> {
    let keeps = if inner.version >= RESUME_VERSION {
        kept_at_most
    } else {
        0
    };
    let source = Replayed::new(Box::pin(data), keeps);
    let reported = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut attempts = inner.attempts();
    loop {
        let mut sent = 0u64;
        let (report, reported) = (progress.clone(), reported.clone());
        let data = tokio_stream::StreamExt::map(source.replay(), move |data: Bytes| {
            sent += data.len() as u64;
            // Reported when the chunk is handed over (never backwards, when
            // the upload starts again); the last report waits for the
            // worker's answer.
            let at = sent.min(total.saturating_sub(1));
            if let Some(report) = &report {
                if reported.fetch_max(at, Ordering::Relaxed) < at {
                    report(at, total);
                }
            }
            data
        });
        let (metadata, _, ()) = inner.bulk_request(()).into_parts();
        let bulk = inner.bulk.take()?;
        let call = put_call(
            bulk.channel.clone(),
            metadata,
            PutBody::new(handle, spec.clone(), Box::pin(data)),
        );
        let retried = attempts.made() > 0;
        let upload = async {
            let outcome = call.await.map_err(|s| Failed::of(&inner, &s));
            drop(bulk);
            outcome
        };
        match attempts.run(upload).await {
            Ok(()) => break,
            // An upload the worker stored before its answer was lost.
            Err(failed) if retried && failed.code() == ErrorCode::AlreadyExists => break,
            Err(failed) if failed.is_link() && !source.replayable() => {
                return Err(failed.into_error().context(format!(
                    "an upload of more than {} MiB copied chunk by chunk cannot start again",
                    MAX_KEPT_COPIES >> 20
                )));
            }
            Err(failed) => attempts.again(failed).await?,
        }
    }
    if let Some(progress) = progress {
        progress(total, total);
    }
    Ok(())
}

/// The chunks of an upload, for each of its attempts: every attempt gets
/// them all, in order, from the first (those an earlier attempt took are
/// kept, when `keeps`).
struct Replayed {
    shared: Arc<std::sync::Mutex<Chunks>>,
}

struct Chunks {
    source: std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Bytes> + Send>>,
    /// The chunks taken from `source` so far, while they come to at most
    /// `keeps` bytes (`kept_bytes`); past that none, and the upload cannot
    /// start again (`lost_some`).
    kept: Vec<Bytes>,
    kept_bytes: usize,
    keeps: usize,
    lost_some: bool,
    /// `source` ended (it is not polled again).
    ended: bool,
    /// The attempt whose stream takes chunks: an earlier one's stream ends
    /// (its connection may go on sending a request whose answer nobody
    /// waits for), short, so the worker drops what it received.
    attempt: u64,
}

impl Replayed {
    fn new(
        source: std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Bytes> + Send>>,
        keeps: usize,
    ) -> Replayed {
        let chunks = Chunks {
            source,
            kept: Vec::new(),
            kept_bytes: 0,
            keeps,
            lost_some: false,
            ended: false,
            attempt: 0,
        };
        Replayed {
            shared: Arc::new(std::sync::Mutex::new(chunks)),
        }
    }

    /// Whether every chunk taken so far is kept: a new attempt can send
    /// them all.
    fn replayable(&self) -> bool {
        !lock(&self.shared).lost_some
    }

    /// The chunks again, from the first, for a new attempt.
    fn replay(&self) -> Replay {
        let attempt = {
            let mut chunks = lock(&self.shared);
            chunks.attempt += 1;
            chunks.attempt
        };
        Replay {
            shared: self.shared.clone(),
            next: 0,
            attempt,
        }
    }
}

/// One attempt's stream of an upload's chunks (see [`Replayed`]).
struct Replay {
    shared: Arc<std::sync::Mutex<Chunks>>,
    next: usize,
    attempt: u64,
}

impl tokio_stream::Stream for Replay {
    type Item = Bytes;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        let shared = self.shared.clone();
        let mut chunks = lock(&shared);
        if chunks.attempt != self.attempt {
            return std::task::Poll::Ready(None);
        }
        if let Some(chunk) = chunks.kept.get(self.next) {
            let chunk = chunk.clone();
            self.next += 1;
            return std::task::Poll::Ready(Some(chunk));
        }
        if chunks.ended {
            return std::task::Poll::Ready(None);
        }
        let polled = chunks.source.as_mut().poll_next(cx);
        chunks.ended = matches!(polled, std::task::Poll::Ready(None));
        if let std::task::Poll::Ready(Some(chunk)) = &polled {
            if chunks.keeps == 0 || chunks.lost_some {
                // Keeps none.
            } else if chunks.kept_bytes + chunk.len() <= chunks.keeps {
                chunks.kept_bytes += chunk.len();
                chunks.kept.push(chunk.clone());
                self.next += 1;
            } else {
                // Past what it may keep: none (the next attempt could not
                // send the chunks it lets go of).
                chunks.lost_some = true;
                chunks.kept = Vec::new();
                chunks.kept_bytes = 0;
                self.next = 0;
            }
        }
        polled
    }
}

/// Streams buffer `handle` into `sink(total, chunk)`: each piece of data as
/// it arrives, a view of the received frame (see
/// [`get_call`](crate::transport::bulk::get_call)). After a broken link the
/// download goes on from the first byte it had not received.
pub(super) async fn get_future(
    inner: Arc<Inner>,
    handle: u64,
    sink: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut sink = Download {
        total: 0,
        received: 0,
        sink,
    };
    let mut attempts = inner.attempts();
    loop {
        let (metadata, _, ()) = inner.bulk_request(()).into_parts();
        let request = GetBufferRequest {
            handle,
            offset: sink.received,
        };
        let broke = std::sync::atomic::AtomicBool::new(false);
        let fail = |status: &tonic::Status| {
            let failed = Failed::of(&inner, status);
            broke.store(failed.is_link(), Ordering::Relaxed);
            failed.into_error()
        };
        let download = async {
            let bulk = inner.bulk.take().map_err(Failed::answer)?;
            let outcome = get_call(bulk.channel.clone(), metadata, request, &mut sink, fail).await;
            drop(bulk);
            outcome.map_err(|err| match broke.load(Ordering::Relaxed) {
                true => Failed::link(err),
                false => Failed::answer(err),
            })
        };
        match attempts.run(download).await {
            Ok(()) => return Ok(()),
            Err(failed) => attempts.again(failed).await?,
        }
    }
}

/// A download's sink, with the total the worker announced and how many
/// bytes came so far.
struct Download<F> {
    total: u64,
    received: u64,
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
        (self.sink)(self.total, bytes)?;
        self.received += bytes.len() as u64;
        Ok(())
    }
}
