//! A traced controller's side of `CollectSpans` (protocol version
//! [`SPANS_VERSION`]): when this process writes a trace, a session asks its
//! worker to record spans from the start, measures the worker's clock
//! against this process's, and fetches the spans into the trace file, as
//! one process named by the worker's address: about every second (from the
//! heartbeat timer), on [`trace::flush`] and when the session closes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{block_on, Inner};
use crate::error::{Error, Result};
use crate::trace::{self, FieldValue, RemoteSpan};
use crate::transport::proto::{span_field, CollectSpansRequest, Span};
use crate::transport::SPANS_VERSION;

/// Clock samples taken when the session opens; the one of the shortest round
/// trip sets the offset.
const CLOCK_SAMPLES: usize = 5;
/// The most spans one request asks for.
const SPANS_PER_REQUEST: u32 = 4096;
/// The most requests of one fetch: a worker that always has more cannot
/// hold a flush forever.
const MAX_REQUESTS_PER_FETCH: usize = 64;
/// How often the heartbeat timer fetches, in milliseconds.
const FETCH_EVERY_MS: u64 = 1000;

/// A session's import of its worker's spans.
pub(super) struct Import {
    /// The trace file's process of the worker.
    pid: u64,
    /// The worker's trace clock minus this process's, in nanoseconds.
    offset_ns: i64,
    /// One fetch at a time: a flush waits for the fetch in flight, so that
    /// what it fetched is written before the flush returns.
    fetching: tokio::sync::Mutex<()>,
    /// When the last fetch started (the timer's milliseconds).
    last_ms: AtomicU64,
}

impl Import {
    /// Whether the timer should fetch now (`now_ms` on its clock); claims
    /// the fetch if so.
    pub(super) fn due(&self, now_ms: u64) -> bool {
        let last = self.last_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(last) >= FETCH_EVERY_MS
            && self
                .last_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// When this process writes a trace and the worker speaks
/// [`SPANS_VERSION`]: starts the worker's recording, measures its clock and
/// registers the session with the trace. A worker that cannot record, or a
/// failed request, leaves the session untraced (with a warning for the
/// latter): tracing never fails a connection.
pub(super) fn start(inner: &Arc<Inner>) {
    if inner.version < SPANS_VERSION || !trace::writing() {
        return;
    }
    match measure_clock(inner) {
        Ok(Some(offset_ns)) => {
            let Some(pid) = trace::remote_process(&inner.address) else {
                return;
            };
            let import = Import {
                pid,
                offset_ns,
                fetching: tokio::sync::Mutex::new(()),
                last_ms: AtomicU64::new(0),
            };
            if inner.spans.set(import).is_ok() {
                let source: Arc<dyn trace::SpanSource> = inner.clone();
                trace::add_source(Arc::downgrade(&source));
            }
        }
        Ok(None) => {}
        Err(err) => {
            tracing::warn!(worker = %inner.address, error = %err, "the worker's spans stay out of the trace")
        }
    }
}

/// The worker's clock minus this process's (nanoseconds), from the sample
/// of the shortest round trip; `None` when the worker cannot record spans.
fn measure_clock(inner: &Arc<Inner>) -> Result<Option<i64>> {
    let inner = inner.clone();
    block_on(async move {
        let mut best: Option<(u64, i64)> = None;
        for _ in 0..CLOCK_SAMPLES {
            let mut rpc = inner.rpc.clone();
            let t0 = trace::clock_ns();
            let answer = rpc
                .collect_spans(inner.request(CollectSpansRequest { max_spans: 0 }))
                .await
                .map_err(|s| inner.fail(&s))?
                .into_inner();
            let t1 = trace::clock_ns();
            if !answer.recording {
                return Ok(None);
            }
            let round_trip = t1.saturating_sub(t0);
            let middle = i128::from(t0) + i128::from(round_trip / 2);
            let offset = i128::from(answer.clock_ns) - middle;
            let offset = i64::try_from(offset).map_err(|_| {
                Error::internal(format!("worker {}'s clock is out of range", inner.address))
            })?;
            if best.is_none_or(|(shortest, _)| round_trip < shortest) {
                best = Some((round_trip, offset));
            }
        }
        if let Some((round_trip, offset)) = best {
            // Half the round trip bounds the error of the worker's placement.
            tracing::debug!(
                worker = %inner.address,
                round_trip_ns = round_trip,
                offset_ns = offset,
                "measured the worker's trace clock"
            );
        }
        Ok(best.map(|(_, offset)| offset))
    })?
}

impl Inner {
    /// Fetches the spans the worker kept and writes them into the trace
    /// (nothing for an untraced session). Failures are logged, not returned:
    /// the trace is best effort.
    pub(super) async fn fetch_spans(&self) {
        let Some(import) = self.spans.get() else {
            return;
        };
        let _one = import.fetching.lock().await;
        for _ in 0..MAX_REQUESTS_PER_FETCH {
            let mut rpc = self.rpc.clone();
            let answer = match rpc
                .collect_spans(self.request(CollectSpansRequest {
                    max_spans: SPANS_PER_REQUEST,
                }))
                .await
            {
                Ok(answer) => answer.into_inner(),
                Err(status) => {
                    tracing::debug!(worker = %self.address, %status, "fetching the worker's spans failed");
                    return;
                }
            };
            if answer.dropped > 0 {
                tracing::warn!(
                    worker = %self.address,
                    dropped = answer.dropped,
                    "the worker dropped spans that waited too long to be fetched"
                );
            }
            let spans: Vec<RemoteSpan> = answer.spans.into_iter().map(from_message).collect();
            trace::write_remote(import.pid, import.offset_ns, &spans);
            if !answer.more {
                return;
            }
        }
    }
}

impl trace::SpanSource for Inner {
    fn collect_spans(&self) {
        // From an async runtime's thread this cannot wait: skipped.
        let _ = block_on(self.fetch_spans());
    }
}

/// A span as the worker sent it.
fn from_message(span: Span) -> RemoteSpan {
    RemoteSpan {
        name: span.name,
        category: span.category,
        start_ns: span.start_ns,
        duration_ns: span.duration_ns,
        stream: (span.stream != 0).then_some(span.stream),
        track: span.track,
        track_name: span.track_name,
        fields: span
            .fields
            .into_iter()
            .filter_map(|field| {
                let value = match field.value? {
                    span_field::Value::Text(text) => FieldValue::Text(text),
                    span_field::Value::Int(v) => FieldValue::Int(v),
                    span_field::Value::Uint(v) => FieldValue::Uint(v),
                    span_field::Value::Real(v) => FieldValue::Real(v),
                    span_field::Value::Flag(v) => FieldValue::Flag(v),
                };
                Some((field.name, value))
            })
            .collect(),
    }
}
