//! The controller's reading of its lanes' answers (see
//! [`crate::transport::lane`]): one thread for every lane of the process.
//!
//! A thread per lane, asleep in `recv`, costs a wake-up (and a context
//! switch) per answer; a call fanned out to N workers paid N of them before
//! the waiting caller was woken. Here one thread (the *leader*) sleeps in
//! `epoll` on every lane at once and takes the answers of all lanes that are
//! ready when it wakes: a fan-out's answers wake it a few times, not N.
//!
//! Each lane is in the `epoll` set edge-triggered: a lane is reported once
//! each time bytes arrive, and stays in the set without a system call per
//! answer to arm it again. One thread at a time reads a lane (its lock, taken
//! without waiting), so one lane's answers are taken in order; a thread that
//! finds the lane being read marks it readable and leaves it to the reader,
//! which looks again before it lets go. What an answer runs (a completion)
//! may last (a callback of the user's): when the leader has run answers for
//! [`TAKEOVER_AFTER`] (its [`Alarm`] goes off), a new thread leads, and the
//! old one ends once its answer is done; the lanes it has not come to yet
//! wait for the new leader, not for it.
//!
//! A thread about to sleep until an event is ready (a *waiter*) reads too:
//! it sleeps in `epoll` on the same set, and the kernel wakes the thread
//! that began waiting last, so the answer it waits for wakes it alone and
//! it takes that answer itself, with no thread woken to hand it over (see
//! `pump::Pump` and [`crate::future::WaitHook`]).
//!
//! A thread that sends the parts of a call to many hosts keeps the leader
//! asleep meanwhile ([`Sending`]): the answers that come wait in their
//! sockets until it waits and reads them itself, rather than the leader
//! taking them one by one while the caller still writes. Never while
//! something else waits, and for [`MAX_HOLD`] at most since a reader last
//! read.
//!
//! Without `epoll` and alarms (not Linux), or if they cannot be had, each
//! lane gets a thread of its own, as before.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::transport::lane::{FrameReader, MAX_FRAME_BYTES};
use crate::transport::proto::ControlResponse;
use crate::transport::runtime;

/// What reads a lane's answers calls: for each answer, in order, and once,
/// with why the lane ended.
pub(crate) struct Handlers {
    /// Takes one answer.
    pub(crate) answer: Box<dyn FnMut(ControlResponse) + Send>,
    /// The lane ended (the worker closed it, it broke, or a message was
    /// bad); nothing is read from it after.
    pub(crate) ended: Box<dyn FnOnce(Error) + Send>,
}

/// How long the leader may run what answers call before another thread
/// takes over the reading.
const TAKEOVER_AFTER: Duration = Duration::from_millis(2);

/// How long the leader stays asleep once a waiter stopped reading, for the
/// next waiter to come (a caller that waits for one call after another,
/// the next wait beginning once a call to hundreds of hosts has gone out):
/// the most an answer that nothing waits for (no thread, no callback of the
/// user's) may wait for a reader then.
const LINGER: Duration = Duration::from_millis(5);

/// The longest a thread that sends a call's parts keeps the lanes unread
/// ([`Sending`]): answers that nobody reads fill their worker's socket
/// buffers, and once the worker's writes block, so would the caller's to
/// that worker. A fan-out to 4,096 hosts takes about 70 ms to send here.
const MAX_HOLD: Duration = Duration::from_millis(100);

/// Reads `socket`'s answers from now on, calling `handlers`: with the
/// process's other lanes, or on a thread of its own.
pub(crate) fn read_lane_answers(
    socket: impl Into<Arc<std::net::TcpStream>>,
    handlers: Handlers,
) -> Result<()> {
    let socket = socket.into();
    #[cfg(target_os = "linux")]
    let (socket, handlers) = match pump::add(socket, handlers) {
        Ok(()) => return Ok(()),
        Err(given_back) => given_back,
    };
    std::thread::Builder::new()
        .name("colocated-lane".into())
        .spawn(move || read_on_this_thread(socket, handlers))
        .map(|_| ())
        .map_err(|e| Error::resource_exhausted(format!("cannot start a lane's thread: {e}")))
}

/// Reads `socket`'s answers on this thread until the lane ends.
fn read_on_this_thread(socket: Arc<std::net::TcpStream>, mut handlers: Handlers) {
    // What answers complete may start work on the network runtime.
    let runtime = runtime().map(|runtime| runtime.enter());
    let mut reader = FrameReader::new(&*socket, MAX_FRAME_BYTES);
    let ended = loop {
        match reader.next::<ControlResponse>() {
            Ok(Some(answer)) => (handlers.answer)(answer),
            Ok(None) => break Error::unavailable("the control stream ended"),
            Err(err) => break broke(&err),
        }
    };
    (handlers.ended)(ended);
    drop(runtime);
}

/// Why a lane whose reading failed with `err` ended.
fn broke(err: &Error) -> Error {
    Error::unavailable(format!("the control stream broke: {}", err.message()))
}

#[cfg(target_os = "linux")]
mod pump;

/// Held by a thread while it sends the parts of a call to many hosts, whose
/// answers it will most likely wait for: the process's reader of lanes, if
/// asleep for the next waiter (see [`LINGER`]), stays asleep until it is
/// dropped, and [`LINGER`] more, so that the caller reads the answers itself
/// once it waits, after its last send, as a raw client would: not a second
/// thread taking them one by one while the caller still writes, each
/// answer's state passed between the two threads. Never while something
/// else waits (a thread asleep, a callback of the user's), and for
/// [`MAX_HOLD`] at most since a reader last read.
pub(crate) struct Sending {
    #[cfg(target_os = "linux")]
    _held: Option<pump::Sending>,
}

impl Sending {
    /// Holds the reader for this thread's sends (nothing where the process
    /// reads no lanes yet, or this thread would not read them as it waits).
    pub(crate) fn start() -> Sending {
        Sending {
            #[cfg(target_os = "linux")]
            _held: pump::Sending::start(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::{read_lane_answers, Handlers};
    use crate::transport::lane::encode_frame;
    use crate::transport::proto::ControlResponse;

    /// Bytes that have arrived on `socket` and wait to be read.
    fn queued(socket: &std::net::TcpStream) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut n) };
        usize::try_from(n).unwrap_or(0)
    }

    /// An answer that arrives while another thread reads its lane (held
    /// up by the answer before, whose completion runs long): the thread
    /// that was told of it leaves it to the reader, which reads it once it
    /// is done, though no byte comes after it.
    #[test]
    fn an_answer_that_arrives_while_its_lane_is_read_is_read_too() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut worker = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (controller, _) = listener.accept().unwrap();
        let answer = |seq: u64| {
            let mut bytes = Vec::new();
            encode_frame(
                &ControlResponse {
                    seq,
                    finished: true,
                    ..Default::default()
                },
                &mut bytes,
            );
            bytes
        };
        let (entered, in_first) = std::sync::mpsc::channel::<()>();
        let (go, wait_for_go) = std::sync::mpsc::channel::<()>();
        let wait_for_go = Mutex::new(wait_for_go);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers = seen.clone();
        read_lane_answers(
            controller,
            Handlers {
                answer: Box::new(move |answer| {
                    answers.lock().unwrap().push(answer.seq);
                    if answer.seq == 1 {
                        entered.send(()).unwrap();
                        let go = wait_for_go.lock().unwrap();
                        go.recv_timeout(Duration::from_secs(10)).unwrap();
                    }
                }),
                ended: Box::new(|_| {}),
            },
        )
        .unwrap();
        worker.write_all(&answer(1)).unwrap();
        in_first.recv_timeout(Duration::from_secs(10)).unwrap();
        // The reader runs the first answer's completion: it is taken over
        // (after 2 ms), and the new reader is told of the second answer.
        worker.write_all(&answer(2)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        go.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "the second answer was not read");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    }

    /// Answers that had all arrived before their lane was read, more than a
    /// reader takes from one lane at a time (16 reads of 64 KiB): the rest
    /// is read too, though no byte arrives after them to report the lane
    /// again.
    #[test]
    fn answers_beyond_one_reading_turn_are_all_read() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut worker = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut controller, _) = listener.accept().unwrap();
        // The receiving side's buffer grows with use: 16 MiB through it
        // first, so that the answers below fit in it at once.
        let warm = std::thread::spawn(move || {
            let chunk = vec![0u8; 1 << 20];
            for _ in 0..16 {
                worker.write_all(&chunk).unwrap();
            }
            worker
        });
        let mut chunk = vec![0u8; 64 << 10];
        let mut read = 0;
        while read < 16 << 20 {
            read += controller.read(&mut chunk).unwrap();
        }
        let mut worker = warm.join().unwrap();
        const ANSWERS: u64 = 5; // 1.25 MiB
        let mut bytes = Vec::new();
        for seq in 1..=ANSWERS {
            let answer = ControlResponse {
                seq,
                finished: true,
                data: vec![seq as u8; 256 << 10].into(),
                ..Default::default()
            };
            encode_frame(&answer, &mut bytes);
        }
        let total = bytes.len();
        let writer = std::thread::spawn(move || {
            worker.write_all(&bytes).unwrap();
            worker
        });
        // All of it waits on the socket before the lane is read (if the
        // machine's buffers take it; the answers are checked either way).
        let deadline = Instant::now() + Duration::from_secs(2);
        while queued(&controller) < total && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers = seen.clone();
        read_lane_answers(
            controller,
            Handlers {
                answer: Box::new(move |answer| {
                    assert!(answer.data.iter().all(|&b| b == answer.seq as u8));
                    answers.lock().unwrap().push(answer.seq);
                }),
                ended: Box::new(|_| {}),
            },
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < ANSWERS as usize {
            assert!(
                Instant::now() < deadline,
                "{} of {ANSWERS} answers were read",
                seen.lock().unwrap().len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*seen.lock().unwrap(), (1..=ANSWERS).collect::<Vec<_>>());
        drop(writer.join().unwrap());
    }

    /// A thread that sends a call's parts keeps the lanes unread (its
    /// [`super::Sending`]) for a bounded time only: a worker whose answers
    /// nobody waits for, more of them than the sockets' buffers hold, gets
    /// them all read while the hold lasts, and its writes never block for
    /// good (had they, so would the sender's writes to it).
    #[test]
    fn a_thread_that_sends_never_keeps_answers_unread_for_long() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut worker = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (controller, _) = listener.accept().unwrap();
        let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = read.clone();
        read_lane_answers(
            controller,
            Handlers {
                answer: Box::new(move |answer| {
                    counted.store(answer.seq, std::sync::atomic::Ordering::SeqCst);
                }),
                ended: Box::new(|_| {}),
            },
        )
        .unwrap();
        // 64 MiB of answers: far more than the two sockets' buffers hold.
        const ANSWERS: u64 = 256;
        let sending = super::Sending::start();
        let writer = std::thread::spawn(move || {
            for seq in 1..=ANSWERS {
                let mut bytes = Vec::new();
                let answer = ControlResponse {
                    seq,
                    finished: true,
                    data: vec![0u8; 256 << 10].into(),
                    ..Default::default()
                };
                encode_frame(&answer, &mut bytes);
                worker.write_all(&bytes).unwrap();
            }
            worker
        });
        // The sender holds on (it does not wait for an event, which would
        // end the hold) until every answer was read, or for long.
        let deadline = Instant::now() + Duration::from_secs(30);
        while read.load(std::sync::atomic::Ordering::SeqCst) < ANSWERS {
            assert!(
                Instant::now() < deadline,
                "{} of {ANSWERS} answers were read while a thread sent",
                read.load(std::sync::atomic::Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(sending);
        drop(writer.join().unwrap());
    }
}
