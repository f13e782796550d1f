//! The trace file: complete events and metadata in the Chrome Trace Event
//! Format, written by one thread that keeps the file a valid JSON array after
//! every batch (see the [module docs](super)).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use super::{ROLE, RUNTIME_TRACK_BASE};

/// Events a batch of the writer takes before it closes the array and acknowledges.
const MAX_BATCH: usize = 4096;

/// A field's value, as recorded.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum FieldValue {
    Text(String),
    Int(i64),
    Uint(u64),
    Real(f64),
    Flag(bool),
}

impl FieldValue {
    /// Appends the value as JSON (a non-finite number as a string).
    pub(super) fn push_json(&self, out: &mut String) {
        match self {
            FieldValue::Text(text) => push_json_str(out, text),
            FieldValue::Int(v) => {
                let _ = write!(out, "{v}");
            }
            FieldValue::Uint(v) => {
                let _ = write!(out, "{v}");
            }
            FieldValue::Real(v) if v.is_finite() => {
                let _ = write!(out, "{v}");
            }
            FieldValue::Real(v) => push_json_str(out, &format!("{v:?}")),
            FieldValue::Flag(v) => {
                let _ = write!(out, "{v}");
            }
        }
    }
}

/// One complete event: `{"name":...,"ph":"X",...}`, times in nanoseconds.
#[allow(clippy::too_many_arguments)]
pub(super) fn event_json<'a>(
    name: &str,
    category: &str,
    start_ns: u64,
    duration_ns: u64,
    pid: u64,
    tid: u64,
    fields: impl Iterator<Item = (&'a str, &'a FieldValue)>,
) -> String {
    let mut json = String::with_capacity(192);
    json.push_str(r#"{"name":"#);
    push_json_str(&mut json, name);
    json.push_str(r#","cat":"#);
    push_json_str(&mut json, category);
    let _ = write!(
        json,
        r#","ph":"X","ts":{}.{:03},"dur":{}.{:03},"pid":{pid},"tid":{tid},"args":{{"#,
        start_ns / 1000,
        start_ns % 1000,
        duration_ns / 1000,
        duration_ns % 1000,
    );
    for (i, (name, value)) in fields.enumerate() {
        if i > 0 {
            json.push(',');
        }
        push_json_str(&mut json, name);
        json.push(':');
        value.push_json(&mut json);
    }
    json.push_str("}}");
    json
}

/// What the hot path sends to the writer thread.
pub(super) enum Msg {
    /// One complete event of this process, already formatted.
    Span {
        pid: u64,
        tid: u64,
        /// The label of a runtime track, sent with its first span.
        track_name: Option<Arc<str>>,
        json: String,
    },
    /// Names process `pid` (a worker's), unless it was named already.
    Process { pid: u64, name: String },
    /// Names track `tid` of process `pid`, unless it was named already.
    Track { pid: u64, tid: u64, name: String },
    /// One complete event of a worker, already formatted; its process and
    /// track were named before.
    Remote(String),
    /// Acknowledge once everything before is on disk.
    Flush(Sender<()>),
}

pub(super) fn start_writer(path: &Path) -> io::Result<Sender<Msg>> {
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

/// The name of process `pid` of this process's own spans.
fn own_process_name(pid: u64) -> String {
    let role = ROLE.get().copied().unwrap_or("controller");
    match pid {
        0 => format!("{role} (this process)"),
        host => format!("{role} (this process): host {host}"),
    }
}

/// The writer thread: runs until every sender is gone or the file fails.
fn write_events(mut out: BufWriter<File>, rx: Receiver<Msg>) -> io::Result<()> {
    let mut first = true;
    let mut seen_hosts = HashSet::new();
    let mut seen_tracks = HashSet::new();
    let mut runtime_names: HashMap<u64, Arc<str>> = HashMap::new();
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
                Msg::Process { pid, name } => {
                    if seen_hosts.insert(pid) {
                        emit(&mut out, &metadata("process_name", pid, 0, &name))?;
                    }
                }
                Msg::Track { pid, tid, name } => {
                    if seen_tracks.insert((pid, tid)) {
                        emit(&mut out, &metadata("thread_name", pid, tid, &name))?;
                    }
                }
                Msg::Remote(json) => emit(&mut out, &json)?,
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
                        let meta = metadata("process_name", pid, 0, &own_process_name(pid));
                        emit(&mut out, &meta)?;
                    }
                    if seen_tracks.insert((pid, tid)) {
                        let name = match runtime_names.get(&tid) {
                            Some(name) => name.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_stay_valid_json_whatever_a_worker_names_its_spans() {
        let fields = [
            (
                "text",
                FieldValue::Text("a \"quoted\"\n\u{1}value\\".into()),
            ),
            ("nan", FieldValue::Real(f64::NAN)),
            ("real", FieldValue::Real(1.5)),
            ("int", FieldValue::Int(-3)),
            ("flag", FieldValue::Flag(true)),
        ];
        let json = event_json(
            "na\"me\t",
            "cat\u{7f}",
            1_234_567,
            89,
            REMOTE_PID,
            RUNTIME_TRACK_BASE | 5,
            fields.iter().map(|(n, v)| (*n, v)),
        );
        let event: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(event["name"], "na\"me\t");
        assert_eq!(event["ts"], 1234.567);
        assert_eq!(event["dur"], 0.089);
        assert_eq!(event["args"]["text"], "a \"quoted\"\n\u{1}value\\");
        assert_eq!(event["args"]["nan"], "NaN");
        assert_eq!(event["args"]["real"], 1.5);
        assert_eq!(event["args"]["int"], -3);
        assert_eq!(event["args"]["flag"], true);
        let meta: serde_json::Value =
            serde_json::from_str(&metadata("process_name", 1, 0, "\"127.0.0.1:1\"")).unwrap();
        assert_eq!(meta["args"]["name"], "\"127.0.0.1:1\"");
    }

    const REMOTE_PID: u64 = 1 << 20;
}
