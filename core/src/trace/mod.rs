//! Logs and Chrome/Perfetto traces.
//!
//! [`init_from_env`] (run by every client a program makes: `Client::new_local`,
//! `Client::connect`) reads two variables once per process and installs a
//! global `tracing` subscriber for them:
//!
//! - `COLOCATED_LOG`: an `EnvFilter` directive such as `colocated_core=debug`. Logs
//!   that pass it are written to stderr.
//! - `COLOCATED_TRACE`: a path. Every span of a `colocated*` crate, at any level,
//!   becomes a complete (`"ph":"X"`) event in a Chrome Trace Event Format file that
//!   chrome://tracing and ui.perfetto.dev load, and so do the spans of every
//!   worker the process connects to (see below).
//!
//! The file's processes (`pid`): this process's spans have the span's `host`
//! field (default 0) as pid; pid 0 is named `controller (this process)`, pid
//! `h` `controller (this process): host h` (the controller's side of host
//! `h`'s work: sending it). Each worker session of a traced client is one more
//! process, numbered from 2^20 up and named by the address the controller was
//! given (`127.0.0.1:7001`). The tracks (`tid`): a span's `stream` field (on a
//! worker, the controller's stream it ran for), so each stream of each host is
//! one timeline. Spans without a `stream` take their parent's track, else a
//! track per OS thread (ids from 2^31 up, named after the thread), so that
//! slices on one track always nest. `args` holds the span's fields, and a
//! metadata event names each process and track when it first appears.
//!
//! Workers: the worker commands call [`init_worker`] instead. A worker never
//! opens `COLOCATED_TRACE` (started from the controller's shell, it would
//! write the controller's file); it writes a file of its own only when its
//! command line says so (`--trace FILE`), and keeps its spans for the traced
//! controllers that ask for them: a controller whose process traces asks each
//! worker of protocol version 10 or later when the session opens, then about
//! every second, on [`flush`] and when the client goes. A worker records
//! nothing, and its span sites cost what they cost untraced, while no session
//! asks.
//!
//! Clock: a worker's spans are placed on the controller's clock with an offset
//! measured when the session opens: the controller reads its clock (`t0`),
//! asks for the worker's (`w`), reads its own again (`t1`), five times, and keeps
//! the sample of the shortest round trip: `offset = w - (t0 + t1) / 2`. A
//! worker's span is then placed within half that round trip of where it
//! happened (tens of microseconds on one machine or a LAN), plus however far the
//! two machines' monotonic clocks drift apart during the run, which is not
//! corrected.
//!
//! The file is a JSON array. Each batch of events is written by a background
//! thread and followed by the closing `]`, so the file is valid JSON whenever the
//! writer is idle; [`flush`] waits for that point. Events still queued when the
//! process exits are lost: call [`flush`] before exiting.
//!
//! Nothing is installed when neither variable is set, or when the application has
//! already installed a global subscriber (its subscriber wins, silently): a
//! library embedder's process stays silent unless it opts in. A bad directive or
//! an unwritable path prints one warning to stderr and disables only that
//! output.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

mod collect;
mod remote;
mod writer;

pub(crate) use collect::{start_collecting, CollectedSpan, SpanCollector};
pub(crate) use remote::{add_source, remote_process, write_remote, RemoteSpan, SpanSource};
pub(crate) use writer::FieldValue;
use writer::{event_json, start_writer, Msg};

/// Track ids from here up hold spans without a stream, one track per OS thread; the
/// base itself is shared by threads that are exiting. Stream ids count up from 1 and
/// stay below it, and it fits the `u32` tids that viewers use.
const RUNTIME_TRACK_BASE: u64 = 1 << 31;

/// How long [`flush`] waits for the writer.
const FLUSH_DEADLINE: Duration = Duration::from_secs(10);

/// The channel to the trace writer, set once the trace layer is installed.
static WRITER: OnceLock<Sender<Msg>> = OnceLock::new();
static NEXT_RUNTIME_TRACK: AtomicU64 = AtomicU64::new(RUNTIME_TRACK_BASE + 1);
/// Where this process's trace clock starts (set when the subscriber is installed).
static EPOCH: OnceLock<Instant> = OnceLock::new();
/// What this process is, for the name of its own processes in its file.
static ROLE: OnceLock<&'static str> = OnceLock::new();

thread_local! {
    /// This thread's runtime track and its label.
    static RUNTIME_TRACK: RefCell<Option<(u64, Arc<str>)>> = const { RefCell::new(None) };
}

/// Installs the log and trace subscriber described by `COLOCATED_LOG` and
/// `COLOCATED_TRACE`, once per process.
///
/// Thread-safe and idempotent: calls after the first (of this function or
/// [`init_worker`]) return at once. Never panics and never fails; problems are
/// reported on stderr (see the module docs).
pub fn init_from_env() {
    INIT.call_once(|| {
        install(Setup {
            default_log: None,
            trace: std::env::var_os("COLOCATED_TRACE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            collect: false,
            role: "controller",
        })
    });
}

/// Installs a worker process's logging and tracing, once per process: logs
/// what `COLOCATED_LOG` selects, else what `default_log` (an `EnvFilter`
/// directive such as `colocated=warn`) lets through, so that operators see
/// warnings and refusals without setting anything. `COLOCATED_TRACE` is
/// ignored: the worker's spans go to the controllers that ask for them (see the
/// module docs), and to `trace_file` when given (the worker's `--trace FILE`).
///
/// Call it before anything else initializes logging (a client does): only the
/// first call of this function or [`init_from_env`] counts. Thread-safe; never
/// panics or fails (problems are reported on stderr).
pub fn init_worker(default_log: &str, trace_file: Option<&Path>) {
    INIT.call_once(|| {
        install(Setup {
            default_log: Some(default_log),
            trace: trace_file.map(Path::to_path_buf),
            collect: true,
            role: "worker",
        })
    });
}

/// Whether logging was initialized (by either function).
static INIT: Once = Once::new();

/// Blocks until every span closed before this call is written and the trace file
/// is valid JSON; a controller first fetches the spans its workers recorded so
/// far.
///
/// Callable from any thread but one of an async runtime (which skips the
/// workers); returns at once when no trace is being written, and after at most
/// 10 seconds for the writer plus each worker's request timeout if one hangs.
pub fn flush() {
    let Some(writer) = WRITER.get() else { return };
    remote::collect_all();
    let (ack, done) = mpsc::channel();
    if writer.send(Msg::Flush(ack)).is_ok() {
        // An error means the writer stopped (and said why) or is stuck: stop waiting.
        let _ = done.recv_timeout(FLUSH_DEADLINE);
    }
}

/// Whether this process writes a trace file.
pub(crate) fn writing() -> bool {
    WRITER.get().is_some()
}

/// Nanoseconds on this process's trace clock (monotonic; 0 is where tracing
/// was installed, or this first call).
pub(crate) fn clock_ns() -> u64 {
    nanos(Instant::now())
}

fn nanos(at: Instant) -> u64 {
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// What [`install`] sets up.
struct Setup<'a> {
    default_log: Option<&'a str>,
    trace: Option<PathBuf>,
    /// Keep spans for controllers that ask (a worker).
    collect: bool,
    role: &'static str,
}

fn install(setup: Setup<'_>) {
    // The application's own subscriber wins; don't open a trace file it would not fill.
    if tracing::dispatcher::has_been_set() {
        return;
    }
    EPOCH.get_or_init(Instant::now);
    let filter = |what: &str, directives: &str| {
        EnvFilter::try_new(directives)
            .map_err(|e| eprintln!("colocated: ignoring {what}={directives:?}: {e}"))
            .ok()
    };
    // A bad COLOCATED_LOG falls back to the default, if any.
    let log = std::env::var_os("COLOCATED_LOG")
        .filter(|v| !v.is_empty())
        .and_then(|directives| filter("COLOCATED_LOG", &directives.to_string_lossy()))
        .or_else(|| setup.default_log.and_then(|d| filter("the default log", d)));
    let trace = setup.trace.and_then(|path| {
        start_writer(&path)
            .map_err(|e| eprintln!("colocated: not tracing to {}: {e}", path.display()))
            .ok()
    });
    if log.is_none() && trace.is_none() && !setup.collect {
        return;
    }
    let _ = ROLE.set(setup.role);
    // Both filters are per layer, so the log filter never hides spans from the trace.
    let fmt = log.map(|filter| {
        tracing_subscriber::fmt::layer()
            .with_writer(io::stderr)
            .with_filter(filter)
    });
    let spans = (trace.is_some() || setup.collect).then(|| {
        SpanLayer {
            file: trace.clone(),
        }
        .with_filter(SpanFilter {
            file: trace.is_some(),
        })
    });
    let subscriber = Registry::default().with(fmt).with(spans);
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        if let Some(tx) = trace {
            let _ = WRITER.set(tx);
        }
        if setup.collect {
            collect::enable();
        }
    }
}

/// Which spans [`SpanLayer`] sees: every span of a `colocated*` crate while a
/// file is written or a controller collects this worker's spans, none
/// otherwise, decided per call site (as a level filter is), so that a worker
/// nobody traces pays nothing at its span sites.
struct SpanFilter {
    /// A trace file is written.
    file: bool,
}

impl SpanFilter {
    fn wanted(&self) -> bool {
        self.file || collect::active()
    }
}

fn ours(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("colocated")
}

impl<S> Filter<S> for SpanFilter {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        ours(meta) && self.wanted()
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if !ours(meta) {
            Interest::never()
        } else if self.file {
            Interest::always()
        } else if collect::active() {
            // Collection may stop: ask again per span.
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(if self.wanted() {
            LevelFilter::TRACE
        } else {
            LevelFilter::OFF
        })
    }
}

/// Turns closed spans into complete events for the file, and into spans kept
/// for controllers.
struct SpanLayer {
    file: Option<Sender<Msg>>,
}

/// Kept in a span's extensions from creation to close.
struct SpanData {
    start: Instant,
    /// `host` and `stream`: the span's own fields, else its parent's.
    host: Option<u64>,
    stream: Option<u64>,
    /// Recorded fields.
    fields: Vec<(&'static str, FieldValue)>,
}

impl Visit for SpanData {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "host" => self.host = Some(value),
            "stream" => self.stream = Some(value),
            _ => {}
        }
        self.set(field, FieldValue::Uint(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        match (field.name(), u64::try_from(value)) {
            ("host", Ok(v)) => self.host = Some(v),
            ("stream", Ok(v)) => self.stream = Some(v),
            _ => {}
        }
        self.set(field, FieldValue::Int(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, FieldValue::Real(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, FieldValue::Flag(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, FieldValue::Text(value.to_owned()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.set(field, FieldValue::Text(format!("{value:?}")));
    }
}

impl SpanData {
    fn set(&mut self, field: &Field, value: FieldValue) {
        match self
            .fields
            .iter_mut()
            .find(|(name, _)| *name == field.name())
        {
            Some(slot) => slot.1 = value,
            None => self.fields.push((field.name(), value)),
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        // Only a contextual parent runs on this thread, so only its track nests.
        let parent = attrs
            .is_contextual()
            .then(|| span.parent())
            .flatten()
            .and_then(|p| {
                let ext = p.extensions();
                ext.get::<SpanData>().map(|d| (d.host, d.stream))
            });
        let (host, stream) = parent.unwrap_or((None, None));
        let mut data = SpanData {
            start: Instant::now(),
            host,
            stream,
            fields: Vec::new(),
        };
        attrs.record(&mut data);
        span.extensions_mut().insert(data);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(data) = extensions.get_mut::<SpanData>() {
            values.record(data);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let end = Instant::now();
        let Some(span) = ctx.span(&id) else { return };
        let Some(data) = span.extensions_mut().remove::<SpanData>() else {
            return;
        };
        let meta = span.metadata();
        let start_ns = nanos(data.start);
        let duration_ns =
            u64::try_from(end.saturating_duration_since(data.start).as_nanos()).unwrap_or(u64::MAX);
        let (track, track_name, first) = match data.stream {
            Some(stream) => (stream, None, false),
            None => {
                let (tid, name, first) = runtime_track();
                (tid, Some(name), first)
            }
        };
        if let Some(tx) = &self.file {
            let pid = data.host.unwrap_or(0);
            let json = event_json(
                meta.name(),
                meta.target(),
                start_ns,
                duration_ns,
                pid,
                track,
                data.fields.iter().map(|(n, v)| (*n, v)),
            );
            // A send fails only once the writer has stopped, which it already reported.
            let _ = tx.send(Msg::Span {
                pid,
                tid: track,
                track_name: track_name.clone().filter(|_| first),
                json,
            });
        }
        if collect::active() {
            collect::push(CollectedSpan {
                name: meta.name(),
                category: meta.target(),
                start_ns,
                duration_ns,
                stream: data.stream,
                track,
                track_name,
                fields: data.fields,
            });
        }
    }
}

/// This OS thread's runtime track and its label, and whether this is the
/// first time it is asked for.
fn runtime_track() -> (u64, Arc<str>, bool) {
    RUNTIME_TRACK
        .try_with(|track| {
            let mut track = track.borrow_mut();
            match &*track {
                Some((tid, name)) => (*tid, name.clone(), false),
                None => {
                    let tid = NEXT_RUNTIME_TRACK.fetch_add(1, Ordering::Relaxed);
                    let thread = std::thread::current();
                    let name: Arc<str> = match thread.name() {
                        Some(name) => format!("{name} (runtime)").into(),
                        None => format!("thread {} (runtime)", tid - RUNTIME_TRACK_BASE).into(),
                    };
                    *track = Some((tid, name.clone()));
                    (tid, name, true)
                }
            }
        })
        .unwrap_or_else(|_| (RUNTIME_TRACK_BASE, Arc::from("runtime"), false))
}
