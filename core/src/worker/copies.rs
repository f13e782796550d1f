//! Copies between workers (protocol version
//! [`COPY_VERSION`](crate::transport::COPY_VERSION)): the source worker grants
//! one read of a buffer (`GrantReadRequest`), and the destination worker reads
//! it from there (`FetchBufferRequest`) with a `GetBuffer` that presents the
//! grant instead of the token and a session. The data never passes the
//! controller; the destination reports progress on its control stream.
//!
//! A grant is 32 random bytes the controller made, good for one request
//! within its time to live (a minute at most), for one buffer of the session
//! that granted it. A request with an unknown grant is refused like one with
//! a wrong token, before its body is read.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tonic::codegen::http;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Channel;

use super::buffers::{buffer_owning, check_fixed_size_spec, CheckedSpec};
use super::control::check_new_handles;
use super::service::Service;
use super::{lock, Session};
use crate::buffer::Buffer;
use crate::error::{Error, ErrorCode, Result};
use crate::prefault::Prefault;
use crate::session::{endpoint, ConnectOptions};
use crate::transport::buffers::receive_buffer;
use crate::transport::bulk::{get_call, ChunkSink};
use crate::transport::proto::{
    BufferChunk, ControlResponse, FetchBufferRequest, GetBufferRequest, GrantReadRequest,
};
use crate::transport::{from_status, reports_progress, SessionId, GRANT};

/// Grants a worker keeps at most (for all sessions): a controller that grants
/// more is refused until some are used or expire.
const MAX_GRANTS: usize = 4096;

/// The longest time to live of a grant.
const MAX_GRANT_TTL: Duration = Duration::from_secs(60);

/// Bytes of a grant.
const GRANT_BYTES: usize = 32;

/// The longest address a fetch may name.
const MAX_ADDRESS_BYTES: usize = 1024;

/// How long a fetch waits for its source to know the grant, in attempts that
/// double their wait from 2 ms: a controller before protocol version 8 (or
/// with a source before it) sends the grant and the fetch at once.
const GRANT_ATTEMPTS: u32 = 10;

/// The most connections to other workers a worker keeps for its fetches.
const MAX_PEER_CHANNELS: usize = 256;

/// How long a kept connection to another worker may go unused before a
/// fetch from a new peer lets it go.
const PEER_IDLE: Duration = Duration::from_secs(60);

/// Where another worker is and how it is reached: address, TLS CA, TLS domain.
type PeerKey = (String, bytes::Bytes, String);

/// Connections to the workers this one fetched from, kept for the next copy
/// from them (a connection costs round trips, and the source an admission):
/// at most [`MAX_PEER_CHANNELS`], those unused for [`PEER_IDLE`] let go when
/// a new one comes.
#[derive(Default)]
pub(super) struct Peers(std::sync::Mutex<HashMap<PeerKey, (Channel, Instant)>>);

impl Peers {
    fn get(&self, key: &PeerKey) -> Option<Channel> {
        let mut peers = lock(&self.0);
        let (channel, used) = peers.get_mut(key)?;
        *used = Instant::now();
        Some(channel.clone())
    }

    fn keep(&self, key: PeerKey, channel: Channel) {
        let now = Instant::now();
        let mut peers = lock(&self.0);
        peers.retain(|_, (_, used)| now.duration_since(*used) < PEER_IDLE);
        if peers.len() >= MAX_PEER_CHANNELS && !peers.contains_key(&key) {
            let oldest = peers
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                peers.remove(&oldest);
            }
        }
        peers.insert(key, (channel, now));
    }
}

/// Reads one worker granted: by grant, the buffer and until when.
#[derive(Default)]
pub(super) struct Grants(std::sync::Mutex<HashMap<[u8; GRANT_BYTES], Grant>>);

struct Grant {
    session: SessionId,
    handle: u64,
    expires: Instant,
}

impl Grants {
    /// The buffer a request's grant reads (and the grant is used up), or
    /// `None` when the request presents no grant.
    fn take(&self, headers: &http::HeaderMap) -> Option<Result<(SessionId, u64)>> {
        let grant = parse_grant(headers.get(GRANT)?.to_str().ok());
        Some(grant.and_then(|grant| {
            let mut grants = lock(&self.0);
            match grants.remove(&grant) {
                Some(g) if g.expires > Instant::now() => Ok((g.session, g.handle)),
                _ => Err(unknown_grant()),
            }
        }))
    }

    /// Whether `headers` present a grant that is known and alive; `None`
    /// when they present none.
    pub(super) fn admits(&self, headers: &http::HeaderMap) -> Option<Result<()>> {
        let grant = parse_grant(headers.get(GRANT)?.to_str().ok());
        Some(grant.and_then(|grant| match lock(&self.0).get(&grant) {
            Some(g) if g.expires > Instant::now() => Ok(()),
            _ => Err(unknown_grant()),
        }))
    }
}

fn unknown_grant() -> Error {
    Error::unauthenticated("unknown or expired read grant")
}

/// A grant as it travels: 64 lower-case hex digits, nothing else.
fn parse_grant(text: Option<&str>) -> Result<[u8; GRANT_BYTES]> {
    let text = text
        .map(str::as_bytes)
        .filter(|t| t.len() == 2 * GRANT_BYTES)
        .ok_or_else(unknown_grant)?;
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(unknown_grant()),
    };
    let mut grant = [0u8; GRANT_BYTES];
    for (byte, pair) in grant.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Ok(grant)
}

/// `grant` as it travels.
fn grant_header(grant: &[u8]) -> String {
    grant.iter().map(|b| format!("{b:02x}")).collect()
}

impl Service {
    /// `GrantReadRequest` of session `id`.
    pub(super) fn grant_read(&self, id: SessionId, request: &GrantReadRequest) -> Result<()> {
        let grant: [u8; GRANT_BYTES] = request.grant.as_ref().try_into().map_err(|_| {
            Error::invalid_argument(format!("a read grant has {GRANT_BYTES} bytes"))
        })?;
        self.with_session(id, |session| {
            session
                .buffers
                .get(&request.handle)
                .map(drop)
                .ok_or_else(|| {
                    Error::not_found(format!("no buffer {} in this session", request.handle))
                })
        })?;
        let ttl = Duration::from_millis(u64::from(request.ttl_ms)).min(MAX_GRANT_TTL);
        let now = Instant::now();
        let mut grants = lock(&self.0.grants.0);
        grants.retain(|_, g| g.expires > now);
        if grants.len() >= MAX_GRANTS {
            return Err(Error::resource_exhausted(format!(
                "this worker holds {MAX_GRANTS} unused read grants"
            )));
        }
        grants.insert(
            grant,
            Grant {
                session: id,
                handle: request.handle,
                expires: now + ttl,
            },
        );
        Ok(())
    }

    /// The session and buffer a `GetBuffer` request reads: by its grant, or
    /// by its session and the handle its message names (`read_handle`).
    pub(super) async fn source_of<F>(
        &self,
        request: &tonic::Request<()>,
        read_handle: F,
    ) -> Result<(SessionId, u64)>
    where
        F: std::future::Future<Output = Result<u64>>,
    {
        match self.0.grants.take(request.metadata().as_ref()) {
            // The grant names the buffer: the message's handle is not read.
            Some(source) => source,
            None => {
                let id = self.session(request)?;
                Ok((id, read_handle.await?))
            }
        }
    }

    /// `FetchBufferRequest` `seq` of session `id`: makes its buffer (pending
    /// until the copy ends) and starts the copy; returns the buffer's
    /// readiness. Progress answers go to `answers`.
    pub(super) fn fetch(
        &self,
        id: SessionId,
        seq: u64,
        request: FetchBufferRequest,
        answers: Answers,
    ) -> Result<crate::future::Event> {
        let spec = check_fixed_size_spec(
            &self.0.client,
            request.spec.as_ref(),
            "FetchBufferRequest",
            "are not copied between workers",
        )?;
        if request.address.is_empty() || request.address.len() > MAX_ADDRESS_BYTES {
            return Err(Error::invalid_argument(
                "a FetchBufferRequest needs the address of its source (at most 1 KiB)",
            ));
        }
        if request.grant.len() != GRANT_BYTES {
            return Err(Error::invalid_argument(format!(
                "a read grant has {GRANT_BYTES} bytes"
            )));
        }
        let ready = crate::future::Event::new();
        let buffer = Buffer::new(
            &self.0.client,
            spec.device.clone(),
            spec.memory.clone(),
            spec.dtype,
            &spec.dims,
            ready.clone(),
        );
        self.with_session(id, |session: &mut Session| {
            check_new_handles(session, &[request.handle])?;
            session.buffers.insert(request.handle, buffer.clone());
            Ok(())
        })?;
        let service = Service(self.0.clone());
        tokio::spawn(async move {
            let copied = service.copy_from(&request, &spec, seq, &answers).await;
            let result = copied
                .and_then(|data| buffer_owning(&service.0.client, &spec, data))
                .and_then(|made| made.storage());
            buffer.finish(result.map_err(|e| {
                e.context(format!(
                    "copying buffer {} from {}",
                    request.handle, request.address
                ))
            }));
        });
        Ok(ready)
    }

    /// The bytes of the buffer `request` names, read from its worker.
    async fn copy_from(
        &self,
        request: &FetchBufferRequest,
        spec: &CheckedSpec,
        seq: u64,
        answers: &Answers,
    ) -> Result<Vec<u8>> {
        #[cfg(feature = "fuzzing")]
        {
            // Fuzzed requests must not reach the network (nor wait for it).
            let loopback = request
                .address
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback());
            if !loopback {
                return Err(Error::invalid_argument(
                    "a fuzzing build fetches from loopback addresses only",
                ));
            }
        }
        let key: PeerKey = (
            request.address.clone(),
            request.tls_ca_pem.clone(),
            request.tls_domain.clone(),
        );
        // A kept channel connects anew by itself when its connection closed.
        let channel = match self.0.peers.get(&key) {
            Some(channel) => channel,
            None => self.connect_peer(request, key).await?,
        };
        let grant = MetadataValue::try_from(grant_header(&request.grant))
            .map_err(|_| Error::internal("a grant is not a header value"))?;
        let mut sink = Fetched::new(spec.size, seq, answers)?;
        let mut wait = Duration::from_millis(2);
        for attempt in 1..=GRANT_ATTEMPTS {
            let mut metadata = MetadataMap::new();
            metadata.insert(GRANT, grant.clone());
            // The grant names the buffer: the request's fields are not read.
            let request = GetBufferRequest::default();
            let outcome =
                get_call(channel.clone(), metadata, request, &mut sink, from_status).await;
            match outcome {
                Ok(()) => return sink.finish(),
                // The grant may not have reached the source yet (a refusal
                // comes before any data).
                Err(e) if e.code() == ErrorCode::Unauthenticated && attempt < GRANT_ATTEMPTS => {
                    sink.data.clear();
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => return Err(e),
            }
        }
        Err(unknown_grant())
    }

    /// A new connection to the source of `request`, kept for later copies.
    async fn connect_peer(&self, request: &FetchBufferRequest, key: PeerKey) -> Result<Channel> {
        let mut options = ConnectOptions::new(request.address.clone(), None);
        options.tls_ca = (!request.tls_ca_pem.is_empty()).then(|| request.tls_ca_pem.to_vec());
        options.tls_domain = (!request.tls_domain.is_empty()).then(|| request.tls_domain.clone());
        let channel = endpoint(&options, &request.address)?
            .connect()
            .await
            .map_err(|e| {
                Error::unavailable(format!("cannot connect to {}: {e}", request.address))
            })?;
        self.0.peers.keep(key, channel.clone());
        Ok(channel)
    }
}

/// Where a worker's answers on a control stream go.
pub(super) type Answers = std::sync::Arc<super::resume::SessionStream>;

/// A fetch's destination: fresh memory (faulted in ahead), and progress
/// answers of operation `seq`.
struct Fetched<'a> {
    data: Vec<u8>,
    size: usize,
    total: u64,
    seq: u64,
    answers: &'a Answers,
    /// Stopped (dropped) before `data` is used.
    prefault: Option<Prefault>,
}

impl<'a> Fetched<'a> {
    fn new(size: usize, seq: u64, answers: &'a Answers) -> Result<Fetched<'a>> {
        let mut data = receive_buffer(size)?;
        let prefault = Prefault::start(data.as_mut_ptr(), data.capacity());
        Ok(Fetched {
            data,
            size,
            total: size as u64,
            seq,
            answers,
            prefault,
        })
    }

    fn finish(mut self) -> Result<Vec<u8>> {
        drop(self.prefault.take());
        if self.data.len() != self.size {
            return Err(Error::internal(format!(
                "the source sent {} bytes of a {}-byte buffer",
                self.data.len(),
                self.size
            )));
        }
        Ok(std::mem::take(&mut self.data))
    }
}

impl ChunkSink<BufferChunk> for Fetched<'_> {
    fn fields(&mut self, chunk: BufferChunk) -> Result<()> {
        if chunk.total_bytes > 0 && chunk.total_bytes != self.size as u64 {
            return Err(Error::invalid_argument(format!(
                "the source buffer has {} bytes; the copy needs {}",
                chunk.total_bytes, self.size
            )));
        }
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> Result<()> {
        let before = self.data.len();
        if before + bytes.len() > self.size {
            return Err(Error::invalid_argument(format!(
                "the source sent more than the {} bytes of the buffer",
                self.size
            )));
        }
        self.data.extend_from_slice(bytes);
        let after = self.data.len();
        if let Some(prefault) = &self.prefault {
            prefault.written(after);
        }
        if reports_progress(before as u64, after as u64, self.total) {
            // Nobody listens once the controller is gone. The answer that
            // the copy finished follows.
            let _ = self.answers.send_with_more(
                Ok(ControlResponse {
                    seq: self.seq,
                    progress_bytes: after as u64,
                    total_bytes: self.total,
                    ..Default::default()
                }),
                true,
            );
        }
        Ok(())
    }
}

impl Drop for Fetched<'_> {
    fn drop(&mut self) {
        // Stopped before the memory goes.
        drop(self.prefault.take());
    }
}
