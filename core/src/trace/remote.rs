//! A controller's side of one trace for the whole job: its workers' spans,
//! fetched by their sessions and written into this process's file, one
//! process per worker (see the module docs of `trace`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::writer::{event_json, Msg};
use super::{FieldValue, RUNTIME_TRACK_BASE, WRITER};

/// The processes of workers' spans are numbered from here up: above any host
/// index of this process's spans.
pub(crate) const REMOTE_PID_BASE: u64 = 1 << 20;
static NEXT_REMOTE_PID: AtomicU64 = AtomicU64::new(REMOTE_PID_BASE);

/// A worker's span as its session received it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RemoteSpan {
    pub name: String,
    pub category: String,
    /// On the worker's trace clock.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The controller's stream it ran for, if any.
    pub stream: Option<u64>,
    /// Else the worker's track (one per thread), and its label.
    pub track: u64,
    pub track_name: String,
    pub fields: Vec<(String, FieldValue)>,
}

/// Something that fetches a worker's spans into the trace (a session).
pub(crate) trait SpanSource: Send + Sync {
    /// Fetches the spans the worker kept so far and writes them; blocks for
    /// at most the session's request timeout per request. Never panics.
    fn collect_spans(&self);
}

static SOURCES: Mutex<Vec<Weak<dyn SpanSource>>> = Mutex::new(Vec::new());

fn sources() -> std::sync::MutexGuard<'static, Vec<Weak<dyn SpanSource>>> {
    SOURCES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lets [`flush`](super::flush) fetch from `source` while it lives.
pub(crate) fn add_source(source: Weak<dyn SpanSource>) {
    let mut sources = sources();
    sources.retain(|s| s.strong_count() > 0);
    sources.push(source);
}

/// Fetches every live source's spans (outside the lock).
pub(super) fn collect_all() {
    let live: Vec<Arc<dyn SpanSource>> = sources().iter().filter_map(Weak::upgrade).collect();
    for source in live {
        source.collect_spans();
    }
}

/// A new process of the trace for a worker, named `name` (its address):
/// its pid, or `None` when this process writes no trace.
pub(crate) fn remote_process(name: &str) -> Option<u64> {
    let tx = WRITER.get()?;
    let pid = NEXT_REMOTE_PID.fetch_add(1, Ordering::Relaxed);
    let _ = tx.send(Msg::Process {
        pid,
        name: name.to_owned(),
    });
    Some(pid)
}

/// Writes the spans of the worker of process `pid` (see [`remote_process`]),
/// whose trace clock reads `offset_ns` more than this process's, on this
/// process's clock.
pub(crate) fn write_remote(pid: u64, offset_ns: i64, spans: &[RemoteSpan]) {
    let Some(tx) = WRITER.get() else { return };
    let mut named = HashSet::new();
    for span in spans {
        // A stream's track is its id, as for this process's spans; anything
        // else goes to the worker's runtime tracks, kept in their range.
        let (tid, track_name) = match span.stream {
            Some(stream) if stream < RUNTIME_TRACK_BASE => (stream, None),
            _ => (
                RUNTIME_TRACK_BASE | (span.track & (RUNTIME_TRACK_BASE - 1)),
                Some(&span.track_name),
            ),
        };
        if named.insert(tid) {
            let name = match track_name {
                Some(name) if !name.is_empty() => name.clone(),
                Some(_) => "runtime".to_owned(),
                None => format!("stream {tid}"),
            };
            let _ = tx.send(Msg::Track { pid, tid, name });
        }
        let start = i128::from(span.start_ns) - i128::from(offset_ns);
        let start = u64::try_from(start.max(0)).unwrap_or(u64::MAX);
        let json = event_json(
            &span.name,
            &span.category,
            start,
            span.duration_ns,
            pid,
            tid,
            span.fields.iter().map(|(n, v)| (n.as_str(), v)),
        );
        let _ = tx.send(Msg::Remote(json));
    }
}
