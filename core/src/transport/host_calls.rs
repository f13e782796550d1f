//! Host callbacks of programs that run on a worker: the call travels to the
//! controller on the session's control stream, runs there, and the result
//! travels back as a control operation (SPEC §3, LoadedHostCallback).

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, SyncSender};

use bytes::Bytes;
use tonic::Status;

use super::proto::{ControlResponse, HostCallbackCall, HostCallbackResult};
use super::{wire_message, MAX_MESSAGE_BYTES};
use crate::error::{Error, ErrorCode, Result};

/// The most host callbacks one executable may name (a bound on what a
/// request can make the worker allocate).
pub(crate) const MAX_HOST_CALLBACKS: u32 = 1024;

/// The largest input or output of a host callback that crosses hosts: one
/// message, less room for its envelope.
pub(crate) const MAX_CALLBACK_BYTES: usize = MAX_MESSAGE_BYTES - 4096;

/// Where a session's control stream sends messages to its controller.
#[derive(Clone)]
pub(crate) enum ControlSink {
    /// The answers of a gRPC `Control` stream (sent by the network runtime).
    Stream(tokio::sync::mpsc::UnboundedSender<std::result::Result<ControlResponse, Status>>),
    /// A lane, written by whichever thread answers.
    Lane(std::sync::Arc<super::lane::LaneSender>),
}

/// The control stream that a [`ControlSink`] sends on has ended.
#[derive(Debug)]
pub(crate) struct SinkClosed;

impl ControlSink {
    /// Sends `message`, which the controller may be waiting for; an error
    /// ends the stream (a lane says nothing more: its connection closes).
    pub(crate) fn send(
        &self,
        message: std::result::Result<ControlResponse, Status>,
    ) -> std::result::Result<(), SinkClosed> {
        self.send_with_more(message, false)
    }

    /// [`send`](Self::send); `more`: further answers are on their way (the
    /// controller keeps operations in flight), so that a lane may write
    /// several at once rather than each on the sending thread.
    pub(crate) fn send_with_more(
        &self,
        message: std::result::Result<ControlResponse, Status>,
        more: bool,
    ) -> std::result::Result<(), SinkClosed> {
        match self {
            ControlSink::Stream(tx) => tx.send(message).map_err(|_| SinkClosed),
            ControlSink::Lane(lane) => match message {
                Ok(message) => lane
                    .send_message(&message, more)
                    .then_some(())
                    .ok_or(SinkClosed),
                Err(_) => {
                    lane.close();
                    Err(SinkClosed)
                }
            },
        }
    }
}

/// Where the result of a host callback call goes.
type ResultSender = SyncSender<Result<Vec<u8>>>;

/// A worker session's calls to its controller's host callbacks.
#[derive(Default)]
pub(crate) struct PendingCalls {
    /// The open control stream, if any: calls travel on it.
    sink: Option<ControlSink>,
    /// Calls waiting for their result, by call id, with what was sent.
    waiting: HashMap<u64, (ResultSender, HostCallbackCall)>,
    next: u64,
    /// The session's control stream resumes after its connection broke
    /// (protocol [`RESUME_VERSION`](super::RESUME_VERSION)): calls wait
    /// for the connection that resumes it, and go out again on it (the
    /// controller runs each call id once).
    resumes: bool,
    /// A control stream was attached once: a stream that resumes exists.
    attached: bool,
}

impl PendingCalls {
    /// The calls of a session whose control stream `resumes` or not.
    pub fn new(resumes: bool) -> PendingCalls {
        PendingCalls {
            resumes,
            ..PendingCalls::default()
        }
    }

    /// The control stream opened: calls travel on `sink` from now on, and
    /// those waiting (sent on a connection that broke, or made while none
    /// was open) go out again on it, in order.
    pub fn attach(&mut self, sink: ControlSink) {
        let mut again: Vec<_> = self.waiting.values().map(|(_, call)| call).collect();
        again.sort_unstable_by_key(|call| call.call);
        for call in again {
            if sink.send(Ok(call_message(call.clone()))).is_err() {
                // Broke again: the next connection sends them.
                break;
            }
        }
        self.sink = Some(sink);
        self.attached = true;
    }

    /// The control stream's connection ended: calls wait for the one that
    /// resumes it, or, for a stream that does not resume, fail (their
    /// waiters see the dropped sender).
    pub fn detach(&mut self) {
        self.sink = None;
        if !self.resumes {
            self.waiting.clear();
        }
    }

    /// Sends a call of host callback `index` of `executable`; the returned
    /// waiter gets the result.
    pub fn start(&mut self, executable: u64, index: u32, input: &[u8]) -> Result<Waiter> {
        if input.len() > MAX_CALLBACK_BYTES {
            return Err(Error::resource_exhausted(format!(
                "a host callback input of {} bytes is over the {MAX_CALLBACK_BYTES}-byte limit \
                 of a call that crosses hosts",
                input.len()
            )));
        }
        if self.sink.is_none() && !(self.resumes && self.attached) {
            return Err(Error::unavailable(
                "the controller has no control stream open to take host callbacks",
            ));
        }
        self.next += 1;
        let call = HostCallbackCall {
            call: self.next,
            executable,
            index,
            input: Bytes::copy_from_slice(input),
        };
        let sent = match &self.sink {
            Some(sink) => sink.send(Ok(call_message(call.clone()))).is_ok(),
            None => false,
        };
        if !(sent || self.resumes && self.attached) {
            return Err(Error::unavailable("the controller's control stream closed"));
        }
        // Unsent, it goes out on the connection that resumes the stream.
        let (tx, rx) = sync_channel(1);
        self.waiting.insert(call.call, (tx, call));
        Ok(Waiter(rx))
    }

    /// Hands the controller's `result` to the call waiting for it.
    pub fn finish(&mut self, result: HostCallbackResult) -> Result<()> {
        let (waiter, _) = self.waiting.remove(&result.call).ok_or_else(|| {
            Error::invalid_argument(format!("no host callback call {} is waiting", result.call))
        })?;
        let outcome = if result.code == 0 {
            Ok(result.output.to_vec())
        } else {
            let code = ErrorCode::from_u32(result.code).unwrap_or(ErrorCode::Internal);
            Err(Error::new(code, result.message).context("host callback on the controller"))
        };
        // The caller may have given up (its session closed): nobody to tell.
        let _ = waiter.send(outcome);
        Ok(())
    }
}

/// The message that carries `call` to the controller.
fn call_message(call: HostCallbackCall) -> ControlResponse {
    ControlResponse {
        host_callback: Some(call),
        ..ControlResponse::default()
    }
}

/// The result of a host callback call, once the controller sends it.
pub(crate) struct Waiter(std::sync::mpsc::Receiver<Result<Vec<u8>>>);

impl Waiter {
    /// Blocks until the result comes, or the session or its control stream
    /// ends (`unavailable`).
    pub fn wait(self) -> Result<Vec<u8>> {
        self.0.recv().unwrap_or_else(|_| {
            Err(Error::unavailable(
                "the controller went away before it answered the host callback",
            ))
        })
    }
}

/// The result operation for a call: the callback's output, or its error.
pub(crate) fn result_of(call: u64, outcome: Result<Vec<u8>>) -> HostCallbackResult {
    let outcome = outcome.and_then(|output| {
        if output.len() > MAX_CALLBACK_BYTES {
            Err(Error::resource_exhausted(format!(
                "a host callback result of {} bytes is over the {MAX_CALLBACK_BYTES}-byte limit \
                 of a call that crosses hosts",
                output.len()
            )))
        } else {
            Ok(output)
        }
    });
    match outcome {
        Ok(output) => HostCallbackResult {
            call,
            output: output.into(),
            ..HostCallbackResult::default()
        },
        Err(e) => HostCallbackResult {
            call,
            code: e.code() as u32,
            message: wire_message(&e),
            output: Bytes::new(),
        },
    }
}
