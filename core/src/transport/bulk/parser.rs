//! The parser of a bulk stream as it arrives: each chunk's fields, then views
//! of its `data` handed to a sink, checked as tonic's decoder and prost
//! would check them.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};
use prost::encoding::WireType;

use super::{Chunk, GRPC_HEADER_BYTES, MAX_FIELDS_BYTES};
use crate::error::{Error, Result};
use crate::transport::MAX_MESSAGE_BYTES;

/// Where [`ChunkParser`] delivers a stream's chunks, in order.
pub(crate) trait ChunkSink<M> {
    /// A chunk's fields other than `data` (left empty), before its data.
    fn fields(&mut self, chunk: M) -> Result<()>;
    /// The next bytes of the current chunk's data.
    fn data(&mut self, bytes: &[u8]) -> Result<()>;
}

/// Where the parser is in the stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Between messages: the next bytes are a gRPC message header.
    #[default]
    Header,
    /// Inside a message, before a field's key.
    Field,
    /// Inside a message's `data` field, with this many bytes of it to come.
    Data(usize),
}

/// Parses a bulk stream (gRPC messages of a [`Chunk`]: a `PutBuffer` request
/// body, a `GetBuffer` answer body) as its frames arrive, with the checks of
/// tonic's decoder and prost's: no
/// compression, messages within [`MAX_MESSAGE_BYTES`], well-formed fields.
/// It holds back only the bytes of a field it has not seen whole (at most
/// [`MAX_FIELDS_BYTES`]); data goes to the sink as it comes.
pub(crate) struct ChunkParser<M> {
    /// Received bytes not parsed yet, in order.
    queue: VecDeque<Bytes>,
    queued: usize,
    state: State,
    /// Bytes of the current message not parsed yet.
    message_left: usize,
    /// The current message's fields other than `data`, encoded.
    fields: Vec<u8>,
    /// Whether the current message's `data` has started (its fields went to
    /// the sink).
    data_seen: bool,
    messages: u64,
    chunk: std::marker::PhantomData<fn(M)>,
}

impl<M> Default for ChunkParser<M> {
    fn default() -> Self {
        ChunkParser {
            queue: VecDeque::new(),
            queued: 0,
            state: State::Header,
            message_left: 0,
            fields: Vec::new(),
            data_seen: false,
            messages: 0,
            chunk: std::marker::PhantomData,
        }
    }
}

/// A varint at the start of `bytes`: its value and length, `None` if `bytes`
/// ends inside it, an error if it is longer than ten bytes or overflows.
fn varint<M: Chunk>(bytes: &[u8]) -> Result<Option<(u64, usize)>> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        if i == 9 && b > 1 {
            return Err(malformed::<M>("a varint overflows 64 bits"));
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 10 {
        return Err(malformed::<M>("a varint is longer than ten bytes"));
    }
    Ok(None)
}

/// The error of a stream that is not well-formed.
fn malformed<M: Chunk>(what: &str) -> Error {
    Error::invalid_argument(format!("malformed {} stream: {what}", M::RPC))
}

impl<M: Chunk> ChunkParser<M> {
    /// Parses the next frame of the body, delivering what it completes.
    pub(crate) fn push(&mut self, frame: Bytes, sink: &mut impl ChunkSink<M>) -> Result<()> {
        if !frame.is_empty() {
            self.queued += frame.len();
            self.queue.push_back(frame);
        }
        while self.step(sink)? {}
        Ok(())
    }

    /// The body ended: it must end between messages, after at least one.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.state != State::Header || self.queued > 0 {
            return Err(malformed::<M>("the stream ended inside a message"));
        }
        if self.messages == 0 {
            return Err(Error::invalid_argument(format!(
                "an empty {} stream",
                M::RPC
            )));
        }
        Ok(())
    }

    /// Parses one thing (a header, a field, a run of data, a message's end);
    /// `false` when it needs more bytes.
    fn step(&mut self, sink: &mut impl ChunkSink<M>) -> Result<bool> {
        match self.state {
            State::Header => {
                if self.queued < GRPC_HEADER_BYTES {
                    return Ok(false);
                }
                let mut header = [0u8; GRPC_HEADER_BYTES];
                self.take_into(&mut header);
                match header[0] {
                    0 => {}
                    1 => {
                        return Err(Error::invalid_argument(format!(
                            "compressed {} messages are not accepted",
                            M::RPC
                        )))
                    }
                    flag => return Err(malformed::<M>(&format!("compression flag {flag}"))),
                }
                let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
                if len > MAX_MESSAGE_BYTES {
                    return Err(Error::resource_exhausted(format!(
                        "a {} message of {len} bytes is over the limit of {MAX_MESSAGE_BYTES}",
                        M::RPC
                    )));
                }
                self.messages += 1;
                self.message_left = len;
                self.fields.clear();
                self.data_seen = false;
                self.state = State::Field;
                Ok(true)
            }
            State::Field if self.message_left == 0 => {
                if !self.data_seen {
                    self.deliver_fields(sink)?;
                }
                self.state = State::Header;
                Ok(true)
            }
            State::Field => self.field(sink),
            State::Data(left) => {
                let mut left = left;
                while left > 0 {
                    let Some(front) = self.queue.front_mut() else {
                        break;
                    };
                    let n = front.len().min(left);
                    sink.data(&front[..n])?;
                    front.advance(n);
                    if front.is_empty() {
                        self.queue.pop_front();
                    }
                    self.queued -= n;
                    self.message_left -= n;
                    left -= n;
                }
                self.state = if left == 0 {
                    State::Field
                } else {
                    State::Data(left)
                };
                Ok(left == 0)
            }
        }
    }

    /// Parses the field that starts here: `data` starts streaming, any other
    /// field is kept (once whole) for the message's fields.
    fn field(&mut self, sink: &mut impl ChunkSink<M>) -> Result<bool> {
        // A key and a length take at most 20 bytes.
        let mut head = [0u8; 20];
        let seen = self.peek(&mut head[..self.message_left.min(20)]);
        let whole = seen == self.message_left.min(20);
        let head = &head[..seen];
        let truncated = || malformed::<M>("a message ends inside a field");
        let Some((key, key_bytes)) = varint::<M>(head)? else {
            return if whole { Err(truncated()) } else { Ok(false) };
        };
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(malformed::<M>(&format!("field number {number}")));
        }
        let length = |at: usize| -> Result<Option<(usize, usize)>> {
            match varint::<M>(&head[at..])? {
                Some((len, n)) => Ok(Some((usize::try_from(len).unwrap_or(usize::MAX), n))),
                None if whole => Err(truncated()),
                None => Ok(None),
            }
        };
        if number == u64::from(M::DATA_FIELD) {
            if key & 7 != WireType::LengthDelimited as u64 {
                return Err(malformed::<M>("`data` is not length-delimited"));
            }
            if self.data_seen {
                return Err(malformed::<M>("a chunk has `data` twice"));
            }
            let Some((len, len_bytes)) = length(key_bytes)? else {
                return Ok(false);
            };
            let header = key_bytes + len_bytes;
            if len > self.message_left - header {
                return Err(truncated());
            }
            self.deliver_fields(sink)?;
            self.data_seen = true;
            self.skip(header);
            self.state = State::Data(len);
            return Ok(true);
        }
        if self.data_seen {
            return Err(malformed::<M>(
                "a chunk has fields after `data` (the spec must come first)",
            ));
        }
        let size = match key & 7 {
            0 => match varint::<M>(&head[key_bytes..])? {
                Some((_, n)) => key_bytes + n,
                None if whole => return Err(truncated()),
                None => return Ok(false),
            },
            1 => key_bytes + 8,
            5 => key_bytes + 4,
            2 => match length(key_bytes)? {
                Some((len, n)) => (key_bytes + n).saturating_add(len),
                None => return Ok(false),
            },
            wire => return Err(malformed::<M>(&format!("wire type {wire}"))),
        };
        if size > self.message_left {
            return Err(truncated());
        }
        if self.fields.len() + size > MAX_FIELDS_BYTES {
            return Err(Error::resource_exhausted(format!(
                "a {} chunk's fields take over {MAX_FIELDS_BYTES} bytes",
                M::RPC
            )));
        }
        if self.queued < size {
            return Ok(false);
        }
        let start = self.fields.len();
        self.fields.resize(start + size, 0);
        let mut kept = std::mem::take(&mut self.fields);
        self.take_into(&mut kept[start..]);
        self.fields = kept;
        Ok(true)
    }

    /// Decodes the current message's fields (checked by prost) for the sink.
    fn deliver_fields(&mut self, sink: &mut impl ChunkSink<M>) -> Result<()> {
        let chunk = M::decode(&self.fields[..])
            .map_err(|e| malformed::<M>(&format!("a chunk does not decode: {e}")))?;
        sink.fields(chunk)
    }

    /// Copies the first `out.len()` queued bytes (or fewer, if fewer are
    /// queued) into `out`; returns how many.
    fn peek(&self, out: &mut [u8]) -> usize {
        let mut n = 0;
        for piece in &self.queue {
            if n == out.len() {
                break;
            }
            let k = piece.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&piece[..k]);
            n += k;
        }
        n
    }

    /// Moves the first `out.len()` queued bytes (all there) into `out`.
    fn take_into(&mut self, out: &mut [u8]) {
        let n = self.peek(out);
        debug_assert_eq!(n, out.len());
        self.skip(n);
    }

    /// Drops the first `n` queued bytes (all there), which belong to the
    /// current message unless they are a header.
    fn skip(&mut self, mut n: usize) {
        if self.state != State::Header {
            self.message_left -= n;
        }
        self.queued -= n;
        while n > 0 {
            let Some(front) = self.queue.front_mut() else {
                return;
            };
            let k = front.len().min(n);
            front.advance(k);
            if front.is_empty() {
                self.queue.pop_front();
            }
            n -= k;
        }
    }
}
