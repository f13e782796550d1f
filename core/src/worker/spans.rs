//! `CollectSpans`: the spans this worker recorded for a session's controller
//! (protocol version [`SPANS_VERSION`](crate::transport::SPANS_VERSION)),
//! named by the controller's streams.

use rustc_hash::FxHashMap;

use super::Service;
use crate::error::Result;
use crate::trace::{self, CollectedSpan, FieldValue};
use crate::transport::proto::{span_field, CollectSpansResponse, Span, SpanField};
use crate::transport::SessionId;

/// The most spans one answer carries, and about the most bytes (well under
/// the protocol's message limit).
const MAX_SPANS_PER_ANSWER: usize = 4096;
const MAX_ANSWER_BYTES: usize = 1 << 20;

impl Service {
    /// The spans kept for session `id` since its last request, at most
    /// `max_spans` (starting the recording on the first request).
    pub(super) fn spans_for(&self, id: SessionId, max_spans: u32) -> Result<CollectSpansResponse> {
        let kept = self.with_session(id, |session| Ok(session.spans.clone()))?;
        let collector = match kept {
            Some(collector) => collector,
            None => {
                // Made outside the table's lock (it may re-register every
                // span site); a request racing this one keeps the first.
                let Some(made) = trace::start_collecting() else {
                    return Ok(CollectSpansResponse {
                        recording: false,
                        clock_ns: trace::clock_ns(),
                        ..Default::default()
                    });
                };
                self.with_session(id, |session| Ok(session.spans.get_or_insert(made).clone()))?
            }
        };
        // The controller's stream of each of this session's streams.
        let streams: FxHashMap<u64, u64> = self.with_session(id, |session| {
            Ok(session
                .streams
                .iter()
                .map(|(theirs, ours)| (ours.id(), *theirs))
                .collect())
        })?;
        let max = (max_spans as usize).min(MAX_SPANS_PER_ANSWER);
        let mut spans = Vec::new();
        let mut bytes = 0;
        let mut dropped = 0;
        let mut more = false;
        while spans.len() < max && bytes < MAX_ANSWER_BYTES {
            let (taken, lost, left) = collector.drain((max - spans.len()).min(256));
            dropped += lost;
            more = left;
            for span in &taken {
                // Work on a stream of another session is not this one's.
                if let Some(message) = to_message(span, &streams) {
                    bytes += estimate(&message);
                    spans.push(message);
                }
            }
            if !left || taken.is_empty() {
                break;
            }
        }
        Ok(CollectSpansResponse {
            recording: true,
            clock_ns: trace::clock_ns(),
            spans,
            more,
            dropped,
        })
    }
}

/// `span` as the controller of the session whose streams are `streams`
/// (ours -> theirs) sees it; `None` for a span on another stream.
fn to_message(span: &CollectedSpan, streams: &FxHashMap<u64, u64>) -> Option<Span> {
    let stream = match span.stream {
        Some(ours) => *streams.get(&ours)?,
        None => 0,
    };
    Some(Span {
        name: span.name.to_owned(),
        category: span.category.to_owned(),
        start_ns: span.start_ns,
        duration_ns: span.duration_ns,
        stream,
        track: if stream == 0 { span.track } else { 0 },
        track_name: match (&span.track_name, stream) {
            (Some(name), 0) => name.to_string(),
            _ => String::new(),
        },
        fields: span
            .fields
            .iter()
            .map(|(name, value)| SpanField {
                name: (*name).to_owned(),
                value: Some(match value {
                    FieldValue::Text(text) => span_field::Value::Text(text.clone()),
                    FieldValue::Int(v) => span_field::Value::Int(*v),
                    FieldValue::Uint(v) => span_field::Value::Uint(*v),
                    FieldValue::Real(v) => span_field::Value::Real(*v),
                    FieldValue::Flag(v) => span_field::Value::Flag(*v),
                }),
            })
            .collect(),
    })
}

/// About how many bytes `span` takes on the wire.
fn estimate(span: &Span) -> usize {
    let fields: usize = span
        .fields
        .iter()
        .map(|f| {
            f.name.len()
                + match &f.value {
                    Some(span_field::Value::Text(text)) => text.len(),
                    _ => 8,
                }
                + 8
        })
        .sum();
    64 + span.name.len() + span.category.len() + span.track_name.len() + fields
}
