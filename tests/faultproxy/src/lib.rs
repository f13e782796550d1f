//! A fault-injecting TCP proxy on loopback, for tests of what a network does
//! to colocated's connections: added latency, partitions (a blackhole that
//! keeps every socket open), connection resets, bandwidth limits and refused
//! connections, each set per direction where that means something, at any
//! time, while connections are open.
//!
//! [`FaultProxy`] listens on `127.0.0.1` (a free port) and forwards every
//! connection it accepts to one upstream address. It runs on its own Tokio
//! runtime, so plain synchronous test code starts it, changes its faults and
//! reads its counters. Rust tests use it as a library; tests in other
//! languages run the `colocated-faultproxy` binary of this crate and drive it
//! over stdin (see `src/main.rs`).
//!
//! "Up" is the client-to-upstream direction, "down" the other. Data is
//! forwarded in chunks as it is read; every fault applies chunk by chunk:
//! a chunk read while a latency is set is delivered that much later, a
//! partition holds the chunks it finds, and so on. Chunks of a direction stay
//! in order whatever the faults do.

mod link;

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::watch;

/// A direction of the proxied connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client (who connected to the proxy) to the upstream.
    Up,
    /// From the upstream to the client.
    Down,
    /// Both directions.
    Both,
}

impl Direction {
    /// The indices into per-direction settings ([`UP`], [`DOWN`]) it names.
    fn indices(self) -> &'static [usize] {
        match self {
            Direction::Up => &[UP],
            Direction::Down => &[DOWN],
            Direction::Both => &[UP, DOWN],
        }
    }
}

/// The index of the up direction in per-direction settings and counters.
pub(crate) const UP: usize = 0;
/// The index of the down direction.
pub(crate) const DOWN: usize = 1;

/// How long [`FaultProxy::reset`] and [`FaultProxy::stop`] wait for the
/// connections they end to close.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// The faults in force: one value that every connection watches.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Faults {
    /// Added delay of each chunk, per direction.
    pub(crate) latency: [Duration; 2],
    /// Bytes per second, per direction (`None`: unlimited).
    pub(crate) bandwidth: [Option<u64>; 2],
    /// Nothing is forwarded, in either direction.
    pub(crate) partitioned: bool,
    /// New connections are reset at once.
    pub(crate) refuse: bool,
    /// The reset generation: a connection accepted in an earlier one is reset.
    pub(crate) generation: u64,
}

/// What the proxy has done so far (see [`FaultProxy::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted, refused ones included.
    pub accepted: u64,
    /// Connections refused (reset at once) while [`FaultProxy::refuse`] was on.
    pub refused: u64,
    /// Connections open now.
    pub open: u64,
    /// Bytes forwarded to the upstream: counted as they are written, so
    /// every byte the upstream has read is counted.
    pub bytes_up: u64,
    /// Bytes forwarded to clients, counted as `bytes_up` is.
    pub bytes_down: u64,
}

impl Stats {
    /// The counters as one line of JSON, as the binary's `stats` answers:
    /// `{"accepted":1,"refused":0,"open":1,"bytes_up":10,"bytes_down":10}`.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"accepted\":{},\"refused\":{},\"open\":{},\"bytes_up\":{},\"bytes_down\":{}}}",
            self.accepted, self.refused, self.open, self.bytes_up, self.bytes_down
        )
    }
}

/// What every task of the proxy shares.
pub(crate) struct Shared {
    /// Where connections go.
    pub(crate) upstream: SocketAddr,
    /// The faults in force; connections wait on changes.
    pub(crate) faults: watch::Sender<Faults>,
    pub(crate) accepted: AtomicU64,
    pub(crate) refused: AtomicU64,
    /// Bytes delivered, per direction.
    pub(crate) bytes: [AtomicU64; 2],
    /// Open connections by the reset generation they were accepted in.
    pub(crate) open: Mutex<HashMap<u64, u64>>,
}

impl Shared {
    /// The open connections, by generation (a poisoned lock still counts).
    pub(crate) fn open(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (up to [`CLOSE_PATIENCE`]) until no connection of a generation
    /// before `generation` is open.
    fn wait_closed_before(&self, generation: u64) {
        let deadline = Instant::now() + CLOSE_PATIENCE;
        while Instant::now() < deadline && self.open().keys().any(|&g| g < generation) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A TCP proxy from `127.0.0.1:<port>` to one upstream address, with faults
/// that can be set at any time.
///
/// Every method takes effect at once, for the connections already open and
/// for later ones; none blocks for long (only [`reset`](Self::reset) and
/// [`stop`](Self::stop) wait, briefly, for sockets to close: call them from
/// plain threads, or `spawn_blocking` in async tests). The proxy runs on two
/// threads of its own and may be used from any thread.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<Runtime>,
}

impl FaultProxy {
    /// Starts a proxy that forwards every connection it accepts to
    /// `upstream`, listening on a free port of `127.0.0.1` (see
    /// [`addr`](Self::addr)). No fault is set.
    ///
    /// Each accepted connection is connected to `upstream` at once (once a
    /// partition heals, if one is on); a connection the upstream refuses is
    /// reset. Errors: the runtime or the listening socket cannot be made.
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("faultproxy")
            .enable_all()
            .build()?;
        let listener = StdTcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _context = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared {
            upstream,
            faults: watch::Sender::new(Faults::default()),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
            open: Mutex::new(HashMap::new()),
        });
        runtime.spawn(link::accept_loop(listener, shared.clone()));
        Ok(FaultProxy {
            addr,
            shared,
            runtime: Some(runtime),
        })
    }

    /// The address clients connect to: `127.0.0.1` and the proxy's port.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address every connection is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Delivers each chunk read from now on in `direction` `latency` after
    /// it was read (zero: no added delay). Order is kept: a chunk never
    /// overtakes an earlier one, even when the latency shrinks.
    pub fn set_latency(&self, direction: Direction, latency: Duration) {
        self.shared.faults.send_modify(|f| {
            for &i in direction.indices() {
                f.latency[i] = latency;
            }
        });
    }

    /// Limits each connection's `direction` to `bytes_per_second` (`None`:
    /// unlimited; 0 counts as 1): a chunk of `n` bytes is delivered no
    /// sooner than `n / bytes_per_second` after the previous one was (or
    /// after it was due), in pieces of at most a twentieth of a second's
    /// worth.
    pub fn set_bandwidth(&self, direction: Direction, bytes_per_second: Option<u64>) {
        self.shared.faults.send_modify(|f| {
            for &i in direction.indices() {
                f.bandwidth[i] = bytes_per_second.map(|b| b.max(1));
            }
        });
    }

    /// Partitions the link (`true`) or heals it (`false`).
    ///
    /// While partitioned, nothing is forwarded in either direction and
    /// every socket stays open: the proxy stops reading from the senders (so
    /// their writes stall once the socket buffers are full, as TCP's
    /// retransmits would), holds what it had read, and delivers all of it,
    /// in order, after the heal; a peer's end of stream or reset reaches
    /// the other side after the heal too. A connection accepted meanwhile
    /// is connected to the upstream after the heal.
    pub fn partition(&self, on: bool) {
        self.shared.faults.send_modify(|f| f.partitioned = on);
    }

    /// Resets every connection the proxy has accepted so far, on both sides:
    /// each socket is closed with `SO_LINGER` 0, so the client and the
    /// upstream see `ECONNRESET` (a read may see the end of the stream
    /// instead). Data held for them is dropped. Later connections work as
    /// usual. Returns once those sockets are closed (or after 5 s).
    pub fn reset(&self) {
        let mut generation = 0;
        self.shared.faults.send_modify(|f| {
            f.generation += 1;
            generation = f.generation;
        });
        self.shared.wait_closed_before(generation);
    }

    /// Refuses new connections (`true`): each one is accepted and reset at
    /// once (`SO_LINGER` 0, then closed), as a port whose process is down
    /// would refuse it; `false` forwards them again. Open connections are
    /// left alone.
    pub fn refuse(&self, on: bool) {
        self.shared.faults.send_modify(|f| f.refuse = on);
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed),
            open: self.shared.open().values().sum(),
            bytes_up: self.shared.bytes[UP].load(Ordering::Relaxed),
            bytes_down: self.shared.bytes[DOWN].load(Ordering::Relaxed),
        }
    }

    /// Stops the proxy: stops listening and resets every connection (as
    /// [`reset`](Self::reset)). Dropping the proxy does the same.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let mut generation = 0;
        self.shared.faults.send_modify(|f| {
            f.refuse = true;
            f.generation += 1;
            generation = f.generation;
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            // Dropped on an async runtime's thread, which must not block:
            // the tasks close their sockets as they are dropped.
            runtime.shutdown_background();
            return;
        }
        self.shared.wait_closed_before(generation);
        // Ends the accept loop (closing the listener) and any task left.
        runtime.shutdown_timeout(CLOSE_PATIENCE);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("faults", &*self.shared.faults.borrow())
            .finish()
    }
}
