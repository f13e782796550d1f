//! Logs and Chrome/Perfetto traces, configured from the environment.
//!
//! [`init_from_env`] (run by every `Client::new_local`) reads two variables once
//! per process and installs a global `tracing` subscriber for them:
//!
//! - `COLOCATED_LOG`: an `EnvFilter` directive such as `colocated_core=debug`. Logs
//!   that pass it are written to stderr.
//! - `COLOCATED_TRACE`: a path. Every span of a `colocated*` crate, at any level,
//!   becomes a complete (`"ph":"X"`) event in a Chrome Trace Event Format file that
//!   chrome://tracing and ui.perfetto.dev load. The process (`pid`) is the span's
//!   `host` field (default 0); the track (`tid`) is its `stream` field, so each
//!   stream of each host is one timeline. Spans without a `stream` take their
//!   parent's track, else a track per OS thread (ids from 2^31 up, named after the
//!   thread), so that slices on one track always nest. `args` holds the span's fields, and
//!   a metadata event names each host and track when it first appears.
//!
//! The file is a JSON array. Each batch of events is written by a background
//! thread and followed by the closing `]`, so the file is valid JSON whenever the
//! writer is idle; [`flush`] waits for that point. Events still queued when the
//! process exits are lost: call [`flush`] before exiting.
//!
//! Nothing is installed when neither variable is set, or when the application has
//! already installed a global subscriber (its subscriber wins, silently): a
//! library embedder's process stays silent unless it opts in. Entry points that
//! serve others, such as the worker commands, call [`init_with_default_log`]
//! instead, so that their operators see warnings without setting anything. A bad
//! directive or an unwritable path prints one warning to stderr and disables only
//! that output.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// Track ids from here up hold spans without a stream, one track per OS thread; the
/// base itself is shared by threads that are exiting. Stream ids count up from 1 and
/// stay below it, and it fits the `u32` tids that viewers use.
const RUNTIME_TRACK_BASE: u64 = 1 << 31;

/// Events a batch of the writer takes before it closes the array and acknowledges.
const MAX_BATCH: usize = 4096;
/// How long [`flush`] waits for the writer.
const FLUSH_DEADLINE: Duration = Duration::from_secs(10);

/// The channel to the trace writer, set once the trace layer is installed.
static WRITER: OnceLock<Sender<Msg>> = OnceLock::new();
static NEXT_RUNTIME_TRACK: AtomicU64 = AtomicU64::new(RUNTIME_TRACK_BASE + 1);

thread_local! {
    static RUNTIME_TRACK: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Installs the log and trace subscriber described by `COLOCATED_LOG` and
/// `COLOCATED_TRACE`, once per process.
///
/// Thread-safe and idempotent: calls after the first return at once. Never panics
/// and never fails; problems are reported on stderr (see the module docs).
pub fn init_from_env() {
    INIT.call_once(|| install(None));
}

/// Like [`init_from_env`], but logs what `default_log` (an `EnvFilter`
/// directive such as `colocated=warn`) lets through when `COLOCATED_LOG` is
/// unset or empty. For processes whose operators must see warnings and
/// refusals by default (the worker commands); call it before anything else
/// initializes logging, as only the first call of either function counts.
pub fn init_with_default_log(default_log: &str) {
    INIT.call_once(|| install(Some(default_log)));
}

/// Whether logging was initialized (by either function).
static INIT: Once = Once::new();

/// Blocks until every span closed before this call is written and the trace file
/// is valid JSON.
///
/// Callable from any thread; returns at once when no trace is being written, and
/// after at most 10 seconds if the writer is stuck on I/O.
pub fn flush() {
    let Some(writer) = WRITER.get() else { return };
    let (ack, done) = mpsc::channel();
    if writer.send(Msg::Flush(ack)).is_ok() {
        // An error means the writer stopped (and said why) or is stuck: stop waiting.
        let _ = done.recv_timeout(FLUSH_DEADLINE);
    }
}

fn install(default_log: Option<&str>) {
    // The application's own subscriber wins; don't open a trace file it would not fill.
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    let filter = |what: &str, directives: &str| {
        EnvFilter::try_new(directives)
            .map_err(|e| eprintln!("colocated: ignoring {what}={directives:?}: {e}"))
            .ok()
    };
    // A bad COLOCATED_LOG falls back to the default, if any.
    let log = var("COLOCATED_LOG")
        .and_then(|directives| filter("COLOCATED_LOG", &directives.to_string_lossy()))
        .or_else(|| default_log.and_then(|d| filter("the default log", d)));
    let trace = var("COLOCATED_TRACE").and_then(|path| {
        let path = PathBuf::from(path);
        start_writer(&path)
            .map_err(|e| eprintln!("colocated: not tracing to {}: {e}", path.display()))
            .ok()
    });
    if log.is_none() && trace.is_none() {
        return;
    }
    // Both filters are per layer, so the log filter never hides spans from the trace.
    let fmt = log.map(|filter| {
        tracing_subscriber::fmt::layer()
            .with_writer(io::stderr)
            .with_filter(filter)
    });
    let chrome = trace.clone().map(|tx| {
        ChromeLayer {
            tx,
            epoch: Instant::now(),
        }
        .with_filter(filter_fn(|m| {
            m.is_span() && m.target().starts_with("colocated")
        }))
    });
    let subscriber = Registry::default().with(fmt).with(chrome);
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        if let Some(tx) = trace {
            let _ = WRITER.set(tx);
        }
    }
}

/// What the hot path sends to the writer thread.
enum Msg {
    /// One complete event, already formatted.
    Span {
        pid: u64,
        tid: u64,
        /// The label of a runtime track, sent with its first span.
        track_name: Option<String>,
        json: String,
    },
    /// Acknowledge once everything before is on disk.
    Flush(Sender<()>),
}

fn start_writer(path: &std::path::Path) -> io::Result<Sender<Msg>> {
    let mut out = BufWriter::new(File::create(path)?);
    out.write_all(b"[\n")?;
    close_array(&mut out)?;
    let (tx, rx) = mpsc::channel();
    let shown = path.display().to_string();
    std::thread::Builder::new()
        .name("colocated-trace".into())
        .spawn(move || {
            if let Err(e) = write_events(out, rx) {
                eprintln!("colocated: trace {shown} stopped: {e}");
            }
        })?;
    Ok(tx)
}

/// Writes `\n]` so the file parses, then steps back over it for the next event.
fn close_array(out: &mut BufWriter<File>) -> io::Result<()> {
    out.write_all(b"\n]")?;
    out.flush()?;
    out.seek(SeekFrom::Current(-2))?;
    Ok(())
}

/// The writer thread: runs until every sender is gone or the file fails.
fn write_events(mut out: BufWriter<File>, rx: Receiver<Msg>) -> io::Result<()> {
    let mut first = true;
    let mut seen_hosts = HashSet::new();
    let mut seen_tracks = HashSet::new();
    let mut runtime_names: HashMap<u64, String> = HashMap::new();
    let mut emit = |out: &mut BufWriter<File>, json: &str| {
        let sep: &[u8] = if std::mem::take(&mut first) {
            b""
        } else {
            b",\n"
        };
        out.write_all(sep)
            .and_then(|()| out.write_all(json.as_bytes()))
    };
    while let Ok(msg) = rx.recv() {
        let mut acks = Vec::new();
        let mut next = Some(msg);
        let mut taken = 0;
        while let Some(msg) = next {
            match msg {
                Msg::Flush(ack) => acks.push(ack),
                Msg::Span {
                    pid,
                    tid,
                    track_name,
                    json,
                } => {
                    if let Some(name) = track_name {
                        runtime_names.insert(tid, name);
                    }
                    if seen_hosts.insert(pid) {
                        let meta = metadata("process_name", pid, 0, &format!("host {pid}"));
                        emit(&mut out, &meta)?;
                    }
                    if seen_tracks.insert((pid, tid)) {
                        let name = match runtime_names.get(&tid) {
                            Some(name) => name.clone(),
                            None if tid >= RUNTIME_TRACK_BASE => "runtime".to_owned(),
                            None => format!("stream {tid}"),
                        };
                        emit(&mut out, &metadata("thread_name", pid, tid, &name))?;
                    }
                    emit(&mut out, &json)?;
                }
            }
            taken += 1;
            next = if taken < MAX_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        close_array(&mut out)?;
        for ack in acks {
            let _ = ack.send(());
        }
    }
    Ok(())
}

fn metadata(kind: &str, pid: u64, tid: u64, name: &str) -> String {
    let mut json =
        format!(r#"{{"name":"{kind}","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":"#);
    push_json_str(&mut json, name);
    json.push_str("}}");
    json
}

/// Turns closed spans into complete events and sends them to the writer.
struct ChromeLayer {
    tx: Sender<Msg>,
    epoch: Instant,
}

/// Kept in a span's extensions from creation to close.
struct SpanData {
    start: Instant,
    /// `host` and `stream`: the span's own fields, else its parent's.
    host: Option<u64>,
    stream: Option<u64>,
    /// Recorded fields, each value already JSON.
    fields: Vec<(&'static str, String)>,
}

impl Visit for SpanData {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "host" => self.host = Some(value),
            "stream" => self.stream = Some(value),
            _ => {}
        }
        self.set(field, value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        match (field.name(), u64::try_from(value)) {
            ("host", Ok(v)) => self.host = Some(v),
            ("stream", Ok(v)) => self.stream = Some(v),
            _ => {}
        }
        self.set(field, value.to_string());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.set(field, value.to_string());
        } else {
            self.record_debug(field, &value);
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, value.to_string());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let mut json = String::with_capacity(value.len() + 2);
        push_json_str(&mut json, value);
        self.set(field, json);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl SpanData {
    fn set(&mut self, field: &Field, json: String) {
        match self
            .fields
            .iter_mut()
            .find(|(name, _)| *name == field.name())
        {
            Some(slot) => slot.1 = json,
            None => self.fields.push((field.name(), json)),
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ChromeLayer {
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
        let pid = data.host.unwrap_or(0);
        let (tid, track_name) = match data.stream {
            Some(stream) => (stream, None),
            None => runtime_track(),
        };
        let micros = |d: Duration| d.as_secs_f64() * 1e6;
        let meta = span.metadata();
        let mut json = String::with_capacity(192);
        json.push_str(r#"{"name":"#);
        push_json_str(&mut json, meta.name());
        json.push_str(r#","cat":"#);
        push_json_str(&mut json, meta.target());
        let _ = write!(
            json,
            r#","ph":"X","ts":{:.3},"dur":{:.3},"pid":{pid},"tid":{tid},"args":{{"#,
            micros(data.start.saturating_duration_since(self.epoch)),
            micros(end.saturating_duration_since(data.start)),
        );
        for (i, (name, value)) in data.fields.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            push_json_str(&mut json, name);
            json.push(':');
            json.push_str(value);
        }
        json.push_str("}}");
        // A send fails only once the writer has stopped, which it already reported.
        let _ = self.tx.send(Msg::Span {
            pid,
            tid,
            track_name,
            json,
        });
    }
}

/// This OS thread's runtime track, with its label the first time.
fn runtime_track() -> (u64, Option<String>) {
    RUNTIME_TRACK
        .try_with(|track| match track.get() {
            Some(tid) => (tid, None),
            None => {
                let tid = NEXT_RUNTIME_TRACK.fetch_add(1, Ordering::Relaxed);
                track.set(Some(tid));
                let thread = std::thread::current();
                let name = match thread.name() {
                    Some(name) => format!("{name} (runtime)"),
                    None => format!("thread {} (runtime)", tid - RUNTIME_TRACK_BASE),
                };
                (tid, Some(name))
            }
        })
        .unwrap_or((RUNTIME_TRACK_BASE, None))
}

/// Appends `s` as a JSON string literal.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
