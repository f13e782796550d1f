//! A session's control stream across the connections it travels on: which
//! operation comes next, where its answers go now, and, from protocol
//! version [`RESUME_VERSION`], the final answers the controller has not yet
//! said it received, which a connection that resumes the stream (after the
//! link broke) gets again. Operations are taken once, in order, whatever
//! connection brings them: one that came twice is not run twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tonic::Status;

use super::lock;
use crate::error::{Error, Result};
use crate::transport::host_calls::{ControlSink, SinkClosed};
use crate::transport::proto::ControlResponse;
use crate::transport::RESUME_VERSION;

/// One session's control stream (see the module docs). Every answer of the
/// session goes through it.
pub(crate) struct SessionStream {
    state: std::sync::Mutex<State>,
    /// Increases with each connection attached: the loop of an earlier one
    /// takes no more operations.
    generation: AtomicU64,
    /// Whether final answers are kept for a resumed stream (the session's
    /// protocol version resumes).
    keeps: bool,
}

struct State {
    /// The `seq` of the next operation to take.
    expected: u64,
    /// Where answers go: the connection attached last, while it is open.
    sink: Option<ControlSink>,
    /// Final answers the controller may not have, by `seq`.
    kept: HashMap<u64, ControlResponse>,
    /// A connection was attached once.
    opened: bool,
}

/// Whether `answer` ends its operation (finished, or failed), so that the
/// controller must get it even across a broken connection.
fn is_final(answer: &ControlResponse) -> bool {
    answer.host_callback.is_none() && (answer.finished || answer.code != 0)
}

impl SessionStream {
    /// The control stream of a session of protocol `version`.
    pub(super) fn new(version: u32) -> Arc<SessionStream> {
        Arc::new(SessionStream {
            state: std::sync::Mutex::new(State {
                expected: 1,
                sink: None,
                kept: HashMap::new(),
                opened: false,
            }),
            generation: AtomicU64::new(0),
            keeps: version >= RESUME_VERSION,
        })
    }

    /// Attaches a connection of the stream, whose answers go to `sink` from
    /// now on; returns its generation. The first connection opens the
    /// stream; a later one must `resume` it (`failed_precondition`
    /// otherwise): it first gets a `resumed` answer naming the last
    /// operation taken, then every final answer kept.
    pub(super) fn attach(&self, sink: ControlSink, resume: bool) -> Result<u64> {
        let mut state = lock(&self.state);
        if resume && !self.keeps {
            return Err(Error::failed_precondition(
                "this session's protocol version does not resume its control stream",
            ));
        }
        if state.opened && !resume {
            return Err(Error::failed_precondition(
                "the session's control stream is open already: another connection resumes it",
            ));
        }
        if !state.opened && resume {
            return Err(Error::failed_precondition(
                "the session's control stream was never opened: there is nothing to resume",
            ));
        }
        state.opened = true;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if resume {
            // Under the lock: no answer overtakes these on the new sink.
            let taken = ControlResponse {
                seq: state.expected - 1,
                resumed: true,
                ..Default::default()
            };
            let mut kept: Vec<&ControlResponse> = state.kept.values().collect();
            kept.sort_by_key(|answer| answer.seq);
            let sent = std::iter::once(&taken)
                .chain(kept)
                .try_for_each(|answer| sink.send_with_more(Ok(answer.clone()), true));
            if sent.is_err() {
                return Err(Error::unavailable(
                    "the connection resuming the control stream closed",
                ));
            }
        }
        state.sink = Some(sink);
        Ok(generation)
    }

    /// Whether connection `generation` is the one attached last.
    pub(super) fn is_current(&self, generation: u64) -> bool {
        self.generation.load(Ordering::SeqCst) == generation
    }

    /// The connection `generation` ended: answers wait for the next one
    /// (kept) or go nowhere.
    pub(super) fn detach(&self, generation: u64) {
        let mut state = lock(&self.state);
        if self.is_current(generation) {
            state.sink = None;
        }
    }

    /// Takes operation `seq` from connection `generation`: `Ok(true)` when it
    /// is the next one, `Ok(false)` when a later connection took over the
    /// stream (this one takes nothing more), `invalid_argument` out of order.
    pub(super) fn take(&self, generation: u64, seq: u64) -> Result<bool> {
        let mut state = lock(&self.state);
        if !self.is_current(generation) {
            return Ok(false);
        }
        if seq != state.expected {
            return Err(Error::invalid_argument(format!(
                "control operation {seq} out of order (expected {})",
                state.expected
            )));
        }
        state.expected += 1;
        Ok(true)
    }

    /// The controller received the final answers of operations `seqs`.
    pub(super) fn received(&self, seqs: &[u64]) {
        if seqs.is_empty() || !self.keeps {
            return;
        }
        let mut state = lock(&self.state);
        for seq in seqs {
            state.kept.remove(seq);
        }
    }

    /// How many final answers wait for the controller to say it has them.
    pub(super) fn kept(&self) -> usize {
        lock(&self.state).kept.len()
    }

    /// Sends `message` on the connection attached now (keeping it first
    /// when it is a final answer); `more`: further answers follow (see
    /// [`ControlSink::send_with_more`]). A final answer with no connection
    /// attached waits for the next (`Ok`); any other message is lost then
    /// (`SinkClosed`).
    pub(crate) fn send_with_more(
        &self,
        message: std::result::Result<ControlResponse, Status>,
        more: bool,
    ) -> std::result::Result<(), SinkClosed> {
        let (sink, kept) = {
            let mut state = lock(&self.state);
            let kept = match &message {
                Ok(answer) if self.keeps && is_final(answer) => {
                    state.kept.insert(answer.seq, answer.clone());
                    true
                }
                _ => false,
            };
            (state.sink.clone(), kept)
        };
        match sink {
            Some(sink) => {
                sink.send_with_more(message, more)
                    .or(if kept { Ok(()) } else { Err(SinkClosed) })
            }
            None if kept => Ok(()),
            None => Err(SinkClosed),
        }
    }

    /// What tells the controller that the session ended (for a session
    /// whose stream resumes: its controller would otherwise connect again
    /// until the session timeout is up).
    pub(super) fn goodbye(&self) -> Option<ControlResponse> {
        self.keeps.then(|| ControlResponse {
            session_ended: true,
            code: crate::error::ErrorCode::Unavailable as u32,
            message: "the worker ended the session (it stops, or the session was closed or \
                      timed out)"
                .into(),
            ..Default::default()
        })
    }

    /// [`send_with_more`](Self::send_with_more), when nothing follows.
    pub(crate) fn send(
        &self,
        message: std::result::Result<ControlResponse, Status>,
    ) -> std::result::Result<(), SinkClosed> {
        self.send_with_more(message, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink whose messages go to the returned receiver.
    fn sink() -> (
        ControlSink,
        tokio::sync::mpsc::UnboundedReceiver<std::result::Result<ControlResponse, Status>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (ControlSink::Stream(tx), rx)
    }

    fn drain(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<std::result::Result<ControlResponse, Status>>,
    ) -> Vec<ControlResponse> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter_map(std::result::Result::ok)
            .collect()
    }

    fn finished(seq: u64) -> ControlResponse {
        ControlResponse {
            seq,
            finished: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_resumed_stream_gets_the_last_operation_taken_and_every_final_answer_not_received() {
        let stream = SessionStream::new(RESUME_VERSION);
        let (first, mut first_rx) = sink();
        let one = stream.attach(first, false).unwrap();
        for seq in 1..=4 {
            assert!(stream.take(one, seq).unwrap());
        }
        // Operation 5 out of order is refused; the stream goes on.
        assert!(stream.take(one, 6).is_err());
        for seq in [1, 2, 3] {
            stream.send(Ok(finished(seq))).unwrap();
        }
        // A taken answer (not final) is not kept.
        stream
            .send(Ok(ControlResponse {
                seq: 4,
                ..Default::default()
            }))
            .unwrap();
        assert_eq!(drain(&mut first_rx).len(), 4);
        stream.received(&[1]);
        assert_eq!(stream.kept(), 2);

        // The connection broke: a final answer waits for the next one.
        stream.detach(one);
        drop(first_rx);
        stream.send(Ok(finished(4))).unwrap();
        assert!(stream.send(Ok(ControlResponse::default())).is_err());

        let (second, mut second_rx) = sink();
        let two = stream.attach(second, true).unwrap();
        let replayed = drain(&mut second_rx);
        assert!(replayed[0].resumed);
        assert_eq!(replayed[0].seq, 4, "the last operation taken");
        let seqs: Vec<u64> = replayed[1..].iter().map(|a| a.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);

        // The earlier connection takes nothing more; the new one goes on.
        assert!(!stream.take(one, 5).unwrap());
        assert!(stream.take(two, 5).unwrap());
        stream.received(&[2, 3, 4]);
        assert_eq!(stream.kept(), 0);
    }

    #[test]
    fn a_stream_opens_once_and_an_older_protocol_keeps_nothing() {
        let stream = SessionStream::new(RESUME_VERSION);
        assert!(stream.attach(sink().0, true).is_err(), "nothing to resume");
        stream.attach(sink().0, false).unwrap();
        assert!(stream.attach(sink().0, false).is_err(), "open already");

        let old = SessionStream::new(RESUME_VERSION - 1);
        let (tx, _rx) = sink();
        old.attach(tx, false).unwrap();
        old.send(Ok(finished(1))).unwrap();
        assert_eq!(old.kept(), 0);
        assert!(old.attach(sink().0, true).is_err());
    }
}
