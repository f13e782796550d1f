//! Who may hold a worker's connections: admission control below gRPC.
//!
//! A connection is *pending* from accept until a request on it carries the
//! worker's token (checked by the router before any body is read); then it is
//! *authenticated*. Pending connections are what a stranger can open, so they
//! are bounded three ways:
//! - each must authenticate within the handshake deadline (TLS handshake,
//!   HTTP/2 preface and a first request included), else it is closed;
//! - at most [`MAX_PENDING`] exist at once, and at most
//!   [`MAX_PENDING_PER_PEER`] per peer address: a new one beyond either bound
//!   closes the oldest pending one (of that peer), so a flood of silent
//!   sockets cannot lock out a controller, whose fresh connection
//!   authenticates within milliseconds;
//! - they hold no descriptors beyond those bounds, however many are opened.
//!
//! Authenticated connections are bounded by [`MAX_AUTHENTICATED`] (refused
//! beyond it) and never time out here (HTTP/2 keepalive finds dead peers).
//! Every connection gets at most [`MAX_STREAMS_PER_CONNECTION`] concurrent
//! streams (an HTTP/2 setting).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::error::{Error, Result};

/// The most pending (not yet authenticated) connections at once.
pub const MAX_PENDING: usize = 256;
/// The most pending connections from one peer address at once.
pub const MAX_PENDING_PER_PEER: usize = 64;
/// The most authenticated connections at once.
pub const MAX_AUTHENTICATED: usize = 512;
/// The most concurrent streams (RPCs) on one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 128;
/// How long a new connection has to authenticate, by default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the listener pauses after a failed accept (out of descriptors):
/// the pending connections it closes meanwhile give them back.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// What the admission control and a connection share.
struct ConnState {
    id: u64,
    peer: SocketAddr,
    authenticated: AtomicBool,
    /// Set when admission closes the connection (evicted, or refused).
    closed: AtomicBool,
    /// Woken to close the connection.
    waker: Mutex<Option<Waker>>,
}

impl ConnState {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

#[derive(Default)]
struct Registry {
    /// Pending connections, oldest first.
    pending: VecDeque<Arc<ConnState>>,
    pending_per_peer: HashMap<IpAddr, usize>,
    authenticated: usize,
    /// Every live connection, by peer address (what the router sees).
    by_peer: HashMap<SocketAddr, Arc<ConnState>>,
}

impl Registry {
    fn remove_pending(&mut self, id: u64) -> bool {
        let Some(at) = self.pending.iter().position(|c| c.id == id) else {
            return false;
        };
        if let Some(conn) = self.pending.remove(at) {
            let ip = conn.peer.ip();
            if let Some(n) = self.pending_per_peer.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.pending_per_peer.remove(&ip);
                }
            }
        }
        true
    }

    /// Closes the oldest pending connection (of `peer`, if given).
    fn evict_oldest(&mut self, peer: Option<IpAddr>) -> Option<SocketAddr> {
        let conn = self
            .pending
            .iter()
            .find(|c| peer.is_none_or(|ip| c.peer.ip() == ip))
            .cloned()?;
        self.remove_pending(conn.id);
        conn.close();
        Some(conn.peer)
    }
}

/// A worker's admission control (see the module docs).
pub(crate) struct Admission {
    registry: Mutex<Registry>,
    next_id: AtomicU64,
    handshake_timeout: Duration,
    /// Connections closed for want of authentication, for logs and tests.
    evicted: AtomicU64,
    timed_out: AtomicU64,
    /// When [`Admission::report`] last logged, and the totals it reported.
    reported: Mutex<(Option<Instant>, u64, u64)>,
}

impl Admission {
    pub(crate) fn new(handshake_timeout: Duration) -> Arc<Admission> {
        Arc::new(Admission {
            registry: Mutex::new(Registry::default()),
            next_id: AtomicU64::new(1),
            handshake_timeout,
            evicted: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            reported: Mutex::new((None, 0, 0)),
        })
    }

    /// Logs (at most once a second) how many connections were closed for not
    /// authenticating since the last report: a flood of strangers shows in
    /// the operator's log without flooding it.
    fn report(&self) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if reported
            .0
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        let (evicted, timed_out) = self.closed_counts();
        let (new_evicted, new_timed_out) = (evicted - reported.1, timed_out - reported.2);
        *reported = (Some(Instant::now()), evicted, timed_out);
        tracing::warn!(
            evicted = new_evicted,
            timed_out = new_timed_out,
            "closed connections that did not authenticate ({new_evicted} displaced by newer ones \
             beyond {MAX_PENDING} pending or {MAX_PENDING_PER_PEER} per peer, {new_timed_out} \
             past the {:?} handshake deadline)",
            self.handshake_timeout
        );
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a freshly accepted connection as pending, closing the oldest
    /// pending ones beyond the bounds.
    fn admit(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr) -> AdmittedStream {
        let state = Arc::new(ConnState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            authenticated: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        let mut evicted = Vec::new();
        {
            let mut registry = self.registry();
            let ip = peer.ip();
            if registry.pending_per_peer.get(&ip).copied().unwrap_or(0) >= MAX_PENDING_PER_PEER {
                evicted.extend(registry.evict_oldest(Some(ip)));
            }
            if registry.pending.len() >= MAX_PENDING {
                evicted.extend(registry.evict_oldest(None));
            }
            registry.pending.push_back(state.clone());
            *registry.pending_per_peer.entry(ip).or_insert(0) += 1;
            registry.by_peer.insert(peer, state.clone());
        }
        if !evicted.is_empty() {
            self.evicted
                .fetch_add(evicted.len() as u64, Ordering::Relaxed);
            self.report();
        }
        AdmittedStream {
            stream,
            deadline: Box::pin(tokio::time::sleep(self.handshake_timeout)),
            guard: AdmissionGuard {
                state,
                admission: self.clone(),
            },
            local: None,
        }
    }

    /// Marks the connection of `peer` authenticated (a request on it carried
    /// the token). `resource_exhausted` when the worker already holds
    /// [`MAX_AUTHENTICATED`] authenticated connections (the connection is
    /// closed). Unknown peers (not accepted here: tests calling the service
    /// directly) pass.
    pub(crate) fn authenticated(&self, peer: Option<SocketAddr>) -> Result<()> {
        let Some(peer) = peer else {
            return Ok(());
        };
        let mut registry = self.registry();
        let Some(state) = registry.by_peer.get(&peer).cloned() else {
            return Ok(());
        };
        if state.authenticated.load(Ordering::SeqCst) {
            return Ok(());
        }
        if registry.authenticated >= MAX_AUTHENTICATED {
            registry.remove_pending(state.id);
            registry.by_peer.remove(&peer);
            drop(registry);
            state.close();
            return Err(Error::resource_exhausted(format!(
                "this worker serves {MAX_AUTHENTICATED} connections already"
            )));
        }
        registry.remove_pending(state.id);
        registry.authenticated += 1;
        state.authenticated.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn release(&self, state: &ConnState) {
        let mut registry = self.registry();
        if !registry.remove_pending(state.id) && state.authenticated.load(Ordering::SeqCst) {
            registry.authenticated -= 1;
        }
        if registry
            .by_peer
            .get(&state.peer)
            .is_some_and(|s| s.id == state.id)
        {
            registry.by_peer.remove(&state.peer);
        }
    }

    /// (pending, authenticated) connections now.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let registry = self.registry();
        (registry.pending.len(), registry.authenticated)
    }

    /// Connections accepted so far (closed since or not).
    pub(crate) fn accepted(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed) - 1
    }

    /// Pending connections closed so far: (evicted by newer ones, timed out).
    pub(crate) fn closed_counts(&self) -> (u64, u64) {
        (
            self.evicted.load(Ordering::Relaxed),
            self.timed_out.load(Ordering::Relaxed),
        )
    }
}

/// A TCP connection under admission control: reads and writes fail once it is
/// closed by admission, or once its handshake deadline passes before it
/// authenticated.
pub(crate) struct AdmittedStream {
    stream: TcpStream,
    deadline: Pin<Box<tokio::time::Sleep>>,
    guard: AdmissionGuard,
    local: Option<SocketAddr>,
}

/// Keeps a connection counted by admission control until dropped.
pub(crate) struct AdmissionGuard {
    state: Arc<ConnState>,
    admission: Arc<Admission>,
}

impl Drop for AdmissionGuard {
    fn drop(&mut self) {
        self.admission.release(&self.state);
    }
}

impl AdmittedStream {
    /// `Ready(err)` when the connection must end now; else registers the task
    /// to be woken when it must.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.guard.state.closed.load(Ordering::SeqCst) {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed by the worker's admission control",
            ));
        }
        *self
            .guard
            .state
            .waker
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        if self.guard.state.closed.load(Ordering::SeqCst) {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed by the worker's admission control",
            ));
        }
        if !self.guard.state.authenticated.load(Ordering::SeqCst)
            && self.deadline.as_mut().poll(cx).is_ready()
        {
            self.guard.state.closed.store(true, Ordering::SeqCst);
            self.guard
                .admission
                .timed_out
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %self.guard.state.peer, "closed a connection that did not authenticate in time");
            self.guard.admission.report();
            return Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection did not authenticate in time",
            ));
        }
        Poll::Pending
    }
}

impl AdmittedStream {
    /// The peer's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.guard.state.peer
    }

    /// The first byte the peer sent, left unread; `None` when it closed
    /// first. Fails like a read once admission closes the connection or its
    /// handshake deadline passes.
    pub(crate) async fn first_byte(&mut self) -> io::Result<Option<u8>> {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(err) = self.check(cx) {
                return Poll::Ready(Err(err));
            }
            let mut byte = [0u8; 1];
            let mut buf = ReadBuf::new(&mut byte);
            match self.stream.poll_peek(cx, &mut buf) {
                Poll::Ready(Ok(0)) => Poll::Ready(Ok(None)),
                Poll::Ready(Ok(_)) => Poll::Ready(Ok(Some(byte[0]))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    /// This (authenticated) connection as a blocking socket for a thread of
    /// its own, which the runtime no longer watches; it stays counted while
    /// the guard lives.
    pub(crate) fn into_blocking(self) -> io::Result<(std::net::TcpStream, AdmissionGuard)> {
        let AdmittedStream { stream, guard, .. } = self;
        let socket = stream.into_std()?;
        socket.set_nonblocking(false)?;
        Ok((socket, guard))
    }
}

impl AsyncRead for AdmittedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Poll::Ready(err) = self.check(cx) {
            return Poll::Ready(Err(err));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AdmittedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.guard.state.closed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.guard.state.closed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for AdmittedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local.or_else(|| self.stream.local_addr().ok()),
            remote_addr: Some(self.guard.state.peer),
        }
    }
}

/// The listener's connections, each admitted (a `Stream` for tonic's
/// `serve_with_incoming_shutdown`). Accept errors (out of descriptors) pause
/// the listener briefly instead of ending it.
pub(crate) struct Incoming {
    listener: TcpListener,
    admission: Arc<Admission>,
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
    last_error_log: Option<Instant>,
}

impl Incoming {
    pub(crate) fn new(listener: TcpListener, admission: Arc<Admission>) -> Incoming {
        Incoming {
            listener,
            admission,
            backoff: None,
            last_error_log: None,
        }
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = std::result::Result<AdmittedStream, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(backoff) = self.backoff.as_mut() {
                if backoff.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.backoff = None;
            }
            match self.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, peer))) => {
                    // Small control messages must not wait for Nagle.
                    let _ = stream.set_nodelay(true);
                    let local = stream.local_addr().ok();
                    let mut admitted = self.admission.admit(stream, peer);
                    admitted.local = local;
                    return Poll::Ready(Some(Ok(admitted)));
                }
                Poll::Ready(Err(e)) => {
                    if self
                        .last_error_log
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
                    {
                        self.last_error_log = Some(Instant::now());
                        tracing::warn!("cannot accept a connection: {e}; pausing the listener");
                    }
                    self.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
            }
        }
    }
}
