//! Fuzz input as gRPC bodies: framing messages, splitting a body back into
//! them, and a request body that delivers one.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use prost::Message;
use tonic::codec::Codec;
use tonic::Streaming;
use tonic_prost::ProstCodec;

use crate::transport::MAX_MESSAGE_BYTES;

/// The gRPC framing of `messages`: an uncompressed flag and a big-endian length
/// before each.
pub(super) fn grpc_body<M: Message>(messages: &[M]) -> Vec<u8> {
    let mut body = Vec::new();
    for message in messages {
        let bytes = message.encode_to_vec();
        body.push(0);
        body.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        body.extend_from_slice(&bytes);
    }
    body
}

/// The messages of a gRPC body, if it is whole uncompressed messages within
/// the size limit only.
///
/// tonic takes a body that ends right after a message's header, before any of
/// its bytes, as a clean end (it reports a body cut anywhere else): that last
/// header is no message.
pub(super) fn split_messages(mut body: &[u8]) -> Option<Vec<&[u8]>> {
    let mut messages = Vec::new();
    while !body.is_empty() {
        let (&[0, a, b, c, d], rest) = body.split_first_chunk::<5>()? else {
            return None;
        };
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return None;
        }
        if rest.is_empty() && len > 0 {
            break;
        }
        messages.push(rest.get(..len)?);
        body = &rest[len..];
    }
    Some(messages)
}

/// How a request body arrives.
pub(super) struct Wire {
    frames: VecDeque<Bytes>,
    pub(super) reset: bool,
    pub(super) body: Bytes,
}

impl Wire {
    pub(super) fn new(flags: u8, body: &[u8]) -> Wire {
        let body = Bytes::copy_from_slice(body);
        let frame_bytes = match flags & 0x0f {
            0 => body.len().max(1),
            k => 1 << k,
        };
        let frames = (0..body.len())
            .step_by(frame_bytes)
            .map(|at| body.slice(at..body.len().min(at + frame_bytes)))
            .collect();
        Wire {
            frames,
            reset: flags & 0x80 != 0,
            body,
        }
    }

    pub(super) fn clean(body: Vec<u8>) -> Wire {
        Wire::new(0, &body)
    }

    /// The body decoded as the worker's server decodes a request stream.
    pub(super) fn decode<T: Message + Default + Send + 'static>(self) -> Streaming<T> {
        let decoder = ProstCodec::<T, T>::default().decoder();
        Streaming::new_request(decoder, self, None, Some(MAX_MESSAGE_BYTES))
    }
}

impl http_body::Body for Wire {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(match self.frames.pop_front() {
            Some(data) => Some(Ok(http_body::Frame::data(data))),
            None if std::mem::take(&mut self.reset) => Some(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the stream was reset",
            ))),
            None => None,
        })
    }
}
