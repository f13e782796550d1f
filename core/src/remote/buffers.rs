//! Buffers held by a worker: deleting the worker's copy on drop, copies from
//! worker to worker, and downloads of bytes and strings.

use std::sync::Arc;

use bytes::Bytes;

use super::{RemoteHost, UploadTarget};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::future::Progress;
use crate::transport::reports_progress;
use crate::transport::{StringDecoder, COPY_VERSION, GRANT_ANSWER_VERSION};

/// A buffer held by a worker, under `handle` of the client's session there.
/// Dropping it deletes the worker's copy.
pub(crate) struct RemoteBuffer {
    pub host: Arc<RemoteHost>,
    pub handle: u64,
    /// The buffer's bytes, when this process has them: the worker sent them
    /// with the answer of the execution that made it (see
    /// [`INLINE_OUTPUTS_VERSION`](crate::transport::INLINE_OUTPUTS_VERSION)),
    /// or this process uploaded them in one control operation (see
    /// [`SMALL_PUT_VERSION`](crate::transport::SMALL_PUT_VERSION)). A read
    /// then needs no round trip.
    pub inline: Option<Bytes>,
}

impl Drop for RemoteBuffer {
    fn drop(&mut self) {
        self.host.session.delete_buffers_later(&[self.handle]);
    }
}

/// How long the grant of a copy between workers lives: the destination uses
/// it at once, when it takes the fetch.
const GRANT_TTL: std::time::Duration = std::time::Duration::from_secs(60);

impl RemoteBuffer {
    /// Whether a buffer of `dtype` here copies to worker `to` directly: both
    /// speak [`COPY_VERSION`] (strings go through this process).
    pub fn copies_directly_to(&self, to: &Arc<RemoteHost>, dtype: DType) -> bool {
        dtype != DType::String
            && !Arc::ptr_eq(&self.host, to)
            && self.host.session.version() >= COPY_VERSION
            && to.session.version() >= COPY_VERSION
    }

    /// Copies this buffer into `target` (a pending buffer of a device of
    /// worker `to`; see [`copies_directly_to`](Self::copies_directly_to)):
    /// this buffer's worker grants one read of it, and `to` reads it from
    /// there, so the data never passes this process. `progress` follows the
    /// bytes that arrived at `to`; `keep` lives until the copy ends.
    pub fn copy_to_worker(
        &self,
        to: &Arc<RemoteHost>,
        target: impl UploadTarget,
        progress: Option<Progress>,
        keep: impl Send + 'static,
    ) {
        let Some((handle, spec, done)) = to.start_upload(target, None) else {
            return;
        };
        let mut grant = [0u8; 32];
        if let Err(e) = getrandom::fill(&mut grant) {
            return done(Err(Error::internal(format!(
                "no randomness for a grant: {e}"
            ))));
        }
        let (source, to) = (self.host.clone(), to.clone());
        let fetch = move |granted: Result<()>| {
            if let Err(e) = granted {
                return done(Err(e));
            }
            to.session.fetch_buffer_then(
                handle,
                spec,
                &source.session,
                &grant,
                progress,
                Box::new(move |result| {
                    drop(keep);
                    done(result)
                }),
            );
        };
        let session = &self.host.session;
        if session.version() >= GRANT_ANSWER_VERSION {
            // The destination reads once the source holds the grant: a read
            // that came first would be refused (and retried).
            session.grant_read_then(self.handle, &grant, GRANT_TTL, Box::new(fetch));
        } else {
            // An older source may answer the grant only after what follows
            // it finished: both go at once, and the reader retries a refusal.
            session.grant_read_then(self.handle, &grant, GRANT_TTL, Box::new(|_| {}));
            fetch(Ok(()));
        }
    }

    /// Downloads the elements of a string buffer of `count` elements (checked
    /// as they arrive, see [`StringDecoder`]); `done` gets them, on a network
    /// thread. `keep` lives until then (it keeps the worker's copy alive).
    pub fn download_strings(
        &self,
        count: usize,
        progress: Option<Progress>,
        keep: impl Send + 'static,
        done: impl FnOnce(Result<Box<[Box<str>]>>) + Send + 'static,
    ) {
        let decoder = Arc::new(std::sync::Mutex::new(Some(StringDecoder::new(count))));
        let fed = decoder.clone();
        let address = self.host.session.address().to_string();
        let mut received = 0u64;
        let sink = move |total: u64, chunk: &[u8]| {
            let mut decoder = fed.lock().unwrap_or_else(|e| e.into_inner());
            let decoder = decoder
                .as_mut()
                .ok_or_else(|| Error::internal("bytes after the end of a download"))?;
            decoder.push(chunk).map_err(|e| bad_strings(&address, e))?;
            let before = received;
            received += chunk.len() as u64;
            let total = total.max(received);
            if let Some(progress) = progress
                .as_ref()
                .filter(|_| reports_progress(before, received, total))
            {
                progress(received, total);
            }
            Ok(())
        };
        let address = self.host.session.address().to_string();
        self.host.session.get_buffer_then(
            self.handle,
            sink,
            Box::new(move |result| {
                let decoder = decoder.lock().unwrap_or_else(|e| e.into_inner()).take();
                let strings = result.and_then(|()| match decoder {
                    Some(decoder) => decoder.finish().map_err(|e| bad_strings(&address, e)),
                    None => Err(Error::internal("a download of strings finished twice")),
                });
                drop(keep);
                done(strings);
            }),
        );
    }

    /// Downloads the buffer's bytes, which must be exactly `len`, into
    /// `write(offset, chunk)`; `done` gets the outcome. `keep` lives until then
    /// (it keeps the worker's copy, and the destination, alive).
    pub fn download(
        &self,
        len: usize,
        mut write: impl FnMut(usize, &[u8]) + Send + 'static,
        progress: Option<Progress>,
        keep: impl Send + 'static,
        done: Event,
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        if let Some(data) = self.inline.as_ref().filter(|d| d.len() == len) {
            // Sent with the execution (or upload) that made it. A buffer of a
            // lost (or closed) session reads as any other of it: it fails.
            if let Some(err) = self.host.session.lost().error() {
                drop(keep);
                done.set_if_pending(Err(err));
                return;
            }
            write(0, data);
            if let Some(progress) = &progress {
                progress(len as u64, len as u64);
            }
            drop(keep);
            done.set_if_pending(Ok(()));
            return;
        }
        if len <= crate::transport::MAX_INLINE_READ_BYTES {
            // One message on the control stream: no stream of its own to open.
            let address = self.host.session.address().to_string();
            self.host.session.read_small_buffer_then(
                self.handle,
                Box::new(move |result| {
                    let result = result.and_then(|data| {
                        if data.len() != len {
                            return Err(Error::internal(format!(
                                "worker {address} sent {} bytes of a {len}-byte buffer",
                                data.len()
                            )));
                        }
                        write(0, &data);
                        if let Some(progress) = &progress {
                            progress(len as u64, len as u64);
                        }
                        Ok(())
                    });
                    drop(keep);
                    done.set_if_pending(result);
                }),
            );
            return;
        }
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        let address = self.host.session.address().to_string();
        let sink = move |_total: u64, chunk: &[u8]| {
            let at = counter.load(Ordering::Relaxed);
            let end = at
                .checked_add(chunk.len())
                .filter(|end| *end <= len)
                .ok_or_else(|| {
                    Error::internal(format!(
                        "worker {address} sent more than the {len} bytes of the buffer"
                    ))
                })?;
            write(at, chunk);
            counter.store(end, Ordering::Relaxed);
            let (at, end, len) = (at as u64, end as u64, len as u64);
            if let Some(progress) = progress.as_ref().filter(|_| reports_progress(at, end, len)) {
                progress(end, len);
            }
            Ok(())
        };
        let address = self.host.session.address().to_string();
        self.host.session.get_buffer_then(
            self.handle,
            sink,
            Box::new(move |result| {
                let got = received.load(Ordering::Relaxed);
                let result = result.and_then(|()| {
                    if got == len {
                        Ok(())
                    } else {
                        Err(Error::internal(format!(
                            "worker {address} sent {got} bytes of a {len}-byte buffer"
                        )))
                    }
                });
                drop(keep);
                done.set_if_pending(result);
            }),
        );
    }
}

/// The error of a download of strings that a worker sent malformed: a broken
/// worker, not a mistake of the caller.
fn bad_strings(address: &str, err: Error) -> Error {
    Error::internal(format!(
        "worker {address} sent a bad string buffer: {}",
        err.message()
    ))
}
