//! Sessions in processes of their own, as every worker's command line asks
//! for them (`--isolate-sessions`, `--shared-sessions`, `--single-session`):
//! the kind of worker an entry point starts ([`WorkerKind`]: how to start
//! another of it, and whether it isolates by default), and the rules that
//! turn a supervisor's flags into its session workers' command line, name a
//! session worker's trace file, and read its one-time token. The supervisor
//! and its children themselves are [`isolate`](crate::transport::isolate).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::WorkerFlags;
use crate::error::{Error, Result};
use crate::transport::isolate::IsolateCommand;
use crate::transport::Token;

/// The kind of worker an entry point starts (`colocated worker`, `python -m
/// colocated.worker`, the Node package's `colocated worker`): how to start
/// another worker of the kind, which a supervisor does for each session, and
/// whether it isolates sessions unless told otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerKind {
    /// The program that starts a worker of this kind: this executable, the
    /// Python interpreter, `node`. An absolute path, as children may start
    /// elsewhere.
    pub program: PathBuf,
    /// The arguments before the worker flags: `["worker"]`, `["-m",
    /// "colocated.worker"]`, `[SCRIPT, "worker"]`.
    pub args: Vec<String>,
    /// Whether sessions run in processes of their own unless
    /// `--shared-sessions` is given: true for the workers that run code
    /// controllers send (Python, JavaScript), whose sessions would otherwise
    /// share an interpreter.
    pub isolates_by_default: bool,
}

impl WorkerFlags {
    /// The command line of a session worker of `kind`, when these flags
    /// isolate sessions (`--isolate-sessions`, else the kind's default, and
    /// never with `--shared-sessions` or `--single-session`); `None` when
    /// sessions are served in this process. The child gets the same devices,
    /// plugins, liveness, TLS and trace flags, with the paths made absolute
    /// and the PJRT plugin resolved to its library (a name by
    /// `PJRT_NAMES_AND_LIBRARY_PATHS`), plus `--shared-sessions`; the
    /// supervisor adds `--listen`, `--token-file` and `--single-session`.
    /// `invalid_argument` for both switches, a path that is not UTF-8 or a
    /// current directory that cannot be read; `not_found` for an unknown
    /// plugin name.
    pub fn isolation(&self, kind: &WorkerKind) -> Result<Option<IsolateCommand>> {
        if self.isolate_sessions && self.shared_sessions {
            return Err(Error::invalid_argument(
                "--isolate-sessions and --shared-sessions exclude each other",
            ));
        }
        let isolate = self.isolate_sessions || (!self.shared_sessions && kind.isolates_by_default);
        if !isolate || self.single_session {
            return Ok(None);
        }
        let mut args = kind.args.clone();
        let mut add = |flag: &str, value: String| args.extend([format!("--{flag}"), value]);
        add("heartbeat-interval", self.heartbeat_interval.to_string());
        add("session-timeout", self.session_timeout.to_string());
        if let Some(n) = self.cpu_devices {
            add("cpu-devices", n.to_string());
        }
        if let Some(spec) = &self.pjrt_plugin {
            let names = std::env::var(crate::PJRT_NAMES_ENV).ok();
            let library = crate::find_plugin(spec, names.as_deref())
                .map_err(|e| e.context("--pjrt-plugin"))?;
            add("pjrt-plugin", absolute("pjrt-plugin", &library)?);
        }
        for option in &self.pjrt_options {
            add("pjrt-option", option.clone());
        }
        for plugin in &self.plugins {
            add("plugin", absolute("plugin", plugin)?);
        }
        if let Some(cert) = &self.tls_cert {
            add("tls-cert", absolute("tls-cert", cert)?);
        }
        if let Some(key) = &self.tls_key {
            add("tls-key", absolute("tls-key", key)?);
        }
        if let Some(trace) = &self.trace {
            add("trace", absolute("trace", trace)?);
        }
        args.push("--shared-sessions".into());
        Ok(Some(IsolateCommand {
            program: kind.program.clone(),
            args,
        }))
    }

    /// This process's own trace file (`--trace`): a session worker's
    /// (`--single-session`) is `NAME.PID.EXT` beside its supervisor's
    /// `NAME.EXT`, as two processes cannot write one file.
    pub fn trace_file(&self) -> Option<PathBuf> {
        let trace = self.trace.as_ref()?;
        if !self.single_session {
            return Some(trace.clone());
        }
        Some(with_pid(trace, std::process::id()))
    }

    /// A session worker's one-time token: read from `--token-file`, which is
    /// then deleted (nobody else needs it). `invalid_argument` without a
    /// token file or with `--insecure`, or for an unreadable one.
    pub(super) fn one_time_token(&self) -> Result<Token> {
        let file =
            match (&self.token_file, self.insecure) {
                (Some(file), false) => file,
                _ => return Err(Error::invalid_argument(
                    "--single-session needs --token-file (its one-time token), and no --insecure",
                )),
            };
        let token = Token::from_file(file);
        // Deleted even when unreadable: it was meant for one reading.
        let _ = std::fs::remove_file(file);
        token
    }
}

/// `path` with `.PID` before its extension (`trace.json` -> `trace.42.json`).
fn with_pid(path: &Path, pid: u32) -> PathBuf {
    let mut name = path.file_stem().map(OsString::from).unwrap_or_default();
    name.push(format!(".{pid}"));
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    path.with_file_name(name)
}

/// `path` made absolute (against the current directory), as text for a
/// command line. `invalid_argument` naming `--flag`.
fn absolute(flag: &str, path: &Path) -> Result<String> {
    let path = std::path::absolute(path)
        .map_err(|e| Error::invalid_argument(format!("--{flag} {}: {e}", path.display())))?;
    path.into_os_string().into_string().map_err(|path| {
        Error::invalid_argument(format!(
            "--{flag} {}: not UTF-8",
            Path::new(&path).display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn kind(isolates_by_default: bool) -> WorkerKind {
        WorkerKind {
            program: "/usr/bin/python3".into(),
            args: vec!["-m".into(), "colocated.worker".into()],
            isolates_by_default,
        }
    }

    fn flags() -> WorkerFlags {
        WorkerFlags {
            listen: "127.0.0.1:0".into(),
            token_file: Some("token".into()),
            heartbeat_interval: 0.5,
            session_timeout: 10.0,
            exit_after_idle: Some(60.0),
            ..Default::default()
        }
    }

    #[test]
    fn each_kind_isolates_by_its_default_unless_a_switch_says_otherwise() {
        let isolates =
            |flags: WorkerFlags, by_default| flags.isolation(&kind(by_default)).unwrap().is_some();
        assert!(isolates(flags(), true));
        assert!(!isolates(flags(), false));
        let isolate = WorkerFlags {
            isolate_sessions: true,
            ..flags()
        };
        assert!(isolates(isolate, false));
        let shared = WorkerFlags {
            shared_sessions: true,
            ..flags()
        };
        assert!(!isolates(shared, true));
        // A session worker serves its session itself.
        let single = WorkerFlags {
            isolate_sessions: true,
            single_session: true,
            ..flags()
        };
        assert!(!isolates(single, true));
    }

    #[test]
    fn a_session_worker_gets_the_supervisors_flags_with_absolute_paths() {
        let cwd = std::env::current_dir().unwrap();
        let flags = WorkerFlags {
            cpu_devices: Some(4),
            pjrt_plugin: Some("lib/pjrt.so".into()),
            pjrt_options: vec!["cpu_device_count=2".into()],
            plugins: vec!["a.so".into(), "/opt/b.so".into()],
            tls_cert: Some("cert.pem".into()),
            tls_key: Some("key.pem".into()),
            trace: Some("out/trace.json".into()),
            ..flags()
        };
        let command = flags.isolation(&kind(true)).unwrap().unwrap();
        assert_eq!(command.program, PathBuf::from("/usr/bin/python3"));
        let at = |p: &str| cwd.join(p).display().to_string();
        let expected = [
            "-m",
            "colocated.worker",
            "--heartbeat-interval",
            "0.5",
            "--session-timeout",
            "10",
            "--cpu-devices",
            "4",
            "--pjrt-plugin",
            &at("lib/pjrt.so"),
            "--pjrt-option",
            "cpu_device_count=2",
            "--plugin",
            &at("a.so"),
            "--plugin",
            "/opt/b.so",
            "--tls-cert",
            &at("cert.pem"),
            "--tls-key",
            &at("key.pem"),
            "--trace",
            &at("out/trace.json"),
            "--shared-sessions",
        ];
        assert_eq!(command.args, expected);
        // Never the supervisor's address, token or idle limit: the supervisor
        // gives its own.
        for supervisor_only in ["--listen", "--port", "--token-file", "--exit-after-idle"] {
            assert!(!command.args.iter().any(|a| a == supervisor_only));
        }
    }

    #[test]
    fn an_unknown_plugin_name_is_refused_before_any_child_starts() {
        let flags = WorkerFlags {
            pjrt_plugin: Some("no-such-plugin-name".into()),
            ..flags()
        };
        let err = flags.isolation(&kind(true)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
        assert!(err.message().contains("--pjrt-plugin"), "{err}");
    }

    #[test]
    fn a_session_worker_traces_to_a_file_of_its_own() {
        assert_eq!(
            with_pid(Path::new("/t/trace.json"), 42),
            PathBuf::from("/t/trace.42.json")
        );
        assert_eq!(with_pid(Path::new("trace"), 7), PathBuf::from("trace.7"));
        assert_eq!(
            with_pid(Path::new("a.tar.gz"), 7),
            PathBuf::from("a.tar.7.gz")
        );
        let supervisor = WorkerFlags {
            trace: Some("t.json".into()),
            ..flags()
        };
        assert_eq!(supervisor.trace_file(), Some(PathBuf::from("t.json")));
        let child = WorkerFlags {
            single_session: true,
            ..supervisor
        };
        let own = format!("t.{}.json", std::process::id());
        assert_eq!(child.trace_file(), Some(PathBuf::from(own)));
        assert_eq!(flags().trace_file(), None);
    }

    #[test]
    fn a_one_time_token_is_read_once_and_its_file_deleted() {
        let dir = std::env::temp_dir().join(format!("colocated-once-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "once\n").unwrap();
        let flags = WorkerFlags {
            token_file: Some(file.clone()),
            single_session: true,
            insecure: false,
            ..flags()
        };
        let options = flags.options(&kind(true)).unwrap();
        assert!(options.token.unwrap().matches("once"));
        assert!(options.single_session && options.isolate.is_none());
        assert!(!file.exists(), "the token file is deleted");
        let err = flags.options(&kind(true)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        let insecure = WorkerFlags {
            insecure: true,
            ..flags
        };
        let err = insecure.options(&kind(true)).unwrap_err();
        assert!(err.message().contains("--single-session"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
