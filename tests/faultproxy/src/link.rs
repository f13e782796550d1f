//! The proxy's tasks: the accept loop, and for each connection two pumps
//! (one per direction), each a reader and a writer joined by a bounded queue
//! of chunks. The reader stamps each chunk with when it is due (its latency);
//! the writer waits for that, for the partition to heal and for the bandwidth
//! limit, then delivers it.
//!
//! A reset (of the proxy, or of the connection when one of its sockets
//! fails) closes both sockets with `SO_LINGER` 0. A socket is closed once
//! both of its halves are dropped; each pump holds one half of each socket,
//! and both pumps see every reset.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::{Faults, Shared, DOWN, UP};

/// The most bytes one read takes.
const READ_BYTES: usize = 64 << 10;
/// The most chunks read and not yet delivered, per direction of a
/// connection: what a partition or a slow link holds before the proxy stops
/// reading from the sender.
const QUEUE_CHUNKS: usize = 64;

/// What a reader hands its writer.
enum Chunk {
    /// Bytes read, to deliver at `due`.
    Data { bytes: Vec<u8>, due: Instant },
    /// The sender closed its side: shut the other side's write half at `due`.
    End { due: Instant },
}

/// Accepts connections until the runtime stops, and serves each on a task.
pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Out of descriptors, or a connection that died in the
                // backlog: try again shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let faults = *shared.faults.borrow();
        if faults.refuse {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            abort(client);
            continue;
        }
        tokio::spawn(serve(shared.clone(), client, faults.generation));
    }
}

/// Closes `stream` with a reset.
fn abort(stream: TcpStream) {
    // Without the zero linger the close would be an orderly one; the reset
    // is the point, and a socket that cannot take it is closed anyway.
    let _ = stream.set_zero_linger();
}

/// Counts an open connection of a reset generation while it lives.
struct Open {
    shared: Arc<Shared>,
    generation: u64,
}

impl Open {
    fn new(shared: &Arc<Shared>, generation: u64) -> Open {
        *shared.open().entry(generation).or_default() += 1;
        Open {
            shared: shared.clone(),
            generation,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut open = self.shared.open();
        if let Some(n) = open.get_mut(&self.generation) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.generation);
            }
        }
    }
}

/// Forwards one accepted connection (of reset generation `generation`) to
/// the upstream until both directions end or it is reset.
async fn serve(shared: Arc<Shared>, client: TcpStream, generation: u64) {
    let _open = Open::new(&shared, generation);
    let _ = client.set_nodelay(true);
    let mut faults = shared.faults.subscribe();
    let upstream = tokio::select! {
        upstream = async {
            if healed(&mut faults, generation).await {
                TcpStream::connect(shared.upstream).await.ok()
            } else {
                None
            }
        } => upstream,
        () = reset(shared.faults.subscribe(), generation) => None,
    };
    let Some(upstream) = upstream else {
        abort(client);
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    // Set when a socket fails: the whole connection is reset then.
    let broken = watch::Sender::new(false);
    let pump_up = Pump {
        direction: UP,
        shared: &shared,
        generation,
        broken: &broken,
    };
    let pump_down = Pump {
        direction: DOWN,
        ..pump_up
    };
    tokio::join!(
        pump_up.run(client_read, upstream_write),
        pump_down.run(upstream_read, client_write),
    );
}

/// Waits until the link is not partitioned: false when the connection is
/// reset meanwhile.
async fn healed(faults: &mut watch::Receiver<Faults>, generation: u64) -> bool {
    match faults
        .wait_for(|f| !f.partitioned || f.generation != generation)
        .await
    {
        Ok(f) => f.generation == generation,
        Err(_) => false,
    }
}

/// Returns once `socket` has an error pending (its peer reset it).
async fn failed(socket: &OwnedReadHalf) {
    match socket.ready(Interest::ERROR).await {
        Ok(ready) if !ready.is_error() => std::future::pending().await,
        _ => {}
    }
}

/// Returns once a connection of `generation` is to be reset.
async fn reset(mut faults: watch::Receiver<Faults>, generation: u64) {
    let _ = faults.wait_for(|f| f.generation != generation).await;
}

/// One direction of a connection.
#[derive(Clone, Copy)]
struct Pump<'a> {
    /// [`UP`] or [`DOWN`].
    direction: usize,
    shared: &'a Arc<Shared>,
    generation: u64,
    broken: &'a watch::Sender<bool>,
}

impl Pump<'_> {
    /// Forwards `from` to `to` until the sender's end is delivered, or a
    /// reset; then closes them as that calls for.
    async fn run(self, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
        let (queue, chunks) = mpsc::channel(QUEUE_CHUNKS);
        let mut broken = self.broken.subscribe();
        let transfer = async {
            let read = self.read(&mut from, queue);
            let write = self.write(&mut to, chunks);
            tokio::pin!(read, write);
            // Either side failing ends the direction at once (a writer
            // blocked on a receiver that reads nothing must not keep a reset
            // sender's connection open); an end of stream read waits until
            // the writer has delivered everything before it.
            tokio::select! {
                read = &mut read => read && write.await,
                written = &mut write => written && read.await,
            }
        };
        let finished = tokio::select! {
            finished = transfer => finished,
            () = reset(self.shared.faults.subscribe(), self.generation) => false,
            _ = broken.wait_for(|b| *b) => false,
        };
        if !finished {
            self.broken.send_replace(true);
            // Both halves' socket closes with a reset once the other pump
            // drops its halves too; `forget` keeps the write half from
            // sending an orderly end first.
            let _ = from.as_ref().set_zero_linger();
            let _ = to.as_ref().set_zero_linger();
            to.forget();
        }
    }

    /// Reads chunks into `queue` until the end of the stream (true) or a
    /// failure or reset (false). Reads nothing while the link is
    /// partitioned.
    async fn read(&self, from: &mut OwnedReadHalf, queue: mpsc::Sender<Chunk>) -> bool {
        let mut faults = self.shared.faults.subscribe();
        let mut buffer = vec![0; READ_BYTES];
        loop {
            if !healed(&mut faults, self.generation).await {
                return false;
            }
            let read = from.read(&mut buffer).await;
            let due = Instant::now() + faults.borrow().latency[self.direction];
            let chunk = match read {
                Ok(0) => Chunk::End { due },
                Ok(n) => Chunk::Data {
                    bytes: buffer[..n].to_vec(),
                    due,
                },
                Err(_) => {
                    // A reset reaches the receiver once a partition heals.
                    healed(&mut faults, self.generation).await;
                    return false;
                }
            };
            let end = matches!(chunk, Chunk::End { .. });
            // While the queue is full the sender is not read, but a reset
            // from it still ends the connection, as it would reach the
            // receiver on a real link (once a partition heals).
            let slot = tokio::select! {
                slot = queue.reserve() => slot,
                () = failed(from) => {
                    healed(&mut faults, self.generation).await;
                    return false;
                }
            };
            let Ok(slot) = slot else { return false };
            slot.send(chunk);
            if end {
                return true;
            }
        }
    }

    /// Delivers the chunks of `chunks` to `to` as the faults allow, until
    /// the end of the stream (true) or a failure or reset (false).
    async fn write(&self, to: &mut OwnedWriteHalf, mut chunks: mpsc::Receiver<Chunk>) -> bool {
        let mut faults = self.shared.faults.subscribe();
        // When the bandwidth limit lets the next byte go.
        let mut next_free = Instant::now();
        while let Some(chunk) = chunks.recv().await {
            let (bytes, due) = match chunk {
                Chunk::Data { bytes, due } => (bytes, due),
                Chunk::End { due } => {
                    tokio::time::sleep_until(due).await;
                    return healed(&mut faults, self.generation).await
                        && to.shutdown().await.is_ok();
                }
            };
            tokio::time::sleep_until(due).await;
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                if !healed(&mut faults, self.generation).await {
                    return false;
                }
                let bandwidth = faults.borrow().bandwidth[self.direction];
                let piece = match bandwidth {
                    Some(rate) => {
                        let piece = usize::try_from(rate / 20).unwrap_or(usize::MAX);
                        let piece = piece.clamp(1, rest.len());
                        let start = next_free.max(Instant::now());
                        next_free = start + Duration::from_secs_f64(piece as f64 / rate as f64);
                        tokio::time::sleep_until(next_free).await;
                        piece
                    }
                    None => rest.len(),
                };
                // Counted first: whatever the receiver has read is counted.
                self.shared.bytes[self.direction].fetch_add(piece as u64, Ordering::Relaxed);
                if to.write_all(&rest[..piece]).await.is_err() {
                    return false;
                }
                rest = &rest[piece..];
            }
        }
        false
    }
}
