//! A worker's side of one trace for the whole job: spans kept for the
//! controllers that asked for them (see the module docs of `trace`).
//!
//! Each session that asked holds a [`SpanCollector`]; every span that closes
//! while at least one lives is kept by each of them, up to
//! [`MAX_KEPT_SPANS`], until its controller fetches them. While none lives the
//! span filter turns the span sites off, as a level filter would.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::FieldValue;

/// The most spans a collector keeps between two fetches; later ones are
/// counted as dropped.
pub(crate) const MAX_KEPT_SPANS: usize = 1 << 18;

/// A closed span of this process, as kept for a controller.
#[derive(Debug)]
pub(crate) struct CollectedSpan {
    pub name: &'static str,
    pub category: &'static str,
    /// On this process's trace clock.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// This process's stream it ran on, if any.
    pub stream: Option<u64>,
    /// Its track here: the stream, or the thread's runtime track.
    pub track: u64,
    /// The runtime track's label (`None` for a stream).
    pub track_name: Option<Arc<str>>,
    pub fields: Vec<(&'static str, FieldValue)>,
}

/// The spans kept for one session's controller. Dropping it stops keeping
/// them (and, with the last one, turns the span sites off again).
#[derive(Debug, Default)]
pub(crate) struct SpanCollector {
    spans: Mutex<VecDeque<Arc<CollectedSpan>>>,
    dropped: AtomicU64,
}

/// This process installed the span layer for collection ([`super::init_worker`]).
static CAN_COLLECT: AtomicBool = AtomicBool::new(false);
/// Live collectors.
static COLLECTING: AtomicUsize = AtomicUsize::new(0);
static COLLECTORS: Mutex<Vec<Weak<SpanCollector>>> = Mutex::new(Vec::new());

fn collectors() -> std::sync::MutexGuard<'static, Vec<Weak<SpanCollector>>> {
    COLLECTORS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether any collector lives (one atomic load).
pub(super) fn active() -> bool {
    COLLECTING.load(Ordering::Relaxed) > 0
}

/// Marks this process as able to collect.
pub(super) fn enable() {
    CAN_COLLECT.store(true, Ordering::SeqCst);
}

/// Starts keeping spans for a controller: `None` when this process cannot
/// (it is no worker process, or the application installed its own
/// subscriber).
pub(crate) fn start_collecting() -> Option<Arc<SpanCollector>> {
    if !CAN_COLLECT.load(Ordering::SeqCst) {
        return None;
    }
    let collector = Arc::new(SpanCollector::default());
    collectors().push(Arc::downgrade(&collector));
    if COLLECTING.fetch_add(1, Ordering::SeqCst) == 0 {
        // The span sites were off: let them ask the filter again.
        tracing::callsite::rebuild_interest_cache();
    }
    Some(collector)
}

impl Drop for SpanCollector {
    fn drop(&mut self) {
        collectors().retain(|c| c.strong_count() > 0);
        if COLLECTING.fetch_sub(1, Ordering::SeqCst) == 1 {
            tracing::callsite::rebuild_interest_cache();
        }
    }
}

/// Keeps `span` for every live collector.
pub(super) fn push(span: CollectedSpan) {
    let span = Arc::new(span);
    // Upgraded under the lock, used (and let go: the last one's drop takes
    // the lock) outside it.
    let live: Vec<Arc<SpanCollector>> = collectors().iter().filter_map(Weak::upgrade).collect();
    for collector in live {
        let mut spans = collector.spans.lock().unwrap_or_else(|e| e.into_inner());
        if spans.len() < MAX_KEPT_SPANS {
            spans.push_back(span.clone());
        } else {
            collector.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl SpanCollector {
    /// Takes the oldest kept spans, at most `max`: them, how many spans were
    /// dropped (the collector was full) since the last call, and whether
    /// more are kept.
    pub(crate) fn drain(&self, max: usize) -> (Vec<Arc<CollectedSpan>>, u64, bool) {
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        let n = spans.len().min(max);
        let taken: Vec<_> = spans.drain(..n).collect();
        let more = !spans.is_empty();
        drop(spans);
        (taken, self.dropped.swap(0, Ordering::Relaxed), more)
    }
}
