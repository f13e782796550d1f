//! Blocking conveniences of a session, for tests, benchmarks and tools that
//! drive one worker by hand (the `testing` feature): each waits for its
//! request. The runtime itself uses the non-blocking calls.

use bytes::Bytes;

use super::bulk::{get_future, put_future};
use super::*;
use crate::transport::buffers::{chunks, reports_progress};
use crate::transport::proto::{control_request, BufferSpec, DeleteBuffersRequest, ExecuteRequest};
use crate::transport::MAX_MESSAGE_BYTES;

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
            usize::MAX,
            progress,
        ))?
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
            let before = data.len() as u64;
            data.extend_from_slice(chunk);
            let (received, total) = (data.len() as u64, total.max(data.len() as u64));
            if let Some(progress) = progress
                .as_ref()
                .filter(|_| reports_progress(before, received, total))
            {
                progress(received, total);
            }
            Ok(())
        };
        block_on(get_future(self.inner.clone(), handle, sink))??;
        Ok(data)
    }

    /// One heartbeat, now: `Ok` while the worker holds the session.
    pub fn heartbeat(&self) -> Result<()> {
        let inner = self.inner.clone();
        block_on(async move { inner.heartbeat().await })?
    }

    /// Deletes buffers of this session; `not_found` (and nothing deleted) if any
    /// handle names no buffer.
    pub fn delete_buffers(&self, handles: &[u64]) -> Result<()> {
        self.settle()?;
        let inner = self.inner.clone();
        let request = DeleteBuffersRequest {
            handles: handles.to_vec(),
        };
        block_on(async move {
            inner.alive()?;
            let mut rpc = inner.rpc.clone();
            rpc.delete_buffers(inner.request(request))
                .await
                .map(|_| ())
                .map_err(|s| inner.fail(&s))
        })?
    }

    /// Queues executable `executable` on buffers `inputs` (argument-major),
    /// naming its output buffers `outputs`, on the controller's `stream`
    /// (executions on one stream run in order). Returns once queued.
    pub fn execute(
        &self,
        executable: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
    ) -> Result<()> {
        self.settle()?;
        let inner = self.inner.clone();
        let request = ExecuteRequest {
            executable,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            stream,
        };
        block_on(async move {
            inner.alive()?;
            let mut rpc = inner.rpc.clone();
            rpc.execute(inner.request(request))
                .await
                .map(|_| ())
                .map_err(|s| inner.fail(&s))
        })?
    }

    /// Closes the session on the worker (idempotent).
    pub fn disconnect(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let inner = self.inner.clone();
        block_on(async move {
            let mut rpc = inner.rpc.clone();
            rpc.close_session(inner.request(CloseSessionRequest {}))
                .await
                .map(|_| ())
                .map_err(|s| inner.fail(&s))
        })?
    }

    /// Queues an execution like [`execute`](Self::execute), without waiting
    /// for the worker: it goes on the session's ordered control stream, so
    /// many can be in flight. An execution the worker refuses still makes its
    /// outputs, failed with the reason (reading one raises it); [`flush`](Self::flush)
    /// also reports the first refusal.
    pub fn execute_async(
        &self,
        executable: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
    ) -> Result<()> {
        self.send_control(
            control_request::Op::Execute(ExecuteRequest {
                executable,
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
                stream,
            }),
            None,
        )
    }

    /// Waits until the worker has taken every operation sent on the control
    /// stream; returns the first refusal since the last `flush`, if any.
    pub fn flush(&self) -> Result<()> {
        self.settle()?;
        let control = lock(&self.inner.control).clone();
        match control.and_then(|c| lock(&c.state.failed).take()) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}
