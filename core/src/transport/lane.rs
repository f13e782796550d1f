//! The lane: a session's control stream on a plain TCP connection
//! (protocol version [`LANE_VERSION`]).
//!
//! The control stream's messages are small and many; on HTTP/2 each one
//! also pays for framing, flow control and a hand-off to the network
//! runtime on both ends. On a lane, the controller's calling thread writes
//! its operations itself, and a thread that waits for an answer reads it
//! (one thread reads every lane's answers otherwise, see
//! [`lane_reader`](super::lane_reader)); the worker takes operations on a
//! thread of the connection, runs a quick program there too, and writes
//! answers from the thread that finished them.
//!
//! A lane reaches the worker's port like gRPC does: the worker tells the
//! two apart by the first byte (HTTP/2 and TLS never begin with zero). The
//! connection opens with [`LANE_MAGIC`] and a [`LaneHello`] (the token and
//! the session id), which the worker checks before it holds anything for
//! the connection (admission control applies as to any connection); the
//! worker answers with a [`LaneWelcome`]. Then it carries `ControlRequest`s
//! one way and `ControlResponse`s the other, each framed as a 4-byte
//! little-endian length and the protobuf message. gRPC's `Control` stays
//! the stream any client may speak; workers that serve TLS offer no lane.

use std::io::{self, Read, Write};

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;

use crate::error::{Error, ErrorCode, Result};
use crate::transport::proto::{LaneHello, LaneWelcome};
use crate::transport::MAX_MESSAGE_BYTES;

/// The protocol version that adds the lane.
pub const LANE_VERSION: u32 = 9;
/// The first bytes of a lane connection.
pub const LANE_MAGIC: &[u8; 16] = b"\0colocated-lane1";
/// The most bytes of a [`LaneHello`]: a token and a session id.
pub const MAX_HELLO_BYTES: usize = 4 << 10;
/// The most bytes of a message on an accepted lane (as on gRPC).
pub const MAX_FRAME_BYTES: usize = MAX_MESSAGE_BYTES;
/// How many bytes a read of a lane asks for at most.
const READ_BYTES: usize = 64 << 10;
/// Messages up to this size are decoded where they were read; a larger
/// one's data is shared with the buffer it was read into (see
/// [`FrameReader::buffered`]).
const KEPT_READ_BYTES: usize = 4 << 10;

thread_local! {
    /// Where this thread reads a lane's bytes before they are parsed: one
    /// per reading thread, not one per lane.
    static READ_CHUNK: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; READ_BYTES].into_boxed_slice());
}

/// Appends `message`, framed, to `out`.
pub(crate) fn encode_frame(message: &impl Message, out: &mut Vec<u8>) {
    let len = message.encoded_len();
    out.reserve(4 + len);
    // Frames are bounded by MAX_FRAME_BYTES when read; a larger one is
    // refused by the reader, so the cast only has to be lossless.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    // Encoding into a Vec cannot run out of room.
    let _ = message.encode(out);
}

/// The length of the frame at the start of `buf`, if its 4 bytes are there.
fn frame_len(buf: &[u8], limit: usize) -> Result<Option<usize>> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let mut len = [0u8; 4];
    len.copy_from_slice(prefix);
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(Error::invalid_argument(format!(
            "a lane message of {len} bytes; at most {limit} are allowed"
        )));
    }
    Ok(Some(len))
}

/// Reads framed messages from a connection.
///
/// It holds no memory between messages: reads go through a buffer of the
/// reading thread, and only the bytes of a message that has not arrived
/// whole stay with the reader.
pub(crate) struct FrameReader<R> {
    source: R,
    buf: BytesMut,
    limit: usize,
}

impl<R: Read> FrameReader<R> {
    /// Reads frames of at most `limit` bytes from `source`.
    pub(crate) fn new(source: R, limit: usize) -> FrameReader<R> {
        FrameReader {
            source,
            buf: BytesMut::new(),
            limit,
        }
    }

    /// Whether another message has arrived whole.
    pub(crate) fn has_message(&self) -> bool {
        matches!(frame_len(&self.buf, self.limit), Ok(Some(len)) if self.buf.len() >= 4 + len)
    }

    /// The next message if it has arrived whole, without reading.
    pub(crate) fn buffered<M: Message + Default>(&mut self) -> Result<Option<M>> {
        let Some(len) = frame_len(&self.buf, self.limit)? else {
            return Ok(None);
        };
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let decoded = if len <= KEPT_READ_BYTES {
            // A small message is decoded in place (its few bytes of data, if
            // any, copied).
            let decoded = M::decode(&self.buf[4..4 + len]);
            self.buf.advance(4 + len);
            decoded
        } else {
            // A large one's data stays where it was read, shared; what
            // follows it moves out, so that the reader holds none of it.
            let _ = self.buf.split_to(4);
            let frame = self.buf.split_to(len).freeze();
            self.buf = BytesMut::from(&self.buf[..]);
            M::decode(frame)
        };
        if self.buf.is_empty() {
            // Nothing of the next message: the reader holds no memory.
            self.buf = BytesMut::new();
        }
        decoded
            .map(Some)
            .map_err(|e| Error::invalid_argument(format!("a bad lane message: {e}")))
    }

    /// The next message, reading until it arrived; `None` when the
    /// connection ended between messages.
    pub(crate) fn next<M: Message + Default>(&mut self) -> Result<Option<M>> {
        loop {
            if let Some(message) = self.buffered()? {
                return Ok(Some(message));
            }
            let more = self.fill().map_err(|failed| match failed {
                Filled::Failed(err) => err,
                Filled::WouldBlock => Error::unavailable("the lane broke: nothing to read"),
            })?;
            if !more {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(Error::unavailable(
                    "the lane ended in the middle of a message",
                ));
            }
        }
    }

    /// Whether no byte of a message is left over.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// What it reads from.
    pub(crate) fn source(&self) -> &R {
        &self.source
    }

    /// Reads once from a source that does not wait.
    pub(crate) fn read_available(&mut self) -> Result<Available> {
        let before = self.buf.len();
        match self.fill() {
            Ok(false) => Ok(Available::End),
            // A read that did not fill the chunk took all there was.
            Ok(true) if self.buf.len() - before < READ_BYTES => Ok(Available::All),
            Ok(true) => Ok(Available::Some),
            Err(Filled::WouldBlock) => Ok(Available::None),
            Err(Filled::Failed(err)) => Err(err),
        }
    }

    /// Reads what has arrived (waiting for something); false at the end.
    fn fill(&mut self) -> std::result::Result<bool, Filled> {
        loop {
            let read = READ_CHUNK.with(|chunk| {
                let mut chunk = chunk.borrow_mut();
                let n = self.source.read(&mut chunk[..])?;
                self.keep(&chunk[..n]);
                Ok::<_, io::Error>(n)
            });
            match read {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(Filled::WouldBlock),
                Err(e) => {
                    return Err(Filled::Failed(Error::unavailable(format!(
                        "the lane broke: {e}"
                    ))))
                }
            }
        }
    }
}

impl<R> FrameReader<R> {
    /// Appends `bytes` that arrived. A message that came in part gets room
    /// for all of it at once (its length is known), and a buffer that grew
    /// for a large one is given back once nothing of a message is left.
    fn keep(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.buf.extend_from_slice(bytes);
        if let Ok(Some(len)) = frame_len(&self.buf, self.limit) {
            let whole = 4 + len;
            if self.buf.len() < whole {
                self.buf.reserve(whole - self.buf.len());
            }
        }
    }
}

/// What a read of a source that does not wait brought.
pub(crate) enum Available {
    /// Bytes, and maybe more after them.
    Some,
    /// Bytes: all that had arrived.
    All,
    /// Nothing had arrived.
    None,
    /// The end of the connection.
    End,
}

/// Why a read of a lane brought nothing.
enum Filled {
    /// Nothing had arrived (a source that does not wait).
    WouldBlock,
    Failed(Error),
}

/// The writing end of a lane, shared by the threads that write on it: each
/// message goes out whole, in one write, under a lock. The connection is
/// shut down (both ways) once a write fails and when the last holder drops
/// it, which ends the reading end too.
pub(crate) struct LaneWriter {
    /// The connection (its reader may share it: one descriptor per lane),
    /// and the lock that keeps each message whole.
    socket: std::sync::Arc<std::net::TcpStream>,
    writing: std::sync::Mutex<()>,
    broken: std::sync::atomic::AtomicBool,
}

impl LaneWriter {
    /// Writes on `socket`; a write that cannot finish within `timeout` (the
    /// peer stopped reading) breaks the lane.
    pub(crate) fn new(
        socket: impl Into<std::sync::Arc<std::net::TcpStream>>,
        timeout: std::time::Duration,
    ) -> LaneWriter {
        let socket = socket.into();
        let _ = socket.set_write_timeout(Some(timeout.max(std::time::Duration::from_millis(1))));
        LaneWriter {
            socket,
            writing: std::sync::Mutex::new(()),
            broken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Sends bytes of whole frames.
    pub(crate) fn send_bytes(&self, frames: &[u8]) -> io::Result<()> {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let written = (&*self.socket).write_all(frames);
        if written.is_err() {
            // Part of a frame may have gone: nothing after it can be read.
            self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = self.socket.shutdown(std::net::Shutdown::Both);
        }
        written
    }

    /// Whether a write failed, or the lane was closed.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Shuts the connection down: the reading ends see it end.
    pub(crate) fn close(&self) {
        self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for LaneWriter {
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

/// Sends on a lane. A message someone waits for is written by the sending
/// thread itself: the fastest way there. Messages sent in a stream, one
/// right after another (pipelined calls and their answers), are queued, and
/// a thread of the transport's blocking pool writes whatever has gathered
/// at once: one system call for many messages, and none on the sending
/// thread. The bytes keep the order in which they were sent: a message is
/// written directly only while nothing is queued or being written.
pub(crate) struct LaneSender {
    writer: LaneWriter,
    queue: std::sync::Mutex<LaneQueue>,
}

#[derive(Default)]
struct LaneQueue {
    bytes: Vec<u8>,
    /// A thread of the pool is writing what was queued.
    writing: bool,
}

/// How long the thread that writes a lane's queue waits for more before it
/// lets go (a stream of pipelined messages keeps it writing, with no wake-up
/// per message).
const LINGER: std::time::Duration = std::time::Duration::from_micros(20);

impl LaneSender {
    pub(crate) fn new(writer: LaneWriter) -> std::sync::Arc<LaneSender> {
        std::sync::Arc::new(LaneSender {
            writer,
            queue: std::sync::Mutex::default(),
        })
    }

    /// Sends `message`, queued when `pipelining` (see [`send`](Self::send));
    /// false once the lane broke.
    pub(crate) fn send_message(
        self: &std::sync::Arc<Self>,
        message: &impl Message,
        pipelining: bool,
    ) -> bool {
        with_frame_buffer(|bytes| {
            encode_frame(message, bytes);
            self.send(bytes, pipelining)
        })
    }

    /// Sends `bytes` (whole frames), queued when `pipelining`; false once
    /// the lane broke.
    pub(crate) fn send(self: &std::sync::Arc<Self>, bytes: &[u8], pipelining: bool) -> bool {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if !pipelining && !queue.writing && queue.bytes.is_empty() {
            drop(queue);
            return self.writer.send_bytes(bytes).is_ok();
        }
        if self.writer.is_broken() {
            return false;
        }
        queue.bytes.extend_from_slice(bytes);
        if queue.writing {
            return true;
        }
        queue.writing = true;
        drop(queue);
        let lane = self.clone();
        let spawned =
            crate::transport::runtime().map(|runtime| runtime.spawn_blocking(move || lane.flush()));
        if spawned.is_err() {
            self.flush();
        }
        true
    }

    /// Writes what is queued until nothing is, or comes within [`LINGER`].
    fn flush(&self) {
        let mut idle_since = None;
        loop {
            let bytes = {
                let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                if queue.bytes.is_empty() && !self.writer.is_broken() {
                    let since = *idle_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() < LINGER {
                        drop(queue);
                        std::thread::yield_now();
                        continue;
                    }
                }
                if queue.bytes.is_empty() || self.writer.is_broken() {
                    queue.bytes = Vec::new();
                    queue.writing = false;
                    return;
                }
                idle_since = None;
                std::mem::take(&mut queue.bytes)
            };
            // A failed write breaks the lane: the reading ends see it end.
            let _ = self.writer.send_bytes(&bytes);
        }
    }

    /// Shuts the connection down (see [`LaneWriter::close`]).
    pub(crate) fn close(&self) {
        self.writer.close();
    }
}

thread_local! {
    /// This thread's buffer for the frames it writes (see
    /// [`with_frame_buffer`]).
    static FRAMES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most bytes a thread's frame buffer keeps between messages.
const KEPT_FRAME_BYTES: usize = 64 << 10;

/// Runs `f` with this thread's buffer for encoding frames, empty: a message
/// costs no allocation of its own (a fresh buffer when `f` sends another
/// message meanwhile).
pub(crate) fn with_frame_buffer<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    FRAMES.with(|frames| match frames.try_borrow_mut() {
        Ok(mut bytes) => {
            bytes.clear();
            let result = f(&mut bytes);
            if bytes.capacity() > KEPT_FRAME_BYTES {
                *bytes = Vec::new();
            }
            result
        }
        Err(_) => f(&mut Vec::new()),
    })
}

/// The opening of a lane for session `session_id` with `token`: the magic
/// bytes and the hello (`resume`: the lane resumes the session's control
/// stream, see [`RESUME_VERSION`](super::RESUME_VERSION)).
pub(crate) fn hello_bytes(token: &str, session_id: &[u8], resume: bool) -> Vec<u8> {
    let mut out = LANE_MAGIC.to_vec();
    encode_frame(
        &LaneHello {
            token: token.to_string(),
            session_id: Bytes::copy_from_slice(session_id),
            resume,
        },
        &mut out,
    );
    out
}

/// The outcome a welcome reports.
pub(crate) fn welcome_result(welcome: &LaneWelcome) -> Result<()> {
    if welcome.code == 0 {
        return Ok(());
    }
    let code = ErrorCode::from_u32(welcome.code).unwrap_or(ErrorCode::Internal);
    Err(Error::new(code, welcome.message.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::proto::{control_request, ControlRequest};

    #[test]
    fn frames_read_back_whole_however_the_bytes_arrive() {
        let mut bytes = Vec::new();
        for seq in 1..=3 {
            encode_frame(
                &ControlRequest {
                    seq,
                    ..Default::default()
                },
                &mut bytes,
            );
        }
        // One byte per read: every message still arrives whole, in order.
        struct Trickle(Vec<u8>, usize);
        impl Read for Trickle {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                match self.0.get(self.1) {
                    Some(&b) => {
                        out[0] = b;
                        self.1 += 1;
                        Ok(1)
                    }
                    None => Ok(0),
                }
            }
        }
        let mut reader = FrameReader::new(Trickle(bytes, 0), 1024);
        for seq in 1..=3 {
            let message: ControlRequest = reader.next().unwrap().unwrap();
            assert_eq!(message.seq, seq);
        }
        assert!(reader.next::<ControlRequest>().unwrap().is_none());
    }

    /// A lane keeps no large buffer between messages: a large message's
    /// room is given back once it was read (a controller holds a lane per
    /// worker).
    #[test]
    fn a_reader_keeps_no_large_buffer_between_messages() {
        use crate::transport::proto::{ControlResponse, ExecuteRequest};
        let mut bytes = Vec::new();
        encode_frame(
            &ControlResponse {
                seq: 1,
                data: vec![7u8; 1 << 20].into(),
                ..Default::default()
            },
            &mut bytes,
        );
        for seq in 2..=3 {
            encode_frame(
                &ControlRequest {
                    seq,
                    op: Some(control_request::Op::Execute(ExecuteRequest::default())),
                    ..Default::default()
                },
                &mut bytes,
            );
        }
        let mut reader = FrameReader::new(&bytes[..], MAX_FRAME_BYTES);
        let big: ControlResponse = reader.next().unwrap().unwrap();
        assert_eq!(big.data.len(), 1 << 20);
        assert!(big.data.iter().all(|&b| b == 7));
        // What follows the large message moved out of its memory.
        assert!(
            big.data.is_unique(),
            "the reader shares the large message's memory"
        );
        for seq in 2..=3 {
            let small: ControlRequest = reader.next().unwrap().unwrap();
            assert_eq!(small.seq, seq);
        }
        // The small messages all came in one read: none of it is kept.
        assert!(
            !reader.buf.try_reclaim(1),
            "the reader keeps {} bytes after its last message",
            reader.buf.capacity()
        );
        assert!(reader.next::<ControlRequest>().unwrap().is_none());

        // A burst of small messages read at once: none of it is kept either.
        let mut burst = Vec::new();
        for seq in 1..=2000 {
            encode_frame(
                &ControlRequest {
                    seq,
                    ..Default::default()
                },
                &mut burst,
            );
        }
        let mut reader = FrameReader::new(&burst[..], MAX_FRAME_BYTES);
        for seq in 1..=2000 {
            let small: ControlRequest = reader.next().unwrap().unwrap();
            assert_eq!(small.seq, seq);
        }
        assert!(
            !reader.buf.try_reclaim(1),
            "the reader keeps the burst's memory"
        );
    }

    #[test]
    fn an_oversized_or_cut_frame_is_an_error() {
        let mut bytes = Vec::new();
        encode_frame(
            &ControlRequest {
                seq: 7,
                ..Default::default()
            },
            &mut bytes,
        );
        let mut reader = FrameReader::new(&bytes[..], 1);
        let err = reader.next::<ControlRequest>().unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.message().contains("at most 1"), "{err}");

        let mut reader = FrameReader::new(&bytes[..bytes.len() - 1], 1024);
        let err = reader.next::<ControlRequest>().unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);

        let garbage = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        let mut reader = FrameReader::new(&garbage[..], 1024);
        let err = reader.next::<ControlRequest>().unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }
}
